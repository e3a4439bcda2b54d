//! Forming the ring: connect to the right neighbour and accept the left one, at the same time,
//! in one poll loop.
//!
//! Invariants:
//! - Connecting retries (with backoff up to half a second) until the rendezvous deadline: a
//!   neighbour that starts late is waited for, one that never starts fails the call at the
//!   deadline naming it.
//! - Any number of connections may arrive at the listener at once; each gets its own handshake
//!   with its own short deadline, so silent, slow or garbage-sending strangers never delay the
//!   real neighbour. At most [`MAX_PENDING`] are held; past that the oldest is dropped, taking
//!   first those that have not sent a valid Hello.
//! - A refusal the neighbour reports (or this rank detects) on the connecting side fails the
//!   call at once with the reason; refusals on the accepting side are logged and the listener
//!   keeps waiting, since a stranger claiming the right rank must not break the ring.
//! - Nothing here allocates by what a peer sends: every message is [`MESSAGE_LEN`] bytes.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use socket2::{Domain, Protocol, Socket, Type};
use tracing::{debug, warn};

use crate::error::ConnectError;
use crate::handshake::{
    Acceptor, Claims, Connector, Failure, MESSAGE_LEN, Message, MessageError, Next, RejectReason,
    VERSION,
};
use crate::wait::wait as poll_wait;

/// How long one incoming connection has to complete its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The most handshakes held open at once on the accepting side.
pub(crate) const MAX_PENDING: usize = 256;
const FIRST_RETRY: Duration = Duration::from_millis(20);
const MAX_RETRY: Duration = Duration::from_millis(500);

/// What one rank needs to join the ring.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) addresses: &'a [SocketAddr],
    pub(crate) token: &'a [u8],
    pub(crate) timeout: Duration,
}

impl Plan<'_> {
    fn right_io_error(&self, e: &io::Error) -> ConnectError {
        ConnectError::Io {
            peer: self.right(),
            address: self.addresses[self.right()].to_string(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    fn right_handshake_error(&self, reason: String) -> ConnectError {
        let address = self.addresses[self.right()].to_string();
        ConnectError::Handshake { peer: self.right(), address, reason }
    }

    fn left(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }
    fn right(&self) -> usize {
        (self.rank + 1) % self.world
    }
}

/// One handshake's bytes over a non-blocking stream: a message out, a message in.
struct Conn {
    stream: TcpStream,
    inbox: [u8; MESSAGE_LEN],
    got: usize,
    outbox: [u8; MESSAGE_LEN],
    sent: usize,
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            inbox: [0; MESSAGE_LEN],
            got: 0,
            outbox: [0; MESSAGE_LEN],
            sent: MESSAGE_LEN,
        }
    }

    fn queue(&mut self, message: &Message) {
        self.outbox = message.encode();
        self.sent = 0;
    }

    fn flushed(&self) -> bool {
        self.sent == MESSAGE_LEN
    }

    fn flush(&mut self) -> io::Result<()> {
        while !self.flushed() {
            match self.stream.write(&self.outbox[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The next whole message, if it has arrived.
    fn receive(&mut self) -> io::Result<Option<[u8; MESSAGE_LEN]>> {
        while self.got < MESSAGE_LEN {
            match self.stream.read(&mut self.inbox[self.got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.got = 0;
        Ok(Some(self.inbox))
    }

    fn events(&self) -> PollFlags {
        if self.flushed() { PollFlags::IN } else { PollFlags::OUT }
    }

    /// Sends a last message if it fits, without waiting.
    fn send_last(&mut self, message: Option<Message>) {
        if let Some(m) = message {
            self.queue(&m);
            let _ = self.flush();
        }
    }
}

/// An incoming connection in its handshake.
struct Pending<'t> {
    conn: Conn,
    role: Acceptor<'t>,
    deadline: Instant,
    remote: SocketAddr,
    /// It sent a valid Hello for the left neighbour's rank: it is dropped for room only after
    /// every connection that has not.
    claimed: bool,
    welcomed: bool,
}

enum Outcome {
    Continue,
    Formed,
    Drop(String),
}

impl Pending<'_> {
    fn step(&mut self) -> Outcome {
        if let Err(e) = self.conn.flush() {
            return Outcome::Drop(format!("write failed: {e}"));
        }
        if !self.conn.flushed() {
            return Outcome::Continue;
        }
        if self.welcomed {
            return Outcome::Formed;
        }
        let bytes = match self.conn.receive() {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Outcome::Continue,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Outcome::Drop("closed during the handshake".into());
            }
            Err(e) => return Outcome::Drop(format!("read failed: {e}")),
        };
        let message = match Message::decode(&bytes) {
            Ok(m) => m,
            Err(MessageError::BadMagic) => return Outcome::Drop("not a silvic-net peer".into()),
            Err(e) => return Outcome::Drop(e.to_string()),
        };
        match self.role.on_message(&message) {
            Next::Send(reply) => {
                self.conn.queue(&reply);
                self.claimed = true;
                self.step()
            }
            Next::SendAndDone(reply) => {
                self.conn.queue(&reply);
                self.welcomed = true;
                self.step()
            }
            Next::Done => Outcome::Formed,
            Next::Fail(failure, reply) => {
                self.conn.send_last(reply);
                Outcome::Drop(describe(failure, self.role.peer_claims))
            }
        }
    }
}

fn describe(failure: Failure, claims: Option<Claims>) -> String {
    let claims = claims.unwrap_or_default();
    match failure {
        Failure::Refused(reason) => format!(
            "refused: {reason} (it sent version {}, world {}, rank {})",
            claims.version, claims.world, claims.rank
        ),
        Failure::RefusedBy(reason) => format!("it refused this rank: {reason}"),
        Failure::Protocol(what) => what.to_string(),
    }
}

/// The connecting side's progress.
enum Dial<'t> {
    Wait(Instant),
    Connecting(Socket),
    Talking { conn: Box<Conn>, role: Connector<'t>, deadline: Instant },
    Done(TcpStream),
}

struct Dialer<'p, 't> {
    plan: &'p Plan<'t>,
    state: Dial<'t>,
    backoff: Duration,
    last_error: Option<String>,
}

impl<'t> Dialer<'_, 't> {
    fn address(&self) -> SocketAddr {
        self.plan.addresses[self.plan.right()]
    }

    fn retry(&mut self, error: String) {
        debug!(peer = self.plan.right(), %error, "retrying connect");
        self.last_error = Some(error);
        self.state = Dial::Wait(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_RETRY);
    }

    fn fail(&self, reason: RejectReason, claims: Option<Claims>) -> ConnectError {
        let c = claims.unwrap_or_default();
        let detail = match reason {
            RejectReason::VersionMismatch => {
                format!(": it speaks version {}, this rank {VERSION}", c.version)
            }
            RejectReason::WorldMismatch => {
                format!(": it has {} ranks, this rank has {}", c.world, self.plan.world)
            }
            RejectReason::WrongRank => format!(
                ": it is rank {} and this rank is {} of {}",
                c.rank, self.plan.rank, self.plan.world
            ),
            _ => String::new(),
        };
        ConnectError::Rejected {
            peer: self.plan.right(),
            address: self.address().to_string(),
            reason,
            detail,
        }
    }

    /// Moves the connecting side as far as it goes without waiting.
    fn step(&mut self, ready: bool) -> Result<(), ConnectError> {
        let plan = self.plan;
        loop {
            match &mut self.state {
                Dial::Wait(until) => {
                    if Instant::now() < *until {
                        return Ok(());
                    }
                    let address = self.address();
                    let socket = Socket::new(
                        Domain::for_address(address),
                        Type::STREAM,
                        Some(Protocol::TCP),
                    )
                    .and_then(|s| s.set_nonblocking(true).map(|()| s));
                    let socket = match socket {
                        Ok(s) => s,
                        Err(e) => return Err(self.io_error(&e)),
                    };
                    match socket.connect(&address.into()) {
                        Ok(()) => self.state = Dial::Connecting(socket),
                        Err(e)
                            if e.raw_os_error()
                                == Some(rustix::io::Errno::INPROGRESS.raw_os_error()) =>
                        {
                            self.state = Dial::Connecting(socket);
                            return Ok(());
                        }
                        Err(e) => self.retry(e.to_string()),
                    }
                }
                Dial::Connecting(socket) => {
                    if !ready {
                        return Ok(());
                    }
                    match socket.take_error() {
                        Ok(Some(e)) | Err(e) => {
                            self.retry(e.to_string());
                            return Ok(());
                        }
                        Ok(None) => {}
                    }
                    if socket.peer_addr().is_err() {
                        return Ok(()); // not connected yet: a spurious wake-up
                    }
                    let Dial::Connecting(socket) =
                        std::mem::replace(&mut self.state, Dial::Wait(Instant::now()))
                    else {
                        unreachable!()
                    };
                    let mut nonce = [0u8; 16];
                    getrandom::fill(&mut nonce).map_err(|e| {
                        plan.right_io_error(&io::Error::other(format!("no random bytes: {e}")))
                    })?;
                    let (role, hello) = Connector::start(
                        plan.token,
                        plan.world as u32,
                        plan.rank as u32,
                        plan.right() as u32,
                        nonce,
                    );
                    let mut conn = Box::new(Conn::new(socket.into()));
                    conn.queue(&hello);
                    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
                    self.state = Dial::Talking { conn, role, deadline };
                }
                Dial::Talking { conn, role, deadline } => {
                    if let Err(e) = conn.flush() {
                        self.retry(format!("handshake write failed: {e}"));
                        continue;
                    }
                    if !conn.flushed() {
                        return Ok(());
                    }
                    let bytes = match conn.receive() {
                        Ok(Some(bytes)) => bytes,
                        Ok(None) if Instant::now() >= *deadline => {
                            self.retry("no handshake answer".into());
                            continue;
                        }
                        Ok(None) => return Ok(()),
                        Err(e) => {
                            self.retry(format!("handshake read failed: {e}"));
                            continue;
                        }
                    };
                    let message = Message::decode(&bytes)
                        .map_err(|e| plan.right_handshake_error(e.to_string()))?;
                    match role.on_message(&message) {
                        Next::Send(reply) => conn.queue(&reply),
                        Next::Done | Next::SendAndDone(_) => {
                            let Dial::Talking { conn, .. } =
                                std::mem::replace(&mut self.state, Dial::Wait(Instant::now()))
                            else {
                                unreachable!()
                            };
                            self.state = Dial::Done(conn.stream);
                        }
                        Next::Fail(failure, reply) => {
                            conn.send_last(reply);
                            let claims = role.peer_claims;
                            return Err(match failure {
                                Failure::Refused(r) | Failure::RefusedBy(r) => self.fail(r, claims),
                                Failure::Protocol(what) => plan.right_handshake_error(what.into()),
                            });
                        }
                    }
                }
                Dial::Done(_) => return Ok(()),
            }
        }
    }

    fn io_error(&self, e: &io::Error) -> ConnectError {
        self.plan.right_io_error(e)
    }

    fn wake_at(&self) -> Option<Instant> {
        match &self.state {
            Dial::Wait(until) => Some(*until),
            Dial::Talking { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }
}

/// How long the listener rests after accept failed with no handshake to close for room.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// How a round of accepting ended.
#[derive(Debug, PartialEq, Eq)]
enum Accepted {
    /// Every waiting connection was taken.
    All,
    /// Accept fails and nothing can be closed to make room.
    Starved,
}

/// Forms this rank's two ring streams: `(left, right)`, still blocking, handshakes done.
pub(crate) fn rendezvous(
    listener: &TcpListener,
    plan: &Plan<'_>,
) -> Result<(TcpStream, TcpStream), ConnectError> {
    // A timeout too long for an Instant (Duration::MAX) has no deadline.
    let deadline = Instant::now().checked_add(plan.timeout);
    listener.set_nonblocking(true).map_err(|e| ConnectError::Io {
        peer: plan.left(),
        address: plan.addresses[plan.left()].to_string(),
        kind: e.kind(),
        message: format!("listener: {e}"),
    })?;
    let mut dialer =
        Dialer { plan, state: Dial::Wait(Instant::now()), backoff: FIRST_RETRY, last_error: None };
    let mut pending: Vec<Pending<'_>> = Vec::new();
    let mut left: Option<TcpStream> = None;
    let mut refused = 0usize;
    let mut last_refusal = String::new();
    let mut dial_ready = false;
    // Set while accept fails with nothing to close for room (out of descriptors): the listener
    // stays readable, so it is left out of the poll set for a moment instead of spinning.
    let mut accept_paused_until: Option<Instant> = None;
    loop {
        dialer.step(dial_ready)?;
        if let (Some(_), Dial::Done(_)) = (&left, &dialer.state) {
            let Dial::Done(right) = dialer.state else { unreachable!() };
            return Ok((left.take().expect("checked"), right));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timeout_error(plan, &dialer, left.is_some(), refused, &last_refusal));
        }
        pending.retain(|p| {
            let alive = now < p.deadline;
            if !alive {
                warn!(remote = %p.remote, "rejected connection: no handshake within {HANDSHAKE_DEADLINE:?}");
            }
            alive
        });

        accept_paused_until = accept_paused_until.filter(|until| now < *until);
        let wake = [deadline, dialer.wake_at(), accept_paused_until]
            .into_iter()
            .chain(pending.iter().map(|p| Some(p.deadline)))
            .flatten()
            .min();
        let dial_fd = match &dialer.state {
            Dial::Connecting(s) => Some(PollFd::new(s, PollFlags::OUT)),
            Dial::Talking { conn, .. } => Some(PollFd::new(&conn.stream, conn.events())),
            _ => None,
        };
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 + pending.len());
        let listening = left.is_none() && accept_paused_until.is_none();
        fds.push(PollFd::new(listener, if listening { PollFlags::IN } else { PollFlags::empty() }));
        let has_dial = dial_fd.is_some();
        fds.extend(dial_fd);
        fds.extend(pending.iter().map(|p| PollFd::new(&p.conn.stream, p.conn.events())));
        poll_wait(&mut fds, wake).map_err(|e| dialer.io_error(&e))?;
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);

        dial_ready = has_dial && ready[1];
        let first_pending = 1 + usize::from(has_dial);
        let outcomes: Vec<Outcome> = pending
            .iter_mut()
            .zip(&ready[first_pending..])
            .map(|(p, &was_ready)| if was_ready { p.step() } else { Outcome::Continue })
            .collect();
        for (i, outcome) in outcomes.into_iter().enumerate().rev() {
            match outcome {
                Outcome::Continue => {}
                Outcome::Formed => {
                    debug!(peer = plan.left(), remote = %pending[i].remote, "left neighbour joined");
                    left = Some(pending.remove(i).conn.stream);
                }
                Outcome::Drop(reason) => {
                    let p = pending.remove(i);
                    warn!(remote = %p.remote, %reason, "rejected connection");
                    refused += 1;
                    last_refusal = reason;
                }
            }
        }
        if left.is_some() {
            pending.clear();
        }
        if listening && ready[0] && accept_all(listener, plan, &mut pending)? == Accepted::Starved {
            accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
        }
    }
}

/// Takes every connection waiting on the listener into its own handshake.
fn accept_all<'t>(
    listener: &TcpListener,
    plan: &Plan<'t>,
    pending: &mut Vec<Pending<'t>>,
) -> Result<Accepted, ConnectError> {
    loop {
        match listener.accept() {
            Ok((stream, remote)) => {
                if pending.len() >= MAX_PENDING {
                    // Drop the oldest that said nothing valid yet: a scanner opening connections
                    // faster than MAX_PENDING per round trip must not push out a neighbour on a
                    // slow link while it proves itself.
                    let victim = pending.iter().position(|p| !p.claimed).unwrap_or(0);
                    let dropped = pending.remove(victim);
                    warn!(remote = %dropped.remote, "rejected connection: too many handshakes at once");
                }
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let mut nonce = [0u8; 16];
                getrandom::fill(&mut nonce).map_err(|e| ConnectError::Io {
                    peer: plan.left(),
                    address: plan.addresses[plan.left()].to_string(),
                    kind: io::ErrorKind::Other,
                    message: format!("no random bytes: {e}"),
                })?;
                let role = Acceptor::new(
                    plan.token,
                    plan.world as u32,
                    plan.rank as u32,
                    plan.left() as u32,
                    nonce,
                );
                pending.push(Pending {
                    conn: Conn::new(stream),
                    role,
                    deadline: Instant::now() + HANDSHAKE_DEADLINE,
                    remote,
                    claimed: false,
                    welcomed: false,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Accepted::All),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // Out of descriptors, most likely: make room by dropping the oldest handshake.
                warn!(error = %e, "accept failed");
                if pending.is_empty() {
                    return Ok(Accepted::Starved);
                }
                pending.remove(0);
            }
        }
    }
}

fn timeout_error(
    plan: &Plan<'_>,
    dialer: &Dialer<'_, '_>,
    have_left: bool,
    refused: usize,
    last_refusal: &str,
) -> ConnectError {
    let (peer, waiting_for) = if !matches!(dialer.state, Dial::Done(_)) {
        let last = dialer.last_error.as_deref().unwrap_or("none");
        (plan.right(), format!("to accept this rank's connection (last error: {last})"))
    } else {
        debug_assert!(!have_left);
        let mut what = "to connect to this rank".to_string();
        if refused > 0 {
            what +=
                &format!(" ({refused} other connections were rejected, the last: {last_refusal})");
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
