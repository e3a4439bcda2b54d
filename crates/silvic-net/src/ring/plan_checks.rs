//! Structural checks of plans of any number of ways, made without running them, and the inputs
//! and fold-order oracle of every op the crate reduces. Test code only.
//!
//! - [`assert_ways_share_streams_in_turn`]: the TCP link carries a way on the stream to the rank
//!   `rank + offset` and reads it from the stream from `rank - offset`, so two ways whose peers
//!   coincide (modulo the world, whatever their offsets) share a stream; the later one's first
//!   frame must wait until the earlier one is all through in that direction.
//! - [`assert_incoming_headers_differ`]: no two frames a rank takes from one peer expect the same
//!   header, so one that comes in the wrong place (another round, phase or chunk) is refused.
//! - [`assert_nothing_overwritten_in_flight`]: a frame coming in never writes where a frame going
//!   out reads unless the gates order the two, in every order they allow.

use silvic_core::fold;

use super::element::{Element, as_bytes};
use super::seam::{FramePlan, Moved};

/// Asserts the stream-sharing rule on `plan` (see the module doc); returns how many pairs of
/// ways share a peer (per direction), for the callers' own counts.
pub(crate) fn assert_ways_share_streams_in_turn(plan: &dyn FramePlan, case: &str) -> usize {
    let call = plan.call();
    let ways = plan.ways();
    let frames: Vec<usize> = (0..ways.len()).map(|w| plan.frames(w)).collect();
    let mut shared = 0;
    for later in 0..ways.len() {
        for earlier in 0..later {
            if frames[earlier] == 0 || frames[later] == 0 {
                continue;
            }
            for out in [true, false] {
                let peer = |w: usize| match out {
                    true => ways[w].sends_to(call.rank, call.world),
                    false => ways[w].receives_from(call.rank, call.world),
                };
                if peer(earlier) != peer(later) {
                    continue;
                }
                shared += 1;
                // Everything else as far on as it goes, the earlier way one frame short.
                let (mut sent, mut received) = (frames.clone(), frames.clone());
                let counts = if out { &mut sent } else { &mut received };
                counts[earlier] -= 1;
                counts[later] = 0;
                let progress = Moved { sent: &sent, received: &received };
                let opens = match out {
                    true => plan.ready(later, progress),
                    false => plan.may_receive(later, progress),
                };
                let what = if out { "writes to" } else { "reads from" };
                assert!(
                    !opens,
                    "{case}: way {later} {what} rank {} before way {earlier} is through",
                    peer(later)
                );
            }
        }
    }
    shared
}

/// Asserts that no two incoming frames from one peer expect the same header.
pub(crate) fn assert_incoming_headers_differ(plan: &dyn FramePlan, case: &str) {
    let call = plan.call();
    let mut seen = Vec::new();
    for (w, route) in plan.ways().iter().enumerate() {
        let peer = route.receives_from(call.rank, call.world);
        for j in 0..plan.frames(w) {
            seen.push((peer, plan.expect(w, j), (w, j)));
        }
    }
    for (a, (peer, head, at)) in seen.iter().enumerate() {
        for (other_peer, other, other_at) in &seen[a + 1..] {
            assert!(
                peer != other_peer || head != other,
                "{case}: frames {at:?} and {other_at:?} from rank {peer} expect one header"
            );
        }
    }
}

/// Where a frame reads (out) or writes (in): an area and a range in it.
pub(crate) type Region = (usize, usize, usize);

/// Asserts that every frame in whose region (`touch(way, frame, out)`) overlaps a frame out's,
/// or another frame in's, is ordered with it by the gates, whatever order a link moves them in.
/// Gates are taken to be monotone (more progress never closes one), as every plan's are.
#[allow(clippy::needless_range_loop)] // events index several tables at once
pub(crate) fn assert_nothing_overwritten_in_flight(
    plan: &dyn FramePlan,
    touch: impl Fn(usize, usize, bool) -> Region,
    case: &str,
) {
    let ways = plan.ways().len();
    let chains = 2 * ways; // chain c < ways: out on way c; else in on way c - ways
    let len = |c: usize| plan.frames(c % ways);
    let full: Vec<usize> = (0..chains).map(len).collect();
    let opens = |c: usize, i: usize, o: usize, k: usize| {
        let mut at = full.clone();
        at[c] = i;
        at[o] = k;
        let progress = Moved { sent: &at[..ways], received: &at[ways..] };
        if c < ways { plan.ready(c, progress) } else { plan.may_receive(c - ways, progress) }
    };
    // clock[c][i][o]: the events of chain o that come before event i of chain c in every order.
    let mut clock: Vec<Vec<Vec<usize>>> =
        (0..chains)
            .map(|c| {
                (0..len(c))
                    .map(|i| {
                        (0..chains)
                            .map(|o| match o == c {
                                true => i,
                                false => (0..=full[o]).find(|&k| opens(c, i, o, k)).unwrap_or_else(
                                    || panic!("{case}: chain {c} event {i} never opens"),
                                ),
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
    loop {
        let mut changed = false;
        for c in 0..chains {
            for i in 0..len(c) {
                let mut need = clock[c][i].clone();
                for o in 0..chains {
                    if clock[c][i][o] > 0 {
                        for (x, prior) in clock[o][clock[c][i][o] - 1].iter().enumerate() {
                            need[x] = need[x].max(*prior);
                        }
                    }
                }
                if need != clock[c][i] {
                    clock[c][i] = need;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    for c in 0..chains {
        for i in 0..len(c) {
            assert!(clock[c][i][c] <= i, "{case}: chain {c} event {i} waits on itself");
        }
    }
    let region = |c: usize, i: usize| touch(c % ways, i, c < ways);
    let overlap =
        |a: Region, b: Region| a.0 == b.0 && a.1 < a.2 && b.1 < b.2 && a.1 < b.2 && b.1 < a.2;
    for d in ways..chains {
        for j in 0..len(d) {
            for e in 0..chains {
                for i in 0..len(e) {
                    if (e, i) == (d, j) || !overlap(region(d, j), region(e, i)) {
                        continue;
                    }
                    let ordered = clock[d][j][e] > i || clock[e][i][d] > j;
                    assert!(
                        ordered,
                        "{case}: frame {j} in on way {} may overwrite what frame {i} {} way {} \
                         touches",
                        d - ways,
                        if e < ways { "out on" } else { "in on" },
                        e % ways
                    );
                }
            }
        }
    }
}

/// The bytes of `values`, every bit (NaN payloads and the sign of zero included).
pub(crate) fn bytes_of<T: Element>(values: &[T]) -> Vec<u8> {
    as_bytes(values).to_vec()
}

/// f64 inputs whose sums show a wrong order, with -0.0, NaN and infinities sprinkled in.
pub(crate) fn inputs_f64(rank: usize, len: usize) -> Vec<f64> {
    let mut v = super::oracle::input(rank, len);
    for (i, x) in v.iter_mut().enumerate() {
        match (i % 23, rank % 4) {
            (3, _) => *x = if rank % 2 == 0 { 0.0 } else { -0.0 },
            (7, 0) => *x = -0.0,
            (11, 1) => *x = f64::from_bits(0x7ff8_0000_0000_0000 | (rank as u64 + 1)),
            (13, 2) => *x = f64::INFINITY,
            (13, 3) => *x = f64::NEG_INFINITY,
            _ => {}
        }
    }
    v
}

pub(crate) fn inputs_f32(rank: usize, len: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..len)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.1 + 1e8 * (rank % 2) as f32)
        .collect();
    for (i, x) in v.iter_mut().enumerate() {
        match (i % 19, rank % 3) {
            (2, _) => *x = -0.0,
            (5, 1) => *x = f32::NAN,
            _ => {}
        }
    }
    v
}

/// Integers that wrap when summed.
pub(crate) fn inputs_i64(rank: usize, len: usize) -> Vec<i64> {
    (0..len as i64).map(|i| (i * 7 + rank as i64 * 13).wrapping_mul(i64::MAX / 5)).collect()
}

pub(crate) fn inputs_i32(rank: usize, len: usize) -> Vec<i32> {
    (0..len as i32)
        .map(|i| i.wrapping_mul(7).wrapping_add(rank as i32 * 13).wrapping_mul(i32::MAX / 5))
        .collect()
}

pub(crate) fn inputs_u64(rank: usize, len: usize) -> Vec<u64> {
    (0..len as u64)
        .map(|i| u64::MAX - (i * 31 + rank as u64 * 17).wrapping_mul(u64::MAX / 97))
        .collect()
}

/// Calls `$check::<T>($($arg,)* name, combine, inputs)` for every (element type, reduction) the
/// crate has.
macro_rules! every_op {
    ($check:ident $(, $arg:expr)*) => {{
        use $crate::ring::plan_checks::*;
        use silvic_core::fold;
        $check::<f64>($($arg,)* "sum f64", fold::sum_f64, inputs_f64);
        $check::<f64>($($arg,)* "min f64", fold::min_f64, inputs_f64);
        $check::<f64>($($arg,)* "max f64", fold::max_f64, inputs_f64);
        $check::<f32>($($arg,)* "sum f32", fold::sum_f32, inputs_f32);
        $check::<f32>($($arg,)* "min f32", fold::min_f32, inputs_f32);
        $check::<f32>($($arg,)* "max f32", fold::max_f32, inputs_f32);
        $check::<i64>($($arg,)* "sum i64", fold::sum_i64, inputs_i64);
        $check::<i64>($($arg,)* "min i64", fold::min_int, inputs_i64);
        $check::<i64>($($arg,)* "max i64", fold::max_int, inputs_i64);
        $check::<i32>($($arg,)* "sum i32", fold::sum_i32, inputs_i32);
        $check::<i32>($($arg,)* "min i32", fold::min_int, inputs_i32);
        $check::<i32>($($arg,)* "max i32", fold::max_int, inputs_i32);
        $check::<u64>($($arg,)* "sum u64", fold::sum_u64, inputs_u64);
        $check::<u64>($($arg,)* "min u64", fold::min_int, inputs_u64);
        $check::<u64>($($arg,)* "max u64", fold::max_int, inputs_u64);
    }};
}
pub(crate) use every_op;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Dir, Header};
    use crate::ring::lockstep::drive;
    use crate::ring::seam::{Call, Route};
    use silvic_core::Op;

    /// Two ways on one route, one frame each: way 1 waits for way 0 to be through, or not.
    struct Shared {
        call: Call,
        routes: [Route; 2],
        in_turn: bool,
    }

    impl FramePlan for Shared {
        fn call(&self) -> Call {
            self.call
        }
        fn ways(&self) -> &[Route] {
            &self.routes
        }
        fn frames(&self, _: usize) -> usize {
            1
        }
        fn header(&self, way: usize, _: usize) -> Header {
            Header::data(Op::AllgatherBytes, 0, 0, 0).carrying(Dir::Right, way)
        }
        fn expect(&self, way: usize, j: usize) -> Header {
            self.header(way, j)
        }
        fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
            !self.in_turn || way == 0 || progress.sent[0] == 1
        }
        fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool {
            !self.in_turn || way == 0 || progress.received[0] == 1
        }
        fn payload(&self, _: usize, _: usize) -> &[u8] {
            &[]
        }
        fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
            &mut []
        }
        fn commit(&mut self, _: usize, _: usize, _: usize) {}
    }

    fn shared(rank: usize, in_turn: bool) -> Shared {
        // World 3: offset -2 writes to the rank +1 writes to.
        let call = Call { rank, world: 3, op: Op::AllgatherBytes, seq: 0 };
        Shared { call, routes: [Route { offset: 1 }, Route { offset: -2 }], in_turn }
    }

    /// The stream checker finds two ways that use one peer out of turn, and the lockstep driver,
    /// whose streams are named by the ranks they join, shows what that does: in some order a
    /// frame of the later way comes in where the earlier way's is expected and is refused. In
    /// turn, both pass.
    #[test]
    fn ways_that_share_a_peer_out_of_turn_are_caught() {
        let loose = std::panic::catch_unwind(|| {
            assert_ways_share_streams_in_turn(&shared(0, false), "loose")
        });
        assert!(loose.is_err(), "the checker lets a shared stream be used out of turn");
        assert_eq!(assert_ways_share_streams_in_turn(&shared(0, true), "in turn"), 2);
        let run = |in_turn: bool, seed: u64| {
            let mut plans: Vec<Shared> = (0..3).map(|r| shared(r, in_turn)).collect();
            let mut dyns: Vec<&mut dyn FramePlan> =
                plans.iter_mut().map(|p| p as &mut dyn FramePlan).collect();
            drive(&mut dyns, seed, 2, 1)
        };
        assert!((0..64).any(|seed| run(false, seed).is_err()), "no order showed the clash");
        for seed in 0..64 {
            assert_eq!(run(true, seed), Ok(()), "seed {seed}");
        }
    }

    /// The overwrite checker finds a frame in that may land where a later frame out still reads
    /// (the same way, no gate between them), and passes once the receive waits for that send.
    #[test]
    fn a_frame_in_that_may_overwrite_a_frame_out_is_caught() {
        struct Overwrites(bool);
        impl FramePlan for Overwrites {
            fn call(&self) -> Call {
                Call { rank: 0, world: 2, op: Op::AllgatherBytes, seq: 0 }
            }
            fn ways(&self) -> &[Route] {
                &[Route::LEFTWARD]
            }
            fn frames(&self, _: usize) -> usize {
                2
            }
            fn header(&self, _: usize, _: usize) -> Header {
                Header::data(Op::AllgatherBytes, 0, 0, 0)
            }
            fn expect(&self, w: usize, j: usize) -> Header {
                self.header(w, j)
            }
            fn ready(&self, _: usize, _: Moved<'_>) -> bool {
                true
            }
            fn may_receive(&self, w: usize, progress: Moved<'_>) -> bool {
                // Gated: frame 1 in waits for frame 0 out, which reads where it lands.
                !self.0 || progress.received[w] == 0 || progress.sent[w] >= 1
            }
            fn payload(&self, _: usize, _: usize) -> &[u8] {
                &[]
            }
            fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
                &mut []
            }
            fn commit(&mut self, _: usize, _: usize, _: usize) {}
        }
        // Frame i out reads cell i; frame 0 in writes cell 2, frame 1 in cell 0.
        let touch = |_: usize, i: usize, out: bool| match (out, i) {
            (true, _) => (0, i, i + 1),
            (false, 0) => (0, 2, 3),
            (false, _) => (0, 0, 1),
        };
        let loose = std::panic::catch_unwind(|| {
            assert_nothing_overwritten_in_flight(&Overwrites(false), touch, "loose")
        });
        assert!(loose.is_err(), "the checker lets a frame in overwrite a frame out");
        assert_nothing_overwritten_in_flight(&Overwrites(true), touch, "gated");
    }

    #[test]
    fn the_inputs_wrap_and_carry_nan_and_negative_zero() {
        use crate::ring::oracle::reference;
        // The inputs do what they are for: sums wrap, NaN and -0.0 come out.
        let wrapped = reference(&[inputs_i64(0, 9), inputs_i64(1, 9)], fold::sum_i64);
        assert!(wrapped.iter().any(|x| *x < 0));
        let zeros = reference(&[inputs_f64(0, 30), inputs_f64(1, 30)], fold::min_f64);
        assert!(zeros.iter().any(|x| x.to_bits() == (-0.0f64).to_bits()));
        let sums = reference(&[inputs_f64(0, 30), inputs_f64(1, 30)], fold::sum_f64);
        assert!(sums.iter().any(|x| x.is_nan()));
    }
}
