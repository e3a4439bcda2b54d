//! Cancelling a call that waits: a [`Cancel`] another thread trips, or that asks a check of its
//! own (Python's pending signals), seen by every wait of `connect`, `from_env` and every
//! collective that [`Cancel::during`] runs on the calling thread.
//!
//! Invariants:
//! - While a cancel is armed on a thread ([`Cancel::during`]), every wait there wakes at least
//!   every [`LOOK`] ([`wake_by`]) and looks at it ([`cancelled`]), and a call that keeps moving
//!   data looks as often, by its clock: a tripped cancel ends the call within about [`LOOK`].
//! - A check is run only on the armed thread, at most once per look; once it says so, the
//!   cancel stays tripped (a cancelled call never resumes).
//! - With no cancel armed, nothing here costs a wait anything: a thread-local read.
//!
//! Not here: what a cancelled call does (its error, the abort its ring sends: `tcp.rs`, the
//! link, the rendezvous and the exchange, each where it waits).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a call with a cancel armed looks at it, at the longest.
pub(crate) const LOOK: Duration = Duration::from_millis(100);

/// What trips a [`Cancel`] besides [`Cancel::cancel`]: asked on the waiting thread.
type Check = dyn Fn() -> bool + Send + Sync;

/// A handle that cancels the calls it watches: `connect`, `from_env` and collectives run
/// through [`Cancel::during`]. `Clone + Send + Sync`: hand a clone to another thread, which
/// calls [`Cancel::cancel`]; the call waiting on this thread then fails within about 100 ms.
///
/// A cancelled collective fails with [`CollectiveError::Cancelled`](crate::CollectiveError),
/// which sticks as any failure does, and the other ranks hear an abort naming this rank; a
/// cancelled `connect` or `from_env` fails with `ConnectError::Cancelled`.
///
/// ```
/// use silvic_net::{Cancel, Collective, CollectiveError, TcpCollective};
/// use std::time::Duration;
///
/// let (a, b) = (TcpCollective::bind("127.0.0.1")?, TcpCollective::bind("127.0.0.1")?);
/// let addresses = vec![a.address(), b.address()];
/// let token = "a long random job token, the same on every rank";
/// let peer = {
///     let addresses = addresses.clone();
///     std::thread::spawn(move || TcpCollective::connect(b, 1, &addresses, token, Duration::from_secs(30)))
/// };
/// let mut ring = TcpCollective::connect(a, 0, &addresses, token, Duration::from_secs(30))?;
/// let _rank1 = peer.join().unwrap()?; // connected, and never calls: rank 0 waits on it
/// let cancel = Cancel::new();
/// let tripper = cancel.clone();
/// std::thread::spawn(move || {
///     std::thread::sleep(Duration::from_millis(200));
///     tripper.cancel();
/// });
/// let waited = cancel.during(|| ring.allreduce_sum_f64(&mut [1.0]));
/// assert_eq!(waited, Err(CollectiveError::Cancelled));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Cancel {
    tripped: Arc<AtomicBool>,
    check: Option<Arc<Check>>,
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .field("checked", &self.check.is_some())
            .finish()
    }
}

thread_local! {
    /// The cancel armed on this thread, and when it was last looked at.
    static ARMED: RefCell<Option<(Cancel, Instant)>> = const { RefCell::new(None) };
}

impl Cancel {
    /// A cancel not yet tripped.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A cancel that also trips itself when `check` returns true. `check` runs on the thread of
    /// the call it watches, each time that call looks (about every 100 ms while it waits): the
    /// Python binding's check takes the GIL and asks whether a signal (Ctrl-C) is pending.
    pub fn checked(check: impl Fn() -> bool + Send + Sync + 'static) -> Cancel {
        Cancel { tripped: Arc::default(), check: Some(Arc::new(check)) }
    }

    /// Trips the cancel: the call it watches fails within about 100 ms, and every later call
    /// it watches fails at its first wait. Never blocks.
    pub fn cancel(&self) {
        self.tripped.store(true, Ordering::Release);
    }

    /// Whether the cancel is tripped (its check is not asked here).
    pub fn is_cancelled(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Runs `call` with this cancel watching every wait it makes on this thread (a `connect`,
    /// a `from_env`, collectives): once tripped, the call fails with the cancelled error of its
    /// kind. The cancel that was armed before (if any) is armed again afterwards.
    pub fn during<R>(&self, call: impl FnOnce() -> R) -> R {
        struct Restore(Option<(Cancel, Instant)>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let before = self.0.take();
                ARMED.with(|armed| *armed.borrow_mut() = before);
            }
        }
        let before = ARMED.with(|armed| armed.borrow_mut().replace((self.clone(), Instant::now())));
        let _restore = Restore(before);
        call()
    }

    /// Looks at the cancel: tripped, or its check says so now (and then it stays tripped).
    fn look(&self) -> bool {
        if self.is_cancelled() {
            return true;
        }
        if self.check.as_ref().is_some_and(|check| check()) {
            self.cancel();
            return true;
        }
        false
    }
}

/// Whether the cancel armed on this thread is tripped, looking at it (and asking its check) at
/// most once per [`LOOK`] unless `now` is `None` (look now, as a wait that just woke does).
/// False where none is armed.
pub(crate) fn cancelled(now: Option<Instant>) -> bool {
    let due = ARMED.with(|armed| {
        let mut armed = armed.borrow_mut();
        let (cancel, looked) = armed.as_mut()?;
        if let Some(now) = now {
            if now.saturating_duration_since(*looked) < LOOK {
                return Some(None);
            }
        }
        *looked = now.unwrap_or_else(Instant::now);
        Some(Some(cancel.clone()))
    });
    // The check runs with the thread-local released: it may itself run a call.
    match due {
        Some(Some(cancel)) => cancel.look(),
        _ => false,
    }
}

/// `deadline`, brought forward to [`LOOK`] from `now` where a cancel is armed on this thread, so
/// that a wait wakes to look at it.
pub(crate) fn wake_by(deadline: Option<Instant>, now: Instant) -> Option<Instant> {
    let armed = ARMED.with(|armed| armed.borrow().is_some());
    if !armed {
        return deadline;
    }
    let look = now + LOOK;
    Some(deadline.map_or(look, |d| d.min(look)))
}

/// Sleeps `gap` on this thread, in slices of [`LOOK`] where a cancel is armed, ending early
/// once it is tripped.
pub(crate) fn sleep(gap: Duration) {
    let until = Instant::now() + gap;
    loop {
        let now = Instant::now();
        let Some(end) = wake_by(Some(until), now) else { return };
        std::thread::sleep(end.saturating_duration_since(now));
        if Instant::now() >= until || cancelled(None) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn nothing_is_cancelled_where_no_cancel_is_armed() {
        assert!(!cancelled(None));
        let now = Instant::now();
        assert_eq!(wake_by(None, now), None);
        assert_eq!(
            wake_by(Some(now + Duration::from_secs(9)), now),
            Some(now + Duration::from_secs(9))
        );
    }

    #[test]
    fn an_armed_cancel_wakes_waits_and_trips_from_another_thread() {
        let cancel = Cancel::new();
        cancel.during(|| {
            let now = Instant::now();
            assert_eq!(wake_by(None, now), Some(now + LOOK));
            assert!(!cancelled(None));
            let tripper = cancel.clone();
            std::thread::spawn(move || tripper.cancel()).join().unwrap();
            assert!(cancelled(None));
        });
        assert!(!cancelled(None), "disarmed after the call");
    }

    #[test]
    fn a_check_is_asked_at_most_once_per_look_and_trips_for_good() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let cancel = Cancel::checked(move || counter.fetch_add(1, Ordering::Relaxed) >= 1);
        cancel.during(|| {
            let start = Instant::now();
            assert!(!cancelled(Some(start + LOOK)), "the first ask says no");
            assert!(!cancelled(Some(start + LOOK + LOOK / 2)), "not asked again so soon");
            assert_eq!(asked.load(Ordering::Relaxed), 1);
            assert!(cancelled(Some(start + 3 * LOOK)), "the second ask says yes");
        });
        assert!(cancel.is_cancelled());
    }

    #[test]
    fn a_sleep_ends_early_once_the_armed_cancel_trips() {
        let cancel = Cancel::new();
        let tripper = cancel.clone();
        let started = Instant::now();
        cancel.during(|| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                tripper.cancel();
            });
            sleep(Duration::from_secs(30));
        });
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
