//! ZooKeeper changes as reconcile triggers: one persistent recursive watch
//! on `<root>/namespaces` turns every create, delete or data change below
//! it into a reconcile of the resource it belongs to.

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, info};
use zookeeper_client as zk;

use crate::api::{Barrier, LockLease};
use crate::layout::{Layout, ResourceKind};
use crate::zk::{Session, SessionState, ZkError};

/// Where triggers go.
pub struct Triggers {
    /// Barriers to reconcile.
    pub barriers: UnboundedSender<ObjectRef<Barrier>>,
    /// LockLeases to reconcile.
    pub locks: UnboundedSender<ObjectRef<LockLease>>,
    /// Reconcile every Barrier (events may have been missed).
    pub all_barriers: UnboundedSender<()>,
    /// Reconcile every LockLease.
    pub all_locks: UnboundedSender<()>,
}

/// Follows the changes until the session ends.
pub async fn follow(session: &Session, layout: &Layout, triggers: Triggers) -> Result<(), ZkError> {
    let root = layout.namespaces_root();
    let client = session.client();
    let dir = zk::CreateMode::Persistent.with_acls(session.node_acls());
    session.mkdir_all(&root, &dir).await?;
    let mut watcher = session
        .retry("watch", &root, || {
            client.watch(&root, zk::AddWatchMode::PersistentRecursive)
        })
        .await
        .map_err(|e| match e {
            ZkError::Zk {
                source: zk::Error::Unimplemented,
                ..
            } => ZkError::Unsupported {
                what: "persistent recursive watches",
                needs: "ZooKeeper 3.6 or newer",
            },
            e => e,
        })?;
    info!(%root, "following ZooKeeper changes");
    loop {
        let event = watcher.changed().await;
        if event.event_type == zk::EventType::Session {
            let state = SessionState::from_client(event.session_state);
            if let Some(err) = state.terminal_error() {
                // The watcher must not be polled after a terminal event.
                return Err(err);
            }
            if state == SessionState::Connected {
                // Changes made while disconnected may not be delivered.
                debug!("reconnected: reconciling everything");
                let _ = triggers.all_barriers.send(());
                let _ = triggers.all_locks.send(());
            }
            continue;
        }
        match layout.resource_of(&event.path) {
            Some((ResourceKind::Barrier, namespace, name)) => {
                let _ = triggers
                    .barriers
                    .send(ObjectRef::new(&name).within(&namespace));
            }
            Some((ResourceKind::Lock, namespace, name)) => {
                let _ = triggers
                    .locks
                    .send(ObjectRef::new(&name).within(&namespace));
            }
            None => {}
        }
    }
}
