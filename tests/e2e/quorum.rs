//! Issue 43, item 6: ZooKeeper out of the path of running work, on real
//! pods, through a real loss of quorum. A three-server ensemble on the
//! cluster's bridge (the pods reach it; nothing outside does) serves a
//! controller of the test's own (see [`HostController`]); two of its three
//! servers are killed for a minute, six times the participants' session
//! timeout, and come back on their data.
//!
//! What must hold: a gang whose barrier opened runs on and completes as if
//! nothing happened (no pod fails, no command is stopped), in rounds too
//! (`RestartGang`: no restart); a lock holder, which cannot know whether
//! its session outlives the outage, is stopped during it, and nobody else
//! holds until the quorum is back; and a labelled Job made during the
//! outage is admitted then, and completes after.

use std::net::Ipv4Addr;

use super::sidecars::{assert_took_turns, exit_of, now_us, status_of, watched_hold, WATCHED_HOLD};
use super::*;
use support::zookeeper::{Ensemble, EnsembleConfig};

/// How long the quorum is gone: longer than any session timeout a
/// participant runs with here (10 s), as a botched rolling restart or a
/// zone's loss would make it.
const OUTAGE: Duration = Duration::from_secs(60);

/// A gang of 3 in the wrap form (`zkgate barrier run` around the
/// command), by label and annotation; its command outlives the outage.
/// `backoffLimit: 0`: a pod that failed would fail the Job.
const GANG: &str = r#"apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  completions: 3
  parallelism: 3
  backoffLimit: 0
  template:
    metadata:
      labels: {zkgate.io/barrier: train}
      annotations: {zkgate.io/barrier-form: wrap}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: worker
          image: workload:local
          command: ["sh", "-c", "echo started-at-us $(now-us); sleep 90; echo until-us $(now-us)"]
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
"#;

/// A gang of 2 in the init form, by label alone, made while the quorum is
/// gone.
const LATE: &str = r#"apiVersion: batch/v1
kind: Job
metadata: {name: late}
spec:
  completions: 2
  parallelism: 2
  backoffLimit: 0
  template:
    metadata:
      labels: {zkgate.io/barrier: late}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: worker
          image: workload:local
          command: ["sh", "-c", "echo started-at-us $(now-us)"]
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
"#;

/// `examples/gang-restart` (3 pods in rounds, the wrap form): each run
/// says its round when it starts and when it ends; the command outlives
/// the outage.
const IN_ROUNDS: &str =
    "echo run-start-$ZKGATE_ROUND $(now-us); sleep 90; echo run-end-$ZKGATE_ROUND $(now-us)";

#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_running_gang_outlives_a_minute_without_quorum_and_a_lock_holder_is_stopped() {
    let c = cluster().await;
    let ns = c.namespace().await;
    let host: Ipv4Addr = HOST_IP.parse().expect("the bridge's address");
    let mut ensemble = tokio::task::spawn_blocking(move || {
        Ensemble::start_with(EnsembleConfig {
            host,
            ..Default::default()
        })
    })
    .await
    .expect("the ensemble");
    let zookeeper = ensemble.connect_string();
    // The ensemble is this test's alone: the root every participant
    // assumes unless told (the lock example tells it nothing).
    let root = ROOT;
    let _controller = c
        .host_controller(
            &ns.name,
            &zookeeper,
            root,
            &["barrier", "lock", "credentials"],
            &[],
        )
        .await;

    c.apply(&ns.name, GANG).await;
    c.apply(
        &ns.name,
        &c.example(
            "gang-restart/job.yaml",
            &[(
                "echo $(hostname) runs with the whole gang; sleep 30",
                IN_ROUNDS,
            )],
        ),
    )
    .await;
    c.apply(&ns.name, &c.example("lock-sidecar/locklease.yaml", &[]))
        .await;
    let hold = WATCHED_HOLD.replace("sleep 12", "sleep 30");
    c.apply(
        &ns.name,
        &c.example(
            "lock-sidecar/job.yaml",
            &[
                (&c.zookeeper(), &zookeeper),
                ("completions: 3", "completions: 2"),
                ("parallelism: 3", "parallelism: 2"),
                ("sleep 20'", &hold),
            ],
        ),
    )
    .await;

    // The gangs' commands all run (their barriers opened), and one pod
    // holds the lock (its command printed its start).
    for (job, says) in [("train", "started-at-us"), ("train-rounds", "run-start-0")] {
        eventually(WITHIN, &format!("{job}'s 3 commands to start"), || async {
            let mut started = 0;
            for pod in c.pods(&ns.name, &format!("job-name={job}")).await {
                let log = c.logs_if_any(&ns.name, &pod.name_any(), "worker").await;
                started += usize::from(log.is_some_and(|l| l.contains(says)));
            }
            (started == 3).then_some(())
        })
        .await;
    }
    let holder = eventually(WITHIN, "a holder's command to start", || async {
        for pod in c.pods(&ns.name, "job-name=upload").await {
            let name = pod.name_any();
            if c.logs_if_any(&ns.name, &name, "upload")
                .await
                .is_some_and(|l| l.contains("from-us"))
            {
                return Some(name);
            }
        }
        None
    })
    .await;

    // The quorum goes: the leader and one follower, killed.
    let leader = ensemble.leader().expect("a leader");
    let down = [leader, (leader + 1) % 3];
    let lost_at = now_us();
    let quorum_back = tokio::time::Instant::now() + OUTAGE;
    for i in down {
        ensemble.servers[i].kill();
    }
    eprintln!("servers {down:?} killed at {lost_at} us; the third has no quorum");

    // The holder cannot tell an outage from being cut off: its command is
    // stopped (exit 6) before its session could expire.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let stopped = eventually(OUTAGE, "the holder's command to be stopped", || async {
        let pod = pods.get(&holder).await.ok()?;
        exit_of(&pod, "upload")
    })
    .await;
    assert_eq!(stopped, 6, "lock watch exits 6 when the hold may be lost");

    // Admission needs no ZooKeeper (issue 43, item 3): a labelled Job made
    // now has its pods admitted, given their barrier container by the
    // webhook of a controller without a quorum; they wait for it.
    c.apply(&ns.name, LATE).await;
    eventually(WITHIN, "late's 2 pods admitted", || async {
        let pods = c.pods(&ns.name, "job-name=late").await;
        let injected = pods.iter().filter(|p| {
            p.spec.as_ref().is_some_and(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .any(|c| c.name == "zkgate-barrier")
            })
        });
        (injected.count() == 2).then_some(())
    })
    .await;
    assert!(
        tokio::time::Instant::now() < quorum_back,
        "late's pods were admitted only after the outage's minute"
    );

    // The rest of the minute: the fault's length, not a wait for anything.
    tokio::time::sleep_until(quorum_back).await;
    let mut gangs = c.pods(&ns.name, "job-name=train").await;
    gangs.extend(c.pods(&ns.name, "job-name=train-rounds").await);
    for pod in gangs {
        let worker = status_of(&pod, "worker").expect("the worker's status");
        assert!(
            worker.state.as_ref().is_some_and(|s| s.running.is_some()) && worker.restart_count == 0,
            "{}'s command runs on through the outage: {worker:?}",
            pod.name_any()
        );
    }
    let back_at = now_us();
    let ensemble = tokio::task::spawn_blocking(move || {
        for i in down {
            ensemble.servers[i].restart();
        }
        for i in down {
            ensemble.servers[i].wait_serving(Duration::from_secs(60));
        }
        ensemble
    })
    .await
    .expect("the servers back");
    eprintln!("the quorum is back at {back_at} us");

    // The gang completes with no pod failed and every command whole.
    c.job_succeeded(&ns.name, "train", 3).await;
    for pod in c.pods(&ns.name, "job-name=train").await {
        let name = pod.name_any();
        let log = c.logs(&ns.name, &name, "worker").await;
        assert_eq!(exit_of(&pod, "worker"), Some(0), "{name}: {log}");
        let (from, until) = (times(&log, "started-at-us"), times(&log, "until-us"));
        assert!(
            from.len() == 1 && from[0] < lost_at && until.len() == 1 && until[0] > back_at,
            "{name}'s one command ran from before the outage to after it: {log}"
        );
    }
    let barrier = c
        .barrier(&ns.name, "train", "the Barrier to count 3 left", |b| {
            b.status.as_ref().is_some_and(|s| s.left == 3)
        })
        .await;
    let status = barrier.status.expect("the Barrier's status");
    assert_eq!(status.entered, 3, "every member entered once: {status:?}");

    // The Job admitted during the outage completes once the quorum is
    // back, its gang started after it.
    c.job_succeeded(&ns.name, "late", 2).await;
    for pod in c.pods(&ns.name, "job-name=late").await {
        let name = pod.name_any();
        let log = c.logs(&ns.name, &name, "worker").await;
        let from = times(&log, "started-at-us");
        assert!(
            from.len() == 1 && from[0] > back_at,
            "{name}'s command started once, after the quorum was back: {log}"
        );
    }

    // In rounds: no restart, each command run once, in round 0.
    c.job_succeeded(&ns.name, "train-rounds", 3).await;
    for pod in c.pods(&ns.name, "job-name=train-rounds").await {
        let name = pod.name_any();
        let log = c.logs(&ns.name, &name, "worker").await;
        let (from, until) = (times(&log, "run-start-0"), times(&log, "run-end-0"));
        assert!(
            from.len() == 1 && from[0] < lost_at && until.len() == 1 && until[0] > back_at,
            "{name}'s one command ran from before the outage to after it: {log}"
        );
        assert!(!log.contains("run-start-1"), "{name} ran again: {log}");
        let worker = status_of(&pod, "worker").expect("the worker's status");
        assert_eq!(worker.restart_count, 0, "{name}: {worker:?}");
    }
    let rounds = c
        .barrier(
            &ns.name,
            "train-rounds",
            "the gang in rounds to complete",
            |b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Some(BarrierPhase::Completed))
            },
        )
        .await;
    let status = rounds.status.expect("the Barrier's status");
    assert_eq!(
        (status.round, status.restarts),
        (Some(0), 0),
        "the gang in rounds restarted: {status:?}"
    );

    // The lock: the stopped holder's pod failed and was replaced; nobody
    // held beside anyone, nor during the outage.
    let failed = c.job_succeeded_after_failures(&ns.name, "upload", 2).await;
    assert_eq!(
        failed,
        1,
        "only the stopped holder failed: {}",
        c.describe(&ns.name).await
    );
    let mut holds = Vec::new();
    for pod in c.pods(&ns.name, "job-name=upload").await {
        let name = pod.name_any();
        let log = c.logs(&ns.name, &name, "upload").await;
        if let Some(hold) = watched_hold(&log, &name) {
            holds.push(hold);
        }
    }
    assert_eq!(holds.len(), 3, "2 holds, and the stopped one: {holds:?}");
    for ((from, until, _, pod), stopped) in &holds {
        if *stopped {
            assert!(
                *pod == holder && *from < lost_at && (lost_at..back_at).contains(until),
                "only the holder was stopped, during the outage: {holds:?}"
            );
        } else {
            assert!(
                *from > back_at,
                "{pod} held only once the quorum was back: {holds:?}"
            );
        }
    }
    assert_took_turns(holds.into_iter().map(|(h, _)| h).collect());
    drop(ensemble);
}
