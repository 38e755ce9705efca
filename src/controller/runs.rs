//! A Barrier per run. The Barrier a Job's pod template labels
//! (`zkgate.io/barrier: NAME`) belongs to one live Job at a time, its run
//! (see [`plan`]): the controller makes it for the oldest live Job, and
//! replaces an earlier run's once that run is over (its Job finished or
//! gone: a Job made again, a CronJob's next run). The run (the Job's uid)
//! is in the barrier node's data, and a participant told its run never
//! registers in another run's node; admission refuses the pods of a second
//! live Job (see `webhook`).
//!
//! Plans are made per (namespace, label), from caches of Jobs and Barriers,
//! one at a time, whenever a labelled Job changes or goes, a Barrier goes,
//! or a plan failed a while ago; never from a partial listing. Nothing
//! waits: a deletion plans again when the Barrier is gone.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::time::{delay_queue, DelayQueue};
use tracing::{debug, info, warn};

use crate::api::{Barrier, BarrierSpec};
use crate::workload::lookup::{jobset_size, run_is_live};
use crate::workload::run::{
    barrier_label, finished, holder_of, live, run_of, run_of_job, suspended, Run, RUN_LABEL,
};
use crate::workload::template::{after_of, barrier_timeout, loss_policy};

/// What asks for a plan.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Touch {
    /// A labelled Job changed or went: its namespace and label.
    Label(String, String),
    /// The Jobs were listed (again): every label.
    All,
}

impl Touch {
    /// The touch of `job`'s label, if its pod template carries one.
    pub fn of(job: &Job) -> Option<Touch> {
        Some(Touch::Label(
            job.namespace()?,
            barrier_label(job)?.to_owned(),
        ))
    }
}

/// Whether a pod of `job` succeeded, or it finished.
fn made_progress(job: &Job) -> bool {
    finished(job) || job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0
}

/// What to do about the Barrier a label names, given the Jobs whose pod
/// templates carry it (see [`plan`]).
#[derive(Debug, PartialEq)]
enum Plan<'a> {
    /// Nothing: the Barrier is the live run's, or made by hand, or no Job
    /// runs.
    Nothing,
    /// Make it for this Job (the oldest live one).
    Make(&'a Job),
    /// It is an earlier run's (its Job gone or finished): delete that
    /// Barrier (by uid); its deletion plans again, and makes it for the
    /// oldest live Job then.
    Replace {
        /// The earlier run's Barrier's uid.
        old: String,
        /// Its Job's name (the Job may be gone).
        holder: String,
        /// The Job the Barrier will be made for.
        new: String,
    },
    /// It is being deleted: its deletion plans again.
    AfterDeletion,
    /// A live Job has it, and these other live Jobs label it too: their
    /// pods are refused at admission, and wait if admitted earlier.
    Shared { holder: String, others: Vec<String> },
}

/// The one rule of runs: a label's Barrier belongs to one live run at a
/// time (a Job, or one restart of a JobSet: all its child Jobs). The oldest
/// live run gets it when there is none, or when the one there belongs to a
/// run that is over; a live holder keeps it (whether its template still
/// carries the label or not: `holder_live`, from the cache of every Job).
fn plan<'a>(barrier: Option<&Barrier>, labelled: &[&'a Job], holder_live: bool) -> Plan<'a> {
    let mut running: Vec<(&Job, Run)> = labelled
        .iter()
        .copied()
        .filter(|j| live(j))
        .filter_map(|j| Some((j, run_of_job(j)?)))
        .collect();
    running.sort_by_key(|(j, _)| {
        (
            j.metadata.creation_timestamp.as_ref().map(|t| t.0),
            j.name_any(),
        )
    });
    let oldest = running.first().map(|&(j, _)| j);
    let Some(barrier) = barrier else {
        return oldest.map_or(Plan::Nothing, Plan::Make);
    };
    if barrier.metadata.deletion_timestamp.is_some() {
        return Plan::AfterDeletion;
    }
    let Some((owner, run)) = holder_of(barrier) else {
        return Plan::Nothing;
    };
    // Its run suspended (preempted by a queue) before any of it finished:
    // its pods are gone, and at its resume they must meet again, not pass
    // this opening. The Barrier goes now and is made again when the run is
    // live again. A run that made progress (a pod of it succeeded, a child
    // Job completed) keeps its Barrier: a new one would be sized for pods
    // that will not run again, and never open.
    let of_run: Vec<&Job> = labelled
        .iter()
        .copied()
        .filter(|j| run_of_job(j).is_some_and(|r| r.id == run))
        .collect();
    if !of_run.is_empty()
        && of_run.iter().all(|j| suspended(j) && !made_progress(j))
        && !holder_live
        && !running.iter().any(|(_, r)| r.id == run)
    {
        return Plan::Replace {
            old: barrier.uid().unwrap_or_default(),
            holder: owner.name.clone(),
            new: owner.name.clone(),
        };
    }
    let Some(oldest) = oldest else {
        return Plan::Nothing;
    };
    let others = || -> Vec<String> {
        running
            .iter()
            .filter(|(_, r)| r.id != run)
            .map(|(j, _)| j.name_any())
            .collect()
    };
    if running.iter().any(|(_, r)| r.id == run) {
        let others = others();
        return if others.is_empty() {
            Plan::Nothing
        } else {
            Plan::Shared {
                holder: owner.name.clone(),
                others,
            }
        };
    }
    // Its Job runs without the label (it was changed, or the Barrier's
    // owner was set by hand): not a run that is over.
    if holder_live {
        return Plan::Shared {
            holder: owner.name.clone(),
            others: others(),
        };
    }
    Plan::Replace {
        old: barrier.uid().unwrap_or_default(),
        holder: owner.name.clone(),
        new: oldest.name_any(),
    }
}

/// Makes Barrier `name` for `job`'s run, owned by the run's owner (deleted
/// with it): a Job's is sized from the Job (`spec.jobRef`), a JobSet's over
/// the replicated Jobs whose pod template carries the label ([`crate::workload::lookup::jobset_size`]).
/// Its timeout is the pod template's, else `default_timeout`.
async fn make_barrier(
    client: &kube::Client,
    api: &Api<Barrier>,
    name: &str,
    job: &Job,
    default_timeout: Option<&str>,
) -> Result<Seen, kube::Error> {
    let (Some(namespace), Some(run)) = (job.namespace(), run_of_job(job)) else {
        return Ok(Seen::Done);
    };
    let (participants, job_ref) = if run.of_jobset() {
        match jobset_size(client, &namespace, &run.owner, name).await? {
            Ok(n) => (Some(n), None),
            Err(why) => {
                warn!(%namespace, barrier = %name, jobset = %run.owner.name, %why, "cannot size the JobSet's Barrier; its pods wait");
                return Ok(Seen::Done);
            }
        }
    } else {
        (None, Some(job.name_any()))
    };
    // The pod template's annotations say how the gang takes a loss (the
    // webhook refuses its pods when they are invalid; here such a value is
    // left at the default).
    let annotations = job
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let (on_participant_loss, max_restarts) = loss_policy(&annotations).unwrap_or_default();
    let after = after_of(&annotations).unwrap_or_default();
    // The platform's default bounds a gang's one meeting: not a gang in
    // rounds (each later round is timed too, from its node's making) nor
    // one waiting for others (it would wait their whole run out). Theirs
    // is the pod template's only.
    let defaulted =
        on_participant_loss != crate::api::OnParticipantLoss::RestartGang && after.is_empty();
    let timeout = barrier_timeout(&annotations)
        .ok()
        .flatten()
        .or_else(|| default_timeout.filter(|_| defaulted).map(str::to_owned));
    let mut barrier = Barrier::new(
        name,
        BarrierSpec {
            participants,
            job_ref,
            on_participant_loss,
            // Bounded by default: the wrapped command fails inside its
            // container, which the Job's own backoffLimit never sees.
            max_restarts: (on_participant_loss == crate::api::OnParticipantLoss::RestartGang).then(
                || {
                    max_restarts.unwrap_or_else(|| {
                        job.spec
                            .as_ref()
                            .and_then(|s| s.backoff_limit)
                            .map_or(6, |b| b.clamp(0, 100) as u32)
                    })
                },
            ),
            after,
            timeout,
        },
    );
    // The run is a label's value: an owner reference written by hand (any
    // string) may not make one, and would fail every create.
    if !label_value(&run.id) {
        warn!(%namespace, barrier = %name, run = %run.id, "the run is no label value (an owner reference written by hand?); no Barrier is made for it");
        return Ok(Seen::Done);
    }
    let mut labels = crate::workload::managed_by();
    if run.of_jobset() {
        labels.insert(RUN_LABEL.to_owned(), run.id.clone());
    }
    barrier.metadata.labels = Some(labels);
    barrier.metadata.owner_references = Some(vec![run.owner.clone()]);
    match api.create(&PostParams::default(), &barrier).await {
        Ok(_) => {
            info!(%namespace, barrier = %name, owner = %run.owner.name, kind = %run.owner.kind, run = %run.id, "made the run's Barrier");
            Ok(Seen::Done)
        }
        // One there the cache does not know of yet: look again.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Seen::Later),
        Err(e) => Err(e),
    }
}

/// Whether `value` can be a label's value: at most 63 characters,
/// alphanumerics, `-`, `_` and `.`, beginning and ending alphanumeric.
fn label_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && edge(value.chars().next())
        && edge(value.chars().last())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A plan that failed (or found the caches behind) is tried again after
/// this, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The Barrier cache keeps what plans read: names, uids, owners, deletion.
fn strip(barrier: &mut Barrier) {
    barrier.managed_fields_mut().clear();
    barrier.metadata.annotations = None;
    // The labels stay: `run_of` reads them.
    barrier.spec = BarrierSpec::default();
    barrier.status = None;
}

/// Keeps every labelled Job's Barrier its run's (see the module's doc),
/// until the Barrier watch ends (never: it retries) or `touches` closes.
/// `barriers` is the API of the Barriers in scope; `jobs` the Job cache
/// (filled by the stream the Barrier controller polls, which sends the
/// touches). A Barrier made without a timeout of its pod template's
/// gets `default_timeout`.
pub async fn keep(
    client: kube::Client,
    barriers: Api<Barrier>,
    jobs: Store<Job>,
    mut touches: UnboundedReceiver<Touch>,
    default_timeout: Option<String>,
) {
    let (cache, writer) = reflector::store();
    let events = watcher(barriers, watcher::Config::default())
        .default_backoff()
        .modify(strip)
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut pending: BTreeSet<Touch> = BTreeSet::new();
    let mut retries = Retries::default();
    loop {
        tokio::select! {
            touch = touches.recv() => match touch {
                Some(touch) => { pending.insert(touch); }
                None => return,
            },
            Some(event) = events.next() => match event {
                Ok(watcher::Event::Delete(gone)) => {
                    if let Some(namespace) = gone.namespace() {
                        pending.insert(Touch::Label(namespace, gone.name_any()));
                    }
                }
                Ok(watcher::Event::InitDone) => { pending.insert(Touch::All); }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "cannot watch Barriers (retried); labelled Jobs' Barriers wait"),
            },
            Some(due) = retries.next_due() => {
                pending.insert(due);
            }
        }
        // Never from a partial listing: a live Job missing from it would
        // look like a run that is over.
        let listed = matches!(jobs.wait_until_ready().now_or_never(), Some(Ok(())))
            && matches!(cache.wait_until_ready().now_or_never(), Some(Ok(())));
        if !listed {
            continue;
        }
        if pending.remove(&Touch::All) {
            pending.extend(jobs.state().iter().filter_map(|j| Touch::of(j)));
        }
        while let Some(touch) = pending.pop_first() {
            let Touch::Label(namespace, label) = &touch else {
                continue;
            };
            match see_to(
                &client,
                &jobs,
                &cache,
                namespace,
                label,
                default_timeout.as_deref(),
            )
            .await
            {
                Ok(Seen::Done) => retries.done(&touch),
                Ok(Seen::Later) => {
                    retries.again(touch);
                }
                Err(e) => {
                    let delay = retries.again(touch.clone());
                    warn!(%namespace, barrier = %label, error = %e, retry_in = ?delay, "cannot see to the Barrier of a labelled Job; trying again");
                }
            }
        }
    }
}

/// Plans to look at again later: one entry per touch, however often it is
/// asked for, each after a delay that doubles (from [`RETRY_FIRST`] to
/// [`RETRY_MAX`]) until a plan for it is done.
#[derive(Default)]
struct Retries {
    queue: DelayQueue<Touch>,
    /// The touches queued, their queue keys and their current delay.
    queued: HashMap<Touch, (delay_queue::Key, Duration)>,
    /// The delay of the next retry of touches not queued now.
    delays: HashMap<Touch, Duration>,
}

impl Retries {
    /// Looks at `touch` again later (once, if it is queued already);
    /// returns when.
    fn again(&mut self, touch: Touch) -> Duration {
        if let Some((_, delay)) = self.queued.get(&touch) {
            return *delay;
        }
        let delay = self
            .delays
            .get(&touch)
            .map_or(RETRY_FIRST, |d| (*d * 2).min(RETRY_MAX));
        self.delays.insert(touch.clone(), delay);
        let key = self.queue.insert(touch.clone(), delay);
        self.queued.insert(touch, (key, delay));
        delay
    }

    /// A plan for `touch` is done: no retry, and the delay starts over.
    fn done(&mut self, touch: &Touch) {
        self.delays.remove(touch);
        if let Some((key, _)) = self.queued.remove(touch) {
            self.queue.remove(&key);
        }
    }

    /// The next touch whose delay is over; `None` at once when none is
    /// queued (a disabled `select!` branch).
    async fn next_due(&mut self) -> Option<Touch> {
        let due = futures::future::poll_fn(|cx| self.queue.poll_expired(cx))
            .await?
            .into_inner();
        self.queued.remove(&due);
        Some(due)
    }
}

/// How a plan went.
enum Seen {
    /// Carried out (or nothing to do until something changes).
    Done,
    /// Look again in a moment: the caches were behind the API server.
    Later,
}

/// Makes and carries out the plan for Barrier `label` in `namespace`.
async fn see_to(
    client: &kube::Client,
    jobs: &Store<Job>,
    barriers: &Store<Barrier>,
    namespace: &str,
    label: &str,
    default_timeout: Option<&str>,
) -> Result<Seen, kube::Error> {
    let all = jobs.state();
    let labelled: Vec<&Job> = all
        .iter()
        .map(|j| &**j)
        .filter(|j| j.namespace().as_deref() == Some(namespace) && barrier_label(j) == Some(label))
        .collect();
    let barrier = barriers.get(&ObjectRef::new(label).within(namespace));
    // In this namespace only: a JobSet's run comes from an owner reference,
    // which anyone may write on a Job of theirs.
    let holder_live = barrier.as_deref().and_then(run_of).is_some_and(|run| {
        all.iter().any(|j| {
            j.namespace().as_deref() == Some(namespace)
                && live(j)
                && run_of_job(j).is_some_and(|r| r.id == run)
        })
    });
    let api: Api<Barrier> = Api::namespaced(client.clone(), namespace);
    match plan(barrier.as_deref(), &labelled, holder_live) {
        Plan::Nothing | Plan::AfterDeletion => Ok(Seen::Done),
        Plan::Make(job) => make_barrier(client, &api, label, job, default_timeout).await,
        Plan::Replace { old, holder, new } => {
            // Its run asked of the API server, not the cache: a live run's
            // Barrier is never taken from it.
            if let Some((owner, run)) = barrier.as_deref().and_then(holder_of) {
                if run_is_live(client, namespace, owner, &run).await? {
                    return Ok(Seen::Later);
                }
            }
            info!(%namespace, barrier = %label, earlier = %holder, job = %new, "the Barrier is an earlier run's: replacing it with this run's");
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(old),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(label, &params).await {
                // Its deletion (the finalizer tells its waiters and removes
                // its nodes first) plans again.
                Ok(_) => Ok(Seen::Done),
                // Gone already, or another there now: the cache is behind.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(Seen::Later),
                Err(e) => Err(e),
            }
        }
        Plan::Shared { holder, others } => {
            debug!(%namespace, barrier = %label, %holder, ?others, "live Jobs label the same Barrier: it stays the oldest's; the others' pods are refused until it is over");
            Ok(Seen::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::run::JOBSET_RESTART_LABEL;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn labelled(name: &str, uid: &str, created: i64, over: bool) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.metadata.namespace = Some("ns".into());
        j.metadata.uid = Some(uid.into());
        j.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        if over {
            j.status = Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: "Complete".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
        j
    }

    fn barrier_of(uid: &str, run: Option<&str>) -> Barrier {
        let mut b = Barrier::new("train", BarrierSpec::default());
        b.metadata.uid = Some(uid.into());
        b.metadata.labels = Some(crate::workload::managed_by());
        b.metadata.owner_references = run.map(|run| {
            vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: "train".into(),
                uid: run.into(),
                ..Default::default()
            }]
        });
        b
    }

    #[test]
    fn a_labels_barrier_belongs_to_one_running_job_at_a_time() {
        let first = labelled("train", "j1", 100, false);
        let later = labelled("other", "j2", 200, false);
        let first_over = labelled("train", "j1", 100, true);
        assert_eq!(
            plan(None, &[&later, &first], false),
            Plan::Make(&first),
            "the oldest running"
        );
        assert_eq!(
            plan(None, &[&first_over], false),
            Plan::Nothing,
            "nothing runs"
        );
        let firsts = barrier_of("b1", Some("j1"));
        assert_eq!(
            plan(Some(&firsts), &[&first], false),
            Plan::Nothing,
            "its own"
        );
        assert_eq!(
            plan(Some(&firsts), &[&first, &later], false),
            Plan::Shared {
                holder: "train".into(),
                others: vec!["other".into()]
            },
            "a running holder keeps it"
        );
        assert_eq!(
            plan(Some(&firsts), &[&first_over, &later], false),
            Plan::Replace {
                old: "b1".into(),
                holder: "train".into(),
                new: "other".into()
            },
            "the holder's run is over"
        );
        let again = labelled("train", "j3", 300, false);
        assert_eq!(
            plan(Some(&firsts), &[&again], false),
            Plan::Replace {
                old: "b1".into(),
                holder: "train".into(),
                new: "train".into()
            },
            "the holder is gone: a Job made again under its name"
        );
        let mut deleting = firsts.clone();
        deleting.metadata.deletion_timestamp = first.metadata.creation_timestamp.clone();
        assert_eq!(plan(Some(&deleting), &[&again], false), Plan::AfterDeletion);
        let by_hand = barrier_of("b0", None);
        assert_eq!(
            plan(Some(&by_hand), &[&first, &later], false),
            Plan::Nothing,
            "made by hand: never replaced"
        );
        assert!(
            matches!(plan(Some(&firsts), &[&later], true), Plan::Shared { .. }),
            "its Job runs without the label: not over"
        );
        let mut theirs = firsts.clone();
        theirs.metadata.labels = None;
        assert_eq!(
            run_of(&theirs),
            None,
            "made by hand, owned by a Job: no run"
        );
        assert_eq!(
            plan(Some(&theirs), &[&later], false),
            Plan::Nothing,
            "never replaced"
        );
        let mut being_deleted = first.clone();
        being_deleted.metadata.deletion_timestamp = first.metadata.creation_timestamp.clone();
        assert!(!live(&being_deleted));
        assert!(!live(&first_over));
    }

    /// A child Job of JobSet `jobset` (uid), of its restart `restart`.
    fn child(name: &str, uid: &str, created: i64, jobset: &str, restart: u32) -> Job {
        let mut j = labelled(name, uid, created, false);
        j.metadata.labels = Some([(JOBSET_RESTART_LABEL.to_owned(), restart.to_string())].into());
        j.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "jobset.x-k8s.io/v1alpha2".into(),
            kind: "JobSet".into(),
            name: "gang".into(),
            uid: jobset.into(),
            controller: Some(true),
            ..Default::default()
        }]);
        j
    }

    #[test]
    fn a_jobsets_child_jobs_of_one_restart_are_one_run() {
        let w0 = child("gang-w-0", "j1", 100, "s1", 0);
        let w1 = child("gang-w-1", "j2", 101, "s1", 0);
        let run = run_of_job(&w0).unwrap();
        assert_eq!(run.id, "s1.0");
        assert!(run.of_jobset());
        assert_eq!(
            (run.owner.kind.as_str(), run.owner.controller),
            ("JobSet", Some(false)),
            "owned by the JobSet, which does not control it"
        );
        assert_eq!(run_of_job(&w1).unwrap().id, run.id);
        assert_eq!(plan(None, &[&w1, &w0], false), Plan::Make(&w0));
        let mut made = Barrier::new("gang", BarrierSpec::default());
        made.metadata.uid = Some("b1".into());
        made.metadata.labels = Some(crate::workload::managed_by());
        made.metadata.owner_references = Some(vec![run.owner.clone()]);
        assert_eq!(
            run_of(&made),
            None,
            "a JobSet's Barrier without its run label"
        );
        made.labels_mut().insert(RUN_LABEL.into(), "s2.0".into());
        assert_eq!(run_of(&made), None, "another JobSet's run");
        made.labels_mut().insert(RUN_LABEL.into(), "s1.0".into());
        assert_eq!(run_of(&made).as_deref(), Some("s1.0"));
        assert_eq!(
            plan(Some(&made), &[&w0, &w1], false),
            Plan::Nothing,
            "its child Jobs share it"
        );
        let job = labelled("other", "j9", 200, false);
        assert_eq!(
            plan(Some(&made), &[&w0, &w1, &job], false),
            Plan::Shared {
                holder: "gang".into(),
                others: vec!["other".into()]
            }
        );
        let mut gone = w0.clone();
        gone.metadata.deletion_timestamp = w0.metadata.creation_timestamp.clone();
        let restarted = child("gang-w-0", "j3", 300, "s1", 1);
        assert_eq!(
            plan(Some(&made), &[&gone, &restarted], false),
            Plan::Replace {
                old: "b1".into(),
                holder: "gang".into(),
                new: "gang-w-0".into()
            },
            "a restart is a run of its own"
        );
    }

    #[test]
    fn a_suspended_run_that_made_progress_keeps_its_barrier() {
        // A plain Job preempted after 2 of its 4 pods succeeded: a new
        // Barrier (sized 4 by the Job) would never open for the 2 left.
        let mut job = labelled("train", "j1", 100, false);
        job.spec = Some(k8s_openapi::api::batch::v1::JobSpec {
            suspend: Some(true),
            ..Default::default()
        });
        job.status = Some(k8s_openapi::api::batch::v1::JobStatus {
            succeeded: Some(2),
            ..Default::default()
        });
        let firsts = barrier_of("b1", Some("j1"));
        assert_eq!(plan(Some(&firsts), &[&job], false), Plan::Nothing);
        // A JobSet suspends only its active child Jobs: one completed
        // already is progress too.
        let mut done = child("gang-w-0", "j2", 100, "s1", 0);
        done.status = labelled("x", "x", 0, true).status;
        let mut waiting = child("gang-w-1", "j3", 101, "s1", 0);
        waiting.spec = job.spec.clone();
        let mut made = barrier_of("b2", None);
        made.metadata.owner_references = Some(vec![run_of_job(&done).unwrap().owner]);
        made.labels_mut().insert(RUN_LABEL.into(), "s1.0".into());
        assert_eq!(plan(Some(&made), &[&done, &waiting], false), Plan::Nothing);
        let mut both = done.clone();
        both.status = None;
        both.spec = job.spec.clone();
        assert!(
            matches!(
                plan(Some(&made), &[&both, &waiting], false),
                Plan::Replace { .. }
            ),
            "every child Job suspended before any finished: replaced"
        );
    }

    #[test]
    fn a_jobset_child_with_a_restart_label_that_is_no_number_has_no_run() {
        let mut j = child("gang-w-0", "j1", 100, "s1", 0);
        j.labels_mut()
            .insert(JOBSET_RESTART_LABEL.into(), "0.x-".into());
        assert_eq!(run_of_job(&j), None);
        assert!(label_value(
            "4b3c2d1e-0000-4000-8000-000000000001.4294967295"
        ));
        assert!(!label_value("a.b."));
        assert!(!label_value(&"a".repeat(64)));
    }

    /// Kueue preempts a Job after its gang started (suspends it: its pods
    /// are deleted) and resumes it later: the resumed pods must meet again,
    /// not pass the first opening. Before this, the suspended Job kept its
    /// Barrier (nothing else ran) and its resumed pods passed `ready`.
    #[test]
    fn a_suspended_run_gives_up_its_barrier_and_gets_a_new_one_at_its_resume() {
        let mut job = labelled("train", "j1", 100, false);
        let firsts = barrier_of("b1", Some("j1"));
        assert_eq!(plan(Some(&firsts), &[&job], false), Plan::Nothing);
        job.spec = Some(k8s_openapi::api::batch::v1::JobSpec {
            suspend: Some(true),
            ..Default::default()
        });
        assert!(!live(&job));
        assert_eq!(
            plan(Some(&firsts), &[&job], false),
            Plan::Replace {
                old: "b1".into(),
                holder: "train".into(),
                new: "train".into()
            },
            "suspended: its Barrier goes"
        );
        assert_eq!(
            plan(None, &[&job], false),
            Plan::Nothing,
            "none is made while it is suspended (a queue has not admitted it)"
        );
        job.spec = None;
        assert_eq!(plan(None, &[&job], false), Plan::Make(&job), "resumed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_touch_asked_again_is_retried_once_with_a_growing_delay() {
        let touch = Touch::Label("ns".into(), "train".into());
        let mut retries = Retries::default();
        assert_eq!(retries.again(touch.clone()), RETRY_FIRST);
        for _ in 0..5 {
            assert_eq!(retries.again(touch.clone()), RETRY_FIRST, "queued once");
        }
        assert_eq!(retries.queue.len(), 1);
        assert_eq!(retries.next_due().await, Some(touch.clone()));
        assert_eq!(retries.next_due().await, None, "due once");
        assert_eq!(retries.again(touch.clone()), RETRY_FIRST * 2, "it doubles");
        retries.done(&touch);
        assert_eq!(retries.queue.len(), 0, "done: not retried");
        assert_eq!(retries.again(touch.clone()), RETRY_FIRST, "and starts over");
        for _ in 0..20 {
            retries.done(&touch);
            retries.delays.insert(touch.clone(), RETRY_MAX);
            assert_eq!(retries.again(touch.clone()), RETRY_MAX, "bounded");
        }
    }
}
