//! The test bed of silvic-net: rank processes, a multi-host network made of Linux network
//! namespaces on one machine, faults injected into it, and a soak. It is also the workspace's
//! test-support crate: silvic-net's own tests take its child-process launcher and its relay
//! (it is their dev-dependency), so each exists once.
//!
//! - [`rank`]: what one rank process runs and prints (the `silvic-testbed rank` binary mode).
//! - [`data`]: seeded inputs whose results every rank checks exactly, alone.
//! - [`child`]: child processes with line-based, deadline-bounded I/O, killed on drop.
//! - [`faults`]: what the fault tests read of a world after a fault, and the checks they share.
//! - [`net`]: namespaces, a bridge, veths, nft rules and qdiscs, all removed on drop and swept
//!   if a run died before it could remove them.
//! - [`relay`]: the one TCP relay of the tests: delay and jitter (with no need of netem),
//!   and a record of what each client sent; in a test's process or as the relay process.
//! - [`ring`]: a world of rank processes, started and driven from a test.
//!
//! It is not part of silvic-net's API and is never published.
#![forbid(unsafe_code)]

use std::time::Duration;

/// How late past its own bound an event may come on a loaded machine before a test calls the
/// behaviour broken. Far above any lateness a busy machine causes, so an upper bound of "the
/// behaviour's bound + `MARGIN`" fails only when the behaviour is broken (it hung, or waited
/// out another timeout), never because the machine was busy. Upper bounds in tests are written
/// this way; measured figures go in results files (docs/results/), never in a bound.
pub const MARGIN: Duration = Duration::from_secs(20);

pub mod child;
pub mod data;
pub mod faults;
pub mod net;
pub mod rank;
pub mod relay;
pub mod ring;
