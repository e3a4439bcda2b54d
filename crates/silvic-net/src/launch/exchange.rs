//! The address exchange: rank 0 serves a port where every other rank sends its ring address
//! and gets the whole list back, for launchers that set variables but gather nothing.
//!
//! One connection per rank `k` to rank 0:
//!
//! ```text
//!  k -> 0  Hello { world, rank k, nonce_k }     the ring handshake's four messages, rank k as
//!  0 -> k  Challenge { world, 0, nonce_0 }      connector and rank 0 as acceptor, keyed with
//!  k -> 0  Proof { mac_k }                      HMAC-SHA256(job token, EXCHANGE_LABEL) so that
//!  0 -> k  Welcome { mac_0 }                    no exchange proof is valid on a ring port
//!  k -> 0  Address                              k's ring address
//!  0 -> k  LIST, world x Address                once every rank has sent one
//!       or DUPLICATE, Address, Address          two live processes claim rank k
//!
//!  Address (19 bytes): | family: 4 or 6 | ip: 16 bytes, IPv4 in the first 4 | port: u16 BE |
//! ```
//!
//! Invariants:
//! - Rank 0 drives every connection from one poll loop, each with its own short handshake
//!   deadline: silent, slow or garbage-sending strangers are dropped without delaying anyone,
//!   and at most [`MAX_PENDING`] are held at once.
//! - A rank is listed only after it proved the token, so a stranger can neither claim a rank
//!   nor learn the list.
//! - A second process claiming a rank whose first claimant's connection is still open is a
//!   duplicate: both are told, and rank 0 fails naming the rank. If the first one's connection
//!   has closed (a rank that restarted before the list was complete), the newcomer takes its
//!   place.
//! - Every wait ends at the caller's deadline; lengths are fixed, so nothing read sizes an
//!   allocation.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use byteorder::{BigEndian, ByteOrder};
use hmac::{Hmac, Mac};
use rustix::event::{PollFd, PollFlags};
use sha2::Sha256;
use tracing::{debug, warn};

use crate::error::ConnectError;
use crate::handshake::{
    Acceptor, Connector, Failure, MAC_LEN, MESSAGE_LEN, Message, MessageKind, Next, RejectReason,
};
use crate::wait::wait as poll_wait;

/// How long one incoming connection has to prove the token and send its address.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The most unproven connections held at once.
const MAX_PENDING: usize = 256;
const FIRST_RETRY: Duration = Duration::from_millis(20);
const MAX_RETRY: Duration = Duration::from_millis(500);
const EXCHANGE_LABEL: &[u8] = b"silvic-net address exchange";
/// The roster both sides bind into their MACs: the exchange runs before any address list
/// exists, so it is fixed (the exchange key already keeps its proofs apart from the ring's).
const NO_ROSTER: [u8; MAC_LEN] = [0; MAC_LEN];

/// Bytes of one address on the wire.
pub(crate) const ADDRESS_LEN: usize = 19;
const LIST: u8 = 1;
const DUPLICATE: u8 = 2;

/// The key the exchange's MACs use: derived from the job token, so an exchange handshake and a
/// ring handshake can never stand in for each other.
pub(crate) fn exchange_key(token: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(EXCHANGE_LABEL);
    mac.finalize().into_bytes().into()
}

/// Encodes an address.
pub(crate) fn encode_address(address: SocketAddr) -> [u8; ADDRESS_LEN] {
    let mut out = [0u8; ADDRESS_LEN];
    match address.ip() {
        IpAddr::V4(ip) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&ip.octets());
        }
    }
    BigEndian::write_u16(&mut out[17..], address.port());
    out
}

/// Decodes an address; `None` for anything that is not one another rank can connect to.
pub(crate) fn decode_address(bytes: &[u8; ADDRESS_LEN]) -> Option<SocketAddr> {
    let ip = match bytes[0] {
        4 if bytes[5..17].iter().all(|&b| b == 0) => {
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[1..5]).ok()?))
        }
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[1..17]).ok()?)),
        _ => return None,
    };
    let port = BigEndian::read_u16(&bytes[17..]);
    (port != 0 && !ip.is_unspecified()).then_some(SocketAddr::new(ip, port))
}

fn nonce() -> io::Result<[u8; 16]> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(nonce)
}

// ---------------------------------------------------------------------------------------------
// Rank 0: the server.

/// Where an incoming connection stands.
enum Stage<'k> {
    /// Waiting for a Hello (which names the rank the acceptor then expects).
    Hello,
    /// Challenge sent, waiting for the proof.
    Proving(Acceptor<'k>),
    /// Proven as `rank`; waiting for its address.
    Address(usize),
    /// Sending a last message (a reject), then closing.
    Closing,
}

struct Pending<'k> {
    stream: TcpStream,
    peer: SocketAddr,
    inbox: [u8; MESSAGE_LEN],
    got: usize,
    outbox: Vec<u8>,
    sent: usize,
    stage: Stage<'k>,
    deadline: Instant,
}

/// A rank that sent its address and waits for the list.
struct Member {
    stream: TcpStream,
    address: SocketAddr,
}

impl Pending<'_> {
    fn need(&self) -> usize {
        match self.stage {
            Stage::Address(_) => ADDRESS_LEN,
            Stage::Closing => 0,
            _ => MESSAGE_LEN,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        write_some(&mut self.stream, &self.outbox, &mut self.sent)
    }

    /// Reads what has arrived; `Ok(true)` once `need()` bytes are in.
    fn fill(&mut self) -> io::Result<bool> {
        let need = self.need();
        while self.got < need {
            match self.stream.read(&mut self.inbox[self.got..need]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(need > 0)
    }

    fn queue(&mut self, bytes: &[u8]) {
        self.outbox.extend_from_slice(bytes);
    }
}

fn write_some(stream: &mut TcpStream, bytes: &[u8], sent: &mut usize) -> io::Result<()> {
    while *sent < bytes.len() {
        match stream.write(&bytes[*sent..]) {
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// True when a member's connection is closed (its process ended) rather than still open.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => true, // a member has nothing more to say: treat chatter as a broken claimant
        Err(e) => e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted,
    }
}

/// Best effort: sends `bytes` on a blocking stream within a short bound, then drops it.
fn tell(mut stream: TcpStream, bytes: &[u8]) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(bytes);
}

fn duplicate_message(first: SocketAddr, second: SocketAddr) -> Vec<u8> {
    let mut out = vec![DUPLICATE];
    out.extend_from_slice(&encode_address(first));
    out.extend_from_slice(&encode_address(second));
    out
}

/// What one turn of the server loop decided for a connection.
enum Outcome {
    Keep,
    Drop(&'static str),
    /// Proven as `rank` at this address.
    Claim(usize, SocketAddr),
}

/// What rank 0 needs to serve the exchange.
#[derive(Debug)]
pub(crate) struct Serve<'a> {
    pub(crate) listener: &'a TcpListener,
    pub(crate) world: usize,
    /// Rank 0's own ring address.
    pub(crate) own: SocketAddr,
    pub(crate) token: &'a [u8],
    pub(crate) deadline: Instant,
    /// The rendezvous timeout, for the error.
    pub(crate) timeout: Duration,
}

/// Serves the exchange until every rank has sent its address; returns the list in rank order,
/// after sending it to every rank.
pub(crate) fn serve(plan: &Serve<'_>) -> Result<Vec<SocketAddr>, ConnectError> {
    let key = exchange_key(plan.token);
    let world = plan.world;
    let listen_address =
        plan.listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let io_error = |peer: usize, address: String, e: io::Error| ConnectError::Io {
        peer,
        address,
        kind: e.kind(),
        message: e.to_string(),
    };
    plan.listener.set_nonblocking(true).map_err(|e| io_error(0, listen_address.clone(), e))?;
    let mut members: Vec<Option<Member>> = (0..world).map(|_| None).collect();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    loop {
        // The list is complete: send it to everyone, each send bounded by the deadline.
        if members.iter().skip(1).all(Option::is_some) {
            let mut list = vec![LIST];
            list.extend_from_slice(&encode_address(plan.own));
            let mut addresses = vec![plan.own];
            for member in members.iter().skip(1).flatten() {
                list.extend_from_slice(&encode_address(member.address));
                addresses.push(member.address);
            }
            for (rank, member) in members.into_iter().enumerate().skip(1) {
                let Some(Member { mut stream, address }) = member else { continue };
                let left = plan.deadline.saturating_duration_since(Instant::now());
                let sent = stream
                    .set_nonblocking(false)
                    .and_then(|()| {
                        stream.set_write_timeout(Some(left.max(Duration::from_millis(1))))
                    })
                    .and_then(|()| stream.write_all(&list));
                if let Err(e) = sent {
                    // Its ring connect will fail and say so; the others can still learn why.
                    warn!(rank, %address, error = %e, "could not send the address list");
                }
            }
            return Ok(addresses);
        }
        let now = Instant::now();
        if now >= plan.deadline {
            let missing: Vec<usize> = (1..world).filter(|&r| members[r].is_none()).collect();
            return Err(ConnectError::Timeout {
                peer: missing[0],
                address: format!("the address exchange on {listen_address}"),
                waited: plan.timeout,
                waiting_for: format!("to send its address (ranks {missing:?} are missing)"),
            });
        }
        pending.retain(|p| {
            let live = p.deadline > now;
            if !live {
                warn!(peer = %p.peer, "exchange: dropped a connection that did not finish in time");
            }
            live
        });

        let next_deadline = pending.iter().map(|p| p.deadline).min().unwrap_or(plan.deadline);
        let mut fds = Vec::with_capacity(1 + pending.len() + world);
        fds.push(PollFd::new(plan.listener, PollFlags::IN));
        for p in &pending {
            let mut flags = PollFlags::IN;
            if p.sent < p.outbox.len() {
                flags |= PollFlags::OUT;
            }
            fds.push(PollFd::new(&p.stream, flags));
        }
        for m in members.iter().flatten() {
            fds.push(PollFd::new(&m.stream, PollFlags::IN));
        }
        poll_wait(&mut fds, Some(next_deadline.min(plan.deadline)))
            .map_err(|e| io_error(0, listen_address.clone(), e))?;
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);

        // Members whose connection shows anything have left (a rank that died): free the slot.
        let mut at = 1 + pending.len();
        for (rank, slot) in members.iter_mut().enumerate() {
            if let Some(member) = slot {
                if ready[at] && closed(&mut member.stream) {
                    warn!(rank, address = %member.address, "exchange: a rank left before the list was complete");
                    *slot = None;
                }
                at += 1;
            }
        }

        let mut claims = Vec::new();
        let mut index = 0;
        pending.retain_mut(|p| {
            index += 1;
            if !ready[index] {
                return true;
            }
            match step(p, &key, world) {
                Outcome::Keep => true,
                Outcome::Drop(why) => {
                    warn!(peer = %p.peer, why, "exchange: dropped a connection");
                    false
                }
                Outcome::Claim(rank, address) => {
                    let stream = p.stream.try_clone();
                    match stream {
                        Ok(stream) => claims.push((rank, Member { stream, address })),
                        Err(e) => warn!(peer = %p.peer, error = %e, "exchange: lost a claimant"),
                    }
                    false
                }
            }
        });
        for (rank, newcomer) in claims {
            claim(&mut members, rank, newcomer, plan.own)?;
        }

        if ready[0] {
            accept_all(plan.listener, &mut pending)?;
        }
    }
}

/// Records `newcomer` as `rank`, or fails the exchange when another live process holds it.
fn claim(
    members: &mut [Option<Member>],
    rank: usize,
    newcomer: Member,
    own: SocketAddr,
) -> Result<(), ConnectError> {
    if rank == 0 {
        tell(newcomer.stream, &duplicate_message(own, newcomer.address));
        return Err(ConnectError::DuplicateRank {
            rank,
            first: own.to_string(),
            second: newcomer.address.to_string(),
        });
    }
    if let Some(old) = &mut members[rank] {
        if !closed(&mut old.stream) {
            let message = duplicate_message(old.address, newcomer.address);
            let old = members[rank].take().expect("checked above");
            let error = ConnectError::DuplicateRank {
                rank,
                first: old.address.to_string(),
                second: newcomer.address.to_string(),
            };
            tell(old.stream, &message);
            tell(newcomer.stream, &message);
            return Err(error);
        }
        debug!(rank, "exchange: a restarted rank takes its place");
    }
    let _ = newcomer.stream.set_nonblocking(true);
    members[rank] = Some(newcomer);
    Ok(())
}

fn accept_all(listener: &TcpListener, pending: &mut Vec<Pending<'_>>) -> Result<(), ConnectError> {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if pending.len() >= MAX_PENDING {
                    // Drop the oldest that has not yet shown a Hello, else the oldest.
                    let victim =
                        pending.iter().position(|p| matches!(p.stage, Stage::Hello)).unwrap_or(0);
                    let dropped = pending.remove(victim);
                    warn!(peer = %dropped.peer, "exchange: too many connections; dropped the oldest");
                }
                pending.push(Pending {
                    stream,
                    peer,
                    inbox: [0; MESSAGE_LEN],
                    got: 0,
                    outbox: Vec::new(),
                    sent: 0,
                    stage: Stage::Hello,
                    deadline: Instant::now() + HANDSHAKE_DEADLINE,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A connection that failed before it was accepted, or a shortage of descriptors:
            // neither ends the exchange; the loop comes back when the listener is ready again.
            Err(e) => {
                warn!(error = %e, "exchange: accept failed");
                return Ok(());
            }
        }
    }
}

/// Moves one connection on as far as its bytes allow.
fn step<'k>(p: &mut Pending<'k>, key: &'k [u8; 32], world: usize) -> Outcome {
    if let Err(e) = p.flush() {
        return if matches!(p.stage, Stage::Closing) {
            Outcome::Drop("closed")
        } else {
            drop_io(e)
        };
    }
    if matches!(p.stage, Stage::Closing) {
        return if p.sent == p.outbox.len() { Outcome::Drop("refused") } else { Outcome::Keep };
    }
    loop {
        match p.fill() {
            Ok(true) => {}
            Ok(false) => return Outcome::Keep,
            Err(e) => return drop_io(e),
        }
        p.got = 0;
        if let Stage::Address(rank) = p.stage {
            let bytes: [u8; ADDRESS_LEN] = p.inbox[..ADDRESS_LEN].try_into().expect("19 bytes");
            return match decode_address(&bytes) {
                Some(address) => Outcome::Claim(rank, address),
                None => Outcome::Drop("sent an address no rank can connect to"),
            };
        }
        let message = match Message::decode(&p.inbox) {
            Ok(m) => m,
            Err(_) => return Outcome::Drop("not a silvic-net handshake"),
        };
        let next = match &mut p.stage {
            Stage::Hello => {
                if message.kind != MessageKind::Hello {
                    return Outcome::Drop("did not open with a Hello");
                }
                // The Hello names the rank; an acceptor expecting a rank outside the world
                // refuses it with WrongRank.
                let claimed = message.rank as usize;
                let expected = if claimed < world { message.rank } else { u32::MAX };
                let Ok(nonce) = nonce() else { return Outcome::Drop("no random nonce") };
                let mut acceptor = Acceptor::new(key, NO_ROSTER, world as u32, 0, expected, nonce);
                let next = acceptor.on_message(&message);
                p.stage = Stage::Proving(acceptor);
                next
            }
            Stage::Proving(acceptor) => acceptor.on_message(&message),
            Stage::Address(_) | Stage::Closing => unreachable!("handled above"),
        };
        match next {
            Next::Send(reply) => p.queue(&reply.encode()),
            Next::SendAndDone(reply) => {
                p.queue(&reply.encode());
                p.stage = Stage::Address(message.rank as usize);
            }
            Next::Done => p.stage = Stage::Address(message.rank as usize),
            Next::Fail(failure, reply) => {
                warn!(peer = %p.peer, ?failure, rank = message.rank, "exchange: refused a connection");
                match reply {
                    Some(reply) => {
                        p.queue(&reply.encode());
                        p.stage = Stage::Closing;
                    }
                    None => return Outcome::Drop("refused"),
                }
            }
        }
        if let Err(e) = p.flush() {
            return drop_io(e);
        }
        if matches!(p.stage, Stage::Closing) {
            return Outcome::Keep;
        }
    }
}

fn drop_io(e: io::Error) -> Outcome {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Outcome::Drop("closed")
    } else {
        Outcome::Drop("i/o error")
    }
}

// ---------------------------------------------------------------------------------------------
// Every other rank: the client.

/// What rank `rank` needs to join the exchange.
#[derive(Debug)]
pub(crate) struct Join<'a> {
    /// Rank 0's exchange address.
    pub(crate) server: SocketAddr,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// This rank's own ring address.
    pub(crate) own: SocketAddr,
    pub(crate) token: &'a [u8],
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
}

/// Why one attempt did not get the list: retry (rank 0 not up yet) or give up.
enum Attempt {
    Retry(String),
    Fatal(ConnectError),
}

/// Sends this rank's address to rank 0 and returns the whole list, retrying the connection
/// until rank 0 serves the exchange or the deadline passes.
pub(crate) fn join(plan: &Join<'_>) -> Result<Vec<SocketAddr>, ConnectError> {
    let key = exchange_key(plan.token);
    let mut backoff = FIRST_RETRY;
    loop {
        let last_error = match attempt(plan, &key) {
            Ok(list) => return Ok(list),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(why)) => why,
        };
        let left = plan.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectError::Timeout {
                peer: 0,
                address: plan.server.to_string(),
                waited: plan.timeout,
                waiting_for: format!("to serve the address exchange (last error: {last_error})"),
            });
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_RETRY);
    }
}

fn attempt(plan: &Join<'_>, key: &[u8; 32]) -> Result<Vec<SocketAddr>, Attempt> {
    let server = plan.server.to_string();
    let left = || plan.deadline.saturating_duration_since(Instant::now());
    if left().is_zero() {
        return Err(Attempt::Retry("no time left".into()));
    }
    let mut stream = TcpStream::connect_timeout(&plan.server, left())
        .map_err(|e| Attempt::Retry(e.to_string()))?;
    let timed_out = |what: &str| {
        Attempt::Fatal(ConnectError::Timeout {
            peer: 0,
            address: server.clone(),
            waited: plan.timeout,
            waiting_for: what.to_string(),
        })
    };
    let fatal_io = |e: io::Error| {
        Attempt::Fatal(ConnectError::Io {
            peer: 0,
            address: server.clone(),
            kind: e.kind(),
            message: e.to_string(),
        })
    };
    // Reads exactly `buf.len()` bytes before the deadline.
    let read = |stream: &mut TcpStream, buf: &mut [u8], what: &str| -> Result<(), Attempt> {
        stream.set_read_timeout(Some(left().max(Duration::from_millis(1)))).map_err(fatal_io)?;
        match stream.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(timed_out(what))
            }
            Err(e) => Err(fatal_io(e)),
        }
    };
    let _ = stream.set_write_timeout(Some(left().max(Duration::from_millis(1))));
    let nonce = nonce().map_err(fatal_io)?;
    let (mut connector, hello) =
        Connector::start(key, NO_ROSTER, plan.world as u32, plan.rank as u32, 0, nonce);
    stream.write_all(&hello.encode()).map_err(|e| Attempt::Retry(e.to_string()))?;
    let mut inbox = [0u8; MESSAGE_LEN];
    let handshake = |reason: String| {
        Attempt::Fatal(ConnectError::Handshake { peer: 0, address: server.clone(), reason })
    };
    let mut first = true;
    loop {
        match read(&mut stream, &mut inbox, "to answer the exchange handshake") {
            // Rank 0 closed before answering: it may be starting over; try again.
            Err(Attempt::Fatal(ConnectError::Io { kind, message, .. }))
                if first
                    && matches!(
                        kind,
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                    ) =>
            {
                return Err(Attempt::Retry(message));
            }
            other => other?,
        }
        first = false;
        let message = Message::decode(&inbox).map_err(|e| handshake(e.to_string()))?;
        match connector.on_message(&message) {
            Next::Send(reply) => stream.write_all(&reply.encode()).map_err(fatal_io)?,
            Next::Done => break,
            Next::SendAndDone(_) => unreachable!("a connector never ends by sending"),
            Next::Fail(failure, reply) => {
                if let Some(reply) = reply {
                    let _ = stream.write_all(&reply.encode());
                }
                let claims = connector.peer_claims.unwrap_or_default();
                return Err(match failure {
                    Failure::Refused(reason) | Failure::RefusedBy(reason) => {
                        Attempt::Fatal(ConnectError::Rejected {
                            peer: 0,
                            address: server.clone(),
                            reason,
                            detail: detail(reason, &claims, plan),
                        })
                    }
                    Failure::Protocol(why) => handshake(why.to_string()),
                });
            }
        }
    }
    stream.write_all(&encode_address(plan.own)).map_err(fatal_io)?;
    let mut kind = [0u8; 1];
    match read(&mut stream, &mut kind, "to send the address list (waiting for the other ranks)") {
        Err(Attempt::Fatal(ConnectError::Io { kind: io::ErrorKind::UnexpectedEof, .. })) => {
            return Err(handshake(
                "rank 0 closed the exchange before sending the address list; its own error \
                 says why"
                    .into(),
            ));
        }
        other => other?,
    }
    let mut address = [0u8; ADDRESS_LEN];
    match kind[0] {
        LIST => {
            let mut list = Vec::with_capacity(plan.world);
            for rank in 0..plan.world {
                read(&mut stream, &mut address, "to send the whole address list")?;
                let entry = decode_address(&address).ok_or_else(|| {
                    handshake(format!("the list holds an unusable address for rank {rank}"))
                })?;
                list.push(entry);
            }
            if list[plan.rank] != plan.own {
                return Err(handshake(format!(
                    "the list gives rank {} the address {}, not this rank's {}",
                    plan.rank, list[plan.rank], plan.own
                )));
            }
            Ok(list)
        }
        DUPLICATE => {
            let mut other = [0u8; ADDRESS_LEN];
            read(&mut stream, &mut address, "to say which processes claim this rank")?;
            read(&mut stream, &mut other, "to say which processes claim this rank")?;
            let show = |b: &[u8; ADDRESS_LEN]| {
                decode_address(b).map_or_else(|| "?".to_string(), |a| a.to_string())
            };
            Err(Attempt::Fatal(ConnectError::DuplicateRank {
                rank: plan.rank,
                first: show(&address),
                second: show(&other),
            }))
        }
        other => Err(handshake(format!("unknown exchange answer {other}"))),
    }
}

fn detail(reason: RejectReason, claims: &crate::handshake::Claims, plan: &Join<'_>) -> String {
    match reason {
        RejectReason::WorldMismatch if claims.world != 0 => format!(
            ": rank 0 has a world of {}, this rank {} (check the world size variables)",
            claims.world, plan.world
        ),
        // A refusal tells only its reason, not the refusing rank's world.
        RejectReason::WorldMismatch => {
            format!(": this rank has a world of {} (check the world size variables)", plan.world)
        }
        RejectReason::WrongRank => {
            format!(": rank {} is outside the world of {}", plan.rank, plan.world)
        }
        RejectReason::TokenMismatch => ": check SILVIC_JOB_TOKEN".to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn addresses_round_trip_and_unusable_ones_are_refused() {
        for text in ["10.0.0.5:29500", "[fd00::7]:1", "127.0.0.1:65535"] {
            let a: SocketAddr = text.parse().unwrap();
            assert_eq!(decode_address(&encode_address(a)), Some(a));
        }
        let good = encode_address("10.0.0.5:29500".parse().unwrap());
        let mut bad = good;
        bad[0] = 5;
        assert_eq!(decode_address(&bad), None);
        let mut bad = good;
        bad[9] = 1; // IPv4 with bytes past its four
        assert_eq!(decode_address(&bad), None);
        assert_eq!(decode_address(&encode_address("0.0.0.0:1".parse().unwrap())), None);
        assert_eq!(decode_address(&encode_address("10.0.0.5:0".parse().unwrap())), None);
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    /// Rank 0 serving a world of `world` on loopback, in a thread, for `timeout`.
    fn server(
        world: usize,
        timeout: Duration,
    ) -> (SocketAddr, thread::JoinHandle<Result<Vec<SocketAddr>, ConnectError>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            serve(&Serve {
                listener: &listener,
                world,
                own: addr("10.0.0.1:100"),
                token: b"t",
                deadline: Instant::now() + timeout,
                timeout,
            })
        });
        (at, handle)
    }

    fn joiner(
        server: SocketAddr,
        rank: usize,
        world: usize,
        own: SocketAddr,
        token: &'static [u8],
    ) -> thread::JoinHandle<Result<Vec<SocketAddr>, ConnectError>> {
        let timeout = Duration::from_secs(20);
        thread::spawn(move || {
            join(&Join {
                server,
                rank,
                world,
                own,
                token,
                deadline: Instant::now() + timeout,
                timeout,
            })
        })
    }

    /// Proves the token as `rank` and sends `own`, then returns the open stream (a rank that
    /// joined and waits for the list).
    fn claim_by_hand(server: SocketAddr, rank: u32, world: u32, own: SocketAddr) -> TcpStream {
        let key = exchange_key(b"t");
        let mut stream = TcpStream::connect(server).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (mut connector, hello) = Connector::start(&key, NO_ROSTER, world, rank, 0, [5; 16]);
        stream.write_all(&hello.encode()).unwrap();
        let mut inbox = [0u8; MESSAGE_LEN];
        loop {
            stream.read_exact(&mut inbox).unwrap();
            match connector.on_message(&Message::decode(&inbox).unwrap()) {
                Next::Send(m) => stream.write_all(&m.encode()).unwrap(),
                Next::Done => break,
                other => panic!("handshake: {other:?}"),
            }
        }
        stream.write_all(&encode_address(own)).unwrap();
        stream
    }

    #[test]
    fn a_rank_that_restarts_before_the_list_is_complete_takes_its_place() {
        let (at, server) = server(3, Duration::from_secs(20));
        // The first life of rank 1 joins, then dies (its connection closes).
        drop(claim_by_hand(at, 1, 3, addr("10.0.0.2:200")));
        let second_life = joiner(at, 1, 3, addr("10.0.0.2:201"), b"t");
        let rank2 = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        let expected = vec![addr("10.0.0.1:100"), addr("10.0.0.2:201"), addr("10.0.0.3:300")];
        assert_eq!(server.join().unwrap().unwrap(), expected);
        assert_eq!(second_life.join().unwrap().unwrap(), expected);
        assert_eq!(rank2.join().unwrap().unwrap(), expected);
    }

    #[test]
    fn a_live_second_claimant_is_refused_with_the_first_and_both_are_told() {
        let (at, server) = server(3, Duration::from_secs(20));
        let mut first = claim_by_hand(at, 2, 3, addr("10.0.0.3:300"));
        let second = joiner(at, 2, 3, addr("10.0.0.4:400"), b"t");
        let e = second.join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "two processes claim rank 2 (10.0.0.3:300 and 10.0.0.4:400); each rank must be \
             started once"
        );
        assert_eq!(server.join().unwrap().unwrap_err(), e);
        let mut answer = [0u8; 1 + 2 * ADDRESS_LEN];
        first.read_exact(&mut answer).unwrap();
        assert_eq!(answer[0], DUPLICATE);
    }

    #[test]
    fn another_world_or_token_is_refused_by_rank_0_naming_it() {
        let (at, server) = server(3, Duration::from_secs(20));
        let e = joiner(at, 1, 4, addr("10.0.0.2:200"), b"t").join().unwrap().unwrap_err();
        assert!(e.to_string().starts_with("world size mismatch with rank 0"), "{e}");
        assert!(e.to_string().contains("this rank has a world of 4"), "{e}");
        let e = joiner(at, 1, 3, addr("10.0.0.2:200"), b"u").join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("job token mismatch with rank 0 at {at}: check SILVIC_JOB_TOKEN")
        );
        let e = joiner(at, 5, 3, addr("10.0.0.2:200"), b"t").join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("rank mismatch with rank 0 at {at}: rank 5 is outside the world of 3")
        );
        // The refusals left rank 0 serving: the real ranks still get the list.
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        let two = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        assert_eq!(server.join().unwrap().unwrap().len(), 3);
        assert_eq!(one.join().unwrap().unwrap().len(), 3);
        assert_eq!(two.join().unwrap().unwrap().len(), 3);
    }

    #[test]
    fn the_exchange_key_is_not_the_token_and_depends_on_it() {
        assert_ne!(exchange_key(b"a"), exchange_key(b"b"));
        assert_ne!(&exchange_key(b"a")[..1], b"a");
    }
}
