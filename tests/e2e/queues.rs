//! Issue 41, item 4: what a queue does to a labelled Job, on real pods.
//! Kueue holds a Job with `spec.suspend` until it admits it, and preempts
//! it by suspending it again (the Job controller deletes its pods) and
//! resumes it later; the controller-manager here runs the real Job
//! controller, so the test suspends and resumes the Job as Kueue does.

use kube::api::{Patch, PatchParams};

use super::*;

impl Cluster {
    /// The `n` pods `selector` picks once each worker printed its start:
    /// (pod, start in us), each checked to have started no earlier than
    /// the opening at `opened_ms` (the `ready` node's ctime).
    pub(super) async fn workers_started_after(
        &self,
        namespace: &str,
        selector: &str,
        n: usize,
        opened_ms: i64,
    ) -> Vec<(String, i64)> {
        let started = eventually(
            WITHIN,
            &format!("{n} workers ({selector}) to run"),
            || async {
                let mut running = Vec::new();
                for pod in self.pods(namespace, selector).await {
                    let name = pod.name_any();
                    let log = self.logs_if_any(namespace, &name, "worker").await?;
                    running.push((name, times(&log, "started-at-us").first().copied()?));
                }
                (running.len() == n).then_some(running)
            },
        )
        .await;
        for (pod, at) in &started {
            assert!(
                *at >= opened_ms * 1000,
                "{pod} started at {at} us, before the opening ({opened_ms} ms)"
            );
        }
        started
    }

    /// None of `earlier` (pods of an earlier run) is among the pods
    /// `selector` picks now.
    pub(super) async fn none_of_these_pods_left(
        &self,
        namespace: &str,
        selector: &str,
        earlier: &[(String, i64)],
    ) {
        for pod in self.pods(namespace, selector).await {
            assert!(
                !earlier.iter().any(|(p, _)| *p == pod.name_any()),
                "a pod of the earlier run is still there: {}",
                pod.name_any()
            );
        }
    }
}

/// A labelled Job of 4 created suspended, as Kueue makes it; each worker
/// prints its start and works for as long as its pod template's
/// annotation `e2e.zkgate.io/work` says (seconds; read through the
/// downward API, so that a resume can change it as Kueue changes a
/// suspended Job's template), stopping at SIGTERM.
const QUEUED_JOB: &str = r#"apiVersion: batch/v1
kind: Job
metadata: {name: queued}
spec:
  suspend: true
  completions: 4
  parallelism: 4
  backoffLimit: 10
  template:
    metadata:
      labels: {zkgate.io/barrier: queued}
      annotations: {e2e.zkgate.io/work: "600"}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 10
      containers:
        - name: worker
          image: workload:local
          env:
            - name: WORK
              valueFrom: {fieldRef: {fieldPath: "metadata.annotations['e2e.zkgate.io/work']"}}
          command: ["sh", "-c", "echo started-at-us $(now-us); trap 'exit 143' TERM; sleep $WORK & wait $!"]
"#;

/// Kueue's life of a Job, on a labelled one: created suspended (no pods,
/// no Barrier), admitted (resumed), its gang started; then preempted
/// (suspended while its workers run: the Job controller deletes the pods)
/// and admitted again. A suspended run that made no progress gives up its
/// Barrier: the first run's Barrier is deleted and its znodes removed
/// before the resume, none is made while the Job is suspended, and the
/// resumed pods meet again on a Barrier made again for the same run (the
/// Job's uid): its `ready` was made after all four resumed pods
/// registered, and no resumed worker started before it. Nothing passes
/// the first opening.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_preempted_job_gives_up_its_barrier_and_its_resumed_pods_meet_again() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, QUEUED_JOB).await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let barriers: Api<Barrier> = Api::namespaced(c.client.clone(), &ns.name);
    let session = support::session(&c.zookeeper()).await;
    let znode = Layout::new(ROOT)
        .unwrap()
        .barrier(&ns.name, "queued")
        .unwrap();
    let ready = format!("{znode}/ready");
    // `exists` needs no permission: the test reads no data under the ACLs.
    let stat = |path: String| {
        let session = &session;
        async move { session.client().check_stat(&path).await.unwrap() }
    };
    let patch = |body: serde_json::Value| {
        let jobs = jobs.clone();
        async move {
            jobs.patch("queued", &PatchParams::default(), &Patch::Merge(body))
                .await
        }
    };
    let uid = jobs.get("queued").await.unwrap().uid().unwrap();
    assert!(c.pods(&ns.name, "job-name=queued").await.is_empty());

    // Admitted: the gang starts.
    patch(json!({ "spec": { "suspend": false } }))
        .await
        .unwrap();
    let first = c
        .barrier(&ns.name, "queued", "the first run's Barrier to open", |b| {
            b.status.as_ref().and_then(|s| s.phase) == Some(BarrierPhase::Open)
        })
        .await;
    assert_eq!(
        zkgate::workload::run::run_of(&first).as_deref(),
        Some(uid.as_str())
    );
    let first_ready = stat(ready.clone()).await.expect("the first run's ready");
    let first_pods = c
        .workers_started_after(&ns.name, "job-name=queued", 4, first_ready.ctime)
        .await;

    // Preempted while the workers run.
    patch(json!({ "spec": { "suspend": true } })).await.unwrap();
    eventually(
        WITHIN,
        "the first run's pods, its Barrier and its znodes gone",
        || async {
            let pods = c.pods(&ns.name, "job-name=queued").await;
            let barrier = barriers.get_opt("queued").await.ok()?;
            (pods.is_empty() && barrier.is_none() && stat(znode.clone()).await.is_none())
                .then_some(())
        },
    )
    .await;
    // Suspended, and its start time reset, its template may change (the
    // shorter work lets the resumed run complete).
    let failed = eventually(WITHIN, "the Job's start time reset", || async {
        let status = jobs.get("queued").await.ok()?.status?;
        status
            .start_time
            .is_none()
            .then(|| status.failed.unwrap_or(0))
    })
    .await;
    eprintln!("the Job counted {failed} failed pods after its suspension");
    assert!(
        barriers.get_opt("queued").await.unwrap().is_none(),
        "a Barrier was made for a suspended Job"
    );

    // Admitted again.
    let resumed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    patch(json!({ "spec": {
        "suspend": false,
        "template": { "metadata": { "annotations": { "e2e.zkgate.io/work": "2" } } }
    } }))
    .await
    .unwrap();
    let again = c
        .gang_of_started_together_after(
            &ns.name,
            "queued",
            "job-name=queued",
            &[("queued", 4)],
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
    let opened = status.opened_at.expect("openedAt").0.as_millisecond();
    // Found in review: compared with the first opening, this could not
    // fail (a Barrier made later opens later); the resume is the moment
    // its opening must follow.
    assert!(
        opened >= resumed_at && opened > first_ready.ctime,
        "the resumed run's Barrier says it opened at {opened} ms, before the resume ({resumed_at} ms)"
    );
    c.none_of_these_pods_left(&ns.name, "job-name=queued", &first_pods)
        .await;
}

/// A labelled Job suspended while its pods wait at the barrier (3 of 4:
/// a ResourceQuota of 3 pods keeps the Job controller from making the
/// 4th), as Kueue preempts a gang that could not all start. The run gives
/// up its Barrier (deleted with the waiters' registrations) and, resumed
/// with room for all 4, meets on a Barrier made again: its `ready` was
/// made after all four new registrations, and no worker started before.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_job_suspended_while_its_pods_wait_at_the_barrier_meets_again_on_a_new_one() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(
        &ns.name,
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: three-pods}\nspec: {hard: {pods: \"3\"}}\n",
    ).await;
    c.apply(
        &ns.name,
        &QUEUED_JOB
            .replace("suspend: true", "suspend: false")
            .replace(r#"e2e.zkgate.io/work: "600""#, r#"e2e.zkgate.io/work: "2""#),
    )
    .await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    let barriers: Api<Barrier> = Api::namespaced(c.client.clone(), &ns.name);
    let session = support::session(&c.zookeeper()).await;
    let znode = Layout::new(ROOT)
        .unwrap()
        .barrier(&ns.name, "queued")
        .unwrap();
    let stat = |path: String| {
        let session = &session;
        async move { session.client().check_stat(&path).await.unwrap() }
    };
    let waiting = c
        .barrier(&ns.name, "queued", "3 pods waiting at the barrier", |b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.entered == 3 && s.phase == Some(BarrierPhase::Waiting))
        })
        .await;
    assert_eq!(stat(format!("{znode}/ready")).await, None);
    assert_eq!(
        c.pods(&ns.name, "job-name=queued").await.len(),
        3,
        "the quota lets 3 pods be made: {}",
        c.describe(&ns.name).await
    );
    let patch = |body: serde_json::Value| {
        let jobs = jobs.clone();
        async move {
            jobs.patch("queued", &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap()
        }
    };
    patch(json!({ "spec": { "suspend": true } })).await;
    eventually(
        WITHIN,
        "the waiting pods, their Barrier and its znodes gone",
        || async {
            let pods = c.pods(&ns.name, "job-name=queued").await;
            let barrier = barriers.get_opt("queued").await.ok()?;
            (pods.is_empty() && barrier.is_none() && stat(znode.clone()).await.is_none())
                .then_some(())
        },
    )
    .await;
    let failed = eventually(WITHIN, "the Job's start time reset", || async {
        let status = jobs.get("queued").await.ok()?.status?;
        status
            .start_time
            .is_none()
            .then(|| status.failed.unwrap_or(0))
    })
    .await;
    // Room for the whole gang, and admitted again.
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(c.client.clone(), &ns.name)
        .delete("three-pods", &DeleteParams::default())
        .await
        .unwrap();
    patch(json!({ "spec": { "suspend": false } })).await;
    let again = c
        .gang_of_started_together_after(
            &ns.name,
            "queued",
            "job-name=queued",
            &[("queued", 4)],
            "zkgate-barrier",
            failed,
        )
        .await;
    assert_ne!(again.uid(), waiting.uid(), "a Barrier made again");
    let status = again.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4), "{status:?}");
}
