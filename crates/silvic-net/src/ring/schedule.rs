//! The ring schedule as pure functions: how a buffer is cut into segments, which segment moves
//! at which step, and the order in which every element is folded.
//!
//! Everything here is arithmetic on `(rank, world, step, length)`: no sockets, no clocks, no
//! state. The plans ([`super::gather`], [`super::ring_path`]) execute it and the tests check it.

use std::ops::Range;

/// Bytes of a ring slice: each segment is cut into slices of about this size, a rank forwards
/// a slice as soon as it has folded it (while it is still in cache), and the next slice sets off
/// round the ring behind it (docs/paths.md). Larger slices (512 KiB, 1 MiB) measured slower
/// on loopback in most cases.
pub(crate) const SLICE_BYTES: usize = 256 * 1024;

/// The widest window [`window`] gives: a bound on the frames a rank has in flight per way.
///
/// [`window`]: super::choice::window
pub(crate) const MAX_WINDOW: usize = 8;

/// How many slices each segment of a `len`-element buffer (`elem` bytes each) is cut into in a
/// world of `world`: enough that the longest segment's slices hold at most [`SLICE_BYTES`],
/// and at least one. The plans ask [`slices_of`] with their longest segment; the tests ask here.
#[cfg(test)]
pub(crate) fn slices(len: usize, world: usize, elem: usize) -> usize {
    slices_of(len.div_ceil(world), elem)
}

/// How many slices each segment is cut into when the longest holds `longest` elements (`elem`
/// bytes each): enough that each slice holds at most [`SLICE_BYTES`], and at least one.
pub(crate) fn slices_of(longest: usize, elem: usize) -> usize {
    (longest * elem).div_ceil(SLICE_BYTES).max(1)
}

/// The elements of slice `k` of segment `j`, every segment being cut into `count` slices
/// the way [`segment`] cuts the buffer (in order, lengths differing by at most one).
pub(crate) fn slice(len: usize, world: usize, j: usize, count: usize, k: usize) -> Range<usize> {
    let seg = segment(len, world, j);
    let part = segment(seg.len(), count, k);
    seg.start + part.start..seg.start + part.end
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

/// The segment that element `i` of a buffer of `len` elements belongs to: the fold order of
/// element `i` is [`fold_order`] of this segment. The paths work segment by segment, so only
/// the tests' oracles ask per element.
#[cfg(test)]
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
    debug_assert!(j < world);
    (0..world).map(move |k| wrap(j + k, world))
}

/// `at` round a ring of `world` ranks (`at mod world`), for `at < 2 × world`: one subtraction.
/// The plans ask for ranks several times a frame and the fold once per rank folded, where a
/// division costs tens of cycles each time.
pub(crate) fn wrap(at: usize, world: usize) -> usize {
    debug_assert!(at < 2 * world);
    if at >= world { at - world } else { at }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_is_the_remainder_below_twice_the_world_and_the_fold_order_starts_at_its_segment() {
        for world in 1..=9 {
            for at in 0..2 * world {
                assert_eq!(wrap(at, world), at % world, "{at} round {world}");
            }
        }
        assert_eq!(fold_order(2, 5).collect::<Vec<_>>(), [2, 3, 4, 0, 1]);
        assert_eq!(fold_order(0, 1).collect::<Vec<_>>(), [0]);
    }

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
    fn slices_partition_every_segment_within_the_slice_size() {
        let per = SLICE_BYTES / 8; // elements of a whole slice
        for world in 1..=16 {
            for len in [0, 1, world, 1000, per, per + 1, 2 * per * world - 1, 2 * per * world + 3] {
                let count = slices(len, world, 8);
                for j in 0..world {
                    let seg = segment(len, world, j);
                    let mut next = seg.start;
                    for k in 0..count {
                        let s = slice(len, world, j, count, k);
                        assert_eq!(s.start, next, "len {len} world {world} segment {j} slice {k}");
                        assert!(s.len() * 8 <= SLICE_BYTES, "len {len} world {world}");
                        next = s.end;
                    }
                    assert_eq!(next, seg.end, "len {len} world {world} segment {j}");
                }
            }
        }
        assert_eq!(slices(0, 4, 8), 1);
        assert_eq!(slices(4 * per, 4, 8), 1); // segments of one whole slice
        assert_eq!(slices(4 * per + 1, 4, 8), 2);
    }
}
