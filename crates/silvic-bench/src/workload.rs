//! What each measured collective does, its inputs, and how its results are checked.
//!
//! Inputs are a function of `(rank, index)`, so every rank can compute what every other rank
//! holds and check its result element by element without a second copy of the buffer: the
//! check costs no memory, and the peak RSS the tool reports is the collective's own.
//!
//! The f64 inputs are small integers, whose sums are exact in any order; the i64 and i128
//! inputs are spread over the whole range, so sums wrap; the max inputs hold a NaN here and
//! there, which must win; the fixed-point histogram's are a trainer's f32 gradients.

use silvic_core::{
    CollectiveError, FixedHistogram, FixedScale, Numbers, Reduction, TrainerCollective,
};

/// One measured collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `allreduce_sum_f64`.
    SumF64,
    /// `allreduce_sum_i64`.
    SumI64,
    /// `allreduce_max_f64`.
    MaxF64,
    /// `TrainerCollective::allreduce` of `Numbers::I128`, a sum: the fixed-point histograms'
    /// op.
    SumI128,
    /// `FixedHistogram::allreduce` of a histogram of f32 gradients, [`GRADIENTS_PER_BIN`] a
    /// bin on each rank; a size is its bins' `i128` bytes. Each call reduces a fresh copy of
    /// the histogram, made before it is timed ([`Workload::prepare`]).
    FixedHistogram,
    /// `allgather_bytes`; a size is the gathered total, each rank giving `size / world` bytes.
    Allgather,
}

/// The gradients each rank adds to each bin of [`Kind::FixedHistogram`].
const GRADIENTS_PER_BIN: usize = 2;

impl Kind {
    /// The `--op` name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::SumF64 => "sum_f64",
            Kind::SumI64 => "sum_i64",
            Kind::MaxF64 => "max_f64",
            Kind::SumI128 => "sum_i128",
            Kind::FixedHistogram => "fixed_histogram",
            Kind::Allgather => "allgather",
        }
    }

    /// The element type, as nccl-tests names it.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Kind::SumF64 | Kind::MaxF64 => "double",
            Kind::SumI64 => "int64",
            Kind::SumI128 | Kind::FixedHistogram => "int128",
            Kind::Allgather => "uint8",
        }
    }

    /// The reduction, as nccl-tests names it.
    pub(crate) fn redop(self) -> &'static str {
        match self {
            Kind::SumF64 | Kind::SumI64 | Kind::SumI128 | Kind::FixedHistogram => "sum",
            Kind::MaxF64 => "max",
            Kind::Allgather => "none",
        }
    }

    /// Whether a call works on the caller's buffer in place (the allreduces) rather than
    /// returning new memory (the allgather).
    pub(crate) fn in_place(self) -> bool {
        self != Kind::Allgather
    }

    /// Bytes per element.
    pub(crate) fn element_bytes(self) -> usize {
        match self {
            Kind::Allgather => 1,
            Kind::SumI128 | Kind::FixedHistogram => 16,
            _ => 8,
        }
    }

    /// busbw / algbw: the share of the buffer each rank must send, as nccl-tests defines it
    /// (`2(n-1)/n` for an allreduce, `(n-1)/n` for an allgather).
    pub(crate) fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Kind::Allgather => (n - 1.0) / n,
            _ => 2.0 * (n - 1.0) / n,
        }
    }
}

/// The value rank `rank` contributes at index `i` to an f64 sum: a small integer.
fn sum_f64_input(rank: usize, i: usize) -> f64 {
    ((i % 61) + (rank * 13) % 17) as f64
}

/// The value rank `rank` contributes at index `i` to an i64 sum: anywhere in the range.
fn sum_i64_input(rank: usize, i: usize) -> i64 {
    (i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64).wrapping_add((rank as i64) << 59)
}

/// The value rank `rank` contributes at index `i` to an i128 sum: anywhere in the range.
fn sum_i128_input(rank: usize, i: usize) -> i128 {
    let word = sum_i64_input(rank, i) as i128;
    word << 64 ^ (i as i128 * 0x5851_f42d) ^ (rank as i128) << 126
}

/// The value rank `rank` contributes at index `i` to an f64 max: NaN on one rank at about one
/// index in a thousand, else a small integer.
fn max_f64_input(rank: usize, world: usize, i: usize) -> f64 {
    if i % 1021 == 17 && i % world == rank { f64::NAN } else { ((i * 7 + rank * 13) % 101) as f64 }
}

/// Gradient `j` that rank `rank` adds to bin `bin` of a fixed-point histogram: an f32 of
/// either sign from 2^-20 to 1, as a trainer's gradients are.
fn gradient_input(rank: usize, bin: usize, j: usize) -> f64 {
    let h = ((rank * GRADIENTS_PER_BIN + j) as u64 ^ (bin as u64) << 8)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let fraction = 1.0 + (h >> 41) as f32 / (1u32 << 23) as f32;
    let sign = if h >> 40 & 1 == 0 { 1.0 } else { -1.0 };
    f64::from(sign * fraction * 2f32.powi(-1 - ((h >> 8) % 20) as i32))
}

/// Byte `i` of rank `rank`'s allgather block.
fn allgather_input(rank: usize, i: usize) -> u8 {
    ((i * 31 + rank * 7) % 251) as u8
}

/// A rank's buffer for one kind of collective, allocated once at the largest size.
#[derive(Debug)]
pub(crate) enum Buffer {
    /// For the f64 allreduces.
    F64(Vec<f64>),
    /// For the i64 allreduce.
    I64(Vec<i64>),
    /// For the i128 allreduce.
    I128(Vec<i128>),
    /// The fixed-point histogram as built, and its copy (none before the first size).
    Histogram(Option<Box<Histograms>>),
    /// This rank's allgather block.
    Bytes(Vec<u8>),
}

/// A rank's side of one collective at every size of a sweep.
#[derive(Debug)]
pub(crate) struct Workload {
    kind: Kind,
    rank: usize,
    world: usize,
    buffer: Buffer,
    /// Elements in use at the current size.
    len: usize,
}

/// A fixed-point histogram as built, and the copy a call reduces: a histogram is reduced once.
#[derive(Debug)]
pub(crate) struct Histograms {
    built: FixedHistogram,
    copy: FixedHistogram,
    /// Whether `copy` is as built, not yet reduced.
    fresh: bool,
}

impl Workload {
    /// Room for `max_bytes`; pages are only touched as sizes use them.
    pub(crate) fn new(kind: Kind, rank: usize, world: usize, max_bytes: usize) -> Workload {
        let buffer = match kind {
            Kind::SumF64 | Kind::MaxF64 => Buffer::F64(vec![0.0; max_bytes / 8]),
            Kind::SumI64 => Buffer::I64(vec![0; max_bytes / 8]),
            Kind::SumI128 => Buffer::I128(vec![0; max_bytes / 16]),
            Kind::FixedHistogram => Buffer::Histogram(None),
            Kind::Allgather => Buffer::Bytes(vec![0; max_bytes / world.max(1)]),
        };
        Workload { kind, rank, world, buffer, len: 0 }
    }

    /// Elements (for an allgather, bytes of this rank's block) at `bytes`.
    pub(crate) fn elements(kind: Kind, world: usize, bytes: usize) -> usize {
        match kind {
            Kind::Allgather => bytes / world.max(1),
            _ => bytes / kind.element_bytes(),
        }
    }

    /// Fills the first elements of the buffer with this rank's inputs for a call of `bytes`
    /// (a fixed-point histogram agrees its scale over `collective`).
    pub(crate) fn fill(
        &mut self,
        collective: &mut dyn TrainerCollective,
        bytes: usize,
    ) -> Result<(), CollectiveError> {
        self.len = Self::elements(self.kind, self.world, bytes);
        let (rank, world) = (self.rank, self.world);
        match (&mut self.buffer, self.kind) {
            (Buffer::Histogram(histograms), _) => {
                let bins = self.len;
                let max_abs = (0..bins * GRADIENTS_PER_BIN)
                    .map(|i| gradient_input(rank, i / GRADIENTS_PER_BIN, i % GRADIENTS_PER_BIN))
                    .fold(0.0f64, |m, g| m.max(g.abs()));
                let rows = (bins * GRADIENTS_PER_BIN) as u64;
                let scale = FixedScale::agree(collective, max_abs, rows)?;
                let mut hist = FixedHistogram::new(bins, scale);
                for bin in 0..bins {
                    for j in 0..GRADIENTS_PER_BIN {
                        hist.add(bin, gradient_input(rank, bin, j))?;
                    }
                }
                *histograms =
                    Some(Box::new(Histograms { copy: hist.clone(), built: hist, fresh: true }));
            }
            (Buffer::F64(v), Kind::SumF64) => {
                v[..self.len].iter_mut().enumerate().for_each(|(i, x)| *x = sum_f64_input(rank, i))
            }
            (Buffer::F64(v), _) => v[..self.len]
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = max_f64_input(rank, world, i)),
            (Buffer::I64(v), _) => {
                v[..self.len].iter_mut().enumerate().for_each(|(i, x)| *x = sum_i64_input(rank, i))
            }
            (Buffer::I128(v), _) => {
                v[..self.len].iter_mut().enumerate().for_each(|(i, x)| *x = sum_i128_input(rank, i))
            }
            (Buffer::Bytes(v), _) => v[..self.len]
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = allgather_input(rank, i)),
        }
        Ok(())
    }

    /// Whether each call reduces a copy of the inputs made for it (a histogram is reduced
    /// once), which [`Workload::prepare`] makes.
    pub(crate) fn reduces_once(&self) -> bool {
        self.kind == Kind::FixedHistogram
    }

    /// Readies the next call, before it is timed: a fixed-point histogram copies what it built
    /// into its copy's memory (other kinds need nothing).
    pub(crate) fn prepare(&mut self) {
        if let Buffer::Histogram(Some(h)) = &mut self.buffer {
            h.copy.clone_from(&h.built);
            h.fresh = true;
        }
    }

    /// One call of the collective on the current size. The allreduces work in place (so
    /// repeated calls reduce the previous results); an allgather returns what it gathered.
    pub(crate) fn call(
        &mut self,
        collective: &mut dyn TrainerCollective,
    ) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
        let n = self.len;
        match (&mut self.buffer, self.kind) {
            (Buffer::F64(v), Kind::SumF64) => collective.allreduce_sum_f64(&mut v[..n])?,
            (Buffer::F64(v), _) => collective.allreduce_max_f64(&mut v[..n])?,
            (Buffer::I64(v), _) => collective.allreduce_sum_i64(&mut v[..n])?,
            (Buffer::I128(v), _) => {
                collective.allreduce(Numbers::I128(&mut v[..n]), Reduction::Sum)?
            }
            (Buffer::Histogram(Some(h)), _) => {
                assert!(h.fresh, "a histogram is prepared before each call");
                h.fresh = false;
                h.copy.allreduce(collective)?
            }
            (Buffer::Histogram(None), _) => unreachable!("a histogram is called once filled"),
            (Buffer::Bytes(v), _) => return collective.allgather_bytes(&v[..n]).map(Some),
        }
        Ok(None)
    }

    /// Fills the inputs, runs one call and counts the elements that differ from the expected
    /// result (for an allgather, the wrong bytes and any block of the wrong length).
    pub(crate) fn check(
        &mut self,
        collective: &mut dyn TrainerCollective,
        bytes: usize,
    ) -> Result<u64, CollectiveError> {
        self.fill(collective, bytes)?;
        self.prepare();
        let gathered = self.call(collective)?;
        Ok(self.count_wrong(gathered))
    }

    /// The elements of the last call's result that differ from the expected one, `gathered`
    /// being what an allgather returned.
    fn count_wrong(&self, gathered: Option<Vec<Vec<u8>>>) -> u64 {
        let world = self.world;
        let n = self.len;
        match (&self.buffer, gathered) {
            (_, Some(blocks)) => count_wrong_blocks(&blocks, world, n),
            (Buffer::F64(v), None) if self.kind == Kind::SumF64 => v[..n]
                .iter()
                .enumerate()
                .filter(|&(i, &x)| x != (0..world).map(|r| sum_f64_input(r, i)).sum::<f64>())
                .count() as u64,
            (Buffer::F64(v), None) => v[..n]
                .iter()
                .enumerate()
                .filter(|&(i, &x)| !same_max(x, expected_max(world, i)))
                .count() as u64,
            (Buffer::I64(v), None) => v[..n]
                .iter()
                .enumerate()
                .filter(|&(i, &x)| {
                    x != (0..world).fold(0i64, |acc, r| acc.wrapping_add(sum_i64_input(r, i)))
                })
                .count() as u64,
            (Buffer::I128(v), None) => v[..n]
                .iter()
                .enumerate()
                .filter(|&(i, &x)| {
                    x != (0..world).fold(0i128, |acc, r| acc.wrapping_add(sum_i128_input(r, i)))
                })
                .count() as u64,
            (Buffer::Histogram(Some(h)), None) if !h.fresh => {
                let copy = &h.copy;
                let scale = copy.scale();
                let quanta = |r, bin, j| scale.quantize(gradient_input(r, bin, j));
                let expected = |bin| {
                    (0..world)
                        .flat_map(|r| (0..GRADIENTS_PER_BIN).map(move |j| (r, j)))
                        .map(|(r, j)| quanta(r, bin, j).unwrap_or(i128::MAX))
                        .fold(0i128, i128::wrapping_add)
                };
                copy.sums().iter().enumerate().filter(|&(bin, &x)| x != expected(bin)).count()
                    as u64
            }
            (Buffer::Histogram(_), None) => n as u64,
            (Buffer::Bytes(_), None) => n as u64,
        }
    }
}

fn expected_max(world: usize, i: usize) -> f64 {
    let values = (0..world).map(|r| max_f64_input(r, world, i));
    if values.clone().any(f64::is_nan) { f64::NAN } else { values.fold(f64::MIN, f64::max) }
}

fn same_max(got: f64, expected: f64) -> bool {
    if expected.is_nan() { got.is_nan() } else { got == expected }
}

fn count_wrong_blocks(blocks: &[Vec<u8>], world: usize, n: usize) -> u64 {
    let mut wrong = n as u64 * world.saturating_sub(blocks.len()) as u64;
    for (r, block) in blocks.iter().enumerate() {
        if block.len() != n {
            wrong += n.max(block.len()) as u64;
            continue;
        }
        wrong +=
            block.iter().enumerate().filter(|&(i, &b)| b != allgather_input(r, i)).count() as u64;
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;
    use silvic_core::{Collective, LocalCollective, RecordFold};

    /// A fake world: "reduces" by writing the expected result, optionally spoiling one element,
    /// so the check's counting can be tested without sockets.
    struct Oracle {
        world: usize,
        spoil: bool,
    }

    impl Collective for Oracle {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            self.world
        }
        fn allreduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (0..self.world).map(|r| sum_f64_input(r, i)).sum();
            }
            if self.spoil && !buf.is_empty() {
                buf[0] += 0.5;
            }
            Ok(())
        }
        fn allreduce_sum_i64(&mut self, buf: &mut [i64]) -> Result<(), CollectiveError> {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (0..self.world).fold(0i64, |a, r| a.wrapping_add(sum_i64_input(r, i)));
            }
            if self.spoil && !buf.is_empty() {
                buf[0] ^= 1;
            }
            Ok(())
        }
        fn allreduce_max_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = expected_max(self.world, i);
            }
            if self.spoil {
                buf[17] = 0.0; // a NaN lost
            }
            Ok(())
        }
        fn allgather_bytes(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
            let mut blocks: Vec<Vec<u8>> = (0..self.world)
                .map(|r| (0..local.len()).map(|i| allgather_input(r, i)).collect())
                .collect();
            if self.spoil {
                blocks[1].pop();
            }
            Ok(blocks)
        }
    }

    /// Only the i128 sum is ever asked of it; any other op is a bug in the test.
    impl TrainerCollective for Oracle {
        fn allreduce(&mut self, buf: Numbers<'_>, _: Reduction) -> Result<(), CollectiveError> {
            let Numbers::I128(buf) = buf else { unreachable!("only the i128 sum is benched") };
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (0..self.world).fold(0i128, |a, r| a.wrapping_add(sum_i128_input(r, i)));
            }
            if self.spoil && !buf.is_empty() {
                buf[0] ^= 1 << 100;
            }
            Ok(())
        }
        fn reduce_scatter_records(
            &mut self,
            _: &mut [u8],
            _: &[usize],
            _: usize,
            _: RecordFold<'_>,
        ) -> Result<(), CollectiveError> {
            unreachable!("not benched")
        }
        fn allreduce_records(
            &mut self,
            _: &mut [u8],
            _: usize,
            _: RecordFold<'_>,
        ) -> Result<(), CollectiveError> {
            unreachable!("not benched")
        }
        fn allgather_blocks(&mut self, _: &mut [u8], _: &[usize]) -> Result<(), CollectiveError> {
            unreachable!("not benched")
        }
        fn allgather_varlen(&mut self, _: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
            unreachable!("not benched")
        }
        fn broadcast_bytes(&mut self, _: &mut Vec<u8>, _: usize) -> Result<(), CollectiveError> {
            unreachable!("not benched")
        }
    }

    const KINDS: [Kind; 5] =
        [Kind::SumF64, Kind::SumI64, Kind::MaxF64, Kind::SumI128, Kind::Allgather];

    #[test]
    fn right_results_count_zero_and_spoiled_ones_are_counted() {
        for kind in KINDS {
            for world in [2, 3, 5] {
                let bytes = 8 * 1024 * world;
                let mut w = Workload::new(kind, 0, world, bytes);
                let good = w.check(&mut Oracle { world, spoil: false }, bytes).unwrap();
                assert_eq!(good, 0, "{kind:?} world {world}");
                let bad = w.check(&mut Oracle { world, spoil: true }, bytes).unwrap();
                let expected = if kind == Kind::Allgather { 8 * 1024 } else { 1 };
                assert_eq!(bad, expected, "{kind:?} world {world}");
            }
        }
    }

    #[test]
    fn a_world_of_one_checks_clean_on_the_local_collective() {
        for kind in KINDS {
            let mut w = Workload::new(kind, 0, 1, 4096);
            assert_eq!(w.check(&mut LocalCollective, 4096).unwrap(), 0, "{kind:?}");
        }
    }

    /// The histogram's check counts the bins whose sums differ from the exact sums of every
    /// rank's gradients as quantised; each call reduces a copy prepared for it.
    #[test]
    fn a_fixed_histogram_reduces_a_prepared_copy_a_call_and_is_checked() {
        let mut w = Workload::new(Kind::FixedHistogram, 0, 1, 16 * 1000);
        assert_eq!(w.check(&mut LocalCollective, 16 * 1000).unwrap(), 0);
        w.prepare();
        let Buffer::Histogram(Some(h)) = &mut w.buffer else { unreachable!() };
        assert!(h.fresh && h.copy == h.built);
        // Built with one value more than the inputs: its bin is counted.
        h.built.add(999, 0.5).unwrap();
        for _ in 0..2 {
            w.prepare();
            let none = w.call(&mut LocalCollective).unwrap();
            assert_eq!(w.count_wrong(none), 1);
        }
        let gradients: Vec<f64> = (0..1000).map(|bin| gradient_input(1, bin, 1)).collect();
        assert!(gradients.iter().all(|g| g.abs() < 1.0 && g.abs() >= 2f64.powi(-20)));
        assert!(gradients.iter().any(|&g| g < 0.0) && gradients.iter().any(|&g| g > 0.0));
        assert!(gradients.iter().all(|&g| f64::from(g as f32) == g));
    }

    #[test]
    fn inputs_exercise_what_they_claim() {
        // i64 sums wrap somewhere; some max has a NaN; f64 sums stay exact.
        let wraps =
            (0..1000).any(|i| sum_i64_input(0, i).checked_add(sum_i64_input(1, i)).is_none());
        assert!(wraps);
        let wide =
            (0..1000).any(|i| sum_i128_input(0, i).checked_add(sum_i128_input(1, i)).is_none());
        assert!(wide, "i128 sums wrap somewhere");
        assert!(expected_max(4, 17).is_nan());
        assert_eq!(
            expected_max(4, 18),
            (0..4).map(|r| ((18 * 7 + r * 13) % 101) as f64).fold(0.0, f64::max)
        );
        assert!(sum_f64_input(1000, 1 << 40) < 100.0);
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(Kind::SumF64.bus_factor(2), 1.0);
        assert_eq!(Kind::SumF64.bus_factor(4), 1.5);
        assert_eq!(Kind::Allgather.bus_factor(4), 0.75);
        assert_eq!(Kind::MaxF64.bus_factor(1), 0.0);
    }
}
