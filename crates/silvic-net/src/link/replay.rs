//! An in-memory [`Link`] for the fuzz targets (feature `fuzzing`): the left neighbour's stream
//! is a byte slice read through the link's own frame reader; what this rank sends is dropped.
//! A world of two has no leftward way (its gather is one rightward hop), so a plan with one
//! finds the right neighbour's stream closed.

use std::io::Read;

use silvic_core::CollectiveError;

use super::READ_AHEAD;
use super::reader::{Incoming, ReadAhead};
use crate::frame::Dir;
use crate::ring::{Link, Plan, Receiving};

/// Rank `rank` of a world of `world`, reading its left neighbour's frames from `left`.
#[derive(Debug)]
pub(crate) struct SliceLink<R> {
    left: R,
    ahead: ReadAhead,
    left_rank: usize,
    world: usize,
}

impl<R: Read> SliceLink<R> {
    pub(crate) fn new(left: R, rank: usize, world: usize) -> Self {
        SliceLink {
            left,
            ahead: ReadAhead::new(READ_AHEAD),
            left_rank: (rank + world - 1) % world,
            world,
        }
    }
}

impl<R: Read> Link for SliceLink<R> {
    fn run(&mut self, plan: &mut dyn Plan) -> Result<(), CollectiveError> {
        if plan.frames(Dir::Left) > 0 {
            let right_rank = (self.left_rank + 2) % self.world;
            return Err(CollectiveError::PeerClosed { peer: right_rank });
        }
        // What this rank sends is dropped, so every frame may come in at once.
        for frame in 0..plan.frames(Dir::Right) {
            let expect = plan.expect(Dir::Right, frame);
            let mut sink = Receiving { plan: &mut *plan, dir: Dir::Right, frame };
            let mut incoming = Incoming::new();
            let mut heard = None;
            // A reader that never blocks: each call reads until the frame is in or fails; a
            // reader that would block ends the frame as if the stream had closed.
            while !incoming.done() {
                let moved = incoming.read_from(
                    &mut self.left,
                    &mut self.ahead,
                    (self.left_rank, self.world),
                    &expect,
                    &mut sink,
                    &mut heard,
                )?;
                if !moved && !incoming.done() {
                    return Err(CollectiveError::PeerClosed { peer: self.left_rank });
                }
            }
        }
        Ok(())
    }
}
