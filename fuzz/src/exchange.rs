//! The exchange_rank0 oracle: rank 0's side of `from_env`'s address exchange
//! (`silvic_net::fuzzing::exchange_rank0`), on loopback, against up to eight strangers whose
//! bytes are the fuzzer's, some opening with a valid Hello so that their bytes reach the proof
//! and what follows, while the honest ranks of a world of two to five join.
//!
//! Input: one byte (the world, `2 + b % 4`), then per stranger one byte of flags and one of
//! length, then that many bytes. Flags bit 0: open with a valid Hello for rank `flags >> 1`
//! (mod the world plus one, so a rank outside the world too).
//!
//! Checked: nothing panics; no stranger (none holds the token) breaks the exchange or claims a
//! rank: rank 0 returns the honest list, and every honest rank gets that same list.

use std::net::SocketAddr;
use std::time::Duration;

use silvic_net::fuzzing::exchange_rank0 as run;
use silvic_net::handshake::Connector;

const TOKEN: &[u8] = b"the-exchange-fuzz-token";
/// Far above an honest exchange on loopback (milliseconds): reaching it is a failure.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Rank 0's side of the exchange against the strangers `data` describes.
pub fn exchange_rank0(data: &[u8]) {
    let Some((&head, mut rest)) = data.split_first() else { return };
    let world = 2 + usize::from(head % 4);
    let mut strangers: Vec<Vec<u8>> = Vec::new();
    while let [flags, len, tail @ ..] = rest {
        if strangers.len() == 8 {
            break;
        }
        let len = usize::from(*len).min(tail.len());
        let mut bytes = Vec::new();
        if flags & 1 == 1 {
            let rank = u32::from(flags >> 1) % (world as u32 + 1);
            let (_, hello) =
                Connector::start(b"not-the-key", [0; 32], world as u32, rank, 0, [9; 16]);
            bytes.extend_from_slice(&hello.encode());
        }
        bytes.extend_from_slice(&tail[..len]);
        strangers.push(bytes);
        rest = &tail[len..];
    }
    let borrowed: Vec<&[u8]> = strangers.iter().map(Vec::as_slice).collect();
    let (served, joined) = run(world, TOKEN, &borrowed, TIMEOUT);
    let expected: Vec<SocketAddr> =
        (0..world).map(|r| SocketAddr::from(([10, 0, 0, r as u8], r as u16 + 1))).collect();
    assert_eq!(served, Ok(expected.clone()), "rank 0 with strangers {strangers:?}");
    for (i, list) in joined.into_iter().enumerate() {
        assert_eq!(list, Ok(expected.clone()), "rank {} with strangers {strangers:?}", i + 1);
    }
}
