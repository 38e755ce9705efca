//! Which install a root belongs to, so that two clusters (or two installs
//! of one cluster) can share one ensemble without touching each other's
//! nodes.
//!
//! The controller's uid checks delete a resource's subtree when its data
//! names another uid: two clusters on one root would delete each other's
//! barriers. So `<root>`'s data records the cluster that owns it (the uid
//! of its `kube-system` namespace, which lives as long as the cluster) and
//! the watch scopes that have run on it; a controller of another cluster
//! refuses to run there, before it writes anything.
//!
//! Within one cluster, installs with different `--watch-namespace` share a
//! root: each scope leads on its own lock (`<root>/leader` for all
//! namespaces, `<root>/leader-<namespace>` for one), and a scope that
//! overlaps a live one (all namespaces beside one namespace) refuses to
//! lead while the other has contenders.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use zookeeper_client as zk;

use crate::layout::Layout;
use crate::zk::Session;

/// The namespace whose uid names a cluster: every cluster has it, and it is
/// never deleted.
pub const IDENTITY_NAMESPACE: &str = "kube-system";

/// The resources one install reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace.
    All,
    /// One namespace (`--watch-namespace`).
    Namespace(String),
}

impl Scope {
    /// The scope of `--watch-namespace`.
    pub fn of(watch_namespace: Option<&str>) -> Scope {
        match watch_namespace {
            Some(namespace) => Scope::Namespace(namespace.to_owned()),
            None => Scope::All,
        }
    }

    /// How the root's record names it.
    fn label(&self) -> String {
        match self {
            Scope::All => "*".to_owned(),
            Scope::Namespace(namespace) => namespace.clone(),
        }
    }

    /// The name of this scope's leader lock under the root. All namespaces
    /// keep the name of earlier versions, so a rolling upgrade's old and new
    /// replicas queue on one lock.
    fn leader_name(&self) -> String {
        match self {
            Scope::All => "leader".to_owned(),
            Scope::Namespace(namespace) => format!("leader-{namespace}"),
        }
    }

    /// This scope's leader lock.
    pub fn leader_path(&self, layout: &Layout) -> String {
        layout.child(&self.leader_name())
    }

    /// Whether the leader lock named `name` (a child of the root) belongs to
    /// a scope that shares resources with this one.
    fn overlaps(&self, name: &str) -> bool {
        if name == self.leader_name() {
            return false;
        }
        match self {
            Scope::All => name == "leader" || name.starts_with("leader-"),
            Scope::Namespace(_) => name == "leader",
        }
    }
}

/// What `<root>`'s data says about its owner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RootRecord {
    /// The owning cluster's identity.
    cluster: String,
    /// Every watch scope that has run on this root (`*`: all namespaces).
    #[serde(default)]
    scopes: BTreeSet<String>,
}

/// Why this install may not run on the root.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Another cluster's controller owns the root.
    #[error("{root} belongs to another cluster (kube-system uid {owner}; this cluster's is {ours}): give this install its own root (--root, the chart's zookeeper.root)")]
    OtherCluster {
        /// The root.
        root: String,
        /// The identity recorded there.
        owner: String,
        /// Ours.
        ours: String,
    },
    /// The root holds data zkgate did not write.
    #[error("{root} holds data zkgate did not write ({problem}): choose another root (--root, the chart's zookeeper.root)")]
    Foreign {
        /// The root.
        root: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A live install with an overlapping scope leads on this root.
    #[error("another zkgate controller leads an overlapping scope on {root} ({other} has contenders) while this one watches {ours}: give one of them its own root, or watch disjoint namespaces")]
    Overlap {
        /// The root.
        root: String,
        /// The other scope's leader lock.
        other: String,
        /// Our scope.
        ours: String,
    },
}

/// The identity of the cluster `client` talks to: its `kube-system`
/// namespace's uid.
pub async fn cluster_identity(client: &kube::Client) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = namespaces.get(IDENTITY_NAMESPACE).await.with_context(|| {
        format!("cannot read the {IDENTITY_NAMESPACE} namespace (its uid names this cluster in ZooKeeper; the chart grants get on it)")
    })?;
    namespace
        .uid()
        .ok_or_else(|| anyhow::anyhow!("the {IDENTITY_NAMESPACE} namespace has no uid"))
}

/// Claims `layout`'s root for `cluster` and records `scope` there: creates
/// the root with the record, or adds to the record of an unclaimed root
/// (empty data: an earlier version's) or of this cluster's. A root owned by
/// another cluster, or holding data zkgate did not write, is refused before
/// anything is written.
pub async fn claim_root(
    session: &Session,
    layout: &Layout,
    cluster: &str,
    scope: &Scope,
) -> anyhow::Result<()> {
    let root = layout.root();
    let client = session.client();
    // A few rounds: another replica may claim between our read and write.
    for _ in 0..5 {
        let (data, stat) = match client.get_data(root).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => {
                let record = RootRecord {
                    cluster: cluster.to_owned(),
                    scopes: BTreeSet::from([scope.label()]),
                };
                let options = zk::CreateMode::Persistent.with_acls(session.node_acls());
                match client
                    .create(root, &serde_json::to_vec(&record)?, &options)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(zk::Error::NodeExists) => continue,
                    Err(zk::Error::NoNode) => {
                        // The root's parent is missing (a nested --root):
                        // make the path, then claim the empty root.
                        match client.mkdir(root, &options).await {
                            Ok(()) | Err(zk::Error::NodeExists) => continue,
                            Err(e) => anyhow::bail!("cannot create {root}: {e}"),
                        }
                    }
                    Err(e) => anyhow::bail!("cannot create {root}: {e}"),
                }
            }
            Err(e) => anyhow::bail!(
                "cannot read {root} (is it another install's, protected by its credential?): {e}"
            ),
        };
        let mut record = if data.is_empty() {
            RootRecord {
                cluster: cluster.to_owned(),
                scopes: BTreeSet::new(),
            }
        } else {
            serde_json::from_slice::<RootRecord>(&data).map_err(|e| Refused::Foreign {
                root: root.to_owned(),
                problem: e.to_string(),
            })?
        };
        if record.cluster != cluster {
            return Err(Refused::OtherCluster {
                root: root.to_owned(),
                owner: record.cluster,
                ours: cluster.to_owned(),
            }
            .into());
        }
        let added = record.scopes.insert(scope.label());
        if !added && !data.is_empty() {
            return Ok(());
        }
        match client
            .set_data(root, &serde_json::to_vec(&record)?, Some(stat.version))
            .await
        {
            Ok(_) => return Ok(()),
            Err(zk::Error::BadVersion) => continue,
            Err(e) => anyhow::bail!("cannot record this install in {root}: {e}"),
        }
    }
    anyhow::bail!("{root} kept changing while this install claimed it; retrying")
}

/// After taking `scope`'s leader lock: the leader lock of a live install
/// whose scope overlaps ours, if any (its contenders are live sessions).
pub async fn overlapping_leader(
    session: &Session,
    layout: &Layout,
    scope: &Scope,
) -> anyhow::Result<Option<Refused>> {
    let root = layout.root();
    let client = session.client();
    let names = client
        .list_children(root)
        .await
        .map_err(|e| anyhow::anyhow!("cannot list {root}: {e}"))?;
    for name in names.iter().filter(|name| scope.overlaps(name)) {
        let path = layout.child(name);
        match client.list_children(&path).await {
            Ok(contenders) if !contenders.is_empty() => {
                return Ok(Some(Refused::Overlap {
                    root: root.to_owned(),
                    other: path,
                    ours: match scope {
                        Scope::All => "every namespace".to_owned(),
                        Scope::Namespace(namespace) => format!("namespace {namespace}"),
                    },
                }))
            }
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => anyhow::bail!("cannot list {path}: {e}"),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_overlap_only_where_they_share_namespaces() {
        let all = Scope::All;
        let a = Scope::Namespace("a".into());
        assert!(all.overlaps("leader-a"));
        assert!(!all.overlaps("leader"));
        assert!(a.overlaps("leader"));
        assert!(!a.overlaps("leader-a"));
        assert!(!a.overlaps("leader-b"));
        assert!(!all.overlaps("namespaces"));
        let layout = Layout::new("/zkgate").unwrap();
        assert_eq!(all.leader_path(&layout), "/zkgate/leader");
        assert_eq!(a.leader_path(&layout), "/zkgate/leader-a");
        assert_eq!(all.leader_path(&Layout::new("/").unwrap()), "/leader");
    }
}
