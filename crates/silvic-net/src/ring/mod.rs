//! The ring algorithms: which bytes move in which frame, and how they are folded.
//!
//! Invariants this module keeps, whatever carries the bytes:
//!
//! - **Plans of frames.** A collective is a fixed [`Plan`]: per way round the ring, the frames
//!   a rank sends to one neighbour and receives from the other, in order, with gates that say
//!   when each may move: a frame out once the frames it forwards are in, a frame in once the
//!   frames that sent what it overwrites are out. A gate may look at the other way (the ring
//!   path's leftward frames wait on its rightward reduce-scatter), but never at its own frame or
//!   a later one of its way, and the rightward way never waits on the leftward one, so a link
//!   that moves whatever its gates let through never deadlocks. Every frame names the op, the
//!   sequence number, the buffer length, its direction and its block, and is checked before
//!   its payload is used.
//! - **Fold order.** Element `i` is folded over ranks in [`schedule::fold_order`] of its segment,
//!   `j, j + 1, …, j - 1` (mod world), left to right with silvic-core's combiners. That depends
//!   on `(i, len, world)` alone, and both paths use it, so results are bitwise identical on every
//!   rank, on every run, and on either path, wherever the cut falls.
//! - **Two paths, one cut.** [`schedule::uses_gather`] picks the path from the buffer size and
//!   the world size alone (so every rank picks the same): the gather below 4 KiB, and above it
//!   while a model of hops against bytes says it is cheaper and the gathered buffers fit in
//!   [`schedule::GATHER_MAX_BYTES`].
//! - **Traffic and memory.** The ring path is a reduce-scatter round the ring, then the reduced
//!   segments gathered both ways round it at once ([`twoway`]): `n - 1 + floor(n/2)` hops,
//!   `2(n-1)/n` of the buffer leaving each rank, and the only extra memory a fixed-size fold
//!   scratch. Each segment is cut into [`schedule::slices`] of the same count, and a rank
//!   forwards a slice as soon as it has folded it, while the next slice sets off behind it. The
//!   gather path is one two-way allgather of whole buffers (`floor(n/2)` hops, each block
//!   forwarded as soon as it is in); it holds `n × bytes`, at most `max(GATHER_MAX_BYTES, n × 4
//!   KiB)`, kept in [`run::Scratch`] so that a steady state allocates nothing per call.
//!
//! Not here: sockets, clocks and failure handling. [`Link`] is the seam: the TCP ring plugs in
//! over poll(2), and the tests plug in an in-memory ring.

pub(crate) mod run;
pub(crate) mod schedule;
pub(crate) mod twoway;

pub(crate) use run::{Link, Plan, Receiving, Sink};
