//! The bitwise oracle for calls split over channels: every rank's channels run the ring plan
//! over their pieces, each over its own in-memory ring in an order drawn from a seed, and every
//! rank must end with the fold-order oracle's bits for every channel count. A rank takes its
//! channels one after the other here (every rank in the same order, so no ring waits on
//! another): the bits depend on each channel's plan alone, and `tests/channels.rs` runs the
//! channels at once, on their threads, over TCP.

use silvic_core::{CollectiveError, Op, fold};

use crate::ring::element::Element;
use crate::ring::mem::{Driver, MemLink, mem_ring};
use crate::ring::oracle::{input, reference};
use crate::ring::ring_path::ring_allreduce_of;
use crate::ring::seam::Call;
use crate::ring::shared::Scratch;
use crate::ring::{layout, schedule};

/// Every rank of `world` over `channels` in-memory rings (channel `c`'s drawn from `seed + c`,
/// its streams holding `capacity` frames), each rank's result of `f` with its links, one per
/// channel.
fn on_channels<R: Send>(
    (world, channels): (usize, usize),
    (seed, capacity): (u64, usize),
    f: impl Fn(usize, Vec<MemLink>) -> R + Sync,
) -> Vec<R> {
    let mut rings: Vec<std::vec::IntoIter<MemLink>> = (0..channels)
        .map(|c| {
            let driver = Driver::new(world).seed(seed + c as u64).capacity(capacity).piece(997);
            mem_ring(driver).into_iter()
        })
        .collect();
    let per_rank: Vec<Vec<MemLink>> =
        (0..world).map(|_| rings.iter_mut().map(|r| r.next().unwrap()).collect()).collect();
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = per_rank
            .into_iter()
            .enumerate()
            .map(|(r, links)| s.spawn(move || f(r, links)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One allreduce of `buf` split over `links` (one channel each), channel after channel, each
/// link dropped once its channel is done (the driver waits on a rank between calls, so a link
/// kept would hold its ring's last moves until the rank came back to it).
fn split_allreduce<T: Element, C: Fn(T, T) -> T + Copy + Send + Sync>(
    links: Vec<MemLink>,
    call: Call,
    buf: &mut [T],
    combine: C,
) -> Result<(), CollectiveError> {
    let total = size_of_val(buf) as u64;
    let pieces = layout::channel_pieces(buf, call.world, links.len());
    let scratch = &mut Scratch::default();
    for (mut link, pieces) in links.into_iter().zip(pieces) {
        let segments = layout::Segments::Pieces(pieces);
        ring_allreduce_of(&mut link, call, (segments, total), combine, scratch)?;
    }
    Ok(())
}

/// Runs the split allreduce of `inputs` (one per rank) with `combine` over `channels` and
/// asserts every rank's bits are the oracle's.
fn check<T: Element + std::fmt::Debug + PartialEq, C: Fn(T, T) -> T + Copy + Send + Sync>(
    inputs: &[Vec<T>],
    channels: usize,
    (combine, oracle): (C, fn(T, T) -> T),
    (seed, capacity): (u64, usize),
    case: &str,
) {
    let world = inputs.len();
    let bytes = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
    let expected = bytes(&reference(inputs, oracle));
    let results = on_channels((world, channels), (seed, capacity), |r, links| {
        let mut buf = inputs[r].clone();
        let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
        split_allreduce(links, call, &mut buf, combine).map(|()| bytes(&buf))
    });
    for (r, got) in results.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("{case}: rank {r}: {e}"));
        assert!(got == expected, "{case} rank {r}: bits differ from the oracle");
    }
}

/// The lengths a split call is checked at in a world of `world` over `channels`: none, fewer
/// than the channels, one either side of the channels and of the world's multiple of them, and
/// lengths divisible by neither.
fn lengths(world: usize, channels: usize) -> Vec<usize> {
    let mut out = vec![0, 1, channels.saturating_sub(1), channels + 1, 3 * world * channels + 1];
    out.extend([world * channels - 1, 517]);
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn split_calls_give_the_oracle_bits_for_every_channel_count_f64_sum_and_max() {
    let mut seed = 0x51ee_d000;
    for world in 1..=9 {
        for channels in [1, 2, 3, 4, 8] {
            for len in lengths(world, channels) {
                seed += 17;
                let mut inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let case = format!("world {world} channels {channels} len {len}");
                let capacity = 1 + (seed % 3) as usize;
                check(&inputs, channels, (fold::sum_f64, fold::sum_f64), (seed, capacity), &case);
                if len > 2 && len % 2 == 1 {
                    inputs[world - 1][len / 2] = f64::NAN;
                    inputs[0][len - 1] = -0.0;
                    let dice = (seed, capacity);
                    check(&inputs, channels, (fold::max_f64, fold::max_f64), dice, &case);
                }
            }
        }
    }
}

#[test]
fn split_calls_give_the_oracle_bits_for_every_channel_count_integers_i128_and_f32() {
    let mut seed = 0x1e7_5eed;
    for world in 1..=9 {
        for channels in [1usize, 2, 3, 4, 8] {
            for len in [channels.saturating_sub(1), world * channels + 3, 517] {
                seed += 29;
                let case = format!("world {world} channels {channels} len {len}");
                let dice = (seed, 1 + (seed % 2) as usize);
                let wraps: Vec<Vec<i64>> = (0..world)
                    .map(|r| (0..len).map(|i| i64::MAX - (i * 3 + r) as i64).collect())
                    .collect();
                check(&wraps, channels, (fold::sum_i64, fold::sum_i64), dice, &case);
                let floats: Vec<Vec<f32>> = (0..world)
                    .map(|r| input(r, len).iter().map(|&x| x as f32 * 1e-3).collect())
                    .collect();
                check(&floats, channels, (fold::sum_f32, fold::sum_f32), dice, &case);
                let ints: Vec<Vec<i32>> = (0..world)
                    .map(|r| (0..len).map(|i| ((i * 7 + r * 11) % 23) as i32 - 11).collect())
                    .collect();
                check(&ints, channels, (fold::min_int, fold::min_int), dice, &case);
                let words: Vec<Vec<u64>> = (0..world)
                    .map(|r| (0..len).map(|i| u64::MAX - (i + r) as u64).collect())
                    .collect();
                check(&words, channels, (fold::sum_u64, fold::sum_u64), dice, &case);
                let wide: Vec<Vec<i128>> = (0..world)
                    .map(|r| (0..len).map(|i| i128::MAX - (((i * 5 + r) as i128) << 64)).collect())
                    .collect();
                check(&wide, channels, (fold::sum_i128, fold::sum_i128), dice, &case);
            }
        }
    }
}

/// Pieces of several slices each: a channel cuts its pieces into slices as a whole ring cuts
/// its segments, and the bits stay the oracle's.
#[test]
fn split_calls_of_sliced_pieces_give_the_oracle_bits() {
    let per_slice = schedule::SLICE_BYTES / 8;
    for (world, channels) in [(2, 2), (3, 4), (4, 3)] {
        let len = world * channels * (per_slice + 1) + 5;
        let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
        let case = format!("world {world} channels {channels} len {len}");
        check(&inputs, channels, (fold::sum_f64, fold::sum_f64), (7, 2), &case);
    }
}
