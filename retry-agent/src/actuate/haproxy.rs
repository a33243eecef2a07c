//! HAProxy actuator: keeps a suppression map in a running HAProxy up to date through its runtime
//! API (the stats socket), with `set map` / `add map` / `del map`. No reload, no restart.
//!
//! Map entry: `<callee service> <unix second the suppression ends>`. The config snippet in
//! deploy/haproxy/ compares that value with `date`, so HAProxy itself stops suppressing when the
//! TTL passes even if the agent is dead (fail open).
//!
//! The key is the backend's name (`be_name` in the snippet), found from the runtime API's
//! `show servers state`: the backends with a server at one of the decision's callee addresses
//! (operators name backends, not us); a backend named like the callee service is the fallback for
//! servers the listing cannot match (e.g. addresses still being resolved).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

use super::{
    ActiveSet, ActuateError, ActuateFuture, Actuator,
    control::{addr_matches, unix_ms},
    wire,
};
use crate::{correlate::Edge, decide::Decision};

pub const DEFAULT_SOCKET: &str = "/run/haproxy/admin.sock";
pub const DEFAULT_MAP: &str = "/etc/haproxy/retry-suppress.map";
const TIMEOUT: Duration = Duration::from_secs(2);
/// Runtime API answers are short; anything longer is cut here.
const MAX_REPLY: u64 = 64 << 10;

pub struct HaproxyActuator {
    socket: PathBuf,
    map: String,
    active: ActiveSet,
    /// Map keys (backend names) each edge's suppression set, so lifting removes exactly those.
    held: BTreeMap<Edge, Vec<String>>,
}

/// Backends of a `show servers state` listing with a server at one of `addrs` (an unspecified IP
/// in `addrs` matches any server on that port), in listing order, without repeats; plus, when
/// none matches, `fallback` if a backend of that name is listed.
pub fn backends_serving(state: &str, addrs: &[SocketAddr], fallback: &str) -> Vec<String> {
    // Columns are named by the `# be_id be_name …` header line (their order is HAProxy's).
    let mut cols: Option<(usize, usize, usize)> = None;
    let (mut found, mut names) = (Vec::<String>::new(), BTreeSet::<&str>::new());
    for line in state.lines() {
        if let Some(h) = line.strip_prefix('#') {
            let pos = |n: &str| h.split_whitespace().position(|c| c == n);
            cols = pos("be_name")
                .zip(pos("srv_addr"))
                .zip(pos("srv_port"))
                .map(|((b, a), p)| (b, a, p));
            continue;
        }
        let Some((bc, ac, pc)) = cols else { continue };
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(be), Some(ip), Some(port)) = (f.get(bc), f.get(ac), f.get(pc)) else {
            continue;
        };
        names.insert(be);
        let server = ip
            .parse::<IpAddr>()
            .ok()
            .zip(port.parse::<u16>().ok())
            .map(|(i, p)| SocketAddr::new(i, p));
        if server.is_some_and(|s| addrs.iter().any(|a| addr_matches(a, &s)))
            && !found.iter().any(|n| n == be)
        {
            found.push((*be).to_string());
        }
    }
    if found.is_empty() && names.contains(fallback) {
        found.push(fallback.to_string());
    }
    found
}

impl HaproxyActuator {
    pub fn new(socket: PathBuf, map: String) -> HaproxyActuator {
        HaproxyActuator {
            socket,
            map,
            active: ActiveSet::default(),
            held: BTreeMap::new(),
        }
    }

    /// The backends (map keys) serving `d`'s callee.
    async fn backends_for(
        &self,
        d: &Decision,
        state: &mut Option<String>,
    ) -> Result<Vec<String>, ActuateError> {
        if state.is_none() {
            *state = Some(self.command("show servers state").await?);
        }
        let found = backends_serving(
            state.as_deref().unwrap_or_default(),
            &d.callee_addrs,
            d.edge.callee.as_str(),
        );
        if found.is_empty() {
            return Err(ActuateError::Invalid(format!(
                "no HAProxy backend has a server at {:?} (callee {})",
                d.callee_addrs, d.edge.callee
            )));
        }
        match found.iter().find(|k| !valid_key(k)) {
            Some(bad) => Err(ActuateError::Invalid(format!(
                "backend {bad:?} is not a valid map key"
            ))),
            None => Ok(found),
        }
    }

    async fn enforce(
        &mut self,
        d: &Decision,
        state: &mut Option<String>,
    ) -> Result<(), ActuateError> {
        let keys = self.backends_for(d, state).await?;
        // Held before it is set, so a half-done change is still removed later.
        let old = self
            .held
            .insert(d.edge.clone(), keys.clone())
            .unwrap_or_default();
        // Round up so a sub-second TTL still suppresses for the current second.
        let until_s = unix_ms().saturating_add(wire::ms(d.ttl())).div_ceil(1000);
        for k in &keys {
            self.upsert(k, &until_s.to_string()).await?;
        }
        let still: BTreeSet<&String> = self.held.values().flatten().collect();
        for k in old.iter().filter(|k| !still.contains(k)) {
            self.remove(k).await?;
        }
        Ok(())
    }

    /// Removes what `edge` set, except keys another edge still holds.
    async fn lift(&mut self, edge: &Edge) -> Result<(), ActuateError> {
        let Some(keys) = self.held.remove(edge) else {
            return Ok(());
        };
        let still: BTreeSet<&String> = self.held.values().flatten().collect();
        let mut first_err = None;
        for k in keys.iter().filter(|k| !still.contains(k)) {
            if let Err(e) = self.remove(k).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Sends one command (non-interactive mode: HAProxy answers and closes).
    pub async fn command(&self, cmd: &str) -> Result<String, ActuateError> {
        let io = |source| ActuateError::HaproxyIo {
            path: self.socket.clone(),
            source,
        };
        let fut = async {
            let mut s = UnixStream::connect(&self.socket).await.map_err(io)?;
            s.write_all(format!("{cmd}\n").as_bytes())
                .await
                .map_err(io)?;
            let mut reply = Vec::new();
            (&mut s)
                .take(MAX_REPLY)
                .read_to_end(&mut reply)
                .await
                .map_err(io)?;
            Ok(String::from_utf8_lossy(&reply).trim().to_string())
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| ActuateError::Timeout { what: "haproxy" })?
    }

    /// Sets `key value` in the map, adding the entry if it is not there yet.
    pub async fn upsert(&self, key: &str, value: &str) -> Result<(), ActuateError> {
        let set = format!("set map {} {key} {value}", self.map);
        let reply = self.command(&set).await?;
        if reply.is_empty() {
            return Ok(());
        }
        if !reply.to_ascii_lowercase().contains("not found") {
            return Err(ActuateError::HaproxyCommand {
                command: set,
                reply,
            });
        }
        let add = format!("add map {} {key} {value}", self.map);
        let reply = self.command(&add).await?;
        if reply.is_empty() {
            Ok(())
        } else {
            Err(ActuateError::HaproxyCommand {
                command: add,
                reply,
            })
        }
    }

    /// Removes `key`; absent is fine.
    pub async fn remove(&self, key: &str) -> Result<(), ActuateError> {
        let del = format!("del map {} {key}", self.map);
        let reply = self.command(&del).await?;
        if reply.is_empty() || reply.to_ascii_lowercase().contains("not found") {
            Ok(())
        } else {
            Err(ActuateError::HaproxyCommand {
                command: del,
                reply,
            })
        }
    }
}

/// Map keys go on a command line: refuse anything that could split or inject a command.
pub fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 256
        && k.bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b'\\')
}

impl Actuator for HaproxyActuator {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(async move {
            let ch = self.active.update(decisions, std::time::Instant::now());
            let mut first_err = None;
            for d in &ch.removed {
                if let Err(e) = self.lift(&d.edge).await {
                    first_err.get_or_insert(e);
                }
            }
            // One `show servers state` per batch, only when something is to be set.
            let mut state = None;
            for d in &ch.upserted {
                if let Err(e) = self.enforce(d, &mut state).await {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// Entries would lapse by their own time; removing them ends the suppression now.
    fn shutdown(&mut self) -> ActuateFuture<'_> {
        Box::pin(async move {
            let edges: Vec<Edge> = self.held.keys().cloned().collect();
            let mut first_err = None;
            for e in &edges {
                if let Err(err) = self.lift(e).await {
                    first_err.get_or_insert(err);
                }
            }
            self.active = ActiveSet::default();
            first_err.map_or(Ok(()), Err)
        })
    }
}
