//! The TCP ring link: one lock-step exchange over two non-blocking sockets, driven by poll(2).
//!
//! Each rank holds two streams. Data flows one way around the ring: a rank writes frames to its
//! right neighbour and reads frames from its left. The reverse direction of each stream carries
//! control frames only (aborts and waiting notices), and both directions are watched for the
//! whole of every step, so a failure travels around the ring both ways in moments.
//!
//! Invariants:
//! - A step writes and reads at the same time; neither side ever blocks on a write before it
//!   reads, so buffers of any size cannot deadlock however small the socket buffers are.
//! - Readiness is a hint: every read and write runs until it would block, and `EINTR` retries.
//! - The right stream's reverse direction is read whatever the step waits for: an abort there
//!   fails the step at once. Its end (or an abort of a later call) while this rank has nothing
//!   left to send in the step is kept and returned by the next step, since a right neighbour that
//!   has taken everything may end its job before this rank has read its last frame.
//! - Once this step's frame from the left is in, control frames behind it are read too (an abort
//!   of this call fails the step), up to the next data frame, which is left for the next step.
//! - Frames on a stream are read in order and every one is looked at: a waiting notice never
//!   hides an abort behind it. On the left, a data frame of the next step waits for that step,
//!   and what follows it with it. A notice of another call than the current one is ignored.
//! - The timeout bounds inactivity per peer: a step fails when the peer it still waits on has
//!   moved no byte and sent no waiting notice for that long. A waiting rank sends notices to both
//!   neighbours ([`notice_every`]), naming the rank it blames (its own stalled neighbour, or the
//!   rank that neighbour's fresh notice names), so only a neighbour of a stalled rank times out,
//!   and every error names the stalled rank.
//! - An outgoing frame, data or control, is written whole or the stream is shut: a notice or an
//!   abort only ever follows a complete frame, so a receiver never mistakes it for payload.
//! - A rank waits by spinning (yielding the core on every turn) for at most [`SPIN`] after its
//!   last progress, then blocks in poll(2): short waits skip a wake-up, long ones cost no CPU.
//!
//! This is the only module that waits on the ring.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;
use tracing::warn;

use crate::frame::{Abort, HEADER_LEN, Header, Kind, MAX_ABORT_LEN, Waiting};
use crate::liveness::Liveness;
use crate::ring::{Link, Sink};
use crate::stats::RingStats;
use crate::wait::wait;

mod control;
mod reader;

use control::{Heard, Queued, notice_every};
#[cfg(feature = "fuzzing")]
pub(crate) mod replay;

use reader::{ControlReader, Incoming, ReadAhead};

/// How long a failing rank keeps writing to finish the frame it was in the middle of, so that it
/// can append an abort frame. Past this it just shuts the stream.
const FINISH_FRAME_BOUND: Duration = Duration::from_millis(250);

/// Payloads up to this size go out in one write together with their header.
const COALESCE: usize = 16 * 1024;

/// How long a step keeps trying, yielding the core between tries, after its last progress
/// before it blocks in poll(2): a short wait is cheaper spun than woken from (README,
/// Performance); past it the rank sleeps, so a slow peer costs no CPU. Yielding (never a bare
/// spin) lets ranks that share a core with this one run.
const SPIN: Duration = Duration::from_micros(50);

/// Bytes of the left stream one read takes ahead: a coalesced frame arrives in one call.
const READ_AHEAD: usize = HEADER_LEN + COALESCE;

/// A collective that has waited this long without progress logs a warning, then again each
/// time its wait doubles.
const WARN_AFTER: Duration = Duration::from_secs(10);

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
    rank: usize,
    world: usize,
    left_rank: usize,
    right_rank: usize,
    /// Every rank's address, for log lines.
    addresses: Vec<SocketAddr>,
    timeout: Duration,
    /// False while a data frame to the right is partly written.
    at_frame_boundary: bool,
    /// Header and small payload, written together.
    coalesced: Vec<u8>,
    /// The reverse direction of the right stream, where only control frames arrive.
    reverse: ControlReader,
    /// The reverse direction of the right stream has ended or failed.
    right_ended: bool,
    /// A failure heard when nothing in the step needed it: the next step returns it.
    pending: Option<CollectiveError>,
    /// Notices queued for the left (reverse direction) and the right (between data frames).
    to_left: Queued,
    to_right: Queued,
    /// The last notice each neighbour sent.
    heard_left: Option<Heard>,
    heard_right: Option<Heard>,
    /// TCP_USER_TIMEOUT of the right stream, raised while the right neighbour is alive but
    /// not reading.
    liveness: Liveness,
    /// How long a step spins before it blocks ([`SPIN`]).
    spin: Duration,
    /// What was read from the left stream beyond the last frame.
    ahead: ReadAhead,
    stats: RingStats,
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

/// A stream read that counts what it reads.
struct Counted<'a> {
    stream: &'a TcpStream,
    bytes: &'a mut u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        *self.bytes += n as u64;
        Ok(n)
    }
}

/// Where the ring sits in its world: this rank, the world size and every rank's address.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) rank: usize,
    pub(crate) addresses: Vec<SocketAddr>,
}

impl TcpRing {
    /// Wraps the two streams of a formed ring. They must be non-blocking.
    pub(crate) fn new(left: TcpStream, right: TcpStream, place: Place, timeout: Duration) -> Self {
        let world = place.addresses.len();
        let rank = place.rank;
        TcpRing {
            left,
            right,
            rank,
            world,
            left_rank: (rank + world - 1) % world,
            right_rank: (rank + 1) % world,
            addresses: place.addresses,
            timeout,
            at_frame_boundary: true,
            coalesced: Vec::with_capacity(HEADER_LEN + COALESCE),
            reverse: ControlReader::new(),
            right_ended: false,
            pending: None,
            to_left: Queued::default(),
            to_right: Queued::default(),
            heard_left: None,
            heard_right: None,
            liveness: Liveness::new(),
            spin: SPIN,
            ahead: ReadAhead::new(READ_AHEAD),
            stats: RingStats::default(),
        }
    }

    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// What the link has counted so far (collectives are counted by the caller).
    pub(crate) fn stats(&self) -> RingStats {
        self.stats
    }

    /// Writes what the right stream takes: queued control bytes first, then the frame.
    /// Returns whether a byte of the frame moved.
    fn write_some(&mut self, out: &mut Outgoing<'_>) -> Result<bool, CollectiveError> {
        match self.to_right.flush(&self.right) {
            Ok(n) => self.stats.bytes_sent += n as u64,
            Err(e) if !out.done() => return Err(self.right_gone(&e)),
            // Only a notice was left to send: the right needs nothing more in this step, and
            // the next step reports the failure.
            Err(e) => {
                self.to_right.sent = self.to_right.bytes.len();
                let error = self.right_gone(&e);
                self.pending.get_or_insert(error);
            }
        }
        let mut moved = false;
        while !out.done() && self.to_right.is_empty() {
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
                    self.stats.bytes_sent += n as u64;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.right_gone(&e)),
            }
        }
        Ok(moved)
    }

    fn drive(
        &mut self,
        out: &mut Outgoing<'_>,
        incoming: &mut Incoming,
        expect: &Header,
        sink: &mut dyn Sink,
    ) -> Result<(), (Side, CollectiveError)> {
        let seq = expect.seq;
        let started = Instant::now();
        // Data progress per side; a notice also shows a neighbour alive (for the timeout).
        let (mut left_active, mut right_active) = (started, started);
        let mut watch_left = true;
        let mut next_notice: Option<Instant> = None;
        let mut warn_at = WARN_AFTER;
        let every = notice_every(self.timeout);
        loop {
            if self.write_some(out).map_err(|e| (Side::Right, e))? {
                right_active = Instant::now();
                self.liveness.restore(&self.right);
            }
            if !incoming.done() {
                let mut src = Counted { stream: &self.left, bytes: &mut self.stats.bytes_received };
                let mut heard = None;
                let moved = incoming
                    .read_from(
                        &mut src,
                        &mut self.ahead,
                        (self.left_rank, self.world),
                        expect,
                        sink,
                        &mut heard,
                    )
                    .map_err(|e| (Side::Left, e))?;
                let now = Instant::now();
                if moved {
                    left_active = now;
                }
                if let Some(notice) = heard {
                    self.heard_left = Some(Heard { notice, at: now });
                }
            }
            if incoming.done() && watch_left {
                watch_left = self.read_left_controls(seq).map_err(|e| (Side::Left, e))?;
            }
            self.read_reverse(seq, !out.done()).map_err(|e| (Side::Right, e))?;
            self.stats.bytes_sent += self.to_left.flush_or_drop(&self.left);
            if out.done() && incoming.done() {
                return Ok(());
            }
            let last_progress = left_active.max(right_active);
            if last_progress.elapsed() < self.spin {
                // Spin before blocking: a blocked wake-up costs more than a short message takes
                // to arrive. Yield the core on every turn so that ranks sharing it still run.
                let t = Instant::now();
                std::thread::yield_now();
                self.count_wait(t.elapsed(), incoming.done(), out.done());
                continue;
            }

            // Each side this step still needs, with its last sign of life.
            let heard_at =
                |h: Option<Heard>, active: Instant| h.map_or(active, |h| h.at.max(active));
            let left_alive = heard_at(self.heard_left, left_active);
            let right_alive = heard_at(self.heard_right, right_active);
            let waits = [
                (!incoming.done()).then_some((Side::Left, left_active, left_alive)),
                (!out.done()).then_some((Side::Right, right_active, right_alive)),
            ];
            let now = Instant::now();
            for (side, _, alive) in waits.iter().flatten() {
                if alive.checked_add(self.timeout).is_some_and(|d| now >= d) {
                    let peer = match side {
                        Side::Left => self.left_rank,
                        Side::Right => self.right_rank,
                    };
                    return Err((*side, CollectiveError::Timeout { peer, waited: self.timeout }));
                }
            }
            // The side waited on longest, and whom to blame for it.
            let (side, since, _) =
                waits.iter().flatten().min_by_key(|w| w.1).copied().expect("the step waits");
            let blamed = self.blame(side, since);
            let stalled = now.saturating_duration_since(last_progress);
            let notice_due = |next: Option<Instant>| {
                let first = last_progress + every;
                next.map_or(first, |t| t.max(first))
            };
            if now >= notice_due(next_notice) {
                self.send_notice(Waiting { on: blamed, waited: stalled }, seq, out.done());
                next_notice = Some(now + every);
            }
            if stalled >= warn_at {
                let op = match expect.kind {
                    Kind::Data(op) => op.name(),
                    _ => "collective",
                };
                warn!(
                    "{op} #{seq} has waited {} s on rank {blamed} ({})",
                    stalled.as_secs(),
                    self.addresses[blamed]
                );
                warn_at = warn_at.saturating_mul(2);
            }

            // A timeout too long for an Instant (Duration::MAX) has no deadline.
            let deadline = waits
                .iter()
                .flatten()
                .filter_map(|(_, _, alive)| alive.checked_add(self.timeout))
                .chain([self.liveness.next_check(last_progress)])
                .chain([notice_due(next_notice)])
                .chain(last_progress.checked_add(warn_at))
                .min();
            let mut right_events = PollFlags::empty();
            if !out.done() || !self.to_right.is_empty() {
                right_events |= PollFlags::OUT;
            }
            if !self.right_ended {
                right_events |= PollFlags::IN;
            }
            let mut left_events = PollFlags::empty();
            if !incoming.done() || watch_left {
                left_events |= PollFlags::IN;
            }
            if !self.to_left.is_empty() {
                left_events |= PollFlags::OUT;
            }
            let mut fds =
                [PollFd::new(&self.right, right_events), PollFd::new(&self.left, left_events)];
            let t = Instant::now();
            wait(&mut fds, deadline)
                .map_err(|e| (Side::Left, CollectiveError::io(self.left_rank, &e)))?;
            self.count_wait(t.elapsed(), incoming.done(), out.done());
            self.liveness.check(&self.right, last_progress, self.timeout);
        }
    }

    /// Adds a wait to the time spent waiting on each side the step still needed.
    fn count_wait(&mut self, waited: Duration, left_done: bool, right_done: bool) {
        if !left_done {
            self.stats.waited_left += waited;
        }
        if !right_done {
            self.stats.waited_right += waited;
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
        let frame = &frame[..len];
        // A notice partly written goes out whole first, so the abort starts on a frame boundary.
        let left = [self.to_left.rest(), frame].concat();
        let mut targets = vec![(&self.left, left)];
        if self.at_frame_boundary {
            targets.push((&self.right, [self.to_right.rest(), frame].concat()));
        }
        for (mut stream, bytes) in targets {
            // Non-blocking: an abort is small and the reverse direction is otherwise nearly
            // empty; if it does not fit, the shutdown below still ends the stream.
            let _ = stream.write(&bytes);
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
        if let Some(error) = self.pending.take() {
            return Err(error);
        }
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
