//! The peer benchmarks' timing protocol (docs/performance.md), so that figures compare with theirs:
//! warm-up, a calibration that picks `reps × iters`, then `reps` repetitions of
//! {barrier, `iters` back-to-back calls}; a repetition's time is the maximum over ranks, and a
//! size reports the median (and minimum) over repetitions.
//!
//! The barrier is a one-element f64 allreduce and the maximum over ranks an f64 max allreduce,
//! both on the collective being measured, so the protocol needs nothing else to talk over.

use std::time::Instant;

use silvic_core::{CollectiveError, TrainerCollective};

use crate::workload::Workload;

/// Sizes from this many bytes up get fewer warm-up calls and one call per repetition.
const BIG: usize = 16 << 20;
/// Repetitions of small sizes.
const REPS: u32 = 15;
/// Bounds on back-to-back calls per repetition.
const MAX_ITERS: u64 = 2000;
/// Bounds on repetitions of big sizes.
const BIG_REPS: (u32, u32) = (5, 15);

/// How many repetitions, and calls per repetition, fill `seconds` at `per_call` seconds a call.
pub(crate) fn plan(bytes: usize, per_call: f64, seconds: f64) -> (u32, u32) {
    let per_call = per_call.max(1e-9);
    if bytes >= BIG {
        let reps = (seconds / per_call) as u64;
        (reps.clamp(BIG_REPS.0 as u64, BIG_REPS.1 as u64) as u32, 1)
    } else {
        let iters = ((seconds / per_call) as u64 / REPS as u64).clamp(1, MAX_ITERS);
        (REPS, iters as u32)
    }
}

/// The most repetitions of a collective timed one call a repetition below [`BIG`].
const ONE_CALL_REPS: u64 = 100;

/// [`plan`] for a workload that `reduces_once` (each call reduces a copy made before its
/// repetition's barrier, untimed and in cache): one call a repetition, as many repetitions as
/// the plan's calls, 15 to 100.
fn plan_calls(bytes: usize, per_call: f64, seconds: f64, reduces_once: bool) -> (u32, u32) {
    let (reps, iters) = plan(bytes, per_call, seconds);
    if !reduces_once || iters == 1 {
        return (reps, iters);
    }
    let calls = u64::from(reps) * u64::from(iters);
    (calls.clamp(u64::from(REPS), ONE_CALL_REPS) as u32, 1)
}

/// Untimed calls before timing `bytes`, unless the user set them.
pub(crate) fn warmup(bytes: usize, chosen: Option<u32>) -> u32 {
    chosen.unwrap_or(if bytes >= BIG { 2 } else { 20 })
}

/// The median and minimum of `times`, which must not be empty (the upper median for an even
/// count, as the peers' scripts take it).
pub(crate) fn median_min(times: &mut [f64]) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0])
}

/// What one size measured, the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    pub(crate) iters: u32,
    pub(crate) reps: u32,
    /// Seconds per call: median and minimum over repetitions, each the maximum over ranks.
    pub(crate) median: f64,
    pub(crate) min: f64,
    /// Wrong elements summed over ranks, if checked.
    pub(crate) wrong: Option<u64>,
    /// CPU seconds per call, summed over ranks (each rank's calling thread and its channels'
    /// threads), where the system tells (Linux schedstat).
    pub(crate) cpu: Option<f64>,
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (nanoseconds, first field).
pub(crate) fn thread_cpu() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    parse_schedstat(&text)
}

/// CPU time rank `rank` has run: this thread's (the rank's calling thread) and its channels'
/// threads', which silvic-net names `silvic-RANK-chC` (every thread of this process whose name
/// starts so: ranks as threads share the process, each counting its own).
pub(crate) fn rank_cpu(rank: usize) -> Option<f64> {
    let mut total = thread_cpu()?;
    let prefix = format!("silvic-{rank}-ch");
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.starts_with(&prefix) {
            let text = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total += parse_schedstat(&text).unwrap_or(0.0);
        }
    }
    Some(total)
}

fn parse_schedstat(text: &str) -> Option<f64> {
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// The maximum of `value` over every rank.
pub(crate) fn max_over_ranks(
    collective: &mut dyn TrainerCollective,
    value: f64,
) -> Result<f64, CollectiveError> {
    let mut v = [value];
    collective.allreduce_max_f64(&mut v)?;
    Ok(v[0])
}

fn barrier(collective: &mut dyn TrainerCollective) -> Result<(), CollectiveError> {
    collective.allreduce_sum_f64(&mut [0.0])
}

/// Two collectives measured in turn ([`measure_pair`]), and the median over repetitions of
/// the second's time over the first's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pair {
    pub(crate) first: Measured,
    pub(crate) second: Measured,
    pub(crate) ratio: f64,
}

/// One side of a [`measure_pair`]: its workload, its size, and what its repetitions gave.
struct Side<'a> {
    workload: &'a mut Workload,
    bytes: usize,
    iters: u32,
    times: Vec<f64>,
    cpu: f64,
}

impl Side<'_> {
    /// One repetition: the call prepared, a barrier, then `iters` calls, timed (the maximum
    /// over ranks).
    fn repeat(&mut self, collective: &mut dyn TrainerCollective) -> Result<(), CollectiveError> {
        self.workload.prepare();
        barrier(collective)?;
        let cpu_start = thread_cpu();
        let start = Instant::now();
        for _ in 0..self.iters {
            self.workload.call(collective)?;
        }
        let mine = start.elapsed().as_secs_f64() / f64::from(self.iters);
        self.cpu += match (cpu_start, thread_cpu()) {
            (Some(a), Some(b)) => b - a,
            _ => f64::NAN,
        };
        self.times.push(max_over_ranks(collective, mine)?);
        Ok(())
    }

    fn measured(
        mut self,
        collective: &mut dyn TrainerCollective,
        check: bool,
    ) -> Result<Measured, CollectiveError> {
        let reps = self.times.len() as u32;
        let mut cpu = [self.cpu / (f64::from(reps) * f64::from(self.iters))];
        collective.allreduce_sum_f64(&mut cpu)?;
        let cpu = cpu[0].is_finite().then_some(cpu[0]);
        let (median, min) = median_min(&mut self.times);
        let wrong = if check {
            let mine = self.workload.check(collective, self.bytes)?;
            let mut total = [mine as i64];
            collective.allreduce_sum_i64(&mut total)?;
            Some(total[0] as u64)
        } else {
            None
        };
        Ok(Measured { iters: self.iters, reps, median, min, wrong, cpu })
    }
}

/// Measures `first` at `bytes.0` and `second` at `bytes.1` in turn, repetition by repetition
/// (each repetition the protocol's, and each pair in alternating order), so that what load
/// the machine has falls on both alike. Both sides follow the plan [`measure`] would make in
/// `seconds` for the slower of the two: the same repetitions and the same calls in each, so
/// that what a repetition pays once (the barrier's wake-ups) weighs on both alike.
pub(crate) fn measure_pair(
    collective: &mut dyn TrainerCollective,
    (first, second): (&mut Workload, &mut Workload),
    bytes: (usize, usize),
    seconds: f64,
    warmup_calls: Option<u32>,
    check: bool,
) -> Result<Pair, CollectiveError> {
    let side = |workload, bytes| Side { workload, bytes, iters: 1, times: Vec::new(), cpu: 0.0 };
    let mut sides = [side(first, bytes.0), side(second, bytes.1)];
    let mut slower = 0.0f64;
    for side in &mut sides {
        slower = slower.max(calibrate(collective, side.workload, side.bytes, warmup_calls)?);
    }
    let once = sides.iter().any(|side| side.workload.reduces_once());
    let (reps, iters) = plan_calls(bytes.0.max(bytes.1), slower, seconds, once);
    for side in &mut sides {
        side.iters = iters;
    }
    for rep in 0..reps as usize {
        for turn in 0..2 {
            sides[(rep + turn) % 2].repeat(collective)?;
        }
    }
    let mut ratios: Vec<f64> =
        sides[0].times.iter().zip(&sides[1].times).map(|(a, b)| b / a).collect();
    let (ratio, _) = median_min(&mut ratios);
    let [first, second] = sides;
    let first = first.measured(collective, check)?;
    Ok(Pair { first, second: second.measured(collective, check)?, ratio })
}

/// Fills `workload` for `bytes`, warms it up and calibrates: the seconds a call takes, the
/// maximum over ranks. A workload that [reduces once](Workload::reduces_once) is prepared
/// before each call, and calibrated on one.
fn calibrate(
    collective: &mut dyn TrainerCollective,
    workload: &mut Workload,
    bytes: usize,
    warmup_calls: Option<u32>,
) -> Result<f64, CollectiveError> {
    workload.fill(collective, bytes)?;
    for _ in 0..warmup(bytes, warmup_calls) {
        workload.prepare();
        workload.call(collective)?;
    }
    let calibration = if bytes >= BIG || workload.reduces_once() { 1 } else { 10 };
    workload.prepare();
    barrier(collective)?;
    let start = Instant::now();
    for _ in 0..calibration {
        workload.call(collective)?;
    }
    max_over_ranks(collective, start.elapsed().as_secs_f64() / f64::from(calibration))
}

/// Measures `workload` at `bytes` following the protocol.
pub(crate) fn measure(
    collective: &mut dyn TrainerCollective,
    workload: &mut Workload,
    bytes: usize,
    seconds: f64,
    warmup_calls: Option<u32>,
    check: bool,
) -> Result<Measured, CollectiveError> {
    let per_call = calibrate(collective, workload, bytes, warmup_calls)?;
    let (reps, iters) = plan_calls(bytes, per_call, seconds, workload.reduces_once());
    let mut times = Vec::with_capacity(reps as usize);
    let cpu_start = rank_cpu(collective.rank());
    for _ in 0..reps {
        workload.prepare();
        barrier(collective)?;
        let start = Instant::now();
        for _ in 0..iters {
            workload.call(collective)?;
        }
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        times.push(max_over_ranks(collective, mine)?);
    }
    let calls = f64::from(reps) * f64::from(iters);
    let mine = match (cpu_start, rank_cpu(collective.rank())) {
        (Some(a), Some(b)) => (b - a) / calls,
        _ => f64::NAN,
    };
    // NaN where any rank cannot tell: the sum is then NaN, shown as unknown.
    let mut cpu = [mine];
    collective.allreduce_sum_f64(&mut cpu)?;
    let cpu = cpu[0].is_finite().then_some(cpu[0]);
    let (median, min) = median_min(&mut times);
    let wrong = if check {
        let mine = workload.check(collective, bytes)?;
        let mut total = [mine as i64];
        collective.allreduce_sum_i64(&mut total)?;
        Some(total[0] as u64)
    } else {
        None
    };
    Ok(Measured { iters, reps, median, min, wrong, cpu })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Kind;
    use silvic_core::LocalCollective;

    #[test]
    fn plans_follow_the_peers_protocol() {
        // Small: 15 repetitions, iterations to fill the time, at most 2000.
        assert_eq!(plan(8, 10e-6, 1.0), (15, 2000));
        assert_eq!(plan(4096, 1e-3, 1.5), (15, 100));
        assert_eq!(plan(4096, 10.0, 1.0), (15, 1));
        // Big: one call per repetition, 5 to 15 repetitions.
        assert_eq!(plan(16 << 20, 0.1, 1.0), (10, 1));
        assert_eq!(plan(64 << 20, 1.0, 1.0), (5, 1));
        assert_eq!(plan(64 << 20, 1e-3, 1.0), (15, 1));
        assert_eq!(plan(8, 0.0, 1.0), (15, 2000));
        // Each call reducing a copy made before it: one call a repetition.
        assert_eq!(plan_calls(4096, 1e-3, 1.5, true), (100, 1));
        assert_eq!(plan_calls(4096, 0.05, 1.5, true), (30, 1));
        assert_eq!(plan_calls(4096, 10.0, 1.0, true), (15, 1));
        assert_eq!(plan_calls(16 << 20, 0.1, 1.0, true), (10, 1));
        assert_eq!(plan_calls(4096, 1e-3, 1.5, false), (15, 100));
        assert_eq!(warmup(8, None), 20);
        assert_eq!(warmup(16 << 20, None), 2);
        assert_eq!(warmup(8, Some(3)), 3);
    }

    #[test]
    fn median_is_the_upper_middle_and_min_the_least() {
        assert_eq!(median_min(&mut [3.0, 1.0, 2.0]), (2.0, 1.0));
        assert_eq!(median_min(&mut [4.0, 1.0, 3.0, 2.0]), (3.0, 1.0));
        assert_eq!(median_min(&mut [5.0]), (5.0, 5.0));
    }

    #[test]
    fn cpu_time_comes_from_schedstat() {
        assert_eq!(parse_schedstat("2500000000 77 3\n"), Some(2.5));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        if cfg!(target_os = "linux") {
            assert!(thread_cpu().is_some());
        }
    }

    #[test]
    fn a_pair_is_timed_in_turn_and_both_checked() {
        let mut f64s = Workload::new(Kind::SumF64, 0, 1, 4096);
        let mut wide = Workload::new(Kind::SumI128, 0, 1, 8192);
        let pair = measure_pair(
            &mut LocalCollective,
            (&mut f64s, &mut wide),
            (4096, 8192),
            0.001,
            Some(1),
            true,
        )
        .unwrap();
        assert_eq!((pair.first.reps, pair.second.reps), (15, 15));
        assert_eq!(pair.first.iters, pair.second.iters, "the same calls in each repetition");
        assert_eq!((pair.first.wrong, pair.second.wrong), (Some(0), Some(0)));
        assert!(pair.ratio > 0.0 && pair.ratio.is_finite(), "{pair:?}");
    }

    #[test]
    fn a_world_of_one_measures_and_checks() {
        let mut w = Workload::new(Kind::SumF64, 0, 1, 4096);
        let m = measure(&mut LocalCollective, &mut w, 4096, 0.001, Some(1), true).unwrap();
        assert_eq!(m.reps, 15);
        assert!(m.median >= m.min && m.min >= 0.0);
        assert_eq!(m.wrong, Some(0));
    }
}
