//! The payloads of the two control frames: the abort ([`Abort`]) and the waiting notice
//! ([`Waiting`]), each checked field by field against the world it arrives in.

use std::time::Duration;

use byteorder::{BigEndian, ByteOrder};
use silvic_core::{CollectiveError, Op};

use super::{
    ABORT_FIXED_LEN, FrameError, HEADER_LEN, Header, Kind, MAX_ABORT_LEN, MAX_ABORT_MESSAGE,
    WAITING_LEN,
};

/// What an abort frame says: the rank where a failure began and the error it saw there.
///
/// The payload after an abort header, fixed binary fields then the message:
///
/// ```text
///  0          4       5          9      10     11             19             27      29
///  +----------+-------+----------+------+------+--------------+--------------+-------+---------+
///  | origin   | cause | peer     | op_a | op_b | a: u64       | b: u64       | n: u16| message |
///  +----------+-------+----------+------+------+--------------+--------------+-------+---------+
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
/// | 7 invalid argument (`peer` is `u32::MAX`: the origin's own call) | 0, 0 | 0, 0 | the reason |
/// | 8 cancelled by the origin's caller (`peer` is `u32::MAX`) | 0, 0 | 0, 0 | empty |
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
const CAUSE_ARGUMENT: u8 = 7;
const CAUSE_CANCELLED: u8 = 8;
/// The peer field of a cause that names no peer.
const NO_PEER: u32 = u32::MAX;

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
            peer: self.cause.peer().map_or(NO_PEER, rank_field),
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
            CollectiveError::InvalidArgument { reason } => {
                f.cause = CAUSE_ARGUMENT;
                reason.clone()
            }
            CollectiveError::Cancelled => {
                f.cause = CAUSE_CANCELLED;
                String::new()
            }
            // Errors with no cause code of their own (a fixed-point overflow or scale) travel as
            // their text: a malformed frame where they name a peer, else as the origin's own call
            // (the one cause that names no peer), so the decoder takes every abort we send.
            other => {
                f.cause = if other.peer().is_some() { CAUSE_MALFORMED } else { CAUSE_ARGUMENT };
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
        // Only an argument error and a cancel name no peer, and they never name one.
        let peer = match (f.cause, f.peer) {
            (CAUSE_ARGUMENT | CAUSE_CANCELLED, NO_PEER) => 0,
            (CAUSE_ARGUMENT | CAUSE_CANCELLED, _) => return Err(FrameError::BadAbort),
            _ => rank_of(f.peer, world)?,
        };
        let raw = &payload[ABORT_FIXED_LEN..];
        let message = escape_controls(&String::from_utf8_lossy(raw));
        // What each cause uses, beyond origin and peer: (ops, a, b, message).
        let uses = match f.cause {
            CAUSE_IO | CAUSE_MALFORMED | CAUSE_ARGUMENT => (false, false, false, true),
            CAUSE_CLOSED | CAUSE_CANCELLED => (false, false, false, false),
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
            CAUSE_ARGUMENT => CollectiveError::InvalidArgument { reason: message },
            CAUSE_CANCELLED => CollectiveError::Cancelled,
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
            CollectiveError::OutOfStep {
                peer: 1,
                expected_op: Op::ReduceScatterRecords,
                expected_seq: 2,
                got_op: Op::allreduce(silvic_core::Reduction::Min, silvic_core::Dtype::F32),
                got_seq: 2,
            },
            CollectiveError::InvalidArgument { reason: "root 9 is not a rank".into() },
            CollectiveError::Cancelled,
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

    /// An error with no cause code of its own still reaches every peer as an abort they take,
    /// carrying its text: one naming no peer (an overflow) as the origin's own call, one naming
    /// a peer (a scale mismatch) as a malformed frame from that peer.
    #[test]
    fn errors_without_a_cause_code_are_sent_as_aborts_the_peers_take() {
        let overflow =
            CollectiveError::Overflow { bin: Some(7), reason: "past the headroom".into() };
        let scale = CollectiveError::ScaleMismatch {
            peer: 2,
            expected: "2^-60".into(),
            got: "2^-59".into(),
        };
        for (cause, peer) in [(overflow, None), (scale, Some(2))] {
            let text = cause.to_string();
            let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
            let n = Abort::for_error(1, &cause).encode(3, &mut out);
            let abort = Abort::decode(&out[HEADER_LEN..n], 4).expect("a peer takes the abort");
            assert_eq!(abort.origin, 1);
            assert_eq!(abort.cause.peer(), peer);
            assert!(abort.cause.to_string().contains(&text), "{}", abort.cause);
        }
    }

    #[test]
    fn only_an_argument_error_names_no_peer() {
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let bad = CollectiveError::InvalidArgument { reason: "x".into() };
        let n = Abort { origin: 1, cause: bad }.encode(0, &mut out);
        let mut named = out;
        named[HEADER_LEN + 5..HEADER_LEN + 9].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(Abort::decode(&named[HEADER_LEN..n], 4), Err(FrameError::BadAbort));
        let mut unnamed = out;
        unnamed[HEADER_LEN + 4] = CAUSE_MALFORMED;
        assert_eq!(Abort::decode(&unnamed[HEADER_LEN..n], 4), Err(FrameError::BadRank(NO_PEER)));
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
