//! JobSet (kubernetes-sigs/jobset) without its controller: its CRD from
//! `tests/crds`, and its child Jobs made as its controller makes them.

use k8s_openapi::api::batch::v1::Job;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::ResourceExt;
use serde_json::json;

/// JobSet's resource (`jobset.x-k8s.io/v1alpha2`).
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        "jobsets",
    )
}

/// The child Jobs of `jobset` (as the API server returned it) for its
/// restart `restart`, as JobSet's controller makes them (`constructJob`):
/// one per replica of each replicated Job, named `JOBSET-RJOB-INDEX`,
/// controlled by the JobSet, its labels on the Job and on its pod template.
pub fn child_jobs(jobset: &DynamicObject, restart: u32) -> Vec<Job> {
    let (name, uid) = (jobset.name_any(), jobset.uid().expect("a stored JobSet"));
    let mut jobs = vec![];
    let replicated = jobset.data["spec"]["replicatedJobs"].as_array().cloned();
    for rjob in replicated.into_iter().flatten() {
        let rjob_name = rjob["name"].as_str().expect("a replicated Job's name");
        let replicas = rjob["replicas"].as_u64().unwrap_or(1);
        for index in 0..replicas {
            let labels = json!({
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/jobset-uid": uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob_name,
                "jobset.sigs.k8s.io/restart-attempt": restart.to_string(),
                "jobset.sigs.k8s.io/replicatedjob-replicas": replicas.to_string(),
                "jobset.sigs.k8s.io/job-index": index.to_string(),
            });
            let mut job = rjob["template"].clone();
            let mut job_labels = labels.clone();
            merge(&mut job_labels, &job["metadata"]["labels"]);
            job["metadata"] = json!({
                "name": format!("{name}-{rjob_name}-{index}"),
                "labels": job_labels,
                "ownerReferences": [{
                    "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name,
                    "uid": uid, "controller": true, "blockOwnerDeletion": true
                }]
            });
            let mut pod_labels = labels;
            merge(
                &mut pod_labels,
                &job["spec"]["template"]["metadata"]["labels"],
            );
            job["spec"]["template"]["metadata"]["labels"] = pod_labels;
            jobs.push(serde_json::from_value(job).expect("a Job"));
        }
    }
    jobs
}

fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
    for (k, v) in from.as_object().into_iter().flatten() {
        into[k] = v.clone();
    }
}
