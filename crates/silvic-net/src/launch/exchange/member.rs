//! A rank waiting at rank 0's exchange for the list: its connection, kept alive by TCP
//! keepalive (a host that died is noticed, and its rank freed for a restart), what rank 0 hears
//! on it ([`listen_to`]) and a last word before it is closed ([`tell`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};
use tracing::debug;

use super::wire::PING;
use crate::wait::nonblocking;

/// Keepalive on a member's connection: a rank whose host died is noticed within about
/// `idle + retries x interval`, rather than holding its rank until the deadline.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_RETRIES: u32 = 3;

/// A rank that sent its address and waits for the list.
pub(super) struct Member {
    pub(super) stream: TcpStream,
    pub(super) address: SocketAddr,
    /// Another process claims this rank: it waits here while this one is asked (a [`PING`])
    /// whether it is still there, until the instant given.
    pub(super) contender: Option<(Box<Member>, Instant)>,
}

impl Member {
    pub(super) fn new(stream: TcpStream, address: SocketAddr) -> Member {
        // A member says nothing until the list: keepalive notices a host that died meanwhile.
        let keepalive = TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES);
        if let Err(e) = SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            debug!(%address, error = %e, "exchange: no keepalive on a member");
        }
        Member { stream, address, contender: None }
    }
}

/// What a member's connection showed.
pub(super) enum Heard {
    Nothing,
    /// Its answer to a [`PING`].
    Pong,
    /// Closed, broken, or saying what a waiting rank never says.
    Gone,
}

pub(super) fn listen_to(stream: &mut TcpStream) -> Heard {
    let mut byte = [0u8; 1];
    match nonblocking(|| stream.read(&mut byte)) {
        Ok(None) => Heard::Nothing,
        Ok(Some(1)) if byte[0] == PING => Heard::Pong,
        _ => Heard::Gone,
    }
}

/// Best effort, without waiting: a last message to a rank rank 0 is about to close. The
/// socket's buffer is empty (a member is sent nothing before), so the bytes fit.
pub(super) fn tell(mut stream: TcpStream, bytes: &[u8]) {
    let _ = nonblocking(|| stream.write(bytes));
}
