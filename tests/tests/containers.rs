//! Pod identity against a real container runtime: `cargo test -p integration-tests --test
//! containers` as root.
//!
//! The test starts its own containerd (private socket, root and state directories, `native`
//! snapshotter, CRI off), imports an OCI image it builds (busybox-static's httpd and a page),
//! and runs three containers the way a kubelet's cgroupfs driver places them
//! (`/kubepods/besteffort/pod<uid>/<id>`), each serving on port 8080 in its own network
//! namespace reached from the host over a veth pair the test creates. Two carry the labels a
//! kubelet sets (`io.kubernetes.pod.name` / `.pod.namespace` / `.container.name`); the third
//! carries none. The agent binary (`retry-agent run`, pointed at that socket) must name the
//! first two `namespace/workload` — different names for the same `busybox:8080` — and the
//! third `comm:port@netns:<inode>`, counting `labels_missing`. Everything is torn down on drop.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    actuate::{agent_bin, wait_until},
    fixture::{Proc, can_run, free_port, have, wait_listening},
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const IMAGE: &str = "docker.io/library/ra-busybox-httpd:test";
/// containerd namespace kubelet's containers live in.
const NS: &str = "k8s.io";

fn sha256(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// An uncompressed tar of `(path, contents, mode)`; `None` contents is a directory.
fn tar_of(entries: &[(&str, Option<&[u8]>, u32)]) -> Vec<u8> {
    let mut t = tar::Builder::new(Vec::new());
    for (path, data, mode) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mode(*mode);
        h.set_mtime(0);
        match data {
            Some(d) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(d.len() as u64);
                t.append_data(&mut h, path, *d).unwrap();
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                t.append_data(&mut h, path, std::io::empty()).unwrap();
            }
        }
    }
    t.into_inner().unwrap()
}

/// An OCI image layout tar: one layer with busybox-static and a page, httpd in the foreground.
fn busybox_image(busybox: &Path) -> Vec<u8> {
    let bin = std::fs::read(busybox).unwrap();
    let layer = tar_of(&[
        ("bin", None, 0o755),
        ("bin/busybox", Some(&bin), 0o755),
        ("www", None, 0o755),
        ("www/index.html", Some(b"served from a container\n"), 0o644),
    ]);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Cmd": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"] },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{}", sha256(&layer))] },
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": format!("sha256:{}", sha256(&config)), "size": config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar",
                     "digest": format!("sha256:{}", sha256(&layer)), "size": layer.len() }],
    }))
    .unwrap();
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{ "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": format!("sha256:{}", sha256(&manifest)), "size": manifest.len(),
                        "annotations": { "org.opencontainers.image.ref.name": IMAGE },
                        "platform": { "architecture": "amd64", "os": "linux" } }],
    }))
    .unwrap();
    let blob = |b: &[u8]| format!("blobs/sha256/{}", sha256(b));
    let (bl, bc, bm) = (blob(&layer), blob(&config), blob(&manifest));
    tar_of(&[
        (
            "oci-layout",
            Some(br#"{"imageLayoutVersion":"1.0.0"}"#),
            0o644,
        ),
        ("index.json", Some(&index), 0o644),
        ("blobs", None, 0o755),
        ("blobs/sha256", None, 0o755),
        (&bl, Some(&layer), 0o644),
        (&bc, Some(&config), 0o644),
        (&bm, Some(&manifest), 0o644),
    ])
}

/// A private containerd and the containers it runs; all of it goes on drop.
struct Runtime {
    dir: PathBuf,
    daemon: Option<Proc>,
    containers: Vec<String>,
}

impl Runtime {
    fn start(dir: PathBuf) -> Runtime {
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.display();
        std::fs::write(
            dir.join("config.toml"),
            format!(
                "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{d}/containerd.sock\"\n\
                 [ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let daemon = Proc::spawn(
            Command::new("containerd")
                .arg("--config")
                .arg(dir.join("config.toml"))
                .stdout(Stdio::null())
                .stderr(log),
        );
        let rt = Runtime {
            dir,
            daemon: Some(daemon),
            containers: Vec::new(),
        };
        let up = wait_until(Duration::from_secs(20), || rt.ctr(&["version"]).0);
        assert!(up.is_some(), "containerd did not start\n{}", rt.log());
        rt
    }

    /// `ctr images import` of an OCI archive, into the `native` snapshotter.
    fn import(&self, archive: &Path) {
        let (ok, out) = self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "native",
            &archive.to_string_lossy(),
        ]);
        assert!(ok, "ctr images import {}: {out}", archive.display());
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr` in the k8s.io namespace: (success, stdout + stderr).
    fn ctr(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", NS])
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Runs the image as container `id` in network namespace `netns`, with `labels`, in a
    /// kubelet-style cgroup of pod `pod_uid`.
    fn run(&mut self, id: &str, netns: &str, pod_uid: &str, labels: &[(&str, &str)]) {
        let cgroup = format!("/kubepods/besteffort/pod{pod_uid}/{id}");
        let ns = format!("network:/var/run/netns/{netns}");
        let mut opts = vec!["--cgroup", &cgroup, "--with-ns", &ns];
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for l in &labels {
            opts.extend(["--label", l]);
        }
        self.run_image(IMAGE, id, &opts, &[]);
    }

    /// `ctr run --detach` of `image` as `id` with `opts`, running `cmd` (empty: the image's).
    fn run_image(&mut self, image: &str, id: &str, opts: &[&str], cmd: &[&str]) {
        let mut args = vec!["run", "--detach", "--snapshotter", "native"];
        args.extend(opts);
        args.extend([image, id]);
        args.extend(cmd);
        let (ok, out) = self.ctr(&args);
        assert!(ok, "ctr run {id}: {out}\n{}", self.log());
        self.containers.push(id.to_string());
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.containers) {
            let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", &id]);
            let _ = wait_until(Duration::from_secs(5), || {
                self.ctr(&["tasks", "delete", &id]).0
                    || !self.ctr(&["tasks", "ls", "-q"]).1.contains(&id)
            });
            let _ = self.ctr(&["containers", "delete", &id]);
        }
        let _ = self.ctr(&["images", "remove", IMAGE]);
        drop(self.daemon.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A network namespace with a veth pair to the host: the host side has `10.214.<n>.1`, the
/// namespace `10.214.<n>.2`. Deleting the namespace removes the pair.
struct Netns {
    name: String,
}

impl Netns {
    fn create(n: u8) -> Option<Netns> {
        let name = format!("ractr{n}");
        let (host, inner) = (format!("ractr{n}h"), format!("ractr{n}c"));
        let _ = ip(&["netns", "del", &name]);
        let ns = Netns { name: name.clone() };
        let steps: Vec<Vec<String>> = vec![
            vec!["netns", "add", &name],
            vec!["link", "add", &host, "type", "veth", "peer", "name", &inner],
            vec!["link", "set", &inner, "netns", &name],
            vec!["addr", "add", &format!("10.214.{n}.1/24"), "dev", &host],
            vec!["link", "set", &host, "up"],
            vec![
                "-n",
                &name,
                "addr",
                "add",
                &format!("10.214.{n}.2/24"),
                "dev",
                &inner,
            ],
            vec!["-n", &name, "link", "set", &inner, "up"],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
        for s in steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            if !ip(&args) {
                eprintln!("skip: `ip {}` failed", args.join(" "));
                return None;
            }
        }
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the test's directory last (declared first, dropped after everything in it).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A 64-hex container id, distinct per test run and container.
fn container_id(tag: u8) -> String {
    sha256(format!("ra-containers-{}-{tag}", std::process::id()).as_bytes())
}

/// The static busybox the test images are built from (Debian's busybox-static).
fn busybox() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn curl(url: &str) -> bool {
    Command::new("curl")
        .args(["-s", "-o", "/dev/null", "--max-time", "5", "-f", url])
        .status()
        .is_ok_and(|s| s.success())
}

fn get_unix(sock: &Path, path: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "--unix-socket"])
        .arg(sock)
        .arg(format!("http://agent{path}"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// (callee, requests) of the agent's edges from curl, and the whole answer.
fn curl_edges(api: &Path) -> (Vec<(String, u64)>, String) {
    let Some(body) = get_unix(api, "/v1/edges") else {
        return (Vec::new(), String::new());
    };
    let edges: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
    let mine = edges
        .iter()
        .filter(|e| e["edge"]["caller"] == "curl")
        .map(|e| {
            (
                e["edge"]["callee"].as_str().unwrap_or_default().to_string(),
                e["requests"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    (mine, body)
}

#[test]
fn containers_are_named_by_pod_and_two_on_one_port_differ() {
    if !can_run() {
        return;
    }
    for tool in ["containerd", "ctr", "runc", "curl"] {
        if !have(tool, "--version") {
            return;
        }
    }
    let Some(busybox) = busybox() else {
        eprintln!("skip: busybox-static not installed");
        return;
    };
    let dir = retry_agent::testkit::temp_dir("containers");
    let _cleanup = RemoveDir(dir.clone());
    let mut rt = Runtime::start(dir.join("containerd"));
    let image = dir.join("image.oci.tar");
    std::fs::write(&image, busybox_image(&busybox)).unwrap();
    rt.import(&image);

    let nets: Vec<Netns> = match (1..=3).map(Netns::create).collect::<Option<Vec<_>>>() {
        Some(n) => n,
        None => return,
    };
    let pods = [
        (
            "team-a",
            "web-a-5d8f7c9b4-x7k2p",
            "1b2c3d4e-0000-4000-8000-00000000000a",
        ),
        (
            "team-b",
            "web-b-6c9d8f7f5-q9zt4",
            "1b2c3d4e-0000-4000-8000-00000000000b",
        ),
    ];
    for (i, (ns, pod, uid)) in pods.iter().enumerate() {
        let labels = [
            ("io.kubernetes.pod.name", *pod),
            ("io.kubernetes.pod.namespace", *ns),
            ("io.kubernetes.container.name", "web"),
        ];
        rt.run(&container_id(i as u8), &nets[i].name, uid, &labels);
    }
    // Same image, same port, no kubelet labels.
    rt.run(
        &container_id(2),
        &nets[2].name,
        "1b2c3d4e-0000-4000-8000-00000000000c",
        &[],
    );
    for (i, n) in nets.iter().enumerate() {
        wait_listening(&format!("10.214.{}.2:8080", i + 1), Some(&n.name));
    }

    let api_port = free_port();
    let api = dir.join("api.sock");
    let agent_log = std::fs::File::create(dir.join("agent.log")).unwrap();
    let _agent = Proc::spawn(
        Command::new(agent_bin())
            .args(["run", "--api-addr", &format!("127.0.0.1:{api_port}")])
            .args(["--identity-kube", "off", "--recorder", "false"])
            .args(["--actuate", "decision-log"])
            .arg("--identity-runtime-sockets")
            .arg(rt.socket())
            .arg("--actuate-decision-log")
            .arg(dir.join("decisions.jsonl"))
            .arg("--actuate-control-socket")
            .arg(dir.join("control.sock"))
            .arg("--api-socket")
            .arg(&api)
            .stdout(Stdio::null())
            .stderr(agent_log),
    );
    let agent_log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(30), || get_unix(&api, "/v1/edges")
            .is_some())
        .is_some(),
        "the agent never served its API\n{}",
        agent_log()
    );

    // A first request per container (its container gets resolved), then the measured ones.
    const N: u64 = 4;
    for i in 1..=3 {
        assert!(curl(&format!("http://10.214.{i}.2:8080/index.html")));
    }
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..N {
        for i in 1..=3 {
            assert!(curl(&format!("http://10.214.{i}.2:8080/index.html")));
        }
    }

    let named =
        |edges: &[(String, u64)], callee: &str| edges.iter().any(|(c, n)| c == callee && *n >= N);
    let (mut edges, mut body) = (Vec::new(), String::new());
    // The last answer that had curl's edges in it: the window moves on while we wait.
    let mut seen = Vec::new();
    let done = wait_until(Duration::from_secs(15), || {
        (edges, body) = curl_edges(&api);
        if !edges.is_empty() {
            seen = edges.clone();
        }
        named(&edges, "team-a/web-a")
            && named(&edges, "team-b/web-b")
            && edges
                .iter()
                .any(|(c, n)| c.starts_with("busybox:8080@netns:") && *n >= N)
    });
    let metrics = || {
        let out = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{api_port}/metrics")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        done.is_some(),
        "curl's edges: {edges:?} (last seen: {seen:?})\nall: {body}\n{}\n{}",
        agent_log(),
        metrics()
    );
    // The containers' addresses are never left as a callee: each was named.
    assert!(
        !edges.iter().any(|(c, _)| c.starts_with("10.214.")),
        "{edges:?}"
    );
    // The unlabelled container was counted.
    let metrics = metrics();
    let missing = metrics
        .lines()
        .find(|l| {
            l.starts_with("retry_agent_identity_failures_total") && l.contains("labels_missing")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        missing.is_some_and(|v| v >= 1.0),
        "labels_missing not counted:\n{metrics}"
    );
    eprintln!("curl's edges: {edges:?}");
}

/// The agent from its own image (`cargo xtask image`: the binary and the libraries it loads,
/// nothing else), run by containerd as the DaemonSet runs it: privileged, the host's network and
/// pid namespaces, tracefs from the host, the runtime's socket, a writable state directory. It
/// attaches, answers `/healthz`, sees requests made on the host, and names a kubelet-labelled
/// container `namespace/workload`.
#[test]
fn the_agent_runs_from_its_own_image() {
    if !can_run() {
        return;
    }
    for tool in ["containerd", "ctr", "runc", "curl", "strip", "python3"] {
        if !have(tool, "--version") {
            return;
        }
    }
    let Some(busybox) = busybox() else {
        eprintln!("skip: busybox-static not installed");
        return;
    };
    let xtask = agent_bin().with_file_name("xtask");
    if !xtask.exists() {
        eprintln!(
            "skip: {} not built (run through `cargo xtask test`)",
            xtask.display()
        );
        return;
    }
    let dir = retry_agent::testkit::temp_dir("agent-image");
    let _cleanup = RemoveDir(dir.clone());
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The debug binary is ~280 MB of debug info: the image carries it stripped.
    let bin = dir.join("retry-agent");
    let ok = Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&bin)
        .arg(agent_bin())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "strip the agent binary");
    let image = dir.join("agent.oci.tar");
    let out = Command::new(&xtask)
        .args(["image", "--tag", "test", "--binary"])
        .arg(&bin)
        .arg("--out")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "xtask image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rt = Runtime::start(dir.join("containerd"));
    rt.import(&image);
    // The workload it must name: a kubelet-labelled busybox httpd in its own network namespace.
    let workload_image = dir.join("busybox.oci.tar");
    std::fs::write(&workload_image, busybox_image(&busybox)).unwrap();
    rt.import(&workload_image);
    let Some(net) = Netns::create(4) else {
        return;
    };
    rt.run(
        &container_id(4),
        &net.name,
        "1b2c3d4e-0000-4000-8000-00000000000d",
        &[
            ("io.kubernetes.pod.name", "shop-api-7c9d8f5b6-k2x7q"),
            ("io.kubernetes.pod.namespace", "shop"),
            ("io.kubernetes.container.name", "api"),
        ],
    );
    wait_listening("10.214.4.2:8080", Some(&net.name));

    // A service on the host's loopback for the agent to watch.
    let port = free_port();
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "hi\n").unwrap();
    let _server = Proc::spawn(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(&www)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_listening(&format!("127.0.0.1:{port}"), None);

    let api_port = free_port();
    let api_addr = format!("127.0.0.1:{api_port}");
    let pid_ns = format!("pid:/proc/{}/ns/pid", std::process::id());
    let state_mount = format!(
        "type=bind,src={},dst=/state,options=rbind:rw",
        state.display()
    );
    // The runtime's socket, as the chart mounts the node's containerd socket.
    let runtime_mount = format!(
        "type=bind,src={},dst=/runtime,options=rbind:rw",
        rt.socket().parent().unwrap().display()
    );
    rt.run_image(
        "docker.io/library/retry-agent:test",
        "retry-agent",
        &[
            "--privileged",
            "--net-host",
            "--with-ns",
            &pid_ns,
            "--mount",
            "type=bind,src=/sys/kernel/tracing,dst=/sys/kernel/tracing,options=rbind:rw",
            "--mount",
            &state_mount,
            "--mount",
            &runtime_mount,
        ],
        &[
            "/usr/bin/retry-agent",
            "run",
            "--api-addr",
            &api_addr,
            "--api-socket",
            "/state/api.sock",
            "--recorder",
            "false",
            "--identity-kube",
            "off",
            "--capture-go",
            "false",
            "--actuate",
            "decision-log",
            "--actuate-decision-log",
            "/state/decisions.jsonl",
            "--actuate-control-socket",
            "/state/control.sock",
            "--identity-runtime-sockets",
            "/runtime/containerd.sock",
        ],
    );
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "5", "-w", "\n%{http_code}"])
            .arg(format!("http://{api_addr}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let healthy = wait_until(Duration::from_secs(60), || {
        get("/healthz").ends_with("\n200")
    });
    assert!(
        healthy.is_some(),
        "the agent in its image never became healthy: {}\n{}",
        get("/healthz"),
        rt.ctr(&["tasks", "ls"]).1
    );
    for _ in 0..5 {
        assert!(curl(&format!("http://127.0.0.1:{port}/index.html")));
    }
    let exchanges = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("retry_agent_l7_exchanges_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let seen = wait_until(Duration::from_secs(15), || {
        exchanges(&get("/metrics")) >= 10.0
    });
    assert!(
        seen.is_some(),
        "5 requests (10 exchanges, both sides) not seen by the agent in its image:\n{}",
        get("/metrics")
    );
    // And the containerized workload by its name: one request to get it resolved, then some.
    assert!(curl("http://10.214.4.2:8080/index.html"));
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..4 {
        assert!(curl("http://10.214.4.2:8080/index.html"));
    }
    let api = state.join("api.sock");
    let mut edges = Vec::new();
    let named = wait_until(Duration::from_secs(15), || {
        edges = curl_edges(&api).0;
        edges.iter().any(|(c, n)| c == "shop/shop-api" && *n >= 4)
    });
    assert!(
        named.is_some(),
        "the agent in its image did not name the workload shop/shop-api: {edges:?}\n{}",
        get("/metrics")
    );
}
