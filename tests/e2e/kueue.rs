//! Issue 42, item 2: Kueue's real controller (its release built from the
//! Go module proxy, run beside the cluster by `scripts/workload-controllers`
//! with `waitForPodsReady` on) queues, admits, preempts and readmits a
//! labelled Job; zkgate gives each admission of it a Barrier, and the
//! resumed pods meet again.
//!
//! Kueue's webhooks are scoped to namespaces labelled `zkgate.dev/kueue=on`
//! (so that the rest of the suite never waits on it); each test makes its
//! own ResourceFlavor, ClusterQueue and WorkloadPriorityClass (cluster
//! objects, named after its namespace) and a LocalQueue `queue`.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};

use super::*;

/// What a test's ClusterQueue lends: 0.5 CPU, so that one gang of 4 pods
/// of 0.1 CPU fits and a second waits or preempts.
const QUOTA_CPU: &str = "500m";

/// A namespace Kueue manages, with a LocalQueue `queue` of a ClusterQueue
/// of its own (`QUOTA_CPU`, preemption of lower priorities), and a
/// WorkloadPriorityClass `high-NAMESPACE` (the cluster objects deleted
/// with the namespace).
async fn queued_namespace(c: &Cluster) -> NamespaceGuard {
    let mut ns = c.namespace().await;
    ns.cluster_objects = vec![
        format!("clusterqueue.kueue.x-k8s.io/cluster-{}", ns.name),
        format!("resourceflavor.kueue.x-k8s.io/flavor-{}", ns.name),
        format!("workloadpriorityclass.kueue.x-k8s.io/high-{}", ns.name),
    ];
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    namespaces
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "zkgate.dev/kueue": "on" } } })),
        )
        .await
        .unwrap();
    let name = &ns.name;
    c.apply(
        name,
        &format!(
            r#"apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: flavor-{name}}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: cluster-{name}}}
spec:
  namespaceSelector:
    matchLabels: {{kubernetes.io/metadata.name: {name}}}
  preemption:
    withinClusterQueue: LowerPriority
  resourceGroups:
    - coveredResources: [cpu]
      flavors:
        - name: flavor-{name}
          resources:
            - {{name: cpu, nominalQuota: "{QUOTA_CPU}"}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{name: queue}}
spec:
  clusterQueue: cluster-{name}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {{name: high-{name}}}
value: 1000
"#
        ),
    )
    .await;
    ns
}

/// A labelled Job of 4 pods of 0.1 CPU queued on `queue`, with a priority
/// class when given; each worker prints its start and works for the
/// seconds the ConfigMap `work` says under the Job's name when its pod
/// starts (so that a readmitted run can work less), stopping at SIGTERM.
fn queued_job(name: &str, priority: Option<&str>) -> String {
    let priority = priority
        .map(|p| format!(", kueue.x-k8s.io/priority-class: {p}"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: queue{priority}}}
spec:
  completions: 4
  parallelism: 4
  backoffLimit: 10
  template:
    metadata:
      labels: {{zkgate.io/barrier: {name}}}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 10
      containers:
        - name: worker
          image: workload:local
          resources: {{requests: {{cpu: 100m}}}}
          env:
            - name: WORK
              valueFrom: {{configMapKeyRef: {{name: work, key: {name}}}}}
          command: ["sh", "-c", "echo started-at-us $(now-us); trap 'exit 143' TERM; sleep $WORK & wait $!"]
"#
    )
}

/// The conditions (type, reason) that are true on the Workload Kueue made
/// for Job `job` (uid).
async fn workload_conditions(c: &Cluster, namespace: &str, job: &str) -> Vec<(String, String)> {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    );
    let workloads: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), namespace, &resource);
    let list = workloads.list(&ListParams::default()).await.unwrap();
    let ours = list.items.iter().find(|w| {
        w.owner_references()
            .iter()
            .any(|o| o.kind == "Job" && o.uid == job)
    });
    ours.and_then(|w| w.data["status"]["conditions"].as_array().cloned())
        .into_iter()
        .flatten()
        .filter(|cond| cond["status"] == "True")
        .map(|cond| {
            (
                cond["type"].as_str().unwrap_or_default().to_owned(),
                cond["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Whether Kueue holds `job` (`spec.suspend`).
async fn suspended(jobs: &Api<Job>, job: &str) -> Option<bool> {
    jobs.get(job).await.ok()?.spec?.suspend
}

/// Kueue's life of a labelled Job, by Kueue itself: created, it is held
/// (suspended by Kueue's webhook) until admitted, then its gang starts
/// together. A Job of a higher priority that does not fit beside it
/// preempts it: Kueue suspends it while its workers run, the Job
/// controller deletes its pods, and the run gives up its Barrier (the
/// Barrier and its znodes gone; none made while it waits). The preemptor
/// starts as a gang of its own and completes; then Kueue admits the first
/// Job again, and its new pods meet on a Barrier made again for the same
/// run: its `ready` made after all four registrations, no worker started
/// before it, and the Job completes.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn kueue_admits_preempts_and_readmits_a_labelled_job_whose_gang_meets_each_time() {
    let c = cluster().await;
    let ns = queued_namespace(&c).await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let barriers: Api<Barrier> = Api::namespaced(c.client.clone(), &ns.name);
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns.name);
    let session = support::session(&c.zookeeper()).await;
    let znode = Layout::new(ROOT).unwrap().barrier(&ns.name, "low").unwrap();
    let stat = |path: String| {
        let session = &session;
        async move { session.client().check_stat(&path).await.unwrap() }
    };
    c.apply(
        &ns.name,
        // The preemptor works long enough for the preempted Job to be seen
        // suspended, its pods and Barrier gone, before it may be readmitted.
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: work}\ndata: {low: \"600\", high: \"15\"}\n",
    ).await;
    c.apply(&ns.name, &queued_job("low", None)).await;
    let uid = jobs.get("low").await.unwrap().uid().unwrap();

    // Admitted by Kueue: the gang starts.
    let first = c
        .barrier(
            &ns.name,
            "low",
            "the first admission's Barrier to open",
            |b| b.status.as_ref().and_then(|s| s.phase) == Some(BarrierPhase::Open),
        )
        .await;
    assert_eq!(
        zkgate::workload::run::run_of(&first).as_deref(),
        Some(uid.as_str())
    );
    let admitted = workload_conditions(&c, &ns.name, &uid).await;
    assert!(
        admitted.iter().any(|(t, _)| t == "Admitted"),
        "Kueue admitted the Job: {admitted:?}"
    );
    let first_ready = stat(format!("{znode}/ready"))
        .await
        .expect("the first admission's ready");
    let first_pods = c
        .workers_started_after(&ns.name, "job-name=low", 4, first_ready.ctime)
        .await;

    // Preempted by a Job of a higher priority.
    c.apply(
        &ns.name,
        &queued_job("high", Some(&format!("high-{}", ns.name))),
    )
    .await;
    eventually(
        WITHIN,
        "Kueue to suspend the first Job, and its pods, Barrier and znodes gone",
        || async {
            let pods = c.pods(&ns.name, "job-name=low").await;
            let barrier = barriers.get_opt("low").await.ok()?;
            (suspended(&jobs, "low").await == Some(true)
                && pods.is_empty()
                && barrier.is_none()
                && stat(znode.clone()).await.is_none())
            .then_some(())
        },
    )
    .await;
    let evicted = workload_conditions(&c, &ns.name, &uid).await;
    assert!(
        evicted.contains(&("Evicted".to_owned(), "Preempted".to_owned())),
        "Kueue preempted the Job: {evicted:?}"
    );
    let failed = jobs
        .get("low")
        .await
        .unwrap()
        .status
        .and_then(|s| s.failed)
        .unwrap_or(0);
    // The readmitted run works for 2 s.
    maps.patch(
        "work",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "low": "2" } })),
    )
    .await
    .unwrap();
    let high = c
        .gang_of_started_together(
            &ns.name,
            "high",
            "job-name=high",
            &[("high", 4)],
            "zkgate-barrier",
        )
        .await;
    assert_eq!(high.status.map(|s| (s.entered, s.left)), Some((4, 4)));
    assert!(
        barriers.get_opt("low").await.unwrap().is_none(),
        "a Barrier was made for the Job Kueue holds"
    );

    // Readmitted once the preemptor completed.
    let again = c
        .gang_of_started_together_after(
            &ns.name,
            "low",
            "job-name=low",
            &[("low", 4)],
            "zkgate-barrier",
            failed,
        )
        .await;
    assert_ne!(again.uid(), first.uid(), "a Barrier made again");
    assert_eq!(
        zkgate::workload::run::run_of(&again).as_deref(),
        Some(uid.as_str()),
        "of the same run"
    );
    let status = again.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4), "{status:?}");
    c.none_of_these_pods_left(&ns.name, "job-name=low", &first_pods)
        .await;
}

/// Kueue's `waitForPodsReady` in every form: a Job Kueue admits whose gang
/// cannot meet (its Barrier, made by hand, waits for 3 participants; the
/// Job has 2 pods) must not count as running, so Kueue evicts it after
/// its timeout (30 s here) and queues it again. A participant waiting at
/// its barrier is not Ready in any form: the init form's pod is still
/// initializing, the sidecar form's main containers have not started (its
/// startup probe), and the wrap form's container has the readiness probe
/// the webhook gives it, which passes only while the command runs after an
/// opening (before, the wrapped pod was Ready at once and Kueue waited
/// forever).
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn kueue_evicts_a_gang_that_cannot_meet_in_every_form() {
    let c = cluster().await;
    let ns = queued_namespace(&c).await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let barriers: Api<Barrier> = Api::namespaced(c.client.clone(), &ns.name);
    let forms = ["init", "sidecar", "wrap"];
    for form in forms {
        let name = format!("short-{form}");
        support::kube::barrier_waiting(&barriers, &name, 3, WITHIN).await;
        c.apply(
            &ns.name,
            &format!(
                r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: queue}}
spec:
  completions: 2
  parallelism: 2
  backoffLimit: 10
  template:
    metadata:
      labels: {{zkgate.io/barrier: {name}}}
      annotations: {{zkgate.io/barrier-form: {form}}}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 5
      containers:
        - name: worker
          image: workload:local
          resources: {{requests: {{cpu: 50m}}}}
          command: ["sh", "-c", "echo started; sleep 600"]
"#
            ),
        )
        .await;
    }
    for form in forms {
        let name = format!("short-{form}");
        let uid = jobs.get(&name).await.unwrap().uid().unwrap();
        // Admitted first, its 2 pods running or waiting at the barrier.
        eventually(WITHIN, &format!("Kueue to admit {name}"), || async {
            let conditions = workload_conditions(&c, &ns.name, &uid).await;
            conditions
                .iter()
                .any(|(t, _)| t == "Admitted")
                .then_some(())
        })
        .await;
        let evicted = eventually(
            WITHIN,
            &format!("Kueue to evict {name} for want of Ready pods"),
            || async {
                let conditions = workload_conditions(&c, &ns.name, &uid).await;
                conditions
                    .iter()
                    .any(|(t, r)| t == "Evicted" && r == "PodsReadyTimeout")
                    .then_some(conditions)
            },
        )
        .await;
        eprintln!("{name}: {evicted:?}");
    }
}

/// The kueue example as a user runs it, under Kueue's controller: its
/// queues, then its Job (smaller requests, for this node's 2 CPUs). Kueue
/// admits it and zkgate starts its 4 pods as one gang.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn the_kueue_example_is_admitted_and_started_as_one_gang() {
    let c = cluster().await;
    let ns = queued_namespace(&c).await;
    c.apply(&ns.name, &c.example("kueue/queues.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "kueue/job.yaml",
            &[
                (
                    "echo $(hostname) starts with the whole gang; sleep 30",
                    "echo started-at-us $(now-us); sleep 2",
                ),
                (
                    r#"requests: {cpu: "1", memory: 1Gi}"#,
                    "requests: {cpu: 50m, memory: 16Mi}",
                ),
            ],
        ),
    )
    .await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let uid = jobs.get("kueue-train").await.unwrap().uid().unwrap();
    let barrier = c
        .gang_of_started_together(
            &ns.name,
            "kueue-train",
            "job-name=kueue-train",
            &[("kueue-train", 4)],
            "zkgate-barrier",
        )
        .await;
    let status = barrier.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4));
    let conditions = workload_conditions(&c, &ns.name, &uid).await;
    assert!(
        conditions.iter().any(|(t, _)| t == "Admitted"),
        "Kueue admitted it: {conditions:?}"
    );
}

/// A wrap-form gang whose members end far apart stays Ready, so Kueue does
/// not evict it (found in review): a member whose command completed waits
/// for the others to end, and its pod stays Ready meanwhile, its released
/// file kept until it has left. Here member 0 completes at once and member
/// 1 runs 60 s, twice Kueue's recovery timeout (30 s): the Job completes
/// and its Workload was never evicted.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn kueue_keeps_a_wrap_form_gang_whose_members_end_far_apart() {
    let c = cluster().await;
    let ns = queued_namespace(&c).await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    c.apply(
        &ns.name,
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: apart
  labels: {kueue.x-k8s.io/queue-name: queue}
spec:
  completions: 2
  parallelism: 2
  completionMode: Indexed
  backoffLimit: 0
  template:
    metadata:
      labels: {zkgate.io/barrier: apart}
      annotations: {zkgate.io/barrier-form: wrap}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      containers:
        - name: worker
          image: workload:local
          resources: {requests: {cpu: 50m}}
          command: ["sh", "-c", "if [ $JOB_COMPLETION_INDEX = 1 ]; then sleep 60; fi"]
"#,
    )
    .await;
    let uid = jobs.get("apart").await.unwrap().uid().unwrap();
    c.job_succeeded_after(&ns.name, "apart", 2, 0).await;
    let conditions = workload_conditions(&c, &ns.name, &uid).await;
    assert!(
        !conditions.iter().any(|(t, _)| t == "Evicted"),
        "Kueue evicted a gang that ran: {conditions:?}"
    );
    let barrier = c
        .barrier(&ns.name, "apart", "the Barrier to complete", |b| {
            b.status.as_ref().and_then(|s| s.phase) == Some(BarrierPhase::Completed)
        })
        .await;
    let status = barrier.status.unwrap();
    assert_eq!((status.entered, status.left), (2, 2));
}
