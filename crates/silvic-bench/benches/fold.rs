//! The fold kernels of a reduce-scatter beside a plain memory copy of the same size.
//!
//! `cargo bench -p silvic-bench` prints, per size, the median GB/s (10^9 bytes of destination
//! per second) of: `copy_from_slice`; `dst[i] = combine(src[i], dst[i])` for silvic-core's three
//! combiners, inlined as silvic-net's ring calls them; the same f64 sum decoding the source from
//! little-endian bytes (the receive scratch is bytes); and the f64 sum through a function
//! pointer, the shape an un-inlined combiner takes. 128 KiB stays in cache, as silvic-net's
//! fold scratch does; 64 MiB is a whole large histogram.
//!
//! A plain `harness = false` bench: a few medians need no statistics crate.

use std::hint::black_box;
use std::time::Instant;

use silvic_core::fold;

/// Runs `f` (which touches `bytes` of destination) until about `budget` seconds have passed,
/// at least 5 times; returns the median GB/s.
fn rate(bytes: usize, budget: f64, mut f: impl FnMut()) -> f64 {
    f(); // fault pages in and warm the caches
    let started = Instant::now();
    let mut rates = Vec::new();
    while rates.len() < 5 || (started.elapsed().as_secs_f64() < budget && rates.len() < 10_000) {
        let t = Instant::now();
        f();
        rates.push(bytes as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[inline(always)]
fn fold_into<T: Copy>(dst: &mut [T], src: &[T], combine: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = combine(*s, *d);
    }
}

fn main() {
    let budget = 0.4;
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11}   (GB/s of destination, median)",
        "size", "memcpy", "sum_f64", "sum_i64", "max_f64", "sum_f64 le", "sum_f64 ptr"
    );
    for bytes in [128 << 10, 2 << 20, 64 << 20] {
        let n = bytes / 8;
        let src_f: Vec<f64> =
            (0..n).map(|i| if i % 4099 == 7 { f64::NAN } else { (i % 1000) as f64 }).collect();
        let src_i: Vec<i64> = (0..n).map(|i| (i as i64).wrapping_mul(0x9E37_79B9)).collect();
        let src_le: Vec<u8> = src_f.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut dst_f = vec![1.0f64; n];
        let mut dst_i = vec![1i64; n];

        let copy = rate(bytes, budget, || {
            dst_f.copy_from_slice(black_box(&src_f));
            black_box(&mut dst_f);
        });
        let sum_f = rate(bytes, budget, || {
            fold_into(black_box(&mut dst_f), black_box(&src_f), fold::sum_f64);
        });
        let sum_i = rate(bytes, budget, || {
            fold_into(black_box(&mut dst_i), black_box(&src_i), fold::sum_i64);
        });
        let max_f = rate(bytes, budget, || {
            fold_into(black_box(&mut dst_f), black_box(&src_f), fold::max_f64);
        });
        let le = rate(bytes, budget, || {
            let dst = black_box(&mut dst_f);
            for (d, s) in dst.iter_mut().zip(black_box(&src_le).chunks_exact(8)) {
                let s = f64::from_le_bytes(s.try_into().expect("chunks of 8"));
                *d = fold::sum_f64(s, *d);
            }
        });
        let pointer: fn(f64, f64) -> f64 = black_box(fold::sum_f64);
        let ptr = rate(bytes, budget, || {
            fold_into(black_box(&mut dst_f), black_box(&src_f), pointer);
        });
        println!(
            "{:>8} {copy:>9.2} {sum_f:>9.2} {sum_i:>9.2} {max_f:>9.2} {le:>11.2} {ptr:>11.2}",
            if bytes >= 1 << 20 {
                format!("{} MiB", bytes >> 20)
            } else {
                format!("{} KiB", bytes >> 10)
            }
        );
    }
}
