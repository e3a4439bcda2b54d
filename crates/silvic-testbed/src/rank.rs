//! One rank as a process: binds, prints its address, reads every rank's, connects, runs a
//! bounded, seeded workload and reports each step on stdout.
//!
//! Arguments are `key=value` words (see [`RankArgs`]). The lines it prints:
//!
//! ```text
//! ADDR <ip:port>                          after bind; then it reads "ADDRS <a0> <a1> ..." on stdin
//! READY <stats>                           after connect
//! OK <index> <ms>                         a call returned a verified result (every `report`-th)
//! STATS <label> <stats>                   after warm-up and at the end:
//!                                         "rss_kb=.. hwm_kb=.. fds=.."
//! PEERS <label> <peer>@<offset>:<sent>:<received> ...   after each STATS line: the bytes of
//!                                         every stream (TcpCollective::peer_stats), ring and chords
//! ERR <index> <ms> peer=<p> kind=<k> <message>   a call failed (k is CollectiveError::kind); the
//! STICKY <same|differs: ...>              rank checks that the next call returns the same error,
//!                                         and exits 0
//! WRONG <index> <what>                    a result was wrong: exit 3
//! EXIT <index>                            it left on purpose (exit_after), dropping the ring
//! DONE <count> <ms>                       every call succeeded
//! CONNECT_ERR <message>                   connect failed: exit 2
//! ```

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use silvic_net::{AllreducePath, TcpCollective};

use crate::data::{Call, Kind, mixed_call, run_and_check};

/// The element counts of the "sweep" workload: empty, tiny, both sides of the 4 KiB cut
/// (512 f64), and large enough for many ring steps (an allgather takes `count % 5000` bytes).
pub const SWEEP: [usize; 11] = [0, 1, 3, 100, 511, 512, 513, 1000, 4099, 70_000, 300_000];

/// What a rank process runs.
#[derive(Debug, Clone)]
pub struct RankArgs {
    /// This rank.
    pub rank: usize,
    /// Host to listen on, such as "0.0.0.0".
    pub host: String,
    /// Address to advertise (bind_advertised's node_ip).
    pub advertise: String,
    /// Job token.
    pub token: String,
    /// Rendezvous timeout, seconds.
    pub connect_timeout: f64,
    /// Collective timeout, seconds.
    pub timeout: f64,
    /// "repeat" (the same kind and size every call), "mixed" (a seeded mix) or "sweep" (every
    /// kind in turn over [`SWEEP`]'s lengths, around every boundary of the ring's paths).
    pub workload: String,
    /// For repeat: the kind.
    pub kind: Kind,
    /// For repeat: bytes per call; for mixed: the largest size.
    pub bytes: usize,
    /// Number of calls.
    pub count: u64,
    /// Seeds the data (and the mix).
    pub seed: u64,
    /// Sleep between calls, milliseconds (the trainer's compute).
    pub gap_ms: u64,
    /// Leave (drop the ring, exit 0) instead of running call `exit_after`.
    pub exit_after: Option<u64>,
    /// Print OK for every `report`-th call.
    pub report: u64,
    /// Print STATS after this many calls.
    pub warmup: u64,
    /// Force this many channels (`ConnectOptions::channels`); else the ring chooses.
    pub channels: Option<usize>,
    /// Force this allreduce path (`ConnectOptions::allreduce`); else the ring chooses per call.
    pub path: AllreducePath,
}

impl RankArgs {
    /// Parses `key=value` words.
    pub fn parse(words: &[String]) -> Result<RankArgs, String> {
        let mut a = RankArgs {
            rank: 0,
            host: "0.0.0.0".into(),
            advertise: String::new(),
            token: "testbed-token".into(),
            connect_timeout: 30.0,
            timeout: 600.0,
            workload: "repeat".into(),
            kind: Kind::SumF64,
            bytes: 1 << 20,
            count: 10,
            seed: 1,
            gap_ms: 0,
            exit_after: None,
            report: 1,
            warmup: 0,
            channels: None,
            path: AllreducePath::Auto,
        };
        for word in words {
            let (k, v) = word.split_once('=').ok_or_else(|| format!("not key=value: {word}"))?;
            let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{k}={v}: {e}"));
            let secs = |v: &str| v.parse::<f64>().map_err(|e| format!("{k}={v}: {e}"));
            match k {
                "rank" => a.rank = num(v)? as usize,
                "host" => a.host = v.into(),
                "advertise" => a.advertise = v.into(),
                "token" => a.token = v.into(),
                "connect_timeout" => a.connect_timeout = secs(v)?,
                "timeout" => a.timeout = secs(v)?,
                "workload" => a.workload = v.into(),
                "kind" => a.kind = Kind::parse(v).ok_or_else(|| format!("unknown kind {v}"))?,
                "bytes" => a.bytes = num(v)? as usize,
                "count" => a.count = num(v)?,
                "seed" => a.seed = num(v)?,
                "gap_ms" => a.gap_ms = num(v)?,
                "exit_after" => a.exit_after = Some(num(v)?),
                "report" => a.report = num(v)?.max(1),
                "warmup" => a.warmup = num(v)?,
                "channels" => a.channels = Some(num(v)? as usize),
                "path" => a.path = v.parse().map_err(|e| format!("{k}={v}: {e}"))?,
                _ => return Err(format!("unknown argument {k}")),
            }
        }
        if a.advertise.is_empty() {
            return Err("advertise=<ip> is required".into());
        }
        Ok(a)
    }

    fn call(&self, index: u64) -> Call {
        let key = self.seed ^ index << 20;
        match self.workload.as_str() {
            "mixed" => mixed_call(self.seed, index, self.bytes),
            "sweep" => {
                let kind = Kind::ALL[(index % 4) as usize];
                let elements = SWEEP[(index / 4) as usize % SWEEP.len()];
                let bytes = if kind == Kind::Gather { elements % 5000 } else { elements * 8 };
                Call { kind, bytes, key }
            }
            _ => Call { kind: self.kind, bytes: self.bytes, key },
        }
    }
}

/// This process's resident set, its peak and its open descriptors, from /proc/self.
pub fn stats() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    format!("rss_kb={} hwm_kb={} fds={fds}", field("VmRSS:"), field("VmHWM:"))
}

/// The ring's bytes per stream, as the PEERS line shows them.
fn peers(ring: &TcpCollective) -> String {
    let each = ring
        .peer_stats()
        .into_iter()
        .map(|p| format!("{}@{}:{}:{}", p.peer, p.offset, p.bytes_sent, p.bytes_received));
    each.collect::<Vec<_>>().join(" ")
}

/// Reads a PEERS line's words after its label: per peer, its offset and the bytes sent to it
/// and received from it.
pub fn parse_peers(text: &str) -> Vec<(usize, isize, u64, u64)> {
    let words = text.strip_prefix("PEERS ").unwrap_or("").split_whitespace().skip(1);
    let parse = |w: &str| {
        let (peer, rest) = w.split_once('@')?;
        let mut fields = rest.split(':');
        let offset = fields.next()?.parse().ok()?;
        let (sent, received) = (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
        Some((peer.parse().ok()?, offset, sent, received))
    };
    words.filter_map(parse).collect()
}

macro_rules! say {
    ($($t:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($t)*);
        let _ = out.flush();
    }};
}

/// Runs a rank; returns the process exit code.
pub fn main(words: &[String]) -> i32 {
    let args = match RankArgs::parse(words) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rank: {e}");
            return 64;
        }
    };
    let listener = match TcpCollective::bind_advertised(&args.host, &args.advertise) {
        Ok(l) => l,
        Err(e) => {
            say!("CONNECT_ERR bind: {e}");
            return 2;
        }
    };
    say!("ADDR {}", listener.address());
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return 2;
    }
    let addresses: Vec<String> =
        line.trim().strip_prefix("ADDRS ").unwrap_or("").split(' ').map(String::from).collect();
    let connect_timeout = Duration::from_secs_f64(args.connect_timeout);
    let options = silvic_net::ConnectOptions::new().allreduce(args.path);
    let options = match args.channels {
        Some(n) => options.channels(n),
        None => options,
    };
    let (rank, token) = (args.rank, &args.token);
    let connected = TcpCollective::connect_with_options(
        listener,
        rank,
        &addresses,
        token,
        connect_timeout,
        &options,
    );
    let mut ring = match connected {
        Ok(r) => r,
        Err(e) => {
            say!("CONNECT_ERR {e}");
            return 2;
        }
    };
    ring.set_timeout(Duration::from_secs_f64(args.timeout));
    say!("READY {}", stats());
    let started = Instant::now();
    for index in 0..args.count {
        if args.exit_after == Some(index) {
            drop(ring);
            say!("EXIT {index}");
            return 0;
        }
        if index > 0 && args.gap_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.gap_ms));
        }
        let call = args.call(index);
        let t = Instant::now();
        match run_and_check(&mut ring, call) {
            Ok(Ok(())) => {
                if (index + 1) % args.report == 0 {
                    say!("OK {index} {}", t.elapsed().as_millis());
                }
            }
            Ok(Err(what)) => {
                say!("WRONG {index} {call:?}: {what}");
                return 3;
            }
            Err(e) => {
                let peer = e.peer().map_or("none".to_string(), |p| p.to_string());
                say!("ERR {index} {} peer={peer} kind={} {e}", t.elapsed().as_millis(), e.kind());
                match run_and_check(&mut ring, args.call(index + 1)) {
                    Err(again) if again == e => say!("STICKY same"),
                    other => say!("STICKY differs: {other:?}"),
                }
                return 0;
            }
        }
        if index + 1 == args.warmup {
            say!("STATS warm {}", stats());
            say!("PEERS warm {}", peers(&ring));
        }
    }
    say!("STATS end {}", stats());
    say!("PEERS end {}", peers(&ring));
    say!("DONE {} {}", args.count, started.elapsed().as_millis());
    0
}
