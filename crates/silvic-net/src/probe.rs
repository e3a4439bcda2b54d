//! What a ring measures of its network when it forms: the cost of a hop, which sets the ring
//! plan's window ([`schedule::window`]) and the cut between paths; and the allreduce path every
//! rank was told to force (`options.rs`).
//!
//! Every rank times a few one-element allreduces (the gather path: `floor(n/2)` hops each, every
//! rank in step with its neighbours), takes its fastest, and the ranks agree with one more
//! allreduce (a max) of `1 + world` numbers: the slowest rank's figure, and each rank's path in
//! its own place (every other rank gives 0 there). So every rank derives the same window from the
//! same number, whatever its own clock saw, and every rank knows every rank's path: if they
//! differ, every rank's `connect` fails with the same error, naming the ranks that differ.
//!
//! Invariants:
//! - The probes are calls of the ring's own plans, numbered from [`FIRST_PROBE_SEQ`] up, a
//!   range no collective of the caller reaches: the caller's calls still count from 0, and a
//!   probe frame can never be taken for one of theirs.
//! - A failure while probing is a failure of `connect`, naming the rank, and the ring is not
//!   handed out; except an abort from another rank (it failed, in a probe or already in its
//!   first call, since ranks leave the probes one after another), which `connect` hands out as
//!   a failed ring whose every call returns it.
//! - The result is a function of the agreed numbers alone ([`hop_from`] is pure).

use std::time::{Duration, Instant};

use silvic_core::{CollectiveError, Dtype, Op, Reduction, fold};

use tracing::{info, warn};

use crate::error::{ConnectError, as_seen_by};
use crate::link::TcpRing;
use crate::options::{self, AllreducePath};
use crate::ring::bruck;
use crate::ring::seam::{Network, Route};
use crate::ring::{self, Call, Link, Scratch, allreduce, schedule, twoway};

/// Timed probes per ring. The first also waits for the slowest rank to arrive, so the fastest
/// of the rest is the figure.
pub(crate) const PROBES: u64 = 6;

/// The sequence number of the first probe; the agreement is the one after the last probe.
pub(crate) const FIRST_PROBE_SEQ: u64 = u64::MAX - PROBES;

/// The op every probe and the agreement run as.
const PROBE_OP: Op = Op::Allreduce { reduction: Reduction::Max, dtype: Dtype::U64 };

/// What every rank agreed on when the ring formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Agreed {
    /// The network (without its chords: the link knows those).
    pub(crate) network: Network,
    /// Every rank's allreduce path, by rank.
    pub(crate) paths: Vec<AllreducePath>,
}

/// Measures the ring's hop over `link` and agrees on it, and on every rank's `path`, with every
/// rank (see the module doc).
pub(crate) fn measure(
    link: &mut dyn Link,
    rank: usize,
    world: usize,
    path: AllreducePath,
    scratch: &mut Scratch,
) -> Result<Agreed, CollectiveError> {
    let mut fastest = Duration::MAX;
    for i in 0..PROBES {
        let call = Call { rank, world, op: PROBE_OP, seq: FIRST_PROBE_SEQ + i };
        let mut one = [0u64];
        let started = Instant::now();
        allreduce(link, call, &mut one, fold::max_int, scratch)?;
        if i > 0 {
            fastest = fastest.min(started.elapsed());
        }
    }
    let call = Call { rank, world, op: PROBE_OP, seq: FIRST_PROBE_SEQ + PROBES };
    let mut agreed = vec![0; 1 + world];
    agreed[0] = hop_from(fastest, world);
    agreed[1 + rank] = path.code();
    allreduce(link, call, &mut agreed, fold::max_int, scratch)?;
    let path_of = |(r, &code): (usize, &u64)| {
        AllreducePath::from_code(code).ok_or_else(|| CollectiveError::MalformedFrame {
            peer: r,
            reason: format!("the agreement gives rank {r} path number {code}, which names none"),
        })
    };
    let paths = agreed[1..].iter().enumerate().map(path_of).collect::<Result<_, _>>()?;
    Ok(Agreed { network: Network { hop_ns: agreed[0], chords: false }, paths })
}

/// Measures the network of a ring `connect` has just formed, agrees on the allreduce path
/// (this rank's is `path`), and hands both to the ring. `Ok(None)` once measured;
/// `Ok(Some(error))` when another rank failed first (an abort came, see the module doc), for
/// the ring to be handed out failed; `Err` naming the rank at fault otherwise, or
/// [`ConnectError::Disagreement`] on every rank where the paths differ. On a failure of a
/// probe the neighbours are told and the streams shut.
pub(crate) fn settle(
    ring: &mut TcpRing,
    rank: usize,
    path: AllreducePath,
    scratch: &mut Scratch,
    addresses: &[String],
    timeout: Duration,
) -> Result<Option<CollectiveError>, ConnectError> {
    let world = addresses.len();
    match measure(ring, rank, world, path, scratch) {
        Ok(Agreed { network, paths }) => {
            // Every rank has the same list, so every rank fails alike: nobody waits on another.
            let path = options::agreed(&paths)?;
            // Every rank formed the same topology, so every rank finds the same routes.
            let chords = world > 1
                && (0..bruck::rounds(world)).map(bruck::route).all(|route| {
                    ring.carries(route) && ring.carries(Route { offset: -route.offset })
                });
            let network = Network { chords, ..network };
            ring.measured(network, path.forced());
            let (hop_us, window) = (network.hop_ns / 1000, schedule::window(network));
            let cuts = ring::describe_cuts(world, network);
            let log_depth = network.log_depth();
            info!(hop_us, window, log_depth, cuts, allreduce = path.name(), "network measured");
            if path.needs_chords() && !chords {
                warn!(
                    "the allreduce path is forced to {path}, which needs chord streams, and \
                     this ring of {world} has none (formed from {} ranks): every allreduce \
                     takes the automatic path",
                    crate::topology::CHORDS_FROM_WORLD
                );
            }
            Ok(None)
        }
        Err(error) => {
            warn!(%error, "measuring the network failed; closing the ring");
            ring.abort(rank, &error, FIRST_PROBE_SEQ);
            match as_seen_by(rank, error) {
                aborted @ CollectiveError::Aborted { .. } => Ok(Some(aborted)),
                error => Err(connect_error(error, addresses, timeout)),
            }
        }
    }
}

/// A failure of the probes `connect` runs once the ring has formed, as a [`ConnectError`]
/// naming the rank at fault: a timeout as the rendezvous's own, anything else as an i/o error
/// with the collective's message.
fn connect_error(error: CollectiveError, addresses: &[String], timeout: Duration) -> ConnectError {
    let peer = error.peer().unwrap_or_default();
    let address = addresses[peer].clone();
    match error {
        CollectiveError::Timeout { .. } => ConnectError::Timeout {
            peer,
            address,
            waited: timeout,
            waiting_for: "to measure the network once the ring formed".into(),
        },
        CollectiveError::Io { kind, .. } => {
            ConnectError::Io { peer, address, kind, message: error.to_string() }
        }
        _ => ConnectError::Io {
            peer,
            address,
            kind: std::io::ErrorKind::ConnectionAborted,
            message: error.to_string(),
        },
    }
}

/// A hop's cost, in nanoseconds, from the time of one small allreduce on the gather path in a
/// world of `world` (which takes [`twoway::hops`] hops).
pub(crate) fn hop_from(call: Duration, world: usize) -> u64 {
    let hops = twoway::hops(world).max(1) as u128;
    u64::try_from(call.as_nanos() / hops).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Driver, on_ring};

    #[test]
    fn a_failed_probe_is_a_connect_error_naming_the_rank() {
        let addresses: Vec<String> = (0..3).map(|r| format!("10.0.0.{r}:7000")).collect();
        let timeout = Duration::from_secs(9);
        let waited = Duration::from_secs(9);
        match connect_error(CollectiveError::Timeout { peer: 2, waited }, &addresses, timeout) {
            ConnectError::Timeout { peer: 2, address, waited, waiting_for } => {
                assert_eq!((address.as_str(), waited), ("10.0.0.2:7000", timeout));
                assert!(waiting_for.contains("measure the network"), "{waiting_for}");
            }
            other => panic!("{other}"),
        }
        let closed = CollectiveError::PeerClosed { peer: 1 };
        match connect_error(closed.clone(), &addresses, timeout) {
            ConnectError::Io { peer: 1, address, kind, message } => {
                assert_eq!(address, "10.0.0.1:7000");
                assert_eq!(kind, std::io::ErrorKind::ConnectionAborted);
                assert_eq!(message, closed.to_string());
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_hop_is_the_call_over_its_hops() {
        assert_eq!(hop_from(Duration::from_micros(30), 2), 30_000);
        assert_eq!(hop_from(Duration::from_micros(90), 7), 30_000, "three hops each way");
        assert_eq!(hop_from(Duration::from_micros(120), 8), 30_000, "four hops");
        assert_eq!(hop_from(Duration::MAX, 4), u64::MAX);
        assert_eq!(hop_from(Duration::ZERO, 1), 0);
    }

    #[test]
    fn every_rank_agrees_on_one_network_and_so_on_one_window() {
        for world in [2, 3, 5, 8] {
            let networks = on_ring(Driver::new(world), |rank, link| {
                let mut scratch = Scratch::default();
                let path = if rank == 1 { AllreducePath::Index } else { AllreducePath::Ring };
                measure(link, rank, world, path, &mut scratch).unwrap()
            });
            let first = &networks[0];
            let mut paths = vec![AllreducePath::Ring; world];
            paths[1] = AllreducePath::Index;
            assert_eq!(first.paths, paths, "world {world}: every rank's path, by rank");
            for (rank, agreed) in networks.iter().enumerate() {
                assert_eq!(agreed, first, "world {world}: rank {rank} agreed on another network");
                assert_eq!(schedule::window(agreed.network), schedule::window(first.network));
            }
        }
    }

    #[test]
    fn the_probes_never_reach_a_callers_sequence_numbers() {
        // A caller would need 2^64 - 7 calls to reach the first probe.
        let last = FIRST_PROBE_SEQ.checked_add(PROBES).expect("the agreement's seq fits");
        assert_eq!(last, u64::MAX);
        assert!(FIRST_PROBE_SEQ > u64::from(u32::MAX));
    }
}
