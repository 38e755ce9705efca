//! The controller's removals and count changes against participants acting
//! at the same moment (issue 24, items 10, 13, 14): a real kube-apiserver, a
//! real ZooKeeper, and where a race needs an interleaving, the test proxy
//! holding one side's request back while the other side acts.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::kube::{client, create_pod, install_crds, namespace, ControllerProcess};
use support::proxy::{op, Proxy};
use support::{children, eventually, session, session_with_timeout, shared_zookeeper};
use zkgate::api::{Barrier, BarrierPhase};
use zkgate::zk::{DoubleBarrier, EnterOptions, ParticipantData, Session};

const WITHIN: Duration = Duration::from_secs(20);

struct Setup {
    client: kube::Client,
    ns: String,
    /// The controller's connect string (through `proxy` when there is one).
    zk: String,
    /// The same chroot, straight to the server.
    direct: String,
    _controller: ControllerProcess,
}

/// A namespace and a controller for it, on the shared ZooKeeper (plain:
/// the proxy relays ZooKeeper's frames, not TLS), in a chroot of its own;
/// with `proxied`, the controller reaches ZooKeeper through a [`Proxy`].
async fn setup(proxied: Option<&Proxy>) -> Setup {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let chroot = format!("t-{}", uuid::Uuid::new_v4().simple());
    let direct = format!("{}/{chroot}", shared_zookeeper());
    let zk = match proxied {
        Some(proxy) => format!("{}/{chroot}", proxy.address()),
        None => direct.clone(),
    };
    let controller = ControllerProcess::start(&ns, &zk, "controller-0");
    Setup {
        client,
        ns,
        zk,
        direct,
        _controller: controller,
    }
}

fn barrier_path(ns: &str, name: &str) -> String {
    format!("/zkgate/namespaces/{ns}/barriers/{name}")
}

async fn create_barrier(s: &Setup, name: &str, spec: serde_json::Value) {
    let api: Api<Barrier> = Api::namespaced(s.client.clone(), &s.ns);
    let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": name }, "spec": spec })).unwrap();
    api.create(&PostParams::default(), &b)
        .await
        .expect("create Barrier");
}

async fn barrier_where(
    s: &Setup,
    name: &str,
    what: &str,
    pred: impl Fn(&Barrier) -> bool,
) -> Barrier {
    let api: Api<Barrier> = Api::namespaced(s.client.clone(), &s.ns);
    eventually(WITHIN, what, || async {
        api.get(name).await.ok().filter(|b| pred(b))
    })
    .await
}

fn phase(b: &Barrier) -> Option<BarrierPhase> {
    b.status.as_ref().and_then(|s| s.phase)
}

fn entered(n: u32) -> impl Fn(&Barrier) -> bool {
    move |b| b.status.as_ref().is_some_and(|s| s.entered == n)
}

/// A persistent registration of `id` for pod `pod` (uid `uid`), as an init
/// container leaves it.
async fn register(observer: &Session, path: &str, id: &str, pod: &str, uid: &str) {
    let data = serde_json::to_vec(&ParticipantData {
        pod: Some(pod.to_owned()),
        pod_uid: Some(uid.to_owned()),
        ..ParticipantData::default()
    })
    .unwrap();
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(observer.node_acls());
    observer
        .client()
        .create(&format!("{path}/{id}"), &data, &persistent)
        .await
        .expect("register");
}

/// Issue 24, item 13: a Job's parallelism lowered to exactly the number of
/// participants already entered opens the barrier. Failed before the fix:
/// the controller kept the old count ("participants lowered to 2, but 2
/// have already entered; keeping 3") and the two waited forever.
#[tokio::test]
async fn lowering_a_jobs_parallelism_to_those_entered_opens_the_barrier() {
    let s = setup(None).await;
    create_barrier(&s, "train", json!({ "jobRef": "train" })).await;
    let jobs: Api<Job> = Api::namespaced(s.client.clone(), &s.ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": { "name": "train" },
        "spec": {
            "parallelism": 3,
            "completions": 3,
            "template": {
                "metadata": { "labels": { "zkgate.io/barrier": "train" } },
                "spec": { "restartPolicy": "Never", "containers": [{ "name": "w", "image": "busybox" }] }
            }
        }
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    barrier_where(&s, "train", "sized 3 by the Job", |b| {
        b.status.as_ref().and_then(|st| st.required) == Some(3)
    })
    .await;
    let path = barrier_path(&s.ns, "train");
    let mut enters = Vec::new();
    for i in 0..2 {
        let (zk, path) = (s.direct.clone(), path.clone());
        enters.push(tokio::spawn(async move {
            let session = session(&zk).await;
            let entered = DoubleBarrier::new(&path)
                .enter(&session, &format!("w-{i}"), &EnterOptions::default(), None)
                .await;
            (entered, session)
        }));
    }
    barrier_where(&s, "train", "2 of 3 entered", entered(2)).await;

    let patch = json!({ "spec": { "parallelism": 2 } });
    jobs.patch("train", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let b = barrier_where(&s, "train", "the barrier open with the 2 entered", |b| {
        phase(b) == Some(BarrierPhase::Open)
    })
    .await;
    assert_eq!(b.status.unwrap().required, Some(2));
    let mut sessions = Vec::new();
    for e in enters {
        let (entered, session) = tokio::time::timeout(WITHIN, e)
            .await
            .expect("both participants pass")
            .unwrap();
        assert_eq!(entered.expect("entered").participants, 2);
        sessions.push(session);
    }
}

/// Issue 24, item 10: the controller's removal of a registration (its pod
/// is being deleted) moves the barrier node's version, so a participant's
/// opening decided on a count that included it fails and counts again.
/// The participant's opening transaction is held at the proxy after it
/// counted 2 of 2 (the doomed pod's registration and its own); the pod is
/// deleted and the controller removes that registration; then the opening
/// goes on. Failed before the fix: the removal was a plain delete, the
/// opening's version check passed, and the barrier opened with 1 of 2.
#[tokio::test]
async fn an_opening_that_counted_a_removed_registration_counts_again() {
    let s = setup(None).await;
    create_barrier(&s, "gang", json!({ "participants": 2 })).await;
    barrier_where(&s, "gang", "Waiting", |b| {
        phase(b) == Some(BarrierPhase::Waiting)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    // A finalizer keeps the pod Terminating once deleted.
    let uid = create_pod(
        &pods,
        json!({ "name": "doomed", "labels": { "zkgate.io/barrier": "gang" }, "finalizers": ["zkgate.io/test-hold"] }),
    )
    .await;
    let path = barrier_path(&s.ns, "gang");
    let observer = session(&s.direct).await;
    register(&observer, &path, "doomed", "doomed", &uid).await;
    barrier_where(&s, "gang", "the doomed registration counted", entered(1)).await;

    // The participant reaches ZooKeeper through the proxy, with a session
    // that outlives the stall.
    let proxy = Proxy::start(shared_zookeeper()).await;
    let chroot = s.direct.split_once('/').unwrap().1.to_owned();
    let via_proxy = format!("{}/{chroot}", proxy.address());
    let participant = Arc::new(session_with_timeout(&via_proxy, Duration::from_secs(30)).await);
    proxy.stall_at(&[op::MULTI], "barriers/gang/ready");
    let enter = {
        let (p, path) = (participant.clone(), path.clone());
        tokio::spawn(async move {
            DoubleBarrier::new(&path)
                .enter(&p, "p", &EnterOptions::default(), None)
                .await
        })
    };
    tokio::time::timeout(WITHIN, proxy.stalled_at())
        .await
        .expect("the participant counted 2 of 2 and sent its opening");

    pods.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        WITHIN,
        "the controller to remove the Terminating pod's registration",
        || async {
            (!children(&observer, &path)
                .await
                .contains(&"doomed".to_owned()))
            .then_some(())
        },
    )
    .await;
    let rounds = proxy.forwarded(&[op::GET_DATA], "barriers/gang");
    proxy.resume();
    // The opening's answer is in once the participant has returned or has
    // begun its next round (it reads the barrier's data first).
    eventually(
        WITHIN,
        "the participant to act on its opening's answer",
        || async {
            (enter.is_finished() || proxy.forwarded(&[op::GET_DATA], "barriers/gang") > rounds)
                .then_some(())
        },
    )
    .await;
    let ready = observer
        .client()
        .check_stat(&format!("{path}/ready"))
        .await
        .unwrap();
    assert!(
        ready.is_none() && !enter.is_finished(),
        "the barrier opened with 1 of 2 participants: the opening counted a registration the controller removed meanwhile (children now {:?})",
        children(&observer, &path).await
    );
    barrier_where(&s, "gang", "1 of 2, still waiting", |b| {
        phase(b) == Some(BarrierPhase::Waiting) && entered(1)(b)
    })
    .await;
    enter.abort();
    let patch = json!({ "metadata": { "finalizers": null } });
    let _ = pods
        .patch("doomed", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

/// Issue 24, item 14: a node made again under the same name after the
/// controller's look survives the removal that look decided. `worker-0` is
/// registered by pod trainer-a, which succeeds; the controller's removal is
/// held at the proxy; meanwhile trainer-a's registration goes and trainer-b
/// (alive) registers `worker-0` again. Failed before the fix: the removal
/// was a delete by name, and it deleted trainer-b's live registration.
#[tokio::test]
async fn a_registration_made_again_since_the_look_survives_the_removal() {
    let proxy = Proxy::start(shared_zookeeper()).await;
    let s = setup(Some(&proxy)).await;
    assert_ne!(s.zk, s.direct);
    create_barrier(&s, "gang", json!({ "participants": 3 })).await;
    barrier_where(&s, "gang", "Waiting", |b| {
        phase(b) == Some(BarrierPhase::Waiting)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let labels = json!({ "zkgate.io/barrier": "gang" });
    let a = create_pod(&pods, json!({ "name": "trainer-a", "labels": labels })).await;
    let b = create_pod(&pods, json!({ "name": "trainer-b", "labels": labels })).await;
    let path = barrier_path(&s.ns, "gang");
    let observer = session(&s.direct).await;
    register(&observer, &path, "worker-0", "trainer-a", &a).await;
    barrier_where(&s, "gang", "worker-0 counted", entered(1)).await;

    // Whatever the controller sends first about worker-0 after its look
    // (the look itself reads the children in one multi-read, another op).
    proxy.stall_at(
        &[
            op::DELETE,
            op::MULTI,
            op::EXISTS,
            op::GET_DATA,
            op::SET_DATA,
        ],
        "barriers/gang/worker-0",
    );
    let patch = json!({ "status": { "phase": "Succeeded" } });
    pods.patch_status("trainer-a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::timeout(WITHIN, proxy.stalled_at())
        .await
        .expect("the controller acts on trainer-a's end");
    // trainer-a's registration goes (its own leave, say) and trainer-b
    // registers the same id.
    observer
        .client()
        .delete(&format!("{path}/worker-0"), None)
        .await
        .unwrap();
    register(&observer, &path, "worker-0", "trainer-b", &b).await;
    let (_, renewed) = observer
        .client()
        .get_data(&format!("{path}/worker-0"))
        .await
        .unwrap();
    proxy.resume();

    // A look after the held one has finished once the status counts a
    // registration made now (a Barrier's reconciles run one at a time).
    register(&observer, &path, "marker", "trainer-b", &b).await;
    barrier_where(&s, "gang", "a later look (the marker counted)", |b| {
        b.status
            .as_ref()
            .is_some_and(|st| st.participants.iter().any(|p| p.id == "marker"))
    })
    .await;
    let now = observer
        .client()
        .check_stat(&format!("{path}/worker-0"))
        .await
        .unwrap();
    assert_eq!(
        now.map(|st| st.czxid),
        Some(renewed.czxid),
        "the controller deleted trainer-b's live registration, made after its look decided to remove trainer-a's"
    );
}

/// Issue 24, item 14: a cached pod whose uid is not the registration's is
/// confirmed by a GET before its registration is judged gone. The cache
/// here is a store the test fills with the pod's predecessor (same name,
/// another uid), as a watch that has not yet delivered the replacement
/// leaves it. Failed before the fix: the fate was Gone (from the cache
/// alone), and the live pod's registration would have been removed.
#[tokio::test]
async fn a_stale_cached_pod_is_confirmed_by_a_get_before_its_registration_is_judged_gone() {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use zkgate::controller::pods::{PodFate, Pods};
    let client = client().await;
    let ns = namespace(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let live = create_pod(
        &pods,
        json!({ "name": "w", "labels": { "zkgate.io/barrier": "gang" } }),
    )
    .await;
    let mut stale: Pod = pods.get("w").await.unwrap();
    stale.metadata.uid = Some("00000000-0000-0000-0000-00000000dead".into());
    let (store, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&Event::Apply(stale));

    // Registrations as a look reads them: one of the live pod, one of a
    // pod of that name that is gone (neither the cache's nor the live uid).
    let zk = session(&format!(
        "{}/t-{}",
        shared_zookeeper(),
        uuid::Uuid::new_v4().simple()
    ))
    .await;
    zk.client()
        .create(
            "/b",
            b"",
            &zookeeper_client::CreateMode::Persistent.with_acls(zk.node_acls()),
        )
        .await
        .unwrap();
    register(&zk, "/b", "live", "w", &live).await;
    register(
        &zk,
        "/b",
        "old",
        "w",
        "00000000-0000-0000-0000-0000000000ff",
    )
    .await;
    let snapshot = zkgate::zk::tree::snapshot(&zk, "/b")
        .await
        .unwrap()
        .unwrap();

    let fates = Pods {
        client: client.clone(),
        caches: vec![store],
        metrics: Arc::new(zkgate::serve::metrics::Metrics::default()),
    }
    .fates(&ns, &snapshot.children)
    .await
    .unwrap();
    let fate = |id: &str| {
        fates
            .iter()
            .find(|(node, _)| node.name == id)
            .map(|(_, fate)| *fate)
    };
    assert_eq!(
        fate("live"),
        Some(PodFate::Alive),
        "a live pod's registration judged by a stale cache entry"
    );
    assert_eq!(fate("old"), Some(PodFate::Gone));
}

/// Issue 44, item 3: a LockLease's mode changed under a contender that had
/// read the old one. Contender A reads "Exclusive" and sends its create,
/// which the proxy holds back; meanwhile the LockLease becomes a Semaphore
/// of one permit (the controller sees nobody in the lock); then A's create
/// arrives. B, reading "Semaphore", must not hold beside A. Failed before
/// the fix: A held as an Exclusive contender, unseen by the semaphore, and
/// B took its one permit at once (exit 0 instead of 3).
#[tokio::test]
async fn a_contender_that_read_the_old_mode_cannot_queue_under_it() {
    use zkgate::api::{LockLease, LockMode};
    use zkgate::controller::LockNodeData;
    let s = setup(None).await;
    let locks: Api<LockLease> = Api::namespaced(s.client.clone(), &s.ns);
    let lock: LockLease = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" },
        "spec": { "mode": "Exclusive" }
    }))
    .unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let observer = session(&s.direct).await;
    let node = format!("/zkgate/namespaces/{}/locks/db", s.ns);
    let rules = || async {
        let (data, _) = observer.client().get_data(&node).await.ok()?;
        serde_json::from_slice::<LockNodeData>(&data).ok()
    };
    eventually(WITHIN, "the lock node", || async {
        rules().await.filter(|d| d.mode == LockMode::Exclusive)
    })
    .await;

    let proxy = Proxy::start(shared_zookeeper()).await;
    let through = s.direct.replacen(&shared_zookeeper(), &proxy.address(), 1);
    proxy.stall_at(&op::CREATES, "locks/db/_c_");
    let dir = tempfile::tempdir().unwrap();
    let a_ran = dir.path().join("a-ran");
    let script = format!("touch {}; sleep 8", a_ran.display());
    let mut a = support::zkgate(
        &through,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "a",
            "--session-timeout",
            "30s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let a = a.env("ZKGATE_NAMESPACE", &s.ns).spawn().unwrap();
    tokio::time::timeout(WITHIN, proxy.stalled_at())
        .await
        .expect("A sends its create");
    locks
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "mode": "Semaphore", "permits": 1 } })),
        )
        .await
        .unwrap();
    eventually(WITHIN, "the lock node says Semaphore", || async {
        rules()
            .await
            .filter(|d| d.mode == LockMode::Semaphore && d.changing_to.is_none())
    })
    .await;
    proxy.resume();
    eventually(WITHIN, "A's command runs", || async {
        a_ran.exists().then_some(())
    })
    .await;

    let mut b = support::zkgate(
        &s.direct,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "b",
            "--timeout",
            "2s",
            "--",
            "true",
        ],
    );
    b.env("ZKGATE_NAMESPACE", &s.ns);
    let (code, err) = support::output(b).await;
    assert_eq!(
        code, 3,
        "B held the semaphore's only permit beside A: {err}"
    );
    let out = tokio::time::timeout(WITHIN, a.wait_with_output())
        .await
        .expect("A ends")
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}
