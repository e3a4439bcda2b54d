//! The lobby's eviction rule, pure: when the lobby is full, which held handshake gives way.
//! Never one that is welcomed or was accepted this turn; among the rest, one from a source that
//! is not preferred first, then the one whose handshake got least far, then the oldest.

/// How far an incoming connection has got, in the order it is worth keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Progress {
    /// Nothing valid yet.
    Silent,
    /// A valid Hello, answered with a Challenge; the proof is awaited.
    Challenged,
    /// Proven and welcomed: the Welcome is being written.
    Welcomed,
}

/// What the eviction rule knows of one held handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Standing {
    /// It comes from a preferred address.
    pub(super) preferred: bool,
    /// How far its handshake got.
    pub(super) progress: Progress,
    /// It was accepted in the current turn, and not yet polled.
    pub(super) fresh: bool,
    /// Its accept order: lower is older.
    pub(super) id: u64,
}

/// The handshake to drop for room, as an index into `held`, if any may be dropped: see the
/// module doc of `accept` for the order. The newcomer is never among `held`.
pub(super) fn victim(held: impl IntoIterator<Item = Standing>) -> Option<usize> {
    held.into_iter()
        .enumerate()
        .filter(|(_, s)| s.progress != Progress::Welcomed && !s.fresh)
        .min_by_key(|(_, s)| (s.preferred, s.progress, s.id))
        .map(|(i, _)| i)
}
