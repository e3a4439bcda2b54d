//! The one error every collective returns.
//!
//! Invariants: a [`CollectiveError`] is cheap to clone (it holds an [`io::ErrorKind`] and text,
//! never an `io::Error`), so a failed collective hands the same value to every later call; its
//! message is lower-case, names the peer rank and says what was expected; it never carries a job
//! token.

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
    /// `TrainerCollective::allreduce` of a reduction and an element type other than
    /// the three above (those are the same op whichever method is called: see
    /// [`Op::allreduce`]).
    Allreduce {
        /// The reduction.
        reduction: Reduction,
        /// The element type.
        dtype: Dtype,
    },
    /// `TrainerCollective::reduce_scatter_records`.
    ReduceScatterRecords,
    /// `TrainerCollective::allreduce_records`.
    AllreduceRecords,
    /// `TrainerCollective::allgather_varlen`.
    AllgatherVarlen,
    /// `TrainerCollective::broadcast_bytes`.
    BroadcastBytes,
    /// `TrainerCollective::allgather_blocks`.
    AllgatherBlocks,
}

/// What an allreduce computes per element, folding `acc = combine(acc, next)` ([`crate::fold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The sum: IEEE 754 addition for floats, wrapping (two's complement) for integers.
    Sum,
    /// The minimum; for floats NaN wins over any number.
    Min,
    /// The maximum; for floats NaN wins over any number.
    Max,
}

/// The element type of a typed buffer (`Numbers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u64`.
    U64,
    /// `i128`: the exact sums of fixed-point histograms (`FixedHistogram`).
    I128,
}

impl Reduction {
    /// Every reduction, in a fixed order.
    pub const ALL: [Reduction; 3] = [Reduction::Sum, Reduction::Min, Reduction::Max];
}

impl Dtype {
    /// Every element type, in a fixed order.
    pub const ALL: [Dtype; 6] =
        [Dtype::F32, Dtype::F64, Dtype::I32, Dtype::I64, Dtype::U64, Dtype::I128];

    /// Bytes of one element.
    pub fn width(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
            Dtype::I128 => 16,
        }
    }
}

/// Method names of the typed allreduces, by `[reduction][dtype]` in the order of
/// [`Reduction::ALL`] and [`Dtype::ALL`].
const ALLREDUCE_NAMES: [[&str; 6]; 3] = [
    [
        "allreduce_sum_f32",
        "allreduce_sum_f64",
        "allreduce_sum_i32",
        "allreduce_sum_i64",
        "allreduce_sum_u64",
        "allreduce_sum_i128",
    ],
    [
        "allreduce_min_f32",
        "allreduce_min_f64",
        "allreduce_min_i32",
        "allreduce_min_i64",
        "allreduce_min_u64",
        "allreduce_min_i128",
    ],
    [
        "allreduce_max_f32",
        "allreduce_max_f64",
        "allreduce_max_i32",
        "allreduce_max_i64",
        "allreduce_max_u64",
        "allreduce_max_i128",
    ],
];

impl Op {
    /// The op of an allreduce of `reduction` over `dtype`: the pinned methods' own ops for a sum
    /// of f64, a sum of i64 and a max of f64 (so a rank calling
    /// [`crate::Collective::allreduce_sum_f64`] and one calling
    /// `TrainerCollective::allreduce` with a sum of f64 are in step), else
    /// [`Op::Allreduce`].
    pub fn allreduce(reduction: Reduction, dtype: Dtype) -> Op {
        match (reduction, dtype) {
            (Reduction::Sum, Dtype::F64) => Op::AllreduceSumF64,
            (Reduction::Sum, Dtype::I64) => Op::AllreduceSumI64,
            (Reduction::Max, Dtype::F64) => Op::AllreduceMaxF64,
            (reduction, dtype) => Op::Allreduce { reduction, dtype },
        }
    }

    /// The method name, as a caller wrote it (a typed allreduce as `allreduce_<reduction>_<type>`).
    pub fn name(self) -> &'static str {
        match self {
            Op::AllreduceSumF64 => "allreduce_sum_f64",
            Op::AllreduceSumI64 => "allreduce_sum_i64",
            Op::AllreduceMaxF64 => "allreduce_max_f64",
            Op::AllgatherBytes => "allgather_bytes",
            Op::Allreduce { reduction, dtype } => {
                ALLREDUCE_NAMES[reduction as usize][dtype as usize]
            }
            Op::ReduceScatterRecords => "reduce_scatter_records",
            Op::AllreduceRecords => "allreduce_records",
            Op::AllgatherVarlen => "allgather_varlen",
            Op::BroadcastBytes => "broadcast_bytes",
            Op::AllgatherBlocks => "allgather_blocks",
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
    #[error("no progress from rank {peer} for {}", RoundedDuration(*waited))]
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

    /// This rank's caller passed arguments the collective cannot run with (block lengths that
    /// do not cover the buffer, a record size that does not divide them, a root outside the
    /// world). Like every failure it closes the ring, so the other ranks fail too, naming this
    /// one as the origin, instead of waiting out their timeout.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong with the arguments.
        reason: String,
    },

    /// A fixed-point histogram (`FixedHistogram`) refused a value or a reduction that
    /// could carry a sum past what its agreed scale holds exactly: a value at or beyond the
    /// scale's bound, a bin whose sum would pass this rank's headroom, or ranks whose
    /// histograms together hold more rows than the scale was agreed for. Nothing was added.
    #[error("fixed-point overflow{}: {reason}", bin.map(|b| format!(" in bin {b}")).unwrap_or_default())]
    Overflow {
        /// The bin the refused value was for, if one was.
        bin: Option<usize>,
        /// What would have overflowed, and the scale's limits.
        reason: String,
    },

    /// `peer` reduced a fixed-point histogram at another scale than this rank's
    /// (`FixedScale`): every rank of the call sees this error, and the histogram's
    /// sums are lost.
    #[error("rank {peer} holds another fixed-point scale: {got}, this rank {expected}")]
    ScaleMismatch {
        /// A rank whose scale differs from this rank's (the lowest such rank).
        peer: usize,
        /// This rank's scale.
        expected: String,
        /// `peer`'s scale.
        got: String,
    },

    /// This rank's caller cancelled the call while it waited (a `Cancel` another thread
    /// tripped, or a signal such as Ctrl-C in Python). Like every failure it closes the ring,
    /// so the other ranks fail too, naming this one as the origin.
    #[error("the call was cancelled by its caller")]
    Cancelled,

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

/// A duration as the errors of silvic print it: three significant digits or so, such as
/// `60.0s`, `1.50ms` or `250µs`, not `Duration`'s `59.999794848s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundedDuration(pub Duration);

impl fmt::Display for RoundedDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.0.as_secs_f64();
        let ms = seconds * 1e3;
        if seconds >= 1.0 {
            write!(f, "{seconds:.1}s")
        } else if ms >= 100.0 {
            write!(f, "{ms:.0}ms")
        } else if ms >= 10.0 {
            write!(f, "{ms:.1}ms")
        } else if ms >= 1.0 {
            write!(f, "{ms:.2}ms")
        } else {
            write!(f, "{:.0}µs", seconds * 1e6)
        }
    }
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
            | CollectiveError::MalformedFrame { peer, .. }
            | CollectiveError::ScaleMismatch { peer, .. } => Some(*peer),
            CollectiveError::InvalidArgument { .. }
            | CollectiveError::Overflow { .. }
            | CollectiveError::Cancelled => None,
            CollectiveError::Aborted { origin, cause } => cause.peer().or(Some(*origin)),
        }
    }

    /// A stable name for the variant: `"io"`, `"peer_closed"`, `"timeout"`, `"out_of_step"`,
    /// `"length_mismatch"`, `"malformed_frame"`, `"invalid_argument"`, `"overflow"`,
    /// `"scale_mismatch"`, `"cancelled"` or `"aborted"`.
    ///
    /// These names are part of the API: the Python binding shows them as `CollectiveError.kind`
    /// and the test bed's rank processes print them, so a caller can branch on the kind without
    /// matching on text or on a `#[non_exhaustive]` enum. A name never changes meaning; a new
    /// variant gets a new name. For [`CollectiveError::Aborted`] it is `"aborted"`: the origin's
    /// own error (`cause`) has its own kind.
    ///
    /// ```
    /// use silvic_core::CollectiveError;
    ///
    /// let closed = CollectiveError::PeerClosed { peer: 2 };
    /// let relayed = CollectiveError::Aborted { origin: 1, cause: Box::new(closed.clone()) };
    /// assert_eq!((closed.kind(), relayed.kind()), ("peer_closed", "aborted"));
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            CollectiveError::Io { .. } => "io",
            CollectiveError::PeerClosed { .. } => "peer_closed",
            CollectiveError::Timeout { .. } => "timeout",
            CollectiveError::OutOfStep { .. } => "out_of_step",
            CollectiveError::LengthMismatch { .. } => "length_mismatch",
            CollectiveError::MalformedFrame { .. } => "malformed_frame",
            CollectiveError::InvalidArgument { .. } => "invalid_argument",
            CollectiveError::Overflow { .. } => "overflow",
            CollectiveError::ScaleMismatch { .. } => "scale_mismatch",
            CollectiveError::Cancelled => "cancelled",
            CollectiveError::Aborted { .. } => "aborted",
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
        assert_eq!(t.to_string(), "no progress from rank 1 for 60.0s");
        let a = CollectiveError::Aborted { origin: 0, cause: Box::new(t) };
        assert_eq!(a.to_string(), "rank 0 failed: no progress from rank 1 for 60.0s");
        assert_eq!(a.peer(), Some(1));
    }

    #[test]
    fn every_typed_allreduce_has_its_own_name_and_the_pinned_three_keep_theirs() {
        let mut names = Vec::new();
        for reduction in Reduction::ALL {
            for dtype in Dtype::ALL {
                names.push(Op::allreduce(reduction, dtype).name());
            }
        }
        assert_eq!(Op::allreduce(Reduction::Sum, Dtype::F64), Op::AllreduceSumF64);
        assert_eq!(Op::allreduce(Reduction::Sum, Dtype::I64), Op::AllreduceSumI64);
        assert_eq!(Op::allreduce(Reduction::Max, Dtype::F64), Op::AllreduceMaxF64);
        assert_eq!(Op::allreduce(Reduction::Min, Dtype::U64).name(), "allreduce_min_u64");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 18);
    }

    #[test]
    fn io_keeps_kind_and_message() {
        let e = CollectiveError::io(4, &io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(e.peer(), Some(4));
        assert!(matches!(e, CollectiveError::Io { kind: io::ErrorKind::ConnectionReset, .. }));
    }

    /// The names are an API (Python's `CollectiveError.kind`): each variant has its own, and
    /// none may change.
    #[test]
    fn every_variant_has_its_own_stable_kind_name() {
        let closed = CollectiveError::PeerClosed { peer: 1 };
        let every = [
            (CollectiveError::io(1, &io::Error::from(io::ErrorKind::BrokenPipe)), "io"),
            (closed.clone(), "peer_closed"),
            (CollectiveError::Timeout { peer: 1, waited: Duration::from_secs(1) }, "timeout"),
            (
                CollectiveError::OutOfStep {
                    peer: 1,
                    expected_op: Op::AllgatherBytes,
                    expected_seq: 0,
                    got_op: Op::AllreduceMaxF64,
                    got_seq: 0,
                },
                "out_of_step",
            ),
            (CollectiveError::LengthMismatch { peer: 1, expected: 8, got: 16 }, "length_mismatch"),
            (CollectiveError::MalformedFrame { peer: 1, reason: "bad".into() }, "malformed_frame"),
            (CollectiveError::InvalidArgument { reason: "bad".into() }, "invalid_argument"),
            (CollectiveError::Overflow { bin: Some(3), reason: "bad".into() }, "overflow"),
            (
                CollectiveError::ScaleMismatch { peer: 1, expected: "a".into(), got: "b".into() },
                "scale_mismatch",
            ),
            (CollectiveError::Cancelled, "cancelled"),
            (CollectiveError::Aborted { origin: 0, cause: Box::new(closed) }, "aborted"),
        ];
        for (error, name) in &every {
            assert_eq!(error.kind(), *name, "{error:?}");
        }
        let mut names: Vec<&str> = every.iter().map(|(e, _)| e.kind()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), every.len(), "two variants share a name");
    }

    #[test]
    fn error_is_send_sync_static_and_clone() {
        fn check<T: std::error::Error + Send + Sync + Clone + 'static>() {}
        check::<CollectiveError>();
    }

    #[test]
    fn durations_print_rounded() {
        let shown = |d: Duration| RoundedDuration(d).to_string();
        assert_eq!(shown(Duration::from_nanos(59_999_794_848)), "60.0s");
        assert_eq!(shown(Duration::from_secs(1800)), "1800.0s");
        assert_eq!(shown(Duration::from_millis(1500)), "1.5s");
        assert_eq!(shown(Duration::from_micros(999_999)), "1000ms");
        assert_eq!(shown(Duration::from_micros(250_400)), "250ms");
        assert_eq!(shown(Duration::from_micros(25_340)), "25.3ms");
        assert_eq!(shown(Duration::from_micros(1_500)), "1.50ms");
        assert_eq!(shown(Duration::from_nanos(250_400)), "250µs");
        assert_eq!(shown(Duration::ZERO), "0µs");
    }
}
