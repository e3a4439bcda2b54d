//! The connecting side: reach one rank this rank dials (the right neighbour, or a chord peer)
//! and prove this rank to it; the rendezvous runs one [`Dialer`] per rank it dials.
//!
//! Invariants:
//! - Each state is consumed and the next returned ([`Dialer::advance`]); a state that cannot
//!   follow another cannot be written.
//! - Until this rank has sent its proof, a connection that fails, closes, or gets no answer
//!   within [`HANDSHAKE_DEADLINE`] is redialled with backoff (20 ms doubling to half a
//!   second): the neighbour may not be listening yet, or the address may be a black hole.
//! - Once the proof is out, the neighbour may already count the link as formed, so the answer
//!   is awaited until the rendezvous deadline: redialling then would strand both sides.
//! - A refusal, from either side, fails the call at once with the reason.
//! - Running out of descriptors is retried like a refused connection: strangers at this rank's
//!   listener may hold them for a moment.
//!
//! Not here: the clock (the caller passes `now`) and the waiting (the caller polls
//! [`Dial::poll_on`]).

use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use rustix::event::PollFlags;
use socket2::{Domain, Protocol, Socket, Type};
use tracing::debug;

use super::conn::{Conn, HANDSHAKE_DEADLINE};
use super::plan::Plan;
use crate::RejectReason;
use crate::error::ConnectError;
use crate::handshake::fresh_nonce;
use crate::handshake::{Claims, Connector, Failure, Message, Next, VERSION};
use crate::wait::Backoff;

/// Where the connecting side stands.
#[derive(Debug)]
// Moved by value a few times per loop turn; boxing would allocate on every step instead.
#[allow(clippy::large_enum_variant)]
pub(super) enum Dial<'t> {
    /// Resting before the next attempt.
    Waiting { until: Instant },
    /// A non-blocking connect in progress.
    Connecting { socket: Socket },
    /// Connected; the handshake runs. Before the proof is out, `deadline` bounds the wait for
    /// an answer.
    Talking { conn: Conn<TcpStream>, role: Connector<'t>, deadline: Instant },
    /// Proven both ways: the stream to the rank dialled.
    Joined(TcpStream),
}

impl Dial<'_> {
    /// The first state: dial at once.
    pub(super) fn start(now: Instant) -> Self {
        Dial::Waiting { until: now }
    }

    /// What to poll, and for what, if anything.
    pub(super) fn poll_on(&self) -> Option<(std::os::fd::BorrowedFd<'_>, PollFlags)> {
        use std::os::fd::AsFd;
        match self {
            Dial::Connecting { socket } => Some((socket.as_fd(), PollFlags::OUT)),
            Dial::Talking { conn, .. } => Some((conn.stream().as_fd(), conn.events())),
            Dial::Waiting { .. } | Dial::Joined(_) => None,
        }
    }

    /// When this state wants attention even if nothing is ready.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        match self {
            Dial::Waiting { until } => Some(*until),
            Dial::Talking { role, deadline, .. } if !role.proved() => Some(*deadline),
            _ => None,
        }
    }

    /// What the connecting side still waits for, for a timeout error.
    pub(super) fn waiting_for(&self) -> &'static str {
        match self {
            Dial::Talking { role, .. } if role.proved() => "to answer this rank's proof",
            _ => "to accept this rank's connection",
        }
    }
}

/// What the connecting side keeps across states.
#[derive(Debug)]
pub(super) struct Dialer<'p> {
    plan: &'p Plan<'p>,
    /// The rank dialled.
    pub(super) peer: usize,
    /// The channel of the stream.
    channel: u16,
    backoff: Backoff,
    /// The last reason an attempt failed, for the timeout error.
    pub(super) last_error: Option<String>,
}

impl<'p> Dialer<'p> {
    /// A dialer for rank `peer` of `plan`, for a stream of channel `channel`.
    pub(super) fn new(plan: &'p Plan<'p>, peer: usize, channel: u16) -> Self {
        let backoff = Backoff::new(Backoff::CONNECT);
        Dialer { plan, peer, channel, backoff, last_error: None }
    }

    fn address(&self) -> SocketAddr {
        self.plan.addresses[self.peer]
    }

    /// Moves `state` as far as it goes at `now` without waiting; `ready` says whether its
    /// descriptor polled ready.
    pub(super) fn advance(
        &mut self,
        mut state: Dial<'p>,
        mut ready: bool,
        now: Instant,
    ) -> Result<Dial<'p>, ConnectError> {
        loop {
            let (next, moved) = self.step(state, ready, now)?;
            if !moved {
                return Ok(next);
            }
            state = next;
            ready = false; // a new state has not been polled yet
        }
    }

    /// One transition; the flag says whether the state changed (and so may move again).
    fn step(
        &mut self,
        state: Dial<'p>,
        ready: bool,
        now: Instant,
    ) -> Result<(Dial<'p>, bool), ConnectError> {
        Ok(match state {
            Dial::Waiting { until } if now < until => (Dial::Waiting { until }, false),
            Dial::Waiting { .. } => (self.open(now)?, true),
            Dial::Connecting { socket } if !ready => (Dial::Connecting { socket }, false),
            Dial::Connecting { socket } => match socket.take_error() {
                Ok(Some(e)) | Err(e) => (self.retry(e.to_string(), now), true),
                // Not connected yet: a spurious wake-up.
                Ok(None) if socket.peer_addr().is_err() => (Dial::Connecting { socket }, false),
                Ok(None) => (self.hello(socket.into(), now)?, true),
            },
            Dial::Talking { conn, role, deadline } => self.talk(conn, role, deadline, now)?,
            Dial::Joined(stream) => (Dial::Joined(stream), false),
        })
    }

    fn open(&mut self, now: Instant) -> Result<Dial<'p>, ConnectError> {
        let address = self.address();
        let socket = Socket::new(Domain::for_address(address), Type::STREAM, Some(Protocol::TCP))
            .and_then(|s| s.set_nonblocking(true).map(|()| s));
        // Before it connects (`congestion`'s module doc says why).
        if let Ok(socket) = &socket {
            crate::congestion::configure(socket);
        }
        let socket = match socket {
            Ok(socket) => socket,
            // Out of descriptors: strangers at this rank's listener may hold them until the
            // accepting side drops some, so this is a reason to retry, not to give up.
            Err(e) if out_of_descriptors(&e) => return Ok(self.retry(e.to_string(), now)),
            Err(e) => return Err(self.plan.io_error(self.peer, &e)),
        };
        Ok(match socket.connect(&address.into()) {
            Ok(()) => Dial::Connecting { socket },
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INPROGRESS.raw_os_error()) => {
                Dial::Connecting { socket }
            }
            Err(e) => self.retry(e.to_string(), now),
        })
    }

    fn hello(&mut self, stream: TcpStream, now: Instant) -> Result<Dial<'p>, ConnectError> {
        let plan = self.plan;
        let (role, hello) = Connector::start_on(
            plan.token,
            plan.roster,
            (plan.world as u32, plan.rank as u32, self.peer as u32),
            self.channel,
            fresh_nonce().map_err(|e| plan.io_error(self.peer, &e))?,
        );
        let mut conn = Conn::new(stream);
        conn.queue(&hello);
        Ok(Dial::Talking { conn, role, deadline: now + HANDSHAKE_DEADLINE })
    }

    fn talk(
        &mut self,
        mut conn: Conn<TcpStream>,
        mut role: Connector<'p>,
        deadline: Instant,
        now: Instant,
    ) -> Result<(Dial<'p>, bool), ConnectError> {
        if let Err(e) = conn.flush() {
            return Ok((self.retry(format!("handshake write failed: {e}"), now), true));
        }
        if !conn.flushed() {
            return Ok((Dial::Talking { conn, role, deadline }, false));
        }
        let bytes = match conn.receive() {
            Ok(Some(bytes)) => bytes,
            Ok(None) if !role.proved() && now >= deadline => {
                return Ok((self.retry("no handshake answer".into(), now), true));
            }
            Ok(None) => return Ok((Dial::Talking { conn, role, deadline }, false)),
            Err(e) => {
                return Ok((self.retry(format!("handshake read failed: {e}"), now), true));
            }
        };
        let message = Message::decode(&bytes).map_err(|e| self.handshake_error(e.to_string()))?;
        match role.on_message(&message) {
            Next::Send(reply) => {
                conn.queue(&reply);
                Ok((Dial::Talking { conn, role, deadline }, true))
            }
            Next::Done | Next::SendAndDone(_) => Ok((Dial::Joined(conn.into_stream()), true)),
            Next::Fail(failure, reply) => {
                conn.send_last(reply);
                Err(match failure {
                    Failure::Refused(r) | Failure::RefusedBy(r) => {
                        self.rejected(r, role.peer_claims)
                    }
                    Failure::Protocol(what) => self.handshake_error(what.into()),
                })
            }
        }
    }

    fn retry(&mut self, error: String, now: Instant) -> Dial<'p> {
        debug!(peer = self.peer, %error, "retrying connect");
        self.last_error = Some(error);
        let until = now + self.backoff.next_gap();
        Dial::Waiting { until }
    }

    fn handshake_error(&self, reason: String) -> ConnectError {
        let peer = self.peer;
        ConnectError::Handshake { peer, address: self.address().to_string(), reason }
    }

    /// A refusal, with both sides' values where this side knows the other's: only from a
    /// Challenge, since a refusal says nothing about its sender.
    fn rejected(&self, reason: RejectReason, claims: Option<Claims>) -> ConnectError {
        let plan = self.plan;
        let detail = match (reason, claims) {
            (RejectReason::VersionMismatch, Some(c)) => {
                format!(": it speaks version {}, this rank {VERSION}", c.version)
            }
            (RejectReason::VersionMismatch, None) => {
                format!(": this rank speaks version {VERSION}")
            }
            (RejectReason::WorldMismatch, Some(c)) => {
                format!(": it has {} ranks, this rank has {}", c.world, plan.world)
            }
            (RejectReason::WorldMismatch, None) => format!(": this rank has {} ranks", plan.world),
            (RejectReason::WrongRank, Some(c)) => {
                format!(": it is rank {} and this rank is {} of {}", c.rank, plan.rank, plan.world)
            }
            (RejectReason::WrongRank, None) => {
                format!(": this rank is {} of {}", plan.rank, plan.world)
            }
            (RejectReason::AddressMismatch, _) => format!(
                ": the ranks were handed different address lists (this rank's has {} addresses)",
                plan.world
            ),
            _ => String::new(),
        };
        ConnectError::Rejected {
            peer: self.peer,
            address: self.address().to_string(),
            reason,
            detail,
        }
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::MFILE, Errno::NFILE].iter().any(|c| e.raw_os_error() == Some(c.raw_os_error()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;
    use crate::handshake::{Acceptor, MESSAGE_LEN, roster_digest};

    struct Fixture {
        addresses: Vec<SocketAddr>,
        neighbour: TcpListener,
    }

    fn fixture() -> Fixture {
        let neighbour = TcpListener::bind("127.0.0.1:0").unwrap();
        let me: SocketAddr = "127.0.0.1:9".parse().unwrap();
        Fixture { addresses: vec![me, neighbour.local_addr().unwrap()], neighbour }
    }

    fn plan(addresses: &[SocketAddr]) -> Plan<'_> {
        Plan {
            rank: 0,
            world: 2,
            addresses,
            token: b"a-job-token-of-some-length",
            timeout: Duration::from_secs(60),
            roster: roster_digest(addresses),
            dials: &[1],
            accepts: &[1],
            channels: 0..1,
        }
    }

    fn read(stream: &mut TcpStream) -> Message {
        let mut bytes = [0u8; MESSAGE_LEN];
        stream.read_exact(&mut bytes).unwrap();
        Message::decode(&bytes).unwrap()
    }

    /// Advances until the state is `Talking` with its Hello written (the listener has it).
    fn until_talking<'p>(dialer: &mut Dialer<'p>, mut state: Dial<'p>) -> Dial<'p> {
        let give_up = Instant::now() + Duration::from_secs(10);
        while Instant::now() < give_up {
            state = dialer.advance(state, true, Instant::now()).unwrap();
            if let Dial::Talking { conn, .. } = &state {
                if conn.flushed() {
                    return state;
                }
            }
            std::thread::yield_now();
        }
        panic!("no connection within 10 s: {state:?}");
    }

    #[test]
    fn after_its_proof_the_dialer_waits_past_the_stranger_deadline() {
        let f = fixture();
        let plan = plan(&f.addresses);
        let mut dialer = Dialer::new(&plan, 1, 0);
        let state = until_talking(&mut dialer, Dial::start(Instant::now()));
        let (mut theirs, _) = f.neighbour.accept().unwrap();
        let mut acceptor = Acceptor::new(plan.token, plan.roster, 2, 1, 0, [3; 16]);
        let Next::Send(challenge) = acceptor.on_message(&read(&mut theirs)) else { panic!() };
        theirs.write_all(&challenge.encode()).unwrap();
        // Read the proof off the wire, as a slow neighbour would before answering.
        let mut state = state;
        let proof = loop {
            state = dialer.advance(state, true, Instant::now()).unwrap();
            if matches!(&state, Dial::Talking { role, conn, .. } if role.proved() && conn.flushed())
            {
                break read(&mut theirs);
            }
        };
        assert_eq!(state.wake_at(), None, "no handshake deadline once the proof is out");
        let late = Instant::now() + HANDSHAKE_DEADLINE * 3;
        let state = dialer.advance(state, true, late).unwrap();
        assert!(matches!(state, Dial::Talking { .. }), "it gave up on a proven link: {state:?}");
        let Next::SendAndDone(welcome) = acceptor.on_message(&proof) else { panic!() };
        theirs.write_all(&welcome.encode()).unwrap();
        let mut state = state;
        let give_up = Instant::now() + Duration::from_secs(10);
        while !matches!(state, Dial::Joined(_)) {
            assert!(Instant::now() < give_up, "the late welcome was not taken");
            state = dialer.advance(state, true, late).unwrap();
        }
    }

    #[test]
    fn before_its_proof_a_silent_neighbour_is_redialled_after_the_deadline() {
        let f = fixture();
        let plan = plan(&f.addresses);
        let mut dialer = Dialer::new(&plan, 1, 0);
        let now = Instant::now();
        let state = until_talking(&mut dialer, Dial::start(now));
        let state = dialer.advance(state, false, Instant::now() + HANDSHAKE_DEADLINE).unwrap();
        assert!(matches!(state, Dial::Waiting { .. }), "{state:?}");
        assert_eq!(dialer.last_error.as_deref(), Some("no handshake answer"));
    }

    #[test]
    fn a_refusal_fails_at_once_and_does_not_claim_the_other_sides_values() {
        let f = fixture();
        let plan = plan(&f.addresses);
        let mut dialer = Dialer::new(&plan, 1, 0);
        let state = until_talking(&mut dialer, Dial::start(Instant::now()));
        let (mut theirs, _) = f.neighbour.accept().unwrap();
        // An acceptor of a three-rank world refuses the Hello.
        let mut acceptor = Acceptor::new(plan.token, plan.roster, 3, 1, 0, [3; 16]);
        let Next::Fail(_, Some(refusal)) = acceptor.on_message(&read(&mut theirs)) else {
            panic!()
        };
        theirs.write_all(&refusal.encode()).unwrap();
        let mut state = state;
        let give_up = Instant::now() + Duration::from_secs(10);
        let error = loop {
            assert!(Instant::now() < give_up, "the refusal was not heard");
            match dialer.advance(state, true, Instant::now()) {
                Ok(next) => state = next,
                Err(e) => break e,
            }
        };
        assert_eq!(
            error.to_string(),
            format!("world size mismatch with rank 1 at {}: this rank has 2 ranks", f.addresses[1])
        );
    }
}
