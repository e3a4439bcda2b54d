//! [`ConnectError`]: why binding or joining a ring failed.
//!
//! Invariants: every variant that involves a peer names its rank and address; messages are
//! lower-case, never contain the job token, and say what was expected where that helps.

use std::{fmt, io, time::Duration};

pub use crate::handshake::message::RejectReason;

/// Why [`crate::TcpCollective::bind`], [`crate::TcpCollective::bind_advertised`],
/// [`crate::TcpCollective::bind_with`], [`crate::TcpCollective::connect`] or
/// [`crate::TcpCollective::from_env`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// An argument is unusable; nothing was opened.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The listener could not be opened.
    #[error("cannot listen on {host}: {message}")]
    Bind {
        /// The host that was asked for.
        host: String,
        /// What the operating system reported.
        kind: io::ErrorKind,
        /// The operating system's message.
        message: String,
    },

    /// Every port of a range is taken on `host`.
    #[error("every port of {first}-{last} is taken on {host}")]
    PortsTaken {
        /// The host or interface that was asked for.
        host: String,
        /// The range's first port.
        first: u16,
        /// The range's last port.
        last: u16,
    },

    /// No network interface of that name has an IP address.
    #[error("no network interface {name:?} with an IP address; there are: {}", available.join(", "))]
    NoInterface {
        /// The name asked for.
        name: String,
        /// The interfaces that have an address.
        available: Vec<String>,
    },

    /// A launcher's environment variable is missing or unusable.
    #[error("{variable}: {message}")]
    Environment {
        /// The variable at fault.
        variable: String,
        /// What is wrong with it.
        message: String,
    },

    /// The rendezvous folder could not be used.
    #[error("rendezvous folder: {path}: {message}")]
    Folder {
        /// The file or folder at fault.
        path: String,
        /// What is wrong with it.
        message: String,
    },

    /// Two processes claim the same rank at the address exchange.
    #[error(
        "two processes claim rank {rank} ({first} and {second}); each rank must be started once"
    )]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
        /// The address of the first claimant.
        first: String,
        /// The address of the second claimant.
        second: String,
    },

    /// Rank 0 gave up the address exchange, for `reason`, while this rank waited for the list.
    #[error("rank 0 at {address} gave up the address exchange: {reason}")]
    ExchangeAbandoned {
        /// Rank 0's exchange address.
        address: String,
        /// Rank 0's own error.
        reason: String,
    },

    /// A handshake with a ring neighbour was refused, by either side, for `reason`.
    #[error("{reason} with rank {peer} at {address}{detail}")]
    Rejected {
        /// The neighbour's rank.
        peer: usize,
        /// The neighbour's address, as the address list gives it.
        address: String,
        /// Why.
        reason: RejectReason,
        /// Both sides' values where they help, such as ": it has 4 ranks, this rank has 3".
        detail: String,
    },

    /// The neighbour's address answered with something that is not a silvic-net handshake.
    #[error("handshake with rank {peer} at {address} failed: {reason}")]
    Handshake {
        /// The neighbour's rank.
        peer: usize,
        /// The neighbour's address.
        address: String,
        /// What was wrong.
        reason: String,
    },

    /// The ring did not form within the timeout.
    #[error("timed out after {waited:?} waiting for rank {peer} at {address} {waiting_for}")]
    Timeout {
        /// The neighbour this rank was still waiting for.
        peer: usize,
        /// The neighbour's address.
        address: String,
        /// The rendezvous timeout.
        waited: Duration,
        /// What was missing, such as "to accept (last error: connection refused)".
        waiting_for: String,
    },

    /// A socket operation failed.
    #[error("i/o error with rank {peer} at {address}: {message}")]
    Io {
        /// The neighbour's rank.
        peer: usize,
        /// The neighbour's address.
        address: String,
        /// What the operating system reported.
        kind: io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::TokenMismatch => "job token mismatch",
            RejectReason::VersionMismatch => "protocol version mismatch",
            RejectReason::WorldMismatch => "world size mismatch",
            RejectReason::WrongRank => "rank mismatch",
            RejectReason::AddressMismatch => "address list mismatch",
        })
    }
}

impl ConnectError {
    /// The one way to build [`ConnectError::Bind`]: `e` met opening a listener for `host`.
    pub(crate) fn bind(host: impl Into<String>, e: &io::Error) -> ConnectError {
        ConnectError::Bind { host: host.into(), kind: e.kind(), message: e.to_string() }
    }

    /// The one way to build [`ConnectError::Io`]: `e` met on the way to rank `peer` at
    /// `address`.
    pub(crate) fn io(peer: usize, address: impl Into<String>, e: &io::Error) -> ConnectError {
        ConnectError::Io { peer, address: address.into(), kind: e.kind(), message: e.to_string() }
    }

    /// The peer rank this error is about, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            ConnectError::Rejected { peer, .. }
            | ConnectError::Handshake { peer, .. }
            | ConnectError::Timeout { peer, .. }
            | ConnectError::Io { peer, .. } => Some(*peer),
            ConnectError::DuplicateRank { rank, .. } => Some(*rank),
            ConnectError::ExchangeAbandoned { .. } => Some(0),
            ConnectError::InvalidArgument(_)
            | ConnectError::Bind { .. }
            | ConnectError::PortsTaken { .. }
            | ConnectError::NoInterface { .. }
            | ConnectError::Environment { .. }
            | ConnectError::Folder { .. } => None,
        }
    }
}
