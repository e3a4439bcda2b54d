//! The simulator's calls: times exact where the model makes them so, the same on every run,
//! the probes' measures, the path taken, and the arguments refused.

use super::*;
use crate::ring::seam;

pub(super) fn network(
    hop_us: u64,
    link_gbit: f64,
    overhead_us: u64,
    fold_gbyte: f64,
) -> NetworkModel {
    NetworkModel {
        hop: Duration::from_micros(hop_us),
        link_gbit,
        frame_overhead: Duration::from_micros(overhead_us),
        fold_gbyte,
        copy_gbyte: f64::INFINITY,
        cores: None,
        network_copies: 0,
    }
}

/// The paths that may be forced on `collective`.
pub(super) fn forced(collective: CallKind) -> Vec<AllreducePath> {
    let forced = AllreducePath::ALL.into_iter().filter(|&p| p != AllreducePath::Auto);
    forced.filter(|&p| collective.takes(p)).collect()
}

/// 8 Gbit/s is a byte a nanosecond, 1 GB/s folds a byte a nanosecond: times in whole ns.
const EXACT: f64 = 8.0;

#[test]
fn world_two_is_one_frame_each_way_overhead_bytes_and_a_hop() {
    let net = network(7, EXACT, 3, 1.0);
    // An allgather: one frame each way, nothing folded.
    let got = simulate(&net, CallKind::Allgather, 2, 1000, AllreducePath::Auto).unwrap();
    assert_eq!(
        got,
        Simulated {
            time: Duration::from_nanos(3000 + 1000 + 7000),
            path: AllreducePath::Gather,
            frames: 2
        }
    );
    // An allreduce at world 2 takes the gather, then folds the other rank's 1000 bytes.
    let got = simulate(&net, CallKind::Allreduce, 2, 1008, AllreducePath::Auto).unwrap();
    assert_eq!(got.time, Duration::from_nanos(3000 + 1008 + 7000 + 1008));
    assert_eq!(got.path, AllreducePath::Gather);
    // Forced onto the ring: the reduce-scatter's frame (a 504-byte segment, folded at 1 GB/s),
    // then the reduced segment's frame, which waits for the fold.
    let got = simulate(&net, CallKind::Allreduce, 2, 1008, AllreducePath::Ring).unwrap();
    let step = 3000 + 504 + 7000;
    assert_eq!((got.time, got.frames), (Duration::from_nanos(step + 504 + step), 4));
}

#[test]
fn the_same_call_gives_the_same_time_on_every_run() {
    let net = network(100, 3.2, 20, 4.0);
    for (world, bytes) in [(5, 40_000), (16, 16 << 20), (37, 1 << 20)] {
        let first = simulate(&net, CallKind::Allreduce, world, bytes, AllreducePath::Auto).unwrap();
        for _ in 0..3 {
            let again =
                simulate(&net, CallKind::Allreduce, world, bytes, AllreducePath::Auto).unwrap();
            assert_eq!(again, first, "world {world} bytes {bytes}");
        }
    }
}

/// The ring measures its hop when it forms, by the probe's small allreduce (the probes' own
/// sequence, `probe::measure`, on the virtual link): on the model, a world of 2 sends one
/// 8-byte frame each way. (The gather's local fold after its frames is the link's caller's,
/// which the probes' calls on the virtual link do not charge: 8 bytes here.)
#[test]
fn the_simulated_ring_measures_the_hop_a_probe_would() {
    let model = network(7, EXACT, 3, 1.0).model().unwrap();
    let link = VirtualLink::formed(model, 2).unwrap();
    assert_eq!(link.measured.hop_ns, 3000 + 8 + 7000);
    // A world of 5 takes 2 hops each way. The first leftward frame waits on the link out for
    // the first rightward one; from then on the leftward way is the later: its frame in
    // (3008 + 3008 + 7000) sends its next at once (3008 + 7000).
    let link = VirtualLink::formed(model, 5).unwrap();
    let call = 3 * 3008 + 2 * 7000;
    assert_eq!(link.measured.hop_ns, call / 2);
}

/// The simulated ring also times the fold probe and the shifts and derives the rates a real
/// ring would: on a link of 1 Gbit/s, copies free, a stream carries 125 B/us, whatever the hop
/// and the fold rate (a shift folds nothing). Half the link, half the rate. At 100 Gbit/s
/// behind 1 ms hops, where the first shift's bytes take a sliver of its hop, the long shift
/// sized from the first estimate finds the rate to within a fifth (12,500 B/us). The fold
/// rate is the model's, in B/us.
#[test]
fn the_simulated_ring_measures_the_rate_a_probe_would() {
    let measured = |hop_us, gbit, world, fold_gbyte| {
        let model = network(hop_us, gbit, 0, fold_gbyte).model().unwrap();
        VirtualLink::formed(model, world).unwrap().measured
    };
    let rate = |hop_us, gbit, world| measured(hop_us, gbit, world, 1000.0).bytes_per_us;
    for world in [2, 4, 7, 16] {
        for hop_us in [5, 50, 200] {
            let (gbit, half) = (rate(hop_us, 1.0, world), rate(hop_us, 0.5, world));
            assert_eq!(gbit, 125, "world {world} hop {hop_us} us");
            assert_eq!(half, 62, "world {world} hop {hop_us} us");
        }
        // Folds as slow as the link: the fold rate says so, the stream's rate does not move.
        let slow_folds = measured(200, 1.0, world, 0.125);
        assert_eq!((slow_folds.folds_per_us, slow_folds.bytes_per_us), (125, 125));
        // 100 Gbit/s behind 1 ms hops: even the longest shift (8 MiB) is below one hop's bytes
        // (12.5 MB), and the hop, taking at most half a shift's time, leaves the rate low but
        // within a fifth of the link's.
        let fast = rate(1000, 100.0, world);
        assert!((10_000..=12_500).contains(&fast), "world {world}: {fast} B/us");
    }
    let folds = |gbyte| measured(200, 1.0, 4, gbyte).folds_per_us;
    assert_eq!((folds(2.0), folds(8.0)), (2000, 8000));
}

/// For one plan (the hop the ring measured, so its window, held fixed: one slice, three),
/// more latency or overhead never makes a call faster, and no call beats its bytes over the
/// link. Across windows it can: a slower probe widens the ring plan's window, which may be
/// faster on the model.
#[test]
fn more_latency_or_overhead_is_never_faster_and_bytes_bound_the_time() {
    for world in [2, 3, 4, 7, 16] {
        for bytes in [8, 4096, 32 << 10, 1 << 20] {
            for collective in [CallKind::Allreduce, CallKind::Allgather] {
                for (path, hop_ns) in
                    forced(collective).into_iter().flat_map(|p| [(p, 0), (p, 400_000)])
                {
                    let time = |hop, overhead| {
                        let model = network(hop, 10.0, overhead, 5.0).model().unwrap();
                        let link = VirtualLink::new(
                            model,
                            seam::Network { hop_ns, ..seam::Network::UNMEASURED },
                        );
                        simulate_on(link, collective, world, bytes, path).unwrap().time
                    };
                    let case = format!(
                        "{collective:?} {path:?} world {world} bytes {bytes} measured hop {hop_ns} ns"
                    );
                    let mut last = Duration::ZERO;
                    for hop in [0, 10, 100, 5000] {
                        let t = time(hop, 5);
                        assert!(t >= last, "{case}: hop {hop} us took {t:?}, less is {last:?}");
                        last = t;
                    }
                    assert!(time(100, 50) >= time(100, 5), "{case}");
                    // No rank can send its share of the bytes faster than its link: the ring
                    // sends 2(n - 1)/n of the buffer, the gather (n - 1) buffers or blocks.
                    let share = match path {
                        AllreducePath::Ring | AllreducePath::Index => {
                            2 * (world - 1) * bytes / world
                        }
                        _ => (world - 1) * bytes,
                    };
                    // Less a byte per frame: segments differ by an element.
                    let share: usize = share.saturating_sub(8 * 2 * world);
                    let floor = Duration::from_secs_f64(share as f64 * 8.0 / 10e9);
                    assert!(time(0, 0) >= floor, "{case}");
                }
            }
        }
    }
}

#[test]
fn a_world_of_1024_runs_every_frame() {
    let net = network(100, 10.0, 5, 5.0);
    let ring = SimulatedRing::form(&net, 1024).unwrap();
    let got = ring.call(CallKind::Allreduce, 16 << 20, AllreducePath::Auto).unwrap();
    // Segments of 16 KiB are one slice: n - 1 + floor(n/2) frames rightward, floor((n-1)/2)
    // leftward, on each of 1024 ranks.
    assert_eq!((got.path, got.frames), (AllreducePath::Ring, 1024 * (1023 + 512 + 511)));
    // At least its hops: n - 1 + floor(n/2) of them, one after another.
    assert!(got.time >= Duration::from_micros(100 * (1023 + 512)), "{got:?}");
    let gathered = ring.call(CallKind::Allgather, 16 << 10, AllreducePath::Auto).unwrap();
    assert_eq!(gathered.frames, 1024 * (512 + 511));
}

/// A formed ring refuses what `simulate` refuses: a world out of range, a bad network, and a
/// call it cannot run.
#[test]
fn a_ring_is_formed_only_on_a_world_and_network_in_range() {
    let net = network(5, 10.0, 1, 5.0);
    for world in [0, MAX_WORLD + 1] {
        assert_eq!(SimulatedRing::form(&net, world).unwrap_err(), SimulateError::World(world));
    }
    let bad = NetworkModel { link_gbit: 0.0, ..net };
    assert!(matches!(SimulatedRing::form(&bad, 4), Err(SimulateError::Network(_))));
    let ring = SimulatedRing::form(&net, 4).unwrap();
    assert_eq!(
        ring.call(CallKind::Allreduce, 12, AllreducePath::Auto),
        Err(SimulateError::Length(12))
    );
    // A ring formed for one call gives the same call as one formed for many.
    let one = simulate(&net, CallKind::Allreduce, 4, 64 << 10, AllreducePath::Auto);
    assert_eq!(ring.call(CallKind::Allreduce, 64 << 10, AllreducePath::Auto), one);
}

/// Where the simulated probe's hop is short (1 and 5 us), auto takes the short-hop cut, at the
/// measured hop where it is shorter than loopback's (always on the 1 us links); where it
/// is long (100 us), the cost model's path at the hop and the rate the ring measured: among the
/// gather and the ring without chords, every path with them.
#[test]
fn a_forced_path_is_taken_and_auto_takes_the_cost_models() {
    for (hop_us, frame_us) in [(1, 1), (5, 5), (100, 5)] {
        let net = network(hop_us, 10.0, frame_us, 5.0);
        for world in [3, 4, 8, 16] {
            let measured = VirtualLink::formed(net.model().unwrap(), world).unwrap().measured;
            assert_eq!(measured.long_hops(), hop_us == 100, "world {world}: {measured:?}");
            let below = crate::ring::choice::short_hop_ns(measured) < crate::ring::choice::HOP_NS;
            assert!(below || hop_us != 1, "world {world}: {measured:?}");
            let rated = measured.bytes_per_us != seam::Network::UNMEASURED_RATE;
            assert!(rated, "world {world}: {measured:?}");
            for bytes in [
                4096,
                crate::ring::choice::gather_limit(world),
                crate::ring::choice::gather_limit(world) + 8,
            ] {
                let bytes = bytes / 8 * 8;
                let run = |path| simulate(&net, CallKind::Allreduce, world, bytes, path).unwrap();
                let (auto, gather, ring) = (
                    run(AllreducePath::Auto),
                    run(AllreducePath::Gather),
                    run(AllreducePath::Ring),
                );
                assert_eq!((gather.path, ring.path), (AllreducePath::Gather, AllreducePath::Ring));
                let case = format!("hop {hop_us} us world {world} bytes {bytes}");
                if measured.long_hops() {
                    let cut =
                        taken(CallKind::Allreduce, world, bytes, AllreducePath::Auto, measured);
                    assert_eq!(auto, run(cut), "{case}");
                    if !measured.chords {
                        assert!(
                            matches!(cut, AllreducePath::Gather | AllreducePath::Ring),
                            "{case}: {cut:?}"
                        );
                    }
                } else {
                    // The short-hop cut, at the simulated hop where it is shorter than loopback's.
                    use crate::ring::choice::{short_hop_ns, uses_gather_at};
                    let hop_ns = short_hop_ns(measured);
                    let expected = if uses_gather_at(bytes, world, hop_ns) { gather } else { ring };
                    assert_eq!(auto, expected, "{case}");
                }
                let n = world as u64;
                assert_eq!(gather.frames, n * (n - 1), "world {world}: one frame per block");
            }
        }
    }
}

#[test]
fn bad_arguments_are_refused_naming_what_is_wrong() {
    let net = network(100, 10.0, 5, 5.0);
    let err =
        |n: &NetworkModel, c, world, bytes, path| simulate(n, c, world, bytes, path).unwrap_err();
    let e = err(&net, CallKind::Allgather, 4, 64, AllreducePath::Ring);
    assert_eq!(
        e,
        SimulateError::NoSuchPath { collective: CallKind::Allgather, path: AllreducePath::Ring }
    );
    assert_eq!(e.to_string(), "the allgather has no ring path (it has: auto, gather)");
    assert_eq!(err(&net, CallKind::Allreduce, 0, 64, AllreducePath::Auto), SimulateError::World(0));
    assert_eq!(
        err(&net, CallKind::Allreduce, MAX_WORLD + 1, 8, AllreducePath::Auto),
        SimulateError::World(MAX_WORLD + 1)
    );
    assert_eq!(
        err(&net, CallKind::Allreduce, 4, 12, AllreducePath::Auto),
        SimulateError::Length(12)
    );
    let e = err(&net, CallKind::Allreduce, 1024, 16 << 20, AllreducePath::Gather);
    assert_eq!(
        e,
        SimulateError::TooLarge { path: AllreducePath::Gather, bytes: 16 << 20, world: 1024 }
    );
    for bad in
        [network(1, 0.0, 1, 1.0), network(1, 1.0, 1, f64::NAN), network(1, f64::INFINITY, 1, 1.0)]
    {
        let e = err(&bad, CallKind::Allreduce, 4, 64, AllreducePath::Auto);
        assert!(matches!(e, SimulateError::Network(_)), "{e}");
    }
}
