//! How a ring gives up: the frames partly written are finished for a moment, every peer is
//! told why, and every stream is shut for writing.
//!
//! Invariants: an abort starts on a frame boundary of every stream it is written to, or is not
//! written (the shutdown still ends the stream); reads stay open until the ring is dropped.

use std::io::Write;
use std::net::Shutdown;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use silvic_core::CollectiveError;

use super::{FINISH_FRAME_BOUND, TcpRing};
use crate::frame::{Abort, HEADER_LEN, MAX_ABORT_LEN};
use crate::ring::seam::FramePlan;
use crate::wait::wait;

impl TcpRing {
    /// After a failure on stream `failed`, keeps writing the frame partly written to each other
    /// stream for a short while, so that the neighbour there gets a whole frame and then the
    /// abort.
    pub(super) fn finish_frames(&mut self, failed: usize, plan: &dyn FramePlan) {
        for s in (0..self.streams.len()).filter(|&s| s != failed) {
            let deadline = Instant::now() + FINISH_FRAME_BOUND.min(self.timeout);
            while !self.out_boundary(s) && Instant::now() < deadline {
                if self.write_some(s, plan, false).is_err() {
                    break;
                }
                let mut fds = [PollFd::new(&self.streams[s].socket, PollFlags::OUT)];
                if self.out_boundary(s) || wait(&mut fds, Some(deadline)).is_err() {
                    break;
                }
            }
        }
    }

    /// Tells every peer (ring neighbours and chords) why this rank gives up, best effort, then
    /// shuts every stream for writing. Reads stay open until the ring is dropped, so a peer's
    /// last bytes are not answered with a reset that could destroy its own abort frame in flight.
    pub(crate) fn abort(&mut self, rank: usize, error: &CollectiveError, seq: u64) {
        let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let len = Abort::for_error(rank, error).encode(seq, &mut frame);
        let frame = &frame[..len];
        for stream in &self.streams {
            // A notice partly written goes out whole first, so the abort starts on a frame
            // boundary. Non-blocking: an abort is small; if it does not fit, the shutdown below
            // still ends the stream.
            if stream.boundary {
                let _ = (&stream.socket).write(&[stream.queued.rest(), frame].concat());
            }
        }
        for stream in &self.streams {
            let _ = stream.socket.shutdown(Shutdown::Write);
        }
    }
}
