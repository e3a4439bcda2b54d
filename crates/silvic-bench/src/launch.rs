//! Starting the ranks: as processes of this program (the default), as threads, as one rank of
//! a multi-host run, or one per host of a network of namespaces. A multi-host run meets in a
//! shared folder (silvic-net's [`folder`] rendezvous, as `TcpCollective::from_env` uses with
//! `SILVIC_RENDEZVOUS=file:///PATH`) or at rank 0's address exchange (`tcp://HOST:PORT`,
//! through `TcpCollective::from_vars`: the exchange is silvic-net's, not written again here).
//!
//! The default mode is a launcher like any other: it makes a fresh rendezvous folder, starts
//! `world` copies of this program as `--rank R --rendezvous DIR`, and waits for them. So the
//! path every rank takes is the multi-host one, and a single-host run tests it. The namespace
//! mode is the same launcher, each copy started inside its own host
//! ([`silvic_testbed::net::Net::bridge`], removed again when the run ends).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use silvic_core::Collective;
use silvic_net::launch::folder;
use silvic_net::{AllreducePath, ConnectOptions, RingListener, TcpCollective};

use silvic_testbed::net::{Net, host_ip};
use silvic_testbed::relay::{Link, Relay};

use crate::cli::{Channels, Config, Format, Mode, Rendezvous, TOKEN_VAR};
use crate::failure::Failure;
use crate::link_limit;
use crate::sweep::sweep;

/// How long the launcher lets the other ranks end by themselves after one failed.
const GRACE: Duration = Duration::from_secs(5);

/// Runs `config` and returns the number of wrong elements seen.
pub(crate) fn run(config: &Config) -> Result<u64, Failure> {
    match &config.mode {
        Mode::Launch => launch(config),
        Mode::Threads => threads(config),
        Mode::Rank { rank, rendezvous: Rendezvous::Folder(dir), token } => {
            one_rank(config, *rank, dir, &token.0)
        }
        Mode::Rank { rank, rendezvous: Rendezvous::Tcp(url), token } => {
            one_rank_by_exchange(config, *rank, url, &token.0)
        }
        Mode::Netns => netns(config),
        Mode::Simulate(simulation) => crate::simulated::run(config, simulation),
    }
}

/// What a rank does once its ring is formed: the sweep, or the link limit.
fn body(
    ring: &mut TcpCollective,
    config: &Config,
    host: &str,
    preamble: &str,
    rss_per: &str,
) -> Result<u64, Failure> {
    if config.link_limit {
        link_limit::measure(ring, config, host, preamble)
    } else {
        Ok(sweep(ring, config, preamble, rss_per)?)
    }
}

fn describe(config: &Config, how: &str, host: &str) -> String {
    if config.link_limit {
        return format!("# silvic-bench --link-limit, world {}, {how}, on {host}\n", config.world);
    }
    let forced = match config.path {
        AllreducePath::Auto => String::new(),
        path => format!(
            "# allreduce path forced to {path} (--path): a call it cannot carry takes the \
             automatic path\n"
        ),
    };
    let channels = match config.channels {
        Channels::Auto => String::new(),
        n => format!("# {n} channels forced on every call the choice splits (--channels)\n"),
    };
    format!(
        "# silvic-bench: silvic-net TCP ring, world {}, {how}, on {host}\n\
         # {} s per size, warm-up {}, results {}\n{forced}{channels}",
        config.world,
        config.seconds_per_size,
        config.warmup.map_or("20 (2 from 16 MiB)".to_string(), |w| w.to_string()),
        if config.check { "checked" } else { "not checked" },
    )
}

/// The options every rank connects with: the allreduce path of `--path`, the channels of
/// `--channels`.
fn options(config: &Config) -> ConnectOptions {
    let options = ConnectOptions::new().allreduce(config.path);
    match config.channels {
        Channels::Auto => options,
        Channels::Forced(n) => options.channels(n),
    }
}

fn bind(config: &Config, host: &str) -> Result<RingListener, Failure> {
    Ok(match &config.listen {
        Some(listen) => TcpCollective::bind_advertised(listen, host)?,
        None => TcpCollective::bind(host)?,
    })
}

/// Ranks as threads of this process, on `--host` (127.0.0.1 by default), or behind relays with
/// `--link-delay-us` or `--flow-mbit`.
fn threads(config: &Config) -> Result<u64, Failure> {
    let (listeners, _relays, how, host) = match relay_link(config) {
        Some(link) => {
            let (listeners, relays) = behind_relays(config.world, link)?;
            let how =
                format!("ranks as threads of one process, each reached through a relay {}", {
                    let mut does = Vec::new();
                    if !link.delay.is_zero() {
                        does.push(format!(
                            "that holds every chunk {} us each way",
                            link.delay.as_micros()
                        ));
                    }
                    if let Some(mbit) = config.flow_mbit {
                        does.push(format!(
                            "that carries each stream at {mbit} Mbit/s at most each way"
                        ));
                    }
                    does.join(" and ")
                });
            (listeners, relays, how, RELAYED.to_string())
        }
        None => {
            let host = config.host.clone().unwrap_or_else(|| "127.0.0.1".into());
            let listeners =
                (0..config.world).map(|_| bind(config, &host)).collect::<Result<Vec<_>, _>>()?;
            (listeners, Vec::new(), "ranks as threads of one process".to_string(), host)
        }
    };
    let addresses: Vec<String> = listeners.iter().map(RingListener::address).collect();
    let preamble = describe(config, &how, &host);
    let token = random_token();
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let (addresses, preamble, token, host) = (&addresses, &preamble, &token, &host);
                s.spawn(move || {
                    let (timeout, options) = (config.timeout, options(config));
                    let mut ring = TcpCollective::connect_with_options(
                        listener, rank, addresses, token, timeout, &options,
                    )
                    .map_err(|e| format!("rank {rank}: {e}"))?;
                    body(&mut ring, config, host, preamble, "(MiB/proc)")
                        .map_err(|e| format!("rank {rank}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut wrong = 0;
    for result in results {
        wrong = wrong.max(result?);
    }
    Ok(wrong)
}

/// What the relays between the ranks do, if `--link-delay-us` or `--flow-mbit` asks for them.
fn relay_link(config: &Config) -> Option<Link> {
    if config.link_delay.is_none() && config.flow_mbit.is_none() {
        return None;
    }
    Some(Link {
        delay: config.link_delay.unwrap_or_default(),
        rate: config.flow_mbit.map(|mbit| mbit * 1_000_000 / 8),
        ..Link::default()
    })
}

/// Where `--link-delay-us` and `--flow-mbit` reach the ranks: their relays listen here, the ranks on 127.0.0.1.
const RELAYED: &str = "127.0.0.2";

/// `world` listeners on 127.0.0.1, each advertised on [`RELAYED`] at the same port, where a relay
/// of `link` forwards to it; and the relays, which must outlive the run.
fn behind_relays(world: usize, link: Link) -> Result<(Vec<RingListener>, Vec<Relay>), Failure> {
    let (mut listeners, mut relays) = (Vec::new(), Vec::new());
    // A port free on 127.0.0.1 may be taken on 127.0.0.2: try another, a bounded number of times.
    let mut tries = 0;
    while listeners.len() < world {
        let listener = TcpCollective::bind_advertised("127.0.0.1", RELAYED)?;
        let address: SocketAddr = listener.address().parse().map_err(|e| format!("{e}"))?;
        let target = SocketAddr::from(([127, 0, 0, 1], address.port()));
        match Relay::start(address, target, link) {
            Ok(relay) => {
                listeners.push(listener);
                relays.push(relay);
            }
            Err(_) if tries < 50 => tries += 1,
            Err(e) => return Err(format!("cannot start a relay on {address}: {e}").into()),
        }
    }
    Ok((listeners, relays))
}

/// This host's address for multi-host mode: the first non-loopback address of its name.
fn host_address() -> Result<String, Failure> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("cannot read this host's name ({e}); pass --host"))?;
    let name = name.trim();
    let ips: Vec<IpAddr> =
        (name, 0).to_socket_addrs().map(|a| a.map(|s| s.ip()).collect()).unwrap_or_default();
    ips.iter().find(|ip| !ip.is_loopback()).map(IpAddr::to_string).ok_or_else(|| {
        format!("host name {name:?} has no non-loopback address; pass --host").into()
    })
}

/// One rank of a run whose ranks meet in `dir`, made if missing (as `from_env` does).
fn one_rank(config: &Config, rank: usize, dir: &Path, token: &str) -> Result<u64, Failure> {
    let host = match &config.host {
        Some(host) => host.clone(),
        None => host_address()?,
    };
    let listener = bind(config, &host)?;
    let folder = folder::Folder::open(dir)?;
    folder.publish(rank, config.world, &listener.address(), token.as_bytes())?;
    let addresses = folder.gather(config.world, token.as_bytes(), config.timeout)?;
    let (timeout, options) = (config.timeout, options(config));
    let mut ring =
        TcpCollective::connect_with_options(listener, rank, &addresses, token, timeout, &options)
            .map_err(|e| format!("rank {rank}: {e}"))?;
    // Every rank has read every file once all have joined the ring; only then may they go.
    ring.allreduce_sum_f64(&mut [0.0]).map_err(|e| format!("rank {rank}: {e}"))?;
    folder.withdraw(rank);
    let preamble = describe(config, "one process per rank", &host);
    body(&mut ring, config, &host, &preamble, "(MiB/rank)")
        .map_err(|e| format!("rank {rank}: {e}").into())
}

/// One rank of a run whose ranks meet at rank 0's address exchange on `url` (tcp://HOST:PORT):
/// `from_env`'s start, with the rank, world and token from the flags. SILVIC_SOCKET_IFNAME,
/// SILVIC_PORTS and SILVIC_ALLREDUCE, if set, choose the ring's interface, ports and allreduce
/// path as for `from_env` (`--path` wins over the last).
fn one_rank_by_exchange(
    config: &Config,
    rank: usize,
    url: &str,
    token: &str,
) -> Result<u64, Failure> {
    let vars = |name: &str| match name {
        "SILVIC_RANK" => Some(rank.to_string()),
        "SILVIC_WORLD_SIZE" => Some(config.world.to_string()),
        "SILVIC_RENDEZVOUS" => Some(url.to_string()),
        "SILVIC_JOB_TOKEN" => Some(token.to_string()),
        "SILVIC_SOCKET_IFNAME" | "SILVIC_PORTS" | "SILVIC_ALLREDUCE" | "SILVIC_CHANNELS" => {
            std::env::var(name).ok()
        }
        _ => None,
    };
    let mut ring = TcpCollective::from_vars_with_options(vars, config.timeout, &options(config))
        .map_err(|e| format!("rank {rank}: {e}"))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "this host".to_string(), |name| name.trim().to_string());
    let preamble = describe(config, &format!("one process per rank, meeting at {url}"), &host);
    body(&mut ring, config, &host, &preamble, "(MiB/rank)")
        .map_err(|e| format!("rank {rank}: {e}").into())
}

fn random_token() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// Removes the rendezvous folder however the launcher leaves.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `world` copies of this program as the ranks, on 127.0.0.1 unless `--host` says
/// otherwise, and waits for them. Rank 0 prints; every rank's errors reach stderr.
fn launch(config: &Config) -> Result<u64, Failure> {
    let host = config.host.clone().unwrap_or_else(|| "127.0.0.1".into());
    start_ranks(config, |exe, _| Command::new(exe), |_| host.clone())
}

/// Builds `world` namespace hosts on a bridge (shaped to `--link-mbit` if given), starts one
/// rank in each, waits for them and removes the hosts.
fn netns(config: &Config) -> Result<u64, Failure> {
    silvic_testbed::net::available().map_err(|why| format!("--netns-hosts: {why}"))?;
    let net = Net::bridge("bench", config.world)?;
    for h in 0..config.world {
        if let Some(mbit) = config.link_mbit {
            net.shape(h, mbit)?;
        }
    }
    if config.format == Format::Table {
        let shaped = config
            .link_mbit
            .map_or("not shaped".to_string(), |m| format!("shaped to {m} Mbit/s (tc tbf)"));
        println!(
            "# {} network-namespace hosts on a bridge, each host's egress {shaped}",
            config.world
        );
    }
    start_ranks(
        config,
        |exe, rank| {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", &net.hosts[rank]]).arg(exe);
            command
        },
        host_ip,
    )
}

/// Starts the ranks, rank `r` as `command(this program, r)` advertising `host(r)`, meeting in
/// a fresh rendezvous folder, and waits for them.
fn start_ranks(
    config: &Config,
    command: impl Fn(&Path, usize) -> Command,
    host: impl Fn(usize) -> String,
) -> Result<u64, Failure> {
    let token = random_token();
    let dir = TempDir(std::env::temp_dir().join(format!("silvic-bench-{token}")));
    std::fs::create_dir(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut children: Vec<Child> = Vec::with_capacity(config.world);
    for rank in 0..config.world {
        let rank_config = Config { host: Some(host(rank)), ..config.clone() };
        let spawned = command(&exe, rank)
            .args(rank_config.rank_args(rank, &dir.0))
            .env(TOKEN_VAR, &token)
            .stdin(Stdio::null())
            .stdout(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(e) => {
                stop(&mut children);
                return Err(format!("cannot start rank {rank}: {e}").into());
            }
        }
    }
    let codes = wait_all(&mut children);
    match codes.iter().enumerate().find(|(_, c)| **c != Some(0)) {
        None => Ok(0),
        // Exit code 1 from every rank and nothing else: a finished run with wrong results.
        Some(_) if codes.iter().all(|c| *c == Some(1)) => Ok(1),
        Some((rank, code)) => Err(match code {
            Some(code) => format!("rank {rank} exited with code {code}"),
            None => format!("rank {rank} was stopped (killed or crashed)"),
        }
        .into()),
    }
}

/// Waits for every child; once one fails, the others get [`GRACE`] to end (their ring breaks
/// with it) before they are stopped. Returns each exit code (`None`: killed).
fn wait_all(children: &mut [Child]) -> Vec<Option<i32>> {
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    let mut stop_at: Option<Instant> = None;
    while codes.iter().any(Option::is_none) {
        for (child, code) in children.iter_mut().zip(codes.iter_mut()).filter(|(_, c)| c.is_none())
        {
            match child.try_wait() {
                Ok(Some(status)) => {
                    *code = Some(status.code());
                    if status.code() != Some(0) && stop_at.is_none() {
                        stop_at = Some(Instant::now() + GRACE);
                    }
                }
                Ok(None) => {}
                Err(_) => *code = Some(None),
            }
        }
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            stop(children);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    codes.into_iter().flatten().collect()
}

/// Kills and reaps the children that are still running.
fn stop(children: &mut [Child]) {
    for child in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Config {
    /// The flags that make a started copy of this program run `rank` of this configuration,
    /// meeting the others in `dir` (its job token goes in [`TOKEN_VAR`]).
    pub(crate) fn rank_args(&self, rank: usize, dir: &std::path::Path) -> Vec<String> {
        let sizes: Vec<String> = self.sizes.iter().map(usize::to_string).collect();
        let mut args = vec!["--world".to_string(), self.world.to_string()];
        if !self.link_limit {
            args.extend(["--op".into(), self.op.flag().into(), "--sizes".into(), sizes.join(",")]);
        }
        if let Some(vs) = self.vs {
            args.extend(["--vs".into(), vs.name().into()]);
        }
        args.extend([
            "--seconds-per-size".into(),
            self.seconds_per_size.to_string(),
            "--timeout".into(),
            self.timeout.as_secs_f64().to_string(),
            "--rank".into(),
            rank.to_string(),
            "--rendezvous".into(),
            dir.display().to_string(),
        ]);
        if let Some(warmup) = self.warmup {
            args.extend(["--warmup".into(), warmup.to_string()]);
        }
        if self.path != AllreducePath::Auto {
            args.extend(["--path".into(), self.path.name().into()]);
        }
        if let Channels::Forced(n) = self.channels {
            args.extend(["--channels".into(), n.to_string()]);
        }
        if let Some(mbit) = self.link_mbit {
            args.extend(["--link-mbit".into(), mbit.to_string()]);
        }
        if let Some(bytes) = self.stream_bytes {
            args.extend(["--stream-bytes".into(), bytes.to_string()]);
        }
        for (flag, value) in [("--host", &self.host), ("--listen", &self.listen)] {
            if let Some(value) = value {
                args.extend([flag.to_string(), value.clone()]);
            }
        }
        for (flag, on) in [
            ("--csv", self.format == Format::Csv),
            ("--json", self.format == Format::Json),
            ("--link-limit", self.link_limit),
            ("--no-check", !self.check),
            ("--quiet", !self.progress),
            ("--cpu", self.cpu),
        ] {
            if on {
                args.push(flag.into());
            }
        }
        args
    }
}
