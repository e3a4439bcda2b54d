//! A plan that cannot move, for the tests of what drives plans: its only way's one frame may go
//! out only once a frame has come in on that way, so on every rank the gates wait in a circle.
//! The in-memory driver fails such a call at once (`ring/mem.rs`); the simulator reports it
//! stuck (`simulate/plan_tests.rs`). Test code only.

use silvic_core::Op;

use super::seam::{Call, FramePlan, Moved, Route};
use crate::frame::Header;

/// The plan (see the module doc).
pub(crate) struct Circular;

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
