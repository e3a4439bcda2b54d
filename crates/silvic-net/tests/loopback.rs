//! Rings of threads on loopback: every op, world sizes 1 to 8, lengths around every boundary
//! (the 4 KiB floor of the gather path and the cut the cost model picks for each world).
//! Results must equal a sequential reference in fold order, bit for bit, on every rank and run.
//! Worlds up to 16 at every cut run over the in-memory driver in the crate's own tests (src/ring/).

mod common;

use std::time::Duration;

use common::ring_of_threads;
use silvic_net::Collective;

const WORLDS: [usize; 6] = [1, 2, 3, 4, 5, 8];

fn lengths(world: usize) -> Vec<usize> {
    let mut l = vec![0, 1, world.saturating_sub(1), world, world + 1, 511, 512, 513];
    l.dedup();
    l
}

/// Values whose f64 sum depends on the order of folding, so a wrong order shows in the bits.
fn value(rank: usize, i: usize) -> f64 {
    let magnitude = if (i + rank) % 3 == 0 { 1e16 } else { 1.0 };
    ((i * 31 + rank * 17) % 101) as f64 * 0.37 * magnitude * if rank % 2 == 0 { 1.0 } else { -1.0 }
}

/// Segment of element i, as the ring cuts it: the first len % world segments are one longer.
fn segment_of(i: usize, len: usize, world: usize) -> usize {
    let (base, extra) = (len / world, len % world);
    let long = extra * (base + 1);
    if i < long { i / (base + 1) } else { extra + (i - long) / base }
}

/// The sequential reference: element i folded over ranks j, j+1, ..., j-1 (j its segment).
fn reference(world: usize, len: usize, combine: fn(f64, f64) -> f64) -> Vec<u64> {
    (0..len)
        .map(|i| {
            let j = segment_of(i, len, world);
            let mut acc = value(j, i);
            for k in 1..world {
                acc = combine(acc, value((j + k) % world, i));
            }
            acc.to_bits()
        })
        .collect()
}

/// Element counts on both sides of the model's cut for `world`.
fn cut_lengths(world: usize) -> Vec<usize> {
    let edge = silvic_net::fuzzing::gather_limit(world) / 8;
    vec![edge - 1, edge, edge + 1]
}

fn run_all_ops(world: usize) -> Vec<Vec<Vec<u64>>> {
    run_ops_at(world, lengths(world))
}

fn run_ops_at(world: usize, lengths: Vec<usize>) -> Vec<Vec<Vec<u64>>> {
    ring_of_threads(world, Duration::from_secs(60), move |rank, mut ring| {
        assert_eq!((ring.rank(), ring.world_size()), (rank, world));
        let mut out = Vec::new();
        for &len in &lengths {
            let mut sum: Vec<f64> = (0..len).map(|i| value(rank, i)).collect();
            ring.allreduce_sum_f64(&mut sum).unwrap();
            out.push(sum.iter().map(|x| x.to_bits()).collect());
            let mut max: Vec<f64> = (0..len).map(|i| value(rank, i)).collect();
            ring.allreduce_max_f64(&mut max).unwrap();
            out.push(max.iter().map(|x| x.to_bits()).collect());
            let mut ints: Vec<i64> = (0..len).map(|i| i64::MAX - (i * rank) as i64).collect();
            ring.allreduce_sum_i64(&mut ints).unwrap();
            out.push(ints.iter().map(|&x| x as u64).collect());
            let gathered = ring.allgather_bytes(&vec![rank as u8; len]).unwrap();
            assert_eq!(gathered.len(), world);
            for (r, bytes) in gathered.iter().enumerate() {
                assert_eq!(bytes, &vec![r as u8; len], "allgather block of rank {r}");
            }
        }
        out
    })
}

#[test]
fn every_op_matches_the_reference_bitwise_on_every_rank_and_run() {
    for world in WORLDS {
        let first = run_all_ops(world);
        let second = run_all_ops(world);
        assert_eq!(first, second, "world {world}: two runs differ");
        check_against_reference(world, &lengths(world), &first);
    }
}

#[test]
fn every_cut_of_the_cost_model_matches_the_reference_bitwise() {
    for world in WORLDS {
        let lengths = cut_lengths(world);
        let results = run_ops_at(world, lengths.clone());
        check_against_reference(world, &lengths, &results);
    }
}

/// From 8 ranks a ring has chord streams (where hops are long, the cost model then chooses
/// among every path; on loopback the ring and the gather): sizes from one element to past the
/// index's one chunk, at worlds a power of two and not, give the reference's bits.
#[test]
fn over_chords_every_path_the_model_takes_matches_the_reference_bitwise() {
    for world in [8, 9, 16] {
        let lengths = vec![1, 7, 512, 4096, 40_000, 300_000];
        let results = run_ops_at(world, lengths.clone());
        check_against_reference(world, &lengths, &results);
    }
}

fn check_against_reference(world: usize, lengths: &[usize], all: &[Vec<Vec<u64>>]) {
    for (k, &len) in lengths.iter().enumerate() {
        let sum = reference(world, len, |a, b| a + b);
        let max = reference(world, len, silvic_core::fold::max_f64);
        let ints: Vec<u64> = (0..len)
            .map(|i| {
                (0..world).fold(0i64, |acc, r| acc.wrapping_add(i64::MAX - (i * r) as i64)) as u64
            })
            .collect();
        for (rank, results) in all.iter().enumerate() {
            assert_eq!(results[3 * k], sum, "sum world {world} len {len} rank {rank}");
            assert_eq!(results[3 * k + 1], max, "max world {world} len {len} rank {rank}");
            assert_eq!(results[3 * k + 2], ints, "i64 world {world} len {len} rank {rank}");
        }
    }
}

#[test]
fn a_million_elements_reduce_exactly() {
    for world in [2, 3, 4] {
        let len = 1 << 20;
        let results = ring_of_threads(world, Duration::from_secs(120), move |rank, mut ring| {
            // Integer-valued f64 below 2^53: exact in any order.
            let mut buf: Vec<f64> = (0..len).map(|i| (i % 1000 + rank) as f64).collect();
            ring.allreduce_sum_f64(&mut buf).unwrap();
            let mut ints: Vec<i64> = (0..len).map(|i| (i as i64) << 40).collect();
            ring.allreduce_sum_i64(&mut ints).unwrap();
            let f_ok = buf
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (world * (i % 1000) + world * (world - 1) / 2) as f64);
            let i_ok = ints
                .iter()
                .enumerate()
                .all(|(i, &x)| x == ((i as i64) << 40).wrapping_mul(world as i64));
            (f_ok, i_ok, buf.iter().map(|x| x.to_bits()).fold(0u64, |h, b| h.rotate_left(5) ^ b))
        });
        let digest = results[0].2;
        for (rank, (f_ok, i_ok, d)) in results.into_iter().enumerate() {
            assert!(f_ok && i_ok, "world {world} rank {rank}");
            assert_eq!(d, digest, "world {world}: rank {rank} differs from rank 0");
        }
    }
}

#[test]
fn a_ring_forms_over_ipv6_loopback() {
    let (timeout, limit) = (common::CONNECT_TIMEOUT, Duration::from_secs(60));
    let results = common::ring_of_threads_with(3, "::1", "v6", timeout, limit, |rank, mut ring| {
        let mut buf = vec![rank as f64; 1000];
        ring.allreduce_sum_f64(&mut buf).unwrap();
        buf[999]
    });
    assert_eq!(results, [3.0, 3.0, 3.0]);
}
