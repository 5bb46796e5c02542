//! Settled records reported to their sessions, the same for both runtimes: a failed write's
//! RAM copy dropped first, then each session told ([`Handler::on_durable`]), then the
//! connections that no longer wait for the device named for the runtime to resume.

use ringstore_service::Now;

use super::Outcome;
use crate::conn::Slab;
use crate::handler::Handler;

/// Reports `outcome` to the sessions of `conns`; a record of a held UDP request (slot
/// [`crate::datapath::kernel_udp::HELD_SLOT`]) goes to `udp` as (id, token, durable).
/// Returns the connections whose session holds no reply any more (their `awaits_device`
/// cleared), each once: the runtime sends what they now have and goes on per `after_send`.
pub(crate) fn settle_sessions<H: Handler>(
    handler: &H,
    conns: &mut Slab<H::Session>,
    outcome: &Outcome,
    now: Now,
    mut udp: impl FnMut(u32, u64, bool),
) -> Vec<(u32, u32)> {
    // A failed write's RAM copy goes before its session answers, so no read sees it.
    for (key, cas) in &outcome.forget {
        handler.forget_if_cas(key, *cas, now);
    }
    let mut touched: Vec<(u32, u32)> = Vec::new();
    for &(slot, generation, token, ok) in &outcome.settled {
        if slot == crate::datapath::kernel_udp::HELD_SLOT {
            udp(generation, token, ok);
            continue;
        }
        let Some(conn) = conns.get_mut(slot, generation) else {
            continue; // closed meanwhile: nobody waits for the reply
        };
        handler.on_durable(&mut conn.session, token, ok, &mut conn.out);
        if touched.last() != Some(&(slot, generation)) {
            touched.push((slot, generation));
        }
    }
    touched.sort_unstable();
    touched.dedup();
    touched.retain(|&(slot, generation)| {
        let Some(conn) = conns.get_mut(slot, generation) else {
            return false;
        };
        if !conn.awaits_device || handler.awaits_durable(&conn.session) {
            return false;
        }
        conn.awaits_device = false;
        true
    });
    touched
}
