//! What one rank needs to join the ring ([`Plan`]): who it is, every rank's address, the token,
//! the bound, and whom it dials and accepts. Shared by the dialling and the accepting sides.
//!
//! Invariants: the token is never shown (`Debug` leaves it out).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::error::ConnectError;

/// What one rank needs to join the ring.
pub(crate) struct Plan<'a> {
    /// This rank.
    pub(crate) rank: usize,
    /// The number of ranks, `addresses.len()`.
    pub(crate) world: usize,
    /// Every rank's advertised address, in rank order, the same on every rank.
    pub(crate) addresses: &'a [SocketAddr],
    /// The job token: keys the MACs, never sent, never logged.
    pub(crate) token: &'a [u8],
    /// The whole rendezvous's bound.
    pub(crate) timeout: Duration,
    /// [`crate::handshake::roster_digest`] of `addresses`.
    pub(crate) roster: [u8; 32],
    /// The ranks this rank dials, the right neighbour first.
    pub(crate) dials: &'a [usize],
    /// The ranks this rank accepts, the left neighbour first.
    pub(crate) accepts: &'a [usize],
    /// The channels whose streams this rendezvous forms: one to each rank dialled and from
    /// each rank accepted per channel (`0..1` when a ring forms; its further channels' after
    /// it has measured itself, `channels.rs`).
    pub(crate) channels: std::ops::Range<u16>,
}

/// Leaves the token out: a Plan may end up in a debug line, the token never.
impl std::fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("addresses", &self.addresses)
            .field("timeout", &self.timeout)
            .field("dials", &self.dials)
            .field("accepts", &self.accepts)
            .field("channels", &self.channels)
            .finish_non_exhaustive()
    }
}

impl Plan<'_> {
    pub(super) fn io_error(&self, peer: usize, e: &io::Error) -> ConnectError {
        ConnectError::io(peer, self.addresses[peer].to_string(), e)
    }
}
