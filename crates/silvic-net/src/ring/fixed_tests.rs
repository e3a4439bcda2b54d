//! Fixed-point histograms ([`silvic_core::FixedHistogram`]) over every path of the ring, on the
//! in-memory driver: the same bits for every world, partition, order and path, equal to the
//! correctly rounded exact sum of the values as quantised; and their errors on every rank.

use num_bigint::BigInt;
use num_traits::ToPrimitive;
use silvic_core::{
    Collective, CollectiveError, Dtype, FixedHistogram, FixedScale, Numbers, Op, RecordFold,
    Reduction, TrainerCollective, fold,
};

use super::choice::{Path, carries, fits};
use super::mem::{Dice, Driver, MemLink, on_ring};
use super::seam::{Call, Link};
use super::{Scratch, records, varlen};

/// One rank of the in-memory ring as a [`TrainerCollective`]: every op is the ring's own
/// call on its path (the driver's forced one), numbered as a `TcpCollective` numbers them.
struct MemCollective<'a> {
    link: &'a mut MemLink,
    rank: usize,
    world: usize,
    seq: u64,
    scratch: Scratch,
    /// The element type of each allreduce called, in order.
    reduced: Vec<Dtype>,
}

impl<'a> MemCollective<'a> {
    fn new(link: &'a mut MemLink, rank: usize, world: usize) -> Self {
        MemCollective { link, rank, world, seq: 0, scratch: Scratch::default(), reduced: vec![] }
    }

    fn call(&mut self, op: Op) -> Call {
        self.seq += 1;
        Call { rank: self.rank, world: self.world, op, seq: self.seq - 1 }
    }
}

impl Collective for MemCollective<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn allreduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
        self.allreduce(Numbers::F64(buf), Reduction::Sum)
    }
    fn allreduce_sum_i64(&mut self, buf: &mut [i64]) -> Result<(), CollectiveError> {
        self.allreduce(Numbers::I64(buf), Reduction::Sum)
    }
    fn allreduce_max_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
        self.allreduce(Numbers::F64(buf), Reduction::Max)
    }
    fn allgather_bytes(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let call = self.call(Op::AllgatherBytes);
        let mut blocks = vec![Vec::new(); self.world];
        blocks[self.rank] = local.to_vec();
        super::allgather(self.link, call, local.len() as u64, &mut blocks)?;
        Ok(blocks)
    }
}

impl TrainerCollective for MemCollective<'_> {
    fn allreduce(&mut self, buf: Numbers<'_>, reduction: Reduction) -> Result<(), CollectiveError> {
        self.reduced.push(buf.dtype());
        let call = self.call(Op::allreduce(reduction, buf.dtype()));
        let mut on = super::OnLink { link: self.link, scratch: &mut self.scratch };
        super::allreduce_numbers(&mut on, call, buf, reduction)
    }
    fn reduce_scatter_records(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        let call = self.call(Op::ReduceScatterRecords);
        records::reduce_scatter_records(
            self.link,
            call,
            buf,
            blocks,
            record,
            fold,
            &mut self.scratch,
        )
    }
    fn allreduce_records(
        &mut self,
        buf: &mut [u8],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        let call = self.call(Op::AllreduceRecords);
        records::allreduce_records(self.link, call, buf, record, fold, &mut self.scratch)
    }
    fn allgather_blocks(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
    ) -> Result<(), CollectiveError> {
        let call = self.call(Op::AllgatherBlocks);
        super::allgather_blocks(self.link, call, buf, blocks)
    }
    fn allgather_varlen(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let call = self.call(Op::AllgatherVarlen);
        varlen::allgather_varlen(self.link, call, local)
    }
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        let call = self.call(Op::BroadcastBytes);
        varlen::broadcast(self.link, call, buf, root)
    }
}

const BINS: usize = 1024;
/// A histogram this large gathers every rank's report before it reduces.
const LARGE: usize = 1 << 18;
const SAMPLES: usize = 100_000;

/// Heavy-tailed per-sample values with mixed signs: magnitudes from 2^-30 to 2^10, log-uniform
/// (so every binade carries as many values), and one in a hundred far smaller (2^-80 to 2^-47),
/// below the window, which the scale rounds. Each with a bin.
fn samples(seed: u64) -> Vec<(usize, f64)> {
    let mut dice = Dice(seed);
    (0..SAMPLES)
        .map(|_| {
            let fraction = 1.0 + dice.below(1 << 30) as f64 / (1u64 << 30) as f64;
            let power = if dice.below(100) == 0 {
                -80 + dice.below(34) as i32
            } else {
                -30 + dice.below(40) as i32
            };
            let sign = if dice.below(2) == 0 { 1.0 } else { -1.0 };
            (dice.below(BINS), sign * fraction * 2f64.powi(power))
        })
        .collect()
}

/// The samples dealt out to `world` ranks at random (a rank may get none), each rank's in a
/// random order.
fn partition(samples: &[(usize, f64)], world: usize, seed: u64) -> Vec<Vec<(usize, f64)>> {
    let mut dice = Dice(seed | 1);
    let mut parts = vec![Vec::new(); world];
    for &sample in samples {
        parts[dice.below(world)].push(sample);
    }
    for part in &mut parts {
        for i in (1..part.len()).rev() {
            part.swap(i, dice.below(i + 1));
        }
    }
    parts
}

/// Gradients as a trainer's f32s: below 1, down to 2^-20, signs mixed, over `bins` bins.
fn f32_samples(seed: u64, bins: usize, count: usize) -> Vec<(usize, f64)> {
    let mut dice = Dice(seed);
    (0..count)
        .map(|_| {
            let fraction = 1.0 + dice.below(1 << 23) as f32 / (1u32 << 23) as f32;
            let value = fraction * 2f32.powi(-(1 + dice.below(20) as i32));
            let sign = if dice.below(2) == 0 { 1.0 } else { -1.0 };
            (dice.below(bins), f64::from(sign * value))
        })
        .collect()
}

/// One rank's part of a histogram of `bins` bins, agreed and reduced over `ring`: the scale
/// and the result.
fn one_rank(
    ring: &mut MemCollective<'_>,
    bins: usize,
    mine: &[(usize, f64)],
) -> (FixedScale, Vec<u64>, Vec<i128>) {
    let max_abs = mine.iter().fold(0.0f64, |m, &(_, v)| m.max(v.abs()));
    let scale = FixedScale::agree(ring, max_abs, mine.len() as u64).unwrap();
    let mut hist = FixedHistogram::new(bins, scale);
    for &(bin, value) in mine {
        hist.add(bin, value).unwrap();
    }
    hist.allreduce(ring).unwrap();
    let bits = hist.to_f64().iter().map(|x| x.to_bits()).collect();
    (scale, bits, hist.sums().to_vec())
}

/// Every world from 1 to 9, three random partitions of the samples each, every path forced:
/// every rank of every run has the same bits, the exact sums of the values as quantised, each
/// correctly rounded. The values are quantised by [`FixedScale::quantize`] (silvic-core's tests
/// check it against the hardware's rounding); the sums and their rounding are checked apart
/// from the library: big integers, and the hardware's conversion of an `i128` to an f64.
#[test]
fn every_world_partition_and_path_gives_the_bits_of_the_exact_sum() {
    let samples = samples(0x5eed_0037);
    let mut seeds = Dice(0xfeed_0037);
    let mut first: Option<(FixedScale, Vec<u64>, Vec<i128>)> = None;
    let mut runs = 0;
    for world in 1..=9 {
        for _ in 0..3 {
            let seed = seeds.below(usize::MAX) as u64;
            let parts = partition(&samples, world, seed);
            for path in [Path::Gather, Path::Ring, Path::Bruck, Path::Index] {
                let bytes = (BINS + 4) * 16;
                let driver = Driver::new(world).seed(seed).capacity(1 + runs % 3).forcing(path);
                let results = on_ring(driver, |r, link| {
                    assert!(carries(path, bytes, world, link.network()), "{path:?} world {world}");
                    one_rank(&mut MemCollective::new(link, r, world), BINS, &parts[r])
                });
                runs += 1;
                for (r, (scale, bits, sums)) in results.into_iter().enumerate() {
                    let case = format!("world {world} seed {seed:#x} {path:?} rank {r}");
                    match &first {
                        None => first = Some((scale, bits, sums)),
                        Some((s, b, _)) => {
                            let agreed = |s: FixedScale| (s.exponent(), s.bound());
                            assert_eq!(agreed(scale), agreed(*s), "{case}: scale");
                            assert!(bits == *b, "{case}: another bit somewhere");
                        }
                    }
                }
            }
        }
    }
    // The one result, against the exact sums of the values as quantised.
    let (scale, bits, sums) = first.unwrap();
    let e = scale.exponent();
    assert_eq!(e, 126 - 17 - 10, "10^5 rows, values below 2^10");
    let rounded = samples.iter().filter(|(_, v)| v.abs() < 2f64.powi(52 - e)).count();
    assert!(rounded > 500, "only {rounded} values below the window");
    assert_the_exact_sums(&samples, BINS, (scale, &bits, &sums));
}

/// `sums` and their f64 `bits` at `scale` are the exact sums of `samples` as quantised (big
/// integers), each correctly rounded (the hardware's conversion of an `i128`).
fn assert_the_exact_sums(
    samples: &[(usize, f64)],
    bins: usize,
    (scale, bits, sums): (FixedScale, &[u64], &[i128]),
) {
    let e = scale.exponent();
    let mut exact = vec![BigInt::from(0); bins];
    for &(bin, value) in samples {
        exact[bin] += BigInt::from(scale.quantize(value).unwrap());
    }
    let held: Vec<BigInt> = sums.iter().map(|&s| BigInt::from(s)).collect();
    assert!(held == exact, "the sums are not the exact sums of the values as quantised");
    for (bin, (sum, got)) in exact.iter().zip(bits).enumerate() {
        // An i128 as f64 is rounded once, ties to even; scaling by 2^-e is exact here.
        let want = sum.to_i128().unwrap() as f64 * 2f64.powi(-e);
        assert_eq!(*got, want.to_bits(), "bin {bin}: {} against {want}", f64::from_bits(*got));
    }
}

/// A histogram of 262,144 bins, whose reduction gathers every rank's report first: worlds 1 to
/// 8, one random partition each, every path that carries it forced. With a trainer's f32 gradients, whose sums
/// less the zeros they share fit an `i64`, the bins go as `i64`s; with the heavy-tailed f64
/// values, as `i128`s. Either way every rank of every run has the bits of the exact sums.
#[test]
fn a_large_histogram_goes_as_i64s_where_its_sums_fit_and_gives_the_exact_bits() {
    let f32s = f32_samples(0x5eed_0f32, LARGE, 2 * LARGE);
    let f64s: Vec<(usize, f64)> =
        samples(0x5eed_0037).into_iter().map(|(bin, v)| (bin * 61 % LARGE, v)).collect();
    let mut seeds = Dice(0xfeed_1a76);
    for (samples, width) in [(&f32s, Dtype::I64), (&f64s, Dtype::I128)] {
        let mut first: Option<(FixedScale, Vec<u64>, Vec<i128>)> = None;
        for world in [1, 2, 3, 5, 8] {
            let seed = seeds.below(usize::MAX) as u64;
            let parts = partition(samples, world, seed);
            let bytes = LARGE * if width == Dtype::I64 { 8 } else { 16 };
            // The gathers hold every rank's bytes, within a bound: not in the larger worlds.
            for path in Path::ALL.into_iter().filter(|&p| fits(p, bytes, world)) {
                let driver = Driver::new(world).seed(seed).forcing(path);
                let results = on_ring(driver, |r, link| {
                    assert!(carries(path, bytes, world, link.network()), "{path:?} world {world}");
                    let mut ring = MemCollective::new(link, r, world);
                    let result = one_rank(&mut ring, LARGE, &parts[r]);
                    (result, ring.reduced)
                });
                for (r, (result, reduced)) in results.into_iter().enumerate() {
                    let case = format!("{width:?} world {world} seed {seed:#x} {path:?} rank {r}");
                    assert_eq!(reduced, [width], "{case}: the allreduces");
                    match &first {
                        None => first = Some(result),
                        Some((s, b, _)) => {
                            assert_eq!(result.0.exponent(), s.exponent(), "{case}: scale");
                            assert!(result.1 == *b, "{case}: another bit somewhere");
                        }
                    }
                }
            }
        }
        let (scale, bits, sums) = first.unwrap();
        assert_the_exact_sums(samples, LARGE, (scale, &bits, &sums));
    }
}

/// Runs `f` on every rank of a world of `world` on the default path, as a collective.
fn on_ranks<R: Send>(
    world: usize,
    f: impl Fn(usize, &mut MemCollective<'_>) -> R + Sync,
) -> Vec<R> {
    on_ring(Driver::new(world), |r, link| f(r, &mut MemCollective::new(link, r, world)))
}

/// One rank holding another scale (it passed another max to a second agreement and kept that
/// scale): every rank fails with the same kind of error, naming a rank whose scale differs, and
/// no rank keeps a sum; with the checks in band and with the reports gathered first.
#[test]
fn a_rank_at_another_scale_fails_every_rank() {
    for bins in [5, LARGE] {
        let results = on_ranks(3, |r, ring| {
            let usual = FixedScale::agree(ring, 1.0, 10).unwrap();
            let other = FixedScale::agree(ring, if r == 1 { 1000.0 } else { 1.0 }, 10).unwrap();
            let mut hist = FixedHistogram::new(bins, if r == 1 { other } else { usual });
            hist.add(r, 0.5).unwrap();
            let error = hist.allreduce(ring).unwrap_err();
            (error, hist.sums().iter().all(|&s| s == 0))
        });
        for (r, (error, empty)) in results.into_iter().enumerate() {
            let CollectiveError::ScaleMismatch { peer, .. } = &error else {
                panic!("{bins} bins, rank {r}: {error}");
            };
            assert_eq!(*peer, if r == 1 { 0 } else { 1 }, "{bins} bins, rank {r}: {error}");
            assert!(error.to_string().contains("values below 2^"), "{error}");
            assert!(empty, "{bins} bins, rank {r}");
        }
    }
}

/// Ranks reducing histograms of other sizes, where the largest gathers its report first: every
/// rank fails, none waits for a call that never comes.
#[test]
fn ranks_reducing_other_bins_fail_every_rank() {
    let sizes: [fn(usize) -> usize; 2] = [|r| LARGE + r, |r| if r == 2 { 7 } else { LARGE }];
    for (case, bins) in sizes.into_iter().enumerate() {
        let results = on_ranks(3, |r, ring| {
            let scale = FixedScale::agree(ring, 1.0, 10).unwrap();
            let mut hist = FixedHistogram::new(bins(r), scale);
            hist.add(0, 0.5).unwrap();
            hist.allreduce(ring).unwrap_err()
        });
        for (r, error) in results.into_iter().enumerate() {
            let text = error.to_string();
            if case == 0 {
                let said = format!("rank 1 reduces a fixed-point histogram of {} bins", LARGE + 1);
                assert!(text.contains(&said), "rank {r}: {text}");
            }
            assert!(!matches!(error, CollectiveError::ScaleMismatch { .. }), "rank {r}: {text}");
        }
    }
}

/// A value refused on one rank fails every rank's reduction with that refusal, naming the rank
/// and the bin; a histogram reduced twice (its rows counted once per rank) fails every rank.
#[test]
fn a_refusal_on_one_rank_and_a_second_reduction_fail_every_rank() {
    for bins in [8, LARGE] {
        let results = on_ranks(4, |r, ring| {
            let scale = FixedScale::agree(ring, 2.0, 3).unwrap();
            let mut hist = FixedHistogram::new(bins, scale);
            hist.add(r, 1.5).unwrap();
            if r == 2 {
                hist.add(6, 9.0).unwrap_err();
            }
            let refused = hist.allreduce(ring).unwrap_err();
            let mut again = FixedHistogram::new(bins, scale);
            again.add(0, 1.0).unwrap();
            again.allreduce(ring).unwrap();
            assert_eq!(again.to_f64()[0], 4.0);
            let twice = again.allreduce(ring).unwrap_err();
            (refused, twice)
        });
        for (r, (refused, twice)) in results.into_iter().enumerate() {
            let case = format!("{bins} bins, rank {r}");
            assert!(matches!(refused, CollectiveError::Overflow { bin: Some(6), .. }), "{case}");
            let text = refused.to_string();
            assert!(text.contains("in bin 6: on rank 2, value 9 is not below"), "{case}: {text}");
            assert!(matches!(twice, CollectiveError::Overflow { bin: None, .. }), "{case}");
            assert!(twice.to_string().contains("of 48 rows"), "{case}: {twice}");
        }
    }
}

/// An i128 allreduce on every path: exact sums that wrap past 2^127 as two's complement, and
/// min and max, for lengths around every cut.
#[test]
fn i128_allreduces_are_exact_on_every_path() {
    let value =
        |r: usize, i: usize| ((i as i128) << 90) * if r % 2 == 0 { 1 } else { -3 } + r as i128;
    for world in [2, 3, 5, 8] {
        for path in [Path::Gather, Path::Ring, Path::Bruck, Path::Index] {
            for len in [0, 1, world + 1, 300, 5000] {
                let results = on_ring(Driver::new(world).forcing(path), |r, link| {
                    let mut ring = MemCollective::new(link, r, world);
                    let mine: Vec<i128> = (0..len).map(|i| value(r, i)).collect();
                    let mut sum = mine.clone();
                    ring.allreduce(Numbers::I128(&mut sum), Reduction::Sum).unwrap();
                    let (mut min, mut max) = (mine.clone(), mine);
                    ring.allreduce(Numbers::I128(&mut min), Reduction::Min).unwrap();
                    ring.allreduce(Numbers::I128(&mut max), Reduction::Max).unwrap();
                    (sum, min, max)
                });
                for (sum, min, max) in results {
                    for i in 0..len {
                        let all = (0..world).map(|r| value(r, i));
                        let case = format!("world {world} {path:?} len {len} element {i}");
                        assert_eq!(sum[i], all.clone().fold(0, fold::sum_i128), "{case}");
                        assert_eq!(min[i], all.clone().min().unwrap(), "{case}");
                        assert_eq!(max[i], all.max().unwrap(), "{case}");
                    }
                }
            }
        }
    }
}
