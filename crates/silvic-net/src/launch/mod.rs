//! Launching from environment variables:
//! [`TcpCollective::from_env`](crate::TcpCollective::from_env) for Slurm, torchrun, Kubernetes,
//! mpirun or a shell script, which set variables but cannot gather addresses.
//!
//! The steps, all within the caller's timeout: read the variables (`env`), bind where they say
//! (an interface, else the address this host uses to reach the rendezvous host), learn every
//! rank's address (through rank 0's exchange, `exchange`, or a shared [`folder`]), then
//! connect the ring as [`TcpCollective::connect`](crate::TcpCollective::connect) does.
//!
//! [`folder`] is public for launchers of their own (silvic-bench's `--rendezvous DIR` uses it).
//!
//! Invariants: every error names the variable or the rank at fault; the job token never appears
//! in an error or a log line; no environment value sizes an allocation beyond a world of
//! 65,536 ranks, and no timeout overflows a deadline.
//!
//! # Threat model
//!
//! Who is trusted, and what each meeting place protects (docs/rendezvous.md says the same for
//! users, with what to do):
//!
//! - **Token holders are fully trusted.** Any process with `SILVIC_JOB_TOKEN` is a rank of the
//!   job: it can claim any rank (and so make rank 0 fail with a duplicate, or take a rank that
//!   restarted), send any address (misdirecting the ring), make other ranks blame a rank of its
//!   choosing, or hold a call open with waiting notices. Keep the token as secret as the job.
//! - **Strangers at the exchange port** (no token) cannot claim a rank, learn the address list,
//!   or learn the world size, protocol version or which ranks exist: rank 0 answers every Hello
//!   alike and judges claims only after a valid proof. Nothing they send panics rank 0 or sizes
//!   an allocation. They can cost rank 0 descriptors and handshake slots, within the lobby's
//!   caps (in all, per source, per turn), never a real rank's place unless they connect from
//!   that rank's own address or from more sources (IPv4 addresses, IPv6 /64s) than the lobby
//!   has slots: room goes by fair share, the source holding the most giving way first. Their
//!   refusals are summarised at doubling gaps, not logged one by one, so a flood cannot block
//!   rank 0 on a log nobody reads; out of descriptors, rank 0 rests rather than spins.
//! - **On the path** (no token), a peer can see the addresses, drop or delay connections, and
//!   so delay or fail the start, but not rewrite a proven rank or address into another: every
//!   field of the handshake is bound by its MACs. The address list itself travels in the clear
//!   after the proof, unauthenticated, like the ring's streams: on an untrusted network, run
//!   under WireGuard or IPsec.
//! - **The folder** is trusted as far as its permissions: every rank refuses one writable by
//!   other users or owned by another, and creates its own 0700. It is opened once (never
//!   through a symlink at its name) and used relative to what was opened and checked. Files are opened without following
//!   links or blocking, bounded in size, and carry a job identity and a MAC keyed by the token,
//!   so another job's (an earlier run's) or a forged file is ignored, never dialled. Claiming a
//!   rank is atomic (a hard link): two processes never both hold one. Anyone who can write in
//!   the folder can still delete files (delaying the start) or fill it.

mod env;
pub(crate) mod exchange;
pub mod folder;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use silvic_core::Collective;
use tracing::info;

use crate::bind::{self, BindOptions};
use crate::error::ConnectError;
use crate::options::{self, ConnectOptions, Settings};
use crate::tcp::{RingListener, TcpCollective};
use crate::topology::Chords;
use crate::variables::process_var;
use crate::wait::Backoff;
use env::{Launch, Meeting, env_error};
use folder::Folder;

// Here rather than in tcp.rs: launching builds on the ring, so this module imports `tcp` and
// `tcp` imports nothing of it.
impl TcpCollective {
    /// Forms the ring from a launcher's environment variables, for launchers (Slurm's `srun`, a
    /// Kubernetes indexed Job, torchrun, mpirun, a shell script) that start every rank with
    /// variables but cannot gather addresses.
    ///
    /// - rank and world: `SILVIC_RANK`/`SILVIC_WORLD_SIZE`, else torchrun's `RANK`/`WORLD_SIZE`,
    ///   Slurm's `SLURM_PROCID`/`SLURM_NTASKS`, OpenMPI's `OMPI_COMM_WORLD_RANK`/`_SIZE`;
    /// - `SILVIC_RENDEZVOUS=tcp://HOST:PORT`: rank 0 (on `HOST`) serves an address exchange on
    ///   `PORT`, every other rank sends it its address and gets the whole list back (the job
    ///   token proven as in the ring handshake); else `MASTER_ADDR`/`MASTER_PORT` (under
    ///   torchrun, whose own store holds `MASTER_PORT`, the port after it); or
    ///   `SILVIC_RENDEZVOUS=file:///PATH`, a folder every rank sees, one file per rank;
    /// - `SILVIC_JOB_TOKEN`: the job's secret (required);
    /// - `SILVIC_SOCKET_IFNAME` (optional): the interface to listen on and advertise; by
    ///   default the address this host uses to reach the rendezvous host;
    /// - `SILVIC_PORTS` (optional): the ring listener's port, `29500`, or range, `29500-29599`;
    /// - `SILVIC_ALLREDUCE` (optional): the allreduce path, as for `connect` ([`ConnectOptions`]).
    ///
    /// `timeout` bounds the whole start (exchange and ring), then is the collective timeout as
    /// for [`TcpCollective::connect`]. Every error names the variable or the rank at fault; two
    /// processes claiming one rank are both refused ([`ConnectError::DuplicateRank`]), while a
    /// rank that restarts before every rank has joined takes its place again.
    pub fn from_env(timeout: Duration) -> Result<TcpCollective, ConnectError> {
        TcpCollective::from_env_with_options(timeout, &ConnectOptions::default())
    }

    /// [`TcpCollective::from_env`] with `options` as [`TcpCollective::connect_with_options`]
    /// takes them.
    pub fn from_env_with_options(
        timeout: Duration,
        options: &ConnectOptions,
    ) -> Result<TcpCollective, ConnectError> {
        launch_from(process_var, timeout, options)
    }

    /// [`TcpCollective::from_env`] with the variables looked up in `vars` (a name in, its
    /// value or `None` out) instead of the process environment: for a launcher of its own
    /// that has the rank, world and rendezvous in hand (silvic-bench's `--rendezvous
    /// tcp://HOST:PORT`), since setting the process environment is unsafe in a threaded
    /// program. `vars` is asked only for the names `from_env` reads; errors name them too.
    pub fn from_vars(
        vars: impl Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> Result<TcpCollective, ConnectError> {
        Self::from_vars_with_options(vars, timeout, &ConnectOptions::default())
    }

    /// [`TcpCollective::from_vars`] with `options` as
    /// [`TcpCollective::connect_with_options`] takes them (`SILVIC_ALLREDUCE` is looked up in
    /// `vars`).
    pub fn from_vars_with_options(
        vars: impl Fn(&str) -> Option<String>,
        timeout: Duration,
        options: &ConnectOptions,
    ) -> Result<TcpCollective, ConnectError> {
        launch_from(|name| Ok(vars(name)), timeout, options)
    }
}

/// `from_env`'s steps, with the variables looked up in `vars`.
fn launch_from(
    vars: impl Fn(&str) -> Result<Option<String>, ConnectError>,
    timeout: Duration,
    options: &ConnectOptions,
) -> Result<TcpCollective, ConnectError> {
    let allreduce = options::resolve_all(options, &vars)?;
    let launch = Launch::parse(vars)?;
    for note in &launch.notes {
        tracing::warn!("from_env: {note}");
    }
    launch_ring(&launch, timeout, allreduce)
}

use crate::wait::deadline_after;

/// Resolves the rendezvous host, retrying until `deadline`: a launcher's DNS name (a
/// Kubernetes headless service) may appear only after the ranks start.
fn resolve_meeting(
    host: &str,
    port: u16,
    variable: &str,
    deadline: Instant,
) -> Result<SocketAddr, ConnectError> {
    let mut backoff = Backoff::new((Duration::from_millis(50), Duration::from_secs(1)));
    let mut warned = false;
    loop {
        let error = match (host, port).to_socket_addrs() {
            Ok(mut found) => match found.next() {
                Some(address) => return Ok(address),
                None => "no address".to_string(),
            },
            Err(e) => e.to_string(),
        };
        if !warned {
            // A typo shows at once; a name that appears later (a Kubernetes service) is
            // still waited for.
            tracing::warn!(
                "from_env: cannot resolve the rendezvous host {host:?} of {variable} ({error}); \
                 retrying until the timeout"
            );
            warned = true;
        }
        if Instant::now() >= deadline {
            return Err(env_error(
                variable,
                format!("cannot resolve the rendezvous host {host:?}: {error}"),
            ));
        }
        if crate::cancel::cancelled(None) {
            return Err(ConnectError::Cancelled);
        }
        let gap = backoff.next_gap();
        crate::cancel::sleep(gap.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// Rank 0's exchange listener: on the rendezvous host's own address, where this host has it
/// (so the exchange is reachable only where the variable says), else on every interface (a
/// name that resolves to a NAT or load balancer address). Errors name the address tried.
fn listen_for_exchange(
    meeting: SocketAddr,
    variable: &str,
) -> Result<std::net::TcpListener, ConnectError> {
    let cannot = |address: SocketAddr, e: ConnectError| {
        let why = match e {
            ConnectError::Bind { kind: std::io::ErrorKind::AddrInUse, message, .. } => format!(
                "{message}: another program (or another job's rank 0) holds port {}; choose \
                 another port in {variable}",
                address.port()
            ),
            ConnectError::Bind { message, .. } => message,
            other => other.to_string(),
        };
        env_error(variable, format!("rank 0 cannot serve the address exchange on {address}: {why}"))
    };
    match bind::listen(&meeting.to_string(), meeting) {
        Ok(listener) => Ok(listener),
        Err(ConnectError::Bind { kind: std::io::ErrorKind::AddrNotAvailable, .. }) => {
            let any: IpAddr = match meeting {
                SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
            };
            let every = SocketAddr::new(any, meeting.port());
            info!(%meeting, "the rendezvous host's address is not this host's: the exchange listens on {every}");
            bind::listen(&every.to_string(), every).map_err(|e| cannot(every, e))
        }
        Err(e) => Err(cannot(meeting, e)),
    }
}

/// The address this host uses to reach `target`: a route lookup (a UDP socket's connect sends
/// no packet).
fn route_to(target: SocketAddr, variable: &str) -> Result<IpAddr, ConnectError> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    UdpSocket::bind(local)
        .and_then(|s| s.connect(target).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .map_err(|e| {
            env_error(
                variable,
                format!(
                    "no route from this host to the rendezvous host {target} ({e}); \
                     set SILVIC_SOCKET_IFNAME to the interface to use"
                ),
            )
        })
}

/// With a folder and no interface named: the one interface that is not loopback, else loopback
/// (a single host); several are ambiguous (docker0 beside eth0), so the user must choose.
fn sole_interface_address() -> Result<IpAddr, ConnectError> {
    let interfaces = if_addrs::get_if_addrs()
        .map_err(|e| env_error("SILVIC_SOCKET_IFNAME", format!("cannot list interfaces: {e}")))?;
    let mut remote: Vec<&if_addrs::Interface> =
        interfaces.iter().filter(|i| !i.is_loopback() && i.ip().is_ipv4()).collect();
    remote.dedup_by(|a, b| a.name == b.name);
    match remote.as_slice() {
        [] => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        [one] => Ok(one.ip()),
        many => Err(env_error(
            "SILVIC_SOCKET_IFNAME",
            format!(
                "missing, and this host has several interfaces ({}); name the one the ranks \
                 reach each other on",
                many.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// Binds the ring listener where the variables say.
fn bind_ring(launch: &Launch, meeting: Option<SocketAddr>) -> Result<RingListener, ConnectError> {
    let ports = launch.ports.clone().unwrap_or(0..=0);
    let options = match (&launch.interface, meeting) {
        (Some(name), _) => BindOptions::interface(name),
        (None, Some(target)) => {
            let variable = match &launch.meeting {
                Meeting::Tcp { variable, .. } => variable,
                Meeting::Folder(_) => "SILVIC_RENDEZVOUS",
            };
            BindOptions::host(&route_to(target, variable)?.to_string())
        }
        (None, None) => BindOptions::host(&sole_interface_address()?.to_string()),
    };
    TcpCollective::bind_with(&options.ports(ports)).map_err(|e| match e {
        ConnectError::NoInterface { .. } => env_error("SILVIC_SOCKET_IFNAME", e.to_string()),
        ConnectError::PortsTaken { first, last, .. } => {
            let hint = if first == last {
                format!(
                    "; ranks that share a host need a port each: give a range, such as \
                     {first}-{}",
                    first.saturating_add(99)
                )
            } else {
                String::new()
            };
            env_error("SILVIC_PORTS", format!("{e}{hint}"))
        }
        other => other,
    })
}

fn launch_ring(
    launch: &Launch,
    timeout: Duration,
    allreduce: Settings,
) -> Result<TcpCollective, ConnectError> {
    if timeout.is_zero() {
        return Err(ConnectError::InvalidArgument("the timeout is zero".into()));
    }
    let (rank, world) = (launch.rank, launch.world);
    let token = launch.token.as_bytes();
    if world == 1 {
        let listener = TcpCollective::bind("127.0.0.1")?;
        let addresses = [listener.address()];
        let token = &launch.token;
        return TcpCollective::connect_with(
            listener,
            0,
            &addresses,
            token,
            timeout,
            Chords::Auto,
            allreduce,
        );
    }
    let started = Instant::now();
    let deadline = deadline_after(started, timeout);
    let addresses: Vec<String>;
    let listener;
    let mut folder = None;
    match &launch.meeting {
        Meeting::Tcp { host, port, variable } => {
            let meeting = resolve_meeting(host, *port, variable, deadline)?;
            // Rank 0 takes the exchange's port first, so that its ring listener (an ephemeral
            // port, or a range) cannot.
            let served =
                if rank == 0 { Some(listen_for_exchange(meeting, variable)?) } else { None };
            listener = bind_ring(launch, Some(meeting))?;
            let own: SocketAddr = listener.address().parse().expect("a listener's own address");
            let list = if let Some(served) = served {
                exchange::serve(&exchange::Serve {
                    listener: &served,
                    world,
                    own,
                    token,
                    deadline,
                    timeout,
                })?
            } else {
                exchange::join(&exchange::Join {
                    server: meeting,
                    rank,
                    world,
                    own,
                    token,
                    deadline,
                    timeout,
                })?
            };
            addresses = list.iter().map(SocketAddr::to_string).collect();
        }
        Meeting::Folder(dir) => {
            listener = bind_ring(launch, None)?;
            let opened = Folder::open(dir)?;
            opened.publish(rank, world, &listener.address(), token)?;
            let left = deadline.saturating_duration_since(Instant::now());
            addresses = match opened.gather(world, token, left) {
                Ok(list) => list,
                Err(e) => {
                    opened.withdraw(rank);
                    return Err(e);
                }
            };
            folder = Some(opened);
        }
    }
    info!(rank, world, elapsed = ?started.elapsed(), "addresses exchanged");
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let token = &launch.token;
    let connected = TcpCollective::connect_with(
        listener,
        rank,
        &addresses,
        token,
        left,
        Chords::Auto,
        allreduce,
    );
    let mut ring = match (&folder, connected) {
        (Some(folder), Err(e)) => {
            folder.withdraw(rank);
            return Err(e);
        }
        (_, connected) => connected?,
    };
    if let Some(folder) = &folder {
        leave_folder(&mut ring, folder, &addresses)?;
    }
    ring.set_timeout(timeout);
    Ok(ring)
}

/// Removes this rank's file once every rank has read the folder: after one collective, since a
/// rank that takes part in one has formed the ring, and so has read every address.
fn leave_folder(
    ring: &mut TcpCollective,
    folder: &Folder,
    addresses: &[String],
) -> Result<(), ConnectError> {
    let passed = ring.allgather_bytes(&[]);
    folder.withdraw(ring.rank());
    passed.map(drop).map_err(|e| {
        let peer = e.peer().unwrap_or(0);
        let failed =
            std::io::Error::other(format!("the ring formed but its first collective failed: {e}"));
        ConnectError::io(peer, addresses.get(peer).cloned().unwrap_or_default(), &failed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn launch(rank: usize, world: usize, meeting: Meeting) -> Launch {
        Launch {
            rank,
            world,
            rank_variables: ("SILVIC_RANK", "SILVIC_WORLD_SIZE"),
            meeting,
            token: "a-launch-test-token-0123456789".into(),
            interface: Some("lo".into()),
            ports: None,
            notes: Vec::new(),
        }
    }

    /// Starts every rank of `world` in a thread with `timeout`; returns each rank's outcome
    /// (an allgather of its rank), failing the test if any takes longer than `bound`.
    fn ring(world: usize, meeting: Meeting, timeout: Duration, bound: Duration) -> Vec<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        for rank in 0..world {
            let (tx, meeting) = (tx.clone(), meeting.clone());
            std::thread::spawn(move || {
                let outcome =
                    launch_ring(&launch(rank, world, meeting), timeout, Settings::default())
                        .map_err(|e| e.to_string())
                        .and_then(|mut ring| {
                            let all =
                                ring.allgather_bytes(&[rank as u8]).map_err(|e| e.to_string())?;
                            Ok(all.concat())
                        });
                let _ = tx.send((rank, outcome));
            });
        }
        drop(tx); // a rank that panics then ends the wait at once
        let until = Instant::now() + bound;
        let mut out = vec![Vec::new(); world];
        for _ in 0..world {
            let left = until.saturating_duration_since(Instant::now());
            let (rank, outcome) =
                rx.recv_timeout(left).expect("a rank panicked or did not return in time");
            out[rank] = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
        out
    }

    fn tcp(port: u16) -> Meeting {
        Meeting::Tcp { host: "127.0.0.1".into(), port, variable: "SILVIC_RENDEZVOUS" }
    }

    /// Finding 8: rank 0's exchange listens on the rendezvous host's address, not on every
    /// interface.
    #[test]
    fn the_exchange_listens_on_the_rendezvous_hosts_address_only() {
        let port = free_port();
        let rank0 = std::thread::spawn(move || {
            launch_ring(&launch(0, 2, tcp(port)), Duration::from_secs(3), Settings::default())
                .map(drop)
        });
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "rank 0 never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        let other = std::net::TcpStream::connect(("127.0.0.2", port)).map(drop);
        assert_eq!(other.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionRefused));
        let e = rank0.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, ConnectError::RendezvousTimeout { missing, .. } if missing == &[1]),
            "{e}"
        );
    }

    /// Finding 14: bind errors name the address and port, and say what to do.
    #[test]
    fn a_port_that_is_taken_is_named_with_what_to_do() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let e = launch_ring(&launch(0, 2, tcp(port)), Duration::from_secs(3), Settings::default())
            .map(drop)
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "SILVIC_RENDEZVOUS: rank 0 cannot serve the address exchange on 127.0.0.1:{port}"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("holds port {port}")), "{text}");
        let mut ring_on_held = launch(1, 2, tcp(free_port()));
        ring_on_held.ports = Some(port..=port);
        let e = bind_ring(&ring_on_held, None).map(drop).unwrap_err().to_string();
        assert!(e.starts_with(&format!("SILVIC_PORTS: port {port} is taken")), "{e}");
        assert!(e.contains(&format!("give a range, such as {port}-")), "{e}");
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn a_timeout_too_long_for_an_instant_forms_the_ring_as_connect_does() {
        let dir = std::env::temp_dir().join(format!("silvic-launch-max-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bound = Duration::from_secs(60);
        let folder = ring(2, Meeting::Folder(dir.clone()), Duration::MAX, bound);
        assert_eq!(folder, [vec![0, 1], vec![0, 1]]);
        let tcp = Meeting::Tcp {
            host: "127.0.0.1".into(),
            port: free_port(),
            variable: "SILVIC_RENDEZVOUS",
        };
        assert_eq!(
            ring(3, tcp, Duration::MAX, bound),
            [vec![0, 1, 2], vec![0, 1, 2], vec![0, 1, 2]]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn from_vars_reads_its_function_not_the_environment() {
        // The test process sets none of these: from_env would fail where from_vars forms a ring.
        let vars = |name: &str| match name {
            "SILVIC_RANK" => Some("0".to_string()),
            "SILVIC_WORLD_SIZE" => Some("1".into()),
            "SILVIC_RENDEZVOUS" => Some("tcp://127.0.0.1:9".into()),
            "SILVIC_JOB_TOKEN" => Some("from-vars-test-token-0123".into()),
            _ => None,
        };
        let mut ring = TcpCollective::from_vars(vars, Duration::from_secs(5)).unwrap();
        assert_eq!((ring.rank(), ring.world_size()), (0, 1));
        assert_eq!(ring.allgather_bytes(b"x").unwrap(), [b"x".to_vec()]);
        let no_token = |name: &str| if name == "SILVIC_JOB_TOKEN" { None } else { vars(name) };
        let e = TcpCollective::from_vars(no_token, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(&e, ConnectError::Environment { variable, .. } if variable == "SILVIC_JOB_TOKEN"),
            "{e}"
        );
    }
}
