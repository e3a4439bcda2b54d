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

/// The replay's link drives the log-depth plans to their end: rank 0 of four, forced onto
/// Bruck's gather, given each peer's honest frames (rank 1's block in round 0, ranks 2's and 3's
/// from rank 2 in round 1), folds every element over the four blocks in fold order.
#[test]
fn a_replay_runs_brucks_gather_to_its_end() {
    use silvic_net::frame::{Dir, Header, Path};
    use silvic_net::fuzzing::{Buffer, Setup, peers, replay};
    use silvic_net::{AllreducePath, Op};

    let len = 5;
    let block = |r: usize| -> Vec<f64> { (0..len).map(|i| (r * 10 + i) as f64).collect() };
    let bytes = |r: usize| -> Vec<u8> { block(r).iter().flat_map(|x| x.to_le_bytes()).collect() };
    let total = (len * 8) as u64;
    let frame = |r: usize| {
        let head = Header::data(Op::AllreduceSumF64, 0, total, total).on(Path::Bruck);
        [head.carrying(Dir::Right, r).encode().to_vec(), bytes(r)].concat()
    };
    assert_eq!(peers(4), [3, 1, 2], "the left neighbour, the right one, the chord");
    let streams = [vec![], frame(1), [frame(2), frame(3)].concat()];
    let streams: Vec<&[u8]> = streams.iter().map(Vec::as_slice).collect();
    let setup = Setup { world: 4, path: AllreducePath::Bruck, long_hops: false };
    let mut mine = block(0);
    replay(setup, Buffer::SumF64(&mut mine), &streams).expect("the honest frames are taken");
    // Small sums of integers: exact in any order.
    let want: Vec<f64> = (0..len).map(|i| (0..4).map(|r| block(r)[i]).sum()).collect();
    assert_eq!(mine, want);
}
