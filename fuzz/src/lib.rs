//! The oracles behind silvic-net's fuzz targets, shared by the libFuzzer targets in
//! `fuzz_targets/` and by `tests/corpus.rs`, which replays every checked-in corpus file as a
//! plain test on the stable toolchain.
//!
//! Each function takes the fuzzer's bytes and panics (an assertion) when silvic-net breaks a
//! property; bytes that say nothing are returned from early. What is checked:
//!
//! - [`frame_decode`]: `Header::decode` never panics, accepts exactly the canonical encodings
//!   (decode then encode gives the same 32 bytes), bounds every length it accepts, and
//!   `Header::expect` accepts exactly the header it was asked to expect, and refuses a frame of
//!   the same call on another path as one of ranks that disagree on the path.
//! - [`abort_decode`]: `Abort::decode` never panics, accepts only ranks of the world, lets no
//!   control character into an error, and anything it accepts re-encodes into a frame that
//!   decodes to the same abort (byte for byte when its text is clean); every error a rank can
//!   send survives the trip through an abort frame (up to the documented losses: the I/O kind,
//!   milliseconds, the cut, escaped control characters); a waiting notice is its own encoding.
//! - [`handshake_decode`]: `Message::decode` never panics and round-trips byte for byte.
//! - [`handshake_roles`]: `Acceptor` (of one rank, or of a set of ranks as a ring with chords
//!   has) and `Connector` driven by a mix of honest, replayed, mutated, wrong-token and
//!   arbitrary messages never panic, succeed at most once, challenge only a rank they admit,
//!   succeed only on the MAC a token holder computes for this very exchange, and do succeed when
//!   every message is honest.
//! - [`ring_frames`]: one collective through the real ring algorithms and the ring link's frame
//!   reader, in memory, in a world of two or three (either path, leftward frames included),
//!   whose neighbours' streams are the fuzzer's bytes, returns with a typed error or with what
//!   the frames said (see `ring.rs`).
//! - [`exchange_rank0`]: rank 0's side of `from_env`'s address exchange, on loopback, against
//!   strangers sending the fuzzer's bytes (some after a valid Hello) while honest ranks join:
//!   no panic, and the strangers neither break the exchange nor claim a rank (see
//!   `exchange.rs`).

mod exchange;
mod ring;
mod roles;

pub use exchange::exchange_rank0;
pub use ring::ring_frames;
pub use roles::handshake_roles;

use libfuzzer_sys::arbitrary::{Result as ArbitraryResult, Unstructured};
use silvic_net::frame::{
    ABORT, ABORT_FIXED_LEN, Abort, FRAME_MAGIC, FrameError, HEADER_LEN, Header, Kind,
    MAX_ABORT_LEN, MAX_ABORT_MESSAGE, MAX_LEN, WAITING, WAITING_LEN, Waiting, escape_controls,
};
use silvic_net::handshake::{MAGIC, MESSAGE_LEN, Message, MessageError, MessageKind};
use silvic_net::{CollectiveError, Op, RejectReason};
use std::time::Duration;

/// `Header::decode` on 32 bytes, and `Header::expect` between two decoded headers.
pub fn frame_decode(data: &[u8]) {
    let Some((first, rest)) = data.split_first_chunk::<HEADER_LEN>() else { return };
    let decoded = Header::decode(first);
    match decoded {
        Ok(h) => {
            assert_eq!(&h.encode(), first, "an accepted header is its own encoding");
            let max = max_len(h.kind);
            assert!(h.len <= max, "accepted a length of {} above {max}", h.len);
        }
        Err(FrameError::BadMagic(m)) => assert!(m == first[..2] && m != FRAME_MAGIC),
        Err(FrameError::UnknownKind(k)) => {
            assert!(k == first[2] && !matches!(k, 1..=4 | ABORT | WAITING))
        }
        Err(FrameError::Reserved) => {
            // A reserved bit of the way byte (only the direction, bit 0, and the path, bits 4
            // and 5, are in use), or a direction, path or block on a control frame.
            let control = matches!(first[2], ABORT | WAITING);
            assert!(first[3] & !0x31 != 0 || (control && first[3..8] != [0; 5]), "{first:?}");
        }
        Err(FrameError::TooLong(len)) => {
            let max = match first[2] {
                ABORT => MAX_ABORT_LEN as u64,
                WAITING => WAITING_LEN as u64,
                _ => MAX_LEN,
            };
            assert!(len > max && len.to_be_bytes() == first[24..]);
        }
        Err(e) => panic!("a header cannot fail with {e:?}"),
    }
    let Some((second, rest)) = rest.split_first_chunk::<HEADER_LEN>() else { return };
    let (Ok(got), Ok(expected)) = (decoded, Header::decode(second)) else { return };
    let peer = rest.first().copied().unwrap_or(0) as usize;
    let verdict = got.expect(&expected, peer);
    let both_data = matches!((got.kind, expected.kind), (Kind::Data(_), Kind::Data(_)));
    assert_eq!(verdict.is_ok(), both_data && got == expected, "expect({got:?}, {expected:?})");
    if let Err(e) = &verdict {
        assert_eq!(e.peer(), Some(peer), "the error names the peer");
    }
    // Ranks on different paths for one call: a malformed frame that says so.
    let same_call = (got.kind, got.seq, got.total) == (expected.kind, expected.seq, expected.total);
    if both_data && same_call && got.path != expected.path {
        let Err(CollectiveError::MalformedFrame { reason, .. }) = &verdict else {
            panic!("a frame of another path must be malformed: {verdict:?}");
        };
        assert!(reason.contains("disagree on the allreduce path"), "{reason}");
    }
}

/// The longest payload a header of `kind` may claim.
fn max_len(kind: Kind) -> u64 {
    match kind {
        Kind::Abort => MAX_ABORT_LEN as u64,
        Kind::Waiting => WAITING_LEN as u64,
        Kind::Data(_) => MAX_LEN,
    }
}

/// The world size the abort oracles decode for: every rank a u32 field can name but one.
const WIDE_WORLD: usize = u32::MAX as usize;

/// Abort payloads: arbitrary bytes decoded (first byte even), or an arbitrary error encoded and
/// decoded again (first byte odd). Waiting notices ride along: bytes decoded as one must name a
/// rank of the world and re-encode to themselves.
pub fn abort_decode(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        abort_bytes(rest);
    } else {
        let _ = abort_error(&mut Unstructured::new(rest));
    }
}

fn encode_abort(abort: &Abort, seq: u64) -> Vec<u8> {
    let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
    let n = abort.encode(seq, &mut frame);
    frame[..n].to_vec()
}

/// Splits an encoded abort frame and decodes both halves, checking the header says what it is.
fn decode_abort_frame(frame: &[u8], seq: u64) -> Result<Abort, FrameError> {
    let head: &[u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("a frame has a header");
    let header = Header::decode(head).expect("an encoded abort header decodes");
    assert_eq!(header.kind, Kind::Abort);
    assert_eq!((header.seq, header.total), (seq, 0));
    assert_eq!(header.len as usize, frame.len() - HEADER_LEN, "the header gives the length");
    Abort::decode(&frame[HEADER_LEN..], WIDE_WORLD)
}

fn abort_bytes(payload: &[u8]) {
    if let Ok(w) = Waiting::decode(payload, 4) {
        assert!(w.on < 4, "a notice names a rank outside the world");
        assert_eq!(w.encode(3)[HEADER_LEN..], *payload, "a notice is its own encoding");
    }
    let Ok(abort) = Abort::decode(payload, WIDE_WORLD) else { return };
    assert!(payload.len() <= MAX_ABORT_LEN);
    // In a world of four, the same payload is accepted only if it names ranks of that world (an
    // argument error names no peer, only its origin).
    let small = Abort::decode(payload, 4);
    let in_small = abort.origin < 4 && abort.cause.peer().is_none_or(|p| p < 4);
    assert_eq!(small.is_ok(), in_small, "ranks checked against the world: {abort:?}");
    let text = &abort.cause.to_string();
    assert!(!text.chars().any(char::is_control), "a control character reached the error: {text:?}");
    let frame = encode_abort(&abort, 7);
    let again = decode_abort_frame(&frame, 7).expect("a decoded abort re-encodes validly");
    // The message is text: bytes that are not UTF-8 are replaced and control characters
    // escaped, which may lengthen it past the cut. Otherwise the abort comes back as it was,
    // byte for byte.
    let clean = std::str::from_utf8(&payload[ABORT_FIXED_LEN..])
        .is_ok_and(|m| !m.chars().any(char::is_control));
    if clean {
        assert_eq!(again, abort);
        assert_eq!(frame[HEADER_LEN..], *payload, "an accepted payload is its own encoding");
    }
    // Either way, one trip reaches the canonical form.
    assert_eq!(encode_abort(&again, 7), frame, "encode(decode(encode(a))) == encode(a)");
}

fn rank(u: &mut Unstructured<'_>) -> ArbitraryResult<usize> {
    // A world has at most u32::MAX ranks, so a rank is below u32::MAX.
    Ok(u.int_in_range(0..=u32::MAX - 1)? as usize)
}

fn op(u: &mut Unstructured<'_>) -> ArbitraryResult<Op> {
    Ok(*u.choose(&[
        Op::AllreduceSumF64,
        Op::AllreduceSumI64,
        Op::AllreduceMaxF64,
        Op::AllgatherBytes,
    ])?)
}

/// Any error a rank can hold, with ranks that fit a world.
fn any_error(u: &mut Unstructured<'_>, depth: u8) -> ArbitraryResult<CollectiveError> {
    let peer = rank(u)?;
    Ok(match u.int_in_range(0..=7)? {
        0 => CollectiveError::Io {
            peer,
            kind: *u.choose(&[std::io::ErrorKind::ConnectionReset, std::io::ErrorKind::Other])?,
            message: u.arbitrary()?,
        },
        1 => CollectiveError::PeerClosed { peer },
        2 => CollectiveError::Timeout { peer, waited: u.arbitrary()? },
        3 => CollectiveError::OutOfStep {
            peer,
            expected_op: op(u)?,
            expected_seq: u.arbitrary()?,
            got_op: op(u)?,
            got_seq: u.arbitrary()?,
        },
        4 => {
            CollectiveError::LengthMismatch { peer, expected: u.arbitrary()?, got: u.arbitrary()? }
        }
        6 => CollectiveError::InvalidArgument { reason: u.arbitrary()? },
        5 if depth < 2 => {
            CollectiveError::Aborted { origin: rank(u)?, cause: Box::new(any_error(u, depth + 1)?) }
        }
        _ => CollectiveError::MalformedFrame { peer, reason: u.arbitrary()? },
    })
}

/// What the receiving rank must see for `cause`: the same error, less what the frame documents
/// it drops (the I/O kind, sub-millisecond time, text past [`MAX_ABORT_MESSAGE`] bytes), with
/// control characters escaped.
fn as_received(cause: &CollectiveError) -> CollectiveError {
    let cut = |text: &str| {
        let mut n = text.len().min(MAX_ABORT_MESSAGE);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        escape_controls(&text[..n])
    };
    match cause.clone() {
        CollectiveError::Io { peer, message, .. } => {
            CollectiveError::Io { peer, kind: std::io::ErrorKind::Other, message: cut(&message) }
        }
        CollectiveError::Timeout { peer, waited } => {
            let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            CollectiveError::Timeout { peer, waited: Duration::from_millis(ms) }
        }
        CollectiveError::MalformedFrame { peer, reason } => {
            CollectiveError::MalformedFrame { peer, reason: cut(&reason) }
        }
        other @ (CollectiveError::PeerClosed { .. }
        | CollectiveError::OutOfStep { .. }
        | CollectiveError::LengthMismatch { .. }) => other,
        CollectiveError::InvalidArgument { reason } => {
            CollectiveError::InvalidArgument { reason: cut(&reason) }
        }
        // A relayed abort inside an abort: sent as text, naming the rank it names.
        other => CollectiveError::MalformedFrame {
            peer: other.peer().expect("an abort names a rank"),
            reason: cut(&other.to_string()),
        },
    }
}

fn abort_error(u: &mut Unstructured<'_>) -> ArbitraryResult<()> {
    let me = rank(u)?;
    let error = any_error(u, 0)?;
    let seq: u64 = u.arbitrary()?;
    let abort = Abort::for_error(me, &error);
    let frame = encode_abort(&abort, seq);
    let received = decode_abort_frame(&frame, seq)
        .unwrap_or_else(|e| panic!("the abort for {error:?} does not decode: {e}"));
    assert_eq!(received.origin, abort.origin);
    assert_eq!(received.cause, as_received(&abort.cause), "sent {error:?}");
    match &error {
        CollectiveError::Aborted { origin, .. } => assert_eq!(received.origin, *origin),
        _ => assert_eq!(received.origin, me),
    }
    Ok(())
}

/// `Message::decode` on 72 bytes.
pub fn handshake_decode(data: &[u8]) {
    let Some(bytes) = data.first_chunk::<MESSAGE_LEN>() else { return };
    match Message::decode(bytes) {
        Ok(m) => {
            assert_eq!(&m.encode(), bytes, "an accepted message is its own encoding");
            assert!(!matches!(m.kind, MessageKind::Reject(_)) || bytes[10] == 5);
        }
        Err(MessageError::BadMagic) => assert_ne!(bytes[..8], MAGIC),
        Err(MessageError::Malformed) => assert_eq!(bytes[..8], MAGIC),
    }
}

/// Reject reasons, for seeds.
pub const REASONS: [RejectReason; 5] = [
    RejectReason::TokenMismatch,
    RejectReason::VersionMismatch,
    RejectReason::WorldMismatch,
    RejectReason::WrongRank,
    RejectReason::AddressMismatch,
];
