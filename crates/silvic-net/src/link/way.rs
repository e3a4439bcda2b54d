//! The ways of a plan as the link drives them ([`Ways`]): per way, the frames a plan sends on
//! one stream and those it receives from another, each moved as soon as the plan lets it, with
//! the progress of every way kept as the arrays the plan's gates read; and a pass of reads
//! that counts its bytes and stops at an emptied socket ([`Counted`]).
//!
//! Invariants: a way's frame counts only ever grow, and a frame is counted out only once its
//! last byte is written and in only once its last byte is read; an outgoing frame is started
//! only when the plan's gate lets it, and then written whole (or the stream fails).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use silvic_core::CollectiveError;

use crate::frame::{HEADER_LEN, Waiting};
use crate::ring::seam::{FramePlan, Moved, Receiving};
use crate::wait::nonblocking;

use super::reader::{FrameIn, ReadAhead};

/// The most frames one vectored write carries (two parts each, far below `IOV_MAX`).
const BATCH: usize = 16;

/// A write takes no more frames once it carries this many bytes: batching saves a system call
/// per frame, which counts for small frames only, and a large write holds the core longer
/// before the reader can start on what it brings.
const BATCH_BYTES: usize = 16 * 1024;

/// Where one way of a plan stands between its frames: the frame going out and the one coming in.
#[derive(Debug)]
struct Way {
    frames: usize,
    /// Bytes of the next outgoing frame written (its header included), and its header.
    written: usize,
    head: [u8; HEADER_LEN],
    incoming: FrameIn,
}

/// Every way of the plan a call runs: where each stands, and the frames all out and all in per
/// way (what [`Moved`] shows the plan). Kept by the link between calls, so that a call
/// allocates nothing once the link has seen as many ways.
#[derive(Debug, Default)]
pub(super) struct Ways {
    ways: Vec<Way>,
    sent: Vec<usize>,
    received: Vec<usize>,
}

impl Ways {
    /// Starts the ways of `plan`, nothing moved.
    pub(super) fn start(&mut self, plan: &dyn FramePlan) {
        let n = plan.ways().len();
        // Reset in place: a way holds a control frame's buffer, not worth building anew each
        // call.
        self.ways.truncate(n);
        self.ways.resize_with(n, || Way {
            frames: 0,
            written: 0,
            head: [0; HEADER_LEN],
            incoming: FrameIn::new(),
        });
        for (w, way) in self.ways.iter_mut().enumerate() {
            (way.frames, way.written) = (plan.frames(w), 0);
            way.incoming.restart();
        }
        for counts in [&mut self.sent, &mut self.received] {
            counts.clear();
            counts.resize(n, 0);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ways.len()
    }

    fn progress(&self) -> Moved<'_> {
        Moved { sent: &self.sent, received: &self.received }
    }

    pub(super) fn out_done(&self, w: usize) -> bool {
        self.sent[w] == self.ways[w].frames
    }

    pub(super) fn in_done(&self, w: usize) -> bool {
        self.received[w] == self.ways[w].frames
    }

    /// Whether every frame of every way is out and in.
    pub(super) fn all_done(&self) -> bool {
        (0..self.len()).all(|w| self.out_done(w) && self.in_done(w))
    }

    /// Incoming frames all read, over every way.
    pub(super) fn received_total(&self) -> usize {
        self.received.iter().sum()
    }

    /// Whether no outgoing frame of `w` is partly written: a control frame may go next.
    pub(super) fn at_boundary(&self, w: usize) -> bool {
        self.ways[w].written == 0
    }

    /// Whether no incoming frame of `w` is partly read.
    pub(super) fn in_at_boundary(&self, w: usize) -> bool {
        self.ways[w].incoming.at_boundary()
    }

    /// Whether the next outgoing frame of `w` may start now and carries at most `bytes`.
    pub(super) fn next_out_at_most(&self, plan: &dyn FramePlan, w: usize, bytes: usize) -> bool {
        self.ways[w].written == 0
            && self.wants_write(plan, w)
            && plan.payload(w, self.sent[w]).len() <= bytes
    }

    /// Whether a frame of `w` is partly written or may start now.
    pub(super) fn wants_write(&self, plan: &dyn FramePlan, w: usize) -> bool {
        self.ways[w].written > 0 || (!self.out_done(w) && plan.ready(w, self.progress()))
    }

    /// Whether the next incoming frame of `w` may be read now.
    pub(super) fn wants_read(&self, plan: &dyn FramePlan, w: usize) -> bool {
        !self.in_done(w) && plan.may_receive(w, self.progress())
    }

    /// Writes what `stream` takes of way `w`, counting the bytes in `sent_bytes`: the frame
    /// partly written, then, if `more`, every frame the plan lets go, up to [`BATCH`] frames
    /// (headers and payloads) in one vectored write. Returns whether a byte moved.
    ///
    /// A frame joins a write if the plan would let it go once the frames before it in the write
    /// are out: they are, in order, before a byte of it is, and a frame is counted out only
    /// once its last byte is written, so the plan's gates see the same progress as when each
    /// frame had a write of its own. One write for the frames of a round (index-fold-gather
    /// sends one per slot) costs one system call, and one wake-up of the reader, not one each.
    pub(super) fn write_to<W: Write>(
        &mut self,
        plan: &dyn FramePlan,
        w: usize,
        mut stream: W,
        sent_bytes: &mut u64,
        more: bool,
    ) -> io::Result<bool> {
        let mut moved = false;
        loop {
            let first = self.sent[w];
            let resume = self.ways[w].written;
            // Asked first, before a batch is built: a call asks every turn, and mostly
            // nothing may go. A frame partly written always goes on.
            if resume == 0 && !(more && self.wants_write(plan, w)) {
                return Ok(moved);
            }
            let mut payloads: [&[u8]; BATCH] = [&[]; BATCH];
            payloads[0] = plan.payload(w, first);
            let mut count = 1;
            let mut bytes = HEADER_LEN + payloads[0].len() - resume;
            while more && count < BATCH && bytes < BATCH_BYTES {
                self.sent[w] = first + count;
                let ready = !self.out_done(w) && plan.ready(w, self.progress());
                self.sent[w] = first;
                if !ready {
                    break;
                }
                payloads[count] = plan.payload(w, first + count);
                bytes += HEADER_LEN + payloads[count].len();
                count += 1;
            }
            let mut heads = [[0; HEADER_LEN]; BATCH];
            for (i, head) in heads.iter_mut().enumerate().take(count) {
                *head = match i {
                    0 if resume > 0 => self.ways[w].head,
                    i => plan.header(w, first + i).encode(),
                };
            }
            let mut parts = [IoSlice::new(&[]); 2 * BATCH];
            let mut used = 0;
            for (i, (head, payload)) in heads.iter().zip(payloads).take(count).enumerate() {
                let skip = if i == 0 { resume } else { 0 };
                if skip < HEADER_LEN {
                    parts[used] = IoSlice::new(&head[skip..]);
                    used += 1;
                }
                parts[used] = IoSlice::new(&payload[skip.saturating_sub(HEADER_LEN)..]);
                used += 1;
            }
            let Some(mut n) = nonblocking(|| stream.write_vectored(&parts[..used]))? else {
                return Ok(moved);
            };
            *sent_bytes += n as u64;
            moved |= n > 0;
            // Count out every frame whose last byte went; the first one not all written is
            // the frame partly written, and the socket takes nothing more now.
            for (i, (head, payload)) in heads.iter().zip(payloads).take(count).enumerate() {
                let have = if i == 0 { resume } else { 0 };
                let left = HEADER_LEN + payload.len() - have;
                if n < left {
                    let way = &mut self.ways[w];
                    (way.written, way.head) = (have + n, *head);
                    return Ok(moved);
                }
                n -= left;
                self.ways[w].written = 0;
                self.sent[w] += 1;
            }
        }
    }

    /// Reads what `src` has, through `ahead`, into the frames of way `w` the plan lets in, from
    /// `peer` of a world of `world`. Returns whether data moved; a waiting notice read on the
    /// way is put in `heard` (see [`FrameIn::read_from`]).
    pub(super) fn read_from<R: Read>(
        &mut self,
        plan: &mut dyn FramePlan,
        w: usize,
        src: &mut R,
        ahead: &mut ReadAhead,
        (peer, world): (usize, usize),
        heard: &mut Option<Waiting>,
    ) -> Result<bool, CollectiveError> {
        let mut moved = false;
        while self.wants_read(plan, w) {
            let j = self.received[w];
            let mut sink = Receiving { plan: &mut *plan, way: w, frame: j };
            let incoming = &mut self.ways[w].incoming;
            moved |= incoming.read_from(src, ahead, (peer, world), &mut sink, heard)?;
            if !incoming.done() {
                break;
            }
            incoming.restart();
            self.received[w] += 1;
        }
        Ok(moved)
    }
}

/// One pass of reads from a stream, counting what it reads.
///
/// A read that returns less than it asked for emptied the socket's queue, so the pass asks the
/// socket no more: its next read would block (`WouldBlock`, no system call). Bytes that come
/// after are read by the next pass; poll(2) sees them, so nothing waits past them.
pub(super) struct Counted<'a> {
    stream: &'a TcpStream,
    bytes: &'a mut u64,
    drained: bool,
}

impl<'a> Counted<'a> {
    /// A pass over `stream`, adding what it reads to `bytes`.
    pub(super) fn new(stream: &'a TcpStream, bytes: &'a mut u64) -> Self {
        Counted { stream, bytes, drained: false }
    }

    /// Whether a read of this pass emptied the socket.
    pub(super) fn drained(&self) -> bool {
        self.drained
    }

    /// This pass continues one whose reads `drained` the socket (see [`Counted::drained`]).
    pub(super) fn after(mut self, drained: bool) -> Self {
        self.drained = drained;
        self
    }
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.drained {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.stream.read(buf)?;
        *self.bytes += n as u64;
        self.drained = n < buf.len();
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use silvic_core::Op;

    use super::*;
    use crate::frame::{Dir, Header};
    use crate::ring::seam::{Call, Route};

    /// One way of `payloads.len()` frames, frame `i` carrying `payloads[i]`; frame `i` may go
    /// once `i < allowed` (a gate on the way's own frames out, as a window of slices is).
    struct Frames {
        payloads: Vec<Vec<u8>>,
        allowed: usize,
    }

    impl Frames {
        fn new(lengths: &[usize]) -> Frames {
            let payloads = lengths.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
            Frames { payloads, allowed: usize::MAX }
        }

        /// Every frame's header and payload, in order: what the stream must carry.
        fn wire(&self) -> Vec<u8> {
            let frames = 0..self.payloads.len();
            frames
                .flat_map(|i| [&self.header(0, i).encode()[..], &self.payloads[i]].concat())
                .collect()
        }
    }

    impl FramePlan for Frames {
        fn call(&self) -> Call {
            Call { rank: 0, world: 2, op: Op::AllgatherBytes, seq: 0 }
        }
        fn ways(&self) -> &[Route] {
            &[Route::RIGHTWARD]
        }
        fn frames(&self, _: usize) -> usize {
            self.payloads.len()
        }
        fn header(&self, _: usize, i: usize) -> Header {
            let len = self.payloads[i].len() as u64;
            Header::data(Op::AllgatherBytes, 0, 1 << 20, len).carrying(Dir::Right, i)
        }
        fn expect(&self, way: usize, j: usize) -> Header {
            self.header(way, j)
        }
        fn ready(&self, _: usize, progress: Moved<'_>) -> bool {
            progress.sent[0] < self.allowed
        }
        fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
            false
        }
        fn payload(&self, _: usize, i: usize) -> &[u8] {
            &self.payloads[i]
        }
        fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
            &mut []
        }
        fn commit(&mut self, _: usize, _: usize, _: usize) {}
    }

    /// A socket that takes at most `cap` bytes a write, across the parts of a vectored one, and
    /// would block on every other write; it counts the writes that took bytes.
    struct Trickle {
        out: Vec<u8>,
        cap: usize,
        writes: usize,
        blocked: bool,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
            self.blocked = !self.blocked;
            if !self.blocked {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let before = self.out.len();
            for part in parts {
                let room = self.cap - (self.out.len() - before);
                self.out.extend_from_slice(&part[..part.len().min(room)]);
            }
            self.writes += 1;
            Ok(self.out.len() - before)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Calls `write_to` until every frame is out (a bounded number of times); returns the
    /// socket.
    fn write_all(plan: &Frames, ways: &mut Ways, cap: usize) -> Trickle {
        let mut socket = Trickle { out: Vec::new(), cap, writes: 0, blocked: true };
        let mut sent = 0;
        for _ in 0..100_000 {
            if ways.out_done(0) {
                break;
            }
            ways.write_to(plan, 0, &mut socket, &mut sent, true).unwrap();
        }
        assert!(ways.out_done(0), "not all out in 100,000 writes at {cap} bytes a write");
        assert_eq!(sent, socket.out.len() as u64, "bytes counted");
        socket
    }

    #[test]
    fn frames_go_out_whole_and_in_order_however_the_socket_cuts_the_writes() {
        let lengths: Vec<usize> = (0..40).map(|i| (i * 37) % 300).collect();
        let plan = Frames::new(&lengths);
        for cap in [1, 7, HEADER_LEN - 1, HEADER_LEN, HEADER_LEN + 1, 333, 1 << 20] {
            let mut ways = Ways::default();
            ways.start(&plan);
            let socket = write_all(&plan, &mut ways, cap);
            assert!(socket.out == plan.wire(), "the stream at {cap} bytes a write");
        }
    }

    #[test]
    fn ready_frames_share_a_write_up_to_the_batch_and_the_gate() {
        let plan = Frames::new(&[24; 40]);
        let mut ways = Ways::default();
        ways.start(&plan);
        let socket = write_all(&plan, &mut ways, 1 << 20);
        assert_eq!(socket.writes, 40usize.div_ceil(BATCH), "one write per {BATCH} frames");
        // A frame the gate holds back stays out of the write, though the socket has room: the
        // gate sees each frame before it as out.
        let mut plan = Frames { allowed: 5, ..Frames::new(&[24; 40]) };
        let mut ways = Ways::default();
        ways.start(&plan);
        let mut socket = Trickle { out: Vec::new(), cap: 1 << 20, writes: 0, blocked: false };
        let mut sent = 0;
        assert!(ways.write_to(&plan, 0, &mut socket, &mut sent, true).unwrap());
        assert_eq!((ways.sent[0], socket.writes), (5, 1));
        assert_eq!(socket.out, plan.wire()[..5 * (HEADER_LEN + 24)]);
        plan.allowed = usize::MAX;
        let rest = write_all(&plan, &mut ways, 1 << 20);
        assert_eq!(rest.out, plan.wire()[5 * (HEADER_LEN + 24)..]);
    }

    /// A pass stops asking the socket once a read came back short, and the next pass asks
    /// again; a read that filled its buffer says nothing of the socket, so the pass goes on.
    #[test]
    fn a_pass_reads_no_more_once_a_read_came_back_short() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mine, _) = listener.accept().unwrap();
        // Blocking but bounded: every read below is of bytes already sent, so none waits.
        mine.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut counted = 0;
        let mut buf = [0u8; 8];
        theirs.write_all(&[1; 20]).unwrap();
        let mut pass = Counted::new(&mine, &mut counted);
        assert_eq!(pass.read(&mut buf).unwrap(), 8, "a full buffer");
        assert_eq!(pass.read(&mut buf).unwrap(), 8, "so the pass reads on");
        assert!(!pass.drained());
        assert_eq!(pass.read(&mut buf).unwrap(), 4, "short: the socket is empty");
        assert!(pass.drained());
        theirs.write_all(&[2; 3]).unwrap();
        let err = pass.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "this pass asks no more");
        assert_eq!(pass.read(&mut []).unwrap(), 0, "an empty read is no read");
        assert!(pass.drained());
        let mut pass = Counted::new(&mine, &mut counted).after(true);
        assert_eq!(pass.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let mut pass = Counted::new(&mine, &mut counted);
        assert_eq!(pass.read(&mut buf).unwrap(), 3, "a new pass reads what came since");
        assert_eq!(counted, 23);
    }
}
