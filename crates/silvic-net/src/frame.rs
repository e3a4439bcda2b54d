//! Data frames: the fixed header in front of every payload a ring step moves, and the abort frame.
//!
//! ```text
//!  0      2      3      4             8                16               24               32
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  | "Sn" | kind | 0x00 | 0x00000000  | seq: u64       | total: u64     | len: u64       |
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  all integers big-endian; `len` payload bytes follow the header
//! ```
//!
//! - `kind` is the collective ([`Op`]) or [`ABORT`].
//! - `seq` is the collective's index since connect: the same on every rank for the same call.
//! - `total` is the caller's buffer length in bytes, so ranks that passed different lengths fail
//!   at the first frame even when a segment happens to be the same size as a whole buffer.
//! - `len` is the payload length. It is compared with what the receiver expects and never used to
//!   size an allocation.
//!
//! Invariants: [`Header::decode`] takes exactly [`HEADER_LEN`] bytes (a short header cannot
//! exist), rejects an unknown kind, nonzero reserved bytes and any length above [`MAX_LEN`], and
//! `decode(encode(h)) == h`. Nothing here does I/O.
//!
//! Payload numbers are little-endian: the ring sends a buffer's memory as it is, so the crate
//! refuses to build for big-endian targets rather than mix byte orders on the wire.

use byteorder::{BigEndian, ByteOrder};
use silvic_core::{CollectiveError, Op};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
/// The two bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 2] = *b"Sn";
/// The kind byte of an abort frame.
pub const ABORT: u8 = 0xAB;
/// The largest payload length a header may claim: 256 TiB, far above any buffer.
pub const MAX_LEN: u64 = 1 << 48;
/// Bytes in an abort payload, before its message.
const ABORT_FIXED_LEN: usize = 4 + 1 + 4 + 2;
/// The longest message an abort payload carries; longer messages are cut.
pub const MAX_ABORT_MESSAGE: usize = 480;
/// The largest abort payload.
pub const MAX_ABORT_LEN: usize = ABORT_FIXED_LEN + MAX_ABORT_MESSAGE;

/// What a frame carries: a collective's data or an abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Data of a collective.
    Data(Op),
    /// The sender failed; the payload says where and why.
    Abort,
}

impl Kind {
    fn to_byte(self) -> u8 {
        match self {
            Kind::Data(Op::AllreduceSumF64) => 1,
            Kind::Data(Op::AllreduceSumI64) => 2,
            Kind::Data(Op::AllreduceMaxF64) => 3,
            Kind::Data(Op::AllgatherBytes) => 4,
            Kind::Data(_) => unreachable!("every Op has a kind byte"),
            Kind::Abort => ABORT,
        }
    }

    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Data(Op::AllreduceSumF64),
            2 => Kind::Data(Op::AllreduceSumI64),
            3 => Kind::Data(Op::AllreduceMaxF64),
            4 => Kind::Data(Op::AllgatherBytes),
            ABORT => Kind::Abort,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// The collective's index since connect.
    pub seq: u64,
    /// The caller's buffer length in bytes (for an abort: 0).
    pub total: u64,
    /// Payload bytes after the header.
    pub len: u64,
}

/// Why bytes are not a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes are not [`FRAME_MAGIC`].
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    /// The kind byte names no collective.
    #[error("unknown kind {0:#04x}")]
    UnknownKind(u8),
    /// A reserved byte is not zero.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// The payload length is above [`MAX_LEN`], or an abort payload above [`MAX_ABORT_LEN`].
    #[error("payload length {0} is too large")]
    TooLong(u64),
    /// An abort payload is cut short or its fields disagree with its length.
    #[error("abort payload is malformed")]
    BadAbort,
}

impl Header {
    /// The header of a data frame.
    pub fn data(op: Op, seq: u64, total: u64, len: u64) -> Header {
        Header { kind: Kind::Data(op), seq, total, len }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..2].copy_from_slice(&FRAME_MAGIC);
        out[2] = self.kind.to_byte();
        BigEndian::write_u64(&mut out[8..16], self.seq);
        BigEndian::write_u64(&mut out[16..24], self.total);
        BigEndian::write_u64(&mut out[24..32], self.len);
        out
    }

    /// Decodes a header, checking everything that does not depend on what the receiver expects.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        if bytes[..2] != FRAME_MAGIC {
            return Err(FrameError::BadMagic([bytes[0], bytes[1]]));
        }
        let kind = Kind::from_byte(bytes[2]).ok_or(FrameError::UnknownKind(bytes[2]))?;
        if bytes[3..8] != [0; 5] {
            return Err(FrameError::Reserved);
        }
        let len = BigEndian::read_u64(&bytes[24..32]);
        let max = if kind == Kind::Abort { MAX_ABORT_LEN as u64 } else { MAX_LEN };
        if len > max {
            return Err(FrameError::TooLong(len));
        }
        let seq = BigEndian::read_u64(&bytes[8..16]);
        let total = BigEndian::read_u64(&bytes[16..24]);
        Ok(Header { kind, seq, total, len })
    }

    /// Checks a data header from `peer` against the one this rank expects at this point of the
    /// collective: same op and sequence (else out of step), same buffer length and payload length
    /// (else a length mismatch). Called before a payload byte is read.
    pub fn expect(&self, expected: &Header, peer: usize) -> Result<(), CollectiveError> {
        let (Kind::Data(got_op), Kind::Data(expected_op)) = (self.kind, expected.kind) else {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: "expected a data frame".into(),
            });
        };
        if got_op != expected_op || self.seq != expected.seq {
            return Err(CollectiveError::OutOfStep {
                peer,
                expected_op,
                expected_seq: expected.seq,
                got_op,
                got_seq: self.seq,
            });
        }
        if self.total != expected.total {
            return Err(CollectiveError::LengthMismatch {
                peer,
                expected: expected.total,
                got: self.total,
            });
        }
        if self.len != expected.len {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: format!("payload of {} bytes, expected {}", self.len, expected.len),
            });
        }
        Ok(())
    }
}

/// What an abort frame says: the rank where a failure began and the error it saw there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abort {
    /// The rank where the failure began.
    pub origin: usize,
    /// The error seen at `origin`.
    pub cause: CollectiveError,
}

const CAUSE_IO: u8 = 1;
const CAUSE_CLOSED: u8 = 2;
const CAUSE_TIMEOUT: u8 = 3;
const CAUSE_OUT_OF_STEP: u8 = 4;
const CAUSE_LENGTH: u8 = 5;
const CAUSE_MALFORMED: u8 = 6;
const NO_PEER: u32 = u32::MAX;

impl Abort {
    /// The abort to send for `error` seen on this rank, `rank`: an error relayed from elsewhere
    /// keeps its origin and cause, so the whole ring names the same origin.
    pub fn for_error(rank: usize, error: &CollectiveError) -> Abort {
        match error {
            CollectiveError::Aborted { origin, cause } => {
                Abort { origin: *origin, cause: (**cause).clone() }
            }
            other => Abort { origin: rank, cause: other.clone() },
        }
    }

    /// The error a rank returns on receiving this abort.
    pub fn into_error(self) -> CollectiveError {
        CollectiveError::Aborted { origin: self.origin, cause: Box::new(self.cause) }
    }

    /// Encodes a whole abort frame (header and payload) into `out`, returning its length.
    ///
    /// The cause travels as its kind, its peer and its message; the message is cut to
    /// [`MAX_ABORT_MESSAGE`] bytes on a character boundary.
    pub fn encode(&self, seq: u64, out: &mut [u8; HEADER_LEN + MAX_ABORT_LEN]) -> usize {
        let (code, message) = match &self.cause {
            CollectiveError::Io { message, .. } => (CAUSE_IO, message.clone()),
            CollectiveError::PeerClosed { .. } => (CAUSE_CLOSED, String::new()),
            CollectiveError::Timeout { waited, .. } => {
                // Decoded as a u64 of milliseconds: a longer wait (a timeout of Duration::MAX)
                // is sent as the longest one that fits.
                let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                (CAUSE_TIMEOUT, ms.to_string())
            }
            CollectiveError::OutOfStep { expected_op, expected_seq, got_op, got_seq, .. } => {
                let (expected, got) =
                    (Kind::Data(*expected_op).to_byte(), Kind::Data(*got_op).to_byte());
                (CAUSE_OUT_OF_STEP, format!("{expected} {expected_seq} {got} {got_seq}"))
            }
            CollectiveError::LengthMismatch { expected, got, .. } => {
                (CAUSE_LENGTH, format!("{expected} {got}"))
            }
            CollectiveError::MalformedFrame { reason, .. } => (CAUSE_MALFORMED, reason.clone()),
            other => (CAUSE_MALFORMED, other.to_string()),
        };
        let mut cut = message.len().min(MAX_ABORT_MESSAGE);
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        let message = &message.as_bytes()[..cut];
        let peer = self.cause.peer().map_or(NO_PEER, |p| u32::try_from(p).unwrap_or(NO_PEER));
        let payload_len = ABORT_FIXED_LEN + message.len();
        let header = Header { kind: Kind::Abort, seq, total: 0, len: payload_len as u64 };
        out[..HEADER_LEN].copy_from_slice(&header.encode());
        let p = &mut out[HEADER_LEN..];
        BigEndian::write_u32(&mut p[0..4], u32::try_from(self.origin).unwrap_or(NO_PEER));
        p[4] = code;
        BigEndian::write_u32(&mut p[5..9], peer);
        BigEndian::write_u16(&mut p[9..11], message.len() as u16);
        p[ABORT_FIXED_LEN..payload_len].copy_from_slice(message);
        HEADER_LEN + payload_len
    }

    /// Decodes an abort payload (the bytes after an abort header). Never panics; text that is not
    /// UTF-8 is replaced, not trusted.
    pub fn decode(payload: &[u8]) -> Result<Abort, FrameError> {
        if payload.len() < ABORT_FIXED_LEN || payload.len() > MAX_ABORT_LEN {
            return Err(FrameError::BadAbort);
        }
        let origin = BigEndian::read_u32(&payload[0..4]) as usize;
        let code = payload[4];
        let peer = BigEndian::read_u32(&payload[5..9]);
        let message_len = BigEndian::read_u16(&payload[9..11]) as usize;
        if ABORT_FIXED_LEN + message_len != payload.len() || peer == NO_PEER {
            return Err(FrameError::BadAbort);
        }
        let peer = peer as usize;
        let message = String::from_utf8_lossy(&payload[ABORT_FIXED_LEN..]).into_owned();
        let cause = match code {
            CAUSE_IO => CollectiveError::Io { peer, kind: std::io::ErrorKind::Other, message },
            CAUSE_CLOSED => CollectiveError::PeerClosed { peer },
            CAUSE_TIMEOUT => {
                let ms = message.parse::<u64>().map_err(|_| FrameError::BadAbort)?;
                CollectiveError::Timeout { peer, waited: std::time::Duration::from_millis(ms) }
            }
            CAUSE_LENGTH => match numbers::<2>(&message)? {
                [expected, got] => CollectiveError::LengthMismatch { peer, expected, got },
            },
            CAUSE_OUT_OF_STEP => {
                let [expected_op, expected_seq, got_op, got_seq] = numbers::<4>(&message)?;
                let op = |byte: u64| match u8::try_from(byte).ok().and_then(Kind::from_byte) {
                    Some(Kind::Data(op)) => Ok(op),
                    _ => Err(FrameError::BadAbort),
                };
                CollectiveError::OutOfStep {
                    peer,
                    expected_op: op(expected_op)?,
                    expected_seq,
                    got_op: op(got_op)?,
                    got_seq,
                }
            }
            CAUSE_MALFORMED => CollectiveError::MalformedFrame { peer, reason: message },
            _ => return Err(FrameError::BadAbort),
        };
        Ok(Abort { origin, cause })
    }
}

/// Exactly `N` space-separated decimal numbers.
fn numbers<const N: usize>(text: &str) -> Result<[u64; N], FrameError> {
    let mut out = [0u64; N];
    let mut parts = text.split(' ');
    for slot in &mut out {
        *slot = parts.next().and_then(|p| p.parse().ok()).ok_or(FrameError::BadAbort)?;
    }
    match parts.next() {
        None => Ok(out),
        Some(_) => Err(FrameError::BadAbort),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn all_kinds() -> Vec<Kind> {
        let mut kinds = vec![Kind::Abort];
        for op in
            [Op::AllreduceSumF64, Op::AllreduceSumI64, Op::AllreduceMaxF64, Op::AllgatherBytes]
        {
            kinds.push(Kind::Data(op));
        }
        kinds
    }

    #[test]
    fn header_round_trips() {
        for kind in all_kinds() {
            for (seq, total, len) in [(0, 0, 0), (1, 4096, 480), (u64::MAX, u64::MAX, 400)] {
                let h = Header { kind, seq, total, len };
                assert_eq!(Header::decode(&h.encode()), Ok(h));
            }
        }
        let big = Header::data(Op::AllgatherBytes, 9, MAX_LEN, MAX_LEN);
        assert_eq!(Header::decode(&big.encode()), Ok(big));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let good = Header::data(Op::AllreduceSumF64, 3, 64, 64).encode();
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), Err(FrameError::BadMagic([b'X', b'n'])));
        let mut bad = good;
        bad[2] = 0x77;
        assert_eq!(Header::decode(&bad), Err(FrameError::UnknownKind(0x77)));
        let mut bad = good;
        bad[5] = 1;
        assert_eq!(Header::decode(&bad), Err(FrameError::Reserved));
        let mut bad = good;
        bad[24..32].copy_from_slice(&(MAX_LEN + 1).to_be_bytes());
        assert_eq!(Header::decode(&bad), Err(FrameError::TooLong(MAX_LEN + 1)));
        let mut bad = Header { kind: Kind::Abort, seq: 0, total: 0, len: 0 }.encode();
        bad[24..32].copy_from_slice(&((MAX_ABORT_LEN + 1) as u64).to_be_bytes());
        assert!(matches!(Header::decode(&bad), Err(FrameError::TooLong(_))));
        assert_eq!(Header::decode(&[0u8; HEADER_LEN]), Err(FrameError::BadMagic([0, 0])));
    }

    #[test]
    fn expect_names_both_sides() {
        let mine = Header::data(Op::AllreduceSumF64, 5, 800, 200);
        let theirs = Header::data(Op::AllgatherBytes, 5, 800, 200);
        assert!(matches!(
            theirs.expect(&mine, 2),
            Err(CollectiveError::OutOfStep { peer: 2, got_op: Op::AllgatherBytes, .. })
        ));
        let later = Header::data(Op::AllreduceSumF64, 6, 800, 200);
        assert!(matches!(
            later.expect(&mine, 2),
            Err(CollectiveError::OutOfStep { expected_seq: 5, got_seq: 6, .. })
        ));
        let longer = Header::data(Op::AllreduceSumF64, 5, 808, 200);
        assert_eq!(
            longer.expect(&mine, 1),
            Err(CollectiveError::LengthMismatch { peer: 1, expected: 800, got: 808 })
        );
        assert_eq!(mine.expect(&mine, 0), Ok(()));
    }

    #[test]
    fn abort_round_trips_each_cause() {
        let causes = [
            CollectiveError::PeerClosed { peer: 3 },
            CollectiveError::Timeout { peer: 1, waited: Duration::from_millis(1500) },
            CollectiveError::LengthMismatch { peer: 0, expected: 8, got: 16 },
            CollectiveError::OutOfStep {
                peer: 5,
                expected_op: Op::AllreduceMaxF64,
                expected_seq: 2,
                got_op: Op::AllgatherBytes,
                got_seq: 3,
            },
            CollectiveError::MalformedFrame { peer: 2, reason: "ünïcode ok".into() },
        ];
        for cause in causes {
            let abort = Abort { origin: 4, cause };
            let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
            let n = abort.encode(11, &mut out);
            let header = Header::decode(out[..HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!((header.kind, header.seq, header.len), (Kind::Abort, 11, (n - 32) as u64));
            assert_eq!(Abort::decode(&out[HEADER_LEN..n]), Ok(abort));
        }
    }

    #[test]
    fn abort_cuts_long_messages_and_keeps_the_origin_of_a_relay() {
        let long = CollectiveError::MalformedFrame { peer: 1, reason: "é".repeat(400) };
        let relayed = CollectiveError::Aborted { origin: 7, cause: Box::new(long) };
        let abort = Abort::for_error(2, &relayed);
        assert_eq!(abort.origin, 7);
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = abort.encode(0, &mut out);
        assert!(n <= out.len());
        let back = Abort::decode(&out[HEADER_LEN..n]).unwrap();
        assert_eq!(back.origin, 7);
        assert_eq!(back.cause.peer(), Some(1));
    }

    #[test]
    fn a_timeout_too_long_for_the_wire_is_sent_as_the_longest_that_fits() {
        // Found by the abort_decode fuzz target: a wait above u64::MAX milliseconds (a timeout
        // of Duration::MAX) was sent as text the receiver could not parse.
        let cause = CollectiveError::Timeout { peer: 1, waited: Duration::MAX };
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin: 0, cause }.encode(3, &mut out);
        let back = Abort::decode(&out[HEADER_LEN..n]).expect("decodes");
        let longest = Duration::from_millis(u64::MAX);
        assert_eq!(back.cause, CollectiveError::Timeout { peer: 1, waited: longest });
    }

    #[test]
    fn malformed_abort_payloads_are_rejected() {
        assert_eq!(Abort::decode(&[]), Err(FrameError::BadAbort));
        assert_eq!(Abort::decode(&[0; ABORT_FIXED_LEN]), Err(FrameError::BadAbort));
        let mut p = [0u8; ABORT_FIXED_LEN + 2];
        p[4] = CAUSE_CLOSED;
        p[10] = 5; // claims a 5-byte message, has 2
        assert_eq!(Abort::decode(&p), Err(FrameError::BadAbort));
        p[10] = 2;
        assert!(Abort::decode(&p).is_ok());
        p[4] = 99;
        assert_eq!(Abort::decode(&p), Err(FrameError::BadAbort));
    }
}
