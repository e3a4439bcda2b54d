//! The TCP ring link: moves a collective's plan of frames over two non-blocking sockets, driven
//! by poll(2).
//!
//! Each rank holds two streams. A plan ([`FramePlan`]) has a rightward way (frames written to the
//! right neighbour, as many read from the left) and a leftward way (written to the left, read
//! from the right; empty in a world of two), so data frames may travel both directions of both
//! streams. Every frame moves the moment the plan lets it: a frame goes out once the
//! frames it forwards are in, and comes in once what it overwrites is out, so a rank forwards a
//! block while the next one arrives, with no lock-step between them. Control frames (aborts
//! and waiting notices) travel both directions too, and both directions are watched for the
//! whole of every call, so a failure travels around the ring both ways in moments.
//!
//! Invariants:
//! - A call writes and reads at the same time, on both ways; it never blocks on a write before
//!   it reads, so buffers of any size cannot deadlock however small the socket buffers are. A
//!   plan's gates never wait on each other in a circle (a frame out waits for earlier frames
//!   in, a frame in for earlier frames out), so some frame can always move.
//! - Readiness is a hint: every read and write runs until it would block, and `EINTR` retries.
//! - Both streams are read whatever the call waits for, per direction: the frames of the way
//!   that comes in on it, when the plan lets them (notices before them noted, an abort before
//!   them fails the call); otherwise the control frames up to the next data frame, which waits
//!   for its turn (an abort of this call fails the call). The right stream's end (or an abort
//!   of a later call) while this rank has nothing left to send it is kept and returned by the
//!   next call, since a right neighbour that has taken everything may end its job before this
//!   rank has read its last frame.
//! - Frames on a stream are read in order and every one is looked at: a waiting notice or a data
//!   frame never hides an abort behind it (a data frame is read whole before what follows it).
//!   A data frame of the next call waits for that call, and what follows it with it. A notice
//!   of another call than the current one is ignored.
//! - A data frame's header and payload go out in one vectored write when the socket takes them.
//! - The timeout bounds inactivity per peer: a call fails when the peer it still waits on has
//!   moved no byte and sent no waiting notice for that long. A waiting rank sends notices to both
//!   neighbours ([`notice_every`]), naming the rank it blames (its own stalled neighbour, or the
//!   rank that neighbour's fresh notice names), so only a neighbour of a stalled rank times out,
//!   and every error names the stalled rank. A data frame starts only once all of it may go,
//!   so a frame stalled half-way is the reader's doing, never a wait further round the ring.
//! - An outgoing frame, data or control, is written whole or the stream is shut: a notice or an
//!   abort only ever follows a complete frame on its stream, so a receiver never mistakes it for
//!   payload.
//! - A rank waits by spinning (yielding the core on every turn) for at most [`SPIN`] after its
//!   last progress, then blocks in poll(2): short waits skip a wake-up, long ones cost no CPU.
//!   A frame that came in and lets a frame of at most [`FORWARD_AT_ONCE`] bytes go is
//!   forwarded before the core is yielded.
//!
//! This is the only module that waits on the ring.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;
use tracing::warn;

use crate::frame::{Abort, HEADER_LEN, MAX_ABORT_LEN, Waiting};
use crate::liveness::Liveness;
use crate::ring::seam::{Call, FramePlan, Link, Route};
use crate::stats::RingStats;
use crate::wait::wait;

mod control;
mod reader;
mod way;

use control::{Heard, Queued, notice_every};
#[cfg(feature = "fuzzing")]
pub(crate) mod replay;

use reader::ReadAhead;
use way::{Counted, Way};

/// How long a failing rank keeps writing to finish the frame it was in the middle of, so that it
/// can append an abort frame. Past this it just shuts the stream.
const FINISH_FRAME_BOUND: Duration = Duration::from_millis(250);

/// How long a call keeps trying, yielding the core between tries, after its last progress
/// before it blocks in poll(2): a short wait is cheaper spun than woken from (measured in
/// docs/performance.md); past it the rank sleeps, so a slow peer costs no CPU. Yielding (never a
/// bare spin) lets ranks that share a core with this one run.
const SPIN: Duration = Duration::from_micros(200);

/// The largest payload a rank forwards before it yields its core once the frame that lets it go
/// is in. A small frame's hop is latency: yielding first hands the core to ranks that have
/// nothing to do while the neighbour waits. A large one is not forwarded at once: on a shared
/// core, a rank that keeps it through large writes holds up the ranks that fold and forward
/// behind it (docs/performance.md).
const FORWARD_AT_ONCE: usize = 64 * 1024;

/// Bytes of a stream one read takes ahead: a header and a small payload arrive in one call.
const READ_AHEAD: usize = HEADER_LEN + 16 * 1024;

/// A collective that has waited this long without progress logs a warning, then again each
/// time its wait doubles.
const WARN_AFTER: Duration = Duration::from_secs(10);

/// Which neighbour an event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// When a call last saw data move to or from each neighbour.
#[derive(Debug, Clone, Copy)]
struct Active {
    left: Instant,
    right: Instant,
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
    /// False while a data frame to the left (right) is partly written.
    left_boundary: bool,
    right_boundary: bool,
    /// The right stream has ended or failed while nothing needed it.
    right_ended: bool,
    /// A failure heard when nothing in the call needed it: the next call returns it.
    pending: Option<CollectiveError>,
    /// Notices queued for the left and the right, written between data frames.
    to_left: Queued,
    to_right: Queued,
    /// The last notice each neighbour sent.
    heard_left: Option<Heard>,
    heard_right: Option<Heard>,
    /// TCP_USER_TIMEOUT of the right stream, raised while the right neighbour is alive but
    /// not reading.
    liveness: Liveness,
    /// How long a call spins before it blocks ([`SPIN`]).
    spin: Duration,
    /// What was read from each stream beyond the last frame.
    ahead_left: ReadAhead,
    ahead_right: ReadAhead,
    stats: RingStats,
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
            left_rank: Route::RIGHTWARD.receives_from(rank, world),
            right_rank: Route::RIGHTWARD.sends_to(rank, world),
            addresses: place.addresses,
            timeout,
            left_boundary: true,
            right_boundary: true,
            right_ended: false,
            pending: None,
            to_left: Queued::default(),
            to_right: Queued::default(),
            heard_left: None,
            heard_right: None,
            liveness: Liveness::new(),
            spin: SPIN,
            ahead_left: ReadAhead::new(READ_AHEAD),
            ahead_right: ReadAhead::new(READ_AHEAD),
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

    fn stream(&self, side: Side) -> &TcpStream {
        match side {
            Side::Left => &self.left,
            Side::Right => &self.right,
        }
    }

    /// Writes what the stream on `side` takes: queued notices first, then the frames of `way`
    /// (only the one partly written unless `more`; `other` is the other way), header and payload
    /// in one vectored write.
    /// Returns whether a byte of a frame moved. `between` says whether the frame read from that
    /// stream is at a boundary (see [`TcpRing::gone`]).
    fn write_some(
        &mut self,
        side: Side,
        plan: &dyn FramePlan,
        (way, other): (&mut Way, &Way),
        between: bool,
        more: bool,
    ) -> Result<bool, CollectiveError> {
        let (stream, queued) = match side {
            Side::Left => (&self.left, &mut self.to_left),
            Side::Right => (&self.right, &mut self.to_right),
        };
        match queued.flush(stream) {
            Ok(n) => self.stats.bytes_sent += n as u64,
            Err(e) if !way.out_done() => return Err(self.gone(side, &e, between)),
            // Only a notice was left to send: the neighbour needs nothing more in this call.
            // A failed right is reported by the next call; a failed left shows on reading it.
            Err(e) => {
                queued.drop_rest();
                if side == Side::Right {
                    let error = self.gone(side, &e, between);
                    self.pending.get_or_insert(error);
                }
                return Ok(false);
            }
        }
        if !queued.is_empty() {
            return Ok(false);
        }
        way.write_to(plan, other, stream, &mut self.stats.bytes_sent, more)
            .map_err(|e| self.gone(side, &e, between))
    }

    /// Reads the frames of `way` that may come in from `side` (`other` is the other way);
    /// returns whether data moved. A notice of this call read on the way is noted.
    fn read_way(
        &mut self,
        side: Side,
        plan: &mut dyn FramePlan,
        (way, other): (&mut Way, &Way),
    ) -> Result<bool, CollectiveError> {
        let (stream, ahead, peer) = match side {
            Side::Left => (&self.left, &mut self.ahead_left, self.left_rank),
            Side::Right => (&self.right, &mut self.ahead_right, self.right_rank),
        };
        let mut src = Counted { stream, bytes: &mut self.stats.bytes_received };
        let mut heard = None;
        let moved = way.read_from(plan, other, &mut src, ahead, (peer, self.world), &mut heard)?;
        if let Some(notice) = heard {
            let heard = Some(Heard { notice, at: Instant::now() });
            match side {
                Side::Left => self.heard_left = heard,
                Side::Right => self.heard_right = heard,
            }
        }
        Ok(moved)
    }

    /// Writes what both streams take (see [`TcpRing::write_some`]) and notes the time in
    /// `active` for a side where a frame's byte moved.
    fn write_both(
        &mut self,
        plan: &dyn FramePlan,
        right: &mut Way,
        left: &mut Way,
        active: &mut Active,
    ) -> Result<(), (Side, CollectiveError)> {
        let between = left.incoming.at_boundary();
        let wrote = self.write_some(Side::Right, plan, (right, left), between, true);
        if wrote.map_err(|e| (Side::Right, e))? {
            active.right = Instant::now();
            self.liveness.restore(&self.right);
        }
        let between = right.incoming.at_boundary();
        let wrote = self.write_some(Side::Left, plan, (left, right), between, true);
        if wrote.map_err(|e| (Side::Left, e))? {
            active.left = Instant::now();
        }
        Ok(())
    }

    fn drive(
        &mut self,
        plan: &mut dyn FramePlan,
        right: &mut Way,
        left: &mut Way,
    ) -> Result<(), (Side, CollectiveError)> {
        let Call { op, seq, .. } = plan.call();
        let started = Instant::now();
        // Data progress per side; a notice also shows a neighbour alive (for the timeout).
        let mut active = Active { left: started, right: started };
        // Whether to read control frames from a side while no frame of this call may come in
        // from it: until a data frame shows up there, which waits for its turn.
        let (mut watch_left, mut watch_right) = (true, true);
        let mut next_notice: Option<Instant> = None;
        let mut warn_at = WARN_AFTER;
        let every = notice_every(self.timeout);
        loop {
            self.write_both(plan, right, left, &mut active)?;
            let came_before = right.received() + left.received();
            if right.wants_read(plan, left) {
                if self.read_way(Side::Left, plan, (right, left)).map_err(|e| (Side::Left, e))? {
                    active.left = Instant::now();
                    watch_left = true;
                }
            } else if watch_left {
                watch_left = self.read_left_controls(seq).map_err(|e| (Side::Left, e))?;
            }
            if left.wants_read(plan, right) {
                if self.read_way(Side::Right, plan, (left, right)).map_err(|e| (Side::Right, e))? {
                    active.right = Instant::now();
                    watch_right = true;
                }
            } else if watch_right {
                watch_right =
                    self.read_reverse(seq, !right.out_done()).map_err(|e| (Side::Right, e))?;
            }
            // A small frame that a frame just in lets go (either way) goes out before the core is
            // yielded; the streams were just read, so the loop does not read them again first.
            let came_in = right.received() + left.received() > came_before;
            if came_in
                && (right.next_out_at_most(plan, left, FORWARD_AT_ONCE)
                    || left.next_out_at_most(plan, right, FORWARD_AT_ONCE))
            {
                self.write_both(plan, right, left, &mut active)?;
            }
            let need_left = !right.in_done() || !left.out_done();
            let need_right = !right.out_done() || !left.in_done();
            if !need_left && !need_right {
                return Ok(());
            }
            let last_progress = active.left.max(active.right);
            if last_progress.elapsed() < self.spin {
                // Spin before blocking: a blocked wake-up costs more than a short message takes
                // to arrive. Yield the core on every turn so that ranks sharing it still run.
                let t = Instant::now();
                std::thread::yield_now();
                self.count_wait(t.elapsed(), need_left, need_right);
                continue;
            }

            // Each side this call still needs, with its last sign of life.
            let heard_at = |h: Option<Heard>, moved: Instant| h.map_or(moved, |h| h.at.max(moved));
            let left_alive = heard_at(self.heard_left, active.left);
            let right_alive = heard_at(self.heard_right, active.right);
            let waits = [
                need_left.then_some((Side::Left, active.left, left_alive)),
                need_right.then_some((Side::Right, active.right, right_alive)),
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
                waits.iter().flatten().min_by_key(|w| w.1).copied().expect("the call waits");
            let blamed = self.blame(side, since);
            let stalled = now.saturating_duration_since(last_progress);
            let notice_due = |next: Option<Instant>| {
                let first = last_progress + every;
                next.map_or(first, |t| t.max(first))
            };
            if now >= notice_due(next_notice) {
                let notice = Waiting { on: blamed, waited: stalled };
                self.send_notice(notice, seq, left.at_boundary(), right.at_boundary());
                next_notice = Some(now + every);
            }
            if stalled >= warn_at {
                warn!(
                    "{} #{seq} has waited {} s on rank {blamed} ({})",
                    op.name(),
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
            if right.wants_write(plan, left) || !self.to_right.is_empty() {
                right_events |= PollFlags::OUT;
            }
            if !self.right_ended && (left.wants_read(plan, right) || watch_right) {
                right_events |= PollFlags::IN;
            }
            let mut left_events = PollFlags::empty();
            if right.wants_read(plan, left) || watch_left {
                left_events |= PollFlags::IN;
            }
            if left.wants_write(plan, right) || !self.to_left.is_empty() {
                left_events |= PollFlags::OUT;
            }
            let mut fds =
                [PollFd::new(&self.right, right_events), PollFd::new(&self.left, left_events)];
            let t = Instant::now();
            wait(&mut fds, deadline)
                .map_err(|e| (Side::Left, CollectiveError::io(self.left_rank, &e)))?;
            self.count_wait(t.elapsed(), need_left, need_right);
            self.liveness.check(&self.right, last_progress, self.timeout);
        }
    }

    /// Adds a wait to the time spent waiting on each side the call still needed.
    fn count_wait(&mut self, waited: Duration, need_left: bool, need_right: bool) {
        if need_left {
            self.stats.waited_left += waited;
        }
        if need_right {
            self.stats.waited_right += waited;
        }
    }

    /// After a failure on the other side, keeps writing the frame partly written to `side` for
    /// a short while, so that the neighbour there gets a whole frame and then the abort.
    fn finish_frame(&mut self, side: Side, plan: &dyn FramePlan, (way, other): (&mut Way, &Way)) {
        let deadline = Instant::now() + FINISH_FRAME_BOUND.min(self.timeout);
        while !way.at_boundary() && Instant::now() < deadline {
            if self.write_some(side, plan, (&mut *way, other), false, false).is_err() {
                break;
            }
            let mut fds = [PollFd::new(self.stream(side), PollFlags::OUT)];
            if way.at_boundary() || wait(&mut fds, Some(deadline)).is_err() {
                break;
            }
        }
    }

    /// Tells both neighbours why this rank gives up, best effort, then shuts both streams for
    /// writing. Reads stay open until the ring is dropped, so a neighbour's last bytes are not
    /// answered with a reset that could destroy its own abort frame in flight.
    pub(crate) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let len = Abort::for_error(rank, error).encode(seq, &mut frame);
        let frame = &frame[..len];
        // A notice partly written goes out whole first, so the abort starts on a frame boundary.
        let targets = [
            (self.left_boundary, &self.left, &self.to_left),
            (self.right_boundary, &self.right, &self.to_right),
        ];
        for (at_boundary, mut stream, queued) in targets {
            if at_boundary {
                // Non-blocking: an abort is small; if it does not fit, the shutdown below still
                // ends the stream.
                let _ = stream.write(&[queued.rest(), frame].concat());
            }
        }
        let _ = self.left.shutdown(Shutdown::Write);
        let _ = self.right.shutdown(Shutdown::Write);
    }
}

impl Link for TcpRing {
    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        if let Some(error) = self.pending.take() {
            return Err(error);
        }
        // This link carries two ways, one each way round the ring.
        let way_of = |route| plan.ways().iter().position(|r| *r == route);
        let (Some(r), Some(l), 2) =
            (way_of(Route::RIGHTWARD), way_of(Route::LEFTWARD), plan.ways().len())
        else {
            unreachable!("the two-stream link runs plans of one rightward and one leftward way")
        };
        let mut right = Way::new(r, plan);
        let mut left = Way::new(l, plan);
        let result = self.drive(plan, &mut right, &mut left);
        let (failed, error) = match result {
            Ok(()) => {
                (self.left_boundary, self.right_boundary) = (true, true);
                return Ok(());
            }
            Err(failure) => failure,
        };
        match failed {
            Side::Left => self.finish_frame(Side::Right, plan, (&mut right, &left)),
            Side::Right => self.finish_frame(Side::Left, plan, (&mut left, &right)),
        }
        (self.left_boundary, self.right_boundary) = (left.at_boundary(), right.at_boundary());
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use silvic_core::Op;

    use super::*;
    use crate::frame::{Dir, Header};
    use crate::ring::seam::{Progress, Sink};
    use std::io::Read;

    /// The ring's timeout in these tests: a frame that never comes (or an abort that a data
    /// frame hid) fails the call with a timeout after this, never a hang.
    const BOUND: Duration = Duration::from_secs(20);

    /// A sink into a vector: the bytes, and how many have come. Shared with reader.rs's tests.
    pub(super) struct VecSink(pub(super) Vec<u8>, pub(super) usize);

    impl Sink for VecSink {
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
        (TcpRing::new(left, right, Place { rank: 1, addresses }, timeout), rank0, rank2)
    }

    /// One hop of a two-way gather for rank 1 of 3: `payload` as block 1 both ways, block 0
    /// expected from the left and block 2 from the right.
    struct OneHop<'a> {
        header: Header,
        payload: &'a [u8],
        sinks: [VecSink; 2],
    }

    fn one_hop(header: Header, payload: &[u8]) -> OneHop<'_> {
        OneHop { header, payload, sinks: [VecSink(vec![0; 3], 0), VecSink(vec![0; 3], 0)] }
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
            let from = if way == 0 { 0 } else { 2 };
            self.header.carrying(DIRS[way], from)
        }
        fn ready(&self, _: usize, _: Progress<'_>) -> bool {
            true
        }
        fn may_receive(&self, _: usize, _: Progress<'_>) -> bool {
            true
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
