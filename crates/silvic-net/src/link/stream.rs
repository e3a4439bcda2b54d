//! One ring stream as the link keeps it ([`Stream`]): the socket and everything that belongs
//! to it alone (its counts, which [`TcpRing::stats`] and [`TcpRing::peer_stats`] report), and
//! the table from a plan's ways to the streams they write and read ([`Table`]), with what it
//! says of a call: the streams it still needs, the ones it waits on now, and the frames that
//! come in on a stream, read way after way.
//!
//! Invariants: a stream is named by its route (the signed offset round the ring of the rank at
//! its other end, `topology.rs`), so the two streams of a world of two, both to rank 1,
//! stay apart; a way writes the stream to the rank its route sends to and reads the stream from
//! the rank that far back; ways that share a stream take it in turn, the earlier way's frames
//! all before the later one's, so frames of two ways never interleave on a stream. A call
//! waits on a stream only while the plan lets that stream's next frame through (in or out).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::control::{Heard, Queued};
use super::reader::ReadAhead;
use super::way::{Counted, Ways};
use super::{READ_AHEAD, StreamFailure, TcpRing};
use crate::liveness::Liveness;
use crate::ring::seam::{Call, FramePlan, Route};
use crate::stats::{PeerStats, RingStats};

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
    /// The last notice the peer sent.
    pub(super) heard: Option<Heard>,
    /// False while a data frame to the peer is partly written.
    pub(super) boundary: bool,
    /// The stream has ended or failed while nothing needed it.
    pub(super) ended: bool,
    /// TCP_USER_TIMEOUT, raised while the peer is alive but not reading.
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
}

impl TcpRing {
    /// Whether the link has a stream to rank `rank + route.offset`: which routes a plan may use
    /// (the ring's `±1` always; `± 2^k` where chords were formed, `topology.rs`).
    pub(crate) fn carries(&self, route: Route) -> bool {
        let peer = route.sends_to(self.rank, self.world);
        peer != self.rank && self.streams.iter().any(|s| s.peer == peer)
    }

    /// What the link has counted so far (collectives are counted by the caller): the bytes of
    /// every stream, and the waits on the streams to the left and the right neighbour as
    /// `waited_left` and `waited_right` (a chord's wait is in [`TcpRing::peer_stats`] only).
    pub(crate) fn stats(&self) -> RingStats {
        let mut stats = RingStats::default();
        for stream in &self.streams {
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

    /// What the link has counted per stream, in the order of its streams (the left
    /// neighbour's, the right one's, then the chords').
    pub(crate) fn peer_stats(&self) -> Vec<PeerStats> {
        let of = |s: &Stream| PeerStats {
            peer: s.peer,
            offset: s.route.offset,
            bytes_sent: s.sent,
            bytes_received: s.received,
            waited: s.waited,
        };
        self.streams.iter().map(of).collect()
    }

    /// Whether the call still needs stream `s`: to write a frame to it or read one from it.
    pub(super) fn needs(&self, s: usize) -> bool {
        let writes = self.table.writer(s, &self.ways).is_some_and(|w| !self.ways.out_done(w));
        writes || self.table.reader(s, &self.ways).is_some_and(|w| !self.ways.in_done(w))
    }

    /// The streams (as bits) with notices queued.
    pub(super) fn queued(&self) -> u64 {
        let streams = self.streams.iter().enumerate();
        streams.filter(|(_, stream)| !stream.queued.is_empty()).map(|(s, _)| 1 << s).sum()
    }

    /// Where the call stands between turns: the streams it waits on, and those it may write
    /// (see [`Waits`]).
    pub(super) fn waits(&self, plan: &dyn FramePlan) -> Waits {
        let (mut reads, mut writes) = (0u64, 0u64);
        for s in 0..self.streams.len() {
            if self.wants_read(s, plan) {
                reads |= 1 << s;
            }
            let writer = self.table.writer(s, &self.ways);
            if writer.is_some_and(|w| self.ways.wants_write(plan, w)) {
                writes |= 1 << s;
            }
        }
        let on = match reads | writes {
            0 => (0..self.streams.len()).filter(|&s| self.needs(s)).map(|s| 1 << s).sum(),
            free => free,
        };
        Waits { on, reads, writes }
    }

    /// Whether a frame may come in on stream `s` now: the way on it lets its next one in.
    pub(super) fn wants_read(&self, s: usize, plan: &dyn FramePlan) -> bool {
        self.table.reader(s, &self.ways).is_some_and(|w| self.ways.wants_read(plan, w))
    }

    /// Reads the frames that come in on stream `s` that the plan lets in, way after way as each
    /// is all in ([`Ways::read_from`] asks the plan before each frame); returns whether data
    /// moved. A notice of this call read on the way is noted.
    pub(super) fn read_ways(
        &mut self,
        s: usize,
        plan: &mut dyn FramePlan,
    ) -> Result<bool, StreamFailure> {
        let (mut moved, mut drained) = (false, false);
        while let Some(w) = self.table.reader(s, &self.ways) {
            let stream = &mut self.streams[s];
            let mut src = Counted::new(&stream.socket, &mut stream.received).after(drained);
            let mut heard = None;
            let peer = (stream.peer, self.world);
            let read = self.ways.read_from(plan, w, &mut src, &mut stream.ahead, peer, &mut heard);
            drained = src.drained();
            if let Some(notice) = heard {
                stream.heard = Some(Heard { notice, at: Instant::now() });
            }
            moved |= read.map_err(|e| (s, e))?;
            // Once a way is all in, the next way on the stream may start at once.
            if !self.ways.in_done(w) || self.table.reader(s, &self.ways) == Some(w) {
                break;
            }
        }
        Ok(moved)
    }

    /// Adds a wait to the time spent waiting on each stream the call waited on.
    pub(super) fn count_wait(&mut self, waited: Duration, on: u64) {
        for (s, stream) in self.streams.iter_mut().enumerate() {
            if on & (1 << s) != 0 {
                stream.waited += waited;
            }
        }
    }
}

/// Where a call stands between turns, as bits of streams.
///
/// It waits on the streams where the plan lets the next frame in and it has not come, or lets a
/// frame out and the socket has not taken it all. A stream the call still needs but whose next
/// frame in and out the plan holds back is not waited on: its turn waits on another stream, and
/// its peer may have sent all it can and be waiting itself, its notices queued behind a data
/// frame this rank does not read yet, so its silence says nothing of it. Where no stream is
/// waited on so (the seam's rule keeps some frame free to move, so this is a safeguard), it
/// waits on every stream the call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waits {
    /// The streams the call waits on (above).
    pub(super) on: u64,
    /// The streams where the plan lets the next frame in.
    pub(super) reads: u64,
    /// The streams with a frame partly written or free to start. Nothing but a turn's own
    /// reads and writes changes what the plan lets go, so the next turn writes only these (and
    /// streams with notices queued).
    pub(super) writes: u64,
}

/// The plan's ways on the streams: per stream, the ways that write it and the ways that read
/// it, in the plan's order. Way `w` writes the stream to rank `rank + offset` and reads the one
/// from rank `rank - offset`, found by peer rank; in a world of two, whose two streams both go
/// to rank 1, by the sign of the offset too (a positive one writes the stream dialled to the
/// right and reads the one accepted from the left, as the ring always has).
///
/// Several ways may share a stream: the plans use it in turn (every frame of an earlier way on
/// it before any of a later one's), so the way on a stream now is the earliest one not yet done
/// with it, and the next frame read from it is that way's (its header is checked against that
/// way's [`FramePlan::expect`], so a frame that does not fit is refused as ever).
///
/// The table is kept between calls and built again only when a call's ways differ from the
/// last call's: a trainer's calls mostly repeat one plan's routes.
#[derive(Debug, Default)]
pub(super) struct Table {
    writers: Vec<Vec<usize>>,
    readers: Vec<Vec<usize>>,
    /// What the table was built for: the rank, the world, and the plan's routes, way by way.
    built_for: Option<(usize, usize)>,
    routes: Vec<Route>,
}

impl Table {
    /// The table of `plan` over `streams` (the same streams every call). Panics if a way's
    /// route has no stream: a plan this link cannot carry is a bug, not a peer's doing.
    pub(super) fn build(&mut self, plan: &dyn FramePlan, streams: &[Stream]) {
        let Call { rank, world, .. } = plan.call();
        if self.built_for == Some((rank, world)) && self.routes == plan.ways() {
            return;
        }
        self.built_for = Some((rank, world));
        self.routes.clear();
        self.routes.extend_from_slice(plan.ways());
        let find = |offset: isize| {
            let peer = Route { offset }.sends_to(rank, world);
            let to_peer = |s: &&Stream| s.peer == peer;
            let same_side = |s: &&Stream| s.route.offset.signum() == offset.signum();
            let found = match streams.iter().filter(to_peer).count() {
                1 => streams.iter().position(|s| to_peer(&s)),
                _ => streams.iter().position(|s| to_peer(&s) && same_side(&s)),
            };
            found.unwrap_or_else(|| unreachable!("no stream to rank {peer} for offset {offset}"))
        };
        for lists in [&mut self.writers, &mut self.readers] {
            lists.iter_mut().for_each(Vec::clear);
            lists.resize_with(streams.len(), Vec::new);
        }
        for (w, route) in plan.ways().iter().enumerate() {
            self.writers[find(route.offset)].push(w);
            self.readers[find(-route.offset)].push(w);
        }
    }

    /// Whether no way of the plan writes or reads stream `s`.
    pub(super) fn idle(&self, s: usize) -> bool {
        self.writers[s].is_empty() && self.readers[s].is_empty()
    }

    /// The way that writes stream `s` now: the first whose frames are not all out, else the
    /// last (done), if any way writes it.
    pub(super) fn writer(&self, s: usize, ways: &Ways) -> Option<usize> {
        let on = &self.writers[s];
        on.iter().copied().find(|&w| !ways.out_done(w)).or(on.last().copied())
    }

    /// The way that reads stream `s` now: the first whose frames are not all in, else the last.
    pub(super) fn reader(&self, s: usize, ways: &Ways) -> Option<usize> {
        let on = &self.readers[s];
        on.iter().copied().find(|&w| !ways.in_done(w)).or(on.last().copied())
    }
}
