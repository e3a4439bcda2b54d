//! The accepting side: every connection a listener takes, each in its own handshake, until the
//! ones that may join have proven the job token. The ring's lobby admits a set of ranks, its left
//! neighbour and the chord peers it accepts (`crate::topology`), each stream proving the token on
//! its own; the address exchange's (rank 0's, in `launch::exchange`) admits every other rank.
//!
//! Invariants:
//! - Each connection has [`HANDSHAKE_DEADLINE`] from its accept to finish its handshake; a
//!   stranger that is silent, slow or sends garbage costs the ranks nothing but its slot.
//! - At most [`MAX_PENDING`] handshakes are held, at most [`MAX_PER_SOURCE`] from any one
//!   address other than a preferred one (the advertised addresses of the ranks the ring
//!   accepts; the sources of the ranks the exchange has already admitted), and at most
//!   [`MAX_ACCEPTS_PER_TURN`] connections are accepted per turn of the loop, so handshakes in
//!   progress are served between bursts.
//! - When room runs out (a cap, or accept failing for want of descriptors) one handshake is
//!   dropped, chosen by [`victim`]: never one already welcomed, never one accepted in this turn
//!   (it has not been polled yet; dropping it would punish the rank that connected at the same
//!   moment as a burst), first those not from a preferred address, then those that have sent
//!   nothing valid, then the oldest. When nothing may go, the newcomer is closed instead; when
//!   accept fails and nothing may go, the caller rests the listener ([`Accepted::Starved`]). A
//!   valid Hello is not a claim (anyone who knows the ranks and the address list can send one);
//!   only the proof is, and a proven connection leaves the lobby at once.
//! - A refusal is logged here and the listener keeps waiting: a stranger claiming the right
//!   rank must not break the ring.
//! - A proven stream leaves the lobby moved, never duplicated: one descriptor per connection.
//!
//! Not here: the listener's own life (the loop in `mod.rs` stops polling it once every rank it
//! accepts has joined) and the connecting side (`dial.rs`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tracing::warn;

use super::Plan;
use super::conn::Conn;
use super::evict::{Progress, Standing, victim};
use crate::handshake::fresh_nonce;
use crate::handshake::{Acceptor, Claims, Failure, MAC_LEN, Message, MessageError, Next};
use crate::wait::nonblocking;

/// How long one incoming connection has to complete its handshake.
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The most handshakes held open at once on the accepting side.
pub(crate) const MAX_PENDING: usize = 256;
/// The most handshakes held from one source address other than a preferred one.
pub(crate) const MAX_PER_SOURCE: usize = 32;
/// The most connections accepted in one turn of the rendezvous loop.
pub(crate) const MAX_ACCEPTS_PER_TURN: usize = 64;
/// How long the listener rests after accept failed with no handshake to close for room.
pub(crate) const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Whom a lobby admits, and the key and roster their proofs are checked with.
#[derive(Clone, Copy)]
pub(crate) struct Admission<'t> {
    /// The MAC key: the job token (the ring) or the key derived from it (the exchange).
    pub(crate) token: &'t [u8],
    pub(crate) roster: [u8; MAC_LEN],
    pub(crate) world: usize,
    /// The accepting rank.
    pub(crate) rank: usize,
    /// The ranks that may connect (the ring's left neighbour and the chord peers this rank
    /// accepts), or `None` for any other rank of the world (the exchange).
    pub(crate) peers: Option<&'t [usize]>,
}

/// Leaves the key out: it is the token, or computed from it.
impl std::fmt::Debug for Admission<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("world", &self.world)
            .field("rank", &self.rank)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

impl<'t> Admission<'t> {
    /// The ring's: the left neighbour and the chord peers this rank accepts, each proven with
    /// the job token and the roster.
    pub(super) fn ring(plan: &Plan<'t>) -> Admission<'t> {
        Admission {
            token: plan.token,
            roster: plan.roster,
            world: plan.world,
            rank: plan.rank,
            peers: Some(plan.accepts),
        }
    }

    fn role(&self) -> io::Result<Acceptor<'t>> {
        let nonce = fresh_nonce()?;
        let (world, rank) = (self.world as u32, self.rank as u32);
        Ok(match self.peers {
            Some(peers) => {
                Acceptor::from_one_of(self.token, self.roster, world, rank, peers, nonce)
            }
            None => Acceptor::any_other_rank(self.token, self.roster, world, rank, nonce),
        })
    }
}

/// One incoming connection in its handshake.
#[derive(Debug)]
pub(crate) struct Incoming<'t, S> {
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
    /// Proven and welcomed as `rank`.
    Formed { stream: S, rank: usize },
    /// Refused or broken, for this reason (the other side was told, where it helps), having
    /// claimed this in its Hello, if it sent one.
    Dropped { remote: SocketAddr, reason: String, claims: Option<Claims> },
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
                return self.formed();
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
                Next::Done => return self.formed(),
                Next::Fail(failure, reply) => {
                    self.conn.send_last(reply);
                    let reason = describe(failure, self.role.peer_claims);
                    return self.drop_for(reason);
                }
            }
        }
    }

    fn formed(self) -> Step<'t, S> {
        let rank = self.role.peer() as usize;
        Step::Formed { stream: self.conn.into_stream(), rank }
    }

    fn drop_for(self, reason: String) -> Step<'t, S> {
        Step::Dropped { remote: self.remote, reason, claims: self.role.peer_claims }
    }
}

impl<S> Incoming<'_, S> {
    /// What the eviction rule weighs; ids from `fresh_from` on were accepted this turn.
    pub(super) fn standing(&self, fresh_from: u64) -> Standing {
        let progress = if self.welcomed {
            Progress::Welcomed
        } else if self.role.challenged() {
            Progress::Challenged
        } else {
            Progress::Silent
        };
        Standing { preferred: self.preferred, progress, fresh: self.id >= fresh_from, id: self.id }
    }

    /// Which turn of accepting it came from, for telling poll results apart.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// When its handshake runs out of time.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The connection's stream and what to poll it for.
    pub(crate) fn poll_on(&self) -> (&S, rustix::event::PollFlags) {
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
pub(crate) trait Listen {
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
pub(crate) enum Accepted {
    /// The listener has nothing more waiting, or this turn took its share.
    Turn,
    /// Accept fails and nothing can be closed to make room: rest before trying again.
    Starved,
}

/// A connection that proved the token as `rank`.
#[derive(Debug)]
pub(crate) struct Joined {
    pub(crate) stream: TcpStream,
    pub(crate) remote: SocketAddr,
    pub(crate) rank: usize,
}

/// A connection the lobby refused or lost, and what its Hello claimed, if it sent one.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) remote: SocketAddr,
    pub(crate) reason: String,
    pub(crate) claims: Option<Claims>,
}

/// Every incoming handshake in progress, and what was refused so far.
#[derive(Debug)]
pub(crate) struct Lobby<'t> {
    admission: Admission<'t>,
    /// Sources dropped last and never capped: the left neighbour's advertised address, the
    /// addresses admitted ranks came from.
    preferred: Vec<IpAddr>,
    held: Vec<Incoming<'t, TcpStream>>,
    next_id: u64,
    /// The first id of the current turn of accepting.
    fresh_from: u64,
    /// How many connections were refused or broke, and the last reason.
    pub(crate) refused: usize,
    pub(crate) last_refusal: String,
}

impl<'t> Lobby<'t> {
    /// An empty lobby for the ranks `plan` accepts: the left neighbour and the chord peers.
    pub(super) fn new(plan: &Plan<'t>) -> Self {
        let sources: Vec<IpAddr> = plan.accepts.iter().map(|&p| plan.addresses[p].ip()).collect();
        Lobby::admitting(Admission::ring(plan), &sources)
    }

    /// An empty lobby that admits whom `admission` says, preferring `preferred` sources.
    pub(crate) fn admitting(admission: Admission<'t>, preferred: &[IpAddr]) -> Self {
        Lobby {
            admission,
            preferred: preferred.iter().map(IpAddr::to_canonical).collect(),
            held: Vec::new(),
            next_id: 0,
            fresh_from: 0,
            refused: 0,
            last_refusal: String::new(),
        }
    }

    /// Prefers connections from `source` from now on.
    pub(crate) fn prefer(&mut self, source: IpAddr) {
        let source = source.to_canonical();
        if !self.preferred.contains(&source) {
            self.preferred.push(source);
            for p in &mut self.held {
                p.preferred |= p.remote.ip().to_canonical() == source;
            }
        }
    }

    /// The handshakes held, for polling.
    pub(crate) fn held(&self) -> &[Incoming<'t, TcpStream>] {
        &self.held
    }

    /// Drops every handshake past its deadline.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.held.retain(|p| {
            let alive = now < p.deadline;
            if !alive {
                warn!(remote = %p.remote, "rejected connection: no handshake within {HANDSHAKE_DEADLINE:?}");
            }
            alive
        });
    }

    /// Steps every handshake whose id `is_ready`; returns those proven, and tells `refused`
    /// of each one dropped.
    pub(crate) fn step_ready(
        &mut self,
        is_ready: impl Fn(u64) -> bool,
        mut refused: impl FnMut(&Refused),
    ) -> Vec<Joined> {
        let mut joined = Vec::new();
        let mut kept = Vec::with_capacity(self.held.len());
        for incoming in std::mem::take(&mut self.held) {
            if !is_ready(incoming.id) {
                kept.push(incoming);
                continue;
            }
            let remote = incoming.remote;
            match incoming.step() {
                Step::Waiting(incoming) => kept.push(incoming),
                Step::Formed { stream, rank } => joined.push(Joined { stream, remote, rank }),
                Step::Dropped { remote, reason, claims } => {
                    warn!(%remote, %reason, "rejected connection");
                    self.refused += 1;
                    let refusal = Refused { remote, reason, claims };
                    refused(&refusal);
                    self.last_refusal = refusal.reason;
                }
            }
        }
        self.held = kept;
        joined
    }

    /// Takes up to [`MAX_ACCEPTS_PER_TURN`] waiting connections into their own handshakes.
    /// Fails only when no random nonce can be drawn.
    pub(crate) fn accept(&mut self, listener: &impl Listen) -> io::Result<Accepted> {
        self.fresh_from = self.next_id;
        for _ in 0..MAX_ACCEPTS_PER_TURN {
            match nonblocking(|| listener.accept()) {
                Ok(Some((stream, remote))) => self.admit(stream, remote)?,
                Ok(None) => return Ok(Accepted::Turn),
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
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

    /// Holds one new connection, dropping another if a cap says so (or the newcomer, if none
    /// may go).
    fn admit(&mut self, stream: TcpStream, remote: SocketAddr) -> io::Result<()> {
        if stream.set_nonblocking(true).is_err() {
            return Ok(());
        }
        // A dual-stack listener sees IPv4 peers as IPv4-mapped IPv6 addresses.
        let source = remote.ip().to_canonical();
        let preferred = self.preferred.contains(&source);
        let from_source = |p: &Incoming<'t, TcpStream>| p.remote.ip().to_canonical() == source;
        let crowded = !preferred
            && self.held.iter().filter(|p| from_source(p)).count() >= MAX_PER_SOURCE
            && !self.evict(from_source, "too many handshakes from one address");
        let full = self.held.len() >= MAX_PENDING && !self.evict(|_| true, "too many handshakes");
        if crowded || full {
            warn!(%remote, "rejected connection: no room, and every handshake held is newer or further");
            return Ok(());
        }
        let role = self.admission.role()?;
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        self.held.push(Incoming::new(self.next_id, stream, role, remote, preferred, deadline));
        self.next_id += 1;
        Ok(())
    }

    /// Drops the [`victim`] among the handshakes `among` selects; false if none may go.
    fn evict(&mut self, among: impl Fn(&Incoming<'t, TcpStream>) -> bool, why: &str) -> bool {
        let candidates: Vec<usize> =
            (0..self.held.len()).filter(|&i| among(&self.held[i])).collect();
        let fresh_from = self.fresh_from;
        let standings = candidates.iter().map(|&i| self.held[i].standing(fresh_from));
        let Some(pick) = victim(standings) else {
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
    use crate::RejectReason;
    use crate::handshake::{Connector, MESSAGE_LEN, MessageKind};

    fn standing(preferred: bool, progress: Progress, id: u64) -> Standing {
        Standing { preferred, progress, fresh: false, id }
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
        // A welcomed connection is never dropped, nor one accepted in this turn.
        assert_eq!(victim([standing(false, Welcomed, 0)]), None);
        let fresh = Standing { fresh: true, ..standing(false, Silent, 0) };
        assert_eq!(victim([fresh, standing(true, Challenged, 1)]), Some(1));
        assert_eq!(victim([fresh]), None);
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
            Step::Formed { .. } => panic!("formed too early"),
            Step::Dropped { reason, .. } => panic!("dropped: {reason}"),
        }
    }

    #[test]
    fn an_honest_neighbour_is_challenged_then_welcomed_and_formed() {
        let (p, mut neighbour) = incoming(b"job");
        let p = waiting(p.step());
        assert_eq!(p.standing(u64::MAX).progress, Progress::Silent);
        let (mut connector, hello) = Connector::start(b"job", ROSTER, 3, 0, 1, [5; 16]);
        neighbour.write_all(&hello.encode()).unwrap();
        let p = waiting(p.step());
        assert_eq!(p.standing(u64::MAX).progress, Progress::Challenged);
        let Next::Send(proof) = connector.on_message(&read(&mut neighbour)) else { panic!() };
        neighbour.write_all(&proof.encode()).unwrap();
        let Step::Formed { rank: 0, .. } = p.step() else {
            panic!("a proven neighbour forms the link")
        };
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
            dials: &[0],
            accepts: &[0],
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
    fn within_one_turn_the_newcomer_goes_rather_than_one_accepted_before_it_in_the_turn() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            vec!["10.0.0.1:7000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap()];
        let plan = lobby_plan(&addresses);
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        // The real neighbour first, then a burst from one stranger larger than its share.
        let mut script = vec![arrival(&server, &mut keep, "10.0.0.1:999")];
        for i in 0..MAX_PER_SOURCE + 8 {
            script.push(arrival(&server, &mut keep, &format!("10.9.9.9:{}", 1000 + i)));
        }
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
        let held: Vec<String> = lobby.held.iter().map(|p| p.remote.to_string()).collect();
        assert_eq!(held.len(), 1 + MAX_PER_SOURCE);
        assert_eq!(held[0], "10.0.0.1:999");
        assert_eq!(held.last().unwrap(), &format!("10.9.9.9:{}", 1000 + MAX_PER_SOURCE - 1));
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
        // All three were accepted in this turn: none is dropped for room before it is polled.
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Starved);
        assert_eq!(lobby.held.len(), 3);
        assert_eq!(lobby.accept(&Scripted::new(vec![emfile()])).unwrap(), Accepted::Turn);
        let kept: Vec<String> = lobby.held.iter().map(|p| p.remote.to_string()).collect();
        assert_eq!(kept, ["10.0.0.1:1000", "10.7.7.7:1001"], "the oldest stranger goes first");
    }

    #[test]
    fn every_rank_a_ring_with_chords_accepts_is_preferred_and_a_stranger_goes_first() {
        // Rank 0 of 8 accepts rank 7 (its left neighbour) and the chord peers 6 and 4.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            (1..=8).map(|h| format!("10.0.0.{h}:7000").parse().unwrap()).collect();
        let plan = Plan {
            rank: 0,
            world: 8,
            dials: &[1, 2],
            accepts: &[7, 6, 4],
            ..lobby_plan(&addresses)
        };
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        let script = ["10.0.0.8:1", "10.0.0.7:1", "10.0.0.5:1", "10.0.0.9:1", "10.0.0.2:1"]
            .map(|remote| arrival(&server, &mut keep, remote));
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
        let preferred: Vec<bool> =
            lobby.held.iter().map(|p| p.standing(u64::MAX).preferred).collect();
        // Ranks 7, 6 and 4 are preferred; rank 1 (dialled, never accepted) and a stranger not.
        assert_eq!(preferred, [true, true, true, false, false]);
        // Out of room, a source that is not preferred gives way first, the oldest of them.
        assert_eq!(lobby.accept(&Scripted::new(vec![emfile()])).unwrap(), Accepted::Turn);
        let kept: Vec<String> = lobby.held.iter().map(|p| p.remote.to_string()).collect();
        assert_eq!(kept, ["10.0.0.8:1", "10.0.0.7:1", "10.0.0.5:1", "10.0.0.2:1"]);
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
        let preferred: Vec<bool> =
            lobby.held.iter().map(|p| p.standing(u64::MAX).preferred).collect();
        assert_eq!(preferred, [true, false]);
    }
}
