//! Data frames: the fixed header in front of every payload a ring step moves; the abort frame and
//! the waiting notice, the two control frames.
//!
//! ```text
//!  0      2      3      4             8                16               24               32
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  | "Sn" | kind | dir  | block: u32  | seq: u64       | total: u64     | len: u64       |
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  all integers big-endian; `len` payload bytes follow the header
//! ```
//!
//! - `kind` is the collective ([`Op`]), [`ABORT`] or [`WAITING`].
//! - `dir` is the way a data frame travels round the ring ([`Dir`]: 0 rightward, 1 leftward),
//!   and `block` whose data it carries (the rank of a gathered block, the segment of a ring
//!   step). Both are zero in a control frame.
//! - `seq` is the collective's index since connect: the same on every rank for the same call.
//! - `total` is the caller's buffer length in bytes, so ranks that passed different lengths fail
//!   at the first frame even when a segment happens to be the same size as a whole buffer.
//! - `len` is the payload length. It is compared with what the receiver expects and never used to
//!   size an allocation.
//!
//! Invariants: [`Header::decode`] takes exactly [`HEADER_LEN`] bytes (a short header cannot
//! exist), rejects an unknown kind, an unknown direction, a control frame with a direction or block and any length above [`MAX_LEN`], and
//! `decode(encode(h)) == h`. Nothing here does I/O.
//!
//! Payload numbers are little-endian: the ring sends a buffer's memory as it is, so the crate
//! refuses to build for big-endian targets rather than mix byte orders on the wire.

use byteorder::{BigEndian, ByteOrder};
use std::time::Duration;

use silvic_core::{CollectiveError, Op};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
/// The two bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 2] = *b"Sn";
/// The kind byte of an abort frame.
pub const ABORT: u8 = 0xAB;
/// The largest payload length a header may claim: 256 TiB, far above any buffer.
pub const MAX_LEN: u64 = 1 << 48;
/// The kind byte of a waiting notice.
pub const WAITING: u8 = 0xA7;
/// Bytes in a waiting notice's payload.
pub const WAITING_LEN: usize = 4 + 8;
/// Bytes in an abort payload, before its message.
pub const ABORT_FIXED_LEN: usize = 4 + 1 + 4 + 1 + 1 + 8 + 8 + 2;
/// The longest message an abort payload carries; longer messages are cut.
pub const MAX_ABORT_MESSAGE: usize = 480;
/// The largest abort payload.
pub const MAX_ABORT_LEN: usize = ABORT_FIXED_LEN + MAX_ABORT_MESSAGE;

/// Which way a data frame travels round the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From a rank to its right neighbour, `r + 1`.
    Right,
    /// From a rank to its left neighbour, `r - 1`.
    Left,
}

/// What a frame carries: a collective's data or an abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Data of a collective.
    Data(Op),
    /// The sender failed; the payload says where and why.
    Abort,
    /// The sender is alive and waiting on another rank; the payload says which.
    Waiting,
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
            Kind::Waiting => WAITING,
        }
    }

    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Data(Op::AllreduceSumF64),
            2 => Kind::Data(Op::AllreduceSumI64),
            3 => Kind::Data(Op::AllreduceMaxF64),
            4 => Kind::Data(Op::AllgatherBytes),
            ABORT => Kind::Abort,
            WAITING => Kind::Waiting,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// Which way the frame travels (a control frame: [`Dir::Right`]).
    pub dir: Dir,
    /// Whose block (or which segment) the frame carries (a control frame: 0).
    pub block: u32,
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
    /// The direction byte names no direction, or a control frame has a direction or block.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// The payload length is above [`MAX_LEN`], or an abort payload above [`MAX_ABORT_LEN`].
    #[error("payload length {0} is too large")]
    TooLong(u64),
    /// An abort payload is cut short, its fields disagree with its length, or a field its
    /// cause does not use is not zero.
    #[error("abort payload is malformed")]
    BadAbort,
    /// A waiting notice's payload is not [`WAITING_LEN`] bytes.
    #[error("waiting notice is malformed")]
    BadWaiting,
    /// A rank field names no rank of this world.
    #[error("rank {0} is not in this world")]
    BadRank(u32),
}

impl Header {
    /// The header of a data frame travelling rightward with block 0 (see [`Header::carrying`]).
    pub fn data(op: Op, seq: u64, total: u64, len: u64) -> Header {
        Header { kind: Kind::Data(op), dir: Dir::Right, block: 0, seq, total, len }
    }

    /// The header of a control frame.
    pub fn control(kind: Kind, seq: u64, len: u64) -> Header {
        Header { kind, dir: Dir::Right, block: 0, seq, total: 0, len }
    }

    /// This header, travelling `dir` and carrying `block`.
    pub fn carrying(self, dir: Dir, block: usize) -> Header {
        Header { dir, block: u32::try_from(block).unwrap_or(u32::MAX), ..self }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..2].copy_from_slice(&FRAME_MAGIC);
        out[2] = self.kind.to_byte();
        out[3] = match self.dir {
            Dir::Right => 0,
            Dir::Left => 1,
        };
        BigEndian::write_u32(&mut out[4..8], self.block);
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
        let dir = match bytes[3] {
            0 => Dir::Right,
            1 => Dir::Left,
            _ => return Err(FrameError::Reserved),
        };
        let block = BigEndian::read_u32(&bytes[4..8]);
        if !matches!(kind, Kind::Data(_)) && (dir, block) != (Dir::Right, 0) {
            return Err(FrameError::Reserved);
        }
        let len = BigEndian::read_u64(&bytes[24..32]);
        let max = match kind {
            Kind::Abort => MAX_ABORT_LEN as u64,
            Kind::Waiting => WAITING_LEN as u64,
            Kind::Data(_) => MAX_LEN,
        };
        if len > max {
            return Err(FrameError::TooLong(len));
        }
        let seq = BigEndian::read_u64(&bytes[8..16]);
        let total = BigEndian::read_u64(&bytes[16..24]);
        Ok(Header { kind, dir, block, seq, total, len })
    }

    /// Checks a data header from `peer` against the one this rank expects at this point of the
    /// collective: same op and sequence (else out of step), same buffer length (else a length
    /// mismatch), same direction, block and payload length (else malformed). Called before a
    /// payload byte is read.
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
        if (self.dir, self.block) != (expected.dir, expected.block) {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: format!(
                    "block {} travelling {:?}, expected block {} travelling {:?}",
                    self.block, self.dir, expected.block, expected.dir
                ),
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
///
/// The payload after an abort header, fixed binary fields then the message:
///
/// ```text
///  0          4       5          9      10     11               19               27      29
///  +----------+-------+----------+------+------+----------------+----------------+-------+---------+
///  | origin   | cause | peer     | op_a | op_b | a: u64         | b: u64         | n: u16| message |
///  +----------+-------+----------+------+------+----------------+----------------+-------+---------+
///  integers big-endian; `n` message bytes (UTF-8) follow
/// ```
///
/// | cause | op_a, a | op_b, b | message |
/// |---|---|---|---|
/// | 1 i/o error | 0, 0 | 0, 0 | the OS message |
/// | 2 peer closed | 0, 0 | 0, 0 | empty |
/// | 3 timeout | 0, waited ms | 0, 0 | empty |
/// | 4 out of step | expected op, expected seq | got op, got seq | empty |
/// | 5 length mismatch | 0, expected bytes | 0, got bytes | empty |
/// | 6 malformed frame | 0, 0 | 0, 0 | the reason |
///
/// A field a cause does not use is zero, and [`Abort::decode`] rejects anything else, so every
/// accepted payload is the one encoding of its abort. Ranks are checked below the world size;
/// control characters in a message are escaped before the text reaches an error or a log line.
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

/// The fields of an abort payload, as they sit on the wire.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct AbortFields {
    origin: u32,
    cause: u8,
    peer: u32,
    op_a: u8,
    op_b: u8,
    a: u64,
    b: u64,
}

/// A rank as a wire field: a world has fewer than `u32::MAX` ranks (checked at connect).
fn rank_field(rank: usize) -> u32 {
    u32::try_from(rank).unwrap_or(u32::MAX)
}

/// A rank read from the wire, if it is one of this world's.
fn rank_of(field: u32, world: usize) -> Result<usize, FrameError> {
    let rank = field as usize;
    if rank < world { Ok(rank) } else { Err(FrameError::BadRank(field)) }
}

/// `text` with every control character (newlines, escapes, NUL...) written as an escape, so
/// that a peer's text cannot forge or garble a log line.
pub fn escape_controls(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

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
    /// The message is cut to [`MAX_ABORT_MESSAGE`] bytes on a character boundary; a wait longer
    /// than `u64::MAX` milliseconds is sent as that.
    pub fn encode(&self, seq: u64, out: &mut [u8; HEADER_LEN + MAX_ABORT_LEN]) -> usize {
        let op = |op: Op| Kind::Data(op).to_byte();
        let mut f = AbortFields {
            origin: rank_field(self.origin),
            peer: self.cause.peer().map_or(u32::MAX, rank_field),
            ..AbortFields::default()
        };
        let message = match &self.cause {
            CollectiveError::Io { message, .. } => {
                f.cause = CAUSE_IO;
                message.clone()
            }
            CollectiveError::PeerClosed { .. } => {
                f.cause = CAUSE_CLOSED;
                String::new()
            }
            CollectiveError::Timeout { waited, .. } => {
                f.cause = CAUSE_TIMEOUT;
                f.a = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                String::new()
            }
            CollectiveError::OutOfStep { expected_op, expected_seq, got_op, got_seq, .. } => {
                f.cause = CAUSE_OUT_OF_STEP;
                (f.op_a, f.a, f.op_b, f.b) =
                    (op(*expected_op), *expected_seq, op(*got_op), *got_seq);
                String::new()
            }
            CollectiveError::LengthMismatch { expected, got, .. } => {
                f.cause = CAUSE_LENGTH;
                (f.a, f.b) = (*expected, *got);
                String::new()
            }
            CollectiveError::MalformedFrame { reason, .. } => {
                f.cause = CAUSE_MALFORMED;
                reason.clone()
            }
            other => {
                f.cause = CAUSE_MALFORMED;
                other.to_string()
            }
        };
        let mut cut = message.len().min(MAX_ABORT_MESSAGE);
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        let message = &message.as_bytes()[..cut];
        let payload_len = ABORT_FIXED_LEN + message.len();
        let header = Header::control(Kind::Abort, seq, payload_len as u64);
        out[..HEADER_LEN].copy_from_slice(&header.encode());
        let p = &mut out[HEADER_LEN..];
        BigEndian::write_u32(&mut p[0..4], f.origin);
        p[4] = f.cause;
        BigEndian::write_u32(&mut p[5..9], f.peer);
        (p[9], p[10]) = (f.op_a, f.op_b);
        BigEndian::write_u64(&mut p[11..19], f.a);
        BigEndian::write_u64(&mut p[19..27], f.b);
        BigEndian::write_u16(&mut p[27..29], message.len() as u16);
        p[ABORT_FIXED_LEN..payload_len].copy_from_slice(message);
        HEADER_LEN + payload_len
    }

    /// Decodes an abort payload (the bytes after an abort header) from a peer of a world of
    /// `world` ranks. Never panics; ranks at or above `world`, a field the cause does not use
    /// that is not zero, and a length that disagrees are errors; text that is not UTF-8 is
    /// replaced and control characters escaped ([`escape_controls`]).
    pub fn decode(payload: &[u8], world: usize) -> Result<Abort, FrameError> {
        if payload.len() < ABORT_FIXED_LEN || payload.len() > MAX_ABORT_LEN {
            return Err(FrameError::BadAbort);
        }
        let f = AbortFields {
            origin: BigEndian::read_u32(&payload[0..4]),
            cause: payload[4],
            peer: BigEndian::read_u32(&payload[5..9]),
            op_a: payload[9],
            op_b: payload[10],
            a: BigEndian::read_u64(&payload[11..19]),
            b: BigEndian::read_u64(&payload[19..27]),
        };
        let message_len = BigEndian::read_u16(&payload[27..29]) as usize;
        if ABORT_FIXED_LEN + message_len != payload.len() {
            return Err(FrameError::BadAbort);
        }
        let origin = rank_of(f.origin, world)?;
        let peer = rank_of(f.peer, world)?;
        let raw = &payload[ABORT_FIXED_LEN..];
        let message = escape_controls(&String::from_utf8_lossy(raw));
        // What each cause uses, beyond origin and peer: (ops, a, b, message).
        let uses = match f.cause {
            CAUSE_IO | CAUSE_MALFORMED => (false, false, false, true),
            CAUSE_CLOSED => (false, false, false, false),
            CAUSE_TIMEOUT => (false, true, false, false),
            CAUSE_OUT_OF_STEP => (true, true, true, false),
            CAUSE_LENGTH => (false, true, true, false),
            _ => return Err(FrameError::BadAbort),
        };
        let unused_set = (!uses.0 && (f.op_a, f.op_b) != (0, 0))
            || (!uses.1 && f.a != 0)
            || (!uses.2 && f.b != 0)
            || (!uses.3 && !raw.is_empty());
        if unused_set {
            return Err(FrameError::BadAbort);
        }
        let op = |byte: u8| match Kind::from_byte(byte) {
            Some(Kind::Data(op)) => Ok(op),
            _ => Err(FrameError::BadAbort),
        };
        let cause = match f.cause {
            CAUSE_IO => CollectiveError::Io { peer, kind: std::io::ErrorKind::Other, message },
            CAUSE_CLOSED => CollectiveError::PeerClosed { peer },
            CAUSE_TIMEOUT => CollectiveError::Timeout { peer, waited: Duration::from_millis(f.a) },
            CAUSE_OUT_OF_STEP => CollectiveError::OutOfStep {
                peer,
                expected_op: op(f.op_a)?,
                expected_seq: f.a,
                got_op: op(f.op_b)?,
                got_seq: f.b,
            },
            CAUSE_LENGTH => CollectiveError::LengthMismatch { peer, expected: f.a, got: f.b },
            _ => CollectiveError::MalformedFrame { peer, reason: message },
        };
        Ok(Abort { origin, cause })
    }
}

/// What a waiting notice says: the sender has waited `waited` without progress, and the rank
/// it blames for that is `on` (its neighbour, or the rank that neighbour itself said it waits
/// on). A rank waiting on the sender learns that the sender is alive and whom to blame.
///
/// ```text
///  0          4                    12
///  +----------+--------------------+
///  | on: u32  | waited ms: u64     |
///  +----------+--------------------+
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// The rank the sender waits on.
    pub on: usize,
    /// How long the sender has waited without progress, in whole milliseconds.
    pub waited: Duration,
}

impl Waiting {
    /// Encodes a whole waiting frame of collective `seq`.
    pub fn encode(&self, seq: u64) -> [u8; HEADER_LEN + WAITING_LEN] {
        let mut out = [0u8; HEADER_LEN + WAITING_LEN];
        let header = Header::control(Kind::Waiting, seq, WAITING_LEN as u64);
        out[..HEADER_LEN].copy_from_slice(&header.encode());
        BigEndian::write_u32(&mut out[HEADER_LEN..HEADER_LEN + 4], rank_field(self.on));
        let ms = u64::try_from(self.waited.as_millis()).unwrap_or(u64::MAX);
        BigEndian::write_u64(&mut out[HEADER_LEN + 4..], ms);
        out
    }

    /// Decodes a waiting payload from a peer of a world of `world` ranks.
    pub fn decode(payload: &[u8], world: usize) -> Result<Waiting, FrameError> {
        let Ok(p) = <&[u8; WAITING_LEN]>::try_from(payload) else {
            return Err(FrameError::BadWaiting);
        };
        let on = rank_of(BigEndian::read_u32(&p[..4]), world)?;
        Ok(Waiting { on, waited: Duration::from_millis(BigEndian::read_u64(&p[4..])) })
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
                let h = Header { kind, dir: Dir::Right, block: 0, seq, total, len };
                assert_eq!(Header::decode(&h.encode()), Ok(h));
                if let Kind::Data(_) = kind {
                    for (dir, block) in [(Dir::Left, 0), (Dir::Right, 7), (Dir::Left, 65_537)] {
                        let h = h.carrying(dir, block);
                        assert_eq!(Header::decode(&h.encode()), Ok(h));
                    }
                }
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
        bad[3] = 2;
        assert_eq!(Header::decode(&bad), Err(FrameError::Reserved), "no third direction");
        let notice = Waiting { on: 1, waited: Duration::ZERO }.encode(3);
        for (at, byte) in [(3, 1), (7, 1), (4, 0x80)] {
            let mut bad: [u8; HEADER_LEN] = notice[..HEADER_LEN].try_into().unwrap();
            bad[at] = byte;
            assert_eq!(Header::decode(&bad), Err(FrameError::Reserved), "control byte {at}");
        }
        let mut bad = good;
        bad[24..32].copy_from_slice(&(MAX_LEN + 1).to_be_bytes());
        assert_eq!(Header::decode(&bad), Err(FrameError::TooLong(MAX_LEN + 1)));
        let mut bad = Header::control(Kind::Abort, 0, 0).encode();
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
        let mine = mine.carrying(Dir::Left, 3);
        for theirs in [mine.carrying(Dir::Right, 3), mine.carrying(Dir::Left, 2)] {
            let error = theirs.expect(&mine, 4).unwrap_err();
            assert!(matches!(error, CollectiveError::MalformedFrame { peer: 4, .. }), "{error}");
        }
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
            assert_eq!(Abort::decode(&out[HEADER_LEN..n], 8), Ok(abort));
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
        let back = Abort::decode(&out[HEADER_LEN..n], 8).unwrap();
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
        let back = Abort::decode(&out[HEADER_LEN..n], 8).expect("decodes");
        let longest = Duration::from_millis(u64::MAX);
        assert_eq!(back.cause, CollectiveError::Timeout { peer: 1, waited: longest });
    }

    #[test]
    fn malformed_abort_payloads_are_rejected() {
        assert_eq!(Abort::decode(&[], 4), Err(FrameError::BadAbort));
        assert_eq!(Abort::decode(&[0; ABORT_FIXED_LEN], 4), Err(FrameError::BadAbort));
        let mut p = [0u8; ABORT_FIXED_LEN + 2];
        p[4] = CAUSE_MALFORMED;
        p[28] = 5; // claims a 5-byte message, has 2
        assert_eq!(Abort::decode(&p, 4), Err(FrameError::BadAbort));
        p[28] = 2;
        assert!(Abort::decode(&p, 4).is_ok());
        p[4] = 99;
        assert_eq!(Abort::decode(&p, 4), Err(FrameError::BadAbort));
        // A peer-closed abort carries no message, no ops and no numbers.
        p[4] = CAUSE_CLOSED;
        assert_eq!(Abort::decode(&p, 4), Err(FrameError::BadAbort), "a message it does not use");
        let mut q = [0u8; ABORT_FIXED_LEN];
        q[4] = CAUSE_CLOSED;
        assert!(Abort::decode(&q, 4).is_ok());
        for at in [9, 10, 18, 26] {
            let mut bad = q;
            bad[at] = 1;
            assert_eq!(Abort::decode(&bad, 4), Err(FrameError::BadAbort), "byte {at}");
        }
    }

    #[test]
    fn abort_ranks_must_be_of_this_world() {
        let abort = Abort { origin: 3, cause: CollectiveError::PeerClosed { peer: 1 } };
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = abort.encode(0, &mut out);
        let payload = &out[HEADER_LEN..n];
        assert_eq!(Abort::decode(payload, 4), Ok(abort));
        assert_eq!(Abort::decode(payload, 3), Err(FrameError::BadRank(3)), "origin 3 of 3");
        let peer_out = Abort { origin: 0, cause: CollectiveError::PeerClosed { peer: 7 } };
        let n = peer_out.encode(0, &mut out);
        assert_eq!(Abort::decode(&out[HEADER_LEN..n], 4), Err(FrameError::BadRank(7)));
    }

    #[test]
    fn control_characters_in_a_cause_are_escaped() {
        let reason = "line one\nFORGED log line\u{1b}[31m red\0";
        let sent = CollectiveError::MalformedFrame { peer: 1, reason: "a\nb\u{1b}[2Jc\0d".into() };
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin: 0, cause: sent }.encode(0, &mut out);
        let back = Abort::decode(&out[HEADER_LEN..n], 2).unwrap().into_error().to_string();
        assert!(!back.chars().any(char::is_control), "{back:?}");
        assert!(back.ends_with(r"a\nb\u{1b}[2Jc\u{0}d"), "{back}");
        assert_eq!(escape_controls(reason), escape_controls(&escape_controls(reason)));
    }

    #[test]
    fn waiting_notices_round_trip_and_are_checked() {
        let w = Waiting { on: 5, waited: Duration::from_millis(2500) };
        let frame = w.encode(9);
        let header = Header::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(header, Header::control(Kind::Waiting, 9, 12));
        assert_eq!(Waiting::decode(&frame[HEADER_LEN..], 6), Ok(w));
        assert_eq!(Waiting::decode(&frame[HEADER_LEN..], 5), Err(FrameError::BadRank(5)));
        assert_eq!(
            Waiting::decode(&frame[HEADER_LEN..HEADER_LEN + 8], 6),
            Err(FrameError::BadWaiting)
        );
        let mut long = header;
        long.len = 13;
        assert_eq!(Header::decode(&long.encode()), Err(FrameError::TooLong(13)));
    }
}
