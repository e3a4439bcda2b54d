//! Where the ranks of a multi-host run meet (`--rendezvous`), and the job token they share.
//!
//! Invariants: a [`Rendezvous`] is a folder or a `tcp://HOST:PORT` with a port from 1 to 65535;
//! a [`Token`] never shows in `Debug` output (a `Config` is printed by failing tests).

use std::path::PathBuf;

/// Where the ranks of a multi-host run meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rendezvous {
    /// A folder every rank sees.
    Folder(PathBuf),
    /// `tcp://HOST:PORT`: rank 0's address exchange, as `TcpCollective::from_env` has it.
    Tcp(String),
}

impl std::fmt::Display for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rendezvous::Folder(dir) => write!(f, "{}", dir.display()),
            Rendezvous::Tcp(url) => f.write_str(url),
        }
    }
}

/// `--rendezvous`: `tcp://HOST:PORT`, `file:///DIR` or a folder's path.
pub(crate) fn parse_rendezvous(text: &str) -> Result<Rendezvous, String> {
    if let Some(rest) = text.strip_prefix("tcp://") {
        let port = rest.rsplit_once(':').filter(|(host, _)| !host.is_empty()).map(|(_, p)| p);
        return match port.map(str::parse::<u16>) {
            Some(Ok(port)) if port > 0 => Ok(Rendezvous::Tcp(text.to_string())),
            _ => Err(format!("{text:?} is not tcp://HOST:PORT (a port from 1 to 65535)")),
        };
    }
    let dir = text.strip_prefix("file://").unwrap_or(text);
    if dir.is_empty() || (text.contains("://") && !text.starts_with("file://")) {
        return Err(format!("{text:?} is not a folder, file:///DIR or tcp://HOST:PORT"));
    }
    Ok(Rendezvous::Folder(PathBuf::from(dir)))
}

/// The environment variable a multi-host rank reads its job token from.
pub(crate) const TOKEN_VAR: &str = "SILVIC_BENCH_TOKEN";

/// A job token, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(pub(crate) String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}
