//! The bookkeeping shared by actuators that control a proxy per *target* (Envoy clusters, HAProxy
//! backends): which edge's suppression set which targets, so that lifting an edge removes exactly
//! what it set — except targets another edge still holds — and a half-done change is still lifted
//! later. The proxy's own calls sit behind [`TargetProxy`]; [`Held`] does the rest.
use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::Instant,
};

use super::{ActiveSet, ActuateError};
use crate::{correlate::Edge, decide::Decision};

/// One proxy's per-target retry control.
pub trait TargetProxy: Send + Sync {
    /// What one override covers (a cluster, a map key).
    type Target: Ord + Clone + Send + Sync;
    /// What the proxy lists to resolve callees to targets, fetched at most once per batch.
    type Listing: Send;

    /// The targets serving `d`'s callee (fetching `listing` if this batch has not yet).
    fn resolve(
        &self,
        d: &Decision,
        listing: &mut Option<Self::Listing>,
    ) -> impl Future<Output = Result<Vec<Self::Target>, ActuateError>> + Send;
    /// Suppress retries into `target` until the unix second `until_s`.
    fn set(
        &self,
        target: &Self::Target,
        until_s: u64,
    ) -> impl Future<Output = Result<(), ActuateError>> + Send;
    /// Remove the override on `target` (absent is fine).
    fn clear(&self, target: &Self::Target)
    -> impl Future<Output = Result<(), ActuateError>> + Send;
}

/// The first error of a batch; the batch goes on past it (one bad edge must not keep the others).
#[derive(Default)]
pub struct FirstError(Option<ActuateError>);

impl FirstError {
    pub fn note(&mut self, r: Result<(), ActuateError>) {
        if let Err(e) = r {
            self.0.get_or_insert(e);
        }
    }

    pub fn into_result(self) -> Result<(), ActuateError> {
        self.0.map_or(Ok(()), Err)
    }
}

/// A proxy with the edges' active suppressions and what each set.
pub struct Held<P: TargetProxy> {
    pub proxy: P,
    active: ActiveSet,
    by_edge: BTreeMap<Edge, Vec<P::Target>>,
}

impl<P: TargetProxy> Held<P> {
    pub fn new(proxy: P) -> Held<P> {
        Held {
            proxy,
            active: ActiveSet::default(),
            by_edge: BTreeMap::new(),
        }
    }

    /// Every target some edge holds now.
    pub fn held(&self) -> BTreeSet<&P::Target> {
        self.by_edge.values().flatten().collect()
    }

    /// New decisions at `now` (`&[]` = tick): lapsed and allowed edges are lifted, suppressed
    /// ones set (with one listing for the whole batch).
    pub async fn apply(
        &mut self,
        decisions: &[Decision],
        now: Instant,
    ) -> Result<(), ActuateError> {
        let ch = self.active.update(decisions, now);
        let mut err = FirstError::default();
        for d in &ch.removed {
            err.note(self.lift(&d.edge).await);
        }
        let mut listing = None;
        for d in &ch.upserted {
            err.note(self.enforce(d, &mut listing).await);
        }
        err.into_result()
    }

    /// Lifts every edge (the agent is stopping).
    pub async fn lift_all(&mut self) -> Result<(), ActuateError> {
        let edges: Vec<Edge> = self.by_edge.keys().cloned().collect();
        let mut err = FirstError::default();
        for e in &edges {
            err.note(self.lift(e).await);
        }
        self.active = ActiveSet::default();
        err.into_result()
    }

    /// Clears what `edge` held, except targets another edge still holds.
    async fn lift(&mut self, edge: &Edge) -> Result<(), ActuateError> {
        let Some(targets) = self.by_edge.remove(edge) else {
            return Ok(());
        };
        let still = self.held();
        let mut err = FirstError::default();
        for t in targets.iter().filter(|t| !still.contains(t)) {
            err.note(self.proxy.clear(t).await);
        }
        err.into_result()
    }

    async fn enforce(
        &mut self,
        d: &Decision,
        listing: &mut Option<P::Listing>,
    ) -> Result<(), ActuateError> {
        let targets = self.proxy.resolve(d, listing).await?;
        // Held before it is set, so a half-done change is still lifted later.
        let old = self
            .by_edge
            .insert(d.edge.clone(), targets.clone())
            .unwrap_or_default();
        // Round up so a sub-second TTL still covers the current second; the TTL is capped
        // (`Decision::ttl`) and the sum saturates, so no TTL wraps into the past.
        let until_s = super::control::unix_ms()
            .saturating_add(super::wire::ms(d.ttl()))
            .div_ceil(1000);
        for t in &targets {
            self.proxy.set(t, until_s).await?;
        }
        // Targets this edge no longer resolves to (endpoints moved) are cleared.
        let still = self.held();
        for t in old.iter().filter(|t| !still.contains(t)) {
            self.proxy.clear(t).await?;
        }
        Ok(())
    }
}
