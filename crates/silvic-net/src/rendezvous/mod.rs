//! Forming the ring: connect to every rank this rank dials ([`dial`]: the right neighbour, and
//! the chord peers ahead of it) and accept every rank it accepts ([`accept`]: the left
//! neighbour, and the chord peers behind it), all at the same time, in one poll loop. Who dials
//! whom is `topology.rs`'s to say; every stream runs its own handshake.
//!
//! Invariants:
//! - The loop ends with every stream handshaken, or with an error at the rendezvous deadline
//!   naming a rank still missing and what it was waited for (a rank this rank dials first, in
//!   the plan's order), or at once on a refusal the connecting side hears or makes (see
//!   `dial.rs`).
//! - A cancel armed on the thread (`cancel.rs`) ends the loop within about 100 ms.
//! - A rendezvous that has not ended warns at growing intervals ([`Reminder`]), naming every
//!   rank still missing, its address, what it was waited for and the last error seen from it.
//! - Strangers at the listener never delay or break the real ring (see `accept.rs`); once every
//!   rank this rank accepts has joined, the listener is no longer polled and every other
//!   handshake is dropped. A second proven stream from a rank already joined is dropped.
//! - The returned streams are non-blocking, and nothing has been read past the handshake.
//! - Nothing here allocates by what a peer sends: every message is
//!   [`crate::handshake::MESSAGE_LEN`] bytes.

pub(crate) mod accept;
mod conn;
mod dial;
mod evict;
mod plan;
mod tally;

use std::collections::HashSet;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use tracing::warn;

use self::accept::{ACCEPT_PAUSE, Accepted, Lobby};
use self::dial::{Dial, Dialer};
pub(crate) use self::plan::Plan;
use crate::error::ConnectError;
use crate::wait::{Reminder, wait as poll_wait};

/// Job tokens shorter than this draw a warning: a short token is guessable offline by anyone
/// who recorded one handshake.
const SHORT_TOKEN: usize = 16;

/// The streams of a formed rendezvous, each in the order of the plan's ranks, and of each
/// rank's channels in order.
#[derive(Debug)]
pub(crate) struct Formed {
    /// To the ranks of [`Plan::dials`].
    pub(crate) dialed: Vec<TcpStream>,
    /// From the ranks of [`Plan::accepts`].
    pub(crate) accepted: Vec<TcpStream>,
}

/// Each of `ranks` with each of `channels`, rank by rank: the streams a plan forms one way.
fn ends(ranks: &[usize], channels: &std::ops::Range<u16>) -> Vec<(usize, u16)> {
    ranks.iter().flat_map(|&r| channels.clone().map(move |c| (r, c))).collect()
}

/// What polled ready in one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    Listener,
    Dial(usize),
    Incoming(u64),
}

/// Forms this rank's streams: non-blocking, handshakes done.
pub(crate) fn rendezvous(listener: &TcpListener, plan: &Plan<'_>) -> Result<Formed, ConnectError> {
    if plan.token.len() < SHORT_TOKEN {
        warn!(
            bytes = plan.token.len(),
            "the job token is shorter than {SHORT_TOKEN} bytes: anyone who records a handshake \
             can guess it offline; use a long random token"
        );
    }
    // A timeout too long for an Instant (Duration::MAX) has no deadline.
    let started = Instant::now();
    let deadline = started.checked_add(plan.timeout);
    let mut reminder = Reminder::new(started);
    let first_accepted = plan.accepts[0];
    listener.set_nonblocking(true).map_err(|e| {
        plan.io_error(first_accepted, &io::Error::new(e.kind(), format!("listener: {e}")))
    })?;
    let dial_ends = ends(plan.dials, &plan.channels);
    let accept_ends = ends(plan.accepts, &plan.channels);
    let mut dialers: Vec<Dialer<'_>> =
        dial_ends.iter().map(|&(p, c)| Dialer::new(plan, p, c)).collect();
    let mut dials: Vec<Dial<'_>> = dial_ends.iter().map(|_| Dial::start(Instant::now())).collect();
    let mut dial_ready = vec![false; dials.len()];
    let mut lobby = Lobby::new(plan);
    let mut accepted: Vec<Option<TcpStream>> = accept_ends.iter().map(|_| None).collect();
    // Set while accept fails with nothing to close for room (out of descriptors): the listener
    // stays readable, so it is left out of the poll set for a moment instead of spinning.
    let mut accept_paused_until: Option<Instant> = None;
    loop {
        for (i, dialer) in dialers.iter_mut().enumerate() {
            let state = std::mem::replace(&mut dials[i], Dial::start(Instant::now()));
            dials[i] = dialer.advance(state, dial_ready[i], Instant::now())?;
        }
        if let Some(formed) = formed(&mut dials, &mut accepted) {
            return Ok(formed);
        }
        let all_in = accepted.iter().all(Option::is_some);
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timeout_error(plan, &dials, &dialers, &lobby, (&accepted, &accept_ends)));
        }
        if crate::cancel::cancelled(Some(now)) {
            return Err(ConnectError::Cancelled);
        }
        lobby.expire(now);
        lobby.report(now);
        if let Some(waited) = reminder.due(now) {
            let missing = still_missing(plan, &dials, &dialers, &lobby, &accepted);
            warn!(
                "connect: rank {} has waited {} s to form its ring, on {missing}; check that \
                 those ranks are running, with the same address list and job token",
                plan.rank,
                waited.as_secs()
            );
        }
        accept_paused_until = accept_paused_until.filter(|until| now < *until);
        let listening = !all_in && accept_paused_until.is_none();

        let wake = [deadline, accept_paused_until, lobby.next_report(), Some(reminder.next_at())]
            .into_iter()
            .chain(dials.iter().map(Dial::wake_at))
            .chain(lobby.held().iter().map(|p| Some(p.deadline())))
            .flatten()
            .min();
        let wake = crate::cancel::wake_by(wake, now);
        let room = 1 + dials.len() + lobby.held().len();
        let mut slots = Vec::with_capacity(room);
        let mut fds = Vec::with_capacity(room);
        if listening {
            slots.push(Slot::Listener);
            fds.push(PollFd::new(listener, PollFlags::IN));
        }
        for (i, dial) in dials.iter().enumerate() {
            if let Some((fd, events)) = dial.poll_on() {
                slots.push(Slot::Dial(i));
                fds.push(PollFd::from_borrowed_fd(fd, events));
            }
        }
        for incoming in lobby.held() {
            let (stream, events) = incoming.poll_on();
            slots.push(Slot::Incoming(incoming.id()));
            fds.push(PollFd::new(stream, events));
        }
        poll_wait(&mut fds, wake).map_err(|e| plan.io_error(plan.dials[0], &e))?;
        let ready: HashSet<Slot> = slots
            .into_iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(slot, _)| slot)
            .collect();
        drop(fds);

        for (i, ready_now) in dial_ready.iter_mut().enumerate() {
            *ready_now = ready.contains(&Slot::Dial(i));
        }
        let joined = lobby.step_ready(|id| ready.contains(&Slot::Incoming(id)), |_| {});
        let some_joined = !joined.is_empty();
        for stream in joined {
            // The lobby admits only the ranks the plan accepts; were it ever to admit another,
            // that is an error of this rank's, never a panic.
            let end = (stream.rank, stream.channel);
            let Some(i) = accept_ends.iter().position(|&e| e == end) else {
                return Err(ConnectError::Handshake {
                    peer: stream.rank,
                    address: stream.remote.to_string(),
                    reason: format!(
                        "a connection proved rank {} on channel {}, which this rank does not \
                         accept (it accepts {:?} on channels {:?})",
                        stream.rank, stream.channel, plan.accepts, plan.channels
                    ),
                });
            };
            if accepted[i].is_some() {
                warn!(peer = stream.rank, remote = %stream.remote, "dropped a second stream");
                continue;
            }
            tracing::debug!(peer = stream.rank, "joined");
            accepted[i] = Some(stream.stream);
        }
        if accepted.iter().all(Option::is_some) {
            if some_joined {
                lobby = Lobby::new(plan); // every other handshake is dropped
            }
        } else if ready.contains(&Slot::Listener)
            && lobby.accept(listener).map_err(|e| plan.io_error(first_accepted, &e))?
                == Accepted::Starved
        {
            accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
        }
    }
}

/// The streams of the rendezvous, taken out of `dials` and `accepted`, once every dial has
/// joined and every accepted rank is in; `None` (and nothing taken) before.
fn formed(dials: &mut Vec<Dial<'_>>, accepted: &mut [Option<TcpStream>]) -> Option<Formed> {
    let done =
        accepted.iter().all(Option::is_some) && dials.iter().all(|d| matches!(d, Dial::Joined(_)));
    if !done {
        return None;
    }
    let dialed = std::mem::take(dials)
        .into_iter()
        .filter_map(|d| match d {
            Dial::Joined(stream) => Some(stream),
            _ => None,
        })
        .collect();
    Some(Formed { dialed, accepted: accepted.iter_mut().filter_map(Option::take).collect() })
}

/// Every rank the rendezvous still waits on, its address, what it was waited for and the last
/// error seen from it, and what strangers the listener refused: for a warning.
fn still_missing(
    plan: &Plan<'_>,
    dials: &[Dial<'_>],
    dialers: &[Dialer<'_>],
    lobby: &Lobby<'_>,
    accepted: &[Option<TcpStream>],
) -> String {
    let mut ranks = Vec::new();
    for (dial, dialer) in dials.iter().zip(dialers) {
        if !matches!(dial, Dial::Joined(_)) {
            let last = dialer.last_error.as_deref().unwrap_or("none");
            let address = plan.addresses[dialer.peer];
            ranks.push(format!(
                "rank {} at {address} (waited for it {}; last error: {last})",
                dialer.peer,
                dial.waiting_for()
            ));
        }
    }
    for (&peer, stream) in plan.accepts.iter().zip(accepted) {
        if stream.is_none() {
            let address = plan.addresses[peer];
            ranks.push(format!("rank {peer} at {address} (it has not connected to this rank)"));
        }
    }
    let mut text = ranks.join(", ");
    if lobby.refused > 0 {
        text += &format!(
            "; {} other connections were refused, the last: {}",
            lobby.refused, lobby.last_refusal
        );
    }
    text
}

fn timeout_error(
    plan: &Plan<'_>,
    dials: &[Dial<'_>],
    dialers: &[Dialer<'_>],
    lobby: &Lobby<'_>,
    (accepted, accept_ends): (&[Option<TcpStream>], &[(usize, u16)]),
) -> ConnectError {
    let dialing = dials.iter().zip(dialers).find(|(d, _)| !matches!(d, Dial::Joined(_)));
    let (peer, waiting_for) = if let Some((dial, dialer)) = dialing {
        let last = dialer.last_error.as_deref().unwrap_or("none");
        (dialer.peer, format!("{} (last error: {last})", dial.waiting_for()))
    } else {
        // A rendezvous times out with a stream missing; the first accepted rank stands in if
        // none is (a deadline that fell in the turn that formed the ring).
        let missing = accepted.iter().position(Option::is_none).unwrap_or(0);
        let mut what = "to connect to this rank".to_string();
        if lobby.refused > 0 {
            what += &format!(
                " ({} other connections were rejected, the last: {})",
                lobby.refused, lobby.last_refusal
            );
        }
        (accept_ends[missing].0, what)
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
    use std::net::SocketAddr;
    use std::time::Duration;

    /// Finding 9 of the second review: forming the result takes the streams only once every
    /// dial and accept is done, and cannot panic on a state the loop did not expect.
    #[test]
    fn the_streams_are_taken_only_once_every_dial_and_accept_is_done() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = || TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let mut dials = vec![Dial::Joined(stream()), Dial::start(Instant::now())];
        let mut accepted = vec![Some(stream()), None];
        assert!(formed(&mut dials, &mut accepted).is_none());
        assert_eq!((dials.len(), accepted.iter().flatten().count()), (2, 1), "nothing taken");
        dials[1] = Dial::Joined(stream());
        assert!(formed(&mut dials, &mut accepted).is_none(), "an accept still missing");
        accepted[1] = Some(stream());
        let done = formed(&mut dials, &mut accepted).expect("every stream in");
        assert_eq!((done.dialed.len(), done.accepted.len()), (2, 2));
    }

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
            dials: &[0],
            accepts: &[0],
            channels: 0..1,
        };
        let shown = format!("{plan:?} {:?} {:?}", Lobby::new(&plan), Dialer::new(&plan, 0, 0));
        assert!(!shown.contains("super-secret"), "{shown}");
        assert!(!shown.contains(&format!("{:?}", plan.token)), "{shown}");
    }
}
