//! Locks in Apache Curator's layout: [`Mutex`] (InterProcessMutex) and
//! [`ReadWriteLock`] (InterProcessReadWriteLock).
//!
//! Each contender creates an ephemeral-sequential node
//! `_c_<uuid>-<marker><seq>` under the lock node and watches only the one
//! contender it must wait for (no herd effect). Curator clients on the same
//! path queue with zkgate's and exclude each other; kazoo's contenders
//! (`__lock__`, `__rlock__`) are recognised so a zkgate waiter queues behind
//! them. Only that way: kazoo sorts our names after its own, so a kazoo
//! waiter does not queue behind a zkgate holder (the guarantees page says
//! so; kazoo cannot be changed from here).

mod internals;
pub mod mode;
mod node;

pub use node::{LockMode, LockNodeData};

use tokio::time::Instant;

use self::internals::LockSpec;
pub(crate) use self::internals::{list, list_synced};
use super::contender::ContenderKind;
use super::error::Result;
use super::hold::LockHold;
use super::session::Session;

/// Options shared by the lock recipes.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    /// Data written into our node (who holds it; shown to others).
    pub data: Vec<u8>,
    /// Make the node persistent so the hold outlives this process (see
    /// [`LockHold::into_registration`]). Default: ephemeral, the session's.
    pub persistent: bool,
    /// Create the lock node when it is missing. Default: fail with
    /// [`crate::zk::ZkError::Deleted`], because the lock node belongs to
    /// whoever manages the lock (the controller).
    pub create_parent: bool,
    /// Queue only if this node's data is still at this version: our node
    /// is created in one transaction with the check, so what the caller
    /// read there (how the lock is to be taken) still holds when it
    /// queues. Else [`crate::zk::ZkError::Changed`], with nothing left
    /// behind.
    pub check: Option<VersionCheck>,
}

/// A node's data version, checked in the transaction that creates a
/// contender's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionCheck {
    /// The node (for zkgate, the lock node, whose data says its mode).
    pub path: String,
    /// The data version it was read at.
    pub version: i32,
    /// Its czxid as read: a node deleted and made again starts its data
    /// version over, so the version alone cannot tell the node made again
    /// (under other rules) from the one read. Checked against the node as
    /// it stands just after our create (a read sent behind it).
    pub czxid: i64,
}

/// An exclusive lock: one holder at a time.
///
/// ```no_run
/// # async fn demo(session: &zkgate::zk::Session) -> Result<(), zkgate::zk::ZkError> {
/// use std::time::Duration;
/// use zkgate::zk::{LockOptions, Mutex};
///
/// let lock = Mutex::new("/zkgate/namespaces/default/locks/db", LockOptions::default());
/// let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
/// let hold = lock.acquire(session, Some(deadline)).await?;
/// println!("fencing token {}", hold.fencing_token());
/// hold.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Mutex {
    spec: LockSpec,
}

impl Mutex {
    /// A mutex on the lock node `path`.
    pub fn new(path: impl Into<String>, options: LockOptions) -> Self {
        Mutex {
            spec: spec(path.into(), ContenderKind::Exclusive, options),
        }
    }

    /// Waits for the lock until `deadline` (`None`: no limit). On a timeout,
    /// an error or cancellation (dropping the future), our node is removed.
    ///
    /// Errors: [`crate::zk::ZkError::Timeout`], `Deleted` (the lock node is
    /// gone), `NodeRemoved` (our node was deleted while we waited),
    /// `SessionExpired`.
    pub async fn acquire<'s>(
        &self,
        session: &'s Session,
        deadline: Option<Instant>,
    ) -> Result<LockHold<'s>> {
        internals::acquire(session, &self.spec, deadline).await
    }
}

/// A read/write lock: readers share it, a writer excludes everyone. A
/// reader waits only for the nearest writer queued before it, so a writer
/// is never starved by readers that came after it.
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    path: String,
    options: LockOptions,
}

impl ReadWriteLock {
    /// A read/write lock on the lock node `path`.
    pub fn new(path: impl Into<String>, options: LockOptions) -> Self {
        ReadWriteLock {
            path: path.into(),
            options,
        }
    }

    /// Waits for a read hold. See [`Mutex::acquire`] for deadlines and errors.
    pub async fn read<'s>(
        &self,
        session: &'s Session,
        deadline: Option<Instant>,
    ) -> Result<LockHold<'s>> {
        let spec = spec(self.path.clone(), ContenderKind::Read, self.options.clone());
        internals::acquire(session, &spec, deadline).await
    }

    /// Waits for a write hold. See [`Mutex::acquire`] for deadlines and errors.
    pub async fn write<'s>(
        &self,
        session: &'s Session,
        deadline: Option<Instant>,
    ) -> Result<LockHold<'s>> {
        let spec = spec(
            self.path.clone(),
            ContenderKind::Write,
            self.options.clone(),
        );
        internals::acquire(session, &spec, deadline).await
    }
}

fn spec(path: String, kind: ContenderKind, options: LockOptions) -> LockSpec {
    LockSpec {
        path,
        kind,
        data: options.data,
        persistent: options.persistent,
        create_parent: options.create_parent,
        check: options.check,
    }
}
