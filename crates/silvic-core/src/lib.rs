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
pub mod fold;

pub use error::{CollectiveError, Op, RoundedDuration};

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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
