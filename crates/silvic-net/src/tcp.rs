//! [`TcpCollective`] and its [`RingListener`]: the public face of the crate.
//!
//! Invariants: arguments are checked before any socket is opened; a world of one opens none; a
//! failed collective records its error, tells both neighbours and shuts the streams, and every
//! later call returns that same error (it is checked first, on the first line of every call).

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use silvic_core::{Collective, CollectiveError, Op, fold};
use tracing::{info, info_span, warn};

use crate::addresses::parse_addresses;
use crate::bind::{self, BindOptions, listen, resolve};
use crate::channels::{Crew, OnChannels};
use crate::error::{ConnectError, as_seen_by};
use crate::link::{RingPlace, TcpRing, Waker};
use crate::liveness;
use crate::options::{self, ConnectOptions, Settings};
use crate::probe;
use crate::rendezvous::{Plan, rendezvous};
use crate::ring::seam::Route;
use crate::ring::{Call, Element, Reducer, Scratch};
use crate::stats::{PeerStats, RingStats, RingWatch};
use crate::topology::{Chords, topology};

/// A bound listening socket, waiting to be handed to [`TcpCollective::connect`].
///
/// Gather every rank's [`RingListener::address`], in rank order, and give the list to every rank.
#[derive(Debug)]
pub struct RingListener {
    listener: TcpListener,
    advertised: SocketAddr,
}

impl RingListener {
    /// The address other ranks connect to: `"ip:port"`, or `"[ip]:port"` for IPv6.
    pub fn address(&self) -> String {
        self.advertised.to_string()
    }
}

/// A rank of a TCP ring: silvic-core's [`Collective`] over sockets.
///
/// ```
/// use silvic_net::{Collective, TcpCollective};
/// use std::time::Duration;
///
/// // A world of one: no sockets are opened and every collective returns its input.
/// let listener = TcpCollective::bind("127.0.0.1")?;
/// let addresses = vec![listener.address()];
/// let timeout = Duration::from_secs(5);
/// let mut ring = TcpCollective::connect(listener, 0, &addresses, "job-1", timeout)?;
/// let mut histogram = vec![1.0, 2.0];
/// ring.allreduce_sum_f64(&mut histogram)?;
/// assert_eq!(histogram, [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Dropping a rank closes its streams once each peer has acknowledged the last bytes sent to
/// it, or has closed its end, waiting at most 5 s (and at most the timeout): a peer still in
/// its last call gets every frame this rank sent, even one the network lost and TCP sends
/// again after this rank returned.
#[derive(Debug)]
pub struct TcpCollective {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Index of the next collective since connect.
    seq: u64,
    timeout: Duration,
    /// `None` for a world of one.
    ring: Option<TcpRing>,
    /// The channels past the first and their threads, on a ring of several channels.
    crew: Option<Crew>,
    failed: Option<CollectiveError>,
    scratch: Scratch,
    /// Collectives that returned `Ok`.
    done: u64,
    /// The call in progress, for other threads to read.
    watch: RingWatch,
}

fn invalid(message: String) -> ConnectError {
    ConnectError::InvalidArgument(message)
}

impl TcpCollective {
    /// Listens on an ephemeral port of `host` and advertises that address.
    ///
    /// `host` must be an address other ranks can reach: `"0.0.0.0"` and `"::"` are refused (use
    /// [`TcpCollective::bind_advertised`] to listen on every interface).
    pub fn bind(host: &str) -> Result<RingListener, ConnectError> {
        let ip = resolve(host)?;
        if ip.is_unspecified() {
            return Err(invalid(format!(
                "cannot advertise {host}: other nodes cannot reach it; \
                 use bind_advertised({host:?}, node_ip)"
            )));
        }
        let listener = listen(host, SocketAddr::new(ip, 0))?;
        let advertised = listener.local_addr().map_err(|e| ConnectError::bind(host, &e))?;
        Ok(RingListener { listener, advertised })
    }

    /// Listens on an ephemeral port of `host` (such as `"0.0.0.0"`) and advertises `node_ip`
    /// with that port, for hosts whose reachable address is not the one they listen on.
    pub fn bind_advertised(host: &str, node_ip: &str) -> Result<RingListener, ConnectError> {
        let ip = resolve(host)?;
        let node: IpAddr = bind::parse_ip(node_ip)
            .ok_or_else(|| invalid(format!("node_ip {node_ip:?} is not an IP address")))?;
        if node.is_unspecified() {
            return Err(invalid(format!(
                "cannot advertise {node_ip}: other nodes cannot reach it"
            )));
        }
        let listener = listen(host, SocketAddr::new(ip, 0))?;
        let port = listener.local_addr().map_err(|e| ConnectError::bind(host, &e))?.port();
        Ok(RingListener { listener, advertised: SocketAddr::new(node, port) })
    }

    /// Listens where `options` say: on a host or an interface, on a port, the first free port of
    /// a range, or an ephemeral port; advertising the address listened on or the one given.
    ///
    /// An interface that does not exist is an error naming those that do; a range whose every
    /// port is taken is an error naming the range.
    pub fn bind_with(options: &BindOptions) -> Result<RingListener, ConnectError> {
        let (listener, advertised) = bind::bind_with(options)?;
        Ok(RingListener { listener, advertised })
    }

    /// Joins the ring as `rank` of `addresses.len()`, connecting to rank + 1 and accepting
    /// rank - 1 (mod world size).
    ///
    /// `addresses` holds every rank's [`RingListener::address`] in rank order, the same on every
    /// rank. `job_token` is a secret shared by this job's ranks: it is proven with a MAC, never
    /// sent, and a rank with another token is refused. `timeout` bounds the whole rendezvous,
    /// then how long a collective waits on a peer that makes no progress (see
    /// [`TcpCollective::set_timeout`]).
    ///
    /// The arguments, and `SILVIC_ALLREDUCE` (see [`ConnectOptions`]), are checked before any
    /// socket is opened. A world of one opens no sockets.
    pub fn connect(
        listener: RingListener,
        rank: usize,
        addresses: &[String],
        job_token: &str,
        timeout: Duration,
    ) -> Result<TcpCollective, ConnectError> {
        let options = ConnectOptions::default();
        Self::connect_with_options(listener, rank, addresses, job_token, timeout, &options)
    }

    /// [`TcpCollective::connect`] with `options`: the allreduce path from
    /// [`ConnectOptions::allreduce`] where it forces one, else from `SILVIC_ALLREDUCE`.
    ///
    /// Every rank must take the same path: the ranks agree on it once the ring forms, and where
    /// any differs, every rank fails with [`ConnectError::Disagreement`] naming those that
    /// differ. A `SILVIC_ALLREDUCE` that names no path fails before any socket is opened.
    pub fn connect_with_options(
        listener: RingListener,
        rank: usize,
        addresses: &[String],
        job_token: &str,
        timeout: Duration,
        options: &ConnectOptions,
    ) -> Result<TcpCollective, ConnectError> {
        let settings = options::resolve_all(options, crate::variables::process_var)?;
        let chords = Chords::Auto;
        TcpCollective::connect_with(listener, rank, addresses, job_token, timeout, chords, settings)
    }

    /// [`TcpCollective::connect`], forming chord streams as `chords` says and taking the
    /// allreduce path and channels of `settings` (all the same on every rank), whatever the
    /// environment says.
    pub(crate) fn connect_with(
        listener: RingListener,
        rank: usize,
        addresses: &[String],
        job_token: &str,
        timeout: Duration,
        chords: Chords,
        settings: Settings,
    ) -> Result<TcpCollective, ConnectError> {
        let world = addresses.len();
        if world == 0 {
            return Err(invalid("the address list is empty".into()));
        }
        if rank >= world {
            return Err(invalid(format!("rank {rank} is out of range for {world} addresses")));
        }
        if u32::try_from(world).is_err() {
            return Err(invalid(format!("a world of {world} ranks is too large")));
        }
        if job_token.is_empty() {
            return Err(invalid("the job token is empty".into()));
        }
        if timeout.is_zero() {
            return Err(invalid("the timeout is zero".into()));
        }
        let parsed = parse_addresses(addresses)?;
        if parsed[rank] != listener.advertised {
            let own = listener.advertised;
            let why = match parsed.iter().position(|a| *a == own) {
                Some(other) => format!(
                    "the list gives this listener's address to rank {other}: was rank {rank} \
                     given to two processes (or the addresses not gathered in rank order)?"
                ),
                None => "this listener's address is not in the list: gather the addresses of \
                         these listeners, in rank order"
                    .to_string(),
            };
            return Err(invalid(format!(
                "the address of rank {rank} is {}, but this rank's listener advertises {own}; \
                 {why}",
                parsed[rank]
            )));
        }
        let mut collective = TcpCollective {
            rank,
            world,
            seq: 0,
            timeout,
            ring: None,
            crew: None,
            failed: None,
            scratch: Scratch::default(),
            done: 0,
            watch: RingWatch::default(),
        };
        if world == 1 {
            return Ok(collective);
        }

        let _span = info_span!("connect", rank, world).entered();
        let started = Instant::now();
        let cores = probe::usable_cores(rank, &parsed);
        let place = (rank, parsed, addresses);
        let (mut ring, listener) = form(listener, place.clone(), job_token, timeout, chords)?;
        let scratch = &mut collective.scratch;
        // The probes and the channels share the rendezvous's timeout: `connect` returns by its
        // deadline.
        let deadline = crate::wait::deadline_after(started, timeout);
        let by = (timeout, deadline);
        collective.failed =
            probe::settle(&mut ring, (rank, settings, cores), scratch, addresses, by)?;
        let channels = ring.agreed().1.spread.most();
        if collective.failed.is_none() && channels > 1 {
            let left = deadline.saturating_duration_since(Instant::now());
            let crew = form_channels(&listener, place, (job_token, left), &mut ring, channels)?;
            collective.crew = Some(crew);
        }
        drop(listener);
        collective.ring = Some(ring);
        Ok(collective)
    }

    /// Sets how long later collectives wait on a peer that makes no progress.
    ///
    /// This bounds inactivity, not the whole call: a collective fails when the peer it waits on
    /// has sent or taken no byte for this long, so a large buffer on a slow link never times out
    /// while it moves. A zero timeout is taken as one millisecond, and `Duration::MAX` waits
    /// without end. A host that vanishes is found sooner, by TCP itself, within about
    /// [`LIVENESS`](crate::LIVENESS).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.max(Duration::from_millis(1));
        if let Some(ring) = &mut self.ring {
            ring.set_timeout(self.timeout);
        }
        if let Some(crew) = &mut self.crew {
            crew.set_timeout(self.timeout);
        }
    }

    /// The current collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What this rank's ring has done since connect: collectives, bytes, and the time spent
    /// waiting on each neighbour (see [`RingStats`]). A world of one counts its collectives and
    /// nothing else.
    ///
    /// ```
    /// use silvic_net::{Collective, TcpCollective};
    /// use std::time::Duration;
    ///
    /// let listener = TcpCollective::bind("127.0.0.1")?;
    /// let addresses = vec![listener.address()];
    /// let timeout = Duration::from_secs(5);
    /// let mut ring = TcpCollective::connect(listener, 0, &addresses, "job-1", timeout)?;
    /// ring.allgather_bytes(b"x")?;
    /// assert_eq!(ring.stats().collectives, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// On a ring of several channels ([`ConnectOptions::channels`]) the bytes and waits are
    /// summed over every channel; [`TcpCollective::channel_stats`] has them per channel.
    pub fn stats(&self) -> RingStats {
        let mut stats = RingStats::default();
        for channel in self.channel_stats() {
            stats.bytes_sent += channel.bytes_sent;
            stats.bytes_received += channel.bytes_received;
            stats.waited_left += channel.waited_left;
            stats.waited_right += channel.waited_right;
        }
        stats.collectives = self.done;
        stats
    }

    /// What this rank has done on each channel since connect, channel 0 (the ring's own
    /// streams, and every call the choice does not split) first: bytes and waits as
    /// [`TcpCollective::stats`] counts them, and the collectives of every channel alike. One
    /// entry per channel; empty in a world of one.
    pub fn channel_stats(&self) -> Vec<RingStats> {
        let first = self.ring.as_ref().map(TcpRing::stats);
        let rest = self.crew.iter().flat_map(Crew::stats);
        let counted = |stats| RingStats { collectives: self.done, ..stats };
        first.into_iter().chain(rest).map(counted).collect()
    }

    /// What this rank has done on each of its streams since connect, one [`PeerStats`] per
    /// stream: the left neighbour's, the right one's, then the chords', then each further
    /// channel's streams ([`PeerStats::channel`]). Empty in a world of one.
    pub fn peer_stats(&self) -> Vec<PeerStats> {
        let first = self.ring.as_ref().map(TcpRing::peer_stats).unwrap_or_default();
        first.into_iter().chain(self.crew.iter().flat_map(Crew::peer_stats)).collect()
    }

    /// A handle that shows, from any thread and while a collective runs, which collective this
    /// rank is in, since when, and how many it has begun and finished (see [`RingWatch`]): what
    /// a hang detector compares across ranks to name the rank the others wait on.
    ///
    /// ```
    /// use silvic_net::{Collective, TcpCollective};
    /// use std::time::Duration;
    ///
    /// let listener = TcpCollective::bind("127.0.0.1")?;
    /// let addresses = vec![listener.address()];
    /// let mut ring = TcpCollective::connect(listener, 0, &addresses, "job-1", Duration::from_secs(5))?;
    /// let watch = ring.watch(); // Send + Sync: hand it to a watchdog thread
    /// ring.allgather_bytes(b"x")?;
    /// let progress = watch.progress();
    /// assert_eq!((progress.entered, progress.completed, progress.current), (1, 1, None));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn watch(&self) -> RingWatch {
        self.watch.clone()
    }

    /// Answers one collective in a world of one (`local`, no I/O), counting it and showing it
    /// on the watch as [`TcpCollective::run`] does for a ring.
    pub(crate) fn alone<R>(
        &mut self,
        op: Op,
        local: impl FnOnce() -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.watch.begin(op, Instant::now());
        let result = local();
        self.done += u64::from(result.is_ok());
        self.watch.end(result.is_ok(), Instant::now());
        result
    }

    /// Runs one collective on the ring's first channel (see [`TcpCollective::run_on_channels`]).
    pub(crate) fn run<R>(
        &mut self,
        op: Op,
        bytes: usize,
        body: impl FnOnce(&mut TcpRing, u64, &mut Scratch) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.run_on_channels(op, bytes, |rank, seq| body(rank.ring, seq, rank.scratch))
    }

    /// Runs one collective on the ring, over its channels where it has several, recording a
    /// failure so that it sticks (every channel's streams aborted), and showing the call on the
    /// watch from start to return.
    pub(crate) fn run_on_channels<R>(
        &mut self,
        op: Op,
        bytes: usize,
        body: impl FnOnce(OnChannels<'_>, u64) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.watch.begin(op, Instant::now());
        if let Some(error) = &self.failed {
            self.watch.end(false, Instant::now());
            return Err(error.clone());
        }
        let seq = self.seq;
        self.seq += 1;
        let _span = tracing::debug_span!(
            "collective",
            op = op.name(),
            seq,
            bytes,
            rank = self.rank,
            world = self.world
        )
        .entered();
        let ring = self.ring.as_mut().expect("a world of more than one has a ring");
        let rank = self.rank;
        let on = OnChannels { ring, crew: self.crew.as_mut(), scratch: &mut self.scratch };
        let result = body(on, seq).map_err(|error| {
            warn!(%error, "collective failed; closing the ring");
            // The neighbours hear what happened as this rank heard it, on every channel; the
            // caller gets this rank's own view of it, which never names this rank as its peer.
            if let Some(crew) = &mut self.crew {
                crew.abort(rank, &error, seq);
            }
            if let Some(ring) = &mut self.ring {
                ring.abort(rank, &error, seq);
            }
            as_seen_by(rank, error)
        });
        if let Err(error) = &result {
            self.failed = Some(error.clone());
        }
        self.done += u64::from(result.is_ok());
        self.watch.end(result.is_ok(), Instant::now());
        result
    }

    fn reduce_elements<T: Element>(
        &mut self,
        op: Op,
        buf: &mut [T],
        combine: impl Fn(T, T) -> T + Copy + Send + Sync,
    ) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return self.alone(op, || Ok(()));
        }
        let (rank, world) = (self.rank, self.world);
        self.run_on_channels(op, size_of_val(buf), |mut on, seq| {
            on.reduce(Call { rank, world, op, seq }, buf, combine)
        })
    }
}

/// Forms the ring of `rank` (with every rank's `addresses`, parsed and as given) through
/// `listener`: the rendezvous of its topology (chord streams as `chords` says), each stream
/// configured for liveness, the link over them. The probes are `connect`'s next step.
fn form(
    listener: RingListener,
    (rank, parsed, addresses): (usize, Vec<SocketAddr>, &[String]),
    job_token: &str,
    timeout: Duration,
    chords: Chords,
) -> Result<(TcpRing, TcpListener), ConnectError> {
    let world = parsed.len();
    let started = Instant::now();
    let topology = topology(rank, world, chords);
    let dials: Vec<usize> = topology.dials.iter().map(|p| p.rank).collect();
    let accepts: Vec<usize> = topology.accepts.iter().map(|p| p.rank).collect();
    let plan = Plan {
        rank,
        world,
        addresses: &parsed,
        token: job_token.as_bytes(),
        timeout,
        roster: crate::handshake::roster_digest(&parsed),
        dials: &dials,
        accepts: &accepts,
        channels: 0..1,
    };
    let formed = rendezvous(&listener.listener, &plan)?;
    let mut by_route: Vec<(Route, TcpStream)> = Vec::new();
    let dialed = topology.dials.iter().zip(formed.dialed);
    for (peer, stream) in topology.accepts.iter().zip(formed.accepted).chain(dialed) {
        liveness::configure(&stream)
            .map_err(|e| ConnectError::io(peer.rank, addresses[peer.rank].clone(), &e))?;
        by_route.push((peer.route, stream));
    }
    info!(elapsed = ?started.elapsed(), streams = by_route.len(), "ring formed");
    let place = RingPlace { rank, addresses: parsed };
    // The link takes its streams in the topology's order (the left neighbour's, the right
    // one's, then the chords), each named by the route to the rank at its other end.
    let streams = topology
        .streams()
        .map(|peer| {
            let at = by_route.iter().position(|(route, _)| *route == peer.route);
            by_route.swap_remove(at.expect("a stream per route"))
        })
        .collect();
    Ok((TcpRing::new(streams, place, timeout), listener.listener))
}

/// Forms channels 1 to `channels - 1` of the ring of `rank` through `listener`, within
/// `left` (what is left of `connect`'s timeout): one stream to the right neighbour and one
/// from the left per channel, each handshaken naming its channel, each configured for liveness;
/// a link over each channel's two streams that takes what `first` (channel 0's) agreed on, and
/// the crew that drives them. `first` wakes on the crew's waker from now on.
fn form_channels(
    listener: &TcpListener,
    (rank, parsed, addresses): (usize, Vec<SocketAddr>, &[String]),
    (job_token, left): (&str, Duration),
    first: &mut TcpRing,
    channels: usize,
) -> Result<Crew, ConnectError> {
    let world = parsed.len();
    let (right, left_rank) = ((rank + 1) % world, (rank + world - 1) % world);
    let last = u16::try_from(channels).expect("at most MAX_CHANNELS channels");
    let plan = Plan {
        rank,
        world,
        addresses: &parsed,
        token: job_token.as_bytes(),
        timeout: left.max(Duration::from_millis(1)),
        roster: crate::handshake::roster_digest(&parsed),
        dials: &[right],
        accepts: &[left_rank],
        channels: 1..last,
    };
    let formed = rendezvous(listener, &plan)?;
    let (network, forced) = first.agreed();
    let timeout = first.timeout();
    let mut rings = Vec::with_capacity(channels - 1);
    for (to_right, from_left) in formed.dialed.into_iter().zip(formed.accepted) {
        for (peer, stream) in [(left_rank, &from_left), (right, &to_right)] {
            liveness::configure(stream)
                .map_err(|e| ConnectError::io(peer, addresses[peer].clone(), &e))?;
        }
        let streams = vec![(Route::LEFTWARD, from_left), (Route::RIGHTWARD, to_right)];
        let place = RingPlace { rank, addresses: parsed.clone() };
        let mut ring = TcpRing::new(streams, place, timeout);
        ring.measured(network, forced);
        rings.push(ring);
    }
    let io = |e: std::io::Error| ConnectError::io(rank, addresses[rank].clone(), &e);
    let waker = std::sync::Arc::new(Waker::new().map_err(io)?);
    first.wake_on(waker.clone());
    info!(channels, "channels formed");
    Crew::new(rank, rings, waker).map_err(io)
}

/// On an error the buffer's contents are unspecified (partly reduced); the ring is closed.
impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn allreduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
        self.reduce_elements(Op::AllreduceSumF64, buf, fold::sum_f64)
    }

    fn allreduce_sum_i64(&mut self, buf: &mut [i64]) -> Result<(), CollectiveError> {
        self.reduce_elements(Op::AllreduceSumI64, buf, fold::sum_i64)
    }

    fn allreduce_max_f64(&mut self, buf: &mut [f64]) -> Result<(), CollectiveError> {
        self.reduce_elements(Op::AllreduceMaxF64, buf, fold::max_f64)
    }

    fn allgather_bytes(&mut self, local: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        if self.world == 1 {
            return self.alone(Op::AllgatherBytes, || Ok(vec![local.to_vec()]));
        }
        let (rank, world) = (self.rank, self.world);
        self.run(Op::AllgatherBytes, local.len(), |ring, seq, _| {
            let mut blocks = vec![Vec::new(); world];
            blocks[rank] = local.to_vec();
            let call = Call { rank, world, op: Op::AllgatherBytes, seq };
            crate::ring::allgather(ring, call, local.len() as u64, &mut blocks)?;
            Ok(blocks)
        })
    }
}

#[cfg(test)]
#[path = "chord_tests.rs"]
mod chord_tests;

#[cfg(test)]
#[path = "connect_tests.rs"]
mod connect_tests;

#[cfg(test)]
#[path = "channel_failure_tests.rs"]
mod channel_failure_tests;

#[cfg(test)]
#[path = "forced_tests.rs"]
mod forced_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn relayed(origin: usize, cause: CollectiveError) -> CollectiveError {
        CollectiveError::Aborted { origin, cause: Box::new(cause) }
    }

    #[test]
    fn a_relayed_error_naming_this_rank_names_the_origin_instead() {
        let mismatch = CollectiveError::LengthMismatch { peer: 2, expected: 8, got: 16 };
        assert_eq!(
            as_seen_by(2, relayed(0, mismatch.clone())),
            CollectiveError::LengthMismatch { peer: 0, expected: 16, got: 8 }
        );
        let step = CollectiveError::OutOfStep {
            peer: 2,
            expected_op: Op::AllreduceSumF64,
            expected_seq: 4,
            got_op: Op::AllgatherBytes,
            got_seq: 5,
        };
        assert_eq!(
            as_seen_by(2, relayed(1, step)),
            CollectiveError::OutOfStep {
                peer: 1,
                expected_op: Op::AllgatherBytes,
                expected_seq: 5,
                got_op: Op::AllreduceSumF64,
                got_seq: 4,
            }
        );
        let refused =
            CollectiveError::MalformedFrame { peer: 2, reason: "of the ring path".into() };
        assert_eq!(
            as_seen_by(2, relayed(1, refused)),
            CollectiveError::MalformedFrame {
                peer: 1,
                reason: "rank 1 refused a frame of this rank: of the ring path".into()
            }
        );
        let timeout = CollectiveError::Timeout { peer: 2, waited: Duration::from_secs(3) };
        assert_eq!(as_seen_by(2, relayed(1, timeout)), CollectiveError::PeerClosed { peer: 1 });
        // Anything that names another rank is kept as it is.
        for kept in
            [relayed(0, mismatch.clone()), mismatch, CollectiveError::PeerClosed { peer: 1 }]
        {
            assert_eq!(as_seen_by(3, kept.clone()), kept);
        }
    }
}
