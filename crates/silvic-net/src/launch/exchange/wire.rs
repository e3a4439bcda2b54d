//! The exchange's wire: its key, its answers and the address encoding. Pure: no I/O, so every
//! decoder is total over any bytes a stranger sends.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use byteorder::{BigEndian, ByteOrder};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::handshake::MAC_LEN;

const EXCHANGE_LABEL: &[u8] = b"silvic-net address exchange";
/// The roster both sides bind into their MACs: the exchange runs before any address list
/// exists, so it is fixed (the exchange key already keeps its proofs apart from the ring's).
pub(super) const NO_ROSTER: [u8; MAC_LEN] = [0; MAC_LEN];

/// Bytes of one address on the wire.
pub(crate) const ADDRESS_LEN: usize = 19;
/// Rank 0's answers to a waiting rank, each one byte and what follows it.
pub(super) const LIST: u8 = 1;
pub(super) const DUPLICATE: u8 = 2;
/// Rank 0 gave up: a u16 BE length, then that many bytes of UTF-8 saying why.
pub(super) const ABORT: u8 = 3;
/// Rank 0 asks whether a waiting rank is still there (another process claims its rank); the
/// rank answers with the same byte.
pub(super) const PING: u8 = 4;
/// The longest reason an abort carries; a longer one is cut.
pub(crate) const MAX_ABORT_TEXT: usize = 1024;

/// The key the exchange's MACs use: derived from the job token, so an exchange handshake and a
/// ring handshake can never stand in for each other.
pub(crate) fn exchange_key(token: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(EXCHANGE_LABEL);
    mac.finalize().into_bytes().into()
}

/// Encodes an address.
pub(crate) fn encode_address(address: SocketAddr) -> [u8; ADDRESS_LEN] {
    let mut out = [0u8; ADDRESS_LEN];
    match address.ip() {
        IpAddr::V4(ip) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&ip.octets());
        }
    }
    BigEndian::write_u16(&mut out[17..], address.port());
    out
}

/// Decodes an address; `None` for anything that is not one another rank can connect to.
pub(crate) fn decode_address(bytes: &[u8; ADDRESS_LEN]) -> Option<SocketAddr> {
    let ip = match bytes[0] {
        4 if bytes[5..17].iter().all(|&b| b == 0) => {
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[1..5]).ok()?))
        }
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[1..17]).ok()?)),
        _ => return None,
    };
    let port = BigEndian::read_u16(&bytes[17..]);
    (port != 0 && !ip.is_unspecified()).then_some(SocketAddr::new(ip, port))
}

/// The answer to a second live claimant of a rank: both claimants' addresses.
pub(super) fn duplicate_message(first: SocketAddr, second: SocketAddr) -> Vec<u8> {
    let mut out = vec![DUPLICATE];
    out.extend_from_slice(&encode_address(first));
    out.extend_from_slice(&encode_address(second));
    out
}

/// The answer telling a waiting rank why rank 0 gave up.
pub(super) fn abort_message(reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(MAX_ABORT_TEXT);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = vec![ABORT, 0, 0];
    BigEndian::write_u16(&mut out[1..3], cut as u16);
    out.extend_from_slice(&reason.as_bytes()[..cut]);
    out
}

/// An abort's reason as this rank may print it: valid UTF-8 and no control characters, so
/// rank 0 (a token holder, but still another process) cannot forge log lines.
pub(super) fn abort_reason(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_unusable_ones_are_refused() {
        for text in ["10.0.0.5:29500", "[fd00::7]:1", "127.0.0.1:65535"] {
            let a: SocketAddr = text.parse().unwrap();
            assert_eq!(decode_address(&encode_address(a)), Some(a));
        }
        let good = encode_address("10.0.0.5:29500".parse().unwrap());
        let mut bad = good;
        bad[0] = 5;
        assert_eq!(decode_address(&bad), None);
        let mut bad = good;
        bad[9] = 1; // IPv4 with bytes past its four
        assert_eq!(decode_address(&bad), None);
        assert_eq!(decode_address(&encode_address("0.0.0.0:1".parse().unwrap())), None);
        assert_eq!(decode_address(&encode_address("10.0.0.5:0".parse().unwrap())), None);
    }
}

#[cfg(test)]
mod abort_tests {
    use super::*;

    #[test]
    fn an_abort_is_cut_at_a_character_and_its_reason_printable() {
        let long = "é".repeat(MAX_ABORT_TEXT);
        let m = abort_message(&long);
        let len = BigEndian::read_u16(&m[1..3]) as usize;
        assert_eq!((m[0], len, m.len()), (ABORT, MAX_ABORT_TEXT, 3 + MAX_ABORT_TEXT));
        assert_eq!(abort_reason(&m[3..]), "é".repeat(MAX_ABORT_TEXT / 2));
        assert_eq!(abort_reason(b"a\nforged\x1b[2J"), "a forged [2J");
    }
}
