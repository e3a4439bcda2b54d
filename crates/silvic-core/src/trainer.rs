//! [`TrainerCollective`]: the op set of the gradient-boosting trainers people already run
//! distributed (LightGBM's network hooks, XGBoost's collective), beyond silvic's own
//! [`Collective`].
//!
//! A second trait rather than more methods on [`Collective`]: the pinned trait keeps its exact
//! shape, so every existing implementation and test double still compiles, while a trainer
//! that needs the wider set asks for it by type (`Box<dyn TrainerCollective>`, which calls both).
//! Every method keeps [`Collective`]'s contract: every rank calls the same methods in the same
//! order; a peer in another call fails both sides out of step; results are bitwise the same on
//! every rank and run; a failure closes the ring and sticks.
//!
//! Invariants kept here: argument checks ([`block_bounds`], the root) are pure and the same for
//! every backend, so a world of one refuses exactly what a ring refuses.

use std::ops::Range;

use crate::{Collective, CollectiveError, Dtype, Reduction};

/// A buffer of numbers of one of the types the ring reduces, reduced in place.
#[derive(Debug)]
pub enum Numbers<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
    /// `i32` elements.
    I32(&'a mut [i32]),
    /// `i64` elements.
    I64(&'a mut [i64]),
    /// `u64` elements.
    U64(&'a mut [u64]),
    /// `i128` elements: the exact sums of fixed-point histograms. Their sums are exact and the
    /// same for any world and any order (wrapping past ±2^127, which
    /// `FixedHistogram` never lets its sums reach).
    I128(&'a mut [i128]),
}

impl Numbers<'_> {
    /// The element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            Numbers::F32(_) => Dtype::F32,
            Numbers::F64(_) => Dtype::F64,
            Numbers::I32(_) => Dtype::I32,
            Numbers::I64(_) => Dtype::I64,
            Numbers::U64(_) => Dtype::U64,
            Numbers::I128(_) => Dtype::I128,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Numbers::F32(v) => v.len(),
            Numbers::F64(v) => v.len(),
            Numbers::I32(v) => v.len(),
            Numbers::I64(v) => v.len(),
            Numbers::U64(v) => v.len(),
            Numbers::I128(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A caller's fold over fixed-size records: `fold(acc, next)` is handed equal-length runs of
/// whole records and must set each record of `acc` to its fold with the same record of `next`,
/// record by record, as a pure function of their bytes (`acc_k = f(acc_k, next_k)`), never
/// looking across records.
pub type RecordFold<'a> = &'a dyn Fn(&mut [u8], &[u8]);

/// The byte range of every block of a buffer of `len` bytes cut into blocks of the given
/// lengths, laid end to end, in a world of `world` ranks; or why they cannot be.
///
/// The lengths must be one per rank, each a whole number of `record`-byte records (blocks may
/// be empty), and add up to `len`; `record` must not be zero.
pub fn block_bounds(
    len: usize,
    blocks: &[usize],
    record: usize,
    world: usize,
) -> Result<Vec<Range<usize>>, CollectiveError> {
    let invalid = |reason: String| Err(CollectiveError::InvalidArgument { reason });
    if record == 0 {
        return invalid("the record size is zero".into());
    }
    if blocks.len() != world {
        return invalid(format!("{} block lengths for a world of {world}", blocks.len()));
    }
    let mut bounds = Vec::with_capacity(world);
    let mut start = 0usize;
    for (rank, &block) in blocks.iter().enumerate() {
        if block % record != 0 {
            return invalid(format!(
                "block {rank} is {block} bytes, not a whole number of {record}-byte records"
            ));
        }
        let Some(end) = start.checked_add(block).filter(|&end| end <= len) else {
            return invalid(format!("the block lengths add up to more than the {len}-byte buffer"));
        };
        bounds.push(start..end);
        start = end;
    }
    if start != len {
        return invalid(format!("the block lengths add up to {start} bytes, the buffer is {len}"));
    }
    Ok(bounds)
}

/// Checks that `root` is a rank of a world of `world`.
pub(crate) fn check_root(root: usize, world: usize) -> Result<(), CollectiveError> {
    if root < world {
        Ok(())
    } else {
        Err(CollectiveError::InvalidArgument {
            reason: format!("root {root} is not a rank of a world of {world}"),
        })
    }
}

/// The collectives gradient-boosting trainers need beyond [`Collective`]: reductions of more
/// element types, a reduce-scatter and an allreduce with the caller's fold over records, a
/// variable-length allgather and a broadcast.
///
/// The trait is object safe. Arguments that cannot be right ([`block_bounds`], a root outside
/// the world) fail with [`CollectiveError::InvalidArgument`]; on a ring that closes it, so the
/// other ranks fail at once naming this rank instead of waiting out their timeout.
///
/// ```
/// use silvic_core::{LocalCollective, Numbers, Reduction, TrainerCollective};
///
/// let mut ring: Box<dyn TrainerCollective> = Box::new(LocalCollective);
/// let mut gains = [0.5f32, -2.0];
/// ring.allreduce(Numbers::F32(&mut gains), Reduction::Max)?;
/// assert_eq!(gains, [0.5, -2.0]); // a world of one: the maximum is the input
/// let mut model = b"tree 0".to_vec();
/// ring.broadcast_bytes(&mut model, 0)?;
/// assert_eq!(ring.allgather_varlen(&model)?, [b"tree 0".to_vec()]);
/// # Ok::<(), silvic_core::CollectiveError>(())
/// ```
pub trait TrainerCollective: Collective {
    /// Replaces every element of `buf` with its `reduction` over all ranks.
    ///
    /// Elements fold in the same fixed rank order as [`Collective::allreduce_sum_f64`] (so a sum
    /// of f64 here is the same op, with the same bits, as that method), with silvic-core's
    /// combiners ([`crate::fold`]): float sums in IEEE 754, integer sums wrapping, min and max
    /// of floats propagating NaN. Every rank passes the same type and length.
    fn allreduce(&mut self, buf: Numbers<'_>, reduction: Reduction) -> Result<(), CollectiveError>;

    /// Reduces `buf` block by block: `blocks[i]` bytes (laid end to end from the start of
    /// `buf`, a whole number of `record`-byte records, possibly none) are folded over every rank
    /// with `fold`, and rank `i` keeps block `i`.
    ///
    /// On return this rank's block of `buf` holds, record by record, the fold of every rank's
    /// block in rank order `i + 1, i + 2, …, i` (mod world, starting from rank `i + 1`'s bytes
    /// and ending with the owner's): `acc = fold(acc, next)`. That order depends only on the
    /// block and the world size, so the bits are the same on every run. The other blocks'
    /// bytes are unspecified afterwards. Every rank passes the same block lengths and record
    /// size.
    fn reduce_scatter_records(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError>;

    /// Replaces `buf`, a whole number of `record`-byte records, with its fold over all ranks:
    /// the records are cut into one block per rank (contiguous, in order, counts differing by at
    /// most one, the first ones longer), each block reduced as
    /// [`TrainerCollective::reduce_scatter_records`] folds it (rank order `i + 1, …, i` for block
    /// `i`), then gathered, so every rank holds the same bits.
    fn allreduce_records(
        &mut self,
        buf: &mut [u8],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError>;

    /// Gathers `buf`'s blocks, whose lengths every rank knows: `buf` is cut into `blocks`
    /// (bytes, laid end to end, one per rank, the same on every rank); this rank's block holds
    /// its bytes on entry, and on return every block holds its rank's. One round of frames,
    /// where [`TrainerCollective::allgather_varlen`] first learns the lengths.
    fn allgather_blocks(&mut self, buf: &mut [u8], blocks: &[usize])
    -> Result<(), CollectiveError>;

    /// Every rank's bytes, indexed by rank, on every rank; each rank may pass any length, and
    /// the lengths are learned in the call.
    fn allgather_varlen(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError>;

    /// Replaces `buf` on every rank with the bytes rank `root` passed (any length). Every rank
    /// passes the same root; what a rank other than `root` passes in `buf` is discarded.
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_bounds_cut_the_buffer_in_order_and_name_what_is_wrong() {
        assert_eq!(block_bounds(10, &[4, 0, 6], 2, 3).unwrap(), [0..4, 4..4, 4..10]);
        assert_eq!(block_bounds(0, &[0, 0], 8, 2).unwrap(), [0..0, 0..0]);
        let reason = |r: Result<_, CollectiveError>| r.unwrap_err().to_string();
        assert!(reason(block_bounds(10, &[4, 6], 0, 2)).contains("record size is zero"));
        assert!(reason(block_bounds(10, &[10], 2, 2)).contains("1 block lengths"));
        assert!(reason(block_bounds(10, &[3, 7], 2, 2)).contains("block 0 is 3 bytes"));
        assert!(reason(block_bounds(10, &[4, 8], 2, 2)).contains("more than the 10-byte"));
        assert!(reason(block_bounds(10, &[4, 4], 2, 2)).contains("add up to 8 bytes"));
        let huge = block_bounds(10, &[usize::MAX - 1, 2], 1, 2);
        assert!(reason(huge).contains("more than"));
    }
}
