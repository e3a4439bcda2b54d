//! The test bed of silvic-net: rank processes, a multi-host network made of Linux network
//! namespaces on one machine, faults injected into it, and a soak.
//!
//! - [`rank`]: what one rank process runs and prints (the `silvic-testbed rank` binary mode).
//! - [`data`]: seeded inputs whose results every rank checks exactly, alone.
//! - [`child`]: child processes with line-based, deadline-bounded I/O, killed on drop.
//! - [`net`]: namespaces, a bridge, veths, nft rules and qdiscs, all removed on drop and swept
//!   if a run died before it could remove them.
//! - [`relay`]: a delaying TCP relay for delay and jitter (this kernel has no netem).
//! - [`ring`]: a world of rank processes, started and driven from a test.
//!
//! It is not part of silvic-net's API and is never published.
#![forbid(unsafe_code)]

pub mod child;
pub mod data;
pub mod net;
pub mod rank;
pub mod relay;
pub mod ring;
