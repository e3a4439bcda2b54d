//! The accepting side: every connection a listener takes, each in its own handshake, until the
//! ones that may join have proven the job token. The ring's lobby admits a set of ranks, its left
//! neighbour and the chord peers it accepts (`topology.rs`), each stream proving the token on
//! its own; the address exchange's (rank 0's, in `launch::exchange`) admits every other rank.
//!
//! Invariants:
//! - Each connection has [`HANDSHAKE_DEADLINE`] from its accept to finish its handshake; a
//!   stranger that is silent, slow or sends garbage costs the ranks nothing but its slot.
//! - At most [`MAX_PENDING`] handshakes are held; from any one [`Source`] (an IPv4 address, an
//!   IPv6 /64) at most [`MAX_PER_SOURCE`] plus the ranks still expected from there (the ring's
//!   lobby knows its peers' advertised addresses; the exchange's expects none in particular);
//!   and at most [`MAX_ACCEPTS_PER_TURN`] connections are accepted per turn of the loop, so
//!   handshakes in progress are served between bursts.
//! - When room runs out (a cap, or accept failing for want of descriptors) one handshake is
//!   dropped by fair share (`evict.rs`): the oldest of the source holding the most beyond the
//!   ranks still expected from it (for a source's own cap, that source's oldest), never one already welcomed, never one accepted in
//!   this turn (it has not been polled yet; dropping it would punish the rank that connected at
//!   the same moment as a burst). A source holding fewer handshakes than another is therefore
//!   never the one to give way, however fast the others connect. When nothing may go, the
//!   newcomer is closed instead; when accept fails and nothing may go, the caller rests the
//!   listener ([`Accepted::Starved`]). How far a handshake got weighs only among the handshakes
//!   that must give way (one that sent nothing goes before one that sent a Hello): a valid
//!   Hello is not a claim (anyone who knows the ranks and the address list can send one); only
//!   the proof is, and a proven connection leaves the lobby at once.
//! - A refusal is counted, not logged one by one: [`Lobby::report`] logs a summary when one is
//!   due (`tally.rs`: at most one line per gap, the gaps doubling to a minute), so a flood
//!   cannot fill a log that nobody reads and block the rendezvous in a write. The listener keeps
//!   waiting: a stranger claiming the right rank must not break the ring.
//! - A proven stream leaves the lobby moved, never duplicated: one descriptor per connection.
//!
//! Not here: the listener's own life (the loop in `mod.rs` stops polling it once every rank it
//! accepts has joined) and the connecting side (`dial.rs`).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tracing::warn;

use super::conn::Conn;
pub(crate) use super::conn::HANDSHAKE_DEADLINE;
use super::evict::{Source, Standing, oldest_from, victim};
use super::plan::Plan;
use super::tally::{Rejection, Tally};
use crate::handshake::fresh_nonce;
use crate::handshake::{Acceptor, Claims, Failure, MAC_LEN, Message, MessageError, Next};
use crate::wait::nonblocking;

/// The most handshakes held open at once on the accepting side.
pub(crate) const MAX_PENDING: usize = 256;
/// The most handshakes held from one [`Source`], beside the ranks still expected from there.
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
    /// The channels whose streams the ring takes, from the first to before the second (the
    /// exchange: channel 0 alone).
    pub(crate) channels: (u16, u16),
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
            channels: (plan.channels.start, plan.channels.end),
        }
    }

    fn role(&self) -> io::Result<Acceptor<'t>> {
        let nonce = fresh_nonce()?;
        let (world, rank) = (self.world as u32, self.rank as u32);
        Ok(match self.peers {
            Some(peers) => {
                Acceptor::from_one_of(self.token, self.roster, world, rank, peers, nonce)
                    .on_channels(self.channels.0..self.channels.1)
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
    source: Source,
    welcomed: bool,
}

/// Where one step of an incoming handshake left it.
#[derive(Debug)]
// Moved by value a few times per loop turn; boxing would allocate on every step instead.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step<'t, S> {
    /// Still talking: poll it again.
    Waiting(Incoming<'t, S>),
    /// Proven and welcomed as `rank`, its stream of channel `channel`.
    Formed { stream: S, rank: usize, channel: u16 },
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
        deadline: Instant,
    ) -> Self {
        let conn = Conn::new(stream);
        let source = Source::of(remote.ip());
        Incoming { id, conn, role, deadline, remote, source, welcomed: false }
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
        let (rank, channel) = (self.role.peer() as usize, self.role.channel());
        Step::Formed { stream: self.conn.into_stream(), rank, channel }
    }

    fn drop_for(self, reason: String) -> Step<'t, S> {
        Step::Dropped { remote: self.remote, reason, claims: self.role.peer_claims }
    }
}

impl<S> Incoming<'_, S> {
    /// What the eviction rule weighs; ids from `fresh_from` on were accepted this turn.
    pub(super) fn standing(&self, fresh_from: u64) -> Standing {
        Standing {
            source: self.source,
            spoke: self.role.challenged(),
            welcomed: self.welcomed,
            fresh: self.id >= fresh_from,
        }
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
    /// The channel of its stream.
    pub(crate) channel: u16,
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
    /// The ranks still expected, each with the source it should come from (the ring's peers'
    /// advertised addresses): each lifts its source's cap by one until it joins.
    expected: Vec<(usize, Source)>,
    /// In accept order: the oldest first.
    held: Vec<Incoming<'t, TcpStream>>,
    /// How many of `held` come from each source.
    per_source: HashMap<Source, usize>,
    next_id: u64,
    /// The first id of the current turn of accepting.
    fresh_from: u64,
    /// How many handshakes were refused or broke, and the last reason.
    pub(crate) refused: usize,
    pub(crate) last_refusal: String,
    /// What was rejected since the last summary line.
    tally: Tally,
}

impl<'t> Lobby<'t> {
    /// An empty lobby for the ranks `plan` accepts (the left neighbour and the chord peers),
    /// a stream of each of its channels from each.
    pub(super) fn new(plan: &Plan<'t>) -> Self {
        let channels = plan.channels.len();
        let expected = (plan.accepts.iter())
            .flat_map(|&p| std::iter::repeat_n((p, Source::of(plan.addresses[p].ip())), channels))
            .collect();
        Lobby::admitting(Admission::ring(plan), expected)
    }

    /// An empty lobby that admits whom `admission` says, expecting each rank of `expected`
    /// from its source.
    pub(crate) fn admitting(admission: Admission<'t>, expected: Vec<(usize, Source)>) -> Self {
        Lobby {
            admission,
            expected,
            held: Vec::new(),
            per_source: HashMap::new(),
            next_id: 0,
            fresh_from: 0,
            refused: 0,
            last_refusal: String::new(),
            tally: Tally::default(),
        }
    }

    /// The handshakes held, for polling.
    pub(crate) fn held(&self) -> &[Incoming<'t, TcpStream>] {
        &self.held
    }

    /// Logs a summary of what was rejected, if one is due at `now`.
    pub(crate) fn report(&mut self, now: Instant) {
        if let Some(line) = self.tally.summary(now) {
            warn!("{line}");
        }
    }

    /// When [`Lobby::report`] has a summary to log, if it has anything to tell.
    pub(crate) fn next_report(&self) -> Option<Instant> {
        self.tally.due()
    }

    /// Drops every handshake past its deadline.
    pub(crate) fn expire(&mut self, now: Instant) {
        let (per_source, tally) = (&mut self.per_source, &mut self.tally);
        self.held.retain(|p| {
            let alive = now < p.deadline;
            if !alive {
                release(per_source, p.source);
                tally.count(now, Rejection::Late);
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
        let now = Instant::now();
        for incoming in std::mem::take(&mut self.held) {
            if !is_ready(incoming.id) {
                kept.push(incoming);
                continue;
            }
            let (remote, source) = (incoming.remote, incoming.source);
            match incoming.step() {
                Step::Waiting(incoming) => kept.push(incoming),
                Step::Formed { stream, rank, channel } => {
                    release(&mut self.per_source, source);
                    if let Some(at) = self.expected.iter().position(|(r, _)| *r == rank) {
                        self.expected.swap_remove(at);
                    }
                    joined.push(Joined { stream, remote, rank, channel });
                }
                Step::Dropped { remote, reason, claims } => {
                    release(&mut self.per_source, source);
                    self.tally.failed(now, remote, &reason);
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
                    self.tally.accept_failed(Instant::now(), &e);
                    if !self.evict(None) {
                        return Ok(Accepted::Starved);
                    }
                }
            }
        }
        Ok(Accepted::Turn)
    }

    /// How many ranks are still expected from `source`.
    fn expected_from(&self, source: Source) -> usize {
        self.expected.iter().filter(|(_, s)| *s == source).count()
    }

    /// Holds one new connection, dropping another if a cap says so (or the newcomer, if none
    /// may go).
    fn admit(&mut self, stream: TcpStream, remote: SocketAddr) -> io::Result<()> {
        if stream.set_nonblocking(true).is_err() {
            return Ok(());
        }
        let source = Source::of(remote.ip());
        let cap = MAX_PER_SOURCE + self.expected_from(source);
        let crowded =
            self.per_source.get(&source).copied().unwrap_or(0) >= cap && !self.evict(Some(source));
        let full = self.held.len() >= MAX_PENDING && !self.evict(None);
        if crowded || full {
            // Every handshake that could make room is newer, or welcomed: the newcomer goes.
            self.tally.count(Instant::now(), Rejection::Room);
            return Ok(());
        }
        let role = self.admission.role()?;
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        self.held.push(Incoming::new(self.next_id, stream, role, remote, deadline));
        *self.per_source.entry(source).or_insert(0) += 1;
        self.next_id += 1;
        Ok(())
    }

    /// Drops a handshake for room, by fair share: the oldest of `source`'s, or with `None`
    /// of the source holding the most beyond the ranks expected from it. False if none may go.
    fn evict(&mut self, source: Option<Source>) -> bool {
        let fresh_from = self.fresh_from;
        let standings: Vec<Standing> = self.held.iter().map(|p| p.standing(fresh_from)).collect();
        let pick = match source {
            Some(source) => oldest_from(&standings, source),
            None => {
                let beyond =
                    |(s, n): (&Source, &usize)| (*s, n.saturating_sub(self.expected_from(*s)));
                victim(&standings, self.per_source.iter().map(beyond))
            }
        };
        let Some(pick) = pick else {
            return false;
        };
        let dropped = self.held.remove(pick);
        release(&mut self.per_source, dropped.source);
        self.tally.count(Instant::now(), Rejection::Room);
        true
    }
}

/// One handshake fewer from `source`.
fn release(per_source: &mut HashMap<Source, usize>, source: Source) {
    if let Some(n) = per_source.get_mut(&source) {
        *n -= 1;
        if *n == 0 {
            per_source.remove(&source);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::RejectReason;
    use crate::handshake::{Connector, MESSAGE_LEN, MessageKind};

    const ROSTER: [u8; 32] = [9; 32];

    fn incoming(acceptor_token: &'static [u8]) -> (Incoming<'static, UnixStream>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let role = Acceptor::new(acceptor_token, ROSTER, 3, 1, 0, [4; 16]);
        let remote = "10.0.0.1:5000".parse().unwrap();
        let far = Instant::now() + Duration::from_secs(3600);
        (Incoming::new(0, ours, role, remote, far), theirs)
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
        let (mut connector, hello) = Connector::start(b"job", ROSTER, 3, 0, 1, [5; 16]);
        neighbour.write_all(&hello.encode()).unwrap();
        let p = waiting(p.step());
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
            channels: 0..1,
        }
    }

    fn sources(lobby: &Lobby<'_>) -> Vec<String> {
        lobby.held.iter().map(|p| p.remote.ip().to_string()).collect()
    }

    #[test]
    fn every_source_holds_at_most_its_share_and_the_neighbours_one_more_for_the_neighbour() {
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
        // Strangers from the neighbour's own address are capped too, one later: the neighbour
        // is still expected from there.
        assert_eq!(neighbour, MAX_PER_SOURCE + 1);
        // Each source's oldest went first: the newest are held.
        let oldest_kept = |ip: &str| {
            let from = lobby.held.iter().filter(|p| p.remote.ip().to_string() == ip);
            from.map(|p| p.remote.port()).min()
        };
        assert_eq!(oldest_kept("10.9.9.9"), Some(1005));
        assert_eq!(oldest_kept("10.0.0.1"), Some(1004));
    }

    /// Finding 1 of the review: a flood from the address a real rank is expected from (or at
    /// the exchange, came from), and floods from 16 other addresses, never drop a rank that
    /// connects from an address of its own, however many turns they go on: at the exchange,
    /// and at a ring listener whose peer connects from behind a NAT (not its advertised
    /// address).
    #[test]
    fn a_rank_holding_one_handshake_outlasts_floods_from_its_peers_address_and_16_others() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        // Rank 1 of 8 expects rank 0 (10.0.0.1) and, as chord peers, ranks 7 and 5.
        let addresses: Vec<SocketAddr> =
            (1..=8).map(|h| format!("10.0.0.{h}:7000").parse().unwrap()).collect();
        let plan = Plan {
            rank: 1,
            world: 8,
            dials: &[2, 3],
            accepts: &[0, 7, 5],
            channels: 0..1,
            ..lobby_plan(&addresses)
        };
        let exchange = Admission { peers: None, ..Admission::ring(&plan) };
        for mut lobby in [Lobby::admitting(exchange, Vec::new()), Lobby::new(&plan)] {
            let mut keep = Vec::new();
            let flood = |n: usize| {
                if n % 5 == 0 {
                    format!("10.0.0.1:{}", 2000 + n % 20_000)
                } else {
                    format!("10.9.0.{}:{}", 1 + n % 16, 2000 + n % 20_000)
                }
            };
            let mut n = 0;
            let mut turn = |lobby: &mut Lobby<'_>,
                            keep: &mut Vec<TcpStream>,
                            real: Option<&str>| {
                let mut script: Vec<_> = real.iter().map(|r| arrival(&server, keep, r)).collect();
                for _ in 0..MAX_ACCEPTS_PER_TURN - script.len() {
                    script.push(arrival(&server, keep, &flood(n)));
                    n += 1;
                }
                assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
                keep.clear(); // the strangers' ends: closing them changes nothing held
            };
            // The floods fill the lobby first.
            for _ in 0..2 * MAX_PENDING / MAX_ACCEPTS_PER_TURN {
                turn(&mut lobby, &mut keep, None);
            }
            assert_eq!(lobby.held.len(), MAX_PENDING, "the floods fill the lobby");
            // A real rank connects from an address of its own; the floods go on, 50 turns more.
            turn(&mut lobby, &mut keep, Some("10.0.0.50:999"));
            for _ in 0..50 {
                turn(&mut lobby, &mut keep, None);
                assert!(
                    lobby.held.iter().any(|p| p.remote.to_string() == "10.0.0.50:999"),
                    "the rank was dropped for room"
                );
                let held = sources(&lobby);
                let from_peer = held.iter().filter(|s| *s == "10.0.0.1").count();
                assert!(from_peer <= MAX_PER_SOURCE + 1, "{from_peer} from rank 0's address");
            }
        }
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
        // Each from its own address: no source's cap is reached.
        let script: std::collections::VecDeque<_> = (0..MAX_ACCEPTS_PER_TURN + 3)
            .map(|i| arrival(&server, &mut keep, &format!("10.1.0.{}:1000", 1 + i)))
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
    fn every_rank_a_ring_with_chords_accepts_is_expected_and_a_stranger_goes_first() {
        // Rank 0 of 8 accepts rank 7 (its left neighbour) and the chord peers 6 and 4.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses: Vec<SocketAddr> =
            (1..=8).map(|h| format!("10.0.0.{h}:7000").parse().unwrap()).collect();
        let plan = Plan {
            rank: 0,
            world: 8,
            dials: &[1, 2],
            accepts: &[7, 6, 4],
            channels: 0..1,
            ..lobby_plan(&addresses)
        };
        let mut lobby = Lobby::new(&plan);
        let mut keep = Vec::new();
        let script = ["10.0.0.8:1", "10.0.0.7:1", "10.0.0.5:1", "10.0.0.9:1", "10.0.0.2:1"]
            .map(|remote| arrival(&server, &mut keep, remote));
        assert_eq!(lobby.accept(&Scripted::new(script)).unwrap(), Accepted::Turn);
        let expected: Vec<usize> =
            lobby.held.iter().map(|p| lobby.expected_from(p.source)).collect();
        // Ranks 7, 6 and 4 are expected; rank 1 (dialled, never accepted) and a stranger not.
        assert_eq!(expected, [1, 1, 1, 0, 0]);
        // Out of room, each source holds one: one holding more than it is expected to gives
        // way first, the oldest of them.
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
        let expected: Vec<usize> =
            lobby.held.iter().map(|p| lobby.expected_from(p.source)).collect();
        assert_eq!(expected, [1, 0]);
    }
}
