//! [`TrainerCollective`] for [`TcpCollective`]: the trainers' op set over the ring, each call
//! one [`TcpCollective::run`] (so a failure, an argument refused included, closes the ring,
//! tells the neighbours and sticks) of the plans in `ring::records` and `ring::varlen`, or an
//! element allreduce of the ring's own paths.
//!
//! A world of one opens no sockets: every op returns its input, after the same argument checks
//! a ring makes.

use silvic_core::{
    CollectiveError, LocalCollective, Numbers, Op, RecordFold, Reduction, TrainerCollective,
};

use crate::ring::{self, Call};
use crate::tcp::TcpCollective;

/// On an error the buffer's contents are unspecified; the ring is closed.
impl TrainerCollective for TcpCollective {
    fn allreduce(&mut self, buf: Numbers<'_>, reduction: Reduction) -> Result<(), CollectiveError> {
        if self.world == 1 {
            let op = Op::allreduce(reduction, buf.dtype());
            return self.alone(op, || LocalCollective.allreduce(buf, reduction));
        }
        let (rank, world) = (self.rank, self.world);
        let op = Op::allreduce(reduction, buf.dtype());
        let bytes = buf.len() * buf.dtype().width();
        self.run(op, bytes, |link, seq, scratch| {
            ring::allreduce_numbers(link, Call { rank, world, op, seq }, buf, reduction, scratch)
        })
    }

    fn reduce_scatter_records(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return self.alone(Op::ReduceScatterRecords, || {
                LocalCollective.reduce_scatter_records(buf, blocks, record, fold)
            });
        }
        let (rank, world, op) = (self.rank, self.world, Op::ReduceScatterRecords);
        self.run(op, buf.len(), |link, seq, scratch| {
            let call = Call { rank, world, op, seq };
            ring::records::reduce_scatter_records(link, call, buf, blocks, record, fold, scratch)
        })
    }

    fn allreduce_records(
        &mut self,
        buf: &mut [u8],
        record: usize,
        fold: RecordFold<'_>,
    ) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return self.alone(Op::AllreduceRecords, || {
                LocalCollective.allreduce_records(buf, record, fold)
            });
        }
        let (rank, world, op) = (self.rank, self.world, Op::AllreduceRecords);
        self.run(op, buf.len(), |link, seq, scratch| {
            let call = Call { rank, world, op, seq };
            ring::records::allreduce_records(link, call, buf, record, fold, scratch)
        })
    }

    fn allgather_blocks(
        &mut self,
        buf: &mut [u8],
        blocks: &[usize],
    ) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return self
                .alone(Op::AllgatherBlocks, || LocalCollective.allgather_blocks(buf, blocks));
        }
        let (rank, world, op) = (self.rank, self.world, Op::AllgatherBlocks);
        self.run(op, buf.len(), |link, seq, _| {
            ring::records::allgather_blocks(link, Call { rank, world, op, seq }, buf, blocks)
        })
    }

    fn allgather_varlen(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        if self.world == 1 {
            return self.alone(Op::AllgatherVarlen, || LocalCollective.allgather_varlen(local));
        }
        let (rank, world, op) = (self.rank, self.world, Op::AllgatherVarlen);
        self.run(op, local.len(), |link, seq, _| {
            ring::varlen::allgather_varlen(link, Call { rank, world, op, seq }, local)
        })
    }

    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return self.alone(Op::BroadcastBytes, || LocalCollective.broadcast_bytes(buf, root));
        }
        let (rank, world, op) = (self.rank, self.world, Op::BroadcastBytes);
        self.run(op, buf.len(), |link, seq, _| {
            ring::varlen::broadcast(link, Call { rank, world, op, seq }, buf, root)
        })
    }
}
