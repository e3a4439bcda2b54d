//! The one error every collective returns.
//!
//! Invariants: a [`CollectiveError`] is cheap to clone (it holds an [`io::ErrorKind`] and text,
//! never an `io::Error`), so a failed ring hands the same value to every later call; its message
//! is lower-case, names the peer rank and says what was expected; it never carries a job token.

use std::{fmt, io, time::Duration};

/// Which collective a frame or a call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`crate::Collective::allreduce_sum_f64`].
    AllreduceSumF64,
    /// [`crate::Collective::allreduce_sum_i64`].
    AllreduceSumI64,
    /// [`crate::Collective::allreduce_max_f64`].
    AllreduceMaxF64,
    /// [`crate::Collective::allgather_bytes`].
    AllgatherBytes,
}

impl Op {
    /// The method name, as a caller wrote it.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllreduceSumF64 => "allreduce_sum_f64",
            Op::AllreduceSumI64 => "allreduce_sum_i64",
            Op::AllreduceMaxF64 => "allreduce_max_f64",
            Op::AllgatherBytes => "allgather_bytes",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a collective failed.
///
/// Every variant that involves a peer names its rank; [`CollectiveError::peer`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A socket operation with `peer` failed.
    #[error("i/o error with rank {peer}: {message}")]
    Io {
        /// The rank on the other end of the socket.
        peer: usize,
        /// What the operating system reported.
        kind: io::ErrorKind,
        /// The operating system's message.
        message: String,
    },

    /// `peer` closed its connection while this rank still needed it.
    #[error("rank {peer} closed the connection")]
    PeerClosed {
        /// The rank that closed.
        peer: usize,
    },

    /// `peer` made no progress (no byte sent or received) for `waited`.
    #[error("no progress from rank {peer} for {waited:?}")]
    Timeout {
        /// The rank this one waited on.
        peer: usize,
        /// How long it waited without a byte moving.
        waited: Duration,
    },

    /// `peer` is in another collective: another method or another call of the sequence.
    #[error(
        "rank {peer} is out of step: expected {expected_op} #{expected_seq}, got {got_op} #{got_seq}"
    )]
    OutOfStep {
        /// The rank that sent the frame.
        peer: usize,
        /// The collective this rank is in.
        expected_op: Op,
        /// This rank's call index since connect.
        expected_seq: u64,
        /// The collective the peer is in.
        got_op: Op,
        /// The peer's call index since connect.
        got_seq: u64,
    },

    /// `peer` passed a buffer of another length to the same collective.
    #[error("rank {peer} passed {got} bytes where this rank passed {expected}")]
    LengthMismatch {
        /// The rank that sent the frame.
        peer: usize,
        /// This rank's buffer length, in bytes.
        expected: u64,
        /// The peer's buffer length, in bytes.
        got: u64,
    },

    /// `peer` sent bytes that are not a valid frame.
    #[error("malformed frame from rank {peer}: {reason}")]
    MalformedFrame {
        /// The rank that sent the bytes.
        peer: usize,
        /// What was wrong with them.
        reason: String,
    },

    /// Another rank failed first and told its neighbours why.
    ///
    /// `origin` is the rank where the failure began and `cause` what it saw there.
    #[error("rank {origin} failed: {cause}")]
    Aborted {
        /// The rank where the failure began.
        origin: usize,
        /// The error `origin` saw.
        cause: Box<CollectiveError>,
    },
}

impl CollectiveError {
    /// The peer rank this error is about, if any.
    ///
    /// For [`CollectiveError::Aborted`] this is the rank the origin's own error named (the rank
    /// that most likely failed), or the origin itself when that error named no one.
    ///
    /// ```
    /// use silvic_core::CollectiveError;
    ///
    /// let closed = CollectiveError::PeerClosed { peer: 2 };
    /// let relayed = CollectiveError::Aborted { origin: 1, cause: Box::new(closed.clone()) };
    /// assert_eq!((closed.peer(), relayed.peer()), (Some(2), Some(2)));
    /// ```
    pub fn peer(&self) -> Option<usize> {
        match self {
            CollectiveError::Io { peer, .. }
            | CollectiveError::PeerClosed { peer }
            | CollectiveError::Timeout { peer, .. }
            | CollectiveError::OutOfStep { peer, .. }
            | CollectiveError::LengthMismatch { peer, .. }
            | CollectiveError::MalformedFrame { peer, .. } => Some(*peer),
            CollectiveError::Aborted { origin, cause } => cause.peer().or(Some(*origin)),
        }
    }

    /// An [`CollectiveError::Io`] for `peer`, keeping the kind and the message of `error`.
    pub fn io(peer: usize, error: &io::Error) -> Self {
        CollectiveError::Io { peer, kind: error.kind(), message: error.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_peer_and_both_sides() {
        let e = CollectiveError::OutOfStep {
            peer: 3,
            expected_op: Op::AllreduceSumF64,
            expected_seq: 7,
            got_op: Op::AllgatherBytes,
            got_seq: 7,
        };
        assert_eq!(
            e.to_string(),
            "rank 3 is out of step: expected allreduce_sum_f64 #7, got allgather_bytes #7"
        );
        let t = CollectiveError::Timeout { peer: 1, waited: Duration::from_secs(60) };
        assert_eq!(t.to_string(), "no progress from rank 1 for 60s");
        let a = CollectiveError::Aborted { origin: 0, cause: Box::new(t) };
        assert_eq!(a.to_string(), "rank 0 failed: no progress from rank 1 for 60s");
        assert_eq!(a.peer(), Some(1));
    }

    #[test]
    fn io_keeps_kind_and_message() {
        let e = CollectiveError::io(4, &io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(e.peer(), Some(4));
        assert!(matches!(e, CollectiveError::Io { kind: io::ErrorKind::ConnectionReset, .. }));
    }

    #[test]
    fn error_is_send_sync_static_and_clone() {
        fn check<T: std::error::Error + Send + Sync + Clone + 'static>() {}
        check::<CollectiveError>();
    }
}
