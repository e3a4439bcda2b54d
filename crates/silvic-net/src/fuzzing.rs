//! Hooks for `fuzz/` only, behind the `fuzzing` feature: not part of the API, no semver promise.
//!
//! [`replay`] runs one collective of rank 0 in a world of two through the real ring algorithms
//! and the ring link's frame reader, in memory: the left neighbour's stream is a byte slice
//! (its end is a close), and what rank 0 sends is dropped. No socket, no clock.
//! [`gather_limit`] tells the tests where the cost model cuts between the two paths.

use silvic_core::{CollectiveError, Op, fold};

use crate::link::replay::SliceLink;
use crate::ring::run::{self, Call, Scratch};

/// The buffer of one collective, which also says which one.
#[derive(Debug)]
pub enum Buffer<'a> {
    /// `allreduce_sum_f64`.
    SumF64(&'a mut [f64]),
    /// `allreduce_sum_i64`.
    SumI64(&'a mut [i64]),
    /// `allreduce_max_f64`.
    MaxF64(&'a mut [f64]),
    /// `allgather_bytes` of this block.
    Gather(&'a [u8]),
}

/// Runs one collective (sequence number 0) as rank 0 of two, rank 1's frames read from `left`.
/// Returns the gathered blocks for a gather, `None` for a reduction (done in place).
pub fn replay(buf: Buffer<'_>, left: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
    let mut link = SliceLink::new(left, 0, 2);
    let call = |op| Call { rank: 0, world: 2, op, seq: 0 };
    let mut scratch = Scratch::default();
    match buf {
        Buffer::SumF64(b) => {
            run::allreduce(&mut link, call(Op::AllreduceSumF64), b, fold::sum_f64, &mut scratch)
                .map(|()| None)
        }
        Buffer::SumI64(b) => {
            run::allreduce(&mut link, call(Op::AllreduceSumI64), b, fold::sum_i64, &mut scratch)
                .map(|()| None)
        }
        Buffer::MaxF64(b) => {
            run::allreduce(&mut link, call(Op::AllreduceMaxF64), b, fold::max_f64, &mut scratch)
                .map(|()| None)
        }
        Buffer::Gather(local) => {
            let mut blocks = vec![local.to_vec(), Vec::new()];
            run::allgather(&mut link, call(Op::AllgatherBytes), local.len() as u64, &mut blocks)
                .map(|()| Some(blocks))
        }
    }
}

/// The largest buffer, in bytes, that an allreduce in a world of `world` sends by the gather
/// path: every smaller one does too, every larger one takes the ring. The tests that drive
/// both sides of the cut over TCP ask here rather than copy the cost model.
pub fn gather_limit(world: usize) -> usize {
    crate::ring::schedule::gather_limit(world)
}
