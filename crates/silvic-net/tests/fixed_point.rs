//! Fixed-point histograms over real loopback rings, ranks as threads: the pinned usage gives
//! every rank of every world the bits of a world of one; i128 allreduces are exact; a rank at
//! another scale fails every rank, and the ring goes on.
//! (Every world, partition and path: `src/ring/fixed_tests.rs`, on the in-memory driver.)

mod common;

use std::time::Duration;

use common::ring_of_threads;
use silvic_core::fold;
use silvic_net::{
    Collective, CollectiveError, FixedHistogram, FixedScale, Numbers, Reduction, TcpCollective,
    TrainerCollective,
};

const LIMIT: Duration = Duration::from_secs(60);
const BINS: usize = 1000;

/// Sample `i`: its bin and a heavy-tailed gradient of either sign (2^-30 to 2^10).
fn sample(i: usize) -> (usize, f64) {
    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let h = h ^ h >> 29;
    let fraction = 1.0 + (h >> 34) as f64 / (1u64 << 30) as f64;
    let power = (h % 40) as i32 - 30;
    let sign = if h >> 33 & 1 == 0 { 1.0 } else { -1.0 };
    ((h >> 8) as usize % BINS, sign * fraction * 2f64.powi(power))
}

/// The pinned usage on one rank: samples `rank, rank + world, …` of `samples`.
fn histogram(ring: &mut TcpCollective, samples: usize) -> Result<Vec<f64>, CollectiveError> {
    let (rank, world) = (ring.rank(), ring.world_size());
    let mine: Vec<(usize, f64)> = (rank..samples).step_by(world).map(sample).collect();
    let local_max_abs = mine.iter().fold(0.0f64, |m, &(_, g)| m.max(g.abs()));
    let local_rows = mine.len() as u64;
    let scale = FixedScale::agree(ring, local_max_abs, local_rows)?;
    let mut hist = FixedHistogram::new(BINS, scale);
    for &(bin, gradient) in &mine {
        hist.add(bin, gradient)?;
    }
    hist.allreduce(ring)?;
    let sums: Vec<f64> = hist.to_f64();
    Ok(sums)
}

#[test]
fn every_world_gets_the_bits_of_a_world_of_one() {
    let samples = 30_000;
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let alone =
        ring_of_threads(1, LIMIT, move |_, mut ring| histogram(&mut ring, samples).unwrap());
    let want = bits(&alone[0]);
    assert!(alone[0].iter().filter(|&&x| x != 0.0).count() > 900, "most bins hold values");
    for world in [2, 3, 5] {
        let results = ring_of_threads(world, LIMIT, move |_, mut ring| {
            histogram(&mut ring, samples).unwrap()
        });
        for (rank, sums) in results.iter().enumerate() {
            assert!(bits(sums) == want, "world {world} rank {rank}: other bits");
        }
    }
}

#[test]
fn i128_allreduces_over_sockets_are_exact() {
    let world = 3;
    let results = ring_of_threads(world, LIMIT, move |rank, mut ring| {
        let mut out = Vec::new();
        for len in [0, 1, 700, 70_000] {
            let mine: Vec<i128> =
                (0..len).map(|i| (i as i128 - 9) << (rank * 60) | rank as i128).collect();
            let mut sum = mine.clone();
            ring.allreduce(Numbers::I128(&mut sum), Reduction::Sum).unwrap();
            let mut max = mine;
            ring.allreduce(Numbers::I128(&mut max), Reduction::Max).unwrap();
            out.push((len, sum, max));
        }
        out
    });
    for calls in results {
        for (len, sum, max) in calls {
            for i in 0..len {
                let all = (0..world).map(|r| (i as i128 - 9) << (r * 60) | r as i128);
                assert_eq!(sum[i], all.clone().fold(0, fold::sum_i128), "len {len} [{i}]");
                assert_eq!(max[i], all.max().unwrap(), "len {len} [{i}]");
            }
        }
    }
}

/// A rank that keeps a scale of its own: every rank's reduction fails naming a rank whose
/// scale differs, the ring stays up, and the next agreement and reduction succeed.
#[test]
fn a_rank_at_another_scale_fails_every_rank_and_the_ring_goes_on() {
    let results = ring_of_threads(3, LIMIT, move |rank, mut ring| {
        let agreed = FixedScale::agree(&mut ring, 1.0, 4).unwrap();
        let own = FixedScale::agree(&mut ring, if rank == 2 { 1000.0 } else { 1.0 }, 4).unwrap();
        let mut hist = FixedHistogram::new(10, if rank == 2 { own } else { agreed });
        hist.add(rank, 0.001).unwrap();
        let error = hist.allreduce(&mut ring).unwrap_err();
        let mut after = FixedHistogram::new(10, agreed);
        after.add(rank, 0.5).unwrap();
        after.allreduce(&mut ring).unwrap();
        (error, after.to_f64())
    });
    for (rank, (error, after)) in results.into_iter().enumerate() {
        assert_eq!(error.kind(), "scale_mismatch", "rank {rank}: {error}");
        assert_eq!(error.peer(), Some(if rank == 2 { 0 } else { 2 }), "rank {rank}: {error}");
        assert_eq!(after[..4], [0.5, 0.5, 0.5, 0.0], "rank {rank}");
    }
}
