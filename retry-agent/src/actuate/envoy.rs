//! Envoy actuator (UNTESTED against a real Envoy here: no Envoy on the build machine).
//!
//! Route: the admin API's `POST /runtime_modify`. For a suppressed edge into cluster `C` (the
//! callee's service id) it sets `circuit_breakers.C.default.max_retries=0`, Envoy's per-cluster
//! runtime override of the retry circuit breaker, so no retry to C is admitted; lifting sets the key
//! to the empty value, which removes the override from the admin layer. `upstream.use_retry`
//! (percent of routes that may retry at all) is global to the Envoy, so it is only driven for the
//! wildcard callee `*`. Runtime overrides do not expire on their own: with a dead agent they stay
//! until Envoy restarts — unlike the shim and HAProxy routes.
use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::{ActiveSet, ActuateError, ActuateFuture, Actuator, haproxy::valid_key};
use crate::decide::Decision;

pub const DEFAULT_ADMIN: &str = "127.0.0.1:9901";
const TIMEOUT: Duration = Duration::from_secs(2);

pub fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9901))
}

pub struct EnvoyActuator {
    admin: SocketAddr,
    active: ActiveSet,
}

/// The runtime key/value pairs that enforce (`suppress = true`) or lift a decision on `callee`.
pub fn runtime_keys(callee: &str, suppress: bool) -> Vec<(String, String)> {
    let v = |on: &str| if suppress { on.to_string() } else { String::new() };
    if callee == "*" {
        vec![("upstream.use_retry".to_string(), v("0"))]
    } else {
        vec![(format!("circuit_breakers.{callee}.default.max_retries"), v("0"))]
    }
}

impl EnvoyActuator {
    pub fn new(admin: SocketAddr) -> EnvoyActuator {
        EnvoyActuator { admin, active: ActiveSet::default() }
    }

    /// `POST /runtime_modify?k=v&...` and check for a 200.
    pub async fn runtime_modify(&self, kv: &[(String, String)]) -> Result<(), ActuateError> {
        let query: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let req = format!(
            "POST /runtime_modify?{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            query.join("&"),
            self.admin
        );
        let io = |source| ActuateError::EnvoyIo { addr: self.admin, source };
        let fut = async {
            let mut s = TcpStream::connect(self.admin).await.map_err(io)?;
            s.write_all(req.as_bytes()).await.map_err(io)?;
            let mut reply = Vec::new();
            (&mut s).take(64 << 10).read_to_end(&mut reply).await.map_err(io)?;
            Ok::<_, ActuateError>(String::from_utf8_lossy(&reply).into_owned())
        };
        let reply = tokio::time::timeout(TIMEOUT, fut).await.map_err(|_| ActuateError::Timeout { what: "envoy admin" })??;
        let status = reply.lines().next().unwrap_or_default().to_string();
        if status.split_whitespace().nth(1) == Some("200") {
            Ok(())
        } else {
            let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default().chars().take(200).collect();
            Err(ActuateError::EnvoyStatus { addr: self.admin, status, body })
        }
    }
}

impl Actuator for EnvoyActuator {
    fn name(&self) -> &'static str {
        "envoy"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        Box::pin(async move {
            let ch = self.active.update(decisions, std::time::Instant::now());
            let mut first_err = None;
            let changes = ch.upserted.iter().map(|d| (d, true)).chain(ch.removed.iter().map(|d| (d, false)));
            for (d, suppress) in changes {
                let callee = d.edge.callee.as_str();
                if callee != "*" && !valid_key(callee) {
                    first_err.get_or_insert(ActuateError::Invalid(format!("cluster {callee:?} is not a valid key")));
                    continue;
                }
                if !suppress && self.active.remaining(std::time::Instant::now()).any(|(a, _)| a.edge.callee == d.edge.callee) {
                    continue;
                }
                if let Err(e) = self.runtime_modify(&runtime_keys(callee, suppress)).await {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }
}
