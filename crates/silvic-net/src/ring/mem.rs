//! The tests' in-memory driver: a ring of ranks, each on its own thread making real calls
//! through a [`Link`], whose frames move one at a time in an order drawn from a seeded
//! generator. The same seed gives the same order, the same pieces and the same result on every
//! run, so a failure found once is found again.
//!
//! How it keeps to one order: a rank inside [`Link::run`] publishes which of its plan's gates
//! are open and waits. Only when every rank is waiting (or has left the ring) does the driver
//! draw one move among all that the gates and the frames in flight allow (a frame out, if its
//! stream holds fewer than the driver's capacity; a frame in, if one is in flight to it; or the
//! end of a stream whose sender has left and sent nothing more) and hand it to that rank's
//! thread, which makes it and waits again. A rank between calls is waited for, so what it does
//! there (its local fold) never races a move. If ranks wait and no move is possible, the gates
//! wait in a circle: every waiting rank's call fails at once, never a hang.
//!
//! Frames are the bytes a TCP link would send, header encoded; payloads are handed to the plan
//! in pieces of random size, to exercise partial commits. A stream holds its frames across
//! calls, as a socket does.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use silvic_core::{CollectiveError, Op};

use super::choice::Path;
use super::seam::{Call, Forced, FramePlan, Link, Moved, Network, Receiving, Route, Sink};
use crate::frame::{HEADER_LEN, Header};

/// The most ways a plan may have in this driver (gates are kept as bit masks).
const MAX_WAYS: usize = 64;

/// A small deterministic generator (xorshift64).
#[derive(Debug, Clone)]
pub(crate) struct Dice(pub(crate) u64);

impl Dice {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// How a ring is driven: its size, the seed of its order, how many frames a stream holds, the
/// largest piece a payload is handed over in, whether sends go before receives, and the path
/// every allreduce is forced onto.
#[derive(Debug, Clone)]
pub(crate) struct Driver {
    world: usize,
    seed: u64,
    capacity: usize,
    piece: usize,
    sends_first: bool,
    forced: Option<Path>,
}

impl Driver {
    /// A ring of `world` whose streams hold one frame, pieces of up to 4 KiB, any order.
    pub(crate) fn new(world: usize) -> Self {
        let seed = 0x9e37_79b9_7f4a_7c15;
        Driver { world, seed, capacity: 1, piece: 4099, sends_first: false, forced: None }
    }
    pub(crate) fn seed(self, seed: u64) -> Self {
        Driver { seed: seed | 1, ..self }
    }
    /// Frames a stream holds in flight (a socket's buffers).
    pub(crate) fn capacity(self, capacity: usize) -> Self {
        Driver { capacity: capacity.max(1), ..self }
    }
    pub(crate) fn piece(self, piece: usize) -> Self {
        Driver { piece: piece.max(1), ..self }
    }
    /// Draws a receive only when no send may go: the order of a link that writes what it may
    /// before it reads, so a rank that fails on its first frame in has sent its own first.
    pub(crate) fn sends_first(self) -> Self {
        Driver { sends_first: true, ..self }
    }
    /// Forces every allreduce onto `path` where it carries the call, as `SILVIC_ALLREDUCE`
    /// does; the ring then has chord streams (this driver carries any route), so every path
    /// can be forced.
    pub(crate) fn forcing(self, path: Path) -> Self {
        Driver { forced: Some(path), ..self }
    }
}

/// One rank of a driven ring.
pub(crate) struct MemLink {
    rank: usize,
    ring: Arc<Ring>,
    /// This call's progress, kept so that a call allocates nothing.
    progress_sent: Vec<usize>,
    progress_received: Vec<usize>,
    /// Frames sent per way so far, over every call.
    pub(crate) sent: Vec<usize>,
}

struct Ring {
    state: Mutex<RingState>,
    /// One per rank: woken when that rank is handed a move.
    turn: Vec<Condvar>,
}

impl Ring {
    /// The state; a rank's thread that panicked (a failed assertion) leaves it usable.
    fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Outside a call, or making a move: the driver waits for it.
    Busy,
    /// Inside a call, its gates published.
    Waiting,
    /// Its link is dropped.
    Gone,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Send(usize),
    Receive(usize),
    Closed(usize),
}

struct RankState {
    phase: Phase,
    /// Per way of the call it waits in: the offset of the way's route.
    offsets: Vec<isize>,
    /// Bit `w`: frame out on way `w` may go; frame in on way `w` may come.
    send: u64,
    receive: u64,
}

/// Frames in flight on one stream, with the buffers of frames already taken, kept for reuse.
#[derive(Default)]
struct InFlight {
    frames: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

struct RingState {
    world: usize,
    config: Driver,
    dice: Dice,
    ranks: Vec<RankState>,
    /// Streams by (sender, route offset), found by [`RingState::stream`].
    streams: Vec<((usize, isize), InFlight)>,
    granted: Option<(usize, Action)>,
    stuck: bool,
    /// A hash of every move and piece drawn so far.
    trace: u64,
}

impl RingState {
    fn mix(&mut self, value: usize) {
        self.trace = (self.trace.rotate_left(7) ^ value as u64).wrapping_mul(0x100_0000_01b3);
    }

    /// A piece size for a payload, drawn and traced.
    fn piece(&mut self) -> usize {
        let n = 1 + self.dice.below(self.config.piece);
        self.mix(n);
        n
    }

    fn stream(&mut self, sender: usize, offset: isize) -> &mut InFlight {
        let at = match self.streams.iter().position(|(k, _)| *k == (sender, offset)) {
            Some(at) => at,
            None => {
                self.streams.push(((sender, offset), InFlight::default()));
                self.streams.len() - 1
            }
        };
        &mut self.streams[at].1
    }

    fn in_flight(&self, sender: usize, offset: isize) -> usize {
        let found = self.streams.iter().find(|(k, _)| *k == (sender, offset));
        found.map_or(0, |(_, s)| s.frames.len())
    }

    /// The sender of way `w`'s frames to `rank`.
    fn source(&self, rank: usize, w: usize) -> (usize, isize) {
        let offset = self.ranks[rank].offsets[w];
        (Route { offset }.receives_from(rank, self.world), offset)
    }

    /// Every move possible now, in a fixed order; `visit` sees each.
    fn moves(&self, mut visit: impl FnMut(usize, Action)) {
        for (r, rank) in self.ranks.iter().enumerate().filter(|(_, s)| s.phase == Phase::Waiting) {
            for w in 0..rank.offsets.len() {
                if rank.send & (1 << w) != 0
                    && self.in_flight(r, rank.offsets[w]) < self.config.capacity
                {
                    visit(r, Action::Send(w));
                }
                if rank.receive & (1 << w) != 0 {
                    let (from, offset) = self.source(r, w);
                    if self.in_flight(from, offset) > 0 {
                        visit(r, Action::Receive(w));
                    } else if self.ranks[from].phase == Phase::Gone {
                        visit(r, Action::Closed(w));
                    }
                }
            }
        }
    }

    /// Hands out the next move once every rank waits or is gone.
    fn schedule(&mut self, ring: &Ring) {
        if self.granted.is_some() || self.stuck {
            return;
        }
        if self.ranks.iter().any(|r| r.phase == Phase::Busy) {
            return;
        }
        let sends_only = self.config.sends_first && {
            let mut any = false;
            self.moves(|_, m| any |= matches!(m, Action::Send(_)));
            any
        };
        let counts = |m: &Action| !sends_only || matches!(m, Action::Send(_));
        let mut n = 0;
        self.moves(|_, m| n += usize::from(counts(&m)));
        if n == 0 {
            if self.ranks.iter().any(|r| r.phase == Phase::Waiting) {
                self.stuck = true;
                ring.turn.iter().for_each(Condvar::notify_one);
            }
            return;
        }
        let mut pick = self.dice.below(n);
        let mut chosen = None;
        self.moves(|r, m| {
            if counts(&m) {
                if pick == 0 && chosen.is_none() {
                    chosen = Some((r, m));
                }
                pick = pick.wrapping_sub(1);
            }
        });
        self.granted = chosen;
        if let Some((r, m)) = chosen {
            let (kind, w) = match m {
                Action::Send(w) => (1, w),
                Action::Receive(w) => (2, w),
                Action::Closed(w) => (3, w),
            };
            self.mix((r * MAX_WAYS + w) * 4 + kind);
            ring.turn[r].notify_one();
        }
    }
}

/// A handle on a ring's trace (see [`MemLink::tracer`]).
pub(crate) struct Tracer(Arc<Ring>);

impl Tracer {
    pub(crate) fn trace(&self) -> u64 {
        self.0.lock().trace
    }
}

/// A driven ring of `driver`'s world: one link per rank.
pub(crate) fn mem_ring(driver: Driver) -> Vec<MemLink> {
    let world = driver.world;
    let ranks = (0..world)
        .map(|_| RankState { phase: Phase::Busy, offsets: Vec::new(), send: 0, receive: 0 })
        .collect();
    let state = RingState {
        world,
        dice: Dice(driver.seed),
        config: driver,
        ranks,
        streams: Vec::new(),
        granted: None,
        stuck: false,
        trace: 0,
    };
    let turn = (0..world).map(|_| Condvar::new()).collect();
    let ring = Arc::new(Ring { state: Mutex::new(state), turn });
    (0..world)
        .map(|rank| MemLink {
            rank,
            ring: ring.clone(),
            progress_sent: Vec::new(),
            progress_received: Vec::new(),
            sent: Vec::new(),
        })
        .collect()
}

impl MemLink {
    /// The ring's trace of every move and piece drawn, readable once the ring is done.
    pub(crate) fn tracer(&self) -> Tracer {
        Tracer(self.ring.clone())
    }

    /// Makes move `m` of `plan`; the lock is held, so no other rank moves meanwhile.
    fn make(
        &mut self,
        state: &mut RingState,
        plan: &mut dyn FramePlan,
        m: Action,
    ) -> Result<(), CollectiveError> {
        let me = self.rank;
        match m {
            Action::Send(w) => {
                let i = self.progress_sent[w];
                let offset = plan.ways()[w].offset;
                let stream = state.stream(me, offset);
                let mut frame = stream.spare.pop().unwrap_or_default();
                frame.clear();
                frame.extend_from_slice(&plan.header(w, i).encode());
                frame.extend_from_slice(plan.payload(w, i));
                stream.frames.push_back(frame);
                self.progress_sent[w] += 1;
                self.sent[w] += 1;
            }
            Action::Receive(w) => {
                let j = self.progress_received[w];
                let (from, offset) = state.source(me, w);
                let frame = state.stream(from, offset).frames.pop_front().expect("in flight");
                let head = Header::decode(frame[..HEADER_LEN].try_into().expect("a header"));
                let checked = head
                    .map_err(|e| CollectiveError::MalformedFrame {
                        peer: from,
                        reason: e.to_string(),
                    })
                    .and_then(|head| head.expect(&plan.expect(w, j), from));
                if let Err(error) = checked {
                    state.stream(from, offset).spare.push(frame);
                    return Err(error);
                }
                let mut sink = Receiving { plan: &mut *plan, way: w, frame: j };
                let mut rest = &frame[HEADER_LEN..];
                while !rest.is_empty() {
                    let space = sink.space();
                    let n = space.len().min(rest.len()).min(state.piece());
                    assert!(n > 0, "rank {me}: payload longer than its frame's space");
                    space[..n].copy_from_slice(&rest[..n]);
                    sink.commit(n);
                    rest = &rest[n..];
                }
                assert!(sink.space().is_empty(), "rank {me}: payload shorter than its frame");
                state.stream(from, offset).spare.push(frame);
                self.progress_received[w] += 1;
            }
            Action::Closed(w) => {
                return Err(CollectiveError::PeerClosed { peer: state.source(me, w).0 });
            }
        }
        Ok(())
    }
}

impl Link for MemLink {
    fn network(&self) -> Network {
        let chords = self.forced().path.is_some();
        Network { chords, ..Network::UNMEASURED }
    }

    fn forced(&self) -> Forced {
        Forced { path: self.ring.lock().config.forced, ..Forced::default() }
    }

    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        let ways = plan.ways().len();
        assert!(ways <= MAX_WAYS, "a plan of {ways} ways");
        for v in [&mut self.progress_sent, &mut self.progress_received] {
            v.clear();
            v.resize(ways, 0);
        }
        if self.sent.len() < ways {
            self.sent.resize(ways, 0);
        }
        let ring = self.ring.clone();
        let mut state = ring.lock();
        let me = self.rank;
        let result = loop {
            let progress = Moved { sent: &self.progress_sent, received: &self.progress_received };
            let (mut send, mut receive, mut done) = (0u64, 0u64, true);
            for w in 0..ways {
                let frames = plan.frames(w);
                if progress.sent[w] < frames && plan.ready(w, progress) {
                    send |= 1 << w;
                }
                if progress.received[w] < frames && plan.may_receive(w, progress) {
                    receive |= 1 << w;
                }
                done &= progress.sent[w] == frames && progress.received[w] == frames;
            }
            if done {
                break Ok(());
            }
            let rank = &mut state.ranks[me];
            rank.offsets.clear();
            rank.offsets.extend(plan.ways().iter().map(|r| r.offset));
            (rank.phase, rank.send, rank.receive) = (Phase::Waiting, send, receive);
            state.schedule(&ring);
            while !state.stuck && !matches!(state.granted, Some((r, _)) if r == me) {
                state = ring.turn[me].wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.ranks[me].phase = Phase::Busy;
            let Some((_, m)) = state.granted.take() else {
                // Gates that wait in a circle fail the call instead of hanging the test.
                let (peer, _) = state.source(me, 0);
                break Err(CollectiveError::Timeout { peer, waited: Duration::ZERO });
            };
            if let Err(error) = self.make(&mut state, plan, m) {
                break Err(error);
            }
        };
        state.ranks[me].phase = Phase::Busy;
        drop(state);
        result
    }
}

impl Drop for MemLink {
    fn drop(&mut self) {
        let ring = self.ring.clone();
        let mut state = ring.lock();
        state.ranks[self.rank].phase = Phase::Gone;
        state.schedule(&ring);
    }
}

/// Runs `f` on every rank of a ring driven by `driver`, one thread each.
pub(crate) fn on_ring<R: Send>(
    driver: Driver,
    f: impl Fn(usize, &mut MemLink) -> R + Sync,
) -> Vec<R> {
    let links = mem_ring(driver);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = links
            .into_iter()
            .enumerate()
            .map(|(r, mut link)| s.spawn(move || f(r, &mut link)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::circular::Circular;
    use crate::ring::oracle::input;

    #[test]
    fn gates_that_wait_in_a_circle_fail_every_rank_at_once() {
        let results = on_ring(Driver::new(2), |_, link| link.run(&mut Circular));
        for result in results {
            assert!(matches!(result, Err(CollectiveError::Timeout { .. })), "{result:?}");
        }
    }

    /// The trace of every move and piece drawn: the same seed gives the same one on every run,
    /// another seed another.
    #[test]
    fn a_seed_gives_the_same_order_on_every_run() {
        let trace = |seed| {
            let tracers = on_ring(Driver::new(5).seed(seed).capacity(3).piece(64), |r, link| {
                let mut buf = input(r, 5000);
                let call = Call { rank: r, world: 5, op: Op::AllreduceSumF64, seq: 0 };
                let scratch = &mut crate::ring::Scratch::default();
                crate::ring::allreduce(link, call, &mut buf, silvic_core::fold::sum_f64, scratch)
                    .unwrap();
                link.tracer()
            });
            // Every rank's link is dropped: the trace is whole.
            tracers[0].trace()
        };
        assert_eq!(trace(7), trace(7));
        assert_ne!(trace(7), trace(9));
    }
}
