//! The variable-length plans: the allgather of blocks of any length ([`allgather_varlen`]) and
//! the broadcast from a root ([`broadcast`]), both two-way gathers ([`super::gather`]) in two
//! rounds.
//!
//! Round one gathers every rank's [`Claim`] (16 bytes: its block's length and, for a
//! broadcast, the root it names), so every rank knows every length before a byte of data
//! moves; round two gathers the blocks, each frame carrying its block's length (checked before
//! its payload is used) and the sum of all of them. A broadcast is the gather in which every
//! rank but the root has an empty block: the root's bytes travel both ways round the ring and
//! every rank forwards them once.
//!
//! Invariants: a learned length never sizes an allocation. A block grows as its bytes arrive,
//! [`GROW`] at a time, so memory follows what peers send, not what they claim. Ranks that name
//! other roots, or a rank other than the root that claims bytes, fail in round one, naming it.

use silvic_core::CollectiveError;

use super::gather;
use super::seam::{Call, Link};
use super::shared::{Blocks, Flat};
use crate::frame::MAX_LEN;

/// Bytes of a claim: the block length and the root, two little-endian u64.
const CLAIM: usize = 16;

/// How much a block being received grows by at a time.
const GROW: usize = 1 << 20;

/// What a rank says in round one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    len: u64,
    root: u64,
}

impl Claim {
    fn encode(self) -> [u8; CLAIM] {
        let mut out = [0u8; CLAIM];
        out[..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..].copy_from_slice(&self.root.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Claim {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Claim { len: word(0), root: word(8) }
    }
}

/// Blocks whose lengths were learned in round one, grown as their bytes arrive.
struct Growing<'a> {
    blocks: &'a mut [Vec<u8>],
    lens: &'a [usize],
}

impl Blocks for Growing<'_> {
    fn block(&self, rank: usize) -> &[u8] {
        &self.blocks[rank]
    }
    fn expected(&self, rank: usize) -> usize {
        self.lens[rank]
    }
    fn room(&mut self, rank: usize, filled: usize) -> &mut [u8] {
        let block = &mut self.blocks[rank];
        if filled == block.len() && block.len() < self.lens[rank] {
            let grow = (self.lens[rank] - block.len()).min(GROW);
            block.resize(block.len() + grow, 0);
        }
        &mut block[filled..]
    }
}

/// Round one: every rank's claim, by rank, checked. `root` is this rank's for a broadcast.
fn claims(
    link: &mut dyn Link,
    call: Call,
    mine: Claim,
    root: Option<usize>,
) -> Result<Vec<usize>, CollectiveError> {
    let mut gathered = vec![0u8; call.world * CLAIM];
    gathered[call.rank * CLAIM..][..CLAIM].copy_from_slice(&mine.encode());
    gather::gather(link, call, CLAIM as u64, &mut Flat { buf: &mut gathered, block: CLAIM })?;
    let mut lens = Vec::with_capacity(call.world);
    for (rank, bytes) in gathered.chunks_exact(CLAIM).enumerate() {
        let claim = Claim::decode(bytes);
        let malformed = |reason: String| CollectiveError::MalformedFrame { peer: rank, reason };
        if claim.len > MAX_LEN {
            return Err(malformed(format!("rank {rank} claims a block of {} bytes", claim.len)));
        }
        match root {
            Some(root) if claim.root != root as u64 => {
                return Err(malformed(format!(
                    "rank {rank} broadcasts from root {}, this rank from root {root}",
                    claim.root
                )));
            }
            Some(root) if rank != root && claim.len != 0 => {
                return Err(malformed(format!(
                    "rank {rank} sends {} bytes in a broadcast from root {root}",
                    claim.len
                )));
            }
            None if claim.root != 0 => {
                return Err(malformed(format!("rank {rank} names a root in an allgather")));
            }
            _ => {}
        }
        lens.push(claim.len as usize);
    }
    Ok(lens)
}

/// Round two: the blocks of the learned lengths, `blocks[rank]` this rank's on entry.
fn blocks(
    link: &mut dyn Link,
    call: Call,
    lens: &[usize],
    blocks: &mut [Vec<u8>],
) -> Result<(), CollectiveError> {
    let total = lens.iter().fold(0u64, |sum, &len| sum.saturating_add(len as u64));
    gather::gather(link, call, total, &mut Growing { blocks, lens })
}

/// Every rank's `local`, by rank, each of any length.
pub(crate) fn allgather_varlen(
    link: &mut dyn Link,
    call: Call,
    local: &[u8],
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let lens = claims(link, call, Claim { len: local.len() as u64, root: 0 }, None)?;
    let mut gathered = vec![Vec::new(); call.world];
    gathered[call.rank] = local.to_vec();
    blocks(link, call, &lens, &mut gathered)?;
    Ok(gathered)
}

/// Replaces `buf` with rank `root`'s bytes (`root` checked against the world first).
pub(crate) fn broadcast(
    link: &mut dyn Link,
    call: Call,
    buf: &mut Vec<u8>,
    root: usize,
) -> Result<(), CollectiveError> {
    if root >= call.world {
        return Err(CollectiveError::InvalidArgument {
            reason: format!("root {root} is not a rank of a world of {}", call.world),
        });
    }
    let len = if call.rank == root { buf.len() as u64 } else { 0 };
    let lens = claims(link, call, Claim { len, root: root as u64 }, Some(root))?;
    let mut gathered = vec![Vec::new(); call.world];
    if call.rank == root {
        gathered[root] = std::mem::take(buf);
    }
    blocks(link, call, &lens, &mut gathered)?;
    *buf = std::mem::take(&mut gathered[root]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Driver, on_ring};
    use silvic_core::Op;

    fn bytes(rank: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + rank * 7 + 1) as u8).collect()
    }

    #[test]
    fn varlen_allgather_delivers_every_length_to_every_rank() {
        for world in 1..=16 {
            let layouts: Vec<Vec<usize>> = vec![
                vec![0; world],
                vec![1; world],
                (0..world).map(|r| (r * 37) % 11).collect(),
                (0..world).map(|r| if r == world / 2 { 5000 } else { 0 }).collect(),
            ];
            for layout in &layouts {
                let driver = Driver::new(world).capacity(2).piece(333);
                let results = on_ring(driver, |r, link| {
                    let call = Call { rank: r, world, op: Op::AllgatherVarlen, seq: 0 };
                    allgather_varlen(link, call, &bytes(r, layout[r])).unwrap()
                });
                for (r, got) in results.into_iter().enumerate() {
                    let want: Vec<Vec<u8>> = (0..world).map(|b| bytes(b, layout[b])).collect();
                    assert!(got == want, "world {world} rank {r}");
                }
            }
        }
    }

    #[test]
    fn broadcast_gives_every_rank_the_roots_bytes() {
        for world in 1..=16 {
            for root in [0, world / 2, world - 1] {
                for len in [0, 1, 4099] {
                    let results = on_ring(Driver::new(world).piece(1000), |r, link| {
                        let mut buf = bytes(r, if r == root { len } else { 3 });
                        let call = Call { rank: r, world, op: Op::BroadcastBytes, seq: 0 };
                        broadcast(link, call, &mut buf, root).unwrap();
                        buf
                    });
                    for (r, got) in results.into_iter().enumerate() {
                        assert!(got == bytes(root, len), "world {world} root {root} rank {r}");
                    }
                }
            }
        }
    }

    /// Ranks naming other roots fail in round one, every rank naming a rank that disagrees with
    /// it, before any data moves; a root outside the world is refused before any frame.
    #[test]
    fn ranks_that_name_other_roots_fail_naming_one() {
        let results = on_ring(Driver::new(4), |r, link| {
            let mut buf = bytes(r, 3);
            let call = Call { rank: r, world: 4, op: Op::BroadcastBytes, seq: 0 };
            broadcast(link, call, &mut buf, if r == 2 { 1 } else { 0 })
        });
        for (r, result) in results.into_iter().enumerate() {
            let e = result.unwrap_err();
            let expected = if r == 2 { 0 } else { 2 };
            assert_eq!(e.peer(), Some(expected), "rank {r}: {e}");
            assert!(e.to_string().contains("broadcasts from root"), "rank {r}: {e}");
        }
        let refused = on_ring(Driver::new(2), |r, link| {
            let call = Call { rank: r, world: 2, op: Op::BroadcastBytes, seq: 0 };
            (broadcast(link, call, &mut Vec::new(), 2), link.sent.clone())
        });
        for (result, sent) in refused {
            assert_eq!(result.unwrap_err().kind(), "invalid_argument");
            assert!(sent.iter().all(|&n| n == 0));
        }
    }

    #[test]
    fn a_block_grows_as_its_bytes_arrive_not_as_its_length_claims() {
        let lens = [0, 3 * GROW + 1];
        let mut blocks = vec![Vec::new(), Vec::new()];
        let mut growing = Growing { blocks: &mut blocks, lens: &lens };
        assert_eq!(growing.room(1, 0).len(), GROW);
        assert_eq!(growing.room(1, 10).len(), GROW - 10, "no growth before the room is full");
        assert_eq!(growing.room(1, GROW).len(), GROW);
        assert!(growing.room(0, 0).is_empty());
        assert_eq!(blocks[1].len(), 2 * GROW);
    }
}
