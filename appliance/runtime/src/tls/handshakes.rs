//! One worker's TLS handshakes in progress: their rustls state, charged against
//! `--conn-memory`, ordered by when each last made progress.
//!
//! Why the table owns the state (not the connection): when the memory bound is reached, the
//! handshake that has waited longest without progress is dropped *now* to make room for the
//! newcomer, and its memory goes back at once; its connection finds its entry gone at its
//! next bytes or at the worker's next tick ([`crate::handler::Handler::expired`]) and closes.
//! A count of handshakes would let a few hundred stalled peers lock every client out (issue
//! 35); a memory bound with eviction makes a stalled peer cost the attacker a connection that
//! is dropped as soon as anyone else needs the room.
//!
//! Invariants: every entry holds a [`Hold`] of exactly its charge
//! ([`HANDSHAKE_STATE_MAX`] + its received-bytes buffer); `order` has exactly one key per
//! entry, the entry's `(last progress, id)`. Only the owning worker touches the table (the
//! mutex is never contended; it makes the shared handler `Sync`).

use std::collections::BTreeSet;
use std::sync::Arc;

use ringstore_service::budget::{ConnMemory, Hold};
use ringstore_tls::{ServerTls, HANDSHAKE_STATE_MAX};

/// A connection's claim on its entry: the slot and the id the entry had when it was made
/// (a slot reused after an eviction carries another id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    slot: u32,
    id: u64,
}

struct Entry {
    tls: ServerTls,
    hold: Hold,
    id: u64,
    /// Monotonic ms of the last bytes that reached this handshake.
    progress_ms: u64,
}

/// What [`Handshakes::admit`] and [`Handshakes::charge`] could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoRoom;

pub(crate) struct Handshakes {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// `(progress_ms, id, slot)` of every entry: the first waited longest without progress.
    order: BTreeSet<(u64, u64, u32)>,
    next_id: u64,
    /// Handshakes dropped to make room since start (for the tests and the log).
    evicted: u64,
}

impl Handshakes {
    pub(crate) fn new() -> Handshakes {
        Handshakes {
            entries: Vec::new(),
            free: Vec::new(),
            order: BTreeSet::new(),
            next_id: 0,
            evicted: 0,
        }
    }

    /// Handshakes in progress.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Handshakes dropped for room since start.
    #[cfg(test)]
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Takes `tls` in as a handshake in progress at `now_ms`, charging
    /// [`HANDSHAKE_STATE_MAX`] to `budget`; without room, the handshakes that waited longest
    /// are dropped until it fits. [`NoRoom`] when even an empty table has none (the rest of
    /// `--conn-memory` is held by requests and replies).
    pub(crate) fn admit(
        &mut self,
        tls: ServerTls,
        budget: &Arc<ConnMemory>,
        now_ms: u64,
    ) -> Result<Ticket, NoRoom> {
        let mut hold = Hold::default();
        let cost = HANDSHAKE_STATE_MAX + tls.buffer_bytes();
        while !hold.set(budget, cost) {
            if !self.evict_oldest(None) {
                return Err(NoRoom);
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        let entry = Entry {
            tls,
            hold,
            id,
            progress_ms: now_ms,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.entries[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.entries.push(Some(entry));
                crate::sys::u32_of(self.entries.len() - 1)
            }
        };
        self.order.insert((now_ms, id, slot));
        Ok(Ticket { slot, id })
    }

    /// The rustls state of `ticket`'s handshake; `None` once it was dropped for room.
    pub(crate) fn get(&mut self, ticket: Ticket) -> Option<&mut ServerTls> {
        self.entry(ticket).map(|e| &mut e.tls)
    }

    /// Whether `ticket`'s handshake is still held (not dropped for room).
    pub(crate) fn holds(&self, ticket: Ticket) -> bool {
        self.entries
            .get(ticket.slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.id == ticket.id)
    }

    fn entry(&mut self, ticket: Ticket) -> Option<&mut Entry> {
        self.entries
            .get_mut(ticket.slot as usize)?
            .as_mut()
            .filter(|e| e.id == ticket.id)
    }

    /// Bytes reached `ticket`'s handshake at `now_ms`: it moves to the back of the order and
    /// its charge follows its buffer, dropping others that waited longer if the growth needs
    /// their room. [`NoRoom`] when it cannot (the caller closes it; its entry is gone).
    pub(crate) fn charge(
        &mut self,
        ticket: Ticket,
        budget: &Arc<ConnMemory>,
        now_ms: u64,
    ) -> Result<(), NoRoom> {
        let Some(entry) = self.entry(ticket) else {
            return Err(NoRoom);
        };
        let old = (entry.progress_ms, entry.id, ticket.slot);
        entry.progress_ms = now_ms;
        let cost = HANDSHAKE_STATE_MAX + entry.tls.buffer_bytes();
        self.order.remove(&old);
        self.order.insert((now_ms, ticket.id, ticket.slot));
        loop {
            let Some(entry) = self.entry(ticket) else {
                return Err(NoRoom);
            };
            if entry.hold.set(budget, cost) {
                return Ok(());
            }
            if !self.evict_oldest(Some(ticket)) {
                self.remove(ticket);
                return Err(NoRoom);
            }
        }
    }

    /// The handshake ended (done, failed or its connection closed): its state leaves the
    /// table (returned, for a finished one to carry on with) and its charge goes back.
    pub(crate) fn remove(&mut self, ticket: Ticket) -> Option<ServerTls> {
        let slot = self.entries.get_mut(ticket.slot as usize)?;
        if slot.as_ref().is_none_or(|e| e.id != ticket.id) {
            return None;
        }
        let entry = slot.take()?;
        self.order
            .remove(&(entry.progress_ms, entry.id, ticket.slot));
        self.free.push(ticket.slot);
        Some(entry.tls)
    }

    /// Drops the handshake that has waited longest without progress, other than `keep`;
    /// false when there is none.
    fn evict_oldest(&mut self, keep: Option<Ticket>) -> bool {
        let victim = self
            .order
            .iter()
            .find(|&&(_, id, slot)| keep != Some(Ticket { slot, id }))
            .copied();
        let Some((_, id, slot)) = victim else {
            return false;
        };
        self.remove(Ticket { slot, id });
        self.evicted += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> ServerTls {
        ServerTls::new(crate::tls::tests::server_config()).expect("a server connection")
    }

    #[test]
    fn the_longest_waiting_handshake_makes_room_for_a_newcomer() {
        let budget = ConnMemory::new(3 * HANDSHAKE_STATE_MAX);
        let mut table = Handshakes::new();
        let a = table.admit(tls(), &budget, 0).expect("room");
        let b = table.admit(tls(), &budget, 1).expect("room");
        let c = table.admit(tls(), &budget, 2).expect("room");
        // `a` makes progress: `b` has now waited longest.
        table.charge(a, &budget, 3).expect("same size");
        let d = table.admit(tls(), &budget, 4).expect("room made");
        assert!(!table.holds(b), "the longest waiting one was dropped");
        assert!(table.holds(a) && table.holds(c) && table.holds(d));
        assert!(table.get(b).is_none());
        assert_eq!(table.len(), 3);
        assert_eq!(table.evicted(), 1);
        assert_eq!(budget.used(), 3 * HANDSHAKE_STATE_MAX);
        for t in [a, c, d] {
            assert!(table.remove(t).is_some());
        }
        assert_eq!(budget.used(), 0, "every charge went back");
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_slot_reused_after_an_eviction_is_not_the_old_ticket() {
        let budget = ConnMemory::new(HANDSHAKE_STATE_MAX);
        let mut table = Handshakes::new();
        let a = table.admit(tls(), &budget, 0).expect("room");
        let b = table.admit(tls(), &budget, 1).expect("a dropped");
        assert_eq!(a.slot, b.slot, "the freed slot is reused");
        assert!(!table.holds(a) && table.holds(b));
        assert!(table.remove(a).is_none(), "a stale ticket removes nothing");
        assert!(table.holds(b));
    }

    #[test]
    fn no_room_without_anything_to_drop() {
        let budget = ConnMemory::new(HANDSHAKE_STATE_MAX - 1);
        let mut table = Handshakes::new();
        assert_eq!(table.admit(tls(), &budget, 0), Err(NoRoom));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn many_handshakes_stay_within_the_budget() {
        let budget = ConnMemory::new(100 * HANDSHAKE_STATE_MAX);
        let mut table = Handshakes::new();
        let mut tickets = Vec::new();
        for now in 0..10_000u64 {
            tickets.push(table.admit(tls(), &budget, now).expect("room by eviction"));
            assert!(budget.used() <= 100 * HANDSHAKE_STATE_MAX);
        }
        assert_eq!(table.len(), 100);
        let held: Vec<_> = tickets.iter().filter(|&&t| table.holds(t)).collect();
        assert_eq!(held.len(), 100);
        assert!(
            held.iter().all(|t| t.id > 9_900),
            "the newest hundred are the ones kept"
        );
    }
}
