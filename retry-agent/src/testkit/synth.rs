//! A synthetic but wire-faithful event stream of a small retry storm, for tests, benchmarks and
//! fuzz seeds: `frontend → api → db` over HTTP/1.1 keep-alive on loopback, db failing with 503
//! for a while, each caller retrying once (so db sees 4× its normal load during the fault).
use std::net::SocketAddr;

use bytes::Bytes;

use crate::capture::{
    ConnEvent, ConnEventKind, ConnId, DataEvent, Direction, Event, ProcessInfo, Role, Syscall,
    Tuple,
};

#[derive(Clone, Debug)]
pub struct StormScenario {
    /// Requests the frontend starts, one every `interval_ns`.
    pub requests: u64,
    pub interval_ns: u64,
    /// Request index range during which db fails.
    pub fault: std::ops::Range<u64>,
    /// Send an Authorization/Cookie on every request (privacy tests).
    pub secrets: bool,
    /// First timestamp.
    pub start_ns: u64,
    /// api serves its requests two at a time on one thread, without trace context (an
    /// untraced event loop): no call of its can be placed under a request, so its verdicts
    /// are all `missing` and only failure shares speak for it.
    pub event_loop: bool,
}

impl Default for StormScenario {
    fn default() -> Self {
        StormScenario {
            requests: 3000,
            interval_ns: 10_000_000,
            fault: 1000..2000,
            secrets: true,
            start_ns: 1_000_000_000,
            event_loop: false,
        }
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

struct Side {
    conn: ConnId,
    role: Role,
    tuple: Tuple,
    tid: u32,
}

impl Side {
    fn data(&self, dir: Direction, ts: u64, payload: Vec<u8>) -> Event {
        Event::Data(DataEvent {
            conn: self.conn,
            role: self.role,
            direction: dir,
            syscall: if dir == Direction::Egress {
                Syscall::Write
            } else {
                Syscall::Read
            },
            tuple: Some(self.tuple),
            pid: self.conn.pid,
            tid: self.tid,
            goid: None,
            interleaved: false,
            ts_enter_ns: ts.saturating_sub(1_000),
            ts_exit_ns: ts,
            len: payload.len() as u64,
            payload: Bytes::from(payload),
        })
    }
    fn conn(&self, ts: u64, kind: ConnEventKind) -> Event {
        Event::Conn(ConnEvent {
            conn: self.conn,
            role: self.role,
            tuple: Some(self.tuple),
            pid: self.conn.pid,
            tid: self.tid,
            ts_ns: ts,
            kind,
        })
    }
}

/// A client/server pair of one loopback connection.
fn link(client: (u32, u32, u32), cport: u16, server: (u32, u32, u32), sport: u16) -> (Side, Side) {
    let c = Side {
        conn: ConnId {
            pid: client.0,
            fd: client.1,
            generation: 1,
        },
        role: Role::Client,
        tuple: Tuple {
            local: addr(cport),
            remote: addr(sport),
        },
        tid: client.2,
    };
    let s = Side {
        conn: ConnId {
            pid: server.0,
            fd: server.1,
            generation: 1,
        },
        role: Role::Server,
        tuple: Tuple {
            local: addr(sport),
            remote: addr(cport),
        },
        tid: server.2,
    };
    (c, s)
}

fn request(host: &str, path: &str, attempt: u32, secrets: bool) -> Vec<u8> {
    let mut r = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
    if attempt > 0 {
        r.push_str(&format!("X-Retry-Attempt: {attempt}\r\n"));
    }
    if secrets {
        r.push_str("Authorization: Bearer SECRET-TOKEN-42\r\nCookie: sid=SECRET-COOKIE-42\r\n");
    }
    r.push_str("\r\n");
    r.into_bytes()
}

fn response(ok: bool, secrets: bool) -> Vec<u8> {
    let (status, body) = if ok {
        ("200 OK", "ok")
    } else {
        ("503 Service Unavailable", "down")
    };
    let cookie = if secrets {
        "Set-Cookie: sid=SECRET-SETCOOKIE-42\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status}\r\n{cookie}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl StormScenario {
    /// The events, in time order (process metadata first).
    pub fn events(&self) -> Vec<Event> {
        let mut ev = Vec::new();
        for (pid, comm) in [(100, "frontend"), (200, "api"), (300, "db")] {
            ev.push(Event::Process(ProcessInfo {
                pid,
                comm: comm.into(),
                exe: Some(format!("/usr/bin/{comm}")),
                cgroup: None,
                container_id: None,
                netns: Some(4026531840),
                host_netns: Some(4026531840),
                workload: None,
                parent: None,
            }));
        }
        let (fe, api_in) = link((100, 10, 101), 40000, (200, 20, 201), 8080);
        let (api_out, db) = link((200, 21, 201), 40001, (300, 30, 301), 9090);
        let t0 = self.start_ns;
        for (c, s) in [(&fe, &api_in), (&api_out, &db)] {
            ev.push(c.conn(t0, ConnEventKind::Connect { errno: 0 }));
            ev.push(s.conn(t0 + 1_000, ConnEventKind::Accept));
        }
        if self.event_loop {
            // A second frontend connection and a second pool connection of api's, on api's
            // one thread; db serves each connection on a thread of its own.
            let (fe2, api_in2) = link((100, 11, 102), 40002, (200, 22, 201), 8080);
            let (api_out2, db2) = link((200, 23, 201), 40003, (300, 31, 302), 9090);
            for (c, s) in [(&fe2, &api_in2), (&api_out2, &db2)] {
                ev.push(c.conn(t0, ConnEventKind::Connect { errno: 0 }));
                ev.push(s.conn(t0 + 1_000, ConnEventKind::Accept));
            }
            self.interleaved(
                &mut ev,
                [(&fe, &api_in), (&fe2, &api_in2)],
                [(&api_out, &db), (&api_out2, &db2)],
            );
            return ev;
        }
        let step = 20_000; // 20 µs between hops
        for i in 0..self.requests {
            let mut t = t0 + 1_000_000 + i * self.interval_ns;
            let failing = self.fault.contains(&i);
            let mut fe_ok = false;
            for fe_attempt in 0..2u32 {
                let req = request("api", &format!("/orders/{i}"), fe_attempt, self.secrets);
                ev.push(fe.data(Direction::Egress, t, req.clone()));
                t += step;
                ev.push(api_in.data(Direction::Ingress, t, req));
                let mut api_ok = false;
                for db_attempt in 0..2u32 {
                    let q = request("db", "/query", db_attempt, self.secrets);
                    t += step;
                    ev.push(api_out.data(Direction::Egress, t, q.clone()));
                    t += step;
                    ev.push(db.data(Direction::Ingress, t, q));
                    let r = response(!failing, self.secrets);
                    t += step;
                    ev.push(db.data(Direction::Egress, t, r.clone()));
                    t += step;
                    ev.push(api_out.data(Direction::Ingress, t, r));
                    if !failing {
                        api_ok = true;
                        break;
                    }
                }
                let r = response(api_ok, self.secrets);
                t += step;
                ev.push(api_in.data(Direction::Egress, t, r.clone()));
                t += step;
                ev.push(fe.data(Direction::Ingress, t, r));
                if api_ok {
                    fe_ok = true;
                    break;
                }
            }
            let _ = fe_ok;
        }
        ev
    }

    /// The requests two by two, each step of the pair's exchanges taken by both in turn, so
    /// both are in flight on api's thread from their reads to their answers.
    fn interleaved(
        &self,
        ev: &mut Vec<Event>,
        fronts: [(&Side, &Side); 2],
        backs: [(&Side, &Side); 2],
    ) {
        let step = 20_000;
        for pair in (0..self.requests).step_by(2) {
            let mut t = self.start_ns + 1_000_000 + pair * self.interval_ns;
            let failing = self.fault.contains(&pair);
            for fe_attempt in 0..2u32 {
                for (k, (fe, api_in)) in (0u64..).zip(fronts) {
                    let req = request(
                        "api",
                        &format!("/orders/{}", pair + k),
                        fe_attempt,
                        self.secrets,
                    );
                    ev.push(fe.data(Direction::Egress, t, req.clone()));
                    t += step;
                    ev.push(api_in.data(Direction::Ingress, t, req));
                    t += step;
                }
                let mut api_ok = false;
                for db_attempt in 0..2u32 {
                    for (api_out, db) in backs {
                        let q = request("db", "/query", db_attempt, self.secrets);
                        ev.push(api_out.data(Direction::Egress, t, q.clone()));
                        t += step;
                        ev.push(db.data(Direction::Ingress, t, q));
                        t += step;
                    }
                    for (api_out, db) in backs {
                        let r = response(!failing, self.secrets);
                        ev.push(db.data(Direction::Egress, t, r.clone()));
                        t += step;
                        ev.push(api_out.data(Direction::Ingress, t, r));
                        t += step;
                    }
                    if !failing {
                        api_ok = true;
                        break;
                    }
                }
                for (fe, api_in) in fronts {
                    let r = response(api_ok, self.secrets);
                    ev.push(api_in.data(Direction::Egress, t, r.clone()));
                    t += step;
                    ev.push(fe.data(Direction::Ingress, t, r));
                    t += step;
                }
                if api_ok {
                    break;
                }
            }
        }
    }
}
