//! The handshake's one message format, and its codec.
//!
//! Every message is [`MESSAGE_LEN`] bytes, integers big-endian:
//!
//! ```text
//!  0          8         10     11       12       16      20          36          68        70   72
//!  +----------+---------+------+--------+--------+-------+-----------+-----------+---------+----+
//!  | SILVICNT | version | kind | reason | world  | rank  | nonce[16] | mac[32]   | channel | 00 |
//!  +----------+---------+------+--------+--------+-------+-----------+-----------+---------+----+
//! ```
//!
//! `channel` names the channel a ring stream carries (0: the ring's first streams, and every
//! stream of the address exchange; see `channels.rs`).
//!
//! A Hello carries the roster digest in its `mac` field. A Reject carries only its reason:
//! version, world and rank are zero, so a peer that has not proven the token learns nothing
//! about the rank that refused it but why.
//!
//! Invariants: `decode` accepts exactly what `encode` produces (reserved bytes zero, known
//! kinds and reasons), and reads nothing past [`MESSAGE_LEN`] bytes. Not here: what a message
//! means in the exchange (`mod.rs`).

use byteorder::{BigEndian, ByteOrder};

/// The protocol version, of the ring handshake and of `from_env`'s address exchange, which
/// speaks the same messages. Ranks of different versions reject each other. 15: an abort's
/// cause 8, a call its caller cancelled (14: every message names the channel of its stream and
/// the agreement carries each rank's cores and channel setting; docs/protocol.md has the history).
pub const VERSION: u16 = 15;
/// Bytes in every handshake message.
pub const MESSAGE_LEN: usize = 72;
/// The eight bytes every handshake message starts with.
pub const MAGIC: [u8; 8] = *b"SILVICNT";
/// Bytes in a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes in a MAC, and in a roster digest.
pub const MAC_LEN: usize = 32;

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
    /// The connection came from, or reached, a rank other than the ring neighbour, or named a
    /// channel the accepting rank does not take.
    WrongRank,
    /// The ranks were given different address lists (another length, other entries or
    /// order). A ring listener answers every Hello that does not carry its own list's digest
    /// with this reason alone, whatever else the Hello claims.
    AddressMismatch,
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::TokenMismatch => 1,
            RejectReason::VersionMismatch => 2,
            RejectReason::WorldMismatch => 3,
            RejectReason::WrongRank => 4,
            RejectReason::AddressMismatch => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => RejectReason::TokenMismatch,
            2 => RejectReason::VersionMismatch,
            3 => RejectReason::WorldMismatch,
            4 => RejectReason::WrongRank,
            5 => RejectReason::AddressMismatch,
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
    /// The sender's MAC (Proof, Welcome), the roster digest (Hello), else zero.
    pub mac: [u8; MAC_LEN],
    /// The channel of the stream (zero but on a ring of several channels).
    pub channel: u16,
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
    pub(super) fn new(kind: MessageKind, world: u32, rank: u32) -> Message {
        let (nonce, mac) = ([0; NONCE_LEN], [0; MAC_LEN]);
        Message { version: VERSION, kind, world, rank, nonce, mac, channel: 0 }
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
        BigEndian::write_u16(&mut out[68..70], self.channel);
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
        if bytes[70..] != [0; 2] {
            return Err(MessageError::Malformed);
        }
        Ok(Message {
            version: BigEndian::read_u16(&bytes[8..10]),
            kind,
            world: BigEndian::read_u32(&bytes[12..16]),
            rank: BigEndian::read_u32(&bytes[16..20]),
            nonce: bytes[20..36].try_into().expect("16 bytes"),
            mac: bytes[36..68].try_into().expect("32 bytes"),
            channel: BigEndian::read_u16(&bytes[68..70]),
        })
    }
}
