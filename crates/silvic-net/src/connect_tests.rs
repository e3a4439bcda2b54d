//! `connect` within its timeout whatever the probes do: a rank that forms the ring and then
//! stalls at any point of the probes (`probe.rs`) costs the other ranks their timeout, and not
//! a moment past it beyond closing.

use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use super::*;
use crate::addresses::parse_addresses;
use crate::options::Settings;
use crate::probe::{self, Timed};
use crate::ring::seam::{Forced, FramePlan, Link, Network};

const TOKEN: &str = "job-token";

/// A rank's link that runs `calls` probe calls, then stalls on the next for `stall` (answering
/// nothing, reading nothing, its sockets open), as a rank whose process stopped.
struct Stalling<'r> {
    ring: &'r mut TcpRing,
    calls: u64,
    stall: Duration,
    start: Instant,
}

impl Link for Stalling<'_> {
    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        if self.calls == 0 {
            std::thread::sleep(self.stall);
            return Err(CollectiveError::PeerClosed { peer: 0 });
        }
        self.calls -= 1;
        self.ring.run(plan)
    }
    fn network(&self) -> Network {
        self.ring.network()
    }
    fn forced(&self) -> Forced {
        self.ring.forced()
    }
}

impl Timed for Stalling<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
    fn fold_ns(&mut self) -> u64 {
        probe::fold_probe_ns()
    }
    fn left(&self) -> Duration {
        Duration::MAX
    }
}

/// Ranks 0 and 1 of 3 connect with `timeout`; rank 2 forms the ring with them, then stalls
/// after `calls` probe calls. Returns each calling rank's outcome and how long its `connect`
/// took.
fn with_a_rank_stalling_after(
    calls: u64,
    timeout: Duration,
) -> Vec<(Result<TcpCollective, ConnectError>, Duration)> {
    let listeners: Vec<RingListener> =
        (0..3).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(RingListener::address).collect();
    let mut listeners = listeners.into_iter();
    let (first, second, third) =
        (listeners.next().unwrap(), listeners.next().unwrap(), listeners.next().unwrap());
    std::thread::scope(|s| {
        let addresses = &addresses;
        s.spawn(move || {
            let parsed = parse_addresses(addresses).unwrap();
            let formed = form(third, (2, parsed, addresses), TOKEN, timeout, Chords::Auto);
            let (mut ring, _listener) = formed.expect("rank 2 forms the ring");
            let stall = timeout + Duration::from_millis(1500);
            let mut link = Stalling { ring: &mut ring, calls, stall, start: Instant::now() };
            let scratch = &mut Scratch::default();
            // The probes skip rounds the time left before the deadline cannot hold, so a loaded
            // machine may run fewer than `calls` of them: then rank 2 stalls right after them.
            if probe::measure(&mut link, 2, 3, (Settings::default(), 1), scratch).is_ok() {
                std::thread::sleep(stall);
            }
        });
        let calling = [(0, first), (1, second)].map(|(rank, listener)| {
            s.spawn(move || {
                let started = Instant::now();
                let (chords, auto) = (Chords::Auto, Settings::default());
                let connected = TcpCollective::connect_with(
                    listener, rank, addresses, TOKEN, timeout, chords, auto,
                );
                (connected, started.elapsed())
            })
        });
        calling.into_iter().map(|rank| rank.join().unwrap()).collect()
    })
}

/// Wherever the stall falls (the hop's probes, the first agreement, the first shifts, their
/// agreement, the long shifts, or just after the probes where time left fewer of them), each
/// other rank's `connect` ends within its timeout and a second, naming the stalled rank: as its
/// own timeout, or, where the other rank timed out first and said so (or the probes had ended),
/// as a ring whose first call returns that.
#[test]
fn connect_returns_within_its_timeout_when_a_rank_stalls_while_the_ring_measures_itself() {
    let timeout = Duration::from_secs(2);
    for calls in [0, 4, 6, 8, 10, 12] {
        let outcomes = with_a_rank_stalling_after(calls, timeout);
        for (rank, (connected, took)) in outcomes.into_iter().enumerate() {
            let case = format!("rank 2 stalled after {calls} probe calls: rank {rank}");
            assert!(took <= timeout + Duration::from_secs(1), "{case}: connect took {took:?}");
            match connected {
                Err(ConnectError::Timeout { peer, waiting_for, .. }) => {
                    assert_eq!(peer, 2, "{case}");
                    assert!(waiting_for.contains("measure the network"), "{case}: {waiting_for}");
                }
                Err(other) => panic!("{case}: {other}"),
                Ok(mut ring) => {
                    let error = ring.allreduce_sum_f64(&mut [1.0]).unwrap_err();
                    assert_eq!(error.peer(), Some(2), "{case}: {error}");
                }
            }
        }
    }
}
