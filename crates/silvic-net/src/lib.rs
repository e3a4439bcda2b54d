//! silvic-net: the collectives silvic's distributed training runs on, over a TCP ring.
//!
//! [`TcpCollective`] implements silvic-core's [`Collective`]. Each rank binds a listener, a
//! launcher (a Ray driver, Slurm, a shell script) gathers every rank's address in rank order,
//! and every rank connects:
//!
//! ```no_run
//! use silvic_net::{Collective, TcpCollective};
//! use std::time::Duration;
//! # fn gather(address: String) -> Vec<String> { vec![address] }
//! # let (rank, node_ip) = (0, "10.0.0.5");
//!
//! let listener = TcpCollective::bind_advertised("0.0.0.0", node_ip)?;
//! let addresses = gather(listener.address()); // every rank's, in rank order
//! // Fresh and random per job, from the launcher.
//! let job_token = "5f0c3a9e1d7b42c8a6e09b3f7d214c6e";
//! let mut ring =
//!     TcpCollective::connect(listener, rank, &addresses, job_token, Duration::from_secs(1800))?;
//! ring.set_timeout(Duration::from_secs(60));
//! let mut histogram = vec![0.0; 1 << 20];
//! ring.allreduce_sum_f64(&mut histogram)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On a cluster, [`TcpCollective::bind_with`] listens on an interface or a port range
//! ([`BindOptions`]), and [`TcpCollective::from_env`] forms the ring from a launcher's
//! variables (Slurm, torchrun, a Kubernetes indexed Job, OpenMPI) through rank 0's address
//! exchange or a shared folder ([`launch`]).
//!
//! # The ring
//!
//! Rank `r` connects to `r + 1` and accepts `r - 1` (mod world size). A handshake checks magic,
//! version, world size and rank, and proves the job token with an HMAC over both sides' nonces
//! (`src/handshake`). An allreduce is a reduce-scatter round the ring, then an allgather of the
//! reduced segments both ways round it at once (`n - 1 + floor(n/2)` hops); below 4 KiB, and
//! above it where a cost model of hops against bytes says so, it is one allgather of whole
//! buffers, both ways at once (`floor(n/2)` hops). Every frame carries the op, the
//! call's sequence number, the lengths, its direction, its call's path and whose block it carries
//! (`src/frame/`), checked before a payload byte is used. Where chord streams and long hops
//! make them pay, log-depth paths join these two; `SILVIC_ALLREDUCE` or [`ConnectOptions`]
//! forces one path on every allreduce ([`AllreducePath`]), the same on every rank.
//!
//! # Guarantees
//!
//! - **Deterministic.** Element `i` folds over ranks in an order fixed by `(i, length, world)`,
//!   on both paths: results are bitwise identical on every rank and every run.
//! - **No deadlock.** A call sends and receives at once over non-blocking sockets, and a frame
//!   waits only on earlier frames, whatever the socket buffers hold.
//! - **Timeouts bound inactivity.** A collective fails when the peer it waits on moves no byte
//!   and says nothing for the timeout; a rank that is itself waiting says so (a waiting notice
//!   naming the rank it waits on), so only a stalled rank's neighbour times out, and every
//!   rank's error names the stalled rank. A vanished host is found sooner by TCP keepalive and
//!   TCP_USER_TIMEOUT (about a minute, [`LIVENESS`]).
//! - **Failures travel both ways and stick.** A failed rank tells both neighbours where and why
//!   it failed and shuts its streams; a rank hears either neighbour at any moment of a
//!   collective, so the failure goes round the ring both ways in moments. Every rank's error
//!   names the origin, and every later call returns the same error. Nothing panics on what a
//!   peer sends, and no error exits the process.
//! - **Watchable.** [`TcpCollective::stats`] counts collectives, bytes and the time waited on
//!   each neighbour; [`TcpCollective::watch`] shows another thread, while a call runs, which
//!   call each rank is in and since when; a collective that waits logs a warning after 10 s
//!   and then as its wait doubles, naming the rank it waits on and its address.
//!
//! # Threat model
//!
//! The job token keeps strangers out: a peer without it cannot join a ring, cannot replay a
//! recorded handshake, and learns nothing of the token (it is proven with an HMAC over fresh
//! nonces, both ranks and the address list, never sent). Use 16 random bytes or more: a short
//! token can be guessed offline from one recorded handshake, and draws a warning. The token does
//! **not** protect the data: after the handshake the streams are plain TCP, neither encrypted
//! nor authenticated, so whoever is on the path can read or alter what the ranks exchange. Run
//! on a trusted network, or under WireGuard or IPsec. Strangers at a listener cost bounded
//! descriptors and share its handshake slots by source, never a real rank's place unless they
//! connect from its own address (docs/protocol.md has the whole threat model).
//!
//! # Threads
//!
//! A [`TcpCollective`] is `Send`, not shared: one thread drives it at a time. The calling
//! thread does all the work of a call, except where the ring has channels
//! ([`ConnectOptions::channels`], `SILVIC_CHANNELS`): then a large allreduce is split over
//! them, the calling thread driving the first and one thread each the others, made when the
//! ring forms, parked between calls and joined when it is dropped.
//!
//! Payload numbers travel little-endian as they lie in memory; big-endian targets are refused at
//! build time rather than mixing byte orders on the wire.
#![deny(missing_docs)]
// Forbidden everywhere but `sys`, the one `TCP_INFO` call (neither rustix nor socket2 has it).
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "silvic-net sends numbers as they lie in memory and supports little-endian targets only"
);

mod addresses;
mod bind;
mod cancel;
mod channels;
mod congestion;
mod error;
// The wire's codecs are public only to fuzz/ and the tests that forge wire bytes, behind the
// `fuzzing` feature, so wire internals are no part of the API. Without it, their `pub` items
// are the crate's own: one spelling serves both builds, so `unreachable_pub` is expected there
// (and only that: dead code or an unused import is still an error, apart from the two
// re-exports fuzz/ alone uses, marked where they are).
#[cfg(feature = "fuzzing")]
pub mod frame;
#[cfg(not(feature = "fuzzing"))]
#[expect(unreachable_pub, reason = "public to fuzz/ behind the `fuzzing` feature")]
mod frame;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(feature = "fuzzing")]
pub mod handshake;
#[cfg(not(feature = "fuzzing"))]
#[expect(unreachable_pub, reason = "public to fuzz/ behind the `fuzzing` feature")]
mod handshake;
pub mod launch;
mod link;
mod liveness;
mod options;
mod probe;
mod rendezvous;
mod ring;
// The simulator is a tool (silvic-bench's `--simulate`), behind its own feature: no part of the
// library's API.
#[cfg(feature = "simulate")]
pub mod simulate;
mod stats;
#[allow(unsafe_code)]
mod sys;
mod tcp;
mod topology;
mod trainer;
mod variables;
mod wait;

pub use bind::BindOptions;
pub use cancel::Cancel;
pub use error::ConnectError;
pub use handshake::message::RejectReason;

/// The examples of README.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
/// The examples of docs/cluster.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/cluster.md")]
pub struct ClusterDocDoctests;
/// The examples of docs/fixed-point.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/fixed-point.md")]
pub struct FixedPointDocDoctests;
/// The examples of docs/paths.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/paths.md")]
pub struct PathsDocDoctests;
pub use liveness::LIVENESS;
pub use options::{
    ALLREDUCE_VARIABLE, AllreducePath, CHANNELS_VARIABLE, ConnectOptions, MAX_CHANNELS,
};
pub use silvic_core::{
    Collective, CollectiveError, Dtype, FixedHistogram, FixedScale, LocalCollective, Numbers, Op,
    RecordFold, Reduction, TrainerCollective,
};
pub use stats::{CurrentCall, PeerStats, Progress, RingStats, RingWatch};
pub use tcp::{RingListener, TcpCollective};
