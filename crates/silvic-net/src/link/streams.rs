//! A ring's streams as one value ([`Streams`]): every [`Stream`], the table from the call's
//! ways to the streams they write and read ([`Table`]), and what a call does on them: write
//! what each takes, read the frames the plan lets in and the control frames between them, queue
//! waiting notices, give up (an abort to every peer) and count what moved.
//!
//! Invariants:
//! - Control frames are read in order and every one looked at (a notice or a data frame never
//!   hides an abort: a data frame stops the reading, to be read whole when its turn comes, then
//!   what follows it). A failure heard while the call needs nothing more of that neighbour is
//!   kept for the next call ([`Streams::pending`]), not returned early, unless it is an abort
//!   whose origin is a peer the call still needs (that peer sends nothing more).
//! - An outgoing frame, data or control, is written whole or the stream is shut: a notice or an
//!   abort only ever follows a complete frame on its stream. An abort starts on a frame boundary
//!   of every stream it is written to, or is not written (the shutdown still ends the stream);
//!   reads stay open until the ring is dropped.
//! - Nothing here reads the clock but [`Streams::finish_frames`], which bounds how long a
//!   failing rank finishes its frames: a turn's time is the drive loop's (`super`).

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;

use super::reader::{Between, Control, next_control};
use super::stream::Stream;
use super::table::{Table, Waits};
use super::way::{Counted, Ways};
use crate::frame::{Abort, HEADER_LEN, MAX_ABORT_LEN, Path, Waiting};
use crate::ring::seam::{FramePlan, Route};
use crate::stats::{PeerStats, RingStats};
use crate::wait::wait;

/// How long a failing rank keeps writing to finish the frame it was in the middle of, so that it
/// can append an abort frame. Past this it just shuts the stream.
const FINISH_FRAME_BOUND: Duration = Duration::from_millis(250);

/// The most streams a ring has (per-stream flags of a call are bit masks).
pub(super) const MAX_STREAMS: usize = 64;

/// Where the ring sits in its world: this rank, the world size and every rank's address.
#[derive(Debug, Clone)]
pub(crate) struct RingPlace {
    pub(crate) rank: usize,
    pub(crate) addresses: Vec<SocketAddr>,
}

/// A failure of a call, and the stream it came from (the others finish their frames).
pub(super) type StreamFailure = (usize, CollectiveError);

/// A rank's ring streams, and the table of the call in progress over them.
#[derive(Debug)]
pub(super) struct Streams {
    pub(super) list: Vec<Stream>,
    /// The ways of the call in progress on the streams, kept between calls.
    table: Table,
    pub(super) rank: usize,
    world: usize,
    /// Every rank's address, for log lines.
    pub(super) addresses: Vec<SocketAddr>,
    /// A failure heard when nothing in the call needed it: the next call returns it.
    pending: Option<CollectiveError>,
}

impl Streams {
    /// The streams of a formed ring, each with the route of the peer at its other end.
    pub(super) fn new(streams: Vec<(Route, TcpStream)>, place: RingPlace) -> Self {
        let world = place.addresses.len();
        let rank = place.rank;
        assert!(streams.len() <= MAX_STREAMS, "{} streams", streams.len());
        let list = streams
            .into_iter()
            .map(|(route, socket)| Stream::new(socket, route, rank, world))
            .collect();
        let table = Table::default();
        Streams { list, table, rank, world, addresses: place.addresses, pending: None }
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// The rank at the other end of each stream.
    pub(super) fn peers(&self) -> Vec<usize> {
        self.list.iter().map(|s| s.peer).collect()
    }

    /// Whether there is a stream to rank `rank + route.offset`: which routes a plan may use (the
    /// ring's `±1` always; `± 2^k` where chords were formed, `topology.rs`).
    pub(super) fn carries(&self, route: Route) -> bool {
        let peer = route.sends_to(self.rank, self.world);
        peer != self.rank && self.list.iter().any(|s| s.peer == peer)
    }

    /// What the streams have counted so far (collectives are counted by the caller): the bytes
    /// of every stream, and the waits on the streams to the left and the right neighbour as
    /// `waited_left` and `waited_right` (a chord's wait is in [`Streams::peer_stats`] only).
    pub(super) fn stats(&self) -> RingStats {
        let mut stats = RingStats::default();
        for stream in &self.list {
            stats.bytes_sent += stream.sent;
            stats.bytes_received += stream.received;
            match stream.route {
                Route::LEFTWARD => stats.waited_left += stream.waited,
                Route::RIGHTWARD => stats.waited_right += stream.waited,
                _ => {}
            }
        }
        stats
    }

    /// What each stream has counted, in the order of the streams (the left neighbour's, the
    /// right one's, then the chords').
    pub(super) fn peer_stats(&self) -> Vec<PeerStats> {
        let of = |s: &Stream| PeerStats {
            peer: s.peer,
            offset: s.route.offset,
            bytes_sent: s.sent,
            bytes_received: s.received,
            waited: s.waited,
            channel: 0,
        };
        self.list.iter().map(of).collect()
    }

    /// Starts the counts afresh: what moved so far is not the caller's. Bytes read ahead and not
    /// yet taken belong to the caller's first call, and are counted when it runs.
    pub(super) fn restart_counts(&mut self) {
        for stream in &mut self.list {
            (stream.sent, stream.received, stream.waited) = (0, 0, Duration::ZERO);
            stream.read_ahead_at_start = stream.ahead.buffered().len() as u64;
        }
    }

    /// Starts a call of `plan`: a failure kept from an earlier call's end is returned first;
    /// else the table is built where the plan's ways differ from the last call's.
    pub(super) fn start(&mut self, plan: &dyn FramePlan) -> Result<(), CollectiveError> {
        for stream in &mut self.list {
            stream.received += std::mem::take(&mut stream.read_ahead_at_start);
        }
        if let Some(error) = self.pending.take() {
            return Err(error);
        }
        self.table.build(plan, &self.list);
        Ok(())
    }

    /// Ends a call: notes on which streams a data frame is partly written (an abort must not
    /// follow it).
    pub(super) fn end(&mut self, ways: &Ways) {
        for s in 0..self.list.len() {
            self.list[s].boundary = self.out_boundary(s, ways);
        }
    }

    /// Whether no way of the plan writes or reads stream `s`.
    pub(super) fn idle(&self, s: usize) -> bool {
        self.table.idle(s)
    }

    /// Whether no data frame to stream `s` is partly written.
    pub(super) fn out_boundary(&self, s: usize, ways: &Ways) -> bool {
        self.table.writer(s, ways).is_none_or(|w| ways.at_boundary(w))
    }

    /// Whether a way still writes stream `s`.
    fn writing(&self, s: usize, ways: &Ways) -> bool {
        self.table.writer(s, ways).is_some_and(|w| !ways.out_done(w))
    }

    /// Whether the call still needs stream `s`: to write a frame to it or read one from it.
    pub(super) fn needs(&self, s: usize, ways: &Ways) -> bool {
        self.writing(s, ways) || self.table.reader(s, ways).is_some_and(|w| !ways.in_done(w))
    }

    /// The streams (as bits) with notices queued.
    pub(super) fn queued(&self) -> u64 {
        let streams = self.list.iter().enumerate();
        streams.filter(|(_, stream)| !stream.queued.is_empty()).map(|(s, _)| 1 << s).sum()
    }

    /// Where the call stands between turns: the streams it waits on, and those it may write
    /// (see [`Waits`]).
    pub(super) fn waits(&self, ways: &Ways, plan: &dyn FramePlan) -> Waits {
        let (mut reads, mut writes) = (0u64, 0u64);
        for s in 0..self.list.len() {
            if self.wants_read(s, ways, plan) {
                reads |= 1 << s;
            }
            let writer = self.table.writer(s, ways);
            if writer.is_some_and(|w| ways.wants_write(plan, w)) {
                writes |= 1 << s;
            }
        }
        let on = match reads | writes {
            0 => (0..self.list.len()).filter(|&s| self.needs(s, ways)).map(|s| 1 << s).sum(),
            free => free,
        };
        Waits { on, reads, writes }
    }

    /// Whether a frame may come in on stream `s` now: the way on it lets its next one in.
    pub(super) fn wants_read(&self, s: usize, ways: &Ways, plan: &dyn FramePlan) -> bool {
        self.table.reader(s, ways).is_some_and(|w| ways.wants_read(plan, w))
    }

    /// Writes what stream `s` takes: queued notices first, then the frames of the way that
    /// writes it (only the one partly written unless `more`), frames that may go together in
    /// one vectored write. Returns whether a byte of a frame moved.
    pub(super) fn write(
        &mut self,
        s: usize,
        ways: &mut Ways,
        plan: &dyn FramePlan,
        more: bool,
    ) -> Result<bool, StreamFailure> {
        // Whether the frame read from the stream is at a boundary (see [`Stream::gone`]), asked
        // only once a write has failed: asked ahead, it cost every stream a look-up every turn.
        let between = |table: &Table, ways: &Ways| {
            table.reader(s, ways).is_none_or(|w| ways.in_at_boundary(w))
        };
        let world = self.world;
        if !self.list[s].queued.is_empty() {
            let writing = self.writing(s, ways);
            match self.list[s].flush_queued() {
                Ok(()) => {}
                Err(e) if writing => {
                    return Err((s, self.list[s].gone(&e, between(&self.table, ways), world)));
                }
                // Only a notice was left to send: the neighbour needs nothing more in this
                // call. The failure is reported by the next call, or shows on reading the
                // stream.
                Err(e) => {
                    self.list[s].queued.drop_rest();
                    let error = self.list[s].gone(&e, between(&self.table, ways), world);
                    self.pending.get_or_insert(error);
                    return Ok(false);
                }
            }
            if !self.list[s].queued.is_empty() {
                return Ok(false);
            }
        }
        let mut wrote = false;
        while let Some(w) = self.table.writer(s, ways) {
            let stream = &mut self.list[s];
            let out = ways.write_to(plan, w, &stream.socket, &mut stream.sent, more);
            wrote |= out.map_err(|e| (s, stream.gone(&e, between(&self.table, ways), world)))?;
            // Once a way is all out, the next way on the stream may start at once.
            if !more || !ways.out_done(w) || self.table.writer(s, ways) == Some(w) {
                break;
            }
        }
        // A raised TCP_USER_TIMEOUT stays raised though the window opened (`crate::liveness`).
        Ok(wrote)
    }

    /// Writes what the streams in `streams` (as bits) take (see [`Streams::write`]); returns
    /// the streams where a frame's byte moved.
    pub(super) fn write_all(
        &mut self,
        ways: &mut Ways,
        plan: &dyn FramePlan,
        streams: u64,
    ) -> Result<u64, StreamFailure> {
        let mut moved = 0;
        for s in (0..self.list.len()).filter(|&s| streams & (1 << s) != 0) {
            if self.write(s, ways, plan, true)? {
                moved |= 1 << s;
            }
        }
        Ok(moved)
    }

    /// Reads the frames that come in on stream `s` that the plan lets in, way after way as each
    /// is all in ([`Ways::read_from`] asks the plan before each frame); returns whether data
    /// moved. A notice of this call read on the way is kept for the watch
    /// ([`Streams::take_heard`]).
    pub(super) fn read_ways(
        &mut self,
        s: usize,
        ways: &mut Ways,
        plan: &mut dyn FramePlan,
    ) -> Result<bool, StreamFailure> {
        let (mut moved, mut drained) = (false, false);
        while let Some(w) = self.table.reader(s, ways) {
            let stream = &mut self.list[s];
            let mut src = Counted::new(&stream.socket, &mut stream.received).after(drained);
            let mut heard = None;
            let peer = (stream.peer, self.world);
            let read = ways.read_from(plan, w, &mut src, &mut stream.ahead, peer, &mut heard);
            drained = src.drained();
            if heard.is_some() {
                stream.heard = heard;
            }
            moved |= read.map_err(|e| (s, e))?;
            // Once a way is all in, the next way on the stream may start at once.
            if !ways.in_done(w) || self.table.reader(s, ways) == Some(w) {
                break;
            }
        }
        Ok(moved)
    }

    /// The last notice of this call stream `s` brought since this was last asked.
    pub(super) fn take_heard(&mut self, s: usize) -> Option<Waiting> {
        self.list[s].heard.take()
    }

    /// Reads the control frames on stream `s` while no frame of this call may come in from it:
    /// notices of this call or an earlier one (the peer is behind, still in it) are kept for
    /// the watch; an abort of this call (or an earlier one),
    /// and any abort or failure while the call still writes to the stream, fails the call.
    /// Otherwise an abort of a later call, or the stream's end, is kept for the next call and
    /// the stream is no longer watched: a neighbour that has taken everything may end its job
    /// before this rank has read its last frame, and one that failed has told the other
    /// neighbours too (if this call still needs a frame from it, reading that frame fails the
    /// call). Except an abort, of any call, whose origin is a peer this call still needs
    /// ([`Streams::needs`]): the origin sends nothing after its abort, and its own abort may
    /// never come (the stream between them is what failed, as when every packet of a chord is
    /// lost: the origin timed out on it, and its abort reaches this rank only relayed, by ranks
    /// a call ahead), so waiting on it could only end in this call's own timeout, naming the
    /// wrong rank. (An origin that failed a later call had sent this call's frames first;
    /// failing now forgoes them, and the next call would have failed with the same error.)
    /// Returns whether to keep watching: not once a data frame (one waiting for its turn, or
    /// the next call's) shows up. A data frame of this call on another `path` than this rank's
    /// fails the call at once: the ranks disagree on the path, and this frame may be all this
    /// rank would ever get of the call on this stream; where its buffer length differs too,
    /// that is the error (ranks that passed other lengths may choose other paths).
    pub(super) fn read_controls(
        &mut self,
        s: usize,
        ways: &Ways,
        (seq, path): (u64, Option<(Path, u64)>),
    ) -> Result<bool, CollectiveError> {
        let writing = self.writing(s, ways);
        while !self.list[s].ended {
            let stream = &mut self.list[s];
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
                    if of <= seq {
                        stream.heard = Some(notice);
                    }
                    continue;
                }
                Ok(Between::Control(Control::Abort { seq: of, error })) => {
                    if of <= seq || writing || self.needs_origin(&error, ways) {
                        return Err(error);
                    }
                    error
                }
                Err(error) if writing => return Err(error),
                Err(error) => error,
            };
            self.list[s].ended = true;
            self.pending.get_or_insert(failure);
        }
        Ok(false)
    }

    /// Whether `error` is an abort whose origin is the peer of a stream this call still needs.
    fn needs_origin(&self, error: &CollectiveError, ways: &Ways) -> bool {
        let CollectiveError::Aborted { origin, .. } = error else { return false };
        (0..self.list.len()).any(|t| self.list[t].peer == *origin && self.needs(t, ways))
    }

    /// The streams no way of the plan uses (chords the plan does not need) that have something
    /// to read at the call's start (`now`), as bits: bytes read ahead, or what one poll(2) that
    /// does not wait finds ready (data, an end, an error). One poll for them all, not a read of
    /// each: a call of a few bytes would spend more on reading idle chords than on its own
    /// frames.
    pub(super) fn stirred_idle(&self, now: Instant) -> Result<u64, StreamFailure> {
        let n = self.list.len();
        let idle = |s: usize| self.table.idle(s) && !self.list[s].ended;
        if !(0..n).any(idle) {
            return Ok(0);
        }
        let events = |s: usize| if idle(s) { PollFlags::IN } else { PollFlags::empty() };
        let mut fds: ArrayVec<PollFd<'_>, MAX_STREAMS> =
            (0..n).map(|s| PollFd::new(&self.list[s].socket, events(s))).collect();
        // A deadline already passed: poll(2) answers at once.
        let polled = wait(&mut fds, Some(now));
        polled.map_err(|e| (0, CollectiveError::io(self.list[0].peer, &e)))?;
        let stirred =
            |s: usize| !self.list[s].ahead.buffered().is_empty() || !fds[s].revents().is_empty();
        Ok((0..n).filter(|&s| idle(s) && stirred(s)).map(|s| 1 << s).sum())
    }

    /// Queues a waiting notice of call `seq` for every peer whose stream is between data frames,
    /// and writes what each stream takes.
    pub(super) fn send_notice(&mut self, notice: Waiting, seq: u64, ways: &Ways) {
        let frame = notice.encode(seq);
        for s in 0..self.list.len() {
            let at_boundary = self.out_boundary(s, ways);
            let stream = &mut self.list[s];
            if at_boundary && stream.queued.is_empty() {
                stream.queued.push(&frame);
            }
            // The failure shows on reading the stream.
            if stream.flush_queued().is_err() {
                stream.queued.drop_rest();
            }
        }
    }

    /// Adds a wait to the time spent waiting on each stream the call waited on.
    pub(super) fn count_wait(&mut self, waited: Duration, on: u64) {
        for (s, stream) in self.list.iter_mut().enumerate() {
            if on & (1 << s) != 0 {
                stream.waited += waited;
            }
        }
    }

    /// After a failure on stream `failed`, keeps writing the frame partly written to each other
    /// stream for a short while (at most `timeout`), so that the neighbour there gets a whole
    /// frame and then the abort.
    pub(super) fn finish_frames(
        &mut self,
        failed: usize,
        ways: &mut Ways,
        plan: &dyn FramePlan,
        timeout: Duration,
    ) {
        for s in (0..self.list.len()).filter(|&s| s != failed) {
            let deadline = Instant::now() + FINISH_FRAME_BOUND.min(timeout);
            while !self.out_boundary(s, ways) && Instant::now() < deadline {
                if self.write(s, ways, plan, false).is_err() {
                    break;
                }
                let mut fds = [PollFd::new(&self.list[s].socket, PollFlags::OUT)];
                if self.out_boundary(s, ways) || wait(&mut fds, Some(deadline)).is_err() {
                    break;
                }
            }
        }
    }

    /// Tells every peer (ring neighbours and chords) why this rank gives up, best effort, then
    /// shuts every stream for writing. Reads stay open until the ring is dropped, so a peer's
    /// last bytes are not answered with a reset that could destroy its own abort frame in flight.
    pub(super) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let len = Abort::for_error(rank, error).encode(seq, &mut frame);
        let frame = &frame[..len];
        for stream in &self.list {
            // A notice partly written goes out whole first, so the abort starts on a frame
            // boundary. Non-blocking: an abort is small; if it does not fit, the shutdown below
            // still ends the stream.
            if stream.boundary {
                let _ = (&stream.socket).write(&[stream.queued.rest(), frame].concat());
            }
        }
        for stream in &self.list {
            let _ = stream.socket.shutdown(Shutdown::Write);
        }
    }
}
