//! The cost model over every allreduce path, as pure functions: what a call of `S` bytes in a
//! world of `n` costs on each path, in hops, bytes one rank sends and bytes it folds, and the
//! time that comes to on a network of a given hop latency, link rate and fold rate.
//!
//! | path | hops | bytes sent per rank | bytes folded per rank |
//! |---|---|---|---|
//! | gather (two-way) | `floor(n/2)` | `(n - 1) S` | `(n - 1) S` |
//! | ring | `n - 1 + floor(n/2)` | `2 (n - 1) S / n` | `(n - 1) S / n` |
//! | Bruck gather | `ceil(log2 n)` | `(n - 1) S` | `(n - 1) S` |
//! | index-fold-gather | `ceil(log2 n) × (chunks + 1)` | `(P(n) + n - 1) S / n` | `(n - 1) S / n` |
//!
//! `P(n)` is the number of set bits in `0..n` (the index's slots sent, about `n log2(n) / 2`)
//! and `chunks` the index's chunks ([`super::index::chunks`]). The two gathering paths hold
//! `n × S`, so they are candidates only where the gather path's memory bound allows
//! ([`schedule::GATHER_MAX_BYTES`], every size below [`schedule::SMALL_BYTES`]).
//!
//! Invariants: the time is computed exactly, in integers scaled by `n ×` the rates, so two ranks
//! given the same numbers pick the same path; ties go to the earlier candidate. With no fold
//! cost and the loopback constants, the gather-or-ring choice is [`schedule::uses_gather`]'s
//! (the tests check it), so the model extends today's cut rather than replacing it. Where hops
//! are long, `super::chosen_path` takes it at the hop and the rate the ring measured, among
//! the gather and the ring, and among every path where the link has chord streams.

use super::bruck::rounds;
use super::index::{STORE_MAX_BYTES, chunks};
use super::schedule::{self, GATHER_MAX_BYTES, SMALL_BYTES};

/// An allreduce path: the gather ([`super::gather`], whole buffers gathered then folded
/// locally), the ring ([`super::ring_path`]), Bruck's gather ([`super::bruck`]) or
/// index-fold-gather ([`super::index`]). Every frame of a call names it (`frame/`).
pub(crate) use crate::frame::Path;

impl Path {
    /// Every path, in the order ties are broken: to the paths that hold less memory, and of the
    /// two gathers to today's.
    pub(crate) const ALL: [Path; 4] = [Path::Ring, Path::Index, Path::Gather, Path::Bruck];
    /// The paths the TCP ring can carry today (no chord streams), ties to the ring as
    /// [`schedule::uses_gather`] breaks them.
    #[cfg(test)]
    pub(crate) const RING_ONLY: [Path; 2] = [Path::Ring, Path::Gather];
}

/// What a network costs: a hop's latency, the rate one rank's bytes leave it, and the rate a
/// rank folds (`None`: folds taken as free, as [`schedule::uses_gather`] takes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Network {
    pub(crate) hop_ns: u64,
    pub(crate) bytes_per_us: u64,
    pub(crate) folds_per_us: Option<u64>,
}

impl Network {
    /// The constants today's cut is made with ([`schedule::HOP_NS`],
    /// [`schedule::RATE_BYTES_PER_US`]), folds free.
    pub(crate) const LOOPBACK: Network = Network {
        hop_ns: schedule::HOP_NS,
        bytes_per_us: schedule::RATE_BYTES_PER_US,
        folds_per_us: None,
    };
}

/// What one call costs on a path, independent of the network: hops, and `n ×` the bytes one
/// rank sends and folds (so every count is an integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub(crate) hops: u64,
    pub(crate) sent_n: u128,
    pub(crate) folded_n: u128,
}

/// Set bits in `0..world`: the slots the index sends, over all its rounds.
fn slots_sent(world: usize) -> u128 {
    (0..world).map(|i| u128::from(i.count_ones())).sum()
}

/// The traffic of an allreduce of `bytes` (elements of `elem` bytes) in a world of `world` on
/// `path` (see the module doc's table).
pub(crate) fn traffic(path: Path, bytes: usize, elem: usize, world: usize) -> Traffic {
    let (n, s) = (world as u128, bytes as u128);
    let below = n.saturating_sub(1);
    let log = rounds(world) as u64;
    match path {
        Path::Gather => {
            Traffic { hops: world as u64 / 2, sent_n: n * below * s, folded_n: n * below * s }
        }
        Path::Ring => Traffic {
            hops: (world as u64).saturating_sub(1) + world as u64 / 2,
            sent_n: 2 * below * s,
            folded_n: below * s,
        },
        Path::Bruck => Traffic { hops: log, sent_n: n * below * s, folded_n: n * below * s },
        Path::Index => {
            let count = chunks(bytes / elem.max(1), world, elem.max(1), STORE_MAX_BYTES) as u64;
            Traffic {
                hops: log * (count + 1),
                sent_n: (slots_sent(world) + below) * s,
                folded_n: below * s,
            }
        }
    }
}

/// Whether `path` may carry `bytes` in a world of `world`: the gathering paths only within the
/// gather path's memory bound.
pub(crate) fn fits(path: Path, bytes: usize, world: usize) -> bool {
    match path {
        Path::Gather | Path::Bruck => {
            bytes < SMALL_BYTES || world.saturating_mul(bytes) <= GATHER_MAX_BYTES
        }
        Path::Ring | Path::Index => true,
    }
}

/// The time of `traffic` in a world of `world` on `net`, scaled by `world × bytes_per_us ×
/// folds_per_us` (the last taken as 1 when folds are free), so that it is exact. Saturates
/// rather than overflow (a hop of centuries agreed from a peer's figure): every path then
/// costs the same, and the first candidate is taken.
pub(crate) fn scaled_time(traffic: Traffic, world: usize, net: Network) -> u128 {
    let (n, rate) = (world.max(1) as u128, u128::from(net.bytes_per_us.max(1)));
    let folds = net.folds_per_us.map_or(1, |f| u128::from(f.max(1)));
    let scale = [n, rate, folds].into_iter().fold(1u128, u128::saturating_mul);
    let hops = (u128::from(traffic.hops) * u128::from(net.hop_ns)).saturating_mul(scale);
    let sent = traffic.sent_n.saturating_mul(1000 * folds);
    let folded = net.folds_per_us.map_or(0, |_| traffic.folded_n.saturating_mul(1000 * rate));
    hops.saturating_add(sent).saturating_add(folded)
}

/// The time of a call in nanoseconds (rounded down), for logs and tables.
pub(crate) fn time_ns(path: Path, bytes: usize, elem: usize, world: usize, net: Network) -> u64 {
    let (n, rate) = (world.max(1) as u128, u128::from(net.bytes_per_us.max(1)));
    let folds = net.folds_per_us.map_or(1, |f| u128::from(f.max(1)));
    let scaled = scaled_time(traffic(path, bytes, elem, world), world, net);
    u64::try_from(scaled / (n * rate).saturating_mul(folds)).unwrap_or(u64::MAX)
}

/// The cheapest of `candidates` that fits, for an allreduce of `bytes` (elements of `elem`
/// bytes) in a world of `world` on `net`; the earliest of equals. `None` if none fits.
pub(crate) fn cheapest(
    candidates: &[Path],
    bytes: usize,
    elem: usize,
    world: usize,
    net: Network,
) -> Option<Path> {
    let fitting = candidates.iter().copied().filter(|p| fits(*p, bytes, world));
    let cost = |p: Path| scaled_time(traffic(p, bytes, elem, world), world, net);
    fitting.fold(None, |best: Option<Path>, p| match best {
        Some(b) if cost(b) <= cost(p) => Some(b),
        _ => Some(p),
    })
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
