//! One way round the ring as the link drives it ([`Way`]): the frames a plan sends to the
//! neighbour on one side and those it receives from the other, each moved as soon as the plan
//! lets it; and a read that counts its bytes ([`Counted`]).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use silvic_core::CollectiveError;

use crate::frame::{HEADER_LEN, Waiting};
use crate::ring::seam::{FramePlan, Progress, Receiving};
use crate::wait::nonblocking;

use super::reader::{FrameIn, ReadAhead};

/// Where one way of a plan stands: frames out, frames in, and the ones in between.
pub(super) struct Way {
    /// The plan's index of this way.
    way: usize,
    frames: usize,
    /// Outgoing frames all written, and bytes of the next one written (its header included).
    sent: usize,
    written: usize,
    head: [u8; HEADER_LEN],
    /// Incoming frames all read, and the one being read.
    received: usize,
    pub(super) incoming: FrameIn,
}

impl Way {
    pub(super) fn new(way: usize, plan: &dyn FramePlan) -> Self {
        Way {
            way,
            frames: plan.frames(way),
            sent: 0,
            written: 0,
            head: [0; HEADER_LEN],
            received: 0,
            incoming: FrameIn::new(),
        }
    }

    pub(super) fn out_done(&self) -> bool {
        self.sent == self.frames
    }

    pub(super) fn in_done(&self) -> bool {
        self.received == self.frames
    }

    /// Incoming frames all read.
    pub(super) fn received(&self) -> usize {
        self.received
    }

    /// How far the plan has moved, this way and `other`, the other way: frames out and frames
    /// in, indexed by the plan's ways.
    fn moved(&self, other: &Way) -> ([usize; 2], [usize; 2]) {
        let (mut sent, mut received) = ([0; 2], [0; 2]);
        for w in [self, other] {
            (sent[w.way], received[w.way]) = (w.sent, w.received);
        }
        (sent, received)
    }

    /// Whether the next outgoing frame may start now and carries at most `bytes` of payload.
    pub(super) fn next_out_at_most(&self, plan: &dyn FramePlan, other: &Way, bytes: usize) -> bool {
        self.written == 0
            && self.wants_write(plan, other)
            && plan.payload(self.way, self.sent).len() <= bytes
    }

    /// Whether no outgoing frame is partly written: a control frame may go next.
    pub(super) fn at_boundary(&self) -> bool {
        self.written == 0
    }

    /// Whether a frame is partly written or may start now (`other` is the other way).
    pub(super) fn wants_write(&self, plan: &dyn FramePlan, other: &Way) -> bool {
        let (sent, received) = self.moved(other);
        let progress = Progress { sent: &sent, received: &received };
        self.written > 0 || (!self.out_done() && plan.ready(self.way, progress))
    }

    /// Whether the next incoming frame may be read now (`other` is the other way).
    pub(super) fn wants_read(&self, plan: &dyn FramePlan, other: &Way) -> bool {
        let (sent, received) = self.moved(other);
        !self.in_done() && plan.may_receive(self.way, Progress { sent: &sent, received: &received })
    }

    /// Writes what `stream` takes, counting the bytes in `sent_bytes`: the frame partly
    /// written, then, if `more`, every frame the plan lets go (`other` is the other way), each
    /// header and payload in one vectored write. Returns whether a byte moved.
    pub(super) fn write_to(
        &mut self,
        plan: &dyn FramePlan,
        other: &Way,
        mut stream: &TcpStream,
        sent_bytes: &mut u64,
        more: bool,
    ) -> io::Result<bool> {
        let mut moved = false;
        loop {
            if self.written == 0 {
                if !more || !self.wants_write(plan, other) {
                    return Ok(moved);
                }
                self.head = plan.header(self.way, self.sent).encode();
            }
            let payload = plan.payload(self.way, self.sent);
            let written = nonblocking(|| {
                if self.written < HEADER_LEN {
                    let parts = [IoSlice::new(&self.head[self.written..]), IoSlice::new(payload)];
                    stream.write_vectored(&parts)
                } else {
                    stream.write(&payload[self.written - HEADER_LEN..])
                }
            })?;
            let Some(n) = written else { return Ok(moved) };
            self.written += n;
            *sent_bytes += n as u64;
            moved = true;
            if self.written == HEADER_LEN + payload.len() {
                (self.sent, self.written) = (self.sent + 1, 0);
            }
        }
    }

    /// Reads what `src` has, through `ahead`, into the frames the plan lets in (`other` is the
    /// other way), from `peer` of a world of `world`. Returns whether data moved; a waiting
    /// notice read on the way is put in `heard` (see [`FrameIn::read_from`]).
    pub(super) fn read_from<R: Read>(
        &mut self,
        plan: &mut dyn FramePlan,
        other: &Way,
        src: &mut R,
        ahead: &mut ReadAhead,
        (peer, world): (usize, usize),
        heard: &mut Option<Waiting>,
    ) -> Result<bool, CollectiveError> {
        let mut moved = false;
        while self.wants_read(plan, other) {
            let expect = plan.expect(self.way, self.received);
            let mut sink = Receiving { plan: &mut *plan, way: self.way, frame: self.received };
            moved |=
                self.incoming.read_from(src, ahead, (peer, world), &expect, &mut sink, heard)?;
            if !self.incoming.done() {
                break;
            }
            self.received += 1;
            self.incoming = FrameIn::new();
        }
        Ok(moved)
    }
}

/// A stream read that counts what it reads.
pub(super) struct Counted<'a> {
    pub(super) stream: &'a TcpStream,
    pub(super) bytes: &'a mut u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        *self.bytes += n as u64;
        Ok(n)
    }
}
