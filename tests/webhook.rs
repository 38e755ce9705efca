//! The admission webhook against a real kube-apiserver: the API server
//! calls the controller's webhook at a loopback URL, as it would call the
//! chart's Service.

mod support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use support::https::Endpoint;
use support::kube::{client, install_crds, kubeconfig, namespace, ControllerProcess};
use support::zookeeper::free_port;
use support::{eventually, isolated_connect};
use zkgate::api::Barrier;

const WITHIN: Duration = Duration::from_secs(30);
const SECRET: &str = "zkgate-webhook-tls";
const IMAGE: &str = "registry.test/zkgate:test";

/// A namespace whose pods (labelled) the API server sends to a webhook at
/// `https://127.0.0.1:<port>/mutate`, registered as the chart registers it
/// but for this namespace alone.
struct Hooked {
    client: kube::Client,
    ns: String,
    port: u16,
    configuration: String,
}

impl Hooked {
    async fn new() -> Hooked {
        let client = client().await;
        install_crds(&client).await;
        let ns = namespace(&client).await;
        // API servers before 1.21 do not label namespaces with their name.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let label = json!({ "metadata": { "labels": { "zkgate-webhook-test": ns } } });
        namespaces
            .patch(&ns, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        let port = free_port();
        let configuration = format!("zkgate-test-{ns}");
        let webhooks: Vec<_> = ["barrier", "lock"]
            .iter()
            .map(|kind| {
                json!({
                    "name": format!("{kind}.pods.zkgate.io"),
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "reinvocationPolicy": "IfNeeded",
                    "clientConfig": { "url": format!("https://127.0.0.1:{port}/mutate") },
                    "rules": [{
                        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["pods"], "scope": "Namespaced"
                    }],
                    "objectSelector": { "matchExpressions": [{ "key": format!("zkgate.io/{kind}"), "operator": "Exists" }] },
                    "namespaceSelector": { "matchLabels": { "zkgate-webhook-test": ns } }
                })
            })
            .collect();
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": { "name": configuration },
            "webhooks": webhooks
        }))
        .unwrap();
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        Hooked {
            client,
            ns,
            port,
            configuration,
        }
    }

    /// The controller, serving the webhook with a certificate it makes for
    /// 127.0.0.1; returns once the API server trusts it (the caBundle is in).
    async fn controller(&self, zk: &str) -> ControllerProcess {
        self.controller_and(zk, &[]).await
    }

    /// [`Hooked::controller`] with more options (`extra`).
    async fn controller_and(&self, zk: &str, extra: &[&str]) -> ControllerProcess {
        let mut args = vec![
            "--webhook-names",
            "127.0.0.1",
            "--webhook-secret",
            SECRET,
            "--webhook-secret-namespace",
            &self.ns,
            "--webhook-configuration",
            &self.configuration,
        ];
        args.extend_from_slice(extra);
        let controller = self.controller_with(zk, &args).await;
        support::kube::ca_bundle_published(&self.client, &self.configuration, WITHIN).await;
        controller
    }

    /// The controller serving the webhook with `certificates` (its
    /// certificate options); returns once it listens.
    async fn controller_with(&self, zk: &str, certificates: &[&str]) -> ControllerProcess {
        let addr = format!("127.0.0.1:{}", self.port);
        let handout = self.handout_url();
        let mut args = vec![
            "--watch-namespace",
            &self.ns,
            "--webhook-addr",
            &addr,
            "--image",
            IMAGE,
            // Where injected containers ask for their credentials: the
            // webhook's own loopback address here.
            "--handout-url",
            &handout,
        ];
        args.extend_from_slice(certificates);
        let controller = ControllerProcess::start_with(&kubeconfig(), zk, "controller-0", &args);
        eventually(WITHIN, "the webhook listening", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .ok()
        })
        .await;
        controller
    }

    /// Creates the Barrier `name` (admission refuses a pod whose label
    /// names a Barrier nobody makes).
    async fn barrier(&self, name: &str, participants: u32) {
        let barrier: Barrier = serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
            "metadata": { "name": name }, "spec": { "participants": participants }
        }))
        .unwrap();
        Api::<Barrier>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &barrier)
            .await
            .unwrap();
    }

    /// Creates the LockLease `name`.
    async fn locklease(&self, name: &str, spec: serde_json::Value) {
        let lease: zkgate::api::LockLease = serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease",
            "metadata": { "name": name }, "spec": spec
        }))
        .unwrap();
        Api::<zkgate::api::LockLease>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &lease)
            .await
            .unwrap();
    }

    /// Where the controller hands out credentials.
    fn handout_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The webhook's CA (PEM), once the controller made it.
    async fn ca(&self) -> Vec<u8> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        eventually(WITHIN, "the webhook's CA", || async {
            Some(
                secrets
                    .get(SECRET)
                    .await
                    .ok()?
                    .data?
                    .get("ca.crt")?
                    .0
                    .clone(),
            )
        })
        .await
    }

    /// Asks the handout for credentials with `token` (none: no header):
    /// the HTTP status and body.
    async fn ask_handout(&self, token: Option<&str>) -> (u16, String) {
        let ca = self.ca().await;
        let header = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        post(self.port, &ca, zkgate::handout::PATH, &header, "{}").await
    }

    /// The names of the Secrets in the namespace.
    async fn secret_names(&self) -> Vec<String> {
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.name_any())
            .collect()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create_pod(&self, pod: serde_json::Value) -> Result<Pod, kube::Error> {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods().create(&PostParams::default(), &pod).await
    }

    async fn done(self) {
        let _ = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.configuration, &DeleteParams::default())
            .await;
    }
}

/// A pod in the barrier's sidecar form, labelled with `barrier`.
fn sidecar_pod_of(barrier: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "name": "sidecar",
            "labels": { "zkgate.io/barrier": barrier },
            "annotations": { "zkgate.io/barrier-form": "sidecar" }
        },
        "spec": { "containers": [{ "name": "worker", "image": "busybox" }] }
    })
}

fn pod_of(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "containers": [{ "name": "worker", "image": "busybox" }] }
    })
}

/// A pod labelled for `barrier`, with `annotations` and an explicit
/// command (which the wrap form needs).
fn annotated_pod(name: &str, barrier: &str, annotations: serde_json::Value) -> serde_json::Value {
    let mut pod = pod_of(name, json!({ "zkgate.io/barrier": barrier }));
    pod["metadata"]["annotations"] = annotations;
    pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", "true"]);
    pod
}

fn env<'a>(
    c: &'a k8s_openapi::api::core::v1::Container,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

/// A labelled Job's pod comes out of admission with the init container and
/// its variables; the Job's Barrier is made, owned by the Job and sized by
/// it; a pod already carrying zkgate is left alone; unlabelled pods never
/// reach the webhook.
#[tokio::test]
async fn a_labelled_jobs_pods_are_injected_and_get_the_jobs_barrier() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;

    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": { "name": "train" },
        "spec": {
            "parallelism": 4, "completions": 4, "completionMode": "Indexed",
            "template": {
                "metadata": { "labels": { "zkgate.io/barrier": "train" } },
                "spec": { "restartPolicy": "Never", "containers": [{ "name": "worker", "image": "busybox" }] }
            }
        }
    }))
    .unwrap();
    let job = jobs.create(&PostParams::default(), &job).await.unwrap();
    // What the Job controller makes (this API server runs none).
    let mut first = pod_of("train-0", json!({ "zkgate.io/barrier": "train" }));
    first["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "train",
        "uid": job.uid().unwrap(), "controller": true, "blockOwnerDeletion": true
    }]);
    let admitted = h.create_pod(first).await.expect("admitted");

    let spec = admitted.spec.unwrap();
    let inits = spec.init_containers.unwrap();
    assert_eq!(inits.len(), 1, "{inits:?}");
    let init = &inits[0];
    assert_eq!(init.name, "zkgate-barrier");
    assert_eq!(
        init.image.as_deref(),
        Some(IMAGE),
        "the controller's own image"
    );
    assert_eq!(init.args.as_deref().unwrap(), ["barrier", "enter", "train"]);
    assert_eq!(
        env(init, "ZKGATE_ZOOKEEPER").and_then(|e| e.value.as_deref()),
        Some(zk.as_str())
    );
    for (var, field) in [
        ("ZKGATE_POD_NAME", "metadata.name"),
        ("ZKGATE_POD_UID", "metadata.uid"),
        ("ZKGATE_NAMESPACE", "metadata.namespace"),
    ] {
        let from = env(init, var)
            .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(from, Some(field), "{var}");
    }
    assert_eq!(
        init.security_context
            .as_ref()
            .unwrap()
            .read_only_root_filesystem,
        Some(true)
    );
    assert!(
        spec.volumes.unwrap().iter().any(|v| v.name == "zkgate-run"),
        "the shared volume"
    );

    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    let made = eventually(WITHIN, "the Job's Barrier, sized by it", || async {
        barriers
            .get("train")
            .await
            .ok()
            .filter(|b| b.status.as_ref().and_then(|s| s.required) == Some(4))
    })
    .await;
    assert_eq!(made.spec.job_ref.as_deref(), Some("train"));
    assert_eq!(made.spec.participants, None);
    let owner = &made.owner_references()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            Some(owner.uid.as_str())
        ),
        ("Job", "train", job.uid().as_deref()),
        "deleted with its Job by the garbage collector"
    );

    // A second pod of the Job: injected, and the Barrier left as it is.
    let mut second = pod_of("train-1", json!({ "zkgate.io/barrier": "train" }));
    second["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "train",
        "uid": job.uid().unwrap(), "controller": true
    }]);
    let second = h.create_pod(second).await.unwrap();
    assert_eq!(second.spec.unwrap().init_containers.unwrap().len(), 1);

    // Written by hand with zkgate already, on a Barrier of its own (the
    // Job's Barrier takes only that run's pods): left alone.
    h.barrier("by-hand", 1).await;
    let mut by_hand = pod_of("by-hand", json!({ "zkgate.io/barrier": "by-hand" }));
    by_hand["spec"]["initContainers"] = json!([{
        "name": "barrier", "image": "ghcr.io/zkgate/zkgate:0.2.0", "args": ["barrier", "enter", "by-hand"]
    }]);
    let by_hand = h.create_pod(by_hand).await.unwrap();
    let inits = by_hand.spec.unwrap().init_containers.unwrap();
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0].name, "barrier");

    // A side of an Exclusive LockLease is refused, saying why (issue 44:
    // two readers of an Exclusive lock held it at once).
    h.locklease("exclusive", json!({})).await;
    let refused = h
        .create_pod(pod_of(
            "reader",
            json!({ "zkgate.io/lock": "exclusive", "zkgate.io/lock-mode": "read" }),
        ))
        .await
        .expect_err("a reader of an Exclusive LockLease is refused");
    assert!(
        refused
            .to_string()
            .contains("sides are for ReadWrite LockLeases"),
        "{refused}"
    );

    // A lock by label: its init container, the token visible to the worker.
    h.locklease("db", json!({ "mode": "ReadWrite" })).await;
    let locked = h
        .create_pod(pod_of(
            "migrate",
            json!({ "zkgate.io/lock": "db", "zkgate.io/lock-mode": "write" }),
        ))
        .await
        .unwrap();
    let spec = locked.spec.unwrap();
    let inits = spec.init_containers.unwrap();
    assert_eq!(inits[0].name, "zkgate-lock");
    assert_eq!(
        inits[0].args.as_deref().unwrap(),
        ["lock", "acquire", "db", "--write"]
    );
    assert!(spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/var/run/zkgate"));

    let plain = h
        .create_pod(pod_of("plain", json!({ "app": "other" })))
        .await
        .unwrap();
    assert!(plain.spec.unwrap().init_containers.is_none());

    assert_eq!(
        controller
            .metric("zkgate_webhook_admissions_total{outcome=\"injected\"}")
            .await,
        Some(3.0)
    );
    assert_eq!(
        controller
            .metric("zkgate_webhook_admissions_total{outcome=\"unchanged\"}")
            .await,
        Some(1.0),
        "the hand-written pod (the unlabelled one never reached the webhook)"
    );
    // Every admission is timed, whatever its outcome (the reader above was
    // refused); none failed (what ZkgateAdmissionsFailing counts).
    let (_, body) = support::http_get(controller.metrics_port, "/metrics")
        .await
        .unwrap();
    let sum = |prefix: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        sum("zkgate_webhook_admissions_total{outcome=\"refused\"}"),
        1.0,
        "{body}"
    );
    assert_eq!(
        sum("zkgate_webhook_admissions_total{outcome=\"failed\"}"),
        0.0,
        "{body}"
    );
    assert_eq!(
        sum("zkgate_webhook_admission_duration_seconds_count"),
        sum("zkgate_webhook_admissions_total{"),
        "an admission answered but not timed:\n{body}"
    );
    drop(controller);
    h.done().await;
}

/// A labelled Job made, deleted and made again under the same name (a
/// re-run), and another Job labelling the same Barrier while the first
/// runs, and then once it is over (a CronJob's next run): each run gets a
/// Barrier of its own, its pods are told their run, and two running Jobs
/// never share one (the second's pods are refused with the reason).
#[tokio::test]
async fn each_run_of_a_labelled_job_gets_a_barrier_of_its_own() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let observer = support::session(&zk).await;
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    let labelled_job = |name: &str| -> Job {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "parallelism": 2,
                "template": {
                    "metadata": { "labels": { "zkgate.io/barrier": "train" } },
                    "spec": { "restartPolicy": "Never", "containers": [{ "name": "worker", "image": "busybox" }] }
                }
            }
        }))
        .unwrap()
    };
    // A pod as the Job controller makes it (this API server runs none).
    let pod_of_job = |name: &str, job: &Job| {
        let mut pod = pod_of(name, json!({ "zkgate.io/barrier": "train" }));
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "batch/v1", "kind": "Job", "name": job.name_any(),
            "uid": job.uid().unwrap(), "controller": true
        }]);
        pod
    };
    let path = format!("/zkgate/namespaces/{}/barriers/train", h.ns);
    // The Barrier once it is `job`'s, and its node once that says so.
    let barrier_of = |job: Job| {
        let (barriers, observer, path) = (barriers.clone(), &observer, path.clone());
        async move {
            let uid = job.uid().unwrap();
            let barrier = support::kube::barrier_of_run(&barriers, "train", &uid, WITHIN).await;
            eventually(WITHIN, "the run's barrier node", || async {
                let (data, _) = observer.client().get_data(&path).await.ok()?;
                let data = zkgate::zk::BarrierData::parse(&path, &data).ok()??;
                (data.run.as_deref() == Some(uid.as_str())).then_some(())
            })
            .await;
            barrier
        }
    };
    let run_of = |pod: &Pod| {
        let init = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        env(init, "ZKGATE_RUN").and_then(|e| e.value.clone())
    };

    let first = jobs
        .create(&PostParams::default(), &labelled_job("train"))
        .await
        .unwrap();
    let first_barrier = barrier_of(first.clone()).await;
    let pod = h.create_pod(pod_of_job("train-a", &first)).await.unwrap();
    assert_eq!(run_of(&pod), first.uid(), "the pod is told its run");

    // Deleted and made again at once. This API server runs no garbage
    // collector: the first run's Barrier stays, owned by a Job that is gone.
    jobs.delete("train", &DeleteParams::background())
        .await
        .unwrap();
    let again = jobs
        .create(&PostParams::default(), &labelled_job("train"))
        .await
        .unwrap();
    let again_barrier = barrier_of(again.clone()).await;
    assert_ne!(
        again_barrier.uid(),
        first_barrier.uid(),
        "a Barrier of its own, not the first run's"
    );
    let pod = h.create_pod(pod_of_job("train-b", &again)).await.unwrap();
    assert_eq!(run_of(&pod), again.uid());

    // Another Job labelling the same Barrier while this run goes on.
    let other = jobs
        .create(&PostParams::default(), &labelled_job("other"))
        .await
        .unwrap();
    let refused = h
        .create_pod(pod_of_job("other-a", &other))
        .await
        .expect_err("two running Jobs never share a Barrier")
        .to_string();
    assert!(
        refused.contains("still runs") && refused.contains("train"),
        "{refused}"
    );
    assert_eq!(
        barriers.get("train").await.unwrap().uid(),
        again_barrier.uid(),
        "the running Job keeps its Barrier"
    );

    // The run is over: the other Job's run gets the Barrier. (A finished
    // Job's status as the API server takes it: started, completed, its
    // success criteria met.)
    let now = "2026-01-01T00:00:00Z";
    jobs.patch_status(
        "train",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "startTime": now, "completionTime": now,
            "conditions": [
                { "type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now },
                { "type": "Complete", "status": "True", "lastTransitionTime": now }
            ]
        } })),
    )
    .await
    .unwrap();
    barrier_of(other.clone()).await;
    let pod = h
        .create_pod(pod_of_job("other-b", &other))
        .await
        .expect("admitted once the Barrier is its run's");
    assert_eq!(run_of(&pod), other.uid());

    // A third waits behind it; the holder is deleted (no Job change tells
    // of that, only its deletion): the third gets the Barrier.
    let third = jobs
        .create(&PostParams::default(), &labelled_job("third"))
        .await
        .unwrap();
    h.create_pod(pod_of_job("third-a", &third))
        .await
        .expect_err("refused while the other Job runs");
    jobs.delete("other", &DeleteParams::background())
        .await
        .unwrap();
    barrier_of(third.clone()).await;
    drop(controller);
    h.done().await;
}

/// A JobSet's replicated Jobs, made as JobSet's controller makes them (one
/// child Job per replica, owned by the JobSet, its labels on the Job and
/// its pod template): one Barrier for the JobSet's run, sized over the
/// replicated Jobs whose template carries the label (not the first child
/// Job's), which every child Job's pods are admitted to and told the run
/// of. A JobSet restart (every child Job made again) is a run of its own,
/// a pod whose JobSet labels its Job does not bear out is refused, and a
/// pod of another owner gets the rule of a bare pod. Failed on the code
/// before: the second child Job's pods were refused as a second run.
#[tokio::test]
async fn a_jobsets_child_jobs_share_one_barrier_sized_over_its_replicated_jobs() {
    use kube::core::DynamicObject;
    let h = Hooked::new().await;
    support::kube::install_jobset_crd(&h.client).await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let observer = support::session(&zk).await;
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    let jobsets: Api<DynamicObject> =
        Api::namespaced_with(h.client.clone(), &h.ns, &support::jobset::resource());
    let job_template = |parallelism: u32, labelled: bool| {
        let labels = if labelled {
            json!({ "zkgate.io/barrier": "gang" })
        } else {
            json!({})
        };
        json!({
            "spec": {
                "parallelism": parallelism, "completions": parallelism,
                "template": {
                    "metadata": { "labels": labels },
                    "spec": { "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox" }] }
                }
            }
        })
    };
    let relabelled = |mut template: serde_json::Value, barrier: &str| {
        template["spec"]["template"]["metadata"]["labels"]["zkgate.io/barrier"] = json!(barrier);
        template
    };
    // Workers: 2 Jobs of 2 pods; a driver: 1 of 1; a monitor (not gated).
    let replicated = [
        ("workers", 2, job_template(2, true)),
        ("driver", 1, job_template(1, true)),
        ("monitor", 1, job_template(1, false)),
    ];
    let jobset: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": { "name": "gang" },
        "spec": {
            "replicatedJobs": replicated.iter().map(|(name, replicas, template)| json!({
                "name": name, "replicas": replicas, "template": template
            })).collect::<Vec<_>>()
        }
    }))
    .unwrap();
    let jobset = jobsets
        .create(&PostParams::default(), &jobset)
        .await
        .expect("the JobSet, checked against its CRD");
    let uid = jobset.uid().unwrap();
    // Its child Jobs for restart `restart`, as JobSet's controller makes
    // them.
    let children = |restart: u32| {
        let (jobs, made) = (jobs.clone(), support::jobset::child_jobs(&jobset, restart));
        async move {
            let mut stored = vec![];
            for job in made {
                stored.push(jobs.create(&PostParams::default(), &job).await.unwrap());
            }
            stored
        }
    };
    // A pod as the Job controller makes it from `job`'s template.
    let pod_of = |name: &str, job: &Job| {
        let template = job.spec.as_ref().unwrap().template.clone();
        json!({
            "metadata": {
                "name": name,
                "labels": template.metadata.unwrap().labels,
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": job.name_any(),
                    "uid": job.uid().unwrap(), "controller": true
                }]
            },
            "spec": { "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox" }] }
        })
    };
    let run_of = |pod: &Pod| {
        let init = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        env(init, "ZKGATE_RUN").and_then(|e| e.value.clone())
    };
    let path = format!("/zkgate/namespaces/{}/barriers/gang", h.ns);
    let barrier_of_run = |run: String| {
        let (barriers, observer, path) = (barriers.clone(), &observer, path.clone());
        async move {
            let barrier =
                eventually(WITHIN, "the run's Barrier", || async {
                    barriers.get_opt("gang").await.ok().flatten().filter(|b| {
                        zkgate::workload::run::run_of(b).as_deref() == Some(run.as_str())
                    })
                })
                .await;
            eventually(WITHIN, "the run's barrier node", || async {
                let (data, _) = observer.client().get_data(&path).await.ok()?;
                let data = zkgate::zk::BarrierData::parse(&path, &data).ok()??;
                (data.run.as_deref() == Some(run.as_str())).then_some(())
            })
            .await;
            barrier
        }
    };

    let first = children(0).await;
    let run0 = format!("{uid}.0");
    let barrier = barrier_of_run(run0.clone()).await;
    assert_eq!(
        barrier.spec.participants,
        Some(2 * 2 + 1),
        "sized over the labelled replicated Jobs"
    );
    assert_eq!(barrier.spec.job_ref, None);
    let owner = &barrier.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("JobSet", uid.as_str()),
        "owned by the JobSet: deleted with it"
    );
    eventually(WITHIN, "the Barrier's size in its status", || async {
        let b = barriers.get("gang").await.ok()?;
        (b.status?.required == Some(5)).then_some(())
    })
    .await;
    let [workers0, workers1, driver, monitor] = [&first[0], &first[1], &first[2], &first[3]];
    for (pod, job) in [("w0-a", workers0), ("w1-a", workers1), ("d-a", driver)] {
        let pod = h
            .create_pod(pod_of(pod, job))
            .await
            .expect("every child Job's pods take part in the JobSet's Barrier");
        assert_eq!(run_of(&pod), Some(run0.clone()), "told the JobSet's run");
    }
    let unlabelled = h.create_pod(pod_of("m-a", monitor)).await.unwrap();
    assert!(
        unlabelled.spec.unwrap().init_containers.is_none(),
        "a replicated Job without the label is not gated"
    );

    // A pod that says it is of the JobSet's run, of a Job that is not.
    let other = jobs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "other" },
                "spec": job_template(1, true)["spec"]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut forged = pod_of("forged", &other);
    forged["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] = json!(uid);
    forged["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = json!("0");
    let refused = h
        .create_pod(forged)
        .await
        .expect_err("JobSet labels its Job does not bear out")
        .to_string();
    assert!(refused.contains("is not of that run"), "{refused}");
    let refused = h
        .create_pod(pod_of("other-a", &other))
        .await
        .expect_err("a second run while the JobSet's runs")
        .to_string();
    assert!(
        refused.contains("still runs") && refused.contains("JobSet gang"),
        "{refused}"
    );
    jobs.delete("other", &DeleteParams::background())
        .await
        .unwrap();

    // What JobSet's pods must say: its uid (JobSet v0.9.0+), and no child
    // Job made again alone by the RestartJob action.
    let mut old_jobset = pod_of("w0-old", workers0);
    let labels = old_jobset["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove("jobset.sigs.k8s.io/jobset-uid");
    let refused = h.create_pod(old_jobset).await.unwrap_err().to_string();
    assert!(refused.contains("before v0.9.0"), "{refused}");
    let mut restarted_alone = pod_of("w0-alone", workers0);
    restarted_alone["metadata"]["labels"]["jobset.sigs.k8s.io/job-restart-attempt"] = json!("1");
    let refused = h.create_pod(restarted_alone).await.unwrap_err().to_string();
    assert!(refused.contains("RestartJob"), "{refused}");
    // A pod of no Job never joins a run's gang.
    let stray = json!({
        "metadata": { "name": "stray", "labels": { "zkgate.io/barrier": "gang" } },
        "spec": { "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox" }] }
    });
    let refused = h.create_pod(stray).await.unwrap_err().to_string();
    assert!(
        refused.contains("is of no Job") && refused.contains("JobSet gang"),
        "{refused}"
    );
    // A JobSet whose labelled replicated Jobs start in order (dependsOn)
    // cannot be one gang: its pods are refused with the reason.
    let ordered: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": { "name": "ordered" },
        "spec": { "replicatedJobs": [
            { "name": "driver", "replicas": 1, "template": relabelled(job_template(1, true), "ordered") },
            { "name": "workers", "replicas": 1, "template": relabelled(job_template(1, true), "ordered"),
              "dependsOn": [{ "name": "driver", "status": "Ready" }] }
        ]}
    }))
    .unwrap();
    let ordered = jobsets
        .create(&PostParams::default(), &ordered)
        .await
        .expect("dependsOn, checked against its CRD");
    let ordered_driver = jobs
        .create(
            &PostParams::default(),
            &support::jobset::child_jobs(&ordered, 0)[0],
        )
        .await
        .unwrap();
    let refused = h
        .create_pod(pod_of("ordered-driver", &ordered_driver))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("depends on driver") && refused.contains("JobSet ordered"),
        "{refused}"
    );

    // The JobSet restarts: its controller deletes every child Job and makes
    // them again, labelled with the next restart. A run of its own.
    for job in &first {
        jobs.delete(&job.name_any(), &DeleteParams::background())
            .await
            .unwrap();
    }
    let again = children(1).await;
    let run1 = format!("{uid}.1");
    let replaced = barrier_of_run(run1.clone()).await;
    assert_ne!(replaced.uid(), barrier.uid(), "a Barrier of its own");
    assert_eq!(replaced.spec.participants, Some(5));
    let pod = h.create_pod(pod_of("w0-b", &again[0])).await.unwrap();
    assert_eq!(run_of(&pod), Some(run1));

    // A pod of another owner (a training operator's): the rule of a bare
    // pod. Without a Barrier, refused with the reason; with one made (and
    // sized) by hand, admitted into it, of no run.
    let mut trainer = json!({
        "metadata": {
            "name": "trainer-0",
            "labels": { "zkgate.io/barrier": "by-hand" },
            "ownerReferences": [{
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "trainer",
                "uid": "4b3c2d1e-0000-4000-8000-000000000001", "controller": true
            }]
        },
        "spec": { "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox" }] }
    });
    let refused = h
        .create_pod(trainer.clone())
        .await
        .expect_err("no Barrier, and no Job to make one for")
        .to_string();
    assert!(
        refused.contains("does not exist") && refused.contains("PyTorchJob trainer"),
        "{refused}"
    );
    h.barrier("by-hand", 2).await;
    trainer["metadata"]["name"] = json!("trainer-1");
    let pod = h.create_pod(trainer).await.expect("sized by the Barrier");
    assert_eq!(run_of(&pod), None, "of no run");
    drop(controller);
    h.done().await;
}

/// Only labelled pods reach the webhook: with it down, an unlabelled pod is
/// admitted as it is, and a labelled one is refused (failurePolicy Fail: a
/// gang member never starts without its barrier).
#[tokio::test]
async fn with_the_webhook_down_unlabelled_pods_pass_and_labelled_ones_wait() {
    let h = Hooked::new().await;
    let plain = h
        .create_pod(pod_of("plain", json!({ "app": "other" })))
        .await
        .expect("an unlabelled pod never waits for the webhook");
    assert!(plain.spec.unwrap().init_containers.is_none());
    let refused = h
        .create_pod(pod_of("member", json!({ "zkgate.io/barrier": "train" })))
        .await
        .expect_err("a labelled pod is not admitted without its barrier");
    assert!(
        refused.to_string().contains("barrier.pods.zkgate.io"),
        "{refused}"
    );
    h.done().await;
}

/// Issue 43, item 3: admission needs no ZooKeeper (it writes nothing
/// there). Once ZooKeeper goes away, a replica serving the webhook still
/// says it is ready (so its pod stays in the webhook Service's endpoints:
/// with `failurePolicy: Fail`, no ready replica means no labelled pod
/// created anywhere), its body says ZooKeeper is away, and a labelled pod
/// is admitted, injected, to wait at its barrier until ZooKeeper is back.
/// A replica that never reached ZooKeeper is not ready (a misconfigured
/// one must not replace working ones in a rolling update).
#[tokio::test]
async fn with_zookeeper_down_the_webhook_is_ready_and_admits_labelled_pods() {
    let h = Hooked::new().await;
    h.barrier("gang", 2).await;
    // Nothing listens there.
    let nowhere = format!("127.0.0.1:{}/nowhere", free_port());
    let misconfigured = h.controller(&nowhere).await;
    // Its webhook serves (the call above waited for it): only never having
    // reached ZooKeeper keeps it unready.
    eventually(WITHIN, "unready, saying why", || async {
        let (code, body) = support::http_get(misconfigured.metrics_port, "/readyz").await?;
        (code == 503 && body.contains("ZooKeeper")).then_some(())
    })
    .await;
    drop(misconfigured);
    let mut server = tokio::task::spawn_blocking(support::ZkServer::standalone)
        .await
        .unwrap();
    let zk = format!("{}/admission", server.address());
    let controller = h.controller(&zk).await;
    eventually(WITHIN, "ready with ZooKeeper", || async {
        (controller.status_of("/readyz").await == Some(200)
            && controller
                .metric("zkgate_zookeeper_session_connected")
                .await
                == Some(1.0))
        .then_some(())
    })
    .await;
    server.kill();
    eventually(WITHIN, "ZooKeeper seen gone", || async {
        (controller
            .metric("zkgate_zookeeper_session_connected")
            .await
            == Some(0.0))
        .then_some(())
    })
    .await;
    eventually(WITHIN, "ready without ZooKeeper", || async {
        (controller.status_of("/readyz").await == Some(200)).then_some(())
    })
    .await;
    let (_, body) = support::http_get(controller.metrics_port, "/readyz")
        .await
        .expect("/readyz answers");
    assert!(body.contains("ZooKeeper"), "{body}");
    assert_eq!(
        controller
            .metric("zkgate_zookeeper_session_connected")
            .await,
        Some(0.0)
    );
    let pod = h
        .create_pod(pod_of("member", json!({ "zkgate.io/barrier": "gang" })))
        .await
        .expect("a labelled pod is admitted with ZooKeeper down");
    let init = pod.spec.unwrap().init_containers.unwrap_or_default();
    assert!(
        init.iter().any(|c| c.name.starts_with("zkgate")),
        "not injected: {init:?}"
    );
    h.done().await;
}

/// `--native-sidecars=false` (a cluster said to run none, whatever its
/// API server's version): the sidecar form is refused with the reason,
/// and the init form still admitted.
#[tokio::test]
async fn told_there_are_no_native_sidecars_the_webhook_refuses_the_sidecar_form() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller_and(&zk, &["--native-sidecars", "false"]).await;
    h.barrier("train", 2).await;
    let refused = h
        .create_pod(sidecar_pod_of("train"))
        .await
        .expect_err("no native sidecars, by the flag")
        .to_string();
    assert!(
        refused.contains("native sidecars") && refused.contains("init form"),
        "{refused}"
    );
    let init = h
        .create_pod(pod_of("member", json!({ "zkgate.io/barrier": "train" })))
        .await
        .expect("the init form needs no sidecars");
    let inits = init.spec.unwrap().init_containers.unwrap();
    assert!(
        inits.iter().all(|c| c.restart_policy.is_none()),
        "{inits:?}"
    );
    drop(controller);
    h.done().await;
}

/// Issue 46, item 3: a namespace whose ResourceQuota asks every container
/// for CPU and memory limits admits labelled pods of every form with the
/// participants' default resources (without a CPU limit, what they had
/// before, the quota refused every one: "must specify limits.cpu").
/// Resources the controller is told are what the containers get;
/// resources it cannot use stop it at once, saying why.
#[tokio::test]
async fn a_namespace_that_asks_every_container_for_limits_admits_labelled_pods() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    limits_quota(&h).await;
    let forms = [
        (
            "init",
            limited(pod_of("init", json!({ "zkgate.io/barrier": "train" }))),
        ),
        ("sidecar", limited(sidecar_pod_of("train"))),
        (
            "wrap",
            limited(annotated_pod(
                "wrap",
                "train",
                json!({ "zkgate.io/barrier-form": "wrap" }),
            )),
        ),
        (
            "lock",
            limited(pod_of("lock", json!({ "zkgate.io/lock": "db" }))),
        ),
    ];

    let controller = h.controller(&zk).await;
    h.barrier("train", 4).await;
    h.locklease("db", json!({})).await;
    for (form, pod) in forms.clone() {
        let admitted = h
            .create_pod(pod)
            .await
            .unwrap_or_else(|e| panic!("the {form} form refused: {e}"));
        let spec = admitted.spec.unwrap();
        let injected: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.name.starts_with("zkgate-"))
            .collect();
        assert!(!injected.is_empty(), "the {form} form: nothing injected");
        for c in injected {
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default();
            assert_eq!(
                (
                    limits.get("cpu").map(|q| q.0.as_str()),
                    limits.get("memory").map(|q| q.0.as_str())
                ),
                (Some("500m"), Some("64Mi")),
                "the {form} form's {}",
                c.name
            );
        }
    }
    drop(controller);
    for (form, _) in &forms {
        h.pods()
            .delete(form, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }

    // Resources the controller is told.
    let told =
        r#"{"requests":{"cpu":"20m","memory":"32Mi"},"limits":{"cpu":"1","memory":"128Mi"}}"#;
    let controller = h
        .controller_and(&zk, &["--participant-resources", told])
        .await;
    let admitted = h
        .create_pod(limited(pod_of(
            "told",
            json!({ "zkgate.io/barrier": "train" }),
        )))
        .await
        .expect("admitted with the resources told");
    let c = &admitted.spec.unwrap().init_containers.unwrap()[0];
    let resources = serde_json::to_value(c.resources.as_ref().unwrap()).unwrap();
    assert_eq!(
        resources,
        serde_json::from_str::<serde_json::Value>(told).unwrap()
    );
    drop(controller);

    // Resources the containers could not run with: the controller does not
    // start, and says why.
    for (bad, says) in [
        (r#"{"limits":{"memory":"8Mi"}}"#, "below 32Mi"),
        (
            r#"{"requests":{"cpu":"2"},"limits":{"cpu":"1"}}"#,
            "above limits.cpu",
        ),
        (
            r#"{"limits":{"nvidia.com/gpu":"1"}}"#,
            "only cpu and memory",
        ),
    ] {
        let stderr = controller_refuses(&zk, "--participant-resources", bad);
        assert!(
            stderr.contains(says) && stderr.contains("--participant-resources"),
            "{bad}: {stderr}"
        );
    }
    h.done().await;
}

/// `zkgate controller` with `flag value` against ZooKeeper `zk`: it must
/// refuse to start (exit 2); its standard error.
fn controller_refuses(zk: &str, flag: &str, value: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args(["controller", "--zookeeper", zk, flag, value])
        .env("KUBECONFIG", kubeconfig())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{flag} {value}: {stderr}");
    stderr
}

/// A ResourceQuota `limits-required` in `h`'s namespace on CPU and memory
/// requests and limits (8 of each), enforced: every container of a pod
/// must give each.
async fn limits_quota(h: &Hooked) -> Api<ResourceQuota> {
    let quotas: Api<ResourceQuota> = Api::namespaced(h.client.clone(), &h.ns);
    let hard = json!({ "limits.cpu": "8", "limits.memory": "8Gi", "requests.cpu": "8", "requests.memory": "8Gi" });
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": { "name": "limits-required" }, "spec": { "hard": hard }
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // What kube-controller-manager's quota controller would write (this
    // tier runs no controller-manager): the quota is enforced once its
    // status knows its resources.
    let used = json!({ "limits.cpu": "0", "limits.memory": "0", "requests.cpu": "0", "requests.memory": "0" });
    quotas
        .patch_status(
            "limits-required",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "hard": hard, "used": used } })),
        )
        .await
        .unwrap();
    quotas
}

/// `pod` with its container's own limits (1 CPU, 256Mi), as a namespace
/// that asks every container for limits wants.
fn limited(mut pod: serde_json::Value) -> serde_json::Value {
    pod["spec"]["containers"][0]["resources"] =
        json!({ "limits": { "cpu": "1", "memory": "256Mi" } });
    pod
}

/// What the docs say a pod of the sidecar form with a lock adds to its
/// namespace's quota, as the API server's quota admission counts it: the
/// barrier's native sidecar beside the pod's container for the pod's whole
/// life (1 + 0.5 CPU, 256Mi + 64Mi), the lock's init container only while
/// it runs (0.5 beside the sidecar's 0.5: less than that).
#[tokio::test]
async fn a_sidecar_and_lock_pod_adds_to_its_quota_what_the_docs_say() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let quotas = limits_quota(&h).await;
    let controller = h.controller(&zk).await;
    h.barrier("train", 2).await;
    h.locklease("db", json!({})).await;
    let mut pod = limited(sidecar_pod_of("train"));
    pod["metadata"]["labels"]["zkgate.io/lock"] = json!("db");
    let admitted = h.create_pod(pod).await.expect("admitted");
    let inits: Vec<String> = admitted
        .spec
        .unwrap()
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(
        inits,
        ["zkgate-barrier", "zkgate-lock"],
        "the order counted"
    );
    let used = eventually(WITHIN, "the quota's use counted", || async {
        let quota = quotas.get("limits-required").await.ok()?;
        let used = quota.status?.used?;
        (used.get("limits.cpu")?.0 != "0").then_some(used)
    })
    .await;
    let of = |key: &str| used.get(key).map(|q| q.0.clone()).unwrap_or_default();
    assert_eq!(
        (of("limits.cpu"), of("limits.memory")),
        ("1500m".to_owned(), "320Mi".to_owned())
    );
    // Requests: the container gave none but its limits (which default
    // them), the sidecar 10m and 16Mi.
    assert_eq!(
        (of("requests.cpu"), of("requests.memory")),
        ("1010m".to_owned(), "272Mi".to_owned())
    );
    drop(controller);
    h.done().await;
}

/// A LimitRange whose `max.cpu` is below the injected containers' CPU limit
/// refuses labelled pods, naming the maximum and the limit (as the docs
/// say); told a limit within it, the controller's pods are admitted.
#[tokio::test]
async fn a_limit_range_below_the_participants_limit_refuses_them_until_told_one_within() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let ranges: Api<k8s_openapi::api::core::v1::LimitRange> =
        Api::namespaced(h.client.clone(), &h.ns);
    let range = serde_json::from_value(json!({
        "metadata": { "name": "small" },
        "spec": { "limits": [{ "type": "Container", "max": { "cpu": "250m" } }] }
    }))
    .unwrap();
    ranges.create(&PostParams::default(), &range).await.unwrap();
    let own = |name: &str| {
        let mut pod = pod_of(name, json!({ "zkgate.io/barrier": "train" }));
        pod["spec"]["containers"][0]["resources"] = json!({ "limits": { "cpu": "200m" } });
        pod
    };
    let mut controller = h.controller(&zk).await;
    h.barrier("train", 2).await;
    let refused = h.create_pod(own("by-default")).await.expect_err("refused");
    let message = refused.to_string();
    assert!(
        message.contains("maximum cpu") && message.contains("250m") && message.contains("500m"),
        "{message}"
    );
    // Gone before the next listens on its port (a dying one still
    // accepting would pass the wait for the next).
    controller.kill().await;
    let within =
        r#"{"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"cpu":"200m","memory":"64Mi"}}"#;
    let controller = h
        .controller_and(&zk, &["--participant-resources", within])
        .await;
    h.create_pod(own("told"))
        .await
        .expect("admitted with a limit within the range");
    drop(controller);
    h.done().await;
}

/// Issue 46, item 3: what a platform team sets once for every tenant. The
/// pull secrets the controller is told go into each pod it injects
/// containers into (once: a pod naming one keeps its own entry); the
/// Barriers it makes for labelled Jobs wait at most the default timeout
/// it is told, or what a Job's pod template says. Bad values are refused:
/// the annotation at admission, the flags when the controller starts.
#[tokio::test]
async fn pull_secrets_and_the_run_barriers_timeout_are_set_once_for_every_tenant() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h
        .controller_and(
            &zk,
            &[
                "--participant-image-pull-secrets",
                "registry,mirror",
                "--run-barrier-timeout",
                "30m",
            ],
        )
        .await;
    h.barrier("train", 2).await;

    let mut pod = pod_of("pulled", json!({ "zkgate.io/barrier": "train" }));
    pod["spec"]["imagePullSecrets"] = json!([{ "name": "registry" }, { "name": "own" }]);
    let admitted = h.create_pod(pod).await.expect("admitted");
    let names: Vec<String> = admitted
        .spec
        .unwrap()
        .image_pull_secrets
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["registry", "own", "mirror"]);
    // No container injected (a pod that carries zkgate already): none added.
    let mut by_hand = pod_of("by-hand", json!({ "zkgate.io/barrier": "train" }));
    by_hand["spec"]["initContainers"] = json!([{ "name": "zkgate-barrier", "image": IMAGE }]);
    let admitted = h.create_pod(by_hand).await.expect("admitted");
    assert_eq!(admitted.spec.unwrap().image_pull_secrets, None);

    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    for (name, annotations) in [
        ("by-default", json!({})),
        ("told", json!({ "zkgate.io/barrier-timeout": "5m" })),
        // The default is not theirs: rounds are timed each, and a gang
        // waiting for others waits their run out.
        (
            "in-rounds",
            json!({ "zkgate.io/on-participant-loss": "RestartGang" }),
        ),
        ("after-others", json!({ "zkgate.io/after": "by-default" })),
        (
            "in-rounds-told",
            json!({ "zkgate.io/on-participant-loss": "RestartGang", "zkgate.io/barrier-timeout": "2h" }),
        ),
    ] {
        let job: Job = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "parallelism": 2, "completions": 2,
                "template": {
                    "metadata": { "labels": { "zkgate.io/barrier": name }, "annotations": annotations },
                    "spec": { "restartPolicy": "Never", "containers": [{ "name": "worker", "image": "busybox" }] }
                }
            }
        }))
        .unwrap();
        jobs.create(&PostParams::default(), &job).await.unwrap();
    }
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    for (name, timeout) in [
        ("by-default", Some("30m")),
        ("told", Some("5m")),
        ("in-rounds", None),
        ("after-others", None),
        ("in-rounds-told", Some("2h")),
    ] {
        let made = eventually(WITHIN, "the Job's Barrier", || async {
            barriers.get_opt(name).await.ok().flatten()
        })
        .await;
        assert_eq!(made.spec.timeout.as_deref(), timeout, "{name}");
    }

    let refused = h
        .create_pod(annotated_pod(
            "zero",
            "train",
            json!({ "zkgate.io/barrier-timeout": "0s" }),
        ))
        .await
        .expect_err("refused");
    let message = refused.to_string();
    assert!(
        message.contains("zkgate.io/barrier-timeout") && message.contains("not zero"),
        "{message}"
    );
    drop(controller);

    for (flag, bad, says) in [
        (
            "--participant-image-pull-secrets",
            "registry,Mirror",
            "no Secret name",
        ),
        ("--run-barrier-timeout", "0s", "not zero"),
    ] {
        let stderr = controller_refuses(&zk, flag, bad);
        assert!(
            stderr.contains(says) && stderr.contains(flag),
            "{flag} {bad}: {stderr}"
        );
    }
    h.done().await;
}

/// A label naming no valid resource is refused, with the reason.
#[tokio::test]
async fn a_bad_label_is_refused_with_the_reason() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let refused = h
        .create_pod(pod_of(
            "member",
            json!({ "zkgate.io/lock": "db", "zkgate.io/lock-mode": "shared" }),
        ))
        .await
        .expect_err("refused");
    let message = refused.to_string();
    assert!(
        message.contains("zkgate.io/lock-mode") && message.contains("read or write"),
        "{message}"
    );
    // Every supported API server runs native sidecars: the sidecar form is
    // an init container that restarts Always, its startup probe gating the
    // worker.
    h.barrier("train", 1).await;
    let sidecar = h
        .create_pod(sidecar_pod_of("train"))
        .await
        .expect("the sidecar form, where the server runs native sidecars");
    let inits = sidecar.spec.unwrap().init_containers.unwrap();
    let gate = inits
        .iter()
        .find(|c| {
            c.args
                .as_ref()
                .is_some_and(|a| a[..2] == ["barrier", "sidecar"])
        })
        .expect("a barrier sidecar");
    assert_eq!(gate.restart_policy.as_deref(), Some("Always"), "{gate:?}");
    assert!(gate.startup_probe.is_some(), "{gate:?}");
    assert_eq!(
        controller
            .metric("zkgate_webhook_admissions_total{outcome=\"refused\"}")
            .await,
        Some(1.0)
    );
    drop(controller);
    h.done().await;
}

/// Issue 25, item 7: a labelled pod that would wait for something nobody
/// makes is refused at admission, with a message that says what is
/// missing: a LockLease that does not exist; a Barrier that does not exist
/// for a pod of no Job; a Barrier that does not exist for a pod whose Job
/// does not carry the label (or does not exist). A pod whose Job carries
/// the label is admitted: the controller makes that Job's Barrier.
#[tokio::test]
async fn a_pod_naming_what_does_not_exist_is_refused_with_the_reason() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let refusal = |e: kube::Error| e.to_string();
    let no_lock = refusal(
        h.create_pod(pod_of("locked", json!({ "zkgate.io/lock": "nosuch" })))
            .await
            .expect_err("no LockLease nosuch"),
    );
    assert!(
        no_lock.contains("LockLease")
            && no_lock.contains("nosuch")
            && no_lock.contains("does not exist"),
        "{no_lock}"
    );
    let no_barrier = refusal(
        h.create_pod(pod_of("gang-0", json!({ "zkgate.io/barrier": "nosuch" })))
            .await
            .expect_err("no Barrier nosuch"),
    );
    assert!(
        no_barrier.contains("Barrier")
            && no_barrier.contains("nosuch")
            && no_barrier.contains("no Job"),
        "{no_barrier}"
    );
    // `kubectl zkgate doctor`'s probe names no Barrier that exists: as a
    // dry run (stored nowhere) it is injected, so the doctor sees the
    // webhook answer; the same pod for real is refused as any other.
    let mut probe = pod_of("probe", json!({ "zkgate.io/barrier": "nosuch" }));
    probe["metadata"]["annotations"] = json!({ "zkgate.io/doctor-probe": "true" });
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probed = h
        .pods()
        .create(&dry_run, &serde_json::from_value(probe.clone()).unwrap())
        .await
        .expect("the doctor's dry-run probe is admitted");
    assert!(
        probed
            .spec
            .unwrap()
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == "zkgate-barrier"),
        "the probe was not injected"
    );
    let real = refusal(
        h.create_pod(probe)
            .await
            .expect_err("the probe's annotation is no pass for a real pod"),
    );
    assert!(real.contains("nosuch") && real.contains("no Job"), "{real}");
    // A pod written by hand (its own zkgate container, so nothing is
    // injected), with or without the credentials label, is checked too.
    // Review: it was admitted before, and waited for a lock nobody makes.
    for labels in [
        json!({ "zkgate.io/lock": "nosuch" }),
        json!({ "zkgate.io/lock": "nosuch", "zkgate.io/credentials": "true" }),
    ] {
        let mut by_hand = pod_of("by-hand", labels.clone());
        by_hand["spec"]["containers"] = json!([{
            "name": "zkgate-lock", "image": "registry.test/zkgate:test",
            "args": ["lock", "acquire", "nosuch"]
        }]);
        let refused = refusal(
            h.create_pod(by_hand)
                .await
                .expect_err("a pod with zkgate of its own naming no LockLease"),
        );
        assert!(
            refused.contains("nosuch") && refused.contains("does not exist"),
            "{labels}: {refused}"
        );
    }
    // A Job whose template does not carry the label: nobody makes the Barrier.
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": { "name": "unlabelled" },
        "spec": { "template": { "spec": { "restartPolicy": "Never", "containers": [{ "name": "w", "image": "busybox" }] } } }
    }))
    .unwrap();
    let job = jobs.create(&PostParams::default(), &job).await.unwrap();
    let mut pod = pod_of("unlabelled-0", json!({ "zkgate.io/barrier": "nosuch" }));
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "unlabelled",
        "uid": job.uid().unwrap(), "controller": true
    }]);
    let unlabelled = refusal(
        h.create_pod(pod)
            .await
            .expect_err("its Job makes no Barrier"),
    );
    assert!(
        unlabelled.contains("unlabelled") && unlabelled.contains("does not carry the label"),
        "{unlabelled}"
    );
    assert!(
        h.pods()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was admitted"
    );
    drop(controller);
    h.done().await;
}

/// The certificate the webhook serves, verified against `ca` for 127.0.0.1.
async fn served_certificate(port: u16, ca: &[u8]) -> Vec<u8> {
    let tls = Endpoint::loopback(port).connect(ca).await;
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// POSTs `review` to the webhook as anyone in the cluster could (no client
/// certificate; the server verified against `ca`): the HTTP status and the
/// response body.
async fn post_review(port: u16, ca: &[u8], review: &serde_json::Value) -> (u16, String) {
    post(port, ca, "/mutate", "", &review.to_string()).await
}

/// POSTs `body` to `path` on the webhook's port on loopback.
async fn post(port: u16, ca: &[u8], path: &str, headers: &str, body: &str) -> (u16, String) {
    Endpoint::loopback(port).post(ca, path, headers, body).await
}

/// Issue 25, item 1: anyone who can reach the webhook's port can POST an
/// AdmissionReview of their own making. One naming a labelled pod of a Job
/// that does not exist must make nothing: no Barrier (with the name and
/// the Job the caller chose), no Secret. Admission is a pure function of
/// the request and what the API server says.
#[tokio::test]
async fn a_forged_admission_review_creates_nothing() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), &h.ns);
    let ca = secrets.get(SECRET).await.unwrap().data.unwrap()["ca.crt"]
        .0
        .clone();
    let secret_names = || h.secret_names();
    let before = secret_names().await;
    let mut pod = pod_of("forged-0", json!({ "zkgate.io/barrier": "forged" }));
    pod["metadata"]["namespace"] = json!(h.ns);
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "ghost",
        "uid": "00000000-0000-0000-0000-000000000001", "controller": true
    }]);
    let review = support::https::pod_creation_review(
        &h.ns,
        "forged-0",
        "system:serviceaccount:tenant:default",
        pod,
    );
    let (status, body) = post_review(h.port, &ca, &review).await;
    assert_eq!(status, 200, "{body}");
    // The response is written after anything admission does: what it made
    // is there now.
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    assert!(
        barriers.get_opt("forged").await.unwrap().is_none(),
        "a forged review made the Barrier 'forged' for a Job that does not exist ({body})"
    );
    assert_eq!(
        before,
        secret_names().await,
        "a forged review wrote a Secret"
    );
    drop(controller);
    h.done().await;
}

const EXPIRY: &str = "zkgate_webhook_certificate_expiry_timestamp_seconds";

/// When the leaf of `pem` expires, Unix seconds (as exported).
fn not_after(pem: &[u8]) -> f64 {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    pem.parse_x509().unwrap().validity().not_after.timestamp() as f64
}

fn pem_der(pem: &[u8]) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem)
        .unwrap()
        .to_vec()
}

/// Asked for by annotation, a new serving certificate is made, served
/// without a restart, and admission goes on working (the CA stays).
#[tokio::test]
async fn a_rotated_certificate_is_served_and_admission_keeps_working() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), &h.ns);
    let field = |s: &Secret, key: &str| s.data.as_ref().unwrap()[key].0.clone();
    let before = secrets.get(SECRET).await.unwrap();
    let ca = field(&before, "ca.crt");
    assert_eq!(
        served_certificate(h.port, &ca).await,
        pem_der(&field(&before, "tls.crt"))
    );
    // What the certificate-expiry alert reads: the served one's end.
    assert_eq!(
        controller.metric(EXPIRY).await,
        Some(not_after(&field(&before, "tls.crt"))),
        "the expiry exported is not the served certificate's"
    );

    let ask = json!({ "metadata": { "annotations": { "zkgate.io/rotate": "now" } } });
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    let after = eventually(WITHIN, "a new serving certificate", || async {
        let s = secrets.get(SECRET).await.ok()?;
        (field(&s, "tls.crt") != field(&before, "tls.crt")
            && !s.annotations().contains_key("zkgate.io/rotate"))
        .then_some(s)
    })
    .await;
    assert_eq!(field(&after, "ca.crt"), ca, "the CA (the caBundle) stays");
    let new = pem_der(&field(&after, "tls.crt"));
    eventually(WITHIN, "the new certificate served", || async {
        (served_certificate(h.port, &ca).await == new).then_some(())
    })
    .await;
    assert_eq!(
        controller.metric(EXPIRY).await,
        Some(not_after(&field(&after, "tls.crt"))),
        "the expiry exported is not the rotated certificate's"
    );
    h.barrier("train", 1).await;
    let admitted = h
        .create_pod(pod_of(
            "after-rotation",
            json!({ "zkgate.io/barrier": "train" }),
        ))
        .await
        .expect("admission works across the rotation");
    assert_eq!(admitted.spec.unwrap().init_containers.unwrap().len(), 1);
    drop(controller);
    h.done().await;
}

/// A CA of the test's own (standing in for cert-manager's issuer), and a
/// way to issue it leaves for 127.0.0.1: (certificate, key) PEMs.
fn test_ca() -> (String, impl Fn() -> (String, String)) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test issuer");
    let ca = params.self_signed(&key).unwrap().pem();
    let issuer = Issuer::new(params, key);
    let issue = move || {
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::default();
        leaf.subject_alt_names = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    (ca, issue)
}

/// Writes a leaf as a mounted Secret changes: each file replaced whole.
fn write_leaf(dir: &std::path::Path, (cert, key): &(String, String)) {
    for (name, pem) in [("tls.key", key), ("tls.crt", cert)] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, pem).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// Certificates kept by someone else (cert-manager, its CA injector filling
/// the caBundle): the controller serves the mounted files, and their
/// renewal without a restart.
#[tokio::test]
async fn a_certificate_from_a_directory_is_served_and_its_renewal_picked_up() {
    let h = Hooked::new().await;
    let (ca, issue) = test_ca();
    let api: Api<MutatingWebhookConfiguration> = Api::all(h.client.clone());
    let mut config = api.get(&h.configuration).await.unwrap();
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle = Some(k8s_openapi::ByteString(ca.clone().into_bytes()));
    }
    api.replace(&h.configuration, &PostParams::default(), &config)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first = issue();
    write_leaf(dir.path(), &first);
    let zk = isolated_connect();
    let controller = h
        .controller_with(&zk, &["--webhook-cert-dir", dir.path().to_str().unwrap()])
        .await;
    assert_eq!(
        served_certificate(h.port, ca.as_bytes()).await,
        pem_der(first.0.as_bytes())
    );
    h.barrier("train", 1).await;
    let admitted = h
        .create_pod(pod_of("before", json!({ "zkgate.io/barrier": "train" })))
        .await
        .expect("admitted with the mounted certificate");
    assert_eq!(admitted.spec.unwrap().init_containers.unwrap().len(), 1);

    let renewed = issue();
    write_leaf(dir.path(), &renewed);
    eventually(
        Duration::from_secs(75),
        "the renewed certificate served",
        || async {
            (served_certificate(h.port, ca.as_bytes()).await == pem_der(renewed.0.as_bytes()))
                .then_some(())
        },
    )
    .await;
    let admitted = h
        .create_pod(pod_of("after", json!({ "zkgate.io/barrier": "train" })))
        .await
        .expect("admitted with the renewed certificate");
    assert_eq!(admitted.spec.unwrap().init_containers.unwrap().len(), 1);
    drop(controller);
    h.done().await;
}

/// A controller limited to one namespace leaves the labelled pods of
/// another as they are (nothing would reconcile their Barrier) and makes
/// no Barrier there.
#[tokio::test]
async fn pods_outside_the_watched_namespace_are_left_alone() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    // Another namespace the API server also sends to this webhook.
    let other = namespace(&h.client).await;
    let label = json!({ "metadata": { "labels": { "zkgate-webhook-test": h.ns } } });
    Api::<Namespace>::all(h.client.clone())
        .patch(&other, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let pod: Pod =
        serde_json::from_value(pod_of("elsewhere", json!({ "zkgate.io/barrier": "train" })))
            .unwrap();
    let admitted = Api::<Pod>::namespaced(h.client.clone(), &other)
        .create(&PostParams::default(), &pod)
        .await
        .expect("admitted as it is");
    assert!(admitted.spec.unwrap().init_containers.is_none());
    assert_eq!(
        controller
            .metric("zkgate_webhook_admissions_total{outcome=\"unchanged\"}")
            .await,
        Some(1.0),
        "it did reach the webhook"
    );
    drop(controller);
    h.done().await;
}

/// Runs `container` of the admitted `pod` as the kubelet would, with the
/// zkgate binary for its image: its volumes materialised in a temporary
/// directory (a Secret's keys as files, an emptyDir empty), its variables
/// resolved from the pod (downward API) and Secrets, nothing else in its
/// environment. Returns the exit code and standard error.
async fn run_as_the_kubelet(
    client: &kube::Client,
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> (i32, String) {
    use std::os::unix::fs::PermissionsExt;
    let ns = pod.namespace().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let root = tempfile::tempdir().unwrap();
    // The container's user must get through to its volumes and binary.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let security = container.security_context.as_ref();
    let (uid, gid) = (
        security.and_then(|s| s.run_as_user),
        security.and_then(|s| s.run_as_group),
    );
    assert!(
        pod.spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
            .is_none(),
        "this stand-in for the kubelet does not apply an fsGroup"
    );
    let volumes = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .clone()
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let dir = root.path().join(&mount.name);
        std::fs::create_dir_all(&dir).unwrap();
        let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
        if let Some(projected) = &volume.projected {
            // As the kubelet projects a ServiceAccount token: the pod's
            // account's, for the audience asked, a root-owned file of the
            // volume's mode.
            let mode = projected.default_mode.unwrap_or(0o644) as u32;
            for source in projected.sources.iter().flatten() {
                let Some(projection) = &source.service_account_token else {
                    panic!("unexpected projection {source:?}");
                };
                let account = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .expect("a pod with a projected token names its ServiceAccount");
                let token = support::handout::token_of(
                    client,
                    &ns,
                    &account,
                    projection.audience.as_deref().unwrap(),
                )
                .await;
                let file = dir.join(&projection.path);
                std::fs::write(&file, token).unwrap();
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        if let Some(source) = &volume.secret {
            let secret = secrets
                .get(source.secret_name.as_deref().unwrap())
                .await
                .expect("the Secret the volume names");
            // As the kubelet writes a Secret volume: root-owned files of
            // the volume's mode (0644 when it sets none).
            let mode = source.default_mode.unwrap_or(0o644) as u32;
            for (key, value) in secret.data.unwrap_or_default() {
                let file = dir.join(key);
                std::fs::write(&file, value.0).unwrap();
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        mounts.push((mount.mount_path.clone(), dir));
    }
    let in_container = |value: &str| {
        mounts
            .iter()
            .find_map(|(path, dir)| {
                let rest = value.strip_prefix(path.as_str())?;
                Some(format!("{}{rest}", dir.display()))
            })
            .unwrap_or_else(|| value.to_owned())
    };
    // The image's binary, where the container's user can run it.
    let binary = root.path().join("zkgate");
    std::fs::copy(env!("CARGO_BIN_EXE_zkgate"), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = tokio::process::Command::new(&binary);
    // As the container's user (the test runs as root, as the kubelet does).
    if let Some(uid) = uid {
        cmd.uid(uid as u32);
    }
    if let Some(gid) = gid {
        cmd.gid(gid as u32);
    }
    cmd.env_clear()
        .args(container.args.iter().flatten())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // The binary's default token path, where this stand-in put the token
    // (a real container sees it at that path).
    let token_file = in_container(zkgate::handout::TOKEN_FILE);
    if token_file != zkgate::handout::TOKEN_FILE {
        cmd.env("ZKGATE_CREDENTIALS_TOKEN_FILE", token_file);
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => in_container(v),
            (None, Some(from)) if from.field_ref.is_some() => {
                match from.field_ref.as_ref().unwrap().field_path.as_str() {
                    "metadata.name" => pod.name_any(),
                    "metadata.namespace" => ns.clone(),
                    "metadata.uid" => pod.uid().unwrap(),
                    other => panic!("unexpected field {other}"),
                }
            }
            (None, Some(from)) if from.secret_key_ref.is_some() => {
                let key = from.secret_key_ref.as_ref().unwrap();
                let secret = secrets.get(&key.name).await.unwrap();
                String::from_utf8(secret.data.unwrap()[&key.key].0.clone()).unwrap()
            }
            other => panic!("unexpected variable {}: {other:?}", var.name),
        };
        cmd.env(&var.name, value);
    }
    let out = tokio::time::timeout(WITHIN, cmd.output())
        .await
        .expect("the container finished")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 25, items 2, 4 and 5: over a ZooKeeper reached by TLS with client
/// certificates, a labelled pod is given no Secret: its injected container,
/// run with only what the pod gives it (a projected token, the handout's
/// address and CA), asks the controller, gets the server CA and a client
/// certificate of its namespace's own (never the controller's identity),
/// and passes the barrier. Nothing is written to the namespace.
#[tokio::test]
async fn over_tls_the_injected_container_gets_working_zookeeper_certificates() {
    use support::tls::TlsZooKeeper;
    let tls = tokio::task::spawn_blocking(TlsZooKeeper::start)
        .await
        .unwrap();
    let zk = format!("{}/webhook-tls", tls.address);
    let h = Hooked::new().await;
    let (ca, cert, key) = (
        tls.path("ca.crt"),
        tls.path("client.crt"),
        tls.path("client.key"),
    );
    // Participants' certificates are issued from the CA the ensemble
    // trusts (the test's one).
    let mut args = tls.controller_args();
    for (option, file) in [
        ("--participant-ca-cert", "ca.crt"),
        ("--participant-ca-key", "ca.key"),
    ] {
        args.push(option.to_owned());
        args.push(tls.path(file).to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let controller = h.controller_and(&zk, &args).await;
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    support::kube::barrier_waiting(&barriers, "solo", 1, WITHIN).await;
    let secret_names = || h.secret_names();
    assert_eq!(secret_names().await, [SECRET], "only the webhook's own");

    let pod = h
        .create_pod(pod_of("solo-0", json!({ "zkgate.io/barrier": "solo" })))
        .await
        .expect("admitted");
    let init = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    for var in [
        "ZKGATE_TLS_CA",
        "ZKGATE_TLS_CERT",
        "ZKGATE_TLS_KEY",
        "ZKGATE_AUTH",
    ] {
        assert!(env(init, var).is_none(), "{var} in the pod spec");
    }
    assert_eq!(
        env(init, "ZKGATE_CREDENTIALS_URL").and_then(|e| e.value.clone()),
        Some(h.handout_url())
    );
    let (code, err) = run_as_the_kubelet(&h.client, &pod, init).await;
    assert_eq!(code, 0, "the injected container passes the barrier: {err}");
    eventually(
        WITHIN,
        "the Barrier open with its one participant",
        || async {
            let status = barriers.get("solo").await.ok()?.status?;
            (status.entered == 1 && status.phase == Some(zkgate::api::BarrierPhase::Open))
                .then_some(())
        },
    )
    .await;

    // What the pod was handed: the server CA and the namespace's own
    // certificate, never the controller's.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(
        &token_file,
        support::handout::token_of(&h.client, &h.ns, "default", zkgate::handout::AUDIENCE).await,
    )
    .unwrap();
    let handed = zkgate::handout::Source {
        urls: vec![h.handout_url()],
        server_name: None,
        ca: String::from_utf8(h.ca().await).unwrap(),
        token_file,
    }
    .fetch(Some(WITHIN))
    .await
    .expect("a handout");
    let handed = handed.tls.expect("TLS material");
    assert_eq!(
        handed.ca.as_bytes(),
        std::fs::read(&ca).unwrap(),
        "the server CA"
    );
    let (handed_cert, handed_key) = (handed.cert.unwrap(), handed.key.unwrap());
    assert_ne!(
        handed_key.as_bytes(),
        std::fs::read(&key).unwrap(),
        "the controller's own client key was handed to the namespace"
    );
    assert_ne!(handed_cert.as_bytes(), std::fs::read(&cert).unwrap());
    let der = pem_der(handed_cert.as_bytes());
    let named = format!("zkgate-participant.{}", h.ns);
    assert!(
        der.windows(named.len()).any(|w| w == named.as_bytes()),
        "the participant certificate names its namespace ({named})"
    );
    assert_eq!(
        secret_names().await,
        [SECRET],
        "nothing was written to the namespace"
    );
    drop(controller);
    h.done().await;
}

/// Issue 25, item 4: the handout gives a caller its namespace's credential
/// only when the API server vouches for a token made for zkgate that names
/// a ServiceAccount of that namespace: no token, a made-up one, one made
/// for the API server, or another namespace's are refused; the namespace's
/// own gets the credential that opens its nodes, and no Secret holds it.
/// Issue 27, item 2: the Barrier made for a Job whose pod template asks for
/// RestartGang has it, with the template's `max-restarts`, or else the
/// Job's `backoffLimit` (a wrapped command fails inside its container,
/// where the Job's own limit never sees it).
#[tokio::test]
async fn a_jobs_restart_gang_annotations_make_its_barrier_restart_bounded() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let _controller = h.controller(&zk).await;
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    for (name, annotations, backoff, wanted) in [
        (
            "given",
            json!({ "zkgate.io/on-participant-loss": "RestartGang", "zkgate.io/max-restarts": "2" }),
            4,
            Some(2),
        ),
        (
            "defaulted",
            json!({ "zkgate.io/on-participant-loss": "RestartGang" }),
            4,
            Some(4),
        ),
        ("plain", json!({}), 4, None),
    ] {
        let job: Job = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "parallelism": 2,
                "backoffLimit": backoff,
                "template": {
                    "metadata": { "labels": { "zkgate.io/barrier": name }, "annotations": annotations },
                    "spec": { "restartPolicy": "Never", "containers": [{ "name": "worker", "image": "busybox", "command": ["true"] }] }
                }
            }
        }))
        .unwrap();
        jobs.create(&PostParams::default(), &job).await.unwrap();
        let barrier = eventually(WITHIN, "the Job's Barrier", || async {
            barriers.get_opt(name).await.ok()?
        })
        .await;
        assert_eq!(barrier.spec.max_restarts, wanted, "{name}");
        assert_eq!(
            barrier.spec.on_participant_loss == zkgate::api::OnParticipantLoss::RestartGang,
            wanted.is_some(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_handout_gives_a_pod_its_own_namespaces_credential_and_nothing_else() {
    use support::handout::token;
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller_auth = "zkgate-controller:handout-test";
    let controller = h.controller_and(&zk, &["--auth", controller_auth]).await;
    // The namespace's credential is made at its first reconcile (and the
    // barrier node, which the probe below registers under, with it).
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    support::kube::barrier_waiting(&barriers, "gang", 1, WITHIN).await;

    let (status, body) = h.ask_handout(None).await;
    assert_eq!(status, 401, "no token: {body}");
    let (status, body) = h.ask_handout(Some("made-up")).await;
    assert_eq!(status, 401, "a made-up token: {body}");
    let for_the_api = token(&h.client, &h.ns, "https://kubernetes.default.svc").await;
    let (status, body) = h.ask_handout(Some(&for_the_api)).await;
    assert_eq!(status, 401, "a token made for the API server: {body}");
    let other = namespace(&h.client).await;
    let (status, body) = h
        .ask_handout(Some(
            &token(&h.client, &other, zkgate::handout::AUDIENCE).await,
        ))
        .await;
    assert_eq!(
        status, 403,
        "another namespace's token (this controller serves one): {body}"
    );

    let own = token(&h.client, &h.ns, zkgate::handout::AUDIENCE).await;
    let asked = std::sync::atomic::AtomicU32::new(0);
    let body = eventually(WITHIN, "the namespace's credential handed out", || async {
        asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (status, body) = h.ask_handout(Some(&own)).await;
        (status == 200).then_some(body)
    })
    .await;
    // Each answer counted by its outcome: the four bad tokens refused, the
    // namespace's own granted once it was (an ask before its credential was
    // made is counted as what it got).
    let serving = &controller;
    let outcome = |o: &'static str| {
        let name = format!("zkgate_handout_requests_total{{outcome=\"{o}\"}}");
        async move { serving.metric(&name).await.unwrap_or(-1.0) }
    };
    let (refused, granted, failed) = (
        outcome("refused").await,
        outcome("granted").await,
        outcome("failed").await,
    );
    assert_eq!(granted, 1.0, "one ask granted");
    assert!(refused >= 4.0, "the four bad tokens refused: {refused}");
    assert_eq!(
        refused + granted + failed,
        4.0 + f64::from(asked.load(std::sync::atomic::Ordering::Relaxed)),
        "every answer counted once (refused {refused}, granted {granted}, failed {failed})"
    );
    let handout: zkgate::handout::Handout = serde_json::from_str(&body).unwrap();
    assert_eq!(handout.namespace, h.ns);
    let credential = zkgate::zk::Credential::parse(&handout.auth.unwrap()).unwrap();
    assert_ne!(
        credential,
        zkgate::zk::Credential::parse(controller_auth).unwrap()
    );
    let mut options = support::options(&zk);
    options.credential = Some(credential);
    let pod = zkgate::zk::Session::connect(&options).await.unwrap();
    let member = format!("/zkgate/namespaces/{}/barriers/gang/probe", h.ns);
    pod.client()
        .create(
            &member,
            b"{}",
            &zookeeper_client::CreateMode::Ephemeral.with_acls(pod.node_acls()),
        )
        .await
        .expect("the handed-out credential opens the namespace's barrier");
    assert_eq!(
        h.secret_names().await,
        [SECRET],
        "no Secret holds the credential"
    );
    drop(controller);
    h.done().await;
}

/// Issue 24, item 15: with the API server down, the certificate keeper
/// retries with a backoff instead of spinning (and flooding the log), and
/// once the API server is back it keeps the certificate again (a rotation
/// asked for is done). On an API server of the test's own, which it
/// crashes. Failed before the fix: thousands of "cannot renew" warnings in
/// the window (the Secret's watch, without a backoff, ended at once on
/// every poll and each end was a renewal attempt).
#[tokio::test]
async fn with_the_api_server_down_the_certificate_keeper_backs_off() {
    let api = tokio::task::spawn_blocking(support::kube::PrivateApiServer::start)
        .await
        .unwrap();
    let kubeconfig = api.kubeconfig();
    let client = support::kube::client_of(&kubeconfig).await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let zk = isolated_connect();
    let (_controller, mut log) = ControllerProcess::start_logged(
        &kubeconfig,
        &zk,
        "controller-0",
        &[
            "--watch-namespace",
            &ns,
            "--webhook-addr",
            &addr,
            "--image",
            IMAGE,
            "--webhook-names",
            "127.0.0.1",
            "--webhook-secret",
            SECRET,
            "--webhook-secret-namespace",
            &ns,
        ],
    );
    // The log is read all along (a full pipe would stall the controller).
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok(Some(line)) = log.next_line().await {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    eventually(WITHIN, "the webhook listening", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    while lines.try_recv().is_ok() {}

    api.crash();
    // A fixed window, as a rate is measured: how many renewal attempts
    // fail in it.
    const WINDOW: Duration = Duration::from_secs(6);
    let end = tokio::time::Instant::now() + WINDOW;
    let mut failed = 0usize;
    while let Ok(Some(line)) = tokio::time::timeout_at(end, lines.recv()).await {
        if line.contains("cannot renew the webhook certificate") {
            failed += 1;
        }
    }
    assert!(
        (1..=8).contains(&failed),
        "{failed} failed renewal attempts in {WINDOW:?} with the API server down: expected a few, backing off"
    );

    let api = tokio::task::spawn_blocking(move || {
        api.restart();
        api
    })
    .await
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let before = secrets.get(SECRET).await.unwrap();
    let field = |s: &Secret, key: &str| s.data.as_ref().unwrap()[key].0.clone();
    let ask = json!({ "metadata": { "annotations": { "zkgate.io/rotate": "now" } } });
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(90),
        "a rotation done once the API server is back",
        || async {
            let s = secrets.get(SECRET).await.ok()?;
            (field(&s, "tls.crt") != field(&before, "tls.crt")).then_some(())
        },
    )
    .await;
    drop(api);
}

/// A pod's form must take part in the rounds its Barrier has, or not:
/// a Barrier that restarts its gang (`RestartGang`) refuses, at admission,
/// a pod whose injected participant would be the init container (it
/// would be refused by the barrier at run time, exit 2, after its pod was
/// scheduled); a pod that asks for `RestartGang` is refused by a Barrier
/// made without it (it would never restart), each with the reason. The
/// wrap form is admitted to both.
#[tokio::test]
async fn a_pods_form_must_agree_with_its_barriers_rounds() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let controller = h.controller(&zk).await;
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    for (name, policy) in [("rounds", "RestartGang"), ("plain", "Wait")] {
        let barrier: Barrier = serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
            "metadata": { "name": name },
            "spec": { "participants": 2, "onParticipantLoss": policy }
        }))
        .unwrap();
        barriers
            .create(&PostParams::default(), &barrier)
            .await
            .unwrap();
    }
    let pod = annotated_pod;
    let refused = |e: kube::Error| e.to_string();
    let init = refused(
        h.create_pod(pod("init", "rounds", json!({})))
            .await
            .expect_err("the init form on a Barrier in rounds"),
    );
    assert!(
        init.contains("rounds") && init.contains("RestartGang") && init.contains("wrap"),
        "{init}"
    );
    let asks = refused(
        h.create_pod(pod(
            "asks",
            "plain",
            json!({ "zkgate.io/on-participant-loss": "RestartGang" }),
        ))
        .await
        .expect_err("RestartGang asked of a Barrier made without it"),
    );
    assert!(
        asks.contains("plain") && asks.contains("RestartGang") && asks.contains("Wait"),
        "{asks}"
    );
    let plain_sidecar = refused(
        h.create_pod(pod(
            "plain-sidecar",
            "rounds",
            json!({ "zkgate.io/barrier-form": "sidecar" }),
        ))
        .await
        .expect_err("the sidecar form without RestartGang on a Barrier in rounds"),
    );
    assert!(
        plain_sidecar.contains("rounds") && plain_sidecar.contains("RestartGang"),
        "{plain_sidecar}"
    );
    // The sidecar form in rounds, where the cluster restarts a pod's
    // containers in place (1.36+): admitted, and the API server keeps the
    // restart rules (its gate is on); refused on an older one, saying so.
    let version = h.client.apiserver_version().await.unwrap();
    let minor: u32 = version
        .minor
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap();
    let in_place = h
        .create_pod(pod(
            "in-place",
            "rounds",
            json!({ "zkgate.io/barrier-form": "sidecar", "zkgate.io/on-participant-loss": "RestartGang" }),
        ))
        .await;
    if minor >= 36 {
        let admitted = in_place.unwrap_or_else(|e| panic!("in-place refused: {e}"));
        let spec = admitted.spec.unwrap();
        let sidecar = spec
            .init_containers
            .iter()
            .flatten()
            .find(|c| c.name == "zkgate-barrier")
            .expect("the sidecar");
        let rules = sidecar.restart_policy_rules.clone().unwrap_or_default();
        assert_eq!(
            rules.first().map(|r| r.action.as_str()),
            Some("RestartAllContainers"),
            "the API server kept the sidecar's rule: {sidecar:?}"
        );
        let worker = &spec.containers[0];
        assert_eq!(worker.restart_policy.as_deref(), Some("Never"));
        assert!(worker.restart_policy_rules.is_some(), "{worker:?}");
        assert!(
            worker
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .is_some(),
            "{worker:?}"
        );
    } else {
        let e = refused(in_place.expect_err("no in-place restart before 1.36"));
        assert!(e.contains("1.36"), "{e}");
    }
    for (name, barrier, annotations) in [
        (
            "wrapped",
            "rounds",
            json!({ "zkgate.io/barrier-form": "wrap" }),
        ),
        (
            "restarting",
            "rounds",
            json!({ "zkgate.io/on-participant-loss": "RestartGang" }),
        ),
        (
            "wrapped-plain",
            "plain",
            json!({ "zkgate.io/barrier-form": "wrap" }),
        ),
    ] {
        h.create_pod(pod(name, barrier, annotations))
            .await
            .unwrap_or_else(|e| panic!("{name} refused: {e}"));
    }
    drop(controller);
    h.done().await;
}

/// Issue 28 by annotation: a labelled Job whose pod template says
/// `zkgate.io/after: workers` (and `zkgate.io/after-until`) gets a Barrier
/// that starts after `workers`; a bad stage, `after-until` alone, and
/// `after` with RestartGang are refused with the reason; a pod whose
/// `after` would close a cycle with the Barriers there now is refused,
/// naming it.
#[tokio::test]
async fn a_jobs_after_annotation_orders_its_barrier_and_a_cycle_is_refused() {
    let h = Hooked::new().await;
    let zk = isolated_connect();
    let _controller = h.controller(&zk).await;
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), &h.ns);
    let barriers: Api<Barrier> = Api::namespaced(h.client.clone(), &h.ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": { "name": "launcher" },
        "spec": {
            "parallelism": 1,
            "template": {
                "metadata": {
                    "labels": { "zkgate.io/barrier": "launcher" },
                    "annotations": { "zkgate.io/after": "workers, db", "zkgate.io/after-until": "Entered" }
                },
                "spec": { "restartPolicy": "Never", "containers": [{ "name": "launcher", "image": "busybox", "command": ["true"] }] }
            }
        }
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let barrier = eventually(WITHIN, "the Job's Barrier", || async {
        barriers.get_opt("launcher").await.ok()?
    })
    .await;
    let after: Vec<(String, zkgate::api::Until)> = barrier
        .spec
        .after
        .iter()
        .map(|a| (a.barrier.clone(), a.until))
        .collect();
    assert_eq!(
        after,
        [
            ("workers".to_owned(), zkgate::api::Until::Entered),
            ("db".to_owned(), zkgate::api::Until::Entered)
        ]
    );

    let pod = annotated_pod;
    let refused = |e: kube::Error| e.to_string();
    for (annotations, says) in [
        (
            json!({ "zkgate.io/after": "workers", "zkgate.io/after-until": "Started" }),
            "must be Entered, Open, Ready or Completed",
        ),
        (
            json!({ "zkgate.io/after-until": "Open" }),
            "only for zkgate.io/after",
        ),
        (
            json!({ "zkgate.io/after": "Workers" }),
            "must name at most 16 Barriers",
        ),
        (
            json!({ "zkgate.io/after": "workers", "zkgate.io/on-participant-loss": "RestartGang" }),
            "cannot be combined",
        ),
    ] {
        let why = refused(
            h.create_pod(pod("bad", "launcher", annotations.clone()))
                .await
                .expect_err("a bad after"),
        );
        assert!(why.contains(says), "{annotations}: {why}");
    }
    // workers after launcher, which starts after workers: a cycle.
    let mut workers = pod(
        "workers-0",
        "workers",
        json!({ "zkgate.io/after": "launcher" }),
    );
    let made: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "workers" }, "spec": { "participants": 1 }
    }))
    .unwrap();
    barriers
        .create(&PostParams::default(), &made)
        .await
        .unwrap();
    let cycle = refused(h.create_pod(workers.clone()).await.expect_err("a cycle"));
    assert!(cycle.contains("workers → launcher → workers"), "{cycle}");
    // An order the Barrier (made before, without it) does not have: it
    // would start at once, so the pod is refused.
    let other = refused(
        h.create_pod(pod("lonely", "workers", json!({ "zkgate.io/after": "db" })))
            .await
            .expect_err("an after the Barrier does not have"),
    );
    assert!(other.contains("was made to start after []"), "{other}");
    // Without the annotation, the same pod is admitted.
    workers["metadata"]["annotations"] = json!({});
    h.create_pod(workers).await.expect("admitted");
}
