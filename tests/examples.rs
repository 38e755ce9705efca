//! The examples' manifests are accepted by the API server (server-side dry
//! run, with the CRDs installed: zkgate's, and JobSet's and Kueue's as
//! released, from `tests/crds`): their custom resources pass the CRD
//! schemas with no field pruned, their Jobs are valid Jobs, every pod
//! template is least-privilege and gets what it needs from the webhook, and
//! no two examples use one resource name.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use support::kube::{client, install_crds, kubeconfig, namespace};

/// The examples' folders, and what each must hold at least.
const EXAMPLES: usize = 17;

#[tokio::test]
async fn every_example_is_accepted_by_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    support::kube::install_upstream_crds(&client).await;
    let ns = namespace(&client).await;
    let kubectl = support::tool("kubectl");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    // (kind, name) → the example folder that uses it.
    let mut names: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let example = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(dir.join("README.md").exists(), "{example} has no README");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .filter(|f| f.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
                .map(|d| Value::deserialize(d).unwrap())
                .filter(|v| !v.is_null())
                .collect();
            if file.ends_with("kueue-config.yaml") {
                kueue_configuration_is_valid(&docs[0]);
                continue;
            }
            for doc in &docs {
                resource_names(doc, &example, &mut names);
            }
            let templates: Vec<&Value> = docs.iter().flat_map(pod_templates).collect();
            // Least privilege in every pod template: no API token, the
            // namespace's ZooKeeper credential handed out by the controller
            // (no Secret), restricted pod security.
            if !templates.is_empty() {
                // A one-label example has no zkgate container of its own:
                // the webhook adds it, with the credential (checked below
                // on what it adds).
                let by_hand = text.contains("ghcr.io/zkgate/zkgate");
                for template in &templates {
                    template_is_injected(&file, template, by_hand);
                }
                assert!(
                    !text.contains("secretKeyRef"),
                    "{}: credentials come from the controller, not a Secret",
                    file.display()
                );
                for wanted in [
                    "automountServiceAccountToken: false",
                    if by_hand {
                        "zkgate.io/credentials: \"true\""
                    } else {
                        "zkgate.io/"
                    },
                    "runAsNonRoot: true",
                    "readOnlyRootFilesystem: true",
                    "allowPrivilegeEscalation: false",
                    "drop: [ALL]",
                    "seccompProfile: {type: RuntimeDefault}",
                ] {
                    assert!(text.contains(wanted), "{}: no {wanted}", file.display());
                }
            }
            // The sidecar examples' Jobs hold native sidecars (an init
            // container that restarts Always, gated by its startupProbe):
            // their shape is checked here, and the server checks the rest.
            if example.ends_with("-sidecar") && file.ends_with("job.yaml") {
                let kind = if example == "gang-sidecar" {
                    "barrier"
                } else {
                    "lock"
                };
                let pod = check_native_sidecar_job(&file, kind);
                if example == "lock-sidecar" {
                    let main = pod.containers[0].command.as_ref().unwrap();
                    assert_eq!(
                        &main[1..3],
                        ["lock", "watch"],
                        "the main container watches the token"
                    );
                }
            }
            // Validated in full by the server (unknown fields refused), and
            // no field of a custom resource may be pruned.
            let out = Command::new(&kubectl)
                .args([
                    "apply",
                    "--dry-run=server",
                    "--validate=strict",
                    "-o",
                    "json",
                    "-n",
                    &ns,
                    "-f",
                    "-",
                ])
                .env("KUBECONFIG", kubeconfig())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut child| {
                    use std::io::Write;
                    child.stdin.take().unwrap().write_all(text.as_bytes())?;
                    child.wait_with_output()
                })
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let said: Value = serde_json::from_slice(&out.stdout).unwrap();
            let stored: Vec<Value> = match said["kind"].as_str() {
                Some("List") => said["items"].as_array().unwrap().clone(),
                _ => vec![said],
            };
            assert_eq!(stored.len(), docs.len(), "{}", file.display());
            for (doc, stored) in docs.iter().zip(&stored) {
                let custom = doc["apiVersion"]
                    .as_str()
                    .and_then(|v| v.split_once('/'))
                    .is_some_and(|(group, _)| group.contains('.'));
                if custom {
                    let mut lost = vec![];
                    pruned(doc, stored, String::new(), &mut lost);
                    assert!(
                        lost.is_empty(),
                        "{}: the API server pruned {lost:?} (not in the {} schema)",
                        file.display(),
                        doc["kind"]
                    );
                }
            }
        }
        checked += 1;
    }
    assert_eq!(checked, EXAMPLES);
}

/// The pod templates of a Job, a CronJob or a JobSet.
fn pod_templates(doc: &Value) -> Vec<&Value> {
    match doc["kind"].as_str() {
        Some("Job") => vec![&doc["spec"]["template"]],
        Some("CronJob") => vec![&doc["spec"]["jobTemplate"]["spec"]["template"]],
        Some("JobSet") => doc["spec"]["replicatedJobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| &r["template"]["spec"]["template"])
            .collect(),
        _ => vec![],
    }
}

/// Records the resource names `doc` uses (its own, and the Barrier or
/// LockLease its pod templates' labels name), refusing one that another
/// example uses: examples applied side by side in one namespace never
/// meet.
fn resource_names(doc: &Value, example: &str, names: &mut BTreeMap<(String, String), String>) {
    let mut used = vec![];
    if let (Some(kind), Some(name)) = (doc["kind"].as_str(), doc["metadata"]["name"].as_str()) {
        used.push((kind.to_owned(), name.to_owned()));
    }
    for template in pod_templates(doc) {
        let labels = &template["metadata"]["labels"];
        if let Some(barrier) = labels["zkgate.io/barrier"].as_str() {
            used.push(("Barrier".to_owned(), barrier.to_owned()));
        }
        if let Some(lock) = labels["zkgate.io/lock"].as_str() {
            used.push(("LockLease".to_owned(), lock.to_owned()));
        }
    }
    for key in used {
        let first = names
            .entry(key.clone())
            .or_insert_with(|| example.to_owned());
        assert_eq!(
            first, example,
            "{} {} is used by the examples {first} and {example}",
            key.0, key.1
        );
    }
}

/// The paths of `sent` that `stored` lacks (what the API server pruned).
fn pruned(sent: &Value, stored: &Value, path: String, lost: &mut Vec<String>) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(stored)) => {
            for (k, v) in sent {
                let here = format!("{path}.{k}");
                match stored.get(k) {
                    Some(s) => pruned(v, s, here, lost),
                    None => lost.push(here),
                }
            }
        }
        (Value::Array(sent), Value::Array(stored)) => {
            for (i, v) in sent.iter().enumerate() {
                match stored.get(i) {
                    Some(s) => pruned(v, s, format!("{path}[{i}]"), lost),
                    None => lost.push(format!("{path}[{i}]")),
                }
            }
        }
        _ => {}
    }
}

/// Kueue's Configuration is a file Kueue reads, not an object: its fields
/// are checked against Kueue's `config.kueue.x-k8s.io/v1beta2` types
/// (apis/config/v1beta2/configuration_types.go), as far as the example uses
/// them.
fn kueue_configuration_is_valid(config: &Value) {
    assert_eq!(config["apiVersion"], "config.kueue.x-k8s.io/v1beta2");
    assert_eq!(config["kind"], "Configuration");
    let wait = config["waitForPodsReady"]
        .as_object()
        .expect("waitForPodsReady");
    for key in wait.keys() {
        assert!(
            [
                "timeout",
                "blockAdmission",
                "requeuingStrategy",
                "recoveryTimeout"
            ]
            .contains(&key.as_str()),
            "waitForPodsReady has no field {key}"
        );
    }
    humantime::parse_duration(wait["timeout"].as_str().expect("a timeout")).expect("a duration");
    for key in wait["requeuingStrategy"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        assert!(
            [
                "timestamp",
                "backoffLimitCount",
                "backoffBaseSeconds",
                "backoffMaxSeconds"
            ]
            .contains(&key.as_str()),
            "requeuingStrategy has no field {key}"
        );
    }
}

/// Checks a Job whose pods hold `kind` (barrier, lock) from a native
/// sidecar gated by a startupProbe; returns its pod spec.
fn check_native_sidecar_job(path: &Path, kind: &str) -> k8s_openapi::api::core::v1::PodSpec {
    use k8s_openapi::api::batch::v1::Job;
    let job: Job = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("a valid Job (Kubernetes 1.33 types)");
    let pod = job.spec.unwrap().template.spec.unwrap();
    let sidecar = pod
        .init_containers
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.restart_policy.is_some())
        .expect("a native sidecar");
    assert_eq!(
        sidecar.restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar"
    );
    let probe = sidecar
        .startup_probe
        .as_ref()
        .expect("a startupProbe gates the main containers");
    let command = probe.exec.as_ref().unwrap().command.as_ref().unwrap();
    assert_eq!(&command[1..3], ["probe", "--ready-file"]);
    assert!(sidecar
        .args
        .as_ref()
        .unwrap()
        .starts_with(&[kind.to_string(), "sidecar".to_string()]));
    pod
}

/// A Job's pod, as the webhook returns it: every zkgate container (the
/// one-label form's injected init container, or the example's own) told
/// where to ask for the namespace's credentials, with the projected token
/// to prove it, the restricted security context on injected ones, and
/// nothing asked of the workload's own containers.
fn template_is_injected(file: &Path, template: &Value, by_hand: bool) {
    use zkgate::webhook::inject::{
        inject, HandoutTarget, Injection, INSTALL_CONTAINER, TOKEN_VOLUME,
    };
    let template: k8s_openapi::api::core::v1::PodTemplateSpec =
        serde_json::from_value(template.clone()).unwrap();
    let pod = k8s_openapi::api::core::v1::Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        ..Default::default()
    };
    let injection = Injection {
        image: "ghcr.io/zkgate/zkgate:0.2.0".into(),
        zookeeper: "zk:2181".into(),
        root: "/zkgate".into(),
        handout: Some(HandoutTarget {
            urls: vec!["https://zkgate-webhook.zkgate-system.svc:443".into()],
            server_name: Some("zkgate-webhook.zkgate-system.svc".into()),
            ca: "CA".into(),
        }),
        native_sidecars: true,
        in_place_restart: true,
        session_timeout: None,
        resources: zkgate::webhook::resources::default(),
        image_pull_secrets: Vec::new(),
    };
    let injected = inject(&pod, &injection)
        .unwrap_or_else(|e| panic!("{}: refused: {e}", file.display()))
        .unwrap_or_else(|| panic!("{}: nothing injected", file.display()));
    let spec = injected.spec.unwrap();
    let zkgate_containers: Vec<_> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        // Every container that takes part (the wrap form's wrapped one
        // too), not the wrap form's installer, which only copies the binary.
        .filter(|c| c.name != INSTALL_CONTAINER)
        .filter(|c| {
            c.name.starts_with("zkgate-")
                || c.image.as_deref().is_some_and(|i| i.contains("zkgate"))
                || c.command
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|cmd| cmd.ends_with("/zkgate"))
        })
        .collect();
    assert!(!zkgate_containers.is_empty(), "{}", file.display());
    for c in zkgate_containers {
        let env = |name: &str| c.env.iter().flatten().any(|e| e.name == name);
        assert!(
            env("ZKGATE_CREDENTIALS_URL") && env("ZKGATE_CREDENTIALS_CA") && !env("ZKGATE_AUTH"),
            "{}: {} is not told where to get its credentials",
            file.display(),
            c.name
        );
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == TOKEN_VOLUME),
            "{}: {} has no token",
            file.display(),
            c.name
        );
        if !by_hand {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true));
            assert_eq!(sc.allow_privilege_escalation, Some(false));
        }
    }
}
