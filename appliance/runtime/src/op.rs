//! io_uring `user_data`: which operation a completion belongs to, encoded and decoded in
//! one place.
//!
//! Layout: the low 8 bits are the op tag; connection ops carry the slot in the high 32 bits
//! and the low 24 bits of the slot's generation in between; data-device ops carry their op
//! id (which never repeats) in the 56 bits above the tag.

/// The bits of a connection slot's generation that `user_data` carries (24, between the tag
/// and the slot); a slab compares generations under this mask.
pub(crate) const GEN_MASK: u32 = 0x00FF_FFFF;

/// One io_uring operation of a worker, as its completion names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// A receive on connection `slot`.
    Recv { slot: u32, generation: u32 },
    /// A send on connection `slot`.
    Send { slot: u32, generation: u32 },
    /// The periodic timer.
    Tick,
    /// The eventfd of the worker's inbox (connections handed over by the acceptor).
    Inbox,
    /// An accept on listener `index`.
    Accept { index: u32 },
    /// A cancel of an accept (at stop).
    Cancel,
    /// A batch write to the data device.
    DiskWrite { id: u64 },
    /// An fdatasync of the data device.
    DiskFlush { id: u64 },
    /// Background compaction: the zeroed header write that frees a segment (linked to the next).
    DiskErase { id: u64 },
    /// Background compaction: the fdatasync after the erase write.
    DiskEraseFlush { id: u64 },
    /// A no-op that wakes the loop at once while compaction has work that needs no completion.
    Wake,
    /// Background compaction: a read of the victim segment into the compactor's buffer.
    DiskCompactRead { id: u64 },
    /// The kernel-UDP backend's multishot recvmsg.
    UdpRecv,
    /// A kernel-UDP reply datagram in send slot `slot`.
    UdpSend { slot: u32 },
    /// Readiness (multishot poll) of the worker's AF_XDP socket `index`.
    XdpReady { index: u32 },
}

const RECV: u64 = 1;
const SEND: u64 = 2;
const TICK: u64 = 3;
const INBOX: u64 = 4;
const ACCEPT: u64 = 5;
const CANCEL: u64 = 6;
const DISK_WRITE: u64 = 7;
const DISK_FLUSH: u64 = 8;
const DISK_ERASE: u64 = 9;
const DISK_ERASE_FLUSH: u64 = 10;
const WAKE: u64 = 11;
const DISK_COMPACT_READ: u64 = 12;
const UDP_RECV: u64 = 13;
const UDP_SEND: u64 = 14;
const XDP_READY: u64 = 15;

impl Op {
    /// The `user_data` of this op.
    pub(crate) fn encode(self) -> u64 {
        let conn = |slot: u32, generation: u32, tag: u64| {
            (u64::from(slot) << 32) | (u64::from(generation & GEN_MASK) << 8) | tag
        };
        let device = |id: u64, tag: u64| {
            debug_assert!(id < 1 << 56, "op ids fit in 56 bits");
            (id << 8) | tag
        };
        match self {
            Op::Recv { slot, generation } => conn(slot, generation, RECV),
            Op::Send { slot, generation } => conn(slot, generation, SEND),
            Op::Tick => TICK,
            Op::Inbox => INBOX,
            Op::Accept { index } => conn(index, 0, ACCEPT),
            Op::Cancel => CANCEL,
            Op::DiskWrite { id } => device(id, DISK_WRITE),
            Op::DiskFlush { id } => device(id, DISK_FLUSH),
            Op::DiskErase { id } => device(id, DISK_ERASE),
            Op::DiskEraseFlush { id } => device(id, DISK_ERASE_FLUSH),
            Op::Wake => WAKE,
            Op::DiskCompactRead { id } => device(id, DISK_COMPACT_READ),
            Op::UdpRecv => UDP_RECV,
            Op::UdpSend { slot } => conn(slot, 0, UDP_SEND),
            Op::XdpReady { index } => conn(index, 0, XDP_READY),
        }
    }

    /// The op a completion's `user_data` names (`None`: not one of ours).
    pub(crate) fn decode(data: u64) -> Option<Op> {
        let slot = (data >> 32) as u32;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "keeps bits 8..40; the mask then keeps the generation's 24 of them"
        )]
        let generation = ((data >> 8) as u32) & GEN_MASK;
        let id = data >> 8;
        Some(match data & 0xff {
            RECV => Op::Recv { slot, generation },
            SEND => Op::Send { slot, generation },
            TICK => Op::Tick,
            INBOX => Op::Inbox,
            ACCEPT => Op::Accept { index: slot },
            CANCEL => Op::Cancel,
            DISK_WRITE => Op::DiskWrite { id },
            DISK_FLUSH => Op::DiskFlush { id },
            DISK_ERASE => Op::DiskErase { id },
            DISK_ERASE_FLUSH => Op::DiskEraseFlush { id },
            WAKE => Op::Wake,
            DISK_COMPACT_READ => Op::DiskCompactRead { id },
            UDP_RECV => Op::UdpRecv,
            UDP_SEND => Op::UdpSend { slot },
            XDP_READY => Op::XdpReady { index: slot },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_round_trips() {
        let ops = [
            Op::Recv {
                slot: u32::MAX,
                generation: GEN_MASK,
            },
            Op::Send {
                slot: 7,
                generation: 3,
            },
            Op::Tick,
            Op::Inbox,
            Op::Accept { index: 2 },
            Op::Cancel,
            Op::DiskWrite { id: (1 << 56) - 1 },
            Op::DiskFlush { id: 1 },
            Op::DiskErase { id: 2 },
            Op::DiskEraseFlush { id: 3 },
            Op::Wake,
            Op::DiskCompactRead { id: 4 },
            Op::UdpRecv,
            Op::UdpSend { slot: u32::MAX },
            Op::XdpReady { index: 3 },
        ];
        for op in ops {
            assert_eq!(Op::decode(op.encode()), Some(op), "{op:?}");
        }
        assert_eq!(Op::decode(0), None);
        assert_eq!(Op::decode(0xff), None);
    }
}
