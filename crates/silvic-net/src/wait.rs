//! The one poll(2) wrapper, which waits on descriptors until a deadline, and the one retry of a
//! non-blocking call ([`nonblocking`]).
//!
//! A leaf: it uses nothing of this crate, so the ring link, the rendezvous and the exchange can
//! all wait through it without importing each other.

use std::io;
use std::time::Instant;

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
