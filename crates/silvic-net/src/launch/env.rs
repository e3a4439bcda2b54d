//! What a launcher's environment variables say: rank, world, where to meet, the job token, the
//! interface and the ports.
//!
//! Pure: [`Launch::parse`] reads variables through a lookup function and opens nothing, so every
//! rule is tested without sockets or a real environment. Every error names the variable at fault;
//! a variable the lookup cannot read (not UTF-8: `crate::variables`) is an error, never unset.
//!
//! Which variables, first match wins:
//!
//! - rank, world: `SILVIC_RANK`/`SILVIC_WORLD_SIZE`, torchrun's `RANK`/`WORLD_SIZE`, Slurm's
//!   `SLURM_PROCID`/`SLURM_NTASKS`, OpenMPI's `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`;
//! - where to meet: `SILVIC_RENDEZVOUS` (`tcp://HOST:PORT` or `file:///PATH`), else
//!   `MASTER_ADDR` + `MASTER_PORT`;
//! - job token: `SILVIC_JOB_TOKEN` (required);
//! - interface: `SILVIC_SOCKET_IFNAME` (optional);
//! - ring ports: `SILVIC_PORTS` (optional: `29500` or `29500-29599`).

use std::net::Ipv6Addr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use crate::error::ConnectError;

/// The rank and world variables of each launcher, in the order they are looked at.
pub(crate) const RANK_VARIABLES: [(&str, &str); 4] = [
    ("SILVIC_RANK", "SILVIC_WORLD_SIZE"),
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
];

/// Where the ranks learn each other's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Meeting {
    /// Rank 0 serves the address exchange on `port` of `host`, which every rank can reach.
    Tcp {
        /// Rank 0's host, as the variable gives it (a name or an IP address).
        host: String,
        /// The exchange's port.
        port: u16,
        /// The variable it came from, for errors.
        variable: &'static str,
    },
    /// A folder every rank sees.
    Folder(PathBuf),
}

/// Everything `from_env` needs, read from the environment.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// The variables rank and world came from, for messages.
    pub(crate) rank_variables: (&'static str, &'static str),
    pub(crate) meeting: Meeting,
    pub(crate) token: String,
    pub(crate) interface: Option<String>,
    pub(crate) ports: Option<RangeInclusive<u16>>,
    /// What `from_env` should warn about: variables that disagree, choices made for the user.
    pub(crate) notes: Vec<String>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of every log line.
        f.debug_struct("Launch")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("meeting", &self.meeting)
            .field("interface", &self.interface)
            .field("ports", &self.ports)
            .field("notes", &self.notes)
            .finish_non_exhaustive()
    }
}

/// The largest world `from_env` starts: rank 0 of the address exchange holds a connection per
/// rank, and every rank a list of them, so a world size beyond any real job (a typo, a stray
/// variable) is refused before anything is sized by it.
pub(crate) const MAX_WORLD: usize = 1 << 16;

pub(crate) fn env_error(variable: &str, message: impl Into<String>) -> ConnectError {
    ConnectError::Environment { variable: variable.to_string(), message: message.into() }
}

fn number(variable: &str, text: &str) -> Result<usize, ConnectError> {
    text.trim()
        .parse()
        .map_err(|_| env_error(variable, format!("{text:?} is not a non-negative integer")))
}

/// Parses `29500` or `29500-29599`.
pub(crate) fn parse_ports(variable: &str, text: &str) -> Result<RangeInclusive<u16>, ConnectError> {
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| env_error(variable, format!("{p:?} is not a port (1-65535)")))
    };
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(text)?;
            (p, p)
        }
    };
    if first > last {
        return Err(env_error(variable, format!("the range {first}-{last} is empty")));
    }
    Ok(first..=last)
}

/// A host as a variable gives it: a name or an IPv4 address, or an IPv6 address in brackets
/// (or bare, where `bare_ipv6`, as torchrun's `MASTER_ADDR` may be); without the brackets.
/// `None` for anything else: an unclosed bracket, brackets round anything but an IPv6 address,
/// a colon outside brackets.
fn host(text: &str, bare_ipv6: bool) -> Option<String> {
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        return inner.parse::<Ipv6Addr>().is_ok().then(|| inner.to_string());
    }
    if text.is_empty() || text.contains(']') {
        return None;
    }
    if text.contains(':') && !(bare_ipv6 && text.parse::<Ipv6Addr>().is_ok()) {
        return None;
    }
    Some(text.to_string())
}

/// Parses `HOST:PORT` (IPv6 as `[ip]:PORT`).
fn parse_host_port(variable: &'static str, text: &str) -> Result<Meeting, ConnectError> {
    let bad = || env_error(variable, format!("{text:?} is not HOST:PORT (IPv6 as [ip]:PORT)"));
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let host = self::host(host, false).ok_or_else(bad)?;
    let port = parse_ports(variable, port)?;
    if port.start() != port.end() {
        return Err(bad());
    }
    Ok(Meeting::Tcp { host, port: *port.start(), variable })
}

/// Parses torchrun's pair: `MASTER_ADDR` a bare host (IPv6 with or without brackets) and
/// `MASTER_PORT` one port.
fn parse_master(host: &str, port: &str) -> Result<(String, u16), ConnectError> {
    if host.is_empty() {
        return Err(env_error("MASTER_ADDR", "empty"));
    }
    let host = self::host(host, true).ok_or_else(|| {
        env_error("MASTER_ADDR", format!("{host:?} is not a host name or IP address"))
    })?;
    let ports = parse_ports("MASTER_PORT", port)?;
    if ports.start() != ports.end() {
        return Err(env_error("MASTER_PORT", format!("{port:?} is a range, not one port")));
    }
    Ok((host, *ports.start()))
}

/// Parses `SILVIC_RENDEZVOUS`: `tcp://HOST:PORT` or `file:///PATH`.
pub(crate) fn parse_rendezvous(text: &str) -> Result<Meeting, ConnectError> {
    const VARIABLE: &str = "SILVIC_RENDEZVOUS";
    if let Some(rest) = text.strip_prefix("tcp://") {
        return parse_host_port(VARIABLE, rest.trim_end_matches('/'));
    }
    if let Some(rest) = text.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(env_error(
                VARIABLE,
                format!("{text:?}: a folder must be an absolute path, as file:///PATH"),
            ));
        }
        return Ok(Meeting::Folder(PathBuf::from(rest)));
    }
    Err(env_error(VARIABLE, format!("{text:?} is neither tcp://HOST:PORT nor file:///PATH")))
}

impl Launch {
    /// Reads the variables through `var` (a missing or blank variable is `None`; one that
    /// cannot be read, such as a value that is not UTF-8, is its error).
    pub(crate) fn parse(
        var: impl Fn(&str) -> Result<Option<String>, ConnectError>,
    ) -> Result<Launch, ConnectError> {
        let var = |name: &str| Ok(var(name)?.filter(|v| !v.trim().is_empty()));
        let mut found = None;
        for (rank_var, world_var) in RANK_VARIABLES {
            match (var(rank_var)?, var(world_var)?) {
                (None, None) => continue,
                (Some(_), None) => {
                    return Err(env_error(world_var, format!("missing, while {rank_var} is set")));
                }
                (None, Some(_)) => {
                    return Err(env_error(rank_var, format!("missing, while {world_var} is set")));
                }
                (Some(r), Some(w)) => {
                    found =
                        Some((number(rank_var, &r)?, number(world_var, &w)?, rank_var, world_var));
                    break;
                }
            }
        }
        let mut notes = Vec::new();
        if let Some((rank, world, rank_var, world_var)) = found {
            // Another launcher's pair that says otherwise: a wrapper script that set SILVIC_*
            // for one job inside another's allocation, most likely. The first pair wins.
            for (other_rank, other_world) in RANK_VARIABLES {
                if other_rank == rank_var {
                    continue;
                }
                let disagree = |name: &str, mine: &str, value: usize| match var(name) {
                    Err(e) => Some(format!("{e}: ignored, {mine} is used")),
                    Ok(said) => {
                        let said = said.and_then(|v| v.trim().parse::<usize>().ok());
                        said.filter(|&v| v != value).map(|v| {
                            format!(
                                "{mine}={value} and {name}={v} disagree; using {mine} (the \
                                 first of SILVIC_*, torchrun's, Slurm's and OpenMPI's variables)"
                            )
                        })
                    }
                };
                notes.extend(disagree(other_rank, rank_var, rank));
                notes.extend(disagree(other_world, world_var, world));
            }
        }
        let Some((rank, world, rank_var, world_var)) = found else {
            return Err(env_error(
                "SILVIC_RANK",
                "no rank given: set SILVIC_RANK and SILVIC_WORLD_SIZE, or run under torchrun \
                 (RANK, WORLD_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS) or OpenMPI",
            ));
        };
        if world == 0 {
            return Err(env_error(world_var, "a world of 0 ranks"));
        }
        if world > MAX_WORLD {
            return Err(env_error(
                world_var,
                format!("a world of {world} ranks is more than the {MAX_WORLD} from_env starts"),
            ));
        }
        if rank >= world {
            return Err(env_error(
                rank_var,
                format!("rank {rank} is out of range for {world_var}={world}"),
            ));
        }
        let meeting = match var("SILVIC_RENDEZVOUS")? {
            Some(text) => parse_rendezvous(text.trim())?,
            None => match (var("MASTER_ADDR")?, var("MASTER_PORT")?) {
                (Some(host), Some(port)) if var("TORCHELASTIC_RUN_ID")?.is_some() => {
                    // torchrun's own store listens on MASTER_PORT on rank 0's host: the
                    // exchange takes the port after it.
                    let (host, port) = parse_master(host.trim(), port.trim())?;
                    let next = port.checked_add(1).ok_or_else(|| {
                        env_error(
                            "MASTER_PORT",
                            "65535 is torchrun's store, and no port follows it for the \
                             address exchange: set SILVIC_RENDEZVOUS=tcp://HOST:PORT",
                        )
                    })?;
                    notes.push(format!(
                        "under torchrun, MASTER_PORT={port} is torch's own store: the address \
                         exchange uses port {next} (set SILVIC_RENDEZVOUS=tcp://HOST:PORT to \
                         choose another)"
                    ));
                    Meeting::Tcp { host, port: next, variable: "MASTER_PORT" }
                }
                (Some(host), Some(port)) => {
                    let (host, port) = parse_master(host.trim(), port.trim())?;
                    Meeting::Tcp { host, port, variable: "MASTER_ADDR" }
                }
                (Some(_), None) => {
                    return Err(env_error("MASTER_PORT", "missing, while MASTER_ADDR is set"));
                }
                (None, Some(_)) => {
                    return Err(env_error("MASTER_ADDR", "missing, while MASTER_PORT is set"));
                }
                (None, None) if world == 1 => Meeting::Folder(PathBuf::new()),
                (None, None) => {
                    return Err(env_error(
                        "SILVIC_RENDEZVOUS",
                        "missing: set SILVIC_RENDEZVOUS=tcp://HOST:PORT (rank 0's host) or \
                         file:///PATH (a folder every rank sees), or MASTER_ADDR and MASTER_PORT",
                    ));
                }
            },
        };
        let token = var("SILVIC_JOB_TOKEN")?.ok_or_else(|| {
            env_error(
                "SILVIC_JOB_TOKEN",
                "missing: every rank of a job needs the same secret job token",
            )
        })?;
        let interface = var("SILVIC_SOCKET_IFNAME")?.map(|s| s.trim().to_string());
        let ports = var("SILVIC_PORTS")?.map(|p| parse_ports("SILVIC_PORTS", &p)).transpose()?;
        if let (Some(ports), Meeting::Tcp { port, variable, .. }) = (&ports, &meeting) {
            if ports.contains(port) {
                return Err(env_error(
                    "SILVIC_PORTS",
                    format!(
                        "{}-{} holds {port}, the address exchange's port ({variable}): a rank \
                         on rank 0's host would listen there and meet itself; give ring ports \
                         apart from it",
                        ports.start(),
                        ports.end()
                    ),
                ));
            }
        }
        Ok(Launch {
            rank,
            world,
            rank_variables: (rank_var, world_var),
            meeting,
            token,
            interface,
            ports,
            notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Launch, ConnectError> {
        let vars: Vec<(String, String)> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Launch::parse(|name| Ok(vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())))
    }

    fn message(vars: &[(&str, &str)]) -> String {
        parse(vars).unwrap_err().to_string()
    }

    const BASE: [(&str, &str); 2] =
        [("SILVIC_JOB_TOKEN", "secret"), ("SILVIC_RENDEZVOUS", "tcp://node-0:29400")];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v = BASE.to_vec();
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn each_launchers_rank_variables_are_read_in_order() {
        for (rank_var, world_var) in RANK_VARIABLES {
            let l = parse(&with(&[(rank_var, "2"), (world_var, "4")])).unwrap();
            assert_eq!((l.rank, l.world, l.rank_variables), (2, 4, (rank_var, world_var)));
        }
        // SILVIC_* wins over torchrun's, which wins over Slurm's.
        let l = parse(&with(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.world), (1, 4));
        let l = parse(&with(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("SILVIC_RANK", "0")]));
        assert!(l.unwrap_err().to_string().starts_with("SILVIC_WORLD_SIZE: missing"));
    }

    /// Finding 11: under torchrun, MASTER_PORT is torch's store; the exchange takes the next.
    #[test]
    fn under_torchrun_the_exchange_takes_the_port_after_torchs_store() {
        let torch = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SILVIC_JOB_TOKEN", "t"),
            ("MASTER_ADDR", "node-0"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "job-7"),
        ];
        let l = parse(&torch).unwrap();
        let expected = Meeting::Tcp { host: "node-0".into(), port: 29501, variable: "MASTER_PORT" };
        assert_eq!(l.meeting, expected);
        assert!(l.notes[0].contains("torch's own store: the address exchange uses port 29501"));
        let mut last = torch.to_vec();
        last[4] = ("MASTER_PORT", "65535");
        assert!(message(&last).starts_with("MASTER_PORT: 65535 is torchrun's store"));
        // Without torchrun, MASTER_PORT is the exchange's own.
        let plain = parse(&torch[..5]).unwrap();
        assert_eq!(
            plain.meeting,
            Meeting::Tcp { host: "node-0".into(), port: 29500, variable: "MASTER_ADDR" }
        );
        assert!(plain.notes.is_empty());
    }

    #[test]
    fn launchers_that_disagree_are_noted_naming_both_variables() {
        let l = parse(&with(&[
            ("SILVIC_RANK", "1"),
            ("SILVIC_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
        ]))
        .unwrap();
        assert_eq!(
            l.notes,
            ["SILVIC_RANK=1 and SLURM_PROCID=3 disagree; using SILVIC_RANK (the first of \
              SILVIC_*, torchrun's, Slurm's and OpenMPI's variables)"]
        );
        let agree = with(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("SLURM_PROCID", "2")]);
        assert!(parse(&agree).unwrap().notes.is_empty());
    }

    #[test]
    fn bad_ranks_name_their_variable() {
        assert!(message(&with(&[])).starts_with("SILVIC_RANK: no rank given"));
        assert_eq!(
            message(&with(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")])),
            "SLURM_PROCID: rank 4 is out of range for SLURM_NTASKS=4"
        );
        assert_eq!(
            message(&with(&[("RANK", "one"), ("WORLD_SIZE", "4")])),
            "RANK: \"one\" is not a non-negative integer"
        );
        assert_eq!(
            message(&with(&[("RANK", "0"), ("WORLD_SIZE", "0")])),
            "WORLD_SIZE: a world of 0 ranks"
        );
        for huge in ["4294967295", "65537"] {
            assert_eq!(
                message(&with(&[("SILVIC_RANK", "0"), ("SILVIC_WORLD_SIZE", huge)])),
                format!(
                    "SILVIC_WORLD_SIZE: a world of {huge} ranks is more than the 65536 from_env starts"
                )
            );
        }
        assert_eq!(parse(&with(&[("RANK", "0"), ("WORLD_SIZE", "65536")])).unwrap().world, 65536);
        assert_eq!(
            message(&with(&[("OMPI_COMM_WORLD_SIZE", "2")])),
            "OMPI_COMM_WORLD_RANK: missing, while OMPI_COMM_WORLD_SIZE is set"
        );
    }

    #[test]
    fn the_meeting_place_comes_from_silvic_rendezvous_or_master_addr() {
        let ranks = [("RANK", "0"), ("WORLD_SIZE", "2"), ("SILVIC_JOB_TOKEN", "t")];
        let mut vars = ranks.to_vec();
        vars.push(("SILVIC_RENDEZVOUS", "tcp://[fd00::1]:29400"));
        let l = parse(&vars).unwrap();
        let tcp = |host: &str, port, variable| Meeting::Tcp { host: host.into(), port, variable };
        assert_eq!(l.meeting, tcp("fd00::1", 29400, "SILVIC_RENDEZVOUS"));
        let mut vars = ranks.to_vec();
        vars.extend([("MASTER_ADDR", "10.0.0.5"), ("MASTER_PORT", "29500")]);
        assert_eq!(parse(&vars).unwrap().meeting, tcp("10.0.0.5", 29500, "MASTER_ADDR"));
        for bare in ["fd00::1", "[fd00::1]"] {
            let mut vars = ranks.to_vec();
            vars.extend([("MASTER_ADDR", bare), ("MASTER_PORT", "29500")]);
            assert_eq!(parse(&vars).unwrap().meeting, tcp("fd00::1", 29500, "MASTER_ADDR"));
        }
        let mut vars = ranks.to_vec();
        vars.extend([("MASTER_ADDR", "10.0.0.5"), ("MASTER_PORT", "29500-29501")]);
        assert!(message(&vars).starts_with("MASTER_PORT: "), "{}", message(&vars));
        let mut vars = ranks.to_vec();
        vars.push(("SILVIC_RENDEZVOUS", "file:///shared/job-7"));
        assert_eq!(parse(&vars).unwrap().meeting, Meeting::Folder("/shared/job-7".into()));
        let mut vars = ranks.to_vec();
        vars.push(("MASTER_ADDR", "10.0.0.5"));
        assert_eq!(message(&vars), "MASTER_PORT: missing, while MASTER_ADDR is set");
        assert!(message(&ranks).starts_with("SILVIC_RENDEZVOUS: missing"));
        // A world of one needs no meeting place.
        let one = [("RANK", "0"), ("WORLD_SIZE", "1"), ("SILVIC_JOB_TOKEN", "t")];
        assert!(parse(&one).is_ok());
    }

    #[test]
    fn bad_rendezvous_urls_say_what_is_wrong() {
        for (text, why) in [
            ("http://a:1", "neither tcp://HOST:PORT nor file:///PATH"),
            ("tcp://node-0", "is not HOST:PORT"),
            ("tcp://:29400", "is not HOST:PORT"),
            ("tcp://fd00::1:29400", "is not HOST:PORT"),
            ("tcp://a:0", "is not a port"),
            ("tcp://a:70000", "is not a port"),
            ("tcp://a:1-9", "is not HOST:PORT"),
            // Finding 8 of the second review: a bracket left open was taken as closed.
            ("tcp://[::1:29400", "is not HOST:PORT"),
            ("tcp://::1]:29400", "is not HOST:PORT"),
            ("tcp://[::1]]:29400", "is not HOST:PORT"),
            ("tcp://[node-0]:29400", "is not HOST:PORT"),
            ("tcp://[]:29400", "is not HOST:PORT"),
            ("file://shared/x", "absolute path"),
        ] {
            let e = parse_rendezvous(text).unwrap_err().to_string();
            assert!(e.starts_with("SILVIC_RENDEZVOUS: "), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
        assert_eq!(
            parse_rendezvous("tcp://a:1/").unwrap(),
            Meeting::Tcp { host: "a".into(), port: 1, variable: "SILVIC_RENDEZVOUS" }
        );
        assert_eq!(
            parse_rendezvous("tcp://[fd00::1]:7").unwrap(),
            Meeting::Tcp { host: "fd00::1".into(), port: 7, variable: "SILVIC_RENDEZVOUS" }
        );
        for bad in ["[fd00::1", "fd00::1]", "[node-0]", "node:0"] {
            let e = parse_master(bad, "29500").unwrap_err().to_string();
            assert!(e.starts_with("MASTER_ADDR: "), "{bad}: {e}");
        }
    }

    /// Finding 8 of the second review: a variable that cannot be read (not UTF-8) is an error
    /// naming it, never taken as unset (which made a broken SILVIC_RENDEZVOUS fall back to
    /// MASTER_ADDR's exchange without a word).
    #[test]
    fn a_variable_that_is_not_utf8_is_an_error_naming_it_not_unset() {
        let vars = with(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "node-0")]);
        let lookup = |unreadable: &'static str| {
            let vars = vars.clone();
            move |name: &str| {
                if name == unreadable {
                    return Err(env_error(name, "not UTF-8"));
                }
                Ok(vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
            }
        };
        for unreadable in ["SILVIC_RENDEZVOUS", "RANK", "SILVIC_JOB_TOKEN", "SILVIC_PORTS"] {
            let e = Launch::parse(lookup(unreadable)).unwrap_err().to_string();
            assert_eq!(e, format!("{unreadable}: not UTF-8"));
        }
        // Another launcher's variable, read only to compare, is noted and passed over.
        let l = Launch::parse(lookup("SLURM_PROCID")).unwrap();
        assert_eq!(l.notes, ["SLURM_PROCID: not UTF-8: ignored, RANK is used"]);
    }

    #[test]
    fn the_token_is_required_and_never_printed() {
        let vars = [("RANK", "0"), ("WORLD_SIZE", "2"), ("SILVIC_RENDEZVOUS", "tcp://a:1")];
        assert_eq!(
            message(&vars),
            "SILVIC_JOB_TOKEN: missing: every rank of a job needs the same secret job token"
        );
        let l = parse(&with(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!(l.token, "secret");
        assert!(!format!("{l:?}").contains("secret"));
    }

    /// Finding 14: a ring port range holding the exchange's port is refused.
    #[test]
    fn ring_ports_that_hold_the_exchanges_port_are_refused() {
        for ports in ["29400", "29300-29500"] {
            let e = message(&with(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("SILVIC_PORTS", ports)]));
            assert!(e.starts_with("SILVIC_PORTS: "), "{e}");
            assert!(
                e.contains("holds 29400, the address exchange's port (SILVIC_RENDEZVOUS)"),
                "{e}"
            );
        }
        let l =
            parse(&with(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("SILVIC_PORTS", "29401-29500")]));
        assert_eq!(l.unwrap().ports, Some(29401..=29500));
    }

    #[test]
    fn ports_and_interface_are_optional() {
        let l = parse(&with(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!((l.interface, l.ports), (None, None));
        let l = parse(&with(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("SILVIC_SOCKET_IFNAME", "eth0"),
            ("SILVIC_PORTS", "29500-29599"),
        ]))
        .unwrap();
        assert_eq!((l.interface.as_deref(), l.ports), (Some("eth0"), Some(29500..=29599)));
        assert_eq!(parse_ports("P", "29500").unwrap(), 29500..=29500);
        assert_eq!(parse_ports("P", "9-8").unwrap_err().to_string(), "P: the range 9-8 is empty");
        assert_eq!(
            parse_ports("SILVIC_PORTS", "x-9").unwrap_err().to_string(),
            "SILVIC_PORTS: \"x\" is not a port (1-65535)"
        );
    }
}
