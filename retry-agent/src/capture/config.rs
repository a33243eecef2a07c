//! `--capture-*`: what the capture loads, attaches and reads, as typed settings, and their
//! checks.
use std::path::PathBuf;

use retry_common::MAX_PAYLOAD;

use super::{Scope, ScopeError};
use crate::settings::{InvalidConfig, Settings};

/// `--capture-go`: the Go uprobes always, never, or where a uprobe is cheap enough.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoMode {
    /// On when one uprobe hit costs at most `--capture-go-max-uprobe-us` here.
    Auto,
    #[value(name = "true")]
    On,
    #[value(name = "false")]
    Off,
}

/// Capture settings (`--capture-*`).
#[derive(clap::Args, Debug, Clone)]
pub struct CaptureConfig {
    /// Kernel ring buffer size in bytes (a power of two, at least one page; default: derived
    /// from --memory-budget-mib).
    #[arg(long = "capture-ring-bytes", alias = "ring-bytes", env = "RETRY_AGENT_CAPTURE_RING_BYTES", default_value_t = 4 << 20)]
    pub ring_bytes: u32,
    /// Payload prefix captured per syscall, in bytes (at most 4096).
    #[arg(long = "capture-payload-bytes", alias = "payload-bytes", env = "RETRY_AGENT_CAPTURE_PAYLOAD_BYTES", default_value_t = retry_common::DEFAULT_PAYLOAD)]
    pub payload_bytes: u32,
    /// Payload prefix captured per syscall of a response (a server's writes, a client's reads;
    /// HTTP/2 connections keep their own), in bytes (at most 4096; default: as
    /// --capture-payload-bytes). Past its head a response's bytes only frame it: a node serving
    /// large responses can lower this (256 with nginx serving 1 KiB files: eBPF time per request
    /// -17 to -33%, agent CPU -16 to -29%) at the price of response headers beyond it
    /// (content-length, x-error-claim), whose loss leaves that response unframed.
    #[arg(
        long = "capture-response-bytes",
        env = "RETRY_AGENT_CAPTURE_RESPONSE_BYTES"
    )]
    pub response_bytes: Option<u32>,
    /// Threads that can be inside a traced syscall at once, per kind (data, connect, accept, SSL
    /// call): the size of the kernel's per-thread argument maps. A thread beyond it goes
    /// unrecorded for that call and is counted (`retry_agent_capture_arg_insert_failures_total`).
    #[arg(
        long = "capture-arg-map-entries",
        env = "RETRY_AGENT_CAPTURE_ARG_MAP_ENTRIES",
        default_value_t = 16384
    )]
    pub arg_map_entries: u32,
    /// Capacity of the channel between the ring reader and the pipeline, in events (default:
    /// derived from --memory-budget-mib).
    #[arg(
        long = "capture-channel-capacity",
        alias = "channel-capacity",
        env = "RETRY_AGENT_CAPTURE_CHANNEL_CAPACITY",
        default_value_t = 1675
    )]
    pub channel_capacity: usize,
    /// Where to read process metadata and pre-existing connections.
    #[arg(
        long = "capture-proc-root",
        alias = "proc-root",
        env = "RETRY_AGENT_CAPTURE_PROC_ROOT",
        default_value = "/proc"
    )]
    pub proc_root: PathBuf,
    /// The kernel wakes the ring reader each time another this many bytes wait (0: on every
    /// record, which costs an interrupt per syscall); below that the reader polls.
    #[arg(long = "capture-ring-wakeup-bytes", alias = "wakeup-bytes", env = "RETRY_AGENT_CAPTURE_RING_WAKEUP_BYTES", default_value_t = 256 << 10)]
    pub wakeup_bytes: u32,
    /// How often the reader looks at the ring without a wakeup, in milliseconds (the most a
    /// record waits when traffic is light).
    #[arg(
        long = "capture-ring-poll-ms",
        alias = "poll-ms",
        env = "RETRY_AGENT_CAPTURE_RING_POLL_MS",
        default_value_t = 10
    )]
    pub poll_ms: u64,
    /// Read TLS plaintext with uprobes on the shared OpenSSL (libssl) processes map. Off by
    /// default: every SSL_read/SSL_write then takes two uprobe traps in the calling process
    /// (`cargo xtask bench capture --tls`: a 100k req/s TLS loop on loopback ran at 0.11x with
    /// them, 0.5x with the syscall tracepoints alone); turn it on where TLS calls are not that hot.
    #[arg(long = "capture-tls", alias = "tls", env = "RETRY_AGENT_CAPTURE_TLS", default_value_t = false, action = clap::ArgAction::Set)]
    pub tls: bool,
    /// libssl files to instrument (repeatable, or comma-separated in the env var); default: the
    /// distribution's usual locations that exist.
    #[arg(
        long = "capture-tls-lib",
        alias = "tls-lib",
        env = "RETRY_AGENT_CAPTURE_TLS_LIB",
        value_delimiter = ','
    )]
    pub tls_libs: Vec<PathBuf>,
    /// How often to look for libssl files new processes map (new pods' images), in seconds
    /// (0: only at start).
    #[arg(
        long = "capture-tls-rescan-secs",
        alias = "tls-rescan-secs",
        env = "RETRY_AGENT_CAPTURE_TLS_RESCAN_SECS",
        default_value_t = 30
    )]
    pub tls_rescan_secs: u64,
    /// Link a Go program's outbound HTTP calls to the inbound request they serve with uprobes on
    /// net/http and the Go scheduler (goroutine ancestry), in every Go executable the node runs.
    /// `auto`: on where a uprobe hit is cheap (measured at start; a Go service takes several per
    /// request), off with a warning where it is not (some virtual machines: 15+ µs a hit).
    #[arg(long = "capture-go", env = "RETRY_AGENT_CAPTURE_GO", value_enum, default_value_t = GoMode::Auto)]
    pub go: GoMode,
    /// With `--capture-go auto`: the most one uprobe hit may cost on this node, in µs, for the Go
    /// uprobes to attach.
    #[arg(
        long = "capture-go-max-uprobe-us",
        env = "RETRY_AGENT_CAPTURE_GO_MAX_UPROBE_US",
        default_value_t = 5
    )]
    pub go_max_uprobe_us: u64,
    /// How often to look for new Go executables among the node's processes, in milliseconds.
    #[arg(
        long = "capture-go-rescan-ms",
        env = "RETRY_AGENT_CAPTURE_GO_RESCAN_MS",
        default_value_t = 1000
    )]
    pub go_rescan_ms: u64,
    /// Observe only processes inside these cgroup v2 subtrees (repeatable, or comma-separated
    /// in the env var): directories of the unified mount, e.g. /sys/fs/cgroup/kubepods.slice.
    /// Default: the whole machine. Checked in the kernel at connect/accept.
    #[arg(
        long = "capture-cgroup",
        env = "RETRY_AGENT_CAPTURE_CGROUP",
        value_delimiter = ','
    )]
    pub cgroups: Vec<PathBuf>,
    /// Observe only processes in these network namespaces (repeatable, or comma-separated in
    /// the env var): an inode as /proc/PID/ns/net shows it (4026532281 or net:[4026532281]) or
    /// a namespace file (/run/netns/NAME). With --capture-cgroup too, a process must be in both.
    #[arg(
        long = "capture-netns",
        env = "RETRY_AGENT_CAPTURE_NETNS",
        value_delimiter = ','
    )]
    pub netns: Vec<String>,
    /// Send a quiet HTTP/1 exchange from the kernel as one summary record (its request as
    /// held, up to 512 bytes with its headers, the response's status and times) instead of its
    /// request's and response's bytes: the kernel holds each request back until its response's
    /// status line, and sends both whole when the answer is a failure, when the answering
    /// thread saw one of its own calls fail, or when the client called a destination that
    /// failed recently (--capture-summary-hot-secs). Summarised exchanges carry no response
    /// headers and no response size past its first write; `false` reads every exchange whole.
    #[arg(long = "capture-summarize", env = "RETRY_AGENT_CAPTURE_SUMMARIZE", default_value_t = true, action = clap::ArgAction::Set)]
    pub summarize: bool,
    /// With --capture-summarize: one summarisable request in this many is sent whole anyway
    /// (0: none), so whole heads keep a sample.
    #[arg(
        long = "capture-summary-sample",
        env = "RETRY_AGENT_CAPTURE_SUMMARY_SAMPLE",
        default_value_t = 64
    )]
    pub summary_sample: u32,
    /// With --capture-summarize: how long, in seconds, a destination that answered a client on
    /// this node with a failure or a reset has its exchanges sent whole (retries and what they
    /// met are seen).
    #[arg(
        long = "capture-summary-hot-secs",
        env = "RETRY_AGENT_CAPTURE_SUMMARY_HOT_SECS",
        default_value_t = 30
    )]
    pub summary_hot_secs: u64,
    /// With --capture-summarize: a connection's quiet exchanges leave the kernel as one summary
    /// in this many, weighted with those counted and not sent before it (which go as a count
    /// before anything else of the connection: a close, a failure, a request sent whole), so
    /// every figure keeps its counts while the agent reads one exchange in N of a busy
    /// keep-alive connection. Only within --capture-summary-window-ms of the connection's last
    /// record: a slow connection's exchanges each go. 1: each quiet exchange goes.
    #[arg(
        long = "capture-summary-every",
        env = "RETRY_AGENT_CAPTURE_SUMMARY_EVERY",
        default_value_t = 16,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub summary_every: u16,
    /// With --capture-summary-every: how long, in milliseconds, after a connection's last
    /// record its quiet exchanges may be counted instead of sent (how late a count may come on
    /// a connection that goes on working).
    #[arg(
        long = "capture-summary-window-ms",
        env = "RETRY_AGENT_CAPTURE_SUMMARY_WINDOW_MS",
        default_value_t = 100
    )]
    pub summary_window_ms: u64,
}

impl CaptureConfig {
    /// The payload prefix of a response's records (`--capture-response-bytes`, else the
    /// payload prefix).
    pub fn response_prefix(&self) -> u32 {
        self.response_bytes.unwrap_or(self.payload_bytes)
    }

    /// The largest payload prefix one record carries outside HTTP/2 (what an event costs).
    pub fn largest_prefix(&self) -> u32 {
        self.payload_bytes.max(self.response_prefix())
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

impl Settings for CaptureConfig {
    fn check(&self, p: &mut InvalidConfig) {
        let ring = self.ring_bytes;
        p.check(
            ring.is_power_of_two() && ring >= 4096,
            "capture-ring-bytes",
            ring,
            "a power of two ≥ 4096",
        );
        let payload = self.payload_bytes;
        p.check(
            payload as usize <= MAX_PAYLOAD,
            "capture-payload-bytes",
            payload,
            "at most 4096",
        );
        if let Some(response) = self.response_bytes {
            p.check(
                response as usize <= MAX_PAYLOAD,
                "capture-response-bytes",
                response,
                "at most 4096",
            );
        }
        p.check(
            (1..=1000).contains(&self.poll_ms),
            "capture-ring-poll-ms",
            self.poll_ms,
            "in 1..=1000",
        );
        p.check(
            self.arg_map_entries > 0,
            "capture-arg-map-entries",
            self.arg_map_entries,
            "at least 1",
        );
        p.check(
            self.channel_capacity > 0,
            "capture-channel-capacity",
            self.channel_capacity,
            "at least 1",
        );
        p.check(
            self.go == GoMode::Off || self.go_rescan_ms > 0,
            "capture-go-rescan-ms",
            self.go_rescan_ms,
            "at least 1",
        );
        if let Err(errors) = Scope::resolve(&self.cgroups, &self.netns) {
            for e in errors {
                let flag = match e {
                    ScopeError::Cgroup { .. } => "capture-cgroup",
                    ScopeError::Netns { .. } => "capture-netns",
                };
                p.check(
                    false,
                    flag,
                    e,
                    "an existing cgroup v2 directory or network namespace",
                );
            }
        }
    }
}
