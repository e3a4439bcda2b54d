//! The control side of the ring link: reading the control frames between data frames on every
//! stream (the streams a call's plan does not use only when one poll(2) finds them ready),
//! queueing waiting notices, whom a wait blames, and what a failed write means.
//!
//! Invariants: control frames are read in order and every one looked at (a notice or a data
//! frame never hides an abort: a data frame stops the reading, to be read whole when its turn
//! comes, then what follows it); a failure heard while the call needs nothing more of that
//! neighbour is kept for the next call, not returned early, unless it is an abort whose origin
//! is a peer the call still needs (that peer sends nothing more); a notice is queued whole, only
//! between data frames on its stream, and dropped (never retried in a busy loop) if its stream
//! fails; a notice names this rank's stalled neighbour or the rank a fresh notice of that
//! neighbour names, never this rank.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;

use super::reader::{Between, Control, next_control, stream_error};
use super::{Counted, MAX_STREAMS, StreamFailure, TcpRing};
use crate::frame::{Path, Waiting};
use crate::wait::{nonblocking, wait};

/// The longest gap between two waiting notices.
const NOTICE_MAX: Duration = Duration::from_millis(500);

/// How long a call waits without progress before it sends a waiting notice, and then how often
/// it sends one: a quarter of the timeout, at most [`NOTICE_MAX`], so that a neighbour with the
/// same timeout hears several before its own timeout could fire.
pub(super) fn notice_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), NOTICE_MAX)
}

/// Control bytes queued for one stream, written whole before anything else goes on it.
#[derive(Debug, Default)]
pub(super) struct Queued {
    pub(super) bytes: Vec<u8>,
    pub(super) sent: usize,
}

impl Queued {
    pub(super) fn is_empty(&self) -> bool {
        self.sent == self.bytes.len()
    }

    pub(super) fn push(&mut self, frame: &[u8]) {
        if self.is_empty() {
            self.bytes.clear();
            self.sent = 0;
        }
        self.bytes.extend_from_slice(frame);
    }

    /// Writes what `stream` takes; returns the bytes written.
    pub(super) fn flush(&mut self, mut stream: &TcpStream) -> io::Result<usize> {
        let start = self.sent;
        while !self.is_empty() {
            match nonblocking(|| stream.write(&self.bytes[self.sent..]))? {
                Some(n) => self.sent += n,
                None => break,
            }
        }
        Ok(self.sent - start)
    }

    /// Drops what is left to write.
    pub(super) fn drop_rest(&mut self) {
        self.sent = self.bytes.len();
    }

    /// What is left to write.
    pub(super) fn rest(&self) -> &[u8] {
        &self.bytes[self.sent..]
    }
}

/// The last waiting notice from a neighbour, and when it came.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heard {
    pub(super) notice: Waiting,
    pub(super) at: Instant,
}

impl TcpRing {
    /// The error for a failed write to stream `s`: the abort that neighbour sent before it
    /// closed, if it is waiting to be read between frames, else the socket error itself. Only
    /// looked for when `between` frames: bytes of a frame partly read are no frame header.
    pub(super) fn gone(&mut self, s: usize, e: &io::Error, between: bool) -> CollectiveError {
        let stream = &mut self.streams[s];
        let peer = stream.peer;
        let mut src = Counted::new(&stream.socket, &mut stream.received);
        while let Some(Ok(Between::Control(control))) =
            between.then(|| next_control(&mut stream.ahead, &mut src, peer, self.world))
        {
            if let Control::Abort { error, .. } = control {
                return error;
            }
        }
        stream_error(peer, e)
    }

    /// Reads the control frames on stream `s` while no frame of this call may come in from it:
    /// notices of this call are noted; an abort of this call (or an earlier one), and any abort
    /// or failure while the call is still `writing` to the stream, fails the call. Otherwise an
    /// abort of a later call, or the stream's end, is kept for the next call and the stream is
    /// no longer watched: a neighbour that has taken everything may end its job before this
    /// rank has read its last frame, and one that failed has told the other neighbours too (if
    /// this call still needs a frame from it, reading that frame fails the call). Except an
    /// abort, of any call, whose origin is a peer this call still needs ([`TcpRing::needs`]):
    /// the origin sends nothing after its abort, and its own abort may never come (the stream
    /// between them is what failed, as when every packet of a chord is lost: the origin timed
    /// out on it, and its abort reaches this rank only relayed, by ranks a call ahead), so
    /// waiting on it could only end in this call's own timeout, naming the wrong rank. (An
    /// origin that failed a later call had sent this call's frames first; failing now forgoes
    /// them, and the next call would have failed with the same error.) Returns
    /// whether to keep watching: not once a data frame (one waiting for its turn, or the next
    /// call's) shows up. A data frame of this call on another `path` than this rank's fails the
    /// call at once: the ranks disagree on the path, and this frame may be all this rank would
    /// ever get of the call on this stream; where its buffer length differs too, that is the
    /// error (ranks that passed other lengths may choose other paths).
    pub(super) fn read_controls(
        &mut self,
        s: usize,
        (seq, path): (u64, Option<(Path, u64)>),
        writing: bool,
    ) -> Result<bool, CollectiveError> {
        while !self.streams[s].ended {
            let stream = &mut self.streams[s];
            let mut src = Counted::new(&stream.socket, &mut stream.received);
            let failure = match next_control(&mut stream.ahead, &mut src, stream.peer, self.world) {
                Ok(Between::Blocked) => return Ok(true),
                Ok(Between::Data(head)) => match path {
                    Some((path, total)) if head.seq == seq && head.path != path => {
                        let peer = stream.peer;
                        return Err(if head.total == total {
                            head.on_another_path(path, peer)
                        } else {
                            CollectiveError::LengthMismatch {
                                peer,
                                expected: total,
                                got: head.total,
                            }
                        });
                    }
                    _ => return Ok(false),
                },
                Ok(Between::Control(Control::Waiting { notice, seq: of })) => {
                    if of == seq {
                        stream.heard = Some(Heard { notice, at: Instant::now() });
                    }
                    continue;
                }
                Ok(Between::Control(Control::Abort { seq: of, error })) => {
                    if of <= seq || writing || self.needs_origin(&error) {
                        return Err(error);
                    }
                    error
                }
                Err(error) if writing => return Err(error),
                Err(error) => error,
            };
            self.streams[s].ended = true;
            self.pending.get_or_insert(failure);
        }
        Ok(false)
    }

    /// The streams no way of the plan uses (chords the plan does not need) that have something
    /// to read at the call's start, as bits: bytes read ahead, or what one poll(2) that does not
    /// wait finds ready (data, an end, an error). One poll for them all, not a read of each: a
    /// call of a few bytes would spend more on reading idle chords than on its own frames.
    pub(super) fn stirred_idle(&self) -> Result<u64, StreamFailure> {
        let n = self.streams.len();
        let idle = |s: usize| self.table.idle(s) && !self.streams[s].ended;
        if !(0..n).any(idle) {
            return Ok(0);
        }
        let events = |s: usize| if idle(s) { PollFlags::IN } else { PollFlags::empty() };
        let mut fds: ArrayVec<PollFd<'_>, MAX_STREAMS> =
            (0..n).map(|s| PollFd::new(&self.streams[s].socket, events(s))).collect();
        let polled = wait(&mut fds, Some(Instant::now()));
        polled.map_err(|e| (0, CollectiveError::io(self.streams[0].peer, &e)))?;
        let stirred =
            |s: usize| !self.streams[s].ahead.buffered().is_empty() || !fds[s].revents().is_empty();
        Ok((0..n).filter(|&s| idle(s) && stirred(s)).map(|s| 1 << s).sum())
    }

    /// Whether `error` is an abort whose origin is the peer of a stream this call still needs.
    fn needs_origin(&self, error: &CollectiveError) -> bool {
        let CollectiveError::Aborted { origin, .. } = error else { return false };
        (0..self.streams.len()).any(|t| self.streams[t].peer == *origin && self.needs(t))
    }

    /// Queues a waiting notice for every peer whose stream `at_boundary` says is between
    /// data frames, and writes what each stream takes.
    pub(super) fn send_notice(
        &mut self,
        notice: Waiting,
        seq: u64,
        at_boundary: impl Fn(usize) -> bool,
    ) {
        let frame = notice.encode(seq);
        for (s, stream) in self.streams.iter_mut().enumerate() {
            if at_boundary(s) && stream.queued.is_empty() {
                stream.queued.push(&frame);
            }
            match stream.queued.flush(&stream.socket) {
                Ok(n) => stream.sent += n as u64,
                // The failure shows on reading the stream.
                Err(_) => stream.queued.drop_rest(),
            }
        }
    }
}
