//! Executes the ring schedule over a [`Link`]: the allreduce paths and the allgather.

use silvic_core::{CollectiveError, Op};

use std::ops::Range;

use super::schedule::{self, pass, segment};
use super::twoway;
use crate::frame::{Dir, Header};

/// Bytes of received data folded at a time. Small enough to stay in cache, large enough that a
/// read moves plenty per system call.
const FOLD_SCRATCH: usize = 128 * 1024;

/// Where the payload of a received frame goes, as it arrives.
pub(crate) trait Sink {
    /// Room for the next bytes; empty once the whole payload has arrived.
    fn space(&mut self) -> &mut [u8];
    /// `n` bytes were written to the front of [`Sink::space`].
    fn commit(&mut self, n: usize);
}

/// One way round the ring in one step: a frame out to the neighbour on one side and a frame in
/// from the neighbour on the other, both travelling the same way.
pub(crate) struct Lane<'a> {
    /// The header of the frame sent.
    pub(crate) header: Header,
    /// The payload sent.
    pub(crate) payload: &'a [u8],
    /// What the header of the frame received must equal (checked before a payload byte is read).
    pub(crate) expect: Header,
    /// Where the payload received goes.
    pub(crate) sink: &'a mut dyn Sink,
}

/// A connection to both ring neighbours.
pub(crate) trait Link {
    /// One ring step: the `right` lane sends to the right neighbour and receives from the left;
    /// the `left` lane, if any, sends to the left neighbour and receives from the right. Every
    /// frame moves at the same time; returns once all are complete.
    fn step(&mut self, right: Lane<'_>, left: Option<Lane<'_>>) -> Result<(), CollectiveError>;

    /// A step with the rightward lane only: sends `header` and `payload` to the right
    /// neighbour while receiving one frame from the left, whose header must equal `expect`.
    fn exchange(
        &mut self,
        header: &Header,
        payload: &[u8],
        expect: &Header,
        sink: &mut dyn Sink,
    ) -> Result<(), CollectiveError> {
        self.step(Lane { header: *header, payload, expect: *expect, sink }, None)
    }
}

/// A number type the ring reduces. Payloads carry its little-endian bytes.
pub(crate) trait Element: bytemuck::Pod {
    fn from_le(bytes: [u8; 8]) -> Self;
}

impl Element for f64 {
    fn from_le(bytes: [u8; 8]) -> Self {
        f64::from_le_bytes(bytes)
    }
}

impl Element for i64 {
    fn from_le(bytes: [u8; 8]) -> Self {
        i64::from_le_bytes(bytes)
    }
}

/// Copies a payload into place.
struct CopySink<'a> {
    dst: &'a mut [u8],
    filled: usize,
}

impl Sink for CopySink<'_> {
    fn space(&mut self) -> &mut [u8] {
        &mut self.dst[self.filled..]
    }
    fn commit(&mut self, n: usize) {
        self.filled += n;
    }
}

/// Folds a payload of partial results into this rank's segment as it arrives:
/// `dst[i] = combine(received[i], dst[i])`, the received value being the earlier accumulator.
///
/// `C` is a type parameter, not a function pointer, so that the combiner inlines into the loop
/// and the fold runs at memory speed rather than one indirect call per element.
struct FoldSink<'a, T, C> {
    dst: &'a mut [T],
    combine: C,
    scratch: &'a mut [u8],
    /// Bytes received so far, folded or pending in `scratch`.
    received: usize,
    /// Bytes at the front of `scratch` not folded yet (fewer than one element once folded).
    pending: usize,
}

impl<T: Element, C: Fn(T, T) -> T> Sink for FoldSink<'_, T, C> {
    fn space(&mut self) -> &mut [u8] {
        let left = self.dst.len() * 8 - self.received;
        let room = (self.scratch.len() - self.pending).min(left);
        &mut self.scratch[self.pending..self.pending + room]
    }

    fn commit(&mut self, n: usize) {
        let done = (self.received - self.pending) / 8;
        self.received += n;
        self.pending += n;
        let whole = self.pending / 8;
        let dst = &mut self.dst[done..done + whole];
        for (d, chunk) in dst.iter_mut().zip(self.scratch[..whole * 8].chunks_exact(8)) {
            let acc = T::from_le(chunk.try_into().expect("chunks of 8"));
            *d = (self.combine)(acc, *d);
        }
        self.scratch.copy_within(whole * 8..self.pending, 0);
        self.pending -= whole * 8;
    }
}

/// Which collective call a ring step belongs to, as this rank sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) op: Op,
    pub(crate) seq: u64,
}

/// Reusable memory of a ring, kept between calls so steady-state collectives do not allocate.
///
/// It grows to the largest call seen and stays there: `fold` is [`FOLD_SCRATCH`] bytes, and
/// `gathered` holds the gather path's `world × bytes`, at most
/// `max(GATHER_MAX_BYTES, world × 4 KiB)` ([`schedule::GATHER_MAX_BYTES`]).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    fold: Vec<u8>,
    gathered: Vec<u8>,
}

/// Borrows `send` of `buf` for reading and `recv` for writing; the ranges must not overlap.
fn send_and_recv<T>(buf: &mut [T], send: Range<usize>, recv: Range<usize>) -> (&[T], &mut [T]) {
    if send.end <= recv.start {
        let (low, high) = buf.split_at_mut(recv.start);
        (&low[send], &mut high[..recv.len()])
    } else {
        assert!(recv.end <= send.start, "a ring step never sends what it receives");
        let (low, high) = buf.split_at_mut(send.start);
        (&high[..send.len()], &mut low[recv])
    }
}

/// The blocks of an allgather, one per rank, all of one length.
trait Blocks {
    /// `reads` for reading and `writes` for writing, as [`pick`] borrows them.
    fn pick(
        &mut self,
        reads: [usize; 2],
        writes: [Option<usize>; 2],
    ) -> ([&[u8]; 2], [Option<&mut [u8]>; 2]);
}

/// One vector per rank, all as long as this rank's: what `allgather_bytes` returns.
impl Blocks for [Vec<u8>] {
    fn pick(
        &mut self,
        reads: [usize; 2],
        writes: [Option<usize>; 2],
    ) -> ([&[u8]; 2], [Option<&mut [u8]>; 2]) {
        pick(self.iter_mut().map(Vec::as_mut_slice), reads, writes)
    }
}

/// Equal blocks laid end to end in one buffer: the gather path's, kept in [`Scratch`].
struct Flat<'a> {
    buf: &'a mut [u8],
    block: usize,
}

impl Blocks for Flat<'_> {
    fn pick(
        &mut self,
        reads: [usize; 2],
        writes: [Option<usize>; 2],
    ) -> ([&[u8]; 2], [Option<&mut [u8]>; 2]) {
        if self.block == 0 {
            // Empty blocks: there is nothing to borrow, and nothing to cut the buffer by.
            let write = writes.map(|w| w.map(|_| <&mut [u8]>::default()));
            return ([&[], &[]], write);
        }
        pick(self.buf.chunks_exact_mut(self.block), reads, writes)
    }
}

/// Borrows, from blocks in rank order, `reads` for reading and `writes` for writing. The two
/// reads may be one block; a write is neither the other write nor a read.
fn pick<'a>(
    blocks: impl Iterator<Item = &'a mut [u8]>,
    reads: [usize; 2],
    writes: [Option<usize>; 2],
) -> ([&'a [u8]; 2], [Option<&'a mut [u8]>; 2]) {
    let (mut read, mut write): ([&[u8]; 2], _) = ([&[], &[]], [None, None]);
    for (i, block) in blocks.enumerate() {
        if writes[0] == Some(i) {
            write[0] = Some(block);
        } else if writes[1] == Some(i) {
            write[1] = Some(block);
        } else {
            let block: &'a [u8] = block;
            for (r, at) in read.iter_mut().zip(reads) {
                if at == i {
                    *r = block;
                }
            }
        }
    }
    (read, write)
}

/// Allgathers one equal-length block per rank: on return `blocks[r]` holds rank `r`'s block.
/// `blocks[rank]` is this rank's on entry. `total` is the length the frames report.
///
/// Two-way ([`twoway`]): each block travels both ways round the ring at once, so the gather
/// takes `floor(world / 2)` steps.
pub(crate) fn allgather(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    blocks: &mut [Vec<u8>],
) -> Result<(), CollectiveError> {
    debug_assert_eq!(blocks.len(), call.world);
    let block = blocks[call.rank].len();
    for b in blocks.iter_mut() {
        b.resize(block, 0);
    }
    gather(link, call, total, block, blocks)
}

/// The two-way allgather over any [`Blocks`] of `block` bytes each.
fn gather<B: Blocks + ?Sized>(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    block: usize,
    blocks: &mut B,
) -> Result<(), CollectiveError> {
    let Call { rank, world, op, seq } = call;
    let header = Header::data(op, seq, total, block as u64);
    for h in 0..twoway::hops(world) {
        let hop = twoway::hop(rank, world, h);
        tracing::debug!(hop = h, ?hop, "allgather hop");
        let reads = [hop.right.send, hop.left.map_or(hop.right.send, |l| l.send)];
        let writes = [Some(hop.right.recv), hop.left.map(|l| l.recv)];
        let ([to_right, to_left], [from_left, from_right]) = blocks.pick(reads, writes);
        let mut right_sink = CopySink { dst: from_left.expect("a rightward block"), filled: 0 };
        let right = Lane {
            header: header.carrying(Dir::Right, hop.right.send),
            payload: to_right,
            expect: header.carrying(Dir::Right, hop.right.recv),
            sink: &mut right_sink,
        };
        let mut left_sink;
        let left = match (hop.left, from_right) {
            (Some(l), Some(dst)) => {
                left_sink = CopySink { dst, filled: 0 };
                Some(Lane {
                    header: header.carrying(Dir::Left, l.send),
                    payload: to_left,
                    expect: header.carrying(Dir::Left, l.recv),
                    sink: &mut left_sink,
                })
            }
            _ => None,
        };
        link.step(right, left)?;
    }
    Ok(())
}

/// Replaces `buf` with its reduction over the ring, `combine` folding in fold order.
pub(crate) fn allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    if schedule::uses_gather(std::mem::size_of_val(buf), call.world) {
        small_allreduce(link, call, buf, combine, scratch)
    } else {
        ring_allreduce(link, call, buf, combine, scratch)
    }
}

/// The gather path: gather every rank's whole buffer, then fold each element in fold order.
fn small_allreduce<T: Element, C: Fn(T, T) -> T>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let Call { rank, world, .. } = call;
    let mine: &[u8] = bytemuck::cast_slice(buf);
    let block = mine.len();
    // Every block is written before it is read, so what the buffer held before does not matter.
    scratch.gathered.resize(world * block, 0);
    let gathered = &mut scratch.gathered[..];
    gathered[rank * block..(rank + 1) * block].copy_from_slice(mine);
    gather(link, call, block as u64, block, &mut Flat { buf: gathered, block })?;
    // Segment by segment, rank by rank in fold order: each element sees the same sequence of
    // combines as one folded alone would, while the inner loop runs straight over memory.
    let len = buf.len();
    for j in 0..world {
        let seg = segment(len, world, j);
        let bytes = seg.start * 8..seg.end * 8;
        let out = &mut buf[seg];
        let mut order = schedule::fold_order(j, world);
        let first = order.next().expect("a world has a rank");
        let values = |r: usize| gathered[r * block..][bytes.clone()].chunks_exact(8);
        for (o, v) in out.iter_mut().zip(values(first)) {
            *o = T::from_le(v.try_into().expect("chunks of 8"));
        }
        for r in order {
            for (o, v) in out.iter_mut().zip(values(r)) {
                *o = combine(*o, T::from_le(v.try_into().expect("chunks of 8")));
            }
        }
    }
    Ok(())
}

/// The ring path: reduce-scatter, after which this rank owns segment `rank + 1` folded over
/// every rank, then allgather the owned segments. Each segment is cut into the same number of
/// slices, and slice `k` of every segment goes all the way round (reduce-scatter and
/// allgather) before slice `k + 1`: each exchange sends what the one before it received and
/// folded. Every element still meets the ranks in its segment's fold order.
fn ring_allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let Call { rank, world, op, seq } = call;
    let total = std::mem::size_of_val(buf) as u64;
    let len = buf.len();
    let count = schedule::slices(len, world, std::mem::size_of::<T>());
    scratch.fold.resize(FOLD_SCRATCH, 0);
    let header = |j: usize, r: &Range<usize>| {
        Header::data(op, seq, total, (r.len() * 8) as u64).carrying(Dir::Right, j)
    };
    for k in 0..count {
        let slice = |j: usize| schedule::slice(len, world, j, count, k);
        for step in 0..world - 1 {
            let p = pass(rank, world, step, 0);
            tracing::debug!(slice = k, step, send = p.send, recv = p.recv, "reduce-scatter step");
            let (send, recv) = (slice(p.send), slice(p.recv));
            let (head, expect) = (header(p.send, &send), header(p.recv, &recv));
            let (send, recv) = send_and_recv(buf, send, recv);
            let mut sink = FoldSink {
                dst: recv,
                combine,
                scratch: &mut scratch.fold,
                received: 0,
                pending: 0,
            };
            link.exchange(&head, bytemuck::cast_slice(send), &expect, &mut sink)?;
        }
        for step in 0..world - 1 {
            let p = pass(rank, world, step, 1);
            tracing::debug!(slice = k, step, send = p.send, recv = p.recv, "allgather step");
            let (send, recv) = (slice(p.send), slice(p.recv));
            let (head, expect) = (header(p.send, &send), header(p.recv, &recv));
            let (send, recv) = send_and_recv(buf, send, recv);
            let mut sink = CopySink { dst: bytemuck::cast_slice_mut(recv), filled: 0 };
            link.exchange(&head, bytemuck::cast_slice(send), &expect, &mut sink)?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;
    use crate::ring::schedule::segment_of;
    use silvic_core::fold;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::sync::{Arc, Condvar, Mutex};

    /// An in-memory ring neighbour: frames travel over channels both ways, and payloads are
    /// handed to the sink in uneven pieces to exercise partial commits.
    pub(crate) struct MemLink {
        to_right: Sender<Vec<u8>>,
        to_left: Sender<Vec<u8>>,
        from_left: Receiver<Vec<u8>>,
        from_right: Receiver<Vec<u8>>,
        left_rank: usize,
        right_rank: usize,
        piece: usize,
        /// Steps taken so far.
        pub(crate) steps: usize,
    }

    pub(crate) fn mem_ring(world: usize) -> Vec<MemLink> {
        // Rank r sends rightward into channel r + 1 and leftward into channel r - 1 of the other
        // set, and receives from channel r of each.
        let (right_tx, right_rx): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
        let (left_tx, left_rx): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
        let mut right_rx: Vec<Option<Receiver<Vec<u8>>>> = right_rx.into_iter().map(Some).collect();
        let mut left_rx: Vec<Option<Receiver<Vec<u8>>>> = left_rx.into_iter().map(Some).collect();
        (0..world)
            .map(|r| MemLink {
                to_right: right_tx[(r + 1) % world].clone(),
                to_left: left_tx[(r + world - 1) % world].clone(),
                from_left: right_rx[r].take().unwrap(),
                from_right: left_rx[r].take().unwrap(),
                left_rank: (r + world - 1) % world,
                right_rank: (r + 1) % world,
                piece: 1 + r * 37 % 4099,
                steps: 0,
            })
            .collect()
    }

    impl MemLink {
        fn receive(
            &self,
            from: &Receiver<Vec<u8>>,
            peer: usize,
            expect: &Header,
            sink: &mut dyn Sink,
        ) -> Result<(), CollectiveError> {
            let got = from.recv().map_err(|_| CollectiveError::PeerClosed { peer })?;
            let head = Header::decode(got[..HEADER_LEN].try_into().unwrap()).unwrap();
            head.expect(expect, peer)?;
            let mut rest = &got[HEADER_LEN..];
            while !rest.is_empty() {
                let space = sink.space();
                let n = space.len().min(self.piece).min(rest.len());
                space[..n].copy_from_slice(&rest[..n]);
                sink.commit(n);
                rest = &rest[n..];
            }
            assert!(sink.space().is_empty(), "payload shorter than the sink");
            Ok(())
        }
    }

    fn frame(header: &Header, payload: &[u8]) -> Vec<u8> {
        [&header.encode()[..], payload].concat()
    }

    impl Link for MemLink {
        fn step(&mut self, right: Lane<'_>, left: Option<Lane<'_>>) -> Result<(), CollectiveError> {
            self.steps += 1;
            let closed = |peer| move |_| CollectiveError::PeerClosed { peer };
            self.to_right
                .send(frame(&right.header, right.payload))
                .map_err(closed(self.right_rank))?;
            if let Some(l) = &left {
                self.to_left.send(frame(&l.header, l.payload)).map_err(closed(self.left_rank))?;
            }
            self.receive(&self.from_left, self.left_rank, &right.expect, right.sink)?;
            if let Some(l) = left {
                self.receive(&self.from_right, self.right_rank, &l.expect, l.sink)?;
            }
            Ok(())
        }
    }

    /// Runs `f` on every rank of an in-memory ring of `world`, one thread each.
    pub(crate) fn on_ring<R: Send>(
        world: usize,
        f: impl Fn(usize, &mut MemLink) -> R + Sync,
    ) -> Vec<R> {
        let links = mem_ring(world);
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = links
                .into_iter()
                .enumerate()
                .map(|(r, mut link)| s.spawn(move || f(r, &mut link)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Inputs whose f64 sums depend on the fold order, so a wrong order shows in the bits.
    fn input(rank: usize, len: usize) -> Vec<f64> {
        (0..len)
            .map(|i| ((i * 7 + rank * 13) % 17) as f64 * 0.1 + 1e16 * (rank % 2) as f64)
            .collect()
    }

    /// The oracle: element `i` folded in fold order of its segment, straight from the schedule.
    fn reference(inputs: &[Vec<f64>], combine: fn(f64, f64) -> f64) -> Vec<f64> {
        let (world, len) = (inputs.len(), inputs[0].len());
        (0..len)
            .map(|i| {
                let mut order = schedule::fold_order(segment_of(i, len, world), world);
                let first = order.next().unwrap();
                order.fold(inputs[first][i], |acc, r| combine(acc, inputs[r][i]))
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn ring_path_equals_the_fold_order_oracle() {
        for world in 1..=16 {
            let base = 512 + world; // at or above the 4 KiB cut
            for len in [base, base + 1, 512, 513, 1000, 4099] {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let expected = bits(&reference(&inputs, fold::sum_f64));
                let results = on_ring(world, |r, link| {
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

    /// Runs `world` ranks over `inputs` with `combine`, each rank both paths in turn, then the
    /// dispatcher (which must take `expect_gather`'s path); returns each rank's three results.
    fn three_ways(
        inputs: &[Vec<f64>],
        combine: fn(f64, f64) -> f64,
        expect_gather: Option<bool>,
    ) -> Vec<[Vec<u64>; 3]> {
        let world = inputs.len();
        on_ring(world, |r, link| {
            let mut scratch = Scratch::default();
            let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
            let mut small = inputs[r].clone();
            small_allreduce(link, call(0), &mut small, combine, &mut scratch).unwrap();
            let mut ring = inputs[r].clone();
            ring_allreduce(link, call(1), &mut ring, combine, &mut scratch).unwrap();
            let mut chosen = inputs[r].clone();
            if let Some(gather) = expect_gather {
                assert_eq!(
                    schedule::uses_gather(chosen.len() * 8, world),
                    gather,
                    "world {world} len {}",
                    chosen.len()
                );
            }
            allreduce(link, call(2), &mut chosen, combine, &mut scratch).unwrap();
            [bits(&small), bits(&ring), bits(&chosen)]
        })
    }

    #[test]
    fn both_paths_give_the_same_bits_for_every_length_and_world() {
        for world in 1..=16 {
            let mut lengths: Vec<usize> = (0..=2 * world + 1).collect();
            lengths.extend([100, 255, 511, 512, 513, 600]);
            for len in lengths {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                for (combine, name) in [
                    (fold::sum_f64 as fn(f64, f64) -> f64, "sum"),
                    (fold::max_f64 as fn(f64, f64) -> f64, "max"),
                ] {
                    let expected = bits(&reference(&inputs, combine));
                    for [small, ring, chosen] in three_ways(&inputs, combine, None) {
                        assert_eq!(small, expected, "{name} small world {world} len {len}");
                        assert_eq!(ring, expected, "{name} ring world {world} len {len}");
                        assert_eq!(chosen, expected, "{name} chosen world {world} len {len}");
                    }
                }
            }
        }
    }

    /// Every cut the cost model can choose: at the edge of the gather path for each world, the
    /// last length it takes and the first the ring takes give the oracle's bits on both paths.
    #[test]
    fn every_cut_of_the_model_gives_the_oracle_bits() {
        for world in 1..=16 {
            let edge = schedule::gather_limit(world) / 8; // the last gathered length
            for (len, gather) in [(edge - 1, true), (edge, true), (edge + 1, false)] {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let expected = bits(&reference(&inputs, fold::sum_f64));
                for [small, ring, chosen] in three_ways(&inputs, fold::sum_f64, Some(gather)) {
                    assert_eq!(small, expected, "small world {world} len {len}");
                    assert_eq!(ring, expected, "ring world {world} len {len}");
                    assert_eq!(chosen, expected, "chosen world {world} len {len}");
                }
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
            let results = on_ring(world, |r, link| {
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

    /// A frame slot between two ranks: one frame at a time, its memory kept.
    #[derive(Default)]
    struct Mailbox {
        slot: Mutex<(Vec<u8>, bool)>,
        changed: Condvar,
    }

    /// An in-memory ring neighbour that allocates nothing once its slots have grown to the
    /// largest frame: a rank puts its frames in its neighbours' slots (waiting until each is
    /// empty), then takes their frames out of its own: one slot per direction.
    struct MailLink {
        /// Frames from the left (travelling rightward) and from the right.
        from_left: Arc<Mailbox>,
        from_right: Arc<Mailbox>,
        /// The right neighbour's `from_left` and the left neighbour's `from_right`.
        right: Arc<Mailbox>,
        left: Arc<Mailbox>,
        left_rank: usize,
        right_rank: usize,
    }

    impl Mailbox {
        fn put(&self, header: &Header, payload: &[u8]) {
            let mut out = self.slot.lock().unwrap();
            while out.1 {
                out = self.changed.wait(out).unwrap();
            }
            out.0.clear();
            out.0.extend_from_slice(&header.encode());
            out.0.extend_from_slice(payload);
            out.1 = true;
            drop(out);
            self.changed.notify_all();
        }

        fn take(
            &self,
            peer: usize,
            expect: &Header,
            sink: &mut dyn Sink,
        ) -> Result<(), CollectiveError> {
            let mut inn = self.slot.lock().unwrap();
            while !inn.1 {
                inn = self.changed.wait(inn).unwrap();
            }
            let head = Header::decode(inn.0[..HEADER_LEN].try_into().unwrap()).unwrap();
            head.expect(expect, peer)?;
            let mut rest = &inn.0[HEADER_LEN..];
            while !rest.is_empty() {
                let space = sink.space();
                let n = space.len().min(rest.len());
                space[..n].copy_from_slice(&rest[..n]);
                sink.commit(n);
                rest = &rest[n..];
            }
            inn.1 = false;
            drop(inn);
            self.changed.notify_all();
            Ok(())
        }
    }

    impl Link for MailLink {
        fn step(&mut self, right: Lane<'_>, left: Option<Lane<'_>>) -> Result<(), CollectiveError> {
            self.right.put(&right.header, right.payload);
            if let Some(l) = &left {
                self.left.put(&l.header, l.payload);
            }
            self.from_left.take(self.left_rank, &right.expect, right.sink)?;
            if let Some(l) = left {
                self.from_right.take(self.right_rank, &l.expect, l.sink)?;
            }
            Ok(())
        }
    }

    /// No allocation per call in steady state: once a rank has made one call of each size,
    /// more calls of those sizes (the gather path below and above 4 KiB, the ring path with
    /// several slices) allocate nothing on its thread, link included.
    #[test]
    fn steady_state_calls_allocate_nothing() {
        let world = 4;
        let from_left: Vec<Arc<Mailbox>> = (0..world).map(|_| Arc::default()).collect();
        let from_right: Vec<Arc<Mailbox>> = (0..world).map(|_| Arc::default()).collect();
        let lengths = [1, 100, schedule::gather_limit(world) / 8, 3 * world * 32768 + 5];
        assert!(schedule::uses_gather(lengths[2] * 8, world) && lengths[2] * 8 > 4096);
        assert!(schedule::slices(lengths[3], world, 8) > 1);
        let counts = std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|r| {
                    let (left_rank, right_rank) = ((r + world - 1) % world, (r + 1) % world);
                    let mut link = MailLink {
                        from_left: from_left[r].clone(),
                        from_right: from_right[r].clone(),
                        right: from_left[right_rank].clone(),
                        left: from_right[left_rank].clone(),
                        left_rank,
                        right_rank,
                    };
                    s.spawn(move || {
                        let mut scratch = Scratch::default();
                        let mut buffers: Vec<Vec<f64>> =
                            lengths.iter().map(|&len| input(r, len)).collect();
                        let mut seq = 0;
                        let mut calls = |buffers: &mut Vec<Vec<f64>>| {
                            for buf in buffers.iter_mut() {
                                let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq };
                                seq += 1;
                                allreduce(&mut link, call, buf, fold::sum_f64, &mut scratch)
                                    .unwrap();
                            }
                        };
                        calls(&mut buffers);
                        allocation_counter::measure(|| {
                            for _ in 0..3 {
                                calls(&mut buffers);
                            }
                        })
                        .count_total
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<u64>>()
        });
        assert_eq!(counts, vec![0; world], "allocations per rank in 12 steady-state calls");
    }

    #[test]
    fn allgather_delivers_every_block_in_half_the_world_of_steps() {
        for world in 1..=16 {
            for block in [0, 1, 5, 4096] {
                let results = on_ring(world, |r, link| {
                    let mut blocks = vec![Vec::new(); world];
                    blocks[r] = (0..block).map(|i| (i * 31 + r * 7) as u8).collect();
                    let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 3 };
                    allgather(link, call, block as u64, &mut blocks).unwrap();
                    (blocks, link.steps)
                });
                for (blocks, steps) in results {
                    assert_eq!(steps, world / 2, "world {world}");
                    for (r, b) in blocks.iter().enumerate() {
                        let sent: Vec<u8> = (0..block).map(|i| (i * 31 + r * 7) as u8).collect();
                        assert_eq!(b, &sent, "world {world} block {block} rank {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn integer_sums_wrap_and_max_propagates_nan_over_the_ring() {
        let world = 3;
        let results = on_ring(world, |r, link| {
            let mut ints = vec![i64::MAX; 1000];
            ints[1] = r as i64;
            let mut scratch = Scratch::default();
            allreduce(
                link,
                Call { rank: r, world, op: Op::AllreduceSumI64, seq: 0 },
                &mut ints,
                fold::sum_i64,
                &mut scratch,
            )
            .unwrap();
            let mut maxes = vec![r as f64; 600];
            if r == 2 {
                maxes[599] = f64::NAN;
            }
            allreduce(
                link,
                Call { rank: r, world, op: Op::AllreduceMaxF64, seq: 1 },
                &mut maxes,
                fold::max_f64,
                &mut scratch,
            )
            .unwrap();
            (ints, maxes)
        });
        for (ints, maxes) in results {
            assert_eq!(ints[0], i64::MAX.wrapping_mul(3));
            assert_eq!(ints[1], 3);
            assert_eq!(maxes[0], 2.0);
            assert!(maxes[599].is_nan());
        }
    }

    #[test]
    fn mismatched_lengths_are_caught_at_the_first_frame() {
        // World 2: a 1000-element buffer's segment is 4000 bytes, the same as a whole 500-element
        // buffer on the small path; the frame's total still tells them apart.
        let results = on_ring(2, |r, link| {
            let mut buf = vec![1.0; if r == 0 { 1000 } else { 500 }];
            allreduce(
                link,
                Call { rank: r, world: 2, op: Op::AllreduceSumF64, seq: 0 },
                &mut buf,
                fold::sum_f64,
                &mut Scratch::default(),
            )
        });
        assert_eq!(
            results[0],
            Err(CollectiveError::LengthMismatch { peer: 1, expected: 8000, got: 4000 })
        );
        assert_eq!(
            results[1],
            Err(CollectiveError::LengthMismatch { peer: 0, expected: 4000, got: 8000 })
        );
    }
}
