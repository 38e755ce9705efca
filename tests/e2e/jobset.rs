//! Issue 42, item 1: JobSet's real controller (its release built from the
//! Go module proxy, run beside the cluster by `scripts/workload-controllers`,
//! its webhooks called by the API server) makes the child Jobs; zkgate
//! gives the JobSet its Barrier by the one label, and a Barrier of its own
//! to each restart of its `failurePolicy`.

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::ResourceExt;

use super::support::{self, eventually};
use super::{cluster, Cluster, WITHIN};
use zkgate::api::Barrier;

const RESTART_LABEL: &str = "jobset.sigs.k8s.io/restart-attempt";

fn jobsets(c: &Cluster, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), namespace, &support::jobset::resource())
}

/// The child Jobs of JobSet `name` once they are all of restart `restart`
/// (`count` of them): (name, the JobSet's uid its controller reference names).
async fn child_jobs_of_restart(
    c: &Cluster,
    namespace: &str,
    name: &str,
    restart: u32,
    count: usize,
) -> Vec<(String, String)> {
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), namespace);
    let selector = format!("jobset.sigs.k8s.io/jobset-name={name}");
    eventually(
        WITHIN,
        &format!("JobSet {name}'s {count} child Jobs of restart {restart}"),
        || async {
            let list = jobs
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            let of_restart = list.items.iter().all(|j| {
                j.metadata.deletion_timestamp.is_none()
                    && j.labels().get(RESTART_LABEL).map(String::as_str)
                        == Some(restart.to_string().as_str())
            });
            if !of_restart || list.items.len() != count {
                return None;
            }
            let mut out: Vec<(String, String)> = list
                .items
                .iter()
                .map(|j| {
                    let owner = j
                        .owner_references()
                        .iter()
                        .find(|o| o.controller == Some(true))
                        .map(|o| format!("{}/{}", o.kind, o.uid))
                        .unwrap_or_default();
                    (j.name_any(), owner)
                })
                .collect();
            out.sort();
            Some(out)
        },
    )
    .await
}

/// The JobSet's condition `kind` is true, as its controller says.
async fn jobset_condition(c: &Cluster, namespace: &str, name: &str, kind: &str) -> DynamicObject {
    let api = jobsets(c, namespace);
    eventually(WITHIN, &format!("JobSet {name} {kind}"), || async {
        let js = api.get(name).await.ok()?;
        let conditions = js.data["status"]["conditions"].as_array()?.clone();
        conditions
            .iter()
            .any(|cond| cond["type"] == kind && cond["status"] == "True")
            .then_some(js)
    })
    .await
}

/// The jobset example as a user runs it, under JobSet's own controller: it
/// makes the three child Jobs, controlled by the JobSet; one Barrier for
/// the whole JobSet, sized over its labelled replicated Jobs (5), owned by
/// the JobSet; no pod's command starts before the 5th registration; and
/// the JobSet completes, as its controller says.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn the_jobset_example_starts_every_replicated_job_as_one_gang() {
    let c = cluster().await;
    let ns = c.namespace().await;
    let manifest = c.example(
        "jobset/jobset.yaml",
        &[
            (
                "echo $(hostname) starts with the whole JobSet; sleep 30",
                "echo started-at-us $(now-us); sleep 2",
            ),
            (
                "echo $(hostname) drives the workers; sleep 30",
                "echo started-at-us $(now-us); sleep 2",
            ),
        ],
    );
    c.apply(&ns.name, &manifest).await;
    let jobset = jobsets(&c, &ns.name).get("jobset-train").await.unwrap();
    let uid = jobset.uid().unwrap();
    let children = child_jobs_of_restart(&c, &ns.name, "jobset-train", 0, 3).await;
    let owner = format!("JobSet/{uid}");
    assert_eq!(
        children,
        [
            ("jobset-train-driver-0".to_owned(), owner.clone()),
            ("jobset-train-workers-0".to_owned(), owner.clone()),
            ("jobset-train-workers-1".to_owned(), owner.clone()),
        ],
        "JobSet's controller made the child Jobs"
    );
    let barrier = c
        .gang_of_started_together(
            &ns.name,
            "jobset-train",
            "jobset.sigs.k8s.io/jobset-name=jobset-train",
            &[
                ("jobset-train-workers-0", 2),
                ("jobset-train-workers-1", 2),
                ("jobset-train-driver-0", 1),
            ],
            "zkgate-barrier",
        )
        .await;
    assert_eq!(barrier.spec.participants, Some(5));
    let owner = &barrier.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("JobSet", uid.as_str())
    );
    let status = barrier.status.unwrap();
    assert_eq!((status.entered, status.left), (5, 5));
    jobset_condition(&c, &ns.name, "jobset-train", "Completed").await;
}

/// `failurePolicy` restarts on real pods: the driver fails once, after the
/// gang opened, in restart 0. JobSet's controller deletes every child Job
/// and makes them again (restart 1); zkgate gives restart 1 a Barrier of
/// its own (labelled with the run `UID.1`), whose five pods meet again:
/// no command of restart 1 starts before its fifth registration, and the
/// JobSet completes.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_jobset_restarted_by_its_failure_policy_meets_again_at_a_barrier_of_its_own() {
    let c = cluster().await;
    let ns = c.namespace().await;
    // The command knows its restart through the downward API; the driver
    // of restart 0 fails a second after the opening, the workers of
    // restart 0 would run for a minute (their Jobs are deleted first).
    let command = "echo started-at-us $(now-us); \
        if [ \"$RESTART\" = 0 ] && [ \"$ROLE\" = driver ]; then sleep 1; exit 3; fi; \
        if [ \"$RESTART\" = 0 ]; then sleep 60; fi; sleep 2";
    let replicated = |name: &str, replicas: u32, pods: u32| {
        format!(
            r#"
    - name: {name}
      replicas: {replicas}
      template:
        spec:
          parallelism: {pods}
          completions: {pods}
          backoffLimit: 0
          template:
            metadata:
              labels:
                zkgate.io/barrier: restarted
            spec:
              restartPolicy: Never
              automountServiceAccountToken: false
              containers:
                - name: worker
                  image: workload:local
                  command: ["sh", "-c", {command:?}]
                  env:
                    - name: ROLE
                      value: {name}
                    - name: RESTART
                      valueFrom:
                        fieldRef:
                          fieldPath: metadata.labels['{RESTART_LABEL}']"#
        )
    };
    let manifest = format!(
        r#"apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: restarted
spec:
  failurePolicy:
    maxRestarts: 1
  replicatedJobs:{}{}
"#,
        replicated("workers", 2, 2),
        replicated("driver", 1, 1)
    );
    c.apply(&ns.name, &manifest).await;
    let uid = jobsets(&c, &ns.name)
        .get("restarted")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let first = c
        .barrier(&ns.name, "restarted", "restart 0's Barrier open", |b| {
            b.labels().get("zkgate.io/run") == Some(&format!("{uid}.0"))
                && b.status.as_ref().is_some_and(|s| s.entered == 5)
        })
        .await;
    // JobSet's controller counts the restart and makes the Jobs again.
    let restarted = eventually(WITHIN, "the JobSet's first restart", || async {
        let js = jobsets(&c, &ns.name).get("restarted").await.ok()?;
        (js.data["status"]["restarts"].as_u64() == Some(1)).then_some(js)
    })
    .await;
    assert_eq!(restarted.uid().as_deref(), Some(uid.as_str()));
    child_jobs_of_restart(&c, &ns.name, "restarted", 1, 3).await;
    let second: Barrier = c
        .barrier(&ns.name, "restarted", "restart 1's Barrier", |b| {
            b.labels().get("zkgate.io/run") == Some(&format!("{uid}.1"))
        })
        .await;
    assert_ne!(
        first.uid(),
        second.uid(),
        "restart 1 has a Barrier of its own"
    );
    let barrier = c
        .gang_of_started_together(
            &ns.name,
            "restarted",
            &format!("jobset.sigs.k8s.io/jobset-name=restarted,{RESTART_LABEL}=1"),
            &[
                ("restarted-workers-0", 2),
                ("restarted-workers-1", 2),
                ("restarted-driver-0", 1),
            ],
            "zkgate-barrier",
        )
        .await;
    assert_eq!(
        barrier.labels().get("zkgate.io/run"),
        Some(&format!("{uid}.1"))
    );
    let status = barrier.status.unwrap();
    assert_eq!((status.entered, status.left), (5, 5));
    jobset_condition(&c, &ns.name, "restarted", "Completed").await;
}
