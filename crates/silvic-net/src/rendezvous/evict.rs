//! The lobby's room, shared fairly, pure: where a connection comes from ([`Source`]) and, when
//! the lobby is full, which held handshake gives way ([`victim`]).
//!
//! Fair share: the victim comes from the source holding the most handshakes, the oldest of
//! them; among sources holding as many, the oldest handshake of any. Never one already welcomed
//! or accepted in the current turn. So a source holding fewer handshakes than another is never
//! the one to give way: a real rank, which holds one, outlasts any flood from other sources
//! for as long as there are fewer sources than the lobby has room. How far a handshake got
//! counts for nothing: a Hello is free to send, and the exchange's Challenge claims nothing.

use std::net::IpAddr;

/// Where a connection comes from, as the lobby shares its room: an IPv4 address, or the /64 of
/// an IPv6 one (one host, or one site, holds a whole /64, so its addresses count as one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// An IPv4 address (an IPv4-mapped IPv6 address included).
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6([u8; 8]),
}

impl Source {
    /// The source `ip` counts as.
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let octets = v6.octets();
                let mut prefix = [0u8; 8];
                prefix.copy_from_slice(&octets[..8]);
                Source::V6(prefix)
            }
        }
    }
}

/// What the eviction rule knows of one held handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Standing {
    /// Where it comes from.
    pub(super) source: Source,
    /// Proven and welcomed: the Welcome is being written.
    pub(super) welcomed: bool,
    /// It was accepted in the current turn, and not yet polled.
    pub(super) fresh: bool,
}

impl Standing {
    fn may_go(&self) -> bool {
        !self.welcomed && !self.fresh
    }
}

/// The handshake to drop for room, as an index into `held` (oldest first), if any may go:
/// the oldest that may go of the sources holding the most, where `counts` says how many each
/// source holds.
pub(super) fn victim(
    held: &[Standing],
    counts: impl IntoIterator<Item = (Source, usize)>,
) -> Option<usize> {
    let mut by_count: Vec<(usize, Source)> = counts.into_iter().map(|(s, c)| (c, s)).collect();
    by_count.sort_unstable_by_key(|&(count, _)| std::cmp::Reverse(count));
    let mut rest = by_count.as_slice();
    while let Some(&(most, _)) = rest.first() {
        let tied = rest.iter().take_while(|(count, _)| *count == most).count();
        let sources = &rest[..tied];
        let oldest = held
            .iter()
            .position(|h| h.may_go() && sources.iter().any(|(_, source)| *source == h.source));
        if oldest.is_some() {
            return oldest;
        }
        rest = &rest[tied..];
    }
    None
}

/// The oldest handshake from `source` that may go, as an index into `held` (oldest first).
pub(super) fn oldest_from(held: &[Standing], source: Source) -> Option<usize> {
    held.iter().position(|h| h.may_go() && h.source == source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ip(text: &str) -> Source {
        Source::of(text.parse().unwrap())
    }

    fn counts(held: &[Standing]) -> HashMap<Source, usize> {
        let mut counts = HashMap::new();
        for h in held {
            *counts.entry(h.source).or_insert(0) += 1;
        }
        counts
    }

    fn held(sources: &[&str]) -> Vec<Standing> {
        sources.iter().map(|s| Standing { source: ip(s), welcomed: false, fresh: false }).collect()
    }

    #[test]
    fn the_victim_is_the_oldest_of_the_source_holding_the_most() {
        // The real rank (10.0.0.2) is the oldest, and a flood from its peer's address holds
        // more: the flood's oldest goes.
        let h = held(&["10.0.0.2", "10.0.0.1", "10.0.0.1", "10.0.0.9", "10.0.0.1"]);
        assert_eq!(victim(&h, counts(&h)), Some(1));
        // Sources holding as many: the oldest of any of them.
        let h = held(&["10.0.0.2", "10.0.0.9", "10.0.0.1", "10.0.0.1", "10.0.0.9"]);
        assert_eq!(victim(&h, counts(&h)), Some(1));
        // One handshake each: the oldest.
        let h = held(&["10.0.0.3", "10.0.0.2", "10.0.0.1"]);
        assert_eq!(victim(&h, counts(&h)), Some(0));
        assert_eq!(victim(&[], HashMap::new()), None);
    }

    #[test]
    fn welcomed_and_fresh_handshakes_never_go_and_their_source_gives_way_from_the_rest() {
        let mut h = held(&["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"]);
        h[0].welcomed = true;
        h[1].fresh = true;
        // 10.0.0.1 holds the most: its oldest that may go.
        assert_eq!(victim(&h, counts(&h)), Some(3));
        h[3].fresh = true;
        // None of 10.0.0.1's may go: the next source's oldest.
        assert_eq!(victim(&h, counts(&h)), Some(2));
        for standing in &mut h {
            standing.fresh = true;
        }
        assert_eq!(victim(&h, counts(&h)), None);
        assert_eq!(oldest_from(&h, ip("10.0.0.1")), None);
        h[4].fresh = false;
        assert_eq!(oldest_from(&h, ip("10.0.0.2")), Some(4));
    }

    #[test]
    fn an_ipv6_64_counts_as_one_source_and_mapped_ipv4_as_ipv4() {
        assert_eq!(ip("2001:db8:1:2::7"), ip("2001:db8:1:2:ffff::1"));
        assert_ne!(ip("2001:db8:1:2::7"), ip("2001:db8:1:3::7"));
        assert_eq!(ip("::ffff:10.0.0.1"), ip("10.0.0.1"));
        assert_ne!(ip("10.0.0.1"), ip("10.0.0.2"));
        // A flood spread over one /64 holds the most, however many addresses it uses.
        let h = held(&["2001:db8::1", "fd00::5", "2001:db8::2", "2001:db8::3"]);
        assert_eq!(victim(&h, counts(&h)), Some(0));
    }
}
