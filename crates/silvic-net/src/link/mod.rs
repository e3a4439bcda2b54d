//! The TCP ring link: moves a collective's plan of frames over non-blocking streams, one
//! [`Stream`] per peer (the two ring neighbours, and the chord peers `r ± 2^k` where the ring
//! has them, `topology.rs`), driven by poll(2).
//!
//! A plan ([`FramePlan`]) has ways, each a route round the ring: on way `w` frames are written
//! to the stream to rank `rank + offset` and read from the stream from rank `rank - offset`
//! ([`Table`]), several ways taking one stream in turn. The two-way ring is two streams (to the
//! right neighbour, route `+1`, and to the left, `-1`) and two ways (rightward and leftward; the
//! leftward one empty in a world of two), so data frames may travel both directions of both
//! streams. Every frame moves the moment the plan lets it: a
//! frame goes out once the frames it forwards are in, and comes in once what it overwrites is
//! out, so a rank forwards a block while the next one arrives, with no lock-step between them.
//! Control frames (aborts and waiting notices) travel both directions of every stream, chords
//! included, and every stream is watched for the whole of every call, so a failure travels
//! around the ring both ways, and across it over the chords, in moments.
//!
//! Invariants:
//! - A call writes and reads at the same time, on every way; it never blocks on a write before
//!   it reads, so buffers of any size cannot deadlock however small the socket buffers are. A
//!   plan's gates keep the seam's rule (a gate looks only at earlier frames of its way and at
//!   earlier ways), so some frame can always move.
//! - Readiness is a hint: every read and write runs until it would block, and `EINTR` retries.
//! - Every stream is read whatever the call waits for: the frames of the way that comes in on
//!   it, when the plan lets them (notices before them noted, an abort before them fails the
//!   call); otherwise the control frames up to the next data frame, which waits for its turn (an
//!   abort of this call fails the call). A stream's end (or an abort of a later call) while this
//!   call needs nothing more of it is kept and returned by the next call, since a neighbour that
//!   has taken everything may end its job before this rank has read its last frame; but an
//!   abort of any call whose origin is a peer this call still needs fails the call at once. A stream
//!   no way of the plan uses (a chord the plan does not need) is read only when poll(2) finds
//!   it ready: at the call's start (one poll that does not wait, for all such streams at once)
//!   and whenever the call waits, never on every turn of a spinning call: an abort on it is
//!   taken at the call's start, or at the latest when the call next waits.
//! - Frames on a stream are read in order and every one is looked at: a waiting notice or a data
//!   frame never hides an abort behind it (a data frame is read whole before what follows it).
//!   A data frame of the next call waits for that call, and what follows it with it. A notice
//!   of this call or an earlier one (a peer still in it) says whom the peer waits on; one of a
//!   later call is ignored. A data frame of the current call that
//!   names another path than the call's fails the call at once, naming its sender, wherever
//!   it comes (the ranks disagree on the path: it may be all that stream brings).
//! - Data frames that may go together go out in one vectored write, headers and payloads, up to
//!   16 frames and 16 KiB (`way::BATCH`): a round of small frames is one system call.
//! - The timeout bounds inactivity per peer: a call fails when the peer it still waits on has
//!   moved no byte and sent no waiting notice for that long ([`Watch`], which keeps the timeout
//!   and decides every timeout, notice, warning and deadline from the moment it is handed). A
//!   waiting rank sends notices to every peer (`watch::notice_every`), naming the rank it
//!   blames (its own
//!   stalled neighbour, or the rank that neighbour's fresh notice names), so only a neighbour
//!   of a stalled rank times out, and every error names the stalled rank. A data frame starts
//!   only once all of it may go, so a frame stalled half-way is the reader's doing, never a wait
//!   further round the ring.
//! - An outgoing frame, data or control, is written whole or the stream is shut: a notice or an
//!   abort only ever follows a complete frame on its stream, so a receiver never mistakes it for
//!   payload.
//! - Every stream that carries data has its own liveness watch: a neighbour alive behind a
//!   closed window is waited for up to the collective timeout, whichever way the data flows.
//! - A rank waits by spinning (yielding the core on every turn) for at most [`watch::SPIN`]
//!   after its last progress (none on a channel's own thread, [`TcpRing::never_spin`]), then
//!   blocks in poll(2): short waits skip a wake-up, long ones cost no CPU. The watch keeps
//!   that span, as it keeps the call's other spans.
//!   A frame that came in and lets a frame of at most [`FORWARD_AT_ONCE`] bytes go is
//!   forwarded before the core is yielded.
//!
//! The module, by concept: [`TcpRing`] here is the drive loop (a call's turns, and its waits
//! in poll(2)); [`Streams`] (`streams.rs`) the streams, with the table from the plan's ways to
//! them (`table.rs`) and one [`Stream`] each (`stream.rs`); [`Watch`] (`watch.rs`) the call's
//! clock; [`Ways`] (`way.rs`) each way's frames in and out; `reader.rs` the frame reader;
//! `close.rs` how a dropped ring closes. The loop reads the clock once a turn and hands the
//! moment to the watch; nothing else in a call reads it. Plans reach the link only through
//! the seam (`ring::seam`).
//!
//! - A call that a cancel armed on its thread watches (`cancel.rs`) looks at it at every turn,
//!   at most every 100 ms, and wakes from poll(2) to do so; once tripped, the call fails with
//!   `Cancelled`, which the caller's abort tells every peer.
//!
//! This is the only module that waits on the ring.
//!
//! [`Stream`]: stream::Stream
//! [`Table`]: table::Table

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use rustix::event::{PollFd, PollFlags};
use silvic_core::{CollectiveError, Op};
use tracing::warn;

use crate::frame::Path;
use crate::ring::seam::{Call, Forced, FramePlan, Link, Network, Route};
use crate::stats::{PeerStats, RingStats};
use crate::wait::wait;

mod close;
mod reader;
mod stream;
mod streams;
mod table;
mod waker;
mod watch;
mod way;

#[cfg(feature = "fuzzing")]
pub(crate) mod replay;

pub(crate) use streams::RingPlace;
use streams::{MAX_STREAMS, StreamFailure, Streams};
use table::Waits;
pub(crate) use waker::Waker;
use watch::Watch;
use way::Ways;

/// The largest payload a rank forwards before it yields its core once the frame that lets it go
/// is in. A small frame's hop is latency: yielding first hands the core to ranks that have
/// nothing to do while the neighbour waits. A large one is not forwarded at once: on a shared
/// core, a rank that keeps it through large writes holds up the ranks that fold and forward
/// behind it (forwarding every frame at once halved world 8's busbw at 2 MiB on loopback).
const FORWARD_AT_ONCE: usize = 64 * 1024;

/// A rank's link: its streams, and the drive loop that moves a plan's frames over them.
#[derive(Debug)]
pub(crate) struct TcpRing {
    streams: Streams,
    /// The ways of the call in progress, kept between calls.
    ways: Ways,
    /// The clock of the call in progress, and the ring's timeout, kept between calls.
    watch: Watch,
    /// What the ranks measured of the network when the ring formed (`probe.rs`).
    network: Network,
    /// What every rank agreed to force on allreduces (`options.rs`).
    forced: Forced,
    /// What ends this channel's part of a call when another channel of this rank fails
    /// (`channels.rs`): on a ring of several channels.
    waker: Option<Arc<Waker>>,
}

/// What the streams show the loop at a turn's end: where the call's path and length are known,
/// what the streams are watched for, and what the last turn left.
struct Turn {
    /// The call's sequence number, and the path and buffer length its frames name.
    call: (u64, Option<(Path, u64)>),
    /// Per stream: whether to read control frames from it while no frame of this call may come
    /// in on it (it stops once a data frame shows up there, which waits for its turn).
    watch: [bool; MAX_STREAMS],
    /// The idle streams (no way of the plan uses them) that poll(2) found ready, to be read once.
    stirred: u64,
}

impl TcpRing {
    /// Wraps the streams of a formed ring, each with the route of the neighbour at its other
    /// end. They must be non-blocking.
    pub(crate) fn new(
        streams: Vec<(Route, TcpStream)>,
        place: RingPlace,
        timeout: Duration,
    ) -> Self {
        let streams = Streams::new(streams, place);
        let watch = Watch::new(streams.peers(), timeout);
        TcpRing {
            streams,
            ways: Ways::default(),
            watch,
            network: Network::UNMEASURED,
            forced: Forced::default(),
            waker: None,
        }
    }

    /// Blocks in poll(2) as soon as a turn moves nothing, never spinning first: for the links of
    /// a rank's further channels (`channels.rs`), whose calls are large and run on threads
    /// of their own, one per channel. Spinning on each of them cost CPU and speed alike where
    /// the channels' threads share cores (docs/results/channels.csv), and a large call's frames
    /// pay a wake-up seldom.
    pub(crate) fn never_spin(&mut self) {
        self.watch.never_spin();
    }

    /// Wakes on `waker` from now on: a trip of it ends the call in progress, and every later
    /// one, with the error it was tripped with.
    pub(crate) fn wake_on(&mut self, waker: Arc<Waker>) {
        self.waker = Some(waker);
    }

    /// The network and what is forced, as [`TcpRing::measured`] took them: what a ring of
    /// another channel takes too.
    pub(crate) fn agreed(&self) -> (Network, Forced) {
        (self.network, self.forced)
    }

    /// Takes the network and the forced path every rank agreed on, and starts the counts of
    /// [`TcpRing::stats`] afresh: what was moved to measure it is not the caller's.
    pub(crate) fn measured(&mut self, network: Network, forced: Forced) {
        (self.network, self.forced) = (network, forced);
        self.streams.restart_counts();
    }

    /// Sets the moment no later call may wait past (`None`: none): `connect`'s deadline while
    /// the ring measures itself (`probe.rs`).
    pub(crate) fn until(&mut self, deadline: Option<Instant>) {
        self.watch.until(deadline);
    }

    /// How long calls wait on a peer that makes no progress.
    pub(crate) fn timeout(&self) -> Duration {
        self.watch.timeout()
    }

    /// Sets how long later calls wait on a peer that makes no progress.
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.watch.set_timeout(timeout);
    }

    /// Whether the link has a stream to rank `rank + route.offset` (see [`Streams::carries`]).
    pub(crate) fn carries(&self, route: Route) -> bool {
        self.streams.carries(route)
    }

    /// What the link has counted so far (see [`Streams::stats`]).
    pub(crate) fn stats(&self) -> RingStats {
        self.streams.stats()
    }

    /// What the link has counted per stream (see [`Streams::peer_stats`]).
    pub(crate) fn peer_stats(&self) -> Vec<PeerStats> {
        self.streams.peer_stats()
    }

    /// Checks every stream's liveness at `now`, as a waiting call does (see `crate::liveness`):
    /// for a channel whose part of a call is done while the rank's other channels still run,
    /// whose last frames may sit unsent behind a neighbour's closed window.
    pub(crate) fn check_liveness(&mut self, now: Instant) {
        let timeout = self.watch.timeout();
        for (s, stream) in self.streams.list.iter_mut().enumerate() {
            stream.liveness.check(&stream.socket, now, self.watch.active(s), timeout);
        }
    }

    /// A handle on this link's stream to `peer` (the first, where two reach it), for tests that
    /// break one stream from outside, as a middlebox that resets one flow does.
    #[cfg(test)]
    pub(crate) fn stream_to(&self, peer: usize) -> TcpStream {
        let stream = self.streams.list.iter().find(|s| s.peer == peer).expect("a stream to peer");
        stream.socket.try_clone().expect("a clone of the socket")
    }

    /// Tells every peer why this rank gives up, then shuts every stream for writing (see
    /// [`Streams::abort`]).
    pub(crate) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        self.streams.abort(rank, error, seq);
    }

    /// One turn: moves what the streams take and the plan lets through, writing the streams in
    /// `writes` (as bits) and reading every stream: returns the streams where data moved.
    ///
    /// A stream no way of the plan uses (a chord the plan does not need) is read only while its
    /// bit is set in `turn.stirred` (once poll(2) has seen it ready: at the call's start and in
    /// the call's own waits), then its bit is cleared: a spinning call does not spend a read on
    /// an idle stream every turn.
    fn turn(
        &mut self,
        plan: &mut dyn FramePlan,
        turn: &mut Turn,
        writes: u64,
    ) -> Result<u64, StreamFailure> {
        let (streams, ways) = (&mut self.streams, &mut self.ways);
        let mut moved = streams.write_all(ways, plan, writes)?;
        let came_before = ways.received_total();
        for s in 0..streams.len() {
            if streams.wants_read(s, ways, plan) {
                if streams.read_ways(s, ways, plan)? {
                    moved |= 1 << s;
                    turn.watch[s] = true;
                }
            } else if turn.watch[s] && (!streams.idle(s) || turn.stirred & (1 << s) != 0) {
                turn.stirred &= !(1 << s);
                turn.watch[s] = streams.read_controls(s, ways, turn.call).map_err(|e| (s, e))?;
            }
        }
        // A small frame that a frame just in lets go (any way) goes out before the core is
        // yielded; the streams were just read, so the loop does not read them again first.
        let came_in = ways.received_total() > came_before;
        if came_in && (0..ways.len()).any(|w| ways.next_out_at_most(plan, w, FORWARD_AT_ONCE)) {
            moved |= streams.write_all(ways, plan, u64::MAX)?;
        }
        Ok(moved)
    }

    /// Runs the call: turns until every frame is through, spinning for a while after progress,
    /// then sleeping in poll(2) until a stream is ready or the [`Watch`] has something due.
    /// The clock is read once a turn, after its reads and writes: that moment is when data
    /// moved and notices came, when the last spin or wait ended, and what the watch is asked
    /// at. What the times mean is the watch's to say.
    fn drive(&mut self, plan: &mut dyn FramePlan) -> Result<(), StreamFailure> {
        let Call { op, seq, .. } = plan.call();
        let n = self.streams.len();
        let started = Instant::now();
        self.watch.start(started);
        // Every frame of a call, whatever its plans, names the same path and buffer length: so
        // its first one's.
        let first = (0..plan.ways().len()).find(|&w| plan.frames(w) > 0);
        let path = first.map(|w| plan.header(w, 0)).map(|h| (h.path, h.total));
        let stirred = self.streams.stirred_idle(started)?;
        let mut turn = Turn { call: (seq, path), watch: [true; MAX_STREAMS], stirred };
        // The last spin or wait, if the loop spun or waited: when it began, the streams it
        // waited on, and whether it slept in poll(2).
        let mut paused: Option<(Instant, u64, bool)> = None;
        // The streams where a frame may go: every one at first, then those the last turn left
        // one free to go on ([`Waits::writes`]).
        let mut free = u64::MAX;
        // Where the call stood after the last turn. A turn that moved no byte of a frame left
        // every count the plan's gates read as it was, so it stands there still: asking every
        // gate again is most of a turn that only waits.
        let mut stands: Option<Waits> = None;
        loop {
            if let Some(error) = self.waker.as_ref().and_then(|w| w.tripped()) {
                return Err((NO_STREAM, error));
            }
            let writes = free | self.streams.queued();
            let moved = self.turn(plan, &mut turn, writes)?;
            let now = Instant::now();
            for s in 0..n {
                if moved & (1 << s) != 0 {
                    self.watch.moved(s, now);
                }
                if let Some(notice) = self.streams.take_heard(s) {
                    self.watch.heard(s, notice, now);
                }
            }
            if let Some((since, on, slept)) = paused.take() {
                self.streams.count_wait(now.saturating_duration_since(since), on);
                if slept {
                    let timeout = self.watch.timeout();
                    for (s, stream) in self.streams.list.iter_mut().enumerate() {
                        stream.liveness.check(&stream.socket, now, self.watch.active(s), timeout);
                    }
                }
            }
            if self.ways.all_done() {
                return Ok(());
            }
            if crate::cancel::cancelled(Some(now)) {
                // No stream failed: every one finishes the frame it was writing.
                return Err((usize::MAX, CollectiveError::Cancelled));
            }
            let waits = match stands {
                Some(waits) if moved == 0 => waits,
                _ => self.streams.waits(&self.ways, plan),
            };
            stands = Some(waits);
            let Waits { on: waited, reads, writes } = waits;
            free = writes;
            self.watch.check_until(now, waited, self.streams.rank)?;
            if self.watch.spins(now) {
                // Spin before blocking: a blocked wake-up costs more than a short message takes
                // to arrive. Yield the core on every turn so that ranks sharing it still run.
                std::thread::yield_now();
                paused = Some((now, waited, false));
                continue;
            }
            let due = self.watch.tick(now, waited, self.streams.rank)?;
            if let Some(notice) = due.notice {
                self.streams.send_notice(notice, seq, &self.ways);
            }
            if let Some((blamed, stalled)) = due.warning {
                let address = self.streams.addresses[blamed];
                warn!("{}", waited_on(op, seq, stalled, blamed, address));
            }
            let streams = &self.streams.list;
            let checks = (0..n).map(|s| streams[s].liveness.next_check(self.watch.active(s)));
            let deadline = due.deadline.into_iter().chain(checks).min();
            let deadline = crate::cancel::wake_by(deadline, now);
            let events = |s: usize| {
                let (stream, mut events) = (&streams[s], PollFlags::empty());
                if writes & (1 << s) != 0 || !stream.queued.is_empty() {
                    events |= PollFlags::OUT;
                }
                let reading = reads & (1 << s) != 0 || turn.watch[s];
                if !stream.ended && reading {
                    events |= PollFlags::IN;
                }
                events
            };
            // On the stack, so that a wait allocates nothing; the waker last.
            let mut fds: ArrayVec<PollFd<'_>, { MAX_STREAMS + 1 }> =
                (0..n).map(|s| PollFd::new(&streams[s].socket, events(s))).collect();
            if let Some(waker) = &self.waker {
                fds.push(PollFd::new(&**waker, PollFlags::IN));
            }
            let polled = wait(&mut fds, deadline);
            polled.map_err(|e| (0, CollectiveError::io(streams[0].peer, &e)))?;
            turn.stirred |=
                (0..n).filter(|&s| !fds[s].revents().is_empty()).map(|s| 1 << s).sum::<u64>();
            paused = Some((now, waited, true));
        }
    }
}

/// The stream a failure names when it came from none (the waker: another channel failed).
const NO_STREAM: usize = usize::MAX;

/// The warning of a call that has waited long, naming the rank it waits on and its address.
fn waited_on(op: Op, seq: u64, stalled: Duration, blamed: usize, address: SocketAddr) -> String {
    let waited = stalled.as_secs();
    format!("{} #{seq} has waited {waited} s on rank {blamed} ({address})", op.name())
}

impl Link for TcpRing {
    fn network(&self) -> Network {
        self.network
    }

    fn forced(&self) -> Forced {
        self.forced
    }

    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        self.streams.start(plan)?;
        self.ways.start(plan);
        let result = self.drive(plan);
        if let Err((failed, _)) = &result {
            let timeout = self.watch.timeout();
            self.streams.finish_frames(*failed, &mut self.ways, plan, timeout);
        }
        self.streams.end(&self.ways);
        result.map_err(|(_, error)| error)
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use silvic_core::Op;

    use super::*;
    use crate::frame::{Abort, Dir, HEADER_LEN, Header, MAX_ABORT_LEN, Waiting};
    use crate::ring::seam::{Moved, Sink};
    use std::io::{Read, Write};

    /// The ring's timeout in these tests: a frame that never comes (or an abort that a data
    /// frame hid) fails the call with a timeout after this, never a hang.
    const BOUND: Duration = Duration::from_secs(20);

    /// A sink into a vector: the bytes, how many have come, and the header the frame must
    /// carry. Shared with reader.rs's tests.
    pub(super) struct VecSink(pub(super) Vec<u8>, pub(super) usize, pub(super) Header);

    impl Sink for VecSink {
        fn expected(&self) -> Header {
            self.2
        }
        fn space(&mut self) -> &mut [u8] {
            &mut self.0[self.1..]
        }
        fn commit(&mut self, n: usize) {
            self.1 += n;
        }
    }

    /// A connected pair of loopback streams: (this rank's end, the test's end).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let theirs = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mine, _) = listener.accept().unwrap();
        mine.set_nonblocking(true).unwrap();
        (mine, theirs)
    }

    /// Rank 1 of a world of 3, its neighbours played by the test.
    fn rank_one(timeout: Duration) -> (TcpRing, TcpStream, TcpStream) {
        let ((left, rank0), (right, rank2)) = (pair(), pair());
        let addresses = vec![left.local_addr().unwrap(); 3];
        let streams = vec![(Route::LEFTWARD, left), (Route::RIGHTWARD, right)];
        (TcpRing::new(streams, RingPlace { rank: 1, addresses }, timeout), rank0, rank2)
    }

    /// One hop of a two-way gather for rank 1 of 3: `payload` as block 1 both ways, block 0
    /// expected from the left and block 2 from the right.
    /// Where `gated`, the frame from the right comes in only after the one from the left (a
    /// gate on an earlier way, as the index's homecomers wait for earlier rounds').
    struct OneHop<'a> {
        header: Header,
        payload: &'a [u8],
        sinks: [VecSink; 2],
        gated: bool,
    }

    fn one_hop(header: Header, payload: &[u8]) -> OneHop<'_> {
        let expect = |way| OneHop::expected(header, way);
        let sinks = [VecSink(vec![0; 3], 0, expect(0)), VecSink(vec![0; 3], 0, expect(1))];
        OneHop { header, payload, sinks, gated: false }
    }

    impl OneHop<'_> {
        /// The header of the frame that comes in on `way`.
        fn expected(header: Header, way: usize) -> Header {
            let from = if way == 0 { 0 } else { 2 };
            header.carrying(DIRS[way], from)
        }
    }

    /// Way 0 rightward, way 1 leftward.
    const DIRS: [Dir; 2] = [Dir::Right, Dir::Left];

    impl FramePlan for OneHop<'_> {
        fn call(&self) -> Call {
            Call { rank: 1, world: 3, op: Op::AllgatherBytes, seq: self.header.seq }
        }
        fn ways(&self) -> &[Route] {
            &[Route::RIGHTWARD, Route::LEFTWARD]
        }
        fn frames(&self, _: usize) -> usize {
            1
        }
        fn header(&self, way: usize, _: usize) -> Header {
            self.header.carrying(DIRS[way], 1)
        }
        fn expect(&self, way: usize, _: usize) -> Header {
            OneHop::expected(self.header, way)
        }
        fn ready(&self, _: usize, _: Moved<'_>) -> bool {
            true
        }
        fn may_receive(&self, way: usize, moved: Moved<'_>) -> bool {
            !self.gated || way == 0 || moved.received[0] == 1
        }
        fn payload(&self, _: usize, _: usize) -> &[u8] {
            self.payload
        }
        fn space(&mut self, way: usize, _: usize) -> &mut [u8] {
            self.sinks[way].space()
        }
        fn commit(&mut self, way: usize, _: usize, n: usize) {
            self.sinks[way].commit(n);
        }
    }

    #[test]
    fn the_warning_names_the_call_the_wait_the_rank_and_its_address() {
        let address = "127.0.0.1:4000".parse().unwrap();
        let text = waited_on(Op::AllreduceSumF64, 0, Duration::from_millis(20_900), 1, address);
        assert_eq!(text, "allreduce_sum_f64 #0 has waited 20 s on rank 1 (127.0.0.1:4000)");
    }

    #[test]
    fn a_call_moves_frames_both_ways_on_both_streams() {
        let (mut ring, mut rank0, mut rank2) = rank_one(BOUND);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        rank0.write_all(&[&header.carrying(Dir::Right, 0).encode()[..], b"zer"].concat()).unwrap();
        rank2.write_all(&[&header.carrying(Dir::Left, 2).encode()[..], b"two"].concat()).unwrap();
        let mut plan = one_hop(header, b"one");
        ring.run(&mut plan).unwrap();
        let [from_left, from_right] = &plan.sinks;
        assert_eq!((&from_left.0[..], &from_right.0[..]), (&b"zer"[..], &b"two"[..]));
        for (peer, dir) in [(&mut rank0, Dir::Left), (&mut rank2, Dir::Right)] {
            let mut got = [0u8; HEADER_LEN + 3];
            peer.read_exact(&mut got).unwrap();
            let head = Header::decode(got[..HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!(head, header.carrying(dir, 1));
            assert_eq!(&got[HEADER_LEN..], b"one");
        }
    }

    #[test]
    fn an_abort_behind_a_leftward_data_frame_fails_the_call_while_the_left_is_silent() {
        // The left neighbour never sends: only the abort on the right can end this call before
        // its timeout (a Timeout error), and it sits behind a whole data frame travelling
        // leftwards.
        let (mut ring, _rank0, mut rank2) = rank_one(BOUND);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        let cause = CollectiveError::PeerClosed { peer: 0 };
        let mut abort = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin: 2, cause: cause.clone() }.encode(0, &mut abort);
        let data = [&header.carrying(Dir::Left, 2).encode()[..], b"two"].concat();
        rank2.write_all(&[&data[..], &abort[..n]].concat()).unwrap();
        let error = ring.run(&mut one_hop(header, b"one")).unwrap_err();
        assert_eq!(error, CollectiveError::Aborted { origin: 2, cause: Box::new(cause) });
    }

    /// Rank 1's call with rank 2's leftward frame in and its own frames out, so that it needs
    /// nothing more of rank 2 and waits only on rank 0; then rank 2 sends an abort of the next
    /// call (it relays a failure it heard there) whose origin is `origin`.
    /// Returns the ring, rank 0's end, rank 2's sender (joined for its end, kept open) and the
    /// error the abort stands for.
    fn later_abort_while_waiting_on_rank_0(origin: usize) -> LaterAbort {
        let (ring, rank0, mut rank2) = rank_one(BOUND);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        rank2.write_all(&[&header.carrying(Dir::Left, 2).encode()[..], b"two"].concat()).unwrap();
        let cause = CollectiveError::Timeout { peer: 1, waited: Duration::from_secs(60) };
        let mut abort = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin, cause: cause.clone() }.encode(1, &mut abort);
        let relay = std::thread::spawn(move || {
            // After rank 1 has had time to take the frame and to find it needs no more of rank 2.
            std::thread::sleep(Duration::from_millis(200));
            rank2.write_all(&abort[..n]).unwrap();
            rank2
        });
        (ring, rank0, relay, CollectiveError::Aborted { origin, cause: Box::new(cause) })
    }

    type LaterAbort = (TcpRing, TcpStream, std::thread::JoinHandle<TcpStream>, CollectiveError);

    #[test]
    fn a_relayed_abort_whose_origin_this_call_waits_on_fails_the_call_at_once() {
        // Rank 0 failed (say every packet between it and rank 1 is lost): it sends nothing
        // more, and its own abort cannot come, so only the abort rank 2 relays from the next
        // call can end this call before its timeout, which would name rank 0 for nothing.
        let (mut ring, _rank0, relay, aborted) = later_abort_while_waiting_on_rank_0(0);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        let error = ring.run(&mut one_hop(header, b"one")).unwrap_err();
        assert_eq!(error, aborted);
        let _rank2 = relay.join().unwrap();
    }

    #[test]
    fn a_later_abort_from_a_rank_this_call_does_not_wait_on_is_kept_for_the_next_call() {
        // Rank 2 failed in the next call: it has sent all it had for this one, which rank 0's
        // frame completes, so this call returns Ok and the next returns the abort.
        let (mut ring, mut rank0, relay, aborted) = later_abort_while_waiting_on_rank_0(2);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            let frame = [&header.carrying(Dir::Right, 0).encode()[..], b"zer"].concat();
            rank0.write_all(&frame).unwrap();
            rank0
        });
        ring.run(&mut one_hop(header, b"one")).unwrap();
        let (_rank0, _rank2) = (late.join().unwrap(), relay.join().unwrap());
        let next = Header::data(Op::AllgatherBytes, 1, 3, 3);
        assert_eq!(ring.run(&mut one_hop(next, b"one")).unwrap_err(), aborted);
    }

    #[test]
    fn a_peer_whose_frame_waits_its_turn_is_not_timed_out_while_the_call_waits_elsewhere() {
        // Rank 2's frame is in from the start, but the plan takes it only after rank 0's, and
        // rank 2 sends nothing more (as a rank that has sent all it can and waits itself, its
        // notices behind that frame). Rank 0 sends only waiting notices for 2.5 timeouts, then
        // its frame: the call waited on rank 0 alone, which stayed alive, so it completes.
        let timeout = Duration::from_secs(1);
        let (mut ring, mut rank0, mut rank2) = rank_one(timeout);
        let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
        rank2.write_all(&[&header.carrying(Dir::Left, 2).encode()[..], b"two"].concat()).unwrap();
        let left = std::thread::spawn(move || {
            for _ in 0..25 {
                let notice = Waiting { on: 2, waited: Duration::from_millis(100) }.encode(0);
                rank0.write_all(&notice).unwrap();
                std::thread::sleep(timeout / 10);
            }
            let frame = [&header.carrying(Dir::Right, 0).encode()[..], b"zer"].concat();
            rank0.write_all(&frame).unwrap();
            rank0
        });
        let mut plan = OneHop { gated: true, ..one_hop(header, b"one") };
        let result = ring.run(&mut plan);
        let _rank0 = left.join().unwrap();
        result.unwrap();
        let [from_left, from_right] = &plan.sinks;
        assert_eq!((&from_left.0[..], &from_right.0[..]), (&b"zer"[..], &b"two"[..]));
    }

    /// Rank 1's call of 3 that sends `payload` rightwards to rank 2 as one frame and takes one
    /// frame of the same length from rank 0.
    struct Outbound<'a> {
        header: Header,
        payload: &'a [u8],
        sink: VecSink,
    }

    impl FramePlan for Outbound<'_> {
        fn call(&self) -> Call {
            Call { rank: 1, world: 3, op: Op::AllgatherBytes, seq: self.header.seq }
        }
        fn ways(&self) -> &[Route] {
            &[Route::RIGHTWARD]
        }
        fn frames(&self, _: usize) -> usize {
            1
        }
        fn header(&self, _: usize, _: usize) -> Header {
            self.header.carrying(Dir::Right, 1)
        }
        fn expect(&self, _: usize, _: usize) -> Header {
            self.header.carrying(Dir::Right, 0)
        }
        fn ready(&self, _: usize, _: Moved<'_>) -> bool {
            true
        }
        fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
            true
        }
        fn payload(&self, _: usize, _: usize) -> &[u8] {
            self.payload
        }
        fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
            self.sink.space()
        }
        fn commit(&mut self, _: usize, _: usize, n: usize) {
            self.sink.commit(n);
        }
    }

    /// A neighbour paused past the liveness bound, then reading again a little at a time through
    /// small buffers (as a resumed rank does), is waited for: its stream's raised
    /// TCP_USER_TIMEOUT is not put back when the window opens, where the kernel's zero-window
    /// clock, still running from the pause, would fail the stream at its next closed window.
    /// The bound is scaled down to 2 s and the checks to 500 ms on this thread (the link runs
    /// here), so the pause takes seconds; the neighbour's reads come closer together than the
    /// checks, as a stream's writes do in a call that moves. Linux only: elsewhere nothing is
    /// raised (`crate::liveness`).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_neighbour_paused_past_the_liveness_bound_then_reading_slowly_is_waited_for() {
        use socket2::{Domain, SockRef, Socket, Type};
        const LEN: usize = 256 * 1024;
        let bound = Duration::from_secs(2);
        crate::liveness::scale_on_this_thread(bound, bound / 4);
        // Rank 2's end takes small segments into a small buffer, so that its window closes and
        // then opens a little at a time, as through the test bed's 16 KiB buffers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let rank2 = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        rank2.set_tcp_mss(1400).unwrap();
        rank2.set_recv_buffer_size(8192).unwrap();
        rank2.connect(&listener.local_addr().unwrap().into()).unwrap();
        let mut rank2 = TcpStream::from(rank2);
        rank2.set_read_timeout(Some(BOUND)).unwrap();
        let (right, _) = listener.accept().unwrap();
        SockRef::from(&right).set_send_buffer_size(8192).unwrap();
        crate::liveness::configure(&right).unwrap();
        let (left, mut rank0) = pair();
        let addresses = vec![left.local_addr().unwrap(); 3];
        let streams = vec![(Route::LEFTWARD, left), (Route::RIGHTWARD, right)];
        let mut ring = TcpRing::new(streams, RingPlace { rank: 1, addresses }, BOUND);
        let header = Header::data(Op::AllgatherBytes, 0, LEN as u64, LEN as u64);
        let feeder = std::thread::spawn(move || {
            let frame = [&header.carrying(Dir::Right, 0).encode()[..], &[7; LEN]].concat();
            rank0.write_all(&frame).unwrap();
            rank0
        });
        let reader = std::thread::spawn(move || {
            std::thread::sleep(bound * 5 / 2);
            let (mut got, mut chunk) = (Vec::new(), [0u8; 3000]);
            let want = HEADER_LEN + LEN;
            for turn in 0.. {
                if got.len() >= want {
                    break;
                }
                let n = rank2.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
                if turn < 8 {
                    std::thread::sleep(bound / 5);
                }
            }
            (rank2, got)
        });
        let payload = vec![1u8; LEN];
        let sink = VecSink(vec![0; LEN], 0, header.carrying(Dir::Right, 0));
        let result = ring.run(&mut Outbound { header, payload: &payload, sink });
        let (_rank0, (_rank2, got)) = (feeder.join().unwrap(), reader.join().unwrap());
        result.unwrap();
        assert_eq!(got.len(), HEADER_LEN + LEN);
        assert!(got[HEADER_LEN..].iter().all(|&b| b == 1));
    }

    #[test]
    fn a_leftward_frame_of_another_block_or_way_is_refused_naming_the_right_neighbour() {
        for wrong in [(Dir::Left, 0), (Dir::Right, 2)] {
            let (mut ring, _rank0, mut rank2) = rank_one(BOUND);
            let header = Header::data(Op::AllgatherBytes, 0, 3, 3);
            let frame = [&header.carrying(wrong.0, wrong.1).encode()[..], b"two"].concat();
            rank2.write_all(&frame).unwrap();
            let error = ring.run(&mut one_hop(header, b"one")).unwrap_err();
            assert!(matches!(error, CollectiveError::MalformedFrame { peer: 2, .. }), "{error}");
        }
    }
}
