//! The simulator's CPU: the copies at each end of a frame, a rank's one thread, and cores
//! shared by every rank.

use super::*;

/// 8 Gbit/s moves a byte a nanosecond, 1 GB/s copies or folds one: times in whole ns.
fn network(copy_gbyte: f64, cores: Option<usize>) -> NetworkModel {
    NetworkModel {
        hop: Duration::from_micros(7),
        link_gbit: 8.0,
        frame_overhead: Duration::from_micros(3),
        fold_gbyte: 1.0,
        copy_gbyte,
        cores,
        network_copies: 0,
    }
}

fn time(
    net: &NetworkModel,
    collective: CallKind,
    world: usize,
    bytes: usize,
    path: AllreducePath,
) -> u64 {
    let got = simulate(net, collective, world, bytes, path).unwrap();
    u64::try_from(got.time.as_nanos()).unwrap()
}

#[test]
fn a_frame_costs_a_copy_out_and_a_copy_in() {
    // World 2, one frame each way: copy out, overhead, bytes over the link, the hop, copy in.
    let net = network(1.0, None);
    assert_eq!(
        time(&net, CallKind::Allgather, 2, 1000, AllreducePath::Auto),
        1000 + 3000 + 1000 + 7000 + 1000
    );
    // Copies at half the rate cost twice as long; no cost at all is the copy-free model.
    let slow = network(0.5, None);
    assert_eq!(
        time(&slow, CallKind::Allgather, 2, 1000, AllreducePath::Auto),
        2000 + 3000 + 1000 + 7000 + 2000
    );
    let free = network(f64::INFINITY, None);
    assert_eq!(time(&free, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 3000 + 1000 + 7000);
    // The ring at world 2: the reduce-scatter's 504-byte frame is copied in and then folded,
    // on the receiver's one thread, before the reduced segment is copied out and sent.
    let step = 504 + 3000 + 504 + 7000 + 504;
    assert_eq!(time(&net, CallKind::Allreduce, 2, 1008, AllreducePath::Ring), step + 504 + step);
}

#[test]
fn ranks_on_one_shared_core_copy_one_after_another() {
    // World 2 on one core: rank 0 copies out at 0..1000, rank 1 waits for the core (1000..2000);
    // their frames arrive at 1000 + 4000 + 7000 = 12000 and 13000, each copied in at once.
    let net = network(1.0, Some(1));
    assert_eq!(time(&net, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 14_000);
    // Two cores: no rank waits for one, as with a core per rank.
    let two = network(1.0, Some(2));
    assert_eq!(time(&two, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 13_000);
}

#[test]
fn on_one_core_a_call_takes_at_least_all_of_its_copies() {
    let one = network(1.0, Some(1));
    for world in [3, 4, 7, 16] {
        for block in [8, 1000, 40_000] {
            // Every rank sends and receives world - 1 blocks; every byte is copied twice.
            let copies = 2 * (world * (world - 1) * block) as u64;
            let t = time(&one, CallKind::Allgather, world, block, AllreducePath::Auto);
            let own =
                time(&network(1.0, None), CallKind::Allgather, world, block, AllreducePath::Auto);
            assert!(t >= copies, "world {world} block {block}: {t} ns, copies {copies} ns");
            assert!(t >= own, "world {world} block {block}: {t} ns on one core, {own} ns on own");
        }
    }
}

#[test]
fn the_networks_copies_take_a_shared_core_but_hold_no_frame() {
    // World 2 on one core, the network copying each byte twice more (2000 ns a frame): rank 0
    // copies out at 0..1000, its frame starts out at 1000 and the network copies it at
    // 1000..3000; rank 1's copy out waits for the core (3000..4000), its frame starts out at
    // 4000 and the network copies it at 4000..6000. The frames arrive as without network copies
    // (1000 and 4000, + 4000 out, + 7000 of hop: 12000 and 15000), copied in at once.
    let net = NetworkModel { network_copies: 2, ..network(1.0, Some(1)) };
    assert_eq!(time(&net, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 16_000);
    // No hop: rank 0's frame arrives at 5000, and rank 1's copy of it in waits for the core
    // until the network has copied rank 1's frame (6000..7000); rank 1's frame arrives at 8000
    // (8000..9000). Without the network's copies, the same call takes 7000.
    let no_hop = NetworkModel { hop: Duration::ZERO, ..net };
    assert_eq!(time(&no_hop, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 9_000);
    let ranks_only = NetworkModel { network_copies: 0, ..no_hop };
    assert_eq!(time(&ranks_only, CallKind::Allgather, 2, 1000, AllreducePath::Auto), 7_000);
    // On one core a call takes at least every copy, the network's too: the ranks copy each
    // byte twice, the network twice more.
    for world in [3, 4, 7] {
        let block = 1000;
        let copies = 4 * (world * (world - 1) * block) as u64;
        let t = time(&net, CallKind::Allgather, world, block, AllreducePath::Auto);
        assert!(t >= copies, "world {world}: {t} ns, copies {copies} ns");
    }
}

#[test]
fn the_gathers_local_fold_is_spread_over_the_shared_cores() {
    // Copies free: the gather's frames take no core, so only the local fold differs: each of 4
    // ranks folds 3 buffers of 4000 bytes (12 us at 1 GB/s), on their own cores at once, or
    // one after another on one core, or in two rounds on two.
    let at = |cores| {
        time(&network(f64::INFINITY, cores), CallKind::Allreduce, 4, 4000, AllreducePath::Gather)
    };
    let own = at(None);
    assert_eq!(at(Some(1)) - own, 3 * 12_000);
    assert_eq!(at(Some(2)) - own, 12_000);
    assert_eq!(at(Some(4)), own);
}

/// For one plan (the window held fixed by the measured hop), with a core per rank, dearer
/// copies are never faster. Not so on shared cores: which rank gets a core first changes with
/// the costs, and a schedule that hands out cores greedily can be faster for dearer work
/// (world 16, a 4 KiB ring on 2 cores: 2 GB/s copies beat 10 GB/s ones by 3%, as list
/// schedules do); [`on_one_core_a_call_takes_at_least_all_of_its_copies`] bounds those.
#[test]
fn dearer_copies_are_never_faster() {
    let measured = seam::Network { hop_ns: 400_000, chords: true, ..seam::Network::UNMEASURED };
    for world in [2, 3, 4, 7, 16] {
        for bytes in [8, 4096, 32 << 10, 1 << 20] {
            for collective in [CallKind::Allreduce, CallKind::Allgather] {
                for path in super::tests::forced(collective) {
                    let case = format!("{collective:?} {path:?} world {world} bytes {bytes}");
                    let mut last = Duration::ZERO;
                    for copy in [f64::INFINITY, 40.0, 10.0, 2.0] {
                        let link = VirtualLink::new(network(copy, None).model().unwrap(), measured);
                        let t = simulate_on(link, collective, world, bytes, path).unwrap().time;
                        assert!(t >= last, "{case}: copy {copy} GB/s took {t:?}, cheaper {last:?}");
                        last = t;
                    }
                }
            }
        }
    }
}

#[test]
fn a_copy_rate_or_core_count_out_of_range_is_refused() {
    for bad in
        [network(0.0, None), network(-1.0, None), network(f64::NAN, None), network(1.0, Some(0))]
    {
        let e = simulate(&bad, CallKind::Allreduce, 4, 64, AllreducePath::Auto).unwrap_err();
        let SimulateError::Network(what) = e else { panic!("{e:?}") };
        assert!(what.contains("copy rate") || what.contains("cores"), "{what}");
    }
    // The network's copies need cores to run on.
    let own = NetworkModel { network_copies: 3, ..network(1.0, None) };
    let e = simulate(&own, CallKind::Allreduce, 4, 64, AllreducePath::Auto).unwrap_err();
    assert_eq!(
        e,
        SimulateError::Network("the network's copies run on shared cores: give the cores".into())
    );
}
