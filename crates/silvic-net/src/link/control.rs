//! The control side of the ring link: reading the control frames between data frames on both
//! streams, queueing waiting notices, whom a wait blames, and what a failed write means.
//!
//! Invariants: control frames are read in order and every one looked at (a notice or a data
//! frame never hides an abort: a data frame stops the reading, to be read whole when its turn
//! comes, then what follows it); a failure heard while the call needs nothing more of that
//! neighbour is kept for the next call, not returned early; a notice is queued whole, only
//! between data frames on its stream, and dropped (never retried in a busy loop) if its stream
//! fails; a notice names this rank's stalled neighbour or the rank a fresh notice of that
//! neighbour names, never this rank.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use super::reader::{Between, Control, next_control, stream_error};
use super::{Counted, Side, TcpRing};
use crate::frame::Waiting;
use crate::wait::nonblocking;

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
    /// The error for a failed write to `side`: the abort that neighbour sent before it closed,
    /// if it is waiting to be read between frames, else the socket error itself. Only looked
    /// for when `between` frames: bytes of a frame partly read are no frame header.
    pub(super) fn gone(&mut self, side: Side, e: &io::Error, between: bool) -> CollectiveError {
        let (stream, ahead, peer) = match side {
            Side::Left => (&self.left, &mut self.ahead_left, self.left_rank),
            Side::Right => (&self.right, &mut self.ahead_right, self.right_rank),
        };
        let mut src = Counted { stream, bytes: &mut self.stats.bytes_received };
        while let Some(Ok(Between::Control(control))) =
            between.then(|| next_control(ahead, &mut src, peer, self.world))
        {
            if let Control::Abort { error, .. } = control {
                return error;
            }
        }
        stream_error(peer, e)
    }

    /// Reads the control frames on the right stream while no frame of this call may come in
    /// from it (all of them, in a call that reads no frame from the right): notices are noted,
    /// an abort of this call (or any failure while the call still writes to the right) fails
    /// the call.
    /// Returns whether to keep watching: not once a data frame (one waiting for its turn) shows up.
    pub(super) fn read_reverse(
        &mut self,
        seq: u64,
        writing: bool,
    ) -> Result<bool, CollectiveError> {
        while !self.right_ended {
            let mut src = Counted { stream: &self.right, bytes: &mut self.stats.bytes_received };
            let failure =
                match next_control(&mut self.ahead_right, &mut src, self.right_rank, self.world) {
                    Ok(Between::Blocked) => return Ok(true),
                    Ok(Between::Data) => return Ok(false),
                    Ok(Between::Control(Control::Waiting { notice, seq: of })) => {
                        if of == seq {
                            self.heard_right = Some(Heard { notice, at: Instant::now() });
                        }
                        continue;
                    }
                    Ok(Between::Control(Control::Abort { seq: of, error })) => {
                        if of <= seq || writing {
                            return Err(error);
                        }
                        error
                    }
                    Err(error) if writing => return Err(error),
                    Err(error) => error,
                };
            // Nothing in this call needs the right any more: the next call reports it.
            self.right_ended = true;
            self.pending.get_or_insert(failure);
        }
        Ok(false)
    }

    /// Reads control frames from the left while no frame of this call may come in from it:
    /// notices are noted, an abort of this call fails the call and one of a later call is kept
    /// for the next call. Returns whether to keep watching the left: not once a data frame (one
    /// waiting for its turn, or the next call's), an abort or the end of the stream shows up;
    /// the end is left for the next read.
    pub(super) fn read_left_controls(&mut self, seq: u64) -> Result<bool, CollectiveError> {
        loop {
            let mut src = Counted { stream: &self.left, bytes: &mut self.stats.bytes_received };
            match next_control(&mut self.ahead_left, &mut src, self.left_rank, self.world) {
                Ok(Between::Blocked) => return Ok(true),
                Ok(Between::Data) | Err(_) => return Ok(false),
                Ok(Between::Control(Control::Waiting { notice, seq: of })) => {
                    if of == seq {
                        self.heard_left = Some(Heard { notice, at: Instant::now() });
                    }
                }
                Ok(Between::Control(Control::Abort { seq: of, error })) => {
                    if of == seq {
                        return Err(error);
                    }
                    self.pending.get_or_insert(error);
                    return Ok(false);
                }
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

    /// Queues a waiting notice for both neighbours, each only between data frames to it.
    pub(super) fn send_notice(
        &mut self,
        notice: Waiting,
        seq: u64,
        left_done: bool,
        right_done: bool,
    ) {
        let frame = notice.encode(seq);
        if left_done && self.to_left.is_empty() {
            self.to_left.push(&frame);
        }
        if right_done && self.to_right.is_empty() {
            self.to_right.push(&frame);
        }
        for (queued, stream) in [(&mut self.to_left, &self.left), (&mut self.to_right, &self.right)]
        {
            match queued.flush(stream) {
                Ok(n) => self.stats.bytes_sent += n as u64,
                // The failure shows on reading the stream.
                Err(_) => queued.drop_rest(),
            }
        }
    }
}
