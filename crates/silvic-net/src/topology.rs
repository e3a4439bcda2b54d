//! Which ranks a rank holds streams to, and which side of each it dials: the two ring streams,
//! and, where chords are formed, one chord stream to every rank `r ± 2^k` (`k ≥ 1`, `2^k <
//! world`) that the ring does not already join. Pure: the rendezvous dials and accepts what
//! [`topology`] says, and the link names its streams by the same [`Route`]s.
//!
//! Invariants:
//! - One stream per peer rank, except in a world of two, which keeps its two ring streams (both
//!   to the other rank, one dialled by each side) as it always has.
//! - Both ends agree: rank `r` dials `p` exactly when `p` accepts `r`. Of two ranks at forward
//!   distance `d` (`p = r + d`), the one with the shorter way forward dials (`d < world - d`),
//!   the lower rank on a tie: the ring's streams keep their direction (each rank dials its right
//!   neighbour), and since every rank dials and accepts at once, nobody waits on a rank that
//!   waits on it.
//! - A rank holds at most `2 ceil(log2 world)` streams: `2 log2 world - 1` in a world that is a
//!   power of two (four and up), as many less as the offsets `± 2^k` coincide round the ring.

use crate::ring::seam::Route;

/// The smallest world in which chord streams are formed (unless a test forces them): below it
/// a log-depth path saves too few hops to pay for the extra sockets.
pub(crate) const CHORDS_FROM_WORLD: usize = 8;

/// Whether a ring forms chord streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chords {
    /// From [`CHORDS_FROM_WORLD`] ranks on.
    Auto,
    /// In every world of four or more ranks (the tests' way to have them at small worlds).
    #[cfg_attr(
        not(any(test, feature = "fuzzing")),
        expect(dead_code, reason = "for the crate's own tests and fuzz/")
    )]
    Always,
}

/// Whether a ring of `world` ranks forms chord streams when nothing forces them (what the
/// simulator models).
#[cfg(feature = "simulate")]
pub(crate) fn chords_formed(world: usize) -> bool {
    Chords::Auto.formed(world)
}

impl Chords {
    fn formed(self, world: usize) -> bool {
        match self {
            Chords::Auto => world >= CHORDS_FROM_WORLD,
            Chords::Always => true,
        }
    }
}

/// One stream of a rank: the rank at its other end, and the route that names it (the signed
/// offset round the ring to that rank, the shorter way; `+world/2` for the rank opposite).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) rank: usize,
    pub(crate) route: Route,
}

/// The streams of one rank: those it dials and those it accepts, ring streams first (the
/// right neighbour's among the dialled, the left's among the accepted), chords by distance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Topology {
    pub(crate) dials: Vec<Peer>,
    pub(crate) accepts: Vec<Peer>,
}

impl Topology {
    /// Every stream: the left neighbour's first, then the right one's (the order the link has
    /// always kept), then the accepted chords, then the dialled ones.
    pub(crate) fn streams(&self) -> impl Iterator<Item = Peer> + '_ {
        let (ring, chords): (Vec<_>, Vec<_>) =
            self.accepts.iter().chain(&self.dials).partition(|p| p.route.offset.abs() == 1);
        ring.into_iter().chain(chords).copied()
    }
}

/// The streams of `rank` in a world of `world` (at least two).
pub(crate) fn topology(rank: usize, world: usize, chords: Chords) -> Topology {
    assert!(world >= 2 && rank < world, "rank {rank} of {world}");
    let route = |offset: isize| Route { offset };
    if world == 2 {
        let other = 1 - rank;
        let (dials, accepts) = (route(1), route(-1));
        return Topology {
            dials: vec![Peer { rank: other, route: dials }],
            accepts: vec![Peer { rank: other, route: accepts }],
        };
    }
    let mut distances = vec![1, world - 1];
    if chords.formed(world) {
        let powers = (1..usize::BITS).map(|k| 1usize << k).take_while(|&d| d < world);
        for d in powers {
            distances.extend([d, world - d]);
        }
    }
    // Nearer peers first, each once; the right neighbour before the left.
    distances.sort_by_key(|&d| (d.min(world - d), d > world / 2));
    distances.dedup_by_key(|d| *d);
    let mut topology = Topology { dials: Vec::new(), accepts: Vec::new() };
    let mut seen = Vec::with_capacity(distances.len());
    for d in distances {
        let peer = (rank + d) % world;
        if seen.contains(&peer) {
            continue;
        }
        seen.push(peer);
        let back = world - d;
        let offset = if d <= back { d as isize } else { -(back as isize) };
        let link = Peer { rank: peer, route: route(offset) };
        if d < back || (d == back && rank < peer) {
            topology.dials.push(link);
        } else {
            topology.accepts.push(link);
        }
    }
    topology
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn ceil_log2(n: usize) -> usize {
        n.next_power_of_two().trailing_zeros() as usize
    }

    /// The peers every `r ± 2^k` (`k ≥ 0`, `2^k < n`) names, computed the plain way.
    fn power_peers(rank: usize, n: usize) -> BTreeSet<usize> {
        (0..usize::BITS)
            .map(|k| 1usize << k)
            .take_while(|&d| d < n)
            .flat_map(|d| [(rank + d) % n, (rank + n - d) % n])
            .filter(|&p| p != rank)
            .collect()
    }

    #[test]
    fn every_world_to_1024_joins_each_power_peer_once_and_both_ends_agree() {
        for n in 3..=1024 {
            // Every rank of the smaller worlds; past them, ranks at the edges and the middle.
            let ranks: Vec<usize> =
                if n <= 128 { (0..n).collect() } else { vec![0, 1, n / 2, n - 2, n - 1] };
            for r in ranks {
                let t = topology(r, n, Chords::Always);
                let of = |p: &Peer| topology(p.rank, n, Chords::Always);
                let peers: Vec<usize> = t.streams().map(|p| p.rank).collect();
                let set: BTreeSet<usize> = peers.iter().copied().collect();
                assert_eq!(set.len(), peers.len(), "world {n} rank {r}: a peer twice");
                assert_eq!(set, power_peers(r, n), "world {n} rank {r}");
                assert!(peers.len() <= 2 * ceil_log2(n), "world {n}: {} streams", peers.len());
                if n.is_power_of_two() {
                    assert_eq!(peers.len(), 2 * ceil_log2(n) - 1, "world {n}");
                }
                for p in &t.dials {
                    let back = of(p).accepts;
                    assert!(back.iter().any(|q| q.rank == r), "{n}: {r} dials {p:?} unawaited");
                    assert_eq!(p.route.sends_to(r, n), p.rank);
                }
                for p in &t.accepts {
                    assert!(of(p).dials.iter().any(|q| q.rank == r), "{n}: {r} {p:?}");
                    assert_eq!(p.route.sends_to(r, n), p.rank);
                }
                // The ring keeps its direction: the right neighbour dialled, the left accepted.
                let first = t.streams().take(2).collect::<Vec<_>>();
                assert_eq!(first[0], Peer { rank: (r + n - 1) % n, route: Route::LEFTWARD });
                assert_eq!(first[1], Peer { rank: (r + 1) % n, route: Route::RIGHTWARD });
                assert_eq!(t.dials[0].route, Route::RIGHTWARD);
            }
        }
    }

    #[test]
    fn chords_form_from_the_threshold_unless_forced_and_a_world_of_two_keeps_two_streams() {
        for n in 3..=64 {
            let auto = topology(0, n, Chords::Auto).streams().count();
            let expected = if n >= CHORDS_FROM_WORLD { power_peers(0, n).len() } else { 2 };
            assert_eq!(auto, expected, "world {n}");
        }
        for rank in 0..2 {
            let t = topology(rank, 2, Chords::Always);
            let routes: Vec<(usize, isize)> =
                t.streams().map(|p| (p.rank, p.route.offset)).collect();
            assert_eq!(routes, [(1 - rank, -1), (1 - rank, 1)]);
        }
        // Socket counts per rank as docs/architecture.md states them.
        let worlds = [2, 3, 4, 7, 8, 9, 12, 16, 24, 32, 64, 100, 128, 256, 1000, 1024];
        let counts: Vec<usize> =
            worlds.iter().map(|&n| topology(0, n, Chords::Auto).streams().count()).collect();
        assert_eq!(counts, [2, 2, 2, 2, 5, 6, 6, 7, 8, 9, 11, 14, 13, 15, 20, 19]);
    }
}
