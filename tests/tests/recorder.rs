//! Flight recorder end to end: `cargo test -p integration-tests --test recorder` (as root for the
//! real-traffic test; the others run anywhere).
//!
//! - real traffic (capture loaded in-process, a Python caller → front → backend chain on loopback
//!   with secrets in the headers): the live pipeline records, a dump is asked for over the HTTP
//!   route, and its replay yields the same exchanges, verdicts, edge figures and decisions;
//! - the dump route on the agent's private socket + `retry-agent dump` client (refused over TCP),
//!   and SIGUSR1;
//! - 50 parallel dump requests: single flight, rate limit, retention cap.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{os::unix::fs::PermissionsExt, process::Stdio, time::Duration};

use integration_tests::{
    fixture::{Proc, can_run, collect, free_port, load, python, python_server, wait_listening},
    recorder::{TempDir, serve_dump_api},
};
use retry_agent::{
    capture::Event,
    correlate::CorrelateConfig,
    decide::DecideConfig,
    l7::L7Config,
    pipeline::{Pipeline, Record, StageOutput},
    recorder::{
        DumpReader, DumpReason, Recorder, RecorderConfig, SharedRecorder, client::request_dump,
        replay, spawn_sigusr1_dumps,
    },
    testkit::StormScenario,
};

fn recorder(dir: &TempDir) -> SharedRecorder {
    let cfg = RecorderConfig {
        dump_dir: dir.0.clone(),
        auto_dump: false,
        ..RecorderConfig::default()
    };
    SharedRecorder::new(Recorder::new(cfg).expect("recorder"))
}

fn pipeline() -> Pipeline {
    Pipeline::new(
        L7Config::default(),
        CorrelateConfig::default(),
        DecideConfig::default(),
    )
}

fn assert_no_secret(raw: &[u8], records: &[Record]) {
    let mut all = raw.to_vec();
    for r in records {
        if let Record::Event(Event::Data(d)) = r {
            all.extend_from_slice(&d.payload);
        }
    }
    all.extend(serde_json::to_vec(records).unwrap_or_default());
    let text = String::from_utf8_lossy(&all);
    assert!(!text.contains("SECRET"), "a secret reached the dump");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_route_client_and_sigusr1() {
    let dir = TempDir::new("api");
    let rec = recorder(&dir);
    let mut p = pipeline().with_tap(rec.clone());
    let mut out = StageOutput::default();
    for ev in (StormScenario {
        requests: 300,
        fault: 100..200,
        ..Default::default()
    })
    .events()
    {
        p.push(&ev, &mut out);
    }
    let api = serve_dump_api(rec.clone(), &dir.0, dir.0.clone(), Duration::ZERO, 20)
        .await
        .expect("serve");
    let path = request_dump(
        &api.url(),
        Some("integration".into()),
        Duration::from_secs(30),
    )
    .await
    .expect("dump over the API");
    let meta = std::fs::metadata(&path).expect("dump file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let raw = std::fs::read(&path).expect("read");
    let dump = DumpReader::read(&raw).expect("parse");
    assert!(dump.loss.is_clean(), "{}", dump.loss);
    assert_eq!(
        dump.header.as_ref().map(|h| h.reason.clone()),
        Some(DumpReason::Other("integration".into()))
    );
    let events = dump
        .records
        .iter()
        .filter(|r| matches!(r, Record::Event(_)))
        .count();
    assert!(events > 3000, "{events} events");
    assert_no_secret(&raw, &dump.records);

    // Over TCP (no authentication) the agent does not serve dumps: an error the client reports.
    let err = request_dump(
        &format!("http://{}", api.public),
        None,
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    drop(api);

    // SIGUSR1: the handler is installed before the signal is sent.
    let sig = spawn_sigusr1_dumps(rec.clone()).expect("signal handler");
    let dumps = || {
        std::fs::read_dir(&dir.0)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "radump"))
                    .count()
            })
            .unwrap_or(0)
    };
    let before = dumps();
    let status = std::process::Command::new("kill")
        .args(["-USR1", &std::process::id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let mut found = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        found = std::fs::read_dir(&dir.0).ok().and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.to_string_lossy().contains("-signal")
                    && p.extension().is_some_and(|e| e == "radump")
            })
        });
        if found.is_some() {
            break;
        }
    }
    sig.abort();
    let found = found.expect("no dump after SIGUSR1");
    assert_eq!(dumps(), before + 1);
    let d = DumpReader::open(&found).expect("signal dump");
    assert_eq!(d.header.map(|h| h.reason), Some(DumpReason::Signal));
}

/// 50 parallel dump requests: one dump at a time (the others refused at once with 409, or 429
/// inside the rate limit), and the dump directory stays under its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_dumps_are_single_flight_rate_limited_and_capped() {
    let dir = TempDir::new("parallel");
    let rec = recorder(&dir);
    let mut p = pipeline().with_tap(rec.clone());
    let mut out = StageOutput::default();
    for ev in (StormScenario {
        requests: 300,
        fault: 100..200,
        ..Default::default()
    })
    .events()
    {
        p.push(&ev, &mut out);
    }
    let radumps = || {
        std::fs::read_dir(&dir.0)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "radump"))
                    .count()
            })
            .unwrap_or(0)
    };
    let burst = |url: String| async move {
        let reqs = (0..50).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { request_dump(&url, None, Duration::from_secs(30)).await })
        });
        let mut ok = 0;
        let mut statuses = Vec::new();
        for r in futures_join(reqs.collect()).await {
            match r {
                Ok(_) => ok += 1,
                Err(retry_agent::recorder::client::ClientError::Agent { status, .. }) => {
                    statuses.push(status)
                }
                Err(e) => panic!("unexpected client error: {e}"),
            }
        }
        (ok, statuses)
    };

    // A long rate limit: exactly one of 50 is written; every other one is refused, none fails.
    let api = serve_dump_api(
        rec.clone(),
        &dir.0,
        dir.0.clone(),
        Duration::from_secs(3600),
        3,
    )
    .await
    .expect("serve");
    let (ok, refused) = burst(api.url()).await;
    assert_eq!(ok, 1, "one dump of 50 ({refused:?})");
    assert_eq!(refused.len(), 49);
    assert!(
        refused.iter().all(|s| *s == 409 || *s == 429),
        "{refused:?}"
    );
    assert_eq!(radumps(), 1);
    drop(api);

    // No rate limit, a cap of 3: bursts until more than 3 dumps were written; concurrent ones
    // are refused with 409 and the directory never holds more than 3.
    let api = serve_dump_api(rec.clone(), &dir.0, dir.0.clone(), Duration::ZERO, 3)
        .await
        .expect("serve");
    let mut written = 1;
    for _ in 0..20 {
        let (ok, refused) = burst(api.url()).await;
        assert!(ok >= 1, "a burst writes at least one dump");
        assert!(refused.iter().all(|s| *s == 409), "{refused:?}");
        written += ok;
        assert!(radumps() <= 3, "{} dumps kept", radumps());
        if written > 5 {
            break;
        }
    }
    assert!(written > 5, "only {written} dumps written");
    assert_eq!(radumps(), 3);
}

async fn futures_join<T>(hs: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(hs.len());
    for h in hs {
        out.push(h.await.expect("request task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_traffic_dump_replays_to_the_live_results() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (backend, bp) = python_server("secret_backend.py", &[]);
    let (front, fp) = python_server("retrying_front.py", &[&bp.to_string()]);
    let n = 60;
    let mut client = Proc::spawn(&mut python(
        "secret_client.py",
        &[&fp.to_string(), &n.to_string()],
    ));
    assert!(
        client.wait(Duration::from_secs(60)).success(),
        "client failed"
    );
    let pids = [backend.pid(), front.pid(), client.pid()];
    let events = collect(
        &mut cap,
        Duration::from_secs(3),
        |e| pids.contains(&e.pid()),
        |_| false,
    )
    .await;
    assert!(
        events.len() > n * 4,
        "only {} events captured",
        events.len()
    );

    // The live pipeline, as `retry-agent run` drives it, with the recorder tapping it.
    let dir = TempDir::new("live");
    let rec = recorder(&dir);
    let mut live = pipeline().with_tap(rec.clone());
    let mut out = StageOutput::default();
    for ev in &events {
        live.push(ev, &mut out);
    }
    let last = events.iter().map(Event::ts_ns).max().unwrap_or(0);
    live.tick(last + 2_000_000_000, &mut out);

    let api = serve_dump_api(rec.clone(), &dir.0, dir.0.clone(), Duration::ZERO, 20)
        .await
        .expect("serve");
    let path = request_dump(&api.url(), None, Duration::from_secs(30))
        .await
        .expect("dump");
    drop(api);
    let raw = std::fs::read(&path).expect("read dump");
    if let Some(keep) = std::env::var_os("RA_RECORDER_KEEP_DUMP") {
        // For looking at `retry-agent forensics` output on real traffic by hand.
        let _ = std::fs::write(keep, &raw);
    }
    let dump = DumpReader::read(&raw).expect("parse dump");
    assert!(dump.loss.is_clean(), "{}", dump.loss);
    assert_no_secret(&raw, &dump.records);

    let mut fresh = pipeline();
    let rep = replay(&mut fresh, &dump.records);
    eprintln!(
        "live: {} events → {} exchanges, {} verdicts, {} snapshots, {} decisions",
        events.len(),
        out.exchanges.len(),
        out.verdicts.len(),
        out.snapshots.len(),
        out.decisions.len()
    );
    assert!(
        out.exchanges.len() >= n * 2,
        "live pipeline saw {} exchanges",
        out.exchanges.len()
    );
    assert_eq!(rep.events, events.len() as u64);
    // Exactly: the replay restores the keyed query and body digests the live run recorded.
    assert_eq!(rep.exchanges, out.exchanges, "exchanges differ");
    assert_eq!(rep.verdicts, out.verdicts, "verdicts differ");
    assert_eq!(rep.snapshots, out.snapshots, "edge figures differ");
    assert_eq!(rep.decisions, out.decisions, "decisions differ");
}

/// The forensics promise on real traffic: 50 requests with distinct query strings (one length),
/// distinct bodies and a few real retries, eight at a time. The dump holds no secret and its
/// replay equals the live run: the same exchanges (digests included), retries, figures and
/// decisions. (Query strings masked before recording once made distinct requests replay as
/// retries of each other: 8 retries and an over-budget decision that never happened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_queries_bodies_and_concurrency_replay_to_the_live_run() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let bp = free_port();
    let backend =
        Proc::spawn(python("distinct_backend.py", &[&bp.to_string()]).stdout(Stdio::null()));
    wait_listening(&format!("127.0.0.1:{bp}"), None);
    let n = 50;
    let mut client = Proc::spawn(&mut python(
        "distinct_client.py",
        &[&bp.to_string(), &n.to_string()],
    ));
    assert!(
        client.wait(Duration::from_secs(60)).success(),
        "client failed"
    );
    let pids = [backend.pid(), client.pid()];
    let events = collect(
        &mut cap,
        Duration::from_secs(3),
        |e| pids.contains(&e.pid()),
        |_| false,
    )
    .await;

    let dir = TempDir::new("distinct");
    let rec = recorder(&dir);
    let mut live = pipeline().with_tap(rec.clone());
    let mut out = StageOutput::default();
    for ev in &events {
        live.push(ev, &mut out);
    }
    let last = events.iter().map(Event::ts_ns).max().unwrap_or(0);
    live.tick(last + 2_000_000_000, &mut out);
    let path = rec
        .with(|r| r.dump(DumpReason::OnDemand))
        .expect("recorder")
        .expect("dump");
    let raw = std::fs::read(&path).expect("read dump");
    let dump = DumpReader::read(&raw).expect("parse dump");
    assert!(dump.loss.is_clean(), "{}", dump.loss);
    assert_no_secret(&raw, &dump.records);

    let client_side: Vec<_> = out
        .exchanges
        .iter()
        .filter(|x| x.pid == client.pid())
        .collect();
    assert!(
        client_side.len() >= n,
        "live pipeline saw {} client exchanges",
        client_side.len()
    );
    let queries: std::collections::HashSet<_> =
        client_side.iter().filter_map(|x| x.query_hash).collect();
    assert!(
        queries.len() >= n,
        "distinct queries have distinct digests: {}",
        queries.len()
    );
    // Retries in the window, as the edge figures count them (5 real ones at most).
    let retried = out
        .snapshots
        .iter()
        .map(|s| s.edges.iter().map(|e| e.retries).sum::<u64>())
        .max()
        .unwrap_or(0);
    let mut fresh = pipeline();
    let rep = replay(&mut fresh, &dump.records);
    eprintln!(
        "live: {} events → {} exchanges, {} retries, {} decisions; replay restored {} digests",
        events.len(),
        out.exchanges.len(),
        retried,
        out.decisions.len(),
        rep.digests_restored
    );
    assert!(
        retried <= 5,
        "live retries are the real ones only: {retried}"
    );
    assert_eq!(rep.exchanges, out.exchanges, "exchanges differ");
    assert_eq!(rep.verdicts, out.verdicts, "verdicts differ");
    assert_eq!(rep.snapshots, out.snapshots, "edge figures differ");
    assert_eq!(rep.decisions, out.decisions, "decisions differ");
}
