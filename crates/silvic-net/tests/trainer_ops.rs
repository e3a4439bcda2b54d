//! The trainers' op set ([`TrainerCollective`]) over real sockets, ranks as threads on
//! loopback: every op's result on every rank against an oracle of the documented fold order,
//! ranks calling different ops or passing different lengths failing naming a peer, and an
//! argument one rank refuses failing the others at once, naming it.

mod common;

use std::time::Duration;

use common::ring_of_threads;
use silvic_net::{
    Collective, CollectiveError, Numbers, Reduction, TcpCollective, TrainerCollective,
};

const LIMIT: Duration = Duration::from_secs(60);

/// Values whose f32/f64 sums depend on the order, and integers that overflow.
fn value(rank: usize, i: usize) -> f64 {
    ((i * 7 + rank * 13) % 17) as f64 * 0.1 + 1e7 * (rank % 2) as f64 - 3.0
}

/// The segment of element `i` (the first `len % world` segments one longer).
fn segment_of(i: usize, len: usize, world: usize) -> usize {
    let (base, extra) = (len / world, len % world);
    let long = extra * (base + 1);
    if i < long { i / (base + 1) } else { extra + (i - long) / base }
}

/// Element `i` folded over ranks `j, j + 1, …` of its segment `j`, as bits.
fn oracle<T: Copy>(
    world: usize,
    len: usize,
    of: impl Fn(usize, usize) -> T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    (0..len)
        .map(|i| {
            let j = segment_of(i, len, world);
            (1..world).fold(of(j, i), |acc, k| f(acc, of((j + k) % world, i)))
        })
        .collect()
}

/// Every reduction of every type, at a small and a ring-path length, on worlds 1 to 4.
#[test]
fn typed_allreduces_give_every_rank_the_fold_order_bits() {
    for world in 1..=4 {
        let results = ring_of_threads(world, LIMIT, move |rank, mut ring| {
            let mut out = Vec::new();
            for len in [0, 1, 7, 5000] {
                for reduction in Reduction::ALL {
                    let f32s = |r: usize| (0..len).map(|i| value(r, i) as f32).collect::<Vec<_>>();
                    let mut a = f32s(rank);
                    ring.allreduce(Numbers::F32(&mut a), reduction).unwrap();
                    let mut b: Vec<f64> = (0..len).map(|i| value(rank, i)).collect();
                    ring.allreduce(Numbers::F64(&mut b), reduction).unwrap();
                    let mut c: Vec<i32> = (0..len).map(|i| i32::MAX - (i * rank) as i32).collect();
                    ring.allreduce(Numbers::I32(&mut c), reduction).unwrap();
                    let mut d: Vec<i64> = (0..len).map(|i| (i as i64 - 3) * rank as i64).collect();
                    ring.allreduce(Numbers::I64(&mut d), reduction).unwrap();
                    let mut e: Vec<u64> = (0..len).map(|i| u64::MAX - (i + rank) as u64).collect();
                    ring.allreduce(Numbers::U64(&mut e), reduction).unwrap();
                    out.push((len, reduction, a, b, c, d, e));
                }
            }
            out
        });
        for (rank, calls) in results.iter().enumerate() {
            for (len, reduction, a, b, c, d, e) in calls {
                let (len, case) =
                    (*len, format!("world {world} rank {rank} {reduction:?} len {len}"));
                use silvic_core::fold;
                let (fa, fb): (F32Fold, F64Fold) = match reduction {
                    Reduction::Sum => (fold::sum_f32, fold::sum_f64),
                    Reduction::Min => (fold::min_f32, fold::min_f64),
                    Reduction::Max => (fold::max_f32, fold::max_f64),
                };
                let want = oracle(world, len, |r, i| value(r, i) as f32, fa);
                assert_eq!(bits32(a), bits32(&want), "{case} f32");
                let want = oracle(world, len, value, fb);
                assert_eq!(bits64(b), bits64(&want), "{case} f64");
                let int = |x: i64, y: i64| match reduction {
                    Reduction::Sum => x.wrapping_add(y),
                    Reduction::Min => x.min(y),
                    Reduction::Max => x.max(y),
                };
                let int32 = |x: i32, y: i32| match reduction {
                    Reduction::Sum => x.wrapping_add(y),
                    Reduction::Min => x.min(y),
                    Reduction::Max => x.max(y),
                };
                let want = oracle(world, len, |r, i| i32::MAX - (i * r) as i32, int32);
                assert_eq!(c, &want, "{case} i32");
                let want = oracle(world, len, |r, i| (i as i64 - 3) * r as i64, int);
                assert_eq!(d, &want, "{case} i64");
                let want = oracle(
                    world,
                    len,
                    |r, i| u64::MAX - (i + r) as u64,
                    |x, y| match reduction {
                        Reduction::Sum => x.wrapping_add(y),
                        Reduction::Min => x.min(y),
                        Reduction::Max => x.max(y),
                    },
                );
                assert_eq!(e, &want, "{case} u64");
            }
        }
    }
}

type F32Fold = fn(f32, f32) -> f32;
type F64Fold = fn(f64, f64) -> f64;

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bits64(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A fold that shows its order: 8-byte records, `acc = 3 × acc + next` (wrapping).
fn ordered(acc: &mut [u8], next: &[u8]) {
    for (a, n) in acc.chunks_exact_mut(8).zip(next.chunks_exact(8)) {
        let x = u64::from_le_bytes(a.try_into().unwrap());
        let y = u64::from_le_bytes(n.try_into().unwrap());
        a.copy_from_slice(&x.wrapping_mul(3).wrapping_add(y).to_le_bytes());
    }
}

fn record(rank: usize, k: usize) -> u64 {
    (rank as u64 + 1) * 1000 + k as u64
}

fn records(rank: usize, n: usize) -> Vec<u8> {
    (0..n).flat_map(|k| record(rank, k).to_le_bytes()).collect()
}

/// Record `k` of block `j` folded over ranks `j + 1, …, j`.
fn folded(world: usize, j: usize, k: usize) -> u64 {
    (2..=world).fold(record((j + 1) % world, k), |acc, s| {
        acc.wrapping_mul(3).wrapping_add(record((j + s) % world, k))
    })
}

#[test]
fn reduce_scatter_and_allreduce_of_records_fold_in_the_documented_order() {
    for world in 1..=5 {
        // Unequal blocks, one of them empty, one of a single record.
        let layout: Vec<usize> = (0..world).map(|j| [3, 0, 1, 40_000, 2][j]).collect();
        let results = ring_of_threads(world, LIMIT, {
            let layout = layout.clone();
            move |rank, mut ring| {
                let total: usize = layout.iter().sum();
                let mut buf = records(rank, total);
                let blocks: Vec<usize> = layout.iter().map(|n| n * 8).collect();
                ring.reduce_scatter_records(&mut buf, &blocks, 8, &ordered).unwrap();
                let start: usize = layout[..rank].iter().sum();
                let mine = buf[start * 8..][..blocks[rank]].to_vec();
                let mut all = records(rank, 1001);
                ring.allreduce_records(&mut all, 8, &ordered).unwrap();
                (start, mine, all)
            }
        });
        for (rank, (start, mine, all)) in results.into_iter().enumerate() {
            let want: Vec<u8> = (0..layout[rank])
                .flat_map(|k| folded(world, rank, start + k).to_le_bytes())
                .collect();
            assert!(mine == want, "world {world} rank {rank}: reduce-scatter");
            let want: Vec<u8> = (0..1001)
                .flat_map(|k| folded(world, segment_of(k, 1001, world), k).to_le_bytes())
                .collect();
            assert!(all == want, "world {world} rank {rank}: allreduce");
        }
    }
}

#[test]
fn varlen_allgather_broadcast_and_block_allgather_deliver_every_length() {
    for world in 1..=5 {
        let results = ring_of_threads(world, LIMIT, move |rank, mut ring| {
            let local: Vec<u8> = (0..rank * 3000).map(|i| (i + rank) as u8).collect();
            let gathered = ring.allgather_varlen(&local).unwrap();
            let root = world - 1;
            let mut model = if rank == root { b"the model".repeat(1000) } else { vec![7; 5] };
            ring.broadcast_bytes(&mut model, root).unwrap();
            let mut empty = vec![1u8; rank];
            ring.broadcast_bytes(&mut empty, 0).unwrap();
            // Known lengths: rank r's block is r × 1000 bytes of r + 1.
            let blocks: Vec<usize> = (0..world).map(|r| r * 1000).collect();
            let mut buf = vec![0u8; blocks.iter().sum()];
            let start: usize = blocks[..rank].iter().sum();
            buf[start..start + blocks[rank]].fill(rank as u8 + 1);
            ring.allgather_blocks(&mut buf, &blocks).unwrap();
            (gathered, model, empty, buf)
        });
        for (rank, (gathered, model, empty, blocks)) in results.into_iter().enumerate() {
            let want: Vec<u8> = (0..world).flat_map(|r| vec![r as u8 + 1; r * 1000]).collect();
            assert!(blocks == want, "world {world} rank {rank}: allgather_blocks");
            for (r, block) in gathered.iter().enumerate() {
                let want: Vec<u8> = (0..r * 3000).map(|i| (i + r) as u8).collect();
                assert!(block == &want, "world {world} rank {rank}: block {r}");
            }
            assert_eq!(gathered.len(), world);
            assert!(model == b"the model".repeat(1000), "world {world} rank {rank}");
            assert!(empty.is_empty(), "world {world} rank {rank}: rank 0's empty bytes");
        }
    }
}

/// The typed spelling of a pinned allreduce is the same op: mixing the two is in step.
#[test]
fn a_typed_sum_of_f64_is_the_pinned_op() {
    let results = ring_of_threads(3, LIMIT, |rank, mut ring| {
        let mut buf = vec![rank as f64 + 0.5; 600];
        if rank == 1 {
            ring.allreduce_sum_f64(&mut buf).unwrap();
        } else {
            ring.allreduce(Numbers::F64(&mut buf), Reduction::Sum).unwrap();
        }
        buf[0]
    });
    assert_eq!(results, [4.5; 3]);
}

fn cause(error: &CollectiveError) -> &CollectiveError {
    match error {
        CollectiveError::Aborted { cause, .. } => cause,
        other => other,
    }
}

/// Ranks calling different new ops fail out of step, naming another rank, and the error
/// sticks.
#[test]
fn ranks_calling_different_new_ops_fail_out_of_step() {
    let results = ring_of_threads(4, LIMIT, |rank, mut ring: TcpCollective| {
        let error = match rank {
            0 => ring.broadcast_bytes(&mut vec![1; 10], 0).unwrap_err(),
            1 => ring.allgather_varlen(b"x").unwrap_err(),
            2 => ring.allgather_blocks(&mut [0; 4], &[1; 4]).unwrap_err(),
            _ => ring.reduce_scatter_records(&mut [0; 32], &[8; 4], 8, &ordered).unwrap_err(),
        };
        (error.clone(), ring.allgather_bytes(b"later").unwrap_err(), rank)
    });
    for (error, later, rank) in &results {
        assert!(matches!(cause(error), CollectiveError::OutOfStep { .. }), "rank {rank}: {error}");
        assert_ne!(error.peer(), Some(*rank), "rank {rank}: {error}");
        assert_eq!(error, later, "rank {rank}: the error must stick");
    }
}

/// Ranks that cut a reduce-scatter into other blocks fail naming a peer; one rank whose
/// arguments are refused fails every other rank at once (well before their 60 s timeout),
/// naming it as the origin.
#[test]
fn other_lengths_and_refused_arguments_fail_every_rank_naming_a_peer() {
    let results = ring_of_threads(4, LIMIT, |rank, mut ring: TcpCollective| {
        let blocks = if rank == 2 { [16, 8, 8, 0] } else { [8, 8, 8, 8] };
        let error = ring.reduce_scatter_records(&mut [0; 32], &blocks, 8, &ordered).unwrap_err();
        (error, rank)
    });
    for (error, rank) in &results {
        assert!(error.peer().is_some_and(|p| p != *rank), "rank {rank}: {error}");
    }
    let started = std::time::Instant::now();
    let results = ring_of_threads(4, LIMIT, |rank, mut ring: TcpCollective| {
        let root = if rank == 3 { 9 } else { 0 };
        ring.broadcast_bytes(&mut vec![1; 3], root).unwrap_err()
    });
    assert!(started.elapsed() < Duration::from_secs(30), "waited out a timeout");
    assert_eq!(results[3].kind(), "invalid_argument", "{}", results[3]);
    for (rank, error) in results.iter().enumerate().take(3) {
        match error {
            CollectiveError::Aborted { origin: 3, cause } => {
                assert_eq!(cause.kind(), "invalid_argument", "rank {rank}: {error}")
            }
            other => panic!("rank {rank}: {other}"),
        }
    }
}
