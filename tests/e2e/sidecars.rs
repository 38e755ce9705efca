//! Issue 41, items 4 and 5: the native sidecar forms on real pods (the
//! local cluster runs a Kubernetes with native sidecars: init containers
//! with `restartPolicy: Always`, their startup probe holding the main
//! containers back). The barrier's sidecar, written by hand
//! (`examples/gang-sidecar`) and injected for a labelled Job
//! (`zkgate.io/barrier-form: sidecar`); the lock's sidecar with the main
//! command under `zkgate lock watch` (`examples/lock-sidecar`); and what
//! each promises when the kubelet restarts its sidecar after the process
//! was killed (SIGKILL through containerd: nothing of the sidecar's own
//! runs on the way out).

use k8s_openapi::api::core::v1::ContainerStatus;
use kube::api::{Patch, PatchParams};

use super::*;

pub(super) use crate::support::now_us;

/// The status of container `name` of `pod`, an init container (a native
/// sidecar) or a main one.
pub(super) fn status_of(pod: &Pod, name: &str) -> Option<ContainerStatus> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|s| s.name == name)
        .cloned()
}

/// The exit code of container `name` of `pod`, once it terminated.
pub(super) fn exit_of(pod: &Pod, name: &str) -> Option<i32> {
    Some(status_of(pod, name)?.state?.terminated?.exit_code)
}

/// Whether container `name` of `pod` has started: it runs, or ran.
fn started(pod: &Pod, name: &str) -> bool {
    status_of(pod, name).is_some_and(|s| {
        let state = s.state.unwrap_or_default();
        state.running.is_some() || state.terminated.is_some()
    })
}

impl Cluster {
    /// SIGKILLs the running container `container` of pod `pod` through
    /// containerd (as the OOM killer or a crash ends it: no handler of the
    /// process runs) and returns when, by this machine's clock (µs), and
    /// the killed container's id.
    async fn kill_container(&self, namespace: &str, pod: &str, container: &str) -> (i64, String) {
        self.signal_container(namespace, pod, container, "SIGKILL")
            .await
    }

    /// Sends `signal` to the process of the running container `container`
    /// of pod `pod` through containerd, as the kubelet does (SIGTERM when
    /// it restarts a container), and returns when, by this machine's clock
    /// (µs), and the container's id.
    pub(super) async fn signal_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        signal: &str,
    ) -> (i64, String) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        // The kubelet reports the running container's id a little after it runs.
        let id = eventually(
            WITHIN,
            &format!("{pod}/{container}'s container id"),
            || async {
                let status = status_of(&pods.get(pod).await.ok()?, container)?;
                status.state?.running?;
                status.container_id
            },
        )
        .await;
        let id = id.trim_start_matches("containerd://").to_owned();
        let at = now_us();
        let out = tokio::process::Command::new(kube_bin("ctr"))
            .arg("-a")
            .arg(self.dir.join("containerd/containerd.sock"))
            .args(["-n", "k8s.io", "tasks", "kill", "--signal", signal, &id])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "ctr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (at, id)
    }

    /// Waits until Job `name` has `n` succeeded pods, and returns how many
    /// failed (which, unlike [`Cluster::job_succeeded`], may be some).
    pub(super) async fn job_succeeded_after_failures(
        &self,
        namespace: &str,
        name: &str,
        n: i32,
    ) -> i32 {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        eventually(WITHIN, &format!("Job {name} to succeed"), || async {
            let status = jobs.get(name).await.ok()?.status?;
            (status.succeeded.unwrap_or(0) >= n).then_some(status.failed.unwrap_or(0))
        })
        .await
    }
}

/// Asserts that `holds` (from, until, token, pod) never overlapped and
/// that their fencing tokens rose in the order of the holds.
pub(super) fn assert_took_turns(mut holds: Vec<Hold>) {
    holds.sort();
    for pair in holds.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.1 <= b.0,
            "{} held until {} but {} from {}: {holds:?}",
            a.3,
            a.1,
            b.3,
            b.0
        );
        assert!(a.2 < b.2, "tokens out of order: {holds:?}");
    }
}

/// `examples/gang-sidecar`: 4 pods of an Indexed Job whose native sidecar
/// runs `zkgate barrier sidecar` (an ephemeral registration) and whose
/// startup probe (`zkgate probe`) holds the worker back. No worker starts
/// before the barrier's `ready` node was made, which was after the 4th
/// registration; every sidecar saw it open, and the Barrier completes as
/// the sidecars leave at the pods' end.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn the_gang_sidecar_example_starts_no_worker_before_the_barrier_opened() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("gang-sidecar/barrier.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-sidecar/job.yaml",
            &[(
                "echo worker $JOB_COMPLETION_INDEX starts with the whole gang; sleep 30",
                "echo started-at-us $(now-us); sleep 2",
            )],
        ),
    )
    .await;
    let barrier = c
        .gang_of_started_together(
            &ns.name,
            "train-sidecar",
            "job-name=train-sidecar",
            &[("train-sidecar", 4)],
            "barrier",
        )
        .await;
    let status = barrier.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4), "{status:?}");
    for pod in c.pods(&ns.name, "job-name=train-sidecar").await {
        let sidecar = status_of(&pod, "barrier").unwrap();
        assert_eq!(sidecar.restart_count, 0, "{sidecar:?}");
        // Stopped by the kubelet once the worker ended, it left the
        // barrier after everyone (the double barrier's leave) and exited 0.
        assert_eq!(exit_of(&pod, "barrier"), Some(0), "{sidecar:?}");
    }
}

/// The one-label Job in the sidecar form (`zkgate.io/barrier-form:
/// sidecar` on the pod template): admission injects `zkgate barrier
/// sidecar` as a native sidecar with its startup probe, the controller
/// makes the Job's Barrier (4), and no worker starts before it opened.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_labelled_job_in_the_sidecar_form_starts_no_worker_before_the_barrier_opened() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-job-labelled/job.yaml",
            &[
                ("sleep 30", "echo started-at-us $(now-us); sleep 2"),
                (
                    "zkgate.io/barrier: train   # these pods start together",
                    "zkgate.io/barrier: train\n      annotations:\n        zkgate.io/barrier-form: sidecar",
                ),
            ],
        ),
    ).await;
    let barrier = c.gang_started_together(&ns.name, "zkgate-barrier").await;
    assert_eq!(barrier.spec.job_ref.as_deref(), Some("train"));
    let status = barrier.status.unwrap();
    assert_eq!(
        (status.required, status.entered, status.left),
        (Some(4), 4, 4)
    );
    for pod in c.pods(&ns.name, "job-name=train").await {
        let spec = pod.spec.unwrap();
        let sidecar = spec
            .init_containers
            .iter()
            .flatten()
            .find(|c| c.name == "zkgate-barrier")
            .expect("the injected sidecar");
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        assert!(sidecar.startup_probe.is_some(), "{sidecar:?}");
        assert_eq!(
            sidecar.args.as_ref().unwrap()[..3],
            ["barrier", "sidecar", "train"]
        );
    }
}

/// `examples/lock-sidecar`: 3 pods hold the lock from a native sidecar
/// (`zkgate lock sidecar`), their commands under `zkgate lock watch`. The
/// commands never overlap and their fencing tokens (handed on by the
/// sidecar's token file) rise in the order of the holds.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn the_lock_sidecar_example_takes_turns_with_increasing_fencing_tokens() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("lock-sidecar/locklease.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "lock-sidecar/job.yaml",
            &[(
                "sleep 20'",
                "echo from-us $(now-us) token $ZKGATE_FENCING_TOKEN; sleep 1; echo until-us $(now-us)'",
            )],
        ),
    ).await;
    c.job_succeeded(&ns.name, "upload", 3).await;
    let holds = c
        .holds(
            &ns.name,
            "job-name=upload",
            "upload",
            "uploads with fencing token",
        )
        .await;
    assert_eq!(holds.len(), 3);
    assert_took_turns(holds);
    for pod in c.pods(&ns.name, "job-name=upload").await {
        assert_eq!(exit_of(&pod, "upload"), Some(0));
        // Stopped by the kubelet at the pod's end, it released the lock.
        assert_eq!(exit_of(&pod, "lock"), Some(0), "{}", pod.name_any());
    }
}

/// What the pods of the killed-sidecar test print around their work:
/// `from-us T token N` when the command starts, `until-us T` when it
/// ends, `stopped-us T` when `lock watch` stopped it (SIGTERM). The trap
/// ignores TERM first, so that its own `now-us` is not stopped with the
/// rest of the command's tree.
pub(super) const WATCHED_HOLD: &str = r#"echo from-us $(now-us) token $ZKGATE_FENCING_TOKEN; trap "trap \"\" TERM; echo stopped-us \$(now-us); exit 143" TERM; sleep 12 & wait $!; echo until-us $(now-us)'"#;

/// A hold a pod's log tells: (from, until or stopped, token, pod) and
/// whether it was stopped.
pub(super) fn watched_hold(log: &str, pod: &str) -> Option<(Hold, bool)> {
    let from = times(log, "from-us");
    let (until, stopped) = (times(log, "until-us"), times(log, "stopped-us"));
    let token: i64 = log
        .lines()
        .find_map(|l| l.split_once(" token ")?.1.trim().parse().ok())?;
    match (from.as_slice(), until.as_slice(), stopped.as_slice()) {
        ([from], [until], []) => Some(((*from, *until, token, pod.to_owned()), false)),
        ([from], [], [stopped]) => Some(((*from, *stopped, token, pod.to_owned()), true)),
        _ => panic!("{pod} printed no single hold: {log}"),
    }
}

/// Issue 41, item 5: a lock sidecar killed while it holds (SIGKILL: it
/// withdraws nothing; the kubelet restarts it, and its session lives on in
/// ZooKeeper until the server expires it). What `lock watch` promises:
/// the holder's command is stopped (it exits 6) once the published trust
/// in the hold runs out unrenewed, or the restarted sidecar withdraws the
/// token it finds, and so before the server can expire the session (10 s
/// after the kill at the latest) and grant the lock to the next pod. No
/// two commands overlap across the restart, the tokens rise, and the Job
/// completes with one failed pod (the killed holder's; its replacement
/// holds in turn).
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_lock_sidecar_killed_while_it_holds_has_its_command_stopped_before_anyone_else_holds() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("lock-sidecar/locklease.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example("lock-sidecar/job.yaml", &[("sleep 20'", WATCHED_HOLD)]),
    )
    .await;
    // The first holder: its main container runs only once its sidecar
    // holds (the startup probe), and its command printed the start.
    let holder = eventually(WITHIN, "a holder's command to start", || async {
        for pod in c.pods(&ns.name, "job-name=upload").await {
            let name = pod.name_any();
            if status_of(&pod, "upload")
                .is_some_and(|s| s.state.is_some_and(|s| s.running.is_some()))
                && c.logs_if_any(&ns.name, &name, "upload")
                    .await
                    .is_some_and(|l| l.contains("from-us"))
            {
                return Some(name);
            }
        }
        None
    })
    .await;
    let (killed_at, _) = c.kill_container(&ns.name, &holder, "lock").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let stopped = eventually(WITHIN, "the holder's command to be stopped", || async {
        let pod = pods.get(&holder).await.ok()?;
        exit_of(&pod, "upload")?;
        Some(pod)
    })
    .await;
    let log = c.logs(&ns.name, &holder, "upload").await;
    assert_eq!(
        exit_of(&stopped, "upload"),
        Some(6),
        "lock watch exits 6 when the hold is lost: {log}"
    );
    assert!(log.contains("the command was terminated"), "{log}");

    let failed = c.job_succeeded_after_failures(&ns.name, "upload", 3).await;
    assert_eq!(
        failed,
        1,
        "only the killed holder failed: {}",
        c.describe(&ns.name).await
    );
    let mut holds = Vec::new();
    for pod in c.pods(&ns.name, "job-name=upload").await {
        let name = pod.name_any();
        let log = c.logs(&ns.name, &name, "upload").await;
        if let Some(hold) = watched_hold(&log, &name) {
            holds.push(hold);
        }
        if name == holder {
            let sidecar = status_of(&pod, "lock").unwrap();
            assert!(
                sidecar.restart_count >= 1,
                "the kubelet restarts a killed native sidecar: {sidecar:?}"
            );
        }
    }
    let stopped: Vec<_> = holds.iter().filter(|(_, s)| *s).map(|(h, _)| h).collect();
    assert!(
        stopped.len() == 1 && stopped[0].3 == holder,
        "only the killed holder's command was stopped: {holds:?}"
    );
    // The session timeout the sidecar asks for (the default): the server
    // cannot expire the session, and hand the lock on, any sooner.
    let by = stopped[0].1 - killed_at;
    eprintln!("the command was stopped {by} us after its sidecar was killed; holds {holds:?}");
    assert!(
        by < 10_000_000,
        "the command was stopped {by} us after its sidecar was killed, not before its session could expire"
    );
    assert_eq!(holds.len(), 4, "3 holds, and the killed one: {holds:?}");
    assert_took_turns(holds.into_iter().map(|(h, _)| h).collect());
}

/// Issue 41, item 5: a barrier sidecar killed while it waits at the
/// barrier (3 of 4 entered). The kubelet restarts it; the restarted
/// sidecar registers again under the pod's id (after the killed one's
/// session has ended, whose ephemeral registration it finds), so the
/// pod is counted once: the barrier does not open with 3 pods, and no
/// worker starts. When the 4th pod comes (the Job's parallelism raised),
/// the barrier opens after all 4 current registrations, no worker starts
/// before, and the Barrier completes counting 4.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_barrier_sidecar_killed_while_waiting_is_counted_once_and_the_gang_waits() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("gang-sidecar/barrier.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-sidecar/job.yaml",
            &[
                (
                    "echo worker $JOB_COMPLETION_INDEX starts with the whole gang; sleep 30",
                    "echo started-at-us $(now-us); sleep 2",
                ),
                ("parallelism: 4", "parallelism: 3"),
            ],
        ),
    )
    .await;
    let session = support::session(&c.zookeeper()).await;
    let barrier = Layout::new(ROOT)
        .unwrap()
        .barrier(&ns.name, "train-sidecar")
        .unwrap();
    let ready = format!("{barrier}/ready");
    // `exists` needs no permission: the test reads no data under the ACLs.
    let czxid = |pod: String| {
        let path = format!("{barrier}/{pod}");
        let session = &session;
        async move { Some(session.client().check_stat(&path).await.ok()??.czxid) }
    };
    let selector = "job-name=train-sidecar";
    let three = eventually(WITHIN, "3 pods registered", || async {
        let pods = c.pods(&ns.name, selector).await;
        let mut registered = Vec::new();
        for pod in &pods {
            registered.push((pod.name_any(), czxid(pod.name_any()).await?));
        }
        (registered.len() == 3).then_some(registered)
    })
    .await;
    let (victim, before) = three[0].clone();
    c.kill_container(&ns.name, &victim, "barrier").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let after = eventually(
        WITHIN,
        "the restarted sidecar to register again",
        || async {
            let pod = pods.get(&victim).await.ok()?;
            if status_of(&pod, "barrier")?.restart_count < 1 {
                return None;
            }
            czxid(victim.clone()).await.filter(|z| *z != before)
        },
    )
    .await;
    assert!(after > before);
    // Counted once: 3 of 4, so no opening, and no worker started.
    assert_eq!(
        session.client().check_stat(&ready).await.unwrap(),
        None,
        "the barrier opened with 3 pods"
    );
    for pod in c.pods(&ns.name, selector).await {
        assert!(
            !started(&pod, "worker"),
            "{}'s worker started before the 4th pod: {}",
            pod.name_any(),
            c.describe(&ns.name).await
        );
    }
    let log = c.logs(&ns.name, &victim, "barrier").await;
    assert!(!log.contains("barrier open"), "{log}");
    eprintln!("{victim}'s restarted sidecar: {log}");
    c.barrier(&ns.name, "train-sidecar", "the status to count 3", |b| {
        b.status
            .as_ref()
            .is_some_and(|s| s.entered == 3 && s.phase == Some(BarrierPhase::Waiting))
    })
    .await;

    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    jobs.patch(
        "train-sidecar",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "parallelism": 4 } })),
    )
    .await
    .unwrap();
    let done = c
        .gang_of_started_together(
            &ns.name,
            "train-sidecar",
            selector,
            &[("train-sidecar", 4)],
            "barrier",
        )
        .await;
    let status = done.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4), "{status:?}");
}

/// Issue 41, item 5: a barrier sidecar killed after the opening, while
/// the workers run. The kubelet restarts it; it registers again under
/// the pod's id (once its earlier session has ended) and finds the
/// barrier open, which counted the pod already: the gang is not released
/// again. The `ready` node stays the one made at the opening, the Barrier
/// records one opening, every worker ran once, and the Barrier completes
/// counting 4 as the sidecars leave at the pods' end.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_barrier_sidecar_killed_after_the_opening_does_not_release_the_gang_again() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("gang-sidecar/barrier.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-sidecar/job.yaml",
            &[(
                "echo worker $JOB_COMPLETION_INDEX starts with the whole gang; sleep 30",
                "echo started-at-us $(now-us); sleep 40",
            )],
        ),
    )
    .await;
    let session = support::session(&c.zookeeper()).await;
    let barrier = Layout::new(ROOT)
        .unwrap()
        .barrier(&ns.name, "train-sidecar")
        .unwrap();
    let ready = format!("{barrier}/ready");
    // `exists` needs no permission: the test reads no data under the ACLs.
    let stat = |path: String| {
        let session = &session;
        async move { session.client().check_stat(&path).await.ok()? }
    };
    let selector = "job-name=train-sidecar";
    let (opened, victim) = eventually(WITHIN, "the gang's workers to run", || async {
        let opened = stat(ready.clone()).await?;
        let pods = c.pods(&ns.name, selector).await;
        let running = pods
            .iter()
            .filter(|p| {
                status_of(p, "worker").is_some_and(|s| s.state.is_some_and(|s| s.running.is_some()))
            })
            .count();
        (pods.len() == 4 && running == 4).then(|| (opened, pods[0].name_any()))
    })
    .await;
    let before = stat(format!("{barrier}/{victim}")).await.unwrap().czxid;
    c.kill_container(&ns.name, &victim, "barrier").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    eventually(
        WITHIN,
        "the restarted sidecar to register again",
        || async {
            let pod = pods.get(&victim).await.ok()?;
            if status_of(&pod, "barrier")?.restart_count < 1 {
                return None;
            }
            let now = stat(format!("{barrier}/{victim}")).await?;
            (now.czxid != before).then_some(())
        },
    )
    .await;
    let log = c.logs(&ns.name, &victim, "barrier").await;
    assert!(log.contains("barrier open"), "the restarted sidecar: {log}");
    let again = stat(ready.clone()).await.expect("ready");
    assert_eq!(
        (again.czxid, again.mzxid),
        (opened.czxid, opened.mzxid),
        "the barrier was opened again"
    );

    c.job_succeeded(&ns.name, "train-sidecar", 4).await;
    let done = c
        .barrier(&ns.name, "train-sidecar", "the Barrier to complete", |b| {
            b.status.as_ref().and_then(|s| s.phase) == Some(BarrierPhase::Completed)
        })
        .await;
    let status = done.status.unwrap();
    assert_eq!((status.entered, status.left), (4, 4), "{status:?}");
    for pod in c.pods(&ns.name, selector).await {
        let name = pod.name_any();
        // Ran once: never restarted (its log is only ever its current
        // run's, so the log cannot say this).
        let worker = status_of(&pod, "worker").unwrap();
        assert_eq!(worker.restart_count, 0, "{worker:?}");
        let started = times(&c.logs(&ns.name, &name, "worker").await, "started-at-us");
        assert!(!started.is_empty(), "{name}'s worker logged its start");
        assert!(
            started[0] >= opened.ctime * 1000,
            "{name}'s worker started at {} us, before the opening at {} ms",
            started[0],
            opened.ctime
        );
    }
    let reasons = c.event_reasons(&ns.name).await;
    let openings = reasons.iter().filter(|r| *r == "Opened").count();
    assert_eq!(openings, 1, "{reasons:?}");
    eprintln!("the Barrier's events: {reasons:?}");
}

/// What the workers of the in-place test run: each run appends its round
/// and times to a file of the pod's own emptyDir (`/log`, which outlives
/// the containers as the pod is restarted in place, unlike their logs), a
/// heartbeat every 100 ms while a round-0 command runs (the kubelet kills
/// those with no grace period: nothing of theirs says when they stopped),
/// and the last run prints the file. Rank 0 fails in round 0.
const IN_PLACE_RUNS: &str = ". /var/run/zkgate-pod/round.env; \
    echo run-start-$ZKGATE_ROUND $(now-us) >> /log/events; \
    if [ $ZKGATE_ROUND = 0 ]; then (while true; do echo alive-0 $(now-us) >> /log/events; sleep 0.1; done) & fi; \
    if [ $ZKGATE_ROUND = 0 ] && [ $ZKGATE_RANK = 0 ]; then sleep 2; exit 3; fi; \
    if [ $ZKGATE_ROUND = 0 ]; then sleep 60; fi; \
    sleep 1; echo run-stop-$ZKGATE_ROUND $(now-us) >> /log/events; cat /log/events";

/// Issue 41, item 4: `examples/gang-restart-in-place`, the gang restarting
/// in place (Kubernetes 1.36+: the kubelet's RestartAllContainers). The
/// worker of rank 0 fails once after the opening: its pod's containers
/// restart, the other pods' sidecars exit 7 and theirs restart too, all
/// three meet in round 1 and complete. No pod was recreated (each pod's
/// own volume saw both rounds), no pod failed, no command of round 1
/// started while one of round 0 still ran (its last heartbeat), and the
/// Barrier says round 1, one restart and why.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_restart_gang_job_in_the_sidecar_form_restarts_its_pods_in_place_and_completes() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-restart-in-place/job.yaml",
            &[
                (
                    ". /var/run/zkgate-pod/round.env; echo $(hostname) runs as rank $ZKGATE_RANK of $ZKGATE_MEMBERS in round $ZKGATE_ROUND; sleep 30",
                    IN_PLACE_RUNS,
                ),
                (
                    "            capabilities: {drop: [ALL]}",
                    "            capabilities: {drop: [ALL]}\n          volumeMounts: [{name: log, mountPath: /log}]\n      volumes: [{name: log, emptyDir: {}}]",
                ),
            ],
        ),
    ).await;
    let failed = c
        .job_succeeded_after_failures(&ns.name, "train-in-place", 3)
        .await;
    assert_eq!(failed, 0, "no pod failed: {}", c.describe(&ns.name).await);
    let barrier = c
        .barrier(&ns.name, "train-in-place", "round 1 completed", |b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.round == Some(1) && s.phase == Some(BarrierPhase::Completed))
        })
        .await;
    let status = barrier.status.unwrap();
    assert_eq!(status.restarts, 1, "{status:?}");
    assert!(
        status.round_ends.len() == 1 && status.round_ends[0].contains("restarted in round 0"),
        "{status:?}"
    );
    let pods = c.pods(&ns.name, "job-name=train-in-place").await;
    assert_eq!(pods.len(), 3, "no pod was recreated");
    let restarts: Vec<(String, Option<i32>)> = pods
        .iter()
        .map(|p| {
            let worker = status_of(p, "worker").map(|s| s.restart_count);
            (p.name_any(), worker)
        })
        .collect();
    eprintln!(
        "the workers' restart counts: {restarts:?}; the round ended: {:?}",
        status.round_ends
    );
    let mut round_0_alive = Vec::new();
    let mut round_1_starts = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        let worker = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "worker"))
            .expect("the worker");
        assert!(
            worker.restart_policy_rules.is_some(),
            "the API server kept the worker's restartPolicyRules: {worker:?}"
        );
        let log = c.logs(&ns.name, &name, "worker").await;
        let (starts_0, starts_1, stops_1) = (
            times(&log, "run-start-0"),
            times(&log, "run-start-1"),
            times(&log, "run-stop-1"),
        );
        assert!(
            starts_0.len() == 1 && starts_1.len() == 1 && stops_1.len() == 1,
            "{name} did not run once in each round, in the same pod: {log}"
        );
        let alive = times(&log, "alive-0");
        assert!(!alive.is_empty(), "{name}'s round-0 heartbeat: {log}");
        round_0_alive.extend(alive);
        round_1_starts.extend(starts_1);
    }
    let (last_alive, first_start) = (
        round_0_alive.iter().max().unwrap(),
        round_1_starts.iter().min().unwrap(),
    );
    assert!(
        first_start > last_alive,
        "a command of round 1 started {} us before the last of round 0 was last seen running",
        last_alive - first_start
    );
    let reasons = c.event_reasons(&ns.name).await;
    assert!(reasons.iter().any(|r| r == "GangRestarted"), "{reasons:?}");
}
