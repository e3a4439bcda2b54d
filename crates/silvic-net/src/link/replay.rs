//! An in-memory [`Link`] for the fuzz targets (feature `fuzzing`): each peer's stream is a byte
//! slice read through the link's own frame reader, and what this rank sends is dropped.
//!
//! It runs a plan as the seam says a driver must (`ring::seam`), gates and all: a frame out
//! counts as out the moment its gate opens (nothing waits for what this rank sends); a frame in
//! is read, in order, from the stream its way reads once its gate opens. Way `w` reads the
//! stream from rank `rank - offset`, found by peer rank (in a world of two, whose two streams
//! both come from rank 1, by the offset's sign too, as the TCP link's table finds them), and
//! ways that share a stream read it in turn, every frame of the earlier way first. So every
//! plan runs here as over TCP: the ring's, the gather's, Bruck's and the index's. A stream that
//! ends before a frame is whole is a closed peer; gates that could never open again would be a
//! plan's bug, and panic.

use std::io::Read;

use silvic_core::CollectiveError;

use super::reader::{FrameIn, ReadAhead};
use super::stream::READ_AHEAD;
use crate::ring::seam::{Forced, FramePlan, Link, Moved, Network, Receiving, Route};

/// One peer's stream: the route to the peer at its other end, its bytes, and what was read
/// ahead of the frame being read.
#[derive(Debug)]
struct Slice<R> {
    route: Route,
    peer: usize,
    bytes: R,
    ahead: ReadAhead,
}

/// Rank `rank` of a world of `world`, reading each peer's frames from its stream.
#[derive(Debug)]
pub(crate) struct SliceLink<R> {
    streams: Vec<Slice<R>>,
    rank: usize,
    world: usize,
    network: Network,
    forced: Forced,
}

impl<R: Read> SliceLink<R> {
    /// Rank `rank` of `world`, its streams each named by the route of the peer at its other end
    /// (as `topology.rs` names them), carrying plans over a ring that measured `network` and
    /// agreed to force `forced`.
    pub(crate) fn new(
        streams: Vec<(Route, R)>,
        (rank, world): (usize, usize),
        network: Network,
        forced: Forced,
    ) -> Self {
        let streams = streams
            .into_iter()
            .map(|(route, bytes)| Slice {
                route,
                peer: route.sends_to(rank, world),
                bytes,
                ahead: ReadAhead::new(READ_AHEAD),
            })
            .collect();
        SliceLink { streams, rank, world, network, forced }
    }

    /// The stream a way of route `offset` writes (by peer rank, and in a world of two by the
    /// offset's sign); a way reads the one of `-offset`. Panics if there is none: a plan this
    /// link cannot carry is a bug.
    fn find(&self, offset: isize) -> usize {
        let peer = Route { offset }.sends_to(self.rank, self.world);
        let to_peer = |s: &&Slice<R>| s.peer == peer;
        let same_side = |s: &&Slice<R>| s.route.offset.signum() == offset.signum();
        let found = match self.streams.iter().filter(to_peer).count() {
            1 => self.streams.iter().position(|s| to_peer(&s)),
            _ => self.streams.iter().position(|s| to_peer(&s) && same_side(&s)),
        };
        found.unwrap_or_else(|| panic!("no stream to rank {peer} for offset {offset}"))
    }

    /// Reads frame `frame` of `way` from stream `s` into the plan, or the stream's end or a
    /// refused frame as an error.
    fn read(
        &mut self,
        s: usize,
        plan: &mut dyn FramePlan,
        (way, frame): (usize, usize),
    ) -> Result<(), CollectiveError> {
        let world = self.world;
        let stream = &mut self.streams[s];
        let mut sink = Receiving { plan, way, frame };
        let mut incoming = FrameIn::new();
        let mut heard = None;
        // A reader that never blocks: each call reads until the frame is in or fails; a reader
        // that would block ends the frame as if the stream had closed.
        while !incoming.done() {
            let peer = (stream.peer, world);
            let moved = incoming.read_from(
                &mut stream.bytes,
                &mut stream.ahead,
                peer,
                &mut sink,
                &mut heard,
            )?;
            if !moved && !incoming.done() {
                return Err(CollectiveError::PeerClosed { peer: stream.peer });
            }
        }
        Ok(())
    }
}

impl<R: Read> Link for SliceLink<R> {
    fn network(&self) -> Network {
        self.network
    }

    fn forced(&self) -> Forced {
        self.forced
    }

    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        let ways = plan.ways().len();
        let reads: Vec<usize> = plan.ways().iter().map(|r| self.find(-r.offset)).collect();
        let frames: Vec<usize> = (0..ways).map(|w| plan.frames(w)).collect();
        let (mut sent, mut received) = (vec![0; ways], vec![0; ways]);
        loop {
            let mut moved = false;
            for w in 0..ways {
                while sent[w] < frames[w]
                    && plan.ready(w, Moved { sent: &sent, received: &received })
                {
                    sent[w] += 1;
                    moved = true;
                }
                // The stream is this way's once every earlier way on it is all in.
                let turn = (0..w).all(|v| reads[v] != reads[w] || received[v] == frames[v]);
                while turn
                    && received[w] < frames[w]
                    && plan.may_receive(w, Moved { sent: &sent, received: &received })
                {
                    self.read(reads[w], plan, (w, received[w]))?;
                    received[w] += 1;
                    moved = true;
                }
            }
            if (0..ways).all(|w| sent[w] == frames[w] && received[w] == frames[w]) {
                return Ok(());
            }
            assert!(moved, "the plan's gates wait in a circle: {sent:?} out, {received:?} in");
        }
    }
}
