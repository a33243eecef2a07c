//! `retry-agent trace`: live events as JSON lines, one object per line, like tcpdump/bpftrace.
use std::{collections::HashMap, io::Write};

use anyhow::Context;
use clap::Args;

use super::{Capture, CaptureConfig, Event};

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
}

/// Which events `trace` prints. Pure, so the filter logic is tested without a kernel.
#[derive(Debug, Default)]
pub struct Filter {
    pids: Vec<u32>,
    ports: Vec<u16>,
    comms: Vec<String>,
    /// comm of each pid, learned from `Event::Process` (which always precedes a pid's events).
    comm_of: HashMap<u32, String>,
}

impl Filter {
    pub fn new(pids: Vec<u32>, ports: Vec<u16>, comms: Vec<String>) -> Self {
        Self { pids, ports, comms, comm_of: HashMap::new() }
    }

    pub fn accepts(&mut self, ev: &Event) -> bool {
        if let Event::Process(p) = ev {
            self.comm_of.insert(p.pid, p.comm.clone());
        }
        let pid = ev.pid();
        if !self.pids.is_empty() && !self.pids.contains(&pid) {
            return false;
        }
        if !self.comms.is_empty() {
            let comm = self.comm_of.get(&pid).map(String::as_str).unwrap_or("");
            if !self.comms.iter().any(|c| c == comm) {
                return false;
            }
        }
        if !self.ports.is_empty() {
            let tuple = match ev {
                Event::Data(d) => d.tuple,
                Event::Conn(c) => c.tuple,
                // Metadata and exits carry no port: shown when the pid/comm filters allow.
                Event::Process(_) | Event::ProcessExit { .. } => return true,
            };
            let Some(t) = tuple else { return false };
            if !self.ports.contains(&t.local.port()) && !self.ports.contains(&t.remote.port()) {
                return false;
            }
        }
        if let Event::ProcessExit { pid, .. } = ev {
            self.comm_of.remove(pid);
        }
        true
    }
}

pub async fn run(args: TraceArgs) -> anyhow::Result<()> {
    let mut capture = Capture::load(&args.capture).context("starting capture")?;
    let mut filter = Filter::new(args.pid, args.port, args.comm);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            ev = capture.events().recv() => {
                let Some(ev) = ev else { break };
                if !filter.accepts(&ev) {
                    continue;
                }
                serde_json::to_writer(&mut out, &ev).context("encoding event")?;
                if writeln!(out).and_then(|()| out.flush()).is_err() {
                    // stdout closed (e.g. piped into head): a normal way to stop.
                    break;
                }
            }
        }
    }
    let stats = capture.stats();
    tracing::info!(?stats, "trace stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::capture::{ConnId, DataEvent, Direction, ProcessInfo, Role, Syscall, Tuple};

    fn data(pid: u32, local: &str, remote: &str) -> Event {
        Event::Data(DataEvent {
            conn: ConnId { pid, fd: 3, generation: 1 },
            role: Role::Client,
            direction: Direction::Egress,
            syscall: Syscall::Write,
            tuple: Some(Tuple { local: local.parse().unwrap(), remote: remote.parse().unwrap() }),
            pid,
            tid: pid,
            goid: None,
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
        })
    }

    #[test]
    fn no_filters_accept_everything() {
        let mut f = Filter::default();
        assert!(f.accepts(&data(1, "127.0.0.1:1", "127.0.0.1:2")));
        assert!(f.accepts(&Event::ProcessExit { pid: 1, ts_ns: 0 }));
    }

    #[test]
    fn pid_port_and_comm_filters() {
        let mut f = Filter::new(vec![], vec![8080], vec![]);
        assert!(f.accepts(&data(1, "127.0.0.1:40000", "127.0.0.1:8080")));
        assert!(f.accepts(&data(1, "127.0.0.1:8080", "127.0.0.1:40000")));
        assert!(!f.accepts(&data(1, "127.0.0.1:40000", "127.0.0.1:9090")));

        let mut f = Filter::new(vec![7], vec![], vec![]);
        assert!(f.accepts(&data(7, "127.0.0.1:1", "127.0.0.1:2")));
        assert!(!f.accepts(&data(8, "127.0.0.1:1", "127.0.0.1:2")));

        let mut f = Filter::new(vec![], vec![], vec!["curl".into()]);
        assert!(f.accepts(&process(5, "curl")));
        assert!(!f.accepts(&process(6, "python3")));
        assert!(f.accepts(&data(5, "127.0.0.1:1", "127.0.0.1:2")));
        assert!(!f.accepts(&data(6, "127.0.0.1:1", "127.0.0.1:2")));
        assert!(!f.accepts(&data(9, "127.0.0.1:1", "127.0.0.1:2")), "unknown comm is not curl");
    }
}
