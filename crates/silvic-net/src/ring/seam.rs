//! The seam between the ring's algorithms and whatever carries their frames: a collective is a
//! [`FramePlan`], and a [`Link`] moves it. The TCP link (`link`), the fuzz targets' slice
//! link and the tests' in-memory driver (`super::mem`) import this module and nothing else of
//! the ring; so does the simulator's virtual-time driver (`simulate/driver.rs`).
//!
//! # How a driver runs a plan
//!
//! A plan has [`FramePlan::ways`] ways. On way `w`, a rank sends [`FramePlan::frames`]`(w)`
//! frames to the rank [`Route::offset`] places round the ring from it, and receives as many
//! from the rank that far back, each way's frames in order. A driver keeps, per way, how many
//! frames are all out and how many all in (a [`Moved`]) and repeats, in any order it likes:
//!
//! - **Send** frame `i = sent[w]` of way `w` once [`FramePlan::ready`]`(w, progress)`: its
//!   bytes are [`FramePlan::header`]`(w, i)` encoded, then [`FramePlan::payload`]`(w, i)`.
//!   Count it in `sent[w]` once all of it is out (what a sent frame reads must not be
//!   overwritten before then).
//! - **Receive** frame `j = received[w]` of way `w` once [`FramePlan::may_receive`]`(w,
//!   progress)`: check its header against [`FramePlan::expect`]`(w, j)` before a payload byte
//!   is used, then hand the payload over in pieces of any size, writing each to the front of
//!   [`FramePlan::space`]`(w, j)` and telling [`FramePlan::commit`]`(w, j, n)`, until the space
//!   is empty. Count it in `received[w]`.
//!
//! The call is done when every way has sent and received all its frames. Every rank builds the
//! same plan from its [`Call`] alone, and frame `j` received on way `w` is the neighbour's
//! frame `j` sent on way `w`.
//!
//! # The rule that keeps gates from waiting in a circle
//!
//! Ways are ordered. A gate of frame `i` of way `w` (sending it, or receiving it) may look at any
//! frame of the ways before `w`, and at the frames before `i` of way `w`, going out or coming in;
//! never at frame `i` or a later one of way `w`, nor at a later way. Then every frame moves, in
//! any driver that moves whatever the gates let through, however few frames its buffers hold:
//! by induction over `(w, i)` in order, frame `i` of way `w` is sent on every rank (its gate
//! looks only at frames already moved), so it is there to be received (its gate likewise).
//! The plans' tests check this rule for every plan and world they build.

use silvic_core::{CollectiveError, Op};

pub(crate) use super::choice::{Forced, Network};
use crate::frame::Header;

/// Which collective call a plan belongs to, as this rank sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) op: Op,
    pub(crate) seq: u64,
}

/// Where one way of a plan goes round the ring: frames are sent to rank `rank + offset` and
/// received from rank `rank - offset` (mod world). Signed, so that the two ways of a world of
/// two (both to rank 1) stay apart: a link carries them on different streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) offset: isize,
}

impl Route {
    /// To the right neighbour, from the left one.
    pub(crate) const RIGHTWARD: Route = Route { offset: 1 };
    /// To the left neighbour, from the right one.
    pub(crate) const LEFTWARD: Route = Route { offset: -1 };

    /// The rank this way's frames go to, from `rank` of a world of `world`.
    pub(crate) fn sends_to(self, rank: usize, world: usize) -> usize {
        (rank as isize + self.offset).rem_euclid(world as isize) as usize
    }

    /// The rank this way's frames come from.
    pub(crate) fn receives_from(self, rank: usize, world: usize) -> usize {
        (rank as isize - self.offset).rem_euclid(world as isize) as usize
    }
}

/// How far a driver has moved a plan: per way (indexed as [`FramePlan::ways`]), the frames all
/// out and the frames all in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moved<'a> {
    pub(crate) sent: &'a [usize],
    pub(crate) received: &'a [usize],
}

/// A collective as the frames it moves, way by way (see the module doc for how a driver runs
/// it and the rule its gates keep).
pub(crate) trait FramePlan {
    /// The call the plan carries out.
    fn call(&self) -> Call;
    /// The plan's ways, in the order of the no-circular-wait rule.
    fn ways(&self) -> &[Route];
    /// Frames sent (and as many received) on `way`.
    fn frames(&self, way: usize) -> usize;
    /// The header of outgoing frame `i` on `way`.
    fn header(&self, way: usize, i: usize) -> Header;
    /// What the header of incoming frame `j` on `way` must equal (checked before a payload byte
    /// is taken).
    fn expect(&self, way: usize, j: usize) -> Header;
    /// Whether the next outgoing frame on `way` (frame `progress.sent[way]`) may go.
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool;
    /// Whether the next incoming frame on `way` (frame `progress.received[way]`) may be taken.
    fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool;
    /// The payload of outgoing frame `i`; asked for only once it is ready.
    fn payload(&self, way: usize, i: usize) -> &[u8];
    /// Room for the next payload bytes of incoming frame `j`; empty once it is all in.
    fn space(&mut self, way: usize, j: usize) -> &mut [u8];
    /// `n` bytes of incoming frame `j` were written to the front of [`FramePlan::space`].
    fn commit(&mut self, way: usize, j: usize, n: usize);
    /// Whether incoming frame `j` on `way` is folded into the buffer (not just copied): what a
    /// model of the plan's time (the simulator) charges the fold's rate for. A link
    /// ignores it.
    fn folds(&self, way: usize, j: usize) -> bool {
        let _ = (way, j);
        false
    }
}

/// Something that moves a plan's frames between ranks.
pub(crate) trait Link {
    /// Moves every frame of `plan`, each as soon as the plan lets it, writing and reading at the
    /// same time; returns once all are through.
    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError>;
    /// What the ranks measured of the network this link carries frames over, the same on every
    /// rank: plans that order their frames by it ask here.
    fn network(&self) -> Network;
    /// What the ranks agreed to force on every allreduce (`SILVIC_ALLREDUCE`, `options.rs`),
    /// the same on every rank: by default nothing, and the choice decides.
    fn forced(&self) -> Forced {
        Forced::default()
    }
}

/// Where the payload of a received frame goes, as it arrives, and the header it must come
/// under.
pub(crate) trait Sink {
    /// The header the frame must carry; asked once a header has come in.
    fn expected(&self) -> Header;
    /// Room for the next bytes; empty once the whole payload has arrived.
    fn space(&mut self) -> &mut [u8];
    /// `n` bytes were written to the front of [`Sink::space`].
    fn commit(&mut self, n: usize);
}

/// Incoming frame `frame` on `way` of a plan, as a [`Sink`] for a frame reader.
pub(crate) struct Receiving<'p> {
    pub(crate) plan: &'p mut dyn FramePlan,
    pub(crate) way: usize,
    pub(crate) frame: usize,
}

impl Sink for Receiving<'_> {
    fn expected(&self) -> Header {
        self.plan.expect(self.way, self.frame)
    }
    fn space(&mut self) -> &mut [u8] {
        self.plan.space(self.way, self.frame)
    }
    fn commit(&mut self, n: usize) {
        self.plan.commit(self.way, self.frame, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_the_neighbours_and_keep_a_world_of_two_apart() {
        assert_eq!((Route::RIGHTWARD.sends_to(0, 4), Route::RIGHTWARD.receives_from(0, 4)), (1, 3));
        assert_eq!((Route::LEFTWARD.sends_to(0, 4), Route::LEFTWARD.receives_from(0, 4)), (3, 1));
        assert_eq!(Route::RIGHTWARD.sends_to(1, 2), Route::LEFTWARD.sends_to(1, 2));
        assert_ne!(Route::RIGHTWARD, Route::LEFTWARD);
        assert_eq!(Route { offset: 2 }.receives_from(1, 8), 7);
    }
}
