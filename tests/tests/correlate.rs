//! Error ownership end to end on the real capture layer: `cargo test -p integration-tests
//! --test correlate` as root.
//!
//! client → A → B, small Python servers on loopback ports. When B fails, B owns its errors
//! (claimed) and A's failures are symptoms (unclaimed, explained by B's failures); when A fails
//! on its own (its call to B succeeded), A's failures are claimed.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{process::Stdio, time::Duration};

use integration_tests::{
    correlate::{Derived, capture_while, derive, named},
    fixture::{
        Proc, Ready, can_run, collect, load, load_summarizing, load_whole, node, python,
        python_server, serve,
    },
};
use retry_agent::{
    capture::{Event, Role},
    correlate::{CorrelateConfig, Verdict},
    decide::{DecideConfig, Decider, Reason},
    l7::Claim,
};

/// The chain's run: A and B serve, urllib asks A for a warm-up, `/chain/1..6`, `/own/1..6` and
/// `extra`; the events of the three processes and the client's lines.
struct ChainRun {
    a: Proc,
    b: Proc,
    events: Vec<Event>,
    lines: Vec<String>,
}

async fn run_chain(cap: &mut retry_agent::capture::Capture, extra: &[String]) -> ChainRun {
    let (b, pb) = python_server("chain_service_b.py", &[]);
    let (a, pa) = python_server("chain_service_a.py", &[&pb.to_string()]);
    // A warm-up request first: the capture may still be settling on the first connection.
    let mut paths = vec!["/warmup".to_string()];
    paths.extend((1..=6).map(|i| format!("/chain/{i}")));
    paths.extend((1..=6).map(|i| format!("/own/{i}")));
    paths.extend(extra.iter().cloned());
    let mut args = vec![pa.to_string()];
    args.extend(paths.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = Proc::spawn(python("urllib_client.py", &args).stdout(Stdio::piped()));
    let (events, lines) = capture_while(cap, client, &[a.pid(), b.pid()]).await;
    assert_eq!(
        lines.len(),
        paths.len(),
        "the client logged every request: {lines:?}"
    );
    ChainRun {
        a,
        b,
        events,
        lines,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_owner_claims_and_symptoms_are_unclaimed() {
    if !can_run() {
        return;
    }
    // Every exchange whole: the summarised run is the next test's.
    let Some(mut cap) = load_whole() else { return };
    check_chain(&run_chain(&mut cap, &[]).await, 0);
}

/// The same chain with `--capture-summarize`: the quiet exchanges (the warm-up, B's answers to
/// `/ok/`) leave the kernel as summaries, every failure and what it passed through whole,
/// and the verdicts and edge figures are those of the whole capture. `/swallow/7..9`: A calls
/// B's `/fail/` once and answers 200 anyway — its answer follows its own call's failure, so the
/// kernel sends it whole too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_verdicts_are_the_same_from_kernel_summaries() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load_summarizing() else {
        return;
    };
    let swallow: Vec<String> = (7..=9).map(|i| format!("/swallow/{i}")).collect();
    let run = run_chain(&mut cap, &swallow).await;
    let summarised: Vec<(u32, String, u16)> = run
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Summary(s) => Some((
                s.request.pid,
                String::from_utf8_lossy(&s.request.payload).into_owned(),
                s.status,
            )),
            _ => None,
        })
        .collect();
    eprintln!("summaries: {summarised:?}");
    let count = |pid: u32, path: &str| {
        summarised
            .iter()
            .filter(|(p, line, _)| *p == pid && line.contains(path))
            .count()
    };
    let (a, b) = (run.a.pid(), run.b.pid());
    // A's six calls to B's /ok/ from B's end; from A's they went whole, as B had answered A
    // with failures just before (a hot destination: what A sends it may be retries). The
    // warm-up from A's end and the client's.
    assert_eq!(count(b, " /ok/"), 6, "{summarised:?}");
    assert_eq!(count(a, " /ok/"), 0, "{summarised:?}");
    assert_eq!(count(a, " /warmup "), 1, "{summarised:?}");
    assert!(summarised.iter().all(|(_, _, st)| (200..400).contains(st)));
    for failing in ["/fail/", "/chain/", "/own/", "/swallow/"] {
        assert!(
            summarised
                .iter()
                .all(|(_, line, _)| !line.contains(failing)),
            "{failing} went whole: {summarised:?}"
        );
    }
    let d = check_chain(&run, swallow.len());
    // A's fail-open answers were read whole: their requests' own bytes reached l7.
    let swallowed = d
        .exchanges
        .values()
        .filter(|x| {
            x.pid == a
                && x.role == Role::Server
                && x.path
                    .as_deref()
                    .is_some_and(|p| p.starts_with("/swallow/"))
        })
        .collect::<Vec<_>>();
    assert_eq!(swallowed.len(), 3, "{swallowed:?}");
    assert!(swallowed.iter().all(|x| x.status == Some(200)));
}

/// What the chain must give, whole or summarised: B owns its failures, A's chained ones are
/// symptoms, A's own are claimed, and the edge figures count every request (`swallowed`: the
/// run's extra `/swallow/` requests, each one more failed call from A to B).
fn check_chain(run: &ChainRun, swallowed: usize) -> Derived {
    let ChainRun {
        a,
        b,
        events,
        lines,
    } = run;
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("/chain/"))
            .all(|l| l.ends_with(" 502")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("/own/"))
            .all(|l| l.ends_with(" 500")),
        "{lines:?}"
    );

    let cfg = named(
        CorrelateConfig::default(),
        &[(a.pid(), "svc-a"), (b.pid(), "svc-b")],
    );
    let d = derive(events, cfg);
    let path_of = |v: &retry_agent::correlate::Verdict| {
        d.exchanges
            .get(&v.exchange)
            .and_then(|x| x.path.clone())
            .unwrap_or_default()
    };
    let server_exchanges = |pid: u32| {
        d.exchanges
            .values()
            .filter(move |x| x.pid == pid && x.role == Role::Server)
            .count()
    };
    eprintln!(
        "exchanges: A served {}, B served {}",
        server_exchanges(a.pid()),
        server_exchanges(b.pid())
    );
    for v in &d.verdicts {
        eprintln!(
            "verdict {} {} {:?} caller {:?} caused_by {:?}",
            v.service,
            path_of(v),
            v.claim,
            v.caller,
            v.caused_by
        );
    }
    let mut xs: Vec<_> = d.exchanges.values().filter(|x| x.pid == a.pid()).collect();
    xs.sort_by_key(|x| x.request_start_ns);
    for x in xs {
        eprintln!(
            "A {:?} {:?} {:?} → {:?} tid {} rtid {:?} {:?} {:?} {:?} {}..{} rs {:?} re {}",
            x.id,
            x.role,
            x.local,
            x.remote,
            x.tid,
            x.response_tid,
            x.path,
            x.status,
            x.failure,
            x.request_start_ns,
            x.end_ns(),
            x.response_start_ns,
            x.request_end_ns
        );
    }

    // B failed on its own: every /fail request it answered is claimed, and A called it.
    let b_verdicts: Vec<_> = d
        .verdicts
        .iter()
        .filter(|v| v.service.as_str() == "svc-b")
        .collect();
    assert_eq!(
        b_verdicts.len(),
        12 + swallowed,
        "two attempts per chained request, one per swallowed one"
    );
    assert!(
        b_verdicts
            .iter()
            .all(|v| v.claim == Claim::Claimed && path_of(v).starts_with("/fail/"))
    );
    let not_from_a: Vec<_> = b_verdicts
        .iter()
        .filter(|v| v.caller.as_ref().map(|c| c.as_str()) != Some("svc-a"))
        .map(|v| {
            let x = d.exchanges.get(&v.exchange);
            (path_of(v), v.caller.clone(), x.map(|x| (x.local, x.remote)))
        })
        .collect();
    assert!(
        not_from_a.is_empty(),
        "B's verdicts not on A's calls (path, caller, B's local and remote): {not_from_a:?}"
    );

    // A's chained failures are symptoms of B's, with both failed attempts as the cause.
    let chained: Vec<_> = d
        .verdicts
        .iter()
        .filter(|v| v.service.as_str() == "svc-a" && path_of(v).starts_with("/chain/"))
        .collect();
    assert_eq!(chained.len(), 6);
    for v in &chained {
        assert_eq!(v.claim, Claim::Unclaimed, "{v:?}");
        assert_eq!(v.caused_by.len(), 2, "{v:?}");
        assert!(
            v.caused_by
                .iter()
                .all(|c| c.callee.as_str() == "svc-b" && c.status == Some(503))
        );
    }
    // A serves each request on a thread of its own: l7 saw every one read and answered with no
    // other in between, so the symptoms (a retried call failed) were judged at their answer, not
    // after the grace period.
    let a_served: Vec<_> = d
        .exchanges
        .values()
        .filter(|x| x.pid == a.pid() && x.role == Role::Server)
        .collect();
    assert!(
        a_served.iter().all(|x| x.sole_on_thread),
        "thread per request, yet: {a_served:?}"
    );
    assert!(
        d.engine.stats().early_verdicts >= 6,
        "{:?}",
        d.engine.stats()
    );
    // A failing on its own (its call to B succeeded) owns its errors.
    let own: Vec<_> = d
        .verdicts
        .iter()
        .filter(|v| v.service.as_str() == "svc-a" && path_of(v).starts_with("/own/"))
        .collect();
    assert_eq!(own.len(), 6);
    assert!(
        own.iter()
            .all(|v| v.claim == Claim::Claimed && v.caused_by.is_empty()),
        "{own:?}"
    );

    // The edge figures: A retried B once per chained request; B's errors were claimed, so the
    // retries into B are never suppressed for ownership.
    let edges = d.engine.edges();
    let ab = edges
        .iter()
        .find(|e| e.edge.to_string() == "svc-a->svc-b")
        .unwrap_or_else(|| panic!("edge svc-a -> svc-b in {edges:?}"));
    eprintln!("{ab:?}");
    assert_eq!(ab.retries_total, 6);
    assert_eq!(ab.requests_total, 18 + swallowed as u64);
    let mut decider = Decider::new(DecideConfig {
        min_requests: 1,
        ..DecideConfig::default()
    });
    let decisions = decider.evaluate_edges(&edges, d.engine.now_ns());
    assert!(
        decisions
            .iter()
            .all(|x| x.reason != Reason::CalleeUnclaimed),
        "{decisions:?}"
    );
    d
}

/// The caller gives up (0.3 s timeout) while A still works (1 s): a timeout mismatch on the
/// client → A edge, seen from both sides of the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_giving_up_is_a_timeout_mismatch() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    let (b, pb) = python_server("chain_service_b.py", &[]);
    let (a, pa) = python_server("chain_service_a.py", &[&pb.to_string()]);
    let client = Proc::spawn(
        python(
            "impatient_client.py",
            &[&pa.to_string(), "/slow/1", "/slow/2", "/slow/3"],
        )
        .stdout(Stdio::piped()),
    );
    let client_pid = client.pid();
    let (events, lines) = capture_while(&mut cap, client, &[a.pid(), b.pid()]).await;
    assert_eq!(
        lines,
        vec!["/slow/1 timeout", "/slow/2 timeout", "/slow/3 timeout"]
    );
    // A answers a second after each request; give it time to write the last one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut more = collect(
        &mut cap,
        Duration::from_millis(500),
        |e: &Event| e.pid() == a.pid(),
        |_| false,
    )
    .await;
    let mut events = events;
    events.append(&mut more);

    let mut cfg = CorrelateConfig::default();
    cfg.service_names
        .push(format!("pid:{}=svc-a", a.pid()).parse().expect("override"));
    cfg.service_names.push(
        format!("pid:{client_pid}=impatient")
            .parse()
            .expect("override"),
    );
    let d = derive(&events, cfg);
    let edges = d.engine.edges();
    let edge = edges
        .iter()
        .find(|e| e.edge.to_string() == "impatient->svc-a");
    eprintln!("{edge:?}\nstats {:?}", d.engine.stats());
    let edge = edge.unwrap_or_else(|| panic!("edge impatient -> svc-a in {edges:?}"));
    assert_eq!(
        edge.timeout_mismatches_total, 3,
        "once per abandoned request: {edge:?}"
    );
    assert_eq!(d.engine.stats().timeout_mismatches, 3);
    // The caller giving up is not A's error: no verdicts for A, and no claims on the edge
    // beyond what A said.
    assert!(
        d.verdicts.iter().all(|v| v.service.as_str() != "svc-a"),
        "{:?}",
        d.verdicts
    );
    assert_eq!(edge.callee_claims.total(), 0, "{edge:?}");
}

/// An event loop serves overlapping requests on one thread: thread context cannot link its
/// outbound failures to one request, so its errors are `missing` (or linked by timing when
/// unambiguous), never a guessed claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_loop_overlap_is_missing_not_guessed() {
    if !can_run() {
        return;
    }
    let node_ok = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok {
        eprintln!("skip: node not available");
        return;
    }
    let Some(mut cap) = load() else { return };
    let (b, pb) = python_server("chain_service_b.py", &[]);
    let (n, pn) = serve(
        node,
        "event_loop_server.js",
        &[&pb.to_string()],
        Ready::Listening,
    );
    let sn = pn.to_string();
    let paths: Vec<String> = (1..=6).map(|i| format!("/chain/{i}")).collect();
    let mut args = vec![sn.clone()];
    args.extend(paths);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = Proc::spawn(python("parallel_client.py", &args).stdout(Stdio::piped()));
    let (events, _) = capture_while(&mut cap, client, &[n.pid(), b.pid()]).await;

    // The loop never retries B: at-least-once would (deliberately) own B's errors; here we look
    // at linking alone.
    let mut cfg = CorrelateConfig {
        at_least_once: false,
        ..CorrelateConfig::default()
    };
    cfg.service_names
        .push(format!("pid:{}=loop", n.pid()).parse().expect("override"));
    cfg.service_names
        .push(format!("pid:{}=svc-b", b.pid()).parse().expect("override"));
    let d = derive(&events, cfg);
    let mine: Vec<_> = d
        .verdicts
        .iter()
        .filter(|v| v.service.as_str() == "loop")
        .collect();
    for v in &mine {
        eprintln!("{v:?}");
    }
    assert_eq!(mine.len(), 6, "every failed request judged");
    // Requests that overlapped on the loop's thread are never taken as served alone, so none
    // is judged at its answer.
    let overlapped = d
        .exchanges
        .values()
        .filter(|x| x.pid == n.pid() && x.role == Role::Server && !x.sole_on_thread)
        .count();
    assert!(overlapped >= 2, "the client sends in parallel");
    assert_eq!(d.engine.stats().early_verdicts, 0, "{:?}", d.engine.stats());
    // Never a guessed claim: missing, or (where exactly one failed call answered right before
    // the response) unclaimed with that call of B's as the cause.
    assert!(mine.iter().all(|v| v.claim != Claim::Claimed), "{mine:?}");
    assert!(
        mine.iter()
            .filter(|v| v.claim == Claim::Unclaimed)
            .all(|v| v.caused_by.len() == 1 && v.caused_by[0].callee.as_str() == "svc-b"),
        "{mine:?}"
    );
    // B still owns its own errors.
    assert!(
        d.verdicts
            .iter()
            .filter(|v| v.service.as_str() == "svc-b")
            .all(|v| v.claim == Claim::Claimed)
    );
}

/// The event loop above, its client sending each request with its own `traceparent` to `paths`
/// at once; the loop forwards the trace to its call. What the agent derives of the loop's
/// verdicts, with timing links off (the trace id alone must link). `None`: cannot run here.
async fn traced_event_loop(paths: &[&str]) -> Option<(Vec<Verdict>, Derived)> {
    if !can_run() {
        return None;
    }
    let node_ok = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok {
        eprintln!("skip: node not available");
        return None;
    }
    let mut cap = load()?;
    let (b, pb) = python_server("chain_service_b.py", &[]);
    let (n, pn) = serve(
        node,
        "event_loop_server.js",
        &[&pb.to_string()],
        Ready::Listening,
    );
    let port = pn.to_string();
    let mut args = vec![port.as_str()];
    args.extend(paths);
    let mut cmd = python("parallel_client.py", &args);
    cmd.env("SEND_TRACEPARENT", "1").stdout(Stdio::piped());
    let client = Proc::spawn(&mut cmd);
    let (events, _) = capture_while(&mut cap, client, &[n.pid(), b.pid()]).await;

    let mut cfg = CorrelateConfig {
        at_least_once: false,
        timing_link_ms: 0,
        ..CorrelateConfig::default()
    };
    cfg.service_names
        .push(format!("pid:{}=loop", n.pid()).parse().expect("override"));
    cfg.service_names
        .push(format!("pid:{}=svc-b", b.pid()).parse().expect("override"));
    let d = derive(&events, cfg);
    let mine: Vec<Verdict> = d
        .verdicts
        .iter()
        .filter(|v| v.service.as_str() == "loop")
        .cloned()
        .collect();
    for v in &mine {
        eprintln!("{v:?}");
    }
    Some((mine, d))
}

/// Every verdict of the loop is sound (unclaimed, B's call the cause) and names its own call.
fn assert_each_names_its_own_call(mine: &[Verdict], d: &Derived) {
    assert_eq!(mine.len(), 6, "every failed request judged");
    assert!(
        mine.iter().all(|v| v.claim == Claim::Unclaimed
            && v.caused_by.len() == 1
            && v.caused_by[0].callee.as_str() == "svc-b"),
        "{mine:?}"
    );
    let mut causes: Vec<_> = mine.iter().map(|v| v.caused_by[0].exchange).collect();
    causes.sort_unstable();
    causes.dedup();
    assert_eq!(causes.len(), 6, "{mine:?}");
    assert_eq!(d.engine.stats().trace_links, 6, "{:?}", d.engine.stats());
}

/// The same event loop forwarding each request's `traceparent` to its call: the trace id ties
/// every failed call to its request, so every verdict is sound (unclaimed, B's call the cause)
/// instead of missing, with timing links off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_loop_forwarding_traceparent_gets_verdicts() {
    let paths: Vec<String> = (1..=6).map(|i| format!("/chain/{i}")).collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let Some((mine, d)) = traced_event_loop(&paths).await else {
        return;
    };
    assert_each_names_its_own_call(&mine, &d);
}

/// Six requests for the same URL: the loop makes six identical, overlapping calls to B, one
/// per request. They are not retries (nor hedges) of one another: each carries its own
/// request's trace id. (Keyed on method and URL alone, five of them read as hedged retries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_of_different_traces_are_not_retries() {
    let Some((mine, d)) = traced_event_loop(&["/chain/1"; 6]).await else {
        return;
    };
    assert_each_names_its_own_call(&mine, &d);
    let s = d.engine.stats();
    assert_eq!((s.retries, s.hedged_retries), (0, 0), "{s:?}");
}

/// Identical calls in flight at once, from a real client: eight threads polling one URL
/// together are first attempts; a hedge (the same request on a second connection while the
/// first is slow, the loser closed unanswered) is a hedged retry. Before hedges needed a
/// dropped loser, the eight pollers read as seven hedged retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_in_flight_are_hedges_only_when_one_is_dropped() {
    if !can_run() {
        return;
    }
    let Some(mut cap) = load() else { return };
    // Only its `/slow/N` (a second, then 200) is used: B is never called.
    let (a, pa) = python_server("chain_service_a.py", &["9"]);
    let client = Proc::spawn(
        python("hedging_client.py", &[&pa.to_string(), "8", "2"]).stdout(Stdio::piped()),
    );
    let client_pid = client.pid();
    let (events, lines) = capture_while(&mut cap, client, &[a.pid()]).await;
    assert_eq!(
        lines.iter().filter(|l| *l == "poll 200").count(),
        8,
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("/slow/hedge-"))
            .all(|l| l.ends_with("won by first 200")),
        "{lines:?}"
    );
    let d = derive(
        &events,
        named(
            CorrelateConfig::default(),
            &[(a.pid(), "svc-a"), (client_pid, "hedger")],
        ),
    );
    let s = d.engine.stats();
    let edges = d.engine.edges();
    let edge = edges
        .iter()
        .find(|e| e.edge.to_string() == "hedger->svc-a")
        .unwrap_or_else(|| panic!("edge hedger -> svc-a in {edges:?}"));
    eprintln!("{edge:?}\nstats {s:?}");
    assert_eq!(
        (s.retries, s.hedged_retries),
        (2, 2),
        "one hedge per round, none among the pollers: {s:?}"
    );
    assert_eq!(
        (edge.requests_total, edge.retries_total),
        (12, 2),
        "8 polls and 2 rounds of two attempts: {edge:?}"
    );
}
