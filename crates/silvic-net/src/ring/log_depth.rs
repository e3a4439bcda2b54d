//! The sizes of the log-depth paths (Bruck's gather, [`super::bruck`], and index-fold-gather,
//! [`super::index`]) as pure functions of the world and the buffer, for their plans and for the
//! cost model that weighs them (`super::choice`): the rounds of a world, and the index's
//! transit store and the chunks a buffer is cut into so that the store stays bounded.
//!
//! Invariants: everything here is arithmetic on `(world, length, element)`; no plan, no link.

/// Rounds of a Bruck exchange in a world of `world`: `ceil(log2 world)` (none for one rank).
pub(crate) fn rounds(world: usize) -> usize {
    match world {
        0 | 1 => 0,
        _ => (usize::BITS - (world - 1).leading_zeros()) as usize,
    }
}

/// The most bytes the index's transit store may hold; larger calls are chunked
/// (`super::index`'s module doc).
pub(crate) const STORE_MAX_BYTES: usize = 1 << 20;

/// Store cells of a world of `world`: one per slot of two or more set bits, and a second per
/// slot of three or more.
pub(crate) fn cells(world: usize) -> usize {
    (0..world).map(|i| (i.count_ones() as usize).saturating_sub(1).min(2)).sum()
}

/// Chunks a buffer of `len` elements of `elem` bytes is cut into in a world of `world`, so that
/// the store holds at most `max(cap, cells(world) × elem)` bytes.
pub(crate) fn chunks(len: usize, world: usize, elem: usize, cap: usize) -> usize {
    let longest = len.div_ceil(world);
    if cells(world) == 0 {
        return 1; // no store: nothing to bound
    }
    match cap / (cells(world) * elem.max(1)) {
        0 => longest.max(1),
        q => longest.div_ceil(q).max(1),
    }
}
