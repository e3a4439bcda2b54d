//! The ring_frames oracle: one collective of rank 0 in a world of two to five or eight, through
//! the real ring algorithms and the ring link's frame reader, in memory
//! (`silvic_net::fuzzing::replay`): each peer's stream is some of the fuzzer's bytes, then its
//! close. An allreduce takes the path the choice picks (the gather, at these sizes, where hops
//! are short) or the path the input forces: the ring (its reduce-scatter and its segments
//! gathered both ways, leftward frames included), the gather, Bruck's gather or
//! index-fold-gather over chord streams; where the input says hops are long, the choice weighs
//! every path, and allgathers take Bruck's rounds.
//!
//! Checked: the collective returns (no panic; a slice cannot hang), with an error naming a rank
//! of the world (one of its peers, unless a peer's abort names another) or with a result that
//! is what the frames said: on the two-way gather of a world of two or three, every element is
//! the fold, in its segment's fold order, of this rank's value and the ones its neighbours
//! sent; for an allgather there, each neighbour's block is its payload.

use silvic_core::fold;
use silvic_net::frame::{HEADER_LEN, WAITING, WAITING_LEN};
use silvic_net::fuzzing::{Buffer, Setup, gather_limit, peers, replay};
use silvic_net::{AllreducePath, CollectiveError, Numbers, Reduction};

/// What rank 0 is asked to do, and with what.
#[derive(Debug, Clone, Copy)]
enum Call {
    SumF64,
    SumI64,
    MaxF64,
    Gather,
    /// The trainers' ops: a typed allreduce of f32 (min), u64 (sum) or i32 (max).
    MinF32,
    SumU64,
    MaxI32,
    /// An exact sum of i128 (the fixed-point histograms' op).
    SumI128,
    /// A reduce-scatter of unequal 4-byte-record blocks, and a record allreduce.
    Records,
    RecordsAllreduce,
    Varlen,
    /// A broadcast from rank 1 (a neighbour in both worlds).
    Broadcast,
    /// An allgather of known, unequal blocks: rank r's is `(len + r) % 7` bytes.
    Blocks,
}

/// The record fold of the replays: 4-byte records, wrapping `3 × acc + next`.
fn record_fold(acc: &mut [u8], next: &[u8]) {
    for (a, n) in acc.chunks_exact_mut(4).zip(next.chunks_exact(4)) {
        let x = u32::from_le_bytes(a.try_into().unwrap());
        let y = u32::from_le_bytes(n.try_into().unwrap());
        a.copy_from_slice(&x.wrapping_mul(3).wrapping_add(y).to_le_bytes());
    }
}

/// What a call returned, in a form the oracle compares.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Reduced(Vec<u64>),
    Gathered(Vec<Vec<u8>>),
}

/// What rank 0 of a replay runs: the call, its length, where it runs, and one stream per peer
/// (in the order of `peers`).
#[derive(Debug, Clone)]
struct Case<'a> {
    call: Call,
    len: usize,
    setup: Setup,
    streams: Vec<&'a [u8]>,
}

fn run(c: &Case<'_>) -> Result<Outcome, CollectiveError> {
    let bits = |v: Vec<f64>| Outcome::Reduced(v.into_iter().map(f64::to_bits).collect());
    let replay = |buf| replay(c.setup, buf, &c.streams);
    match c.call {
        Call::SumF64 | Call::MaxF64 => {
            let mut buf = local_f64(c.len);
            let b = if matches!(c.call, Call::SumF64) {
                Buffer::SumF64(&mut buf)
            } else {
                Buffer::MaxF64(&mut buf)
            };
            replay(b)?;
            Ok(bits(buf))
        }
        Call::SumI64 => {
            let mut buf = local_i64(c.len);
            replay(Buffer::SumI64(&mut buf))?;
            Ok(Outcome::Reduced(buf.into_iter().map(|x| x as u64).collect()))
        }
        Call::Gather => {
            let blocks = replay(Buffer::Gather(&local_bytes(c.len)))?;
            Ok(Outcome::Gathered(blocks.expect("a gather returns blocks")))
        }
        Call::MinF32 => {
            let mut buf: Vec<f32> = local_f64(c.len).into_iter().map(|x| x as f32).collect();
            replay(Buffer::Typed(Numbers::F32(&mut buf), Reduction::Min))?;
            Ok(Outcome::Reduced(buf.into_iter().map(|x| u64::from(x.to_bits())).collect()))
        }
        Call::SumU64 => {
            let mut buf: Vec<u64> = local_i64(c.len).into_iter().map(|x| x as u64).collect();
            replay(Buffer::Typed(Numbers::U64(&mut buf), Reduction::Sum))?;
            Ok(Outcome::Reduced(buf))
        }
        Call::MaxI32 => {
            let mut buf: Vec<i32> = local_i64(c.len).into_iter().map(|x| x as i32).collect();
            replay(Buffer::Typed(Numbers::I32(&mut buf), Reduction::Max))?;
            Ok(Outcome::Reduced(buf.into_iter().map(|x| x as u64).collect()))
        }
        Call::SumI128 => {
            let mut buf = local_i128(c.len);
            replay(Buffer::Typed(Numbers::I128(&mut buf), Reduction::Sum))?;
            // Each element as its low and high words, in order.
            let words = buf.into_iter().flat_map(|x| [x as u64, (x >> 64) as u64]);
            Ok(Outcome::Reduced(words.collect()))
        }
        Call::Records => {
            // Unequal blocks: rank r's is (len + r) % 5 records, one of them often empty.
            let blocks: Vec<usize> = (0..c.setup.world).map(|r| (c.len + r) % 5 * 4).collect();
            let mut buf = local_bytes(blocks.iter().sum());
            replay(Buffer::Records(&mut buf, &blocks, 4, record_fold))?;
            Ok(Outcome::Gathered(vec![buf]))
        }
        Call::RecordsAllreduce => {
            let mut buf = local_bytes(c.len / 4 * 4);
            replay(Buffer::RecordsAllreduce(&mut buf, 4, record_fold))?;
            Ok(Outcome::Gathered(vec![buf]))
        }
        Call::Varlen => {
            let blocks = replay(Buffer::Varlen(&local_bytes(c.len)))?;
            Ok(Outcome::Gathered(blocks.expect("a gather returns blocks")))
        }
        Call::Blocks => {
            let blocks: Vec<usize> = (0..c.setup.world).map(|r| (c.len + r) % 7).collect();
            let mut buf = local_bytes(blocks.iter().sum());
            replay(Buffer::Blocks(&mut buf, &blocks))?;
            assert_eq!(buf[..blocks[0]], local_bytes(blocks[0])[..], "this rank's block changed");
            Ok(Outcome::Gathered(vec![buf]))
        }
        Call::Broadcast => {
            let mut buf = local_bytes(c.len);
            replay(Buffer::Broadcast(&mut buf, 1))?;
            Ok(Outcome::Gathered(vec![buf]))
        }
    }
}

fn local_f64(len: usize) -> Vec<f64> {
    (0..len).map(|i| i as f64 * 0.5 - 3.0).collect()
}

fn local_i64(len: usize) -> Vec<i64> {
    (0..len as i64).map(|i| i * 3 - 7).collect()
}

fn local_i128(len: usize) -> Vec<i128> {
    (0..len as i128).map(|i| (i * 3 - 7) << 70 | i).collect()
}

fn local_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}

/// The payload of the first data frame of `stream`, past any waiting notices (as much of it as
/// there is).
fn first_payload(mut stream: &[u8]) -> &[u8] {
    while stream.len() >= HEADER_LEN && stream[2] == WAITING {
        stream = &stream[(HEADER_LEN + WAITING_LEN).min(stream.len())..];
    }
    &stream[HEADER_LEN.min(stream.len())..]
}

/// The segment of element `i` of `len` cut into `world` segments (the first `len % world` one
/// longer).
fn segment_of(i: usize, len: usize, world: usize) -> usize {
    let (base, extra) = (len / world, len % world);
    let long = extra * (base + 1);
    if i < long { i / (base + 1) } else { extra + (i - long) / base }
}

/// Checks a successful result of the two-way gather in a world of two or three against the
/// first frame each neighbour sent: rank 1's block comes from the right neighbour, the last
/// rank's from the left (in a world of two, both are rank 1 and its block comes rightward, from
/// the left). Other paths and worlds are checked for their errors alone.
fn check_result(c: &Case<'_>, outcome: &Outcome) {
    let Setup { world, path, long_hops } = c.setup;
    if world > 3 || long_hops {
        return;
    }
    let stream = |s: usize| c.streams.get(s).copied().unwrap_or_default();
    let mut theirs = vec![&[][..]; world];
    theirs[world - 1] = first_payload(stream(0));
    if world > 2 {
        theirs[1] = first_payload(stream(1));
    }
    let word =
        |r: usize, i: usize| u64::from_le_bytes(theirs[r][8 * i..8 * i + 8].try_into().unwrap());
    let len = c.len;
    // The allreduce took the two-way gather: chosen below the cut, or forced (it carries every
    // size here).
    let gathered = match path {
        AllreducePath::Auto => len * 8 < gather_limit(world),
        path => path == AllreducePath::Gather,
    };
    match (c.call, outcome) {
        (Call::Gather, Outcome::Gathered(blocks)) => {
            assert_eq!(blocks.len(), world);
            assert_eq!(blocks[0], local_bytes(len), "this rank's own block changed");
            for r in 1..world {
                assert_eq!(blocks[r], theirs[r][..len], "rank {r}'s block is not what it sent");
            }
        }
        (Call::Varlen, Outcome::Gathered(blocks)) => {
            assert_eq!(blocks.len(), world);
            assert_eq!(blocks[0], local_bytes(len), "this rank's own block changed");
        }
        (Call::SumF64 | Call::MaxF64, Outcome::Reduced(got)) if gathered => {
            let f = if matches!(c.call, Call::SumF64) { fold::sum_f64 } else { fold::max_f64 };
            let mine = local_f64(len);
            for (i, &g) in got.iter().enumerate() {
                let value = |r: usize| if r == 0 { mine[i] } else { f64::from_bits(word(r, i)) };
                let j = segment_of(i, len, world);
                let order = (0..world).map(|k| (j + k) % world);
                let want = order.skip(1).fold(value(j), |acc, r| f(acc, value(r)));
                assert_eq!(
                    g,
                    want.to_bits(),
                    "element {i}: got {}, folded {want}",
                    f64::from_bits(g)
                );
            }
        }
        (Call::SumI128, Outcome::Reduced(got))
            if path == AllreducePath::Gather
                || (path == AllreducePath::Auto && len * 16 < gather_limit(world)) =>
        {
            let wide = |r: usize, i: usize| {
                let bytes: [u8; 16] = theirs[r][16 * i..16 * i + 16].try_into().unwrap();
                i128::from_le_bytes(bytes)
            };
            let mine = local_i128(len);
            for i in 0..len {
                let want = (1..world).fold(mine[i], |acc, r| acc.wrapping_add(wide(r, i)));
                let got = i128::from(got[2 * i]) | i128::from(got[2 * i + 1]) << 64;
                assert_eq!(got, want, "element {i}");
            }
        }
        (Call::SumI64, Outcome::Reduced(got)) if gathered => {
            let mine = local_i64(len);
            for (i, &g) in got.iter().enumerate() {
                let want = (1..world).fold(mine[i], |acc, r| acc.wrapping_add(word(r, i) as i64));
                assert_eq!(g as i64, want, "element {i}");
            }
        }
        _ => {}
    }
}

/// One input: `[selector, len_lo, len_hi, rest...]`. The selector's low two bits pick the call;
/// bit 2 a world of three (else two); bit 3 the ring path for an allreduce; bits 4 to 6, when
/// not all zero, pick one of the trainers' ops instead (1 to 7: min of f32, sum of u64, max of
/// i32, record reduce-scatter, record allreduce, variable-length allgather, broadcast); bit 7,
/// with bits 4 to 6 zero, the allgather of known blocks, and with them 1, a sum of i128. The length is the low ten bits of
/// `len` (modulo 701). `len_hi`'s high bits, where not zero, say more: bits 2 to 4 a forced
/// path (`AllreducePath::ALL[k]` for `k` from 1: the ring, the gather, Bruck's, the index; 7 the
/// choice's where hops are long; others as bit 3 says) and bits 5 and 6 a larger world (1:
/// four, 2: five, 3: eight; 0: as bit 2 says).
///
/// In a world of two `rest` is the left neighbour's stream and the right one sends nothing; in
/// a larger world of `k` streams (`peers`), `rest` is `k - 1` splits (`u16` LE) and then the
/// streams, stream `s` taking the next `split s` bytes (modulo what is left) and the last the
/// rest.
pub fn ring_frames(data: &[u8]) {
    let [selector, lo, hi, rest @ ..] = data else { return };
    let trainer = [
        Call::MinF32,
        Call::SumU64,
        Call::MaxI32,
        Call::Records,
        Call::RecordsAllreduce,
        Call::Varlen,
        Call::Broadcast,
    ];
    let call = match (selector >> 4) & 7 {
        0 if selector & 0x80 != 0 => Call::Blocks,
        1 if selector & 0x80 != 0 => Call::SumI128,
        0 => [Call::SumF64, Call::SumI64, Call::MaxF64, Call::Gather][*selector as usize % 4],
        k => trainer[k as usize - 1],
    };
    // Up to 700 elements: both sides of the 4 KiB cut below which the gather is always taken.
    let len = u16::from_le_bytes([*lo, hi & 0x03]) as usize % 701;
    let world = match (hi >> 5) & 3 {
        0 if selector & 4 == 0 => 2,
        0 => 3,
        w => [4, 5, 8][usize::from(w) - 1],
    };
    let by_bit = if selector & 8 == 0 { AllreducePath::Auto } else { AllreducePath::Ring };
    // Every path there is, a new one too: `AllreducePath::ALL` from its second (auto is first).
    let (path, long_hops) = match usize::from((hi >> 2) & 7) {
        7 => (AllreducePath::Auto, true),
        k => (AllreducePath::ALL.get(k).filter(|_| k > 0).copied().unwrap_or(by_bit), false),
    };
    let Some(streams) = split_streams(rest, peers(world).len(), world) else { return };
    let setup = Setup { world, path, long_hops };
    let case = Case { call, len, setup, streams };
    match run(&case) {
        Ok(outcome) => check_result(&case, &outcome),
        Err(e) => {
            // A peer's abort names ranks it says, checked against the world; anything else
            // names a peer.
            match &e {
                CollectiveError::Aborted { origin, .. } => {
                    assert!(*origin < world, "an abort from outside the world: {e}");
                    assert!(e.peer().is_some_and(|p| p < world), "{e}");
                }
                _ => {
                    let peers = peers(world);
                    assert!(e.peer().is_some_and(|p| peers.contains(&p)), "{e}");
                }
            }
            assert!(!e.to_string().chars().any(char::is_control), "{e:?}");
        }
    }
}

/// `rest` cut into the `k` streams of a world of `world`: in a world of two (no splits) all of
/// it the left neighbour's; else `k - 1` splits (`u16` LE) first, each taking that many of the
/// bytes left (modulo what there is), the last stream the rest. `None` where the splits are cut
/// short.
fn split_streams(rest: &[u8], k: usize, world: usize) -> Option<Vec<&[u8]>> {
    if world == 2 {
        return Some(vec![rest, &[]]);
    }
    let (splits, mut bytes) = rest.split_at_checked(2 * (k - 1))?;
    let mut streams = Vec::with_capacity(k);
    for split in splits.chunks_exact(2) {
        let n = usize::from(u16::from_le_bytes([split[0], split[1]])) % (bytes.len() + 1);
        let (stream, left) = bytes.split_at(n);
        streams.push(stream);
        bytes = left;
    }
    streams.push(bytes);
    Some(streams)
}
