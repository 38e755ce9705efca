//! What a workload is to zkgate, below both admission and the controller:
//! the labels that ask for a Barrier or a LockLease, a run's identity and
//! owner ([`run`]), and the pod template's annotations the run's Barrier
//! takes ([`template`]).

pub mod after;
pub mod lookup;
pub mod run;
pub mod template;

/// The label that asks for a Barrier (`zkgate.io/barrier: NAME`), on a pod
/// or a workload's pod template. The controller watches the pods carrying
/// it or [`LOCK_LABEL`], so their end is seen at once (without, on its next
/// periodic look).
pub const BARRIER_LABEL: &str = "zkgate.io/barrier";

/// The label that asks for a LockLease (`zkgate.io/lock: NAME`).
pub const LOCK_LABEL: &str = "zkgate.io/lock";

/// The labels of the objects the controller makes (a Job's Barrier, the
/// webhook's certificate Secret): `app.kubernetes.io/managed-by: zkgate`.
pub fn managed_by() -> std::collections::BTreeMap<String, String> {
    [(
        "app.kubernetes.io/managed-by".to_owned(),
        "zkgate".to_owned(),
    )]
    .into()
}

/// Whether an object carries [`managed_by`]'s labels: the controller made it.
pub fn made_by_zkgate(meta: &kube::api::ObjectMeta) -> bool {
    let Some(labels) = meta.labels.as_ref() else {
        return false;
    };
    managed_by().iter().all(|(k, v)| labels.get(k) == Some(v))
}
