//! What unfinished large uploads may hold of the data device (issue 35): the chunks of an
//! upload hold device space from the moment they are staged until its manifest is staged or
//! it is abandoned, so a client that sends part of several bodies and stalls could hold a
//! region until the request timeout cuts it, and every other client's upload got 507.
//!
//! The rule, checked before each chunk is staged (a chunk over it is answered 507, as a
//! full device is): on a worker's region,
//! - one client's (peer address's) unfinished uploads together hold at most half the region,
//!   unless it has only one (a lone upload may fill the region, as before);
//! - all unfinished uploads together hold at most three quarters of it, unless there is
//!   only one;
//!
//! so the stalled uploads of one client leave half a region to the others, and those of many
//! clients leave a quarter to small writes and the uploads that finish.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Bytes and count of unfinished uploads of one client, or on one region.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    uploads: u32,
    bytes: u64,
}

impl Held {
    /// True when `n` more bytes stay within `limit` (or this is the only upload).
    fn admits(&self, n: u64, limit: u64) -> bool {
        self.uploads <= 1 || self.bytes.saturating_add(n) <= limit
    }
}

#[derive(Debug, Default)]
struct Ledger {
    /// By peer address (`None`: a connection whose peer is unknown).
    clients: HashMap<Option<IpAddr>, Held>,
    /// By worker (each worker stages into its own region of the device).
    regions: HashMap<usize, Held>,
}

/// The server's unfinished uploads, by client and by region.
#[derive(Debug, Default)]
pub struct UploadLedger {
    inner: Mutex<Ledger>,
}

impl UploadLedger {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an upload of `client` on worker `region`'s region; its share is given back
    /// when the returned [`UploadShare`] is dropped.
    pub fn open(self: &Arc<Self>, client: Option<IpAddr>, region: usize) -> UploadShare {
        let mut l = self.lock();
        l.clients.entry(client).or_default().uploads += 1;
        l.regions.entry(region).or_default().uploads += 1;
        UploadShare {
            ledger: Arc::clone(self),
            client,
            region,
            bytes: 0,
        }
    }
}

/// One unfinished upload's place in the [`UploadLedger`].
#[derive(Debug)]
pub struct UploadShare {
    ledger: Arc<UploadLedger>,
    client: Option<IpAddr>,
    region: usize,
    /// Chunk bytes this upload staged.
    bytes: u64,
}

impl UploadShare {
    /// Takes `n` more bytes for a chunk about to be staged on a region of `region_len`
    /// bytes: false (nothing taken) when the rule of this module refuses them.
    pub fn take(&mut self, n: u64, region_len: u64) -> bool {
        let mut l = self.ledger.lock();
        let client = l.clients.get(&self.client).copied().unwrap_or_default();
        let region = l.regions.get(&self.region).copied().unwrap_or_default();
        if !client.admits(n, region_len / 2) || !region.admits(n, region_len / 4 * 3) {
            return false;
        }
        l.clients.entry(self.client).or_default().bytes += n;
        l.regions.entry(self.region).or_default().bytes += n;
        self.bytes += n;
        true
    }
}

impl Drop for UploadShare {
    fn drop(&mut self) {
        let mut l = self.ledger.lock();
        let client = self.client;
        release(&mut l.clients, &client, self.bytes);
        release(&mut l.regions, &self.region, self.bytes);
    }
}

/// Gives back one upload of `bytes` under `key` (the entry goes when its last upload does,
/// so the map never outgrows the uploads in progress).
fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Held>, key: &K, bytes: u64) {
    if let Some(h) = map.get_mut(key) {
        h.uploads = h.uploads.saturating_sub(1);
        h.bytes = h.bytes.saturating_sub(bytes);
        if h.uploads == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: u64 = 1000;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_lone_upload_may_fill_the_region() {
        let ledger = Arc::new(UploadLedger::default());
        let mut one = ledger.open(ip(1), 0);
        assert!(one.take(REGION, REGION));
    }

    #[test]
    fn one_clients_uploads_hold_at_most_half_a_region() {
        let ledger = Arc::new(UploadLedger::default());
        let mut stalls: Vec<_> = (0..4).map(|_| ledger.open(ip(1), 0)).collect();
        assert!(stalls[0].take(300, REGION));
        assert!(stalls[1].take(200, REGION));
        assert!(!stalls[2].take(1, REGION), "over half the region");
        // Another client is not held back by the first one's share.
        let mut other = ledger.open(ip(2), 0);
        assert!(other.take(200, REGION));
        // All uploads together: at most three quarters (500 + 200 + 50 = 750).
        assert!(other.take(50, REGION));
        assert!(!other.take(1, REGION));
        // What a finished or abandoned upload held comes back.
        stalls.truncate(1);
        assert!(stalls[0].take(200, REGION));
        drop(stalls);
        drop(other);
        let l = ledger.lock();
        assert!(l.clients.is_empty() && l.regions.is_empty());
    }

    #[test]
    fn regions_are_counted_apart() {
        let ledger = Arc::new(UploadLedger::default());
        let mut a = ledger.open(ip(1), 0);
        let mut b = ledger.open(ip(2), 1);
        let mut c = ledger.open(ip(3), 1);
        assert!(a.take(REGION, REGION));
        assert!(b.take(700, REGION));
        assert!(!c.take(51, REGION));
        assert!(c.take(50, REGION));
    }
}
