//! The one plan the simulator runs against every rank's own: gates that wait in a circle are
//! reported, not hung, and rank 0's plan gives every rank's gate answers.

use std::cell::RefCell;

use super::driver::drive;
use super::tests::network;
use super::*;
use crate::frame::Header;
use crate::ring::choice::Path;
use crate::ring::circular::Circular;
use crate::ring::schedule;
use crate::ring::seam::{self, Moved, Route};

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
            for path in [Path::Gather, Path::Ring, Path::Bruck, Path::Index] {
                if matches!(path, Path::Gather | Path::Bruck) && len > 1000 {
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
                crate::ring::allgather(link, call, 77, &mut blocks).unwrap();
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
