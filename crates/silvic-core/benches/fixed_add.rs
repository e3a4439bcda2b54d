//! The rate of `FixedHistogram::add` against a plain f64 histogram add, per value.
//!
//! ```text
//! cargo bench -p silvic-core --bench fixed_add
//! ```
//!
//! One million heavy-tailed values (signs mixed, 2^-30 to 2^10) into 1,024 bins, the same
//! bins and values for each way; the ways are run in turn, 21 rounds, and each way's median
//! round is printed with the ratio of the medians. A round is timed in this thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), not the wall clock, so that time spent descheduled on a shared
//! machine is not counted; the rounds interleave so that what load remains (caches, frequency)
//! falls on every way alike.

use std::hint::black_box;

use silvic_core::{FixedHistogram, FixedScale, LocalCollective};

const VALUES: usize = 1 << 20;
const BINS: usize = 1024;
const ROUNDS: usize = 21;

/// xorshift64*: the same samples on every run.
fn samples() -> (Vec<usize>, Vec<f64>) {
    let mut state = 0x5eed_0037_u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..VALUES)
        .map(|_| {
            let h = next();
            let fraction = 1.0 + (h >> 34) as f64 / (1u64 << 30) as f64;
            let sign = if h & 1 == 0 { 1.0 } else { -1.0 };
            ((h >> 8) as usize % BINS, sign * fraction * 2f64.powi(((h >> 20) % 40) as i32 - 30))
        })
        .unzip()
}

/// This thread's time on a CPU so far, in nanoseconds.
fn cpu_ns() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let (bins, values) = samples();
    let bins_i64: Vec<i64> = bins.iter().map(|&b| b as i64).collect();
    let max_abs = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let scale = FixedScale::agree(&mut LocalCollective, max_abs, VALUES as u64).unwrap();
    let (mut plain_ns, mut fixed_ns, mut many_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let start = cpu_ns();
        let mut plain = vec![0.0f64; BINS];
        for (&b, &v) in black_box(&bins).iter().zip(black_box(&values)) {
            plain[b] += v;
        }
        black_box(&plain);
        plain_ns.push((cpu_ns() - start) / VALUES as f64);

        let start = cpu_ns();
        let mut fixed = FixedHistogram::new(BINS, scale);
        for (&b, &v) in black_box(&bins).iter().zip(black_box(&values)) {
            fixed.add(b, v).unwrap();
        }
        black_box(&fixed);
        fixed_ns.push((cpu_ns() - start) / VALUES as f64);

        let start = cpu_ns();
        let mut many = FixedHistogram::new(BINS, scale);
        many.add_many(black_box(&bins_i64), black_box(&values)).unwrap();
        black_box(&many);
        many_ns.push((cpu_ns() - start) / VALUES as f64);
        assert_eq!(fixed.sums(), many.sums());
    }
    let (plain, fixed, many) = (median(&mut plain_ns), median(&mut fixed_ns), median(&mut many_ns));
    println!("values {VALUES}, bins {BINS}, rounds {ROUNDS} (medians, ns per value)");
    println!("plain f64 add        {plain:.3} ns");
    println!("FixedHistogram::add  {fixed:.3} ns  rate {:.2} of plain", plain / fixed);
    println!("FixedHistogram::add_many (i64 bins) {many:.3} ns  rate {:.2} of plain", plain / many);
}
