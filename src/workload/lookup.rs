//! What the API server says of a run now: whether it still runs, and how
//! many participants a JobSet's Barrier takes. Asked by admission (a second
//! live run's pods are refused; a JobSet's Barrier sized) and by the
//! controller alike.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams};
use kube::ResourceExt;

use super::run::{is_jobset, live, run_of_job, JOBSET_GROUP, JOBSET_UID_LABEL};
use super::template::AFTER_ANNOTATION;
use super::BARRIER_LABEL;

/// Whether run `run` of `owner` (a Job or a JobSet, see [`super::run::holder_of`])
/// still runs, asked of the API server: its Job, or one of its JobSet's
/// child Jobs of that restart, is [`live`].
pub async fn run_is_live(
    client: &kube::Client,
    namespace: &str,
    owner: &OwnerReference,
    run: &str,
) -> Result<bool, kube::Error> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    if is_jobset(owner) {
        let children = jobs
            .list(&ListParams::default().labels(&format!("{JOBSET_UID_LABEL}={}", owner.uid)))
            .await?;
        return Ok(children
            .items
            .iter()
            .any(|j| live(j) && run_of_job(j).is_some_and(|r| r.id == run)));
    }
    Ok(jobs
        .get_opt(&owner.name)
        .await?
        .is_some_and(|j| j.uid().as_deref() == Some(owner.uid.as_str()) && live(&j)))
}

/// How many participants JobSet `jobset`'s Barrier `label` takes: over its
/// replicated Jobs whose pod template carries the label, `replicas` times
/// each Job's count ([`crate::workload::run::count`]). Read from the
/// JobSet itself, not from the child Jobs there now (its controller makes
/// them one by one). `Ok(Err(why))` when there is no such size: the JobSet
/// gone or another by that name, or no replicated Job so labelled.
pub async fn jobset_size(
    client: &kube::Client,
    namespace: &str,
    jobset: &OwnerReference,
    label: &str,
) -> Result<Result<u32, String>, kube::Error> {
    let (group, version) = jobset
        .api_version
        .split_once('/')
        .unwrap_or((JOBSET_GROUP, "v1alpha2"));
    let resource = kube::discovery::ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: jobset.api_version.clone(),
        kind: "JobSet".to_owned(),
        plural: "jobsets".to_owned(),
    };
    let api: Api<kube::core::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource);
    let Some(found) = api.get_opt(&jobset.name).await? else {
        return Ok(Err("the JobSet is gone".to_owned()));
    };
    if found.metadata.uid.as_deref() != Some(jobset.uid.as_str()) {
        return Ok(Err("the JobSet of that name is another one".to_owned()));
    }
    Ok(size_over_replicated_jobs(&found.data, label))
}

/// [`jobset_size`] of a JobSet's `data` (its `spec` and `status`).
fn size_over_replicated_jobs(data: &serde_json::Value, label: &str) -> Result<u32, String> {
    let replicated = data["spec"]["replicatedJobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let labelled: Vec<&serde_json::Value> = replicated
        .iter()
        .filter(|r| {
            r["template"]["spec"]["template"]["metadata"]["labels"][BARRIER_LABEL].as_str()
                == Some(label)
        })
        .collect();
    let names: Vec<&str> = labelled.iter().filter_map(|r| r["name"].as_str()).collect();
    // JobSet creates (or resumes) a later replicated Job only once the
    // earlier ones are Ready or Complete: in one gang with them, it would
    // wait for pods that wait for it.
    if names.len() > 1
        && data["spec"]["startupPolicy"]["startupPolicyOrder"].as_str() == Some("InOrder")
    {
        return Err(format!(
            "the JobSet starts its replicated Jobs in order (startupPolicy InOrder), so {} cannot start as one gang: give each its own {} label and order them with {}",
            names.join(", "),
            BARRIER_LABEL,
            AFTER_ANNOTATION
        ));
    }
    for rjob in &labelled {
        for dependency in rjob["dependsOn"].as_array().into_iter().flatten() {
            let on = dependency["name"].as_str().unwrap_or_default();
            if names.contains(&on) {
                return Err(format!(
                    "replicated Job {} depends on {on} (dependsOn), which is in the same gang: it would wait for pods that wait for it. Give each its own {} label and order them with {}",
                    rjob["name"],
                    BARRIER_LABEL,
                    AFTER_ANNOTATION
                ));
            }
        }
    }
    let mut total: u32 = 0;
    for rjob in labelled {
        let spec: k8s_openapi::api::batch::v1::JobSpec =
            serde_json::from_value(rjob["template"]["spec"].clone()).map_err(|e| {
                format!(
                    "replicated Job {} has a Job template that cannot be read: {e}",
                    rjob["name"]
                )
            })?;
        let replicas = u32::try_from(rjob["replicas"].as_u64().unwrap_or(1))
            .map_err(|_| format!("replicated Job {} has too many replicas", rjob["name"]))?;
        let each = crate::workload::run::count(&spec).unwrap_or(0);
        total = replicas
            .checked_mul(each)
            .and_then(|n| total.checked_add(n))
            .ok_or_else(|| "more participants than a Barrier takes".to_owned())?;
    }
    if total == 0 {
        return Err(format!(
            "no replicated Job's pod template carries {}={label} with a pod to run",
            BARRIER_LABEL
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobsets_replicated_jobs_started_in_order_cannot_be_one_gang() {
        let template = serde_json::json!({ "spec": { "parallelism": 1,
            "template": { "metadata": { "labels": { "zkgate.io/barrier": "gang" } } } } });
        let in_order = serde_json::json!({ "spec": {
        "startupPolicy": { "startupPolicyOrder": "InOrder" },
        "replicatedJobs": [
            { "name": "driver", "template": template },
            { "name": "workers", "template": template },
        ]}});
        let why = size_over_replicated_jobs(&in_order, "gang").unwrap_err();
        assert!(
            why.contains("InOrder") && why.contains("zkgate.io/after"),
            "{why}"
        );
        let depends = serde_json::json!({ "spec": { "replicatedJobs": [
            { "name": "driver", "template": template },
            { "name": "workers", "template": template,
              "dependsOn": [{ "name": "driver", "status": "Ready" }] },
        ]}});
        let why = size_over_replicated_jobs(&depends, "gang").unwrap_err();
        assert!(why.contains("depends on driver"), "{why}");
        let overflow = serde_json::json!({ "spec": { "replicatedJobs": [
            { "name": "a", "replicas": 2_000_000_000u64, "template": template },
            { "name": "b", "replicas": 2_000_000_000u64, "template": template },
            { "name": "c", "replicas": 1_000_000_000u64, "template": template },
        ]}});
        assert!(size_over_replicated_jobs(&overflow, "gang").is_err());
    }

    #[test]
    fn a_jobsets_barrier_is_sized_over_its_labelled_replicated_jobs() {
        let template = |parallelism: u32, completions: u32, label: Option<&str>| {
            serde_json::json!({ "spec": {
                "parallelism": parallelism, "completions": completions,
                "template": { "metadata": { "labels": label.map(|l| serde_json::json!({ "zkgate.io/barrier": l })) },
                              "spec": { "containers": [] } }
            }})
        };
        let jobset = serde_json::json!({ "spec": { "replicatedJobs": [
            { "name": "workers", "replicas": 4, "template": template(8, 8, Some("gang")) },
            { "name": "driver", "template": template(2, 1, Some("gang")) },
            { "name": "other", "replicas": 3, "template": template(5, 5, Some("another")) },
            { "name": "monitor", "replicas": 1, "template": template(1, 1, None) },
        ]}});
        assert_eq!(size_over_replicated_jobs(&jobset, "gang"), Ok(4 * 8 + 1));
        assert_eq!(size_over_replicated_jobs(&jobset, "another"), Ok(15));
        let none = size_over_replicated_jobs(&jobset, "nobody").unwrap_err();
        assert!(none.contains("no replicated Job"), "{none}");
        let huge = serde_json::json!({ "spec": { "replicatedJobs": [
            { "name": "w", "replicas": 100000, "template": template(100000, 100000, Some("gang")) }
        ]}});
        assert!(size_over_replicated_jobs(&huge, "gang").is_err());
    }
}
