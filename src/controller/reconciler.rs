//! What every reconcile does around its kind's own work: the finalizer,
//! metrics, and writing the status by server-side apply.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalized};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::context::{Context, StatusMemory, FINALIZER, MANAGER};
use super::credentials::{NamespaceAcls, Rotated, Rotation, ROTATE_ANNOTATION};
use super::error::Error;
use super::status::{Capped, Note};
use crate::zk::tree::Snapshot;

/// A kind the controller reconciles.
pub trait Reconciled:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
    + HasStatus<
        Status: Clone
                    + Default
                    + PartialEq
                    + Debug
                    + Serialize
                    + DeserializeOwned
                    + Capped
                    + Send
                    + Sync,
    >
{
    /// The statuses this term applied to objects of this kind.
    fn memory(ctx: &Context) -> &StatusMemory<Self::Status>;

    /// Makes ZooKeeper and the status match the resource; `acls` are its
    /// namespace's (asked for once per reconcile).
    fn apply(
        &self,
        namespace: &str,
        acls: &NamespaceAcls,
        ctx: &Context,
    ) -> impl Future<Output = Result<Action, Error>> + Send;
    /// Removes what the resource owns; the finalizer goes once this succeeds.
    fn cleanup(
        &self,
        namespace: &str,
        ctx: &Context,
    ) -> impl Future<Output = Result<Action, Error>> + Send;
}

/// Reconciles one object, wrapped in the finalizer helper.
pub async fn reconcile<K: Reconciled>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = object.namespace().ok_or(Error::Incomplete("namespace"))?;
    let object_ref = object.clone();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let started = std::time::Instant::now();
    let object = with_finalizer(&api, object).await?;
    let result = finalizer(&api, FINALIZER, object, |event| async {
        match event {
            // The namespace's credentials first: its pods' nodes are
            // readable only with them (see credentials.rs).
            Finalized::Apply(o) => {
                let rotation = rotation_asked(o.as_ref());
                let (acls, rotated) = ctx.namespace_acls(&namespace, rotation.as_ref()).await?;
                match rotated {
                    Some(done @ (Rotated::Now | Rotated::Before)) => {
                        rotation_answered(o.as_ref(), &api, done, &ctx).await?;
                    }
                    Some(Rotated::Waiting) => {
                        let note = Note {
                            reason: "CredentialRotationWaiting",
                            message: format!(
                                "the rotation annotation {ROTATE_ANNOTATION} asks for waits until the previous rotation's grace window closes (a second rotation now would take the credential it replaced away from the pods still on it)"
                            ),
                            warning: false,
                        };
                        ctx.record(o.as_ref(), &note).await;
                    }
                    None => {}
                }
                o.apply(&namespace, &acls, &ctx).await
            }
            Finalized::Cleanup(o) => {
                ctx.credentials
                    .hold(&namespace, &ctx.zk, &ctx.layout)
                    .await?;
                let action = o.cleanup(&namespace, &ctx).await?;
                // Tidying up after a deleted namespace must never hold the
                // finalizer (and with it the namespace's deletion) back.
                if let Err(error) = ctx
                    .credentials
                    .forget_if_terminating(&namespace, &ctx.zk, &ctx.layout, &ctx.client)
                    .await
                {
                    tracing::warn!(%namespace, %error, "could not tidy up after a deleted namespace");
                }
                Ok(action)
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .observe_reconcile(&K::kind(&()), started.elapsed(), result.is_err());
    if result.is_ok() {
        ctx.failures.succeeded(&key(object_ref.as_ref()));
    }
    result
}

/// `object` with zkgate's finalizer: added (by the same patch as kube's
/// finalizer helper, which fails rather than duplicate a finalizer someone
/// added meanwhile) to a resource that lacks it and is not being deleted,
/// so that a new resource gets its finalizer, its znodes and its first
/// status in one reconcile. The helper alone adds the finalizer and stops,
/// and the finalizer's update is no trigger (see `super::worth`).
async fn with_finalizer<K: Reconciled>(api: &Api<K>, object: Arc<K>) -> Result<Arc<K>, Error> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, TestOperation};
    if object.meta().deletion_timestamp.is_some()
        || object.finalizers().iter().any(|f| f == FINALIZER)
    {
        return Ok(object);
    }
    let (test, add): (serde_json::Value, _) = if object.finalizers().is_empty() {
        (
            serde_json::Value::Null,
            (
                PointerBuf::from_tokens(["metadata", "finalizers"]),
                vec![FINALIZER].into(),
            ),
        )
    } else {
        (
            object.finalizers().into(),
            (
                PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
                FINALIZER.into(),
            ),
        )
    };
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "finalizers"]),
            value: test,
        }),
        PatchOperation::Add(AddOperation {
            path: add.0,
            value: add.1,
        }),
    ]);
    let name = object.name_any();
    let mut updated = match api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(updated) => updated,
        // The test failed: the finalizers are not what this (possibly
        // lagging) copy says. The finalizer may be there already (a
        // reconcile triggered by a registration, before the watch brought
        // the finalizer this controller added): go on with the object as
        // it is, rather than fail and back off; else fail as before.
        Err(kube::Error::Api(e)) if e.code == 422 => {
            let current = api.get(&name).await?;
            if !current.finalizers().iter().any(|f| f == FINALIZER) {
                return Err(kube::Error::Api(e).into());
            }
            current
        }
        Err(e) => return Err(e.into()),
    };
    updated.managed_fields_mut().clear();
    Ok(Arc::new(updated))
}

/// The credential rotation `object` asks for by annotation, if any.
fn rotation_asked<K: Reconciled>(object: &K) -> Option<Rotation> {
    let value = object.annotations().get(ROTATE_ANNOTATION)?;
    Some(Rotation(format!(
        "{}/{}/{value}",
        K::kind(&()),
        object.uid().unwrap_or_default()
    )))
}

/// The rotation `object` asked for is answered: drops the annotation (a
/// merge patch, which can remove what another field manager set; with the
/// resource version read, so that a new request made meanwhile is not
/// dropped unanswered: the patch then fails, and the next reconcile sees
/// it) and, when it rotated now, says so.
async fn rotation_answered<K: Reconciled>(
    object: &K,
    api: &Api<K>,
    rotated: Rotated,
    ctx: &Context,
) -> Result<(), Error> {
    let patch = serde_json::json!({ "metadata": {
        "resourceVersion": object.resource_version(),
        "annotations": { ROTATE_ANNOTATION: null },
    } });
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    if rotated != Rotated::Now {
        return Ok(());
    }
    let note = Note {
        reason: "CredentialRotated",
        message: format!(
            "rotated namespace {}'s ZooKeeper credential, as annotation {ROTATE_ANNOTATION} asked: pods get the new one from now on; the replaced one works until the rotation's grace window closes",
            object.namespace().unwrap_or_default()
        ),
        warning: false,
    };
    ctx.record(object, &note).await;
    Ok(())
}

/// How often a resource with registrations that outlive their processes
/// (init containers' persistent nodes) is looked at again, for pods that
/// carry no `zkgate.io/barrier` / `zkgate.io/lock` label to be watched.
pub const POD_RECHECK: std::time::Duration = std::time::Duration::from_secs(15);

/// When to look at a resource again: the soonest of what its status needs
/// (`due`: a timeout or lease to enforce, the pod recheck), the end of its
/// namespace's rotation grace window (a change to act on), and a periodic
/// look every 5 minutes.
pub async fn next_look(
    ctx: &Context,
    namespace: &str,
    due: impl IntoIterator<Item = Option<std::time::Duration>>,
) -> Action {
    let grace = ctx.credentials.grace_left(namespace).await;
    let soonest = due.into_iter().flatten().chain(grace).min();
    Action::requeue(soonest.unwrap_or(std::time::Duration::from_secs(300)))
}

/// How an object is named in logs and in the error policy's counts:
/// `Kind/namespace/name`.
pub fn key<K: Reconciled>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Publishes what a look found: writes `status` (its capped form) when it
/// differs from what was read back, after confirming leadership, remembers
/// it, and records `notes`.
pub async fn publish<K: Reconciled>(
    object: &K,
    namespace: &str,
    status: &K::Status,
    notes: &[Note],
    ctx: &Context,
) -> Result<bool, Error> {
    let uid = object.uid().ok_or(Error::Incomplete("uid"))?;
    // Compared as it will read back: the API keeps times to the second, and
    // a status that differs from its read-back only below the second would
    // be written again on every look (twice the writes per change, which
    // saturated the API server at 200 changes a second).
    let written = as_read_back(&status.capped())?;
    let changed = object.status() != Some(&written);
    if changed {
        ctx.confirm_leading().await?;
        K::memory(ctx)
            .write_as_own(
                &uid,
                &written,
                write_status(object, namespace, &written, ctx),
            )
            .await?;
    } else {
        K::memory(ctx).written(&uid, &written);
    }
    K::memory(ctx).remember(&uid, status);
    for note in notes {
        ctx.record(object, note).await;
    }
    Ok(changed)
}

/// `status` as the API server will hand it back (its JSON form).
fn as_read_back<S: Serialize + serde::de::DeserializeOwned>(status: &S) -> Result<S, Error> {
    Ok(serde_json::from_value(serde_json::to_value(status)?)?)
}

/// Writes `status` by server-side apply with the controller's field
/// manager, then removes what someone else wrote beside it (see
/// [`left_by_others`]).
async fn write_status<K: Reconciled>(
    object: &K,
    namespace: &str,
    status: &impl Serialize,
    ctx: &Context,
) -> Result<(), Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let status = serde_json::to_value(status)?;
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let stored = api
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    let stored = serde_json::to_value(stored.status())?;
    if let Some(removal) = left_by_others(&status, &stored) {
        tracing::info!(object = %key(object), ?removal, "removing status fields someone else wrote");
        let patch = serde_json::json!({ "status": removal });
        api.patch_status(
            &object.name_any(),
            &PatchParams {
                field_manager: Some(MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(())
}

/// The fields of `stored` that `ours` leaves out, as a merge patch that
/// removes them (`null` each), or `None` if there are none. Server-side
/// apply takes over only the fields it names: a field another field
/// manager wrote (a forged `completedAt` beside a status that has none,
/// participants where nobody entered) would stay. Lists are atomic in the
/// CRDs, so an applied list replaces theirs whole; objects are merged, so
/// they are looked into.
fn left_by_others(
    ours: &serde_json::Value,
    stored: &serde_json::Value,
) -> Option<serde_json::Value> {
    use serde_json::{Map, Value};
    let (Value::Object(ours), Value::Object(stored)) = (ours, stored) else {
        return None;
    };
    let removal: Map<String, Value> = stored
        .iter()
        .filter_map(|(field, theirs)| match ours.get(field) {
            None => Some((field.clone(), Value::Null)),
            Some(mine) => left_by_others(mine, theirs).map(|inner| (field.clone(), inner)),
        })
        .collect();
    (!removal.is_empty()).then_some(Value::Object(removal))
}

/// Rewrites a node whose data could not be read (someone wrote garbage) with
/// `data`, records a `Repaired` warning on `object`, and updates `node`.
/// The node's children are real registrations or holds: they stay.
pub async fn repair_node_data<K: Reconciled>(
    object: &K,
    ctx: &Context,
    node: &mut Snapshot,
    path: &str,
    data: Vec<u8>,
    problem: &str,
) -> Result<(), Error> {
    tracing::warn!(%path, %problem, "repairing the node's data");
    let stat = ctx
        .zk
        .client()
        .set_data(path, &data, Some(node.stat.version))
        .await
        .map_err(|e| crate::zk::ZkError::Zk {
            op: "write",
            path: path.to_owned(),
            source: e,
        })?;
    let note = super::status::Note {
        reason: "Repaired",
        message: format!("the data of {path} could not be read ({problem}); rewrote it"),
        warning: true,
    };
    ctx.record(object, &note).await;
    node.data = data;
    node.stat = stat;
    Ok(())
}

/// Removes the nodes among `nodes` (children of `parent`, as a look saw
/// them: holds or leases that outlive the init containers that made them)
/// whose pod `ended` by its fate, and returns the names removed. A node
/// made again or rewritten since the look is left alone
/// ([`super::removal::remove_seen`]). Not for barrier registrations, whose
/// removal must also move the barrier node's version.
pub async fn release_ended(
    ctx: &Context,
    namespace: &str,
    parent: &str,
    nodes: Vec<&crate::zk::tree::ChildNode>,
    ended: impl Fn(super::pods::PodFate) -> bool,
) -> Result<Vec<String>, Error> {
    use super::removal::{remove_seen, Removal};
    let mut removed = Vec::new();
    for (node, fate) in ctx.pods.fates(namespace, nodes).await? {
        if ended(fate) {
            tracing::info!(%parent, node = %node.name, ?fate, "removing the node of a pod that ended");
            match remove_seen(&ctx.zk, parent, node).await? {
                Removal::Removed => removed.push(node.name.clone()),
                outcome => {
                    tracing::info!(%parent, node = %node.name, ?outcome, "the node was not removed")
                }
            }
        }
    }
    Ok(removed)
}

/// Makes `path` this object's node and returns its snapshot (`None` if it
/// went meanwhile: look again). `owner` reads the uid a node's data names:
/// a node naming another uid (or none) was left by an earlier resource of
/// the same name and goes with its subtree; data that cannot be read (someone
/// wrote garbage) is rewritten with `wanted` in place, since the nodes under
/// it are real registrations or holds; a missing node is made by `create`.
pub async fn own_node<K: Reconciled, F>(
    object: &K,
    ctx: &Context,
    path: &str,
    uid: &str,
    wanted: Vec<u8>,
    owner: impl Fn(&[u8]) -> Result<Option<String>, String>,
    create: impl FnOnce() -> F,
) -> Result<Option<Snapshot>, Error>
where
    F: Future<Output = Result<(), Error>>,
{
    let mut node = crate::zk::tree::snapshot(&ctx.zk, path).await?;
    match node.as_ref().map(|n| owner(&n.data)) {
        Some(Ok(named)) if named.as_deref() != Some(uid) => {
            tracing::info!(%path, "replacing the subtree of an earlier resource with the same name");
            let left = crate::zk::tree::delete_tree(&ctx.zk, path).await?;
            if !left.is_empty() {
                // Said on the resource, not only in the log: its owner
                // sees why it never gets going.
                let error = Error::ShutOut(left);
                let note = super::status::Note {
                    reason: "NodesInTheWay",
                    message: error.to_string(),
                    warning: true,
                };
                ctx.record(object, &note).await;
                return Err(error);
            }
            node = None;
        }
        Some(Err(problem)) => {
            if let Some(n) = node.as_mut() {
                repair_node_data(object, ctx, n, path, wanted, &problem).await?;
            }
        }
        _ => {}
    }
    if node.is_none() {
        create().await?;
        node = crate::zk::tree::snapshot(&ctx.zk, path).await?;
    }
    Ok(node)
}

/// Deletes the subtree at `path` as `object` goes. Nodes it has to leave
/// (a participant made them with an ACL that shuts the controller out) are
/// said, in a Warning event on `object` and the log, and left: only a
/// ZooKeeper superuser can remove them, and holding the finalizer would
/// only keep the resource, and its namespace, from ever going.
pub async fn delete_subtree<K>(object: &K, ctx: &Context, path: &str) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()>,
{
    let left = crate::zk::tree::delete_tree(&ctx.zk, path).await?;
    if !left.is_empty() {
        let message = Error::ShutOut(left).to_string();
        tracing::error!(%path, "{message}");
        let note = super::status::Note {
            reason: "NodesLeftBehind",
            message,
            warning: true,
        };
        ctx.record(object, &note).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::left_by_others;
    use serde_json::json;

    #[test]
    fn fields_someone_else_wrote_beside_the_controllers_status_are_removed() {
        let ours = json!({ "phase": "Waiting", "entered": 1, "held": { "by": "a" } });
        let stored = json!({
            "phase": "Waiting", "entered": 1, "completedAt": "2026-01-01T00:00:00Z",
            "held": { "by": "a", "forged": true }, "participants": [{ "id": "x" }]
        });
        assert_eq!(
            left_by_others(&ours, &stored),
            Some(json!({
                "completedAt": null, "held": { "forged": null }, "participants": null
            }))
        );
        assert_eq!(left_by_others(&ours, &ours), None, "nothing but ours");
        assert_eq!(
            left_by_others(&ours, &serde_json::Value::Null),
            None,
            "no status"
        );
    }
}
