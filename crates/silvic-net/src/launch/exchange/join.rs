//! Every other rank's side of the exchange: prove the token to rank 0, send this rank's
//! address, read the list (or the news that another process claims this rank).
//!
//! Every wait ends at one absolute deadline, the caller's (and, for rank 0's answers during the
//! handshake, [`HANDSHAKE_DEADLINE`] after the connection was made): each read and write is
//! given only the time left, so neither a trickle of bytes nor PINGs sent for ever can stretch
//! a wait past it.
//!
//! A join that has not ended warns at growing intervals ([`Reminder`]), saying where it stands:
//! rank 0 not answering (with the last error), or rank 0 holding this rank's address while it
//! waits for the others.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::wire::{
    ABORT, ADDRESS_LEN, DUPLICATE, LIST, MAX_ABORT_TEXT, NO_ROSTER, PING, abort_reason,
    decode_address, encode_address, exchange_key,
};
use crate::error::ConnectError;
use crate::handshake::message::RejectReason;
use crate::handshake::{Claims, Connector, Failure, MESSAGE_LEN, Message, Next, fresh_nonce};
use crate::rendezvous::accept::HANDSHAKE_DEADLINE;
use crate::wait::{Backoff, Reminder};

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

/// Why one attempt did not get the list: retry (rank 0 not up yet, restarting, or too busy to
/// keep this connection) or give up.
enum Attempt {
    Retry(String),
    Fatal(ConnectError),
}

/// Where a join stands, for its warnings (see the module doc).
struct Patience {
    reminder: Reminder,
    /// What the join waits for now.
    stage: String,
}

impl Patience {
    /// Logs a warning if one is due at `now`.
    fn tick(&mut self, plan: &Join<'_>, now: Instant) {
        if let Some(waited) = self.reminder.due(now) {
            warn!(
                "from_env: rank {} has waited {} s for the address exchange at {} ({}); check \
                 that rank 0 is running, and that every rank has the same rendezvous address, \
                 world size and job token",
                plan.rank,
                waited.as_secs(),
                plan.server,
                self.stage
            );
        }
    }
}

/// Sends this rank's address to rank 0 and returns the whole list, retrying the connection
/// until rank 0 serves the exchange or the deadline passes.
pub(crate) fn join(plan: &Join<'_>) -> Result<Vec<SocketAddr>, ConnectError> {
    let key = exchange_key(plan.token);
    let mut backoff = Backoff::new(Backoff::CONNECT);
    let mut last_error = None;
    let patience = RefCell::new(Patience {
        reminder: Reminder::new(Instant::now()),
        stage: "rank 0 has not answered yet".into(),
    });
    loop {
        if crate::cancel::cancelled(None) {
            return Err(ConnectError::Cancelled);
        }
        if Instant::now() >= plan.deadline {
            let last = last_error.as_deref().unwrap_or("none: no time to try");
            return Err(ConnectError::Timeout {
                peer: 0,
                address: plan.server.to_string(),
                waited: plan.timeout,
                waiting_for: format!("to serve the address exchange (last error: {last})"),
            });
        }
        match attempt(plan, &key, &patience) {
            Ok(list) => return Ok(list),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(why)) => {
                debug!(rank = plan.rank, %why, "retrying the address exchange");
                patience.borrow_mut().stage = format!("rank 0 has not answered; last error: {why}");
                last_error = Some(why);
            }
        }
        let gap = backoff.next_gap();
        crate::cancel::sleep(gap.min(plan.deadline.saturating_duration_since(Instant::now())));
        patience.borrow_mut().tick(plan, Instant::now());
    }
}

/// A connection rank 0 closed or reset: it is restarting, or dropped this one for room.
fn lost(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The error a read gives when the cancel armed on this thread trips (`cancel.rs`).
fn cancelled_read() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "cancelled")
}

/// Whether `e` is [`cancelled_read`]'s.
fn is_cancelled(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted && crate::cancel::cancelled(None)
}

/// Reads exactly `buf.len()` bytes before `until`: each read waits at most the time left, and
/// no longer than the next warning `patience` has due, which it then gives, or than a cancel
/// armed on this thread lets it (a tripped one ends the read with [`cancelled_read`]).
fn read_until(
    stream: &mut TcpStream,
    buf: &mut [u8],
    until: Instant,
    plan: &Join<'_>,
    patience: &RefCell<Patience>,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let now = Instant::now();
        patience.borrow_mut().tick(plan, now);
        if crate::cancel::cancelled(Some(now)) {
            return Err(cancelled_read());
        }
        let slice = until.min(patience.borrow().reminder.next_at());
        let slice = crate::cancel::wake_by(Some(slice), now).unwrap_or(slice);
        let left = slice.saturating_duration_since(now);
        if until <= now {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `bytes` before `until`: each write waits at most the time left.
fn write_until(stream: &mut TcpStream, bytes: &[u8], until: Instant) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(&bytes[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn attempt(
    plan: &Join<'_>,
    key: &[u8; 32],
    patience: &RefCell<Patience>,
) -> Result<Vec<SocketAddr>, Attempt> {
    let server = plan.server.to_string();
    let left = plan.deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Attempt::Retry("no time left to connect".into()));
    }
    // A host that drops the connection's packets is tried again after a handshake's time, so
    // the join still warns while it waits.
    let mut stream = TcpStream::connect_timeout(&plan.server, left.min(HANDSHAKE_DEADLINE))
        .map_err(|e| Attempt::Retry(e.to_string()))?;
    // Rank 0 answers a handshake at once: past this, the port is another program's (or rank 0
    // is too busy to take this connection).
    let handshake_until = plan.deadline.min(Instant::now() + HANDSHAKE_DEADLINE);
    let timed_out = |what: &str| {
        Attempt::Fatal(ConnectError::Timeout {
            peer: 0,
            address: server.clone(),
            waited: plan.timeout,
            waiting_for: what.to_string(),
        })
    };
    // A connection lost before the list arrived is tried again; other errors are fatal.
    let io_failure = |e: io::Error, when: &str| {
        if lost(&e) {
            Attempt::Retry(format!("rank 0 closed the connection {when}: {e}"))
        } else {
            Attempt::Fatal(ConnectError::io(0, server.clone(), &e))
        }
    };
    // Reads exactly `buf.len()` bytes before the deadline.
    let read = |stream: &mut TcpStream, buf: &mut [u8], what: &str| -> Result<(), Attempt> {
        match read_until(stream, buf, plan.deadline, plan, patience) {
            Ok(()) => Ok(()),
            Err(e) if is_cancelled(&e) => Err(Attempt::Fatal(ConnectError::Cancelled)),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(timed_out(what)),
            Err(e) => Err(io_failure(e, "before sending the address list")),
        }
    };
    let write = |stream: &mut TcpStream, bytes: &[u8], when: &str| -> Result<(), Attempt> {
        match write_until(stream, bytes, plan.deadline) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                Err(timed_out("to take this rank's bytes"))
            }
            Err(e) => Err(io_failure(e, when)),
        }
    };
    let nonce =
        fresh_nonce().map_err(|e| Attempt::Fatal(ConnectError::io(0, server.clone(), &e)))?;
    let (connector, hello) =
        Connector::start(key, NO_ROSTER, plan.world as u32, plan.rank as u32, 0, nonce);
    let mut connector = connector.blind();
    write(&mut stream, &hello.encode(), "during the handshake")?;
    let mut inbox = [0u8; MESSAGE_LEN];
    let handshake = |reason: String| {
        Attempt::Fatal(ConnectError::Handshake { peer: 0, address: server.clone(), reason })
    };
    loop {
        // A port that stays silent is another program's (or a rank 0 too busy to take this
        // connection): try again, and say so if time runs out.
        match read_until(&mut stream, &mut inbox, handshake_until, plan, patience) {
            Ok(()) => {}
            Err(e) if is_cancelled(&e) => return Err(Attempt::Fatal(ConnectError::Cancelled)),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Attempt::Retry(format!(
                    "no exchange handshake answer within {HANDSHAKE_DEADLINE:?}: is another \
                     program listening on that port?"
                )));
            }
            Err(e) => return Err(io_failure(e, "during the handshake")),
        }
        let message = Message::decode(&inbox).map_err(|e| handshake(e.to_string()))?;
        match connector.on_message(&message) {
            Next::Send(reply) => write(&mut stream, &reply.encode(), "during the handshake")?,
            Next::Done => break,
            Next::SendAndDone(_) => {
                return Err(handshake("a connector never ends by sending".into()));
            }
            Next::Fail(failure, reply) => {
                if let Some(reply) = reply {
                    let _ = write_until(&mut stream, &reply.encode(), handshake_until);
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
    write(&mut stream, &encode_address(plan.own), "during the handshake")?;
    patience.borrow_mut().stage =
        "rank 0 has this rank's address and waits for the other ranks to send theirs".into();
    let mut kind = [0u8; 1];
    loop {
        read(&mut stream, &mut kind, "to send the address list (waiting for the other ranks)")?;
        if kind[0] != PING {
            break;
        }
        // Another process claims this rank: rank 0 asks whether this one is still there.
        write(&mut stream, &[PING], "while asking after this rank")?;
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
        ABORT => {
            let mut len = [0u8; 2];
            read(&mut stream, &mut len, "to say why it gave up")?;
            let len = usize::from(u16::from_be_bytes(len));
            if len > MAX_ABORT_TEXT {
                return Err(handshake(format!(
                    "an abort of {len} bytes (at most {MAX_ABORT_TEXT})"
                )));
            }
            let mut text = vec![0u8; len];
            read(&mut stream, &mut text, "to say why it gave up")?;
            Err(Attempt::Fatal(ConnectError::ExchangeAbandoned {
                address: server.clone(),
                reason: abort_reason(&text),
            }))
        }
        other => Err(handshake(format!("unknown exchange answer {other}"))),
    }
}

fn detail(reason: RejectReason, claims: &Claims, plan: &Join<'_>) -> String {
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
        RejectReason::TokenMismatch => ": check SILVIC_JOB_TOKEN (the same on every rank of \
            the job), and that this port is your job's rank 0's, not another job's"
            .to_string(),
        _ => String::new(),
    }
}
