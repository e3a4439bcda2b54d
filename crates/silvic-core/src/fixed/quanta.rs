//! The exact conversions between f64 values and quanta, the whole numbers of `2^−exponent` a
//! [`FixedHistogram`](super::FixedHistogram) sums: a value into quanta as it is added, a sum of
//! quanta back into an f64 as it is read.
//!
//! Invariants kept here, for any exponent a [`FixedScale`](super::FixedScale) may have:
//!
//! - **One rounding per value, to nearest, ties to even.** [`quantize`] computes
//!   `round(value × 2^exponent)` from the value's bits in integers, with no float step: the
//!   quanta depend on that value and the exponent alone, never on other values, their order or
//!   their grouping. Its caller makes sure the value is finite and the result within `2^126`.
//! - **The fast path agrees with it.** [`Units::whole_quanta`], the adds' common case, answers
//!   only for values that are a whole number of quanta (no rounding at all) and then gives
//!   exactly [`quantize`]'s quanta; for every other value it answers `None`, and
//!   [`quantize_below`] does the rest. A [`Units`] table is a function of the scale alone, so
//!   histograms of a scale may share one.
//! - **Exact reads, one correct rounding.** [`quanta_to_f64`] turns an exact `i128` sum back
//!   into the f64 nearest to it, ties to even, subnormals included and overflow to infinity,
//!   rounding once; zero is `+0`. [`pow2`] and [`exponent_above`] are exact.
//!
//! Not here: choosing the scale, the bound and headroom checks, and the refusals and errors of
//! an add; the parent module keeps those and calls these functions only on values that passed.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// The exponent of the smallest positive f64 (a subnormal).
const MIN_EXPONENT: i32 = -1074;

/// A normal f64's implicit leading bit.
const IMPLICIT: u64 = 1 << 52;

/// For each f64 sign and biased exponent (a value's top 12 bits), the signed quanta of a unit
/// of its significand, `±2^(biased − 1075 + exponent)`, where that is a whole number from
/// `2^0` to `2^62` and the exponent's values are normal and below the bound; 0 for every
/// other exponent (zeros, subnormals, infinities and NaNs included). A value whose unit is not
/// 0 is `significand × unit` quanta exactly: one 64 × 64 → 128-bit multiply. That is every
/// value held exactly (see [`FixedScale`](super::FixedScale)) but, with fewer than `2^11` rows
/// (`k < 11`), those in the top `11 − k` binades below the bound.
///
/// Beside each unit, what added to a value's bits makes its significand (the implicit bit set,
/// sign and exponent cleared), so that the adds' common case takes both from one table with
/// one index. The table (64 KiB) depends on the scale alone, and the histograms of a scale
/// share one: the last few scales' tables are kept.
#[derive(Clone)]
pub(super) struct Units {
    /// The scale's exponent and bound exponent.
    key: (i32, i32),
    /// The units at `top`, the significands' offsets at `top + 4096`.
    table: Arc<[i64; 8192]>,
}

/// How many scales' tables [`Units::new`] keeps for the next histograms.
const KEPT_TABLES: usize = 4;

impl Units {
    pub(super) fn new(exponent: i32, bound_exponent: i32) -> Units {
        static KEPT: Mutex<Vec<Units>> = Mutex::new(Vec::new());
        let key = (exponent, bound_exponent);
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(units) = kept.iter().find(|units| units.key == key) {
            return units.clone();
        }
        let mut table = vec![0i64; 8192];
        for (top, offset) in table[4096..].iter_mut().enumerate() {
            *offset = IMPLICIT.wrapping_sub((top as u64) << 52) as i64;
        }
        // Normal exponents only: a value of biased exponent b is below 2^(b − 1022), and all
        // of its binade is below the bound 2^m when b − 1022 <= m.
        for biased in 1..=2046i64 {
            let unit = biased - 1075 + i64::from(exponent);
            if (0..=62).contains(&unit) && biased - 1022 <= i64::from(bound_exponent) {
                table[biased as usize] = 1 << unit;
                table[biased as usize | 2048] = -(1 << unit);
            }
        }
        let table = Arc::<[i64]>::from(table).try_into().expect("8192 entries");
        let units = Units { key, table };
        if kept.len() == KEPT_TABLES {
            kept.remove(0);
        }
        kept.push(units.clone());
        units
    }

    /// The unit of the value with these bits (0 where the common case does not hold it), and
    /// the offset that makes its significand.
    #[inline(always)]
    pub(super) fn of(&self, bits: u64) -> (i64, u64) {
        let top = (bits >> 52) as usize;
        (self.table[top], self.table[top + 4096] as u64)
    }

    /// `value`'s quanta where its unit is not 0; else `None`.
    #[inline]
    pub(super) fn whole_quanta(&self, value: f64) -> Option<i128> {
        let bits = value.to_bits();
        let (unit, offset) = self.of(bits);
        let significand = bits.wrapping_add(offset) as i64;
        (unit != 0).then(|| i128::from(significand) * i128::from(unit))
    }
}

impl PartialEq for Units {
    fn eq(&self, other: &Units) -> bool {
        // The table is a function of the key.
        self.key == other.key
    }
}

impl fmt::Debug for Units {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Units").field("key", &self.key).finish_non_exhaustive()
    }
}

/// The quanta of the values [`Units::whole_quanta`] leaves, out of the adds' loops.
#[cold]
#[inline(never)]
pub(super) fn quantize_below(value: f64, bound: f64, exponent: i32) -> Option<i128> {
    (value.abs() < bound).then(|| quantize(value, exponent))
}

/// `2^exponent` for exponents from -1074 (the smallest subnormal) to 1024 (infinity).
pub(super) fn pow2(exponent: i32) -> f64 {
    match exponent {
        1024.. => f64::INFINITY,
        -1022.. => f64::from_bits(((exponent + 1023) as u64) << 52),
        _ => f64::from_bits(1u64 << (exponent - MIN_EXPONENT).max(0)),
    }
}

/// The least `m` with `x < 2^m`, for a finite `x >= 0`; -1074 for zero (so that only zeros lie
/// below `2^m`: none of f64's positive values do).
pub(super) fn exponent_above(x: f64) -> i32 {
    let bits = x.abs().to_bits();
    let biased = (bits >> 52) as i32;
    if biased == 0 {
        // Zero or a subnormal: `bits` is the value in units of 2^-1074.
        (64 - bits.leading_zeros() as i32 + MIN_EXPONENT).max(MIN_EXPONENT)
    } else {
        biased - 1022
    }
}

/// `round(value × 2^exponent)`, to nearest, ties to even, exactly, for a finite `value` whose
/// result is within `2^126` (which the bound check makes sure of).
#[inline]
pub(crate) fn quantize(value: f64, exponent: i32) -> i128 {
    let bits = value.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    // value = significand × 2^(power - exponent): a subnormal has no implicit bit and the
    // smallest normal's exponent.
    let (significand, power) = if biased == 0 {
        (fraction, MIN_EXPONENT + exponent)
    } else {
        (fraction | 1 << 52, biased - 1075 + exponent)
    };
    let magnitude = if power >= 0 {
        (significand as u128) << power
    } else {
        u128::from(shift_right_even(significand, power.unsigned_abs()))
    };
    let magnitude = magnitude as i128;
    if bits >> 63 == 0 { magnitude } else { -magnitude }
}

/// `x / 2^by` rounded to nearest, ties to even, for `x < 2^53`.
#[inline]
fn shift_right_even(x: u64, by: u32) -> u64 {
    if by >= 64 {
        return 0; // below half of 2^by
    }
    let kept = x >> by;
    let dropped = x & ((1u64 << by) - 1);
    let half = 1u64 << (by - 1);
    kept + u64::from(dropped > half || (dropped == half && kept & 1 == 1))
}

/// `x / 2^by` rounded to nearest, ties to even, for any `by >= 1`.
fn shift_right_even_u128(x: u128, by: u32) -> u128 {
    if by > 128 {
        return 0;
    }
    let (kept, dropped) = if by == 128 { (0, x) } else { (x >> by, x & ((1u128 << by) - 1)) };
    let half = 1u128 << (by - 1);
    kept + u128::from(dropped > half || (dropped == half && kept & 1 == 1))
}

/// `quanta × 2^−exponent` rounded once to an f64 (to nearest, ties to even), subnormals and
/// overflow included.
pub(crate) fn quanta_to_f64(quanta: i128, exponent: i32) -> f64 {
    let magnitude = quanta.unsigned_abs();
    let length = 128 - magnitude.leading_zeros() as i32;
    // The leading bit is worth 2^top.
    let top = length - 1 - exponent;
    let value = if magnitude == 0 {
        0.0
    } else if top > 1023 {
        f64::INFINITY
    } else {
        // Keep 53 bits, or fewer where the value is subnormal: none below 2^-1074.
        let keep = 53.min(top - MIN_EXPONENT + 1);
        let drop = length - keep;
        let (significand, power) = if drop > 0 {
            (shift_right_even_u128(magnitude, drop as u32), drop - exponent)
        } else {
            (magnitude, -exponent)
        };
        // significand <= 2^53 and -1074 <= power <= 971, so both are exact and the product is
        // rounded only where it overflows (to infinity, as a correct rounding does).
        significand as f64 * pow2(power)
    };
    if quanta < 0 { -value } else { value }
}

#[cfg(test)]
#[path = "quanta_tests.rs"]
pub(super) mod tests;
