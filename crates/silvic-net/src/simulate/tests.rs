use std::cell::RefCell;

use super::driver::drive;
use super::*;
use crate::frame::Header;
use crate::ring::seam::{self, Moved, Route};
use crate::ring::{gather, schedule};

fn network(hop_us: u64, link_gbit: f64, overhead_us: u64, fold_gbyte: f64) -> Network {
    Network {
        hop: Duration::from_micros(hop_us),
        link_gbit,
        frame_overhead: Duration::from_micros(overhead_us),
        fold_gbyte,
        copy_gbyte: f64::INFINITY,
        cores: None,
    }
}

/// 8 Gbit/s is a byte a nanosecond, 1 GB/s folds a byte a nanosecond: times in whole ns.
const EXACT: f64 = 8.0;

#[test]
fn world_two_is_one_frame_each_way_overhead_bytes_and_a_hop() {
    let net = network(7, EXACT, 3, 1.0);
    // An allgather: one frame each way, nothing folded.
    let got = simulate(&net, Collective::Allgather, 2, 1000, Path::Auto).unwrap();
    assert_eq!(
        got,
        Simulated { time: Duration::from_nanos(3000 + 1000 + 7000), path: Path::Gather, frames: 2 }
    );
    // An allreduce at world 2 takes the gather, then folds the other rank's 1000 bytes.
    let got = simulate(&net, Collective::Allreduce, 2, 1008, Path::Auto).unwrap();
    assert_eq!(got.time, Duration::from_nanos(3000 + 1008 + 7000 + 1008));
    assert_eq!(got.path, Path::Gather);
    // Forced onto the ring: the reduce-scatter's frame (a 504-byte segment, folded at 1 GB/s),
    // then the reduced segment's frame, which waits for the fold.
    let got = simulate(&net, Collective::Allreduce, 2, 1008, Path::Ring).unwrap();
    let step = 3000 + 504 + 7000;
    assert_eq!((got.time, got.frames), (Duration::from_nanos(step + 504 + step), 4));
}

#[test]
fn the_same_call_gives_the_same_time_on_every_run() {
    let net = network(100, 3.2, 20, 4.0);
    for (world, bytes) in [(5, 40_000), (16, 16 << 20), (37, 1 << 20)] {
        let first = simulate(&net, Collective::Allreduce, world, bytes, Path::Auto).unwrap();
        for _ in 0..3 {
            let again = simulate(&net, Collective::Allreduce, world, bytes, Path::Auto).unwrap();
            assert_eq!(again, first, "world {world} bytes {bytes}");
        }
    }
}

/// The ring measures its hop when it forms, by the probe's small allreduce: on the model, a
/// world of 2 sends one 8-byte frame each way and folds the other's 8 bytes.
#[test]
fn the_simulated_ring_measures_the_hop_a_probe_would() {
    let model = network(7, EXACT, 3, 1.0).model().unwrap();
    let link = VirtualLink::formed(model, 2).unwrap();
    assert_eq!(
        link.measured,
        seam::Network { hop_ns: 3000 + 8 + 7000 + 8, ..seam::Network::UNMEASURED }
    );
    // A world of 5 takes 2 hops each way. The first leftward frame waits on the link out for
    // the first rightward one; from then on the leftward way is the later: its frame in
    // (3008 + 3008 + 7000) sends its next at once (3008 + 7000), then the 4 blocks fold.
    let link = VirtualLink::formed(model, 5).unwrap();
    let call = 3 * 3008 + 2 * 7000 + 4 * 8;
    assert_eq!(link.measured, seam::Network { hop_ns: call / 2, ..seam::Network::UNMEASURED });
}

/// Where the hop is long, the simulated ring also times the fold probe and the rate probe and
/// derives the rates a real ring would: on a link of 1 Gbit/s, copies free, the bytes one rank
/// sends move at the link's rate, about 125 B/us once the hops and the folds are taken off,
/// whatever the fold rate. Half the link, half the rate; a short hop measures none. At 100
/// Gbit/s behind 1 ms hops, where the first round's bytes take a sliver of its hops, the
/// second round's larger buffer finds the rate (about 12,500 B/us) within the noise of the
/// measured hop. The fold rate is the model's, in B/us.
#[test]
fn the_simulated_ring_measures_the_rate_a_probe_would() {
    let measured = |hop_us, gbit, world, fold_gbyte| {
        let model = network(hop_us, gbit, 0, fold_gbyte).model().unwrap();
        VirtualLink::formed(model, world).unwrap().measured
    };
    let rate = |hop_us, gbit, world| measured(hop_us, gbit, world, 1000.0).bytes_per_us;
    for world in [2, 4, 7, 16] {
        assert_eq!(rate(50, 1.0, world), seam::Network::UNMEASURED_RATE, "world {world}");
        let (gbit, half) = (rate(200, 1.0, world), rate(200, 0.5, world));
        assert!((112..=140).contains(&gbit), "world {world}: {gbit} B/us");
        assert!(half.abs_diff(gbit / 2) <= gbit / 10, "world {world}: {half} B/us");
        // Folds as slow as the link: they take their share of the probe's time, not the rate's.
        let slow_folds = measured(200, 1.0, world, 0.125);
        assert_eq!(slow_folds.folds_per_us, 125, "world {world}");
        let rated = slow_folds.bytes_per_us;
        assert!(rated.abs_diff(gbit) <= gbit / 10, "world {world}: {rated} against {gbit} B/us");
        // 100 Gbit/s behind 1 ms hops: the first round's bytes take a sliver of its hops, and
        // the second round's more bytes find the rate all the same.
        let fast = rate(1000, 100.0, world);
        assert!((10_000..=17_000).contains(&fast), "world {world}: {fast} B/us");
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
            for collective in [Collective::Allreduce, Collective::Allgather] {
                for (&path, hop_ns) in
                    collective.paths().iter().flat_map(|p| [(p, 0), (p, 400_000)])
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
                        Path::Ring | Path::Index => 2 * (world - 1) * bytes / world,
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
    let got = ring.call(Collective::Allreduce, 16 << 20, Path::Auto).unwrap();
    // Segments of 16 KiB are one slice: n - 1 + floor(n/2) frames rightward, floor((n-1)/2)
    // leftward, on each of 1024 ranks.
    assert_eq!((got.path, got.frames), (Path::Ring, 1024 * (1023 + 512 + 511)));
    // At least its hops: n - 1 + floor(n/2) of them, one after another.
    assert!(got.time >= Duration::from_micros(100 * (1023 + 512)), "{got:?}");
    let gathered = ring.call(Collective::Allgather, 16 << 10, Path::Auto).unwrap();
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
    let bad = Network { link_gbit: 0.0, ..net };
    assert!(matches!(SimulatedRing::form(&bad, 4), Err(SimulateError::Network(_))));
    let ring = SimulatedRing::form(&net, 4).unwrap();
    assert_eq!(ring.call(Collective::Allreduce, 12, Path::Auto), Err(SimulateError::Length(12)));
    // A ring formed for one call gives the same call as one formed for many.
    let one = simulate(&net, Collective::Allreduce, 4, 64 << 10, Path::Auto);
    assert_eq!(ring.call(Collective::Allreduce, 64 << 10, Path::Auto), one);
}

/// Where the simulated probe's hop is short (5 us), auto takes today's cut; where it is long
/// (100 us), the ring also measures its rate, and auto takes the cost model's path at that hop
/// and rate: among the gather and the ring without chords, every path with them.
#[test]
fn a_forced_path_is_taken_and_auto_takes_the_cost_models() {
    for hop_us in [5, 100] {
        let net = network(hop_us, 10.0, 5, 5.0);
        for world in [3, 4, 8, 16] {
            let measured = VirtualLink::formed(net.model().unwrap(), world).unwrap().measured;
            assert_eq!(measured.long_hops(), hop_us == 100, "world {world}: {measured:?}");
            let rated = measured.bytes_per_us != seam::Network::UNMEASURED_RATE;
            assert_eq!(rated, measured.long_hops(), "world {world}: {measured:?}");
            for bytes in [4096, schedule::gather_limit(world), schedule::gather_limit(world) + 8] {
                let bytes = bytes / 8 * 8;
                let run = |path| simulate(&net, Collective::Allreduce, world, bytes, path).unwrap();
                let (auto, gather, ring) = (run(Path::Auto), run(Path::Gather), run(Path::Ring));
                assert_eq!((gather.path, ring.path), (Path::Gather, Path::Ring));
                let case = format!("hop {hop_us} us world {world} bytes {bytes}");
                if measured.long_hops() {
                    let cut = taken(Collective::Allreduce, world, bytes, Path::Auto, measured);
                    assert_eq!(auto, run(cut), "{case}");
                    if !measured.chords {
                        assert!(matches!(cut, Path::Gather | Path::Ring), "{case}: {cut:?}");
                    }
                } else {
                    let expected = if schedule::uses_gather(bytes, world) { gather } else { ring };
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
    let err = |n: &Network, c, world, bytes, path| simulate(n, c, world, bytes, path).unwrap_err();
    let e = err(&net, Collective::Allgather, 4, 64, Path::Ring);
    assert_eq!(
        e,
        SimulateError::NoSuchPath { collective: Collective::Allgather, path: Path::Ring }
    );
    assert_eq!(e.to_string(), "the allgather has no ring path (it has: auto, gather)");
    assert_eq!(err(&net, Collective::Allreduce, 0, 64, Path::Auto), SimulateError::World(0));
    assert_eq!(
        err(&net, Collective::Allreduce, MAX_WORLD + 1, 8, Path::Auto),
        SimulateError::World(MAX_WORLD + 1)
    );
    assert_eq!(err(&net, Collective::Allreduce, 4, 12, Path::Auto), SimulateError::Length(12));
    let e = err(&net, Collective::Allreduce, 1024, 16 << 20, Path::Gather);
    assert_eq!(e, SimulateError::TooLarge { path: Path::Gather, bytes: 16 << 20, world: 1024 });
    for bad in
        [network(1, 0.0, 1, 1.0), network(1, 1.0, 1, f64::NAN), network(1, f64::INFINITY, 1, 1.0)]
    {
        let e = err(&bad, Collective::Allreduce, 4, 64, Path::Auto);
        assert!(matches!(e, SimulateError::Network(_)), "{e}");
    }
}

/// A plan whose only gate waits on its own frame in.
struct Circular;

impl FramePlan for Circular {
    fn call(&self) -> Call {
        Call { rank: 0, world: 2, op: Op::AllgatherBytes, seq: 0 }
    }
    fn ways(&self) -> &[Route] {
        &[Route::RIGHTWARD]
    }
    fn frames(&self, _: usize) -> usize {
        1
    }
    fn header(&self, _: usize, _: usize) -> Header {
        Header::data(Op::AllgatherBytes, 0, 0, 0)
    }
    fn expect(&self, w: usize, i: usize) -> Header {
        self.header(w, i)
    }
    fn ready(&self, w: usize, progress: Moved<'_>) -> bool {
        progress.received[w] > 0
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, _: usize, _: usize) -> &[u8] {
        &[]
    }
    fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
        &mut []
    }
    fn commit(&mut self, _: usize, _: usize, _: usize) {}
}

#[test]
fn gates_that_wait_in_a_circle_are_reported_not_hung() {
    let model = network(1, 1.0, 1, 1.0).model().unwrap();
    assert_eq!(drive(&[&Circular], 2, model), Err(Stuck { rank: 0 }));
}

/// A gate question and rank 0's plan's answer.
#[derive(Debug, Clone)]
struct Asked {
    receive: bool,
    way: usize,
    sent: Vec<usize>,
    received: Vec<usize>,
    answer: bool,
}

/// Rank 0's plan, remembering every gate question the driver asks it.
struct Recording<'p> {
    plan: &'p dyn FramePlan,
    asked: RefCell<Vec<Asked>>,
}

impl Recording<'_> {
    fn ask(&self, receive: bool, way: usize, progress: Moved<'_>, answer: bool) -> bool {
        let (sent, received) = (progress.sent.to_vec(), progress.received.to_vec());
        self.asked.borrow_mut().push(Asked { receive, way, sent, received, answer });
        answer
    }
}

impl FramePlan for Recording<'_> {
    fn call(&self) -> Call {
        self.plan.call()
    }
    fn ways(&self) -> &[Route] {
        self.plan.ways()
    }
    fn frames(&self, way: usize) -> usize {
        self.plan.frames(way)
    }
    fn header(&self, way: usize, i: usize) -> Header {
        self.plan.header(way, i)
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        self.plan.expect(way, j)
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        self.ask(false, way, progress, self.plan.ready(way, progress))
    }
    fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool {
        self.ask(true, way, progress, self.plan.may_receive(way, progress))
    }
    fn payload(&self, _: usize, _: usize) -> &[u8] {
        unreachable!("the simulator moves no byte")
    }
    fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
        unreachable!("the simulator moves no byte")
    }
    fn commit(&mut self, _: usize, _: usize, _: usize) {}
    fn folds(&self, way: usize, j: usize) -> bool {
        self.plan.folds(way, j)
    }
}

/// What a rank's plan says: per way, each frame's length out, length in and whether it folds.
fn shape(plan: &dyn FramePlan) -> Vec<Vec<(u64, u64, bool)>> {
    let ways = 0..plan.ways().len();
    ways.map(|w| {
        (0..plan.frames(w))
            .map(|i| (plan.header(w, i).len, plan.expect(w, i).len, plan.folds(w, i)))
            .collect()
    })
    .collect()
}

/// What a plan says of its frames ([`shape`]).
type Shape = Vec<Vec<(u64, u64, bool)>>;

/// Rank 0: simulates each of its call's plans on every rank and keeps the questions, plan by
/// plan. Any other rank: checks its own plans, in the same order, answer them as rank 0's did
/// and have rank 0's shapes to within `slack` bytes.
enum Probe {
    Record { plans: Vec<(Vec<Asked>, Shape)> },
    Check { plans: std::collections::VecDeque<(Vec<Asked>, Shape)>, slack: u64, case: String },
}

/// A [`Probe`] on a network measured as `network` (which sets the ring plan's window).
struct ProbeLink {
    network: seam::Network,
    probe: Probe,
}

impl Link for ProbeLink {
    fn network(&self) -> seam::Network {
        self.network
    }
    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), silvic_core::CollectiveError> {
        match &mut self.probe {
            Probe::Record { plans } => {
                let recording = Recording { plan: &*plan, asked: RefCell::default() };
                let model = network(50, 10.0, 5, 5.0).model().unwrap();
                drive(&[&recording], plan.call().world, model).expect("not stuck");
                plans.push((recording.asked.take(), shape(&*plan)));
            }
            Probe::Check { plans, slack, case } => {
                let (asked, s) = plans.pop_front().unwrap_or_else(|| panic!("{case}: a plan more"));
                let mine = shape(&*plan);
                assert_eq!(mine.len(), s.len(), "{case}: ways");
                for (w, (mine, zero)) in mine.iter().zip(s.iter()).enumerate() {
                    assert_eq!(mine.len(), zero.len(), "{case}: frames on way {w}");
                    for (i, (a, b)) in mine.iter().zip(zero).enumerate() {
                        let near = a.0.abs_diff(b.0) <= *slack && a.1.abs_diff(b.1) <= *slack;
                        assert!(near && a.2 == b.2, "{case}: way {w} frame {i}: {a:?} vs {b:?}");
                    }
                }
                for q in asked.iter() {
                    let progress = Moved { sent: &q.sent, received: &q.received };
                    let answer = if q.receive {
                        plan.may_receive(q.way, progress)
                    } else {
                        plan.ready(q.way, progress)
                    };
                    assert_eq!(answer, q.answer, "{case}: {q:?}");
                }
            }
        }
        Ok(())
    }
}

/// One rank's real call of a plan shape, over a probe.
type RankCall = dyn Fn(&mut ProbeLink, usize);

/// The assumption the simulator rests on (see the module doc): for every plan shape (the
/// allreduce's gather and ring paths, segments of one slice and of several, even and uneven
/// lengths, windows of one slice and of three, and the allgather), in worlds 1 to 12, every
/// rank's own plan answers every gate question a simulated run asks as rank 0's plan does, and
/// its frames are as long to within one element.
#[test]
fn one_plan_answers_for_every_rank() {
    let per_slice = schedule::SLICE_BYTES / 8;
    for world in 1..=12 {
        let lengths = [3 * world + 1, 600, 2 * world * per_slice + 5, 3 * world * per_slice - 1];
        let mut shapes: Vec<(String, Box<RankCall>, u64)> = Vec::new();
        for len in lengths {
            for path in [RingPath::Gather, RingPath::Ring, RingPath::Bruck, RingPath::Index] {
                if matches!(path, RingPath::Gather | RingPath::Bruck) && len > 1000 {
                    continue; // the gather's frames are whole buffers, equal on every rank
                }
                let run = move |link: &mut ProbeLink, rank: usize| {
                    let call = Call { rank, world, op: Op::AllreduceSumF64, seq: 0 };
                    let mut buf = vec![0.0; len];
                    let s = &mut Scratch::default();
                    ring::allreduce_on(path, link, call, &mut buf, fold::sum_f64, s).unwrap();
                };
                shapes.push((format!("{path:?} len {len}"), Box::new(run), 8));
            }
        }
        shapes.push((
            "allgather".into(),
            Box::new(move |link: &mut ProbeLink, rank: usize| {
                let mut blocks = vec![Vec::new(); world];
                blocks[rank] = vec![0; 77];
                let call = Call { rank, world, op: Op::AllgatherBytes, seq: 0 };
                gather::allgather(link, call, 77, &mut blocks).unwrap();
            }),
            0,
        ));
        // Windows of one slice (nothing measured) and of three (a 400 us hop).
        for network in [
            seam::Network::UNMEASURED,
            seam::Network { hop_ns: 400_000, chords: true, ..seam::Network::UNMEASURED },
        ] {
            for (name, run, slack) in &shapes {
                let mut zero = ProbeLink { network, probe: Probe::Record { plans: Vec::new() } };
                run(&mut zero, 0);
                let Probe::Record { plans } = zero.probe else { unreachable!() };
                assert!(world == 1 || plans.iter().all(|p| !p.0.is_empty()), "{name}: no gate");
                for rank in 1..world {
                    let case = format!("world {world} rank {rank} {name} {network:?}");
                    let plans = plans.iter().cloned().collect();
                    let mut link =
                        ProbeLink { network, probe: Probe::Check { plans, slack: *slack, case } };
                    run(&mut link, rank);
                    let Probe::Check { plans, case, .. } = link.probe else { unreachable!() };
                    assert!(plans.is_empty(), "{case}: {} plans fewer", plans.len());
                }
            }
        }
    }
}
