//! Forming the ring: connect to the right neighbour ([`dial`]) and accept the left one
//! ([`accept`]), at the same time, in one poll loop.
//!
//! Invariants:
//! - The loop ends with both streams handshaken, or with an error at the rendezvous deadline
//!   naming the neighbour still missing and what it was waited for, or at once on a refusal
//!   the connecting side hears or makes (see `dial.rs`).
//! - Strangers at the listener never delay or break the real ring (see `accept.rs`); once the
//!   left neighbour has joined, the listener is no longer polled and every other handshake is
//!   dropped.
//! - The returned streams are non-blocking, and nothing has been read past the handshake.
//! - Nothing here allocates by what a peer sends: every message is
//!   [`crate::handshake::MESSAGE_LEN`] bytes.

pub(crate) mod accept;
mod conn;
mod dial;
mod evict;

use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use tracing::warn;

use self::accept::{ACCEPT_PAUSE, Accepted, Lobby};
use self::dial::{Dial, Dialer};
use crate::error::ConnectError;
use crate::wait::wait as poll_wait;

/// Job tokens shorter than this draw a warning: a short token is guessable offline by anyone
/// who recorded one handshake.
const SHORT_TOKEN: usize = 16;

/// What one rank needs to join the ring.
pub(crate) struct Plan<'a> {
    /// This rank.
    pub(crate) rank: usize,
    /// The number of ranks, `addresses.len()`.
    pub(crate) world: usize,
    /// Every rank's advertised address, in rank order, the same on every rank.
    pub(crate) addresses: &'a [SocketAddr],
    /// The job token: keys the MACs, never sent, never logged.
    pub(crate) token: &'a [u8],
    /// The whole rendezvous's bound.
    pub(crate) timeout: Duration,
    /// [`crate::handshake::roster_digest`] of `addresses`.
    pub(crate) roster: [u8; 32],
}

/// Leaves the token out: a Plan may end up in a debug line, the token never.
impl std::fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("addresses", &self.addresses)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Plan<'_> {
    fn left(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn right(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn io_error(&self, peer: usize, e: &io::Error) -> ConnectError {
        ConnectError::io(peer, self.addresses[peer].to_string(), e)
    }
}

/// What polled ready in one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    Listener,
    Dial,
    Incoming(u64),
}

/// Forms this rank's two ring streams, `(left, right)`: non-blocking, handshakes done.
pub(crate) fn rendezvous(
    listener: &TcpListener,
    plan: &Plan<'_>,
) -> Result<(TcpStream, TcpStream), ConnectError> {
    if plan.token.len() < SHORT_TOKEN {
        warn!(
            bytes = plan.token.len(),
            "the job token is shorter than {SHORT_TOKEN} bytes: anyone who records a handshake \
             can guess it offline; use a long random token"
        );
    }
    // A timeout too long for an Instant (Duration::MAX) has no deadline.
    let deadline = Instant::now().checked_add(plan.timeout);
    listener.set_nonblocking(true).map_err(|e| {
        plan.io_error(plan.left(), &io::Error::new(e.kind(), format!("listener: {e}")))
    })?;
    let mut dialer = Dialer::new(plan);
    let mut dial = Dial::start(Instant::now());
    let mut lobby = Lobby::new(plan);
    let mut left: Option<TcpStream> = None;
    let mut dial_ready = false;
    // Set while accept fails with nothing to close for room (out of descriptors): the listener
    // stays readable, so it is left out of the poll set for a moment instead of spinning.
    let mut accept_paused_until: Option<Instant> = None;
    loop {
        dial = dialer.advance(dial, dial_ready, Instant::now())?;
        dial = match (left, dial) {
            (Some(left), Dial::Joined(right)) => return Ok((left, right)),
            (l, d) => {
                left = l;
                d
            }
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timeout_error(plan, &dial, &dialer, &lobby, left.is_some()));
        }
        lobby.expire(now);
        accept_paused_until = accept_paused_until.filter(|until| now < *until);
        let listening = left.is_none() && accept_paused_until.is_none();

        let wake = [deadline, dial.wake_at(), accept_paused_until]
            .into_iter()
            .chain(lobby.held().iter().map(|p| Some(p.deadline())))
            .flatten()
            .min();
        let mut slots = Vec::with_capacity(2 + lobby.held().len());
        let mut fds = Vec::with_capacity(2 + lobby.held().len());
        if listening {
            slots.push(Slot::Listener);
            fds.push(PollFd::new(listener, PollFlags::IN));
        }
        if let Some((fd, events)) = dial.poll_on() {
            slots.push(Slot::Dial);
            fds.push(PollFd::from_borrowed_fd(fd, events));
        }
        for incoming in lobby.held() {
            let (stream, events) = incoming.poll_on();
            slots.push(Slot::Incoming(incoming.id()));
            fds.push(PollFd::new(stream, events));
        }
        poll_wait(&mut fds, wake).map_err(|e| plan.io_error(plan.right(), &e))?;
        let ready: HashSet<Slot> = slots
            .into_iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(slot, _)| slot)
            .collect();
        drop(fds);

        dial_ready = ready.contains(&Slot::Dial);
        let joined = lobby.step_ready(|id| ready.contains(&Slot::Incoming(id)), |_| {});
        if let Some(first) = joined.into_iter().next() {
            tracing::debug!(peer = plan.left(), "left neighbour joined");
            left = Some(first.stream);
            lobby = Lobby::new(plan); // every other handshake is dropped
        }
        if left.is_none()
            && ready.contains(&Slot::Listener)
            && lobby.accept(listener).map_err(|e| plan.io_error(plan.left(), &e))?
                == Accepted::Starved
        {
            accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
        }
    }
}

fn timeout_error(
    plan: &Plan<'_>,
    dial: &Dial<'_>,
    dialer: &Dialer<'_>,
    lobby: &Lobby<'_>,
    have_left: bool,
) -> ConnectError {
    let (peer, waiting_for) = if !matches!(dial, Dial::Joined(_)) {
        let last = dialer.last_error.as_deref().unwrap_or("none");
        (plan.right(), format!("{} (last error: {last})", dial.waiting_for()))
    } else {
        debug_assert!(!have_left);
        let mut what = "to connect to this rank".to_string();
        if lobby.refused > 0 {
            what += &format!(
                " ({} other connections were rejected, the last: {})",
                lobby.refused, lobby.last_refusal
            );
        }
        (plan.left(), what)
    };
    ConnectError::Timeout {
        peer,
        address: plan.addresses[peer].to_string(),
        waited: plan.timeout,
        waiting_for,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_never_shows_its_token() {
        let addresses: Vec<SocketAddr> = vec!["10.0.0.1:1".parse().unwrap()];
        let plan = Plan {
            rank: 0,
            world: 1,
            addresses: &addresses,
            token: b"super-secret-token-value",
            timeout: Duration::from_secs(1),
            roster: [0; 32],
        };
        let shown = format!("{plan:?} {:?} {:?}", Lobby::new(&plan), Dialer::new(&plan));
        assert!(!shown.contains("super-secret"), "{shown}");
        assert!(!shown.contains(&format!("{:?}", plan.token)), "{shown}");
    }
}
