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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::time::{delay_queue, DelayQueue};
use tracing::{debug, info, warn};

use super::jobs::barrier_label;
use crate::api::{Barrier, BarrierSpec};

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

/// The run a Barrier belongs to: for one the controller made (labelled
/// [`crate::controller::managed_by`]), the uid of its `batch/v1` Job owner
/// (the Job it was made for). A Barrier made by hand belongs to no run,
/// and every participant enters it.
pub fn run_of(barrier: &Barrier) -> Option<&str> {
    // Only what the controller made: a Barrier made by hand stays its
    // maker's even when a Job owns it (for the garbage collector).
    if !crate::controller::made_by_zkgate(&barrier.metadata) {
        return None;
    }
    barrier
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job" && o.api_version == "batch/v1")
        .map(|o| o.uid.as_str())
}

/// Whether `job` still runs: not finished (`Complete` or `Failed`) and not
/// being deleted. A live Job's Barrier is never taken from it.
pub fn live(job: &Job) -> bool {
    job.metadata.deletion_timestamp.is_none() && !finished(job)
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
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

/// The one rule of runs: a label's Barrier belongs to one live Job at a
/// time. The oldest live Job gets it when there is none, or when the one
/// there belongs to a run that is over; a live holder keeps it (whether its
/// template still carries the label or not: `holder_live`, from the cache
/// of every Job).
fn plan<'a>(barrier: Option<&Barrier>, labelled: &[&'a Job], holder_live: bool) -> Plan<'a> {
    let mut running: Vec<&Job> = labelled.iter().copied().filter(|j| live(j)).collect();
    running.sort_by_key(|j| {
        (
            j.metadata.creation_timestamp.as_ref().map(|t| t.0),
            j.name_any(),
        )
    });
    let Some(&oldest) = running.first() else {
        return Plan::Nothing;
    };
    let Some(barrier) = barrier else {
        return Plan::Make(oldest);
    };
    if barrier.metadata.deletion_timestamp.is_some() {
        return Plan::AfterDeletion;
    }
    let Some(run) = run_of(barrier) else {
        return Plan::Nothing;
    };
    match running.iter().find(|j| j.uid().as_deref() == Some(run)) {
        Some(holder) if running.len() > 1 => Plan::Shared {
            holder: holder.name_any(),
            others: running
                .iter()
                .filter(|j| j.uid().as_deref() != Some(run))
                .map(|j| j.name_any())
                .collect(),
        },
        Some(_) => Plan::Nothing,
        // Its Job runs without the label (it was changed, or the Barrier's
        // owner was set by hand): not a run that is over.
        None if holder_live => Plan::Shared {
            holder: owner_name(barrier, run),
            others: running.iter().map(|j| j.name_any()).collect(),
        },
        None => Plan::Replace {
            old: barrier.uid().unwrap_or_default(),
            holder: owner_name(barrier, run),
            new: oldest.name_any(),
        },
    }
}

/// The name of `barrier`'s owner of uid `run` (its Job, which may be gone).
fn owner_name(barrier: &Barrier, run: &str) -> String {
    barrier
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.uid == run)
        .map(|o| o.name.clone())
        .unwrap_or_default()
}

/// Makes Barrier `name` for `job`: sized from the Job (`spec.jobRef`),
/// owned by it (its run; deleted with it).
async fn make_barrier(api: &Api<Barrier>, name: &str, job: &Job) -> Result<Seen, kube::Error> {
    let (Some(namespace), Some(uid)) = (job.namespace(), job.uid()) else {
        return Ok(Seen::Done);
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
    let (on_participant_loss, max_restarts) =
        crate::controller::webhook::inject::loss_policy(&annotations).unwrap_or_default();
    let after = crate::controller::webhook::inject::after_of(&annotations).unwrap_or_default();
    let mut barrier = Barrier::new(
        name,
        BarrierSpec {
            participants: None,
            job_ref: Some(job.name_any()),
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
            ..BarrierSpec::default()
        },
    );
    barrier.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".to_owned(),
        kind: "Job".to_owned(),
        name: job.name_any(),
        uid,
        controller: Some(false),
        block_owner_deletion: Some(false),
    }]);
    barrier.metadata.labels = Some(crate::controller::managed_by());
    match api.create(&PostParams::default(), &barrier).await {
        Ok(_) => {
            info!(%namespace, barrier = %name, job = %job.name_any(), "made the Job's Barrier");
            Ok(Seen::Done)
        }
        // One there the cache does not know of yet: look again.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Seen::Later),
        Err(e) => Err(e),
    }
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
/// touches).
pub async fn keep(
    client: kube::Client,
    barriers: Api<Barrier>,
    jobs: Store<Job>,
    mut touches: UnboundedReceiver<Touch>,
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
            match see_to(&client, &jobs, &cache, namespace, label).await {
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
) -> Result<Seen, kube::Error> {
    let all = jobs.state();
    let labelled: Vec<&Job> = all
        .iter()
        .map(|j| &**j)
        .filter(|j| j.namespace().as_deref() == Some(namespace) && barrier_label(j) == Some(label))
        .collect();
    let barrier = barriers.get(&ObjectRef::new(label).within(namespace));
    let holder_live = barrier.as_deref().and_then(run_of).is_some_and(|run| {
        all.iter()
            .any(|j| j.uid().as_deref() == Some(run) && live(j))
    });
    let api: Api<Barrier> = Api::namespaced(client.clone(), namespace);
    match plan(barrier.as_deref(), &labelled, holder_live) {
        Plan::Nothing | Plan::AfterDeletion => Ok(Seen::Done),
        Plan::Make(job) => make_barrier(&api, label, job).await,
        Plan::Replace { old, holder, new } => {
            // Its Job asked of the API server, not the cache: a live run's
            // Barrier is never taken from it.
            let job_api: Api<Job> = Api::namespaced(client.clone(), namespace);
            let run = barrier.as_deref().and_then(run_of).unwrap_or_default();
            if job_api
                .get_opt(&holder)
                .await?
                .is_some_and(|j| j.uid().as_deref() == Some(run) && live(&j))
            {
                return Ok(Seen::Later);
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
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

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
        b.metadata.labels = Some(crate::controller::managed_by());
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
