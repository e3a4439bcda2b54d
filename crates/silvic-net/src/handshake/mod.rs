//! The rendezvous handshake: who a connection comes from, and proof that it holds the job token.
//!
//! Four fixed-size messages, the connecting rank `C` (rank `r`) to the accepting rank `A`
//! (rank `r + 1` on the ring; on a chord stream, the rank `r + 2^k` that `topology.rs`
//! has `r` dial, which takes a Hello from any rank it accepts, [`Acceptor::from_one_of`]):
//!
//! ```text
//!  C -> A  Hello     { world, rank r,     channel, nonce_c, roster }
//!  A -> C  Challenge { world, rank r + 1, channel, nonce_a }          or Reject { reason }
//!  C -> A  Proof     { channel, mac_c }
//!  A -> C  Welcome   { channel, mac_a }                               or Reject { reason }
//!
//!  roster = SHA-256 of the whole address list, in rank order (see [`roster_digest`])
//!  mac_x  = HMAC-SHA256(key = job token,
//!           label_x | version | world | r | r + 1 | channel | roster | nonce_c | nonce_a)
//! ```
//!
//! Every message is [`MESSAGE_LEN`] bytes; the layout is drawn in `message.rs`. A Reject
//! carries only its reason.
//!
//! Invariants: the token never leaves the process, only MACs over both sides' fresh nonces, so a
//! replayed handshake fails; the connector proves first, so a stranger learns nothing computed
//! from the token; the two labels differ, so one side's proof is never valid as the other's;
//! MACs are compared in constant time. The Proof and the Welcome must repeat
//! the version, world and rank of the Hello and the Challenge, which the MACs cover, so no field
//! of a proven message is unbound. The MACs cover the roster digest, so two ranks handed
//! different address lists never form a link, and the acceptor compares the Hello's digest
//! first, so they fail with that reason rather than as a token mismatch. The roster digest is
//! not secret (who connects to whom is visible on the network anyway). Each role checks what
//! it can (roster, version, world, rank, proof) and tells the other side why it rejects, so a
//! misconfigured rank fails fast; but the acceptor judges the roster first, and a Hello whose
//! roster is not its own gets one refusal ([`RejectReason::AddressMismatch`]) whatever it
//! claims, so a stranger who does not know the job's address list learns only that it was
//! refused, not this rank's version, world, rank or chord peers.
//!
//! This module is sans-IO: [`Connector`] and [`Acceptor`] take messages and return what to send;
//! the rendezvous loop owns the sockets and the clocks.

pub(crate) mod message;
mod transcript;

use sha2::{Digest, Sha256};

use self::transcript::Transcript;

#[cfg_attr(not(feature = "fuzzing"), expect(unused_imports, reason = "for fuzz/ alone"))]
pub use self::message::MAGIC;
pub use self::message::{
    MAC_LEN, MESSAGE_LEN, Message, MessageError, MessageKind, NONCE_LEN, VERSION,
};
// Public as `silvic_net::RejectReason` only (it is part of `ConnectError`): one path.
use self::message::RejectReason;

const CONNECT_LABEL: &[u8] = b"silvic-net connector proof";
const ACCEPT_LABEL: &[u8] = b"silvic-net acceptor proof";

/// A fresh random nonce for one handshake, from the operating system. The one place nonces
/// are drawn; [`Connector`] and [`Acceptor`] take theirs as an argument, so they stay
/// deterministic under test and fuzzing.
pub(crate) fn fresh_nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce)
        .map_err(|e| std::io::Error::other(format!("no random bytes: {e}")))?;
    Ok(nonce)
}

/// The SHA-256 digest of the address list every rank was handed, in rank order: each
/// address's canonical text (`ip:port`, IPv6 as `[ip]:port`) followed by a newline. Ranks
/// whose digests differ refuse each other with [`RejectReason::AddressMismatch`].
pub fn roster_digest(addresses: &[std::net::SocketAddr]) -> [u8; MAC_LEN] {
    let mut digest = Sha256::new();
    for address in addresses {
        digest.update(address.to_string().as_bytes());
        digest.update(b"\n");
    }
    digest.finalize().into()
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

/// What the other side said about itself in its Hello or Challenge, for error messages. A
/// Reject says nothing about its sender, so it leaves no claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claims {
    /// The version it sent.
    pub version: u16,
    /// The world size it sent.
    pub world: u32,
    /// The rank it sent.
    pub rank: u32,
}

impl Claims {
    fn of(m: &Message) -> Claims {
        Claims { version: m.version, world: m.world, rank: m.rank }
    }
}

/// A refusal: the reason and nothing else (version, world and rank zero).
fn reject(reason: RejectReason) -> Option<Message> {
    let mut m = Message::new(MessageKind::Reject(reason), 0, 0);
    m.version = 0;
    Some(m)
}

fn refuse(reason: RejectReason) -> Next {
    Next::Fail(Failure::Refused(reason), reject(reason))
}

/// Checks version, world, rank and channel of a message against what this side expects.
fn check_claims(m: &Message, world: u32, expected: (u32, u16)) -> Result<(), RejectReason> {
    if m.version != VERSION {
        Err(RejectReason::VersionMismatch)
    } else if m.world != world {
        Err(RejectReason::WorldMismatch)
    } else if (m.rank, m.channel) != expected {
        Err(RejectReason::WrongRank)
    } else {
        Ok(())
    }
}

/// A blind acceptor's judgement of a proven connector's claims (see
/// [`Acceptor::any_other_rank`]): the first that is wrong, in the order the ring checks them.
fn judge(t: &Transcript<'_>, (world, roster): (u32, [u8; MAC_LEN])) -> Option<RejectReason> {
    if t.version != VERSION {
        Some(RejectReason::VersionMismatch)
    } else if t.world != world {
        Some(RejectReason::WorldMismatch)
    } else if t.connector >= world || t.connector == t.acceptor || t.channel != 0 {
        Some(RejectReason::WrongRank)
    } else if t.roster != roster {
        Some(RejectReason::AddressMismatch)
    } else {
        None
    }
}

/// The connecting side: rank `r` joining its right neighbour `r + 1`.
#[derive(Debug)]
pub struct Connector<'t> {
    transcript: Transcript<'t>,
    state: ConnectorState,
    /// The Challenge claims nothing (see [`Connector::blind`]).
    blind: bool,
    /// What the other side said about itself in its Challenge, once it sent one.
    pub peer_claims: Option<Claims>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectorState {
    AwaitChallenge,
    AwaitWelcome,
    Finished,
}

impl<'t> Connector<'t> {
    /// Starts a handshake as `rank` of `world` towards `peer`, with the job's `token` and
    /// [`roster_digest`] and a fresh `nonce`. Returns the connector and the Hello to send.
    pub fn start(
        token: &'t [u8],
        roster: [u8; MAC_LEN],
        world: u32,
        rank: u32,
        peer: u32,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Message) {
        Connector::start_on(token, roster, (world, rank, peer), 0, nonce)
    }

    /// [`Connector::start`] for a stream of channel `channel` (of a ring of several channels).
    pub fn start_on(
        token: &'t [u8],
        roster: [u8; MAC_LEN],
        (world, rank, peer): (u32, u32, u32),
        channel: u16,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Message) {
        let transcript = Transcript {
            token,
            version: VERSION,
            roster,
            world,
            connector: rank,
            acceptor: peer,
            channel,
            nonce_c: nonce,
            nonce_a: [0; NONCE_LEN],
        };
        let mut hello = Message::new(MessageKind::Hello, world, rank);
        hello.channel = channel;
        hello.nonce = nonce;
        hello.mac = roster;
        let me = Connector {
            transcript,
            state: ConnectorState::AwaitChallenge,
            blind: false,
            peer_claims: None,
        };
        (me, hello)
    }

    /// The connecting side of the address exchange, whose rank 0 answers every Hello with a
    /// Challenge that claims nothing ([`Acceptor::any_other_rank`]): its claims are judged by
    /// the Welcome, or by the refusal that comes after the proof.
    pub fn blind(mut self) -> Self {
        self.blind = true;
        self
    }

    /// Whether this side has sent its proof and waits only for the Welcome: the other side
    /// may already count the link as formed, so giving up on it now would strand both.
    pub fn proved(&self) -> bool {
        self.state == ConnectorState::AwaitWelcome
    }

    /// Takes the acceptor's next message.
    pub fn on_message(&mut self, m: &Message) -> Next {
        let t = &mut self.transcript;
        let next = match (self.state, m.kind) {
            (ConnectorState::Finished, _) => {
                Next::Fail(Failure::Protocol("message after end"), None)
            }
            (_, MessageKind::Reject(reason)) => Next::Fail(Failure::RefusedBy(reason), None),
            (ConnectorState::AwaitChallenge, MessageKind::Challenge) => {
                let claims = if self.blind {
                    Ok(())
                } else {
                    check_claims(m, t.world, (t.acceptor, t.channel))
                };
                if !self.blind {
                    self.peer_claims = Some(Claims::of(m));
                }
                match claims {
                    Err(reason) => refuse(reason),
                    Ok(()) => {
                        t.nonce_a = m.nonce;
                        let mut proof = Message::new(MessageKind::Proof, t.world, t.connector);
                        proof.channel = t.channel;
                        proof.mac = t.prove(CONNECT_LABEL);
                        self.state = ConnectorState::AwaitWelcome;
                        return Next::Send(proof);
                    }
                }
            }
            (ConnectorState::AwaitWelcome, MessageKind::Welcome) => {
                if let Err(reason) = check_claims(m, t.world, (t.acceptor, t.channel)) {
                    refuse(reason)
                } else if t.verify(ACCEPT_LABEL, &m.mac) {
                    self.state = ConnectorState::Finished;
                    return Next::Done;
                } else {
                    refuse(RejectReason::TokenMismatch)
                }
            }
            _ => Next::Fail(Failure::Protocol("unexpected handshake message"), None),
        };
        self.state = ConnectorState::Finished;
        next
    }
}

/// The accepting side: rank `r + 1` taking a connection that claims to be its left neighbour
/// ([`Acceptor::new`]), or rank 0 of the address exchange taking any other rank
/// ([`Acceptor::any_other_rank`]).
#[derive(Debug)]
pub struct Acceptor<'t> {
    transcript: Transcript<'t>,
    state: AcceptorState,
    /// The connector may be any rank of the world but this one: its Hello names it, and its
    /// claims are judged only once it has proven the token (see [`Acceptor::any_other_rank`]).
    any_peer: bool,
    /// The ranks that may connect, of which the Hello names one (see [`Acceptor::from_one_of`]).
    among: Option<&'t [usize]>,
    /// This side's own world and roster, for judging a blind connector's claims after its
    /// proof.
    own: (u32, [u8; MAC_LEN]),
    /// The channels whose streams this side takes (see [`Acceptor::on_channels`]).
    channels: std::ops::Range<u16>,
    /// What the other side said about itself in its Hello, once it sent one.
    pub peer_claims: Option<Claims>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptorState {
    AwaitHello,
    AwaitProof,
    Finished,
}

impl<'t> Acceptor<'t> {
    /// Waits for a Hello as `rank` of `world`, expecting it from `peer`, with the job's `token`
    /// and [`roster_digest`] and a fresh `nonce`.
    pub fn new(
        token: &'t [u8],
        roster: [u8; MAC_LEN],
        world: u32,
        rank: u32,
        peer: u32,
        nonce: [u8; NONCE_LEN],
    ) -> Self {
        let transcript = Transcript {
            token,
            version: VERSION,
            roster,
            world,
            connector: peer,
            acceptor: rank,
            channel: 0,
            nonce_c: [0; NONCE_LEN],
            nonce_a: nonce,
        };
        Acceptor {
            transcript,
            state: AcceptorState::AwaitHello,
            any_peer: false,
            among: None,
            own: (world, roster),
            channels: 0..1,
            peer_claims: None,
        }
    }

    /// Takes streams of the channels in `channels` (by default channel 0 alone), which the Hello
    /// names; [`Acceptor::channel`] then says which. A Hello of another channel is refused as
    /// the wrong rank.
    pub fn on_channels(mut self, channels: std::ops::Range<u16>) -> Self {
        self.channels = channels;
        self
    }

    /// The channel of the stream: the one its accepted Hello named (before that, 0).
    pub fn channel(&self) -> u16 {
        self.transcript.channel
    }

    /// Waits for a Hello as `rank` of `world` from any other rank of the world, which the
    /// Hello names; [`Acceptor::peer`] then says which. Blind: every Hello is answered with a
    /// Challenge that claims nothing (version, world and rank zero), and the Hello's version,
    /// world, rank and roster are judged only after a valid proof, so a connection without the
    /// token learns nothing, not even this side's world or version, from the answers. The
    /// connector must be [`Connector::blind`].
    pub fn any_other_rank(
        token: &'t [u8],
        roster: [u8; MAC_LEN],
        world: u32,
        rank: u32,
        nonce: [u8; NONCE_LEN],
    ) -> Self {
        let mut acceptor = Acceptor::new(token, roster, world, rank, rank, nonce);
        acceptor.any_peer = true;
        acceptor
    }

    /// Waits for a Hello as `rank` of `world` from one of `peers` (a rank's ring neighbour and
    /// chord peers), which the Hello names; [`Acceptor::peer`] then says which. The claims are
    /// checked as [`Acceptor::new`] checks them, for the rank the Hello names: a rank outside
    /// `peers` is refused as the wrong rank.
    pub fn from_one_of(
        token: &'t [u8],
        roster: [u8; MAC_LEN],
        world: u32,
        rank: u32,
        peers: &'t [usize],
        nonce: [u8; NONCE_LEN],
    ) -> Self {
        let mut acceptor = Acceptor::new(token, roster, world, rank, rank, nonce);
        acceptor.among = Some(peers);
        acceptor
    }

    /// The rank the connector proves: the one given to [`Acceptor::new`], or, for
    /// [`Acceptor::any_other_rank`] and [`Acceptor::from_one_of`], the one its accepted Hello
    /// named (before that, this side's own rank, which no connector can be).
    pub fn peer(&self) -> u32 {
        self.transcript.connector
    }

    /// Whether the other side sent a Hello this side accepted and was challenged. Weak
    /// evidence: anyone who knows the address list can send one, and
    /// [`Acceptor::any_other_rank`] challenges every Hello.
    pub fn challenged(&self) -> bool {
        self.state == AcceptorState::AwaitProof
    }

    /// Takes the connector's next message.
    pub fn on_message(&mut self, m: &Message) -> Next {
        let t = &mut self.transcript;
        let next = match (self.state, m.kind) {
            (AcceptorState::AwaitHello, MessageKind::Hello) if self.any_peer => {
                self.peer_claims = Some(Claims::of(m));
                // Prove against what the Hello claims; judge it after the proof.
                (t.version, t.world, t.connector) = (m.version, m.world, m.rank);
                t.channel = m.channel;
                (t.roster, t.nonce_c) = (m.mac, m.nonce);
                let mut challenge = Message::new(MessageKind::Challenge, 0, 0);
                challenge.version = 0;
                challenge.nonce = t.nonce_a;
                self.state = AcceptorState::AwaitProof;
                return Next::Send(challenge);
            }
            (AcceptorState::AwaitHello, MessageKind::Hello) => {
                self.peer_claims = Some(Claims::of(m));
                let among = self
                    .among
                    .map(|peers| usize::try_from(m.rank).is_ok_and(|named| peers.contains(&named)));
                if among == Some(true) {
                    t.connector = m.rank;
                }
                if self.channels.contains(&m.channel) {
                    t.channel = m.channel;
                }
                // The roster first: a connection that does not know this job's address list hears
                // one refusal, whatever else it claims, and so learns nothing of this side's
                // version, world, rank or peers.
                if m.mac != t.roster {
                    refuse(RejectReason::AddressMismatch)
                } else {
                    match check_claims(m, t.world, (t.connector, t.channel)) {
                        Err(reason) => refuse(reason),
                        // Not in the set, though it claims this side's own rank (the
                        // placeholder).
                        Ok(()) if among == Some(false) => refuse(RejectReason::WrongRank),
                        // A channel this side does not take.
                        Ok(()) if !self.channels.contains(&m.channel) => {
                            refuse(RejectReason::WrongRank)
                        }
                        Ok(()) => {
                            t.nonce_c = m.nonce;
                            let mut challenge =
                                Message::new(MessageKind::Challenge, t.world, t.acceptor);
                            challenge.channel = t.channel;
                            challenge.nonce = t.nonce_a;
                            self.state = AcceptorState::AwaitProof;
                            return Next::Send(challenge);
                        }
                    }
                }
            }
            (AcceptorState::AwaitProof, MessageKind::Proof) => {
                // The MAC covers the Hello's claims; the Proof must repeat them, so no field of
                // it is left for a stranger on the path to rewrite.
                let repeated = m.version == t.version
                    && m.world == t.world
                    && (m.rank, m.channel) == (t.connector, t.channel);
                if !repeated {
                    refuse(RejectReason::WrongRank)
                } else if !t.verify(CONNECT_LABEL, &m.mac) {
                    refuse(RejectReason::TokenMismatch)
                } else if let Some(reason) = self.any_peer.then(|| judge(t, self.own)).flatten() {
                    refuse(reason)
                } else {
                    let mut welcome = Message::new(MessageKind::Welcome, t.world, t.acceptor);
                    welcome.channel = t.channel;
                    welcome.mac = t.prove(ACCEPT_LABEL);
                    self.state = AcceptorState::Finished;
                    return Next::SendAndDone(welcome);
                }
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

    const ROSTER: [u8; MAC_LEN] = [5; MAC_LEN];

    fn roundtrip(m: &Message) -> Message {
        Message::decode(&m.encode()).unwrap()
    }

    /// Plays a whole handshake between the two roles; returns how each side ended.
    fn play(c_token: &[u8], a_token: &[u8], c: (u32, u32), a: (u32, u32)) -> (Option<Next>, Next) {
        let (mut conn, hello) =
            Connector::start(c_token, ROSTER, c.0, c.1, (c.1 + 1) % c.0, [1; 16]);
        let mut acc = Acceptor::new(a_token, ROSTER, a.0, a.1, (a.1 + a.0 - 1) % a.0, [2; 16]);
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

    /// A stream names its channel: an acceptor of channels 1 to 3 takes channel 2 and says so,
    /// refuses channels 0 and 4 as the wrong rank, and a Proof whose channel was rewritten on
    /// the path fails (the MACs cover the channel).
    #[test]
    fn a_stream_proves_its_channel_and_only_a_channel_taken_joins() {
        let token = b"job";
        for (channel, joins) in [(2, true), (0, false), (4, false)] {
            let (mut conn, hello) = Connector::start_on(token, ROSTER, (4, 1, 2), channel, [1; 16]);
            let acc = Acceptor::new(token, ROSTER, 4, 2, 1, [2; 16]);
            let mut acc = acc.on_channels(1..4);
            let next = acc.on_message(&roundtrip(&hello));
            let Next::Send(challenge) = next else {
                assert!(!joins, "channel {channel}: {next:?}");
                assert_eq!(next, refuse(RejectReason::WrongRank), "channel {channel}");
                continue;
            };
            assert!(joins, "channel {channel} was challenged");
            assert_eq!((challenge.channel, acc.channel()), (channel, channel));
            let Next::Send(proof) = conn.on_message(&roundtrip(&challenge)) else { panic!() };
            let mut rewritten = Acceptor::new(token, ROSTER, 4, 2, 1, [2; 16]).on_channels(1..4);
            let forged = Message { channel: 3, ..hello };
            assert!(matches!(rewritten.on_message(&forged), Next::Send(_)));
            assert!(matches!(
                rewritten.on_message(&Message { channel: 3, ..proof }),
                Next::Fail(..)
            ));
            let Next::SendAndDone(welcome) = acc.on_message(&roundtrip(&proof)) else { panic!() };
            assert_eq!(conn.on_message(&roundtrip(&welcome)), Next::Done);
        }
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
        let (mut conn, hello) = Connector::start(token, ROSTER, 2, 0, 1, [7; 16]);
        let mut first = Acceptor::new(token, ROSTER, 2, 1, 0, [8; 16]);
        let Next::Send(challenge) = first.on_message(&hello) else { panic!() };
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        // An eavesdropper replays Hello and Proof to a new connection with a new nonce.
        let mut second = Acceptor::new(token, ROSTER, 2, 1, 0, [9; 16]);
        assert!(matches!(second.on_message(&hello), Next::Send(_)));
        assert!(matches!(
            second.on_message(&proof),
            Next::Fail(Failure::Refused(RejectReason::TokenMismatch), _)
        ));
    }

    #[test]
    fn an_acceptor_with_another_token_is_caught_by_the_connector() {
        let (mut conn, hello) = Connector::start(b"a", ROSTER, 2, 0, 1, [7; 16]);
        // A stranger who skips the proof check and welcomes with a MAC it cannot compute.
        let mut stranger = Acceptor::new(b"b", ROSTER, 2, 1, 0, [8; 16]);
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
            MessageKind::Reject(RejectReason::AddressMismatch),
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
        // A rank of the job (it knows the address list) that runs another version.
        let mut acc = Acceptor::new(b"t", ROSTER, 2, 1, 0, [0; 16]);
        let mut hello = Message::new(MessageKind::Hello, 2, 0);
        hello.version = VERSION + 1;
        hello.mac = ROSTER;
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
        let (mut conn, hello) = Connector::start(token, ROSTER, 2, 0, 1, [1; 16]);
        let mut acc = Acceptor::new(token, ROSTER, 2, 1, 0, [2; 16]);
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        let Next::SendAndDone(welcome) = acc.on_message(&proof) else { panic!() };
        for m in [hello, challenge, proof, welcome] {
            let bytes = m.encode();
            assert!(!bytes.windows(token.len()).any(|w| w == token));
        }
        assert!(!format!("{conn:?}{acc:?}").contains("super-secret"));
    }

    #[test]
    fn different_address_lists_are_refused_with_the_reason_and_bound_into_the_proof() {
        let (mut conn, hello) = Connector::start(b"t", [1; 32], 2, 0, 1, [1; 16]);
        let mut acc = Acceptor::new(b"t", [2; 32], 2, 1, 0, [2; 16]);
        let next = acc.on_message(&hello);
        assert_eq!(
            next,
            Next::Fail(
                Failure::Refused(RejectReason::AddressMismatch),
                reject(RejectReason::AddressMismatch)
            )
        );
        let Next::Fail(_, Some(refusal)) = next else { unreachable!() };
        assert_eq!(
            conn.on_message(&refusal),
            Next::Fail(Failure::RefusedBy(RejectReason::AddressMismatch), None)
        );
        // A Hello whose digest was rewritten in flight still fails: the MACs cover the roster.
        let (mut conn, mut hello) = Connector::start(b"t", [1; 32], 2, 0, 1, [1; 16]);
        hello.mac = [2; 32];
        let mut acc = Acceptor::new(b"t", [2; 32], 2, 1, 0, [2; 16]);
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        assert_eq!(acc.on_message(&proof), refuse(RejectReason::TokenMismatch));
    }

    #[test]
    fn a_proof_or_welcome_that_does_not_repeat_the_claims_is_refused_though_its_mac_verifies() {
        for rewrite in [
            |m: &mut Message| m.rank = u32::MAX,
            |m: &mut Message| m.rank = 3,
            |m: &mut Message| m.world = 9,
            |m: &mut Message| m.version = VERSION + 1,
        ] {
            let (mut conn, hello) = Connector::start(b"t", ROSTER, 4, 1, 2, [1; 16]);
            let mut acc = Acceptor::new(b"t", ROSTER, 4, 2, 1, [2; 16]);
            let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
            let Next::Send(mut proof) = conn.on_message(&challenge) else { panic!() };
            // A twin of the acceptor, fed the honest proof, gives the honest Welcome.
            let mut twin = Acceptor::new(b"t", ROSTER, 4, 2, 1, [2; 16]);
            twin.on_message(&hello);
            let Next::SendAndDone(mut welcome) = twin.on_message(&proof) else { panic!() };
            rewrite(&mut proof);
            let next = acc.on_message(&roundtrip(&proof));
            assert!(matches!(next, Next::Fail(Failure::Refused(_), Some(_))), "{next:?}");
            rewrite(&mut welcome);
            let next = conn.on_message(&roundtrip(&welcome));
            assert!(matches!(next, Next::Fail(Failure::Refused(_), Some(_))), "{next:?}");
        }
    }

    /// Plays the exchange's handshake: a blind connector claiming (`version`, `world`, `rank`)
    /// with `token`, and rank 0 of a world of 4 holding "t". Returns what rank 0 answered each
    /// message and how it ended.
    fn play_blind(token: &[u8], version: u16, world: u32, rank: u32) -> (Vec<Message>, Next) {
        let (conn, mut hello) = Connector::start(token, ROSTER, world, rank, 0, [1; 16]);
        let mut conn = conn.blind();
        hello.version = version;
        conn.transcript.version = version;
        let mut acc = Acceptor::any_other_rank(b"t", ROSTER, 4, 0, [2; 16]);
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!("no challenge") };
        let Next::Send(mut proof) = conn.on_message(&challenge) else { panic!("no proof") };
        proof.version = version;
        let last = acc.on_message(&proof);
        let answer = match &last {
            Next::SendAndDone(m) | Next::Fail(_, Some(m)) => *m,
            other => panic!("{other:?}"),
        };
        (vec![challenge, answer], last)
    }

    #[test]
    fn an_acceptor_of_any_other_rank_proves_the_rank_its_hello_names_and_no_other() {
        for rank in [1, 3] {
            let (answers, last) = play_blind(b"t", VERSION, 4, rank);
            assert!(matches!(last, Next::SendAndDone(_)), "{last:?}");
            assert_eq!(answers[1].kind, MessageKind::Welcome);
        }
        for (version, world, rank, reason) in [
            (VERSION, 4, 0, RejectReason::WrongRank),
            (VERSION, 4, 4, RejectReason::WrongRank),
            (VERSION, 4, u32::MAX, RejectReason::WrongRank),
            (VERSION, 5, 1, RejectReason::WorldMismatch),
            (VERSION + 1, 4, 1, RejectReason::VersionMismatch),
        ] {
            let (_, last) = play_blind(b"t", version, world, rank);
            assert_eq!(last, refuse(reason), "{version} {world} {rank}");
        }
    }

    /// Finding 7: without the token, a connection learns nothing from rank 0's answers: not its
    /// world, not its version, not which ranks exist. Every Hello is challenged alike, with
    /// nothing claimed, and every proof refused alike.
    #[test]
    fn without_the_token_every_claim_gets_the_same_answers_from_the_exchange() {
        let honest = play_blind(b"wrong", VERSION, 4, 1).0;
        assert_eq!((honest[0].version, honest[0].world, honest[0].rank), (0, 0, 0));
        assert_eq!(honest[1].kind, MessageKind::Reject(RejectReason::TokenMismatch));
        for (version, world, rank) in
            [(VERSION, 5, 1), (VERSION, 2, 1), (VERSION + 1, 4, 1), (1, 4, 1), (VERSION, 4, 9)]
        {
            let answers = play_blind(b"wrong", version, world, rank).0;
            let shape = |m: &Message| (m.version, m.kind, m.world, m.rank);
            let shapes: Vec<_> = answers.iter().map(shape).collect();
            assert_eq!(
                shapes,
                honest.iter().map(shape).collect::<Vec<_>>(),
                "{version} {world} {rank}"
            );
        }
    }

    #[test]
    fn a_refusal_tells_only_its_reason() {
        let mut acc = Acceptor::new(b"t", ROSTER, 7, 3, 2, [0; 16]);
        let (_, hello) = Connector::start(b"t", ROSTER, 5, 2, 3, [1; 16]);
        let Next::Fail(_, Some(refusal)) = acc.on_message(&hello) else { panic!() };
        let expected = Message {
            version: 0,
            kind: MessageKind::Reject(RejectReason::WorldMismatch),
            world: 0,
            rank: 0,
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
            channel: 0,
        };
        assert_eq!(refusal, expected);
        // And a refusal leaves the hearer no claims to report as the other side's.
        let (mut conn, _) = Connector::start(b"t", ROSTER, 5, 2, 3, [1; 16]);
        assert!(matches!(conn.on_message(&refusal), Next::Fail(Failure::RefusedBy(_), None)));
        assert_eq!(conn.peer_claims, None);
    }

    /// Finding 5 of the second review: a ring listener answered a stranger by reason (another
    /// version, world, rank, a rank outside its chord peers), which told it the version, the
    /// world size and, from 8 ranks, the listener's chord peers and so its rank. Without the
    /// job's address list, every Hello now hears the same refusal, byte for byte.
    #[test]
    fn a_stranger_learns_nothing_from_a_ring_listeners_refusal_but_that_it_was_refused() {
        let peers = [3usize, 2, 0];
        let acceptors = || {
            [
                Acceptor::new(b"t", ROSTER, 8, 3, 2, [0; 16]),
                Acceptor::from_one_of(b"t", ROSTER, 8, 4, &peers, [0; 16]),
            ]
        };
        let mut answers = std::collections::HashSet::new();
        for version in [VERSION, VERSION + 1, 1, 0] {
            for world in [8, 5, 9, 0, u32::MAX] {
                for rank in [0, 1, 2, 3, 4, 7, 8, u32::MAX] {
                    for roster in [[0; 32], [7; 32]] {
                        let (_, mut hello) =
                            Connector::start(b"?", roster, world, rank, 4, [1; 16]);
                        hello.version = version;
                        let hello = roundtrip(&hello);
                        for mut acceptor in acceptors() {
                            let Next::Fail(Failure::Refused(_), Some(refusal)) =
                                acceptor.on_message(&hello)
                            else {
                                panic!("a stranger's Hello was not refused: {hello:?}");
                            };
                            answers.insert(refusal.encode());
                        }
                    }
                }
            }
        }
        let expected = reject(RejectReason::AddressMismatch).unwrap().encode();
        assert_eq!(answers.into_iter().collect::<Vec<_>>(), [expected]);
        // One who knows the list is told why, as a misconfigured rank of the job needs.
        let (_, hello) = Connector::start(b"t", ROSTER, 5, 2, 3, [1; 16]);
        let mut acc = Acceptor::new(b"t", ROSTER, 8, 3, 2, [0; 16]);
        assert_eq!(acc.on_message(&hello), refuse(RejectReason::WorldMismatch));
    }

    #[test]
    fn the_roster_digest_depends_on_every_address_and_its_order() {
        let a: std::net::SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: std::net::SocketAddr = "[::1]:2".parse().unwrap();
        let c: std::net::SocketAddr = "10.0.0.1:3".parse().unwrap();
        assert_eq!(roster_digest(&[a, b]), roster_digest(&[a, b]));
        assert_ne!(roster_digest(&[a, b]), roster_digest(&[b, a]));
        assert_ne!(roster_digest(&[a, b]), roster_digest(&[a, c]));
        assert_ne!(roster_digest(&[a]), roster_digest(&[a, a]));
    }

    #[test]
    fn an_acceptor_of_a_set_proves_the_rank_its_hello_names_and_refuses_the_others() {
        // Rank 4 of 8 accepts its left neighbour and the chord peers behind it.
        let expected: [usize; 3] = [3, 2, 0];
        for rank in [3, 2, 0] {
            let (mut conn, hello) = Connector::start(b"t", ROSTER, 8, rank, 4, [1; 16]);
            let mut acc = Acceptor::from_one_of(b"t", ROSTER, 8, 4, &expected, [2; 16]);
            assert_eq!(acc.peer(), 4, "no rank is proven before a Hello");
            let Next::Send(challenge) = acc.on_message(&hello) else { panic!("rank {rank}") };
            assert_eq!((challenge.world, challenge.rank), (8, 4));
            let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
            assert!(matches!(acc.on_message(&proof), Next::SendAndDone(_)), "rank {rank}");
            assert_eq!(acc.peer(), rank);
        }
        for rank in [1, 4, 5, 7, 8, u32::MAX] {
            let (_, hello) = Connector::start(b"t", ROSTER, 8, rank, 4, [1; 16]);
            let mut acc = Acceptor::from_one_of(b"t", ROSTER, 8, 4, &expected, [2; 16]);
            assert_eq!(acc.on_message(&hello), refuse(RejectReason::WrongRank), "rank {rank}");
        }
        // A proof made for another acceptor rank (a replay from another stream) fails here.
        let (mut conn, hello) = Connector::start(b"t", ROSTER, 8, 3, 5, [1; 16]);
        let mut acc = Acceptor::from_one_of(b"t", ROSTER, 8, 4, &expected, [2; 16]);
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
        let mut challenge = challenge;
        challenge.rank = 5;
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        assert_eq!(acc.on_message(&proof), refuse(RejectReason::TokenMismatch));
    }

    #[test]
    fn roles_say_when_the_proof_is_out_and_when_a_hello_was_taken() {
        let (mut conn, hello) = Connector::start(b"t", ROSTER, 2, 0, 1, [1; 16]);
        let mut acc = Acceptor::new(b"t", ROSTER, 2, 1, 0, [2; 16]);
        assert!(!acc.challenged());
        let Next::Send(challenge) = acc.on_message(&hello) else { panic!() };
        assert!(acc.challenged());
        assert!(!conn.proved());
        let Next::Send(proof) = conn.on_message(&challenge) else { panic!() };
        assert!(conn.proved());
        assert!(matches!(acc.on_message(&proof), Next::SendAndDone(_)));
        assert!(!acc.challenged());
    }
}
