//! The address exchange: rank 0 serves a port where every other rank sends its ring address
//! and gets the whole list back, for launchers that set variables but gather nothing.
//!
//! One connection per rank `k` to rank 0:
//!
//! ```text
//!  k -> 0  Hello { world, rank k, nonce_k }     the ring handshake's four messages, rank k as
//!  0 -> k  Challenge { world, 0, nonce_0 }      connector and rank 0 as acceptor, keyed with
//!  k -> 0  Proof { mac_k }                      HMAC-SHA256(job token, EXCHANGE_LABEL) so that
//!  0 -> k  Welcome { mac_0 }                    no exchange proof is valid on a ring port
//!  k -> 0  Address                              k's ring address
//!  0 -> k  LIST, world x Address                once every rank has sent one
//!       or DUPLICATE, Address, Address          two live processes claim rank k
//!
//!  Address (19 bytes): | family: 4 or 6 | ip: 16 bytes, IPv4 in the first 4 | port: u16 BE |
//! ```
//!
//! Invariants:
//! - Rank 0 drives every connection from one poll loop, each with its own short handshake
//!   deadline: silent, slow or garbage-sending strangers are dropped without delaying anyone,
//!   and at most `serve::MAX_PENDING` are held at once.
//! - A rank is listed only after it proved the token, so a stranger can neither claim a rank
//!   nor learn the list.
//! - A second process claiming a rank whose first claimant's connection is still open is a
//!   duplicate: both are told, and rank 0 fails naming the rank. If the first one's connection
//!   has closed (a rank that restarted before the list was complete), the newcomer takes its
//!   place.
//! - Every wait ends at the caller's deadline; lengths are fixed, so nothing read sizes an
//!   allocation.

mod join;
mod serve;
mod wire;

pub(crate) use join::{Join, join};
pub(crate) use serve::{Serve, serve};

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::thread;
    use std::time::{Duration, Instant};

    use super::wire::{ADDRESS_LEN, DUPLICATE, NO_ROSTER, encode_address, exchange_key};
    use crate::error::ConnectError;
    use crate::handshake::{Connector, MESSAGE_LEN, Message, MessageKind, Next};

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    /// Rank 0 serving a world of `world` on loopback, in a thread, for `timeout`.
    fn server(
        world: usize,
        timeout: Duration,
    ) -> (SocketAddr, thread::JoinHandle<Result<Vec<SocketAddr>, ConnectError>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            serve(&Serve {
                listener: &listener,
                world,
                own: addr("10.0.0.1:100"),
                token: b"t",
                deadline: Instant::now() + timeout,
                timeout,
            })
        });
        (at, handle)
    }

    fn joiner(
        server: SocketAddr,
        rank: usize,
        world: usize,
        own: SocketAddr,
        token: &'static [u8],
    ) -> thread::JoinHandle<Result<Vec<SocketAddr>, ConnectError>> {
        let timeout = Duration::from_secs(20);
        thread::spawn(move || {
            join(&Join {
                server,
                rank,
                world,
                own,
                token,
                deadline: Instant::now() + timeout,
                timeout,
            })
        })
    }

    /// Proves the token as `rank` and sends `own`, then returns the open stream (a rank that
    /// joined and waits for the list).
    fn claim_by_hand(server: SocketAddr, rank: u32, world: u32, own: SocketAddr) -> TcpStream {
        let key = exchange_key(b"t");
        let mut stream = TcpStream::connect(server).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (mut connector, hello) = Connector::start(&key, NO_ROSTER, world, rank, 0, [5; 16]);
        stream.write_all(&hello.encode()).unwrap();
        let mut inbox = [0u8; MESSAGE_LEN];
        loop {
            stream.read_exact(&mut inbox).unwrap();
            match connector.on_message(&Message::decode(&inbox).unwrap()) {
                Next::Send(m) => stream.write_all(&m.encode()).unwrap(),
                Next::Done => break,
                other => panic!("handshake: {other:?}"),
            }
        }
        stream.write_all(&encode_address(own)).unwrap();
        stream
    }

    /// A token holder (or anyone on the path) that rewrites the Proof's rank field: the Hello
    /// claims `hello_rank`, the Proof says `proof_rank`. Returns what rank 0 answered.
    fn rewritten_proof(server: SocketAddr, hello_rank: u32, proof_rank: u32) -> Vec<u8> {
        let key = exchange_key(b"t");
        let mut stream = TcpStream::connect(server).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (mut connector, hello) = Connector::start(&key, NO_ROSTER, 3, hello_rank, 0, [6; 16]);
        stream.write_all(&hello.encode()).unwrap();
        let mut inbox = [0u8; MESSAGE_LEN];
        stream.read_exact(&mut inbox).unwrap();
        let Next::Send(mut proof) = connector.on_message(&Message::decode(&inbox).unwrap()) else {
            panic!("no challenge")
        };
        proof.rank = proof_rank;
        stream.write_all(&proof.encode()).unwrap();
        let _ = stream.write_all(&encode_address(addr("10.6.6.6:666")));
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    }

    #[test]
    fn a_proof_whose_rank_differs_from_the_hellos_is_refused_and_never_listed() {
        let (at, server) = server(3, Duration::from_secs(20));
        for (hello_rank, proof_rank) in [(1, u32::MAX), (1, 2), (2, 1), (1, 3)] {
            let answer = rewritten_proof(at, hello_rank, proof_rank);
            let refusal = Message::decode(answer[..MESSAGE_LEN].try_into().unwrap()).unwrap();
            assert!(matches!(refusal.kind, MessageKind::Reject(_)), "{refusal:?}");
            assert_eq!(answer.len(), MESSAGE_LEN, "nothing after the refusal");
        }
        // Rank 0 is still serving, and lists only the real ranks.
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        let two = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        let expected = vec![addr("10.0.0.1:100"), addr("10.0.0.2:200"), addr("10.0.0.3:300")];
        assert_eq!(server.join().expect("rank 0 does not panic").unwrap(), expected);
        assert_eq!(one.join().unwrap().unwrap(), expected);
        assert_eq!(two.join().unwrap().unwrap(), expected);
    }

    #[test]
    fn a_rank_that_restarts_before_the_list_is_complete_takes_its_place() {
        let (at, server) = server(3, Duration::from_secs(20));
        // The first life of rank 1 joins, then dies (its connection closes).
        drop(claim_by_hand(at, 1, 3, addr("10.0.0.2:200")));
        let second_life = joiner(at, 1, 3, addr("10.0.0.2:201"), b"t");
        let rank2 = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        let expected = vec![addr("10.0.0.1:100"), addr("10.0.0.2:201"), addr("10.0.0.3:300")];
        assert_eq!(server.join().unwrap().unwrap(), expected);
        assert_eq!(second_life.join().unwrap().unwrap(), expected);
        assert_eq!(rank2.join().unwrap().unwrap(), expected);
    }

    #[test]
    fn a_live_second_claimant_is_refused_with_the_first_and_both_are_told() {
        let (at, server) = server(3, Duration::from_secs(20));
        let mut first = claim_by_hand(at, 2, 3, addr("10.0.0.3:300"));
        let second = joiner(at, 2, 3, addr("10.0.0.4:400"), b"t");
        let e = second.join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "two processes claim rank 2 (10.0.0.3:300 and 10.0.0.4:400); each rank must be \
             started once"
        );
        assert_eq!(server.join().unwrap().unwrap_err(), e);
        let mut answer = [0u8; 1 + 2 * ADDRESS_LEN];
        first.read_exact(&mut answer).unwrap();
        assert_eq!(answer[0], DUPLICATE);
    }

    #[test]
    fn another_world_or_token_is_refused_by_rank_0_naming_it() {
        let (at, server) = server(3, Duration::from_secs(20));
        let e = joiner(at, 1, 4, addr("10.0.0.2:200"), b"t").join().unwrap().unwrap_err();
        assert!(e.to_string().starts_with("world size mismatch with rank 0"), "{e}");
        assert!(e.to_string().contains("this rank has a world of 4"), "{e}");
        let e = joiner(at, 1, 3, addr("10.0.0.2:200"), b"u").join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("job token mismatch with rank 0 at {at}: check SILVIC_JOB_TOKEN")
        );
        let e = joiner(at, 5, 3, addr("10.0.0.2:200"), b"t").join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("rank mismatch with rank 0 at {at}: rank 5 is outside the world of 3")
        );
        // The refusals left rank 0 serving: the real ranks still get the list.
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        let two = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        assert_eq!(server.join().unwrap().unwrap().len(), 3);
        assert_eq!(one.join().unwrap().unwrap().len(), 3);
        assert_eq!(two.join().unwrap().unwrap().len(), 3);
    }

    #[test]
    fn the_exchange_key_is_not_the_token_and_depends_on_it() {
        assert_ne!(exchange_key(b"a"), exchange_key(b"b"));
        assert_ne!(&exchange_key(b"a")[..1], b"a");
    }
}
