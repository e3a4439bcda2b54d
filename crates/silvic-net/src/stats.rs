//! [`RingStats`]: what a ring has done and how long it waited, for a trainer to name its
//! straggler.
//!
//! Invariants: counters only grow; they count from connect and are never reset; nothing here
//! does I/O or reads a clock (the ring link adds to them as it moves bytes and waits).

use std::time::Duration;

/// What a [`TcpCollective`](crate::TcpCollective) has done since connect.
///
/// The waits are the time a collective spent blocked or spinning while it still needed
/// a frame from its left neighbour or had bytes for it that it would not take (`waited_left`),
/// or the same of its right neighbour (`waited_right`; in the two-way gather frames travel both
/// ways); a moment that needs both counts in both. A rank whose
/// `waited_left` grows fastest waits on the ranks before it: the straggler is upstream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Collectives that returned `Ok`.
    pub collectives: u64,
    /// Bytes written to both ring streams: frames, headers and control frames.
    pub bytes_sent: u64,
    /// Bytes read from both ring streams.
    pub bytes_received: u64,
    /// Time spent waiting on the left neighbour.
    pub waited_left: Duration,
    /// Time spent waiting on the right neighbour.
    pub waited_right: Duration,
}
