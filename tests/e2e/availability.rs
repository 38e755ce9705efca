//! Issue 43, item 5: admission stays available while the controller's
//! replicas go and come back. Every replica serves the webhook (and the
//! credential handout) behind one Service; the API server calls it for
//! every labelled pod and, with `failurePolicy: Fail`, refuses the pod when
//! the call fails. A replica being deleted (a rolling update, a drain, an
//! eviction) must therefore not drop a single call: it leaves the Service
//! first and stops serving after.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kube::api::PostParams;

use super::*;

impl Cluster {
    /// Holds off every other test that deletes a controller replica until
    /// the returned file is dropped (tests run in processes of their own):
    /// two replicas deleted at once leave the webhook no endpoint, which
    /// is an outage of the chart's own making, not what either test checks.
    pub(super) async fn disrupting_controllers(&self) -> std::fs::File {
        let path = self.dir.join("e2e-controller-disruption.lock");
        tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .expect("open the disruption lock");
            // SAFETY: flock on a descriptor this function owns.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            assert_eq!(locked, 0, "flock: {}", std::io::Error::last_os_error());
            file
        })
        .await
        .expect("the disruption lock's thread")
    }

    /// The controller's pods that are Ready and not being deleted.
    async fn ready_controllers(&self) -> Vec<String> {
        self.pods(SYSTEM_NAMESPACE, "app.kubernetes.io/name=zkgate")
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .map(|p| p.name_any())
            .collect()
    }
}

/// A labelled pod as a Job's template makes them (one label, nothing of
/// zkgate's), for admission alone: created with `dryRun`, it goes through
/// the whole admission chain, the webhook included, and is stored nowhere.
fn labelled_pod(barrier: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "admitted-", "labels": {"zkgate.io/barrier": barrier}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{"name": "worker", "image": "busybox:1.36", "command": ["true"]}]
        }
    }))
    .expect("a pod")
}

/// Labelled pods are created (admitted, dry run) without a pause while
/// each of the two controller replicas in turn is stopped: the first by
/// SIGTERM to its process, as the kubelet sends it when it restarts the
/// container (a failed liveness probe), the pod staying; the second
/// deleted, as a rolling update or a node drain deletes it, and replaced.
/// Not one is refused, and every one is given its barrier's container.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn stopping_each_controller_replica_in_turn_refuses_no_labelled_pod() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(
        &ns.name,
        "apiVersion: zkgate.io/v1alpha1\nkind: Barrier\nmetadata: {name: gang}\nspec: {participants: 2}\n",
    ).await;
    let _disrupting = c.disrupting_controllers().await;
    let replicas = eventually(WITHIN, "two ready controller replicas", || async {
        let ready = c.ready_controllers().await;
        (ready.len() == 2).then_some(ready)
    })
    .await;

    // Four callers at once, as a Job controller and a JobSet make pods.
    let done = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (pods, done) = (
                Api::<Pod>::namespaced(c.client.clone(), &ns.name),
                done.clone(),
            );
            tokio::spawn(async move {
                let (mut admitted, mut refused) = (0usize, Vec::new());
                let dry_run = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                while !done.load(Ordering::SeqCst) {
                    match pods.create(&dry_run, &labelled_pod("gang")).await {
                        Ok(pod) => {
                            let injected = pod
                                .spec
                                .iter()
                                .flat_map(|s| s.init_containers.iter().flatten())
                                .any(|c| c.name == "zkgate-barrier");
                            if injected {
                                admitted += 1;
                            } else {
                                refused.push("admitted without its barrier's container".to_owned());
                            }
                        }
                        Err(e) => refused.push(e.to_string()),
                    }
                }
                (admitted, refused)
            })
        })
        .collect();

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), SYSTEM_NAMESPACE);
    let restarts = |pod: Pod| {
        pod.status
            .and_then(|s| s.container_statuses)
            .and_then(|s| s.into_iter().find(|s| s.name == "controller"))
            .map(|s| s.restart_count)
            .unwrap_or_default()
    };
    let (terminated, deleted) = (&replicas[0], &replicas[1]);
    let before = restarts(pods.get(terminated).await.expect("get a pod"));
    eprintln!("SIGTERM to controller replica {terminated}'s process");
    c.signal_container(SYSTEM_NAMESPACE, terminated, "controller", "SIGTERM")
        .await;
    // Restarted in its pod, and two ready replicas again.
    eventually(WITHIN, "the replica to be restarted", || async {
        let now = restarts(pods.get(terminated).await.ok()?);
        let ready = c.ready_controllers().await;
        (now > before && ready.len() == 2 && ready.contains(terminated)).then_some(())
    })
    .await;
    eprintln!("deleting controller replica {deleted}");
    pods.delete(deleted, &DeleteParams::default())
        .await
        .expect("delete a controller replica");
    // Gone for good (its process ended), and two ready replicas again.
    eventually(WITHIN, "the replica to be replaced", || async {
        let gone = pods.get_opt(deleted).await.expect("get a pod").is_none();
        let ready = c.ready_controllers().await;
        (gone && ready.len() == 2 && !ready.contains(deleted)).then_some(())
    })
    .await;
    done.store(true, Ordering::SeqCst);

    let (mut admitted, mut refused) = (0, Vec::new());
    for caller in callers {
        let (a, r) = caller.await.expect("a caller");
        admitted += a;
        refused.extend(r);
    }
    eprintln!(
        "{admitted} labelled pods admitted, {} refused, while both replicas were stopped",
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {} labelled pods refused while a controller replica stopped: {:?}",
        refused.len(),
        admitted + refused.len(),
        refused
            .iter()
            .take(3)
            .map(|r| r.chars().take(300).collect::<String>())
            .collect::<Vec<_>>()
    );
    // Calls went on throughout (a caller stuck on its first call would
    // pass the assertion above vacuously).
    assert!(admitted >= 20, "only {admitted} labelled pods admitted");
}
