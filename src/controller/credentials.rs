//! Per-namespace ZooKeeper credentials, and the ACLs that keep namespaces
//! apart.
//!
//! With a credential of its own (`--auth`), the controller gives every
//! namespace that has Barriers or LockLeases a digest credential:
//! - kept in ZooKeeper at `<root>/credentials/<ns>` (only the controller may
//!   read it);
//! - handed to the namespace's pods by the credential handout
//!   ([`crate::handout`]: a pod proves its namespace with a projected
//!   ServiceAccount token), never written to a Secret, so the controller
//!   needs no right on Secrets outside its own namespace;
//! - held by the controller's session too, so it can read and remove the
//!   nodes participants make (their ACL names the namespace's credential).
//!
//! The namespace's nodes carry: the namespace node, `barriers` and `locks`:
//! controller ALL, namespace READ; each barrier and lock node: controller
//! ALL, namespace READ + CREATE + DELETE (register, queue, leave, release;
//! not change the node's data or ACL). Another namespace's credential gets
//! nothing, so a pod of `a` cannot enter, delete or fake anything in `b`.
//! The namespace node's data names the digest ids of the credentials that
//! work in the namespace now ([`acl::Readers`]): a participant gives each
//! READ on the nodes it makes, so that during a rotation's grace window
//! the pods on either credential can look at each other's (ZooKeeper 3.9
//! checks READ on `exists` and its watch).
//!
//! Rotation: annotate any Barrier or LockLease of the namespace
//! `zkgate.io/rotate-credential` (any value). At that resource's next
//! reconcile the controller makes a new credential, gives every node of the
//! namespace to it as well (the participants' own nodes included), and
//! drops the annotation (an event `CredentialRotated` says so); the
//! request (kind, uid and value) is stored with the credential, so it is
//! answered once even if dropping the annotation fails. Pods asking for
//! their credential from then on get the new one. The replaced credential
//! keeps working beside it for a grace window (`--rotation-grace`, stored
//! with the credentials, so a restarted controller keeps to it): a gang
//! that started with it finishes its round. When the window closes, the
//! next look (reconciles are scheduled for it) takes it away from every
//! node. The replaced credential is kept (stored and held) until the next
//! rotation, so a rotation cut short by an error or a crash is finished by
//! the next look rather than lost.
//!
//! A credential belongs to one namespace object (its uid is stored with
//! it): when the namespace goes (the controller follows the namespaces),
//! its subtree and stored credential go too, whatever the order of the
//! deletions, and a namespace made again under the same name gets a new
//! credential at its first resource's reconcile (a stored credential of
//! another uid is never handed out: it and its subtree are removed first).
//! The deletion of a terminating namespace's last resource tidies up too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use tracing::info;
use zookeeper_client as zk;

use super::error::Error;
use crate::layout::Layout;
use crate::zk::{acl, acl_change, tree, Credential, Session, ZkError};

/// Set on any Barrier or LockLease to ask for a new credential for its
/// namespace (any value; the controller drops it when done).
pub const ROTATE_ANNOTATION: &str = "zkgate.io/rotate-credential";

/// A rotation asked for by [`ROTATE_ANNOTATION`]: `kind/uid/value`, what
/// the stored credential remembers so that one request rotates once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation(pub String);

/// What became of a rotation request at a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotated {
    /// Rotated now.
    Now,
    /// This request was answered before (the annotation outlived it).
    Before,
    /// Not yet: the previous rotation's grace window is still open, and a
    /// second rotation would take the credential it replaced away from the
    /// pods still on it at once. Done at the look when the window closes.
    Waiting,
}

/// The ACLs of one namespace's nodes.
#[derive(Clone, Debug)]
pub struct NamespaceAcls {
    /// The namespace node, `barriers` and `locks`.
    pub dirs: Vec<zk::Acl>,
    /// Lock nodes: participants queue and release below them (create,
    /// delete) but never rewrite the lock's data.
    pub resources: Vec<zk::Acl>,
    /// Barrier nodes: as lock nodes, and participants may also write the
    /// barrier's data, which a withdrawal rewrites as it is (a version
    /// bump, so that an opening that counted the withdrawn participant
    /// fails its check: `DoubleBarrier::enter`). That gives a namespace's
    /// pods no power they lack: whoever may register may also make
    /// `ready` or remove a registration; the namespace is the boundary.
    pub barriers: Vec<zk::Acl>,
    /// Published in the namespace node for the participants, who give
    /// each of these credentials READ on the nodes they make
    /// ([`acl::Readers`]). Empty without credentials.
    pub readers: acl::Readers,
}

impl NamespaceAcls {
    fn open() -> NamespaceAcls {
        NamespaceAcls {
            dirs: acl::open(),
            resources: acl::open(),
            barriers: acl::open(),
            readers: acl::Readers::default(),
        }
    }

    /// The ACLs for `namespace`'s credentials: the current one, and during
    /// a rotation's grace window the one it replaced as well.
    fn new(controller: &Credential, namespace: &[&Credential]) -> NamespaceAcls {
        use zk::Permission as P;
        let mut acls = NamespaceAcls {
            dirs: vec![controller.acl(P::ALL)],
            resources: vec![controller.acl(P::ALL)],
            barriers: vec![controller.acl(P::ALL)],
            readers: acl::Readers::of(namespace.iter().copied()),
        };
        for credential in namespace {
            acls.dirs.push(credential.acl(P::READ));
            acls.resources
                .push(credential.acl(P::READ | P::CREATE | P::DELETE));
            acls.barriers
                .push(credential.acl(P::READ | P::WRITE | P::CREATE | P::DELETE));
        }
        acls
    }
}

/// What `<root>/credentials/<ns>` holds.
#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    /// `user:password` now.
    current: String,
    /// The one before the last rotation: nodes may still name it until the
    /// rotation finished, so the controller holds it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<String>,
    /// Until when (Unix milliseconds) `previous` keeps working beside
    /// `current`: the rotation's grace window for work in flight. Absent:
    /// over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_until_ms: Option<i64>,
    /// The uid of the namespace object it was made for (absent: stored by
    /// an older controller; adopted by the namespace of that name then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace_uid: Option<String>,
    /// The last rotation request answered ([`Rotation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rotated_for: Option<String>,
    /// Whether every node grants `current` (after a rotation, once the
    /// nodes were moved to it): until then the handout gives `previous`.
    #[serde(default = "moved", skip_serializing_if = "is_true")]
    moved: bool,
}

fn moved() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Stored {
    /// What `known` stores.
    fn of(known: &Known) -> Stored {
        Stored {
            current: known.credential.expose(),
            previous: known.previous.as_ref().map(Credential::expose),
            previous_until_ms: known
                .previous
                .as_ref()
                .and(known.grace_until)
                .and_then(|until| {
                    let ms = until
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .ok()?
                        .as_millis();
                    i64::try_from(ms).ok()
                }),
            namespace_uid: known.namespace_uid.clone(),
            rotated_for: known.rotated_for.clone(),
            moved: known.moved,
        }
    }
}

struct Known {
    /// The uid of the namespace object it belongs to, when stored.
    namespace_uid: Option<String>,
    /// The current credential (this session holds it).
    credential: Credential,
    /// The one it replaced, while nodes may still name it (this session
    /// holds it too).
    previous: Option<Credential>,
    /// While the rotation's grace window is open: when it closes. Until
    /// then `previous` works beside `credential` on every node; then the
    /// next look takes it away.
    grace_until: Option<SystemTime>,
    /// The last rotation request answered.
    rotated_for: Option<String>,
    /// Whether every node grants `credential` (stored).
    moved: bool,
    /// Whether the namespace's nodes are known to carry the ACLs: not on
    /// the first look of a term, nor while a rotation is unfinished.
    checked: bool,
}

impl Known {
    /// The credentials the namespace's nodes grant: the current one, and the
    /// replaced one while the grace window is open.
    fn granted(&self) -> Vec<&Credential> {
        let open = self.grace_until.is_some_and(|t| SystemTime::now() < t);
        std::iter::once(&self.credential)
            .chain(self.previous.as_ref().filter(|_| open))
            .collect()
    }

    /// Ends the rotation's grace window once it has closed: the replaced
    /// credential is taken away from every node at this look.
    fn close_grace_if_over(&mut self, namespace: &str) {
        if self.grace_until.is_some_and(|t| SystemTime::now() >= t) {
            info!(
                namespace,
                "the rotation's grace window closed: the replaced credential stops working"
            );
            self.grace_until = None;
            self.checked = false;
        }
    }

    /// How the participants' own nodes go from the replaced credential to
    /// the current one: shared while the grace window is open, replaced after.
    fn moving(&self) -> Option<Moving<'_>> {
        let old = self.previous.as_ref()?;
        Some(Moving {
            old,
            new: &self.credential,
            keep_old: self.granted().len() > 1,
        })
    }
}

/// A rotation's move of the participants' nodes.
#[derive(Clone, Copy)]
struct Moving<'c> {
    old: &'c Credential,
    new: &'c Credential,
    /// The grace window is open: both work.
    keep_old: bool,
}

/// The namespaces' credentials, for one leadership term (one session).
pub struct Credentials {
    controller: Option<Credential>,
    /// How long a replaced credential keeps working after a rotation.
    grace: Duration,
    /// Each namespace's entry behind a lock of its own: a rotation must not
    /// race a first look of the same namespace, but namespaces do not wait
    /// for each other's network round trips.
    known: std::sync::Mutex<HashMap<String, Slot>>,
    /// The namespaces (names and uids), followed by [`Credentials::follow`].
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The one namespace this install watches (`--watch-namespace`): the
    /// others' stored credentials belong to other installs on the root.
    scope: Option<String>,
}

/// One namespace's entry (`None` until loaded).
type Slot = Arc<tokio::sync::Mutex<Option<Known>>>;

impl Credentials {
    /// Namespace credentials when `controller` is set; open ACLs otherwise.
    /// `scope`: the one namespace this install watches, if it watches one
    /// (`namespaces` then follows that one alone).
    pub fn new(
        controller: Option<Credential>,
        grace: Duration,
        namespaces: Store<PartialObjectMeta<Namespace>>,
        scope: Option<String>,
    ) -> Credentials {
        Credentials {
            controller,
            grace,
            known: Default::default(),
            namespaces,
            scope,
        }
    }

    /// The uid of the namespace object named `namespace` now: from the
    /// followed namespaces, or asked for when they do not show it (yet).
    async fn namespace_uid(&self, namespace: &str, client: &kube::Client) -> Result<String, Error> {
        if let Some(uid) = self
            .namespaces
            .get(&ObjectRef::new(namespace))
            .and_then(|n| n.metadata.uid.clone())
        {
            return Ok(uid);
        }
        Api::<Namespace>::all(client.clone())
            .get_opt(namespace)
            .await?
            .and_then(|n| n.metadata.uid)
            .ok_or(Error::Incomplete("the resource's namespace"))
    }

    /// Follows the namespaces (`events`, of a metadata watcher whose store
    /// is this one's): when one is deleted, or found gone when the watch
    /// (re)lists, its subtree and stored credential go, so a namespace
    /// made later under the same name gets a new one. Runs until `events`
    /// ends. A no-op without a controller credential.
    pub async fn follow(
        &self,
        events: impl futures::Stream<
            Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>,
        >,
        zk: &Session,
        layout: &Layout,
    ) {
        use futures::StreamExt;
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            if self.controller.is_none() {
                continue;
            }
            let gone: Vec<(String, Option<String>)> = match event {
                Ok(watcher::Event::Delete(ns)) => {
                    vec![(ns.name_any(), ns.metadata.uid.clone())]
                }
                // A full listing: every stored credential of this install's
                // namespaces whose namespace is not there (deleted while
                // nobody watched). Installs watching other namespaces may
                // share the root: their credentials are not this one's to
                // judge (its listing does not show their namespaces).
                Ok(watcher::Event::InitDone) => match stored_namespaces(zk, layout).await {
                    Ok(mut stored) => {
                        stored.sort();
                        stored
                            .into_iter()
                            .filter(|name| self.scope.as_ref().is_none_or(|s| s == name))
                            .filter(|name| self.namespaces.get(&ObjectRef::new(name)).is_none())
                            .map(|name| (name, None))
                            .collect()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list the stored namespace credentials");
                        Vec::new()
                    }
                },
                Ok(_) => Vec::new(),
                Err(e) => {
                    tracing::debug!(error = %e, "following the namespaces");
                    Vec::new()
                }
            };
            for (namespace, uid) in gone {
                if let Err(e) = self.forget(&namespace, uid.as_deref(), zk, layout).await {
                    tracing::warn!(%namespace, error = %e, "cannot remove what ZooKeeper keeps of a deleted namespace; trying again at the next listing");
                }
            }
        }
    }

    /// Removes `namespace`'s subtree and stored credential, the namespace
    /// (of `uid`, when known) being gone: unless the credential stored now
    /// is of another namespace object (one made again meanwhile).
    async fn forget(
        &self,
        namespace: &str,
        uid: Option<&str>,
        zk: &Session,
        layout: &Layout,
    ) -> Result<(), Error> {
        let slot = self.slot(namespace);
        let mut known = slot.lock().await;
        let node = layout.credential(namespace)?;
        let stored_uid = match load(zk, &node, namespace, None, false).await? {
            Some(stored) => stored.namespace_uid,
            None => None,
        };
        if let (Some(uid), Some(stored)) = (uid, &stored_uid) {
            if uid != stored {
                return Ok(());
            }
        }
        if let Some(now) = self
            .namespaces
            .get(&ObjectRef::new(namespace))
            .and_then(|n| n.metadata.uid.clone())
        {
            if stored_uid.as_deref().is_none_or(|s| s == now) {
                // The namespace of that name stands (made again, its
                // credential adopted or its own): nothing to remove.
                return Ok(());
            }
        }
        remove_namespace_state(zk, layout, namespace).await?;
        *known = None;
        Ok(())
    }

    /// `namespace`'s entry.
    fn slot(&self, namespace: &str) -> Slot {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(namespace.to_owned())
            .or_default()
            .clone()
    }

    /// How long until `namespace`'s rotation grace window closes (and a
    /// look must take the replaced credential away), if one is open.
    pub async fn grace_left(&self, namespace: &str) -> Option<Duration> {
        self.controller.as_ref()?;
        let slot = self.slot(namespace);
        let known = slot.lock().await;
        let until = known.as_ref()?.grace_until?;
        Some(
            until.duration_since(SystemTime::now()).unwrap_or_default()
                + Duration::from_millis(100),
        )
    }

    /// The ACLs for `namespace`'s nodes. With credentials, first makes sure
    /// the namespace has its credential (stored in ZooKeeper, where the
    /// handout reads it), that this session holds it, and (once a term, and
    /// after a rotation) that the namespace's nodes carry the ACLs; with
    /// `rotation`, rotates unless that request was answered already.
    pub async fn namespace_acls(
        &self,
        namespace: &str,
        zk: &Session,
        layout: &Layout,
        client: &kube::Client,
        rotation: Option<&Rotation>,
    ) -> Result<(NamespaceAcls, Option<Rotated>), Error> {
        let Some(controller) = &self.controller else {
            return Ok((NamespaceAcls::open(), None));
        };
        let slot = self.slot(namespace);
        let mut known = slot.lock().await;
        let uid = self.namespace_uid(namespace, client).await?;
        let k = hold(&mut known, namespace, zk, layout, Some(&uid), true)
            .await?
            .ok_or(Error::Incomplete("namespace credential"))?;
        k.close_grace_if_over(namespace);
        // The first look of a term, or a rotation left unfinished (by an
        // error here, or by a crash: the stored previous credential says
        // so): every node moves to the current credential (shared with the
        // replaced one while the grace window is open). Idempotent.
        if !k.checked {
            let acls = NamespaceAcls::new(controller, &k.granted());
            protect(zk, layout, namespace, &acls, k.moving()).await?;
            if !k.moved {
                k.moved = true;
                store(zk, &layout.credential(namespace)?, &Stored::of(k)).await?;
            }
            k.checked = true;
        }
        let rotated = match rotation {
            None => None,
            Some(r) if k.rotated_for.as_deref() == Some(r.0.as_str()) => Some(Rotated::Before),
            Some(r) if k.granted().len() > 1 => {
                info!(namespace, request = %r.0, "a credential rotation waits for the previous rotation's grace window to close");
                Some(Rotated::Waiting)
            }
            Some(r) => {
                self.rotate(k, namespace, controller, zk, layout, r).await?;
                Some(Rotated::Now)
            }
        };
        Ok((NamespaceAcls::new(controller, &k.granted()), rotated))
    }

    /// Rotates `namespace`'s credential: a new one stored first (the source
    /// of truth, with the credential it replaces and the request it
    /// answers; the handout goes on giving the replaced one), then the
    /// nodes, then stored as moved (the handout gives the new one from
    /// then): if a step fails, the next look finishes it rather than
    /// rotating again.
    async fn rotate(
        &self,
        k: &mut Known,
        namespace: &str,
        controller: &Credential,
        zk: &Session,
        layout: &Layout,
        rotation: &Rotation,
    ) -> Result<(), Error> {
        let new = Credential::generate(user_of(namespace));
        zk.add_credential(&new).await?;
        let mut rotated = Known {
            namespace_uid: k.namespace_uid.clone(),
            previous: Some(k.credential.clone()),
            credential: new,
            grace_until: Some(SystemTime::now() + self.grace),
            rotated_for: Some(rotation.0.clone()),
            moved: false,
            checked: false,
        };
        let node = layout.credential(namespace)?;
        store(zk, &node, &Stored::of(&rotated)).await?;
        info!(namespace, grace = ?self.grace, request = %rotation.0, "rotated the namespace's ZooKeeper credential; the replaced one works until the grace window closes");
        let acls = NamespaceAcls::new(controller, &rotated.granted());
        // Stored: from here on the rotation is this namespace's state,
        // finished by the next look if the nodes cannot be moved now.
        let moved = protect(zk, layout, namespace, &acls, rotated.moving()).await;
        if moved.is_ok() {
            rotated.moved = true;
            rotated.checked = true;
        }
        *k = rotated;
        moved?;
        store(zk, &node, &Stored::of(k)).await
    }

    /// When `namespace` is being deleted and none of its barriers and locks
    /// is left in ZooKeeper, removes its subtree and its stored credential,
    /// so a namespace made later under the same name gets a new one (a copy
    /// of the old credential opens nothing). A no-op without a controller
    /// credential.
    pub async fn forget_if_terminating(
        &self,
        namespace: &str,
        zk: &Session,
        layout: &Layout,
        client: &kube::Client,
    ) -> Result<(), Error> {
        if self.controller.is_none() {
            return Ok(());
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let terminating = namespaces
            .get_opt(namespace)
            .await?
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some());
        if !terminating {
            return Ok(());
        }
        let dirs = layout.namespace_dirs(namespace)?;
        for parent in &dirs[1..] {
            if !children(zk, parent).await?.is_empty() {
                return Ok(());
            }
        }
        let slot = self.slot(namespace);
        let mut known = slot.lock().await;
        remove_namespace_state(zk, layout, namespace).await?;
        *known = None;
        Ok(())
    }

    /// Makes sure this session holds `namespace`'s credentials, so it can
    /// read and remove the nodes its pods made: what a resource's deletion
    /// needs, which must work in a namespace being deleted too. It makes no credential: without one
    /// stored, no pod of the namespace had one to make nodes with (and a
    /// deletion that comes after the namespace was tidied up must not bring
    /// it back). A no-op without a controller credential.
    pub async fn hold(&self, namespace: &str, zk: &Session, layout: &Layout) -> Result<(), Error> {
        if self.controller.is_some() {
            let slot = self.slot(namespace);
            hold(&mut *slot.lock().await, namespace, zk, layout, None, false).await?;
        }
        Ok(())
    }
}

/// `namespace`'s current credential (`user:password`), if one is stored
/// for the namespace object `uid` (one stored for a namespace of that name
/// deleted since, or by an older controller and not adopted yet, is not
/// handed out). Reads only: what the handout serves, on any replica.
pub async fn current_for(
    zk: &Session,
    layout: &Layout,
    namespace: &str,
    uid: &str,
) -> Result<Option<String>, Error> {
    let node = layout.credential(namespace)?;
    Ok(load(zk, &node, namespace, None, false)
        .await?
        .filter(|k| k.namespace_uid.as_deref() == Some(uid))
        .map(|k| match (&k.previous, k.moved) {
            // A rotation's nodes are not all moved yet: the replaced
            // credential still opens them all.
            (Some(previous), false) => previous.expose(),
            _ => k.credential.expose(),
        }))
}

/// [`current_for`] as the credential handout asks it
/// (`webhook::handout::CurrentCredential`): its error as the text the
/// handout's refusal carries.
pub fn current_for_handout<'a>(
    zk: &'a Session,
    layout: &'a Layout,
    namespace: &'a str,
    uid: &'a str,
) -> futures::future::BoxFuture<'a, Result<Option<String>, String>> {
    Box::pin(async move {
        current_for(zk, layout, namespace, uid)
            .await
            .map_err(|e| e.to_string())
    })
}

/// The namespace's entry, loading its stored credentials and adding them
/// to the session the first time; `None` when none is stored and not
/// `create`. With `uid` (the namespace object's, now), a credential stored
/// for another namespace object of that name (deleted since) is never
/// used: it goes, with that namespace's subtree, and with `create` a new
/// one is made; one stored without a uid (by an older controller) is
/// adopted.
async fn hold<'k>(
    known: &'k mut Option<Known>,
    namespace: &str,
    zk: &Session,
    layout: &Layout,
    uid: Option<&str>,
    create: bool,
) -> Result<Option<&'k mut Known>, Error> {
    let stale =
        |k: &Known| uid.is_some_and(|uid| k.namespace_uid.as_deref().is_some_and(|u| u != uid));
    if known.as_ref().is_some_and(stale) {
        remove_namespace_state(zk, layout, namespace).await?;
        *known = None;
    }
    if known.is_none() {
        let node = layout.credential(namespace)?;
        let mut loaded = load(zk, &node, namespace, uid, create).await?;
        if loaded.as_ref().is_some_and(stale) {
            remove_namespace_state(zk, layout, namespace).await?;
            loaded = load(zk, &node, namespace, uid, create).await?;
        }
        let Some(mut loaded) = loaded else {
            return Ok(None);
        };
        if let (Some(uid), None) = (uid, &loaded.namespace_uid) {
            loaded.namespace_uid = Some(uid.to_owned());
            store(zk, &node, &Stored::of(&loaded)).await?;
        }
        for c in std::iter::once(&loaded.credential).chain(loaded.previous.as_ref()) {
            zk.add_credential(c).await?;
        }
        *known = Some(loaded);
    }
    Ok(known.as_mut())
}

/// The namespaces with a stored credential.
async fn stored_namespaces(zk: &Session, layout: &Layout) -> Result<Vec<String>, Error> {
    let dir = layout.credential("x")?;
    let dir = dir
        .rsplit_once('/')
        .map_or(dir.as_str(), |(d, _)| d)
        .to_owned();
    children(zk, &dir).await
}

/// Removes what ZooKeeper keeps of `namespace`: its subtree and its stored
/// credential.
async fn remove_namespace_state(
    zk: &Session,
    layout: &Layout,
    namespace: &str,
) -> Result<(), Error> {
    let dirs = layout.namespace_dirs(namespace)?;
    // Nodes a participant shut the controller out of stay (only a
    // ZooKeeper superuser can remove them), but the credential goes all
    // the same: a namespace made again must get a new one.
    let left = tree::delete_tree(zk, &dirs[0]).await?;
    if !left.is_empty() {
        tracing::error!(namespace, "{}", Error::ShutOut(left));
    }
    tree::delete_if_present(zk, &layout.credential(namespace)?).await?;
    info!(
        namespace,
        "removed the ZooKeeper subtree and stored credential of a namespace that is gone"
    );
    Ok(())
}

/// The digest user of a namespace's credential.
fn user_of(namespace: &str) -> String {
    format!("namespace-{namespace}")
}

/// The stored credentials; with `create`, making one (for the namespace
/// object `uid`) when there is none (else `None`).
async fn load(
    zk: &Session,
    node: &str,
    namespace: &str,
    uid: Option<&str>,
    create: bool,
) -> Result<Option<Known>, Error> {
    let client = zk.client();
    let mut attempts = 0;
    loop {
        attempts += 1;
        if attempts > crate::zk::CONTENDED_ATTEMPTS {
            return Err(ZkError::Contended {
                op: "read",
                path: node.to_owned(),
                attempts: attempts - 1,
            }
            .into());
        }
        // The data and the ACL of one and the same node (both asked for
        // before either answer is awaited; compared by their stats below).
        let read = zk
            .retry("read", node, || {
                let data = client.get_data(node);
                let acl = client.get_acl(node);
                async move { Ok((data.await?, acl.await?)) }
            })
            .await;
        match read {
            Ok(((data, stat), (node_acl, acl_stat))) => {
                if (acl_stat.czxid, acl_stat.mzxid, acl_stat.aversion)
                    != (stat.czxid, stat.mzxid, stat.aversion)
                {
                    // Replaced or changed between the two reads: again.
                    continue;
                }
                // Only a node the controller made (its ACL the controller's
                // alone) holds a credential: one made while ACLs were off
                // (open to anyone then) may hold a password a tenant
                // planted. The leader removes it, and the namespace gets a
                // new one; a reader that makes nothing (the handout) only
                // refuses to use it.
                if !acl::same(&node_acl, &zk.node_acls()) {
                    if !create {
                        return Ok(None);
                    }
                    tracing::warn!(
                        namespace,
                        node,
                        "a stored credential whose ACL is not the controller's alone (made while ACLs were off?) is not used: removed, the namespace gets a new credential"
                    );
                    match zk
                        .retry("delete", node, || client.delete(node, Some(stat.version)))
                        .await
                    {
                        Ok(())
                        | Err(ZkError::Zk {
                            source: zk::Error::NoNode | zk::Error::BadVersion,
                            ..
                        }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                let stored: Stored =
                    serde_json::from_slice(&data).map_err(|e| ZkError::InvalidData {
                        path: node.to_owned(),
                        reason: format!("not a stored credential: {e}"),
                    })?;
                let parse = |s: &str| {
                    Credential::parse(s).map_err(|reason| ZkError::InvalidData {
                        path: node.to_owned(),
                        reason,
                    })
                };
                return Ok(Some(Known {
                    namespace_uid: stored.namespace_uid,
                    credential: parse(&stored.current)?,
                    previous: stored.previous.as_deref().map(parse).transpose()?,
                    grace_until: stored
                        .previous_until_ms
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
                    rotated_for: stored.rotated_for,
                    moved: stored.moved,
                    checked: false,
                }));
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) if !create => return Ok(None),
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => {
                let fresh = Credential::generate(user_of(namespace));
                let data = serde_json::to_vec(&Stored {
                    current: fresh.expose(),
                    previous: None,
                    previous_until_ms: None,
                    namespace_uid: uid.map(str::to_owned),
                    rotated_for: None,
                    moved: true,
                })?;
                // The controller's own ACL: nobody else may read it.
                let options = zk::CreateMode::Persistent.with_acls(zk.node_acls());
                if let Some((parent, _)) = node.rsplit_once('/') {
                    zk.mkdir_all(parent, &options).await?;
                }
                match zk
                    .retry("create", node, || client.create(node, &data, &options))
                    .await
                {
                    // Made by another replica meanwhile: read theirs.
                    Ok(_)
                    | Err(ZkError::Zk {
                        source: zk::Error::NodeExists,
                        ..
                    }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `stored` to `node`.
async fn store(zk: &Session, node: &str, stored: &Stored) -> Result<(), Error> {
    let data = serde_json::to_vec(stored)?;
    let client = zk.client();
    zk.retry("write", node, || client.set_data(node, &data, None))
        .await?;
    Ok(())
}

/// Makes the namespace's parents with `acls` and gives the ones there, and
/// every barrier and lock node, the ACLs; after a rotation also moves the
/// participants' own nodes from the old credential to the new one.
async fn protect(
    zk: &Session,
    layout: &Layout,
    namespace: &str,
    acls: &NamespaceAcls,
    rotation: Option<Moving<'_>>,
) -> Result<(), Error> {
    let dirs = layout.namespace_dirs(namespace)?;
    let options = zk::CreateMode::Persistent.with_acls((&acls.dirs[..]).into());
    for dir in &dirs {
        zk.mkdir_all(dir, &options).await?;
        acl_change::ensure(zk, dir, &acls.dirs).await?;
    }
    // Before the nodes move: a participant that connects from here on
    // grants READ to every credential of the grace window.
    publish_readers(zk, &dirs[0], &acls.readers).await?;
    for (parent, wanted) in [(&dirs[1], &acls.barriers), (&dirs[2], &acls.resources)] {
        for resource in children(zk, parent).await? {
            let resource = format!("{parent}/{resource}");
            acl_change::ensure(zk, &resource, wanted).await?;
            if let Some(Moving { old, new, keep_old }) = rotation {
                for member in children(zk, &resource).await? {
                    let member = format!("{resource}/{member}");
                    if keep_old {
                        acl_change::share_digest(zk, &member, old, new).await?;
                    } else {
                        acl_change::replace_digest(zk, &member, old, new).await?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes `readers` into the namespace node `node` unless it says so
/// already (a rewrite would be a write per look).
async fn publish_readers(zk: &Session, node: &str, readers: &acl::Readers) -> Result<(), Error> {
    let client = zk.client();
    let wanted = readers.to_bytes();
    for _ in 0..crate::zk::CONTENDED_ATTEMPTS {
        let (data, stat) = zk.retry("read", node, || client.get_data(node)).await?;
        if acl::Readers::parse(&data) == *readers {
            return Ok(());
        }
        match zk
            .retry("write", node, || {
                client.set_data(node, &wanted, Some(stat.version))
            })
            .await
        {
            Ok(_) => {
                tracing::debug!(%node, readers = readers.readers.len(), "published the credentials the namespace's participants grant READ to");
                return Ok(());
            }
            // Written meanwhile (a replica that led before us): read again.
            Err(ZkError::Zk {
                source: zk::Error::BadVersion,
                ..
            }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ZkError::Contended {
        op: "publish the readers of",
        path: node.to_owned(),
        attempts: crate::zk::CONTENDED_ATTEMPTS,
    }
    .into())
}

async fn children(zk: &Session, path: &str) -> Result<Vec<String>, Error> {
    let client = zk.client();
    match zk.retry("list", path, || client.list_children(path)).await {
        Ok(children) => Ok(children),
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}
