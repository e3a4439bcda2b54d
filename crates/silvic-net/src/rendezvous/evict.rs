//! The lobby's room, shared fairly, pure: where a connection comes from ([`Source`]) and, when
//! the lobby is full, which held handshake gives way ([`victim`]).
//!
//! Fair share: the victim comes from the source holding the most handshakes; among sources
//! holding as many, any of them. Within those, one that has sent no Hello goes before one that
//! has, then the oldest. Never one already welcomed or accepted in the current turn. So a
//! source holding fewer handshakes than another is never the one to give way: a real rank,
//! which holds one, outlasts any flood from other sources for as long as there are fewer
//! sources than the lobby has room. How far a handshake got weighs only among the sources that
//! must give way (a port scanner behind a rank's own address goes first), never against a
//! source holding fewer: a Hello is free to send, and the exchange challenges every one.

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
    /// It sent a Hello that was answered with a Challenge.
    pub(super) spoke: bool,
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
/// of the sources holding the most (`counts` says how many each holds), the oldest that may go
/// and has sent no Hello, else the oldest that may go.
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
        let pick = first_to_go(held, |h| sources.iter().any(|(_, source)| *source == h.source));
        if pick.is_some() {
            return pick;
        }
        rest = &rest[tied..];
    }
    None
}

/// The handshake from `source` to drop for room, as an index into `held` (oldest first): the
/// oldest that may go and has sent no Hello, else the oldest that may go.
pub(super) fn oldest_from(held: &[Standing], source: Source) -> Option<usize> {
    first_to_go(held, |h| h.source == source)
}

/// Among the handshakes `among` selects, the oldest silent one that may go, else the oldest.
fn first_to_go(held: &[Standing], among: impl Fn(&Standing) -> bool) -> Option<usize> {
    let silent = held.iter().position(|h| h.may_go() && !h.spoke && among(h));
    silent.or_else(|| held.iter().position(|h| h.may_go() && among(h)))
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
        let standing =
            |s: &&str| Standing { source: ip(s), spoke: true, welcomed: false, fresh: false };
        sources.iter().map(standing).collect()
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
    fn a_silent_handshake_goes_before_one_that_spoke_among_those_that_must_give_way_only() {
        // A port scanner behind the rank's own address: its silent connection goes first.
        let mut h = held(&["10.0.0.1", "10.0.0.1", "10.0.0.2"]);
        h[1].spoke = false;
        assert_eq!(victim(&h, counts(&h)), Some(1));
        assert_eq!(oldest_from(&h, ip("10.0.0.1")), Some(1));
        // A silent source holding fewer never goes for a source holding more that spoke.
        let mut h = held(&["10.0.0.2", "10.0.0.1", "10.0.0.1"]);
        h[0].spoke = false;
        assert_eq!(victim(&h, counts(&h)), Some(1));
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
