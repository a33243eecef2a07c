//! HAProxy actuator: keeps a suppression map in a running HAProxy up to date through its runtime
//! API (the stats socket), with `set map` / `add map` / `del map`. No reload, no restart.
//!
//! Map entry: `<callee service> <unix second the suppression ends>`. The config snippet in
//! deploy/haproxy/ compares that value with `date`, so HAProxy itself stops suppressing when the
//! TTL passes even if the agent is dead (fail open). The backend name must be the callee's
//! service id (or the map key the snippet looks up).
use std::{path::PathBuf, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

use super::{ActiveSet, ActuateError, ActuateFuture, Actuator, control::unix_ms};
use crate::decide::Decision;

pub const DEFAULT_SOCKET: &str = "/run/haproxy/admin.sock";
pub const DEFAULT_MAP: &str = "/etc/haproxy/retry-suppress.map";
const TIMEOUT: Duration = Duration::from_secs(2);
/// Runtime API answers are short; anything longer is cut here.
const MAX_REPLY: u64 = 64 << 10;

pub struct HaproxyActuator {
    socket: PathBuf,
    map: String,
    active: ActiveSet,
}

impl HaproxyActuator {
    pub fn new(socket: PathBuf, map: String) -> HaproxyActuator {
        HaproxyActuator { socket, map, active: ActiveSet::default() }
    }

    /// Sends one command (non-interactive mode: HAProxy answers and closes).
    pub async fn command(&self, cmd: &str) -> Result<String, ActuateError> {
        let io = |source| ActuateError::HaproxyIo { path: self.socket.clone(), source };
        let fut = async {
            let mut s = UnixStream::connect(&self.socket).await.map_err(io)?;
            s.write_all(format!("{cmd}\n").as_bytes()).await.map_err(io)?;
            let mut reply = Vec::new();
            (&mut s).take(MAX_REPLY).read_to_end(&mut reply).await.map_err(io)?;
            Ok(String::from_utf8_lossy(&reply).trim().to_string())
        };
        tokio::time::timeout(TIMEOUT, fut).await.map_err(|_| ActuateError::Timeout { what: "haproxy" })?
    }

    /// Sets `key value` in the map, adding the entry if it is not there yet.
    pub async fn upsert(&self, key: &str, value: &str) -> Result<(), ActuateError> {
        let set = format!("set map {} {key} {value}", self.map);
        let reply = self.command(&set).await?;
        if reply.is_empty() {
            return Ok(());
        }
        if !reply.to_ascii_lowercase().contains("not found") {
            return Err(ActuateError::HaproxyCommand { command: set, reply });
        }
        let add = format!("add map {} {key} {value}", self.map);
        let reply = self.command(&add).await?;
        if reply.is_empty() { Ok(()) } else { Err(ActuateError::HaproxyCommand { command: add, reply }) }
    }

    /// Removes `key`; absent is fine.
    pub async fn remove(&self, key: &str) -> Result<(), ActuateError> {
        let del = format!("del map {} {key}", self.map);
        let reply = self.command(&del).await?;
        if reply.is_empty() || reply.to_ascii_lowercase().contains("not found") {
            Ok(())
        } else {
            Err(ActuateError::HaproxyCommand { command: del, reply })
        }
    }
}

/// Map keys go on a command line: refuse anything that could split or inject a command.
pub fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 256 && k.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b'\\')
}

impl Actuator for HaproxyActuator {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(async move {
            let ch = self.active.update(decisions, std::time::Instant::now());
            let mut first_err = None;
            for d in &ch.upserted {
                let key = d.edge.callee.as_str();
                if !valid_key(key) {
                    first_err.get_or_insert(ActuateError::Invalid(format!("service {key:?} is not a valid map key")));
                    continue;
                }
                // Round up so a sub-second TTL still suppresses for the current second.
                let until_s = (unix_ms() + d.ttl_ms).div_ceil(1000);
                if let Err(e) = self.upsert(key, &until_s.to_string()).await {
                    first_err.get_or_insert(e);
                }
            }
            for d in &ch.removed {
                let key = d.edge.callee.as_str();
                // A later decision for another caller of the same callee may still hold the key.
                let still = self.active.remaining(std::time::Instant::now()).any(|(a, _)| a.edge.callee == d.edge.callee);
                if valid_key(key)
                    && !still
                    && let Err(e) = self.remove(key).await
                {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }
}
