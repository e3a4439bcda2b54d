//! The scale's window, the histogram's headroom and refusals, batches, and reductions in a
//! world of one (every world and path: silvic-net's `src/ring/fixed_tests.rs`).

use num_bigint::BigInt;

use super::quanta::tests::{Dice, assert_correctly_rounded};
use super::*;
use crate::LocalCollective;

fn scale(max_abs: f64, rows: u64) -> FixedScale {
    FixedScale::agree(&mut LocalCollective, max_abs, rows).unwrap()
}

/// The window the module docs state: values within 74 - k binades of the bound come back
/// exactly; smaller ones are off by at most half a quantum; N values at the bound fit.
#[test]
fn the_window_holds_what_the_docs_say() {
    let mut dice = Dice(0xb1_4a5e);
    for (max_abs, rows) in [(1.0, 1), (1000.0, 100_000), (3.0e-7, 1 << 32), (1.7e308, 9), (0.0, 4)]
    {
        let s = scale(max_abs, rows);
        let k = if rows <= 1 { 0 } else { 64 - (rows - 1).leading_zeros() as i32 };
        let m = exponent_above(max_abs);
        assert!(max_abs < s.bound() && (max_abs == 0.0 || s.bound() <= 2.0 * max_abs.max(1e-300)));
        assert_eq!(s.exponent(), 126 - k - m);
        assert_eq!(s.rows_exponent(), k);
        for _ in 0..2000 {
            let binades = dice.between(0, 140);
            let fraction = 1.0 + dice.below(1 << 52) as f64 / (1u64 << 52) as f64;
            // Below 2^m: 2^(m - 1) times [1, 2), then scaled down.
            let value = 2f64.powi(m - 1) * fraction * 2f64.powi(-binades);
            if value == 0.0 {
                continue;
            }
            let quanta = s.quantize(value).unwrap();
            let back = s.to_f64(quanta);
            if value >= 2f64.powi(m + k - 74) {
                assert_eq!(back, value, "{value:e} within the window, {s}");
            } else {
                let off = (back - value).abs();
                assert!(off <= 2f64.powi(m + k - 127), "{value:e} off by {off:e}, {s}");
            }
        }
    }
    assert_eq!(scale(0.0, 3).quantize(0.0), Some(0));
    assert_eq!(scale(0.0, 3).quantize(f64::from_bits(1)), None, "only zeros below a max of 0");
    assert_eq!(scale(f64::MAX, 1).bound(), f64::INFINITY);
    assert_eq!(scale(f64::MAX, 1).quantize(f64::INFINITY), None);
    assert_eq!(scale(1.0, 1).quantize(f64::NAN), None);
}

#[test]
fn a_bin_holds_every_rows_values_at_the_bound_and_refuses_one_more() {
    for rows in [1u64, 2, 3, 1000, 1 << 20] {
        let s = scale(1.0, rows);
        let largest = 2.0 - f64::EPSILON; // below the bound 2
        let mut hist = FixedHistogram::new(3, s);
        for _ in 0..rows {
            hist.add(1, largest).unwrap();
            hist.add(2, -largest).unwrap();
        }
        let before = hist.clone();
        let refused = hist.add(1, largest).unwrap_err();
        assert!(matches!(refused, CollectiveError::Overflow { bin: Some(1), .. }), "{refused}");
        assert!(refused.to_string().contains("in bin 1"), "{refused}");
        assert!(hist.add(2, -largest).is_err());
        assert_eq!(hist.sums(), before.sums(), "a refused add adds nothing");
        // Cancelling values still fit: the headroom bounds the sum, not the count.
        hist.add(1, -largest).unwrap();
        hist.add(1, largest).unwrap();
        assert_eq!(hist.to_f64()[1], rows as f64 * largest);
        assert_eq!(hist.to_f64()[2], -(rows as f64) * largest);
    }
    // Rows that are all a scale's: 2^64 - 1 of them, the headroom within 2^126.
    let s = scale(1.0, u64::MAX);
    let mut hist = FixedHistogram::new(1, s);
    hist.add(0, 1.999).unwrap();
    assert_eq!(hist.to_f64(), [1.999]);
}

#[test]
fn values_outside_the_scale_and_bins_outside_the_histogram_are_refused() {
    let mut hist = FixedHistogram::new(4, scale(3.0, 10));
    assert_eq!(hist.scale().bound(), 4.0);
    let outside = hist.add(2, 4.0).unwrap_err();
    assert!(matches!(outside, CollectiveError::Overflow { bin: Some(2), .. }), "{outside}");
    assert!(
        outside.to_string().contains("value 4 is not below the scale's bound 2^2"),
        "{outside}"
    );
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let e = hist.add(0, bad).unwrap_err();
        assert_eq!(e.kind(), "invalid_argument", "{e}");
    }
    let past = hist.add(4, 1.0).unwrap_err();
    assert!(past.to_string().contains("bin 4 is not a bin of this 4-bin histogram"), "{past}");
    hist.add_f32(3, -0.75f32).unwrap();
    assert_eq!(hist.to_f64(), [0.0, 0.0, 0.0, -0.75]);
    assert_eq!(hist.sums()[3], -3i128 << (hist.scale().exponent() - 2));
}

#[test]
fn a_refused_value_in_a_batch_takes_the_batch_back_out() {
    let mut hist = FixedHistogram::new(3, scale(1.0, 4));
    hist.add(0, 0.125).unwrap();
    let before = hist.clone();
    let e = hist.add_many(&[0i64, 1, 2, 1], &[0.5, 1e-30, 0.25, 7.0]).unwrap_err();
    assert!(matches!(e, CollectiveError::Overflow { bin: Some(1), .. }), "{e}");
    assert_eq!(hist.sums(), before.sums());
    let e = hist.add_many(&[0i64, -1], &[0.5, 0.5]).unwrap_err();
    assert!(e.to_string().contains("bin -1 of value 1"), "{e}");
    assert_eq!(hist.sums(), before.sums());
    assert!(hist.add_many(&[0i64], &[0.5, 0.5]).is_err());
    hist.add_many(&[0i64, 1, 2, 1], &[0.5, 1e-30, 0.25, -0.5]).unwrap();
    assert_eq!(hist.to_f64(), [0.625, 1e-30 - 0.5, 0.25]);
}

#[test]
fn a_sum_is_the_same_in_any_order_and_grouping() {
    let mut dice = Dice(0x0bde_0001);
    let values: Vec<f64> = (0..5000)
        .map(|_| {
            let v = f64::from_bits(dice.next() >> 12 | 0x3ff0_0000_0000_0000) - 1.0;
            v * 2f64.powi(dice.between(-40, 10)) * if dice.below(2) == 0 { 1.0 } else { -1.0 }
        })
        .collect();
    let max_abs = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let s = scale(max_abs, values.len() as u64);
    let mut forward = FixedHistogram::new(1, s);
    for &v in &values {
        forward.add(0, v).unwrap();
    }
    let mut backward = FixedHistogram::new(1, s);
    for &v in values.iter().rev() {
        backward.add(0, v).unwrap();
    }
    assert_eq!(forward.sums(), backward.sums());
    let exact: BigInt = values.iter().map(|&v| BigInt::from(s.quantize(v).unwrap())).sum();
    assert_eq!(BigInt::from(forward.sums()[0]), exact);
    assert_correctly_rounded(forward.sums()[0], s.exponent(), forward.to_f64()[0]);
}

#[test]
fn agree_refuses_a_max_that_is_not_a_number_at_least_zero() {
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let e = FixedScale::agree(&mut LocalCollective, bad, 3).unwrap_err();
        assert_eq!(e.kind(), "invalid_argument", "{e}");
        assert!(e.to_string().contains("rank 0 passed FixedScale::agree a max"), "{e}");
    }
    let s = FixedScale::agree(&mut LocalCollective, -0.0, 3).unwrap();
    assert_eq!(
        (s.local_rows(), s.to_string()),
        (3, "quanta of 2^-1198, values below 2^-1074".into())
    );
}

#[test]
fn a_world_of_one_reduces_to_its_own_sums_as_often_as_asked() {
    let s = scale(10.0, 4);
    let mut hist = FixedHistogram::new(2, s);
    hist.add(0, 9.5).unwrap();
    hist.add(1, -0.1).unwrap();
    let before = hist.to_f64();
    hist.allreduce(&mut LocalCollective).unwrap();
    hist.allreduce(&mut LocalCollective).unwrap();
    assert_eq!(hist.to_f64(), before);
    assert_eq!(describe_tag(s.tag()), s.to_string());
    assert_eq!(describe_tag(scale(1e300, 1).tag()), scale(1e300, 1).to_string());
}

/// A refused add is told at the reduction (here to the one rank there is), which fails and
/// empties the histogram rather than reduce sums that miss a value.
#[test]
fn a_refused_add_fails_the_reduction_and_empties_the_histogram() {
    let mut hist = FixedHistogram::new(2, scale(1.0, 2));
    hist.add(0, 0.5).unwrap();
    assert!(hist.add(1, 3.0).is_err());
    hist.add(1, 0.25).unwrap();
    let e = hist.allreduce(&mut LocalCollective).unwrap_err();
    assert!(matches!(e, CollectiveError::Overflow { bin: Some(1), .. }), "{e}");
    assert!(e.to_string().starts_with("fixed-point overflow in bin 1: on rank 0, value 3"), "{e}");
    assert_eq!(hist.sums(), [0, 0]);
    let mut nan = FixedHistogram::new(1, scale(1.0, 2));
    assert!(nan.add(0, f64::NAN).is_err());
    let e = nan.allreduce(&mut LocalCollective).unwrap_err();
    assert_eq!(e.kind(), "invalid_argument", "{e}");
    assert!(e.to_string().contains("on rank 0, a fixed-point histogram adds finite"), "{e}");
}

/// A long batch, values spanning every binade of the window and past it (rounded), gives the
/// sums that adding one by one gives, with bins as usize or i64.
#[test]
fn a_batch_adds_what_adds_one_by_one_add() {
    let mut dice = Dice(0xba7c_4000);
    let n = 337;
    let values: Vec<f64> = (0..n)
        .map(|_| {
            let v = f64::from_bits(dice.next() >> 12 | 0x3ff0_0000_0000_0000) - 1.0;
            v * 2f64.powi(dice.between(-120, 10)) * if dice.below(2) == 0 { 1.0 } else { -1.0 }
        })
        .collect();
    let bins: Vec<usize> = (0..n).map(|_| dice.below(7) as usize).collect();
    // The last two: a scale whose 2^e is no f64, and one of one row (its top 11 binades
    // converted the slow way).
    for (s, unit) in [
        (scale(1024.0, n as u64), 1.0),
        (scale(1024.0, 1 << 40), 1.0),
        (scale(1e300, 2), 1.0e290),
        (scale(1.0e-300, n as u64), 1.0e-304),
        (scale(1024.0, 1), 1.0),
    ] {
        let values: Vec<f64> = values.iter().map(|v| v * unit).collect();
        let mut one_by_one = FixedHistogram::new(7, s);
        let mut batch = FixedHistogram::new(7, s);
        let mut wide = FixedHistogram::new(7, s);
        let rows = s.local_rows() as usize;
        for (&b, &v) in bins.iter().zip(&values).take(rows) {
            one_by_one.add(b, v).unwrap();
        }
        let bins_i64: Vec<i64> = bins.iter().map(|&b| b as i64).collect();
        batch.add_many(&bins[..n.min(rows)], &values[..n.min(rows)]).unwrap();
        wide.add_many(&bins_i64[..n.min(rows)], &values[..n.min(rows)]).unwrap();
        assert_eq!(batch.sums(), one_by_one.sums(), "{s}");
        assert_eq!(wide.sums(), one_by_one.sums(), "{s}");
        assert!(one_by_one.sums().iter().any(|&q| q != 0), "{s}");
    }
}

/// A value or bin refused late in a long batch takes every value of the batch back out, and
/// names the one refused.
#[test]
fn a_refusal_late_in_a_long_batch_takes_it_all_back() {
    let n = 197;
    let mut hist = FixedHistogram::new(4, scale(1.0, 1 << 20));
    hist.add(3, 0.375).unwrap();
    let before = hist.clone();
    let bins: Vec<i64> = (0..n as i64).map(|i| i % 4).collect();
    let values: Vec<f64> = (0..n).map(|i| 0.001 * i as f64 - 0.1).collect();
    for at in [0, 1, 63, 64, 131, n - 1] {
        let mut bad_value = values.clone();
        bad_value[at] = 2.5;
        let e = hist.add_many(&bins, &bad_value).unwrap_err();
        let bin = at % 4;
        assert!(matches!(e, CollectiveError::Overflow { bin: Some(b), .. } if b == bin), "{e}");
        assert_eq!(hist.sums(), before.sums(), "value {at}");
        let mut bad_bin = bins.clone();
        bad_bin[at] = 4;
        let e = hist.add_many(&bad_bin, &values).unwrap_err();
        assert!(e.to_string().contains(&format!("bin 4 of value {at}")), "{e}");
        assert_eq!(hist.sums(), before.sums(), "bin {at}");
    }
    let mut nan = values.clone();
    nan[128] = f64::NAN;
    assert_eq!(hist.add_many(&bins, &nan).unwrap_err().kind(), "invalid_argument");
    hist.add_many(&bins, &values).unwrap();
    let mut want = before.clone();
    for (&b, &v) in bins.iter().zip(&values) {
        want.add(b as usize, v).unwrap();
    }
    assert_eq!(hist.sums(), want.sums());
}

/// Past the rows a histogram was made for, and once reduced, every add is checked again: the
/// one that takes a bin past the headroom is refused, in a batch or alone.
#[test]
fn adds_past_the_proof_are_checked() {
    let largest = 2.0 - f64::EPSILON;
    let rows = 192;
    let mut hist = FixedHistogram::new(2, scale(1.0, rows));
    let all = vec![0usize; rows as usize];
    hist.add_many(&all, &vec![largest; rows as usize]).unwrap();
    let before = hist.clone();
    let e = hist.add_many(&[1usize, 0], &[largest, largest]).unwrap_err();
    assert!(matches!(e, CollectiveError::Overflow { bin: Some(0), .. }), "{e}");
    assert_eq!(hist.sums(), before.sums());
    hist.add_many(&[1usize, 0, 0], &[largest, -largest, largest]).unwrap();
    assert!(hist.add(0, largest).is_err());
    // Reduced in a world of one, the sums hold the rows' values: nothing more fits bin 0.
    let mut reduced = FixedHistogram::new(1, scale(1.0, 4));
    for _ in 0..4 {
        reduced.add(0, largest).unwrap();
    }
    reduced.allreduce(&mut LocalCollective).unwrap();
    assert!(reduced.add(0, largest).is_err());
    assert!(reduced.add_many(&[0usize], &[largest]).is_err());
    reduced.add(0, -largest).unwrap();
}

/// `clone_from` gives an equal histogram, refusal and rows included, in the memory it had.
#[test]
fn clone_from_copies_a_histogram_into_its_own_memory() {
    let mut source = FixedHistogram::new(300, scale(10.0, 4));
    source.add(7, 9.5).unwrap();
    source.add(8, 20.0).unwrap_err();
    let mut copy = FixedHistogram::new(300, scale(1.0, 1000));
    let memory = copy.sums().as_ptr();
    copy.clone_from(&source);
    assert_eq!(copy, source);
    assert_eq!(copy.sums().as_ptr(), memory);
    let e = copy.allreduce(&mut LocalCollective).unwrap_err();
    assert!(matches!(e, CollectiveError::Overflow { bin: Some(8), .. }), "{e}");
    assert_eq!(source.clone(), source);
}
