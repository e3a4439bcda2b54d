//! An in-memory [`Link`] for the fuzz targets (feature `fuzzing`): the left neighbour's stream
//! is a byte slice read through the link's own frame reader; what this rank sends is dropped.

use std::io::Read;

use silvic_core::CollectiveError;

use super::READ_AHEAD;
use super::reader::{Incoming, ReadAhead};
use crate::frame::Header;
use crate::ring::{Link, Sink};

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
    fn exchange(
        &mut self,
        _header: &Header,
        _payload: &[u8],
        expect: &Header,
        sink: &mut dyn Sink,
    ) -> Result<(), CollectiveError> {
        let mut incoming = Incoming::new();
        let mut heard = None;
        // A reader that never blocks: each call reads until the frame is in or fails; a reader
        // that would block ends the frame as if the stream had closed.
        while !incoming.done() {
            let moved = incoming.read_from(
                &mut self.left,
                &mut self.ahead,
                (self.left_rank, self.world),
                expect,
                sink,
                &mut heard,
            )?;
            if !moved && !incoming.done() {
                return Err(CollectiveError::PeerClosed { peer: self.left_rank });
            }
        }
        Ok(())
    }
}
