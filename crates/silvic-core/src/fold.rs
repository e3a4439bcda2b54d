//! The element-wise combiners of every reduction, shared by every backend.
//!
//! A reduction folds the values of one element across ranks left to right:
//! `acc = combine(acc, next)`, starting from the first rank of the fold order. The order itself is
//! the backend's (silvic-net states its own); these functions fix what one combine does, including
//! which operand wins where IEEE 754 leaves a choice (NaN payloads, signed zeros), so that two
//! backends with the same order give the same bits.

/// `acc + x` in IEEE 754 double precision; where both are NaN, `acc`'s NaN (quieted) wins.
///
/// IEEE 754 leaves open which NaN an add of two NaNs returns, and so does Rust: an optimizing
/// compiler may swap an add's operands (it does where it vectorizes a fold), and the hardware
/// then returns the other one. So where `acc` is NaN it is added to zero instead of `x`: an
/// add that sees one NaN keeps its payload in either operand order, and two folds in the same
/// order give the same bits however they were compiled. (A zero chosen by the NaN test
/// compiles to one mask instruction; picking `acc` itself would cost a blend.)
#[inline]
pub fn sum_f64(acc: f64, x: f64) -> f64 {
    acc + if acc.is_nan() { 0.0 } else { x }
}

/// `acc + x` in two's complement, wrapping on overflow: exact, and the same in any order.
#[inline]
pub fn sum_i64(acc: i64, x: i64) -> i64 {
    acc.wrapping_add(x)
}

/// The larger of `acc` and `x`, where NaN is larger than everything.
///
/// If `acc` is NaN it is kept (so the first NaN in fold order wins, payload and all); otherwise a
/// NaN `x` is taken. Between equal values (`-0.0` and `+0.0`) `acc` is kept.
#[inline]
pub fn max_f64(acc: f64, x: f64) -> f64 {
    if acc.is_nan() || (!x.is_nan() && x <= acc) { acc } else { x }
}

/// `acc + x` in IEEE 754 single precision; where both are NaN, `acc`'s NaN (quieted) wins, as
/// in [`sum_f64`].
#[inline]
pub fn sum_f32(acc: f32, x: f32) -> f32 {
    acc + if acc.is_nan() { 0.0 } else { x }
}

/// `acc + x` in two's complement, wrapping on overflow.
#[inline]
pub fn sum_i32(acc: i32, x: i32) -> i32 {
    acc.wrapping_add(x)
}

/// `acc + x` modulo 2^64.
#[inline]
pub fn sum_u64(acc: u64, x: u64) -> u64 {
    acc.wrapping_add(x)
}

/// `acc + x` modulo 2^128, in two's complement: exact, and the same in any order.
#[inline]
pub fn sum_i128(acc: i128, x: i128) -> i128 {
    acc.wrapping_add(x)
}

/// The larger of `acc` and `x` as [`max_f64`] picks it, in single precision.
#[inline]
pub fn max_f32(acc: f32, x: f32) -> f32 {
    if acc.is_nan() || (!x.is_nan() && x <= acc) { acc } else { x }
}

/// The smaller of `acc` and `x`, where NaN wins over everything.
///
/// If `acc` is NaN it is kept (the first NaN in fold order wins, payload and all); otherwise a
/// NaN `x` is taken. Between equal values (`-0.0` and `+0.0`) `acc` is kept.
#[inline]
pub fn min_f64(acc: f64, x: f64) -> f64 {
    if acc.is_nan() || (!x.is_nan() && x >= acc) { acc } else { x }
}

/// The smaller of `acc` and `x` as [`min_f64`] picks it, in single precision.
#[inline]
pub fn min_f32(acc: f32, x: f32) -> f32 {
    if acc.is_nan() || (!x.is_nan() && x >= acc) { acc } else { x }
}

/// The larger of two integers (of any order-total type: `i32`, `i64`, `u64`, `i128`).
#[inline]
pub fn max_int<T: Ord>(acc: T, x: T) -> T {
    acc.max(x)
}

/// The smaller of two integers (of any order-total type: `i32`, `i64`, `u64`, `i128`).
#[inline]
pub fn min_int<T: Ord>(acc: T, x: T) -> T {
    acc.min(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_propagates_nan_from_either_side() {
        assert!(max_f64(f64::NAN, 1.0).is_nan());
        assert!(max_f64(1.0, f64::NAN).is_nan());
        assert_eq!(max_f64(1.0, 2.0), 2.0);
        assert_eq!(max_f64(2.0, 1.0), 2.0);
        assert_eq!(max_f64(f64::NEG_INFINITY, -1e308), -1e308);
    }

    #[test]
    fn max_keeps_the_first_of_equal_values_and_the_first_nan() {
        assert!(max_f64(-0.0, 0.0).is_sign_negative());
        assert!(max_f64(0.0, -0.0).is_sign_positive());
        let first = f64::from_bits(0x7ff8_0000_0000_0001);
        let second = f64::from_bits(0x7ff8_0000_0000_0002);
        assert_eq!(max_f64(first, second).to_bits(), first.to_bits());
    }

    #[test]
    fn min_mirrors_max_and_single_precision_keeps_the_same_rules() {
        assert!(min_f64(f64::NAN, 1.0).is_nan() && min_f64(1.0, f64::NAN).is_nan());
        assert_eq!((min_f64(1.0, 2.0), min_f64(2.0, 1.0)), (1.0, 1.0));
        assert!(min_f64(0.0, -0.0).is_sign_positive() && min_f64(-0.0, 0.0).is_sign_negative());
        let first = f32::from_bits(0x7fc0_0001);
        assert_eq!(max_f32(first, f32::from_bits(0x7fc0_0002)).to_bits(), first.to_bits());
        assert_eq!(min_f32(first, f32::NAN).to_bits(), first.to_bits());
        assert!(max_f32(1.0, f32::NAN).is_nan() && min_f32(1.0, f32::NAN).is_nan());
        assert_eq!((max_f32(-1.0, 3.0), min_f32(-1.0, 3.0)), (3.0, -1.0));
        assert_eq!((max_int(3u64, 9), min_int(-3i32, 9)), (9, -3));
        assert_eq!((sum_i32(i32::MAX, 1), sum_u64(u64::MAX, 2)), (i32::MIN, 1));
        assert_eq!((sum_i128(i128::MAX, 1), sum_i128(-5, 3)), (i128::MIN, -2));
        assert_eq!(sum_f32(0.1, 0.2), 0.1f32 + 0.2f32);
    }

    #[test]
    fn a_sum_of_two_nans_keeps_the_first_quieted_and_of_one_nan_that_one() {
        let (first, second) = (0x7ff8_0000_0000_0001, 0x7ff8_0000_0000_0002);
        let sum = |a: u64, b: u64| sum_f64(f64::from_bits(a), f64::from_bits(b)).to_bits();
        assert_eq!(sum(first, second), first);
        assert_eq!(sum(second, first), second);
        assert_eq!(sum(0x7ff0_0000_0000_0005, second), 0x7ff8_0000_0000_0005, "quieted");
        assert_eq!(sum(1f64.to_bits(), second), second);
        assert!(sum_f64(f64::INFINITY, f64::NEG_INFINITY).is_nan());
        assert!(sum_f64(-0.0, -0.0).is_sign_negative() && sum_f64(-0.0, 0.0).is_sign_positive());
        let sum32 = |a: u32, b: u32| sum_f32(f32::from_bits(a), f32::from_bits(b)).to_bits();
        assert_eq!(sum32(0x7fc0_0001, 0x7fc0_0002), 0x7fc0_0001);
        assert_eq!(sum32(0x7f80_0003, 0x7fc0_0002), 0x7fc0_0003, "quieted");
        assert_eq!(sum32(2f32.to_bits(), 0x7fc0_0002), 0x7fc0_0002);
    }

    /// The loop an optimized build vectorizes, where the compiler may swap an add's operands:
    /// element by element, the first NaN still wins.
    #[test]
    fn a_fold_over_slices_keeps_each_elements_first_nan() {
        let nan = |i: usize, tag: u64| f64::from_bits(0x7ff8_0000_0000_0000 | tag << 16 | i as u64);
        let first: Vec<f64> =
            (0..256).map(|i| if i % 3 == 0 { nan(i, 1) } else { i as f64 }).collect();
        let second: Vec<f64> = (0..256).map(|i| if i % 2 == 0 { nan(i, 2) } else { 0.5 }).collect();
        let mut acc = first.clone();
        for (a, x) in acc.iter_mut().zip(&second) {
            *a = sum_f64(*a, *x);
        }
        for (i, a) in acc.iter().enumerate() {
            let want = match (i % 3, i % 2) {
                (0, _) => first[i],
                (_, 0) => second[i],
                _ => i as f64 + 0.5,
            };
            assert_eq!(a.to_bits(), want.to_bits(), "element {i}");
        }
    }

    #[test]
    fn integer_sum_wraps() {
        assert_eq!(sum_i64(i64::MAX, 1), i64::MIN);
        assert_eq!(sum_i64(-5, 3), -2);
        assert_eq!(sum_f64(0.1, 0.2), 0.1 + 0.2);
    }
}
