//! What became of the pods behind persistent registrations, served from a
//! cache of labelled pods so that a reconcile asks the API server nothing
//! per participant.
//!
//! Init containers register with persistent nodes that outlive them; the
//! controller removes those whose pod ended. Pods labelled
//! `zkgate.io/barrier` / `zkgate.io/lock` are watched (a reflector per
//! label, each pod stripped to the few fields read here), so their end
//! triggers a reconcile and their fate is a lookup. A registration whose pod
//! is not in the cache (unlabelled, or not listed yet) is looked up by a GET,
//! at most [`MAX_GETS`] per reconcile.

use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;

use super::metrics::Metrics;
use crate::zk::tree::ChildNode;
use crate::zk::ParticipantData;

/// The most pods one reconcile GETs (those not in the cache); the rest are
/// looked at on the next look, which a resource with persistent
/// registrations has every [`super::reconciler::POD_RECHECK`].
pub const MAX_GETS: usize = 50;
/// GETs in flight at once within one reconcile.
const GETS_IN_FLIGHT: usize = 8;

/// What became of the pod behind a persistent registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodFate {
    /// Still running (or not started yet): keep the registration.
    Alive,
    /// Being deleted (a deletion timestamp) and not finished: it will
    /// start no container it has not started. A kubelet may SIGKILL the
    /// init containers of such a pod without a SIGTERM (1.20's did), so an init
    /// container's registration outlives its process until the pod is gone.
    Terminating,
    /// Finished (Succeeded or Failed).
    Finished,
    /// Gone, or replaced by a new pod with the same name.
    Gone,
}

/// Whether `pod` is another pod than the one `who` registered for: the
/// registration names a uid, and it is not `pod`'s.
fn another_pod(pod: &Pod, who: &ParticipantData) -> bool {
    who.pod_uid
        .as_deref()
        .is_some_and(|uid| pod.uid().as_deref() != Some(uid))
}

impl PodFate {
    /// The fate of `pod` for a registration naming `who`.
    fn of(pod: &Pod, who: &ParticipantData) -> PodFate {
        if another_pod(pod, who) {
            return PodFate::Gone;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        match phase {
            Some("Succeeded") | Some("Failed") => PodFate::Finished,
            _ if pod.metadata.deletion_timestamp.is_some() => PodFate::Terminating,
            _ => PodFate::Alive,
        }
    }
}

/// Drops what the controller never reads from a watched pod (its spec,
/// managed fields, annotations, container statuses): a cached pod costs a
/// few hundred bytes instead of tens of kilobytes.
pub fn strip(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        labels: meta.labels,
        deletion_timestamp: meta.deletion_timestamp,
        resource_version: meta.resource_version,
        ..Default::default()
    };
    pod.spec = None;
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        // Whether it is Ready (a Barrier may start after its pods are).
        conditions: s.conditions.map(|c| {
            c.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| k8s_openapi::api::core::v1::PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    });
}

/// Whether `pod` runs with its `Ready` condition true.
fn ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A watch of the pods labelled `label`, stripped, feeding `store`: the
/// stream of changed pods triggers reconciles (see
/// `Controller::watches_stream`).
pub fn watch(
    api: Api<Pod>,
    label: &str,
) -> (
    Store<Pod>,
    impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().labels(label))
        .default_backoff()
        .modify(strip)
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

/// The caches of labelled pods and the fallback for the others.
pub struct Pods {
    /// The API client, for pods not in a cache.
    pub client: kube::Client,
    /// The labelled pods' caches.
    pub caches: Vec<Store<Pod>>,
    /// Counts lookups by where they were answered.
    pub metrics: Arc<Metrics>,
}

impl Pods {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let key = ObjectRef::new(name).within(namespace);
        self.caches.iter().find_map(|cache| cache.get(&key))
    }

    /// Those of the pods `names` (in `namespace`) that do not run Ready
    /// (gone ones among them), from the cache, else by a GET each, or, past
    /// [`MAX_GETS`] of them, by one list of the namespace's pods.
    pub async fn not_ready(
        &self,
        namespace: &str,
        names: &[String],
    ) -> Result<Vec<String>, kube::Error> {
        let mut not_ready = Vec::new();
        let mut uncached = Vec::new();
        for name in names {
            match self.cached(namespace, name) {
                Some(pod) if ready(&pod) => {}
                Some(_) => not_ready.push(name.clone()),
                None => uncached.push(name.clone()),
            }
        }
        self.metrics
            .pod_lookups((names.len() - uncached.len()) as u64, uncached.len() as u64);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        if uncached.len() > MAX_GETS {
            // From the API server's cache (`resourceVersion=0`), not etcd.
            let listed: std::collections::HashMap<String, bool> = pods
                .list(&kube::api::ListParams::default().match_any())
                .await?
                .items
                .iter()
                .map(|p| (p.name_any(), ready(p)))
                .collect();
            not_ready.extend(
                uncached
                    .into_iter()
                    .filter(|name| !listed.get(name).copied().unwrap_or(false)),
            );
        } else {
            let fetched: Vec<Option<String>> = futures::stream::iter(uncached)
                .map(|name| {
                    let pods = pods.clone();
                    async move {
                        let ok = pods.get_opt(&name).await?.is_some_and(|p| ready(&p));
                        Ok::<_, kube::Error>((!ok).then_some(name))
                    }
                })
                .buffer_unordered(GETS_IN_FLIGHT)
                .try_collect()
                .await?;
            not_ready.extend(fetched.into_iter().flatten());
        }
        not_ready.sort();
        Ok(not_ready)
    }

    /// The fates of the pods behind `nodes` (persistent registrations in
    /// `namespace`). A registration that names no pod is someone else's to
    /// manage: Alive. Past [`MAX_GETS`] uncached pods, the rest are Alive
    /// until the next look.
    ///
    /// Never Gone from the cache alone when the cached pod has another uid
    /// than the registration: the cache may lag behind a pod replaced under
    /// the same name (the registration being the new pod's), so such a pod
    /// is looked up by a GET like an uncached one, and Gone only if the API
    /// server says so.
    pub async fn fates<'n>(
        &self,
        namespace: &str,
        nodes: impl IntoIterator<Item = &'n ChildNode>,
    ) -> Result<Vec<(&'n ChildNode, PodFate)>, kube::Error> {
        let nodes: Vec<&'n ChildNode> = nodes.into_iter().collect();
        let mut fates = Vec::with_capacity(nodes.len());
        let mut uncached = Vec::new();
        let mut hits = 0;
        for (index, node) in nodes.iter().enumerate() {
            let who = ParticipantData::parse(&node.data);
            let Some(name) = who.pod.clone() else {
                fates.push((*node, PodFate::Alive));
                continue;
            };
            match self.cached(namespace, &name) {
                Some(pod) if !another_pod(&pod, &who) => {
                    hits += 1;
                    fates.push((*node, PodFate::of(&pod, &who)));
                }
                // Not cached, or cached with another uid (see above).
                _ if uncached.len() < MAX_GETS => uncached.push((index, who, name)),
                _ => fates.push((*node, PodFate::Alive)),
            }
        }
        self.metrics.pod_lookups(hits, uncached.len() as u64);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let fetched: Vec<(usize, PodFate)> = futures::stream::iter(uncached)
            .map(|(index, who, name)| {
                let pods = pods.clone();
                async move {
                    let fate = match pods.get_opt(&name).await? {
                        Some(pod) => PodFate::of(&pod, &who),
                        None => PodFate::Gone,
                    };
                    Ok::<_, kube::Error>((index, fate))
                }
            })
            .buffer_unordered(GETS_IN_FLIGHT)
            .try_collect()
            .await?;
        let fetched = fetched
            .into_iter()
            .map(|(index, fate)| (nodes[index], fate));
        fates.extend(fetched);
        Ok(fates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, phase: &str, deleting: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": uid, "labels": { "zkgate.io/barrier": "g" },
                "annotations": { "big": "x".repeat(1000) },
                "managedFields": [{ "manager": "kubectl", "operation": "Apply" }],
            },
            "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
            "status": { "phase": phase, "podIP": "10.0.0.1" },
        }))
        .unwrap();
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        pod
    }

    #[test]
    fn a_stripped_pod_keeps_what_its_fate_needs() {
        let mut p = pod("u1", "Running", true);
        strip(&mut p);
        assert!(p.spec.is_none() && p.metadata.managed_fields.is_none());
        assert!(p.metadata.annotations.is_none());
        assert_eq!(
            p.labels().get("zkgate.io/barrier").map(String::as_str),
            Some("g")
        );
        assert!(serde_json::to_vec(&p).unwrap().len() < 300);
        let who = |uid: &str| ParticipantData {
            id: None,
            pod: Some("p".into()),
            pod_uid: Some(uid.into()),
            ..Default::default()
        };
        assert_eq!(PodFate::of(&p, &who("u1")), PodFate::Terminating);
        assert_eq!(PodFate::of(&p, &who("u2")), PodFate::Gone);
        let mut done = pod("u1", "Succeeded", false);
        strip(&mut done);
        assert_eq!(PodFate::of(&done, &who("u1")), PodFate::Finished);
        let mut running = pod("u1", "Pending", false);
        strip(&mut running);
        assert_eq!(PodFate::of(&running, &who("u1")), PodFate::Alive);
    }
}
