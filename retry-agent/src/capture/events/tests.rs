use super::*;

fn ev(pid: u32) -> Event {
    Event::ProcessExit { pid, ts_ns: 1 }
}

fn pids(b: &[Event]) -> Vec<u32> {
    b.iter().map(Event::pid).collect()
}

#[tokio::test]
async fn a_batch_arrives_whole_and_in_order() {
    let (mut tx, mut rx) = channel(100);
    for p in 1..=3 {
        assert_eq!(tx.push(ev(p)), Flushed::Sent { dropped: 0 });
    }
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    assert_eq!(pids(&rx.recv_batch().await.unwrap()), vec![1, 2, 3]);
}

#[tokio::test]
async fn the_bound_counts_events_and_drops_the_tail() {
    let (mut tx, mut rx) = channel(4);
    for p in 1..=3 {
        tx.push(ev(p));
    }
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    // One slot left of four: the second batch keeps its first event only.
    for p in 4..=6 {
        tx.push(ev(p));
    }
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 2 });
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 }, "nothing left");
    // Taking a batch frees its room.
    assert_eq!(pids(&rx.recv_batch().await.unwrap()), vec![1, 2, 3]);
    tx.push(ev(7));
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    assert_eq!(rx.recv().await.map(|e| e.pid()), Some(4));
    assert_eq!(rx.recv().await.map(|e| e.pid()), Some(7));
}

#[tokio::test]
async fn a_full_batch_is_sent_without_a_flush() {
    let (mut tx, mut rx) = channel(10 * BATCH_MAX);
    for p in 0..BATCH_MAX as u32 {
        tx.push(ev(p));
    }
    assert_eq!(rx.recv_batch().await.map(|b| b.len()), Some(BATCH_MAX));
}

#[tokio::test]
async fn recv_hands_out_a_batch_event_by_event_then_ends_with_the_sender() {
    let (mut tx, mut rx) = channel(10);
    tx.push(ev(1));
    tx.push(ev(2));
    tx.flush();
    drop(tx);
    assert_eq!(rx.recv().await.map(|e| e.pid()), Some(1));
    // The rest of a batch `recv` started comes first.
    assert_eq!(rx.recv_batch().await.map(|b| pids(&b)), Some(vec![2]));
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn a_gone_consumer_is_reported() {
    let (mut tx, rx) = channel(10);
    drop(rx);
    tx.push(ev(1));
    assert_eq!(tx.flush(), Flushed::Closed);
}

#[tokio::test]
async fn room_counts_the_queue_and_the_batch_and_an_empty_stream_always_has_some() {
    let (mut tx, mut rx) = channel(4);
    assert!(tx.has_room(2));
    tx.push(ev(1));
    tx.push(ev(2));
    assert!(tx.has_room(2));
    assert!(!tx.has_room(3), "two in the batch, four at most");
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    tx.push(ev(3));
    assert!(!tx.has_room(2), "two queued, one in the batch");
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    assert_eq!(pids(&rx.recv_batch().await.unwrap()), vec![1, 2]);
    assert!(tx.has_room(2), "taking a batch frees its room");
    // A bound smaller than a record's events must not stop the reader for good.
    let (tx, _rx) = channel(1);
    assert!(tx.has_room(2));
}

#[tokio::test]
async fn a_recycled_batch_is_filled_again() {
    let (mut tx, mut rx) = channel(10);
    tx.push(ev(1));
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    // The batch being filled now was made at that flush; the one after it is the recycled one.
    tx.push(ev(2));
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    let first = rx.recv_batch().await.unwrap();
    assert_eq!(pids(&first), vec![1]);
    let at = first.as_ptr();
    rx.recycle(first);
    tx.push(ev(3));
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    tx.push(ev(4));
    assert_eq!(tx.flush(), Flushed::Sent { dropped: 0 });
    assert_eq!(pids(&rx.recv_batch().await.unwrap()), vec![2]);
    let third = rx.recv_batch().await.unwrap();
    assert_eq!(pids(&third), vec![3]);
    let fourth = rx.recv_batch().await.unwrap();
    assert_eq!(pids(&fourth), vec![4]);
    assert_eq!(
        fourth.as_ptr(),
        at,
        "the emptied batch came back to be filled"
    );
    // A batch smaller than the reader's is not kept.
    rx.recycle(Vec::new());
    assert!(rx.spares.lock().unwrap().is_empty());
}
