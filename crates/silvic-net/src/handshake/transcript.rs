//! The transcript of one handshake: what both sides agreed on, and the MACs over it.
//!
//! Invariants: a MAC covers the label (so one side's proof never verifies as the other's), the
//! version, the world, both ranks, the channel, the roster digest and both nonces; it is checked in constant
//! time; the token keys it and is never shown (not even by `Debug`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{MAC_LEN, NONCE_LEN};

/// What both sides of one connection agreed on, and the job token that keys the MACs.
#[derive(Clone)]
pub(super) struct Transcript<'t> {
    pub(super) token: &'t [u8],
    /// The connector's version: this side's own, except for a blind acceptor, which proves
    /// against the Hello's claims before it judges them.
    pub(super) version: u16,
    pub(super) roster: [u8; MAC_LEN],
    pub(super) world: u32,
    pub(super) connector: u32,
    pub(super) acceptor: u32,
    /// The channel the stream carries.
    pub(super) channel: u16,
    pub(super) nonce_c: [u8; NONCE_LEN],
    pub(super) nonce_a: [u8; NONCE_LEN],
}

impl Transcript<'_> {
    fn keyed(&self, label: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.token)
            .expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(&self.version.to_be_bytes());
        mac.update(&self.world.to_be_bytes());
        mac.update(&self.connector.to_be_bytes());
        mac.update(&self.acceptor.to_be_bytes());
        mac.update(&self.channel.to_be_bytes());
        mac.update(&self.roster);
        mac.update(&self.nonce_c);
        mac.update(&self.nonce_a);
        mac
    }

    pub(super) fn prove(&self, label: &[u8]) -> [u8; MAC_LEN] {
        self.keyed(label).finalize().into_bytes().into()
    }

    pub(super) fn verify(&self, label: &[u8], mac: &[u8; MAC_LEN]) -> bool {
        self.keyed(label).verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for Transcript<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcript")
            .field("world", &self.world)
            .field("connector", &self.connector)
            .field("acceptor", &self.acceptor)
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}
