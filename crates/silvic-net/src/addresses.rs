//! The address list `connect` is handed, checked before any socket is opened: every entry an
//! `ip:port` another rank can reach, none twice, loopback and remote never mixed.
//!
//! Invariants: pure (no I/O, no clock); every refusal is a [`ConnectError::InvalidArgument`]
//! naming the rank whose entry is wrong.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::error::ConnectError;

fn invalid(message: String) -> ConnectError {
    ConnectError::InvalidArgument(message)
}

/// Parses and checks the address list: every entry an `ip:port` other ranks can reach, none twice.
pub(crate) fn parse_addresses(addresses: &[String]) -> Result<Vec<SocketAddr>, ConnectError> {
    let mut seen = HashMap::new();
    addresses
        .iter()
        .enumerate()
        .map(|(rank, text)| {
            let address: SocketAddr = text.parse().map_err(|_| {
                invalid(format!(
                    "address of rank {rank} is not ip:port (IPv6 as [ip]:port): {text:?}"
                ))
            })?;
            if address.ip().is_unspecified() || address.port() == 0 {
                return Err(invalid(format!(
                    "address of rank {rank} cannot be connected to: {text}"
                )));
            }
            if let Some(first) = seen.insert(address, rank) {
                return Err(invalid(format!(
                    "ranks {first} and {rank} have the same address {address}"
                )));
            }
            Ok(address)
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(refuse_loopback_mix)
}

/// A list that mixes loopback and remote addresses cannot form a ring: the remote ranks would
/// connect to their own loopback. Names the first loopback rank, the usual sign of a host name
/// that resolves to 127.0.1.1.
fn refuse_loopback_mix(parsed: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, ConnectError> {
    let Some(remote) = parsed.iter().position(|a| !a.ip().is_loopback()) else {
        return Ok(parsed);
    };
    match parsed.iter().position(|a| a.ip().is_loopback()) {
        None => Ok(parsed),
        Some(rank) => Err(invalid(format!(
            "rank {rank} advertises {}, a loopback address, while other ranks are remote \
             (rank {remote} advertises {}): the other hosts cannot reach it; bind that rank \
             to a reachable address (BindOptions::interface, or SILVIC_SOCKET_IFNAME)",
            parsed[rank].ip(),
            parsed[remote].ip()
        ))),
    }
}
