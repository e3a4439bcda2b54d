//! The ring plan: the allreduce's ring path as a [`FramePlan`]. A reduce-scatter rightward
//! round the ring, after which this rank owns segment `rank + 1` folded over every rank, then an
//! allgather of the owned segments. When each segment is one slice (the sizes whose time is
//! hops), the allgather runs both ways round the ring at once ([`twoway`], with segment `b + 1`
//! as rank `b`'s block): `world - 1 + floor(world / 2)` hops instead of the `2(world - 1)` of a
//! one-way ring, with the same bytes. Sliced segments are gathered rightward
//! ([`RingPlan::two_way`]).
//!
//! Each segment is cut into `count` slices ([`schedule::slices_of`]), and the slices go round in
//! windows of [`schedule::window`] slices (the last one smaller): the rightward frames of a window are
//! its steps in order, each step made of its slices in order, so the window's slices travel
//! side by side and a step pays the link's latency once for all of them, not once per slice.
//! Window `g + 1` sets off behind window `g`. A frame forwards what the frame of the same slice
//! one step before brought (folded, in the reduce-scatter); the first step of a slice sends this
//! rank's own values, and the first leftward frame (when segments are one slice, so there is no
//! window to speak of) this rank's owned segment once the reduce-scatter has folded it. The
//! order of frames never changes which values meet: each element still meets the ranks in its
//! segment's fold order, so the window changes no result bit.
//!
//! Nothing is overwritten before it is sent:
//! - Rightward, a rank takes in at most one frame more than it has sent: frame `j` comes in once
//!   frame `j - 1` is out. Step `s` of the reduce-scatter sends segment `rank - s` and receives
//!   segment `rank - s - 1`, and hop `h` of the rightward gather overwrites slice `k` of segment
//!   `rank - h`, which the reduce-scatter sent at step `h` of slice `k`, an earlier frame. The
//!   credit also keeps the ring in step without a barrier (the socket buffers hold what a
//!   neighbour sends beyond it; reading further ahead measured slower).
//! - Leftward hop `h` overwrites segment `rank + h + 2`, which the reduce-scatter sent at step
//!   `world - h - 2`: it comes in once that rightward frame is out. An honest right neighbour
//!   cannot send it earlier (the segment was folded on its way through this rank), so the gate
//!   only guards the buffer against a peer that does.
//! - The two ways carry different segments, and no way sends what the other overwrites.
//!
//! [`schedule::window`]: choice::window

use std::ops::Range;

use silvic_core::CollectiveError;

use super::choice;
use super::element::{Element, as_bytes, as_bytes_mut, elements};
use super::layout::Segments;
use super::schedule::{self, pass, segment};
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::shared::{FOLD_SCRATCH, LEFTWARD, RIGHTWARD, Scratch, TWO_WAYS, wire_dir};
use super::twoway::{self, Move};
use crate::frame::{Header, Path};

/// The ring path as a plan (see the module doc).
struct RingPlan<'a, T, C> {
    call: Call,
    /// The segments it reduces: the whole buffer's, or one channel's pieces of them.
    segments: Segments<'a, T>,
    /// The call's whole buffer in bytes, which every frame names (a channel's too).
    total: u64,
    combine: C,
    count: usize,
    /// Slices that go round side by side ([`choice::window`]).
    window: usize,
    scratch: &'a mut [u8],
    /// Per way, the frame being received.
    filling: [Filling; 2],
}

/// Where an incoming frame of one way stands: the frame, its bytes in so far, and how many of
/// them wait in the fold scratch to be folded (fewer than one element once folded).
#[derive(Debug, Clone, Copy)]
struct Filling {
    frame: usize,
    bytes: usize,
    pending: usize,
}

impl Filling {
    const NONE: Filling = Filling { frame: usize::MAX, bytes: 0, pending: 0 };
}

/// What one frame of the ring path moves: the slice, the segments sent and received, and
/// whether what comes in is folded (the reduce-scatter) rather than copied.
#[derive(Debug, Clone, Copy)]
struct RingFrame {
    slice: usize,
    send: usize,
    recv: usize,
    folds: bool,
    /// Its index among the slice's frames on its way.
    at: usize,
}

impl<T: Element, C: Fn(T, T) -> T> RingPlan<'_, T, C> {
    /// Whether the reduced segments are gathered both ways: when each segment is one slice.
    /// Sliced segments are gathered rightward only, step by step behind the reduce-scatter: their
    /// time is the bytes, not the hops, and gathering them both ways made world 4 slower at 2 and
    /// 16 MiB on loopback.
    fn two_way(&self) -> bool {
        self.count == 1
    }

    /// Frames per slice on `way`.
    fn per_slice(&self, way: usize) -> usize {
        let world = self.call.world;
        match (way, self.two_way()) {
            (RIGHTWARD, true) => world - 1 + twoway::hops(world),
            (RIGHTWARD, false) => 2 * (world - 1),
            (_, true) => twoway::left_hops(world),
            (_, false) => 0,
        }
    }

    /// The slices of the window slice `k` belongs to: the first, and how many.
    fn window_of(&self, k: usize) -> (usize, usize) {
        let first = k - k % self.window;
        (first, self.window.min(self.count - first))
    }

    /// The index among the rightward frames of step `at` of slice `k`.
    fn right_index(&self, k: usize, at: usize) -> usize {
        let (first, slices) = self.window_of(k);
        first * self.per_slice(RIGHTWARD) + at * slices + (k - first)
    }

    /// What frame `i` on `way` moves.
    fn frame(&self, way: usize, i: usize) -> RingFrame {
        let Call { rank, world, .. } = self.call;
        let per = self.per_slice(way);
        // Rightward frames go window by window, step by step, slice by slice (see the module
        // doc); leftward ones exist only for one-slice segments, slice by slice.
        let (at, slice) = if way == RIGHTWARD {
            let first = i / (per * self.window) * self.window;
            let (first, slices) = self.window_of(first);
            let offset = i - first * per;
            (offset / slices, first + offset % slices)
        } else {
            (i % per, i / per)
        };
        // The gather moves owned segments: rank `b` owns segment `b + 1`.
        let owned = |m: Move| ((m.send + 1) % world, (m.recv + 1) % world);
        let ((send, recv), folds) = match way {
            RIGHTWARD if at < world - 1 => {
                let p = pass(rank, world, at, 0);
                ((p.send, p.recv), true)
            }
            RIGHTWARD if self.two_way() => {
                (owned(twoway::hop(rank, world, at + 1 - world).right), false)
            }
            RIGHTWARD => {
                let p = pass(rank, world, at + 1 - world, 1);
                ((p.send, p.recv), false)
            }
            _ => {
                let hop = twoway::hop(rank, world, at).left;
                (owned(hop.expect("a leftward hop within the leftward frames")), false)
            }
        };
        RingFrame { slice, send, recv, folds, at }
    }

    /// Slice `k` of segment `seg`, within the segment.
    fn slice(&self, seg: usize, k: usize) -> Range<usize> {
        segment(self.segments.part(self.call.world, seg).len(), self.count, k)
    }

    fn frame_header(&self, way: usize, seg: usize, k: usize) -> Header {
        let len = (self.slice(seg, k).len() * size_of::<T>()) as u64;
        let head = Header::data(self.call.op, self.call.seq, self.total, len).on(Path::Ring);
        head.carrying(wire_dir(way), seg)
    }
}

impl<T: Element, C: Fn(T, T) -> T> FramePlan for RingPlan<'_, T, C> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &TWO_WAYS
    }
    fn frames(&self, way: usize) -> usize {
        self.per_slice(way) * self.count
    }
    fn header(&self, way: usize, i: usize) -> Header {
        let f = self.frame(way, i);
        self.frame_header(way, f.send, f.slice)
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        let f = self.frame(way, j);
        self.frame_header(way, f.recv, f.slice)
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        let i = progress.sent[way];
        let f = self.frame(way, i);
        match way {
            // A step forwards what the slice's step before brought.
            RIGHTWARD => {
                f.at == 0 || progress.received[RIGHTWARD] > self.right_index(f.slice, f.at - 1)
            }
            // The owned segment is whole once the slice's last reduce-scatter frame is in.
            _ if f.at == 0 => {
                let folded = self.right_index(f.slice, self.call.world - 2);
                progress.received[RIGHTWARD] > folded
            }
            _ => progress.received[LEFTWARD] >= i,
        }
    }
    fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool {
        let j = progress.received[way];
        match way {
            RIGHTWARD => j <= progress.sent[RIGHTWARD],
            _ => {
                let f = self.frame(way, j);
                let step = self.call.world - f.at - 2;
                progress.sent[RIGHTWARD] > self.right_index(f.slice, step)
            }
        }
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        let f = self.frame(way, i);
        as_bytes(&self.segments.part(self.call.world, f.send)[self.slice(f.send, f.slice)])
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        let filling = self.filling[way];
        let filling =
            if filling.frame == j { filling } else { Filling { frame: j, ..Filling::NONE } };
        self.filling[way] = filling;
        let f = self.frame(way, j);
        let dst = self.slice(f.recv, f.slice);
        if !f.folds {
            let part = self.segments.part_mut(self.call.world, f.recv);
            return &mut as_bytes_mut(&mut part[dst])[filling.bytes..];
        }
        let left = dst.len() * size_of::<T>() - filling.bytes;
        let room = (self.scratch.len() - filling.pending).min(left);
        &mut self.scratch[filling.pending..filling.pending + room]
    }
    fn commit(&mut self, way: usize, j: usize, n: usize) {
        let f = self.frame(way, j);
        let dst = self.slice(f.recv, f.slice);
        let filling = &mut self.filling[way];
        if !f.folds {
            filling.bytes += n;
            return;
        }
        // dst[i] = combine(received[i], dst[i]): the received value is the earlier accumulator.
        let done = (filling.bytes - filling.pending) / size_of::<T>();
        filling.bytes += n;
        filling.pending += n;
        let whole = filling.pending / size_of::<T>();
        let pending = filling.pending;
        filling.pending -= whole * size_of::<T>();
        let part = self.segments.part_mut(self.call.world, f.recv);
        let dst = &mut part[dst][done..done + whole];
        for (d, acc) in dst.iter_mut().zip(elements::<T>(&self.scratch[..whole * size_of::<T>()])) {
            *d = (self.combine)(acc, *d);
        }
        self.scratch.copy_within(whole * size_of::<T>()..pending, 0);
    }
    fn folds(&self, way: usize, j: usize) -> bool {
        self.frame(way, j).folds
    }
}

/// The ring path: [`RingPlan`] over the link.
pub(crate) fn ring_allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let total = size_of_val(buf) as u64;
    ring_allreduce_of(link, call, (Segments::Whole(buf), total), combine, scratch)
}

/// The ring path over `segments` (the whole buffer's, or one channel's pieces of them), its
/// frames naming the call's `total` bytes.
pub(crate) fn ring_allreduce_of<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    (segments, total): (Segments<'_, T>, u64),
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let count = schedule::slices_of(segments.longest(call.world), size_of::<T>());
    scratch.fold.resize(FOLD_SCRATCH, 0);
    let mut plan = RingPlan {
        call,
        segments,
        total,
        combine,
        count,
        window: choice::window(link.network()),
        scratch: &mut scratch.fold,
        filling: [Filling::NONE; 2],
    };
    link.run(&mut plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::allreduce;
    use crate::ring::mem::{Dice, Driver, on_ring};
    use crate::ring::oracle::{assert_gates_keep_the_rule, bits, input, reference};
    use silvic_core::{Op, fold};

    #[test]
    fn ring_path_equals_the_fold_order_oracle() {
        for world in 1..=16 {
            let base = 512 + world; // at or above the 4 KiB cut
            for len in [base, base + 1, 512, 513, 1000, 4099] {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let expected = bits(&reference(&inputs, fold::sum_f64));
                let results = on_ring(Driver::new(world), |r, link| {
                    let mut buf = inputs[r].clone();
                    let mut scratch = Scratch::default();
                    ring_allreduce(
                        link,
                        Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 },
                        &mut buf,
                        fold::sum_f64,
                        &mut scratch,
                    )
                    .unwrap();
                    bits(&buf)
                });
                for got in results {
                    assert_eq!(got, expected, "world {world} len {len}");
                }
            }
        }
    }

    /// The ring plan under every order of moves its gates allow (sampled at random, streams
    /// holding one frame, two, or any number), for worlds 1..=16, 1..=4 slices per segment,
    /// windows of 1..=4 slices and several lengths:
    /// every rank ends with the oracle's bits, and no order gets stuck. A gate one frame too
    /// loose lets a frame forward what has not come in, or overwrite what is not yet out, and
    /// some order then shows it in the bits; one that waits in a circle gets stuck.
    #[test]
    fn ring_plan_gives_the_oracle_bits_in_any_order_its_gates_allow() {
        let mut seeds = Dice(0x9e37_79b9_7f4a_7c15);
        for world in 1..=16 {
            for count in 1..=4 {
                for len in [world * count, 2 * world * count + 1, 5 * world * count + 3] {
                    let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                    let expected = bits(&reference(&inputs, fold::sum_f64));
                    let runs = [(1, 1), (2, 2), (1000, 3), (1, 4), (2, 3), (1000, 2)];
                    for (capacity, window) in runs {
                        let seed = seeds.below(usize::MAX) as u64;
                        let driver = Driver::new(world).seed(seed).capacity(capacity).piece(20);
                        let case = format!(
                            "world {world} count {count} window {window} len {len} seed {seed}"
                        );
                        let results = on_ring(driver, |rank, link| {
                            let mut buf = inputs[rank].clone();
                            let mut scratch = [0u8; 20];
                            let total = (buf.len() * 8) as u64;
                            let mut plan = RingPlan {
                                call: Call { rank, world, op: Op::AllreduceSumF64, seq: 0 },
                                segments: Segments::Whole(&mut buf[..]),
                                total,
                                combine: fold::sum_f64,
                                count,
                                window,
                                scratch: &mut scratch,
                                filling: [Filling::NONE; 2],
                            };
                            link.run(&mut plan).map(|()| bits(&buf))
                        });
                        for (r, got) in results.into_iter().enumerate() {
                            let got = got.unwrap_or_else(|e| panic!("{case}: rank {r}: {e}"));
                            assert!(got == expected, "{case}: rank {r}");
                        }
                    }
                }
            }
        }
    }

    /// Calls `check` with every rank's ring plan of each world in `worlds`, in the shapes (slices,
    /// window) the plan tests cover, and the case's name.
    fn each_ring_plan(
        worlds: std::ops::RangeInclusive<usize>,
        mut check: impl FnMut(&RingPlan<'_, f64, fn(f64, f64) -> f64>, &str),
    ) {
        for world in worlds {
            for (count, window) in [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (4, 3), (5, 2), (3, 3)]
            {
                let mut buf = vec![0.0f64; world * count * 2];
                let mut scratch = vec![0u8; 64];
                for rank in 0..world {
                    let plan = RingPlan {
                        call: Call { rank, world, op: Op::AllreduceSumF64, seq: 0 },
                        segments: Segments::Whole(&mut buf),
                        total: (world * count * 16) as u64,
                        combine: fold::sum_f64 as fn(f64, f64) -> f64,
                        count,
                        window,
                        scratch: &mut scratch,
                        filling: [Filling::NONE; 2],
                    };
                    check(
                        &plan,
                        &format!("world {world} count {count} window {window} rank {rank}"),
                    );
                }
            }
        }
    }

    /// The ring plan's gates, structurally, for worlds 2..=16, 1..=5 slices in windows of 1..=3
    /// and every rank: of a
    /// frame coming in and a frame going out with the same slice, one always comes before the
    /// other, whatever order the link moves them in. So no frame overwrites a slice that a frame
    /// still on its way out is reading. An honest neighbour cannot send a frame before the gate
    /// that holds it would open (what it carries went through this rank first), so the
    /// interleaving test above cannot see a receive gate that is too loose; this one does.
    #[test]
    #[allow(clippy::needless_range_loop)] // events index several tables at once
    fn ring_plan_never_takes_in_a_slice_while_a_frame_out_may_still_be_reading_it() {
        each_ring_plan(2..=16, |plan, case| {
            let frames = [plan.frames(RIGHTWARD), plan.frames(LEFTWARD)];
            // Four chains of events: out rightward, out leftward, in rightward, in
            // leftward. An event is (chain, index); `clock[event][c]` counts the events
            // of chain `c` that come before it in every order the gates allow.
            let len = |c: usize| frames[c % 2];
            let gate = |c: usize, i: usize, before: [usize; 4]| {
                let (mut sent, mut received) = ([before[0], before[1]], [before[2], before[3]]);
                if c < 2 {
                    sent[c] = i;
                } else {
                    received[c - 2] = i;
                }
                let progress = Moved { sent: &sent, received: &received };
                if c < 2 { plan.ready(c, progress) } else { plan.may_receive(c - 2, progress) }
            };
            // What each gate needs directly: per other chain, the fewest events that
            // open it with every other chain as far on as it goes.
            let all = [frames[0], frames[1], frames[0], frames[1]];
            let mut clock: Vec<Vec<[usize; 4]>> = (0..4)
                .map(|c| {
                    (0..len(c))
                        .map(|i| {
                            let mut need = [0; 4];
                            need[c] = i;
                            for o in (0..4).filter(|&o| o != c) {
                                let opens = |k: usize| {
                                    let mut before = all;
                                    before[o] = k;
                                    gate(c, i, before)
                                };
                                need[o] = (0..=all[o]).find(|&k| opens(k)).unwrap();
                            }
                            need
                        })
                        .collect()
                })
                .collect();
            // What comes before an event's predecessors comes before it.
            loop {
                let mut changed = false;
                for c in 0..4 {
                    for i in 0..len(c) {
                        let mut need = clock[c][i];
                        for o in 0..4 {
                            if need[o] > 0 {
                                let prior = clock[o][need[o] - 1];
                                for x in 0..4 {
                                    need[x] = need[x].max(prior[x]);
                                }
                            }
                        }
                        if raise(&mut clock[c][i], need) {
                            changed = true;
                        }
                    }
                }
                if !changed {
                    break;
                }
            }
            for c in 0..4 {
                for i in 0..len(c) {
                    assert!(clock[c][i][c] <= i, "{case}: chain {c} event {i} waits on itself");
                }
            }
            let slice_of = |c: usize, i: usize| {
                let f = plan.frame(c % 2, i);
                (if c < 2 { f.send } else { f.recv }, f.slice)
            };
            for d in 2..4 {
                for j in 0..len(d) {
                    for e in 0..2 {
                        for i in 0..len(e) {
                            let ordered = clock[d][j][e] > i || clock[e][i][d] > j;
                            assert!(
                                slice_of(e, i) != slice_of(d, j) || ordered,
                                "{case}: frame {j} in on way {} may overwrite what frame \
                                 {i} out on way {e} is still sending",
                                d - 2
                            );
                        }
                    }
                }
            }
        });
    }

    /// Raises `clock` to `need`; whether it changed.
    fn raise(clock: &mut [usize; 4], need: [usize; 4]) -> bool {
        let changed = *clock != need;
        *clock = need;
        changed
    }

    /// The ring path's frames: with segments of one slice each rank sends `world - 1 +
    /// floor(world / 2)` frames rightward and `floor((world - 1) / 2)` leftward, so the call
    /// crosses `world - 1 + floor(world / 2)` hops, not `2(world - 1)`; sliced segments make the
    /// `2(world - 1)` rightward steps per slice.
    #[test]
    fn the_ring_path_gathers_one_slice_segments_both_ways() {
        let per_slice = schedule::SLICE_BYTES / 8;
        for world in 1..=9 {
            for (len, count) in [(3 * world + 1, 1), (2 * world * per_slice, 2)] {
                assert_eq!(schedule::slices(len, world, 8), count, "world {world}");
                let sent = on_ring(Driver::new(world), |r, link| {
                    let mut buf = input(r, len);
                    let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
                    ring_allreduce(link, call, &mut buf, fold::sum_f64, &mut Scratch::default())
                        .unwrap();
                    link.sent.clone()
                });
                let expected = match count {
                    1 => [world - 1 + world / 2, (world - 1) / 2],
                    _ => [2 * (world - 1) * count, 0],
                };
                assert!(sent.iter().all(|s| *s == expected), "world {world}: {sent:?}");
            }
        }
    }

    /// Segments of several slices: slice by slice round the ring, the fold order holds.
    #[test]
    fn sliced_segments_equal_the_fold_order_oracle() {
        let per_slice = schedule::SLICE_BYTES / 8;
        for (world, count) in [(1, 2), (2, 3), (3, 2), (4, 3), (7, 2), (16, 2)] {
            // Segments one element longer than count - 1 slices: `count` slices each.
            let len = world * ((count - 1) * per_slice + 1) - (world > 2) as usize;
            assert_eq!(schedule::slices(len, world, 8), count, "world {world}");
            let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
            let expected = bits(&reference(&inputs, fold::sum_f64));
            let results = on_ring(Driver::new(world), |r, link| {
                let mut buf = inputs[r].clone();
                let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
                allreduce(link, call, &mut buf, fold::sum_f64, &mut Scratch::default()).unwrap();
                bits(&buf)
            });
            for (r, got) in results.into_iter().enumerate() {
                assert!(got == expected, "world {world} len {len} rank {r}");
            }
        }
    }

    /// The ring plan keeps the seam's rule for worlds 1..=16, 1..=5 slices in windows of 1..=3
    /// and every rank.
    #[test]
    fn ring_gates_look_only_at_earlier_frames_and_ways() {
        each_ring_plan(1..=16, |plan, case| assert_gates_keep_the_rule(plan, case));
    }
}
