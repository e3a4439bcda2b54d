//! The ring schedule as pure functions: how a buffer is cut into segments, which segment moves
//! at which step, and the order in which every element is folded.
//!
//! Everything here is arithmetic on `(rank, world, step, length)`: no sockets, no clocks, no
//! state. [`super::run`] executes it and the tests check it.

use std::ops::Range;

/// Buffers of fewer bytes than this take the small path: one allgather of whole buffers, folded
/// locally in [`fold_order`].
pub(crate) const SMALL_BYTES: usize = 4096;

/// Whether an allreduce of `bytes` takes the small path.
pub(crate) fn is_small(bytes: usize) -> bool {
    bytes < SMALL_BYTES
}

/// The elements of segment `j` of a buffer of `len` elements cut into `world` segments.
///
/// Segments are contiguous, in order, and differ in length by at most one (the first
/// `len % world` are one longer); some are empty when `len < world`.
pub(crate) fn segment(len: usize, world: usize, j: usize) -> Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = |k: usize| k * base + k.min(extra);
    start(j)..start(j + 1)
}

/// The segment that element `i` of a buffer of `len` elements belongs to.
pub(crate) fn segment_of(i: usize, len: usize, world: usize) -> usize {
    let (base, extra) = (len / world, len % world);
    let long = extra * (base + 1);
    if i < long { i / (base + 1) } else { extra + (i - long) / base }
}

/// What one rank does in one step of a ring pass: the block it sends right and the block it
/// receives from the left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    pub(crate) send: usize,
    pub(crate) recv: usize,
}

/// Step `step` of a ring pass in which each rank `r` starts by sending block `r + start`.
///
/// Every step, each block moves one rank to the right: rank `r` sends the block it received in
/// the step before and receives the block its left neighbour holds. A reduce-scatter is
/// `world - 1` steps with `start = 0`, after which rank `r` holds block `r + 1` folded over every
/// rank; the allgather that follows is `world - 1` steps with `start = 1`, and a plain allgather
/// of one block per rank uses `start = 0`.
pub(crate) fn pass(rank: usize, world: usize, step: usize, start: usize) -> Pass {
    let send = (rank + start + world - step % world) % world;
    Pass { send, recv: (send + world - 1) % world }
}

/// The ranks whose values are folded into segment `j`, in order: `j, j + 1, …, j - 1` (mod
/// `world`). The first is the starting accumulator; each later one is combined as
/// `acc = combine(acc, value)`.
///
/// This is the order the reduce-scatter produces (segment `j` sets off from rank `j` and gathers
/// one rank per step), and the small path folds in the same order, so the path an allreduce
/// takes never changes a result bit.
pub(crate) fn fold_order(j: usize, world: usize) -> impl Iterator<Item = usize> {
    (0..world).map(move |k| (j + k) % world)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(world: usize) -> Vec<usize> {
        let mut out = vec![0, 1, 2, 3, 7, 511, 512, 513, 1000];
        for k in 1..=3 {
            for d in [-1i64, 0, 1] {
                let l = (k * world) as i64 + d;
                if l >= 0 {
                    out.push(l as usize);
                }
            }
        }
        out
    }

    #[test]
    fn segments_partition_the_buffer() {
        for world in 1..=16 {
            for len in lengths(world) {
                let mut next = 0;
                for j in 0..world {
                    let s = segment(len, world, j);
                    assert_eq!(s.start, next, "len {len} world {world} segment {j}");
                    assert!(s.len() == len / world || s.len() == len / world + 1);
                    for i in s.clone() {
                        assert_eq!(segment_of(i, len, world), j, "len {len} world {world} i {i}");
                    }
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[allow(clippy::needless_range_loop)] // ranks index several tables at once
    /// Runs the schedule symbolically: each rank holds, per segment, the list of ranks folded
    /// into it so far.
    #[test]
    fn reduce_scatter_folds_each_segment_once_per_rank_in_fold_order() {
        for world in 1..=16 {
            let mut held: Vec<Vec<Vec<usize>>> =
                (0..world).map(|r| (0..world).map(|_| vec![r]).collect()).collect();
            for step in 0..world - 1 {
                let sent: Vec<(usize, Vec<usize>)> = (0..world)
                    .map(|r| {
                        let p = pass(r, world, step, 0);
                        (p.send, held[r][p.send].clone())
                    })
                    .collect();
                for r in 0..world {
                    let p = pass(r, world, step, 0);
                    let left = (r + world - 1) % world;
                    assert_eq!(sent[left].0, p.recv, "world {world} step {step} rank {r}");
                    let mut folded = sent[left].1.clone();
                    folded.push(r);
                    held[r][p.recv] = folded;
                }
            }
            for (r, segments) in held.iter().enumerate() {
                let owned = (r + 1) % world;
                let expected: Vec<usize> = fold_order(owned, world).collect();
                assert_eq!(segments[owned], expected, "world {world} rank {r}");
            }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn allgather_passes_deliver_every_block_to_every_rank() {
        for world in 1..=16 {
            for start in [0, 1] {
                let mut has: Vec<Vec<bool>> = (0..world)
                    .map(|r| (0..world).map(|b| b == (r + start) % world).collect())
                    .collect();
                for step in 0..world - 1 {
                    for r in 0..world {
                        let p = pass(r, world, step, start);
                        let left = (r + world - 1) % world;
                        assert!(has[r][p.send], "rank {r} sends a block it lacks");
                        assert_eq!(pass(left, world, step, start).send, p.recv);
                    }
                    for r in 0..world {
                        let p = pass(r, world, step, start);
                        has[r][p.recv] = true;
                    }
                }
                assert!(has.iter().flatten().all(|&h| h), "world {world} start {start}");
            }
        }
    }

    #[test]
    fn the_small_cut_is_four_kib() {
        assert!(is_small(4095));
        assert!(!is_small(4096));
        assert!(is_small(0));
    }
}
