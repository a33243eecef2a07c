//! The event stream from the ring reader to the pipeline: batches, not single events.
//!
//! The reader hands over everything one drain of the ring produced as one `Vec<Event>`, so the
//! channel's synchronisation and the consumer's wake-up (and its `select!` over timers and
//! signals) are paid once per batch instead of once per event: under a keep-alive load they
//! were ~5% of the agent's CPU. The bound stays in events (`--capture-channel-capacity`, what
//! the memory budget sizes): a shared count of queued events, checked before each batch.
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};

use tokio::sync::mpsc;

use super::Event;

/// Events one batch holds at most: a drain of a busy ring is cut into batches this long so the
/// consumer starts on the first while the reader decodes the rest.
pub(super) const BATCH_MAX: usize = 512;
/// Batches in flight at most (the event bound is the real one; this only caps the channel's
/// own slots).
const BATCHES: usize = 1024;
/// Emptied batches kept for the reader to fill again at most.
const SPARES: usize = 4;

/// Batches the pipeline emptied, back to the reader: a new one is 512 events (~180 KiB) that
/// the reader's thread would allocate and the pipeline's free, once per flush.
type Spares = Arc<Mutex<Vec<Vec<Event>>>>;

/// The reader's end: collects a batch, sends it whole, counts what the bound refuses.
pub(super) struct Sender {
    tx: mpsc::Sender<Vec<Event>>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    batch: Vec<Event>,
    spares: Spares,
}

/// What a flush did with the batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flushed {
    /// Sent, with this many events refused by the bound (counted as channel drops).
    Sent { dropped: usize },
    /// The consumer is gone.
    Closed,
}

impl Sender {
    /// Queues `ev` in the current batch; a full batch is flushed.
    pub(super) fn push(&mut self, ev: Event) -> Flushed {
        self.batch.push(ev);
        if self.batch.len() >= BATCH_MAX {
            return self.flush();
        }
        Flushed::Sent { dropped: 0 }
    }

    /// Whether `n` more events fit under the bound (with the batch collected so far): the
    /// reader leaves records in the kernel's ring rather than decode what it would drop.
    /// An empty stream always has room, whatever the bound.
    pub(super) fn has_room(&self, n: usize) -> bool {
        let used = self.queued.load(Ordering::Acquire) + self.batch.len();
        used == 0 || used + n <= self.capacity
    }

    /// Sends the batch collected so far: as much of it as the event bound has room for, in
    /// order (the rest is dropped, like a full channel dropped events before).
    pub(super) fn flush(&mut self) -> Flushed {
        let n = self.batch.len();
        if n == 0 {
            return Flushed::Sent { dropped: 0 };
        }
        let room = self
            .capacity
            .saturating_sub(self.queued.load(Ordering::Acquire));
        let dropped = n.saturating_sub(room);
        self.batch.truncate(n - dropped);
        let sent = self.batch.len();
        if sent == 0 {
            return Flushed::Sent { dropped };
        }
        // Counted before the send, so the consumer's decrement never runs ahead of it.
        self.queued.fetch_add(sent, Ordering::AcqRel);
        let next = self
            .spares
            .lock()
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or_else(|| Vec::with_capacity(BATCH_MAX));
        let batch = std::mem::replace(&mut self.batch, next);
        match self.tx.try_send(batch) {
            Ok(()) => Flushed::Sent { dropped },
            Err(mpsc::error::TrySendError::Full(mut b)) => {
                self.queued.fetch_sub(sent, Ordering::AcqRel);
                b.clear();
                self.batch = b;
                Flushed::Sent {
                    dropped: dropped + sent,
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Flushed::Closed,
        }
    }
}

/// The pipeline's end: batches as the reader sent them, or one event at a time.
pub struct Events {
    rx: mpsc::Receiver<Vec<Event>>,
    queued: Arc<AtomicUsize>,
    /// What `recv` has not handed out yet of the last batch.
    rest: std::vec::IntoIter<Event>,
    spares: Spares,
}

impl Events {
    /// The next batch, in kernel order; `None` once the reader is gone. Cancel-safe.
    pub async fn recv_batch(&mut self) -> Option<Vec<Event>> {
        if self.rest.len() > 0 {
            return Some(std::mem::take(&mut self.rest).collect());
        }
        let batch = self.rx.recv().await?;
        self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        Some(batch)
    }

    /// Hands a batch `recv_batch` returned back, emptied here, for the reader to fill again.
    pub fn recycle(&self, mut batch: Vec<Event>) {
        batch.clear();
        if batch.capacity() < BATCH_MAX {
            return;
        }
        if let Ok(mut s) = self.spares.lock()
            && s.len() < SPARES
        {
            s.push(batch);
        }
    }

    /// The next event; `None` once the reader is gone. Cancel-safe (a received batch is kept
    /// before this returns).
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.rest.next() {
                return Some(ev);
            }
            let batch = self.rx.recv().await?;
            self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
            self.rest = batch.into_iter();
        }
    }
}

/// A stream bounded to `capacity` queued events.
pub(super) fn channel(capacity: usize) -> (Sender, Events) {
    let (tx, rx) = mpsc::channel(BATCHES);
    let queued = Arc::new(AtomicUsize::new(0));
    let spares = Spares::default();
    (
        Sender {
            tx,
            queued: queued.clone(),
            capacity,
            batch: Vec::with_capacity(BATCH_MAX),
            spares: spares.clone(),
        },
        Events {
            rx,
            queued,
            rest: Vec::new().into_iter(),
            spares,
        },
    )
}

#[cfg(test)]
mod tests;
