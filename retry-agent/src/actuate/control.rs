//! The agent ↔ shim control socket: the agent serves [`wire::Snapshot`] lines to every shim
//! that connects ([`ControlActuator`]); a shim follows them ([`follow`]) into a [`ControlView`]
//! that expires entries locally. The protocol itself is documented in [`super::wire`].
use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::watch,
    task::JoinHandle,
};

use super::{
    ActiveSet, ActuateError, ActuateFuture, Actuator,
    wire::{self, ClaimEntry, MAX_LINE, Snapshot, Suppression},
};
use crate::{
    correlate::ServiceClaim,
    decide::{Decision, Reason},
    l7::Claim,
};

/// Snapshots are re-sent at least this often, so a shim's view never ages past one heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Claims are republished every second; a shim that stops hearing them drops them after this.
pub const CLAIM_TTL: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct State {
    active: ActiveSet,
    claims: Vec<(ServiceClaim, Instant)>,
    seq: u64,
}

impl State {
    fn snapshot(&self, now: Instant) -> Snapshot {
        let suppress = self
            .active
            .remaining(now)
            .map(|(d, left)| Suppression::new(d, left))
            .collect();
        let claims = self
            .claims
            .iter()
            .filter_map(|(c, until)| {
                let left = until.saturating_duration_since(now);
                if left.is_zero() {
                    None
                } else {
                    ClaimEntry::new(c, left)
                }
            })
            .collect();
        Snapshot {
            v: wire::VERSION,
            seq: self.seq,
            sent_unix_ms: unix_ms(),
            suppress,
            claims,
        }
    }
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(wire::ms)
        .unwrap_or(0)
}

/// Agent side: serves snapshots to every connected shim.
pub struct ControlActuator {
    path: PathBuf,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    server: JoinHandle<()>,
}

impl ControlActuator {
    /// Binds the socket (creating its directory, replacing a stale socket file) and starts serving.
    pub fn bind(path: &Path) -> Result<ControlActuator, ActuateError> {
        tokio::runtime::Handle::try_current().map_err(|_| ActuateError::NoRuntime)?;
        let err = |source| ActuateError::ControlSocket {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        if path.exists() {
            // A live agent answers; a stale file from a crash does not and is replaced.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another agent is serving it",
                )));
            }
            std::fs::remove_file(path).map_err(err)?;
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        let state = Arc::new(Mutex::new(State::default()));
        let (changed, rx) = watch::channel(0u64);
        let server = tokio::spawn(serve(listener, state.clone(), rx));
        Ok(ControlActuator {
            path: path.to_path_buf(),
            state,
            changed,
            server,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The snapshot a shim connecting now would receive.
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.state).snapshot(Instant::now())
    }

    fn update(&mut self, f: impl FnOnce(&mut State) -> bool) {
        let seq = {
            let mut st = lock(&self.state);
            if !f(&mut st) {
                return;
            }
            st.seq += 1;
            st.seq
        };
        self.changed.send_replace(seq);
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave State inconsistent in a way that matters here.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for ControlActuator {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Actuator for ControlActuator {
    fn name(&self) -> &'static str {
        "control"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        let now = Instant::now();
        self.update(|st| {
            let ch = st.active.update(decisions, now);
            !ch.upserted.is_empty() || !ch.removed.is_empty()
        });
        Box::pin(async { Ok(()) })
    }

    fn publish_claims<'a>(&'a mut self, claims: &'a [ServiceClaim]) -> ActuateFuture<'a> {
        let now = Instant::now();
        self.update(|st| {
            st.claims = claims
                .iter()
                .filter(|c| c.claim != Claim::Missing)
                .map(|c| (c.clone(), now + CLAIM_TTL))
                .collect();
            true
        });
        Box::pin(async { Ok(()) })
    }
}

async fn serve(listener: UnixListener, state: Arc<Mutex<State>>, rx: watch::Receiver<u64>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(feed(stream, state.clone(), rx.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Streams snapshots to one shim until it goes away.
async fn feed(mut stream: UnixStream, state: Arc<Mutex<State>>, mut rx: watch::Receiver<u64>) {
    let mut beat = tokio::time::interval(HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rx.mark_changed();
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = beat.tick() => {}
        }
        let snap = lock(&state).snapshot(Instant::now());
        let line = match wire::encode(&snap) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot serialize control snapshot");
                return;
            }
        };
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&line)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "shim went away");
                return;
            }
            Err(_) => {
                tracing::warn!("shim not reading its control socket; dropping it");
                return;
            }
        }
    }
}

/// Shim side: what the agent last said, expiring locally. Cheap to query per request.
#[derive(Debug, Default)]
pub struct ControlView {
    inner: RwLock<View>,
}

#[derive(Debug, Default)]
struct View {
    /// Callee addresses, why, until when.
    suppress: Vec<(Vec<SocketAddr>, Reason, Instant)>,
    /// Service addresses, their claim, until when.
    claims: Vec<(Vec<SocketAddr>, Claim, Instant)>,
    seq: u64,
    received: Option<Instant>,
}

/// Whether `pattern` (a callee or service address; unspecified IP = any IP) covers `dst`.
pub fn addr_matches(pattern: &SocketAddr, dst: &SocketAddr) -> bool {
    let canon = |ip: std::net::IpAddr| ip.to_canonical();
    pattern.port() == dst.port()
        && (pattern.ip().is_unspecified() || canon(pattern.ip()) == canon(dst.ip()))
}

impl ControlView {
    pub fn new() -> Arc<ControlView> {
        Arc::new(ControlView::default())
    }

    /// Replaces the view with a snapshot received at `now`. Entries this build cannot read (a
    /// reason or claim from a newer minor revision) are left out: not acting is the safe side.
    pub fn replace(&self, snap: &Snapshot, now: Instant) {
        // Remaining times are capped (wire::MAX_REMAINING_MS) and the addition checked: no value
        // on the socket can panic the follow task. An entry whose deadline cannot be
        // represented is left out (not acting is the safe side).
        let until = |left: Duration| now.checked_add(left);
        let mut v = self.inner.write().unwrap_or_else(|p| p.into_inner());
        v.suppress = snap
            .suppress
            .iter()
            .filter_map(|s| {
                Some((
                    s.callee_addrs.clone(),
                    s.reason.known()?,
                    until(s.remaining())?,
                ))
            })
            .collect();
        v.claims = snap
            .claims
            .iter()
            .filter_map(|c| Some((c.addrs.clone(), c.claim.known()?, until(c.remaining())?)))
            .collect();
        v.seq = snap.seq;
        v.received = Some(now);
    }

    /// The reason retries to `dst` are suppressed, if an unexpired decision covers it.
    pub fn suppression(&self, dst: &SocketAddr, now: Instant) -> Option<Reason> {
        let v = self.inner.read().unwrap_or_else(|p| p.into_inner());
        v.suppress
            .iter()
            .find(|(addrs, _, until)| *until > now && addrs.iter().any(|a| addr_matches(a, dst)))
            .map(|(_, reason, _)| *reason)
    }

    /// The claim for errors of the service listening at `dst`, if the agent gave one.
    pub fn claim(&self, dst: &SocketAddr, now: Instant) -> Option<Claim> {
        let v = self.inner.read().unwrap_or_else(|p| p.into_inner());
        v.claims
            .iter()
            .find(|(addrs, _, until)| *until > now && addrs.iter().any(|a| addr_matches(a, dst)))
            .map(|(_, c, _)| *c)
    }

    /// Sequence number of the last snapshot (0 = none yet).
    pub fn seq(&self) -> u64 {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).seq
    }
}

/// Shim side: follows the agent forever, reconnecting with capped exponential backoff. Never
/// returns; errors are logged. The view keeps expiring on its own while disconnected.
pub async fn follow(path: PathBuf, view: Arc<ControlView>) {
    let mut backoff = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    loop {
        match UnixStream::connect(&path).await {
            Ok(stream) => {
                tracing::info!(path = %path.display(), "connected to the agent");
                backoff = Duration::from_millis(50);
                if let Err(e) = read_snapshots(stream, &view).await {
                    tracing::warn!(error = %e, "control stream ended");
                }
            }
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "agent not reachable"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn read_snapshots(stream: UnixStream, view: &ControlView) -> io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    // One warning per connection: the agent sends a line a second.
    let mut warned = false;
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control line too long or truncated",
            ));
        }
        match wire::decode(&line) {
            Ok(s) => view.replace(&s, Instant::now()),
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(error = %e, "ignoring control lines this shim cannot read; forwarding unchanged");
            }
            Err(e) => tracing::debug!(error = %e, "control line ignored"),
        }
    }
}
