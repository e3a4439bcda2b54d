//! The clock of a call, as a pure watch ([`Watch`]): when data last moved on each stream, and
//! what is due at a given moment (a timeout, a waiting notice, a warning) and when to look
//! again. It is handed `now` and never reads a clock, so the tests run it in virtual time.
//!
//! Invariants:
//! - A call times out on a stream it waits on only once that stream has moved no byte and
//!   brought no waiting notice for the whole timeout, counted from when the call began waiting
//!   on it (the first tick that named it, until a tick that does not): never earlier. A peer
//!   silent while the call had no need of it is not blamed for that silence.
//! - A notice goes out once the call has seen no progress for [`notice_every`] of the timeout,
//!   then at most every such interval, and names the rank to blame: the stream's peer, or the
//!   rank a notice heard from that peer since its data last moved names, never this rank.
//! - A warning is logged once the call has waited [`WARN_AFTER`], then each time the wait
//!   doubles.
//! - The deadline it gives is the earliest moment any of those falls due (none for a timeout
//!   too long for an `Instant`), so a link that sleeps until then misses nothing.

use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use super::control::{Heard, notice_every};
use crate::frame::Waiting;

/// A collective that has waited this long without progress logs a warning, then again each
/// time its wait doubles.
pub(super) const WARN_AFTER: Duration = Duration::from_secs(10);

/// What one stream shows the watch: the rank at its other end and the last notice it brought.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    pub(super) peer: usize,
    pub(super) heard: Option<Heard>,
}

/// What is due at a moment of a call that waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Due {
    /// A waiting notice to send to every neighbour now.
    pub(super) notice: Option<Waiting>,
    /// A warning to log now: the rank waited on, and for how long.
    pub(super) warning: Option<(usize, Duration)>,
    /// When something falls due next, at the latest.
    pub(super) deadline: Option<Instant>,
}

/// The clock of one call over `streams` streams (see the module doc). The link keeps one and
/// starts it afresh for each call ([`Watch::start`]), so a call allocates nothing for it.
#[derive(Debug, Default)]
pub(super) struct Watch {
    timeout: Duration,
    every: Duration,
    /// When data last moved on each stream (the call's start before any did).
    active: Vec<Instant>,
    /// Since when the call has waited on each stream, for those it waits on now.
    waiting_since: Vec<Option<Instant>>,
    next_notice: Option<Instant>,
    warn_at: Duration,
}

impl Watch {
    /// A call started at `now` over `streams` streams, timing out after `timeout`.
    #[cfg(test)]
    pub(super) fn new(now: Instant, streams: usize, timeout: Duration) -> Self {
        let mut watch = Watch::default();
        watch.start(now, streams, timeout);
        watch
    }

    /// Starts the clock of a call started at `now` over `streams` streams, timing out after
    /// `timeout`: nothing of the call before it stays.
    pub(super) fn start(&mut self, now: Instant, streams: usize, timeout: Duration) {
        (self.timeout, self.every) = (timeout, notice_every(timeout));
        self.active.clear();
        self.active.resize(streams, now);
        self.waiting_since.clear();
        self.waiting_since.resize(streams, None);
        (self.next_notice, self.warn_at) = (None, WARN_AFTER);
    }

    /// Data moved on stream `s` at `now`.
    pub(super) fn moved(&mut self, s: usize, now: Instant) {
        self.active[s] = self.active[s].max(now);
    }

    /// When data last moved on stream `s`.
    pub(super) fn active(&self, s: usize) -> Instant {
        self.active[s]
    }

    /// When data last moved on any stream.
    pub(super) fn last_progress(&self) -> Instant {
        self.active.iter().copied().max().expect("a ring has a stream")
    }

    /// Since when stream `s` has shown nothing while the call waited on it: the later of its
    /// last data and the start of the wait.
    fn quiet_since(&self, s: usize) -> Instant {
        self.waiting_since[s].map_or(self.active[s], |t| t.max(self.active[s]))
    }

    /// When stream `s` last showed its peer alive to a call waiting on it: data moved, a notice
    /// came, or the wait began.
    fn alive(&self, s: usize, seen: Seen) -> Instant {
        let quiet = self.quiet_since(s);
        seen.heard.map_or(quiet, |h| h.at.max(quiet))
    }

    /// What is due at `now` for a call that waits on the streams whose bits are set in `waited`
    /// (at least one), as `seen` shows each, on rank `rank`. A stream waited on and silent for
    /// the timeout fails the call: `Err` with that stream and the timeout naming its peer.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        waited: u64,
        rank: usize,
        seen: impl Fn(usize) -> Seen,
    ) -> Result<Due, (usize, CollectiveError)> {
        for (s, since) in self.waiting_since.iter_mut().enumerate() {
            *since = (waited & (1 << s) != 0).then(|| since.unwrap_or(now));
        }
        let waits = (0..self.active.len()).filter(|&s| waited & (1 << s) != 0);
        for s in waits.clone() {
            let seen = seen(s);
            if self.alive(s, seen).checked_add(self.timeout).is_some_and(|d| now >= d) {
                let waited = self.timeout;
                return Err((s, CollectiveError::Timeout { peer: seen.peer, waited }));
            }
        }
        // The stream waited on longest, and whom to blame for it.
        let longest = waits.clone().min_by_key(|&s| self.quiet_since(s)).expect("the call waits");
        let since = self.active[longest];
        let blamed = match seen(longest) {
            Seen { heard: Some(h), .. } if h.at >= since && h.notice.on != rank => h.notice.on,
            Seen { peer, .. } => peer,
        };
        let last_progress = self.last_progress();
        let stalled = now.saturating_duration_since(last_progress);
        let notice_due = |next: Option<Instant>| {
            let first = last_progress + self.every;
            next.map_or(first, |t| t.max(first))
        };
        let mut due = Due { notice: None, warning: None, deadline: None };
        if now >= notice_due(self.next_notice) {
            due.notice = Some(Waiting { on: blamed, waited: stalled });
            self.next_notice = Some(now + self.every);
        }
        if stalled >= self.warn_at {
            due.warning = Some((blamed, stalled));
            self.warn_at = self.warn_at.saturating_mul(2);
        }
        // A timeout too long for an Instant (Duration::MAX) has no deadline.
        due.deadline = waits
            .filter_map(|s| self.alive(s, seen(s)).checked_add(self.timeout))
            .chain([notice_due(self.next_notice)])
            .chain(last_progress.checked_add(self.warn_at))
            .min();
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn quiet(peer: usize) -> impl Fn(usize) -> Seen {
        move |_| Seen { peer, heard: None }
    }

    fn heard(peer: usize, on: usize, at: Instant) -> impl Fn(usize) -> Seen {
        move |_| Seen { peer, heard: Some(Heard { notice: Waiting { on, waited: SECOND }, at }) }
    }

    #[test]
    fn a_timeout_fires_at_the_timeout_after_the_last_byte_never_earlier() {
        let t0 = Instant::now();
        let timeout = 3 * SECOND;
        let mut watch = Watch::new(t0, 2, timeout);
        assert!(watch.tick(t0, 0b01, 1, quiet(0)).is_ok(), "the call waits on stream 0 from t0");
        let almost = t0 + timeout - Duration::from_nanos(1);
        assert!(watch.tick(almost, 0b01, 1, quiet(0)).is_ok());
        let fired = watch.tick(t0 + timeout, 0b01, 1, quiet(0)).unwrap_err();
        assert_eq!(fired, (0, CollectiveError::Timeout { peer: 0, waited: timeout }));
        // Data moving restarts it, per stream: stream 1 moved, stream 0 did not.
        let mut watch = Watch::new(t0, 2, timeout);
        assert!(watch.tick(t0, 0b11, 1, quiet(2)).is_ok());
        watch.moved(1, t0 + 2 * SECOND);
        assert!(watch.tick(t0 + 2 * SECOND, 0b11, 1, quiet(2)).is_ok());
        assert_eq!(watch.tick(t0 + 3 * SECOND, 0b11, 1, quiet(2)).unwrap_err().0, 0);
        // A stream the call no longer waits on never times out (stream 0, silent since t0).
        let mut watch = Watch::new(t0, 2, timeout);
        assert!(watch.tick(t0, 0b11, 1, quiet(2)).is_ok());
        assert!(watch.tick(t0 + 60 * SECOND, 0b10, 1, heard(2, 0, t0 + 59 * SECOND)).is_ok());
    }

    #[test]
    fn a_peer_is_not_blamed_for_its_silence_while_the_call_did_not_wait_on_it() {
        // Stream 1's peer sent nothing since t0, but the call waited on stream 0 (alive by its
        // notices) until 5 s, and on stream 1 only from then: it times out on stream 1 a whole
        // timeout later, never at once for the silence before.
        let t0 = Instant::now();
        let timeout = 3 * SECOND;
        let mut watch = Watch::new(t0, 2, timeout);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for ms in (0..5000).step_by(100) {
            assert!(watch.tick(at(ms), 0b01, 1, heard(0, 7, at(ms))).is_ok(), "at {ms} ms");
        }
        watch.moved(0, at(5000));
        assert!(watch.tick(at(5000), 0b10, 1, quiet(3)).is_ok());
        let due = watch.tick(at(7999), 0b10, 1, quiet(3)).unwrap();
        assert_eq!(due.deadline, Some(at(8000)), "the timeout counts from the wait's start");
        let fired = watch.tick(at(8000), 0b10, 1, quiet(3)).unwrap_err();
        assert_eq!(fired, (1, CollectiveError::Timeout { peer: 3, waited: timeout }));
        // A wait that lapses and begins again counts afresh: back on stream 0 at 8 s, then on
        // stream 1 again from 9 s.
        let mut watch = Watch::new(t0, 2, timeout);
        assert!(watch.tick(t0, 0b10, 1, quiet(3)).is_ok());
        assert!(watch.tick(at(2000), 0b01, 1, heard(0, 7, at(2000))).is_ok());
        assert!(watch.tick(at(4000), 0b11, 1, heard(0, 7, at(3900))).is_ok());
        assert_eq!(watch.tick(at(6900), 0b10, 1, quiet(3)).unwrap().deadline, Some(at(7000)));
    }

    #[test]
    fn a_notice_from_the_peer_keeps_it_alive_for_another_timeout() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, 1, 3 * SECOND);
        assert!(watch.tick(t0, 1, 1, quiet(0)).is_ok());
        let alive = heard(0, 3, t0 + 2 * SECOND);
        assert!(watch.tick(t0 + 4 * SECOND, 1, 1, &alive).is_ok());
        let (_, error) = watch.tick(t0 + 5 * SECOND, 1, 1, &alive).unwrap_err();
        assert_eq!(error.peer(), Some(0), "the timeout names the neighbour, not whom it blamed");
    }

    #[test]
    fn notices_start_after_a_quarter_of_the_timeout_then_repeat_and_blame_the_stalled_rank() {
        let t0 = Instant::now();
        let timeout = 2 * SECOND; // notices every 500 ms
        let mut watch = Watch::new(t0, 2, timeout);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let notices = |watch: &mut Watch, at: Instant, seen: &dyn Fn(usize) -> Seen| {
            watch.tick(at, 0b11, 1, seen).unwrap().notice
        };
        assert_eq!(notices(&mut watch, ms(499), &quiet(0)), None);
        let first = notices(&mut watch, ms(500), &quiet(0)).unwrap();
        assert_eq!(first, Waiting { on: 0, waited: Duration::from_millis(500) });
        assert_eq!(notices(&mut watch, ms(900), &quiet(0)), None);
        // A fresh notice from the neighbour names the rank it waits on: that rank is blamed.
        let second = notices(&mut watch, ms(1000), &heard(0, 5, ms(800))).unwrap();
        assert_eq!(second.on, 5);
        // Never this rank, though a neighbour may have heard of this rank's own wait.
        let third = notices(&mut watch, ms(1500), &heard(0, 1, ms(1400))).unwrap();
        assert_eq!(third.on, 0);
        // A notice older than the neighbour's last data is stale.
        watch.moved(0, ms(1600));
        watch.moved(1, ms(1600));
        assert_eq!(notices(&mut watch, ms(2099), &heard(0, 5, ms(1000))), None);
        assert_eq!(notices(&mut watch, ms(2100), &heard(0, 5, ms(1000))).unwrap().on, 0);
    }

    #[test]
    fn the_warning_comes_after_ten_seconds_then_as_the_wait_doubles() {
        let t0 = Instant::now();
        let mut watch = Watch::new(t0, 1, Duration::from_secs(3600));
        let warnings: Vec<u64> = (0..=100)
            .filter_map(|s| watch.tick(t0 + s * SECOND, 1, 1, quiet(0)).unwrap().warning)
            .map(|(on, waited)| {
                assert_eq!(on, 0);
                waited.as_secs()
            })
            .collect();
        assert_eq!(warnings, [10, 20, 40, 80]);
    }

    #[test]
    fn the_deadline_is_the_earliest_of_timeout_notice_and_warning() {
        let t0 = Instant::now();
        // Timeout 1 s: notices every 250 ms come first.
        let mut watch = Watch::new(t0, 1, SECOND);
        let due = watch.tick(t0, 1, 1, quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + Duration::from_millis(250)));
        // Just after a notice, with the timeout 100 ms away, the timeout comes first.
        let mut watch = Watch::new(t0, 1, SECOND);
        assert!(watch.tick(t0, 1, 1, quiet(0)).is_ok());
        let at = t0 + Duration::from_millis(900);
        assert!(watch.tick(at, 1, 1, quiet(0)).unwrap().notice.is_some());
        let due = watch.tick(at, 1, 1, quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + SECOND));
        // An endless timeout: the next notice (500 ms apart), then the warning, bound the sleep.
        let mut watch = Watch::new(t0, 1, Duration::MAX);
        let at = t0 + Duration::from_millis(9_800);
        assert!(watch.tick(at, 1, 1, quiet(0)).unwrap().notice.is_some());
        let due = watch.tick(at + Duration::from_millis(100), 1, 1, quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + WARN_AFTER));
    }
}
