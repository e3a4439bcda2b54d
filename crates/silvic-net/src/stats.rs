//! [`RingStats`] and [`RingWatch`]: what a ring has done, how long it waited, and which call it
//! is in now, for a trainer (or a watchdog in another thread) to name its straggler.
//!
//! Invariants: counters only grow; they count from connect and are never reset; nothing here
//! does I/O or reads a clock (the ring link adds to the stats as it moves bytes and waits, and
//! `TcpCollective` hands the watch the instants a call begins and ends). A [`RingWatch`] is read
//! from any thread at any moment, a collective running or not: its lock is held only to copy or
//! update a few words, never across I/O.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use silvic_core::Op;

/// What a `TcpCollective` has done since connect, from `TcpCollective::stats`.
///
/// The waits are the time a collective spent blocked or spinning while it still needed
/// a frame from its left neighbour or had bytes for it that it would not take (`waited_left`),
/// or the same of its right neighbour (`waited_right`; in the two-way gather frames travel both
/// ways); a moment that needs both counts in both. A rank whose
/// `waited_left` grows fastest waits on the ranks before it: the straggler is upstream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Collectives that returned `Ok`.
    pub collectives: u64,
    /// Bytes written to every stream (the two ring streams and any chords): frames, headers and
    /// control frames.
    pub bytes_sent: u64,
    /// Bytes read from every stream.
    pub bytes_received: u64,
    /// Time spent waiting on the left neighbour.
    pub waited_left: Duration,
    /// Time spent waiting on the right neighbour.
    pub waited_right: Duration,
}

/// What a `TcpCollective` has done on one of its streams since connect, from
/// `TcpCollective::peer_stats`: one per stream, the two ring streams and every chord stream, so a
/// wait is seen on the very peer it was spent on.
///
/// `waited` counts as [`RingStats`]'s waits do: time a collective spent blocked or spinning
/// while it still needed a frame from this peer or had bytes for it that it would not take.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStats {
    /// The rank at the other end.
    pub peer: usize,
    /// Where that rank sits from this one, round the ring: `-1` the left neighbour, `+1` the
    /// right one (in a world of two, both are rank 1), `± 2^k` (mod world) a chord.
    pub offset: isize,
    /// Bytes written to the stream: frames, headers and control frames.
    pub bytes_sent: u64,
    /// Bytes read from the stream.
    pub bytes_received: u64,
    /// Time spent waiting on this peer.
    pub waited: Duration,
    /// The channel the stream carries: 0 for the ring's own streams, `c` for channel `c`'s
    /// (see `ConnectOptions::channels`).
    pub channel: usize,
}

/// The collective a ring is in now, from [`Progress::current`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CurrentCall {
    /// Its index since connect: the `n` of the `n`-th collective, counted from 0 on every rank
    /// alike, so ranks in the same call show the same index.
    pub index: u64,
    /// Which collective it is.
    pub op: Op,
    /// When it began.
    pub since: Instant,
}

/// Where a ring stands, from [`RingWatch::progress`].
///
/// Across the ranks of one ring, a rank whose `entered` is lower than the others' while they
/// are in a call has not reached that call: they wait on it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Collectives begun since connect (the one running now included).
    pub entered: u64,
    /// Collectives that returned `Ok`.
    pub completed: u64,
    /// The collective running now, if one is.
    pub current: Option<CurrentCall>,
    /// When the last collective returned, `Ok` or not; `None` before the first returns.
    pub last_returned: Option<Instant>,
    /// Whether a collective has failed: the ring is closed and every later call fails alike.
    pub failed: bool,
}

/// A handle on a ring's [`Progress`], from `TcpCollective::watch`:
/// `Clone + Send + Sync`, read from another thread while the ring's own thread is blocked in
/// a collective (a hang detector's poll). It only reads; it outlives the ring harmlessly.
#[derive(Debug, Clone, Default)]
pub struct RingWatch {
    shared: Arc<Mutex<Progress>>,
}

impl RingWatch {
    /// Where the ring stands now.
    pub fn progress(&self) -> Progress {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        // Nothing panics while holding the lock (it guards plain copies), so a poisoned lock
        // still holds a whole value.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A collective begins at `now`.
    pub(crate) fn begin(&self, op: Op, now: Instant) {
        let mut progress = self.lock();
        progress.current = Some(CurrentCall { index: progress.entered, op, since: now });
        progress.entered += 1;
    }

    /// The collective begun last returns at `now`, `Ok` or not.
    pub(crate) fn end(&self, ok: bool, now: Instant) {
        let mut progress = self.lock();
        progress.current = None;
        progress.last_returned = Some(now);
        progress.completed += u64::from(ok);
        progress.failed |= !ok;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_shows_the_call_in_progress_and_what_returned() {
        let watch = RingWatch::default();
        let reader = watch.clone();
        let t0 = Instant::now();
        assert_eq!(reader.progress(), Progress::default());

        watch.begin(Op::AllgatherBytes, t0);
        let during = reader.progress();
        assert_eq!(
            during.current,
            Some(CurrentCall { index: 0, op: Op::AllgatherBytes, since: t0 })
        );
        assert_eq!((during.entered, during.completed, during.failed), (1, 0, false));

        let t1 = t0 + Duration::from_millis(5);
        watch.end(true, t1);
        watch.begin(Op::AllreduceSumF64, t1);
        assert_eq!(
            reader.progress().current.map(|c| (c.index, c.op)),
            Some((1, Op::AllreduceSumF64))
        );
        let t2 = t1 + Duration::from_millis(5);
        watch.end(false, t2);
        let after = reader.progress();
        assert_eq!(after.current, None);
        assert_eq!(after.last_returned, Some(t2));
        assert_eq!((after.entered, after.completed, after.failed), (2, 1, true));
    }
}
