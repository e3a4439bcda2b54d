//! Channels: one call on as many threads and streams as the ring agreed to give it.
//!
//! A ring of `C > 1` channels holds, beside channel 0's streams (the ring's own, `tcp.rs`),
//! one [`TcpRing`] per further channel, over its own stream to each ring neighbour, formed at
//! connect once the ranks have agreed on `C` (`probe.rs`); and a pool of `C - 1` named
//! threads, made at connect and parked between calls. A call the choice splits
//! (`ring::choice::channels`) cuts every segment of its buffer into one piece per channel
//! (`ring::layout`) and runs the ring path over each channel's pieces on that channel's
//! streams: channel 0 on the calling thread, channel `c` on pool thread `c - 1`, each thread
//! one channel for the whole call (two channels taken in turn by one thread could wait on each
//! other across ranks). The call returns when every channel is done.
//!
//! Invariants:
//! - **Bits.** Every element folds in its segment's fold order whatever `C` is, so a split
//!   call gives the bits one channel gives.
//! - **One failure, one error.** A channel that fails trips the rank's [`Waker`] with its
//!   error; every other channel, spinning or blocked in poll(2), ends at once with that error;
//!   the caller then aborts every channel's streams (`tcp.rs`), so the failure reaches every
//!   channel of every neighbour, and the error sticks.
//! - **Cancel.** Channel 0 runs on the calling thread, where a cancel is armed
//!   (`crate::cancel`): its waits see the cancel, and its failure ends every channel as any
//!   failure does; done before the others, it keeps looking at the cancel while it waits.
//! - **Liveness.** A channel whose part of a call is done while others still run keeps its
//!   streams' liveness watch (`crate::liveness`) until every channel is done: a paused
//!   neighbour never times out a stream whose last frames wait behind its closed window.
//! - **Threads.** No thread is made per call; none for `C = 1`. Dropping a [`Crew`] joins its
//!   threads: it waits for every pool thread's exit, a bounded wait (they are idle between
//!   calls), never a hang. A pool thread's link never spins before it blocks in poll(2)
//!   (`TcpRing::never_spin`): channel 0, on the calling thread, spins as a call of one channel
//!   does.
//!
//! No unsafe code: the pool's scoped jobs (rayon's `in_place_scope` and `spawn_broadcast`)
//! hand each thread its channel's `&mut` link and pieces, which outlive the scope.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use crate::link::{TcpRing, Waker};
use crate::ring::choice::{self, Choice, Shape};
use crate::ring::layout::{Segments, channel_pieces};
use crate::ring::ring_path::ring_allreduce_of;
use crate::ring::{self, Call, Element, Reducer, Scratch};
use crate::stats::{PeerStats, RingStats};

/// How often a channel done before the others checks its streams' liveness (each stream's own
/// checks are spaced by `crate::liveness`).
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long dropping a [`Crew`] waits for its threads to exit: they are parked, so they exit
/// at once; a bound all the same, so that a drop never hangs.
const JOIN_BOUND: Duration = Duration::from_secs(10);

/// The channels past the first of a rank's ring, and the threads that drive them.
#[derive(Debug)]
pub(crate) struct Crew {
    /// Channel `c`'s link at `c - 1`.
    rings: Vec<TcpRing>,
    /// Channel `c`'s fold scratch at `c - 1`.
    scratch: Vec<Scratch>,
    /// `C - 1` threads, pool thread `i` driving channel `i + 1`.
    pool: Option<rayon::ThreadPool>,
    /// How many pool threads have exited.
    exited: Arc<(Mutex<usize>, Condvar)>,
    /// What ends every channel's part of a call when one fails (in every ring, channel 0's too).
    waker: Arc<Waker>,
}

impl Crew {
    /// A crew of `rings` (channels 1 onwards) for `rank`, the waker every channel's ring (and
    /// channel 0's, which the caller hands it) wakes on; its threads named after the rank and
    /// the channel.
    pub(crate) fn new(
        rank: usize,
        mut rings: Vec<TcpRing>,
        waker: Arc<Waker>,
    ) -> std::io::Result<Crew> {
        for ring in &mut rings {
            ring.wake_on(waker.clone());
            ring.never_spin();
        }
        let exited = Arc::new((Mutex::new(0), Condvar::new()));
        let on_exit = exited.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rings.len())
            .thread_name(move |i| format!("silvic-{rank}-ch{}", i + 1))
            .exit_handler(move |_| {
                let (count, cond) = &*on_exit;
                *count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                cond.notify_all();
            })
            .build()
            .map_err(std::io::Error::other)?;
        let scratch = rings.iter().map(|_| Scratch::default()).collect();
        Ok(Crew { rings, scratch, pool: Some(pool), exited, waker })
    }

    /// How many channels a call may run on: the crew's and channel 0.
    pub(crate) fn channels(&self) -> usize {
        self.rings.len() + 1
    }

    /// One allreduce of `buf` split over `channels` channels (at most [`Crew::channels`]),
    /// channel 0 over `first` on the calling thread: every segment cut into one piece per
    /// channel, the ring path over each channel's pieces (see the module doc).
    pub(crate) fn allreduce<T: Element, C: Fn(T, T) -> T + Copy + Send + Sync>(
        &mut self,
        (first, first_scratch): (&mut TcpRing, &mut Scratch),
        call: Call,
        (buf, channels): (&mut [T], usize),
        combine: C,
    ) -> Result<(), CollectiveError> {
        debug_assert!((2..=self.channels()).contains(&channels));
        let total = size_of_val(buf) as u64;
        let waker = &*self.waker;
        let mut pieces = channel_pieces(buf, call.world, channels).into_iter();
        let first_pieces = pieces.next().expect("a first channel");
        // Each pool thread takes its channel's job from its own slot; threads past the call's
        // channels find theirs empty.
        let jobs: Vec<Mutex<Option<Job<'_, T>>>> = (self.rings.iter_mut())
            .zip(self.scratch.iter_mut())
            .map(|(ring, scratch)| pieces.next().map(|p| (ring, scratch, p)))
            .map(Mutex::new)
            .collect();
        // The channels still running: a channel done before the others keeps its streams'
        // liveness watch until they are all done (its last frames may wait in the kernel behind
        // a paused neighbour's closed window, which no other loop of this rank looks at).
        let running = (Mutex::new(channels), Condvar::new());
        let run = |ring: &mut TcpRing, scratch: &mut Scratch, pieces: Vec<&mut [T]>| {
            let segments = (Segments::Pieces(pieces), total);
            let result = ring_allreduce_of(ring, call, segments, combine, scratch);
            if let Err(error) = &result {
                waker.trip(error);
            }
            let (count, cond) = &running;
            let mut left = count.lock().unwrap_or_else(PoisonError::into_inner);
            *left -= 1;
            cond.notify_all();
            while *left > 0 {
                // Channel 0, done first, still looks at the cancel armed on the calling thread
                // (none is armed on a pool thread): it ends every channel through the waker.
                let now = Instant::now();
                let wake = crate::cancel::wake_by(Some(now + WATCH_EVERY), now);
                let wait = wake.map_or(WATCH_EVERY, |at| at.saturating_duration_since(now));
                left = cond.wait_timeout(left, wait).unwrap_or_else(PoisonError::into_inner).0;
                let now = Instant::now();
                if crate::cancel::cancelled(Some(now)) {
                    waker.trip(&CollectiveError::Cancelled);
                }
                if result.is_ok() {
                    ring.check_liveness(now);
                }
            }
        };
        let pool = self.pool.as_ref().expect("a crew has its pool until dropped");
        pool.in_place_scope(|scope| {
            scope.spawn_broadcast(|_, context| {
                let slot =
                    jobs[context.index()].lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some((ring, scratch, pieces)) = slot {
                    run(ring, scratch, pieces);
                }
            });
            run(first, first_scratch, first_pieces);
        });
        match waker.tripped() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Channel `c`'s link (`c >= 1`), for tests that break one of its streams.
    #[cfg(test)]
    pub(crate) fn link(&self, c: usize) -> &TcpRing {
        &self.rings[c - 1]
    }

    /// Tells every peer of every channel why this rank gives up, and shuts their streams (see
    /// [`TcpRing::abort`]); trips the waker, so no later call waits on a channel.
    pub(crate) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        self.waker.trip(error);
        for ring in &mut self.rings {
            ring.abort(rank, error, seq);
        }
    }

    /// Sets every channel's timeout (see [`TcpRing::set_timeout`]).
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        for ring in &mut self.rings {
            ring.set_timeout(timeout);
        }
    }

    /// What each channel past the first has counted.
    pub(crate) fn stats(&self) -> impl Iterator<Item = RingStats> + '_ {
        self.rings.iter().map(TcpRing::stats)
    }

    /// What each stream of each channel past the first has counted, channel by channel.
    pub(crate) fn peer_stats(&self) -> impl Iterator<Item = PeerStats> + '_ {
        self.rings.iter().enumerate().flat_map(|(c, ring)| {
            ring.peer_stats().into_iter().map(move |s| PeerStats { channel: c + 1, ..s })
        })
    }
}

/// One pool thread's part of a call: its channel's link, scratch and pieces.
type Job<'a, T> = (&'a mut TcpRing, &'a mut Scratch, Vec<&'a mut [T]>);

/// Joins the threads: the pool is told to end, and its threads' exits are waited for.
impl Drop for Crew {
    fn drop(&mut self) {
        let threads = self.rings.len();
        drop(self.pool.take());
        let (count, cond) = &*self.exited;
        let deadline = Instant::now() + JOIN_BOUND;
        let mut exited = count.lock().unwrap_or_else(PoisonError::into_inner);
        while *exited < threads {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(threads, exited = *exited, "channel threads did not exit in time");
                break;
            }
            exited = cond.wait_timeout(exited, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// A rank's ring for one allreduce: channel 0's link and scratch, and the crew of further
/// channels where the ring has one. It splits the calls the choice splits
/// (`ring::choice::channels`), and runs every other call on channel 0 alone.
pub(crate) struct OnChannels<'a> {
    pub(crate) ring: &'a mut TcpRing,
    pub(crate) crew: Option<&'a mut Crew>,
    pub(crate) scratch: &'a mut Scratch,
}

impl Reducer for OnChannels<'_> {
    fn reduce<T: Element, C: Fn(T, T) -> T + Copy + Send + Sync>(
        &mut self,
        call: Call,
        buf: &mut [T],
        combine: C,
    ) -> Result<(), CollectiveError> {
        let shape = Shape { bytes: size_of_val(buf), elem: size_of::<T>(), world: call.world };
        let (network, forced) = self.ring.agreed();
        let Choice { path, channels } = choice::choose(shape, network, forced);
        match self.crew.as_deref_mut() {
            Some(crew) if channels > 1 => {
                let channels = channels.min(crew.channels());
                crew.allreduce((self.ring, self.scratch), call, (buf, channels), combine)
            }
            _ => ring::allreduce_on(path, self.ring, call, buf, combine, self.scratch),
        }
    }
}
