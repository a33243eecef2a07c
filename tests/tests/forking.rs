//! Pre-forking servers on the real capture layer: `cargo test -p integration-tests --test
//! forking` as root. The parent accepts, a forked child serves (Python's ForkingMixIn; busybox
//! httpd, which also moves the socket onto stdin/stdout with dup2 and answers with sendfile):
//! the child's I/O is captured, its exchanges are server-side ones, and the service it is is
//! named like its parent (`comm:port`), not left as the bare address the client dialled.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    collections::BTreeSet,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    correlate::derive,
    fixture::{Proc, can_run, collect, dump, free_port, have, load, python, wait_listening},
};
use retry_agent::{
    capture::{Capture, Event, Role},
    correlate::CorrelateConfig,
};

const PATHS: [&str; 3] = ["/a.html", "/b.html", "/c.html"];

/// Whether an event is about a connection to or from `port` (forked children have pids the
/// test cannot know in advance), or describes a process (for names).
fn about_port(port: u16) -> impl FnMut(&Event) -> bool {
    move |e| match e {
        Event::Process(_) | Event::ProcessExit { .. } => true,
        _ => e
            .tuple()
            .is_some_and(|t| t.local.port() == port || t.remote.port() == port),
    }
}

/// curl asks for every path (one connection each: both servers close after a response), a
/// child of the server answers each, and the agent's derivations are checked.
async fn serve_and_check(cap: &mut Capture, server: &Proc, port: u16, comm: &str) {
    let urls: Vec<String> = PATHS
        .iter()
        .map(|p| format!("http://127.0.0.1:{port}{p}"))
        .collect();
    let mut curl = Command::new("curl");
    curl.args(["-s", "--max-time", "5", "-w", "%{http_code}\\n"]);
    for u in &urls {
        curl.args(["-o", "/dev/null", u]);
    }
    let client = Proc::spawn(curl.stdout(Stdio::piped()));
    let collecting = collect(cap, Duration::from_secs(4), about_port(port), |_| false);
    let codes = tokio::task::spawn_blocking(move || {
        let mut client = client;
        client.output_lines()
    });
    let events = collecting.await;
    let codes = codes.await.unwrap_or_default();
    assert_eq!(codes, vec!["200"; PATHS.len()], "curl got every answer");

    let d = derive(&events, CorrelateConfig::default());
    let served: Vec<_> = d
        .exchanges
        .values()
        .filter(|x| x.role == Role::Server && x.local.map(|a| a.port()) == Some(port))
        .collect();
    let paths: BTreeSet<&str> = served.iter().filter_map(|x| x.path.as_deref()).collect();
    assert_eq!(
        paths,
        PATHS.into_iter().collect(),
        "every request seen on the server side\n{}",
        dump(&events)
    );
    assert_eq!(served.len(), PATHS.len(), "{served:?}");
    assert!(served.iter().all(|x| x.status == Some(200)), "{served:?}");
    // Served by children: the parent only accepted.
    let pids: BTreeSet<u32> = served.iter().map(|x| x.pid).collect();
    assert!(!pids.contains(&server.pid()), "the parent served: {pids:?}");
    assert_eq!(
        pids.len(),
        PATHS.len(),
        "one child per connection: {pids:?}"
    );

    // The client's edge ends at the service the children are, by its name.
    let edges = d.engine.edges();
    let want = format!("curl->{comm}:{port}");
    let edge = edges
        .iter()
        .find(|e| e.edge.to_string() == want)
        .unwrap_or_else(|| {
            let names: Vec<String> = edges.iter().map(|e| e.edge.to_string()).collect();
            panic!("no edge {want} in {names:?}")
        });
    assert_eq!(edge.requests, PATHS.len() as u64, "{edge:?}");
    eprintln!(
        "{want}: {} requests, served by children {pids:?}",
        edge.requests
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_children_serve_what_the_parent_accepted() {
    if !can_run() || !have("curl", "--version") {
        return;
    }
    let Some(mut cap) = load() else { return };

    let port = free_port();
    let server = Proc::spawn(&mut python("forking_http_server.py", &[&port.to_string()]));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    serve_and_check(&mut cap, &server, port, "python3").await;
    drop(server);

    if !have("busybox", "true") {
        return;
    }
    let root = retry_agent::testkit::temp_dir("forking-httpd");
    std::fs::create_dir_all(&root).expect("document root");
    for p in PATHS {
        std::fs::write(root.join(&p[1..]), "served by busybox httpd\n").expect("page");
    }
    let port = free_port();
    let server = Proc::spawn(Command::new("busybox").args([
        "httpd",
        "-f",
        "-p",
        &format!("127.0.0.1:{port}"),
        "-h",
        &root.to_string_lossy(),
    ]));
    wait_listening(&format!("127.0.0.1:{port}"), None);
    serve_and_check(&mut cap, &server, port, "busybox").await;
}
