//! The conversions against an exact oracle apart from the code (big integers) and the
//! hardware's own rounding: one rounding per value, ties to even; reads correctly rounded at
//! every exponent; the adds' fast table equal to `quantize` wherever it answers.

use num_bigint::BigInt;
use num_traits::Signed;

use super::*;

/// A small deterministic generator (xorshift64*), shared with the histogram's tests.
pub(in crate::fixed) struct Dice(pub(in crate::fixed) u64);

impl Dice {
    pub(in crate::fixed) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(in crate::fixed) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(in crate::fixed) fn between(&mut self, low: i32, high: i32) -> i32 {
        low + self.below((high - low + 1) as u64) as i32
    }
}

/// `y × 2^at` as an exact big integer (`at` large enough that it is one).
fn exact(y: f64, at: i32) -> BigInt {
    let bits = y.abs().to_bits();
    let (biased, fraction) = ((bits >> 52) as i32, BigInt::from(bits & ((1 << 52) - 1)));
    let (significand, power) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction + (BigInt::from(1) << 52), biased - 1075)
    };
    let magnitude = significand << usize::try_from(power + at).expect("a whole number");
    if y < 0.0 { -magnitude } else { magnitude }
}

/// Asserts that `got` is `quanta × 2^-exponent` rounded to nearest, ties to even: no f64 lies
/// closer, and at a tie its significand is even. Checked in big integers, apart from the code.
pub(in crate::fixed) fn assert_correctly_rounded(quanta: i128, exponent: i32, got: f64) {
    let case = format!("{quanta} × 2^{} gave {got:e}", -exponent);
    let at = exponent.max(0) + 1074;
    let target = BigInt::from(quanta) << usize::try_from(at - exponent).unwrap();
    if got.is_infinite() {
        // Rounds to infinity from 2^1024 - 2^970 (half an ulp above f64::MAX) up.
        let threshold =
            (BigInt::from(1) << (1024 + at as usize)) - (BigInt::from(1) << (970 + at as usize));
        assert!(target.abs() >= threshold, "{case}");
        assert_eq!(got.is_sign_negative(), quanta < 0, "{case}");
        return;
    }
    let distance = |y: f64| (&target - exact(y, at)).abs();
    let mine = distance(got);
    let bits = got.to_bits();
    let neighbours = [f64::from_bits(bits.wrapping_add(1)), f64::from_bits(bits.wrapping_sub(1))];
    for n in neighbours
        .into_iter()
        .filter(|n| n.is_finite() && n.is_sign_negative() == got.is_sign_negative())
    {
        let theirs = distance(n);
        assert!(mine <= theirs, "{case}: {n:e} is closer");
        if mine == theirs {
            assert_eq!(bits & 1, 0, "{case}: a tie with {n:e} kept the odd one");
        }
    }
    if got == 0.0 {
        // Zero's other neighbour is the smallest subnormal of the other sign.
        let other = if got.is_sign_negative() { f64::from_bits(1) } else { -f64::from_bits(1) };
        assert!(mine <= distance(other), "{case}: {other:e} is closer");
    }
}

#[test]
fn quanta_convert_with_one_correct_rounding_at_every_exponent() {
    let mut dice = Dice(0x5eed_f1ed);
    for _ in 0..20_000 {
        let length = dice.between(1, 127) as u32;
        let magnitude = (u128::from(dice.next()) << 64 | u128::from(dice.next())) >> (128 - length);
        let magnitude = (magnitude | 1 << (length - 1)) as i128;
        let quanta = if dice.below(2) == 0 { magnitude } else { -magnitude };
        // Exponents that put the result anywhere: deep subnormal to overflow.
        let exponent = dice.between(-1100, 1250);
        assert_correctly_rounded(quanta, exponent, quanta_to_f64(quanta, exponent));
    }
    // Ties at 53 bits, both ways, and at the subnormal cut.
    for (quanta, exponent) in [
        ((1i128 << 53) + 1, 0),
        ((1i128 << 53) + 3, 0),
        (-(1i128 << 54) - 2, 1),
        (3, 1075),
        (1, 1075),
        (1, 1076),
        (5, 1076),
        (i128::MAX, -900),
        (i128::MIN + 1, -897),
        (1, -1023),
        (i128::MAX, 0),
    ] {
        assert_correctly_rounded(quanta, exponent, quanta_to_f64(quanta, exponent));
    }
    assert_eq!(quanta_to_f64((1i128 << 53) + 1, 0), 2f64.powi(53), "a tie goes to even");
    assert_eq!(quanta_to_f64((1i128 << 53) + 3, 0), 2f64.powi(53) + 4.0);
    assert_eq!(quanta_to_f64(1, 1075), 0.0, "half the smallest subnormal ties to zero");
    assert_eq!(quanta_to_f64(3, 1075), f64::from_bits(2), "one and a half rounds to two");
    assert_eq!(quanta_to_f64(0, 77).to_bits(), 0, "zero is +0");
}

#[test]
fn a_value_is_rounded_once_to_nearest_ties_to_even() {
    // Where `value × 2^exponent` is a normal f64, the hardware's own exact product and
    // round-ties-even are the oracle.
    let mut dice = Dice(0x0dd_ba11);
    for _ in 0..50_000 {
        let power = dice.between(-60, 60);
        let value = f64::from_bits(dice.next() >> 12 | 0x3ff0_0000_0000_0000) * 2f64.powi(power);
        let value = if dice.below(2) == 0 { value } else { -value };
        let exponent = dice.between(-power - 60, 120 - power);
        let want = (value * 2f64.powi(exponent)).round_ties_even() as i128;
        assert_eq!(quantize(value, exponent), want, "{value:e} at 2^{exponent}");
    }
    let e = 59;
    assert_eq!(quantize(0.5 * 2f64.powi(-e), e), 0, "half a quantum ties to zero");
    assert_eq!(quantize(1.5 * 2f64.powi(-e), e), 2);
    assert_eq!(quantize(-2.5 * 2f64.powi(-e), e), -2);
    assert_eq!(quantize(-3.5 * 2f64.powi(-e), e), -4);
    assert_eq!(quantize(f64::from_bits(1), 1074), 1, "a subnormal held exactly");
    assert_eq!(quantize(f64::from_bits(3), 1073), 2, "1.5 quanta to 2");
    assert_eq!(quantize(f64::from_bits(1), 1000), 0);
    assert_eq!(quantize(1e-300, 0), 0);
    assert_eq!(quantize(-0.0, 3), 0);
    assert_eq!(quantize(2f64.powi(72), 54), 1i128 << 126);
}

/// The adds' fast conversion ([`Units::whole_quanta`]) gives `quantize`'s quanta (itself checked
/// against big integers and the hardware's rounding above) wherever it answers, answers for
/// every value its doc names, and the adds' conversion as a whole refuses exactly the values not
/// below the bound: at every exponent a scale may have, over every binade, at the edges.
#[test]
fn the_fast_conversion_is_quantize_where_it_answers() {
    let mut dice = Dice(0x5b11_7000);
    let check = |value: f64, exponent: i32, bound_exponent: i32| {
        let bound = pow2(bound_exponent);
        let units = Units::new(exponent, bound_exponent);
        let want = (value.abs() < bound).then(|| quantize(value, exponent));
        let fast = units.whole_quanta(value);
        assert_eq!(
            fast.or_else(|| quantize_below(value, bound, exponent)),
            want,
            "{value:e} at 2^{exponent}, bound 2^{bound_exponent}"
        );
        assert!(fast.is_none() || fast == want, "{value:e} at 2^{exponent}: {fast:?}");
        // Where the doc says it answers: normal, below the bound, a unit of 2^0 to 2^62 quanta.
        let unit = ((value.to_bits() >> 52) & 0x7ff) as i32 - 1075 + exponent;
        let answers = value.is_normal() && value.abs() < bound;
        let answers = answers && (0..=62).contains(&unit);
        assert_eq!(fast.is_some(), answers, "{value:e} at 2^{exponent}");
    };
    for _ in 0..3_000 {
        // A scale as agree makes one: e = 126 - k - m, with k from 0 to 64.
        let bound_exponent = dice.between(-1073, 1024);
        let exponent = 126 - dice.between(0, 64) - bound_exponent;
        for _ in 0..100 {
            // Magnitudes from far below a quantum to past the bound.
            let binades = bound_exponent - dice.between(-2, 140);
            let fraction = f64::from_bits(dice.next() >> 12 | 0x3ff0_0000_0000_0000);
            let value = fraction * pow2(binades.clamp(-1074, 1023));
            let value = if dice.below(2) == 0 { value } else { -value };
            check(value, exponent, bound_exponent);
            check(f64::from_bits(dice.next() >> 12), exponent, bound_exponent); // subnormal
        }
    }
    // The neighbours of a positive value (f64's next_up and next_down are newer than the MSRV).
    let up = |x: f64| f64::from_bits(x.to_bits() + 1);
    let down = |x: f64| f64::from_bits(x.to_bits() - 1);
    for (exponent, bound_exponent) in
        [(0, 11), (95, 11), (115, 11), (116, 10), (-962, 1024), (1200, -1073)]
    {
        let bound = pow2(bound_exponent);
        // The edges of the fast range (a unit of 1 and of 2^62 quanta), the bound, and
        // what is never a number below it.
        for unit in [-1, 0, 1, 62, 63] {
            let at = pow2((unit + 52 - exponent).clamp(-1074, 1023));
            for value in [at, down(at), up(at), 1.5 * at] {
                check(value, exponent, bound_exponent);
                check(-value, exponent, bound_exponent);
            }
        }
        for value in [bound, down(bound), 0.0, -0.0, f64::INFINITY, f64::NAN, f64::MAX] {
            check(value, exponent, bound_exponent);
            check(-value, exponent, bound_exponent);
        }
    }
}
