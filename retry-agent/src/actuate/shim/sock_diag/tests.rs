use std::net::{SocketAddr, TcpListener, TcpStream};

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// A reply datagram: header, then `body`.
fn reply(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&((NLMSG_HDR_LEN + body.len()) as u32).to_ne_bytes());
    b.extend_from_slice(&kind.to_ne_bytes());
    b.extend_from_slice(&0u16.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(body);
    b
}

fn diag_msg(state: u8, sport: u16, uid: u32) -> Vec<u8> {
    let mut m = vec![0u8; 72];
    m[0] = libc::AF_INET as u8;
    m[1] = state;
    m[4..6].copy_from_slice(&sport.to_be_bytes());
    m[MSG_UID_AT..MSG_UID_AT + 4].copy_from_slice(&uid.to_ne_bytes());
    m
}

#[test]
fn request_is_an_exact_lookup_of_the_tuple() {
    let r = request(7, addr("127.0.0.1:41668"), addr("10.0.0.7:8080"));
    assert_eq!(u32_at(&r, 0), Some(REQ_LEN as u32));
    assert_eq!(u16_at(&r, 4), Some(SOCK_DIAG_BY_FAMILY));
    // No NLM_F_DUMP: one socket, found by hash, not a walk of them all.
    assert_eq!(u16_at(&r, 6), Some(NLM_F_REQUEST));
    assert_eq!(u32_at(&r, 8), Some(7));
    assert_eq!(r[16], libc::AF_INET as u8);
    assert_eq!(r[17], libc::IPPROTO_TCP as u8);
    assert_eq!(&r[24..26], &41668u16.to_be_bytes());
    assert_eq!(&r[26..28], &8080u16.to_be_bytes());
    assert_eq!(&r[28..32], &[127, 0, 0, 1]);
    assert_eq!(&r[44..48], &[10, 0, 0, 7]);
    assert_eq!(&r[64..72], &[0xff; 8]);
    let r6 = request(1, addr("[::1]:5"), addr("[::1]:6"));
    assert_eq!(r6[16], libc::AF_INET6 as u8);
    assert_eq!(r6[43], 1);
}

#[test]
fn replies_table() {
    let me = addr("127.0.0.1:41668");
    let enoent = (-libc::ENOENT).to_ne_bytes();
    let eperm = (-libc::EPERM).to_ne_bytes();
    let cases: Vec<(&str, Vec<u8>, Result<Reply, ()>)> = vec![
        (
            "found",
            reply(20, 3, &diag_msg(1, 41668, 1000)),
            Ok(Reply::Found(Some(1000))),
        ),
        (
            "no such socket",
            reply(2, 3, &enoent),
            Ok(Reply::Found(None)),
        ),
        (
            "listener on the port",
            reply(20, 3, &diag_msg(10, 41668, 0)),
            Ok(Reply::Found(None)),
        ),
        (
            "another socket",
            reply(20, 3, &diag_msg(1, 1, 1000)),
            Ok(Reply::Found(None)),
        ),
        (
            "another request's",
            reply(20, 2, &diag_msg(1, 41668, 1000)),
            Ok(Reply::Other),
        ),
        ("kernel error", reply(2, 3, &eperm), Err(())),
        (
            "truncated",
            reply(20, 3, &[1, 2, 3])[..10].to_vec(),
            Err(()),
        ),
        ("short body", reply(20, 3, &[1, 1, 0, 0, 0]), Err(())),
        ("empty", Vec::new(), Err(())),
    ];
    for (name, bytes, want) in cases {
        let got = parse_reply(&bytes, 3, me).map_err(|_| ());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn finds_live_sockets_by_tuple() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = l.local_addr().expect("addr");
    let c = TcpStream::connect(server).expect("connect");
    let me = c.local_addr().expect("addr");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(uid_of(me, server).expect("lookup"), Some(uid));
    // Repeated on the thread's socket.
    assert_eq!(uid_of(me, server).expect("lookup"), Some(uid));
    // The wrong peer: no such socket (the listener on `server` is not taken for it).
    assert_eq!(uid_of(me, addr("127.0.0.1:1")).expect("lookup"), None);
    assert_eq!(uid_of(addr("127.0.0.1:1"), server).expect("lookup"), None);
    // IPv6, where the host has it.
    if let Ok(l6) = TcpListener::bind("[::1]:0") {
        let s6 = l6.local_addr().expect("addr");
        let c6 = TcpStream::connect(s6).expect("connect");
        let me6 = c6.local_addr().expect("addr");
        assert_eq!(uid_of(me6, s6).expect("lookup"), Some(uid));
        assert_eq!(uid_of(me6, server).expect("lookup"), None);
    }
}

#[test]
fn finds_another_users_socket() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to create a socket as another uid");
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = l.local_addr().expect("addr");
    // A socket's owner is the creating thread's fsuid; setfsuid is per thread on Linux.
    let c = std::thread::spawn(move || {
        // SAFETY: setfsuid has no memory preconditions; it changes only this thread's fsuid.
        unsafe { libc::setfsuid(4242) };
        TcpStream::connect(server)
    })
    .join()
    .expect("thread")
    .expect("connect");
    let me = c.local_addr().expect("addr");
    assert_eq!(uid_of(me, server).expect("lookup"), Some(4242));
}
