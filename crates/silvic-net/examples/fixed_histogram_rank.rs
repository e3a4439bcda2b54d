//! One rank of a fixed-point histogram ring, as a process: the Rust side of the Python
//! binding's mixed-language test (`crates/silvic-net-py/tests/test_fixed.py`), and the pinned
//! usage of `FixedScale` and `FixedHistogram` end to end.
//!
//! ```text
//! fixed_histogram_rank RANK BINS SAMPLES_FILE RESULT_FILE
//! ```
//!
//! `SAMPLES_FILE` holds this rank's samples: `n` bins as little-endian i64, then `n` values as
//! little-endian f64. The rank binds on 127.0.0.1, prints `ADDR <address>`, reads one line of
//! every rank's address in rank order (space-separated) from stdin, joins the ring (job token
//! "fixed-histogram"), agrees the scale, adds its samples, reduces, and writes every bin's f64
//! result to `RESULT_FILE` as little-endian bits. Any failure is printed as `error: ...` with a
//! non-zero exit.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use silvic_net::{FixedHistogram, FixedScale, TcpCollective};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            println!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [rank, bins, samples, result] = args.as_slice() else {
        return Err("usage: fixed_histogram_rank RANK BINS SAMPLES_FILE RESULT_FILE".into());
    };
    let (rank, bins): (usize, usize) = (rank.parse()?, bins.parse()?);
    let bytes = std::fs::read(samples)?;
    let n = bytes.len() / 16;
    let word = |at: usize| -> [u8; 8] { bytes[at * 8..at * 8 + 8].try_into().expect("8 bytes") };
    let mine: Vec<(usize, f64)> = (0..n)
        .map(|i| {
            Ok((usize::try_from(i64::from_le_bytes(word(i)))?, f64::from_le_bytes(word(n + i))))
        })
        .collect::<Result<_, std::num::TryFromIntError>>()?;

    let listener = TcpCollective::bind("127.0.0.1")?;
    println!("ADDR {}", listener.address());
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let addresses: Vec<String> = line.split_whitespace().map(String::from).collect();
    let timeout = Duration::from_secs(60);
    let mut ring = TcpCollective::connect(listener, rank, &addresses, "fixed-histogram", timeout)?;

    let local_max_abs = mine.iter().fold(0.0f64, |m, &(_, g)| m.max(g.abs()));
    let local_rows = n as u64;
    let scale = FixedScale::agree(&mut ring, local_max_abs, local_rows)?;
    let mut hist = FixedHistogram::new(bins, scale);
    for &(bin, gradient) in &mine {
        hist.add(bin, gradient)?;
    }
    hist.allreduce(&mut ring)?;
    let sums: Vec<f64> = hist.to_f64();

    let out: Vec<u8> = sums.iter().flat_map(|s| s.to_bits().to_le_bytes()).collect();
    std::fs::write(result, out)?;
    Ok(())
}
