//! A single-threaded driver for the tests: every rank's plan of one call, moved frame by frame
//! in an order drawn from a seed, over streams named by the pair of ranks they join (as the TCP
//! link with chord streams names them: two ways whose peers coincide modulo the world share a
//! stream, whatever their offsets). Fast enough to run worlds 1..=64 at every op; the threaded
//! driver (`super::mem`) runs the calls themselves.
//!
//! A move is a frame out (its gate open and its stream holding fewer than `capacity` frames)
//! or a frame in (its gate open and a frame waiting on its stream). The frame in is the first on
//! the stream, whichever way sent it, and its header is checked against the plan's `expect`
//! before its payload is handed over in pieces of random size: a way that uses a shared stream
//! out of turn fails here. No move possible before every plan is through: stuck.

use std::collections::VecDeque;

use super::mem::Dice;
use super::seam::{FramePlan, Moved, Receiving, Sink};
use crate::frame::{HEADER_LEN, Header};

/// Moves every frame of `plans` (rank `r`'s plan at index `r`); an error names the rank and
/// what went wrong.
pub(crate) fn drive(
    plans: &mut [&mut dyn FramePlan],
    seed: u64,
    capacity: usize,
    piece: usize,
) -> Result<(), String> {
    let world = plans.len();
    let mut dice = Dice(seed | 1);
    let ways: Vec<usize> = plans.iter().map(|p| p.ways().len()).collect();
    let mut sent: Vec<Vec<usize>> = ways.iter().map(|&w| vec![0; w]).collect();
    let mut received = sent.clone();
    // Stream from rank a to rank b at a * world + b.
    let mut streams: Vec<VecDeque<Vec<u8>>> = vec![VecDeque::new(); world * world];
    let mut options = Vec::new();
    let mut left: usize =
        (0..world).map(|r| (0..ways[r]).map(|w| 2 * plans[r].frames(w)).sum::<usize>()).sum();
    loop {
        if left == 0 {
            return Ok(());
        }
        left -= 1; // the move drawn below, or a failure
        // A rank drawn first, then one of its moves: cheap per move, and every order the gates
        // allow can still be drawn.
        let start = dice.below(world);
        let mut chosen = None;
        for r in (0..world).map(|k| (start + k) % world) {
            let plan = &*plans[r];
            let progress = Moved { sent: &sent[r], received: &received[r] };
            options.clear();
            for (w, route) in plan.ways().iter().enumerate() {
                let frames = plan.frames(w);
                let to = route.sends_to(r, world);
                let from = route.receives_from(r, world);
                if sent[r][w] < frames
                    && streams[r * world + to].len() < capacity
                    && plan.ready(w, progress)
                {
                    options.push((w, true));
                }
                if received[r][w] < frames
                    && !streams[from * world + r].is_empty()
                    && plan.may_receive(w, progress)
                {
                    options.push((w, false));
                }
            }
            if !options.is_empty() {
                chosen = Some((r, options[dice.below(options.len())]));
                break;
            }
        }
        let Some((r, (w, out))) = chosen else {
            return Err("stuck: no move possible before every plan is through".into());
        };
        let route = plans[r].ways()[w];
        if out {
            let i = sent[r][w];
            let mut frame = plans[r].header(w, i).encode().to_vec();
            frame.extend_from_slice(plans[r].payload(w, i));
            streams[r * world + route.sends_to(r, world)].push_back(frame);
            sent[r][w] += 1;
            continue;
        }
        let j = received[r][w];
        let from = route.receives_from(r, world);
        let frame = streams[from * world + r].pop_front().expect("a frame waiting");
        let head = Header::decode(frame[..HEADER_LEN].try_into().expect("a header"))
            .map_err(|e| format!("rank {r} way {w} frame {j}: {e}"))?;
        head.expect(&plans[r].expect(w, j), from)
            .map_err(|e| format!("rank {r} way {w} frame {j}: {e}"))?;
        let mut sink = Receiving { plan: &mut *plans[r], way: w, frame: j };
        let mut rest = &frame[HEADER_LEN..];
        while !rest.is_empty() {
            let space = sink.space();
            let n = space.len().min(rest.len()).min(1 + dice.below(piece));
            if n == 0 {
                return Err(format!("rank {r} way {w} frame {j}: payload longer than its space"));
            }
            space[..n].copy_from_slice(&rest[..n]);
            sink.commit(n);
            rest = &rest[n..];
        }
        if !sink.space().is_empty() {
            return Err(format!("rank {r} way {w} frame {j}: payload shorter than its space"));
        }
        received[r][w] += 1;
    }
}
