//! Unit tests of [`super::GroupCommit`]: acks wait for the covering flush, ordering, id reuse,
//! write and flush errors, backpressure, the in-flight write limit and pipelined flushes.
use super::*;

fn gc(limits: Limits) -> GroupCommit<u32> {
    GroupCommit::new(limits, 512, 4096)
}

fn write_id(a: Option<Action>) -> (OpId, u64, usize) {
    match a {
        Some(Action::WriteBatch {
            id, offset, bytes, ..
        }) => (id, offset, bytes.len()),
        other => panic!("expected a write, got {other:?}"),
    }
}

fn flush_id(a: Option<Action>) -> OpId {
    match a {
        Some(Action::Flush { id, .. }) => id,
        other => panic!("expected a flush, got {other:?}"),
    }
}

#[test]
fn acks_wait_for_the_flush_even_across_ticks() {
    let mut g = gc(Limits::default());
    assert_eq!(g.push(Some(1), &[1; 100]).unwrap(), 4096);
    assert_eq!(g.push(Some(2), &[2; 100]).unwrap(), 4196);
    let (w, off, len) = write_id(g.poll_action());
    assert_eq!((off, len), (4096, 512));
    assert_eq!(g.poll_action(), None, "no flush before the write completes");
    // Write completes in one tick: nothing is acked yet.
    let c = g.on_write_complete(w, true).unwrap();
    assert!(c.acked.is_empty() && c.failed.is_empty());
    // Next batch lands block-aligned after the first.
    assert_eq!(g.push(Some(3), &[3; 10]).unwrap(), 4608);
    let f = flush_id(g.poll_action());
    assert_ne!(f, w);
    let (w2, off2, _) = write_id(g.poll_action());
    assert_eq!(off2, 4608);
    assert_eq!(g.on_flush_complete(f, true).unwrap().acked, vec![1, 2]);
    // The second batch's write completed before the flush was issued? No: it needs its own flush.
    assert!(g.on_write_complete(w2, true).unwrap().acked.is_empty());
    let f2 = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![3]);
    assert!(g.is_idle());
    assert_eq!(g.pending_writes(), 0);
}

#[test]
fn out_of_order_write_completions_ack_in_log_order() {
    let mut g = gc(Limits {
        max_batch_bytes: 512,
        ..Limits::default()
    });
    g.push(Some(1), &[1; 400]).unwrap();
    let second = g.push(Some(2), &[2; 400]).unwrap();
    assert_eq!(
        second,
        4096 + 512,
        "a full batch is cut and the next starts on a block"
    );
    let (w1, _, _) = write_id(g.poll_action());
    let (w2, _, _) = write_id(g.poll_action());
    g.on_write_complete(w2, true).unwrap();
    let f = flush_id(g.poll_action());
    // Batch 2 is durable but batch 1 is not: nothing may be acked (log prefix rule).
    assert!(g.on_flush_complete(f, true).unwrap().acked.is_empty());
    g.on_write_complete(w1, true).unwrap();
    let f2 = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![1, 2]);
}

#[test]
fn ids_are_never_reused_and_stale_completions_are_rejected() {
    let mut g = gc(Limits::default());
    let mut seen = std::collections::HashSet::new();
    for t in 0..50u32 {
        g.push(Some(t), &[0; 64]).unwrap();
        let (w, _, _) = write_id(g.poll_action());
        assert!(seen.insert(w));
        g.on_write_complete(w, true).unwrap();
        assert!(matches!(
            g.on_write_complete(w, true),
            Err(DurableError::UnexpectedCompletion(_))
        ));
        let f = flush_id(g.poll_action());
        assert!(seen.insert(f));
        assert_eq!(g.on_flush_complete(f, true).unwrap().acked, vec![t]);
        assert!(g.on_flush_complete(f, true).is_err());
    }
}

#[test]
fn write_error_fails_that_batch_and_later_ones_only() {
    let mut g = gc(Limits {
        max_batch_bytes: 512,
        ..Limits::default()
    });
    g.push(Some(1), &[1; 400]).unwrap();
    g.push(Some(2), &[2; 400]).unwrap();
    g.push(Some(3), &[3; 400]).unwrap();
    let (w1, _, _) = write_id(g.poll_action());
    let (w2, off2, _) = write_id(g.poll_action());
    let (w3, _, _) = write_id(g.poll_action());
    let c = g.on_write_complete(w2, false).unwrap();
    assert_eq!((c.failed, c.error_offset), (vec![2, 3], Some(off2)));
    assert!(g.is_broken());
    assert!(
        g.push(Some(9), &[0; 8]).is_err(),
        "no appends at an unknown tail"
    );
    g.on_write_complete(w3, true).unwrap(); // late completion of an abandoned batch
    g.on_write_complete(w1, true).unwrap();
    let f = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f, true).unwrap().acked, vec![1]);
    g.relocate(1 << 20);
    assert_eq!(g.push(Some(4), &[4; 8]).unwrap(), 1 << 20);
}

#[test]
fn flush_error_fails_everything_not_durable() {
    let mut g = gc(Limits::default());
    g.push(Some(1), &[1; 8]).unwrap();
    let (w, _, _) = write_id(g.poll_action());
    g.on_write_complete(w, true).unwrap();
    let f = flush_id(g.poll_action());
    g.push(Some(2), &[2; 8]).unwrap();
    let c = g.on_flush_complete(f, false).unwrap();
    assert_eq!(c.failed, vec![1, 2]);
    assert!(c.acked.is_empty());
    assert_eq!(g.pending_writes(), 0);
}

#[test]
fn backpressure_when_full() {
    let mut g = gc(Limits {
        max_pending_writes: 2,
        ..Limits::default()
    });
    g.push(Some(1), &[0; 8]).unwrap();
    g.push(Some(2), &[0; 8]).unwrap();
    assert!(matches!(
        g.push(Some(3), &[0; 8]),
        Err(DurableError::Backpressure { limit: 2 })
    ));
    assert!(
        g.push(None, &[0; 8]).is_ok(),
        "internal bytes are not counted"
    );
}

#[test]
fn inflight_write_limit_holds_batches_back() {
    let mut g = gc(Limits {
        max_batch_bytes: 512,
        max_inflight_writes: 1,
        ..Limits::default()
    });
    g.push(Some(1), &[1; 400]).unwrap();
    g.push(Some(2), &[2; 400]).unwrap();
    let (w1, _, _) = write_id(g.poll_action());
    assert_eq!(g.poll_action(), None);
    g.on_write_complete(w1, true).unwrap();
    let f = flush_id(g.poll_action());
    let (w2, _, _) = write_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f, true).unwrap().acked, vec![1]);
    g.on_write_complete(w2, true).unwrap();
    let f2 = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![2]);
}

/// One batch written and completed, so the next poll would issue a flush.
fn written(g: &mut GroupCommit<u32>, token: u32) {
    g.push(Some(token), &[u8::try_from(token % 256).unwrap(); 8])
        .unwrap();
    let (w, _, _) = write_id(g.poll_action());
    assert!(g.on_write_complete(w, true).unwrap().acked.is_empty());
}

#[test]
fn a_second_flush_is_issued_while_the_first_is_in_flight() {
    let mut g = gc(Limits::default());
    written(&mut g, 1);
    let f1 = flush_id(g.poll_action());
    written(&mut g, 2);
    let f2 = flush_id(g.poll_action());
    written(&mut g, 3);
    assert_eq!(g.poll_action(), None, "two flushes in flight is the limit");
    assert_eq!(g.on_flush_complete(f1, true).unwrap().acked, vec![1]);
    let f3 = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![2]);
    assert_eq!(g.on_flush_complete(f3, true).unwrap().acked, vec![3]);
    assert!(g.is_idle());
}

#[test]
fn a_later_flush_completing_first_makes_the_earlier_batches_durable_in_order() {
    let mut g = gc(Limits::default());
    written(&mut g, 1);
    let f1 = flush_id(g.poll_action());
    written(&mut g, 2);
    let f2 = flush_id(g.poll_action());
    // fdatasync #2 was issued after batch 1's write completed: it covers batch 1 too.
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![1, 2]);
    // The earlier flush's completion still arrives; it releases nothing and is no error.
    let late = g.on_flush_complete(f1, true).unwrap();
    assert!(late.acked.is_empty() && late.failed.is_empty());
    assert!(
        g.on_flush_complete(f1, true).is_err(),
        "each id completes once"
    );
    assert!(g.is_idle());
}

#[test]
fn a_failed_flush_fails_what_the_flush_still_in_flight_covers() {
    let mut g = gc(Limits::default());
    written(&mut g, 1);
    let f1 = flush_id(g.poll_action());
    written(&mut g, 2);
    let f2 = flush_id(g.poll_action());
    let c = g.on_flush_complete(f1, false).unwrap();
    assert_eq!(
        c.failed,
        vec![1, 2],
        "nothing unflushed is trusted after a failed flush"
    );
    // The other flush succeeding afterwards must not resurrect a failed batch.
    let late = g.on_flush_complete(f2, true).unwrap();
    assert!(late.acked.is_empty() && late.failed.is_empty());
    assert_eq!(g.pending_writes(), 0);
    assert!(g.is_broken());
}

#[test]
fn one_flush_in_flight_when_the_limit_says_so() {
    let mut g = gc(Limits {
        max_inflight_flushes: 1,
        ..Limits::default()
    });
    written(&mut g, 1);
    let f1 = flush_id(g.poll_action());
    written(&mut g, 2);
    assert_eq!(g.poll_action(), None);
    assert_eq!(g.on_flush_complete(f1, true).unwrap().acked, vec![1]);
    let f2 = flush_id(g.poll_action());
    assert_eq!(g.on_flush_complete(f2, true).unwrap().acked, vec![2]);
}

#[test]
fn flushes_in_flight_never_share_a_lane() {
    let mut g = gc(Limits::default());
    let lane = |a: Option<Action>| match a {
        Some(Action::Flush { id, lane }) => (id, lane),
        other => panic!("expected a flush, got {other:?}"),
    };
    written(&mut g, 1);
    let (f1, l1) = lane(g.poll_action());
    written(&mut g, 2);
    let (f2, l2) = lane(g.poll_action());
    assert_ne!(l1, l2);
    // The second completes first; the next flush takes its lane, not the first's.
    g.on_flush_complete(f2, true).unwrap();
    written(&mut g, 3);
    let (_, l3) = lane(g.poll_action());
    assert_eq!(l3, l2);
    g.on_flush_complete(f1, true).unwrap();
    g.limit_flush_lanes(1);
    written(&mut g, 4);
    assert_eq!(g.poll_action(), None, "one lane, and it is busy");
}

#[test]
fn durable_groups_report_their_records_and_latency_once() {
    let metrics = std::sync::Arc::new(CommitMetrics::default());
    let mut g = gc(Limits::default());
    g.attach_metrics(metrics.clone());
    g.push(None, &[0; 64]).unwrap();
    g.push(Some(1), &[1; 100]).unwrap();
    g.push(Some(2), &[2; 100]).unwrap();
    let (w, _, _) = write_id(g.poll_action());
    g.on_write_complete(w, true).unwrap();
    g.push(Some(3), &[3; 10]).unwrap();
    let f = flush_id(g.poll_action());
    assert_eq!(
        metrics.group_sizes().buckets.iter().sum::<u64>(),
        0,
        "not durable yet"
    );
    let (w2, _, _) = write_id(g.poll_action());
    g.on_flush_complete(f, true).unwrap();
    g.on_write_complete(w2, true).unwrap();
    let f2 = flush_id(g.poll_action());
    g.on_flush_complete(f2, true).unwrap();
    let sizes = metrics.group_sizes();
    assert_eq!(sizes.buckets.iter().sum::<u64>(), 2, "two groups");
    assert_eq!(
        sizes.sum, 3,
        "three acknowledged records; the untokened bytes are none"
    );
    assert_eq!(metrics.latency().buckets.iter().sum::<u64>(), 3);
}
