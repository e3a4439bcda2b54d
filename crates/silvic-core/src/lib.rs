//! The collective operations silvic's distributed training runs on, with no I/O of its own.
//!
//! A [`Collective`] joins `world_size` ranks. Every rank calls the same collectives, in the same
//! order, with buffers of the same length; each call returns on every rank with the same result.
//! Implementations keep these promises, and callers may rely on them:
//!
//! - **Determinism.** Every element is folded in an order that depends only on its index, the
//!   buffer length and the world size, so a result is bitwise identical on every rank and on every
//!   run for a given world size. [`fold`] holds the element-wise combiners every backend shares.
//! - **Integer sums wrap.** [`Collective::allreduce_sum_i64`] adds in two's complement: exact, and
//!   the same in any order. f64 sums of integer-valued data below 2^53 are exact as well.
//! - **max propagates NaN.** If any rank holds a NaN at an index, the maximum there is NaN.
//! - **Errors are sticky.** Once a collective fails, the group is broken: that call and every
//!   later one return the same [`CollectiveError`], naming the peer rank involved where there is
//!   one.
//!   Nothing panics or exits the process on a failure; the caller decides what happens next.
//!
//! The trait is object safe: trainers hold a `Box<dyn Collective>` and do not care whether it is
//! [`LocalCollective`] or a network backend such as silvic-net's `TcpCollective`.
//! [`TrainerCollective`] adds the op set other trainers need (LightGBM's reduce-scatter over
//! records, XGBoost's broadcast and variable-length allgather, reductions of more element
//! types); it extends [`Collective`], so a `Box<dyn TrainerCollective>` calls both.
//! [`FixedHistogram`] sums per-sample values exactly, at a [`FixedScale`] every rank agrees on,
//! so that its results depend on the samples alone, not on the world size or the partition.
//!
//! ```
//! use silvic_core::{Collective, LocalCollective};
//!
//! let mut collective: Box<dyn Collective> = Box::new(LocalCollective);
//! let mut histogram = vec![1.0, 2.5, 4.0];
//! collective.allreduce_sum_f64(&mut histogram)?;
//! assert_eq!(histogram, [1.0, 2.5, 4.0]); // a world of one: the sum is the input
//! assert_eq!(collective.allgather_bytes(b"rank 0")?, vec![b"rank 0".to_vec()]);
//! # Ok::<(), silvic_core::CollectiveError>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod fixed;
pub mod fold;

mod trainer;

pub use error::{CollectiveError, Dtype, Op, Reduction, RoundedDuration};
pub use fixed::{FixedHistogram, FixedScale};
pub use trainer::{Numbers, RecordFold, TrainerCollective, block_bounds};

/// A group of ranks that reduce and gather buffers together.
///
/// Every rank calls the same methods in the same order with buffers of the same length. A call
/// that a peer does not match (another method, another length) fails on both sides with
/// [`CollectiveError::OutOfStep`] or [`CollectiveError::LengthMismatch`] rather than mixing data.
pub trait Collective: Send {
    /// This rank's index, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Replaces every element of `buf` with its sum over all ranks.
    ///
    /// The sum of element `i` is folded in a fixed rank order, so every rank gets the same bits.
    fn allreduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError>;

    /// Replaces every element of `buf` with its wrapping (two's complement) sum over all ranks.
    fn allreduce_sum_i64(&mut self, buf: &mut [i64]) -> Result<(), CollectiveError>;

    /// Replaces every element of `buf` with its maximum over all ranks; NaN wins over any number.
    fn allreduce_max_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError>;

    /// Every rank's bytes, indexed by rank, on every rank. Every rank passes the same length.
    fn allgather_bytes(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError>;
}

/// A world of one rank: every collective returns its input.
///
/// Useful for single-process training and as a stand-in in tests.
///
/// ```
/// use silvic_core::{Collective, LocalCollective};
///
/// let mut local = LocalCollective;
/// let mut counts = [3_i64, i64::MAX];
/// local.allreduce_sum_i64(&mut counts)?;
/// assert_eq!((local.rank(), local.world_size(), counts), (0, 1, [3, i64::MAX]));
/// # Ok::<(), silvic_core::CollectiveError>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalCollective;

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn allreduce_sum_f64(&mut self, _buf: &mut [f64]) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn allreduce_sum_i64(&mut self, _buf: &mut [i64]) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn allreduce_max_f64(&mut self, _buf: &mut [f64]) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn allgather_bytes(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        Ok(vec![local.to_vec()])
    }
}

impl TrainerCollective for LocalCollective {
    fn allreduce(
        &mut self,
        _buf: Numbers<'_>,
        _reduction: Reduction,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn reduce_scatter_records(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
        record: usize,
        _fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        block_bounds(buf.len(), blocks, record, 1).map(|_| ())
    }

    fn allreduce_records(
        &mut self,
        buf: &mut [u8],
        record: usize,
        _fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        block_bounds(buf.len(), &[buf.len()], record, 1).map(|_| ())
    }

    fn allgather_blocks(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
    ) -> Result<(), CollectiveError> {
        block_bounds(buf.len(), blocks, 1, 1).map(|_| ())
    }

    fn allgather_varlen(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        Ok(vec![local.to_vec()])
    }

    fn broadcast_bytes(&mut self, _buf: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        trainer::check_root(root, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_trainer_ops_return_their_input_and_check_their_arguments() {
        let mut local = LocalCollective;
        let mut halves = [1.5f32, f32::NAN];
        local.allreduce(Numbers::F32(&mut halves), Reduction::Min).unwrap();
        assert_eq!(halves[0], 1.5);
        let fold: &dyn Fn(&mut [u8], &[u8]) = &|acc, next| acc.copy_from_slice(next);
        let mut records = vec![7u8; 12];
        local.reduce_scatter_records(&mut records, &[12], 4, fold).unwrap();
        local.allreduce_records(&mut records, 3, fold).unwrap();
        assert_eq!(records, [7; 12]);
        let bad = local.reduce_scatter_records(&mut records, &[12], 5, fold).unwrap_err();
        assert_eq!(bad.kind(), "invalid_argument", "{bad}");
        assert!(local.reduce_scatter_records(&mut records, &[8], 4, fold).is_err());
        assert!(local.reduce_scatter_records(&mut records, &[4, 8], 4, fold).is_err());
        assert_eq!(local.allgather_varlen(b"abc").unwrap(), [b"abc".to_vec()]);
        local.allgather_blocks(&mut records, &[12]).unwrap();
        assert!(local.allgather_blocks(&mut records, &[11]).is_err());
        let mut root = b"model".to_vec();
        local.broadcast_bytes(&mut root, 0).unwrap();
        assert_eq!(root, b"model");
        let outside = local.broadcast_bytes(&mut root, 1).unwrap_err();
        assert_eq!(outside.peer(), None, "{outside}");
    }

    #[test]
    fn local_collective_returns_its_input() {
        let mut local = LocalCollective;
        let mut f = [1.5, f64::NAN, -0.0];
        local.allreduce_sum_f64(&mut f).unwrap();
        assert_eq!(f[0], 1.5);
        assert!(f[1].is_nan());
        assert!(f[2].is_sign_negative());
        local.allreduce_max_f64(&mut f).unwrap();
        assert_eq!(f[0], 1.5);
        let mut i = [i64::MIN, 7];
        local.allreduce_sum_i64(&mut i).unwrap();
        assert_eq!(i, [i64::MIN, 7]);
        assert_eq!(local.allgather_bytes(&[]).unwrap(), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn collective_is_object_safe_and_send() {
        fn takes(_: Box<dyn Collective>) {}
        takes(Box::new(LocalCollective));
        fn widens(mut all: Box<dyn TrainerCollective>) -> usize {
            all.allgather_bytes(b"").unwrap().len()
        }
        assert_eq!(widens(Box::new(LocalCollective)), 1);
    }
}
