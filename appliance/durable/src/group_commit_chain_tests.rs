//! Tests of chained group commit ([`super::GroupCommit::chain_flushes`]): a batch waits for a
//! free flush lane unless full, its flush follows it, and a chained write is covered by its
//! own flush only; plus a seeded model of the kernel (writes and flushes completing and
//! reported in any order the chain allows, with faults) that checks no token is ever acked
//! before a flush that started after its write completed.
use super::*;
use crate::sim::SimRng;

fn chained(limits: Limits) -> GroupCommit<u32> {
    let mut g = GroupCommit::new(limits, 512, 4096);
    g.chain_flushes(true);
    g
}

/// A chained write and its flush, the next two actions.
fn chain(g: &mut GroupCommit<u32>) -> (OpId, OpId, usize) {
    let w = match g.poll_action() {
        Some(Action::WriteBatch {
            id, chained: true, ..
        }) => id,
        other => panic!("expected a chained write, got {other:?}"),
    };
    match g.poll_action() {
        Some(Action::Flush { id, lane }) => (w, id, lane),
        other => panic!("expected the chained flush, got {other:?}"),
    }
}

#[test]
fn each_group_is_one_write_with_its_flush_chained_behind() {
    let mut g = chained(Limits::default());
    g.push(Some(1), &[1; 100]).unwrap();
    g.push(Some(2), &[2; 100]).unwrap();
    let (w, f, _) = chain(&mut g);
    assert_eq!(g.poll_action(), None);
    assert!(g.on_write_complete(w, true).unwrap().acked.is_empty());
    assert_eq!(g.on_flush_complete(f, true).unwrap().acked, vec![1, 2]);
    assert!(g.is_idle());
}

#[test]
fn the_flush_reported_before_its_write_acks_only_once_the_write_is_in() {
    let mut g = chained(Limits::default());
    g.push(Some(1), &[1; 100]).unwrap();
    let (w, f, _) = chain(&mut g);
    assert!(g.on_flush_complete(f, true).unwrap().acked.is_empty());
    assert_eq!(g.on_write_complete(w, true).unwrap().acked, vec![1]);
    // A short or failed write fails its batch even when the flush said yes.
    g.push(Some(2), &[2; 100]).unwrap();
    let (w, f, _) = chain(&mut g);
    assert!(g.on_flush_complete(f, true).unwrap().acked.is_empty());
    assert_eq!(g.on_write_complete(w, false).unwrap().failed, vec![2]);
}

#[test]
fn a_later_flush_never_covers_an_earlier_chained_write() {
    let mut g = chained(Limits::default());
    g.push(Some(1), &[1; 100]).unwrap();
    let (w1, f1, l1) = chain(&mut g);
    g.push(Some(2), &[2; 512]).unwrap();
    let (w2, f2, l2) = chain(&mut g);
    assert_ne!(l1, l2);
    // Write 1 is in, but flush 2 may have started before it ended (each flush waits only
    // for its own write): flush 2's success leaves batch 1 waiting for flush 1.
    assert!(g.on_write_complete(w1, true).unwrap().acked.is_empty());
    assert!(g.on_write_complete(w2, true).unwrap().acked.is_empty());
    let c = g.on_flush_complete(f2, true).unwrap();
    assert!(c.acked.is_empty(), "acked {:?} before flush 1", c.acked);
    assert_eq!(g.on_flush_complete(f1, true).unwrap().acked, vec![1, 2]);
}

#[test]
fn a_group_collects_while_both_lanes_flush_unless_it_fills() {
    let mut g = chained(Limits {
        max_batch_bytes: 1024,
        ..Limits::default()
    });
    g.push(Some(1), &[1; 100]).unwrap();
    let (w1, f1, _) = chain(&mut g);
    g.push(Some(2), &[2; 600]).unwrap();
    let (w2, f2, _) = chain(&mut g);
    for t in 3..=5 {
        g.push(Some(t), &[u8::try_from(t % 256).unwrap(); 300])
            .unwrap();
        assert_eq!(g.poll_action(), None, "no lane free: token {t} waits");
    }
    // The next record does not fit: the full batch is cut and written at once, unchained.
    g.push(Some(6), &[6; 300]).unwrap();
    let full = match g.poll_action() {
        Some(Action::WriteBatch {
            id,
            chained: false,
            bytes,
            ..
        }) => {
            assert_eq!(bytes.len(), 1024);
            id
        }
        other => panic!("expected the full batch, got {other:?}"),
    };
    assert_eq!(g.poll_action(), None, "token 6 waits for a lane");
    g.on_write_complete(w1, true).unwrap();
    g.on_write_complete(w2, true).unwrap();
    g.on_write_complete(full, true).unwrap();
    assert_eq!(g.on_flush_complete(f1, true).unwrap().acked, vec![1]);
    // A free lane flushes the written full batch first, then the other lane takes token 6.
    let f3 = match g.poll_action() {
        Some(Action::Flush { id, .. }) => id,
        other => panic!("expected the full batch's flush, got {other:?}"),
    };
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![2]);
    assert_eq!(
        g.poll_action(),
        None,
        "token 6 (under a block) waits behind flush 3"
    );
    assert_eq!(g.on_flush_complete(f3, true).unwrap().acked, vec![3, 4, 5]);
    let (w4, f4, _) = chain(&mut g);
    g.on_write_complete(w4, true).unwrap();
    assert_eq!(g.on_flush_complete(f4, true).unwrap().acked, vec![6]);
    assert!(g.is_idle());
}

#[test]
fn a_second_lane_takes_a_group_only_once_it_fills_a_block() {
    let mut g = chained(Limits::default());
    g.push(Some(1), &[1; 100]).unwrap();
    let (w1, f1, _) = chain(&mut g);
    // One flush runs: a group of less than a block (512 here) waits behind it.
    g.push(Some(2), &[2; 200]).unwrap();
    assert_eq!(g.poll_action(), None);
    g.push(Some(3), &[3; 200]).unwrap();
    assert_eq!(g.poll_action(), None);
    g.push(Some(4), &[4; 200]).unwrap();
    let (w2, f2, _) = chain(&mut g);
    g.on_write_complete(w1, true).unwrap();
    g.on_write_complete(w2, true).unwrap();
    assert_eq!(
        g.on_flush_complete(f2, true).unwrap().acked,
        Vec::<u32>::new()
    );
    assert_eq!(
        g.on_flush_complete(f1, true).unwrap().acked,
        vec![1, 2, 3, 4]
    );
    // With no flush running, any group goes at once.
    g.push(Some(5), &[5; 8]).unwrap();
    let (w3, f3, _) = chain(&mut g);
    g.on_write_complete(w3, true).unwrap();
    assert_eq!(g.on_flush_complete(f3, true).unwrap().acked, vec![5]);
}

#[test]
fn a_cancelled_chained_flush_after_a_failed_write_fails_and_acks_nothing() {
    let mut g = chained(Limits::default());
    g.push(Some(1), &[1; 100]).unwrap();
    let (w, f, _) = chain(&mut g);
    let c = g.on_write_complete(w, false).unwrap();
    assert_eq!(c.failed, vec![1]);
    // The kernel cancels the chained fsync (-ECANCELED): a failed flush, nothing left to fail.
    let c = g.on_flush_complete(f, false).unwrap();
    assert!(c.acked.is_empty() && c.failed.is_empty());
    assert!(g.is_broken() && g.is_idle());
}

/// One operation the model kernel holds until it is reported.
struct Op {
    id: OpId,
    flush: bool,
    lane: usize,
    /// A write's byte range.
    range: (u64, u64),
    /// A chained flush: the write it waits for.
    chained_to: Option<OpId>,
    /// Ran on the device, with this outcome.
    ran: Option<bool>,
}

/// The model: ops in flight, writes that ran ok and are not yet flushed, and what is durable.
#[derive(Default)]
struct Model {
    ops: Vec<Op>,
    completed: Vec<(u64, u64)>,
    durable: Vec<(u64, u64)>,
    /// Device offset of each token (tokens are 0, 1, ...).
    at_of: Vec<u64>,
    acked: Vec<u32>,
    failed: usize,
}

impl Model {
    fn take_actions(&mut self, g: &mut GroupCommit<u32>) {
        let mut chained_write = None;
        while let Some(a) = g.poll_action() {
            match a {
                Action::WriteBatch {
                    id,
                    offset,
                    bytes,
                    chained,
                } => {
                    if chained {
                        chained_write = Some(id);
                    }
                    self.ops.push(Op {
                        id,
                        flush: false,
                        lane: 0,
                        range: (offset, offset + bytes.len() as u64),
                        chained_to: None,
                        ran: None,
                    });
                }
                Action::Flush { id, lane } => self.ops.push(Op {
                    id,
                    flush: true,
                    lane,
                    range: (0, 0),
                    chained_to: chained_write.take(),
                    ran: None,
                }),
            }
        }
        assert!(chained_write.is_none(), "a chained write without its flush");
        let lanes: Vec<usize> = self
            .ops
            .iter()
            .filter(|o| o.flush)
            .map(|o| o.lane)
            .collect();
        let mut distinct = lanes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), lanes.len(), "two flushes on one lane");
    }

    /// Ops that may run now: a chained flush only once its write ran.
    fn runnable(&self) -> Vec<usize> {
        (0..self.ops.len())
            .filter(|&i| {
                self.ops[i].ran.is_none()
                    && self.ops[i]
                        .chained_to
                        .is_none_or(|w| self.ops.iter().all(|o| o.id != w || o.ran.is_some()))
            })
            .collect()
    }

    /// Runs op `i` on the device; a flush makes every write that ran before it durable. A
    /// chained flush behind a failed write is cancelled.
    fn run(&mut self, i: usize, fail: bool) {
        let cancelled = self.ops[i]
            .chained_to
            .is_some_and(|w| self.ops.iter().any(|o| o.id == w && o.ran == Some(false)));
        let ok = !cancelled && !fail;
        self.ops[i].ran = Some(ok);
        if ok && self.ops[i].flush {
            self.durable.append(&mut self.completed);
        } else if ok {
            self.completed.push(self.ops[i].range);
        }
    }

    /// Reports op `i` (which ran) and checks every token it acks is durable.
    fn report(&mut self, g: &mut GroupCommit<u32>, i: usize) {
        let op = self.ops.remove(i);
        let ok = op.ran == Some(true);
        let c = if op.flush {
            g.on_flush_complete(op.id, ok)
        } else {
            g.on_write_complete(op.id, ok)
        }
        .unwrap_or_else(|e| panic!("completion refused: {e}"));
        for t in c.acked {
            let at = self.at_of[t as usize];
            assert!(
                self.durable.iter().any(|&(s, e)| s <= at && at < e),
                "token {t} at {at} acked before a flush covered it"
            );
            assert!(
                self.acked.last().is_none_or(|&l| l < t),
                "acks out of order"
            );
            self.acked.push(t);
        }
        self.failed += c.failed.len();
    }
}

/// Seeded runs of a model kernel (ops run and are reported in any order a chain allows, with
/// faults on some seeds): every acked token lies in a write that ran before a flush that
/// succeeded ran; every token ends acked or failed; acks come in push order.
#[test]
fn model_kernel_never_acks_a_write_before_a_flush_covering_it() {
    let mut failures_seen = false;
    for seed in 0..300u64 {
        let mut rng = SimRng::new(seed);
        let faults = seed % 3 == 0;
        let mut g = chained(Limits {
            max_batch_bytes: if seed % 2 == 0 { 1024 } else { 1 << 20 },
            max_inflight_flushes: if seed % 4 == 0 { 1 } else { 2 },
            ..Limits::default()
        });
        let mut m = Model::default();
        let mut relocations = 0u64;
        for _ in 0..300 {
            if g.is_broken() && rng.chance(1, 4) {
                // The driver continues the log elsewhere after an error (a new segment).
                relocations += 1;
                g.relocate(relocations << 30);
            }
            if rng.chance(1, 2) && !g.is_broken() {
                let len = 8 + usize::try_from(rng.below(300)).unwrap();
                let token = u32::try_from(m.at_of.len()).unwrap();
                if let Ok(at) = g.push(Some(token), &vec![1; len]) {
                    m.at_of.push(at);
                }
            }
            m.take_actions(&mut g);
            // Half the time the newest op goes first: later ops overtaking earlier ones is
            // where a flush could be credited with a write it did not wait for.
            let pick = |rng: &mut SimRng, from: &[usize]| match from.last() {
                Some(&newest) if rng.chance(1, 2) => newest,
                _ => from[usize::try_from(rng.below(from.len() as u64)).unwrap()],
            };
            let runnable = m.runnable();
            if !runnable.is_empty() {
                let i = pick(&mut rng, &runnable);
                m.run(i, faults && rng.chance(1, 25));
            }
            let ran: Vec<usize> = (0..m.ops.len())
                .filter(|&i| m.ops[i].ran.is_some())
                .collect();
            if !ran.is_empty() && rng.chance(2, 3) {
                let i = pick(&mut rng, &ran);
                m.report(&mut g, i);
            }
        }
        // Drain without faults: run everything, then report in any order.
        for _ in 0..10_000 {
            m.take_actions(&mut g);
            if m.ops.is_empty() {
                break;
            }
            while let Some(&i) = m.runnable().first() {
                m.run(i, false);
            }
            let i = usize::try_from(rng.below(m.ops.len() as u64)).unwrap();
            m.report(&mut g, i);
        }
        assert!(g.is_idle(), "seed {seed}: not idle after the drain");
        assert_eq!(
            m.acked.len() + m.failed,
            m.at_of.len(),
            "seed {seed}: a token was neither acked nor failed"
        );
        if faults {
            failures_seen |= m.failed > 0;
        } else {
            assert_eq!(m.failed, 0, "seed {seed}: failures without faults");
            assert!(m.acked.len() > 50, "seed {seed}: {} acked", m.acked.len());
        }
    }
    assert!(failures_seen, "the fault seeds never failed a write");
}
