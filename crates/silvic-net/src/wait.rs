//! The one poll(2) wrapper, which waits on descriptors until a deadline, the one retry of a
//! non-blocking call ([`nonblocking`]), the one backoff of every retry loop ([`Backoff`]:
//! dialling a neighbour, joining the address exchange, resolving the rendezvous host, polling
//! the rendezvous folder), and when a start that has not ended says so ([`Reminder`]).
//!
//! A leaf: it uses nothing of this crate, so the ring link, the rendezvous and the exchange can
//! all wait through it without importing each other.

use std::io;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, Timespec, poll};

/// Makes one non-blocking call, again while a signal interrupts it: `Ok(None)` when it would
/// block, so the caller goes back to polling.
pub(crate) fn nonblocking<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<Option<T>> {
    loop {
        match call() {
            Ok(done) => return Ok(Some(done)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Polls `fds` until `deadline` (or forever with `None`), retrying `EINTR`.
pub(crate) fn wait(fds: &mut [PollFd<'_>], deadline: Option<Instant>) -> io::Result<()> {
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        Timespec { tv_sec: left.as_secs() as _, tv_nsec: left.subsec_nanos() as _ }
    });
    match poll(fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The gap before each retry: `first`, doubled per retry up to `max` (the caller sleeps it
/// through `cancel::sleep`, cut short at its deadline).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Dialling and joining: 20 ms, doubling to half a second.
    pub(crate) const CONNECT: (Duration, Duration) =
        (Duration::from_millis(20), Duration::from_millis(500));

    /// A backoff from `first` doubling to `max`.
    pub(crate) fn new((first, max): (Duration, Duration)) -> Backoff {
        Backoff { next: first, max: max.max(first) }
    }

    /// The gap before the next retry; doubles the one after it.
    pub(crate) fn next_gap(&mut self) -> Duration {
        let gap = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        gap
    }
}

/// When a wait that has not ended warns: once it has lasted [`Reminder::FIRST`], then each time
/// it has doubled (5 s, 10 s, 20 s, ...), so a stuck start is never silent and a long one is not
/// noisy. Pure: it is handed the moments, and reads no clock.
#[derive(Debug, Clone)]
pub(crate) struct Reminder {
    started: Instant,
    /// How long the wait will have lasted at the next warning.
    next: Duration,
}

impl Reminder {
    /// The first warning's wait.
    pub(crate) const FIRST: Duration = Duration::from_secs(5);

    /// The reminder of a wait that began at `started`.
    pub(crate) fn new(started: Instant) -> Reminder {
        Reminder { started, next: Reminder::FIRST }
    }

    /// Whether a warning is due at `now`: if so, how long the wait has lasted (and the next one
    /// falls at twice that).
    pub(crate) fn due(&mut self, now: Instant) -> Option<Duration> {
        let waited = now.saturating_duration_since(self.started);
        if waited < self.next {
            return None;
        }
        while self.next <= waited {
            self.next = self.next.saturating_mul(2);
        }
        Some(waited)
    }

    /// When the next warning falls due.
    pub(crate) fn next_at(&self) -> Instant {
        deadline_after(self.started, self.next)
    }
}

/// `timeout` after `now`; a timeout too long for an `Instant` (`Duration::MAX`, as `connect`
/// takes it) is a century, which no launch outlives.
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(timeout).or_else(|| now.checked_add(CENTURY)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_doubles_to_its_cap() {
        let mut b = Backoff::new((Duration::from_millis(20), Duration::from_millis(70)));
        let gaps: Vec<u64> = (0..4).map(|_| b.next_gap().as_millis() as u64).collect();
        assert_eq!(gaps, [20, 40, 70, 70]);
    }

    #[test]
    fn a_reminder_warns_at_five_seconds_then_each_time_the_wait_doubles() {
        let start = Instant::now();
        let mut reminder = Reminder::new(start);
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(reminder.next_at(), at(5));
        assert_eq!(reminder.due(at(4)), None);
        assert_eq!(reminder.due(at(5)), Some(Duration::from_secs(5)));
        assert_eq!(reminder.due(at(9)), None);
        assert_eq!(reminder.next_at(), at(10));
        assert_eq!(reminder.due(at(10)), Some(Duration::from_secs(10)));
        // A wait that was not looked at for long warns once, then at twice its length.
        assert_eq!(reminder.due(at(70)), Some(Duration::from_secs(70)));
        assert_eq!(reminder.next_at(), at(80));
        assert_eq!(reminder.due(at(79)), None);
    }
}
