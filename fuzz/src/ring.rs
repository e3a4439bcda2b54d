//! The ring_frames oracle: one collective of rank 0 in a world of two, through the real ring
//! algorithms and the ring link's frame reader, in memory (`silvic_net::fuzzing::replay`): rank
//! 1's stream is the fuzzer's bytes, then its close.
//!
//! Checked: the collective returns (no panic; a slice cannot hang), with an error naming a rank
//! of the world (rank 1 unless rank 1's abort names another) or with a result that is what the
//! frames said: for the small path, every element is the fold of this rank's value and the one
//! rank 1 sent; for an allgather, rank 1's block is its payload.

use silvic_core::fold;
use silvic_net::CollectiveError;
use silvic_net::frame::{HEADER_LEN, WAITING, WAITING_LEN};
use silvic_net::fuzzing::{Buffer, replay};

/// What rank 0 is asked to do, and with what.
#[derive(Debug, Clone, Copy)]
enum Call {
    SumF64,
    SumI64,
    MaxF64,
    Gather,
}

/// What a call returned, in a form the oracle compares.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Reduced(Vec<u64>),
    Gathered(Vec<Vec<u8>>),
}

fn run(call: Call, len: usize, stream: &[u8]) -> Result<Outcome, CollectiveError> {
    let bits = |v: Vec<f64>| Outcome::Reduced(v.into_iter().map(f64::to_bits).collect());
    match call {
        Call::SumF64 | Call::MaxF64 => {
            let mut buf = local_f64(len);
            let b = if matches!(call, Call::SumF64) {
                Buffer::SumF64(&mut buf)
            } else {
                Buffer::MaxF64(&mut buf)
            };
            replay(b, stream)?;
            Ok(bits(buf))
        }
        Call::SumI64 => {
            let mut buf: Vec<i64> = (0..len as i64).map(|i| i * 3 - 7).collect();
            replay(Buffer::SumI64(&mut buf), stream)?;
            Ok(Outcome::Reduced(buf.into_iter().map(|x| x as u64).collect()))
        }
        Call::Gather => {
            let blocks = replay(Buffer::Gather(&local_bytes(len)), stream)?;
            Ok(Outcome::Gathered(blocks.expect("a gather returns blocks")))
        }
    }
}

fn local_f64(len: usize) -> Vec<f64> {
    (0..len).map(|i| i as f64 * 0.5 - 3.0).collect()
}

fn local_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}

/// Checks a successful small-path result against the first frame rank 1 sent.
fn check_result(call: Call, len: usize, sent: &[u8], outcome: &Outcome) {
    // Waiting notices before the data frame are control frames, not data.
    let mut sent = sent;
    while sent.len() >= HEADER_LEN && sent[2] == WAITING {
        sent = &sent[(HEADER_LEN + WAITING_LEN).min(sent.len())..];
    }
    let payload = &sent[HEADER_LEN.min(sent.len())..];
    let word = |i: usize| u64::from_le_bytes(payload[8 * i..8 * i + 8].try_into().unwrap());
    match (call, outcome) {
        (Call::Gather, Outcome::Gathered(blocks)) => {
            assert_eq!(blocks.len(), 2);
            assert_eq!(blocks[0], local_bytes(len), "this rank's own block changed");
            assert_eq!(blocks[1], payload[..len], "rank 1's block is not what it sent");
        }
        (Call::SumF64 | Call::MaxF64, Outcome::Reduced(got)) if len * 8 < 4096 => {
            let f = if matches!(call, Call::SumF64) { fold::sum_f64 } else { fold::max_f64 };
            for (i, (&g, mine)) in got.iter().zip(local_f64(len)).enumerate() {
                let theirs = f64::from_bits(word(i));
                let either = [f(mine, theirs).to_bits(), f(theirs, mine).to_bits()];
                assert!(
                    either.contains(&g),
                    "element {i}: {mine} and {theirs} gave {}",
                    f64::from_bits(g)
                );
            }
        }
        (Call::SumI64, Outcome::Reduced(got)) if len * 8 < 4096 => {
            for (i, &g) in got.iter().enumerate() {
                let mine = i as i64 * 3 - 7;
                assert_eq!(g as i64, mine.wrapping_add(word(i) as i64), "element {i}");
            }
        }
        _ => {}
    }
}

/// One input: `[call, len_lo, len_hi, stream...]`.
pub fn ring_frames(data: &[u8]) {
    let [selector, lo, hi, stream @ ..] = data else { return };
    let call = [Call::SumF64, Call::SumI64, Call::MaxF64, Call::Gather][*selector as usize % 4];
    // Up to 700 elements: both sides of the 4 KiB small-path cut.
    let len = u16::from_le_bytes([*lo, *hi]) as usize % 701;
    match run(call, len, stream) {
        Ok(outcome) => check_result(call, len, stream, &outcome),
        Err(e) => {
            // An abort from rank 1 names ranks it says, checked against the world of two;
            // anything else names rank 1.
            match &e {
                CollectiveError::Aborted { origin, .. } => {
                    assert!(*origin < 2, "an abort from outside the world: {e}");
                    assert!(e.peer().is_some_and(|p| p < 2), "{e}");
                }
                _ => assert_eq!(e.peer(), Some(1), "the error names rank 1: {e}"),
            }
            assert!(!e.to_string().chars().any(char::is_control), "{e:?}");
        }
    }
}
