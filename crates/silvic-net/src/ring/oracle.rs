//! The plans' test oracles: the seam's gate rule checked on a plan without running it, inputs
//! whose sums show a wrong fold order in their bits, and the fold-order reference computed
//! straight from the schedule. Test code only; the driver that runs the plans is `super::mem`.

use super::schedule::{self, segment_of};
use super::seam::{FramePlan, Moved};

/// Asserts the seam's rule on `plan` (see [`super::seam`]): the gates of frame `i` of way `w`
/// open once every frame of the ways before `w` and the frames before `i` of way `w` have moved,
/// with nothing of a later way. Gates only open as frames move, so one that opens here waits on
/// nothing else.
pub(crate) fn assert_gates_keep_the_rule(plan: &dyn FramePlan, case: &str) {
    let ways = plan.ways().len();
    let frames: Vec<usize> = (0..ways).map(|w| plan.frames(w)).collect();
    for w in 0..ways {
        for i in 0..frames[w] {
            let mut moved: Vec<usize> =
                (0..ways).map(|v| if v < w { frames[v] } else { 0 }).collect();
            moved[w] = i;
            let progress = Moved { sent: &moved, received: &moved };
            assert!(plan.ready(w, progress), "{case}: frame {i} out on way {w} waits on more");
            assert!(plan.may_receive(w, progress), "{case}: frame {i} in on way {w} waits on more");
        }
    }
}

/// Inputs whose f64 sums depend on the fold order, so a wrong order shows in the bits.
pub(crate) fn input(rank: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 7 + rank * 13) % 17) as f64 * 0.1 + 1e16 * (rank % 2) as f64).collect()
}

/// The oracle: element `i` folded in fold order of its segment, straight from the schedule
/// (any element type).
pub(crate) fn reference<T: Copy>(inputs: &[Vec<T>], combine: fn(T, T) -> T) -> Vec<T> {
    let (world, len) = (inputs.len(), inputs[0].len());
    (0..len)
        .map(|i| {
            let mut order = schedule::fold_order(segment_of(i, len, world), world);
            let first = order.next().unwrap();
            order.fold(inputs[first][i], |acc, r| combine(acc, inputs[r][i]))
        })
        .collect()
}

pub(crate) fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}
