//! What a workload is to zkgate, below both admission and the controller:
//! the labels that ask for a Barrier or a LockLease, a run's identity and
//! owner ([`run`]), and the pod template's annotations the run's Barrier
//! takes ([`template`]).

pub mod run;
pub mod template;

/// The label that asks for a Barrier (`zkgate.io/barrier: NAME`), on a pod
/// or a workload's pod template. The controller watches the pods carrying
/// it or [`LOCK_LABEL`], so their end is seen at once (without, on its next
/// periodic look).
pub const BARRIER_LABEL: &str = "zkgate.io/barrier";

/// The label that asks for a LockLease (`zkgate.io/lock: NAME`).
pub const LOCK_LABEL: &str = "zkgate.io/lock";
