//! Seeded inputs whose collective results every rank can check exactly, alone.
//!
//! Each element is built from a hash of `(key, index)`, plus a small part that depends on the
//! rank, so that the expected result needs one pass over the hash and no other rank's data:
//!
//! - sum f64: `b + rank` with `b < 2^43`, so every partial sum is an exact integer below 2^53
//!   and the result is `world * b + world * (world - 1) / 2` whatever the fold order;
//! - sum i64: `h + rank * K` wrapping, result `world * h + K * world * (world - 1) / 2` wrapping;
//! - max f64: `b + 1` on the rank `i % world` and `b` elsewhere; about one element in 1021 is
//!   NaN on that rank, and the result must be NaN there (max propagates NaN);
//! - allgather: every rank's block is a hash of `(key, rank, index)`, regenerated to check.

use silvic_net::{Collective, CollectiveError};

/// splitmix64: a small, well-mixed hash of one word.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash(key: u64, i: usize) -> u64 {
    mix(key ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

const RANK_STEP: i64 = 0x1234_5678_9ABC_DEF1;

/// Which collective a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `allreduce_sum_f64`.
    SumF64,
    /// `allreduce_sum_i64`.
    SumI64,
    /// `allreduce_max_f64`.
    MaxF64,
    /// `allgather_bytes`.
    Gather,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 4] = [Kind::SumF64, Kind::SumI64, Kind::MaxF64, Kind::Gather];

    /// Parses the names [`Kind::name`] gives.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A short name, for command lines and reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::SumF64 => "sum_f64",
            Kind::SumI64 => "sum_i64",
            Kind::MaxF64 => "max_f64",
            Kind::Gather => "gather",
        }
    }
}

/// One collective call: what, how many bytes per rank, and the key its data is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The collective.
    pub kind: Kind,
    /// Bytes each rank passes (a multiple of 8 for the allreduces).
    pub bytes: usize,
    /// Seeds the data; the same on every rank for a given call.
    pub key: u64,
}

/// The `index`-th call of a seeded mix, the same on every rank: a random kind and a size drawn
/// log-uniformly, nine calls in ten from 0 to 64 KiB and one in ten from 64 KiB to `max_bytes`
/// (a trainer's traffic: many small gathers and sums, some large histograms).
pub fn mixed_call(seed: u64, index: u64, max_bytes: usize) -> Call {
    let r = mix(seed ^ mix(index));
    let kind = Kind::ALL[(r % 4) as usize];
    let small = (64usize << 10).min(max_bytes);
    let (lo, hi) = if (r >> 4) % 10 == 0 { (small, max_bytes) } else { (0, small) };
    let bytes = log_uniform(mix(r), lo, hi);
    let bytes = if kind == Kind::Gather { bytes } else { bytes / 8 * 8 };
    Call { kind, bytes, key: mix(r ^ 0xA5A5) }
}

/// A size in `lo..=hi`, uniform in its number of bits (0 stands for itself), both ends reachable.
fn log_uniform(r: u64, lo: usize, hi: usize) -> usize {
    let bits = |x: usize| usize::BITS - x.leading_zeros();
    let (b_lo, b_hi) = (bits(lo), bits(hi));
    let b = b_lo + (r % u64::from(b_hi - b_lo + 1)) as u32;
    let size = match b {
        0 => 0,
        b => (1usize << (b - 1)) + (mix(r) as usize) % (1usize << (b - 1)),
    };
    // The top octave is drawn whole, so that exactly `hi` comes up too.
    if b == b_hi && (r >> 40) % 8 == 0 { hi } else { size.clamp(lo, hi) }
}

/// The result of one call on this rank: `Ok(Err(text))` is a wrong result.
pub type Outcome = Result<Result<(), String>, CollectiveError>;

/// Runs `call` on `ring` with this rank's seeded input and checks the result.
pub fn run_and_check(ring: &mut dyn Collective, call: Call) -> Outcome {
    let (rank, world) = (ring.rank(), ring.world_size());
    let n = call.bytes / 8;
    let tri = (world * (world - 1) / 2) as u64;
    match call.kind {
        Kind::SumF64 => {
            let mut buf: Vec<f64> =
                (0..n).map(|i| (hash(call.key, i) >> 21) as f64 + rank as f64).collect();
            ring.allreduce_sum_f64(&mut buf)?;
            Ok(first_wrong(&buf, |i| (world as u64 * (hash(call.key, i) >> 21) + tri) as f64))
        }
        Kind::SumI64 => {
            let mut buf: Vec<i64> = (0..n)
                .map(|i| {
                    (hash(call.key, i) as i64).wrapping_add(RANK_STEP.wrapping_mul(rank as i64))
                })
                .collect();
            ring.allreduce_sum_i64(&mut buf)?;
            Ok(first_wrong(&buf, |i| {
                (hash(call.key, i) as i64)
                    .wrapping_mul(world as i64)
                    .wrapping_add(RANK_STEP.wrapping_mul(tri as i64))
            }))
        }
        Kind::MaxF64 => {
            let nan_at = |i: usize| hash(call.key, i) % 1021 == 0;
            let mut buf: Vec<f64> = (0..n)
                .map(|i| {
                    let mine = i % world == rank;
                    match (mine, nan_at(i)) {
                        (true, true) => f64::NAN,
                        (true, false) => (hash(call.key, i) >> 21) as f64 + 1.0,
                        (false, _) => (hash(call.key, i) >> 21) as f64,
                    }
                })
                .collect();
            ring.allreduce_max_f64(&mut buf)?;
            Ok(first_wrong(&buf, |i| {
                if nan_at(i) { f64::NAN } else { (hash(call.key, i) >> 21) as f64 + 1.0 }
            }))
        }
        Kind::Gather => {
            let local = block(call.key, rank, call.bytes);
            let all = ring.allgather_bytes(&local)?;
            if all.len() != world {
                return Ok(Err(format!(
                    "allgather returned {} blocks for {world} ranks",
                    all.len()
                )));
            }
            for (r, got) in all.iter().enumerate() {
                if *got != block(call.key, r, call.bytes) {
                    return Ok(Err(format!("allgather block of rank {r} differs")));
                }
            }
            Ok(Ok(()))
        }
    }
}

/// Rank `rank`'s allgather block for `key`: `len` hashed bytes.
pub fn block(key: u64, rank: usize, len: usize) -> Vec<u8> {
    let key = mix(key ^ (rank as u64) << 48);
    let mut out = Vec::with_capacity(len + 8);
    for w in 0..len.div_ceil(8) {
        out.extend_from_slice(&hash(key, w).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Compares bit for bit (so NaN equals NaN) and names the first element that differs.
fn first_wrong<T: Copy + Bits>(got: &[T], expected: impl Fn(usize) -> T) -> Result<(), String> {
    match got.iter().enumerate().find(|(i, g)| g.bits() != expected(*i).bits()) {
        None => Ok(()),
        Some((i, g)) => Err(format!(
            "element {i} of {}: got bits {:#x}, expected {:#x}",
            got.len(),
            g.bits(),
            expected(i).bits()
        )),
    }
}

trait Bits {
    fn bits(self) -> u64;
}
impl Bits for f64 {
    fn bits(self) -> u64 {
        if self.is_nan() { f64::NAN.to_bits() } else { self.to_bits() }
    }
}
impl Bits for i64 {
    fn bits(self) -> u64 {
        self as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use silvic_net::LocalCollective;

    #[test]
    fn mixed_calls_cover_every_kind_and_the_size_range() {
        let calls: Vec<Call> = (0..4000).map(|i| mixed_call(7, i, 4 << 20)).collect();
        for kind in Kind::ALL {
            assert!(calls.iter().any(|c| c.kind == kind), "{kind:?} never drawn");
        }
        assert!(calls.iter().any(|c| c.bytes == 0));
        assert!(calls.iter().any(|c| c.bytes == 4 << 20));
        assert!(calls.iter().filter(|c| c.bytes > 2 << 20).count() > 20);
        assert!(calls.iter().all(|c| c.bytes <= 4 << 20));
        assert!(calls.iter().filter(|c| c.kind != Kind::Gather).all(|c| c.bytes % 8 == 0));
        assert_eq!(mixed_call(7, 99, 4 << 20), calls[99], "the mix is a function of its inputs");
    }

    #[test]
    fn a_world_of_one_checks_out_and_a_wrong_value_is_caught() {
        for i in 0..200 {
            let call = mixed_call(3, i, 1 << 16);
            assert_eq!(run_and_check(&mut LocalCollective, call), Ok(Ok(())), "{call:?}");
        }
        let wrong = first_wrong(&[1.0, 2.0], |i| i as f64 + 1.0 + (i as f64));
        assert_eq!(
            wrong.unwrap_err(),
            "element 1 of 2: got bits 0x4000000000000000, expected 0x4008000000000000"
        );
    }
}
