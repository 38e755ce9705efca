//! ZooKeeper sessions and recipes: the double barrier and the locks.
//!
//! Nothing here knows about Kubernetes: the controller and the participant
//! commands both stand on these types.
//!
//! - [`Session`]: a session with an explicit, awaited [`Session::close`] and
//!   a visible [`SessionState`].
//! - [`DoubleBarrier`]: ZooKeeper's double barrier (enter / leave), and
//!   [`GangBarrier`]: one in rounds, for a gang that restarts together.
//! - [`Semaphore`]: N permits in Curator's InterProcessSemaphoreV2 layout,
//!   k at a time, all or nothing; its hold is a [`LockHold`] too.
//! - [`Mutex`] and [`ReadWriteLock`]: Curator-compatible locks; a held lock
//!   is a [`LockHold`] with a fencing token and a [`HoldMonitor`] that tells
//!   when the hold may be or is lost.
//! - [`KeptRegistration`]: a registration in an opened barrier, kept
//!   through any ZooKeeper outage (the work it started goes on), and
//!   [`RunMarks`]: in rounds, what tells the next round that a command of
//!   the round before may still run.
//! - [`acl`]: digest [`Credential`]s and ACLs. A session with a credential
//!   makes every node it creates its credential's alone
//!   ([`Session::node_acls`]); `tcp+tls://` servers are reached over TLS
//!   ([`TlsSettings`]).
//!
//! Every waiting operation takes an optional deadline, removes its own node
//! on every failure path (including when its future is dropped), and re-reads
//! the state after every wake-up.

pub mod acl;
pub mod acl_change;
mod barrier;
mod connect;
pub mod contender;
mod error;
mod guard;
mod hold;
mod kept;
mod lock;
pub mod path;
pub mod probe;
pub mod rounds;
pub mod running;
mod semaphore;
mod session;
pub mod tree;

pub use acl::Credential;
pub use barrier::{
    BarrierData, DoubleBarrier, EnterOptions, Entered, Entry, ParticipantData, MAX_KILL_GRACE,
    READY,
};
pub use connect::{ConnectString, Server, DEFAULT_PORT};
pub use contender::{ContenderKind, LEASE_MARKER};
pub use error::{within, ErrorKind, Result, ZkError, CONTENDED_ATTEMPTS};
pub use hold::{
    leader_lag, Confirmation, HoldMonitor, HoldState, LockHold, LossReason, Registration, Trust,
};
pub use kept::{for_want_of_zookeeper, when_reachable, KeptRegistration};
pub use lock::mode as lock_mode;
pub use lock::{LockMode, LockNodeData, LockOptions, Mutex, ReadWriteLock, VersionCheck};
pub use rounds::{GangBarrier, RoundEnd};
pub use running::{RunMark, RunMarks};
pub use semaphore::{decode_count, encode_count, Permits, Semaphore, COUNT, LEASES, LOCKS};
pub use session::{Session, SessionOptions, SessionState, SessionStats, StateWatcher, TlsSettings};
