use super::*;
use crate::ring::lockstep::drive;
use crate::ring::mem::{Dice, Driver, on_ring};
use crate::ring::oracle::assert_gates_keep_the_rule;
use crate::ring::plan_checks;
use crate::ring::plan_checks::{
    assert_incoming_headers_differ, assert_nothing_overwritten_in_flight,
    assert_ways_share_streams_in_turn, bytes_of, every_op,
};
use crate::ring::shared::{Flat, fold_gathered};
use silvic_core::Op;

fn block_bytes(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + rank * 7 + 1) as u8).collect()
}

/// Every block reaches every rank, in `ceil(log2 n)` rounds of `min(2^k, n - 2^k)` frames,
/// through the call and the threaded driver (worlds 1..=64 run in the lockstep tests below).
#[test]
fn bruck_allgather_delivers_every_block_in_ceil_log2_rounds() {
    for world in (1..=9).chain([16, 17, 33]) {
        let sizes: &[usize] = if world <= 9 { &[0, 1, 5, 4096] } else { &[3] };
        for &block in sizes {
            let results = on_ring(Driver::new(world), |r, link| {
                let mut blocks = vec![vec![0; block]; world];
                blocks[r] = block_bytes(r, block);
                let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 3 };
                bruck_gather(link, call, block as u64, &mut blocks[..]).unwrap();
                (blocks, link.sent.clone())
            });
            let frames: Vec<usize> = (0..rounds(world)).map(|k| gather_frames(world, k)).collect();
            assert_eq!(frames.iter().sum::<usize>(), world - 1, "world {world}");
            assert!(world == 1 || 1 << (frames.len() - 1) < world && world <= 1 << frames.len());
            for (blocks, sent) in results {
                assert_eq!(sent, frames, "world {world}");
                for (r, b) in blocks.iter().enumerate() {
                    assert_eq!(b, &block_bytes(r, block), "world {world} block {block} rank {r}");
                }
            }
        }
    }
}

/// Blocks of different lengths, empty ones included, when every rank knows the lengths (as
/// the varlen allgather learns them first), under orders drawn at random.
#[test]
fn bruck_allgather_moves_unequal_and_empty_blocks() {
    let mut seeds = Dice(0x5eed_0001);
    for world in (1..=64).filter(|w| *w <= 12 || w % 7 == 0 || *w == 64) {
        let length = |r: usize| (r * 37 + world) % 11 * (r % 3); // every third block empty
        let seed = seeds.below(usize::MAX) as u64;
        let mut all: Vec<Vec<Vec<u8>>> = (0..world)
            .map(|r| {
                let mut blocks: Vec<Vec<u8>> = (0..world).map(|b| vec![0; length(b)]).collect();
                blocks[r] = block_bytes(r, length(r));
                blocks
            })
            .collect();
        let mut plans: Vec<_> = all
            .iter_mut()
            .enumerate()
            .map(|(r, blocks)| {
                let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 0 };
                BruckPlan::new(call, 0, &mut blocks[..])
            })
            .collect();
        let mut dyns: Vec<&mut dyn FramePlan> =
            plans.iter_mut().map(|p| p as &mut dyn FramePlan).collect();
        drive(&mut dyns, seed, 1 + world % 3, 3)
            .unwrap_or_else(|e| panic!("world {world} seed {seed}: {e}"));
        drop(plans);
        for (r, got) in all.into_iter().enumerate() {
            for (b, block) in got.iter().enumerate() {
                assert_eq!(block, &block_bytes(b, length(b)), "world {world} rank {r} block {b}");
            }
        }
    }
}

/// The plan's structure for worlds 1..=64 and every rank: the seam's rule, no stream shared out
/// of turn (no two rounds have the same peer), headers that tell every frame apart, and no
/// block written while a frame out reads it.
#[test]
fn bruck_plan_keeps_the_gate_rule_the_stream_rule_and_distinct_headers() {
    for world in 1..=64 {
        let mut blocks = vec![vec![0u8; 2]; world];
        for rank in 0..world {
            let call = Call { rank, world, op: Op::AllgatherBytes, seq: 0 };
            let plan = BruckPlan::new(call, 2, &mut blocks[..]);
            let case = format!("world {world} rank {rank}");
            assert_gates_keep_the_rule(&plan, &case);
            assert_eq!(assert_ways_share_streams_in_turn(&plan, &case), 0, "{case}");
            assert_incoming_headers_differ(&plan, &case);
            if world <= 16 || rank == 0 {
                let touch = |w, i, out| (plan.block_of(w, i, out), 0, 1);
                assert_nothing_overwritten_in_flight(&plan, touch, &case);
            }
        }
    }
}

/// Runs the Bruck allreduce of `inputs(rank, len)` on `world` ranks in lockstep under a seeded
/// order (the plans, then each rank's fold, as [`bruck_allreduce`] does) and asserts every
/// rank's bits are the fold-order oracle's.
fn check_allreduce<T: Element>(
    world: usize,
    len: usize,
    seed: u64,
    name: &str,
    combine: fn(T, T) -> T,
    inputs: fn(usize, usize) -> Vec<T>,
) {
    let all: Vec<Vec<T>> = (0..world).map(|r| inputs(r, len)).collect();
    let expected = bytes_of(&crate::ring::oracle::reference(&all, combine));
    let block = len * size_of::<T>();
    let mut gathered: Vec<Vec<u8>> = (0..world)
        .map(|r| {
            let mut g = vec![0u8; world * block];
            g[r * block..][..block].copy_from_slice(&bytes_of(&all[r]));
            g
        })
        .collect();
    let mut flats: Vec<Flat<'_>> = gathered.iter_mut().map(|g| Flat { buf: g, block }).collect();
    let mut plans: Vec<_> = flats
        .iter_mut()
        .enumerate()
        .map(|(r, flat)| {
            let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
            BruckPlan::new(call, block as u64, flat)
        })
        .collect();
    let mut dyns: Vec<&mut dyn FramePlan> =
        plans.iter_mut().map(|p| p as &mut dyn FramePlan).collect();
    let case = format!("{name} world {world} len {len} seed {seed}");
    drive(&mut dyns, seed, 1 + (seed % 3) as usize, 7).unwrap_or_else(|e| panic!("{case}: {e}"));
    drop(plans);
    drop(flats);
    for (r, g) in gathered.iter().enumerate() {
        let mut buf = all[r].clone();
        fold_gathered(&mut buf, world, g, block, combine);
        assert!(bytes_of(&buf) == expected, "{case}: rank {r}");
    }
}

/// The tiny-buffer allreduce gives the oracle's bits for worlds 1..=64 and lengths 0, 1, below
/// the world and not divisible by it, and for every op at ten of the worlds (NaN, -0.0 and
/// integer wrap in the inputs).
#[test]
fn bruck_allreduce_gives_the_oracle_bits_for_every_op() {
    let mut seeds = Dice(0x5eed_0002);
    for world in 1..=64usize {
        let lengths = [0, 1, world.saturating_sub(1), 2 * world + 3];
        let every = world <= 5 || [8, 16, 17, 33, 64].contains(&world);
        for len in lengths {
            let seed = seeds.below(usize::MAX) as u64;
            if every && len > world {
                every_op!(check_allreduce, world, len, seed);
            } else {
                let (sum, inputs) = (silvic_core::fold::sum_f64, plan_checks::inputs_f64);
                check_allreduce::<f64>(world, len, seed, "sum f64", sum, inputs);
            }
        }
    }
}

/// The call itself over the threaded driver: the Bruck allreduce and the gather path agree bit
/// for bit with the oracle, through one ring, call after call.
#[test]
fn bruck_allreduce_equals_the_gather_path_and_the_oracle() {
    for world in [1, 2, 3, 5, 8, 13] {
        let len = 100 + world;
        let results = on_ring(Driver::new(world), |r, link| {
            let mut scratch = Scratch::default();
            let mut a = plan_checks::inputs_f64(r, len);
            let mut b = a.clone();
            let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
            let sum = silvic_core::fold::sum_f64;
            bruck_allreduce(link, call(0), &mut a, sum, &mut scratch).unwrap();
            crate::ring::gather::gather_allreduce(link, call(1), &mut b, sum, &mut scratch)
                .unwrap();
            (bytes_of(&a), bytes_of(&b))
        });
        let all: Vec<Vec<f64>> = (0..world).map(|r| plan_checks::inputs_f64(r, len)).collect();
        let expected = bytes_of(&crate::ring::oracle::reference(&all, silvic_core::fold::sum_f64));
        for (bruck, gather) in results {
            assert_eq!(bruck, expected, "world {world}");
            assert_eq!(gather, expected, "world {world}");
        }
    }
}

/// The trainer's block allgather by Bruck's rounds: the same buffer as the two-way gather's,
/// unequal and empty blocks included, call after call on one ring.
#[test]
fn bruck_block_allgather_equals_the_two_way_one() {
    for world in [1, 2, 3, 6, 11] {
        let blocks: Vec<usize> = (0..world).map(|r| (r * 5 + 3) % 7).collect();
        let total: usize = blocks.iter().sum();
        let results = on_ring(Driver::new(world).seed(world as u64), |r, link| {
            let start: usize = blocks[..r].iter().sum();
            let mut mine = vec![0u8; total];
            mine[start..start + blocks[r]].copy_from_slice(&block_bytes(r, blocks[r]));
            let mut two_way = mine.clone();
            let call = |seq| Call { rank: r, world, op: Op::AllgatherBlocks, seq };
            crate::ring::records::allgather_blocks_on(
                Path::Bruck,
                link,
                call(0),
                &mut mine,
                &blocks,
            )
            .unwrap();
            crate::ring::allgather_blocks(link, call(1), &mut two_way, &blocks).unwrap();
            (mine, two_way)
        });
        let whole: Vec<u8> = (0..world).flat_map(|r| block_bytes(r, blocks[r])).collect();
        for (bruck, two_way) in results {
            assert_eq!(bruck, whole, "world {world}");
            assert_eq!(two_way, whole, "world {world}");
        }
    }
}
