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
        self.run_on_channels(op, bytes, |mut on, seq| {
            ring::allreduce_numbers(&mut on, Call { rank, world, op, seq }, buf, reduction)
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
            ring::allgather_blocks(link, Call { rank, world, op, seq }, buf, blocks)
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

impl TcpCollective {
    /// Fails a call of `op` that this rank cannot make, because its own caller handed it
    /// arguments no collective can run with (`reason` says which): the call fails as one that
    /// refused its arguments would, with [`CollectiveError::InvalidArgument`], so the ring is
    /// closed, both neighbours are told, and every other rank's current or next call fails
    /// naming this rank instead of waiting for it. For a caller that checks what it was handed
    /// before it can even build the call's arguments, as a foreign-function hook must (LightGBM's
    /// network hooks in the Python binding). Returns the error, which sticks as any failure does
    /// (in a world of one, with no ring to close, it is only returned).
    ///
    /// ```
    /// use silvic_net::{CollectiveError, Op, TcpCollective};
    /// use std::time::Duration;
    ///
    /// let listener = TcpCollective::bind("127.0.0.1")?;
    /// let addresses = vec![listener.address()];
    /// let mut ring = TcpCollective::connect(listener, 0, &addresses, "job-1", Duration::from_secs(5))?;
    /// let e = ring.refuse(Op::AllgatherBlocks, "a null output");
    /// assert_eq!(e, CollectiveError::InvalidArgument { reason: "a null output".into() });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refuse(&mut self, op: Op, reason: impl Into<String>) -> CollectiveError {
        let error = CollectiveError::InvalidArgument { reason: reason.into() };
        let refused = if self.world == 1 {
            self.alone(op, || Err::<(), _>(error))
        } else {
            self.run(op, 0, |_, _, _| Err(error))
        };
        refused.err().unwrap_or_else(|| CollectiveError::InvalidArgument { reason: String::new() })
    }
}
