//! The ring reader task: drains the ring buffer (woken by the kernel past a threshold, polling
//! below it), decodes records, describes each process once (`Event::Process`), leaves out the
//! agent's own shims, and forwards events in batches without ever blocking: records the event
//! bound has no room for wait in the ring (the kernel counts what a full ring refuses).
use std::{path::PathBuf, sync::atomic::Ordering, time::Duration};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
// Looked up for every record: a fast hasher (pids are not attacker-chosen keys of note).
use foldhash::{HashMap, HashSet};
use retry_common::{ConnInfo, ConnKey, KIND_SUMMARY, KIND_TALLY, SUMMARY_HEAD, SummaryRecord};
use tokio::io::unix::AsyncFd;

use super::{
    ConnEventKind, Event, ProcessInfo, StatsHandle, decode,
    events::{self, Flushed},
    own_exe::OwnExe,
    procfs,
};

/// How long the reader leaves records in the ring when the pipeline has no room for them.
const FULL_RETRY: Duration = Duration::from_millis(1);

/// How a round of draining ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drained {
    /// The ring is empty.
    Empty,
    /// The pipeline has no room: records wait in the ring.
    Full,
    /// The round took its share and more wait.
    More,
}

/// Bound on `Reader::forked_from` (entries normally live one record long).
const FORKED_FROM_MAX: usize = 4096;

/// The ring reader task's state.
pub(super) struct Reader {
    pub(super) tx: events::Sender,
    pub(super) stats: StatsHandle,
    pub(super) drops: PerCpuArray<MapData, u64>,
    pub(super) arg_failures: PerCpuArray<MapData, u64>,
    pub(super) conns: BpfHashMap<MapData, ConnKey, ConnInfo>,
    /// Requests the kernel holds for their answer (`--capture-summarize`): an exited process's
    /// are taken and reported before its exit (they got no answer).
    pub(super) held: BpfHashMap<MapData, ConnKey, SummaryRecord>,
    pub(super) proc_root: PathBuf,
    pub(super) poll_interval: Duration,
    /// Pids whose `Event::Process` was sent, with the fds the kernel map tracks for them (so an
    /// exit removes exactly those entries instead of scanning the whole map).
    pub(super) seen: HashMap<u32, HashSet<u32>>,
    /// Processes running the agent's own binary (its shims): a proxy hop is not a service, and
    /// observing it would put a fake service between every caller and callee it steers.
    pub(super) ignored: HashSet<u32>,
    /// The agent's executable: processes running it (shims) are not observed.
    pub(super) own_exe: OwnExe,
    /// The kernel's list of those processes (their new sockets are never tracked).
    pub(super) agent_tgids: BpfHashMap<MapData, u32, u8>,
    /// Pids described with no name (gone from /proc before they were read): their exit record
    /// names them. Entries go with the exit, like `seen`'s.
    pub(super) nameless: HashSet<u32>,
    /// Children whose first record adopted a connection across fork, by pid, until described:
    /// their parent's pid.
    pub(super) forked_from: HashMap<u32, u32>,
    /// Where decoded payloads go.
    pub(super) arena: decode::PayloadArena,
}

impl Reader {
    pub(super) async fn run(mut self, mut ring: AsyncFd<RingBuf<MapData>>, initial: Vec<Event>) {
        for ev in initial {
            self.stats.0.events.fetch_add(1, Ordering::Relaxed);
            if !self.forward(ev) {
                return;
            }
        }
        if !self.flush() {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // The kernel wakes us each time another `wakeup_bytes` wait; below that we come and look.
        let mut poll = tokio::time::interval(self.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // How the last round ended: `Full` brings the reader back once the pipeline had time to
        // make room, `More` at once (after the other arms had their turn).
        let mut last = Drained::Empty;
        loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    match guard {
                        // Readiness is cleared only once nothing more can be taken now: the
                        // kernel wakes the reader only as records arrive, so clearing with
                        // records left would leave them to the poll.
                        Ok(mut g) => {
                            let Some(d) = self.drain(g.get_inner_mut()) else { return };
                            if d != Drained::More {
                                g.clear_ready();
                            }
                            last = d;
                            continue;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "ring buffer poll failed; capture stops");
                            return;
                        }
                    }
                }
                _ = tokio::task::yield_now(), if last == Drained::More => {}
                _ = tokio::time::sleep(FULL_RETRY), if last == Drained::Full => {}
                _ = poll.tick() => {
                    // Records committed without a wakeup.
                    self.stats.0.polls.fetch_add(1, Ordering::Relaxed);
                }
                _ = tick.tick() => {
                    self.refresh_drops();
                    continue;
                }
            }
            let Some(d) = self.drain(ring.get_mut()) else {
                return;
            };
            last = d;
        }
    }

    /// Handles up to one round of records and sends what they made; `None`: the consumer is
    /// gone. Bounded so the tick and a closed channel are noticed.
    fn drain(&mut self, rb: &mut RingBuf<MapData>) -> Option<Drained> {
        let mut drained = Drained::More;
        for _ in 0..4096 {
            let Some(item) = rb.next() else {
                drained = Drained::Empty;
                break;
            };
            // A record makes at most two events (its process's description and its own). One
            // the channel has no room for stays in the ring, which holds far more than the
            // channel, instead of being decoded only to be dropped: the kernel drops (and
            // counts) only once the ring is full.
            if !self.tx.has_room(2) {
                // Not dropped, so not consumed: the next `next()` returns it again.
                std::mem::forget(item);
                drained = Drained::Full;
                break;
            }
            // Decoded in place: the decoder copies the payload once, into the event it owns.
            if !self.handle(&item) {
                return None;
            }
        }
        self.flush().then_some(drained)
    }

    /// Sends the batch collected so far. `false`: the consumer is gone.
    fn flush(&mut self) -> bool {
        let flushed = self.tx.flush();
        self.count(flushed)
    }

    fn count(&self, f: Flushed) -> bool {
        match f {
            Flushed::Sent { dropped } => {
                if dropped > 0 {
                    self.stats
                        .0
                        .channel_drops
                        .fetch_add(dropped as u64, Ordering::Relaxed);
                }
                true
            }
            Flushed::Closed => false,
        }
    }

    fn refresh_drops(&self) {
        if let Ok(v) = self.drops.get(&0, 0) {
            let total: u64 = v.iter().sum();
            self.stats.0.kernel_drops.store(total, Ordering::Relaxed);
        }
        for (slot, counter) in (0u32..).zip(&self.stats.0.arg_insert_failures) {
            if let Ok(v) = self.arg_failures.get(&slot, 0) {
                counter.store(v.iter().sum(), Ordering::Relaxed);
            }
        }
    }

    /// Returns false when the consumer is gone.
    fn handle(&mut self, raw: &[u8]) -> bool {
        if let Some(pid) = decode::exec_pid(raw) {
            // The kernel forgot an ignored process at exec: its new image is judged anew.
            if self.ignored.remove(&pid) {
                return true;
            }
            // New image, new comm/exe: describe it again, but only if it was described before.
            if self.seen.contains_key(&pid) {
                if self.is_ours(pid) {
                    // A traced process that became a shim: its sockets go untracked.
                    for fd in self.seen.remove(&pid).unwrap_or_default() {
                        let _ = self.conns.remove(&ConnKey { tgid: pid, fd });
                    }
                    return true;
                }
                let info = self.describe(pid);
                return self.send(Event::Process(info));
            }
            return true;
        }
        if let Some((child, parent)) = decode::inherited_from(raw)
            && !self.seen.contains_key(&child)
            && self.forked_from.len() < FORKED_FROM_MAX
        {
            self.forked_from.insert(child, parent);
        }
        match decode::decode_in(raw, Some(&mut self.arena)) {
            Ok(ev) => {
                self.stats.0.events.fetch_add(1, Ordering::Relaxed);
                if let Event::ProcessExit { pid, .. } = ev
                    && self.nameless.remove(&pid)
                    && let Some(comm) = decode::exit_comm(raw)
                    && !self.send(Event::Process(ProcessInfo::named_at_exit(pid, comm)))
                {
                    return false;
                }
                self.forward(ev)
            }
            Err(e) => {
                let n = self.stats.0.decode_errors.fetch_add(1, Ordering::Relaxed);
                // Rate-limited: the first few and then every 1000th.
                if n < 5 || n.is_multiple_of(1000) {
                    tracing::warn!(error = %e, total = n + 1, "malformed capture record");
                }
                true
            }
        }
    }

    /// Whether `pid` runs the agent's executable; if so it is ignored from now on, here and
    /// in the kernel.
    fn is_ours(&mut self, pid: u32) -> bool {
        if !self
            .own_exe
            .is_ours(&self.proc_root.join(pid.to_string()).join("exe"))
        {
            return false;
        }
        tracing::debug!(
            pid,
            "not observing another process of the agent's executable (a shim)"
        );
        self.ignored.insert(pid);
        if let Err(e) = self.agent_tgids.insert(&pid, &1, 0) {
            tracing::debug!(pid, error = %e, "cannot tell the kernel to skip an agent process");
        }
        true
    }

    fn forward(&mut self, ev: Event) -> bool {
        let pid = ev.pid();
        if self.ignored.contains(&pid) {
            match &ev {
                Event::ProcessExit { .. } => {
                    self.ignored.remove(&pid);
                }
                // Untrack its sockets in the kernel so their I/O costs no records.
                Event::Conn(c) => {
                    let _ = self.conns.remove(&ConnKey {
                        tgid: pid,
                        fd: c.conn.fd,
                    });
                }
                _ => {}
            }
            return true;
        }
        if let Event::ProcessExit { .. } = ev {
            // Exits of processes never traced are noise.
            let Some(fds) = self.seen.remove(&pid) else {
                return true;
            };
            // The kernel cannot iterate its map on exit; drop the dead process's entries here,
            // and report the requests it held for them: they will get no answer.
            for fd in fds {
                let key = ConnKey { tgid: pid, fd };
                let _ = self.conns.remove(&key);
                if let Ok(h) = self.held.get(&key, 0) {
                    let _ = self.held.remove(&key);
                    // What it counted and did not send goes as the kernel's close would, first.
                    if h.weight > 0 && !self.release_tally(h, ev.ts_ns()) {
                        return false;
                    }
                    // An entry that holds nothing is the connection's, kept for its next request.
                    if h.kind == KIND_SUMMARY && !self.release_held(&h) {
                        return false;
                    }
                }
            }
        } else if !self.seen.contains_key(&pid) {
            if self.is_ours(pid) {
                return self.forward(ev);
            }
            let info = self.describe(pid);
            self.seen.insert(pid, HashSet::default());
            if !self.send(Event::Process(info)) {
                return false;
            }
        }
        if let (Event::Conn(c), Some(fds)) = (&ev, self.seen.get_mut(&pid)) {
            match c.kind {
                ConnEventKind::Close => {
                    fds.remove(&c.conn.fd);
                }
                ConnEventKind::Connect { .. } | ConnEventKind::Accept | ConnEventKind::Existing => {
                    fds.insert(c.conn.fd);
                }
                _ => {}
            }
        }
        self.send(ev)
    }

    /// Reads a process's metadata; one already gone (no name) is described as the parent it was
    /// forked from, if known (short-lived pre-forked children), else named by its exit record.
    fn describe(&mut self, pid: u32) -> ProcessInfo {
        let parent = self.forked_from.remove(&pid);
        let mut info = procfs::process_info(&self.proc_root, pid);
        if let Some(parent) = parent {
            if info.comm.is_empty() {
                info = procfs::process_info(&self.proc_root, parent);
                info.pid = pid;
            } else if info.is_partial() {
                // A child that already exited is a zombie until reaped: its comm still reads,
                // its exe, cgroup and namespaces do not. A forked child shares them with its
                // parent, so take them from there instead of naming it as a host process.
                // (Only then: a pre-forking server forks a child per request.)
                info.fill_from(&procfs::process_info(&self.proc_root, parent));
            }
            info.parent = Some(parent);
        }
        if info.comm.is_empty() {
            self.nameless.insert(pid);
        } else {
            self.nameless.remove(&pid);
        }
        info
    }

    /// A held request as the record it would have been: the request's header and its bytes
    /// lie one after the other in the entry, a data record as it is. Returns false when the
    /// consumer is gone.
    fn release_held(&mut self, h: &SummaryRecord) -> bool {
        self.send_from(h, std::mem::offset_of!(SummaryRecord, request))
    }

    /// The tally of the quiet exchanges entry `h` counted, timed `now`, as the kernel sends one.
    /// Returns false when the consumer is gone.
    fn release_tally(&mut self, mut h: SummaryRecord, now: u64) -> bool {
        h.kind = KIND_TALLY;
        h.status = 0;
        h.response.ts_enter_ns = now;
        h.response.ts_exit_ns = now;
        self.send_from(&h, 0)
    }

    /// Decodes and sends entry `h`'s bytes from offset `at` to the end of its request's
    /// captured bytes (a decode error is counted). Returns false when the consumer is gone.
    fn send_from(&mut self, h: &SummaryRecord, at: usize) -> bool {
        let captured = usize::try_from(h.request.captured)
            .unwrap_or(usize::MAX)
            .min(h.bytes.len());
        // SAFETY: `SummaryRecord` is Pod (repr(C), no padding): its bytes are plain bytes.
        let all = unsafe {
            std::slice::from_raw_parts(
                (h as *const SummaryRecord).cast::<u8>(),
                size_of::<SummaryRecord>(),
            )
        };
        let raw = all.get(at..SUMMARY_HEAD + captured).unwrap_or_default();
        match decode::decode_in(raw, Some(&mut self.arena)) {
            Ok(ev) => self.send(ev),
            Err(_) => {
                self.stats.0.decode_errors.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    fn send(&mut self, ev: Event) -> bool {
        let f = self.tx.push(ev);
        self.count(f)
    }
}
