//! Issue 25's hostile-tenant suite, on the one-node cluster with ACLs on
//! (the chart installed as `install_chart` does it).
//!
//! Each tenant is a user (impersonated) with what a namespace admin
//! usually has: the built-in `admin` ClusterRole bound in their own
//! namespace by a RoleBinding, which the chart's aggregated ClusterRoles
//! extend to Barriers and LockLeases. Tenant A attacks tenant B every way
//! zkgate offers: through the API, through ZooKeeper with the credential
//! its pods are handed, through its pods (labels and flags), through the
//! webhook's port, and by taking over B's namespace name. Every attempt
//! must fail with a message that says why, and B's resources and znodes
//! must be exactly what they were.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::Value;
use zkgate::api::LockLease;
use zkgate::handout::Handout;
use zkgate::zk::{Credential, Session};
use zookeeper_client as zk;

use super::*;

/// A namespace and the user who administers it.
struct Tenant {
    ns: NamespaceGuard,
    user: String,
    client: Client,
}

impl Tenant {
    /// A fresh namespace whose admin (the `admin` ClusterRole, bound
    /// there) is the user `tenant-NS`.
    async fn new(c: &Cluster) -> Tenant {
        Tenant::adopt(c, c.namespace().await).await
    }

    /// The namespace of `ns`, administered by the user `tenant-NS`.
    async fn adopt(c: &Cluster, ns: NamespaceGuard) -> Tenant {
        let user = format!("tenant-{}", ns.name);
        c.apply(
            &ns.name,
            &format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: namespace-admin}}\n\
                 roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}}\n\
                 subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n"
            ),
        ).await;
        let client = support::kube::client_as(&c.dir.join("kubeconfig"), &user).await;
        Tenant { ns, user, client }
    }

    /// Two tenants, A and B, each with its resources made.
    async fn pair(c: &Cluster) -> (Tenant, Tenant) {
        let (a, b) = (Tenant::new(c).await, Tenant::new(c).await);
        a.make_resources().await;
        b.make_resources().await;
        (a, b)
    }

    fn name(&self) -> &str {
        &self.ns.name
    }

    /// Makes, as the tenant, the Barrier `gang` (2 participants), the
    /// LockLease `db` (exclusive) and `slots` (a Semaphore of 1 permit),
    /// and waits until the controller reconciled them. A namespace admin
    /// may, through the chart's aggregated roles (created asynchronously
    /// by the API server's aggregation controller after the install: the
    /// first attempt is retried for a while).
    async fn make_resources(&self) {
        let barriers: Api<Barrier> = Api::namespaced(self.client.clone(), self.name());
        let locks: Api<LockLease> = Api::namespaced(self.client.clone(), self.name());
        let gang: Barrier = serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
            "metadata": { "name": "gang" }, "spec": { "participants": 2 }
        }))
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match barriers.create(&PostParams::default(), &gang).await {
                Ok(_) => break,
                Err(kube::Error::Api(e))
                    if e.code == 403 && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(e) => panic!(
                    "a namespace admin may make a Barrier (the chart's aggregated roles): {e}"
                ),
            }
        }
        for (name, spec) in [
            ("db", json!({})),
            ("slots", json!({ "mode": "Semaphore", "permits": 1 })),
        ] {
            let lock: LockLease = serde_json::from_value(json!({
                "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease",
                "metadata": { "name": name }, "spec": spec
            }))
            .unwrap();
            locks
                .create(&PostParams::default(), &lock)
                .await
                .unwrap_or_else(|e| panic!("the tenant makes LockLease {name}: {e}"));
        }
        eventually(WITHIN, "the tenant's resources reconciled", || async {
            barriers.get("gang").await.ok()?.status?.znode?;
            for name in ["db", "slots"] {
                locks.get(name).await.ok()?.status?.znode?;
            }
            Some(())
        })
        .await;
    }

    /// What a pod of this namespace is handed by the controller (asked
    /// for as the pod asks: a projected token of its ServiceAccount).
    async fn handout(&self, c: &Cluster) -> Handout {
        let dir = tempfile::tempdir().unwrap();
        let source = c.handout_source(self.name(), dir.path()).await;
        source
            .fetch(Some(Duration::from_secs(60)))
            .await
            .unwrap_or_else(|e| panic!("no handout for {}: {e}", self.name()))
    }

    /// A session that reads everything of this namespace's, as the
    /// controller does: its own credential and the namespace's.
    async fn observer(&self, c: &Cluster) -> Session {
        let session = c.controller_session().await;
        session
            .add_credential(&self.credential(c).await)
            .await
            .unwrap();
        session
    }

    async fn credential(&self, c: &Cluster) -> Credential {
        let auth = self
            .handout(c)
            .await
            .auth
            .expect("ACLs are on: a credential in the handout");
        Credential::parse(&auth).unwrap()
    }
}

impl Cluster {
    /// The handout as a pod of `namespace` reaches it: each controller
    /// pod's address, the webhook Service's name in its certificate, the
    /// webhook's CA, and a token of the namespace's `default`
    /// ServiceAccount for audience `zkgate` (what the kubelet projects) in
    /// a file of `dir`.
    async fn handout_source(&self, namespace: &str, dir: &Path) -> zkgate::handout::Source {
        let token = support::handout::token_of(
            &self.client,
            namespace,
            "default",
            zkgate::handout::AUDIENCE,
        )
        .await;
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).unwrap();
        let urls = self
            .controllers()
            .await
            .into_iter()
            .map(|(_, ip, _)| format!("https://{ip}:9443"))
            .collect();
        zkgate::handout::Source {
            urls,
            server_name: Some(format!("{RELEASE}-webhook.{SYSTEM_NAMESPACE}.svc")),
            ca: String::from_utf8(self.webhook_ca().await).unwrap(),
            token_file,
        }
    }

    /// The CA the webhook's (and the handout's) certificate chains to.
    async fn webhook_ca(&self) -> Vec<u8> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let secret = secrets
            .get(&format!("{RELEASE}-webhook-tls"))
            .await
            .expect("the webhook's certificate Secret");
        secret.data.expect("data")["ca.crt"].0.clone()
    }

    /// A session holding the controller's own credential (the chart's
    /// `zookeeper.auth.existingSecret`): it may read every namespace's
    /// nodes, which is how the tests see what changed.
    async fn controller_session(&self) -> Session {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let secret = secrets.get("zkgate-controller-auth").await.unwrap();
        let auth = String::from_utf8(secret.data.unwrap()["auth"].0.clone()).unwrap();
        support::session_as(&self.zookeeper(), Some(&Credential::parse(&auth).unwrap())).await
    }
}

/// Every node under `path` (itself included): its data and ACL, as the
/// controller reads them.
async fn subtree(session: &Session, path: &str) -> BTreeMap<String, (Vec<u8>, String)> {
    let client = session.client();
    let mut nodes = BTreeMap::new();
    let mut pending = vec![path.to_owned()];
    while let Some(node) = pending.pop() {
        let (data, _) = client
            .get_data(&node)
            .await
            .unwrap_or_else(|e| panic!("read {node}: {e}"));
        let (acl, _) = client.get_acl(&node).await.unwrap();
        let (children, _) = client.get_children(&node).await.unwrap();
        pending.extend(children.into_iter().map(|c| format!("{node}/{c}")));
        nodes.insert(node, (data, format!("{acl:?}")));
    }
    nodes
}

/// After an attack: nobody holds or waits for B's locks, B's own participants still get through a new barrier
/// of B's (two of them, with B's credential, from this host: the
/// controller still reconciles B) and B's lock is
/// still taken and given back: what A tried left B working, not just
/// unchanged.
async fn still_works(c: &Cluster, b: &Tenant) {
    let locks: Api<LockLease> = Api::namespaced(c.client.clone(), b.name());
    for name in ["db", "slots"] {
        let status = locks.get(name).await.unwrap().status.unwrap();
        assert_eq!(
            (status.holder_count, status.waiting_count),
            (0, 0),
            "nobody holds or waits for B's {name}: {status:?}"
        );
    }
    let after: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "after" }, "spec": { "participants": 2 }
    }))
    .unwrap();
    let barriers: Api<Barrier> = Api::namespaced(b.client.clone(), b.name());
    barriers
        .create(&PostParams::default(), &after)
        .await
        .expect("B makes a Barrier after the attack");
    eventually(WITHIN, "B's new Barrier reconciled", || async {
        barriers.get("after").await.ok()?.status?.znode
    })
    .await;
    let credential = b.credential(c).await;
    // Flags before the command's `--`.
    let participant = |id: &'static str, kind: &'static str, name: &'static str| {
        let mut cmd = support::zkgate(&c.zookeeper(), &[kind, "run", name]);
        cmd.args(["--namespace", b.name(), "--id", id, "--timeout", "60s"])
            .args(["--auth", &credential.expose(), "--", "true"]);
        support::output(cmd)
    };
    let ((first, e1), (second, e2)) = tokio::join!(
        participant("b-0", "barrier", "after"),
        participant("b-1", "barrier", "after")
    );
    assert_eq!(
        (first, second),
        (0, 0),
        "B's gang after the attack: {e1}\n{e2}"
    );
    let (code, err) = participant("b-lock", "lock", "db").await;
    assert_eq!(code, 0, "B's lock after the attack: {err}");
}

/// Asserts that the nodes under `path` are what `before` recorded, naming
/// the nodes that differ.
async fn assert_unchanged(
    session: &Session,
    path: &str,
    before: &BTreeMap<String, (Vec<u8>, String)>,
) {
    let after = subtree(session, path).await;
    let differ: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(differ.is_empty(), "nodes under {path} changed: {differ:?}");
}

/// The names of what `api` lists.
async fn names_in<K>(api: &Api<K>) -> std::collections::BTreeSet<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|x| x.name_any())
        .collect()
}

fn no_auth<T: std::fmt::Debug>(what: &str, result: Result<T, zk::Error>) {
    match result {
        Err(zk::Error::NoAuth) => {}
        other => panic!("{what} must be refused (NoAuth): {other:?}"),
    }
}

fn forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("{what} must be forbidden: {other:?}"),
    }
}

/// What a tenant may not change of another's resources: spec, labels,
/// annotations, finalizers, deletion.
fn unchanged_part(object: &impl serde::Serialize) -> Value {
    let value = serde_json::to_value(object).unwrap();
    json!({
        "spec": value["spec"],
        "labels": value["metadata"]["labels"],
        "annotations": value["metadata"]["annotations"],
        "finalizers": value["metadata"]["finalizers"],
        "deletionTimestamp": value["metadata"]["deletionTimestamp"],
        "uid": value["metadata"]["uid"],
    })
}

/// Through the API: tenant A may do what it likes with its own Barriers
/// and LockLeases (but not write their status, which is the
/// controller's), and nothing with B's: not read, make, change, annotate
/// (a credential rotation), delete; nor read B's Secrets or the
/// controller's. And no path through zkgate reads a Secret of B's: every
/// zkgate path acts as the controller's ServiceAccount, which may not.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn through_the_api_a_tenant_reaches_only_its_own_namespace() {
    let c = cluster().await;
    let (a, b) = Tenant::pair(&c).await;
    let theirs_barriers: Api<Barrier> = Api::namespaced(a.client.clone(), b.name());
    let theirs_locks: Api<LockLease> = Api::namespaced(a.client.clone(), b.name());
    let admin_barriers: Api<Barrier> = Api::namespaced(c.client.clone(), b.name());
    let admin_locks: Api<LockLease> = Api::namespaced(c.client.clone(), b.name());
    let before = (
        unchanged_part(&admin_barriers.get("gang").await.unwrap()),
        unchanged_part(&admin_locks.get("db").await.unwrap()),
    );

    forbidden("reading B's Barrier", theirs_barriers.get("gang").await);
    forbidden(
        "listing B's LockLeases",
        theirs_locks.list(&Default::default()).await,
    );
    let barrier: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "planted" }, "spec": { "participants": 1 }
    }))
    .unwrap();
    forbidden(
        "making a Barrier in B",
        theirs_barriers
            .create(&PostParams::default(), &barrier)
            .await,
    );
    let shrink = json!({ "spec": { "participants": 1 } });
    forbidden(
        "changing B's Barrier",
        theirs_barriers
            .patch("gang", &PatchParams::default(), &Patch::Merge(&shrink))
            .await,
    );
    let rotate = json!({ "metadata": { "annotations": { "zkgate.io/rotate-credential": "now" } } });
    forbidden(
        "asking for a rotation of B's credential",
        theirs_locks
            .patch("db", &PatchParams::default(), &Patch::Merge(&rotate))
            .await,
    );
    let failed = json!({ "status": { "phase": "Failed", "reason": "Forged" } });
    forbidden(
        "failing B's Barrier through its status",
        theirs_barriers
            .patch_status("gang", &PatchParams::default(), &Patch::Merge(&failed))
            .await,
    );
    forbidden(
        "deleting B's Barrier",
        theirs_barriers
            .delete("gang", &DeleteParams::default())
            .await,
    );
    forbidden(
        "deleting B's LockLeases",
        theirs_locks
            .delete_collection(&DeleteParams::default(), &Default::default())
            .await,
    );
    for ns in [b.name(), SYSTEM_NAMESPACE] {
        forbidden(
            &format!("listing the Secrets of {ns}"),
            Api::<Secret>::namespaced(a.client.clone(), ns)
                .list(&Default::default())
                .await,
        );
    }
    // Its own status is the controller's too: a tenant cannot fake an
    // opening (or a failure) for its own pods' `kubectl zkgate` either.
    forbidden(
        "writing the status of its own Barrier",
        Api::<Barrier>::namespaced(a.client.clone(), a.name())
            .patch_status("gang", &PatchParams::default(), &Patch::Merge(&failed))
            .await,
    );
    // Every zkgate path (admission, reconcile, handout) acts as the
    // controller's ServiceAccount: it cannot read B's Secrets.
    let b_secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "b-private" }, "stringData": { "password": "b's own" }
    }))
    .unwrap();
    Api::<Secret>::namespaced(b.client.clone(), b.name())
        .create(&PostParams::default(), &b_secret)
        .await
        .expect("B keeps a Secret of its own");
    let controller = support::kube::client_as(
        &c.dir.join("kubeconfig"),
        &format!("system:serviceaccount:{SYSTEM_NAMESPACE}:{RELEASE}"),
    )
    .await;
    forbidden(
        "the controller reading B's Secret",
        Api::<Secret>::namespaced(controller, b.name())
            .get("b-private")
            .await,
    );

    let after = (
        unchanged_part(&admin_barriers.get("gang").await.unwrap()),
        unchanged_part(&admin_locks.get("db").await.unwrap()),
    );
    assert_eq!(before, after, "B's resources changed");
    assert!(admin_barriers.get_opt("planted").await.unwrap().is_none());
}

/// Through ZooKeeper, with the credential A's pods are handed (and A's
/// TokenReview-proved namespace: asking for B's is impossible, since the
/// token says A): B's nodes cannot be read, listed, written, deleted,
/// re-ACLed, joined, opened or released; the stored credentials cannot be
/// read; a namespace not made yet cannot be squatted; the zkgate command
/// given A's credential and B's namespace is refused by the server, and
/// says so. B's subtree is byte for byte what it was.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_tenants_credential_opens_nothing_of_another_namespace_in_zookeeper() {
    let c = cluster().await;
    let (a, b) = Tenant::pair(&c).await;
    // B has a participant registered and waiting at its barrier.
    c.apply(
        b.name(),
        &waiting_pod("member", &c.zookeeper(), "gang", None),
    )
    .await;
    c.barrier(b.name(), "gang", "B's member to be counted", |x| {
        x.status.as_ref().is_some_and(|s| s.entered == 1)
    })
    .await;
    let handout = a.handout(&c).await;
    assert_eq!(handout.namespace, a.name(), "A's token proves A");
    let credential = Credential::parse(handout.auth.as_deref().unwrap()).unwrap();
    assert_ne!(credential, b.credential(&c).await);

    let layout = Layout::new(ROOT).unwrap();
    let theirs = layout.namespace(b.name()).unwrap();
    let observer = b.observer(&c).await;
    let before = subtree(&observer, &theirs).await;
    let registration = format!("{}/member", layout.barrier(b.name(), "gang").unwrap());
    assert!(
        before.contains_key(&registration),
        "B's member registered: {:?}",
        before.keys()
    );

    let intruder = support::session_as(&c.zookeeper(), Some(&credential)).await;
    let z = intruder.client();
    let mine = zk::CreateMode::Ephemeral.with_acls(intruder.node_acls());
    let open = zk::Acls::anyone_all();
    for node in before.keys() {
        no_auth(&format!("reading {node}"), z.get_data(node).await);
        no_auth(&format!("listing {node}"), z.get_children(node).await);
        no_auth(
            &format!("writing {node}"),
            z.set_data(node, b"{\"participants\":1}", None).await,
        );
        no_auth(
            &format!("opening {node} to anyone"),
            z.set_acl(node, &open, None).await,
        );
        no_auth(
            &format!("creating under {node}"),
            z.create(&format!("{node}/intruder"), b"{}", &mine).await,
        );
        no_auth(&format!("deleting {node}"), z.delete(node, None).await);
    }
    let gang = layout.barrier(b.name(), "gang").unwrap();
    no_auth(
        "opening B's barrier (its ready node)",
        z.create(
            &format!("{gang}/ready"),
            b"",
            &zk::CreateMode::Persistent.with_acls(intruder.node_acls()),
        )
        .await,
    );
    let stored = layout.credential(b.name()).unwrap();
    no_auth("reading B's stored credential", z.get_data(&stored).await);
    no_auth(
        "listing the stored credentials",
        z.get_children(&layout.child("credentials")).await,
    );
    no_auth(
        "listing the namespaces",
        z.get_children(&layout.namespaces_root()).await,
    );
    no_auth(
        "squatting a namespace not made yet",
        z.create(
            &layout.namespace("t-not-yet-made").unwrap(),
            b"",
            &zk::CreateMode::Persistent.with_acls(intruder.node_acls()),
        )
        .await,
    );
    no_auth(
        "opening the root to anyone",
        z.set_acl(layout.root(), &open, None).await,
    );

    // The command, given A's credential and B's namespace by flag (so
    // that the handout's namespace check does not apply): the server
    // refuses, and the command says it was the credential.
    for args in [
        &["barrier", "enter", "gang", "--timeout", "10s"][..],
        &["lock", "acquire", "db", "--timeout", "10s"][..],
        &["lock", "acquire", "slots", "--timeout", "10s"][..],
    ] {
        let mut cmd = support::zkgate(&c.zookeeper(), args);
        cmd.args(["--namespace", b.name(), "--id", "intruder"])
            .args(["--auth", &credential.expose()]);
        let (code, err) = support::output(cmd).await;
        assert_eq!(code, 5, "{args:?}: {err}");
        assert!(
            err.contains("NoAuth") && err.contains("--auth"),
            "{args:?} must say the credential was refused: {err}"
        );
    }

    assert_unchanged(&observer, &theirs, &before).await;
    still_works(&c, &b).await;
}

/// Through its pods: a pod of A labelled with the name of a Barrier or a
/// LockLease that only B has is refused at admission with a message
/// naming A's namespace; a pod of A whose zkgate commands name B's
/// namespace is handed A's credential only, and each command exits 2
/// saying so. B's barrier counts no one more, B's locks have no holder or
/// waiter, and B's nodes are what they were.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_tenants_pods_cannot_join_or_take_another_namespaces_barriers_and_locks() {
    let c = cluster().await;
    let (a, b) = Tenant::pair(&c).await;
    let b_only = "apiVersion: zkgate.io/v1alpha1\nkind: Barrier\nmetadata: {name: b-only}\nspec: {participants: 2}\n---\n\
                  apiVersion: zkgate.io/v1alpha1\nkind: LockLease\nmetadata: {name: b-only-lock}\nspec: {}\n";
    c.apply_as(Some(&b.user), b.name(), b_only)
        .await
        .expect("B makes its resources");
    let layout = Layout::new(ROOT).unwrap();
    let theirs = layout.namespace(b.name()).unwrap();
    let observer = b.observer(&c).await;
    let b_locks: Api<LockLease> = Api::namespaced(c.client.clone(), b.name());
    eventually(WITHIN, "B's Barrier and LockLease made", || async {
        let barrier = Api::<Barrier>::namespaced(c.client.clone(), b.name());
        barrier.get("b-only").await.ok()?.status?.znode?;
        b_locks.get("b-only-lock").await.ok()?.status?.znode
    })
    .await;
    let before = subtree(&observer, &theirs).await;

    // By label.
    for (label, name) in [
        ("zkgate.io/barrier", "b-only"),
        ("zkgate.io/lock", "b-only-lock"),
    ] {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: by-label, labels: {{{label}: {name}}}}}\n\
             spec: {{restartPolicy: Never, containers: [{{name: work, image: workload:local, command: [\"true\"]}}]}}\n"
        );
        let refusal = c
            .apply_as(Some(&a.user), a.name(), &pod)
            .await
            .expect_err("a pod naming another namespace's resource is refused");
        assert!(
            refusal.contains("denied the request")
                && refusal.contains(&format!("does not exist in namespace {}", a.name())),
            "{label}={name}: {refusal}"
        );
    }

    // By flag: each container names B's namespace.
    let container = |name: &str, args: &str| {
        format!(
            r#"    - name: {name}
      image: zkgate:local
      args: {args}
      env:
        - {{name: ZKGATE_ZOOKEEPER, value: "{zookeeper}"}}
        - {{name: ZKGATE_NAMESPACE, value: "{theirs}"}}
        - {{name: ZKGATE_ID, value: "intruder-{name}"}}
      securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
"#,
            zookeeper = c.zookeeper(),
            theirs = b.name(),
        )
    };
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: by-flag, labels: {{zkgate.io/credentials: "true"}}}}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {{runAsNonRoot: true, runAsUser: 65532, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
{}{}{}"#,
        container(
            "barrier",
            r#"["barrier", "enter", "gang", "--timeout", "60s"]"#
        ),
        container(
            "lock",
            r#"["lock", "run", "db", "--timeout", "60s", "--", "true"]"#
        ),
        container(
            "permit",
            r#"["lock", "acquire", "slots", "--timeout", "60s"]"#
        ),
    );
    c.apply_as(Some(&a.user), a.name(), &pod)
        .await
        .expect("A may run zkgate in its own namespace");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), a.name());
    let statuses = eventually(WITHIN, "A's containers to end", || async {
        let pod = pods.get("by-flag").await.ok()?;
        let statuses = pod.status?.container_statuses?;
        statuses
            .iter()
            .all(|s| {
                s.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some()
            })
            .then_some(statuses)
    })
    .await;
    for status in statuses {
        let code = status.state.unwrap().terminated.unwrap().exit_code;
        let log = c.logs(a.name(), "by-flag", &status.name).await;
        assert_eq!(code, 2, "{}: {log}", status.name);
        assert!(
            log.contains(&format!(
                "handed out namespace {}'s credentials (the pod's), but the resource is in namespace {}",
                a.name(),
                b.name()
            )),
            "{}: {log}",
            status.name
        );
    }

    assert_unchanged(&observer, &theirs, &before).await;
    let gang = c
        .barrier(b.name(), "gang", "B's Barrier", |_| true)
        .await
        .status
        .unwrap();
    assert_eq!(gang.entered, 0, "{gang:?}");
    still_works(&c, &b).await;
}

/// Through the webhook's port, which any pod can reach: an AdmissionReview
/// forged to name B's namespace and a Job that does not exist is refused
/// and makes nothing; one naming B's existing LockLease gets the patch the
/// API server would get, which carries no credential (the pod must still
/// prove its namespace to the handout), and makes nothing. The handout,
/// asked with A's token, hands out A's, whatever the request says.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn forged_requests_to_the_webhooks_port_make_nothing_and_hand_out_nothing() {
    let c = cluster().await;
    let (a, b) = Tenant::pair(&c).await;
    let layout = Layout::new(ROOT).unwrap();
    let theirs = layout.namespace(b.name()).unwrap();
    let observer = b.observer(&c).await;
    let before = subtree(&observer, &theirs).await;
    let b_barriers: Api<Barrier> = Api::namespaced(c.client.clone(), b.name());
    let b_secrets: Api<Secret> = Api::namespaced(c.client.clone(), b.name());
    let barriers_before = names_in(&b_barriers).await;
    let secrets_before = names_in(&b_secrets).await;
    let b_credential = b.credential(&c).await;

    let ca = c.webhook_ca().await;
    let (_, ip, _) = c.controllers().await.remove(0);
    let port = support::https::Endpoint {
        host: ip,
        port: 9443,
        server_name: format!("{RELEASE}-webhook.{SYSTEM_NAMESPACE}.svc"),
    };
    let review = |labels: Value, owners: Value| {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "forged", "namespace": b.name(), "labels": labels, "ownerReferences": owners },
            "spec": { "containers": [{ "name": "work", "image": "workload:local", "command": ["true"] }] }
        });
        support::https::pod_creation_review(b.name(), "forged", &a.user, pod).to_string()
    };
    let ghost = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "ghost",
        "uid": "00000000-0000-0000-0000-000000000001", "controller": true
    }]);
    let (status, body) = port
        .post(
            &ca,
            "/mutate",
            "",
            &review(json!({ "zkgate.io/barrier": "forged" }), ghost),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{body}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Job ghost") && m.contains("does not exist")),
        "{body}"
    );
    let (status, body) = port
        .post(
            &ca,
            "/mutate",
            "",
            &review(json!({ "zkgate.io/lock": "db" }), json!([])),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    // kube's AdmissionResponse writes the patch as an array of bytes (which
    // the API server reads like Go's base64 form).
    let patch: Vec<u8> = serde_json::from_value(answer["response"]["patch"].clone())
        .unwrap_or_else(|e| panic!("a patch ({e}): {body}"));
    let patch = String::from_utf8(patch).unwrap();
    assert!(
        !patch.contains(&b_credential.password) && !body.contains(&b_credential.password),
        "the patch carries B's credential: {patch}"
    );

    // The handout: A's token, a body and headers naming B.
    let dir = tempfile::tempdir().unwrap();
    let source = c.handout_source(a.name(), dir.path()).await;
    let token = std::fs::read_to_string(&source.token_file).unwrap();
    let (status, body) = port
        .post(
            &ca,
            zkgate::handout::PATH,
            &format!(
                "Authorization: Bearer {token}\r\nX-Namespace: {b}\r\n",
                b = b.name()
            ),
            &json!({ "namespace": b.name() }).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let handed: Handout = serde_json::from_str(&body).unwrap();
    assert_eq!(handed.namespace, a.name());
    assert_eq!(
        handed.auth.as_deref(),
        Some(a.credential(&c).await.expose().as_str()),
        "A's token is handed A's credential, whatever the request names"
    );
    // B's token for another audience (say, one B's pod was given for
    // another service, and leaked) is refused.
    let other = support::handout::token_of(&c.client, b.name(), "default", "vault").await;
    let (status, body) = port
        .post(
            &ca,
            zkgate::handout::PATH,
            &format!("Authorization: Bearer {other}\r\n"),
            "{}",
        )
        .await;
    assert!(status == 401 || status == 403, "{status}: {body}");
    assert!(!body.contains(&b_credential.password), "{body}");

    assert_unchanged(&observer, &theirs, &before).await;
    let barriers_after = names_in(&b_barriers).await;
    let secrets_after = names_in(&b_secrets).await;
    assert_eq!(barriers_before, barriers_after);
    assert_eq!(secrets_before, secrets_after);
    still_works(&c, &b).await;
}

/// Taking over a namespace's name: a tenant whose namespace is deleted
/// (by the real namespace controller, which deletes its Barriers and
/// LockLeases in whatever order it does) keeps the credential its pods
/// were handed. Whoever makes a namespace of that name later gets a new
/// credential at once; the old one opens nothing there.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_namespace_made_again_under_the_same_name_gets_a_new_credential() {
    let c = cluster().await;
    let old = Tenant::new(&c).await;
    old.make_resources().await;
    let kept = old.credential(&c).await;
    let name = old.name().to_owned();
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    namespaces
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(WITHIN, "the namespace gone", || async {
        namespaces
            .get_opt(&name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let layout = Layout::new(ROOT).unwrap();
    let observer = c.controller_session().await;
    for gone in [
        layout.namespace(&name).unwrap(),
        layout.credential(&name).unwrap(),
    ] {
        eventually(WITHIN, &format!("{gone} removed"), || async {
            observer
                .client()
                .check_stat(&gone)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }

    let again: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    namespaces
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    let new = Tenant::adopt(
        &c,
        NamespaceGuard {
            kubeconfig: c.dir.join("kubeconfig"),
            name: name.clone(),
            cluster_objects: Vec::new(),
        },
    )
    .await;
    new.make_resources().await;
    let fresh = new.credential(&c).await;
    assert_ne!(
        kept, fresh,
        "the namespace made again got the old credential"
    );
    let gang = layout.barrier(&name, "gang").unwrap();
    let with_old = support::session_as(&c.zookeeper(), Some(&kept)).await;
    no_auth(
        "the old credential reading the new barrier",
        with_old.client().get_data(&gang).await,
    );
    no_auth(
        "the old credential registering at the new barrier",
        with_old
            .client()
            .create(
                &format!("{gang}/former-tenant"),
                b"{}",
                &zk::CreateMode::Ephemeral.with_acls(with_old.node_acls()),
            )
            .await,
    );
    let with_new = support::session_as(&c.zookeeper(), Some(&fresh)).await;
    with_new
        .client()
        .get_data(&gang)
        .await
        .expect("the new credential reads the new barrier");
}
