//! The accepting side: every connection the listener takes, each in its own handshake, until
//! one proves it is the left neighbour.
//!
//! Invariants:
//! - Each connection has [`HANDSHAKE_DEADLINE`] from its accept to finish its handshake; a
//!   stranger that is silent, slow or sends garbage costs the neighbour nothing but its slot.
//! - At most [`MAX_PENDING`] handshakes are held, at most [`MAX_PER_SOURCE`] from any one
//!   address other than the left neighbour's advertised one, and at most
//!   [`MAX_ACCEPTS_PER_TURN`] connections are accepted per turn of the loop, so handshakes in
//!   progress are served between bursts.
//! - When room runs out (a cap, or accept failing for want of descriptors) one handshake is
//!   dropped, chosen by [`victim`]: never one already welcomed, never the newcomer, first those
//!   not from the neighbour's advertised address, then those that have sent nothing valid,
//!   then the oldest. A valid Hello is not a claim (anyone who knows the ranks and the address
//!   list can send one); only the proof is, and a proven connection is formed at once.
//! - A refusal is logged here and the listener keeps waiting: a stranger claiming the right
//!   rank must not break the ring.
//!
//! Not here: the listener's own life (the loop in `mod.rs` stops polling it once the left
//! neighbour has joined) and the connecting side (`dial.rs`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tracing::warn;

use super::conn::Conn;
use super::{Plan, fresh_nonce};
use crate::error::ConnectError;
use crate::handshake::{Acceptor, Claims, Failure, Message, MessageError, Next};

/// How long one incoming connection has to complete its handshake.
pub(super) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The most handshakes held open at once on the accepting side.
pub(crate) const MAX_PENDING: usize = 256;
/// The most handshakes held from one source address other than the left neighbour's.
pub(crate) const MAX_PER_SOURCE: usize = 32;
/// The most connections accepted in one turn of the rendezvous loop.
pub(super) const MAX_ACCEPTS_PER_TURN: usize = 64;

/// How far an incoming connection has got, in the order it is worth keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Progress {
    /// Nothing valid yet.
    Silent,
    /// A valid Hello, answered with a Challenge; the proof is awaited.
    Challenged,
    /// Proven and welcomed: it is the neighbour, the Welcome is being written.
    Welcomed,
}

/// What the eviction rule knows of one held handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Standing {
    /// It comes from the left neighbour's advertised address.
    pub(super) preferred: bool,
    /// How far its handshake got.
    pub(super) progress: Progress,
    /// Its accept order: lower is older.
    pub(super) id: u64,
}

/// The handshake to drop for room, as an index into `held`, if any may be dropped: see the
/// module doc for the order. The newcomer is never among `held`.
pub(super) fn victim(held: impl IntoIterator<Item = Standing>) -> Option<usize> {
    held.into_iter()
        .enumerate()
        .filter(|(_, s)| s.progress != Progress::Welcomed)
        .min_by_key(|(_, s)| (s.preferred, s.progress, s.id))
        .map(|(i, _)| i)
}

/// One incoming connection in its handshake.
#[derive(Debug)]
pub(super) struct Incoming<'t, S> {
    id: u64,
    conn: Conn<S>,
    role: Acceptor<'t>,
    deadline: Instant,
    remote: SocketAddr,
    preferred: bool,
    welcomed: bool,
}

/// Where one step of an incoming handshake left it.
#[derive(Debug)]
// Moved by value a few times per loop turn; boxing would allocate on every step instead.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step<'t, S> {
    /// Still talking: poll it again.
    Waiting(Incoming<'t, S>),
    /// Proven and welcomed: the left neighbour's stream.
    Formed(S),
    /// Refused or broken, for this reason (the other side was told, where it helps).
    Dropped { remote: SocketAddr, reason: String },
}

impl<'t, S: Read + Write> Incoming<'t, S> {
    /// A handshake over a non-blocking `stream` from `remote`, given until `deadline`.
    pub(super) fn new(
        id: u64,
        stream: S,
        role: Acceptor<'t>,
        remote: SocketAddr,
        preferred: bool,
        deadline: Instant,
    ) -> Self {
        let conn = Conn::new(stream);
        Incoming { id, conn, role, deadline, remote, preferred, welcomed: false }
    }

    /// Moves the handshake as far as it goes without waiting.
    pub(super) fn step(mut self) -> Step<'t, S> {
        loop {
            if let Err(e) = self.conn.flush() {
                return self.drop_for(format!("write failed: {e}"));
            }
            if !self.conn.flushed() {
                return Step::Waiting(self);
            }
            if self.welcomed {
                return Step::Formed(self.conn.into_stream());
            }
            let bytes = match self.conn.receive() {
                Ok(Some(bytes)) => bytes,
                Ok(None) => return Step::Waiting(self),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return self.drop_for("closed during the handshake".into());
                }
                Err(e) => return self.drop_for(format!("read failed: {e}")),
            };
            let message = match Message::decode(&bytes) {
                Ok(m) => m,
                Err(MessageError::BadMagic) => {
                    return self.drop_for("not a silvic-net peer".into());
                }
                Err(e) => return self.drop_for(e.to_string()),
            };
            match self.role.on_message(&message) {
                Next::Send(reply) => self.conn.queue(&reply),
                Next::SendAndDone(reply) => {
                    self.conn.queue(&reply);
                    self.welcomed = true;
                }
                Next::Done => return Step::Formed(self.conn.into_stream()),
                Next::Fail(failure, reply) => {
                    self.conn.send_last(reply);
                    let reason = describe(failure, self.role.peer_claims);
                    return self.drop_for(reason);
                }
            }
        }
    }

    fn drop_for(self, reason: String) -> Step<'t, S> {
        Step::Dropped { remote: self.remote, reason }
    }
}

impl<S> Incoming<'_, S> {
    /// What the eviction rule weighs.
    pub(super) fn standing(&self) -> Standing {
        let progress = if self.welcomed {
            Progress::Welcomed
        } else if self.role.challenged() {
            Progress::Challenged
        } else {
            Progress::Silent
        };
        Standing { preferred: self.preferred, progress, id: self.id }
    }

    /// Which turn of accepting it came from, for telling poll results apart.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// When its handshake runs out of time.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The connection's stream and what to poll it for.
    pub(super) fn poll_on(&self) -> (&S, rustix::event::PollFlags) {
        (self.conn.stream(), self.conn.events())
    }
}

fn describe(failure: Failure, claims: Option<Claims>) -> String {
    match (failure, claims) {
        (Failure::Refused(reason), Some(c)) => format!(
            "refused: {reason} (it sent version {}, world {}, rank {})",
            c.version, c.world, c.rank
        ),
        (Failure::Refused(reason), None) => format!("refused: {reason}"),
        (Failure::RefusedBy(reason), _) => format!("it refused this rank: {reason}"),
        (Failure::Protocol(what), _) => what.to_string(),
    }
}

/// Where connections come from: the listener, or a test's stand-in that fails on demand.
pub(super) trait Listen {
    /// The next waiting connection and its source, as `accept(2)` gives them.
    fn accept(&self) -> io::Result<(TcpStream, SocketAddr)>;
}

impl Listen for TcpListener {
    fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self)
    }
}

/// How a turn of accepting ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Accepted {
    /// The listener has nothing more waiting, or this turn took its share.
    Turn,
    /// Accept fails and nothing can be closed to make room: rest before trying again.
    Starved,
}

/// Every incoming handshake in progress, and what was refused so far.
#[derive(Debug)]
pub(super) struct Lobby<'t> {
    plan: &'t Plan<'t>,
    /// The left neighbour's advertised address: connections from it are dropped last.
    preferred: IpAddr,
    held: Vec<Incoming<'t, TcpStream>>,
    next_id: u64,
    /// How many connections were refused or broke, and the last reason.
    pub(super) refused: usize,
    pub(super) last_refusal: String,
}

impl<'t> Lobby<'t> {
    /// An empty lobby for `plan`'s rank.
    pub(super) fn new(plan: &'t Plan<'t>) -> Self {
        let preferred = plan.addresses[plan.left()].ip().to_canonical();
        Lobby {
            plan,
            preferred,
            held: Vec::new(),
            next_id: 0,
            refused: 0,
            last_refusal: String::new(),
        }
    }

    /// The handshakes held, for polling.
    pub(super) fn held(&self) -> &[Incoming<'t, TcpStream>] {
        &self.held
    }

    /// Drops every handshake past its deadline.
    pub(super) fn expire(&mut self, now: Instant) {
        self.held.retain(|p| {
            let alive = now < p.deadline;
            if !alive {
                warn!(remote = %p.remote, "rejected connection: no handshake within {HANDSHAKE_DEADLINE:?}");
            }
            alive
        });
    }

    /// Steps every handshake whose id `is_ready`; returns the left neighbour's stream once one
    /// is proven, dropping all the others.
    pub(super) fn step_ready(&mut self, is_ready: impl Fn(u64) -> bool) -> Option<TcpStream> {
        let mut kept = Vec::with_capacity(self.held.len());
        for incoming in std::mem::take(&mut self.held) {
            if !is_ready(incoming.id) {
                kept.push(incoming);
                continue;
            }
            match incoming.step() {
                Step::Waiting(incoming) => kept.push(incoming),
                Step::Formed(stream) => {
                    tracing::debug!(peer = self.plan.left(), "left neighbour joined");
                    return Some(stream);
                }
                Step::Dropped { remote, reason } => {
                    warn!(%remote, %reason, "rejected connection");
                    self.refused += 1;
                    self.last_refusal = reason;
                }
            }
        }
        self.held = kept;
        None
    }

    /// Takes up to [`MAX_ACCEPTS_PER_TURN`] waiting connections into their own handshakes.
    pub(super) fn accept(&mut self, listener: &impl Listen) -> Result<Accepted, ConnectError> {
        for _ in 0..MAX_ACCEPTS_PER_TURN {
            match listener.accept() {
                Ok((stream, remote)) => self.admit(stream, remote)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Accepted::Turn),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // Out of descriptors, most likely: make room by the same rule as a cap.
                    warn!(error = %e, "accept failed");
                    if !self.evict(|_| true, "accept failed and room was needed") {
                        return Ok(Accepted::Starved);
                    }
                }
            }
        }
        Ok(Accepted::Turn)
    }

    /// Holds one new connection, dropping another if a cap says so.
    fn admit(&mut self, stream: TcpStream, remote: SocketAddr) -> Result<(), ConnectError> {
        if stream.set_nonblocking(true).is_err() {
            return Ok(());
        }
        // A dual-stack listener sees IPv4 peers as IPv4-mapped IPv6 addresses.
        let source = remote.ip().to_canonical();
        let preferred = source == self.preferred;
        let from_source = |p: &Incoming<'t, TcpStream>| p.remote.ip().to_canonical() == source;
        if !preferred && self.held.iter().filter(|p| from_source(p)).count() >= MAX_PER_SOURCE {
            self.evict(from_source, "too many handshakes from one address");
        }
        if self.held.len() >= MAX_PENDING {
            self.evict(|_| true, "too many handshakes at once");
        }
        let plan = self.plan;
        let role = Acceptor::new(
            plan.token,
            plan.roster,
            plan.world as u32,
            plan.rank as u32,
            plan.left() as u32,
            fresh_nonce(plan, plan.left())?,
        );
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        self.held.push(Incoming::new(self.next_id, stream, role, remote, preferred, deadline));
        self.next_id += 1;
        Ok(())
    }

    /// Drops the [`victim`] among the handshakes `among` selects; false if none may go.
    fn evict(&mut self, among: impl Fn(&Incoming<'t, TcpStream>) -> bool, why: &str) -> bool {
        let candidates: Vec<usize> =
            (0..self.held.len()).filter(|&i| among(&self.held[i])).collect();
        let Some(pick) = victim(candidates.iter().map(|&i| self.held[i].standing())) else {
            return false;
        };
        let dropped = self.held.remove(candidates[pick]);
        warn!(remote = %dropped.remote, "rejected connection: {why}");
        true
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::handshake::{Connector, MESSAGE_LEN, MessageKind, RejectReason};

    fn standing(preferred: bool, progress: Progress, id: u64) -> Standing {
        Standing { preferred, progress, id }
    }

    #[test]
    fn the_victim_is_a_stranger_first_then_the_least_advanced_then_the_oldest() {
        use Progress::*;
        // A preferred connection that has said nothing outlives a stranger that sent a Hello.
        let held = [standing(true, Silent, 0), standing(false, Challenged, 1)];
        assert_eq!(victim(held), Some(1));
        // Among strangers, the silent go before the challenged, the oldest first.
        let held = [
            standing(false, Challenged, 0),
            standing(false, Silent, 3),
            standing(false, Silent, 2),
        ];
        assert_eq!(victim(held), Some(2));
        // From the neighbour's own address, a Hello counts, then age.
        let held = [standing(true, Challenged, 0), standing(true, Challenged, 1)];
        assert_eq!(victim(held), Some(0));
        // A welcomed connection is never dropped.
        assert_eq!(victim([standing(false, Welcomed, 0)]), None);
        assert_eq!(victim([]), None);
    }

    const ROSTER: [u8; 32] = [9; 32];

    fn incoming(acceptor_token: &'static [u8]) -> (Incoming<'static, UnixStream>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let role = Acceptor::new(acceptor_token, ROSTER, 3, 1, 0, [4; 16]);
        let remote = "10.0.0.1:5000".parse().unwrap();
        let far = Instant::now() + Duration::from_secs(3600);
        (Incoming::new(0, ours, role, remote, true, far), theirs)
    }

    fn read(stream: &mut UnixStream) -> Message {
        let mut bytes = [0u8; MESSAGE_LEN];
        stream.read_exact(&mut bytes).unwrap();
        Message::decode(&bytes).unwrap()
    }

    fn waiting<S>(step: Step<'static, S>) -> Incoming<'static, S> {
        match step {
            Step::Waiting(i) => i,
            Step::Formed(_) => panic!("formed too early"),
            Step::Dropped { reason, .. } => panic!("dropped: {reason}"),
        }
    }

    #[test]
    fn an_honest_neighbour_is_challenged_then_welcomed_and_formed() {
        let (p, mut neighbour) = incoming(b"job");
        let p = waiting(p.step());
        assert_eq!(p.standing().progress, Progress::Silent);
        let (mut connector, hello) = Connector::start(b"job", ROSTER, 3, 0, 1, [5; 16]);
        neighbour.write_all(&hello.encode()).unwrap();
        let p = waiting(p.step());
        assert_eq!(p.standing().progress, Progress::Challenged);
        let Next::Send(proof) = connector.on_message(&read(&mut neighbour)) else { panic!() };
        neighbour.write_all(&proof.encode()).unwrap();
        let Step::Formed(_) = p.step() else { panic!("a proven neighbour forms the link") };
        assert_eq!(connector.on_message(&read(&mut neighbour)), Next::Done);
    }

    #[test]
    fn a_wrong_token_is_dropped_and_told_only_the_reason() {
        let (p, mut stranger) = incoming(b"job");
        let (mut connector, hello) = Connector::start(b"other", ROSTER, 3, 0, 1, [5; 16]);
        stranger.write_all(&hello.encode()).unwrap();
        let p = waiting(p.step());
        let Next::Send(proof) = connector.on_message(&read(&mut stranger)) else { panic!() };
        stranger.write_all(&proof.encode()).unwrap();
        let Step::Dropped { reason, .. } = p.step() else { panic!("a wrong proof is dropped") };
        assert!(reason.contains("job token mismatch"), "{reason}");
        let refusal = read(&mut stranger);
        assert_eq!(refusal.kind, MessageKind::Reject(RejectReason::TokenMismatch));
        assert_eq!((refusal.version, refusal.world, refusal.rank), (0, 0, 0));
    }

    #[test]
    fn garbage_and_a_close_are_dropped_with_a_reason() {
        let (p, mut stranger) = incoming(b"job");
        stranger.write_all(&[0x16; MESSAGE_LEN]).unwrap();
        let Step::Dropped { reason, .. } = p.step() else { panic!() };
        assert_eq!(reason, "not a silvic-net peer");
        let (p, stranger) = incoming(b"job");
        drop(stranger);
        let Step::Dropped { reason, .. } = p.step() else { panic!() };
        assert_eq!(reason, "closed during the handshake");
    }

    /// Stands in for the listener: hands out `script` in order, then WouldBlock.
    struct Scripted {
        script: std::cell::RefCell<std::collections::VecDeque<io::Result<(TcpStream, SocketAddr)>>>,
    }

    impl Scripted {
        fn new(script: impl IntoIterator<Item = io::Result<(TcpStream, SocketAddr)>>) -> Self {
            Scripted { script: std::cell::RefCell::new(script.into_iter().collect()) }
        }
    }

    impl Listen for Scripted {
        fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
            let next = self.script.borrow_mut().pop_front();
            next.unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
        }
    }

    /// A connected loopback stream (its other end kept alive in `keep`), said to come from
    /// `remote`.
    fn arrival(
        server: &TcpListener,
        keep: &mut Vec<TcpStream>,
        remote: &str,
    ) -> io::Result<(TcpStream, SocketAddr)> {
        keep.push(TcpStream::connect(server.local_addr().unwrap()).unwrap());
        let (stream, _) = server.accept().unwrap();
        Ok((stream, remote.parse().unwrap()))
    }

    fn emfile() -> io::Result<(TcpStream, SocketAddr)> {
        Err(io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error()))
    }

    fn lobby_plan(addresses: &[SocketAddr]) -> Plan<'_> {
        Plan {
            rank: 1,
            world: 2,
            addresses,
            token: b"a-job-token-of-some-length",
            timeout: Duration::from_secs(60),
            roster: ROSTER,
        }
    }

    fn sources(lobby: &Lobby<'_>) -> Vec<String> {
        lobby.held.iter().map(|p| p.remote.ip().to_string()).collect()
    }

    #[test]
    fn one_source_other_than_the_neighbours_holds_at_most_its_share() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let plan = lobby_plan(&addresses);
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        let mut script = std::collections::VecDeque::new();
        for i in 0..MAX_PER_SOURCE + 5 {
            script.push_back(arrival(&server, &mut keep, &format!("10.9.9.9:{}", 1000 + i)));
            script.push_back(arrival(&server, &mut keep, &format!("10.0.0.1:{}", 1000 + i)));
        }
        let listener = Scripted::new(script);
        while !listener.script.borrow().is_empty() {
            assert_eq!(lobby.accept(&listener).unwrap(), Accepted::Turn);
        }
        let held = sources(&lobby);
        let stranger = held.iter().filter(|s| *s == "10.9.9.9").count();
        let neighbour = held.iter().filter(|s| *s == "10.0.0.1").count();
        assert_eq!(stranger, MAX_PER_SOURCE, "one stranger source kept more than its share");
        assert_eq!(neighbour, MAX_PER_SOURCE + 5, "the neighbour's address is not capped");
        // The stranger's oldest went first: the newest are held.
        let oldest_kept = lobby.held.iter().filter(|p| p.remote.ip().to_string() == "10.9.9.9");
        assert_eq!(oldest_kept.map(|p| p.remote.port()).min(), Some(1005));
    }

    #[test]
    fn a_turn_accepts_a_bounded_number() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let plan = lobby_plan(&addresses);
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        let script: std::collections::VecDeque<_> = (0..MAX_ACCEPTS_PER_TURN + 3)
            .map(|i| arrival(&server, &mut keep, &format!("10.0.0.1:{}", 1000 + i)))
            .collect();
        let listener = Scripted::new(script);
        assert_eq!(lobby.accept(&listener).unwrap(), Accepted::Turn);
        assert_eq!(lobby.held.len(), MAX_ACCEPTS_PER_TURN);
        assert_eq!(lobby.accept(&listener).unwrap(), Accepted::Turn);
        assert_eq!(lobby.held.len(), MAX_ACCEPTS_PER_TURN + 3);
    }

    #[test]
    fn out_of_descriptors_a_stranger_is_dropped_by_the_same_rule_or_accepting_rests() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let plan = lobby_plan(&addresses);
        let mut lobby = Lobby::new(&plan);
        assert_eq!(
            lobby.accept(&Scripted::new(vec![emfile()])).unwrap(),
            Accepted::Starved,
            "nothing to drop: rest"
        );
        let mut keep = Vec::new();
        let script = vec![
            arrival(&server, &mut keep, "10.0.0.1:1000"), // the neighbour's address, oldest
            arrival(&server, &mut keep, "10.7.7.7:1000"),
            arrival(&server, &mut keep, "10.7.7.7:1001"),
            emfile(),
        ];
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
        let kept: Vec<String> = lobby.held.iter().map(|p| p.remote.to_string()).collect();
        assert_eq!(kept, ["10.0.0.1:1000", "10.7.7.7:1001"], "the oldest stranger goes first");
    }

    #[test]
    fn the_neighbours_address_is_recognised_through_a_dual_stack_listener() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let plan = lobby_plan(&addresses);
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        let script = vec![
            arrival(&server, &mut keep, "[::ffff:10.0.0.1]:1000"),
            arrival(&server, &mut keep, "[::ffff:10.0.0.9]:1000"),
        ];
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
        let preferred: Vec<bool> = lobby.held.iter().map(|p| p.standing().preferred).collect();
        assert_eq!(preferred, [true, false]);
    }
}
