//! Rank 0's side of the exchange: one poll loop over the listener, the connections still
//! proving the token, and the ranks that wait for the list.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use tracing::{debug, warn};

use super::wire::{
    ADDRESS_LEN, LIST, NO_ROSTER, decode_address, duplicate_message, encode_address, exchange_key,
};
use crate::error::ConnectError;
use crate::handshake::{Acceptor, MESSAGE_LEN, Message, MessageKind, Next, fresh_nonce};
use crate::wait::{nonblocking, wait as poll_wait};

/// How long one incoming connection has to prove the token and send its address.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The most unproven connections held at once.
const MAX_PENDING: usize = 256;

/// Where an incoming connection stands.
enum Stage<'k> {
    /// Waiting for a Hello (which names the rank the acceptor then expects).
    Hello,
    /// Challenge sent, waiting for the proof of the rank the Hello claimed.
    Proving(Acceptor<'k>, usize),
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
            match nonblocking(|| self.stream.read(&mut self.inbox[self.got..need]))? {
                Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(n) => self.got += n,
                None => return Ok(false),
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
        match nonblocking(|| stream.write(&bytes[*sent..]))? {
            Some(n) => *sent += n,
            None => break,
        }
    }
    Ok(())
}

/// True when a member's connection is closed (its process ended) rather than still open.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    // A member has nothing more to say: chatter, like a close or an error, is a broken claimant.
    !matches!(nonblocking(|| stream.read(&mut byte)), Ok(None))
}

/// Best effort: sends `bytes` on a blocking stream within a short bound, then drops it.
fn tell(mut stream: TcpStream, bytes: &[u8]) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(bytes);
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
    plan.listener
        .set_nonblocking(true)
        .map_err(|e| ConnectError::io(0, listen_address.clone(), &e))?;
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
            .map_err(|e| ConnectError::io(0, listen_address.clone(), &e))?;
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
        match nonblocking(|| listener.accept()) {
            Ok(Some((stream, peer))) => {
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
            Ok(None) => return Ok(()),
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
                let Ok(nonce) = fresh_nonce() else { return Outcome::Drop("no random nonce") };
                let mut acceptor = Acceptor::new(key, NO_ROSTER, world as u32, 0, expected, nonce);
                let next = acceptor.on_message(&message);
                p.stage = Stage::Proving(acceptor, claimed);
                next
            }
            Stage::Proving(acceptor, _) => acceptor.on_message(&message),
            Stage::Address(_) | Stage::Closing => unreachable!("handled above"),
        };
        match next {
            Next::Send(reply) => p.queue(&reply.encode()),
            // The rank proven is the Hello's, which the MAC covers (the acceptor refuses a
            // Proof that does not repeat it), never a field of a later message.
            Next::SendAndDone(reply) => {
                p.queue(&reply.encode());
                let Stage::Proving(_, rank) = p.stage else { unreachable!("welcomed in Proving") };
                p.stage = Stage::Address(rank);
            }
            Next::Done => return Outcome::Drop("an acceptor never ends without a Welcome"),
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
