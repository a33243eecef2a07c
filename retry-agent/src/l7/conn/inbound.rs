//! Inbound requests each server thread has read and not yet answered: whether a request was
//! its thread's only one in flight when it was answered.
//!
//! A thread-per-request server reads a request, serves it and answers it before reading the
//! next; an event loop reads others meanwhile. Only in the first case are the calls the thread
//! made during the request the request's own, and only then may a verdict rest on them as soon
//! as the answer is seen (`Exchange::sole_on_thread`) instead of after a grace period that waits
//! for an overlapping request to show itself. Read and answer happen on the same thread, so
//! its events arrive in the order it made them: a read before the answer is always seen first.
use foldhash::HashMap;

use crate::capture::ConnId;

/// Unanswered reads kept per thread (an event loop has many; one is enough to say so).
const PER_THREAD: usize = 8;
/// Threads tracked before the table starts again (a node-wide bound; losing it only makes
/// requests wait their grace period).
const MAX_THREADS: usize = 16_384;
/// A read unanswered for this long is taken as lost (its connection evicted or its answer
/// unseen), not as a request still in flight.
const STALE_NS: u64 = 10_000_000_000;

#[derive(Clone, Copy, Debug)]
struct Read {
    conn: ConnId,
    start_ns: u64,
    /// Another request was read by the thread while this one was unanswered.
    interleaved: bool,
}

#[derive(Debug, Default)]
pub(crate) struct InboundByThread {
    threads: HashMap<(u32, u32), Vec<Read>>,
}

impl InboundByThread {
    /// Thread `tid` of `pid` read the head of a request on `conn` starting at `start_ns`;
    /// `interleaved`: the kernel saw the thread read it among others it had not answered
    /// (requests it held back, which reach here late: the order of reads alone cannot tell).
    pub(crate) fn read(
        &mut self,
        pid: u32,
        tid: u32,
        conn: ConnId,
        start_ns: u64,
        interleaved: bool,
    ) {
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&(pid, tid)) {
            self.threads.clear();
        }
        let reads = self.threads.entry((pid, tid)).or_default();
        reads.retain(|r| start_ns.saturating_sub(r.start_ns) < STALE_NS);
        if reads.len() >= PER_THREAD {
            reads.remove(0);
        }
        // Both overlap, whichever is answered first.
        let interleaved = interleaved || !reads.is_empty();
        for r in reads.iter_mut() {
            r.interleaved = true;
        }
        reads.push(Read {
            conn,
            start_ns,
            interleaved,
        });
    }

    /// The request on `conn` that started at `start_ns` (read by `tid`) was answered at
    /// `end_ns`: whether its thread read no other request from its read to this answer and
    /// had none unanswered from before. Unknown (never read, e.g. capture began mid-request)
    /// counts as not alone.
    pub(crate) fn answer(
        &mut self,
        pid: u32,
        tid: u32,
        conn: ConnId,
        start_ns: u64,
        end_ns: u64,
    ) -> bool {
        let Some(reads) = self.threads.get_mut(&(pid, tid)) else {
            return false;
        };
        let Some(at) = reads
            .iter()
            .position(|r| r.conn == conn && r.start_ns == start_ns)
        else {
            return false;
        };
        let own = reads.remove(at);
        reads.retain(|r| end_ns.saturating_sub(r.start_ns) < STALE_NS);
        !own.interleaved && reads.is_empty()
    }

    /// The process is gone: its threads' reads with it.
    pub(crate) fn forget_pid(&mut self, pid: u32) {
        self.threads.retain(|&(p, _), _| p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(fd: u32) -> ConnId {
        ConnId {
            pid: 1,
            fd,
            generation: 1,
        }
    }

    #[test]
    fn a_thread_per_request_answers_alone() {
        let mut t = InboundByThread::default();
        for i in 0..20u64 {
            t.read(1, 7, conn(4), i * 10, false);
            assert!(t.answer(1, 7, conn(4), i * 10, i * 10 + 5));
        }
        // Another thread's requests in between change nothing.
        t.read(1, 7, conn(4), 300, false);
        t.read(1, 8, conn(5), 301, false);
        assert!(t.answer(1, 8, conn(5), 301, 302));
        assert!(t.answer(1, 7, conn(4), 300, 310));
    }

    #[test]
    fn an_event_loop_never_answers_alone() {
        let mut t = InboundByThread::default();
        // Y read, X read, Y answered, X answered: both overlapped, whatever the order.
        t.read(1, 7, conn(5), 30, false);
        t.read(1, 7, conn(6), 35, false);
        assert!(!t.answer(1, 7, conn(5), 30, 40));
        assert!(!t.answer(1, 7, conn(6), 35, 50));
        // X read while Y was unanswered; X answered first.
        t.read(1, 7, conn(5), 60, false);
        t.read(1, 7, conn(6), 65, false);
        assert!(!t.answer(1, 7, conn(6), 65, 70));
        assert!(!t.answer(1, 7, conn(5), 60, 80));
        // Alone again afterwards.
        t.read(1, 7, conn(5), 90, false);
        assert!(t.answer(1, 7, conn(5), 90, 95));
    }

    #[test]
    fn the_kernels_word_on_reads_held_back_counts() {
        let mut t = InboundByThread::default();
        // An event loop read X, then Y, both held by the kernel; Y was answered first, and its
        // summary came before X's: from the order alone Y was alone.
        t.read(1, 7, conn(6), 35, true);
        assert!(!t.answer(1, 7, conn(6), 35, 40));
        t.read(1, 7, conn(5), 30, true);
        assert!(!t.answer(1, 7, conn(5), 30, 50));
        // Unflagged and alone: alone.
        t.read(1, 7, conn(5), 60, false);
        assert!(t.answer(1, 7, conn(5), 60, 70));
    }

    #[test]
    fn unknown_and_lost_reads() {
        let mut t = InboundByThread::default();
        // An answer to a request never read is not known to be alone.
        assert!(!t.answer(1, 7, conn(4), 10, 20));
        // A read never answered (its connection evicted) spoils the next ones until it is stale.
        t.read(1, 7, conn(4), 100, false);
        t.read(1, 7, conn(5), 200, false);
        assert!(!t.answer(1, 7, conn(5), 200, 210));
        let later = 100 + STALE_NS;
        t.read(1, 7, conn(5), later, false);
        assert!(t.answer(1, 7, conn(5), later, later + 10));
        // A process that exits takes its threads' reads with it.
        t.read(1, 7, conn(4), later + 20, false);
        t.forget_pid(1);
        t.read(1, 7, conn(5), later + 30, false);
        assert!(t.answer(1, 7, conn(5), later + 30, later + 40));
    }
}
