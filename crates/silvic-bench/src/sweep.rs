//! One rank's sweep: every kind at every size, measured on a collective; rank 0 prints.

use silvic_core::{CollectiveError, TrainerCollective};

use crate::cli::Config;
use crate::report::{self, Printer, Row};
use crate::timing::{self, max_over_ranks};
use crate::workload::{Kind, Workload};

/// Runs the sweep of `config` on this rank's `collective` and returns the wrong elements seen
/// (summed over ranks, the same on every rank). Rank 0 prints `preamble`, the rows and the
/// progress line; `rss_per` labels the peak RSS column ("(MiB/rank)" or "(MiB/proc)").
pub(crate) fn sweep(
    collective: &mut dyn TrainerCollective,
    config: &Config,
    preamble: &str,
    rss_per: &str,
) -> Result<u64, CollectiveError> {
    let (rank, world) = (collective.rank(), collective.world_size());
    let mut printer = (rank == 0)
        .then(|| Printer::new(config.format, config.progress, config.cpu, config.link_mbit));
    let largest = config.sizes.iter().copied().max().unwrap_or(0);
    let mut wrong = 0;
    for &kind in &config.kinds {
        let mut workload = Workload::new(kind, rank, world, largest);
        // The same element count in the other collective's bytes.
        let theirs = |vs: Kind, bytes: usize| bytes / kind.element_bytes() * vs.element_bytes();
        let mut versus =
            config.vs.map(|vs| (vs, Workload::new(vs, rank, world, theirs(vs, largest))));
        if let Some(p) = &mut printer {
            p.start(preamble, kind, rss_per);
        }
        let mut rows = Vec::with_capacity(config.sizes.len());
        for (index, &bytes) in config.sizes.iter().enumerate() {
            if let Some(p) = &mut printer {
                p.progress(kind, bytes, index, config.sizes.len());
            }
            let (seconds, warmup, check) = (config.seconds_per_size, config.warmup, config.check);
            let (measured, ratio) = match &mut versus {
                None => {
                    let measured =
                        timing::measure(collective, &mut workload, bytes, seconds, warmup, check)?;
                    (vec![(kind, bytes, measured)], None)
                }
                Some((vs, other)) => {
                    let sizes = (bytes, theirs(*vs, bytes));
                    let pair = timing::measure_pair(
                        collective,
                        (&mut workload, other),
                        sizes,
                        seconds,
                        warmup,
                        check,
                    )?;
                    let both = vec![(kind, sizes.0, pair.first), (*vs, sizes.1, pair.second)];
                    (both, Some((*vs, pair.ratio)))
                }
            };
            // -1 where this rank cannot tell, so any rank that can wins the maximum.
            let rss = max_over_ranks(collective, report::peak_rss().map_or(-1.0, |b| b as f64))?;
            for (kind, bytes, measured) in measured {
                wrong += measured.wrong.unwrap_or(0);
                let peak_rss = (rss >= 0.0).then_some(rss as u64);
                let row = Row { kind, world, bytes, measured, peak_rss };
                if let Some(p) = &mut printer {
                    p.row(&row);
                }
                rows.push(row);
            }
            if let (Some(p), Some((vs, ratio))) = (&mut printer, ratio) {
                p.ratio(kind, vs, bytes / kind.element_bytes(), ratio);
            }
        }
        if let Some(p) = &mut printer {
            p.finish(&rows);
        }
    }
    Ok(wrong)
}
