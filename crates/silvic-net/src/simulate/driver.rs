//! The simulator's driver: a [`Link`] that moves a plan's frames between every rank of a world
//! in virtual time, through the network model of [`super::NetworkModel`], and moves no byte.
//!
//! It runs a plan the way the seam says a driver must (`crate::ring::seam`): per rank and way it
//! keeps the frames all out and all in, sends frame `sent[w]` once its gate opens and takes
//! frame `received[w]` once its gate opens and the frame has arrived. Everything is an event on
//! one clock of whole picoseconds, handled in the order (time, then the order it was made), so
//! the same plan and model give the same time on every run.
//!
//! The model, per frame of `b` payload bytes sent by rank `r` to rank `d`:
//!
//! - `r`'s core first copies the frame out (`b / copy rate`), then `r`'s link out carries one
//!   frame at a time, in the order their gates opened: the frame holds it for
//!   `overhead + b / rate`, starting when its copy is done or the frame before is out,
//!   whichever is later; it counts as sent (`sent[w]`) when it is all out.
//! - Its last byte reaches `d` a hop's latency later, or once `d`'s link in has carried it at
//!   the same rate after the frames that came in before it, whichever is later.
//! - `d` takes it once it is all in and `d`'s gate lets it in: `d`'s core copies it in
//!   (`b / copy rate`) and, if the plan folds it ([`FramePlan::folds`]), folds it
//!   (`b / fold rate`); it counts as received when that is done. Buffers (socket buffers,
//!   relays) hold whatever has arrived and is not yet taken.
//! - A rank is one thread: its copies and folds run one after another, in the order asked. With
//!   [`Model::cores`] they also need one of that many cores, shared by every rank (ranks of one
//!   host); each piece of work takes the core free first (the lowest-numbered of equals), and
//!   starts once both the rank and that core are free. Without it, every rank has its own core.
//! - With shared cores, the network's own copies of the frame ([`Model::network_copies`], a
//!   relay's) take the core free first once the frame starts out, `copies × b / copy rate`; they
//!   hold no rank's thread and no frame (a relay copies a frame's bytes while they travel), only
//!   the core, which then runs the ranks' work later.
//!
//! Every rank runs one plan, the calling rank's (see the module doc of [`super`] for why that
//! is every rank's plan relabelled); [`drive`] also takes one plan per rank, which the tests
//! use to check that assumption.
//!
//! [`Link`]: crate::ring::seam::Link

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::ring::seam::{FramePlan, Moved};

/// The model in the units the driver counts in: picoseconds, and picoseconds per byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Model {
    pub(crate) hop_ps: u64,
    pub(crate) overhead_ps: u64,
    /// Picoseconds a byte holds a rank's link, out or in.
    pub(crate) link_ps_per_byte: f64,
    /// Picoseconds folding a byte takes.
    pub(crate) fold_ps_per_byte: f64,
    /// Picoseconds a rank's core takes to copy a byte out to its link or in from it.
    pub(crate) copy_ps_per_byte: f64,
    /// The cores every rank's copies and folds share, or `None` for a core per rank.
    pub(crate) cores: Option<usize>,
    /// Copies of each byte the network itself makes on the shared cores (0 without them).
    pub(crate) network_copies: u32,
}

impl Model {
    fn carry(&self, bytes: u64) -> u64 {
        (bytes as f64 * self.link_ps_per_byte).round() as u64
    }
    pub(crate) fn fold(&self, bytes: u64) -> u64 {
        (bytes as f64 * self.fold_ps_per_byte).round() as u64
    }
    fn copy(&self, bytes: u64) -> u64 {
        (bytes as f64 * self.copy_ps_per_byte).round() as u64
    }
    fn network_copy(&self, bytes: u64) -> u64 {
        self.copy(bytes * u64::from(self.network_copies))
    }

    /// What every rank folding `bytes` of its own, all at once after a call, adds to the call:
    /// one rank's fold, or, on fewer shared cores than ranks, the world's folds spread over them.
    pub(crate) fn local_fold(&self, world: usize, bytes: u64) -> u64 {
        let one = self.fold(bytes);
        match self.cores {
            Some(cores) if cores < world => {
                (u128::from(one) * world as u128).div_ceil(cores as u128) as u64
            }
            _ => one,
        }
    }
}

/// What a driven plan did: when its last rank was done, and the frames all ranks sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) end_ps: u64,
    pub(crate) frames: u64,
}

/// The gates waited in a circle: events ran out with frames still to move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stuck {
    /// The first rank with frames left.
    pub(crate) rank: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    /// A rank's frame on a way is all out.
    Sent,
    /// A frame on a way is all in at a rank.
    Arrived,
    /// A rank has taken (and folded) a frame on a way.
    Received,
}

/// One event: at `time`, `what` happened to `rank`'s `way`; `order` breaks ties by creation.
/// Events are ordered by `(time, order)` alone, compared as one integer (`order` is unique, so
/// that is the whole order): a large world's run is mostly the heap's compares and moves, so
/// an event is kept small and its compare one instruction.
#[derive(Debug, Clone, Copy)]
struct Event {
    time: u64,
    order: u64,
    rank: u32,
    way: u32,
    what: What,
}

impl Event {
    fn key(&self) -> u128 {
        u128::from(self.time) << 64 | u128::from(self.order)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// Every rank's progress, flat: entry `rank * ways + way`.
struct World<'p> {
    plans: &'p [&'p dyn FramePlan],
    ways: usize,
    world: usize,
    model: Model,
    sent: Vec<usize>,
    received: Vec<usize>,
    arrived: Vec<usize>,
    sending: Vec<bool>,
    receiving: Vec<bool>,
    /// Per rank: when its link out and its link in are next free.
    out_free: Vec<u64>,
    in_free: Vec<u64>,
    /// Per rank: when its thread is next free to copy or fold.
    thread_free: Vec<u64>,
    /// Per shared core ([`Model::cores`]; empty for a core per rank): when it is next free.
    cores_free: Vec<u64>,
    events: BinaryHeap<Reverse<Event>>,
    order: u64,
    frames: u64,
}

impl<'p> World<'p> {
    fn plan(&self, rank: usize) -> &'p dyn FramePlan {
        self.plans.get(rank).copied().unwrap_or(self.plans[0])
    }

    fn push(&mut self, time: u64, what: What, rank: usize, way: usize) {
        self.order += 1;
        // A world is at most `super::MAX_WORLD` ranks, and a plan has a few ways a rank.
        let (rank, way) = (rank as u32, way as u32);
        self.events.push(Reverse(Event { time, order: self.order, rank, way, what }));
    }

    /// Runs `work` picoseconds of `rank`'s copying or folding, asked for at `now`, on its thread
    /// (and a shared core, if any): returns when it is done. No work takes no time, and waits on
    /// nothing.
    fn work(&mut self, rank: usize, now: u64, work: u64) -> u64 {
        if work == 0 {
            return now;
        }
        let mut start = now.max(self.thread_free[rank]);
        if let Some(c) = self.first_free_core() {
            start = start.max(self.cores_free[c]);
            self.cores_free[c] = start + work;
        }
        self.thread_free[rank] = start + work;
        start + work
    }

    /// The shared core free first (the lowest-numbered of equals), if cores are shared.
    fn first_free_core(&self) -> Option<usize> {
        (0..self.cores_free.len()).min_by_key(|&c| (self.cores_free[c], c))
    }

    /// Runs `work` picoseconds of the network's own copying, asked for at `now`, on the shared
    /// core free first (no rank's thread). Without shared cores there is none to run it on, and
    /// the model has no network copies.
    fn network_work(&mut self, now: u64, work: u64) {
        if let Some(c) = self.first_free_core().filter(|_| work > 0) {
            self.cores_free[c] = now.max(self.cores_free[c]) + work;
        }
    }

    /// Starts whatever `rank`'s gates let through at `now`.
    fn poll(&mut self, rank: usize, now: u64) {
        let at = rank * self.ways;
        let plan = self.plan(rank);
        for w in 0..self.ways {
            let frames = plan.frames(w);
            let progress = Moved {
                sent: &self.sent[at..at + self.ways],
                received: &self.received[at..at + self.ways],
            };
            let i = progress.sent[w];
            let send = !self.sending[at + w] && i < frames && plan.ready(w, progress);
            let j = progress.received[w];
            let take = !self.receiving[at + w]
                && j < frames
                && self.arrived[at + w] > j
                && plan.may_receive(w, progress);
            if send {
                let bytes = plan.header(w, i).len;
                let copied = self.work(rank, now, self.model.copy(bytes));
                let start = copied.max(self.out_free[rank]);
                let end = start + self.model.overhead_ps + self.model.carry(bytes);
                self.out_free[rank] = end;
                self.network_work(start, self.model.network_copy(bytes));
                self.sending[at + w] = true;
                self.push(end, What::Sent, rank, w);
            }
            if take {
                let bytes = plan.expect(w, j).len;
                let fold = if plan.folds(w, j) { self.model.fold(bytes) } else { 0 };
                let done = self.work(rank, now, self.model.copy(bytes) + fold);
                self.receiving[at + w] = true;
                self.push(done, What::Received, rank, w);
            }
        }
    }

    fn handle(&mut self, e: Event) {
        let (rank, way) = (e.rank as usize, e.way as usize);
        let at = rank * self.ways + way;
        match e.what {
            What::Sent => {
                let plan = self.plan(rank);
                let bytes = plan.header(way, self.sent[at]).len;
                let to = plan.ways()[way].sends_to(rank, self.world);
                self.sent[at] += 1;
                self.sending[at] = false;
                self.frames += 1;
                let arrives =
                    (e.time + self.model.hop_ps).max(self.in_free[to] + self.model.carry(bytes));
                self.in_free[to] = arrives;
                self.push(arrives, What::Arrived, to, way);
            }
            What::Arrived => self.arrived[at] += 1,
            What::Received => {
                self.received[at] += 1;
                self.receiving[at] = false;
            }
        }
        self.poll(rank, e.time);
    }

    /// The first rank with a frame left to send or receive.
    fn unfinished(&self) -> Option<usize> {
        (0..self.world).find(|&r| {
            let plan = self.plan(r);
            (0..self.ways).any(|w| {
                let at = r * self.ways + w;
                self.sent[at] < plan.frames(w) || self.received[at] < plan.frames(w)
            })
        })
    }
}

/// Runs a plan on every rank of a world of `world` from time 0: `plans` holds one plan for every
/// rank, or one per rank (in rank order). All plans must have the same ways.
pub(crate) fn drive(
    plans: &[&dyn FramePlan],
    world: usize,
    model: Model,
) -> Result<Outcome, Stuck> {
    let ways = plans[0].ways().len();
    debug_assert!(plans.iter().all(|p| p.ways().len() == ways));
    let cells = world * ways;
    let mut state = World {
        plans,
        ways,
        world,
        model,
        sent: vec![0; cells],
        received: vec![0; cells],
        arrived: vec![0; cells],
        sending: vec![false; cells],
        receiving: vec![false; cells],
        out_free: vec![0; world],
        in_free: vec![0; world],
        thread_free: vec![0; world],
        cores_free: vec![0; model.cores.unwrap_or(0)],
        events: BinaryHeap::new(),
        order: 0,
        frames: 0,
    };
    for rank in 0..world {
        state.poll(rank, 0);
    }
    let mut end = 0;
    while let Some(Reverse(e)) = state.events.pop() {
        end = e.time;
        state.handle(e);
    }
    match state.unfinished() {
        Some(rank) => Err(Stuck { rank }),
        None => Ok(Outcome { end_ps: end, frames: state.frames }),
    }
}
