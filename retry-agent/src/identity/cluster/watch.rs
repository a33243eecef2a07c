//! The API watches feeding [`ClusterIndex`]: one `kube::runtime::watcher` per kind, each
//! applying its events under the index's write lock. Errors are counted (`api_watch`) and the
//! watcher re-lists after a backoff; the agent never stops for them.
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::ReplicaSet, core::v1::Pod, core::v1::Service, discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::{ClusterIndex, ObjectKind};
use crate::identity::{FailureReason, resolver::Shared};

pub(super) async fn run(index: Arc<RwLock<ClusterIndex>>, shared: Arc<Shared>) {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "Kubernetes API client unavailable: remote addresses stay unnamed");
            shared.failures.count(FailureReason::ApiWatch);
            return;
        }
    };
    info!("watching pods, services, endpointslices and replicasets for names");
    tokio::join!(
        watch::<Pod>(
            client.clone(),
            index.clone(),
            shared.clone(),
            ObjectKind::Pod,
            ClusterIndex::apply_pod,
            ClusterIndex::delete_pod
        ),
        watch::<ReplicaSet>(
            client.clone(),
            index.clone(),
            shared.clone(),
            ObjectKind::ReplicaSet,
            ClusterIndex::apply_replicaset,
            ClusterIndex::delete_replicaset,
        ),
        watch::<Service>(
            client.clone(),
            index.clone(),
            shared.clone(),
            ObjectKind::Service,
            ClusterIndex::apply_service,
            ClusterIndex::delete_service
        ),
        watch::<EndpointSlice>(
            client,
            index,
            shared,
            ObjectKind::EndpointSlice,
            ClusterIndex::apply_slice,
            ClusterIndex::delete_slice
        ),
    );
}

async fn watch<K>(
    client: Client,
    index: Arc<RwLock<ClusterIndex>>,
    shared: Arc<Shared>,
    kind: ObjectKind,
    apply: fn(&mut ClusterIndex, &K),
    delete: fn(&mut ClusterIndex, &K),
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                shared.failures.count(FailureReason::ApiWatch);
                warn!(?kind, error = %e, "Kubernetes watch failed; it restarts");
                continue;
            }
        };
        let Ok(mut ix) = index.write() else { return };
        match ev {
            watcher::Event::Init => ix.clear(kind),
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => apply(&mut ix, &o),
            watcher::Event::Delete(o) => delete(&mut ix, &o),
            watcher::Event::InitDone => {}
        }
    }
}
