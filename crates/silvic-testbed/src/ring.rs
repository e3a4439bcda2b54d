//! A world of rank processes, on loopback or one per host of a [`Net`], optionally behind the
//! delaying [`crate::relay`].

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::{Line, LineChild};
use crate::net::{Net, host_ip, relay_ip};

/// How a world is laid out.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Delay and jitter (ms) of a relay every ring connection goes through, if any.
    pub relay: Option<(u64, u64)>,
}

/// Running rank processes. Dropping it kills them, then the relay, then removes the network.
#[derive(Debug)]
pub struct World {
    /// Rank processes, by rank.
    pub ranks: Vec<LineChild>,
    /// The relay process, if any.
    pub relay: Option<LineChild>,
    /// The network, if not loopback.
    pub net: Option<Net>,
}

/// What a rank's last line said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every call succeeded.
    Done,
    /// It left on purpose.
    Exited,
    /// A call failed: the peer it named, the error kind, the message, and whether the next call
    /// returned the same error.
    Failed {
        /// `CollectiveError::peer()`.
        peer: Option<usize>,
        /// [`silvic_net::CollectiveError::kind`]: "peer_closed", "timeout", "aborted", ...
        kind: String,
        /// The error's message.
        message: String,
    },
    /// A result was wrong.
    Wrong(String),
    /// Nothing conclusive before the deadline.
    Silent,
}

impl End {
    /// Reads a final line.
    pub fn parse(text: &str) -> End {
        if text.starts_with("DONE") {
            End::Done
        } else if text.starts_with("EXIT") {
            End::Exited
        } else if let Some(rest) = text.strip_prefix("WRONG ") {
            End::Wrong(rest.into())
        } else if let Some(rest) = text.strip_prefix("ERR ") {
            let mut words = rest.splitn(5, ' ').skip(2);
            let peer =
                words.next().and_then(|w| w.strip_prefix("peer=")).and_then(|p| p.parse().ok());
            let kind = words.next().and_then(|w| w.strip_prefix("kind=")).unwrap_or("").to_string();
            End::Failed { peer, kind, message: words.next().unwrap_or("").into() }
        } else {
            End::Silent
        }
    }
}

impl World {
    /// Starts `world` ranks and forms the ring. `args` go to every rank; `extra(rank)` adds
    /// per-rank arguments. With `net`, rank `r` runs in host `r`'s namespace.
    pub fn start(
        exe: &Path,
        world: usize,
        net: Option<Net>,
        layout: &Layout,
        args: &[String],
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Result<World, String> {
        let mut w = World { ranks: Vec::new(), relay: None, net };
        for rank in 0..world {
            let (mut cmd, advertise) = match &w.net {
                Some(net) => {
                    let ip = if layout.relay.is_some() { relay_ip(rank) } else { host_ip(rank) };
                    (net.command(&net.hosts[rank], &exe.to_string_lossy()), ip)
                }
                None => (Command::new(exe), "127.0.0.1".to_string()),
            };
            let host = if w.net.is_some() { "0.0.0.0" } else { "127.0.0.1" };
            cmd.arg("rank")
                .arg(format!("rank={rank}"))
                .arg(format!("host={host}"))
                .arg(format!("advertise={advertise}"))
                .args(args)
                .args(extra(rank));
            w.ranks.push(LineChild::spawn(&format!("rank {rank}"), cmd)?);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut addresses = Vec::new();
        for r in &mut w.ranks {
            let line = r.wait_for(&["ADDR ", "CONNECT_ERR"], deadline)?;
            let addr = line.text.strip_prefix("ADDR ").ok_or(line.text.clone())?.to_string();
            addresses.push(addr);
        }
        if let (Some((delay, jitter)), Some(net)) = (layout.relay, &w.net) {
            let mut cmd = net.command(&net.switch, &exe.to_string_lossy());
            cmd.args(["relay", &format!("delay_ms={delay}"), &format!("jitter_ms={jitter}")]);
            let mut relay = LineChild::spawn("relay", cmd)?;
            for (rank, addr) in addresses.iter().enumerate() {
                let port = addr.rsplit(':').next().unwrap_or("0");
                relay.send(&format!("FWD {addr} {}:{port}", host_ip(rank)))?;
                relay.wait_for(&["LISTENING"], deadline)?;
            }
            w.relay = Some(relay);
        }
        let list = format!("ADDRS {}", addresses.join(" "));
        for r in &mut w.ranks {
            r.send(&list)?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for r in &mut w.ranks {
            let line = r.wait_for(&["READY", "CONNECT_ERR"], deadline)?;
            if !line.text.starts_with("READY") {
                return Err(format!("{}: {}", r.name, line.text));
            }
        }
        Ok(w)
    }

    /// Waits until every rank in `ranks` has printed at least `n` lines starting with "OK".
    pub fn wait_oks(&mut self, ranks: &[usize], n: usize, deadline: Instant) -> Result<(), String> {
        for &rank in ranks {
            let child = &mut self.ranks[rank];
            while child.seen.iter().filter(|l| l.text.starts_with("OK")).count() < n {
                let line = child.wait_for(&["OK", "ERR", "WRONG", "DONE", "EXIT"], deadline)?;
                if !line.text.starts_with("OK") {
                    return Err(format!("rank {rank} ended early: {}", line.text));
                }
            }
        }
        Ok(())
    }

    /// Each rank's final line (DONE, EXIT, ERR or WRONG), waiting until `deadline`;
    /// [`End::Silent`] with no line if it printed none by then.
    pub fn ends(&mut self, deadline: Instant) -> Vec<(End, Option<Line>)> {
        self.ranks
            .iter_mut()
            .map(|r| {
                let done = r.seen.iter().rev().find(|l| is_final(&l.text)).cloned();
                let line =
                    done.or_else(|| r.wait_for(&["DONE", "EXIT", "ERR", "WRONG"], deadline).ok());
                match line {
                    Some(l) => (End::parse(&l.text), Some(l)),
                    None => (End::Silent, None),
                }
            })
            .collect()
    }
}

fn is_final(text: &str) -> bool {
    ["DONE", "EXIT", "ERR", "WRONG"].iter().any(|p| text.starts_with(p))
}
