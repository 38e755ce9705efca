//! The queue shared by every lock recipe: create a sequential node, find
//! the contender to wait for, watch only that one, repeat until none is
//! left. What to wait for is the driver's choice ([`contender::blocker`]).

use tokio::time::Instant;
use tracing::{debug, info, trace};
use zookeeper_client as zk;

use super::super::contender::{self, ContenderKind, PROTECTED_PREFIX};
use super::super::error::{within, Result, ZkError};
use super::super::guard::NodeGuard;
use super::super::hold::{Acquired, LockHold};
use super::super::path;
use super::super::session::{is_connection_loss, Session};

/// How often a waiter reports where it stands.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Everything that decides how one contender queues.
#[derive(Clone, Debug)]
pub(crate) struct LockSpec {
    /// The lock node, parent of the contenders.
    pub path: String,
    /// What we ask for.
    pub kind: ContenderKind,
    /// Data written into our node (Curator's lock data; zkgate puts JSON
    /// naming the holder there).
    pub data: Vec<u8>,
    /// A persistent node outlives this session (a registration made by a
    /// process that exits); an ephemeral one is the session's.
    pub persistent: bool,
    /// Create the lock node (and its parents) when it is missing.
    pub create_parent: bool,
    /// Create our node only if this node's data is unchanged.
    pub check: Option<super::VersionCheck>,
}

/// Acquires per `spec`, waiting at most until `deadline`. On every error,
/// on the deadline, and when the returned future is dropped, our node is
/// removed.
pub(crate) async fn acquire<'s>(
    session: &'s Session,
    spec: &LockSpec,
    deadline: Option<Instant>,
) -> Result<LockHold<'s>> {
    path::validate_path(&spec.path)?;
    if spec.path == "/" {
        return Err(ZkError::InvalidPath {
            path: spec.path.clone(),
            reason: "the root cannot be a lock",
        });
    }
    let started = Instant::now();
    let mut guard = NodeGuard::new(session);
    let outcome = within(
        deadline,
        || format!("waiting for the lock {}", spec.path),
        queue_and_wait(session, spec, &mut guard),
    )
    .await;
    match outcome {
        Ok(acquired) => {
            guard.disarm();
            debug!(path = %acquired.node, token = acquired.token, waited_ms = started.elapsed().as_millis() as u64, "lock acquired");
            Ok(LockHold::new(session, acquired, spec.kind, spec.persistent))
        }
        Err(e) => {
            guard.delete_now(session).await;
            Err(e)
        }
    }
}

/// Creates our node and waits until no contender blocks it; `guard` holds
/// our node (from before its create is sent).
async fn queue_and_wait(
    session: &Session,
    spec: &LockSpec,
    guard: &mut NodeGuard,
) -> Result<Acquired> {
    let client = session.client();
    let parent = spec.path.as_str();
    let protection = format!("{PROTECTED_PREFIX}{}-", uuid::Uuid::new_v4());
    let prefix = path::join(
        parent,
        &format!("{protection}{}", contender::marker(spec.kind)),
    );
    let mode = if spec.persistent {
        zk::CreateMode::PersistentSequential
    } else {
        zk::CreateMode::EphemeralSequential
    };
    let options = mode.with_acls(session.node_acls());

    // A persistent registration outlives its process: a restarted process
    // (an init container run again) adopts its own instead of queueing a
    // second one behind it.
    let adopted = if spec.persistent && !spec.data.is_empty() {
        find_registration(session, spec).await?
    } else {
        None
    };
    let mut listed_at = Instant::now();
    // An adopted registration was found by a plain listing, which a server
    // behind its leader may answer from a past in which the node stood (a
    // revocation since): confirmed with the leader before holding, as
    // after a wake-up.
    let mut woken = adopted.is_some();
    let (name, token, mut children) = if let Some(found) = adopted {
        guard.arm_created(path::join(parent, &found.0), found.1);
        found
    } else {
        loop {
            // From the moment the create is sent, its node is ours to
            // remove, found by its protected name even if the reply is lost.
            guard.arm_protected(parent, &protection);
            // The create and the first listing go out together: the server
            // answers them in order, so the listing already holds our node.
            listed_at = Instant::now();
            let create = create_checked(session, spec, &prefix, &options)?;
            let listing = client.list_children(parent);
            match create.await {
                Ok((name, stat)) => {
                    let node = path::join(parent, &name);
                    let czxid = match stat {
                        Some(stat) => stat.czxid,
                        None => created_czxid(session, &node).await?,
                    };
                    guard.arm_created(node, czxid);
                    let children = match listing.await {
                        Ok(children) => children,
                        Err(_) => {
                            listed_at = Instant::now();
                            list(session, parent).await?
                        }
                    };
                    break (name, czxid, children);
                }
                Err(CreateError::Changed(at) | CreateError::Replaced(at)) => {
                    return Err(ZkError::Changed { path: at })
                }
                Err(CreateError::Zk(zk::Error::NoNode)) if spec.create_parent => {
                    let dir = zk::CreateMode::Persistent.with_acls(session.node_acls());
                    match session
                        .retry("create", parent, || client.mkdir(parent, &dir))
                        .await
                    {
                        Ok(())
                        | Err(ZkError::Zk {
                            source: zk::Error::NodeExists,
                            ..
                        }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(CreateError::Zk(zk::Error::NoNode)) => {
                    return Err(ZkError::Deleted {
                        path: parent.to_owned(),
                    })
                }
                Err(CreateError::Zk(e)) if is_connection_loss(&e) => {
                    // The create may have been applied before the connection
                    // dropped: our protected prefix finds that ghost node.
                    session.await_connected().await?;
                    listed_at = Instant::now();
                    let children = list_synced(session, parent).await?;
                    if let Some(name) = children
                        .iter()
                        .find(|c| c.starts_with(&protection))
                        .cloned()
                    {
                        let node = path::join(parent, &name);
                        let stat = session
                            .retry("check", &node, || client.check_stat(&node))
                            .await?;
                        // Only a node of this session is ours (a persistent one has no owner).
                        if let Some(stat) =
                            stat.filter(|s| spec.persistent || s.ephemeral_owner == session.id())
                        {
                            debug!(%node, "found the node of a create whose reply was lost");
                            guard.arm_created(node, stat.czxid);
                            if let Some(check) = &spec.check {
                                if !still_the_one_read(session, check).await? {
                                    return Err(ZkError::Changed {
                                        path: check.path.clone(),
                                    });
                                }
                            }
                            break (name, stat.czxid, children);
                        }
                    }
                }
                Err(CreateError::Zk(e)) => return Err(ZkError::from_client("create", &prefix, e)),
            }
        }
    };

    let mut last_progress: Option<Instant> = None;
    // The check sent with the latest listing after a wake-up, not yet
    // answered (see below).
    let mut confirmation = None;
    loop {
        let queue = contender::queue(&children);
        let Some(index) = queue.iter().position(|c| c.name == name) else {
            return Err(ZkError::NodeRemoved {
                path: path::join(parent, &name),
            });
        };
        let Some(blocker) = contender::blocker(&queue, index) else {
            let node = path::join(parent, &name);
            // The first listing went out with our create, so the server that
            // answered it had applied that write: what it shows is current
            // enough. After a wake-up the listing is a plain read, which a
            // server behind its leader (a follower cut off a while, catching
            // up) may answer from a past in which our node still stood and
            // our session lived: confirm with the leader before holding.
            if woken {
                listed_at = match confirmation.take() {
                    Some((sent, reply)) => match checked(&node, sent, reply.await)? {
                        Some(confirmed) => confirmed,
                        None => {
                            session.await_connected().await?;
                            confirm_ours(session, &node).await?
                        }
                    },
                    None => confirm_ours(session, &node).await?,
                };
            }
            return Ok(Acquired {
                node,
                siblings: Vec::new(),
                token,
                confirmed_at: listed_at,
            });
        };
        let blocker = path::join(parent, &blocker.name);
        // Progress at a modest rate: the first time, then at most every 10 s.
        if last_progress.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
            info!(lock = %parent, ahead = index, waiting_for = %blocker, "position {} in the queue for the lock", index + 1);
            last_progress = Some(Instant::now());
        } else {
            trace!(lock = %parent, ahead = index, waiting_for = %blocker, "position {} in the queue for the lock", index + 1);
        }
        // Watch only the contender we wait for: its deletion is the only
        // event that can let us through, so a release wakes one waiter.
        let (stat, watcher) = session
            .retry("watch", &blocker, || client.check_and_watch_stat(&blocker))
            .await?;
        if stat.is_some() {
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::Session {
                if let Some(err) =
                    super::super::session::SessionState::from_client(event.session_state)
                        .terminal_error()
                {
                    return Err(err);
                }
            }
            session.stats().record_wakeup();
        }
        // Every wake-up re-reads the queue: the blocker may be gone for good
        // or merely changed, and others may have joined or left.
        woken = true;
        listed_at = Instant::now();
        // The confirmation that our node stands goes out with the listing,
        // not after its answer: when the listing shows us first, the
        // handoff pays no second round trip. It proves the same, only
        // from an earlier moment (its send time, before the listing's
        // answer); when we are not first, its answer is not waited for.
        let listing = client.list_children(parent);
        let (sent, reply) = send_check(session, &path::join(parent, &name))?;
        children = match listing.await {
            Ok(children) => {
                confirmation = Some((sent, reply));
                children
            }
            Err(zk::Error::NoNode) => {
                return Err(ZkError::Deleted {
                    path: parent.to_owned(),
                })
            }
            // Lost, or refused for a reason `list` tells: that reply's
            // check is not waited for either.
            Err(_) => {
                confirmation = None;
                list(session, parent).await?
            }
        };
    }
}

/// Why our node was not created.
enum CreateError {
    /// The checked node's data changed (or it is gone): nothing was made.
    Changed(String),
    /// Our node was made, but under the checked node made again since it
    /// was read (its version started over): our node is to go, found by
    /// its protected name.
    Replaced(String),
    /// The create itself failed.
    Zk(zk::Error),
}

/// Sends the create of our node (with `spec.check` in the same
/// transaction when there is one) at once, so that a listing sent after
/// it is answered after it; the future resolves to our node's name and,
/// when the server sent it, its stat.
fn create_checked<'a>(
    session: &'a Session,
    spec: &'a LockSpec,
    prefix: &'a str,
    options: &'a zk::CreateOptions<'a>,
) -> Result<
    impl std::future::Future<Output = std::result::Result<(String, Option<zk::Stat>), CreateError>> + 'a,
> {
    use futures::future::{Either, FutureExt as _};
    let client = session.client();
    let Some(check) = &spec.check else {
        let create = client.create(prefix, &spec.data, options);
        return Ok(Either::Left(create.map(move |created| {
            let (stat, sequence) = created.map_err(CreateError::Zk)?;
            Ok((format!("{}{sequence}", path::name_of(prefix)), Some(stat)))
        })));
    };
    let mut writer = client.new_multi_writer();
    writer
        .add_check_version(&check.path, check.version)
        .map_err(|e| ZkError::from_client("check", &check.path, e))?;
    writer
        .add_create(prefix, &spec.data, options)
        .map_err(|e| ZkError::from_client("create", prefix, e))?;
    let commit = writer.commit();
    // Sent behind the transaction, so answered after it: the node the
    // check passed on is the one read only if its czxid is the one read.
    let checked = client.check_stat(&check.path);
    Ok(Either::Right(async move {
        let committed = commit.await;
        let checked = checked.await;
        match committed {
            Ok(results) => {
                let created = results
                    .into_iter()
                    .find_map(|r| match r {
                        zk::MultiWriteResult::Create { path, stat } => Some((
                            path::name_of(&path).to_owned(),
                            (!stat.is_invalid()).then_some(stat),
                        )),
                        _ => None,
                    })
                    .ok_or(CreateError::Zk(zk::Error::UnexpectedError(
                        "a multi with a create answered no path".to_owned(),
                    )))?;
                match checked {
                    Ok(Some(stat)) if stat.czxid == check.czxid => Ok(created),
                    // Made again since it was read (or gone since): our
                    // node is under rules nobody read.
                    Ok(_) => Err(CreateError::Replaced(check.path.clone())),
                    Err(e) => Err(CreateError::Zk(e)),
                }
            }
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::BadVersion | zk::Error::NoNode,
            }) => Err(CreateError::Changed(check.path.clone())),
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => {
                Err(CreateError::Zk(source))
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(CreateError::Zk(source)),
        }
    }))
}

/// Whether `check`'s node is still the one read (not deleted and made
/// again since: its version alone cannot tell).
async fn still_the_one_read(session: &Session, check: &super::VersionCheck) -> Result<bool> {
    let client = session.client();
    let stat = session
        .retry("check", &check.path, || client.check_stat(&check.path))
        .await?;
    Ok(stat.is_some_and(|s| s.czxid == check.czxid))
}

/// The czxid of our node, when a multi's reply had no valid stat for it.
async fn created_czxid(session: &Session, node: &str) -> Result<i64> {
    let client = session.client();
    match session
        .retry("check", node, || client.check_stat(node))
        .await?
    {
        Some(stat) => Ok(stat.czxid),
        None => Err(ZkError::NodeRemoved {
            path: node.to_owned(),
        }),
    }
}

/// Finds a persistent contender of our kind whose data is exactly ours: a
/// registration made earlier by the same holder. Returns its name, token and
/// the lock's children.
async fn find_registration(
    session: &Session,
    spec: &LockSpec,
) -> Result<Option<(String, i64, Vec<String>)>> {
    let client = session.client();
    let children = match list(session, &spec.path).await {
        Ok(children) => children,
        Err(ZkError::Deleted { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let ours: Vec<&String> = children
        .iter()
        .filter(|c| contender::Contender::parse(c).is_some_and(|c| c.kind == spec.kind))
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    let results = session
        .retry("read", &spec.path, || {
            let mut reader = client.new_multi_reader();
            for name in &ours {
                // The names come from the server under a valid parent.
                let _ = reader.add_get_data(&path::join(&spec.path, name));
            }
            reader.commit()
        })
        .await?;
    let found = ours
        .iter()
        .zip(results)
        .find_map(|(name, result)| match result {
            zk::MultiReadResult::Data { data, stat }
                if stat.ephemeral_owner == 0 && data == spec.data =>
            {
                Some(((*name).clone(), stat.czxid))
            }
            _ => None,
        });
    Ok(found.map(|(name, token)| {
        debug!(node = %name, "adopting our earlier registration");
        (name, token, children.clone())
    }))
}

/// Confirms with the leader that our `node` stands (a `check` in a multi:
/// a transaction only a quorum behind the leader answers; it fails when our
/// session has been expired). The check's send time, what it confirms.
async fn confirm_ours(session: &Session, node: &str) -> Result<Instant> {
    loop {
        let (sent, reply) = send_check(session, node)?;
        if let Some(confirmed) = checked(node, sent, reply.await)? {
            return Ok(confirmed);
        }
        session.await_connected().await?;
    }
}

/// The check of [`confirm_ours`], sent now (the client sends a request
/// when it is made, not when its reply is awaited): its send time and its
/// reply.
fn send_check<'a>(
    session: &'a Session,
    node: &str,
) -> Result<(
    Instant,
    impl std::future::Future<
            Output = std::result::Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>,
        > + 'a,
)> {
    let mut writer = session.client().new_multi_writer();
    writer
        .add_check_version(node, -1)
        .map_err(|e| ZkError::from_client("check", node, e))?;
    let sent = Instant::now();
    Ok((sent, writer.commit()))
}

/// What the reply to a check of our `node` sent at `sent` says: it stood
/// then (`Some(sent)`), or nothing (`None`: the connection was lost before
/// the answer, so ask again once connected). Gone is an error.
fn checked(
    node: &str,
    sent: Instant,
    reply: std::result::Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>,
) -> Result<Option<Instant>> {
    match reply {
        Ok(_) => Ok(Some(sent)),
        Err(zk::MultiWriteError::OperationFailed {
            source: zk::Error::NoNode,
            ..
        }) => Err(ZkError::NodeRemoved {
            path: node.to_owned(),
        }),
        Err(e) => {
            let e = zk::Error::from(e);
            if is_connection_loss(&e) {
                Ok(None)
            } else {
                Err(ZkError::from_client("check", node, e))
            }
        }
    }
}

/// Lists a lock node's children as the leader has them: a `sync` goes
/// first, in the same round trip. For the search of a node whose create's
/// reply was lost: a server that has not applied that create yet would
/// otherwise show no such node, and we would make a second one (and wait
/// on ourselves).
pub(crate) async fn list_synced(session: &Session, parent: &str) -> Result<Vec<String>> {
    let client = session.client();
    let listed = session
        .retry("list", parent, || {
            let sync = client.sync(parent);
            let list = client.list_children(parent);
            async move {
                sync.await?;
                list.await
            }
        })
        .await;
    match listed {
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Err(ZkError::Deleted {
            path: parent.to_owned(),
        }),
        other => other,
    }
}

/// Lists a lock node's children; a missing node means the lock was deleted.
pub(crate) async fn list(session: &Session, parent: &str) -> Result<Vec<String>> {
    let client = session.client();
    match session
        .retry("list", parent, || client.list_children(parent))
        .await
    {
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Err(ZkError::Deleted {
            path: parent.to_owned(),
        }),
        other => other,
    }
}
