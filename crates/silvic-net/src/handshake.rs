//! The rendezvous handshake: who a connection comes from, and proof that it holds the job token.
//!
//! Four fixed-size messages, the connecting rank `C` (rank `r`) to the accepting rank `A`
//! (rank `r + 1`):
//!
//! ```text
//!  C -> A  Hello     { world, rank r,     nonce_c }
//!  A -> C  Challenge { world, rank r + 1, nonce_a }          or Reject { reason }
//!  C -> A  Proof     { mac_c }
//!  A -> C  Welcome   { mac_a }                               or Reject { reason }
//!
//!  mac_x = HMAC-SHA256(key = job token, label_x | version | world | r | r + 1 | nonce_c | nonce_a)
//! ```
//!
//! Every message is [`MESSAGE_LEN`] bytes, integers big-endian:
//!
//! ```text
//!  0          8         10     11       12       16      20          36          68     72
//!  +----------+---------+------+--------+--------+-------+-----------+-----------+------+
//!  | SILVICNT | version | kind | reason | world  | rank  | nonce[16] | mac[32]   | 0000 |
//!  +----------+---------+------+--------+--------+-------+-----------+-----------+------+
//! ```
//!
//! Invariants: the token never leaves the process, only MACs over both sides' fresh nonces, so a
//! replayed handshake fails; the connector proves first, so a stranger learns nothing computed
//! from the token; the two labels differ, so one side's proof is never valid as the other's;
//! MACs are compared in constant time. Each role checks what it can (version, world, rank,
//! proof) and tells the other side why it rejects, so a misconfigured rank fails fast.
//!
//! This module is sans-IO: [`Connector`] and [`Acceptor`] take messages and return what to send;
//! the rendezvous loop owns the sockets and the clocks.

use byteorder::{BigEndian, ByteOrder};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The protocol version. Ranks of different versions reject each other.
pub const VERSION: u16 = 3;
/// Bytes in every handshake message.
pub const MESSAGE_LEN: usize = 72;
/// The eight bytes every handshake message starts with.
pub const MAGIC: [u8; 8] = *b"SILVICNT";
const NONCE_LEN: usize = 16;
const MAC_LEN: usize = 32;
const CONNECT_LABEL: &[u8] = b"silvic-net connector proof";
const ACCEPT_LABEL: &[u8] = b"silvic-net acceptor proof";

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// The connector's opening: its world, rank and nonce.
    Hello,
    /// The acceptor's answer: its world, rank and nonce.
    Challenge,
    /// The connector's MAC.
    Proof,
    /// The acceptor's MAC; the connection is now a ring link.
    Welcome,
    /// A refusal, with its reason.
    Reject(RejectReason),
}

/// Why a rank refused a connection. Sent to the other side so its `connect` can say why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// The MAC did not verify: the two ranks were given different job tokens.
    TokenMismatch,
    /// The ranks run different protocol versions.
    VersionMismatch,
    /// The ranks were given address lists of different lengths.
    WorldMismatch,
    /// The connection came from, or reached, a rank other than the ring neighbour.
    WrongRank,
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::TokenMismatch => 1,
            RejectReason::VersionMismatch => 2,
            RejectReason::WorldMismatch => 3,
            RejectReason::WrongRank => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => RejectReason::TokenMismatch,
            2 => RejectReason::VersionMismatch,
            3 => RejectReason::WorldMismatch,
            4 => RejectReason::WrongRank,
            _ => return None,
        })
    }
}

/// One handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The sender's protocol version.
    pub version: u16,
    /// What the message is.
    pub kind: MessageKind,
    /// The sender's world size.
    pub world: u32,
    /// The sender's rank.
    pub rank: u32,
    /// The sender's nonce (Hello, Challenge), else zero.
    pub nonce: [u8; NONCE_LEN],
    /// The sender's MAC (Proof, Welcome), else zero.
    pub mac: [u8; MAC_LEN],
}

/// Why bytes are not a handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The bytes do not start with [`MAGIC`]: not a silvic-net peer.
    #[error("not a silvic-net handshake (bad magic)")]
    BadMagic,
    /// An unknown kind or reject reason, or nonzero reserved bytes.
    #[error("malformed handshake message")]
    Malformed,
}

impl Message {
    fn new(kind: MessageKind, world: u32, rank: u32) -> Message {
        Message { version: VERSION, kind, world, rank, nonce: [0; NONCE_LEN], mac: [0; MAC_LEN] }
    }

    /// Encodes the message.
    pub fn encode(&self) -> [u8; MESSAGE_LEN] {
        let mut out = [0u8; MESSAGE_LEN];
        out[..8].copy_from_slice(&MAGIC);
        BigEndian::write_u16(&mut out[8..10], self.version);
        (out[10], out[11]) = match self.kind {
            MessageKind::Hello => (1, 0),
            MessageKind::Challenge => (2, 0),
            MessageKind::Proof => (3, 0),
            MessageKind::Welcome => (4, 0),
            MessageKind::Reject(reason) => (5, reason.code()),
        };
        BigEndian::write_u32(&mut out[12..16], self.world);
        BigEndian::write_u32(&mut out[16..20], self.rank);
        out[20..36].copy_from_slice(&self.nonce);
        out[36..68].copy_from_slice(&self.mac);
        out
    }

    /// Decodes a message. The version is returned as sent, for the receiver to judge: a peer of
    /// another version gets a reject, not silence.
    pub fn decode(bytes: &[u8; MESSAGE_LEN]) -> Result<Message, MessageError> {
        if bytes[..8] != MAGIC {
            return Err(MessageError::BadMagic);
        }
        let kind = match (bytes[10], bytes[11]) {
            (1, 0) => MessageKind::Hello,
            (2, 0) => MessageKind::Challenge,
            (3, 0) => MessageKind::Proof,
            (4, 0) => MessageKind::Welcome,
            (5, code) => {
                MessageKind::Reject(RejectReason::from_code(code).ok_or(MessageError::Malformed)?)
            }
            _ => return Err(MessageError::Malformed),
        };
        if bytes[68..] != [0; 4] {
            return Err(MessageError::Malformed);
        }
        Ok(Message {
            version: BigEndian::read_u16(&bytes[8..10]),
            kind,
            world: BigEndian::read_u32(&bytes[12..16]),
            rank: BigEndian::read_u32(&bytes[16..20]),
            nonce: bytes[20..36].try_into().expect("16 bytes"),
            mac: bytes[36..68].try_into().expect("32 bytes"),
        })
    }
}

/// What both sides of one connection agreed on, and the job token that keys the MACs.
#[derive(Clone)]
struct Transcript<'t> {
    token: &'t [u8],
    world: u32,
    connector: u32,
    acceptor: u32,
    nonce_c: [u8; NONCE_LEN],
    nonce_a: [u8; NONCE_LEN],
}

impl Transcript<'_> {
    fn keyed(&self, label: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.token).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(&VERSION.to_be_bytes());
        mac.update(&self.world.to_be_bytes());
        mac.update(&self.connector.to_be_bytes());
        mac.update(&self.acceptor.to_be_bytes());
        mac.update(&self.nonce_c);
        mac.update(&self.nonce_a);
        mac
    }

    fn prove(&self, label: &[u8]) -> [u8; MAC_LEN] {
        self.keyed(label).finalize().into_bytes().into()
    }

    fn verify(&self, label: &[u8], mac: &[u8; MAC_LEN]) -> bool {
        self.keyed(label).verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for Transcript<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcript")
            .field("world", &self.world)
            .field("connector", &self.connector)
            .field("acceptor", &self.acceptor)
            .finish_non_exhaustive()
    }
}

/// Why a handshake did not produce a ring link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// This side refused the other, for this reason (and sends it a reject).
    Refused(RejectReason),
    /// The other side refused this one, for this reason.
    RefusedBy(RejectReason),
    /// The other side broke the protocol (garbage, a message out of order).
    Protocol(&'static str),
}

/// What a role does after a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Send this message and wait for the next one.
    Send(Message),
    /// Send this message; the handshake succeeded.
    SendAndDone(Message),
    /// The handshake succeeded; nothing more to send.
    Done,
    /// The handshake failed; send the message if there is one, then close.
    Fail(Failure, Option<Message>),
}

/// Details of the other side's claims, for error messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claims {
    /// The version it sent.
    pub version: u16,
    /// The world size it sent.
    pub world: u32,
    /// The rank it sent.
    pub rank: u32,
}

fn reject(reason: RejectReason, world: u32, rank: u32) -> Option<Message> {
    Some(Message::new(MessageKind::Reject(reason), world, rank))
}

/// Checks version, world and rank of a message against what this side expects.
fn check_claims(m: &Message, world: u32, expected_rank: u32) -> Result<(), RejectReason> {
    if m.version != VERSION {
        Err(RejectReason::VersionMismatch)
    } else if m.world != world {
        Err(RejectReason::WorldMismatch)
    } else if m.rank != expected_rank {
        Err(RejectReason::WrongRank)
    } else {
        Ok(())
    }
}

/// The connecting side: rank `r` joining its right neighbour `r + 1`.
#[derive(Debug)]
pub struct Connector<'t> {
    transcript: Transcript<'t>,
    state: ConnectorState,
    /// What the other side said about itself, once it said anything.
    pub peer_claims: Option<Claims>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectorState {
    AwaitChallenge,
    AwaitWelcome,
    Finished,
}

impl<'t> Connector<'t> {
    /// Starts a handshake as `rank` of `world` towards `peer`, with a fresh `nonce`. Returns the
    /// connector and the Hello to send.
    pub fn start(
        token: &'t [u8],
        world: u32,
        rank: u32,
        peer: u32,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Message) {
        let transcript = Transcript {
            token,
            world,
            connector: rank,
            acceptor: peer,
            nonce_c: nonce,
            nonce_a: [0; NONCE_LEN],
        };
        let mut hello = Message::new(MessageKind::Hello, world, rank);
        hello.nonce = nonce;
        let me = Connector { transcript, state: ConnectorState::AwaitChallenge, peer_claims: None };
        (me, hello)
    }

    /// Takes the acceptor's next message.
    pub fn on_message(&mut self, m: &Message) -> Next {
        let t = &mut self.transcript;
        let (world, rank) = (t.world, t.connector);
        self.peer_claims.get_or_insert(Claims { version: m.version, world: m.world, rank: m.rank });
        let next = match (self.state, m.kind) {
            (ConnectorState::Finished, _) => {
                Next::Fail(Failure::Protocol("message after end"), None)
            }
            (_, MessageKind::Reject(reason)) => Next::Fail(Failure::RefusedBy(reason), None),
            (ConnectorState::AwaitChallenge, MessageKind::Challenge) => {
                match check_claims(m, world, t.acceptor) {
                    Err(reason) => {
                        Next::Fail(Failure::Refused(reason), reject(reason, world, rank))
                    }
                    Ok(()) => {
                        t.nonce_a = m.nonce;
                        let mut proof = Message::new(MessageKind::Proof, world, rank);
                        proof.mac = t.prove(CONNECT_LABEL);
                        self.state = ConnectorState::AwaitWelcome;
                        return Next::Send(proof);
                    }
                }
            }
            (ConnectorState::AwaitWelcome, MessageKind::Welcome) => {
                if t.verify(ACCEPT_LABEL, &m.mac) {
                    self.state = ConnectorState::Finished;
                    return Next::Done;
                }
                let reason = RejectReason::TokenMismatch;
                Next::Fail(Failure::Refused(reason), reject(reason, world, rank))
            }
            _ => Next::Fail(Failure::Protocol("unexpected handshake message"), None),
        };
        self.state = ConnectorState::Finished;
        next
    }
}

/// The accepting side: rank `r + 1` taking a connection that claims to be its left neighbour.
#[derive(Debug)]
pub struct Acceptor<'t> {
    transcript: Transcript<'t>,
    state: AcceptorState,
    /// What the other side said about itself, once it said anything.
    pub peer_claims: Option<Claims>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptorState {
    AwaitHello,
    AwaitProof,
    Finished,
}

impl<'t> Acceptor<'t> {
    /// Waits for a Hello as `rank` of `world`, expecting it from `peer`, with a fresh `nonce`.
    pub fn new(token: &'t [u8], world: u32, rank: u32, peer: u32, nonce: [u8; NONCE_LEN]) -> Self {
        let transcript = Transcript {
            token,
            world,
            connector: peer,
            acceptor: rank,
            nonce_c: [0; NONCE_LEN],
            nonce_a: nonce,
        };
        Acceptor { transcript, state: AcceptorState::AwaitHello, peer_claims: None }
    }

    /// Takes the connector's next message.
    pub fn on_message(&mut self, m: &Message) -> Next {
        let t = &mut self.transcript;
        let (world, rank) = (t.world, t.acceptor);
        self.peer_claims.get_or_insert(Claims { version: m.version, world: m.world, rank: m.rank });
        let next = match (self.state, m.kind) {
            (AcceptorState::AwaitHello, MessageKind::Hello) => {
                match check_claims(m, world, t.connector) {
                    Err(reason) => {
                        Next::Fail(Failure::Refused(reason), reject(reason, world, rank))
                    }
                    Ok(()) => {
                        t.nonce_c = m.nonce;
                        let mut challenge = Message::new(MessageKind::Challenge, world, rank);
                        challenge.nonce = t.nonce_a;
                        self.state = AcceptorState::AwaitProof;
                        return Next::Send(challenge);
                    }
                }
            }
            (AcceptorState::AwaitProof, MessageKind::Proof) => {
                if t.verify(CONNECT_LABEL, &m.mac) {
                    let mut welcome = Message::new(MessageKind::Welcome, world, rank);
                    welcome.mac = t.prove(ACCEPT_LABEL);
                    self.state = AcceptorState::Finished;
                    return Next::SendAndDone(welcome);
                }
                let reason = RejectReason::TokenMismatch;
                Next::Fail(Failure::Refused(reason), reject(reason, world, rank))
            }
            (_, MessageKind::Reject(reason)) => Next::Fail(Failure::RefusedBy(reason), None),
            _ => Next::Fail(Failure::Protocol("unexpected handshake message"), None),
        };
        self.state = AcceptorState::Finished;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: &Message) -> Message {
        Message::decode(&m.encode()).unwrap()
    }

    /// Plays a whole handshake between the two roles; returns how each side ended.
    fn play(c_token: &[u8], a_token: &[u8], c: (u32, u32), a: (u32, u32)) -> (Option<Next>, Next) {
        let (mut conn, hello) = Connector::start(c_token, c.0, c.1, (c.1 + 1) % c.0, [1; 16]);
        let mut acc = Acceptor::new(a_token, a.0, a.1, (a.1 + a.0 - 1) % a.0, [2; 16]);
        let mut to_acceptor = hello;
        loop {
            let a_next = acc.on_message(&roundtrip(&to_acceptor));
            let to_connector = match &a_next {
                Next::Send(m) | Next::SendAndDone(m) | Next::Fail(_, Some(m)) => *m,
                _ => return (None, a_next),
            };
            let c_next = conn.on_message(&roundtrip(&to_connector));
            match c_next {
                Next::Send(m) => to_acceptor = m,
                other => {
                    if let Next::Fail(_, Some(m)) = &other {
                        // The acceptor hears the connector's reject.
                        let heard = acc.on_message(&roundtrip(m));
                        return (Some(other), heard);
                    }
                    return (Some(other), a_next);
                }
            }
        }
    }

    #[test]
    fn matching_ranks_complete_the_handshake() {
        let (c, a) = play(b"job-42", b"job-42", (4, 1), (4, 2));
        assert_eq!(c, Some(Next::Done));
        assert!(matches!(a, Next::SendAndDone(Message { kind: MessageKind::Welcome, .. })));
    }

    #[test]
    fn a_wrong_token_is_refused_by_the_acceptor_with_the_reason() {
        let (c, a) = play(b"wrong", b"job-42", (4, 1), (4, 2));
        assert_eq!(c, Some(Next::Fail(Failure::RefusedBy(RejectReason::TokenMismatch), None)));
        assert!(matches!(a, Next::Fail(Failure::Refused(RejectReason::TokenMismatch), Some(_))));
    }

    #[test]
    fn world_and_rank_mismatches_are_refused_with_the_reason() {
        let (c, _) = play(b"t", b"t", (3, 1), (4, 2));
        assert_eq!(c, Some(Next::Fail(Failure::RefusedBy(RejectReason::WorldMismatch), None)));
        let (c, _) = play(b"t", b"t", (4, 0), (4, 2));
        assert_eq!(c, Some(Next::Fail(Failure::RefusedBy(RejectReason::WrongRank), None)));
    }

    #[test]
    fn a_replayed_proof_fails_against_a_fresh_challenge() {
        let token = b"job";
        let (mut conn, hello) = Connector::start(token, 2, 0, 1, [7; 16]);
        let mut first = Acceptor::new(token, 2, 1, 0, [8; 16]);
        let Next::Send(challenge) = first.on_message(&hello) else { panic!() };
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        // An eavesdropper replays Hello and Proof to a new connection with a new nonce.
        let mut second = Acceptor::new(token, 2, 1, 0, [9; 16]);
        assert!(matches!(second.on_message(&hello), Next::Send(_)));
        assert!(matches!(
            second.on_message(&proof),
            Next::Fail(Failure::Refused(RejectReason::TokenMismatch), _)
        ));
    }

    #[test]
    fn an_acceptor_with_another_token_is_caught_by_the_connector() {
        let (mut conn, hello) = Connector::start(b"a", 2, 0, 1, [7; 16]);
        // A stranger who skips the proof check and welcomes with a MAC it cannot compute.
        let mut stranger = Acceptor::new(b"b", 2, 1, 0, [8; 16]);
        let Next::Send(challenge) = stranger.on_message(&hello) else { panic!() };
        assert!(matches!(conn.on_message(&challenge), Next::Send(_)));
        let mut welcome = Message::new(MessageKind::Welcome, 2, 1);
        welcome.mac = [0xEE; 32];
        assert!(matches!(
            conn.on_message(&welcome),
            Next::Fail(Failure::Refused(RejectReason::TokenMismatch), Some(_))
        ));
    }

    #[test]
    fn messages_round_trip_and_garbage_is_typed() {
        for kind in [
            MessageKind::Hello,
            MessageKind::Challenge,
            MessageKind::Proof,
            MessageKind::Welcome,
            MessageKind::Reject(RejectReason::TokenMismatch),
            MessageKind::Reject(RejectReason::VersionMismatch),
            MessageKind::Reject(RejectReason::WorldMismatch),
            MessageKind::Reject(RejectReason::WrongRank),
        ] {
            let mut m = Message::new(kind, 16, 15);
            m.nonce = [3; 16];
            m.mac = [4; 32];
            assert_eq!(roundtrip(&m), m);
        }
        let good = Message::new(MessageKind::Hello, 2, 0).encode();
        assert_eq!(Message::decode(&[0x16; MESSAGE_LEN]), Err(MessageError::BadMagic));
        let mut bad = good;
        bad[10] = 9;
        assert_eq!(Message::decode(&bad), Err(MessageError::Malformed));
        let mut bad = good;
        bad[10..12].copy_from_slice(&[5, 77]);
        assert_eq!(Message::decode(&bad), Err(MessageError::Malformed));
        let mut bad = good;
        bad[70] = 1;
        assert_eq!(Message::decode(&bad), Err(MessageError::Malformed));
    }

    #[test]
    fn another_version_is_refused_with_the_reason() {
        let mut acc = Acceptor::new(b"t", 2, 1, 0, [0; 16]);
        let mut hello = Message::new(MessageKind::Hello, 2, 0);
        hello.version = VERSION + 1;
        let next = acc.on_message(&Message::decode(&hello.encode()).unwrap());
        assert!(matches!(
            next,
            Next::Fail(Failure::Refused(RejectReason::VersionMismatch), Some(_))
        ));
        assert_eq!(acc.peer_claims.unwrap().version, VERSION + 1);
    }

    #[test]
    fn the_token_never_appears_in_a_message() {
        let token = b"super-secret-token-value";
        let (mut conn, hello) = Connector::start(token, 2, 0, 1, [1; 16]);
        let mut acc = Acceptor::new(token, 2, 1, 0, [2; 16]);
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        let Next::SendAndDone(welcome) = acc.on_message(&proof) else { panic!() };
        for m in [hello, challenge, proof, welcome] {
            let bytes = m.encode();
            assert!(!bytes.windows(token.len()).any(|w| w == token));
        }
        assert!(!format!("{conn:?}{acc:?}").contains("super-secret"));
    }
}
