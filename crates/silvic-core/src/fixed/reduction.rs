//! How a [`FixedHistogram`] is reduced over a ring, and how its ranks reach one error together.
//!
//! There are two ways, by the histogram's size:
//!
//! - **Checks in band** (fewer than [`SUMMARIZED_FROM_BINS`] bins): one `i128` allreduce of the
//!   bins and [`CHECKS`] elements after them (the scale's tag and its square, the rows, the
//!   refusals), whose sums show whether every rank held the same scale, refused nothing, and
//!   declared rows the scale holds. Only where they show otherwise are the ranks' [`Report`]s
//!   gathered, to name what differs. A small histogram's call costs mostly its hops, so it
//!   makes one call.
//! - **Summarized** (from [`SUMMARIZED_FROM_BINS`] bins): every rank's [`Report`] is gathered
//!   first, in one small call, and every rank [`judge`]s the same reports. They also bound
//!   every bin's total: where the totals, less the trailing zeros every rank's sums share, fit
//!   an `i64`, the bins go as `i64`s, the bytes of an f64 histogram rather than twice them.
//!
//! Invariants kept here:
//!
//! - **One way, one width.** Every rank takes the same way and sends the same width: the way
//!   follows the bins, which every rank holds alike (else the reduction fails), and the width
//!   follows the gathered reports, which every rank holds alike.
//! - **Exact in `i64`s.** Every rank's sums are multiples of `2^shift`, and the sum over the
//!   ranks of a bound on each rank's |sums|, shifted, is below `2^63`. That bounds every bin's total
//!   and every partial total, so the `i64` sum of the shifted sums is the total, shifted.
//! - **Every rank alike.** The checks, and the error they make, are functions of what every
//!   rank gathered, so every rank fails with the same error or none does; on any error the
//!   histogram is emptied.

use super::{FixedHistogram, FixedScale, describe_tag};
use crate::{CollectiveError, Numbers, Reduction, TrainerCollective};

/// From this many bins a reduction gathers every rank's report first: one more small call,
/// whose hops cost less than the bytes an `i64` histogram saves from here up on the links
/// `docs/fixed-point.md` measures.
pub(super) const SUMMARIZED_FROM_BINS: usize = 1 << 18;
/// The elements after the bins in a reduction with its checks in band: the scale's tag, its
/// square, the rows and whether an add was refused.
pub(super) const CHECKS: usize = 4;
/// The kinds of refusal a report carries: none, an overflow, an invalid argument.
const REFUSED_NONE: u8 = 0;
const REFUSED_OVERFLOW: u8 = 1;
const REFUSED_ARGUMENT: u8 = 2;

/// What one rank tells the others of its histogram: before a summarized reduction, or where
/// the checks in band failed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Report {
    /// The scale's [`FixedScale::tag`].
    pub(super) tag: i128,
    pub(super) bins: u64,
    /// The rows the rank's sums may hold.
    pub(super) rows: u128,
    /// Every bin's sum XOR its sign (`|sum|`, less one where negative), ORed: `2^n`, `n` its
    /// bit length, bounds every |sum|.
    pub(super) magnitudes: u128,
    /// Every bin's sum ORed, in two's complement: its trailing zeros are the zeros every sum
    /// ends in.
    pub(super) ored: u128,
    /// The first add the rank refused.
    pub(super) refused: Option<Refused>,
}

/// A refused add, as a report carries it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refused {
    /// An overflow ([`CollectiveError::Overflow`]), else an invalid argument.
    pub(super) overflow: bool,
    pub(super) bin: Option<usize>,
    pub(super) reason: String,
}

impl Report {
    /// The bytes: tag, bins, rows, magnitudes, ored, the refusal's kind and bin (`u64::MAX` for
    /// none), little-endian, then the reason.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let (kind, bin, reason) = match &self.refused {
            None => (REFUSED_NONE, None, ""),
            Some(r) => {
                let kind = if r.overflow { REFUSED_OVERFLOW } else { REFUSED_ARGUMENT };
                (kind, r.bin, r.reason.as_str())
            }
        };
        let mut bytes = Vec::with_capacity(81 + reason.len());
        bytes.extend_from_slice(&self.tag.to_le_bytes());
        bytes.extend_from_slice(&self.bins.to_le_bytes());
        for word in [self.rows, self.magnitudes, self.ored] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.push(kind);
        bytes.extend_from_slice(&bin.map_or(u64::MAX, |b| b as u64).to_le_bytes());
        bytes.extend_from_slice(reason.as_bytes());
        bytes
    }

    /// A report from its bytes; `None` where they are too short or name no kind of refusal.
    pub(super) fn read(bytes: &[u8]) -> Option<Report> {
        let (tag, rest) = bytes.split_first_chunk::<16>()?;
        let (bins, rest) = rest.split_first_chunk::<8>()?;
        let (rows, rest) = rest.split_first_chunk::<16>()?;
        let (magnitudes, rest) = rest.split_first_chunk::<16>()?;
        let (ored, rest) = rest.split_first_chunk::<16>()?;
        let (&kind, rest) = rest.split_first()?;
        let (bin, reason) = rest.split_first_chunk::<8>()?;
        let bin = Some(u64::from_le_bytes(*bin)).filter(|&b| b != u64::MAX);
        let refused = match kind {
            REFUSED_NONE => None,
            REFUSED_OVERFLOW | REFUSED_ARGUMENT => Some(Refused {
                overflow: kind == REFUSED_OVERFLOW,
                bin: bin.and_then(|b| usize::try_from(b).ok()),
                reason: String::from_utf8_lossy(reason).into_owned(),
            }),
            _ => return None,
        };
        Some(Report {
            tag: i128::from_le_bytes(*tag),
            bins: u64::from_le_bytes(*bins),
            rows: u128::from_le_bytes(*rows),
            magnitudes: u128::from_le_bytes(*magnitudes),
            ored: u128::from_le_bytes(*ored),
            refused,
        })
    }
}

/// What the reports decide where they find nothing wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Totals {
    /// The rows of every rank together: what the reduced sums may hold.
    pub(super) rows: u128,
    /// Where the bins go as `i64`s, the zeros every sum ends in, shifted off.
    pub(super) narrow: Option<u32>,
}

/// The same verdict on every rank that gathered `reports` (one a rank, `None` where it could
/// not be read), for a histogram at `scale`: a rank whose scale differs from `scale` (the first
/// one, so the rank it names depends on the rank judging; the kind of error does not), then
/// the first refusal, then bins that differ from rank 0's, then rows together past what the
/// scale holds. Where none is found, the totals.
pub(super) fn judge(
    reports: &[Option<Report>],
    scale: FixedScale,
) -> Result<Totals, CollectiveError> {
    let tag = scale.tag();
    if let Some(peer) = reports.iter().position(|r| r.as_ref().map(|r| r.tag) != Some(tag)) {
        let got =
            reports[peer].as_ref().map_or_else(|| "unreadable".into(), |r| describe_tag(r.tag));
        return Err(CollectiveError::ScaleMismatch { peer, expected: scale.to_string(), got });
    }
    let reports: Vec<&Report> = reports.iter().flatten().collect();
    let refusal =
        reports.iter().enumerate().find_map(|(rank, r)| r.refused.as_ref().map(|r| (rank, r)));
    if let Some((rank, refused)) = refusal {
        let reason = format!("on rank {rank}, {}", refused.reason);
        return Err(if refused.overflow {
            CollectiveError::Overflow { bin: refused.bin, reason }
        } else {
            CollectiveError::InvalidArgument { reason }
        });
    }
    let bins = reports.first().map_or(0, |r| r.bins);
    if let Some((rank, r)) = reports.iter().enumerate().find(|(_, r)| r.bins != bins) {
        return Err(CollectiveError::InvalidArgument {
            reason: format!(
                "rank {rank} reduces a fixed-point histogram of {} bins, rank 0 one of {bins}: \
                 every rank reduces the same bins",
                r.bins
            ),
        });
    }
    let rows = reports.iter().try_fold(0u128, |sum, r| sum.checked_add(r.rows));
    let most = 1u128 << scale.rows_exponent();
    let rows = rows.filter(|&rows| rows <= most).ok_or_else(|| {
        let rows = reports.iter().map(|r| r.rows).fold(0u128, u128::saturating_add);
        twice(rows, most, scale)
    })?;
    let shift = shared_zeros(reports.iter().fold(0u128, |ored, r| ored | r.ored));
    // Each rank's sums, shifted, are within 2^n >> shift, n the bit length of its magnitudes
    // (0 where 2^n < 2^shift: a multiple of 2^shift below it is 0); their total bounds every
    // bin's total.
    let bound = |r: &&Report| 1u128.checked_shl(128 - r.magnitudes.leading_zeros());
    let total = reports.iter().try_fold(0u128, |sum, r| sum.checked_add(bound(r)? >> shift));
    let narrow = total.is_some_and(|t| t <= i64::MAX as u128).then_some(shift);
    Ok(Totals { rows, narrow })
}

/// The error of ranks whose rows together pass what the scale was agreed for.
fn twice(rows: u128, most: u128, scale: FixedScale) -> CollectiveError {
    CollectiveError::Overflow {
        bin: None,
        reason: format!(
            "the ranks' histograms hold the values of {rows} rows, and the scale ({scale}) was \
             agreed for at most {most}: was a histogram reduced twice?"
        ),
    }
}

impl FixedHistogram {
    /// Replaces every bin's sum with its sum over every rank of `ring`, exactly, so the same
    /// bits for any world: one [`TrainerCollective::allreduce`] of `i128`s (the bins, then four
    /// checks) for a histogram of fewer than 262,144 bins; from 262,144, one small gather of each
    /// rank's report first, then the bins as `i64`s where the totals fit (less the trailing
    /// zeros every sum shares), else as `i128`s.
    ///
    /// Every rank calls it with the same number of bins. The checks fail every rank alike,
    /// with the same error: ranks holding another scale ([`CollectiveError::ScaleMismatch`],
    /// naming one); a value refused by an add on any rank since this histogram was made (the
    /// refusal, naming that rank: its sums would miss the value); and ranks whose rows together
    /// are more than the scale was agreed for, as when a histogram already reduced is reduced
    /// again ([`CollectiveError::Overflow`]). On any error the histogram is emptied (every sum
    /// zero): a partial or mixed reduction is never left to read. Once reduced, the histogram
    /// holds every rank's rows: values may still be added within that headroom.
    pub fn allreduce<C: TrainerCollective + ?Sized>(
        &mut self,
        ring: &mut C,
    ) -> Result<(), CollectiveError> {
        let reduced = if self.bins() < SUMMARIZED_FROM_BINS {
            self.reduce_checked_in_band(ring)
        } else {
            self.reduce_summarized(ring)
        };
        match reduced {
            Ok(rows) => {
                self.hold_rows(rows);
                Ok(())
            }
            Err(error) => {
                self.sums.fill(0);
                Err(error)
            }
        }
    }

    /// The reduction with its checks after the bins; the rows of every rank together.
    fn reduce_checked_in_band<C: TrainerCollective + ?Sized>(
        &mut self,
        ring: &mut C,
    ) -> Result<u128, CollectiveError> {
        let bins = self.bins();
        let tag = self.scale.tag();
        let rows = i128::try_from(self.rows).expect("at most 2^64 rows");
        let refused = i128::from(self.refused.is_some());
        self.sums.extend_from_slice(&[tag, tag * tag, rows, refused]);
        let reduced = ring.allreduce(Numbers::I128(&mut self.sums), Reduction::Sum);
        let mut checks = [0; CHECKS];
        checks.copy_from_slice(&self.sums[bins..]);
        self.sums.truncate(bins);
        reduced?;
        let [tags, squares, rows, refusals] = checks;
        let world = i128::try_from(ring.world_size()).expect("a world fits an i128");
        // Sums of n tags and of their squares equal n × t and n × t² only if every tag is t
        // (their variance about t is then zero).
        if tags != world * tag || squares != world * tag * tag || refusals != 0 {
            return Err(self.tell_every_rank(ring));
        }
        let most = 1i128 << self.scale.rows_exponent();
        if !(0..=most).contains(&rows) {
            return Err(twice(rows.unsigned_abs(), most.unsigned_abs(), self.scale));
        }
        Ok(rows.unsigned_abs())
    }

    /// The error every rank returns where the checks in band found another scale or a
    /// refused value: the reports are gathered, and each rank judges them alike.
    fn tell_every_rank<C: TrainerCollective + ?Sized>(&self, ring: &mut C) -> CollectiveError {
        let reports = match self.gather_reports(ring) {
            Ok(reports) => reports,
            Err(error) => return error,
        };
        match judge(&reports, self.scale) {
            Err(error) => error,
            // The sums said the scales differed or a value was refused, and the reports say
            // neither: only ranks that changed between the two calls could do that.
            Ok(_) => CollectiveError::InvalidArgument {
                reason: "the ranks' fixed-point histograms changed during their reduction".into(),
            },
        }
    }

    /// The reduction that gathers every rank's report first, and sends the bins as `i64`s
    /// where they fit; the rows of every rank together.
    fn reduce_summarized<C: TrainerCollective + ?Sized>(
        &mut self,
        ring: &mut C,
    ) -> Result<u128, CollectiveError> {
        let totals = judge(&self.gather_reports(ring)?, self.scale)?;
        match totals.narrow {
            Some(shift) => {
                let bins = self.bins();
                let words: &mut [i64] = bytemuck::cast_slice_mut(self.sums.as_mut_slice());
                narrow(words, bins, shift);
                ring.allreduce(Numbers::I64(&mut words[..bins]), Reduction::Sum)?;
                widen(words, bins, shift);
            }
            None => ring.allreduce(Numbers::I128(&mut self.sums), Reduction::Sum)?,
        }
        Ok(totals.rows)
    }

    /// Every rank's report, `None` for one that cannot be read.
    fn gather_reports<C: TrainerCollective + ?Sized>(
        &self,
        ring: &mut C,
    ) -> Result<Vec<Option<Report>>, CollectiveError> {
        let reports = ring.allgather_varlen(&self.report().to_bytes())?;
        Ok(reports.iter().map(|bytes| Report::read(bytes)).collect())
    }

    /// This rank's report.
    pub(super) fn report(&self) -> Report {
        let (magnitudes, ored) = magnitudes_and_ored(&self.sums);
        let refused = match &self.refused {
            Some(CollectiveError::Overflow { bin, reason }) => {
                Some(Refused { overflow: true, bin: *bin, reason: reason.clone() })
            }
            Some(CollectiveError::InvalidArgument { reason }) => {
                Some(Refused { overflow: false, bin: None, reason: reason.clone() })
            }
            _ => None,
        };
        Report {
            tag: self.scale.tag(),
            bins: self.bins() as u64,
            rows: self.rows,
            magnitudes,
            ored,
            refused,
        }
    }
}

/// The sums' [`Report::magnitudes`] and their OR: the one pass over a large histogram's sums
/// before its reduction, word by word (the high word's sign flips both), which the compiler
/// vectorizes.
///
/// It stops early where the sums it has read already need 64 bits or more between their
/// magnitudes' top bit and the zeros they share ([`needs_i128s`]): more sums only add
/// magnitude bits and take shared zeros away, so the verdict is `i128`s whatever the rest
/// holds, and a histogram of wide sums costs no pass.
pub(super) fn magnitudes_and_ored(sums: &[i128]) -> (u128, u128) {
    let high = usize::from(cfg!(target_endian = "little"));
    let join = |w: [u64; 2]| u128::from(w[high]) << 64 | u128::from(w[1 - high]);
    let [mut magnitudes, mut ored] = [[0u64; 2]; 2];
    for chunk in bytemuck::cast_slice::<i128, u64>(sums).chunks(2 * 1024) {
        for sum in chunk.chunks_exact(2) {
            let sign = (sum[high] as i64 >> 63) as u64;
            for w in 0..2 {
                magnitudes[w] |= sum[w] ^ sign;
                ored[w] |= sum[w];
            }
        }
        if needs_i128s(join(magnitudes), join(ored)) {
            break;
        }
    }
    (join(magnitudes), join(ored))
}

/// Whether sums of these magnitudes and OR, shifted by the zeros they share, may pass an
/// `i64`: their bound `2^n` (`n` the magnitudes' bit length) is at least `2^63` shifted.
pub(super) fn needs_i128s(magnitudes: u128, ored: u128) -> bool {
    (128 - magnitudes.leading_zeros()).saturating_sub(shared_zeros(ored)) >= 63
}

/// The trailing zeros of sums whose OR is `ored`: every sum is a multiple of `2^` them (none
/// where every sum is zero, which any shift keeps).
fn shared_zeros(ored: u128) -> u32 {
    if ored == 0 { 0 } else { ored.trailing_zeros() }
}

/// Writes each of the first `bins` `i128`s that `words` holds, shifted right by `shift`, as
/// the `i64` `words[i]`. In order, so each `i128` (`words[2i..2i + 2]`) is read before its
/// words are written.
pub(super) fn narrow(words: &mut [i64], bins: usize, shift: u32) {
    for i in 0..bins {
        let sum: i128 = bytemuck::cast([words[2 * i], words[2 * i + 1]]);
        words[i] = (sum >> shift) as i64;
    }
}

/// [`narrow`] undone: each `i64` `words[i]`, shifted left by `shift`, as the `i128`
/// `words[2i..2i + 2]`. From the last, so each `i64` is read before its words are written.
pub(super) fn widen(words: &mut [i64], bins: usize, shift: u32) {
    for i in (0..bins).rev() {
        let halves: [i64; 2] = bytemuck::cast(i128::from(words[i]) << shift);
        words[2 * i..2 * i + 2].copy_from_slice(&halves);
    }
}

#[cfg(test)]
#[path = "reduction_tests.rs"]
mod tests;
