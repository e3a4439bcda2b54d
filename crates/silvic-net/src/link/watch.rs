//! The clock of a call, as a pure watch ([`Watch`]): the ring's timeout (kept here alone), when
//! data last moved on each stream and the last waiting notice each brought ([`Heard`]), and
//! what is due at a given moment (a timeout, a waiting notice, a warning) and when to look
//! again, notices at their cadence ([`notice_every`]). It is handed `now` and never reads a
//! clock, so the tests run it in virtual time.
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
//! - Where the ring has a deadline ([`Watch::until`]: `connect`'s, while the ring measures
//!   itself), a call still waiting at it fails then, naming the peer it waited on longest,
//!   whatever its timeout says.
//! - The deadline it gives is the earliest moment any of those falls due (none for a timeout
//!   too long for an `Instant`), so a link that sleeps until then misses nothing.
//! - A call spins (tries again at once, never sleeping) only within [`SPIN`] of its last
//!   progress, and never on a ring made never to spin ([`Watch::never_spin`]).

use std::time::{Duration, Instant};

use silvic_core::CollectiveError;

use crate::frame::Waiting;

/// A collective that has waited this long without progress logs a warning, then again each
/// time its wait doubles.
pub(super) const WARN_AFTER: Duration = Duration::from_secs(10);

/// How long a call keeps trying, yielding the core between tries, after its last progress
/// before it blocks in poll(2): a short wait is cheaper spun than woken from (50 us measured
/// slower at world 4); past it the rank sleeps, so a slow peer costs no CPU. Yielding (never a
/// bare spin) lets ranks that share a core with this one run.
pub(super) const SPIN: Duration = Duration::from_micros(200);

/// The longest gap between two waiting notices.
const NOTICE_MAX: Duration = Duration::from_millis(500);

/// How long a call waits without progress before it sends a waiting notice, and then how often
/// it sends one: a quarter of the timeout, at most [`NOTICE_MAX`], so that a neighbour with the
/// same timeout hears several before its own timeout could fire.
pub(super) fn notice_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), NOTICE_MAX)
}

/// The last waiting notice from a stream's peer in this call, and when it came.
#[derive(Debug, Clone, Copy)]
struct Heard {
    notice: Waiting,
    at: Instant,
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

/// The clock of one call over a ring's streams (see the module doc). The link keeps one and
/// starts it afresh for each call ([`Watch::start`]), so a call allocates nothing for it once
/// it has seen as many streams.
#[derive(Debug)]
pub(super) struct Watch {
    /// How long a stream waited on may show nothing: the ring's timeout.
    timeout: Duration,
    every: Duration,
    /// The moment no call may wait past, if any.
    until: Option<Instant>,
    /// The rank at the other end of each stream.
    peers: Vec<usize>,
    /// When data last moved on each stream (the call's start before any did).
    active: Vec<Instant>,
    /// The last notice each stream brought in this call.
    heard: Vec<Option<Heard>>,
    /// Since when the call has waited on each stream, for those it waits on now.
    waiting_since: Vec<Option<Instant>>,
    next_notice: Option<Instant>,
    warn_at: Duration,
    /// How long a call spins after its last progress before it blocks: [`SPIN`], or none.
    spin: Duration,
}

impl Watch {
    /// The watch of a ring whose streams go to `peers` (by stream), timing out after `timeout`.
    pub(super) fn new(peers: Vec<usize>, timeout: Duration) -> Self {
        let streams = peers.len();
        Watch {
            timeout,
            every: notice_every(timeout),
            until: None,
            peers,
            active: Vec::with_capacity(streams),
            heard: Vec::with_capacity(streams),
            waiting_since: Vec::with_capacity(streams),
            next_notice: None,
            warn_at: WARN_AFTER,
            spin: SPIN,
        }
    }

    /// Makes every later call block as soon as it waits, never spinning first.
    pub(super) fn never_spin(&mut self) {
        self.spin = Duration::ZERO;
    }

    /// Whether a call that waits at `now` spins rather than blocks: within [`SPIN`] of its last
    /// progress, on a ring that spins.
    pub(super) fn spins(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_progress()) < self.spin
    }

    /// The ring's timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the ring's timeout, for later calls.
    pub(super) fn set_timeout(&mut self, timeout: Duration) {
        (self.timeout, self.every) = (timeout, notice_every(timeout));
    }

    /// Sets the moment no call may wait past (`None`: none), for later calls.
    pub(super) fn until(&mut self, deadline: Option<Instant>) {
        self.until = deadline;
    }

    /// Starts the clock of a call started at `now`: nothing of the call before it stays.
    pub(super) fn start(&mut self, now: Instant) {
        let streams = self.peers.len();
        self.active.clear();
        self.active.resize(streams, now);
        self.heard.clear();
        self.heard.resize(streams, None);
        self.waiting_since.clear();
        self.waiting_since.resize(streams, None);
        (self.next_notice, self.warn_at) = (None, WARN_AFTER);
    }

    /// Stream `s`'s peer sent a waiting notice of this call, read at `now`.
    pub(super) fn heard(&mut self, s: usize, notice: Waiting, now: Instant) {
        self.heard[s] = Some(Heard { notice, at: now });
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

    /// Whom rank `rank` blames for a wait on stream `s`: the rank a notice from its peer names,
    /// if one came since the stream's data last moved (and names another rank than this one),
    /// else the peer itself.
    fn blamed(&self, s: usize, rank: usize) -> usize {
        match self.heard[s] {
            Some(h) if h.at >= self.active[s] && h.notice.on != rank => h.notice.on,
            _ => self.peers[s],
        }
    }

    /// When stream `s` last showed its peer alive to a call waiting on it: data moved, a notice
    /// came, or the wait began.
    fn alive(&self, s: usize) -> Instant {
        let quiet = self.quiet_since(s);
        self.heard[s].map_or(quiet, |h| h.at.max(quiet))
    }

    /// What is due at `now` for a call that waits on the streams whose bits are set in `waited`
    /// (at least one), on rank `rank`. A stream waited on and silent for the timeout fails the
    /// call: `Err` with that stream and the timeout naming its peer.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        waited: u64,
        rank: usize,
    ) -> Result<Due, (usize, CollectiveError)> {
        for (s, since) in self.waiting_since.iter_mut().enumerate() {
            *since = (waited & (1 << s) != 0).then(|| since.unwrap_or(now));
        }
        let waits = (0..self.active.len()).filter(|&s| waited & (1 << s) != 0);
        for s in waits.clone() {
            if self.alive(s).checked_add(self.timeout).is_some_and(|d| now >= d) {
                let waited = self.timeout;
                return Err((s, CollectiveError::Timeout { peer: self.peers[s], waited }));
            }
        }
        // The stream waited on longest, and whom to blame for it.
        let longest = waits.clone().min_by_key(|&s| self.quiet_since(s)).expect("the call waits");
        let blamed = self.blamed(longest, rank);
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
            .filter_map(|s| self.alive(s).checked_add(self.timeout))
            .chain([notice_due(self.next_notice)])
            .chain(last_progress.checked_add(self.warn_at))
            .chain(self.until)
            .min();
        Ok(due)
    }

    /// A call that waits on the streams whose bits are set in `waited` fails at `now` if the
    /// ring's deadline ([`Watch::until`]) has passed: `Err` with the stream waited on longest
    /// and a timeout naming the rank to blame for it ([`Watch::blamed`], as a notice would name
    /// it: a rank that only waits on the stalled one is never named). A call whose data still
    /// moves is checked every turn (`super`'s loop), not only when it would sleep.
    pub(super) fn check_until(
        &self,
        now: Instant,
        waited: u64,
        rank: usize,
    ) -> Result<(), (usize, CollectiveError)> {
        if self.until.is_none_or(|deadline| now < deadline) {
            return Ok(());
        }
        let waits = (0..self.active.len()).filter(|&s| waited & (1 << s) != 0);
        let s = waits.min_by_key(|&s| self.quiet_since(s)).unwrap_or(0);
        let peer = self.blamed(s, rank);
        Err((s, CollectiveError::Timeout { peer, waited: self.timeout }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// What every stream shows the watch at a tick of these tests: its peer, and the last
    /// notice it brought, if any.
    struct Seen {
        peer: usize,
        heard: Option<Heard>,
    }

    fn quiet(peer: usize) -> Seen {
        Seen { peer, heard: None }
    }

    fn heard(peer: usize, on: usize, at: Instant) -> Seen {
        Seen { peer, heard: Some(Heard { notice: Waiting { on, waited: SECOND }, at }) }
    }

    /// A watch of `streams` streams, its call started at `now`.
    fn started(now: Instant, streams: usize, timeout: Duration) -> Watch {
        let mut watch = Watch::new(vec![0; streams], timeout);
        watch.start(now);
        watch
    }

    impl Watch {
        /// [`Watch::tick`] with every stream showing what `seen` says.
        fn tick_seen(
            &mut self,
            now: Instant,
            waited: u64,
            rank: usize,
            seen: &Seen,
        ) -> Result<Due, (usize, CollectiveError)> {
            self.peers.fill(seen.peer);
            self.heard.fill(seen.heard);
            self.tick(now, waited, rank)
        }
    }

    #[test]
    fn a_call_spins_only_within_spin_of_its_last_progress_and_never_where_told_not_to() {
        let t0 = Instant::now();
        let mut watch = started(t0, 2, SECOND);
        assert!(watch.spins(t0));
        assert!(watch.spins(t0 + SPIN - Duration::from_nanos(1)));
        assert!(!watch.spins(t0 + SPIN));
        // Progress on either stream starts the spin again.
        watch.moved(1, t0 + SECOND);
        assert!(watch.spins(t0 + SECOND + SPIN / 2));
        watch.never_spin();
        assert!(!watch.spins(t0 + SECOND));
        // It holds for the ring's later calls.
        watch.start(t0 + 2 * SECOND);
        assert!(!watch.spins(t0 + 2 * SECOND));
    }

    #[test]
    fn a_timeout_fires_at_the_timeout_after_the_last_byte_never_earlier() {
        let t0 = Instant::now();
        let timeout = 3 * SECOND;
        let mut watch = started(t0, 2, timeout);
        assert!(
            watch.tick_seen(t0, 0b01, 1, &quiet(0)).is_ok(),
            "the call waits on stream 0 from t0"
        );
        let almost = t0 + timeout - Duration::from_nanos(1);
        assert!(watch.tick_seen(almost, 0b01, 1, &quiet(0)).is_ok());
        let fired = watch.tick_seen(t0 + timeout, 0b01, 1, &quiet(0)).unwrap_err();
        assert_eq!(fired, (0, CollectiveError::Timeout { peer: 0, waited: timeout }));
        // Data moving restarts it, per stream: stream 1 moved, stream 0 did not.
        let mut watch = started(t0, 2, timeout);
        assert!(watch.tick_seen(t0, 0b11, 1, &quiet(2)).is_ok());
        watch.moved(1, t0 + 2 * SECOND);
        assert!(watch.tick_seen(t0 + 2 * SECOND, 0b11, 1, &quiet(2)).is_ok());
        assert_eq!(watch.tick_seen(t0 + 3 * SECOND, 0b11, 1, &quiet(2)).unwrap_err().0, 0);
        // A stream the call no longer waits on never times out (stream 0, silent since t0).
        let mut watch = started(t0, 2, timeout);
        assert!(watch.tick_seen(t0, 0b11, 1, &quiet(2)).is_ok());
        assert!(watch.tick_seen(t0 + 60 * SECOND, 0b10, 1, &heard(2, 0, t0 + 59 * SECOND)).is_ok());
    }

    #[test]
    fn a_peer_is_not_blamed_for_its_silence_while_the_call_did_not_wait_on_it() {
        // Stream 1's peer sent nothing since t0, but the call waited on stream 0 (alive by its
        // notices) until 5 s, and on stream 1 only from then: it times out on stream 1 a whole
        // timeout later, never at once for the silence before.
        let t0 = Instant::now();
        let timeout = 3 * SECOND;
        let mut watch = started(t0, 2, timeout);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for ms in (0..5000).step_by(100) {
            assert!(watch.tick_seen(at(ms), 0b01, 1, &heard(0, 7, at(ms))).is_ok(), "at {ms} ms");
        }
        watch.moved(0, at(5000));
        assert!(watch.tick_seen(at(5000), 0b10, 1, &quiet(3)).is_ok());
        let due = watch.tick_seen(at(7999), 0b10, 1, &quiet(3)).unwrap();
        assert_eq!(due.deadline, Some(at(8000)), "the timeout counts from the wait's start");
        let fired = watch.tick_seen(at(8000), 0b10, 1, &quiet(3)).unwrap_err();
        assert_eq!(fired, (1, CollectiveError::Timeout { peer: 3, waited: timeout }));
        // A wait that lapses and begins again counts afresh: back on stream 0 at 8 s, then on
        // stream 1 again from 9 s.
        let mut watch = started(t0, 2, timeout);
        assert!(watch.tick_seen(t0, 0b10, 1, &quiet(3)).is_ok());
        assert!(watch.tick_seen(at(2000), 0b01, 1, &heard(0, 7, at(2000))).is_ok());
        assert!(watch.tick_seen(at(4000), 0b11, 1, &heard(0, 7, at(3900))).is_ok());
        assert_eq!(watch.tick_seen(at(6900), 0b10, 1, &quiet(3)).unwrap().deadline, Some(at(7000)));
    }

    #[test]
    fn a_notice_from_the_peer_keeps_it_alive_for_another_timeout() {
        let t0 = Instant::now();
        let mut watch = started(t0, 1, 3 * SECOND);
        assert!(watch.tick_seen(t0, 1, 1, &quiet(0)).is_ok());
        let alive = heard(0, 3, t0 + 2 * SECOND);
        assert!(watch.tick_seen(t0 + 4 * SECOND, 1, 1, &alive).is_ok());
        let (_, error) = watch.tick_seen(t0 + 5 * SECOND, 1, 1, &alive).unwrap_err();
        assert_eq!(error.peer(), Some(0), "the timeout names the neighbour, not whom it blamed");
    }

    #[test]
    fn notices_start_after_a_quarter_of_the_timeout_then_repeat_and_blame_the_stalled_rank() {
        let t0 = Instant::now();
        let timeout = 2 * SECOND; // notices every 500 ms
        let mut watch = started(t0, 2, timeout);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let notices = |watch: &mut Watch, at: Instant, seen: &Seen| {
            watch.tick_seen(at, 0b11, 1, seen).unwrap().notice
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
        let mut watch = started(t0, 1, Duration::from_secs(3600));
        let warnings: Vec<u64> = (0..=100)
            .filter_map(|s| watch.tick_seen(t0 + s * SECOND, 1, 1, &quiet(0)).unwrap().warning)
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
        let mut watch = started(t0, 1, SECOND);
        let due = watch.tick_seen(t0, 1, 1, &quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + Duration::from_millis(250)));
        // Just after a notice, with the timeout 100 ms away, the timeout comes first.
        let mut watch = started(t0, 1, SECOND);
        assert!(watch.tick_seen(t0, 1, 1, &quiet(0)).is_ok());
        let at = t0 + Duration::from_millis(900);
        assert!(watch.tick_seen(at, 1, 1, &quiet(0)).unwrap().notice.is_some());
        let due = watch.tick_seen(at, 1, 1, &quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + SECOND));
        // An endless timeout: the next notice (500 ms apart), then the warning, bound the sleep.
        let mut watch = started(t0, 1, Duration::MAX);
        let at = t0 + Duration::from_millis(9_800);
        assert!(watch.tick_seen(at, 1, 1, &quiet(0)).unwrap().notice.is_some());
        let due = watch.tick_seen(at + Duration::from_millis(100), 1, 1, &quiet(0)).unwrap();
        assert_eq!(due.deadline, Some(t0 + WARN_AFTER));
    }
}
