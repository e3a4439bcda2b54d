//! What wakes every channel of a rank's call at once: a [`Waker`], one per rank of a ring of
//! several channels, in the poll(2) set of every channel's drive loop.
//!
//! A channel that fails trips it with its error; every other channel of the call, spinning or
//! blocked in poll(2), sees it on its next turn (an eventfd that stays readable once written,
//! so one write wakes every poll set that holds it, however many and whenever they poll), ends
//! its part of the call with that same error, and the caller aborts every channel's streams as
//! one failure does. Anything else that must end a waiting call at once (a caller that cancels
//! it) trips the same waker.
//!
//! Invariants: the first trip's error is the one every channel returns; a trip is never undone
//! (a failed ring stays failed: its error sticks); tripping never blocks and never fails (an
//! eventfd that cannot be written is already readable). Not here: who trips it, and what is
//! aborted (`channels.rs`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use rustix::event::{EventfdFlags, eventfd};
use silvic_core::CollectiveError;

/// A one-shot alarm shared by a rank's channels (see the module doc).
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
    tripped: AtomicBool,
    cause: Mutex<Option<CollectiveError>>,
}

impl Waker {
    /// A waker not yet tripped: one eventfd.
    pub(crate) fn new() -> std::io::Result<Waker> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Waker { fd, tripped: AtomicBool::new(false), cause: Mutex::new(None) })
    }

    /// Trips the waker with `cause`, unless it was tripped already (the first cause stays), and
    /// wakes every poll set that holds it.
    pub(crate) fn trip(&self, cause: &CollectiveError) {
        let mut kept = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.is_none() {
            *kept = Some(cause.clone());
            self.tripped.store(true, Ordering::Release);
        }
        drop(kept);
        // Readable from now on. A counter already near its end is readable already, so a
        // failed write changes nothing.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// The error the waker was tripped with, if it was: one atomic load when it was not.
    pub(crate) fn tripped(&self) -> Option<CollectiveError> {
        if !self.tripped.load(Ordering::Acquire) {
            return None;
        }
        self.cause.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl AsFd for Waker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rustix::event::{PollFd, PollFlags};

    use super::*;

    /// A waker wakes a poll that waits on it from another thread, keeps the first cause, and
    /// stays readable for every later poll.
    #[test]
    fn a_trip_wakes_every_poll_at_once_and_keeps_the_first_cause() {
        let waker = std::sync::Arc::new(Waker::new().unwrap());
        assert_eq!(waker.tripped(), None);
        let first = CollectiveError::PeerClosed { peer: 2 };
        let tripping = std::thread::spawn({
            let (waker, first) = (waker.clone(), first.clone());
            move || {
                std::thread::sleep(Duration::from_millis(50));
                waker.trip(&first);
                waker.trip(&CollectiveError::PeerClosed { peer: 3 });
            }
        });
        let started = Instant::now();
        for _ in 0..2 {
            let mut fds = [PollFd::new(&*waker, PollFlags::IN)];
            crate::wait::wait(&mut fds, Some(started + Duration::from_secs(60))).unwrap();
            assert!(fds[0].revents().contains(PollFlags::IN));
        }
        assert!(started.elapsed() < Duration::from_secs(60), "woken by the trip, not the deadline");
        tripping.join().unwrap();
        assert_eq!(waker.tripped(), Some(first));
    }
}
