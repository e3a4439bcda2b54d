//! The one poll(2) wrapper: waits on descriptors until a deadline.
//!
//! A leaf: it uses nothing of this crate, so the ring link and the rendezvous can both wait
//! through it without importing each other.

use std::io;
use std::time::Instant;

use rustix::event::{PollFd, Timespec, poll};

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
