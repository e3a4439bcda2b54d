use super::*;

/// 50 us hops, 10 Gbit/s, folds at 2 GB/s: the example network.
const WIDE: Network = Network { hop_ns: 50_000, bytes_per_us: 1250, folds_per_us: Some(2000) };

const KIB: usize = 1024;

/// With folds free and the loopback constants, the model picks gather or ring exactly where
/// today's cut does, for worlds 2..=64 and sizes from 1 byte to 2 MiB (a world of one moves
/// nothing on either path).
#[test]
fn the_model_puts_the_ring_cut_where_uses_gather_does() {
    for world in 2..=64 {
        let edge = schedule::gather_limit(world);
        let mut sizes: Vec<usize> = (0..=21).map(|b| 1 << b).collect();
        sizes.extend([edge - 1, edge, edge + 1, 4095, 4096, 4097]);
        for bytes in sizes {
            let chosen = cheapest(&Path::RING_ONLY, bytes, 1, world, Network::LOOPBACK);
            let today = if schedule::uses_gather(bytes, world) { Path::Gather } else { Path::Ring };
            assert_eq!(chosen, Some(today), "world {world} bytes {bytes}");
        }
    }
}

/// The table (50 us, 10 Gbit/s): index-fold-gather beats today's best path at 16 to 128
/// ranks from 32 KiB to 1 MiB, at least 5x the ring at world 64 and 32 KiB and 3x at 256 KiB;
/// its times are the table's within 20 % (this model charges the folds, and at 1 MiB the second
/// chunk's index that keeps the store within its cap; today's best path comes out slower than
/// the table says for the same reason, so it is not compared).
#[test]
fn index_fold_gather_wins_where_hops_cost_the_most() {
    let cases = [
        (16, 32 * KIB, 480),
        (64, 32 * KIB, 710),
        (64, 256 * KIB, 1500),
        (64, 1024 * KIB, 4100),
        (128, 256 * KIB, 1700),
    ];
    for (world, bytes, index_us) in cases {
        assert_eq!(cheapest(&Path::ALL, bytes, 8, world, WIDE), Some(Path::Index), "{world}");
        let us = |p| time_ns(p, bytes, 8, world, WIDE) as f64 / 1000.0;
        let near = |got: f64, want: f64| (got / want - 1.0).abs() < 0.2;
        assert!(near(us(Path::Index), index_us as f64), "{world} {bytes}: {}", us(Path::Index));
    }
    let ratio = |bytes| {
        time_ns(Path::Ring, bytes, 8, 64, WIDE) as f64
            / time_ns(Path::Index, bytes, 8, 64, WIDE) as f64
    };
    assert!(ratio(32 * KIB) >= 5.0 && ratio(256 * KIB) >= 3.0);
}

/// The cut's ends: a world of one costs nothing anywhere (the first candidate); tiny buffers
/// take the gather of fewer hops (Bruck's from world 10, where `ceil(log2 n) < floor(n/2)`
/// always; today's where it has as few); large ones the ring (fewest bytes), at every world.
#[test]
fn tiny_buffers_take_the_fewest_hops_and_large_ones_the_ring() {
    assert_eq!(cheapest(&Path::ALL, 8, 8, 1, WIDE), Some(Path::Ring));
    for world in 2..=128 {
        let fewer = if rounds(world) < world / 2 { Path::Bruck } else { Path::Gather };
        assert!(world < 10 || fewer == Path::Bruck);
        for net in [WIDE, Network { hop_ns: 10_000, ..WIDE }, Network::LOOPBACK] {
            let tiny = cheapest(&Path::ALL, 8, 8, world, net);
            assert_eq!(tiny, Some(fewer), "world {world} {net:?}");
            let large = cheapest(&Path::ALL, 64 << 20, 8, world, net);
            assert_eq!(large, Some(Path::Ring), "world {world} {net:?}");
        }
    }
}

/// The gathering paths are never chosen past their memory bound, however cheap.
#[test]
fn the_gathering_paths_stay_within_their_memory() {
    let free = Network { hop_ns: 1_000_000_000, bytes_per_us: 1 << 40, folds_per_us: None };
    for world in 2..=64 {
        for bytes in [4096, GATHER_MAX_BYTES / world, GATHER_MAX_BYTES / world + 1, 1 << 22] {
            let path = cheapest(&Path::ALL, bytes, 8, world, free).unwrap();
            let gathers = matches!(path, Path::Gather | Path::Bruck);
            assert_eq!(gathers, world * bytes <= GATHER_MAX_BYTES, "world {world} bytes {bytes}");
        }
    }
}

/// The index's hops count its chunks: a buffer whose store passes the cap pays one more index
/// per chunk, and its bytes are the slots it sends plus the allgather.
#[test]
fn the_index_pays_for_its_chunks() {
    let world = 64;
    let one = traffic(Path::Index, 256 * KIB, 8, world);
    assert_eq!(one.hops, 12);
    assert_eq!(one.sent_n, (192 + 63) * 256 * KIB as u128);
    let big = traffic(Path::Index, 16 << 20, 8, world);
    let count = chunks((16 << 20) / 8, world, 8, STORE_MAX_BYTES) as u64;
    assert!(count > 1);
    assert_eq!(big.hops, 6 * (count + 1));
}

/// The model's traffic is what the plans send: for worlds 1..=64 and buffers whose segments are
/// equal, the frames' payloads of every rank sum to the model's bytes, and the plans' rounds to
/// its hops.
#[test]
fn the_model_counts_what_the_plans_send() {
    use crate::ring::bruck::BruckPlan;
    use crate::ring::gather::Flat;
    use crate::ring::index::{IndexPlan, Store};
    use crate::ring::seam::{Call, FramePlan};
    use silvic_core::Op;
    let sent = |plan: &dyn FramePlan| -> (u128, u64) {
        let ways = plan.ways().len();
        let bytes = (0..ways).flat_map(|w| (0..plan.frames(w)).map(move |i| (w, i)));
        (bytes.map(|(w, i)| u128::from(plan.header(w, i).len)).sum(), ways as u64)
    };
    for world in 1..=64 {
        let len = 3 * world;
        let bytes = len * 8;
        let mut buf = vec![0.0f64; len];
        let store = Store::new(world, 3 * 8);
        let (mut transit, mut fold) = (vec![0; store.bytes()], vec![0; 16]);
        let mut gathered = vec![0u8; world * bytes];
        for rank in 0..world {
            let call = Call { rank, world, op: Op::AllreduceSumF64, seq: 0 };
            let sum = silvic_core::fold::sum_f64;
            let index =
                IndexPlan::new(call, &mut buf, sum, (1, 0), &store, &mut transit, &mut fold);
            let model = traffic(Path::Index, bytes, 8, world);
            assert_eq!(sent(&index), (model.sent_n / world as u128, model.hops), "world {world}");
            let mut flat = Flat { buf: &mut gathered, block: bytes };
            let bruck = BruckPlan::new(call, bytes as u64, &mut flat);
            let model = traffic(Path::Bruck, bytes, 8, world);
            assert_eq!(sent(&bruck), (model.sent_n / world as u128, model.hops), "world {world}");
        }
    }
}
