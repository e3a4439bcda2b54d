//! The oracle of the `handshake_roles` target: an `Acceptor` (of one rank, or of a set of
//! ranks as a ring with chords has) and a `Connector`, each driven through up to six messages
//! chosen from honest, replayed, mutated, wrong-token and arbitrary ones (see the crate doc for
//! what it checks).

use libfuzzer_sys::arbitrary::{Result as ArbitraryResult, Unstructured};
use silvic_net::handshake::{
    Acceptor, Connector, Failure, MAGIC, MESSAGE_LEN, Message, MessageKind, Next, VERSION,
};

/// How the fuzzer picks the next message a role under test receives.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// What the honest other side says next.
    Honest,
    /// The honest message with one byte changed.
    Flipped,
    /// A message the honest other side sent earlier.
    Replay,
    /// What a peer with another job token says at this point.
    WrongToken,
    /// Any 72 bytes that decode.
    Arbitrary,
}

fn pick(u: &mut Unstructured<'_>) -> ArbitraryResult<Pick> {
    // The empty input (all zero choices) is the honest exchange.
    Ok(match u.int_in_range(0..=7u8)? {
        0..=3 => Pick::Honest,
        4 => Pick::Flipped,
        5 => Pick::Replay,
        6 => Pick::WrongToken,
        _ => Pick::Arbitrary,
    })
}

/// Applies `pick` to `honest`, the message the honest side would send now.
fn choose(
    u: &mut Unstructured<'_>,
    pick: Pick,
    honest: Option<Message>,
    sent: &[Message],
    wrong: Option<Message>,
) -> ArbitraryResult<Option<Message>> {
    Ok(match pick {
        Pick::Honest => honest,
        Pick::Flipped => honest.and_then(|m| {
            let mut bytes = m.encode();
            let at = u.choose_index(MESSAGE_LEN).ok()?;
            bytes[at] ^= u.int_in_range(1..=255u8).ok()?;
            Message::decode(&bytes).ok()
        }),
        Pick::Replay => (!sent.is_empty()).then(|| sent[u.choose_index(sent.len()).unwrap_or(0)]),
        Pick::WrongToken => wrong,
        Pick::Arbitrary => {
            let bytes: [u8; MESSAGE_LEN] = u.arbitrary()?;
            let mut bytes = bytes;
            if u.arbitrary()? {
                bytes[..8].copy_from_slice(&MAGIC); // mostly past the magic check
                bytes[68..].fill(0);
            }
            Message::decode(&bytes).ok()
        }
    })
}

fn reply_of(next: &Next) -> Option<Message> {
    match next {
        Next::Send(m) | Next::SendAndDone(m) | Next::Fail(_, Some(m)) => Some(*m),
        Next::Done | Next::Fail(_, None) => None,
    }
}

/// Checks what one step of a role returned, given whether it had already finished.
fn check_step(next: &Next, finished: bool) {
    if finished {
        assert!(matches!(next, Next::Fail(..)), "a finished role went on: {next:?}");
    }
    if let Next::Fail(failure, reply) = next {
        match (failure, reply) {
            (Failure::Refused(reason), Some(m)) => {
                assert_eq!(m.kind, MessageKind::Reject(*reason), "a refusal says why");
                let nothing_else = (m.version, m.world, m.rank, m.nonce, m.mac);
                assert_eq!(nothing_else, (0, 0, 0, [0; 16], [0; 32]), "a refusal says only why");
            }
            (Failure::Refused(_), None) => panic!("a refusal is sent to the other side"),
            (_, Some(m)) => panic!("only a refusal sends a message, not {m:?}"),
            (_, None) => {}
        }
    }
}

/// The parameters both roles share, drawn from the input.
struct Setup {
    token: Vec<u8>,
    other_token: Vec<u8>,
    roster: [u8; 32],
    world: u32,
    connector: u32,
    acceptor: u32,
    nonce_c: [u8; 16],
    nonce_a: [u8; 16],
    /// Whether the acceptor under test takes any rank of `among` (as a ring with chords does)
    /// rather than the connector alone.
    from_set: bool,
    /// The connector and up to three other ranks, never the acceptor.
    among: Vec<usize>,
}

impl Setup {
    /// Whether the acceptor under test may challenge a Hello naming `rank`.
    fn admits(&self, rank: u32) -> bool {
        match self.from_set {
            true => usize::try_from(rank).is_ok_and(|r| self.among.contains(&r)),
            false => rank == self.connector,
        }
    }
}

fn setup(u: &mut Unstructured<'_>) -> ArbitraryResult<Setup> {
    let mut token: Vec<u8> = u.arbitrary()?;
    if token.is_empty() {
        token = b"job-token".to_vec();
    }
    let mut other_token = token.clone();
    other_token.push(u.arbitrary()?);
    let world = u.int_in_range(2..=u32::MAX)?;
    let connector = u.int_in_range(0..=world - 1)?;
    let acceptor = (connector + 1) % world;
    let (roster, nonce_c, nonce_a) = (u.arbitrary()?, u.arbitrary()?, u.arbitrary()?);
    let from_set: bool = u.arbitrary()?;
    let mut among = vec![connector as usize];
    for _ in 0..u.int_in_range(0..=3)? {
        let rank = u.int_in_range(0..=world - 1)?;
        if rank != acceptor {
            among.push(rank as usize);
        }
    }
    Ok(Setup {
        token,
        other_token,
        roster,
        world,
        connector,
        acceptor,
        nonce_c,
        nonce_a,
        from_set,
        among,
    })
}

/// Drives the Acceptor and the Connector under test, each through up to six messages.
pub fn handshake_roles(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(s) = setup(&mut u) else { return };
    let _ = drive_acceptor(&mut u, &s);
    let _ = drive_connector(&mut u, &s);
}

/// The proof a holder of the token sends, as the rank `hello` names, after `hello` and
/// `challenge`.
fn honest_proof(s: &Setup, hello: &Message, challenge: &Message) -> Option<Message> {
    let (mut c, _) =
        Connector::start(&s.token, s.roster, s.world, hello.rank, s.acceptor, hello.nonce);
    match c.on_message(challenge) {
        Next::Send(proof) => Some(proof),
        _ => None,
    }
}

fn drive_acceptor(u: &mut Unstructured<'_>, s: &Setup) -> ArbitraryResult<()> {
    let mut under_test = match s.from_set {
        true => Acceptor::from_one_of(&s.token, s.roster, s.world, s.acceptor, &s.among, s.nonce_a),
        false => Acceptor::new(&s.token, s.roster, s.world, s.acceptor, s.connector, s.nonce_a),
    };
    let (mut honest, hello) =
        Connector::start(&s.token, s.roster, s.world, s.connector, s.acceptor, s.nonce_c);
    let (mut wrong, wrong_hello) =
        Connector::start(&s.other_token, s.roster, s.world, s.connector, s.acceptor, s.nonce_c);
    let (mut honest_next, mut wrong_next) = (Some(hello), Some(wrong_hello));
    let (mut sent, mut finished, mut all_honest) = (Vec::new(), false, true);
    let mut accepted_hello: Option<Message> = None;
    let mut challenge: Option<Message> = None;
    for _ in 0..6 {
        let p = pick(u)?;
        all_honest &= matches!(p, Pick::Honest);
        let Some(m) = choose(u, p, honest_next, &sent, wrong_next)? else { break };
        let next = under_test.on_message(&m);
        check_step(&next, finished);
        if let Some(honest_msg) = honest_next {
            sent.push(honest_msg);
        }
        match &next {
            Next::Send(reply) => {
                assert_eq!(reply.kind, MessageKind::Challenge);
                assert_eq!(reply.nonce, s.nonce_a, "the challenge carries the acceptor's nonce");
                assert_eq!((m.kind, m.version), (MessageKind::Hello, VERSION));
                assert!(s.admits(m.rank), "a challenge for rank {} of {:?}", m.rank, s.among);
                assert_eq!(m.world, s.world);
                assert_eq!(m.mac, s.roster, "a challenge only for a Hello of this address list");
                accepted_hello = Some(m);
                challenge = Some(*reply);
            }
            Next::SendAndDone(welcome) => {
                assert_eq!(welcome.kind, MessageKind::Welcome);
                let (hello, challenge) = (accepted_hello.unwrap(), challenge.unwrap());
                let proof = honest_proof(s, &hello, &challenge).expect("an honest proof exists");
                assert_eq!(m.kind, MessageKind::Proof);
                assert_eq!(m.mac, proof.mac, "the acceptor took a proof without the token");
                assert_eq!(under_test.peer(), hello.rank, "it proved the rank its Hello named");
            }
            Next::Done => panic!("an acceptor always answers a proof with a welcome"),
            Next::Fail(..) => {}
        }
        if all_honest && !finished {
            assert!(!matches!(next, Next::Fail(..)), "the honest exchange failed: {next:?}");
        }
        finished |= matches!(next, Next::SendAndDone(_) | Next::Fail(..));
        // The honest and the wrong-token connectors hear what the acceptor answered.
        let reply = reply_of(&next);
        honest_next = reply.and_then(|r| reply_of(&honest.on_message(&r)));
        wrong_next = reply.and_then(|r| reply_of(&wrong.on_message(&r)));
    }
    if all_honest {
        assert!(finished, "six honest messages complete a handshake");
    }
    Ok(())
}

fn drive_connector(u: &mut Unstructured<'_>, s: &Setup) -> ArbitraryResult<()> {
    let (mut under_test, hello) =
        Connector::start(&s.token, s.roster, s.world, s.connector, s.acceptor, s.nonce_c);
    assert_eq!((hello.kind, hello.nonce), (MessageKind::Hello, s.nonce_c));
    let mut honest = Acceptor::new(&s.token, s.roster, s.world, s.acceptor, s.connector, s.nonce_a);
    let mut wrong =
        Acceptor::new(&s.other_token, s.roster, s.world, s.acceptor, s.connector, s.nonce_a);
    let mut honest_next = reply_of(&honest.on_message(&hello));
    let mut wrong_next = reply_of(&wrong.on_message(&hello));
    let (mut sent, mut finished, mut all_honest) = (Vec::new(), false, true);
    let mut accepted_challenge: Option<Message> = None;
    let mut proof: Option<Message> = None;
    for _ in 0..6 {
        let p = pick(u)?;
        all_honest &= matches!(p, Pick::Honest);
        let Some(m) = choose(u, p, honest_next, &sent, wrong_next)? else { break };
        let next = under_test.on_message(&m);
        check_step(&next, finished);
        if let Some(honest_msg) = honest_next {
            sent.push(honest_msg);
        }
        match &next {
            Next::Send(reply) => {
                assert_eq!(reply.kind, MessageKind::Proof);
                assert_eq!((m.kind, m.version), (MessageKind::Challenge, VERSION));
                assert_eq!((m.rank, m.world), (s.acceptor, s.world));
                accepted_challenge = Some(m);
                proof = Some(*reply);
            }
            Next::Done => {
                // The welcome a holder of the token sends for exactly this exchange.
                let challenge = accepted_challenge.expect("a welcome follows a challenge");
                let mut a = Acceptor::new(
                    &s.token,
                    s.roster,
                    s.world,
                    s.acceptor,
                    s.connector,
                    challenge.nonce,
                );
                assert!(matches!(a.on_message(&hello), Next::Send(_)));
                let Next::SendAndDone(welcome) = a.on_message(&proof.unwrap()) else {
                    panic!("the connector's own proof does not verify")
                };
                assert_eq!(m.kind, MessageKind::Welcome);
                assert_eq!(m.mac, welcome.mac, "the connector took a welcome without the token");
            }
            Next::SendAndDone(_) => panic!("a connector has nothing to send after a welcome"),
            Next::Fail(Failure::RefusedBy(reason), _) => {
                assert_eq!(m.kind, MessageKind::Reject(*reason));
            }
            Next::Fail(..) => {}
        }
        if all_honest && !finished {
            assert!(!matches!(next, Next::Fail(..)), "the honest exchange failed: {next:?}");
        }
        finished |= matches!(next, Next::Done | Next::Fail(..));
        let reply = reply_of(&next);
        honest_next = reply.and_then(|r| reply_of(&honest.on_message(&r)));
        wrong_next = reply.and_then(|r| reply_of(&wrong.on_message(&r)));
    }
    if all_honest {
        assert!(finished, "six honest messages complete a handshake");
    }
    Ok(())
}
