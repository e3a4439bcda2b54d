use super::*;
use crate::ring::lockstep::drive;
use crate::ring::mem::{Dice, Driver, on_ring};
use crate::ring::oracle::assert_gates_keep_the_rule;
use crate::ring::plan_checks::{
    self, assert_incoming_headers_differ, assert_nothing_overwritten_in_flight,
    assert_ways_share_streams_in_turn, bytes_of, every_op,
};
use silvic_core::{Op, fold};

/// The module doc's claim: round by round, frame by frame, the slots that come home are
/// `1, 2, …, n - 1`, the fold order after the owner's own; and the index is an all-to-all:
/// run symbolically, slot `i` of rank `t` ends holding rank `t + i`'s contribution to segment
/// `t`, and at every move the segment [`IndexPlan::place`] names is the one the data is for.
#[test]
fn slots_come_home_in_fold_order_and_the_index_delivers_every_segment() {
    for world in 1..=1024 {
        let mut home = Vec::new();
        for k in 0..rounds(world) {
            let frames = index_frames(world, k);
            assert_eq!(frames, (0..world).filter(|i| i >> k & 1 == 1).count(), "world {world}");
            for j in 0..frames {
                let i = slot(k, j);
                assert!(i < world && i >> k & 1 == 1 && position(k, i) == j, "world {world}");
                if i >> (k + 1) == 0 {
                    assert_eq!(j, home.len() + 1 - (1 << k), "home frames lead their round");
                    home.push(i);
                }
            }
        }
        assert_eq!(home, (1..world).collect::<Vec<_>>(), "world {world}");
        assert!(cells(world) < 2 * world.max(1), "world {world}");
    }
    for world in 1..=40 {
        let len = 3 * world + 2;
        let mut buf = vec![0.0f64; len];
        let store = Store::new(world, len);
        let (mut transit, mut scratch) = (vec![0; store.bytes()], vec![0; 16]);
        // held[t][i]: (origin, segment) of the data in slot i of rank t.
        let mut held: Vec<Vec<(usize, usize)>> = (0..world)
            .map(|t| (0..world).map(|i| (t, (t + world - i) % world)).collect())
            .collect();
        for k in 0..rounds(world) {
            let before = held.clone();
            for (t, slots) in held.iter_mut().enumerate() {
                let call = Call { rank: t, world, op: Op::AllreduceSumF64, seq: 0 };
                let plan = IndexPlan::new(
                    call,
                    &mut buf,
                    fold::sum_f64,
                    (1, 0),
                    &store,
                    &mut transit,
                    &mut scratch,
                );
                for j in 0..index_frames(world, k) {
                    let i = slot(k, j);
                    let from = (t + (1 << k)) % world;
                    assert_eq!(plan.place(k, j, true).1, before[t][i].1, "world {world} out");
                    assert_eq!(plan.place(k, j, false).1, before[from][i].1, "world {world} in");
                    slots[i] = before[from][i];
                }
            }
        }
        for (t, slots) in held.iter().enumerate() {
            for (i, got) in slots.iter().enumerate() {
                assert_eq!(*got, ((t + i) % world, t), "world {world} rank {t} slot {i}");
            }
        }
    }
}

/// The store stays within its bound, and chunking keeps it there with as few chunks as it
/// takes: at most `max(cap, cells × element)` bytes, for worlds 1..=64, lengths up to 1 MiB and
/// several caps.
#[test]
fn the_store_stays_within_its_bound() {
    for world in 1..=64 {
        for len in [0, 1, world, 7 * world + 5, 131_072, 131_073] {
            for (cap, width) in [(STORE_MAX_BYTES, 8), (4096, 8), (64, 4), (1, 8)] {
                let count = chunks(len, world, width, cap);
                let store = Store::new(world, len.div_ceil(world).div_ceil(count) * width);
                let bound = cap.max(cells(world) * width);
                assert!(store.bytes() <= bound, "world {world} len {len} cap {cap}");
                if count > 1 && cap >= cells(world) * width {
                    // No more chunks than it takes: one fewer would not fit.
                    let fewer = len.div_ceil(world).div_ceil(count - 1) * width;
                    assert!(cells(world) * fewer > cap, "world {world} len {len} cap {cap}");
                }
            }
        }
    }
}

/// The index-fold-gather plans of `inputs`, chunk after chunk, in lockstep under a seeded order;
/// every rank's bits against the oracle's.
fn check_allreduce<T: Element>(
    world: usize,
    len: usize,
    (seed, cap): (u64, usize),
    name: &str,
    combine: fn(T, T) -> T,
    inputs: fn(usize, usize) -> Vec<T>,
) {
    let width = size_of::<T>();
    let mut all: Vec<Vec<T>> = (0..world).map(|r| inputs(r, len)).collect();
    let expected = bytes_of(&crate::ring::oracle::reference(&all, combine));
    let count = chunks(len, world, width, cap);
    let store = Store::new(world, len.div_ceil(world).div_ceil(count) * width);
    let mut transits = vec![vec![0u8; store.bytes()]; world];
    // A fold scratch of two elements and a bit for small buffers: folds cut mid-element.
    let fold_scratch = if len > 10_000 { 1 << 16 } else { 2 * width + 3 };
    let mut folds = vec![vec![0u8; fold_scratch]; world];
    let case = format!("{name} world {world} len {len} seed {seed} chunks {count}");
    for chunk in 0..count {
        let mut plans: Vec<_> = all
            .iter_mut()
            .zip(transits.iter_mut().zip(folds.iter_mut()))
            .enumerate()
            .map(|(r, (buf, (transit, fold)))| {
                let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
                IndexPlan::new(call, buf, combine, (count, chunk), &store, transit, fold)
            })
            .collect();
        let mut dyns: Vec<&mut dyn FramePlan> =
            plans.iter_mut().map(|p| p as &mut dyn FramePlan).collect();
        let capacity = 1 + (seed % 3) as usize;
        drive(&mut dyns, seed + chunk as u64, capacity, 5)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    for (r, got) in all.iter().enumerate() {
        assert!(bytes_of(got) == expected, "{case}: rank {r}");
    }
}

/// Worlds 1..=64, lengths 0, 1, below the world and not divisible by it, one chunk and many
/// (every op at ten of the worlds): the oracle's bits on every rank, in orders drawn at
/// random.
#[test]
fn index_fold_gather_gives_the_oracle_bits_for_every_op() {
    let mut seeds = Dice(0x1de_0001);
    for world in 1..=64usize {
        let every = world <= 5 || [8, 16, 17, 33, 64].contains(&world);
        let lengths = [0, 1, world.saturating_sub(1), 2 * world + 3];
        for (len, cap) in lengths.map(|l| (l, STORE_MAX_BYTES)).into_iter().chain([(world + 1, 16)])
        {
            let seed = seeds.below(usize::MAX) as u64;
            if every && len > world {
                every_op!(check_allreduce, world, len, (seed, cap));
            } else {
                let (sum, inputs) = (fold::sum_f64, plan_checks::inputs_f64);
                check_allreduce::<f64>(world, len, (seed, cap), "sum f64", sum, inputs);
            }
        }
    }
}

/// Larger buffers, up to 1 MiB, one chunk and several, at a few worlds.
#[test]
fn index_fold_gather_gives_the_oracle_bits_up_to_a_mebibyte() {
    for (world, len) in [(3, 131_072), (8, 131_072), (16, 20_000), (64, 3_001)] {
        for cap in [STORE_MAX_BYTES, 100_000] {
            let (sum, inputs) = (fold::sum_f64, plan_checks::inputs_f64);
            check_allreduce::<f64>(world, len, (7, cap), "sum f64", sum, inputs);
        }
    }
}

/// Calls `check` with every rank's last-chunk plan (index and allgather) of each world.
fn each_plan(
    worlds: impl Iterator<Item = usize>,
    mut check: impl FnMut(&IndexPlan<'_, f64, fn(f64, f64) -> f64>, &str),
) {
    for world in worlds {
        let len = 2 * world + 1;
        let mut buf = vec![0.0f64; len];
        let store = Store::new(world, len.div_ceil(world) * 8);
        let (mut transit, mut scratch) = (vec![0; store.bytes()], vec![0; 16]);
        for rank in 0..world {
            let call = Call { rank, world, op: Op::AllreduceSumF64, seq: 0 };
            let sum = fold::sum_f64 as fn(f64, f64) -> f64;
            let plan =
                IndexPlan::new(call, &mut buf, sum, (2, 1), &store, &mut transit, &mut scratch);
            check(&plan, &format!("world {world} rank {rank}"));
        }
    }
}

/// The seam's rule, the stream rule and headers that tell every frame apart, for worlds
/// 1..=64 and every rank. The stream checker finds exactly the pairs the module doc names: the
/// index's round `k` and the allgather's round `k`, in each direction, and no other.
#[test]
fn index_plan_keeps_the_gate_rule_the_stream_rule_and_distinct_headers() {
    each_plan(1..=64, |plan, case| {
        assert_gates_keep_the_rule(plan, case);
        let shared = assert_ways_share_streams_in_turn(plan, case);
        assert_eq!(shared, 2 * rounds(plan.call.world), "{case}");
        assert_incoming_headers_differ(plan, case);
    });
}

/// No frame in writes where a frame out reads (or another frame in writes) unless the gates
/// order them, in every order they allow: worlds 1..=20 and 33, every rank.
#[test]
fn index_plan_never_overwrites_what_a_frame_out_still_reads() {
    each_plan((1..=20).chain([33]), |plan, case| {
        let touch = |w, i, out| match plan.place(w, i, out).0 {
            Place::Buf(a, b) => (0, a, b),
            Place::Store(a, b) => (1, a, b),
        };
        assert_nothing_overwritten_in_flight(plan, touch, case);
    });
}

/// The call itself over the threaded driver, with a fold scratch and frames of every size:
/// one chunk and several, against the oracle and the ring path, call after call on one ring.
#[test]
fn index_allreduce_equals_the_oracle_and_the_ring_path() {
    for world in [1, 2, 3, 4, 5, 7, 8, 12] {
        for len in [0, 5, 8 * world + 3, 3000] {
            let all: Vec<Vec<f64>> = (0..world).map(|r| plan_checks::inputs_f64(r, len)).collect();
            let expected = bytes_of(&crate::ring::oracle::reference(&all, fold::sum_f64));
            let driver = Driver::new(world).seed(len as u64 + 3).capacity(2).piece(100);
            let results = on_ring(driver, |r, link| {
                let mut scratch = Scratch::default();
                let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
                let sum = fold::sum_f64;
                let mut whole = all[r].clone();
                index_allreduce(link, call(0), &mut whole, sum, &mut scratch).unwrap();
                let mut chunked = all[r].clone();
                index_allreduce_capped(link, call(1), &mut chunked, sum, &mut scratch, 256)
                    .unwrap();
                let mut ring = all[r].clone();
                crate::ring::ring_path::ring_allreduce(link, call(2), &mut ring, sum, &mut scratch)
                    .unwrap();
                [bytes_of(&whole), bytes_of(&chunked), bytes_of(&ring)]
            });
            for (r, got) in results.iter().enumerate() {
                for (path, bits) in ["index", "chunked", "ring"].iter().zip(got) {
                    assert!(*bits == expected, "{path} world {world} len {len} rank {r}");
                }
            }
        }
    }
}

/// Every path through the one dispatcher gives the same bits, on one ring, call after call,
/// for every op at a few worlds: the cut may later pick any of them.
#[test]
fn every_path_gives_the_same_bits_through_allreduce_on() {
    fn check<T: Element + Sync>(
        world: usize,
        len: usize,
        name: &str,
        combine: fn(T, T) -> T,
        inputs: fn(usize, usize) -> Vec<T>,
    ) {
        let all: Vec<Vec<T>> = (0..world).map(|r| inputs(r, len)).collect();
        let expected = bytes_of(&crate::ring::oracle::reference(&all, combine));
        let results = on_ring(Driver::new(world).seed(len as u64), |r, link| {
            let mut scratch = Scratch::default();
            let paths = crate::ring::choice::Path::ALL;
            paths.map(|path| {
                let mut buf = all[r].clone();
                let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: path as u64 };
                crate::ring::allreduce_on(path, link, call, &mut buf, combine, &mut scratch)
                    .unwrap();
                (path, bytes_of(&buf))
            })
        });
        for (r, got) in results.iter().enumerate() {
            for (path, bits) in got {
                assert!(*bits == expected, "{name} {path:?} world {world} len {len} rank {r}");
            }
        }
    }
    for world in [2, 3, 6, 9] {
        every_op!(check, world, 4 * world + 1);
    }
}

/// Ranks that pass buffers of different lengths fail at the first frame on both log-depth
/// paths, naming each other, never with garbage.
#[test]
fn mismatched_lengths_are_caught_at_the_first_frame_on_both_paths() {
    for path in [crate::ring::choice::Path::Bruck, crate::ring::choice::Path::Index] {
        let results = on_ring(Driver::new(2).sends_first(), |r, link| {
            let mut buf = vec![1.0; if r == 0 { 1000 } else { 500 }];
            let call = Call { rank: r, world: 2, op: Op::AllreduceSumF64, seq: 0 };
            let sum = fold::sum_f64;
            crate::ring::allreduce_on(path, link, call, &mut buf, sum, &mut Scratch::default())
        });
        use silvic_core::CollectiveError::LengthMismatch;
        let expected = [
            Err(LengthMismatch { peer: 1, expected: 8000, got: 4000 }),
            Err(LengthMismatch { peer: 0, expected: 4000, got: 8000 }),
        ];
        assert_eq!(results, expected, "{path:?}");
    }
}

/// The calls themselves through the threaded driver (one thread a rank) for worlds 1..=20 and
/// 32 (the lockstep tests above cover every world to 64; the threaded driver's stream table is
/// a list, slow with the hundreds of streams of larger worlds): both log-depth paths give the
/// oracle's bits at a length not divisible by the world, the index in chunks from world 16 on
/// (its store capped at 64 bytes).
#[test]
fn both_log_depth_calls_give_the_oracle_bits_on_threads() {
    for world in (1..=20).chain([32]) {
        let len = world + 3;
        let all: Vec<Vec<f64>> = (0..world).map(|r| plan_checks::inputs_f64(r, len)).collect();
        let expected = bytes_of(&crate::ring::oracle::reference(&all, fold::sum_f64));
        let results = on_ring(Driver::new(world).seed(world as u64).capacity(2), |r, link| {
            let mut scratch = Scratch::default();
            let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
            let mut bruck = all[r].clone();
            crate::ring::bruck::bruck_allreduce(
                link,
                call(0),
                &mut bruck,
                fold::sum_f64,
                &mut scratch,
            )
            .unwrap();
            let mut index = all[r].clone();
            let cap = if world >= 16 { 64 } else { STORE_MAX_BYTES };
            index_allreduce_capped(link, call(1), &mut index, fold::sum_f64, &mut scratch, cap)
                .unwrap();
            [bytes_of(&bruck), bytes_of(&index)]
        });
        for (r, got) in results.iter().enumerate() {
            assert!(got[0] == expected, "bruck world {world} rank {r}");
            assert!(got[1] == expected, "index world {world} rank {r}");
        }
    }
}
