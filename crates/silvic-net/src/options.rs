//! The path every allreduce of a ring takes: chosen per call from the network, or forced
//! ([`AllreducePath`]), by [`ConnectOptions`] or the `SILVIC_ALLREDUCE` variable; and the
//! channels a large call is split over ([`Channels`]), by [`ConnectOptions::channels`] or the
//! `SILVIC_CHANNELS` variable.
//!
//! Invariants: a value is read in one place ([`resolve`], [`resolve_channels`]), before any
//! socket is opened; a value that names no path (or no channel count) is an error naming the
//! variable (or the option) and the value; every rank of a ring takes the same settings, or
//! `connect` fails on every rank naming the ranks that differ (the probe's agreement,
//! `probe.rs`). A forced path or channel count changes no result bit: every path folds every
//! element in the same order, and every channel count too (`ring/layout.rs`).

use std::str::FromStr;

use crate::error::ConnectError;
use crate::ring::choice::{self, Path, Spread};

/// The variable `connect` and `from_env` read the allreduce path from.
pub const ALLREDUCE_VARIABLE: &str = "SILVIC_ALLREDUCE";

/// Which path a ring's allreduces take.
///
/// [`AllreducePath::Auto`], the default, lets each call choose from its size, the world and
/// the network the ranks measured at connect (docs/paths.md). The others force one
/// path on every call that path can carry; a call it cannot carry takes the automatic choice:
///
/// - [`AllreducePath::Ring`] carries every call.
/// - [`AllreducePath::Gather`] holds every rank's whole buffer, so it carries a call only within
///   the gather's memory bound (every buffer below 4 KiB, else `world × bytes` at most 1 MiB).
/// - [`AllreducePath::Bruck`] holds every rank's whole buffer too, and needs chord streams (to
///   `rank ± 2^k`): within that bound, on a ring that has them.
/// - [`AllreducePath::Index`] needs chord streams: every call, on a ring that has them.
///
/// Chord streams are formed from 8 ranks on (and a world of 2 or 3 needs none: every `rank ±
/// 2^k` is a neighbour), whatever the path; `connect` logs a warning when the forced path
/// needs chords the ring has not formed. The path is the same on every rank of a ring: see
/// [`ConnectOptions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AllreducePath {
    /// Chosen per call from the network (the default).
    #[default]
    Auto,
    /// The reduce-scatter and gather of slices round the ring.
    Ring,
    /// A two-way allgather of whole buffers round the ring, folded locally.
    Gather,
    /// Bruck's allgather of whole buffers over chord streams, folded locally.
    Bruck,
    /// Index-fold-gather over chord streams: each segment's raw contributions brought to one
    /// rank, folded there, and the folded segments gathered.
    Index,
}

impl AllreducePath {
    /// Every path, in the order of their codes in the agreement.
    pub const ALL: [AllreducePath; 5] = [
        AllreducePath::Auto,
        AllreducePath::Ring,
        AllreducePath::Gather,
        AllreducePath::Bruck,
        AllreducePath::Index,
    ];

    /// The path's name, as `SILVIC_ALLREDUCE` spells it: `auto`, `ring`, `gather`, `bruck` or
    /// `index` (a forced path's is the name its frames give it, `frame/`).
    pub fn name(self) -> &'static str {
        self.forced().map_or("auto", Path::name)
    }

    /// The path a call is forced onto, if any: the one conversion between the public names
    /// and the crate's [`Path`], which the options, the probe's agreement, the choice and the
    /// simulator all go through.
    pub(crate) fn forced(self) -> Option<Path> {
        match self {
            AllreducePath::Auto => None,
            AllreducePath::Ring => Some(Path::Ring),
            AllreducePath::Gather => Some(Path::Gather),
            AllreducePath::Bruck => Some(Path::Bruck),
            AllreducePath::Index => Some(Path::Index),
        }
    }

    /// The public name of `path`: the one whose [`AllreducePath::forced`] it is (what the
    /// simulator reports a call took).
    #[cfg(feature = "simulate")]
    pub(crate) fn of(path: Path) -> AllreducePath {
        let forcing = Self::ALL.into_iter().find(|p| p.forced() == Some(path));
        forcing.expect("every path has a public name")
    }

    /// The path's number in the probe's agreement: one more than its place in
    /// [`AllreducePath::ALL`], so that 0 is no rank's.
    pub(crate) fn code(self) -> u64 {
        1 + Self::ALL.iter().position(|&p| p == self).expect("every path is in ALL") as u64
    }

    /// The path numbered `code` ([`AllreducePath::code`]).
    pub(crate) fn from_code(code: u64) -> Option<AllreducePath> {
        let at = usize::try_from(code.checked_sub(1)?).ok()?;
        Self::ALL.get(at).copied()
    }

    /// Whether a call forced onto `self` needs chord streams.
    pub(crate) fn needs_chords(self) -> bool {
        matches!(self, AllreducePath::Bruck | AllreducePath::Index)
    }

    fn names() -> String {
        Self::ALL.map(AllreducePath::name).join(", ")
    }
}

impl std::fmt::Display for AllreducePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a path's [`AllreducePath::name`]; anything else is
/// [`ConnectError::InvalidArgument`] naming the value and the paths there are.
impl FromStr for AllreducePath {
    type Err = ConnectError;

    fn from_str(value: &str) -> Result<AllreducePath, ConnectError> {
        Self::ALL.into_iter().find(|p| p.name() == value).ok_or_else(|| {
            ConnectError::InvalidArgument(format!(
                "{value:?} is not an allreduce path (one of {})",
                Self::names()
            ))
        })
    }
}

/// What `TcpCollective::connect_with_options` and `TcpCollective::from_env_with_options` take
/// beyond `connect`'s and `from_env`'s arguments. The default is what `connect` and `from_env`
/// do.
///
/// The allreduce path comes from [`ConnectOptions::allreduce`] where it forces one, else from
/// `SILVIC_ALLREDUCE` (`auto`, `ring`, `gather`, `bruck` or `index`), else
/// [`AllreducePath::Auto`]. The variable is read and checked on every connect: a value that
/// names no path is [`ConnectError::Environment`] naming the variable and the value, even
/// where the options force a path. Every rank must end up with the same path: the ranks
/// agree on it once the ring forms, and if any differs, `connect` fails on every rank with
/// [`ConnectError::Disagreement`] naming the ranks that differ from the most common path.
///
/// ```
/// use silvic_net::{AllreducePath, ConnectOptions, TcpCollective};
/// use std::time::Duration;
///
/// let listener = TcpCollective::bind("127.0.0.1")?;
/// let addresses = vec![listener.address()];
/// let options = ConnectOptions::new().allreduce(AllreducePath::Ring);
/// let timeout = Duration::from_secs(5);
/// let ring =
///     TcpCollective::connect_with_options(listener, 0, &addresses, "job-1", timeout, &options)?;
/// # drop(ring);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    allreduce: AllreducePath,
    channels: Option<usize>,
}

impl ConnectOptions {
    /// The defaults: what `connect` and `from_env` do.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Forces every allreduce onto `path` where it can carry the call (see [`AllreducePath`]),
    /// whatever `SILVIC_ALLREDUCE` says; [`AllreducePath::Auto`] leaves the path to the
    /// variable.
    pub fn allreduce(mut self, path: AllreducePath) -> ConnectOptions {
        self.allreduce = path;
        self
    }

    /// Forces `n` channels (`n >= 1`) on every call the choice would split, whatever
    /// `SILVIC_CHANNELS` says: such a call cuts every segment of its buffer into `n` pieces and
    /// runs the ring path on each over its own streams (one to each ring neighbour per
    /// channel), each channel driven by its own thread, the calling thread driving the first.
    /// The default chooses the count from the cores and the network (docs/paths.md,
    /// "Channels"). Every result bit is the same for every count. `n` of 0, or above
    /// [`MAX_CHANNELS`], fails `connect` with [`ConnectError::InvalidArgument`].
    pub fn channels(mut self, n: usize) -> ConnectOptions {
        self.channels = Some(n);
        self
    }
}

/// The variable `connect` and `from_env` read the channel count from: `auto` (or unset) to
/// choose, or a count from 1 to [`MAX_CHANNELS`] to force.
pub const CHANNELS_VARIABLE: &str = "SILVIC_CHANNELS";

/// The most channels a ring may be given: each costs a thread and a stream to each ring
/// neighbour.
pub const MAX_CHANNELS: usize = 16;

/// How many channels the calls a ring splits run on: chosen at connect, or forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Channels {
    /// Chosen from the agreed cores and the network (`ring/choice.rs`).
    #[default]
    Auto,
    /// This many, from 1 to [`MAX_CHANNELS`].
    Forced(usize),
}

impl Channels {
    /// As `SILVIC_CHANNELS` spells it.
    pub(crate) fn name(self) -> String {
        match self {
            Channels::Auto => "auto".into(),
            Channels::Forced(n) => n.to_string(),
        }
    }

    /// The setting's number in the probe's agreement: 1 for auto, `1 + n` forced (0 is no
    /// rank's).
    pub(crate) fn code(self) -> u64 {
        match self {
            Channels::Auto => 1,
            Channels::Forced(n) => 1 + n as u64,
        }
    }

    /// The setting numbered `code` ([`Channels::code`]).
    pub(crate) fn from_code(code: u64) -> Option<Channels> {
        match usize::try_from(code).ok()? {
            1 => Some(Channels::Auto),
            n @ 2.. if n - 1 <= MAX_CHANNELS => Some(Channels::Forced(n - 1)),
            _ => None,
        }
    }

    /// The count `value` names (`auto`, or 1 to [`MAX_CHANNELS`]), or why it names none.
    fn parse(value: &str) -> Result<Channels, String> {
        if value == "auto" {
            return Ok(Channels::Auto);
        }
        match value.parse::<usize>() {
            Ok(n) if (1..=MAX_CHANNELS).contains(&n) => Ok(Channels::Forced(n)),
            _ => Err(format!("{value:?} is not a channel count (auto, or 1 to {MAX_CHANNELS})")),
        }
    }
}

/// What a rank was given to agree on with the others: its allreduce path and channel count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Settings {
    pub(crate) allreduce: AllreducePath,
    pub(crate) channels: Channels,
}

/// The channel count of a ring from `options` and the value of [`CHANNELS_VARIABLE`] (`None`:
/// unset; blank is unset too), as [`ConnectOptions::channels`] says.
pub(crate) fn resolve_channels(
    options: &ConnectOptions,
    variable: Option<&str>,
) -> Result<Channels, ConnectError> {
    let from_variable = match variable.map(str::trim).filter(|v| !v.is_empty()) {
        None => Channels::Auto,
        Some(value) => Channels::parse(value).map_err(|message| ConnectError::Environment {
            variable: CHANNELS_VARIABLE.into(),
            message,
        })?,
    };
    match options.channels {
        None => Ok(from_variable),
        Some(n) if (1..=MAX_CHANNELS).contains(&n) => Ok(Channels::Forced(n)),
        Some(n) => Err(ConnectError::InvalidArgument(format!(
            "{n} channels: a ring takes 1 to {MAX_CHANNELS}"
        ))),
    }
}

/// Both settings of a ring from `options` and the variables `var` reads (see [`resolve`] and
/// [`resolve_channels`]).
pub(crate) fn resolve_all(
    options: &ConnectOptions,
    var: impl Fn(&str) -> Result<Option<String>, ConnectError>,
) -> Result<Settings, ConnectError> {
    let allreduce = resolve(options, var(ALLREDUCE_VARIABLE)?.as_deref())?;
    let channels = resolve_channels(options, var(CHANNELS_VARIABLE)?.as_deref())?;
    Ok(Settings { allreduce, channels })
}

/// The path of a ring's allreduces from `options` and the value of [`ALLREDUCE_VARIABLE`]
/// (`None`: unset; blank is unset too), as [`ConnectOptions`] says.
pub(crate) fn resolve(
    options: &ConnectOptions,
    variable: Option<&str>,
) -> Result<AllreducePath, ConnectError> {
    // As every launch variable: blank is unset, and spaces around a value are not part of it.
    let from_variable = match variable.map(str::trim).filter(|v| !v.is_empty()) {
        None => AllreducePath::Auto,
        Some(value) => value.parse().map_err(|_| ConnectError::Environment {
            variable: ALLREDUCE_VARIABLE.into(),
            message: format!(
                "{value:?} is not an allreduce path (one of {})",
                AllreducePath::names()
            ),
        })?,
    };
    Ok(match options.allreduce {
        AllreducePath::Auto => from_variable,
        forced => forced,
    })
}

/// The path every rank of a ring takes, from every rank's (`paths[r]` is rank `r`'s): the one
/// path they all have, else [`ConnectError::Disagreement`] naming the ranks that differ from
/// the most common path (of two as common, the one the lowest rank has). The same on every rank
/// given the same list.
pub(crate) fn agreed(paths: &[AllreducePath]) -> Result<AllreducePath, ConnectError> {
    agreed_on(paths, ALLREDUCE_VARIABLE, |p| p.name().to_string())
}

/// The channel count every rank of a ring takes, from every rank's, as [`agreed`] finds the
/// path.
pub(crate) fn agreed_channels(counts: &[Channels]) -> Result<Channels, ConnectError> {
    agreed_on(counts, CHANNELS_VARIABLE, |c| c.name())
}

/// The one value of `setting` that every rank has, from every rank's (see [`agreed`]).
fn agreed_on<T: Copy + PartialEq + Default>(
    paths: &[T],
    setting: &str,
    name: impl Fn(T) -> String,
) -> Result<T, ConnectError> {
    let count = |path: T| paths.iter().filter(|&&p| p == path).count();
    let Some(&common) = paths.iter().max_by_key(|&&p| {
        let first = paths.iter().position(|&q| q == p).unwrap_or_default();
        (count(p), std::cmp::Reverse(first))
    }) else {
        return Ok(T::default());
    };
    let differ: Vec<usize> = (0..paths.len()).filter(|&r| paths[r] != common).collect();
    if differ.is_empty() {
        return Ok(common);
    }
    let ranks = |of: &[usize]| {
        let list: Vec<String> = of.iter().map(usize::to_string).collect();
        let noun = if of.len() == 1 { "rank" } else { "ranks" };
        format!("{noun} {}", list.join(", "))
    };
    let odd: Vec<String> =
        differ.iter().map(|&r| format!("{} on rank {r}", name(paths[r]))).collect();
    let same: Vec<usize> = (0..paths.len()).filter(|&r| paths[r] == common).collect();
    Err(ConnectError::Disagreement {
        setting: setting.into(),
        detail: format!("{}, against {} on {}", odd.join(", "), name(common), ranks(&same)),
        ranks: differ,
    })
}

/// The channel count a ring runs with, from what its ranks agreed: the user's option turned into
/// the choice's [`Spread`] here, beside the option, so the choice never imports the options.
impl Spread {
    /// The spread of a ring whose ranks agreed on `channels`, the fewest usable `cores` of any
    /// rank being `cores`: a forced count as it is; automatically one channel per usable core,
    /// at most [`MAX_AUTO_CHANNELS`](choice::MAX_AUTO_CHANNELS).
    pub(crate) fn of(channels: Channels, cores: u64) -> Spread {
        match channels {
            Channels::Forced(1) => Spread::One,
            Channels::Forced(n) => Spread::Forced(n),
            Channels::Auto => {
                let n = usize::try_from(cores).unwrap_or(usize::MAX).min(choice::MAX_AUTO_CHANNELS);
                if n > 1 { Spread::Auto(n) } else { Spread::One }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AllreducePath::{Auto, Bruck, Gather, Index, Ring};

    #[test]
    fn names_parse_back_and_codes_are_one_to_one() {
        for path in AllreducePath::ALL {
            assert_eq!(path.name().parse::<AllreducePath>(), Ok(path));
            assert_eq!(AllreducePath::from_code(path.code()), Some(path));
        }
        for path in crate::ring::choice::Path::ALL {
            assert_eq!(AllreducePath::of(path).forced(), Some(path));
            assert_eq!(AllreducePath::of(path).name(), path.name());
        }
        assert_eq!(AllreducePath::from_code(0), None);
        assert_eq!(AllreducePath::from_code(6), None);
        assert_eq!(AllreducePath::from_code(u64::MAX), None);
        let error = "Ring".parse::<AllreducePath>().unwrap_err();
        assert!(error.to_string().contains("\"Ring\" is not an allreduce path"), "{error}");
    }

    #[test]
    fn channel_counts_parse_force_over_the_variable_and_bad_ones_are_named() {
        let auto = ConnectOptions::new();
        let four = ConnectOptions::new().channels(4);
        assert_eq!(resolve_channels(&auto, None), Ok(Channels::Auto));
        assert_eq!(resolve_channels(&auto, Some(" ")), Ok(Channels::Auto));
        assert_eq!(resolve_channels(&auto, Some("auto")), Ok(Channels::Auto));
        assert_eq!(resolve_channels(&auto, Some(" 3\n")), Ok(Channels::Forced(3)));
        assert_eq!(resolve_channels(&auto, Some("16")), Ok(Channels::Forced(16)));
        assert_eq!(resolve_channels(&four, Some("2")), Ok(Channels::Forced(4)));
        assert_eq!(resolve_channels(&four, None), Ok(Channels::Forced(4)));
        for value in ["0", "17", "four", "-1", "Auto", "2 4"] {
            match resolve_channels(&auto, Some(value)) {
                Err(ConnectError::Environment { variable, message }) => {
                    assert_eq!(variable, "SILVIC_CHANNELS");
                    assert!(
                        message.contains(&format!("{value:?} is not a channel count")),
                        "{message}"
                    );
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
        for n in [0, MAX_CHANNELS + 1] {
            let options = ConnectOptions::new().channels(n);
            match resolve_channels(&options, Some("auto")) {
                Err(ConnectError::InvalidArgument(message)) => {
                    assert!(message.contains(&format!("{n} channels")), "{message}");
                }
                other => panic!("{n}: {other:?}"),
            }
        }
        for channels in [Channels::Auto, Channels::Forced(1), Channels::Forced(MAX_CHANNELS)] {
            assert_eq!(Channels::from_code(channels.code()), Some(channels));
        }
        for code in [0, MAX_CHANNELS as u64 + 2, u64::MAX] {
            assert_eq!(Channels::from_code(code), None, "{code}");
        }
        let counts = [Channels::Auto, Channels::Forced(4), Channels::Auto];
        match agreed_channels(&counts) {
            Err(ConnectError::Disagreement { setting, ranks, detail }) => {
                assert_eq!((setting.as_str(), ranks.as_slice()), ("SILVIC_CHANNELS", &[1][..]));
                assert!(detail.contains("4 on rank 1, against auto on ranks 0, 2"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(agreed_channels(&[Channels::Forced(2); 3]), Ok(Channels::Forced(2)));
    }

    #[test]
    fn options_force_a_path_over_the_variable_and_auto_defers_to_it() {
        let auto = ConnectOptions::new();
        let ring = ConnectOptions::new().allreduce(Ring);
        assert_eq!(resolve(&auto, None), Ok(Auto));
        assert_eq!(resolve(&auto, Some("index")), Ok(Index));
        assert_eq!(resolve(&ring, Some("gather")), Ok(Ring));
        assert_eq!(resolve(&ring, None), Ok(Ring));
        assert_eq!(resolve(&auto, Some(" bruck\n")), Ok(Bruck));
        assert_eq!(resolve(&auto, Some("  ")), Ok(Auto));
        for (options, value) in [(&auto, "rings"), (&ring, "Index"), (&auto, "ring,gather")] {
            match resolve(options, Some(value)) {
                Err(ConnectError::Environment { variable, message }) => {
                    assert_eq!(variable, "SILVIC_ALLREDUCE");
                    assert!(message.contains(&format!("{value:?}")), "{message}");
                    assert!(message.contains("auto, ring, gather, bruck, index"), "{message}");
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_agreement_names_the_ranks_that_differ_from_the_most_common_path() {
        assert_eq!(agreed(&[Bruck; 5]), Ok(Bruck));
        assert_eq!(agreed(&[]), Ok(Auto));
        let error = agreed(&[Auto, Auto, Index, Auto]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "SILVIC_ALLREDUCE differs between ranks: index on rank 2, against auto on ranks 0, 1, 3"
        );
        assert!(matches!(&error, ConnectError::Disagreement { ranks, .. } if ranks == &[2]));
        // Two as common: the lowest rank's path is the reference.
        let error = agreed(&[Gather, Ring, Ring, Gather]).unwrap_err();
        assert!(matches!(&error, ConnectError::Disagreement { ranks, .. } if ranks == &[1, 2]));
        let error = agreed(&[Ring, Gather, Bruck]).unwrap_err();
        assert!(matches!(&error, ConnectError::Disagreement { ranks, .. } if ranks == &[1, 2]));
    }

    /// The option as the choice's spread: a forced count as it is (one is no split), automatically
    /// one channel per usable core up to the most an automatic count opens.
    #[test]
    fn agreed_channels_become_the_choices_spread() {
        use crate::ring::choice::{MAX_AUTO_CHANNELS, Spread};
        assert_eq!(Spread::of(Channels::Auto, 1), Spread::One);
        assert_eq!(Spread::of(Channels::Auto, 6), Spread::Auto(6));
        assert_eq!(Spread::of(Channels::Auto, 96), Spread::Auto(MAX_AUTO_CHANNELS));
        assert_eq!(Spread::of(Channels::Forced(1), 96), Spread::One);
        assert_eq!(Spread::of(Channels::Forced(12), 2), Spread::Forced(12));
    }
}
