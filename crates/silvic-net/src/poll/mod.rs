//! The TCP ring link: one lock-step exchange over two non-blocking sockets, driven by poll(2).
//!
//! Each rank holds two streams. Data flows one way around the ring: a rank writes frames to its
//! right neighbour and reads frames from its left. The reverse direction of each stream carries
//! nothing but abort frames, so a rank blocked writing to its right still hears why that
//! neighbour gave up.
//!
//! Invariants:
//! - A step writes and reads at the same time; neither side ever blocks on a write before it
//!   reads, so buffers of any size cannot deadlock however small the socket buffers are.
//! - Readiness is a hint: every read and write runs until it would block, and `EINTR` retries.
//! - The timeout bounds inactivity per peer: a step fails when the peer it still waits on has
//!   moved no byte for that long; the deadline is recomputed after every bit of progress.
//! - An outgoing frame is written whole or the stream is shut: an abort frame only ever follows
//!   a complete frame, so a receiver never mistakes it for payload.
//! - A rank waits by spinning (yielding the core on every turn) for at most [`SPIN`] after its
//!   last progress, then blocks in poll(2): short waits skip a wake-up, long ones cost no CPU.
//! - Bytes read from the left stream beyond the current frame are kept for the next step
//!   ([`ReadAhead`]), so a header and a small payload take one system call, not two.
//!
//! This is the only module that waits.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;

use crate::frame::{Abort, HEADER_LEN, Header, Kind, MAX_ABORT_LEN};
use crate::liveness::Liveness;
use crate::ring::{Link, Sink};
use crate::wait::wait;

mod incoming;

use incoming::{Incoming, NoPayload, ReadAhead, stream_error};

/// How long a failing rank keeps writing to finish the frame it was in the middle of, so that it
/// can append an abort frame. Past this it just shuts the stream.
const FINISH_FRAME_BOUND: Duration = Duration::from_millis(250);

/// Payloads up to this size go out in one write together with their header.
const COALESCE: usize = 16 * 1024;

/// How long a step keeps trying, yielding the core between tries, after its last progress
/// before it blocks in poll(2). A blocked rank's wake-up costs about 25 us on a loaded 2-core
/// machine, more than a small message takes to arrive, so a short wait is cheaper spun; past
/// this bound the rank sleeps, so a slow peer costs no CPU. Yielding (never a bare spin) lets
/// ranks that share a core with this one run: with more ranks than cores, a spinning rank only
/// takes the core when no other rank wants it.
const SPIN: Duration = Duration::from_micros(50);

/// Bytes of the left stream one read takes ahead: a coalesced frame arrives in one call.
const READ_AHEAD: usize = HEADER_LEN + COALESCE;

/// Which neighbour an event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// A rank's two ring streams.
#[derive(Debug)]
pub(crate) struct TcpRing {
    left: TcpStream,
    right: TcpStream,
    left_rank: usize,
    right_rank: usize,
    timeout: Duration,
    /// False while a frame to the right is partly written.
    at_frame_boundary: bool,
    /// Header and small payload, written together.
    coalesced: Vec<u8>,
    /// The reverse direction of the right stream, where only an abort may arrive.
    reverse: Incoming,
    /// TCP_USER_TIMEOUT of the right stream, raised while the right neighbour is alive but
    /// not reading.
    liveness: Liveness,
    /// How long a step spins before it blocks ([`SPIN`]).
    spin: Duration,
    /// What was read from the left stream beyond the last frame.
    ahead: ReadAhead,
}

/// The frame being written to the right.
struct Outgoing<'a> {
    head: [u8; HEADER_LEN],
    payload: &'a [u8],
    sent: usize,
}

impl Outgoing<'_> {
    fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
    fn done(&self) -> bool {
        self.sent == self.len()
    }
}

impl TcpRing {
    /// Wraps the two streams of a formed ring. They must be non-blocking.
    pub(crate) fn new(
        left: TcpStream,
        right: TcpStream,
        left_rank: usize,
        right_rank: usize,
        timeout: Duration,
    ) -> Self {
        TcpRing {
            left,
            right,
            left_rank,
            right_rank,
            timeout,
            at_frame_boundary: true,
            coalesced: Vec::with_capacity(HEADER_LEN + COALESCE),
            reverse: Incoming::new(),
            liveness: Liveness::new(),
            spin: SPIN,
            ahead: ReadAhead::new(),
        }
    }

    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Writes what the right stream takes. Returns whether a byte moved.
    fn write_some(&mut self, out: &mut Outgoing<'_>) -> Result<bool, CollectiveError> {
        let mut moved = false;
        while !out.done() {
            let buf = if !self.coalesced.is_empty() {
                &self.coalesced[out.sent..]
            } else if out.sent < HEADER_LEN {
                &out.head[out.sent..]
            } else {
                &out.payload[out.sent - HEADER_LEN..]
            };
            match (&self.right).write(buf) {
                Ok(n) => {
                    out.sent += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.right_gone(&e)),
            }
        }
        Ok(moved)
    }

    /// The error for a failed write to the right: the abort the right neighbour sent before it
    /// closed, if it is waiting to be read, else the socket error itself.
    fn right_gone(&mut self, e: &io::Error) -> CollectiveError {
        match self.reverse.read_from(&self.right, None, self.right_rank, None, &mut NoPayload) {
            Err(aborted @ CollectiveError::Aborted { .. }) => aborted,
            _ => stream_error(self.right_rank, e),
        }
    }

    fn drive(
        &mut self,
        out: &mut Outgoing<'_>,
        incoming: &mut Incoming,
        expect: &Header,
        sink: &mut dyn Sink,
    ) -> Result<(), (Side, CollectiveError)> {
        let (mut left_active, mut right_active) = (Instant::now(), Instant::now());
        // Once this step's frame from the left is in, the left is still watched for an abort
        // frame (see `abort_ahead`) until something else shows up there.
        let mut watch_left = true;
        loop {
            if self.write_some(out).map_err(|e| (Side::Right, e))? {
                right_active = Instant::now();
                self.liveness.restore(&self.right);
            }
            if !incoming.done()
                && incoming
                    .read_from(
                        &self.left,
                        Some(&mut self.ahead),
                        self.left_rank,
                        Some(expect),
                        sink,
                    )
                    .map_err(|e| (Side::Left, e))?
            {
                left_active = Instant::now();
            }
            if out.done() && incoming.done() {
                return Ok(());
            }
            if incoming.done() && watch_left && !self.ahead.is_empty() {
                // The next frame from the left has started to arrive with this one: look at it
                // now, since poll(2) will not report bytes that were already read.
                watch_left = false;
                self.abort_ahead(expect.seq).map_err(|e| (Side::Left, e))?;
            }
            if left_active.max(right_active).elapsed() < self.spin {
                // Spin before blocking: a blocked wake-up costs more than a short message takes
                // to arrive. Yield the core on every turn so that ranks sharing it still run.
                std::thread::yield_now();
                continue;
            }

            // Wait on whichever peer this step still needs; the right stream's reverse
            // direction is watched while writing, for an abort.
            // A timeout too long for an Instant (Duration::MAX) has no deadline.
            let left_deadline =
                (!incoming.done()).then(|| left_active.checked_add(self.timeout)).flatten();
            let right_deadline =
                (!out.done()).then(|| right_active.checked_add(self.timeout)).flatten();
            let now = Instant::now();
            for (deadline, side, peer) in [
                (left_deadline, Side::Left, self.left_rank),
                (right_deadline, Side::Right, self.right_rank),
            ] {
                if deadline.is_some_and(|d| now >= d) {
                    return Err((side, CollectiveError::Timeout { peer, waited: self.timeout }));
                }
            }
            let last_progress = left_active.max(right_active);
            let deadline = left_deadline
                .into_iter()
                .chain(right_deadline)
                .chain([self.liveness.next_check(last_progress)])
                .min();
            let right_events =
                if out.done() { PollFlags::empty() } else { PollFlags::OUT | PollFlags::IN };
            let left_events =
                if incoming.done() && !watch_left { PollFlags::empty() } else { PollFlags::IN };
            let mut fds =
                [PollFd::new(&self.right, right_events), PollFd::new(&self.left, left_events)];
            wait(&mut fds, deadline)
                .map_err(|e| (Side::Left, CollectiveError::io(self.left_rank, &e)))?;
            let (right_revents, left_revents) = (fds[0].revents(), fds[1].revents());
            if incoming.done() && !left_revents.is_empty() {
                watch_left = false;
                self.abort_ahead(expect.seq).map_err(|e| (Side::Left, e))?;
            }
            if right_revents.intersects(PollFlags::IN) {
                self.reverse
                    .read_from(&self.right, None, self.right_rank, None, &mut NoPayload)
                    .map_err(|e| (Side::Right, e))?;
            }
            self.liveness.check(&self.right, last_progress, self.timeout);
        }
    }

    /// Looks past this step's frame from the left, without consuming anything else: if the
    /// next frame there is an abort (the left neighbour failed after sending its part), reads
    /// it and returns it. A rank still writing to the right learns of the failure at once
    /// instead of waiting out its own timeout. A data frame of the next step, a partial
    /// header or a close are left for later; the caller stops watching the left then.
    /// Only an abort of this same call (`seq`) counts: one from a later call would fail a call
    /// that can still complete here.
    fn abort_ahead(&mut self, seq: u64) -> Result<(), CollectiveError> {
        let Some(head) = self.ahead.peek_header(&self.left) else {
            return Ok(());
        };
        match Header::decode(&head) {
            Ok(header) if header.kind == Kind::Abort && header.seq == seq => {
                let mut abort = Incoming::new();
                // Bounded: the abort is at most MAX_ABORT_LEN bytes, already sent whole or
                // followed by a close; a rest that does not come is left to the timeout.
                let deadline = Instant::now() + FINISH_FRAME_BOUND;
                while Instant::now() < deadline {
                    abort.read_from(
                        &self.left,
                        Some(&mut self.ahead),
                        self.left_rank,
                        None,
                        &mut NoPayload,
                    )?;
                    let mut fds = [PollFd::new(&self.left, PollFlags::IN)];
                    wait(&mut fds, Some(deadline))
                        .map_err(|e| CollectiveError::io(self.left_rank, &e))?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// After a failure on the left, keeps writing the frame to the right for a short while, so
    /// that the right neighbour gets a whole frame and then the abort.
    fn finish_frame(&mut self, out: &mut Outgoing<'_>) {
        let deadline = Instant::now() + FINISH_FRAME_BOUND.min(self.timeout);
        while !out.done() && Instant::now() < deadline {
            if self.write_some(out).is_err() {
                return;
            }
            let mut fds = [PollFd::new(&self.right, PollFlags::OUT)];
            if out.done() || wait(&mut fds, Some(deadline)).is_err() {
                break;
            }
        }
        self.at_frame_boundary = out.done();
    }

    /// Tells both neighbours why this rank gives up, best effort, then shuts both streams for
    /// writing. Reads stay open until the ring is dropped, so a neighbour's last bytes are not
    /// answered with a reset that could destroy its own abort frame in flight.
    pub(crate) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let len = Abort::for_error(rank, error).encode(seq, &mut frame);
        let mut targets = vec![&self.left];
        if self.at_frame_boundary {
            targets.push(&self.right);
        }
        for mut stream in targets {
            // Non-blocking: an abort is small and the reverse direction is otherwise empty; if
            // it does not fit, the shutdown below still ends the stream.
            let _ = stream.write(&frame[..len]);
        }
        let _ = self.left.shutdown(Shutdown::Write);
        let _ = self.right.shutdown(Shutdown::Write);
    }
}

impl Link for TcpRing {
    fn exchange(
        &mut self,
        header: &Header,
        payload: &[u8],
        expect: &Header,
        sink: &mut dyn Sink,
    ) -> Result<(), CollectiveError> {
        let mut out = Outgoing { head: header.encode(), payload, sent: 0 };
        self.coalesced.clear();
        if payload.len() <= COALESCE {
            self.coalesced.extend_from_slice(&out.head);
            self.coalesced.extend_from_slice(payload);
        }
        self.at_frame_boundary = false;
        let mut incoming = Incoming::new();
        let result = self.drive(&mut out, &mut incoming, expect, sink);
        match result {
            Ok(()) => {
                self.at_frame_boundary = true;
                Ok(())
            }
            Err((Side::Left, e)) => {
                self.finish_frame(&mut out);
                Err(e)
            }
            Err((Side::Right, e)) => Err(e),
        }
    }
}
