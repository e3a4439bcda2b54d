//! Where a ring plan's segments lie: the whole buffer cut into the world's segments, or one
//! channel's piece of every segment ([`Segments`]), and how a call split over channels cuts its
//! buffer into those pieces ([`channel_pieces`]).
//!
//! A call split over `C` channels gives channel `c` the `c`-th of `C` pieces of every segment
//! (each segment cut as [`schedule::segment`] cuts a buffer: in order, lengths differing by at
//! most one). Segment `j` is cut from the whole buffer by `(len, world)` alone, so element `i`
//! stays in segment `schedule::segment_of(i, len, world)` and folds over the ranks in that
//! segment's [`schedule::fold_order`] whatever `C` is: every result bit is the same for every
//! channel count. A channel runs the ring plan over its pieces as over segments, so each rank
//! sends on every step of every channel, and every channel moves about `1 / C` of each
//! segment. (Contiguous ranges of the buffer, one per channel, would keep the fold order too,
//! but a range inside one segment is a chain from one rank round the ring: one stream of the
//! channel busy at a time, so `C` channels would move no faster than one.)
//!
//! Invariants: the pieces of [`channel_pieces`] are disjoint, cover the buffer, and piece `j`
//! of channel `c` lies inside segment `j`. Not here: which calls are split, or into how many
//! channels (`super::choice`); running the channels (`channels.rs`).
//!
//! [`schedule::segment`]: super::schedule::segment
//! [`schedule::fold_order`]: super::schedule::fold_order

use super::schedule::segment;

/// The segments a ring plan works on, in segment order.
#[derive(Debug)]
pub(crate) enum Segments<'a, T> {
    /// The whole buffer, cut into the world's segments.
    Whole(&'a mut [T]),
    /// One channel's piece of every segment of the call's buffer.
    Pieces(Vec<&'a mut [T]>),
}

impl<T> Segments<'_, T> {
    /// Segment `j` (of `world`).
    pub(crate) fn part(&self, world: usize, j: usize) -> &[T] {
        match self {
            Segments::Whole(buf) => &buf[segment(buf.len(), world, j)],
            Segments::Pieces(pieces) => pieces[j],
        }
    }

    /// Segment `j` (of `world`), to be written.
    pub(crate) fn part_mut(&mut self, world: usize, j: usize) -> &mut [T] {
        match self {
            Segments::Whole(buf) => {
                let range = segment(buf.len(), world, j);
                &mut buf[range]
            }
            Segments::Pieces(pieces) => pieces[j],
        }
    }

    /// The elements of the longest segment (of `world`).
    pub(crate) fn longest(&self, world: usize) -> usize {
        match self {
            Segments::Whole(buf) => buf.len().div_ceil(world),
            Segments::Pieces(pieces) => pieces.iter().map(|p| p.len()).max().unwrap_or(0),
        }
    }
}

/// `buf` cut for `channels` channels in a world of `world`: per channel, its piece of every
/// segment, in segment order (see the module doc).
pub(crate) fn channel_pieces<T>(
    buf: &mut [T],
    world: usize,
    channels: usize,
) -> Vec<Vec<&mut [T]>> {
    let len = buf.len();
    let mut out: Vec<Vec<&mut [T]>> = (0..channels).map(|_| Vec::with_capacity(world)).collect();
    let mut rest = buf;
    for j in 0..world {
        let seg = segment(len, world, j).len();
        for (c, pieces) in out.iter_mut().enumerate() {
            let (piece, tail) =
                std::mem::take(&mut rest).split_at_mut(segment(seg, channels, c).len());
            pieces.push(piece);
            rest = tail;
        }
    }
    debug_assert!(rest.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::schedule::segment_of;

    /// Every element lands in exactly one piece, in its own segment, at its own place, for
    /// lengths shorter than the world and the channels and not divisible by either.
    #[test]
    fn pieces_partition_the_buffer_within_the_segments() {
        for world in 1..=9 {
            for channels in [1, 2, 3, 4, 8] {
                for len in [0, 1, 2, 3, 7, 8, 9, 31, 100, 257] {
                    let mut buf: Vec<usize> = (0..len).collect();
                    let pieces = channel_pieces(&mut buf, world, channels);
                    let mut seen = vec![0; len];
                    for (c, channel) in pieces.iter().enumerate() {
                        assert_eq!(channel.len(), world);
                        for (j, piece) in channel.iter().enumerate() {
                            let seg = segment(len, world, j);
                            let part = segment(seg.len(), channels, c);
                            let expected: Vec<usize> =
                                (seg.start + part.start..seg.start + part.end).collect();
                            assert_eq!(&piece[..], &expected[..], "w {world} C {channels} {len}");
                            for &i in piece.iter() {
                                assert_eq!(segment_of(i, len, world), j);
                                seen[i] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&n| n == 1), "world {world} C {channels} len {len}");
                }
            }
        }
    }

    #[test]
    fn whole_and_pieces_show_the_same_segments() {
        let (world, len) = (3, 11);
        let mut a: Vec<u32> = (0..len).collect();
        let mut b = a.clone();
        let whole = Segments::Whole(&mut a[..]);
        let mut one = channel_pieces(&mut b, world, 1);
        let pieces = Segments::Pieces(one.remove(0));
        for j in 0..world {
            assert_eq!(whole.part(world, j), pieces.part(world, j));
        }
        assert_eq!((whole.longest(world), pieces.longest(world)), (4, 4));
    }
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod channel_tests;
