//! [`ConnectError`]: why binding or joining a ring failed.
//!
//! Invariants: every variant that involves a peer names its rank and address; messages are
//! lower-case, never contain the job token, and say what was expected where that helps.

use std::{fmt, io, time::Duration};

use silvic_core::{CollectiveError, RoundedDuration};

use crate::handshake::message::RejectReason;

/// Why `TcpCollective::bind`, `bind_advertised`, `bind_with`, `connect` or `from_env` failed.
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
    #[error("{} taken on {host}", ports_taken(*first, *last))]
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
    #[error(
        "timed out after {} waiting for rank {peer} at {address} {waiting_for}",
        RoundedDuration(*waited)
    )]
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

    /// The launcher's rendezvous (a folder, or rank 0's address exchange) did not hear from
    /// every rank within the timeout. Those ranks gave no address, so none is named.
    #[error(
        "timed out after {} at the rendezvous {rendezvous}: ranks {missing:?} never gave \
         their addresses{detail}",
        RoundedDuration(*waited)
    )]
    RendezvousTimeout {
        /// Where ranks meet: the folder, or the address rank 0 serves the exchange on.
        rendezvous: String,
        /// The ranks not heard from, in rank order; never empty.
        missing: Vec<usize>,
        /// The rendezvous timeout.
        waited: Duration,
        /// What else is known of the missing ranks (a connection claiming one was refused, and
        /// why), each part starting with "; " or " ("; empty if nothing.
        detail: String,
    },

    /// The ranks were started with different values of a setting every rank must share (such as
    /// `SILVIC_ALLREDUCE`): found when the ring formed, by every rank alike, so `connect` fails
    /// on every rank with the same error.
    #[error("{setting} differs between ranks: {detail}")]
    Disagreement {
        /// The setting: the variable that sets it.
        setting: String,
        /// The ranks whose value differs from the most common one, in rank order; never empty.
        ranks: Vec<usize>,
        /// Each of those ranks' value, and the most common value and its ranks.
        detail: String,
    },

    /// This rank's caller cancelled the start while it waited (a
    /// [`Cancel`](crate::Cancel) another thread tripped, or a signal such as Ctrl-C in Python).
    #[error("the start was cancelled by its caller")]
    Cancelled,

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

impl RejectReason {
    /// A stable name for the reason, for programs (and the Python binding's `reason`):
    /// `"token_mismatch"`, `"version_mismatch"`, `"world_mismatch"`, `"wrong_rank"` or
    /// `"address_mismatch"`. [`Display`](fmt::Display) is the sentence for people.
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::TokenMismatch => "token_mismatch",
            RejectReason::VersionMismatch => "version_mismatch",
            RejectReason::WorldMismatch => "world_mismatch",
            RejectReason::WrongRank => "wrong_rank",
            RejectReason::AddressMismatch => "address_mismatch",
        }
    }
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

    /// A stable name for the variant, for programs that branch on it without matching (the
    /// Python binding's `kind`): the variant's name in snake case, such as `"rejected"` or
    /// `"ports_taken"`, except that [`ConnectError::RendezvousTimeout`] is a `"timeout"` too.
    /// A name, once given, is never changed or reused.
    ///
    /// Like [`CollectiveError::kind`](crate::CollectiveError::kind), a `&'static str` rather
    /// than a second enum: a Rust caller who wants exhaustiveness matches the error itself.
    pub fn kind(&self) -> &'static str {
        match self {
            ConnectError::InvalidArgument(_) => "invalid_argument",
            ConnectError::Bind { .. } => "bind",
            ConnectError::PortsTaken { .. } => "ports_taken",
            ConnectError::NoInterface { .. } => "no_interface",
            ConnectError::Environment { .. } => "environment",
            ConnectError::Folder { .. } => "folder",
            ConnectError::DuplicateRank { .. } => "duplicate_rank",
            ConnectError::ExchangeAbandoned { .. } => "exchange_abandoned",
            ConnectError::Rejected { .. } => "rejected",
            ConnectError::Handshake { .. } => "handshake",
            ConnectError::Timeout { .. } | ConnectError::RendezvousTimeout { .. } => "timeout",
            ConnectError::Io { .. } => "io",
            ConnectError::Disagreement { .. } => "disagreement",
            ConnectError::Cancelled => "cancelled",
        }
    }

    /// The network address (`"ip:port"` or `"host:port"`) of the peer this error is about, if
    /// it has one: never a path or a sentence.
    pub fn address(&self) -> Option<&str> {
        match self {
            ConnectError::Rejected { address, .. }
            | ConnectError::Handshake { address, .. }
            | ConnectError::Timeout { address, .. }
            | ConnectError::Io { address, .. }
            | ConnectError::ExchangeAbandoned { address, .. } => Some(address),
            ConnectError::InvalidArgument(_)
            | ConnectError::Bind { .. }
            | ConnectError::PortsTaken { .. }
            | ConnectError::NoInterface { .. }
            | ConnectError::Environment { .. }
            | ConnectError::Folder { .. }
            | ConnectError::DuplicateRank { .. }
            | ConnectError::RendezvousTimeout { .. }
            | ConnectError::Disagreement { .. }
            | ConnectError::Cancelled => None,
        }
    }

    /// The peer rank this error is about, if any: for [`ConnectError::RendezvousTimeout`], the
    /// first rank missing; for [`ConnectError::Disagreement`], the first rank that differs.
    pub fn peer(&self) -> Option<usize> {
        match self {
            ConnectError::Rejected { peer, .. }
            | ConnectError::Handshake { peer, .. }
            | ConnectError::Timeout { peer, .. }
            | ConnectError::Io { peer, .. } => Some(*peer),
            ConnectError::DuplicateRank { rank, .. } => Some(*rank),
            ConnectError::RendezvousTimeout { missing, .. } => missing.first().copied(),
            ConnectError::Disagreement { ranks, .. } => ranks.first().copied(),
            ConnectError::ExchangeAbandoned { .. } => Some(0),
            ConnectError::InvalidArgument(_)
            | ConnectError::Bind { .. }
            | ConnectError::PortsTaken { .. }
            | ConnectError::NoInterface { .. }
            | ConnectError::Environment { .. }
            | ConnectError::Folder { .. }
            | ConnectError::Cancelled => None,
        }
    }
}

/// A failure as rank `rank` reports it to its caller: `peer()` names another rank, never
/// `rank` (SPEC). An abort relayed from `origin` whose cause names this rank (the origin found
/// this rank's buffer of another length, or this rank in another call) becomes the same
/// mismatch seen from here, naming the origin; a frame of this rank the origin refused (one of
/// another path) becomes a malformed frame naming the origin, with its reason; any other cause
/// naming this rank (the origin timed out on it, or lost its stream) becomes the origin closing
/// its streams to this rank, the one thing this rank saw of it (the origin's own error is in
/// the log line before). Every other error is kept as it is.
pub(crate) fn as_seen_by(rank: usize, error: CollectiveError) -> CollectiveError {
    let CollectiveError::Aborted { origin, cause } = error else {
        return error;
    };
    if cause.peer() != Some(rank) || origin == rank {
        return CollectiveError::Aborted { origin, cause };
    }
    match *cause {
        CollectiveError::LengthMismatch { expected, got, .. } => {
            CollectiveError::LengthMismatch { peer: origin, expected: got, got: expected }
        }
        CollectiveError::OutOfStep { expected_op, expected_seq, got_op, got_seq, .. } => {
            CollectiveError::OutOfStep {
                peer: origin,
                expected_op: got_op,
                expected_seq: got_seq,
                got_op: expected_op,
                got_seq: expected_seq,
            }
        }
        CollectiveError::MalformedFrame { reason, .. } => CollectiveError::MalformedFrame {
            peer: origin,
            reason: format!("rank {origin} refused a frame of this rank: {reason}"),
        },
        _ => CollectiveError::PeerClosed { peer: origin },
    }
}

/// A port range as its error says it: one port as one port.
fn ports_taken(first: u16, last: u16) -> String {
    if first == last {
        format!("port {first} is")
    } else {
        format!("every port of {first}-{last} is")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_of_each() -> Vec<ConnectError> {
        let addressed = "10.0.0.7:41231".to_string();
        vec![
            ConnectError::InvalidArgument("x".into()),
            ConnectError::bind("0.0.0.0", &io::Error::from(io::ErrorKind::AddrInUse)),
            ConnectError::PortsTaken { host: "h".into(), first: 1, last: 2 },
            ConnectError::NoInterface { name: "eth9".into(), available: vec!["lo".into()] },
            ConnectError::Environment { variable: "SILVIC_RANK".into(), message: "m".into() },
            ConnectError::Folder { path: "/tmp/meet".into(), message: "m".into() },
            ConnectError::DuplicateRank { rank: 1, first: "a:1".into(), second: "b:2".into() },
            ConnectError::Rejected {
                peer: 2,
                address: addressed.clone(),
                reason: RejectReason::TokenMismatch,
                detail: String::new(),
            },
            ConnectError::Handshake { peer: 2, address: addressed.clone(), reason: "r".into() },
            ConnectError::Timeout {
                peer: 2,
                address: addressed.clone(),
                waited: Duration::from_secs(1),
                waiting_for: "to accept".into(),
            },
            ConnectError::RendezvousTimeout {
                rendezvous: "/tmp/meet".into(),
                missing: vec![3, 5],
                waited: Duration::from_secs(1),
                detail: String::new(),
            },
            ConnectError::ExchangeAbandoned {
                address: "10.0.0.7:41231".into(),
                reason: "timed out".into(),
            },
            ConnectError::io(2, addressed, &io::Error::from(io::ErrorKind::ConnectionReset)),
            ConnectError::Cancelled,
        ]
    }

    #[test]
    fn kinds_are_snake_case_names_and_only_timeouts_share_one() {
        let kinds: Vec<&str> = one_of_each().iter().map(ConnectError::kind).collect();
        assert_eq!(
            kinds,
            [
                "invalid_argument",
                "bind",
                "ports_taken",
                "no_interface",
                "environment",
                "folder",
                "duplicate_rank",
                "rejected",
                "handshake",
                "timeout",
                "timeout",
                "exchange_abandoned",
                "io",
                "cancelled"
            ]
        );
    }

    #[test]
    fn address_is_a_peer_address_or_nothing() {
        for e in one_of_each() {
            match e.address() {
                Some(address) => {
                    assert_eq!(address, "10.0.0.7:41231", "{e:?}");
                    let rank_0 = matches!(e, ConnectError::ExchangeAbandoned { .. });
                    assert_eq!(e.peer(), Some(if rank_0 { 0 } else { 2 }), "{e:?}");
                }
                None => assert!(!e.to_string().contains("10.0.0.7"), "{e:?}"),
            }
        }
        let timed_out = &one_of_each()[10];
        assert_eq!((timed_out.peer(), timed_out.address()), (Some(3), None));
        assert_eq!(
            timed_out.to_string(),
            "timed out after 1.0s at the rendezvous /tmp/meet: ranks [3, 5] never gave their \
             addresses"
        );
    }

    #[test]
    fn reject_reasons_have_distinct_snake_case_names() {
        let reasons = [
            RejectReason::TokenMismatch,
            RejectReason::VersionMismatch,
            RejectReason::WorldMismatch,
            RejectReason::WrongRank,
            RejectReason::AddressMismatch,
        ];
        let names: Vec<&str> = reasons.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            [
                "token_mismatch",
                "version_mismatch",
                "world_mismatch",
                "wrong_rank",
                "address_mismatch"
            ]
        );
    }
}
