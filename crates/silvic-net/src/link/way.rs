//! The ways of a plan as the link drives them ([`Ways`]): per way, the frames a plan sends on
//! one stream and those it receives from another, each moved as soon as the plan lets it, with
//! the progress of every way kept as the arrays the plan's gates read; and a read that counts
//! its bytes ([`Counted`]).
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
        self.ways.clear();
        self.ways.extend((0..n).map(|w| Way {
            frames: plan.frames(w),
            written: 0,
            head: [0; HEADER_LEN],
            incoming: FrameIn::new(),
        }));
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
    /// partly written, then, if `more`, every frame the plan lets go, each header and payload in
    /// one vectored write. Returns whether a byte moved.
    pub(super) fn write_to(
        &mut self,
        plan: &dyn FramePlan,
        w: usize,
        mut stream: &TcpStream,
        sent_bytes: &mut u64,
        more: bool,
    ) -> io::Result<bool> {
        let mut moved = false;
        loop {
            if self.ways[w].written == 0 {
                if !more || !self.wants_write(plan, w) {
                    return Ok(moved);
                }
                self.ways[w].head = plan.header(w, self.sent[w]).encode();
            }
            let payload = plan.payload(w, self.sent[w]);
            let way = &mut self.ways[w];
            let written = nonblocking(|| {
                if way.written < HEADER_LEN {
                    let parts = [IoSlice::new(&way.head[way.written..]), IoSlice::new(payload)];
                    stream.write_vectored(&parts)
                } else {
                    stream.write(&payload[way.written - HEADER_LEN..])
                }
            })?;
            let Some(n) = written else { return Ok(moved) };
            way.written += n;
            *sent_bytes += n as u64;
            moved = true;
            if way.written == HEADER_LEN + payload.len() {
                way.written = 0;
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
            let expect = plan.expect(w, j);
            let mut sink = Receiving { plan: &mut *plan, way: w, frame: j };
            let incoming = &mut self.ways[w].incoming;
            moved |= incoming.read_from(src, ahead, (peer, world), &expect, &mut sink, heard)?;
            if !incoming.done() {
                break;
            }
            *incoming = FrameIn::new();
            self.received[w] += 1;
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
