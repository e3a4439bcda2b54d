//! Reports and their bytes, the verdict on them, the width it picks, narrowing in place, and a
//! summarized reduction in a world of one (every world and path: silvic-net's
//! `src/ring/fixed_tests.rs`).

use super::super::quanta::tests::Dice;
use super::*;
use crate::LocalCollective;

fn scale(max_abs: f64, rows: u64) -> FixedScale {
    FixedScale::agree(&mut LocalCollective, max_abs, rows).unwrap()
}

/// A report of `scale` with nothing wrong: 8 bins, 3 rows, sums of these `magnitudes`, every
/// sum a multiple of 2^`zeros`.
fn report(scale: FixedScale, magnitudes: u128, zeros: u32) -> Report {
    Report { tag: scale.tag(), bins: 8, rows: 3, magnitudes, ored: 1 << zeros, refused: None }
}

#[test]
fn a_report_comes_back_from_its_bytes_and_short_or_unknown_bytes_are_none() {
    let s = scale(2.0, 10);
    let plain = Report { ored: u128::MAX - 7, ..report(s, 1 << 100, 3) };
    let refused = Report {
        refused: Some(Refused { overflow: true, bin: Some(6), reason: "value 9 é".into() }),
        ..plain.clone()
    };
    let argument = Report {
        refused: Some(Refused { overflow: false, bin: None, reason: String::new() }),
        ..plain.clone()
    };
    for r in [&plain, &refused, &argument] {
        let bytes = r.to_bytes();
        assert_eq!(Report::read(&bytes).as_ref(), Some(r));
        for cut in 0..81 {
            assert_eq!(Report::read(&bytes[..cut]), None, "cut at {cut}");
        }
    }
    let mut unknown = plain.to_bytes();
    unknown[72] = 3;
    assert_eq!(Report::read(&unknown), None);
}

#[test]
fn the_verdict_names_a_scale_then_a_refusal_then_bins_then_rows() {
    let s = scale(2.0, 10);
    let other = scale(1000.0, 10);
    let fine = || Some(report(s, 5, 0));
    let judged = |reports: Vec<Option<Report>>| judge(&reports, s);

    let e = judged(vec![fine(), Some(report(other, 5, 0)), None]).unwrap_err();
    assert!(
        matches!(&e, CollectiveError::ScaleMismatch { peer: 1, got, .. } if *got == other.to_string()),
        "{e}"
    );
    let e = judged(vec![fine(), fine(), None]).unwrap_err();
    assert!(
        matches!(&e, CollectiveError::ScaleMismatch { peer: 2, got, .. } if got == "unreadable"),
        "{e}"
    );

    let refusal = |overflow, rank| {
        let r = Refused { overflow, bin: Some(4), reason: format!("trouble {rank}") };
        Some(Report { refused: Some(r), ..report(s, 5, 0) })
    };
    let e = judged(vec![fine(), refusal(false, 1), refusal(true, 2)]).unwrap_err();
    assert!(
        matches!(&e, CollectiveError::InvalidArgument { reason } if reason == "on rank 1, trouble 1"),
        "{e}"
    );
    let e = judged(vec![fine(), fine(), refusal(true, 2)]).unwrap_err();
    assert!(
        matches!(&e, CollectiveError::Overflow { bin: Some(4), reason } if reason == "on rank 2, trouble 2"),
        "{e}"
    );

    let nine = Some(Report { bins: 9, ..report(s, 5, 0) });
    let e = judged(vec![fine(), fine(), nine]).unwrap_err();
    assert!(
        e.to_string().contains("rank 2 reduces a fixed-point histogram of 9 bins, rank 0 one of 8"),
        "{e}"
    );

    // 10 rows agreed: 2^4 at most.
    let rows = |rows| Some(Report { rows, ..report(s, 5, 0) });
    assert_eq!(judged(vec![rows(10), rows(6)]).unwrap().rows, 16);
    let e = judged(vec![rows(10), rows(7)]).unwrap_err();
    assert!(
        matches!(&e, CollectiveError::Overflow { bin: None, reason } if reason.contains("of 17 rows")),
        "{e}"
    );
    let e = judged(vec![rows(u128::MAX), rows(7)]).unwrap_err();
    assert!(e.to_string().contains(&format!("of {} rows", u128::MAX)), "{e}");
}

/// The bins go as i64s exactly where the ranks' bounds on their sums (powers of two), less
/// the zeros every sum ends in, add up to at most i64::MAX.
#[test]
fn the_bins_go_narrow_where_the_shifted_bounds_fit_an_i64() {
    let s = scale(2.0, 10);
    let narrow = |reports: &[Report]| {
        let reports: Vec<_> = reports.iter().cloned().map(Some).collect();
        judge(&reports, s).unwrap().narrow
    };
    // Magnitudes of 72 bits bound the sums by 2^72: 2^62 shifted by 10.
    let bits = |n: u32| (1u128 << n) - 1;
    assert_eq!(narrow(&[report(s, bits(72), 10)]), Some(10));
    assert_eq!(narrow(&[report(s, bits(73), 10)]), None, "2^63");
    assert_eq!(narrow(&[report(s, bits(72), 10), report(s, bits(71), 10)]), Some(10));
    assert_eq!(narrow(&[report(s, bits(72), 10), report(s, bits(72), 10)]), None, "2^63");
    // The shift is the zeros every rank's sums end in: the fewest.
    assert_eq!(narrow(&[report(s, bits(70), 12), report(s, bits(70), 9)]), Some(9));
    assert_eq!(narrow(&[report(s, bits(80), 12), report(s, bits(80), 9)]), None);
    // Sums of 0 and -1 (no magnitude bits: bound 1), and sums past any shift.
    assert_eq!(narrow(&[report(s, 0, 0), report(s, bits(62), 0)]), Some(0));
    assert_eq!(narrow(&[report(s, u128::MAX, 0)]), None);
    // Nothing but zeros.
    let empty = Report { magnitudes: 0, ored: 0, ..report(s, 0, 0) };
    assert_eq!(narrow(&[empty.clone(), empty]), Some(0));
}

/// The one pass's magnitudes and OR are those of the sums, and `2^n`, `n` the bit length of
/// the magnitudes, bounds every |sum|.
#[test]
fn magnitudes_bound_every_sum() {
    let mut dice = Dice(0x3a6_0001);
    for n in [0, 1, 2, 5, 64, 1001] {
        let sums: Vec<i128> = (0..n)
            .map(|_| {
                (i128::from(dice.next() as i64) << 64 | i128::from(dice.next())) >> dice.below(127)
            })
            .chain([-1, 0, i128::MIN >> 3])
            .collect();
        // Shifted by 60 to 67 bits, so that some need i128s and some not.
        let sums: Vec<i128> = sums.iter().map(|&x| x >> (127 - 64 - dice.below(4))).collect();
        let (magnitudes, ored) = magnitudes_and_ored(&sums);
        let all_ored = sums.iter().fold(0, |o, &x| o | x as u128);
        let all_magnitudes = sums.iter().fold(0, |m, &x| m | (x ^ (x >> 127)) as u128);
        if needs_i128s(all_magnitudes, all_ored) {
            assert!(needs_i128s(magnitudes, ored), "{n} sums");
        } else {
            assert_eq!((magnitudes, ored), (all_magnitudes, all_ored), "{n} sums");
        }
        let bound = 1u128 << (128 - all_magnitudes.leading_zeros());
        assert!(sums.iter().all(|x| x.unsigned_abs() <= bound), "{n} sums");
        assert!(sums.iter().any(|x| x.unsigned_abs() > bound >> 2), "{n} sums: a loose bound");
    }
}

/// A pass that stops early, on sums that already need i128s, leaves a report the verdict
/// sends as i128s, though the sums after it would share fewer zeros and hold larger sums.
#[test]
fn a_pass_stopped_early_still_sends_i128s() {
    let s = scale(2.0, 10);
    let mut sums = vec![1i128 << 70; 5000];
    sums[0] = 1 << 7;
    sums[4999] = (1 << 100) + 1;
    let (magnitudes, ored) = magnitudes_and_ored(&sums);
    assert_eq!((magnitudes, ored), (1 << 70 | 1 << 7, 1 << 70 | 1 << 7), "one chunk read");
    let report = Report { magnitudes, ored, ..report(s, 0, 0) };
    assert_eq!(judge(&[Some(report)], s).unwrap().narrow, None);
    // Sums that fit are read to the last.
    sums[0] = 1 << 10;
    sums[4999] = 1 << 9;
    assert_eq!(
        magnitudes_and_ored(&sums),
        (1 << 70 | 1 << 10 | 1 << 9, 1 << 70 | 1 << 10 | 1 << 9)
    );
    assert!(!needs_i128s(1 << 70 | 1 << 10 | 1 << 9, 1 << 9));
    assert!(needs_i128s(1 << 71, 1 << 9) && !needs_i128s((1 << 71) - 1, 1 << 9));
}

/// Narrowing and widening in the sums' own words give back every sum, and the i64s between
/// are the sums shifted.
#[test]
fn narrowing_in_place_keeps_every_sum() {
    let mut dice = Dice(0x6e_a770);
    for bins in [0, 1, 2, 3, 17, 1000] {
        for shift in [0, 1, 63, 64, 100, 127] {
            // Below 2^(127 - shift) in magnitude, so that shifted they are i128s.
            let bits = (127 - shift).min(63);
            let sums: Vec<i128> = (0..bins)
                .map(|_| {
                    let word =
                        dice.next() as i64 >> (63 - bits + dice.below(u64::from(bits) + 1) as u32);
                    i128::from(word) << shift
                })
                .collect();
            let mut held = sums.clone();
            let words: &mut [i64] = bytemuck::cast_slice_mut(held.as_mut_slice());
            let n = bins;
            narrow(words, n, shift);
            let shifted: Vec<i64> = sums.iter().map(|&s| (s >> shift) as i64).collect();
            assert_eq!(&words[..n], shifted, "{n} bins, shift {shift}");
            widen(words, n, shift);
            assert_eq!(held, sums, "{n} bins, shift {shift}");
        }
    }
}

/// A world of one, at the size that gathers reports first: the sums come back, narrow or
/// wide, and a refused value fails the reduction and empties the histogram.
#[test]
fn a_summarized_reduction_in_a_world_of_one_keeps_its_sums() {
    let bins = SUMMARIZED_FROM_BINS;
    for (values, narrow) in [(&[0.5, -0.25, 3.0e-3][..], true), (&[1.0, 1.0e-12][..], false)] {
        let s = scale(2.0, bins as u64);
        let mut hist = FixedHistogram::new(bins, s);
        for bin in 0..bins {
            hist.add(bin, values[bin % values.len()]).unwrap();
        }
        let before = hist.sums().to_vec();
        let report = hist.report();
        let totals = judge(&[Some(report)], s).unwrap();
        assert_eq!(totals.narrow.is_some(), narrow, "{values:?}");
        hist.allreduce(&mut LocalCollective).unwrap();
        assert_eq!(hist.sums(), before, "{values:?}");
        hist.add(7, 5.0).unwrap_err();
        let e = hist.allreduce(&mut LocalCollective).unwrap_err();
        assert!(
            matches!(&e, CollectiveError::Overflow { bin: Some(7), reason } if reason.starts_with("on rank 0, value 5 is not below")),
            "{e}"
        );
        assert!(hist.sums().iter().all(|&s| s == 0));
    }
}

/// Whatever bytes a peer sends as its report, reading and judging them returns, never panics:
/// a report it cannot read names it, one it can is judged like any other.
#[test]
fn any_bytes_as_a_report_are_read_or_refused_and_judged_without_a_panic() {
    let s = scale(2.0, 10);
    let mut dice = Dice(0xbad_b17e5);
    let mine = report(s, 5, 0);
    let mut readable = 0;
    for _ in 0..20_000 {
        let mut bytes = mine.to_bytes();
        bytes.resize(dice.below(100) as usize, 0);
        for _ in 0..dice.below(6) {
            if !bytes.is_empty() {
                let at = dice.below(bytes.len() as u64) as usize;
                bytes[at] = dice.next() as u8;
            }
        }
        let theirs = Report::read(&bytes);
        readable += usize::from(theirs.is_some());
        let verdict = judge(&[Some(mine.clone()), theirs.clone()], s);
        if theirs.is_none() {
            assert!(matches!(verdict, Err(CollectiveError::ScaleMismatch { peer: 1, .. })));
        }
    }
    assert!(readable > 1000, "{readable} readable");
}
