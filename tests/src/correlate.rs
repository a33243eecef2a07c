//! Helpers for the correlation end-to-end tests (tests/tests/correlate.rs): the client → A → B
//! chain's peers are fixtures (`chain_service_{a,b}.py`, `*_client.py`, `event_loop_server.js`);
//! what the agent derives from the captured events comes from the live `Pipeline`, the one
//! l7 → correlate → decide driver `retry-agent run` and forensics use.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::collections::HashMap;

use retry_agent::{
    capture::Event,
    correlate::{CorrelateConfig, Engine, Verdict},
    decide::DecideConfig,
    l7::{Exchange, ExchangeId, L7Config},
    pipeline::{Pipeline, StageOutput},
};

/// What the agent derived from a capture.
pub struct Derived {
    pub exchanges: HashMap<ExchangeId, Exchange>,
    pub verdicts: Vec<Verdict>,
    pub engine: Engine,
}

/// Runs `client` (a program printing `done` last) while collecting the events of `pids` and
/// the client; returns the events and the client's lines.
pub async fn capture_while(
    cap: &mut retry_agent::capture::Capture,
    client: crate::fixture::Proc,
    pids: &[u32],
) -> (Vec<Event>, Vec<String>) {
    let mut pids = pids.to_vec();
    pids.push(client.pid());
    let collecting = crate::fixture::collect(
        cap,
        std::time::Duration::from_secs(8),
        move |e: &Event| pids.contains(&e.pid()),
        |_| false,
    );
    let waiter = tokio::task::spawn_blocking(move || {
        // One reader for the whole output: lines arriving together must not be lost.
        let mut client = client;
        let lines: Vec<String> = client
            .output_lines()
            .into_iter()
            .take_while(|l| l != "done")
            .collect();
        drop(client);
        lines
    });
    let events = collecting.await;
    let lines = waiter.await.unwrap_or_default();
    (events, lines)
}

/// Events (kernel order) through the live pipeline, then everything pending judged.
/// `cfg` with these processes named (`pid:N=name` overrides), so verdicts read by name.
pub fn named(mut cfg: CorrelateConfig, names: &[(u32, &str)]) -> CorrelateConfig {
    for (pid, name) in names {
        cfg.service_names
            .push(format!("pid:{pid}={name}").parse().expect("override"));
    }
    cfg
}

pub fn derive(events: &[Event], cfg: CorrelateConfig) -> Derived {
    let mut pipeline = Pipeline::new(L7Config::default(), cfg, DecideConfig::default());
    let mut out = StageOutput::default();
    for ev in events {
        pipeline.push(ev, &mut out);
    }
    // Close what is still open a second after the last event (not at the end of time: the
    // engine's window follows capture time), complete the current statistics bucket, and judge
    // what is still pending, as the live loop's idle timer and shutdown do.
    let last = events.iter().map(Event::ts_ns).max().unwrap_or(0);
    pipeline.tick(last + 1_000_000_000, &mut out);
    pipeline.finish(&mut out);
    let exchanges = out.exchanges.drain(..).map(|x| (x.id, x)).collect();
    Derived {
        exchanges,
        verdicts: out.verdicts,
        engine: pipeline.engine,
    }
}
