//! Replays every checked-in corpus file through its target's oracle, on the stable toolchain and
//! without libFuzzer: the seeds and the inputs of every bug the fuzzers found stay regression
//! tests even where cargo-fuzz cannot run.

use std::path::PathBuf;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{target}: only {} seeds in {}", files.len(), dir.display());
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "{target}: {} fails its oracle", file.display());
    }
}

#[test]
fn frame_decode_corpus() {
    replay("frame_decode", silvic_net_fuzz::frame_decode);
}

#[test]
fn abort_decode_corpus() {
    replay("abort_decode", silvic_net_fuzz::abort_decode);
}

#[test]
fn handshake_decode_corpus() {
    replay("handshake_decode", silvic_net_fuzz::handshake_decode);
}

#[test]
fn handshake_roles_corpus() {
    replay("handshake_roles", silvic_net_fuzz::handshake_roles);
}

#[test]
fn ring_frames_corpus() {
    replay("ring_frames", silvic_net_fuzz::ring_frames);
}

#[test]
fn exchange_rank0_corpus() {
    replay("exchange_rank0", silvic_net_fuzz::exchange_rank0);
}
