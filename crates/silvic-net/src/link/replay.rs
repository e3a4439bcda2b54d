//! An in-memory [`Link`] for the fuzz targets (feature `fuzzing`): each neighbour's stream is a
//! byte slice read through the link's own frame reader, and what this rank sends is dropped.
//!
//! Since nothing this rank sends is waited for, every frame may come in at once: the link reads
//! the rightward way's frames from the left neighbour's stream, then the leftward way's from the
//! right neighbour's. A stream that ends before its way's last frame is a closed peer.

use std::io::Read;

use silvic_core::CollectiveError;

use super::READ_AHEAD;
use super::reader::{FrameIn, ReadAhead};
use crate::ring::seam::{FramePlan, Link, Network, Receiving, Route};

/// Rank `rank` of a world of `world`, reading its left neighbour's frames from `left` and its
/// right neighbour's from `right`.
#[derive(Debug)]
pub(crate) struct SliceLink<R> {
    /// From the left neighbour (the rightward way's frames), then from the right.
    streams: [R; 2],
    ahead: [ReadAhead; 2],
    /// The left neighbour's rank, then the right one's.
    peers: [usize; 2],
    world: usize,
}

impl<R: Read> SliceLink<R> {
    pub(crate) fn new(left: R, right: R, rank: usize, world: usize) -> Self {
        SliceLink {
            streams: [left, right],
            ahead: [ReadAhead::new(READ_AHEAD), ReadAhead::new(READ_AHEAD)],
            peers: [
                Route::RIGHTWARD.receives_from(rank, world),
                Route::LEFTWARD.receives_from(rank, world),
            ],
            world,
        }
    }
}

impl<R: Read> Link for SliceLink<R> {
    fn network(&self) -> Network {
        Network::UNMEASURED
    }

    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        for way in 0..plan.ways().len() {
            // A way's frames come from the left stream if it runs rightward, else the right.
            let side = usize::from(plan.ways()[way].offset < 0);
            let (stream, ahead, peer) =
                (&mut self.streams[side], &mut self.ahead[side], self.peers[side]);
            for frame in 0..plan.frames(way) {
                let mut sink = Receiving { plan: &mut *plan, way, frame };
                let mut incoming = FrameIn::new();
                let mut heard = None;
                // A reader that never blocks: each call reads until the frame is in or fails; a
                // reader that would block ends the frame as if the stream had closed.
                while !incoming.done() {
                    let moved = incoming.read_from(
                        stream,
                        ahead,
                        (peer, self.world),
                        &mut sink,
                        &mut heard,
                    )?;
                    if !moved && !incoming.done() {
                        return Err(CollectiveError::PeerClosed { peer });
                    }
                }
            }
        }
        Ok(())
    }
}
