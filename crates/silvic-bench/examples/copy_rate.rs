//! The rate one core copies a frame's bytes, for `silvic-bench --simulate --copy-gbyte`
//! (docs/simulator.md): 256 KiB slices (the ring's slice) of a 64 MiB buffer, far past the
//! caches as a large call's buffer is, copied into one 256 KiB buffer (a socket buffer's worth:
//! a send) and back out of it (a receive), 4 passes a round, 7 rounds.
//!
//! `cargo run --release -p silvic-bench --example copy_rate`

use std::hint::black_box;
use std::time::Instant;

const BUFFER: usize = 64 << 20;
const SLICE: usize = 256 << 10;
const PASSES: usize = 4;

fn main() {
    let mut buffer = vec![1u8; BUFFER];
    let mut socket = vec![0u8; SLICE];
    let rate = |start: Instant| (PASSES * BUFFER) as f64 / start.elapsed().as_secs_f64() / 1e9;
    for round in 0..7 {
        let start = Instant::now();
        for _ in 0..PASSES {
            for slice in buffer.chunks_exact(SLICE) {
                socket.copy_from_slice(slice);
                black_box(&mut socket);
            }
        }
        let out = rate(start);
        let start = Instant::now();
        for _ in 0..PASSES {
            for slice in buffer.chunks_exact_mut(SLICE) {
                slice.copy_from_slice(&socket);
                black_box(&mut *slice);
            }
        }
        let back = rate(start);
        println!("round {round}: out {out:.2} GB/s, in {back:.2} GB/s");
    }
}
