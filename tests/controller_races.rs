//! The controller's removals and count changes against participants acting
//! at the same moment (issue 24, items 10, 13, 14): a real kube-apiserver, a
//! real ZooKeeper, and where a race needs an interleaving, the test proxy
//! holding one side's request back while the other side acts.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::kube::{client, install_crds, namespace, ControllerProcess};
use support::proxy::Proxy;
use support::{eventually, session, shared_zookeeper};
use zkgate::api::{Barrier, BarrierPhase};
use zkgate::zk::{DoubleBarrier, EnterOptions};

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
