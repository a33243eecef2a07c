//! `retry-agent trace`: live events as JSON lines, one object per line, like tcpdump/bpftrace.
use std::{
    collections::HashMap,
    io::Write,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;

use crate::settings::InvalidConfig;
use crate::{
    capture::{Capture, CaptureConfig, Event, ProcessInfo, monotonic_ns},
    l7::{L7Config, Reassembler},
};

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub capture: CaptureConfig,
    /// Only events of these process ids (repeatable).
    #[arg(long)]
    pub pid: Vec<u32>,
    /// Only connections with this local or remote port (repeatable).
    #[arg(long)]
    pub port: Vec<u16>,
    /// Only processes whose command name (comm) is one of these (repeatable).
    #[arg(long)]
    pub comm: Vec<String>,
    /// Print reassembled HTTP exchanges instead of raw events.
    #[arg(long, conflicts_with = "count")]
    pub exchanges: bool,
    #[command(flatten)]
    pub l7: L7Config,
    /// Print nothing per event; on exit (Ctrl-C/SIGTERM) print the capture counters as one JSON
    /// object (benchmarks, health checks).
    #[arg(long)]
    pub count: bool,
    /// Print payloads as captured, credentials and bodies included (default: redacted as the
    /// flight recorder stores them).
    #[arg(long)]
    pub raw: bool,
}

/// Which events `trace` prints. Pure, so the filter logic is tested without a kernel.
///
/// `Event::Process` is held back until the first event of that pid passes the filters, so the
/// metadata line precedes exactly the processes that are shown.
#[derive(Debug, Default)]
pub struct Filter {
    pids: Vec<u32>,
    ports: Vec<u16>,
    comms: Vec<String>,
    /// Metadata of pids not shown yet.
    pending: HashMap<u32, ProcessInfo>,
    /// comm of pids already shown.
    shown: HashMap<u32, String>,
}

impl Filter {
    pub fn new(pids: Vec<u32>, ports: Vec<u16>, comms: Vec<String>) -> Self {
        Self {
            pids,
            ports,
            comms,
            ..Default::default()
        }
    }

    /// Appends to `out` what to print for `ev` (nothing, the event, or its process's metadata
    /// and then the event).
    pub fn admit(&mut self, ev: Event, out: &mut Vec<Event>) {
        let pid = ev.pid();
        match ev {
            Event::Process(p) => {
                self.shown.remove(&p.pid);
                self.pending.insert(p.pid, p);
            }
            Event::ProcessExit { .. } => {
                self.pending.remove(&pid);
                if self.shown.remove(&pid).is_some() {
                    out.push(ev);
                }
            }
            Event::Data(_) | Event::Conn(_) | Event::Summary(_) => {
                if !self.pids.is_empty() && !self.pids.contains(&pid) {
                    return;
                }
                if !self.comms.is_empty() {
                    let comm = self
                        .shown
                        .get(&pid)
                        .map(String::as_str)
                        .or_else(|| self.pending.get(&pid).map(|p| p.comm.as_str()))
                        .unwrap_or("");
                    if !self.comms.iter().any(|c| c == comm) {
                        return;
                    }
                }
                if !self.ports.is_empty() {
                    let Some(t) = ev.tuple() else { return };
                    if !self.ports.contains(&t.local.port())
                        && !self.ports.contains(&t.remote.port())
                    {
                        return;
                    }
                }
                if let Some(p) = self.pending.remove(&pid) {
                    self.shown.insert(pid, p.comm.clone());
                    out.push(Event::Process(p));
                }
                out.push(ev);
            }
        }
    }
}

pub async fn run(args: TraceArgs) -> anyhow::Result<()> {
    let mut problems = InvalidConfig::default();
    problems.add(&args.capture).add(&args.l7);
    problems.into_result()?;
    let mut capture = Capture::load(&args.capture).context("starting capture")?;
    let mut filter = Filter::new(args.pid, args.port, args.comm);
    let mut reassembler = args.exchanges.then(|| Reassembler::new(args.l7.clone()));
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let started = Instant::now();
    let (mut shown, mut exchanges) = (Vec::new(), Vec::new());
    let mut redactor = (!args.raw).then(crate::recorder::redact::Redactor::new);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                if let Some(r) = reassembler.as_mut() {
                    r.tick(monotonic_ns(), &mut exchanges);
                }
            }
            ev = capture.events().recv() => {
                let Some(ev) = ev else { break };
                if args.count {
                    continue;
                }
                filter.admit(ev, &mut shown);
                match reassembler.as_mut() {
                    Some(r) => shown.drain(..).for_each(|ev| r.push(&ev, &mut exchanges)),
                    None => {
                        for mut ev in shown.drain(..) {
                            match (redactor.as_mut(), &mut ev) {
                                (Some(r), Event::Data(d)) => {
                                    d.payload = crate::recorder::redact::redact_for_display(r, d);
                                }
                                (Some(r), Event::Summary(s)) => {
                                    s.request.payload =
                                        crate::recorder::redact::redact_for_display(r, &s.request);
                                }
                                _ => {}
                            }
                            serde_json::to_writer(&mut out, &ev).context("encoding event")?;
                            out.write_all(b"\n").ok();
                        }
                    }
                }
            }
        }
        for x in exchanges.drain(..) {
            serde_json::to_writer(&mut out, &x).context("encoding exchange")?;
            out.write_all(b"\n").ok();
        }
        if out.flush().is_err() {
            // stdout closed (e.g. piped into head): a normal way to stop.
            break;
        }
    }
    let stats = capture.stats();
    if args.count {
        let v = serde_json::json!({ "seconds": started.elapsed().as_secs_f64(), "stats": stats });
        writeln!(out, "{v}").ok();
        out.flush().ok();
    }
    tracing::info!(
        events = stats.events,
        kernel_drops = stats.kernel_drops,
        channel_drops = stats.channel_drops,
        decode_errors = stats.decode_errors,
        "trace stopped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use bytes::Bytes;

    use super::*;
    use crate::capture::{ConnId, DataEvent, Direction, ProcessInfo, Role, Syscall, Tuple};

    fn data(pid: u32, local: &str, remote: &str) -> Event {
        Event::Data(DataEvent {
            conn: ConnId {
                pid,
                fd: 3,
                generation: 1,
            },
            role: Role::Client,
            direction: Direction::Egress,
            syscall: Syscall::Write,
            tuple: Some(Tuple {
                local: local.parse().unwrap(),
                remote: remote.parse().unwrap(),
            }),
            pid,
            tid: pid,
            goid: None,
            interleaved: false,
            ts_enter_ns: 1,
            ts_exit_ns: 2,
            len: 1,
            payload: Bytes::from_static(b"x"),
        })
    }

    fn process(pid: u32, comm: &str) -> Event {
        Event::Process(ProcessInfo {
            pid,
            comm: comm.into(),
            exe: None,
            cgroup: None,
            container_id: None,
            netns: None,
            host_netns: None,
            workload: None,
            parent: None,
        })
    }

    fn admit(f: &mut Filter, ev: Event) -> Vec<Event> {
        let mut out = Vec::new();
        f.admit(ev, &mut out);
        out
    }

    #[test]
    fn no_filters_accept_everything_and_metadata_comes_first() {
        let mut f = Filter::default();
        assert!(admit(&mut f, process(1, "curl")).is_empty(), "held back");
        let out = admit(&mut f, data(1, "127.0.0.1:1", "127.0.0.1:2"));
        assert!(matches!(out.as_slice(), [Event::Process(p), Event::Data(_)] if p.pid == 1));
        assert_eq!(
            admit(&mut f, data(1, "127.0.0.1:1", "127.0.0.1:2")).len(),
            1,
            "metadata once"
        );
        assert_eq!(
            admit(&mut f, Event::ProcessExit { pid: 1, ts_ns: 0 }).len(),
            1
        );
        assert!(
            admit(&mut f, Event::ProcessExit { pid: 2, ts_ns: 0 }).is_empty(),
            "never shown"
        );
    }

    #[test]
    fn pid_port_and_comm_filters() {
        let mut f = Filter::new(vec![], vec![8080], vec![]);
        assert_eq!(
            admit(&mut f, data(1, "127.0.0.1:40000", "127.0.0.1:8080")).len(),
            1
        );
        assert_eq!(
            admit(&mut f, data(1, "127.0.0.1:8080", "127.0.0.1:40000")).len(),
            1
        );
        assert!(admit(&mut f, data(1, "127.0.0.1:40000", "127.0.0.1:9090")).is_empty());

        let mut f = Filter::new(vec![7], vec![], vec![]);
        assert_eq!(
            admit(&mut f, data(7, "127.0.0.1:1", "127.0.0.1:2")).len(),
            1
        );
        assert!(admit(&mut f, data(8, "127.0.0.1:1", "127.0.0.1:2")).is_empty());

        let mut f = Filter::new(vec![], vec![], vec!["curl".into()]);
        assert!(admit(&mut f, process(5, "curl")).is_empty());
        assert!(admit(&mut f, process(6, "python3")).is_empty());
        assert_eq!(
            admit(&mut f, data(5, "127.0.0.1:1", "127.0.0.1:2")).len(),
            2
        );
        assert!(admit(&mut f, data(6, "127.0.0.1:1", "127.0.0.1:2")).is_empty());
        assert!(
            admit(&mut f, data(9, "127.0.0.1:1", "127.0.0.1:2")).is_empty(),
            "unknown comm is not curl"
        );
        assert!(admit(&mut f, Event::ProcessExit { pid: 6, ts_ns: 0 }).is_empty());
    }
}
