//! Issue 41: an Indexed Job's `podFailurePolicy` built on zkgate's exit
//! codes (`examples/lock-shards`), on real pods and the real Job
//! controller: a shard whose hold was revoked (exit 6) is retried without
//! counting, one that cannot reach ZooKeeper (exit 5) counts against its
//! `backoffLimitPerIndex`, and one whose LockLease was deleted (exit 4)
//! fails the Job at once.

use super::*;

/// The annotations the Job controller gives a pod of an Indexed Job with
/// `backoffLimitPerIndex`: the failures of the pod's index before it,
/// counted and ignored (by the failure policy).
const FAILURES: &str = "batch.kubernetes.io/job-index-failure-count";
const IGNORED: &str = "batch.kubernetes.io/job-index-ignored-failure-count";

/// The example's shard command, for the tests to replace.
const SHARD: &str = r#"'echo "shard $JOB_COMPLETION_INDEX (lost holds before: ${LOST:-0}) writes with fencing token $ZKGATE_FENCING_TOKEN"; sleep 10'"#;

/// The exit code of container `shard` of `pod`, once it terminated.
fn shard_exit(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == "shard")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.annotations().get(key).map(String::as_str)
}

impl Cluster {
    /// Waits until Job `name` has the condition `kind` (`Complete` or
    /// `Failed`) and returns its reason.
    async fn job_finished(&self, namespace: &str, name: &str, kind: &str) -> String {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        eventually(WITHIN, &format!("Job {name} to be {kind}"), || async {
            let job = jobs.get(name).await.ok()?;
            let conditions = job.status?.conditions?;
            if let Some(other) = conditions.iter().find(|c| {
                (c.type_ == "Complete" || c.type_ == "Failed")
                    && c.type_ != kind
                    && c.status == "True"
            }) {
                panic!(
                    "Job {name} is {} ({:?}), not {kind}: {}",
                    other.type_,
                    other.message,
                    self.describe(namespace).await
                );
            }
            conditions
                .into_iter()
                .find(|c| c.type_ == kind && c.status == "True")
                .map(|c| c.reason.unwrap_or_default())
        })
        .await
    }
}

/// A shard held past the lease is revoked: `zkgate lock run` stops its
/// command and exits 6, which the Job's rule ignores. With
/// `backoffLimitPerIndex: 0` (any counted failure fails the index) the
/// Job still completes: the index is retried, its new pod says the
/// failure was ignored, not counted, and the other shards hold in turn
/// with rising tokens, the revoked hold's below the next one's.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_shard_whose_hold_was_revoked_is_retried_without_counting() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(
        &ns.name,
        &c.example(
            "lock-shards/locklease.yaml",
            &[("leaseDuration: 5m", "leaseDuration: 6s")],
        ),
    )
    .await;
    // Shard 0's first pod holds on until revoked; every other hold is 1 s.
    let script = "'echo from-us $(now-us) token $ZKGATE_FENCING_TOKEN lost ${LOST:-0}; \
        if [ $JOB_COMPLETION_INDEX = 0 ] && [ -z \"$LOST\" ]; then sleep 60; fi; \
        sleep 1; echo until-us $(now-us)'";
    c.apply(
        &ns.name,
        &c.example(
            "lock-shards/job.yaml",
            &[
                (SHARD, script),
                ("backoffLimitPerIndex: 2", "backoffLimitPerIndex: 0"),
            ],
        ),
    )
    .await;
    let reason = c.job_finished(&ns.name, "ledger-shards", "Complete").await;
    eprintln!("ledger-shards completed: {reason}");
    let pods = c.pods(&ns.name, "job-name=ledger-shards").await;
    let revoked: Vec<&Pod> = pods.iter().filter(|p| shard_exit(p) == Some(6)).collect();
    assert_eq!(
        (pods.len(), revoked.len()),
        (4, 1),
        "3 shards and one retry of shard 0: {}",
        c.describe(&ns.name).await
    );
    let revoked = revoked[0];
    assert_eq!(
        annotation(revoked, "batch.kubernetes.io/job-completion-index"),
        Some("0")
    );
    let log = c.logs(&ns.name, &revoked.name_any(), "shard").await;
    assert!(
        log.contains("for its leaseDuration (6s): the hold is revoked"),
        "{log}"
    );
    let retry = pods
        .iter()
        .find(|p| {
            annotation(p, "batch.kubernetes.io/job-completion-index") == Some("0")
                && p.name_any() != revoked.name_any()
        })
        .expect("shard 0 retried");
    assert_eq!(
        (annotation(retry, FAILURES), annotation(retry, IGNORED)),
        (Some("0"), Some("1")),
        "the revoked pod's failure was ignored, not counted"
    );
    assert_eq!(shard_exit(retry), Some(0));
    let retry_log = c.logs(&ns.name, &retry.name_any(), "shard").await;
    assert!(retry_log.contains("lost 1"), "{retry_log}");

    let mut holds = Vec::new();
    for pod in pods.iter().filter(|p| shard_exit(p) == Some(0)) {
        let log = c.logs(&ns.name, &pod.name_any(), "shard").await;
        let (from, until) = (times(&log, "from-us"), times(&log, "until-us"));
        let token: i64 = log
            .lines()
            .find_map(|l| {
                l.split_once(" token ")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no token in {log}"));
        assert_eq!((from.len(), until.len()), (1, 1), "{log}");
        holds.push((from[0], until[0], token, pod.name_any()));
    }
    holds.sort();
    for pair in holds.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "holds overlap: {holds:?}");
        assert!(pair[0].2 < pair[1].2, "tokens out of order: {holds:?}");
    }
    // The revoked hold: its token is below every later one's (the store a
    // fencing token protects refuses it once another holder wrote).
    let revoked_token: i64 = log
        .lines()
        .find_map(|l| {
            l.split_once(" token ")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    let revoked_from = times(&log, "from-us")[0];
    for hold in holds.iter().filter(|h| h.0 > revoked_from) {
        assert!(
            hold.2 > revoked_token,
            "{hold:?} after the revoked {revoked_token}"
        );
    }
    let reasons = c.event_reasons(&ns.name).await;
    assert!(reasons.iter().any(|r| r == "Revoked"), "{reasons:?}");
}

/// ZooKeeper unreachable (a closed port): each shard's `zkgate lock run`
/// gives up after its connect timeout and exits 5, which no rule ignores:
/// it counts, so each index is retried once (`backoffLimitPerIndex: 1`;
/// the retry says one failure counted) and then fails, and the Job fails
/// with `FailedIndexes`.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_shard_that_cannot_reach_zookeeper_counts_against_its_retries() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("lock-shards/locklease.yaml", &[]))
        .await;
    let closed = format!("{HOST_IP}:1");
    c.apply(
        &ns.name,
        &c.example(
            "lock-shards/job.yaml",
            &[
                (&c.zookeeper(), &closed),
                ("backoffLimitPerIndex: 2", "backoffLimitPerIndex: 1"),
                (
                    r#"- {name: ZKGATE_TIMEOUT, value: "30m"}"#,
                    r#"- {name: ZKGATE_TIMEOUT, value: "30m"}
            - {name: ZKGATE_CONNECT_TIMEOUT, value: "3s"}"#,
                ),
            ],
        ),
    )
    .await;
    let reason = c.job_finished(&ns.name, "ledger-shards", "Failed").await;
    assert_eq!(reason, "FailedIndexes", "{}", c.describe(&ns.name).await);
    let pods = c.pods(&ns.name, "job-name=ledger-shards").await;
    assert_eq!(
        pods.len(),
        6,
        "2 tries of each shard: {}",
        c.describe(&ns.name).await
    );
    for pod in &pods {
        let name = pod.name_any();
        assert_eq!(
            shard_exit(pod),
            Some(5),
            "{name}: {}",
            c.describe(&ns.name).await
        );
        let log = c.logs(&ns.name, &name, "shard").await;
        assert!(!log.contains("writes with fencing token"), "{log}");
        // The first try of each index has no failure before it, the
        // retry one counted and none ignored.
        assert!(
            matches!(
                (annotation(pod, FAILURES), annotation(pod, IGNORED)),
                (Some("0" | "1"), None)
            ),
            "{name}: {:?}",
            pod.annotations()
        );
    }
    let retried = pods
        .iter()
        .filter(|p| annotation(p, FAILURES) == Some("1"))
        .count();
    assert_eq!(retried, 3, "each index retried once, its failure counted");
}

/// The LockLease deleted while shards wait: the waiters' `zkgate lock
/// run` exits 4 (nothing left to wait for), and the rule fails the Job at
/// once (`PodFailurePolicy`), without the retries `backoffLimitPerIndex`
/// would give.
#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn a_shard_whose_locklease_was_deleted_fails_the_job_at_once() {
    let c = cluster().await;
    let ns = c.namespace().await;
    c.apply(&ns.name, &c.example("lock-shards/locklease.yaml", &[]))
        .await;
    c.apply(
        &ns.name,
        &c.example(
            "lock-shards/job.yaml",
            &[(
                SHARD,
                "'echo holds with token $ZKGATE_FENCING_TOKEN; sleep 120'",
            )],
        ),
    )
    .await;
    let locks: Api<zkgate::api::LockLease> = Api::namespaced(c.client.clone(), &ns.name);
    eventually(WITHIN, "one shard holding and two waiting", || async {
        let status = locks.get("ledger").await.ok()?.status?;
        (status.holder_count == 1 && status.waiting_count == 2).then_some(())
    })
    .await;
    locks
        .delete("ledger", &DeleteParams::default())
        .await
        .unwrap();
    let reason = c.job_finished(&ns.name, "ledger-shards", "Failed").await;
    assert_eq!(reason, "PodFailurePolicy", "{}", c.describe(&ns.name).await);
    let pods = c.pods(&ns.name, "job-name=ledger-shards").await;
    let exits: Vec<_> = pods.iter().map(|p| (p.name_any(), shard_exit(p))).collect();
    eprintln!("the shards' exits after the LockLease's deletion: {exits:?}");
    let deleted = pods.iter().filter(|p| shard_exit(p) == Some(4)).count();
    assert!(
        deleted >= 1,
        "a waiter exited 4: {}",
        c.describe(&ns.name).await
    );
    assert!(
        pods.iter().all(|p| annotation(p, FAILURES) == Some("0")),
        "no shard was retried: {}",
        c.describe(&ns.name).await
    );
}
