//! The control side of the ring link: reading the reverse direction and the control frames
//! behind a step's frame, queueing waiting notices, and whom a wait blames.
//!
//! Invariants: control frames are read in order and every one looked at (a notice never hides
//! an abort); a failure heard while the step needs nothing more of that neighbour is kept for the
//! next step, not returned early; a notice is queued whole, only between data frames on the
//! right, and dropped (never retried in a busy loop) if its stream fails; a notice names this
//! rank's stalled neighbour or the rank a fresh notice of that neighbour names, never this rank.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use super::reader::{Control, Parsed, parse_control, stream_error};
use super::{Counted, Side, TcpRing};
use crate::frame::Waiting;

/// The longest gap between two waiting notices.
const NOTICE_MAX: Duration = Duration::from_millis(500);

/// How long a step waits without progress before it sends a waiting notice, and then how often
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
            match stream.write(&self.bytes[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.sent - start)
    }

    /// Writes what `stream` takes, dropping the queue if the stream fails (the failure shows
    /// on reading it). Returns the bytes written.
    pub(super) fn flush_or_drop(&mut self, stream: &TcpStream) -> u64 {
        match self.flush(stream) {
            Ok(n) => n as u64,
            Err(_) => {
                self.sent = self.bytes.len();
                0
            }
        }
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
    /// The error for a failed write to the right: the abort the right neighbour sent before it
    /// closed, if it is waiting to be read, else the socket error itself.
    pub(super) fn right_gone(&mut self, e: &io::Error) -> CollectiveError {
        let mut src = Counted { stream: &self.right, bytes: &mut self.stats.bytes_received };
        while let Ok(Some(control)) = self.reverse.next(&mut src, self.right_rank, self.world) {
            if let Control::Abort { error, .. } = control {
                return error;
            }
        }
        stream_error(self.right_rank, e)
    }

    /// Reads the reverse direction of the right stream: notices are noted, an abort of this
    /// call (or any failure while the step still writes to the right) fails the step.
    pub(super) fn read_reverse(&mut self, seq: u64, writing: bool) -> Result<(), CollectiveError> {
        while !self.right_ended {
            let mut src = Counted { stream: &self.right, bytes: &mut self.stats.bytes_received };
            let failure = match self.reverse.next(&mut src, self.right_rank, self.world) {
                Ok(None) => return Ok(()),
                Ok(Some(Control::Waiting { notice, seq: of })) => {
                    if of == seq {
                        self.heard_right = Some(Heard { notice, at: Instant::now() });
                    }
                    continue;
                }
                Ok(Some(Control::Abort { seq: of, error })) => {
                    if of <= seq || writing {
                        return Err(error);
                    }
                    error
                }
                Err(error) if writing => return Err(error),
                Err(error) => error,
            };
            // Nothing in this step needs the right any more: the next step reports it.
            self.right_ended = true;
            self.pending.get_or_insert(failure);
        }
        Ok(())
    }

    /// Reads control frames behind this step's frame from the left: notices are noted, an
    /// abort of this call fails the step. Returns whether to keep watching the left: not once a
    /// data frame (the next step's), an abort of a later call or the end of the stream shows
    /// up, which are all left for the next read.
    pub(super) fn read_left_controls(&mut self, seq: u64) -> Result<bool, CollectiveError> {
        loop {
            let mut src = Counted { stream: &self.left, bytes: &mut self.stats.bytes_received };
            let need = match parse_control(self.ahead.buffered(), self.left_rank, self.world) {
                Ok(Parsed::Data) | Err(_) => return Ok(false),
                Ok(Parsed::Incomplete(need)) => need,
                Ok(Parsed::Control(Control::Waiting { notice, seq: of }, len)) => {
                    self.ahead.consume(len);
                    if of == seq {
                        self.heard_left = Some(Heard { notice, at: Instant::now() });
                    }
                    continue;
                }
                Ok(Parsed::Control(Control::Abort { seq: of, error }, _)) => {
                    return if of == seq { Err(error) } else { Ok(false) };
                }
            };
            match self.ahead.fill(&mut src, need) {
                Ok(true) => {}
                Ok(false) => return Ok(true),
                Err(_) => return Ok(false),
            }
        }
    }

    /// The rank to blame for waiting on `side` since its last sign of life at `since`: the
    /// neighbour there, or the rank its notice names if that notice is newer (never this rank:
    /// a neighbour may have heard of this rank's wait before this rank's own notice).
    pub(super) fn blame(&self, side: Side, since: Instant) -> usize {
        let (peer, heard) = match side {
            Side::Left => (self.left_rank, self.heard_left),
            Side::Right => (self.right_rank, self.heard_right),
        };
        match heard {
            Some(h) if h.at >= since && h.notice.on != self.rank => h.notice.on,
            _ => peer,
        }
    }

    /// Queues a waiting notice for both neighbours: the left on the reverse direction, the
    /// right only between data frames.
    pub(super) fn send_notice(&mut self, notice: Waiting, seq: u64, out_done: bool) {
        let frame = notice.encode(seq);
        if self.to_left.is_empty() {
            self.to_left.push(&frame);
        }
        if out_done && self.to_right.is_empty() {
            self.to_right.push(&frame);
        }
        self.stats.bytes_sent += self.to_left.flush_or_drop(&self.left);
        self.stats.bytes_sent += self.to_right.flush_or_drop(&self.right);
    }
}
