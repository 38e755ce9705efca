//! Per-namespace ACLs, end to end: a controller with a credential of its own
//! (on an API server of the test's own, so it may watch every namespace)
//! gives two namespaces a credential each, handed out to whoever proves the
//! namespace with a ServiceAccount token; a pod of one cannot touch the
//! other's barriers and locks, a participant without credentials is refused
//! with exit 5, participants with the handed-out credential work, and a
//! rotation asked for by annotation takes the old credential's power away.

mod support;

use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::handout::Served;
use support::kube::{barrier_waiting, namespace, ControllerProcess, PrivateApiServer};
use support::{children, eventually, session_as};
use tokio::process::Command;
use zkgate::api::{Barrier, BarrierPhase, LockLease};
use zkgate::zk::{Credential, Session};
use zookeeper_client as zk;

const CONTROLLER_AUTH: &str = "zkgate-controller:controller-secret";

/// How long a replaced credential keeps working in these tests.
const GRACE: &str = "4s";

/// A controller (over every namespace of `api`) with a credential of its
/// own, handing out the namespaces' credentials at `served`.
fn controller_with_credential(
    api: &PrivateApiServer,
    zk: &str,
    id: &str,
    served: &Served,
) -> ControllerProcess {
    controller_with(api, zk, id, served, GRACE)
}

/// [`controller_with_credential`] with the rotation grace `grace`.
fn controller_with(
    api: &PrivateApiServer,
    zk: &str,
    id: &str,
    served: &Served,
    grace: &str,
) -> ControllerProcess {
    let mut args = vec!["--auth", CONTROLLER_AUTH, "--rotation-grace", grace];
    let handout = served.controller_args();
    args.extend(handout.iter().map(String::as_str));
    ControllerProcess::start_with(&api.kubeconfig(), zk, id, &args)
}

/// What most tests here start from: an API server with the CRDs, a
/// namespace in it, a ZooKeeper root of the test's own, and a controller
/// `id` with a credential of its own (rotation grace `grace`) handing out
/// the namespaces' credentials.
struct Setup {
    api: PrivateApiServer,
    client: kube::Client,
    ns: String,
    zk: String,
    served: Served,
    controller: ControllerProcess,
}

impl Setup {
    async fn start(id: &str, grace: &str) -> Setup {
        let (api, client) = PrivateApiServer::with_crds().await;
        let ns = namespace(&client).await;
        let zk = support::isolated_connect();
        let served = Served::new("default");
        let controller = controller_with(&api, &zk, id, &served, grace);
        Setup {
            api,
            client,
            ns,
            zk,
            served,
            controller,
        }
    }
}

/// Asks for a rotation of `ns`'s credential by annotating `poke`'s `name`
/// (a LockLease or Barrier there) and returns the new credential, once the
/// controller has made it (and dropped the annotation).
async fn rotate<K>(
    client: &kube::Client,
    served: &Served,
    ns: &str,
    poke: &Api<K>,
    name: &str,
    old: &Credential,
) -> Credential
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    poke.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { zkgate::controller::ROTATE_ANNOTATION: "now" } } })),
    )
    .await
    .unwrap();
    eventually(Duration::from_secs(90), "the rotation done", || async {
        let object = poke.get(name).await.ok()?;
        let annotations = object.meta().annotations.clone().unwrap_or_default();
        (!annotations.contains_key(zkgate::controller::ROTATE_ANNOTATION)).then_some(())
    })
    .await;
    let now = served.credential(client, ns).await;
    assert_ne!(now, *old, "the handout gives the rotated credential");
    now
}

/// A pod holding `credential` takes the lock at `lock`; the hold shows in
/// the LockLease's status only if the controller can read the pod's node.
async fn a_hold_shows_in_the_status(
    zk: &str,
    credential: &Credential,
    lock: &str,
    locks: &Api<LockLease>,
) {
    let within = Duration::from_secs(30);
    let holder = session_as(zk, Some(credential)).await;
    let hold = zkgate::zk::Mutex::new(lock, Default::default())
        .acquire(&holder, Some(tokio::time::Instant::now() + within))
        .await
        .expect("the pod holds its namespace's lock");
    eventually(within, "the hold in the status", || async {
        (locks.get("db").await.ok()?.status?.holder_count == 1).then_some(())
    })
    .await;
    hold.release().await.unwrap();
}

/// A command's failure (exit 5) names the refused credential.
fn refused_as_no_auth(stderr: &str, who: &str) {
    assert!(
        stderr.contains("NoAuth"),
        "{who} must be refused as NoAuth: {stderr}"
    );
}

fn is_no_auth<T>(result: Result<T, zk::Error>) -> bool {
    matches!(result, Err(zk::Error::NoAuth))
}

fn zkgate(connect: &str, ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zkgate"));
    cmd.args(args)
        .envs(support::tls_env(connect))
        .env("ZKGATE_NAMESPACE", ns)
        .env("ZKGATE_ZOOKEEPER", connect)
        .env("ZKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(cmd: &mut Command) -> (i32, String) {
    let out = cmd.output().await.expect("run zkgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn namespaces_are_isolated_by_their_credentials_and_rotation_revokes_the_old_one() {
    let (api, client) = PrivateApiServer::with_crds().await;
    let (a, b) = (namespace(&client).await, namespace(&client).await);
    let zk = support::isolated_connect();
    let served = Served::new("default");
    let mut controller = controller_with_credential(&api, &zk, "controller-acl", &served);
    let within = Duration::from_secs(30);
    for ns in [&a, &b] {
        let barriers: Api<Barrier> = Api::namespaced(client.clone(), ns);
        let locks: Api<LockLease> = Api::namespaced(client.clone(), ns);
        let barrier: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 2 } })).unwrap();
        let lock: LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" }, "spec": {} })).unwrap();
        barriers
            .create(&PostParams::default(), &barrier)
            .await
            .unwrap();
        locks.create(&PostParams::default(), &lock).await.unwrap();
        eventually(within, "both reconciled", || async {
            barriers.get("gang").await.ok()?.status?;
            locks.get("db").await.ok()?.status.map(|_| ())
        })
        .await;
    }
    let cred_a = served.credential(&client, &a).await;
    let cred_b = served.credential(&client, &b).await;
    assert_ne!(cred_a, cred_b);

    let root = "/zkgate/namespaces";
    let (barrier_b, lock_b) = (
        format!("{root}/{b}/barriers/gang"),
        format!("{root}/{b}/locks/db"),
    );
    let (barrier_a, lock_a) = (
        format!("{root}/{a}/barriers/gang"),
        format!("{root}/{a}/locks/db"),
    );
    let pod_a = session_as(&zk, Some(&cred_a)).await;
    let pod_b = session_as(&zk, Some(&cred_b)).await;
    let eph = zk::CreateMode::Ephemeral.with_acls(pod_b.node_acls());
    // b's own participant and contender.
    pod_b
        .client()
        .create(&format!("{barrier_b}/b0"), b"{}", &eph)
        .await
        .expect("b registers in its own barrier");
    let (_, seq) = pod_b
        .client()
        .create(
            &format!("{lock_b}/_c_00000000-0000-0000-0000-000000000000-lock-"),
            b"{}",
            &zk::CreateMode::EphemeralSequential.with_acls(pod_b.node_acls()),
        )
        .await
        .expect("b queues on its own lock");
    let contender_b = format!("{lock_b}/_c_00000000-0000-0000-0000-000000000000-lock-{seq}");

    // a's credential can do nothing in b.
    let c = pod_a.client();
    let a_eph = zk::CreateMode::Ephemeral.with_acls(pod_a.node_acls());
    for parent in [
        &barrier_b,
        &lock_b,
        &format!("{root}/{b}/barriers"),
        &format!("{root}/{b}"),
    ] {
        assert!(
            is_no_auth(c.create(&format!("{parent}/intruder"), b"", &a_eph).await),
            "create under {parent}"
        );
    }
    for node in [&barrier_b, &lock_b] {
        assert!(
            is_no_auth(c.set_data(node, b"{\"participants\":1}", None).await),
            "set data of {node}"
        );
        assert!(is_no_auth(c.get_data(node).await), "read {node}");
    }
    assert!(
        is_no_auth(c.delete(&format!("{barrier_b}/b0"), None).await),
        "delete b's participant"
    );
    assert!(
        is_no_auth(c.delete(&contender_b, None).await),
        "release b's lock"
    );
    assert!(
        is_no_auth(c.delete(&barrier_b, None).await),
        "delete b's barrier"
    );
    // Within its own namespace a may register, and write its barrier's
    // data (a withdrawal rewrites it as it is, so that an opening that
    // counted the withdrawn participant fails its version check), but not
    // rewrite the lock node.
    c.create(&format!("{barrier_a}/a-probe"), b"{}", &a_eph)
        .await
        .expect("a registers in its own barrier");
    c.delete(&format!("{barrier_a}/a-probe"), None)
        .await
        .unwrap();
    let (data, stat) = c.get_data(&barrier_a).await.expect("read a's barrier");
    c.set_data(&barrier_a, &data, Some(stat.version))
        .await
        .expect("a rewrites its own barrier's data as it is");
    assert!(
        is_no_auth(c.set_data(&lock_a, b"{\"participants\":1}", None).await),
        "set data of {lock_a}"
    );

    // A participant without credentials: exit 5 naming auth, nothing made.
    let (code, err) = run(&mut zkgate(
        &zk,
        &a,
        &[
            "barrier",
            "enter",
            "gang",
            "--id",
            "nobody",
            "--timeout",
            "5s",
        ],
    ))
    .await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("NoAuth") && err.contains("--auth"), "{err}");
    let (code, err) = run(&mut zkgate(
        &zk,
        &a,
        &["lock", "acquire", "db", "--id", "nobody", "--timeout", "5s"],
    ))
    .await;
    assert_eq!(code, 5, "{err}");
    let observer = session_as(&zk, Some(&cred_a)).await;
    assert!(
        children(&observer, &barrier_a).await.is_empty(),
        "nothing registered"
    );
    assert!(
        children(&observer, &lock_a).await.is_empty(),
        "nothing queued"
    );

    // With the credential handed out (asked for with the namespace's
    // token, as an injected container does): the gang runs.
    let dir = tempfile::tempdir().unwrap();
    let handed = served.env(&client, &a, dir.path()).await;
    let gang = |id: &'static str| {
        let mut cmd = zkgate(
            &zk,
            &a,
            &[
                "barrier",
                "run",
                "gang",
                "--id",
                id,
                "--timeout",
                "30s",
                "--",
                "true",
            ],
        );
        cmd.envs(handed.clone());
        async move { run(&mut cmd).await }
    };
    let ((c0, e0), (c1, e1)) = tokio::join!(gang("p0"), gang("p1"));
    assert_eq!((c0, c1), (0, 0), "{e0}\n{e1}");
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &a);
    eventually(within, "Completed", || async {
        (barriers.get("gang").await.ok()?.status?.phase == Some(BarrierPhase::Completed))
            .then_some(())
    })
    .await;

    // The controller can act in b: deleting b's Barrier removes its subtree,
    // b's own participant node included, and the finalizer.
    let barriers_b: Api<Barrier> = Api::namespaced(client.clone(), &b);
    barriers_b
        .delete("gang", &Default::default())
        .await
        .unwrap();
    eventually(within, "b's Barrier gone", || async {
        barriers_b
            .get_opt("gang")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(observer
        .client()
        .check_stat(&barrier_b)
        .await
        .unwrap()
        .is_none());

    // A restarted controller (a new session that holds no namespace
    // credential yet) still reads what a's pods make: a hold taken after the
    // restart shows in the status.
    controller.kill().await;
    let mut controller = controller_with_credential(&api, &zk, "controller-acl-2", &served);
    let locks_a: Api<LockLease> = Api::namespaced(client.clone(), &a);
    a_hold_shows_in_the_status(&zk, &cred_a, &lock_a, &locks_a).await;

    // Rotation: asked for by annotation, done by the controller.
    let locks: Api<LockLease> = Api::namespaced(client.clone(), &a);
    let rotated = rotate(&client, &served, &a, &locks, "db", &cred_a).await;
    // Once the rotation's grace window has closed, the old credential is
    // refused, and the failure says it was the credential (NoAuth), not an
    // unreachable server (the same exit code).
    let err = eventually(
        Duration::from_secs(30),
        "the old credential refused",
        || async {
            let mut old = zkgate(
                &zk,
                &a,
                &[
                    "lock",
                    "run",
                    "db",
                    "--id",
                    "old",
                    "--timeout",
                    "5s",
                    "--",
                    "true",
                ],
            );
            old.env("ZKGATE_AUTH", cred_a.expose());
            let (code, err) = run(&mut old).await;
            (code == 5).then_some(err)
        },
    )
    .await;
    refused_as_no_auth(&err, "the old credential after the rotation");
    let mut new = zkgate(
        &zk,
        &a,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "new",
            "--timeout",
            "5s",
            "--",
            "true",
        ],
    );
    new.env("ZKGATE_AUTH", rotated.expose());
    let (code, err) = run(&mut new).await;
    assert_eq!(code, 0, "{err}");

    // A controller started after the rotation (it loads the new credential
    // and the one it replaced) reads what a's pods make with the new one.
    controller.kill().await;
    let _controller = controller_with_credential(&api, &zk, "controller-acl-3", &served);
    a_hold_shows_in_the_status(&zk, &rotated, &lock_a, &locks_a).await;

    // Deleting namespace b: the deletion of its last resource removes its
    // subtree and its stored credential. (No kube-controller-manager runs
    // here to empty a terminating namespace: the test deletes what it would.)
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces.delete(&b, &Default::default()).await.unwrap();
    let stored_b = format!("/zkgate/credentials/{b}");
    // Looked at with the controller's credential: the stored credential is
    // the controller's alone, and from ZooKeeper 3.9 on even its stat is
    // refused to a's (READ is checked on `exists`), as it must be.
    let controller_view = session_as(&zk, Some(&Credential::parse(CONTROLLER_AUTH).unwrap())).await;
    assert!(controller_view
        .client()
        .check_stat(&stored_b)
        .await
        .unwrap()
        .is_some());
    assert!(
        is_no_auth(observer.client().get_data(&stored_b).await),
        "a reads b's stored credential"
    );
    let locks_b: Api<LockLease> = Api::namespaced(client.clone(), &b);
    locks_b.delete("db", &Default::default()).await.unwrap();
    eventually(within, "b's LockLease gone", || async {
        locks_b.get_opt("db").await.ok()?.is_none().then_some(())
    })
    .await;
    for gone in [stored_b, format!("{root}/{b}")] {
        assert!(
            controller_view
                .client()
                .check_stat(&gone)
                .await
                .unwrap()
                .is_none(),
            "{gone} left behind"
        );
    }
    // (Not with `observer`: its credential, a's before the rotation, is
    // refused by now, and from ZooKeeper 3.9 on that includes `exists`.)
    assert!(
        controller_view
            .client()
            .check_stat(&format!("{root}/{a}"))
            .await
            .unwrap()
            .is_some(),
        "a is untouched"
    );
    drop(api);
}

/// Issue 12, item 16: a rotation in the middle of a gang's round does not
/// fail the gang. A participant that entered with the old credential leaves
/// with it, while one that starts after the rotation uses the new one; the
/// old credential stops working when the grace window closes.
#[tokio::test]
async fn a_rotation_in_the_middle_of_a_round_does_not_fail_the_gang() {
    let Setup {
        api: _api,
        client,
        ns,
        zk,
        served,
        controller: _controller,
    } = Setup::start("controller-rotation", "20s").await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let barrier: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "round" }, "spec": { "participants": 2 } })).unwrap();
    barriers
        .create(&PostParams::default(), &barrier)
        .await
        .unwrap();
    let old = served.credential(&client, &ns).await;
    let participant = |id: &str, credential: &Credential| {
        let mut cmd = zkgate(
            &zk,
            &ns,
            &[
                "barrier",
                "run",
                "round",
                "--id",
                id,
                "--timeout",
                "60s",
                "--",
                "sleep",
                "1",
            ],
        );
        cmd.env("ZKGATE_AUTH", credential.expose());
        cmd.spawn().unwrap()
    };
    let first = participant("p1", &old);
    eventually(Duration::from_secs(30), "p1 registered", || async {
        (barriers.get("round").await.ok()?.status?.entered == 1).then_some(())
    })
    .await;
    let new = rotate(&client, &served, &ns, &barriers, "round", &old).await;
    let second = participant("p2", &new);
    for (who, p) in [
        ("p1 (old credential)", first),
        ("p2 (new credential)", second),
    ] {
        let out = tokio::time::timeout(Duration::from_secs(60), p.wait_with_output())
            .await
            .expect("the participant finishes")
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let done = barriers.get("round").await.unwrap().status.unwrap();
    assert_ne!(done.phase, Some(BarrierPhase::Failed), "{done:?}");
    // After the grace window, the old credential opens nothing (refused as
    // NoAuth, not merely exit 5, which an unreachable server also gives).
    let err = eventually(
        Duration::from_secs(60),
        "the old credential refused",
        || async {
            let mut late = zkgate(
                &zk,
                &ns,
                &[
                    "barrier",
                    "enter",
                    "round",
                    "--id",
                    "late",
                    "--timeout",
                    "2s",
                ],
            );
            late.env("ZKGATE_AUTH", old.expose());
            let (code, err) = run(&mut late).await;
            (code == 5).then_some(err)
        },
    )
    .await;
    refused_as_no_auth(&err, "the old credential after the grace window");
}

/// Removes namespace `ns` for good on an API server without a
/// kube-controller-manager: deleted, then its `kubernetes` finalizer
/// dropped (what the namespace controller does once it emptied it; the
/// test emptied it first).
async fn remove_namespace(client: &kube::Client, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(ns, &Default::default()).await.unwrap();
    let mut terminating = namespaces.get(ns).await.unwrap();
    terminating.metadata.managed_fields = None;
    if let Some(spec) = terminating.spec.as_mut() {
        spec.finalizers = Some(Vec::new());
    }
    namespaces
        .replace_subresource("finalize", ns, &PostParams::default(), &terminating)
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the namespace gone", || async {
        namespaces.get_opt(ns).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Issue 25, item 3: a namespace's credential and subtree go when the
/// namespace goes, whatever the order of deletions (here its resources
/// first, while the namespace still stood, then the namespace), and a
/// namespace made again under the same name gets a new credential at once;
/// the old credential opens nothing there.
#[tokio::test]
async fn a_namespace_made_again_gets_a_new_credential_at_once() {
    use k8s_openapi::api::core::v1::Namespace;
    let Setup {
        api,
        client,
        ns,
        zk,
        served,
        controller: _controller,
    } = Setup::start("controller-remade", GRACE).await;
    let within = Duration::from_secs(30);
    let barrier: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 2 } })).unwrap();
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    barriers
        .create(&PostParams::default(), &barrier)
        .await
        .unwrap();
    let old = served.credential(&client, &ns).await;
    // The resources go first, while the namespace stands (its credential
    // stays: the namespace may get resources again), then the namespace.
    barriers.delete("gang", &Default::default()).await.unwrap();
    eventually(within, "the Barrier gone", || async {
        barriers.get_opt("gang").await.ok()?.is_none().then_some(())
    })
    .await;
    remove_namespace(&client, &ns).await;
    let observer = session_as(&zk, Some(&Credential::parse(CONTROLLER_AUTH).unwrap())).await;
    let stored = format!("/zkgate/credentials/{ns}");
    let subtree = format!("/zkgate/namespaces/{ns}");
    eventually(
        Duration::from_secs(90),
        "the namespace's stored credential and subtree gone with it",
        || async {
            let c = observer.client();
            (c.check_stat(&stored).await.ok()?.is_none()
                && c.check_stat(&subtree).await.ok()?.is_none())
            .then_some(())
        },
    )
    .await;

    // Made again under the same name: a new credential, at once.
    let again: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    barriers
        .create(&PostParams::default(), &barrier)
        .await
        .unwrap();
    let new = served.credential(&client, &ns).await;
    assert_ne!(new, old, "the namespace made again got the old credential");
    // The credential is made before the barrier's node: wait for the node,
    // so that the attempt below meets it (not a NoNode).
    eventually(within, "the Barrier's node made again", || async {
        barriers.get("gang").await.ok()?.status?.znode
    })
    .await;
    let with_old = session_as(&zk, Some(&old)).await;
    let attempt = with_old
        .client()
        .create(
            &format!("{subtree}/barriers/gang/intruder"),
            b"{}",
            &zk::CreateMode::Ephemeral.with_acls(with_old.node_acls()),
        )
        .await;
    assert!(
        matches!(attempt, Err(zk::Error::NoAuth)),
        "the old credential must open nothing in the namespace made again: {attempt:?}"
    );
    drop(api);
}

/// Issue 25, item 4 (review): two rotations asked for back to back (two
/// resources annotated at once) must not cut the first one's grace window:
/// the second waits until it closes, so a pod still on the credential the
/// first replaced keeps working meanwhile; then it rotates. Failed before
/// the fix: the second rotation replaced the stored "previous" credential
/// at once and the oldest one stopped opening anything.
#[tokio::test]
async fn a_second_rotation_waits_for_the_first_ones_grace_window() {
    let Setup {
        api,
        client,
        ns,
        zk,
        served,
        controller: _controller,
    } = Setup::start("controller-twice", "15s").await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let locks: Api<LockLease> = Api::namespaced(client.clone(), &ns);
    let barrier: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 3 } })).unwrap();
    let lock: LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" }, "spec": {} })).unwrap();
    barriers
        .create(&PostParams::default(), &barrier)
        .await
        .unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let first = served.credential(&client, &ns).await;
    let second = rotate(&client, &served, &ns, &locks, "db", &first).await;
    // The second request, while the first's grace window is open.
    barriers
        .patch(
            "gang",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { zkgate::controller::ROTATE_ANNOTATION: "again" } } })),
        )
        .await
        .unwrap();
    let barrier_node = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let with_first = session_as(&zk, Some(&first)).await;
    // Until the controller answered the request: put it off (an event
    // says so), or (the bug) rotated at once (the annotation gone).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    eventually(Duration::from_secs(30), "the request looked at", || async {
        let put_off = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("CredentialRotationWaiting"));
        let annotations = barriers.get("gang").await.ok()?.metadata.annotations;
        let answered = !annotations
            .unwrap_or_default()
            .contains_key(zkgate::controller::ROTATE_ANNOTATION);
        (put_off || answered).then_some(())
    })
    .await;
    // Reconciles of the barrier are poked while the window is open: the
    // request waits, and the first credential still opens the barrier.
    for i in 0..3 {
        let _ = barriers
            .patch(
                "gang",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "poke": format!("p{i}") } } })),
            )
            .await;
        register(&with_first, &format!("{barrier_node}/first-{i}"))
            .await
            .expect("the credential the first rotation replaced works until its window closes");
        assert_eq!(served.credential(&client, &ns).await, second);
    }
    let annotated = barriers.get("gang").await.unwrap();
    assert!(
        annotated
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(zkgate::controller::ROTATE_ANNOTATION),
        "the second request is still waiting"
    );
    // Once the window closed, the second rotation is done.
    let third = eventually(Duration::from_secs(60), "the second rotation", || async {
        let annotations = barriers
            .get("gang")
            .await
            .ok()?
            .metadata
            .annotations
            .unwrap_or_default();
        if annotations.contains_key(zkgate::controller::ROTATE_ANNOTATION) {
            return None;
        }
        Some(served.credential(&client, &ns).await)
    })
    .await;
    assert_ne!(third, second);
    assert_ne!(third, first);
    drop(api);
}

/// Registers an ephemeral node at `path` with `session`'s credentials.
async fn register(session: &Session, path: &str) -> Result<(), zk::Error> {
    let options = zk::CreateMode::Ephemeral.with_acls(session.node_acls());
    session
        .client()
        .create(path, b"{}", &options)
        .await
        .map(|_| ())
}

/// Review of issue 25: installs of one cluster that watch different
/// namespaces may share a root (with ACLs on, and so one controller
/// credential). When one of them lists its namespace (at every leadership
/// term) it must judge only its own namespace's stored credential. Failed
/// before the fix: it took the other install's namespace, which its
/// listing does not show, for a deleted one, and removed its credential
/// and subtree.
#[tokio::test]
async fn an_install_watching_one_namespace_leaves_the_other_installs_credentials_alone() {
    use k8s_openapi::api::core::v1::Namespace;
    let (api, client) = PrivateApiServer::with_crds().await;
    // Swept in name order: `theirs` comes before `mine`, so once `mine`
    // is swept, `theirs` was judged too.
    let base = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (theirs, mine) = (format!("{base}-0"), format!("{base}-1"));
    for name in [&theirs, &mine] {
        let ns: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let zk = support::isolated_connect();
    let scoped = |id: &str, ns: &str, served: &Served| {
        let mut args = vec!["--auth", CONTROLLER_AUTH, "--watch-namespace", ns];
        let handout = served.controller_args();
        args.extend(handout.iter().map(String::as_str));
        ControllerProcess::start_with(&api.kubeconfig(), &zk, id, &args)
    };
    let (served_theirs, served_mine) = (Served::new(&theirs), Served::new(&mine));
    let _other_install = scoped("install-theirs", &theirs, &served_theirs);
    let mut this_install = scoped("install-mine", &mine, &served_mine);
    let within = Duration::from_secs(30);
    for ns in [&theirs, &mine] {
        let barriers: Api<Barrier> = Api::namespaced(client.clone(), ns);
        barrier_waiting(&barriers, "gang", 2, within).await;
    }
    let their_credential = served_theirs.credential(&client, &theirs).await;
    let observer = session_as(&zk, Some(&Credential::parse(CONTROLLER_AUTH).unwrap())).await;
    let stat = |path: String| {
        let observer = &observer;
        async move { observer.client().check_stat(&path).await.unwrap() }
    };
    let stored_theirs = stat(format!("/zkgate/credentials/{theirs}"))
        .await
        .expect("their credential stored");

    // This install's namespace goes while it is down (its Barrier first,
    // while it ran); when it comes back, its listing finds it gone.
    let mine_barriers: Api<Barrier> = Api::namespaced(client.clone(), &mine);
    mine_barriers
        .delete("gang", &Default::default())
        .await
        .unwrap();
    eventually(within, "my Barrier gone", || async {
        mine_barriers
            .get_opt("gang")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    this_install.kill().await;
    remove_namespace(&client, &mine).await;
    let _this_install = scoped("install-mine-2", &mine, &served_mine);
    eventually(within, "my namespace's stored credential swept", || async {
        stat(format!("/zkgate/credentials/{mine}"))
            .await
            .is_none()
            .then_some(())
    })
    .await;

    let after = stat(format!("/zkgate/credentials/{theirs}")).await;
    assert_eq!(
        after.map(|s| s.czxid),
        Some(stored_theirs.czxid),
        "the other install's namespace's stored credential was removed"
    );
    assert!(
        stat(format!("/zkgate/namespaces/{theirs}/barriers/gang"))
            .await
            .is_some(),
        "the other install's barrier node was removed"
    );
    assert_eq!(
        served_theirs.credential(&client, &theirs).await,
        their_credential
    );
    drop(api);
}

/// Review of issue 25: ACLs turned on after zkgate ran without them (every
/// node open to anyone who reaches ZooKeeper). What a tenant planted
/// meanwhile must not survive the switch: a stored credential for another
/// namespace (a password the tenant knows) is not adopted, and the
/// controller's own nodes (the stored credentials' parent, the leader
/// lock's) become the controller's alone. Failed before the fix: the
/// planted credential was handed to the namespace's pods, so the tenant
/// held the namespace's nodes, and the parents stayed open.
#[tokio::test]
async fn turning_acls_on_later_drops_what_a_tenant_planted_while_they_were_off() {
    let (api, client) = PrivateApiServer::with_crds().await;
    let victim = namespace(&client).await;
    let zk = support::isolated_connect();
    let served = Served::new(&victim);
    let open = {
        let handout = served.controller_args();
        let args: Vec<&str> = handout.iter().map(String::as_str).collect();
        ControllerProcess::start_with(&api.kubeconfig(), &zk, "controller-open", &args)
    };
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &victim);
    let within = Duration::from_secs(30);
    barrier_waiting(&barriers, "gang", 2, within).await;
    // The tenant, with no credential at all, plants a credential it knows.
    let planted = Credential::parse(&format!("namespace-{victim}:known-to-the-tenant")).unwrap();
    let tenant = session_as(&zk, None).await;
    let stored = format!("/zkgate/credentials/{victim}");
    let data = json!({ "current": planted.expose(), "moved": true }).to_string();
    let anyone = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    tenant
        .client()
        .mkdir("/zkgate/credentials", &anyone)
        .await
        .unwrap();
    tenant
        .client()
        .create(&stored, data.as_bytes(), &anyone)
        .await
        .unwrap();

    // ACLs on.
    drop(open);
    let _controller = controller_with_credential(&api, &zk, "controller-acl-on", &served);
    let handed = eventually(within, "a credential handed out", || async {
        served.handout(&client, &victim).await.auth
    })
    .await;
    let handed = Credential::parse(&handed).unwrap();
    assert_ne!(handed, planted, "the planted credential was adopted");
    let with_planted = session_as(&zk, Some(&planted)).await;
    let attempt = with_planted
        .client()
        .get_data(&format!("/zkgate/namespaces/{victim}/barriers/gang"))
        .await;
    assert!(
        matches!(attempt, Err(zk::Error::NoAuth)),
        "the planted credential must open nothing: {attempt:?}"
    );
    for (what, attempt) in [
        (
            "listing the stored credentials",
            tenant
                .client()
                .list_children("/zkgate/credentials")
                .await
                .map(drop),
        ),
        (
            "planting another credential",
            tenant
                .client()
                .create("/zkgate/credentials/t-next", b"{}", &anyone)
                .await
                .map(drop),
        ),
        (
            "listing the leader lock's contenders",
            tenant
                .client()
                .list_children("/zkgate/leader")
                .await
                .map(drop),
        ),
    ] {
        assert!(
            matches!(attempt, Err(zk::Error::NoAuth)),
            "{what} must be refused once ACLs are on: {attempt:?}"
        );
    }
    drop(api);
}

/// Review of issue 25: whoever makes a node chooses its ACL, so a
/// namespace's pod can make one under its own barrier that shuts the
/// controller out (it can neither list it nor, once it has a child, delete
/// it). Deleting the Barrier then kept its finalizer for ever, the
/// namespace could never go, and its stored credential stayed. Now the
/// controller removes everything else, says what it had to leave (a
/// Warning event naming the node, for a ZooKeeper superuser), and lets the
/// Barrier and then the namespace's credential go. Failed before the fix:
/// the Barrier was still there after 30 s.
#[tokio::test]
async fn a_node_that_shuts_the_controller_out_does_not_keep_the_barrier_or_the_credential() {
    use k8s_openapi::api::events::v1::Event;
    let Setup {
        api,
        client,
        ns,
        zk,
        served,
        controller: _controller,
    } = Setup::start("controller-shut-out", GRACE).await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let within = Duration::from_secs(30);
    barrier_waiting(&barriers, "gang", 2, within).await;
    let credential = served.credential(&client, &ns).await;
    let pod = session_as(&zk, Some(&credential)).await;
    let trap = format!("/zkgate/namespaces/{ns}/barriers/gang/trap");
    let mine = zk::CreateMode::Persistent.with_acls(pod.node_acls());
    pod.client().create(&trap, b"", &mine).await.unwrap();
    pod.client()
        .create(&format!("{trap}/inner"), b"", &mine)
        .await
        .unwrap();
    let nobody = Credential::parse("nobody:unknown").unwrap();
    let shut = [nobody.acl(zk::Permission::ALL)];
    pod.client()
        .set_acl(&trap, &shut, None)
        .await
        .expect("the maker may shut everyone else out");

    barriers.delete("gang", &Default::default()).await.unwrap();
    eventually(within, "the Barrier gone", || async {
        barriers.get_opt("gang").await.ok()?.is_none().then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let said = eventually(within, "a Warning naming the node left", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodesLeftBehind"))
    })
    .await;
    assert_eq!(said.type_.as_deref(), Some("Warning"));
    assert!(
        said.note.as_deref().is_some_and(|n| n.contains(&trap)),
        "{said:?}"
    );

    // The namespace goes: its stored credential goes with it, the node
    // left behind notwithstanding.
    remove_namespace(&client, &ns).await;
    let observer = session_as(&zk, Some(&Credential::parse(CONTROLLER_AUTH).unwrap())).await;
    let stored = format!("/zkgate/credentials/{ns}");
    eventually(
        Duration::from_secs(60),
        "the stored credential gone",
        || async {
            observer
                .client()
                .check_stat(&stored)
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    // Made again under that name: a new credential at once; a Barrier of
    // the name that held the node says what is in its way; one of another
    // name works.
    use k8s_openapi::api::core::v1::Namespace;
    let again: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    let gang: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 2 } })).unwrap();
    barriers
        .create(&PostParams::default(), &gang)
        .await
        .unwrap();
    let in_the_way = eventually(within, "a Warning naming the node in the way", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodesInTheWay"))
    })
    .await;
    assert!(
        in_the_way
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&trap)),
        "{in_the_way:?}"
    );
    let fresh = served.credential(&client, &ns).await;
    assert_ne!(
        fresh, credential,
        "the namespace made again got the old credential"
    );
    barrier_waiting(&barriers, "other", 2, within).await;
    drop(api);
}

/// Review of issue 25 (second round): a namespace's pods may write their
/// barrier's node and make nodes under their lock's. Neither may keep the
/// resource (and so its namespace) from ever going: a barrier node
/// rewritten with junk, without pause, while the Barrier is deleted, and
/// a node named like a contender with a child of its own under the lock.
/// Failed before the fix: both were still there after 30 s (the cleanup
/// stopped at the junk, and at the contender it could not delete alone).
#[tokio::test]
async fn what_a_namespaces_pods_write_does_not_keep_its_resources_from_going() {
    let Setup {
        api,
        client,
        ns,
        zk,
        served,
        controller: _controller,
    } = Setup::start("controller-pods-write", GRACE).await;
    let within = Duration::from_secs(30);
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    barrier_waiting(&barriers, "gang", 2, within).await;
    let locks: Api<LockLease> = Api::namespaced(client.clone(), &ns);
    let lock: LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" }, "spec": {} })).unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    eventually(within, "the lock's node made", || async {
        locks.get("db").await.ok()?.status?.znode
    })
    .await;
    let credential = served.credential(&client, &ns).await;
    let pod = session_as(&zk, Some(&credential)).await;
    let mine = zk::CreateMode::Persistent.with_acls(pod.node_acls());
    let lock_node = format!("/zkgate/namespaces/{ns}/locks/db");
    let fake = format!("{lock_node}/x-lock-0000000001");
    pod.client().create(&fake, b"", &mine).await.unwrap();
    pod.client()
        .create(&format!("{fake}/inner"), b"", &mine)
        .await
        .unwrap();
    locks.delete("db", &Default::default()).await.unwrap();

    let gang = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (pod, gang, stop) = (
            session_as(&zk, Some(&credential)).await,
            gang.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Err(zk::Error::NoNode) = pod.client().set_data(&gang, b"junk", None).await {
                    return;
                }
            }
        })
    };
    barriers.delete("gang", &Default::default()).await.unwrap();
    let gone = |what: &'static str| {
        let (barriers, locks) = (barriers.clone(), locks.clone());
        async move {
            match what {
                "Barrier" => barriers.get_opt("gang").await.ok()?.is_none().then_some(()),
                _ => locks.get_opt("db").await.ok()?.is_none().then_some(()),
            }
        }
    };
    eventually(within, "the Barrier gone", || gone("Barrier")).await;
    eventually(within, "the LockLease gone", || gone("LockLease")).await;
    stop.cancel();
    writer.await.unwrap();
    let observer = session_as(&zk, Some(&Credential::parse(CONTROLLER_AUTH).unwrap())).await;
    for node in [gang, lock_node] {
        assert!(
            observer.client().check_stat(&node).await.unwrap().is_none(),
            "{node} left behind"
        );
    }
    drop(api);
}
