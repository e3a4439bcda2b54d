//! One ring stream as the link keeps it ([`Stream`]): the socket and everything that belongs
//! to it alone, and the table from a plan's ways to the streams they write and read
//! ([`Table`]).
//!
//! Invariants: a stream is named by its route (the signed offset round the ring of the rank at
//! its other end), so the two streams of a world of two, both to rank 1, stay apart; a way
//! writes the stream of its route and reads the stream of the opposite route (its frames come
//! from the rank that far back); each stream carries at most one way out and one way in per
//! plan, so frames of two ways never interleave on a stream.

use std::net::TcpStream;
use std::time::Duration;

use super::READ_AHEAD;
use super::control::{Heard, Queued};
use super::reader::ReadAhead;
use crate::liveness::Liveness;
use crate::ring::seam::{FramePlan, Route};

/// A ring stream and all that is its own.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) socket: TcpStream,
    /// The rank at the other end is `rank + route.offset`.
    pub(super) route: Route,
    pub(super) peer: usize,
    /// What was read beyond the last frame.
    pub(super) ahead: ReadAhead,
    /// Notices queued for the peer, written between data frames.
    pub(super) queued: Queued,
    /// The last notice the peer sent.
    pub(super) heard: Option<Heard>,
    /// False while a data frame to the peer is partly written.
    pub(super) boundary: bool,
    /// The stream has ended or failed while nothing needed it.
    pub(super) ended: bool,
    /// TCP_USER_TIMEOUT, raised while the peer is alive but not reading.
    pub(super) liveness: Liveness,
    /// Time spent waiting while a call needed this stream.
    pub(super) waited: Duration,
}

impl Stream {
    pub(super) fn new(socket: TcpStream, route: Route, rank: usize, world: usize) -> Self {
        Stream {
            socket,
            route,
            peer: route.sends_to(rank, world),
            ahead: ReadAhead::new(READ_AHEAD),
            queued: Queued::default(),
            heard: None,
            boundary: true,
            ended: false,
            liveness: Liveness::new(),
            waited: Duration::ZERO,
        }
    }
}

/// The plan's ways on the streams: per stream, the way that writes it and the way that reads
/// it, if any (way `w` writes the stream of its route and reads that of the opposite one).
#[derive(Debug, Default)]
pub(super) struct Table {
    writer: Vec<Option<usize>>,
    reader: Vec<Option<usize>>,
}

impl Table {
    /// The table of `plan` over `streams`. Panics if a way's route has no stream, or two ways
    /// would write (or read) one stream: a plan this link cannot carry is a bug, not a peer's
    /// doing.
    pub(super) fn build(&mut self, plan: &dyn FramePlan, streams: &[Stream]) {
        let find = |route: Route| {
            streams.iter().position(|s| s.route == route).unwrap_or_else(|| {
                unreachable!("no stream to offset {} for a way of the plan", route.offset)
            })
        };
        self.writer.clear();
        self.writer.resize(streams.len(), None);
        self.reader.clear();
        self.reader.resize(streams.len(), None);
        for (w, route) in plan.ways().iter().enumerate() {
            let (out, inp) = (find(*route), find(Route { offset: -route.offset }));
            assert!(self.writer[out].replace(w).is_none(), "two ways write one stream");
            assert!(self.reader[inp].replace(w).is_none(), "two ways read one stream");
        }
    }

    /// The way that writes stream `s`, if any.
    pub(super) fn writer(&self, s: usize) -> Option<usize> {
        self.writer[s]
    }

    /// The way that reads stream `s`, if any.
    pub(super) fn reader(&self, s: usize) -> Option<usize> {
        self.reader[s]
    }
}
