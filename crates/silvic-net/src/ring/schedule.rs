//! The ring schedule as pure functions: how a buffer is cut into segments, which segment moves
//! at which step, and the order in which every element is folded.
//!
//! Everything here is arithmetic on `(rank, world, step, length)`: no sockets, no clocks, no
//! state. The plans ([`super::gather`], [`super::ring_path`]) execute it and the tests check it.

use std::ops::Range;

use super::seam::Network;

/// Buffers of fewer bytes than this always take the gather path: one allgather of whole
/// buffers, folded locally in [`fold_order`].
pub(crate) const SMALL_BYTES: usize = 4096;

// The cost model that picks the path from 4 KiB up. A call costs its hops times the cost of a
// hop plus the bytes one rank sends over the link rate:
//
//   gather: floor(n/2) hops, (n - 1) × S bytes
//   ring:   n - 1 + floor(n/2) hops, 2(n - 1)/n × S bytes
//
// (the gather, and the ring's allgather of reduced segments, run both ways round the ring at
// once, super::twoway), so the gather wins while (n - 1) × S × (1 - 2/n) / rate < (n - 1) hops,
// that is while S × (n - 2)/n < hop × rate: at worlds 1 and 2 always, and at larger worlds below
// a cut that falls towards hop × rate as n grows. The constants are loopback figures of a shared
// 2-core VM (docs/performance.md, "The cut between the two paths"); on another network, measure a
// hop and the per-rank rate with silvic-bench and change them here.

/// What one hop costs, in nanoseconds: a wake-up and a small frame's way to the neighbour (a
/// loopback figure, the one that puts the cut where the two paths measured the same;
/// docs/performance.md, "The cut between the two paths", gives the measurements).
pub(crate) const HOP_NS: u64 = 10_000;

/// The rate at which one rank's bytes leave it, in bytes per microsecond (1500 is 1.5 GB/s, a
/// loopback figure; docs/performance.md gives the measurements).
pub(crate) const RATE_BYTES_PER_US: u64 = 1_500;

/// The most memory the gather path may hold for the gathered buffers (`world × bytes`) above
/// [`SMALL_BYTES`]: past it the ring is taken whatever the model says, so the gather's extra
/// memory is at most `max(GATHER_MAX_BYTES, world × 4 KiB)`.
pub(crate) const GATHER_MAX_BYTES: usize = 1 << 20;

/// Whether an allreduce of `bytes` in a world of `world` takes the gather path (else the ring).
///
/// Below [`SMALL_BYTES`] always; above it, when the gathered buffers fit in
/// [`GATHER_MAX_BYTES`] and the model above says the gather is cheaper. Either path gives the
/// same bits, so this only decides the speed (and the memory).
pub(crate) fn uses_gather(bytes: usize, world: usize) -> bool {
    if bytes < SMALL_BYTES {
        return true;
    }
    if world.saturating_mul(bytes) > GATHER_MAX_BYTES {
        return false;
    }
    if world <= 2 {
        // The same bytes in no more hops: nothing for the ring to win.
        return true;
    }
    // Compared in integers, scaled by n × RATE (bytes per us) × 1000 (ns per us):
    // gather < ring  <=>  (n - 2) × S × 1000 < n × HOP_NS × RATE.
    let (n, s) = (world as u128, bytes as u128);
    (n - 2) * s * 1000 < n * u128::from(HOP_NS) * u128::from(RATE_BYTES_PER_US)
}

/// The largest buffer, in bytes, that takes the gather path in a world of `world`: every
/// smaller size does too, every larger one takes the ring.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn gather_limit(world: usize) -> usize {
    // `uses_gather` is monotone in the size, so a binary search over [SMALL_BYTES, cap] finds
    // the edge; past `cap` the memory bound alone refuses it.
    let cap = GATHER_MAX_BYTES.max(SMALL_BYTES);
    let (mut lo, mut hi) = (SMALL_BYTES - 1, cap + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if uses_gather(mid, world) { lo = mid } else { hi = mid }
    }
    lo
}

/// Bytes of a ring slice: each segment is cut into slices of about this size, a rank forwards
/// a slice as soon as it has folded it (while it is still in cache), and the next slice sets off
/// round the ring behind it. docs/performance.md ("How the ring path was chosen") has the
/// comparison that chose this size.
pub(crate) const SLICE_BYTES: usize = 256 * 1024;

/// The widest window [`window`] gives: a bound on the frames a rank has in flight per way.
pub(crate) const MAX_WINDOW: usize = 8;

/// Slices of a segment that go round the ring side by side (the ring plan's window) on
/// `network`: the frames of a window's slices go step by step, so a step pays a hop once for
/// all of them rather than once per slice. One slice, plus as many as leave a rank at
/// [`RATE_BYTES_PER_US`] while a hop passes: one on loopback, where a slice is best forwarded
/// while its fold is still in cache, more where hops are long (docs/ring-window.md). Every rank
/// must use the same window (it orders the frames on the wire): every rank has the same
/// `network`.
pub(crate) fn window(network: Network) -> usize {
    let in_flight = u128::from(network.hop_ns) * u128::from(RATE_BYTES_PER_US) / 1000;
    let extra = in_flight / SLICE_BYTES as u128;
    1 + usize::try_from(extra).unwrap_or(usize::MAX).min(MAX_WINDOW - 1)
}

/// How many slices each segment of a `len`-element buffer (`elem` bytes each) is cut into in a
/// world of `world`: enough that the longest segment's slices hold at most [`SLICE_BYTES`],
/// and at least one.
pub(crate) fn slices(len: usize, world: usize, elem: usize) -> usize {
    let longest = len.div_ceil(world) * elem;
    longest.div_ceil(SLICE_BYTES).max(1)
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
    fn below_four_kib_the_gather_is_always_taken() {
        for world in [1, 2, 3, 4, 8, 16, 64, 1000, 1 << 20] {
            assert!(uses_gather(0, world) && uses_gather(4095, world), "world {world}");
        }
    }

    #[test]
    fn the_model_picks_the_cheaper_path_within_the_memory_bound() {
        // World 2: the gather sends the same bytes in half the hops, up to the memory bound.
        assert!(uses_gather(GATHER_MAX_BYTES / 2, 2));
        assert!(!uses_gather(GATHER_MAX_BYTES / 2 + 8, 2));
        // A world of one and of two have no reason to take the ring below the bound.
        assert_eq!(gather_limit(1), GATHER_MAX_BYTES);
        // From world 3 the cut falls towards hop × rate (15 000 bytes here) as n grows (up to
        // world 60, below where the memory bound cuts first).
        let hop_bytes = (HOP_NS * RATE_BYTES_PER_US / 1000) as usize;
        let cuts: Vec<usize> = (3..=60).map(gather_limit).collect();
        assert!(cuts.windows(2).all(|w| w[0] >= w[1]), "{cuts:?}");
        assert!(cuts.iter().all(|&c| c >= hop_bytes), "{cuts:?}");
        // World 4: the ring's 3 + 2 hops against the gather's 2, and the gather sends
        // (n - 1)(n - 2)/n = 3/2 × S more: S < 2 × hop × rate.
        assert_eq!(gather_limit(4), 2 * hop_bytes - 1);
        // Large worlds hit the memory bound before the model's cut, but never go under 4 KiB.
        assert_eq!(gather_limit(100), GATHER_MAX_BYTES / 100);
        assert_eq!(gather_limit(1000), SMALL_BYTES - 1);
    }

    #[test]
    fn the_gather_limit_is_the_edge_of_the_model() {
        for world in 1..=70 {
            let limit = gather_limit(world);
            assert!(uses_gather(limit, world), "world {world}");
            assert!(!uses_gather(limit + 1, world), "world {world}");
            for bytes in (0..limit).step_by(997) {
                assert!(uses_gather(bytes, world), "world {world} bytes {bytes}");
            }
            for bytes in (limit + 1..4 * GATHER_MAX_BYTES).step_by(7919) {
                assert!(!uses_gather(bytes, world), "world {world} bytes {bytes}");
            }
            // The memory bound holds above 4 KiB.
            assert!(limit < SMALL_BYTES || world * limit <= GATHER_MAX_BYTES, "world {world}");
        }
    }

    #[test]
    fn the_window_is_one_slice_until_a_hop_outlasts_a_slice_and_is_bounded() {
        let window = |hop_us: u64| window(Network { hop_ns: hop_us * 1000, ..Network::UNMEASURED });
        assert_eq!(window(0), 1);
        assert_eq!(window(10), 1, "a loopback hop");
        // A slice leaves a rank in SLICE_BYTES / RATE microseconds.
        let slice_us = (SLICE_BYTES as u64).div_ceil(RATE_BYTES_PER_US);
        assert_eq!(window(slice_us - 1), 1);
        assert_eq!(window(slice_us), 2);
        assert_eq!(window(500), 1 + 500 / slice_us as usize);
        assert_eq!(window(u64::MAX / 1000), MAX_WINDOW);
        assert_eq!(
            super::window(Network {
                hop_ns: u64::MAX,
                chords: true,
                bytes_per_us: 1,
                folds_per_us: 1
            }),
            MAX_WINDOW
        );
        for hop_us in 0..5000 {
            assert!(window(hop_us) <= window(hop_us + 1), "not monotone at {hop_us} us");
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
