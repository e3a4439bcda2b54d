//! What a lobby refused, told in summaries rather than a line per connection: a flood of
//! strangers costs the log one line per gap, the gaps doubling from [`GAPS`]'s first to its
//! last, so a log nobody reads (a child's stderr pipe that a launcher drains only at exit) fills
//! slowly enough that no write blocks the rendezvous before its deadline.
//!
//! Pure: the time is handed in, so the summaries are tested without a clock.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::wait::Backoff;

/// The gaps between summary lines: the first line as soon as there is something to tell, the
/// next after a second, then doubling up to a minute.
pub(crate) const GAPS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Why a connection left the lobby without joining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// Dropped to make room (or refused at once, when nothing could go).
    Room,
    /// No handshake within the deadline.
    Late,
    /// Its handshake failed: refused, garbage, closed or broken.
    Failed,
    /// Accepting it failed (out of descriptors, most likely).
    AcceptFailed,
}

/// Counts of rejections since the last summary, and the last one's story.
#[derive(Debug)]
pub(crate) struct Tally {
    room: usize,
    late: usize,
    failed: usize,
    accept_failed: usize,
    /// The last failed handshake since the last summary, and where it came from.
    last_failure: Option<(SocketAddr, String)>,
    /// The last failed accept's error since the last summary.
    last_accept_error: Option<String>,
    /// When the first rejection since the last summary came.
    since: Option<Instant>,
    /// No summary before this.
    quiet_until: Option<Instant>,
    gaps: Backoff,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            room: 0,
            late: 0,
            failed: 0,
            accept_failed: 0,
            last_failure: None,
            last_accept_error: None,
            since: None,
            quiet_until: None,
            gaps: Backoff::new(GAPS),
        }
    }
}

impl Tally {
    /// Counts one rejection at `now`.
    pub(crate) fn count(&mut self, now: Instant, rejection: Rejection) {
        self.since.get_or_insert(now);
        match rejection {
            Rejection::Room => self.room += 1,
            Rejection::Late => self.late += 1,
            Rejection::Failed => self.failed += 1,
            Rejection::AcceptFailed => self.accept_failed += 1,
        }
    }

    /// Counts a failed handshake from `remote`, for `reason`.
    pub(crate) fn failed(&mut self, now: Instant, remote: SocketAddr, reason: &str) {
        self.count(now, Rejection::Failed);
        self.last_failure = Some((remote, reason.to_string()));
    }

    /// Counts a failed accept.
    pub(crate) fn accept_failed(&mut self, now: Instant, error: &std::io::Error) {
        self.count(now, Rejection::AcceptFailed);
        self.last_accept_error = Some(error.to_string());
    }

    /// When the next summary is due, if there is anything to tell.
    pub(crate) fn due(&self) -> Option<Instant> {
        let since = self.since?;
        Some(self.quiet_until.map_or(since, |quiet| quiet.max(since)))
    }

    /// The summary to log at `now`, if one is due; the counts start again after it.
    pub(crate) fn summary(&mut self, now: Instant) -> Option<String> {
        let since = self.since?;
        if self.quiet_until.is_some_and(|quiet| now < quiet) {
            return None;
        }
        let total = self.room + self.late + self.failed + self.accept_failed;
        let mut parts = Vec::new();
        if self.room > 0 {
            parts.push(format!("{} dropped for room", self.room));
        }
        if self.late > 0 {
            let deadline = super::conn::HANDSHAKE_DEADLINE;
            parts.push(format!("{} with no handshake within {deadline:?}", self.late));
        }
        if self.failed > 0 {
            let mut part = format!("{} whose handshake failed", self.failed);
            if let Some((remote, reason)) = &self.last_failure {
                part += &format!(" (the last from {remote}: {reason})");
            }
            parts.push(part);
        }
        if self.accept_failed > 0 {
            let mut part = format!("{} accepts failed", self.accept_failed);
            if let Some(error) = &self.last_accept_error {
                part += &format!(" (the last: {error})");
            }
            parts.push(part);
        }
        let over = now.saturating_duration_since(since);
        let line = format!(
            "rejected {total} connection{} in {over:.1?}: {}",
            if total == 1 { "" } else { "s" },
            parts.join(", ")
        );
        let gap = self.gaps.next_gap();
        *self = Tally { quiet_until: Some(now + gap), gaps: self.gaps.clone(), ..Tally::default() };
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_rejection_is_told_at_once_and_a_flood_in_lines_at_doubling_gaps() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut tally = Tally::default();
        assert_eq!((tally.due(), tally.summary(t0)), (None, None), "nothing to tell");
        let remote: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        tally.failed(t0, remote, "refused: job token mismatch");
        assert_eq!(tally.due(), Some(t0));
        assert_eq!(
            tally.summary(t0).unwrap(),
            "rejected 1 connection in 0.0ns: 1 whose handshake failed (the last from \
             10.0.0.9:4000: refused: job token mismatch)"
        );
        // A flood: 10,000 strangers a second for a minute, counted without a line each.
        let mut lines = Vec::new();
        for ms in 1..=60_000 {
            for _ in 0..10 {
                tally.count(at(ms), Rejection::Room);
            }
            if ms % 7 == 0 {
                tally.count(at(ms), Rejection::Late);
            }
            if let Some(line) = tally.summary(at(ms)) {
                lines.push((ms, line));
            }
        }
        let times: Vec<u64> = lines.iter().map(|(ms, _)| *ms).collect();
        // Gaps of 1, 2, 4, 8, 16 and 32 s after the first line.
        assert_eq!(times, [1000, 3000, 7000, 15_000, 31_000]);
        assert_eq!(
            lines[0].1,
            "rejected 10142 connections in 999.0ms: 10000 dropped for room, 142 with no \
             handshake within 5s"
        );
        assert_eq!(tally.due(), Some(at(63_000)), "the rest is told after a gap of 32 s");
        tally.accept_failed(at(70_000), &std::io::Error::other("Too many open files"));
        let line = tally.summary(at(70_000)).unwrap();
        assert!(line.ends_with("1 accepts failed (the last: Too many open files)"), "{line}");
        assert_eq!(tally.due(), None);
    }
}
