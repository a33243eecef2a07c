use super::*;

const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
   2: garbage
";

const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:0050 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 0 10 -1
   1: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000200007F:C350 08 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 20 4 0 10 -1
";

#[test]
fn parses_v4_rows_and_skips_garbage() {
    let rows = parse_proc_net_tcp(TCP);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].local, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(rows[0].state, TCP_LISTEN);
    assert_eq!(rows[0].inode, 1111);
    assert_eq!(rows[1].local, "127.0.0.1:40000".parse().unwrap());
    assert_eq!(rows[1].remote, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(rows[1].state, TCP_ESTABLISHED);
}

#[test]
fn parses_v6_rows() {
    let rows = parse_proc_net_tcp(TCP6);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].local, "[::1]:80".parse().unwrap());
    assert_eq!(rows[0].remote, "[::1]:54321".parse().unwrap());
    assert_eq!(rows[1].local, "[::ffff:127.0.0.1]:8080".parse().unwrap());
    assert_eq!(rows[1].remote, "[::ffff:127.0.0.2]:50000".parse().unwrap());
    assert_eq!(rows[1].state, TCP_CLOSE_WAIT);
    assert_eq!(
        canonical(rows[1].remote),
        "127.0.0.2:50000".parse().unwrap()
    );
}

#[test]
fn links_and_cgroups() {
    assert_eq!(socket_inode("socket:[12345]"), Some(12345));
    assert_eq!(socket_inode("pipe:[12345]"), None);
    assert_eq!(socket_inode("/etc/passwd"), None);
    assert_eq!(ns_inode("net:[4026531840]"), Some(4026531840));
    assert_eq!(
        parse_cgroup("0::/system.slice/x.service\n"),
        Some("/system.slice/x.service".into())
    );
    assert_eq!(parse_cgroup("12:cpu:/a\n11:memory:/b\n"), Some("/a".into()));
    let id = "a".repeat(64);
    assert_eq!(
        container_id(&format!("/system.slice/docker-{id}.scope")),
        Some(id.clone())
    );
    assert_eq!(
        container_id(&format!("/kubepods/besteffort/pod1/{id}")),
        Some(id.clone())
    );
    assert_eq!(container_id("/user.slice/user-0.slice"), None);
}

#[test]
fn role_from_listening_ports() {
    let listening: HashSet<SocketAddr> = [
        "0.0.0.0:8080".parse().unwrap(),
        "127.0.0.1:9000".parse().unwrap(),
        "[::]:443".parse().unwrap(),
    ]
    .into();
    assert_eq!(
        role_for("127.0.0.1:8080".parse().unwrap(), &listening),
        Role::Server
    );
    assert_eq!(
        role_for("127.0.0.1:9000".parse().unwrap(), &listening),
        Role::Server
    );
    assert_eq!(
        role_for("[::1]:443".parse().unwrap(), &listening),
        Role::Server
    );
    assert_eq!(
        role_for("127.0.0.2:9000".parse().unwrap(), &listening),
        Role::Client
    );
    assert_eq!(
        role_for("127.0.0.1:40000".parse().unwrap(), &listening),
        Role::Client
    );
}

#[test]
fn process_info_of_self() {
    let me = std::process::id();
    let info = process_info(Path::new("/proc"), me);
    assert_eq!(info.pid, me);
    assert!(!info.comm.is_empty());
    assert!(info.exe.is_some());
    assert!(info.netns.is_some());
    let gone = process_info(Path::new("/nonexistent"), 1);
    assert_eq!((gone.pid, gone.comm.as_str(), gone.exe), (1, "", None));
}

/// Where pid 1's namespace link cannot be read (this machine's sandbox, a hardened /proc), the
/// agent's own is the host's: without it every containerized process lost its `@netns` suffix.
#[test]
fn host_netns_falls_back_to_the_agents_own() {
    let root = crate::testkit::temp_dir("procfs-netns");
    let link = |pid: &str, target: &str| {
        std::fs::create_dir_all(root.join(pid).join("ns")).unwrap();
        std::os::unix::fs::symlink(target, root.join(pid).join("ns/net")).unwrap();
    };
    link("self", "net:[4026531999]");
    assert_eq!(host_netns(&root), Some(4026531999));
    link("1", "net:[4026531840]");
    assert_eq!(
        host_netns(&root),
        Some(4026531840),
        "pid 1's wins when readable"
    );
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(host_netns(&root), None);
}
