//! Hooks for `fuzz/` only, behind the `fuzzing` feature: not part of the API, no semver promise.
//!
//! [`replay`] runs one collective of rank 0 through the real ring algorithms, on any path
//! ([`Setup`]), and the ring link's frame reader, in memory: each peer's stream is a byte slice
//! (its end is a close), and what rank 0 sends is dropped. No socket, no clock.
//! [`gather_limit`] tells the tests where the cost model cuts between the two paths.
//! [`exchange_rank0`] runs rank 0's side of `from_env`'s address exchange on loopback against
//! strangers that send given bytes and honest ranks that join.

use silvic_core::{CollectiveError, Numbers, Op, Reduction, fold};

use crate::AllreducePath;
use crate::link::replay::SliceLink;
use crate::ring::seam::{Forced, Network};
use crate::ring::{Call, Element, Link, Scratch};
use crate::topology::{Chords, topology};

/// A record fold as a plain function (see `silvic_core::RecordFold`).
pub type RecordFn = fn(&mut [u8], &[u8]);

/// The buffer of one collective, which also says which one.
#[derive(Debug)]
pub enum Buffer<'a> {
    /// `allreduce_sum_f64`.
    SumF64(&'a mut [f64]),
    /// `allreduce_sum_i64`.
    SumI64(&'a mut [i64]),
    /// `allreduce_max_f64`.
    MaxF64(&'a mut [f64]),
    /// `allgather_bytes` of this block.
    Gather(&'a [u8]),
    /// `TrainerCollective::allreduce` of these numbers with this reduction.
    Typed(Numbers<'a>, Reduction),
    /// `reduce_scatter_records` of this buffer, cut into these blocks of records of this size,
    /// with this fold.
    Records(&'a mut [u8], &'a [usize], usize, RecordFn),
    /// `allreduce_records` of this buffer of records of this size, with this fold.
    RecordsAllreduce(&'a mut [u8], usize, RecordFn),
    /// `allgather_varlen` of this block.
    Varlen(&'a [u8]),
    /// `broadcast_bytes` of this buffer from this root.
    Broadcast(&'a mut Vec<u8>, usize),
    /// `allgather_blocks` of this buffer cut into these blocks.
    Blocks(&'a mut [u8], &'a [usize]),
}

/// Where the rank a replay runs sits: its world, the allreduce path its ring agreed to force
/// ([`AllreducePath::Auto`]: the choice's), and whether its network's hops are long (the choice
/// then weighs every path, and `allgather_bytes` takes Bruck's rounds). Its ring has chord
/// streams from a world of four on, so that Bruck's gather and index-fold-gather can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// The world, at least 2.
    pub world: usize,
    /// The path forced on every allreduce that path can carry.
    pub path: AllreducePath,
    /// Whether hops are long.
    pub long_hops: bool,
}

/// The peers rank 0 of a world of `world` (at least 2) has streams to, in the order
/// [`replay`] takes their streams: the left neighbour's, the right one's (both rank 1 in a
/// world of two), then the chords'.
///
/// # Panics
///
/// If `world` is below 2.
pub fn peers(world: usize) -> Vec<usize> {
    let streams = topology(0, world, Chords::Always).streams().collect::<Vec<_>>();
    streams.into_iter().map(|p| p.rank).collect()
}

/// Runs one collective (sequence number 0) as rank 0 of `setup`, every frame it receives read
/// from `streams`, one per peer in the order of [`peers`] (a missing one sends nothing), and
/// what it sends dropped. Returns the gathered blocks for a gather (either kind), `None` for a
/// reduction or a broadcast (done in place).
///
/// # Panics
///
/// If `setup.world` is below 2.
pub fn replay(
    setup: Setup,
    buf: Buffer<'_>,
    streams: &[&[u8]],
) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
    let world = setup.world;
    assert!(world >= 2, "a replay needs its peers' streams, so a world of at least 2");
    let topology = topology(0, world, Chords::Always);
    let routes = topology.streams().map(|p| p.route);
    let slices = routes.zip(streams.iter().copied().chain(std::iter::repeat(&[][..]))).collect();
    let hop_ns = if setup.long_hops { Network::LOG_DEPTH_FROM_HOP_NS } else { 0 };
    let network = Network { hop_ns, chords: true, ..Network::UNMEASURED };
    let forced = Forced { path: setup.path.forced(), ..Forced::default() };
    let mut link = SliceLink::new(slices, (0, world), network, forced);
    let call = |op| Call { rank: 0, world, op, seq: 0 };
    let mut scratch = Scratch::default();
    match buf {
        Buffer::SumF64(b) => reduce(&mut link, call(Op::AllreduceSumF64), b, fold::sum_f64),
        Buffer::SumI64(b) => reduce(&mut link, call(Op::AllreduceSumI64), b, fold::sum_i64),
        Buffer::MaxF64(b) => reduce(&mut link, call(Op::AllreduceMaxF64), b, fold::max_f64),
        Buffer::Gather(local) => {
            let mut blocks = vec![Vec::new(); world];
            blocks[0] = local.to_vec();
            crate::ring::allgather(
                &mut link,
                call(Op::AllgatherBytes),
                local.len() as u64,
                &mut blocks,
            )
            .map(|()| Some(blocks))
        }
        Buffer::Typed(numbers, reduction) => {
            let op = Op::allreduce(reduction, numbers.dtype());
            crate::ring::allreduce_numbers(
                &mut crate::ring::OnLink { link: &mut link, scratch: &mut scratch },
                call(op),
                numbers,
                reduction,
            )
            .map(|()| None)
        }
        Buffer::Records(b, blocks, record, f) => {
            let call = call(Op::ReduceScatterRecords);
            crate::ring::records::reduce_scatter_records(
                &mut link,
                call,
                b,
                blocks,
                record,
                &f,
                &mut scratch,
            )
            .map(|()| None)
        }
        Buffer::RecordsAllreduce(b, record, f) => {
            let call = call(Op::AllreduceRecords);
            crate::ring::records::allreduce_records(&mut link, call, b, record, &f, &mut scratch)
                .map(|()| None)
        }
        Buffer::Varlen(local) => {
            crate::ring::varlen::allgather_varlen(&mut link, call(Op::AllgatherVarlen), local)
                .map(Some)
        }
        Buffer::Blocks(b, blocks) => {
            crate::ring::allgather_blocks(&mut link, call(Op::AllgatherBlocks), b, blocks)
                .map(|()| None)
        }
        Buffer::Broadcast(b, root) => {
            crate::ring::varlen::broadcast(&mut link, call(Op::BroadcastBytes), b, root)
                .map(|()| None)
        }
    }
}

fn reduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
    crate::ring::allreduce(link, call, buf, combine, &mut Scratch::default()).map(|()| None)
}

/// The largest buffer, in bytes, that an allreduce in a world of `world` sends by the gather
/// path: every smaller one does too, every larger one takes the ring. The tests that drive
/// both sides of the cut over TCP ask here rather than copy the cost model.
pub fn gather_limit(world: usize) -> usize {
    crate::ring::choice::gather_limit(world)
}

/// What [`exchange_rank0`] saw: rank 0's outcome and each honest rank's, in rank order from 1.
pub type ExchangeOutcome = (
    Result<Vec<std::net::SocketAddr>, crate::ConnectError>,
    Vec<Result<Vec<std::net::SocketAddr>, crate::ConnectError>>,
);

/// Rank 0 of a world of `world` (2 to 8) serves the address exchange on loopback, with job
/// token `token`, for `timeout`. First each of `strangers` connects (from 127.0.0.1, as the
/// ranks do) and sends its bytes, all waiting in the listener's backlog, then ranks 1 to
/// `world - 1` join honestly (threads) with addresses `10.0.0.R:R+1`; the strangers' connections
/// stay open until rank 0 returns. Rank 0's own address is `10.0.0.0:1`.
///
/// # Panics
///
/// If `world` is outside 2 to 8, or loopback sockets cannot be opened.
pub fn exchange_rank0(
    world: usize,
    token: &[u8],
    strangers: &[&[u8]],
    timeout: std::time::Duration,
) -> ExchangeOutcome {
    use std::io::Write;
    use std::net::{SocketAddr, TcpStream};
    use std::time::Instant;

    use crate::launch::exchange::{Join, Serve, join, serve};

    assert!((2..=8).contains(&world), "a world of 2 to 8");
    let listener = crate::bind::listen("127.0.0.1", "127.0.0.1:0".parse().expect("an address"))
        .expect("a loopback listener");
    let at = listener.local_addr().expect("its address");
    let held: Vec<TcpStream> = strangers
        .iter()
        .filter_map(|bytes| {
            let mut stream = TcpStream::connect(at).ok()?;
            // A stranger's bytes go out at once; the kernel's buffers take these few KiB.
            let _ = stream.write_all(bytes);
            Some(stream)
        })
        .collect();
    let address = |rank: usize| SocketAddr::from(([10, 0, 0, rank as u8], rank as u16 + 1));
    let deadline = Instant::now() + timeout;
    let joiners: Vec<_> = (1..world)
        .map(|rank| {
            let token = token.to_vec();
            std::thread::spawn(move || {
                join(&Join {
                    server: at,
                    rank,
                    world,
                    own: address(rank),
                    token: &token,
                    deadline,
                    timeout,
                })
            })
        })
        .collect();
    let served =
        serve(&Serve { listener: &listener, world, own: address(0), token, deadline, timeout });
    drop(held);
    let joined = joiners.into_iter().map(|j| j.join().expect("a joiner does not panic")).collect();
    (served, joined)
}
