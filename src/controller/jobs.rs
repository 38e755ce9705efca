//! Barriers sized by their Job (`spec.jobRef`): the Jobs' counts from a
//! cache (no request per reconcile), and which Barriers follow which Job,
//! so that a change of the Job's parallelism reconciles them at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use futures::Stream;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;

use crate::api::Barrier;
use crate::workload::run::{count, template_label};
use crate::workload::template::BARRIER_ANNOTATIONS;
use crate::workload::BARRIER_LABEL;

/// How long a reconcile waits for the Job cache's first listing.
const LISTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The Jobs' counts, and the Barriers that follow them.
pub struct Jobs {
    store: Store<Job>,
    followers: Mutex<Followers>,
}

/// Which Barriers follow which Job, indexed both ways so that a Barrier's
/// look and a Job's change each cost O(log n), whatever the number of
/// Barriers.
#[derive(Default)]
struct Followers {
    /// (namespace, Job) → the Barriers whose `spec.jobRef` names it.
    of_job: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, Barrier) → the Job it follows.
    job_of: HashMap<(String, String), String>,
}

/// A Job stripped to what sizing reads, and its pod template's
/// [`BARRIER_LABEL`] (the cache keeps nothing else of the template).
fn strip(job: &mut Job) {
    job.managed_fields_mut().clear();
    job.metadata.annotations = None;
    // Of the status, only whether it finished (see `live`) and whether a
    // pod of it succeeded (a suspended run that made progress keeps its
    // Barrier: `runs::plan`).
    job.status = job.status.take().and_then(|status| {
        let succeeded = status.succeeded.filter(|n| *n > 0);
        let over: Vec<_> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            .map(|c| JobCondition {
                message: None,
                reason: None,
                ..c
            })
            .collect();
        (!over.is_empty() || succeeded.is_some()).then(|| JobStatus {
            conditions: (!over.is_empty()).then_some(over),
            succeeded,
            ..JobStatus::default()
        })
    });
    if let Some(spec) = job.spec.as_mut() {
        let label = template_label(&spec.template).map(str::to_owned);
        // What the Barrier made for the Job takes from its pod template.
        let kept: std::collections::BTreeMap<String, String> = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .into_iter()
            .flatten()
            .filter(|(k, _)| BARRIER_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        *spec = JobSpec {
            parallelism: spec.parallelism,
            completions: spec.completions,
            // A RestartGang Barrier's restarts default to it.
            backoff_limit: spec.backoff_limit,
            // A suspended Job's run gives up its Barrier (`runs::plan`).
            suspend: spec.suspend,
            ..JobSpec::default()
        };
        if let Some(label) = label {
            spec.template.metadata = Some(ObjectMeta {
                labels: Some([(BARRIER_LABEL.to_owned(), label)].into()),
                annotations: (!kept.is_empty()).then_some(kept),
                ..ObjectMeta::default()
            });
        }
    }
}

impl Jobs {
    /// The cache of `api`'s Jobs, and the stream of its events that fills
    /// it (to be polled: the Barrier controller watches it).
    pub fn watch(
        api: Api<Job>,
    ) -> (
        Jobs,
        impl Stream<Item = Result<watcher::Event<Job>, watcher::Error>>,
    ) {
        let (store, writer) = reflector::store();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(strip)
            .reflect(writer);
        let jobs = Jobs {
            store,
            followers: Default::default(),
        };
        (jobs, stream)
    }

    /// The count of Job `job` in `namespace` (see [`count`]), or why there
    /// is none. Waits (a while) for the cache's first listing, so that a Job
    /// is never reported missing only because the cache is not filled yet.
    pub async fn size(&self, namespace: &str, job: &str) -> Result<u32, String> {
        if tokio::time::timeout(LISTED_WITHIN, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Err("the Jobs are not listed yet (can the controller list Jobs?)".to_owned());
        }
        let found = self
            .store
            .get(&ObjectRef::<Job>::new(job).within(namespace))
            .ok_or_else(|| format!("Job {job} not found"))?;
        count(found.spec.as_ref().unwrap_or(&JobSpec::default()))
            .ok_or_else(|| format!("Job {job} runs no pod at once (parallelism or completions 0)"))
    }

    /// `barrier` in `namespace` follows `job` (and no other Job).
    pub fn follow(&self, namespace: &str, barrier: &str, job: Option<&str>) {
        let mut f = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_owned(), barrier.to_owned());
        if f.job_of.get(&key).map(String::as_str) == job {
            return;
        }
        if let Some(old) = f.job_of.remove(&key) {
            let job_key = (namespace.to_owned(), old);
            if let Some(barriers) = f.of_job.get_mut(&job_key) {
                barriers.remove(barrier);
                if barriers.is_empty() {
                    f.of_job.remove(&job_key);
                }
            }
        }
        if let Some(job) = job {
            f.job_of.insert(key, job.to_owned());
            f.of_job
                .entry((namespace.to_owned(), job.to_owned()))
                .or_default()
                .insert(barrier.to_owned());
        }
    }

    /// The cache of Jobs.
    pub fn store(&self) -> &Store<Job> {
        &self.store
    }

    /// The Barriers that follow `job`.
    pub fn followers(&self, job: &Job) -> Vec<ObjectRef<Barrier>> {
        let namespace = job.namespace().unwrap_or_default();
        let followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers
            .of_job
            .get(&(namespace.clone(), job.name_any()))
            .into_iter()
            .flatten()
            .map(|b| ObjectRef::new(b).within(&namespace))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_the_smaller_of_parallelism_and_completions() {
        let spec = |parallelism, completions| JobSpec {
            parallelism,
            completions,
            ..JobSpec::default()
        };
        assert_eq!(count(&spec(Some(4), Some(4))), Some(4));
        assert_eq!(count(&spec(Some(8), Some(3))), Some(3));
        assert_eq!(count(&spec(Some(2), None)), Some(2), "a work queue");
        assert_eq!(count(&spec(None, None)), Some(1), "the defaults");
        assert_eq!(count(&spec(Some(0), Some(4))), None, "nothing runs");
    }

    #[test]
    fn a_barrier_follows_one_job_at_a_time() {
        let (jobs, _) = {
            let store = reflector::store::<Job>().0;
            (
                Jobs {
                    store,
                    followers: Default::default(),
                },
                (),
            )
        };
        let job = |name: &str| {
            let mut j = Job::default();
            j.metadata.name = Some(name.into());
            j.metadata.namespace = Some("ns".into());
            j
        };
        jobs.follow("ns", "gang", Some("a"));
        assert_eq!(
            jobs.followers(&job("a")),
            [ObjectRef::new("gang").within("ns")]
        );
        jobs.follow("ns", "gang", Some("b"));
        assert!(jobs.followers(&job("a")).is_empty(), "moved to b");
        assert_eq!(jobs.followers(&job("b")).len(), 1);
        jobs.follow("ns", "gang", None);
        assert!(jobs.followers(&job("b")).is_empty());
    }
}
