//! The two-way gather schedule as pure functions: which block travels which way at which hop.
//!
//! Every rank's block sets off both ways round the ring at once: rightward to ranks `r + 1,
//! r + 2, …` and leftward to `r - 1, r - 2, …`. A block meets every other rank after
//! `floor(world / 2)` hops instead of `world - 1`.
//!
//! Invariants, checked by the tests below for worlds 1..=16:
//! - At hop `h` a way sends what it received at hop `h - 1` (its own block at hop 0), so a rank
//!   can forward a block the moment it is in ([`super::gather`] does), and never sends a block it
//!   lacks. The two ways do not wait for each other: a hop is a number, not a barrier.
//! - The rightward way runs `ceil((world - 1) / 2)` hops and the leftward way
//!   `floor((world - 1) / 2)`: together they bring each of the other `world - 1` blocks exactly
//!   once. In an even world the last hop is rightward only.
//! - What a rank sends on a way at a hop is what its neighbour on that way expects to receive.
//!
//! Everything here is arithmetic on `(rank, world, hop)`: no sockets, no clocks, no state.

use super::schedule::wrap;

/// The blocks one way moves at one hop: the rank's own `send` goes out, `recv` comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) send: usize,
    pub(crate) recv: usize,
}

/// What a rank does at one hop of the two-way gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hop {
    /// Sent to the right neighbour, received from the left.
    pub(crate) right: Move,
    /// Sent to the left neighbour, received from the right; `None` when the leftward way has
    /// already brought its share (the last hop of an even world).
    pub(crate) left: Option<Move>,
}

/// Hops of a two-way gather in a world of `world`: `floor(world / 2)`.
pub(crate) fn hops(world: usize) -> usize {
    world / 2
}

/// Hops the leftward way runs: `floor((world - 1) / 2)`.
pub(crate) fn left_hops(world: usize) -> usize {
    world.saturating_sub(1) / 2
}

/// Hop `hop` (`< hops(world)`) of rank `rank`.
pub(crate) fn hop(rank: usize, world: usize, hop: usize) -> Hop {
    debug_assert!(rank < world && hop < hops(world));
    let send = wrap(rank + world - hop, world);
    let right = Move { send, recv: wrap(send + world - 1, world) };
    let left = (hop < left_hops(world)).then(|| {
        let send = wrap(rank + hop, world);
        Move { send, recv: wrap(send + 1, world) }
    });
    Hop { right, left }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_counts_are_half_the_world() {
        let expected = [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (8, 4), (9, 4), (16, 8)];
        for (world, h) in expected {
            assert_eq!(hops(world), h, "world {world}");
        }
    }

    /// Runs the schedule symbolically: what each rank holds, hop by hop.
    #[test]
    #[allow(clippy::needless_range_loop)] // ranks index several tables at once
    fn every_rank_gets_every_block_once_and_sends_only_what_it_holds() {
        for world in 1..=16 {
            let mut has: Vec<Vec<usize>> =
                (0..world).map(|r| (0..world).map(|b| usize::from(b == r)).collect()).collect();
            let mut last: Vec<(Option<usize>, Option<usize>)> = vec![(None, None); world];
            for k in 0..hops(world) {
                let plan: Vec<Hop> = (0..world).map(|r| hop(r, world, k)).collect();
                for r in 0..world {
                    let (left, right) = ((r + world - 1) % world, (r + 1) % world);
                    let p = plan[r];
                    assert_eq!(has[r][p.right.send], 1, "world {world} hop {k} rank {r}");
                    // A way forwards what it received at the hop before.
                    assert_eq!(last[r].0.unwrap_or(r), p.right.send, "world {world} hop {k}");
                    assert_eq!(plan[left].right.send, p.right.recv, "world {world} hop {k}");
                    assert_eq!(p.left.is_some(), plan[right].left.is_some());
                    if let Some(l) = p.left {
                        assert_eq!(has[r][l.send], 1, "world {world} hop {k} rank {r}");
                        assert_eq!(last[r].1.unwrap_or(r), l.send, "world {world} hop {k}");
                        assert_eq!(plan[right].left.unwrap().send, l.recv);
                        assert_ne!(l.recv, p.right.recv, "world {world}: one block twice");
                    }
                }
                for r in 0..world {
                    let p = plan[r];
                    has[r][p.right.recv] += 1;
                    last[r].0 = Some(p.right.recv);
                    if let Some(l) = p.left {
                        has[r][l.recv] += 1;
                        last[r].1 = Some(l.recv);
                    }
                }
            }
            for (r, h) in has.iter().enumerate() {
                assert!(h.iter().all(|&n| n == 1), "world {world} rank {r}: {h:?}");
            }
        }
    }

    #[test]
    fn even_worlds_end_on_a_rightward_hop_and_odd_worlds_use_both_ways_throughout() {
        for world in 2..=16 {
            for k in 0..hops(world) {
                let both = hop(0, world, k).left.is_some();
                let last = k + 1 == hops(world);
                assert_eq!(both, !(world % 2 == 0 && last), "world {world} hop {k}");
            }
        }
        assert_eq!(
            hop(2, 4, 0),
            Hop { right: Move { send: 2, recv: 1 }, left: Some(Move { send: 2, recv: 3 }) }
        );
        assert_eq!(hop(2, 4, 1), Hop { right: Move { send: 1, recv: 0 }, left: None });
    }
}
