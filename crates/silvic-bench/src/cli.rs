//! The command line: flags, their checks, and the flags a launcher hands to each rank.
//!
//! Parsing turns [`Args`] into a checked [`Config`]; a flag that makes no sense (a rank out of
//! range, a size that is not a whole number of elements, `--rank` without `--rendezvous`) is a
//! usage error, which clap prints with the usage line and exit code 2.

use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use silvic_net::AllreducePath;

use crate::rendezvous::parse_rendezvous;
pub(crate) use crate::rendezvous::{Rendezvous, TOKEN_VAR, Token};
use crate::simulate::{SimulateArgs, Simulation};
use crate::sizes::ladder;
use crate::sizes::parse_size;
use crate::workload::Kind;

/// The most hosts `--netns-hosts` builds (their addresses are 10.231.0.1 to .99).
const MAX_NETNS_HOSTS: usize = 64;

/// The longest `--link-delay-us`: a second each way.
const MAX_LINK_DELAY_US: u64 = 1_000_000;

/// The sizes measured by default: 8 B to 64 MiB, a factor of 8 apart (as the peers' scripts).
pub(crate) const DEFAULT_MIN: usize = 8;
pub(crate) const DEFAULT_MAX: usize = 64 << 20;
const DEFAULT_FACTOR: usize = 8;

/// Measures silvic-net's ring collectives: a table of time, algbw and busbw per size, in the
/// style of nccl-tests.
///
/// With no flags: a 4-rank ring on loopback, one process per rank (this program starts itself as
/// the ranks), f64 sum from 8 B to 64 MiB. On a cluster, start one rank per host with
/// `--rank R --world N --rendezvous DIR` (DIR a folder every host sees, NFS or similar) or
/// `--rendezvous tcp://HOST:PORT` (rank 0 on HOST serves the address exchange on PORT), each
/// with the same secret in SILVIC_BENCH_TOKEN (such as `export SILVIC_BENCH_TOKEN=$(openssl
/// rand -hex 16)`). As root, `--netns-hosts N --link-mbit R` runs one rank on each of N
/// network-namespace hosts of one machine, joined by a bridge, each host's egress shaped to
/// R Mbit/s.
///
/// Environment: SILVIC_BENCH_TOKEN, the job token of a multi-host run (required with --rank;
/// the launcher modes make a random one); RUST_LOG, which of silvic-net's events reach stderr
/// (default `warn`; `silvic_net=debug` for every step).
#[derive(Debug, Parser)]
#[command(name = "silvic-bench", version)]
pub(crate) struct Args {
    /// Number of ranks [default: 4, or the number of --netns-hosts].
    #[arg(long, short = 'n')]
    world: Option<usize>,

    /// Run one rank on each of this many hosts made of network namespaces on a bridge (root;
    /// needs ip and tc). The ranks meet through a --rendezvous folder, as on a cluster.
    #[arg(long, conflicts_with_all = ["threads", "rank", "rendezvous", "host", "listen"])]
    netns_hosts: Option<usize>,

    /// The link rate in Mbit/s: adds a `link` column (busbw / link rate). With --netns-hosts,
    /// each host's egress is also shaped to this rate (tc tbf).
    #[arg(long)]
    link_mbit: Option<u64>,

    /// Measure what the links carry instead of a collective: every rank streams to its right
    /// neighbour for --seconds-per-size seconds, all at once (host i to host i + 1, as iperf3
    /// flows in the ring's pattern), and each rank's received rate is printed.
    #[arg(long, conflicts_with_all = ["op", "sizes", "min_bytes", "max_bytes", "factor", "no_check", "cpu"])]
    link_limit: bool,

    /// With --link-limit: stream out of and into buffers of this many bytes (K, M, G as in
    /// --sizes), 128 KiB at a time, as a call of that size touches its memory [default: 128K,
    /// one chunk, as iperf3 does].
    #[arg(long, requires = "link_limit", value_parser = parse_size)]
    stream_bytes: Option<usize>,

    /// The collective to measure.
    #[arg(long, value_enum, default_value_t = OpArg::SumF64)]
    op: OpArg,

    /// Time this collective too, at each size's element count (sum_i128 at 16 KiB of sum_f64
    /// is 32 KiB), in the same ring, repetition by repetition in turn with --op's, and print the
    /// median of their time ratios: a comparison that load on a shared machine moves less
    /// than runs one after the other.
    #[arg(long, value_enum, conflicts_with_all = ["link_limit", "simulate"])]
    vs: Option<OpArg>,

    /// Comma-separated sizes in bytes; K, M, G (or KiB, MiB, GiB) multiply by 1024, 1024², 1024³.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with_all = ["min_bytes", "max_bytes", "factor"])]
    sizes: Option<Vec<usize>>,

    /// Smallest size of the sweep [default: 8].
    #[arg(long, short = 'b', value_parser = parse_size)]
    min_bytes: Option<usize>,

    /// Largest size of the sweep [default: 64M].
    #[arg(long, short = 'e', value_parser = parse_size)]
    max_bytes: Option<usize>,

    /// Each size of the sweep is this many times the one before [default: 8].
    #[arg(long, short = 'f')]
    factor: Option<usize>,

    /// Roughly how long to time each size, in seconds.
    #[arg(long, default_value_t = 1.0)]
    seconds_per_size: f64,

    /// Untimed calls before each size [default: 20, and 2 from 16 MiB up].
    #[arg(long)]
    warmup: Option<u32>,

    /// Run the ranks as threads of this process instead of one process each.
    #[arg(long, conflicts_with_all = ["rank", "rendezvous"])]
    threads: bool,

    /// With --threads: reach every rank through a relay of the test bed that holds each chunk
    /// this many microseconds each way, so that a hop costs a network's latency, as across
    /// hosts (the ranks listen on 127.0.0.1 and are reached on 127.0.0.2).
    #[arg(long, requires = "threads", conflicts_with_all = ["host", "listen"])]
    link_delay_us: Option<u64>,

    /// With --threads: reach every rank through a relay of the test bed that carries each
    /// stream, each way, at this many Mbit/s at most, as a cloud NIC caps each flow (with
    /// --link-delay-us the same relays also hold each chunk).
    #[arg(long, requires = "threads", conflicts_with_all = ["host", "listen"])]
    flow_mbit: Option<u64>,

    /// The channels a large allreduce is split over: auto (what connect chooses from the
    /// cores and the network), or a count from 1 to silvic-net's MAX_CHANNELS forced on every
    /// call the choice splits, as ConnectOptions::channels and SILVIC_CHANNELS do. Each channel
    /// is a thread and a stream to each ring neighbour (on every run but --simulate).
    #[arg(long, default_value = "auto", value_parser = parse_channels)]
    channels: Channels,

    /// Run only this rank (multi-host mode; needs --rendezvous, --world and the same
    /// SILVIC_BENCH_TOKEN on every rank).
    #[arg(long, requires = "rendezvous")]
    rank: Option<usize>,

    /// Where the ranks of a multi-host run meet: a folder every rank sees (DIR or file:///DIR,
    /// created if missing; use an empty one for each run), or tcp://HOST:PORT, where rank 0 (on
    /// HOST) serves an address exchange on PORT, as silvic-net's from_env does.
    #[arg(long, requires = "rank", value_parser = parse_rendezvous)]
    rendezvous: Option<Rendezvous>,

    /// Address this rank advertises to the others [default: 127.0.0.1 on one host; the address
    /// of the host's name with a folder; not with tcp://, where the ring listens on the
    /// interface that reaches HOST, or on SILVIC_SOCKET_IFNAME].
    #[arg(long)]
    host: Option<String>,

    /// Address to listen on, when it is not the advertised one (e.g. 0.0.0.0).
    #[arg(long)]
    listen: Option<String>,

    /// Seconds a rank waits for the others to join, and on a silent peer during a collective.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,

    /// Print one CSV (world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs,op, then
    /// link with --link-mbit) instead of the table: the peers' columns first.
    #[arg(long, conflicts_with = "json")]
    csv: bool,

    /// Print one JSON object per row (JSON Lines) instead of the table.
    #[arg(long)]
    json: bool,

    /// Do not check results (the #wrong column shows "-").
    #[arg(long)]
    no_check: bool,

    /// Add a column of CPU time per call, summed over ranks: the CPU the timed repetitions took
    /// (their barriers included) over the calls they made, on each rank's calling thread and its
    /// channels' threads. What the collective costs the trainer's cores; on a busy machine,
    /// steadier than the time.
    #[arg(long)]
    cpu: bool,

    /// No progress line on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,

    #[command(flatten)]
    simulate: SimulateArgs,
}

/// The `--op` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OpArg {
    /// allreduce, f64 sum.
    #[value(name = "sum_f64")]
    SumF64,
    /// allreduce, i64 wrapping sum.
    #[value(name = "sum_i64")]
    SumI64,
    /// allreduce, f64 max (NaN wins).
    #[value(name = "max_f64")]
    MaxF64,
    /// allreduce, i128 sum (exact; the fixed-point histograms' op).
    #[value(name = "sum_i128")]
    SumI128,
    /// FixedHistogram::allreduce of a histogram of f32 gradients (a size is its bins' i128
    /// bytes).
    #[value(name = "fixed_histogram")]
    FixedHistogram,
    /// allgather of bytes.
    #[value(name = "allgather")]
    Allgather,
    /// The pinned collectives in turn: sum_f64, sum_i64, max_f64 and allgather.
    #[value(name = "all")]
    All,
}

impl OpArg {
    fn kinds(self) -> Vec<Kind> {
        match self {
            OpArg::SumF64 => vec![Kind::SumF64],
            OpArg::SumI64 => vec![Kind::SumI64],
            OpArg::MaxF64 => vec![Kind::MaxF64],
            OpArg::SumI128 => vec![Kind::SumI128],
            OpArg::FixedHistogram => vec![Kind::FixedHistogram],
            OpArg::Allgather => vec![Kind::Allgather],
            OpArg::All => vec![Kind::SumF64, Kind::SumI64, Kind::MaxF64, Kind::Allgather],
        }
    }

    pub(crate) fn flag(self) -> &'static str {
        match self {
            OpArg::SumF64 => "sum_f64",
            OpArg::SumI64 => "sum_i64",
            OpArg::MaxF64 => "max_f64",
            OpArg::SumI128 => "sum_i128",
            OpArg::FixedHistogram => "fixed_histogram",
            OpArg::Allgather => "allgather",
            OpArg::All => "all",
        }
    }
}

/// How the ranks of this run are started.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mode {
    /// Start `world` copies of this program as the ranks and wait for them.
    Launch,
    /// Run the ranks as threads of this process.
    Threads,
    /// Be one rank of a multi-host run.
    Rank {
        /// This rank.
        rank: usize,
        /// Where the ranks meet.
        rendezvous: Rendezvous,
        /// The run's job token, from [`TOKEN_VAR`].
        token: Token,
    },
    /// Build `world` namespace hosts and start one rank on each.
    Netns,
    /// Start no rank: simulate the calls in virtual time, on this network model and path.
    Simulate(Simulation),
}

/// How rank 0 prints its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The nccl-tests style table.
    Table,
    /// One CSV, the peers' columns first.
    Csv,
    /// One JSON object per line.
    Json,
}

/// A checked run description.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    pub(crate) world: usize,
    pub(crate) op: OpArg,
    pub(crate) kinds: Vec<Kind>,
    /// The collective timed in turn with `kinds`' one, at the same element count (`--vs`).
    pub(crate) vs: Option<Kind>,
    pub(crate) sizes: Vec<usize>,
    pub(crate) seconds_per_size: f64,
    pub(crate) warmup: Option<u32>,
    pub(crate) mode: Mode,
    pub(crate) host: Option<String>,
    pub(crate) listen: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) format: Format,
    /// The link rate, in Mbit/s, if known.
    pub(crate) link_mbit: Option<u64>,
    /// What a relay holds each chunk between ranks, each way (threads only).
    pub(crate) link_delay: Option<Duration>,
    /// The rate, in Mbit/s, a relay carries each stream at most, each way (threads only).
    pub(crate) flow_mbit: Option<u64>,
    /// Measure the links' limit instead of the collectives.
    pub(crate) link_limit: bool,
    /// The buffers the link limit streams through, if not one chunk.
    pub(crate) stream_bytes: Option<usize>,
    pub(crate) check: bool,
    pub(crate) progress: bool,
    pub(crate) cpu: bool,
    /// The path every allreduce of a real run is forced onto (`--path`).
    pub(crate) path: AllreducePath,
    /// The channels of every ring (`--channels`).
    pub(crate) channels: Channels,
}

/// The channels of `--channels`: chosen by connect, or forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channels {
    Auto,
    Forced(usize),
}

impl std::fmt::Display for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Channels::Auto => f.write_str("auto"),
            Channels::Forced(n) => write!(f, "{n}"),
        }
    }
}

fn parse_channels(s: &str) -> Result<Channels, String> {
    match s {
        "auto" => Ok(Channels::Auto),
        _ => match s.parse::<usize>() {
            Ok(n) if (1..=silvic_net::MAX_CHANNELS).contains(&n) => Ok(Channels::Forced(n)),
            _ => Err(format!(
                "{s:?} is not a channel count (auto, or 1 to {})",
                silvic_net::MAX_CHANNELS
            )),
        },
    }
}

impl Args {
    /// Checks the flags together, with `token` the value of [`TOKEN_VAR`] if set; the error is
    /// a clap usage error (exit code 2).
    pub(crate) fn into_config(self, token: Option<String>) -> Result<Config, clap::Error> {
        let fail = |message: String| Args::command().error(ErrorKind::ValueValidation, message);
        let world = match (self.world, self.netns_hosts) {
            (Some(w), Some(h)) if w != h => {
                return Err(fail(format!("--world {w} differs from --netns-hosts {h}")));
            }
            (w, h) => h.or(w).unwrap_or(4),
        };
        if world == 0 {
            return Err(fail("--world must be at least 1".into()));
        }
        if self.netns_hosts.is_some_and(|h| h > MAX_NETNS_HOSTS) {
            return Err(fail(format!("--netns-hosts must be at most {MAX_NETNS_HOSTS}")));
        }
        if self.link_mbit == Some(0) {
            return Err(fail("--link-mbit must be at least 1".into()));
        }
        if self.flow_mbit == Some(0) {
            return Err(fail("--flow-mbit must be at least 1".into()));
        }
        if self.stream_bytes == Some(0) {
            return Err(fail("--stream-bytes must be at least 1".into()));
        }
        if self.link_delay_us.is_some_and(|d| !(1..=MAX_LINK_DELAY_US).contains(&d)) {
            return Err(fail(format!("--link-delay-us must be from 1 to {MAX_LINK_DELAY_US}")));
        }
        let sizes = match self.sizes {
            Some(sizes) => sizes,
            None => {
                let min = self.min_bytes.unwrap_or(DEFAULT_MIN);
                let max = self.max_bytes.unwrap_or(DEFAULT_MAX.max(min));
                let factor = self.factor.unwrap_or(DEFAULT_FACTOR);
                if factor < 2 {
                    return Err(fail("--factor must be at least 2".into()));
                }
                if min == 0 || min > max {
                    return Err(fail(format!(
                        "--min-bytes ({min}) must be at least 1 and at most --max-bytes ({max})"
                    )));
                }
                ladder(min, max, factor)
            }
        };
        let kinds = self.op.kinds();
        for &size in &sizes {
            for kind in &kinds {
                if size % kind.element_bytes() != 0 || size == 0 {
                    return Err(fail(format!(
                        "size {size} is not a whole, non-zero number of {}-byte elements for {}",
                        kind.element_bytes(),
                        kind.name()
                    )));
                }
            }
        }
        let vs = match self.vs.map(OpArg::kinds).as_deref() {
            None => None,
            Some(&[vs]) if kinds.len() == 1 => Some(vs),
            Some(_) => return Err(fail("--vs and --op each name one collective, not all".into())),
        };
        if !(self.seconds_per_size.is_finite() && self.seconds_per_size > 0.0) {
            return Err(fail("--seconds-per-size must be a positive number".into()));
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0 && self.timeout < 1e9) {
            return Err(fail("--timeout must be a positive number of seconds".into()));
        }
        let simulation = self.simulate.simulation(world, &kinds, &sizes).map_err(fail)?;
        let path = self.simulate.path;
        let mode = match (self.rank, self.rendezvous, self.threads, simulation) {
            (_, _, _, Some(simulation)) => Mode::Simulate(simulation),
            (Some(rank), Some(rendezvous), _, _) => {
                if rank >= world {
                    return Err(fail(format!("--rank {rank} is out of range for --world {world}")));
                }
                let Some(token) = token.filter(|t| !t.is_empty()) else {
                    return Err(fail(format!(
                        "--rank needs {TOKEN_VAR}: every rank of a multi-host run needs the same \
                         secret job token, such as `export {TOKEN_VAR}=$(openssl rand -hex 16)`"
                    )));
                };
                if matches!(rendezvous, Rendezvous::Tcp(_)) {
                    if self.host.is_some() || self.listen.is_some() {
                        return Err(fail(format!(
                            "--host and --listen do not apply to --rendezvous {rendezvous}: the \
                             ring listens on the interface that reaches its host, or on \
                             SILVIC_SOCKET_IFNAME"
                        )));
                    }
                    if self.link_limit {
                        return Err(fail(
                            "--link-limit needs a folder --rendezvous (and --host), not tcp://"
                                .into(),
                        ));
                    }
                }
                Mode::Rank { rank, rendezvous, token: Token(token) }
            }
            _ if self.netns_hosts.is_some() => Mode::Netns,
            (_, _, true, _) => Mode::Threads,
            _ => Mode::Launch,
        };
        let format = match (self.csv, self.json) {
            (true, _) => Format::Csv,
            (_, true) => Format::Json,
            _ => Format::Table,
        };
        Ok(Config {
            world,
            op: self.op,
            kinds,
            vs,
            sizes,
            seconds_per_size: self.seconds_per_size,
            warmup: self.warmup,
            mode,
            host: self.host,
            listen: self.listen,
            timeout: Duration::from_secs_f64(self.timeout),
            format,
            link_mbit: self.link_mbit,
            link_delay: self.link_delay_us.map(Duration::from_micros),
            flow_mbit: self.flow_mbit,
            link_limit: self.link_limit,
            stream_bytes: self.stream_bytes,
            check: !self.no_check,
            progress: !self.quiet,
            cpu: self.cpu,
            path,
            channels: self.channels,
        })
    }
}

/// Parses and checks `argv` (program name first), with the job token from [`TOKEN_VAR`].
pub(crate) fn parse<I, T>(argv: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Args::try_parse_from(argv)?.into_config(std::env::var(TOKEN_VAR).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<Config, clap::Error> {
        config_with_token(args, Some("bench-test-token"))
    }

    fn config_with_token(args: &[&str], token: Option<&str>) -> Result<Config, clap::Error> {
        let argv = std::iter::once("silvic-bench").chain(args.iter().copied());
        Args::try_parse_from(argv)?.into_config(token.map(str::to_string))
    }

    fn child(argv: Vec<String>) -> Config {
        let argv = std::iter::once("silvic-bench".to_string()).chain(argv);
        Args::try_parse_from(argv).unwrap().into_config(Some("bench-test-token".into())).unwrap()
    }

    #[test]
    fn no_flags_is_the_default_sweep_of_four_processes() {
        let c = config(&[]).unwrap();
        assert_eq!(c.world, 4);
        assert_eq!(c.mode, Mode::Launch);
        assert_eq!(c.kinds, vec![Kind::SumF64]);
        assert_eq!(c.sizes, [8, 64, 512, 4096, 32768, 262144, 2097152, 16777216, 67108864]);
        assert!(c.check && c.progress && c.format == Format::Table);
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("8B"), Ok(8));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        let c = config(&["--sizes", "8,4K,2M"]).unwrap();
        assert_eq!(c.sizes, [8, 4096, 2 << 20]);
    }

    #[test]
    fn min_max_and_factor_make_a_ladder() {
        let c = config(&["--min-bytes", "1K", "--max-bytes", "1M", "--factor", "4"]).unwrap();
        assert_eq!(c.sizes, [1024, 4096, 16384, 65536, 262144, 1048576]);
        let c = config(&["-b", "1K", "-e", "3K", "-f", "2"]).unwrap();
        assert_eq!(c.sizes, [1024, 2048, 3072]);
        let c = config(&["-b", "4K", "-e", "4K"]).unwrap();
        assert_eq!(c.sizes, [4096]);
        assert_eq!(ladder(8, usize::MAX, 1 << 40).len(), 3);
    }

    #[test]
    fn bad_flags_are_usage_errors_with_exit_code_2() {
        for bad in [
            &["--world", "0"][..],
            &["--world", "four"],
            &["--op", "sum"],
            &["--sizes", "12"],
            &["--sizes", "8", "--max-bytes", "64"],
            &["--min-bytes", "1M", "--max-bytes", "1K"],
            &["--factor", "1"],
            &["--seconds-per-size", "0"],
            &["--seconds-per-size", "nan"],
            &["--timeout", "-1"],
            &["--rank", "1"],
            &["--rendezvous", "/tmp/x"],
            &["--rank", "4", "--rendezvous", "/tmp/x"],
            &["--threads", "--rank", "0", "--rendezvous", "/tmp/x"],
            &["--no-such-flag"],
            &["--netns-hosts", "3", "--world", "4"],
            &["--netns-hosts", "2", "--threads"],
            &["--netns-hosts", "2", "--rank", "0", "--rendezvous", "/tmp/x"],
            &["--netns-hosts", "65"],
            &["--netns-hosts", "0"],
            &["--link-mbit", "0"],
            &["--csv", "--json"],
            &["--link-limit", "--op", "all"],
            &["--op", "all", "--vs", "sum_i128"],
            &["--vs", "all"],
            &["--vs", "sum_i128", "--simulate"],
            &["--vs", "sum_i128", "--link-limit"],
        ] {
            let e = config(bad).expect_err(&format!("{bad:?} should be refused"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn netns_hosts_set_the_world_and_the_mode() {
        let c = config(&["--netns-hosts", "3", "--link-mbit", "1000", "--json"]).unwrap();
        assert_eq!((c.world, c.mode.clone(), c.link_mbit), (3, Mode::Netns, Some(1000)));
        assert_eq!(c.format, Format::Json);
        assert_eq!(config(&["--netns-hosts", "3", "--world", "3"]).unwrap().world, 3);
    }

    #[test]
    fn link_limit_ranks_get_the_same_run() {
        let c = config(&["--world", "2", "--link-limit", "--link-mbit", "10000", "--csv"]).unwrap();
        let dir = std::path::Path::new("/tmp/meet");
        let child = child(c.rank_args(1, dir));
        assert_eq!(Config { mode: Mode::Launch, ..child }, c);
    }

    #[test]
    fn vs_names_the_collective_timed_in_turn_and_ranks_get_it() {
        let c = config(&["--vs", "sum_i128", "--sizes", "8,16K"]).unwrap();
        assert_eq!((c.kinds.clone(), c.vs), (vec![Kind::SumF64], Some(Kind::SumI128)));
        assert_eq!(config(&["--sizes", "8"]).unwrap().vs, None);
        let dir = std::path::Path::new("/tmp/meet");
        let child = child(c.rank_args(3, dir));
        assert_eq!(Config { mode: Mode::Launch, ..child }, c);
    }

    #[test]
    fn allgather_takes_any_byte_count() {
        let c = config(&["--op", "allgather", "--sizes", "1,3"]).unwrap();
        assert_eq!(c.kinds, vec![Kind::Allgather]);
        assert!(config(&["--op", "all", "--sizes", "3"]).is_err());
    }

    #[test]
    fn rank_args_describe_the_same_run_as_one_rank() {
        let c = config(&[
            "--world",
            "3",
            "--op",
            "all",
            "--sizes",
            "8,64",
            "--warmup",
            "1",
            "--csv",
            "--no-check",
            "-q",
            "--seconds-per-size",
            "0.25",
            "--host",
            "10.1.2.3",
            "--path",
            "index",
        ])
        .unwrap();
        assert_eq!(c.path, AllreducePath::Index);
        let dir = std::path::Path::new("/tmp/meet here");
        let child = child(c.rank_args(2, dir));
        let token = Token("bench-test-token".into());
        let rendezvous = Rendezvous::Folder(dir.to_path_buf());
        assert_eq!(child.mode, Mode::Rank { rank: 2, rendezvous, token });
        assert_eq!(Config { mode: Mode::Launch, ..child }, c);
    }

    #[test]
    fn a_rank_needs_the_token_and_takes_a_folder_or_tcp() {
        let rank = ["--world", "2", "--rank", "1", "--rendezvous"];
        for token in [None, Some("")] {
            let e = config_with_token(&[&rank[..], &["/tmp/x"]].concat(), token).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("--rank needs SILVIC_BENCH_TOKEN"), "{e}");
        }
        let at = |where_: &str| match config(&[&rank[..], &[where_]].concat()).unwrap().mode {
            Mode::Rank { rendezvous, .. } => rendezvous,
            other => panic!("{other:?}"),
        };
        assert_eq!(at("rel/dir"), Rendezvous::Folder("rel/dir".into()));
        assert_eq!(at("file:///srv/meet"), Rendezvous::Folder("/srv/meet".into()));
        assert_eq!(at("tcp://node-0:29400"), Rendezvous::Tcp("tcp://node-0:29400".into()));
        assert_eq!(at("tcp://[::1]:29400"), Rendezvous::Tcp("tcp://[::1]:29400".into()));
        for bad in
            ["tcp://node-0", "tcp://:29400", "tcp://node-0:0", "tcp://h:99999", "http://h:1", ""]
        {
            let e = config(&[&rank[..], &[bad]].concat()).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
        }
        for bad in [&["--host", "10.0.0.1"][..], &["--listen", "0.0.0.0"], &["--link-limit"]] {
            let e = config(&[&rank[..], &["tcp://h:1"], bad].concat()).expect_err("tcp");
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        let debug = format!("{:?}", config(&[&rank[..], &["/tmp/x"]].concat()).unwrap());
        assert!(!debug.contains("bench-test-token"), "{debug}");
    }
}
