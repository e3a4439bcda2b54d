//! One ring stream as the link keeps it ([`Stream`]): the socket and everything that belongs
//! to it alone: its counts (which `TcpRing::stats` and `TcpRing::peer_stats` report), the bytes
//! read ahead, the notices queued for its peer ([`Queued`]), the last notice its peer sent
//! and not yet handed to the watch, its liveness bound, and whether it has ended.
//!
//! Invariants: a stream is named by its route (the signed offset round the ring of the rank at
//! its other end, `topology.rs`), so the two streams of a world of two, both to rank 1, stay
//! apart; a notice is queued whole, only between data frames on its stream, and dropped (never
//! retried in a busy loop) if its stream fails.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::Duration;

use silvic_core::CollectiveError;

use super::reader::{Between, Control, ReadAhead, next_control, stream_error};
use super::way::Counted;
use crate::frame::{HEADER_LEN, Waiting};
use crate::liveness::Liveness;
use crate::ring::seam::Route;
use crate::wait::nonblocking;

/// Bytes of a stream one read takes ahead: a header and a small payload arrive in one call.
pub(super) const READ_AHEAD: usize = HEADER_LEN + 16 * 1024;

/// A ring stream and all that is its own.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) socket: TcpStream,
    /// The rank at the other end is `rank + route.offset`.
    pub(super) route: Route,
    pub(super) peer: usize,
    /// What was read beyond the last frame.
    pub(super) ahead: ReadAhead,
    /// Notices queued for the peer, written between data frames.
    pub(super) queued: Queued,
    /// The last notice of this call the peer sent since the watch was last told of one.
    pub(super) heard: Option<Waiting>,
    /// False while a data frame to the peer is partly written.
    pub(super) boundary: bool,
    /// The stream has ended or failed while nothing needed it.
    pub(super) ended: bool,
    /// TCP_USER_TIMEOUT, raised once the peer was seen alive but not reading, until it is seen
    /// silent (`crate::liveness`).
    pub(super) liveness: Liveness,
    /// Time spent waiting while a call needed this stream.
    pub(super) waited: Duration,
    /// Bytes written to the stream and read from it.
    pub(super) sent: u64,
    pub(super) received: u64,
    /// Bytes read ahead while the network was measured, for the first call to count.
    pub(super) read_ahead_at_start: u64,
}

impl Stream {
    pub(super) fn new(socket: TcpStream, route: Route, rank: usize, world: usize) -> Self {
        Stream {
            socket,
            route,
            peer: route.sends_to(rank, world),
            ahead: ReadAhead::new(READ_AHEAD),
            queued: Queued::default(),
            heard: None,
            boundary: true,
            ended: false,
            liveness: Liveness::new(),
            waited: Duration::ZERO,
            sent: 0,
            received: 0,
            read_ahead_at_start: 0,
        }
    }

    /// Writes what the socket takes of the queued notices, counting the bytes.
    pub(super) fn flush_queued(&mut self) -> io::Result<()> {
        let n = self.queued.flush(&self.socket)?;
        self.sent += n as u64;
        Ok(())
    }

    /// The error for a failed write to this stream: the abort the peer sent before it closed,
    /// if it is waiting to be read between frames, else the socket error itself. Only looked
    /// for when `between` frames: bytes of a frame partly read are no frame header.
    pub(super) fn gone(&mut self, e: &io::Error, between: bool, world: usize) -> CollectiveError {
        let peer = self.peer;
        let mut src = Counted::new(&self.socket, &mut self.received);
        while let Some(Ok(Between::Control(control))) =
            between.then(|| next_control(&mut self.ahead, &mut src, peer, world))
        {
            if let Control::Abort { error, .. } = control {
                return error;
            }
        }
        stream_error(peer, e)
    }
}

/// Control bytes queued for one stream, written whole before anything else goes on it.
#[derive(Debug, Default)]
pub(super) struct Queued {
    bytes: Vec<u8>,
    sent: usize,
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
    fn flush(&mut self, mut stream: &TcpStream) -> io::Result<usize> {
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
