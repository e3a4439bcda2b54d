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
//!  0 -> k  PING          k -> 0  PING           (another process claims rank k: still there?)
//!  0 -> k  LIST, world x Address                once every rank has sent one
//!       or DUPLICATE, Address, Address          two live processes claim rank k
//!       or ABORT, len: u16 BE, len bytes UTF-8  rank 0 gave up, and why (len <= 1024)
//!
//!  Address (19 bytes): | family: 4 or 6 | ip: 16 bytes, IPv4 in the first 4 | port: u16 BE |
//! ```
//!
//! The exchange speaks the handshake's [`VERSION`](crate::handshake::VERSION): a change to this
//! wire bumps it.
//!
//! Invariants:
//! - Rank 0 proves connections with the ring's own lobby (`rendezvous::accept`): the same
//!   handshake deadline, caps (in all, per source, per turn), eviction rule and rest when
//!   descriptors run out. The sources of ranks already admitted are preferred. Silent, slow or
//!   garbage-sending strangers cost a slot, never a real rank's place.
//! - A rank is listed only after it proved the token, as the rank its Hello named (which the
//!   MACs cover), so a stranger can neither claim a rank nor learn the list.
//! - A second process claiming a held rank is a duplicate only if the first still answers a
//!   PING within the handshake deadline: both are told, and rank 0 fails naming the rank.
//!   A first claimant that has closed, or does not answer (a dead host, a half-open
//!   connection), is replaced by the newcomer. Member connections have TCP keepalive.
//! - The list is sent only after every member is looked at once more, to all at once, on
//!   non-blocking sockets: one stalled rank delays no other, and one that has not taken it
//!   within the handshake deadline is left behind.
//! - When rank 0 fails (timeout, duplicate) it tells every waiting rank why (ABORT); its
//!   timeout names each missing rank and the last refusal of a connection claiming it.
//! - A joining rank retries a connection lost before the list arrives (rank 0 restarting, or
//!   dropping it for room); a refusal, a duplicate or an abort is final.
//! - Every wait ends at the caller's deadline; lengths are fixed or bounded (an abort's reason),
//!   so nothing read sizes an allocation beyond [`wire::MAX_ABORT_TEXT`].

mod join;
mod member;
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

    use super::wire::{ADDRESS_LEN, DUPLICATE, NO_ROSTER, PING, encode_address, exchange_key};
    use crate::error::ConnectError;
    use crate::handshake::{Acceptor, Connector, MESSAGE_LEN, Message, MessageKind, Next};

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
        prove_by_hand(TcpStream::connect(server).unwrap(), rank, world, own)
    }

    /// [`claim_by_hand`] on a connection already made.
    fn prove_by_hand(mut stream: TcpStream, rank: u32, world: u32, own: SocketAddr) -> TcpStream {
        let key = exchange_key(b"t");
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (connector, hello) = Connector::start(&key, NO_ROSTER, world, rank, 0, [5; 16]);
        let mut connector = connector.blind();
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

    /// A stranger from `source` that sends a valid Hello (right version and world, a rank of
    /// the world) to `server` and then holds the connection.
    fn stranger(source: &str, server: SocketAddr, rank: u32) -> socket2::Socket {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.bind(&format!("{source}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
        socket.connect(&server.into()).unwrap();
        let hello = Connector::start(b"no-key", NO_ROSTER, 2, rank, 0, [7; 16]).1;
        (&socket).write_all(&hello.encode()).unwrap();
        socket
    }

    /// Finding 2: a real rank that arrives in one burst with hundreds of strangers sending
    /// valid Hellos from one other host keeps its connection: it is never the one dropped for
    /// room (the rule took "the oldest without a Hello", which a rank accepted in the same
    /// batch always was), so it joins on its first connection, not after retries.
    #[test]
    fn a_rank_in_a_burst_of_strangers_from_another_host_is_never_dropped_for_room() {
        let listener = crate::bind::listen("127.0.0.1", addr("127.0.0.1:0")).unwrap();
        let at = listener.local_addr().unwrap();
        // All of them wait in the listener's backlog before rank 0 accepts one.
        let mut strangers: Vec<_> = (0..300).map(|_| stranger("127.0.0.2", at, 1)).collect();
        let real = TcpStream::connect(at).unwrap();
        strangers.extend((0..300).map(|_| stranger("127.0.0.2", at, 1)));
        let rank1 = thread::spawn(move || {
            let mut stream = prove_by_hand(real, 1, 2, addr("10.0.0.2:200"));
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).map(|_| answer)
        });
        let timeout = Duration::from_secs(20);
        let list = serve(&Serve {
            listener: &listener,
            world: 2,
            own: addr("10.0.0.1:100"),
            token: b"t",
            deadline: Instant::now() + timeout,
            timeout,
        })
        .unwrap();
        assert_eq!(list, [addr("10.0.0.1:100"), addr("10.0.0.2:200")]);
        let answer = rank1.join().expect("rank 1 kept its one connection").unwrap();
        assert_eq!(answer.len(), 1 + 2 * ADDRESS_LEN, "rank 1 got the list on that connection");
        drop(strangers);
    }

    /// A token holder (or anyone on the path) that rewrites the Proof's rank field: the Hello
    /// claims `hello_rank`, the Proof says `proof_rank`. Returns what rank 0 answered.
    fn rewritten_proof(server: SocketAddr, hello_rank: u32, proof_rank: u32) -> Vec<u8> {
        let key = exchange_key(b"t");
        let mut stream = TcpStream::connect(server).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (connector, hello) = Connector::start(&key, NO_ROSTER, 3, hello_rank, 0, [6; 16]);
        let mut connector = connector.blind();
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

    /// A rank waiting for the list by hand that answers rank 0's pings (a live process), until
    /// anything else arrives; returns what that was, to the end.
    fn answering_pings(mut stream: TcpStream) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                stream.read_exact(&mut byte).unwrap();
                if byte[0] != PING {
                    break;
                }
                stream.write_all(&[PING]).unwrap();
            }
            let mut rest = byte.to_vec();
            let _ = stream.read_to_end(&mut rest);
            rest
        })
    }

    #[test]
    fn ranks_that_never_join_time_out_named_with_no_address() {
        let (at, server) = server(4, Duration::from_millis(300));
        let _rank2 = claim_by_hand(at, 2, 4, addr("10.0.0.3:300"));
        let e = server.join().unwrap().unwrap_err();
        assert_eq!((e.kind(), e.peer(), e.address()), ("timeout", Some(1), None), "{e}");
        let ConnectError::RendezvousTimeout { rendezvous, missing, .. } = &e else {
            panic!("not a rendezvous timeout: {e:?}");
        };
        assert_eq!(
            (rendezvous.as_str(), missing.as_slice()),
            (at.to_string().as_str(), &[1, 3][..])
        );
    }

    #[test]
    fn a_live_second_claimant_is_refused_with_the_first_and_both_are_told() {
        let (at, server) = server(3, Duration::from_secs(20));
        let first = answering_pings(claim_by_hand(at, 2, 3, addr("10.0.0.3:300")));
        let second = joiner(at, 2, 3, addr("10.0.0.4:400"), b"t");
        let e = second.join().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "two processes claim rank 2 (10.0.0.3:300 and 10.0.0.4:400); each rank must be \
             started once"
        );
        assert_eq!(server.join().unwrap().unwrap_err(), e);
        let answer = first.join().unwrap();
        assert_eq!((answer[0], answer.len()), (DUPLICATE, 1 + 2 * ADDRESS_LEN));
    }

    /// Finding 6: a first life whose connection stays open but says nothing (its host died, the
    /// connection is half-open; or the process is frozen) does not keep its rank.
    #[test]
    fn a_first_life_that_no_longer_answers_is_replaced_by_the_rank_that_restarted() {
        let (at, server) = server(3, Duration::from_secs(30));
        let mut half_open = claim_by_hand(at, 1, 3, addr("10.0.0.2:200"));
        let second_life = joiner(at, 1, 3, addr("10.0.0.2:201"), b"t");
        // Rank 0 asks the first life whether it is there; it never answers. Rank 2 starts only
        // then, so the list cannot be complete before the contest for rank 1.
        let mut asked = [0u8; 1];
        half_open.read_exact(&mut asked).unwrap();
        assert_eq!(asked[0], PING);
        let rank2 = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        let expected = vec![addr("10.0.0.1:100"), addr("10.0.0.2:201"), addr("10.0.0.3:300")];
        assert_eq!(server.join().unwrap().unwrap(), expected);
        assert_eq!(second_life.join().unwrap().unwrap(), expected);
        assert_eq!(rank2.join().unwrap().unwrap(), expected);
    }

    /// Finding 13: rank 0 names the rank it refused and why, and the rank that waited is told
    /// why rank 0 gave up rather than that it closed.
    #[test]
    fn rank_0_names_the_ranks_it_refused_and_tells_every_waiting_rank_why_it_gave_up() {
        let (at, server) = server(3, Duration::from_secs(2));
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        let e = joiner(at, 2, 3, addr("10.0.0.3:300"), b"other").join().unwrap().unwrap_err();
        assert!(e.to_string().contains("check SILVIC_JOB_TOKEN"), "{e}");
        let e = server.join().unwrap().unwrap_err();
        let text = e.to_string();
        assert_eq!(e.peer(), Some(2));
        assert!(text.contains("ranks [2] never gave their addresses"), "{text}");
        assert!(text.contains("a connection claiming rank 2 (from 127.0.0.1:"), "{text}");
        assert!(text.contains("was refused: job token mismatch"), "{text}");
        let told = one.join().unwrap().unwrap_err();
        assert_eq!(
            told,
            ConnectError::ExchangeAbandoned { address: at.to_string(), reason: text.clone() }
        );
        assert!(told.to_string().starts_with("rank 0 at "), "{told}");
    }

    /// Finding 2 (`join`): a connection rank 0 drops after its Challenge (for room, under a
    /// flood), or after the address (rank 0 restarted), is tried again, not fatal.
    #[test]
    fn a_rank_whose_connection_rank_0_drops_before_the_list_tries_again() {
        for drop_after_address in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = listener.local_addr().unwrap();
            let one = joiner(at, 1, 2, addr("10.0.0.2:200"), b"t");
            let (mut first, _) = listener.accept().unwrap();
            let key = exchange_key(b"t");
            let mut acceptor = Acceptor::any_other_rank(&key, NO_ROSTER, 2, 0, [3; 16]);
            let mut inbox = [0u8; MESSAGE_LEN];
            first.read_exact(&mut inbox).unwrap();
            let Next::Send(challenge) = acceptor.on_message(&Message::decode(&inbox).unwrap())
            else {
                panic!("the joiner's Hello")
            };
            first.write_all(&challenge.encode()).unwrap();
            first.read_exact(&mut inbox).unwrap();
            if drop_after_address {
                let Next::SendAndDone(welcome) =
                    acceptor.on_message(&Message::decode(&inbox).unwrap())
                else {
                    panic!("the joiner's Proof")
                };
                first.write_all(&welcome.encode()).unwrap();
                first.read_exact(&mut [0u8; ADDRESS_LEN]).unwrap();
            }
            drop(first); // rank 0 dies, or drops the connection for room
            let timeout = Duration::from_secs(20);
            let list = serve(&Serve {
                listener: &listener,
                world: 2,
                own: addr("10.0.0.1:100"),
                token: b"t",
                deadline: Instant::now() + timeout,
                timeout,
            })
            .unwrap();
            assert_eq!(list, [addr("10.0.0.1:100"), addr("10.0.0.2:200")]);
            assert_eq!(one.join().unwrap().unwrap(), list, "after address: {drop_after_address}");
        }
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
            format!(
                "job token mismatch with rank 0 at {at}: check SILVIC_JOB_TOKEN (the same on \
                 every rank of the job), and that this port is your job's rank 0's, not another \
                 job's"
            )
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

    /// Finding 7: a stranger cannot learn rank 0's world size or version, one connection per
    /// guess, from which Hello it refuses first: every Hello gets the same answer.
    #[test]
    fn a_stranger_learns_neither_world_nor_version_from_rank_0s_first_answer() {
        let (at, server) = server(3, Duration::from_secs(20));
        let answer = |version: u16, world: u32, rank: u32| {
            let mut stream = TcpStream::connect(at).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut hello = Connector::start(b"guess", NO_ROSTER, world, rank, 0, [8; 16]).1;
            hello.version = version;
            stream.write_all(&hello.encode()).unwrap();
            let mut inbox = [0u8; MESSAGE_LEN];
            stream.read_exact(&mut inbox).unwrap();
            let m = Message::decode(&inbox).unwrap();
            (m.version, m.kind, m.world, m.rank)
        };
        let version = crate::handshake::VERSION;
        let right = answer(version, 3, 1);
        for (v, world, rank) in
            [(version, 4, 1), (version, 2, 1), (version + 1, 3, 1), (version, 3, 7)]
        {
            assert_eq!(answer(v, world, rank), right, "version {v}, world {world}, rank {rank}");
        }
        assert_eq!(right, (0, MessageKind::Challenge, 0, 0), "the Challenge claims nothing");
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        let two = joiner(at, 2, 3, addr("10.0.0.3:300"), b"t");
        assert_eq!(server.join().unwrap().unwrap().len(), 3);
        assert!(one.join().unwrap().is_ok() && two.join().unwrap().is_ok());
    }

    /// Finding 12: a rank that does not read the list (stalled) holds up no other rank, and
    /// rank 0 does not wait on it for the rest of its time. The world is large enough for the
    /// list (95 KB) to overflow the stalled rank's buffers and rank 0's send buffer, which the
    /// stalled rank's small segment size keeps small.
    #[test]
    fn a_rank_that_stalls_on_the_list_holds_up_no_other() {
        const WORLD: u32 = 5000;
        // Both ends of every rank's connection are in this process: raise the soft limit.
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        let needed = 2 * u64::from(WORLD) + 256;
        if limit.current.is_some_and(|current| current < needed) {
            limit.current = Some(needed);
            // The hard limit too, where it is lower (root may raise it).
            limit.maximum = limit.maximum.map(|max| max.max(needed));
            let raised = setrlimit(Resource::Nofile, limit);
            assert!(raised.is_ok(), "this test needs {needed} descriptors: {raised:?}");
        }
        // Well past what the 5000 handshakes take themselves (a debug build on 2 loaded cores:
        // 40 to 56 s), so that a rank 0 that waited out its timeout on the stalled rank (more
        // than 180 s in all) is far from one that did not (under half of it).
        let timeout = Duration::from_secs(180);
        let (at, server) = server(WORLD as usize, timeout);
        let started = Instant::now();
        // Rank 1 stalls: a tiny receive buffer, and it never reads.
        let stalled = {
            let socket =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket.set_recv_buffer_size(1).unwrap();
            socket.set_tcp_mss(536).unwrap();
            socket.connect(&at.into()).unwrap();
            prove_by_hand(socket.into(), 1, WORLD, addr("10.0.0.2:200"))
        };
        let mut others: Vec<TcpStream> = (2..WORLD)
            .map(|r| {
                claim_by_hand(
                    at,
                    r,
                    WORLD,
                    SocketAddr::from(([10, 1, (r >> 8) as u8, r as u8], 300)),
                )
            })
            .collect();
        // The last rank's list arrives whole while rank 1 still has not read a byte.
        let last = others.last_mut().unwrap();
        let mut list = vec![0u8; 1 + WORLD as usize * ADDRESS_LEN];
        last.read_exact(&mut list).unwrap();
        assert_eq!(list[0], super::wire::LIST);
        let got = server.join().unwrap().unwrap();
        assert_eq!(got.len(), WORLD as usize);
        assert!(
            started.elapsed() < timeout / 2,
            "rank 0 spent its timeout on the stalled rank: {:?}",
            started.elapsed()
        );
        drop(stalled);
    }

    /// Finding 13: while rank 0 waits, it says for whom, at the warning level.
    #[test]
    fn rank_0_says_whom_it_waits_for_while_it_waits() {
        #[derive(Clone, Default)]
        struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let timeout = Duration::from_secs(7);
        let rank0 = thread::spawn(move || {
            tracing::subscriber::with_default(subscriber, || {
                serve(&Serve {
                    listener: &listener,
                    world: 3,
                    own: addr("10.0.0.1:100"),
                    token: b"t",
                    deadline: Instant::now() + timeout,
                    timeout,
                })
            })
        });
        let one = joiner(at, 1, 3, addr("10.0.0.2:200"), b"t");
        assert!(rank0.join().unwrap().is_err(), "rank 2 never came");
        assert!(one.join().unwrap().is_err());
        let logged = String::from_utf8_lossy(&capture.0.lock().unwrap()).into_owned();
        assert!(logged.contains("WARN"), "{logged}");
        assert!(logged.contains("waited 5 s for ranks [2] (2 of 3 joined)"), "{logged}");
    }

    /// Finding 14: the last real error is kept (rank 0 never started: the connection was
    /// refused), and a port that answers nothing is named as perhaps another program's.
    #[test]
    fn a_joiner_that_gives_up_says_what_went_wrong_last() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let e = join(&Join {
            server: closed,
            rank: 1,
            world: 2,
            own: addr("10.0.0.2:200"),
            token: b"t",
            deadline: Instant::now() + Duration::from_millis(300),
            timeout: Duration::from_millis(300),
        })
        .unwrap_err();
        assert!(e.to_string().contains("(last error: Connection refused"), "{e}");
        // Accepts (the backlog), never answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let timeout = Duration::from_secs(6);
        let e = join(&Join {
            server: silent.local_addr().unwrap(),
            rank: 1,
            world: 2,
            own: addr("10.0.0.2:200"),
            token: b"t",
            deadline: Instant::now() + timeout,
            timeout,
        })
        .unwrap_err();
        assert!(e.to_string().contains("is another program listening on that port?"), "{e}");
    }

    /// What a hostile or broken rank 0 does to a joiner, in [`a_joiner_meets_its_deadline`].
    #[derive(Debug, Clone, Copy)]
    enum Rank0 {
        /// Accepts, and never says a word.
        Silent,
        /// Sends its Challenge one byte at a time.
        TrickledChallenge,
        /// Takes the address, then asks whether the rank is still there, for ever.
        Pings,
        /// Takes the address, then sends the list one byte at a time.
        TrickledList,
    }

    /// Serves one joiner as `rank0` says, until the joiner goes or a minute has passed.
    fn hostile_rank0(rank0: Rank0) -> (SocketAddr, thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            let slowly = |stream: &mut TcpStream, bytes: &[u8]| {
                for byte in bytes {
                    if stream.write_all(&[*byte]).is_err() || Instant::now() > until {
                        return false;
                    }
                    thread::sleep(Duration::from_millis(200));
                }
                true
            };
            let mut inbox = [0u8; MESSAGE_LEN];
            if matches!(rank0, Rank0::Silent) || stream.read_exact(&mut inbox).is_err() {
                // Holds the connection open, answering nothing.
                let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                let _ = stream.read_to_end(&mut Vec::new());
                return;
            }
            let key = exchange_key(b"t");
            let mut acceptor = Acceptor::any_other_rank(&key, NO_ROSTER, 2, 0, [3; 16]);
            let Next::Send(challenge) = acceptor.on_message(&Message::decode(&inbox).unwrap())
            else {
                panic!("the joiner's Hello")
            };
            if matches!(rank0, Rank0::TrickledChallenge) {
                slowly(&mut stream, &challenge.encode());
                return;
            }
            stream.write_all(&challenge.encode()).unwrap();
            stream.read_exact(&mut inbox).unwrap();
            let Next::SendAndDone(welcome) = acceptor.on_message(&Message::decode(&inbox).unwrap())
            else {
                panic!("the joiner's Proof")
            };
            stream.write_all(&welcome.encode()).unwrap();
            stream.read_exact(&mut [0u8; ADDRESS_LEN]).unwrap();
            match rank0 {
                Rank0::Pings => {
                    stream.set_nonblocking(true).unwrap();
                    while Instant::now() < until {
                        if stream.write(&[PING]).is_err() {
                            return; // the joiner gave up
                        }
                        let _ = stream.read(&mut [0u8; 64]);
                        thread::sleep(Duration::from_millis(5));
                    }
                }
                _ => {
                    let mut list = vec![super::wire::LIST];
                    list.extend_from_slice(&encode_address(addr("10.0.0.1:100")));
                    list.extend_from_slice(&encode_address(addr("10.0.0.2:200")));
                    slowly(&mut stream, &list);
                }
            }
        });
        (at, handle)
    }

    /// Finding 4 of the second review: every wait of a joining rank ends at its deadline, plus
    /// a second: a rank 0 that says nothing, trickles its answers a byte at a time, or sends
    /// PINGs for ever (each of which used to re-arm the wait) holds it no longer.
    #[test]
    fn a_joiner_meets_its_deadline() {
        let timeout = Duration::from_secs(2);
        let joiners: Vec<_> =
            [Rank0::Silent, Rank0::TrickledChallenge, Rank0::Pings, Rank0::TrickledList]
                .into_iter()
                .map(|rank0| {
                    let (at, _hostile) = hostile_rank0(rank0);
                    let started = Instant::now();
                    let joiner = thread::spawn(move || {
                        join(&Join {
                            server: at,
                            rank: 1,
                            world: 2,
                            own: addr("10.0.0.2:200"),
                            token: b"t",
                            deadline: started + timeout,
                            timeout,
                        })
                    });
                    (rank0, started, joiner)
                })
                .collect();
        for (rank0, started, joiner) in joiners {
            let outcome = joiner.join().unwrap();
            let took = started.elapsed();
            assert!(took <= timeout + Duration::from_secs(1), "{rank0:?}: returned after {took:?}");
            let e = outcome.unwrap_err();
            assert_eq!(e.kind(), "timeout", "{rank0:?}: {e}");
        }
    }

    /// The same through `from_env`: its timeout bounds the whole start, however rank 0 waits.
    #[test]
    fn from_env_meets_its_deadline_under_a_rank_0_that_pings_for_ever() {
        let (at, _hostile) = hostile_rank0(Rank0::Pings);
        let timeout = Duration::from_secs(2);
        let vars = move |name: &str| match name {
            "SILVIC_RANK" => Some("1".to_string()),
            "SILVIC_WORLD_SIZE" => Some("2".into()),
            "SILVIC_RENDEZVOUS" => Some(format!("tcp://{at}")),
            "SILVIC_JOB_TOKEN" => Some("t".into()),
            _ => None,
        };
        let started = Instant::now();
        let e = crate::TcpCollective::from_vars(vars, timeout).map(drop).unwrap_err();
        let took = started.elapsed();
        assert!(took <= timeout + Duration::from_secs(1), "returned after {took:?}");
        assert_eq!(e.kind(), "timeout", "{e}");
    }

    #[test]
    fn the_exchange_key_is_not_the_token_and_depends_on_it() {
        assert_ne!(exchange_key(b"a"), exchange_key(b"b"));
        assert_ne!(&exchange_key(b"a")[..1], b"a");
    }
}
