//! The ring algorithms: which bytes move at each step and how they are folded.
//!
//! Invariants this module keeps, whatever carries the bytes:
//!
//! - **Lock-step.** A collective is a fixed sequence of steps; in each, a rank sends one frame to
//!   its right neighbour and receives one from its left, at the same time ([`Link::exchange`]);
//!   a step of the two-way gather ([`twoway`]) also sends one to its left and receives one from
//!   its right ([`Link::step`]). Every frame names the op, the sequence number, the buffer
//!   length, its direction and its block, and is checked before its payload is used.
//! - **Fold order.** Element `i` is folded over ranks in [`schedule::fold_order`] of its segment,
//!   `j, j + 1, …, j - 1` (mod world), left to right with silvic-core's combiners. That depends
//!   on `(i, len, world)` alone, and both paths use it, so results are bitwise identical on every
//!   rank, on every run, and on either path, wherever the cut falls.
//! - **Two paths, one cut.** [`schedule::uses_gather`] picks the path from the buffer size and
//!   the world size alone (so every rank picks the same): the gather below 4 KiB, and above it
//!   while a model of hops against bytes says it is cheaper and the gathered buffers fit in
//!   [`schedule::GATHER_MAX_BYTES`].
//! - **Traffic and memory.** The ring path is a reduce-scatter then an allgather: `2(n-1)/n` of
//!   the buffer leaves each rank, and the only extra memory is a fixed-size fold scratch. Each
//!   segment is cut into [`schedule::slices`] of the same count, and slice `k` goes all the way
//!   round before slice `k + 1`, so each step sends what the step before folded. The gather path
//!   is one two-way allgather of whole buffers ([`twoway`], `floor(n/2)` steps); it holds
//!   `n × bytes`, at most `max(GATHER_MAX_BYTES, n × 4 KiB)`, kept in [`run::Scratch`] so that a
//!   steady state allocates nothing per call.
//!
//! Not here: sockets, clocks and failure handling. [`Link`] is the seam: the TCP ring plugs in
//! over poll(2), and the tests plug in an in-memory ring.

pub(crate) mod run;
pub(crate) mod schedule;
pub(crate) mod twoway;

pub(crate) use run::{Link, Plan, Receiving, Sink};
