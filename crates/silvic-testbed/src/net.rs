//! A multi-host network on one machine: one network namespace per host, each with its own
//! address on a veth whose other end sits on a bridge in a "switch" namespace.
//!
//! ```text
//!   svt-<pid>-<tag>-h0          svt-<pid>-<tag>-sw                 svt-<pid>-<tag>-h1
//!   eth0 10.231.0.1 ──veth── p0 ─┐                           ┌─ p1 ──veth── eth0 10.231.0.2
//!                                br0 10.231.0.100 (+ .101.. for the relay)
//! ```
//!
//! Nothing is created in the namespace the tests run in: every interface, address, nft table
//! and qdisc lives inside a namespace of this module, so deleting the namespaces removes all of
//! it, and no packet can leave them (they have no route out). [`Net`] deletes its namespaces on
//! drop, also when a test panics; [`sweep`] deletes those of test processes that died before
//! they could (names carry the creating process's id).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every namespace this module creates starts with this.
pub const PREFIX: &str = "svt-";

/// The switch's own address on the bridge (needed for nft's `reject with tcp reset` on
/// bridged packets: the reset is routed out of the switch namespace).
pub const SWITCH_IP: &str = "10.231.0.100";

/// Host `h`'s address.
pub fn host_ip(h: usize) -> String {
    format!("10.231.0.{}", h + 1)
}

/// The relay's address that stands for host `h`.
pub fn relay_ip(h: usize) -> String {
    format!("10.231.0.{}", h + 101)
}

fn run(program: &str, args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        stdin.write_all(text.as_bytes()).map_err(|e| format!("{program} stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks what the namespace tests need: root, `ip`, `nft`, `tc`, and a namespace that can be
/// created. `Err` says what is missing.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for (tool, arg) in [("ip", "-V"), ("nft", "--version"), ("tc", "-V")] {
        run(tool, &[arg], None).map_err(|e| format!("`{tool}` is not usable: {e}"))?;
    }
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let probe = format!("{PREFIX}{}-probe{n}", std::process::id());
    run("ip", &["netns", "add", &probe], None)
        .map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let _ = run("ip", &["netns", "del", &probe], None);
    Ok(())
}

/// Fails the test `test`, saying what is missing, unless the namespace tests can run here.
///
/// A namespace test never passes without running: whether it runs is decided by nextest's
/// filter (`.config/nextest.toml`: the default profile skips the `netns_` tests, and nextest
/// counts them as skipped; the `ci` profile, which `.ci/run` uses as root, runs them), and once
/// it runs it either does its job or fails.
pub fn require(test: &str) {
    if let Err(why) = available() {
        panic!(
            "{test} needs root, ip, nft and tc: {why}. Outside `--profile ci` nextest skips the \
             netns_ tests"
        );
    }
}

/// Deletes the namespaces of test processes that no longer exist.
pub fn sweep() {
    let Ok(list) = run("ip", &["netns", "list"], None) else { return };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let pid = rest.split('-').next().unwrap_or("");
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name], None);
        }
    }
}

/// A bridge and `hosts` hosts, each in its own namespace. Deleted on drop.
#[derive(Debug)]
pub struct Net {
    /// The switch namespace.
    pub switch: String,
    /// Host namespaces, by host index.
    pub hosts: Vec<String>,
}

impl Net {
    /// Builds the network of the fault tests: [`Net::bridge`], plus the relay's addresses on
    /// the switch and bridged packets passed through the switch's nft hooks. `tag` makes the
    /// names unique within this process.
    pub fn create(tag: &str, hosts: usize) -> Result<Net, String> {
        let net = Net::bridge(tag, hosts)?;
        let sw = net.switch.clone();
        for h in 0..hosts {
            net.ip(&sw, &["addr", "add", &format!("{}/24", relay_ip(h)), "dev", "br0"])?;
        }
        // Bridged IPv4 goes through the inet hooks too, so `reject with tcp reset` works there.
        net.exec(&sw, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
        Ok(net)
    }

    /// Builds hosts on a plain bridge and nothing else: no relay addresses, no filtering of
    /// bridged packets (what silvic-bench measures on). `tag` makes the names unique within
    /// this process.
    pub fn bridge(tag: &str, hosts: usize) -> Result<Net, String> {
        sweep();
        let base = format!("{PREFIX}{}-{tag}", std::process::id());
        let mut net = Net { switch: format!("{base}-sw"), hosts: Vec::new() };
        // Registered before creation so that drop removes whatever part exists.
        run("ip", &["netns", "add", &net.switch], None)?;
        let sw = net.switch.clone();
        net.ip(&sw, &["link", "add", "br0", "type", "bridge"])?;
        net.ip(&sw, &["addr", "add", &format!("{SWITCH_IP}/24"), "dev", "br0"])?;
        net.ip(&sw, &["link", "set", "br0", "up"])?;
        net.ip(&sw, &["link", "set", "lo", "up"])?;
        for h in 0..hosts {
            let ns = format!("{base}-h{h}");
            run("ip", &["netns", "add", &ns], None)?;
            net.hosts.push(ns.clone());
            let port = format!("p{h}");
            net.ip(
                &sw,
                &["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns],
            )?;
            net.ip(&sw, &["link", "set", &port, "master", "br0", "up"])?;
            net.ip(&ns, &["addr", "add", &format!("{}/24", host_ip(h)), "dev", "eth0"])?;
            net.ip(&ns, &["link", "set", "eth0", "up"])?;
            net.ip(&ns, &["link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Shapes the egress of host `h` (its `eth0`) to `mbit` Mbit/s with a token bucket (tc
    /// tbf). The bucket holds at least 64 KiB, so a whole GSO segment passes unsplit, and about
    /// 1 ms of traffic at higher rates; the queue holds 20 ms of traffic.
    pub fn shape(&self, h: usize, mbit: u64) -> Result<(), String> {
        let burst = (mbit * 1_000_000 / 8 / 1000).max(64 * 1024);
        let (rate, burst) = (format!("{mbit}mbit"), burst.to_string());
        let args = ["qdisc", "add", "dev", "eth0", "root", "tbf", "rate", &rate, "burst", &burst];
        self.exec(&self.hosts[h], "tc", &[&args[..], &["latency", "20ms"]].concat()).map(drop)
    }

    /// Runs `ip -n <ns> <args>`.
    pub fn ip(&self, ns: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", ns];
        all.extend_from_slice(args);
        run("ip", &all, None)
    }

    /// Runs `program args` inside `ns`.
    pub fn exec(&self, ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", ns, program];
        all.extend_from_slice(args);
        run("ip", &all, None)
    }

    /// Loads an nft ruleset into `ns`.
    pub fn nft(&self, ns: &str, ruleset: &str) -> Result<(), String> {
        run("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(ruleset)).map(drop)
    }

    /// The sum of the packet counts of every `counter` in `ns`'s ruleset.
    pub fn nft_packets(&self, ns: &str) -> u64 {
        let listing = self.exec(ns, "nft", &["list", "ruleset"]).unwrap_or_default();
        let words: Vec<&str> = listing.split_whitespace().collect();
        words
            .windows(3)
            .filter(|w| w[0] == "counter" && w[1] == "packets")
            .filter_map(|w| w[2].parse::<u64>().ok())
            .sum()
    }

    /// A command that runs `program` inside host `h`'s namespace.
    pub fn command(&self, ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }

    /// Pulls host `h`'s cable at the switch.
    pub fn link_down(&self, h: usize) -> Result<(), String> {
        self.ip(&self.switch, &["link", "set", &format!("p{h}"), "down"]).map(drop)
    }

    /// The kernel's TCP counters (TcpExt and Tcp of /proc/net) in host `h`'s namespace.
    pub fn tcp_counters(&self, h: usize) -> HashMap<String, u64> {
        let mut out = HashMap::new();
        for file in ["/proc/net/netstat", "/proc/net/snmp"] {
            let text = self.exec(&self.hosts[h], "cat", &[file]).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                for (k, v) in names.split_whitespace().zip(values.split_whitespace()).skip(1) {
                    if let Ok(v) = v.parse() {
                        out.insert(k.to_string(), v);
                    }
                }
            }
        }
        out
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain([&self.switch]) {
            let _ = run("ip", &["netns", "del", ns], None);
        }
    }
}
