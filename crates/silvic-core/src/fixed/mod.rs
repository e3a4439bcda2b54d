//! Fixed-point histograms: sums of per-sample values whose bits depend on the samples alone.
//!
//! A float sum depends on how its terms are grouped, so a histogram summed from per-rank
//! partial sums changes in its last bits when the rows move to other ranks (another world
//! size, another partition). Here each value is rounded once, on its own, to a whole number of
//! quanta of a power-of-two size every rank agrees on ([`FixedScale`]), and the sums are exact
//! `i128` integers, the same whatever the grouping. Each bin's f64 result
//! ([`FixedHistogram::to_f64`]) is one correct rounding of its exact total, so it depends on the
//! samples alone: any world, partition, order or allreduce path gives the same bits.
//!
//! Which values are held exactly, and how the others are rounded, is on [`FixedScale`].
//!
//! This module owns the scale and how the ranks agree on it, the histogram, its headroom
//! checks and its adds' errors. The exact conversions between an f64 and quanta, and the adds'
//! table of units, are in [`quanta`], which keeps their rounding invariants: each value rounded
//! once, to nearest, ties to even; each sum read back with one correct rounding. How a
//! histogram is reduced, in which width, and how its ranks fail together is in [`reduction`].
//!
//! Invariants kept here:
//!
//! - **One scale.** The scale is a pure function of the global max and row count, so every
//!   rank that agreed holds the same one, and each value's quanta depend on that value alone.
//! - **Headroom.** Each bin's sum on a rank stays within `rows × 2^(m + e)` quanta (the
//!   headroom), where `rows` are the rows the rank declared: every add checks the sum against
//!   it (the common case by the high word of the sum it adds to, a test that passes only sums
//!   that no value below the bound can take past it, and every other add exactly) and refuses,
//!   naming the bin, an add that would pass it; as each value adds at most `2^(m + e)` in
//!   magnitude, `rows` values never pass it.
//! - **No wrapped sums.** A reduction checks that every rank held the same scale and that
//!   their rows together are at most `2^k`, so the reduced sums never wrapped.
//! - **No partial sums.** A refused add adds nothing and is kept: a reduction then fails on
//!   every rank, naming it, and empties the histogram rather than reduce sums that miss a value.

use std::fmt;

use crate::{Collective, CollectiveError};

mod quanta;
mod reduction;

use quanta::{Units, exponent_above, pow2, quanta_to_f64, quantize, quantize_below};
use reduction::CHECKS;

/// A bin's sum stays within `±2^SUM_BITS` quanta, one bit short of an `i128`'s reach, so a fold
/// of two such partial sums cannot wrap either.
const SUM_BITS: i32 = 126;
/// Tags hold the bound exponent plus this in their low 12 bits (always 1 to 2099).
const TAG_BOUND_OFFSET: i32 = 1075;

/// The power-of-two quantum of a [`FixedHistogram`], agreed by every rank from the data alone.
///
/// It holds three numbers: the quantum `2^−exponent`, the bound every value must stay below
/// (`2^m`, the power of two above the global max |value|) and this rank's rows (its
/// headroom).
///
/// # The window
///
/// The scale comes from the global max |value| `M` and the global row count `N`: with `2^m`
/// the power of two above `M` (`M < 2^m`) and `2^k` the power of two at or above `N`, a value
/// `v` is held as `round(v × 2^e)` quanta, `e = 126 − k − m`, to nearest, ties to even. Then:
///
/// - a value is held exactly when `|v| >= 2^(m + k − 74)`: every bit of its 53 lies at or above
///   the quantum `2^−e`. That is the 74 − k binades below the largest value (57 binades for
///   10^5 rows, 42 for 2^32);
/// - a smaller value is off by at most half a quantum, `2^(m + k − 127)`: relative to `2^m`,
///   at most `2^(k − 127)` (`2^−110` for 10^5 rows); one below half a quantum becomes zero;
/// - a sum of `N` values below `2^m` stays within `2^126` quanta, so no order of folding, on any
///   rank, can pass the `±2^127` of an `i128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedScale {
    exponent: i32,
    bound_exponent: i32,
    local_rows: u64,
}

impl FixedScale {
    /// Agrees the scale with every rank of `ring` in one small collective (an allgather of 16
    /// bytes per rank): `local_max_abs` is the largest |value| this rank will add to any
    /// histogram of this scale, `local_rows` the most values it will add to any one bin (its
    /// row count). The scale comes from the largest max and the sum of the rows, so it depends
    /// on the data alone, not on how the rows are partitioned.
    ///
    /// Every rank calls it with its own numbers. A max that is not a finite number at least
    /// zero (naming the rank that passed it), or rows adding up to more than `u64::MAX`, fail
    /// every rank alike.
    ///
    /// ```
    /// use silvic_core::{FixedHistogram, FixedScale, LocalCollective};
    ///
    /// let mut ring = LocalCollective;
    /// let gradients = [0.25f64, -1.5, 3.0e-9];
    /// let max_abs = gradients.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    /// let scale = FixedScale::agree(&mut ring, max_abs, gradients.len() as u64)?;
    /// let mut hist = FixedHistogram::new(2, scale);
    /// for (row, &g) in gradients.iter().enumerate() {
    ///     hist.add(row % 2, g)?;
    /// }
    /// hist.allreduce(&mut ring)?;
    /// assert_eq!(hist.to_f64(), [0.25 + 3.0e-9, -1.5]);
    /// # Ok::<(), silvic_core::CollectiveError>(())
    /// ```
    pub fn agree<C: Collective + ?Sized>(
        ring: &mut C,
        local_max_abs: f64,
        local_rows: u64,
    ) -> Result<FixedScale, CollectiveError> {
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&local_max_abs.to_bits().to_le_bytes());
        mine[8..].copy_from_slice(&local_rows.to_le_bytes());
        let every = ring.allgather_bytes(&mine)?;
        let invalid = |reason: String| CollectiveError::InvalidArgument { reason };
        let (mut max_abs, mut rows) = (0.0f64, 0u64);
        for (rank, block) in every.iter().enumerate() {
            let words: Option<[u8; 16]> = block.as_slice().try_into().ok();
            let Some(words) = words else {
                return Err(invalid(format!("rank {rank} sent {} bytes, not 16", block.len())));
            };
            let theirs = f64::from_le_bytes(words[..8].try_into().expect("8 bytes"));
            let their_rows = u64::from_le_bytes(words[8..].try_into().expect("8 bytes"));
            if !(theirs.is_finite() && theirs >= 0.0) {
                return Err(invalid(format!(
                    "rank {rank} passed FixedScale::agree a max |value| of {theirs}: it must be \
                     a finite number at least 0"
                )));
            }
            max_abs = max_abs.max(theirs);
            rows = rows.checked_add(their_rows).ok_or_else(|| {
                invalid(
                    "the ranks' rows passed to FixedScale::agree add up to more than 2^64".into(),
                )
            })?;
        }
        Ok(FixedScale::for_totals(max_abs, rows, local_rows))
    }

    /// The scale for values below the power of two above `max_abs` and `rows` rows in all,
    /// with `local_rows` of them this rank's.
    fn for_totals(max_abs: f64, rows: u64, local_rows: u64) -> FixedScale {
        let bound_exponent = exponent_above(max_abs);
        let rows_exponent = if rows <= 1 { 0 } else { 64 - (rows - 1).leading_zeros() as i32 };
        FixedScale {
            exponent: SUM_BITS - rows_exponent - bound_exponent,
            bound_exponent,
            local_rows,
        }
    }

    /// Values are held as whole numbers of quanta of `2^−exponent`.
    pub fn exponent(self) -> i32 {
        self.exponent
    }

    /// Every value added must be below this in magnitude: the power of two above the agreed
    /// max |value| (infinity where that max is in f64's top binade).
    pub fn bound(self) -> f64 {
        pow2(self.bound_exponent)
    }

    /// The rows this rank declared: no bin's sum may pass what this many values could make.
    pub fn local_rows(self) -> u64 {
        self.local_rows
    }

    /// `value` as a whole number of quanta, rounded to nearest, ties to even; `None` where it
    /// is not below [`FixedScale::bound`] in magnitude (NaN and infinities included).
    pub fn quantize(self, value: f64) -> Option<i128> {
        (value.abs() < self.bound()).then(|| quantize(value, self.exponent))
    }

    /// `quanta` quanta as an f64, correctly rounded (to nearest, ties to even, subnormals and
    /// overflow to infinity included).
    pub fn to_f64(self, quanta: i128) -> f64 {
        quanta_to_f64(quanta, self.exponent)
    }

    /// The log2 of the rows the scale holds, `k`: `2^k` at or above the agreed total.
    fn rows_exponent(self) -> i32 {
        SUM_BITS - self.exponent - self.bound_exponent
    }

    /// The agreed parts of the scale (quantum and bound) as one small number, the same on every
    /// rank that agreed: its square and itself fit an `i128` summed over any world.
    fn tag(self) -> i128 {
        i128::from(self.exponent) * 4096 + i128::from(self.bound_exponent + TAG_BOUND_OFFSET)
    }
}

/// The agreed parts of a scale, as the errors show them.
fn describe(exponent: i32, bound_exponent: i32) -> String {
    format!("quanta of 2^{}, values below 2^{bound_exponent}", -exponent)
}

/// [`describe`] of a scale's [`FixedScale::tag`].
fn describe_tag(tag: i128) -> String {
    let (exponent, bound) = (tag.div_euclid(4096), tag.rem_euclid(4096));
    let bound = i32::try_from(bound).unwrap_or(0) - TAG_BOUND_OFFSET;
    describe(i32::try_from(exponent).unwrap_or(i32::MAX), bound)
}

impl fmt::Display for FixedScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(self.exponent, self.bound_exponent))
    }
}

/// Per-bin exact sums of per-sample values at an agreed [`FixedScale`], reduced over a ring
/// with one `i128` allreduce (a large histogram's bins go as `i64`s where they fit).
///
/// Build it on every rank with the same bins and scale, [`add`](FixedHistogram::add) each
/// sample's value to its bin, [`allreduce`](FixedHistogram::allreduce), and read the sums with
/// [`to_f64`](FixedHistogram::to_f64): every rank gets the same bits, and so would any other
/// world size or partition of the same samples (see [`FixedScale::agree`] for an example).
#[derive(Debug, PartialEq)]
pub struct FixedHistogram {
    /// The bins' sums in quanta, with room for the [`CHECKS`] elements a reduction appends
    /// (and takes off again).
    sums: Vec<i128>,
    scale: FixedScale,
    /// The rows whose values the sums may hold: the scale's local rows, then, once reduced,
    /// every rank's.
    rows: u128,
    /// What an add checks against: the bound, and the most quanta a bin's sum may hold in
    /// magnitude (the headroom, `rows × 2^(m + e)`).
    adder: Adder,
    /// The quanta of a unit of each f64 exponent's significand, for the adds' common case.
    units: Units,
    /// The first add refused since the histogram was made: its reduction fails on every rank.
    refused: Option<CollectiveError>,
}

impl Clone for FixedHistogram {
    fn clone(&self) -> FixedHistogram {
        FixedHistogram {
            sums: self.sums.clone(),
            scale: self.scale,
            rows: self.rows,
            adder: self.adder,
            units: self.units.clone(),
            refused: self.refused.clone(),
        }
    }

    /// Copies `source` into this histogram's memory: no new allocation where it has the room.
    fn clone_from(&mut self, source: &FixedHistogram) {
        self.sums.clone_from(&source.sums);
        self.scale = source.scale;
        self.rows = source.rows;
        self.adder = source.adder;
        self.units.clone_from(&source.units);
        self.refused.clone_from(&source.refused);
    }
}

impl FixedHistogram {
    /// `bins` empty bins at `scale`.
    pub fn new(bins: usize, scale: FixedScale) -> FixedHistogram {
        let mut sums = Vec::with_capacity(bins + CHECKS);
        sums.resize(bins, 0);
        let mut hist = FixedHistogram {
            sums,
            scale,
            rows: 0,
            adder: Adder::new(scale.exponent, scale.bound(), 0, 0),
            units: Units::new(scale.exponent, scale.bound_exponent),
            refused: None,
        };
        hist.hold_rows(u128::from(scale.local_rows));
        hist
    }

    /// Sets the rows the sums may hold, and so the headroom (`rows <= 2^k`, so at most
    /// `2^126` quanta).
    fn hold_rows(&mut self, rows: u128) {
        self.rows = rows;
        let most = 1u128 << (SUM_BITS - self.scale.rows_exponent());
        self.adder = Adder::new(self.scale.exponent, self.scale.bound(), rows * most, most);
    }

    /// The number of bins.
    pub fn bins(&self) -> usize {
        self.sums.len()
    }

    /// The scale the sums are held at.
    pub fn scale(&self) -> FixedScale {
        self.scale
    }

    /// Each bin's exact sum, in quanta of `2^−exponent` ([`FixedScale::exponent`]).
    pub fn sums(&self) -> &[i128] {
        &self.sums
    }

    /// Adds `value`, rounded to the scale on its own, to bin `bin`.
    ///
    /// Refused, with nothing added: a bin past the last and a value that is not finite
    /// ([`CollectiveError::InvalidArgument`]); a value not below the scale's bound, and one
    /// that would take the bin's sum past what this rank's declared rows could make
    /// ([`CollectiveError::Overflow`], naming the bin).
    #[inline]
    pub fn add(&mut self, bin: usize, value: f64) -> Result<(), CollectiveError> {
        // The bits, not the value: a caller's loop then loads them into an integer register.
        let bits = value.to_bits();
        if self.add_common(bin, bits) {
            return Ok(());
        }
        self.add_one(bin, bits)
    }

    /// Adds the value with these bits where it is the common case, in a few instructions, and
    /// says whether it did: a value held exactly (its exponent's unit is a whole number of
    /// quanta, below 2^63, and the value is below the bound: else the unit is 0), a bin of the
    /// histogram, and a sum whose high word says that no value below the bound can take it
    /// past the headroom. [`FixedHistogram::add_one`] does the rest.
    #[inline(always)]
    fn add_common(&mut self, bin: usize, bits: u64) -> bool {
        let (unit, offset) = self.units.of(bits);
        let (high, span) = (self.adder.high, self.adder.high_span);
        if let (true, Some(slot)) = (unit != 0, self.sums.get_mut(bin)) {
            if (((*slot >> 64) as i64).wrapping_add(high) as u64) < span {
                let significand = bits.wrapping_add(offset) as i64;
                *slot = slot.wrapping_add(i128::from(significand) * i128::from(unit));
                return true;
            }
        }
        false
    }

    /// [`FixedHistogram::add`] in full: checked exactly, and refusing.
    #[inline(never)]
    fn add_one(&mut self, bin: usize, bits: u64) -> Result<(), CollectiveError> {
        let value = f64::from_bits(bits);
        let adder = self.adder;
        if bin >= self.bins() {
            return Err(self.no_bin(bin));
        }
        let quanta = self
            .units
            .whole_quanta(value)
            .or_else(|| quantize_below(value, adder.bound, adder.exponent));
        let Some(quanta) = quanta else {
            return Err(self.refused(Refusal::Bound, bin, value));
        };
        adder.add_checked(&mut self.sums[bin], quanta).map_err(|r| self.refused(r, bin, value))
    }

    /// [`FixedHistogram::add`] of an f32 value (widened exactly).
    #[inline]
    pub fn add_f32(&mut self, bin: usize, value: f32) -> Result<(), CollectiveError> {
        self.add(bin, f64::from(value))
    }

    /// Adds `values[i]` to bin `bins[i]` for every `i`, as [`FixedHistogram::add`] does; if
    /// one is refused, the ones before it are taken back out (exactly: the sums are integers),
    /// so the histogram is as it was.
    pub fn add_many<B>(&mut self, bins: &[B], values: &[f64]) -> Result<(), CollectiveError>
    where
        B: Copy + TryInto<usize> + fmt::Display,
    {
        if bins.len() != values.len() {
            return Err(CollectiveError::InvalidArgument {
                reason: format!("{} bins for {} values", bins.len(), values.len()),
            });
        }
        for (i, (&bin, &value)) in bins.iter().zip(values).enumerate() {
            // A bin that is no usize is past the last: usize::MAX.
            let index = bin.try_into().unwrap_or(usize::MAX);
            if !self.add_common(index, value.to_bits()) {
                self.add_many_one(bins, values, i)?;
            }
        }
        Ok(())
    }

    /// Value `i` of [`FixedHistogram::add_many`], which the common case did not add: added in
    /// full, or refused with the values before it taken back out. Out of the batch's loop, so
    /// that the loop keeps what it needs in registers.
    #[cold]
    #[inline(never)]
    fn add_many_one<B>(
        &mut self,
        bins: &[B],
        values: &[f64],
        i: usize,
    ) -> Result<(), CollectiveError>
    where
        B: Copy + TryInto<usize> + fmt::Display,
    {
        let (bin, value) = (bins[i], values[i]);
        let added = match bin.try_into() {
            Ok(index) if index < self.bins() => self.add_one(index, value.to_bits()),
            _ => Err(self.refuse(CollectiveError::InvalidArgument {
                reason: format!("bin {bin} of value {i} is not a bin of {}", self.bins()),
            })),
        };
        if added.is_err() {
            for (&bin, &value) in bins[..i].iter().zip(values) {
                let index: usize = bin.try_into().unwrap_or_else(|_| unreachable!("added"));
                let sum = &mut self.sums[index];
                *sum = sum.wrapping_sub(quantize(value, self.adder.exponent));
            }
        }
        added
    }

    /// The error of a refused add, kept for the reduction.
    #[cold]
    fn refused(&mut self, refusal: Refusal, bin: usize, value: f64) -> CollectiveError {
        match refusal {
            Refusal::Bound => self.out_of_bound(bin, value),
            Refusal::Headroom => self.past_headroom(bin, value),
        }
    }

    /// Each bin's sum as an f64: one correct rounding of the exact total.
    pub fn to_f64(&self) -> Vec<f64> {
        self.sums().iter().map(|&quanta| quanta_to_f64(quanta, self.scale.exponent)).collect()
    }

    /// Keeps the first refusal for the reduction to tell every rank, and returns it.
    fn refuse(&mut self, error: CollectiveError) -> CollectiveError {
        self.refused.get_or_insert_with(|| error.clone());
        error
    }

    #[cold]
    fn no_bin(&mut self, bin: usize) -> CollectiveError {
        self.refuse(CollectiveError::InvalidArgument {
            reason: format!("bin {bin} is not a bin of this {}-bin histogram", self.bins()),
        })
    }

    #[cold]
    fn out_of_bound(&mut self, bin: usize, value: f64) -> CollectiveError {
        if !value.is_finite() {
            return self.refuse(CollectiveError::InvalidArgument {
                reason: format!(
                    "a fixed-point histogram adds finite values, bin {bin} got {value}"
                ),
            });
        }
        let error = CollectiveError::Overflow {
            bin: Some(bin),
            reason: format!(
                "value {value} is not below the scale's bound 2^{} (its {}), agreed from every \
                 rank's max |value|",
                self.scale.bound_exponent, self.scale
            ),
        };
        self.refuse(error)
    }

    #[cold]
    fn past_headroom(&mut self, bin: usize, value: f64) -> CollectiveError {
        let error = CollectiveError::Overflow {
            bin: Some(bin),
            reason: format!(
                "adding {value} takes the bin's sum past what {} rows of values below 2^{} can \
                 make (the rows this rank declared)",
                self.rows, self.scale.bound_exponent
            ),
        };
        self.refuse(error)
    }
}

/// Why an add was refused.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The value is not below the bound (or not a number).
    Bound,
    /// The bin's sum would pass the headroom.
    Headroom,
}

/// An add's constants, read once from the histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Adder {
    /// Every value must be below this in magnitude.
    bound: f64,
    exponent: i32,
    /// The most quanta a bin's sum may hold in magnitude.
    headroom: u128,
    /// The high word of the headroom less the most quanta one value makes, `2^(m + e)`: a sum
    /// whose high word is at least `-high` and below `high` stays within the headroom with
    /// any value below the bound added.
    high: i64,
    /// Twice `high`.
    high_span: u64,
}

impl Adder {
    /// `most` is the most quanta one value makes (`2^(m + e)`), `headroom` a bin's.
    fn new(exponent: i32, bound: f64, headroom: u128, most: u128) -> Adder {
        // headroom <= 2^126, so its high word is at most 2^62 and twice it fits a u64.
        let high = i64::try_from(headroom.saturating_sub(most) >> 64).expect("within 2^126");
        Adder { bound, exponent, headroom, high, high_span: 2 * high as u64 }
    }

    #[inline(always)]
    fn add_checked(self, slot: &mut i128, quanta: i128) -> Result<(), Refusal> {
        let sum = slot.wrapping_add(quanta);
        // Within the headroom: -h <= sum <= h, one unsigned compare of sum + h with 2h. Both
        // terms were within 2^126 quanta, so a sum past the headroom is seen even where it
        // wrapped (to -2^127).
        let lifted = sum.wrapping_add(self.headroom as i128) as u128;
        if lifted > self.headroom << 1 {
            return Err(Refusal::Headroom);
        }
        *slot = sum;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
