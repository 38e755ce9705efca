//! The examples' manifests are accepted by the API server (server-side dry
//! run, with the CRDs installed): their Barriers and LockLeases pass the CRD
//! schemas, and their Jobs are valid Jobs.

mod support;

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use support::kube::{client, install_crds, kubeconfig, namespace};

#[tokio::test]
async fn every_example_is_accepted_by_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let kubectl = Path::new(
        &std::env::var("ZKGATE_TOOLS")
            .unwrap_or_else(|_| format!("{}/.cache/zkgate/tools", std::env::var("HOME").unwrap())),
    )
    .join("kubectl");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        assert!(
            dir.join("README.md").exists(),
            "{} has no README",
            dir.display()
        );
        // The test server is Kubernetes 1.20: fields newer than it (Indexed
        // Jobs, native sidecars) are not in its schema, so client-side
        // validation is off; the server still checks everything it knows,
        // including the zkgate CRD schemas.
        // Native sidecars need Kubernetes 1.29; a 1.20 server refuses their
        // startupProbe. There the Job is checked against the 1.33 API types
        // instead, and only the Barrier goes to the server.
        // Least privilege in every Job: no API token, the namespace's
        // ZooKeeper credential handed out by the controller (no Secret),
        // restricted pod security.
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().path();
            let text = std::fs::read_to_string(&file).unwrap();
            if !text.contains("kind: Job") {
                continue;
            }
            // A one-label example has no zkgate container of its own: the
            // webhook adds it, with the credential (checked below on what
            // it adds).
            let by_hand = text.contains("ghcr.io/zkgate/zkgate");
            job_is_injected(&file, &text, by_hand);
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
        let target = if dir.ends_with("gang-sidecar") {
            check_native_sidecar_job(&dir.join("job.yaml"), "barrier");
            dir.join("barrier.yaml")
        } else if dir.ends_with("lock-sidecar") {
            let pod = check_native_sidecar_job(&dir.join("job.yaml"), "lock");
            let main = pod.containers[0].command.as_ref().unwrap();
            assert_eq!(
                &main[1..3],
                ["lock", "watch"],
                "the main container watches the token"
            );
            dir.join("locklease.yaml")
        } else {
            dir.clone()
        };
        let out = Command::new(&kubectl)
            .args([
                "apply",
                "--dry-run=server",
                "--validate=false",
                "-n",
                &ns,
                "-f",
            ])
            .arg(&target)
            .env("KUBECONFIG", kubeconfig())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("(server dry run)"), "{said}");
        checked += 1;
    }
    assert_eq!(checked, 11);
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
fn job_is_injected(file: &Path, text: &str, by_hand: bool) {
    use zkgate::controller::webhook::inject::{
        inject, HandoutTarget, Injection, INSTALL_CONTAINER, TOKEN_VOLUME,
    };
    let job: k8s_openapi::api::batch::v1::Job = serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde_yaml_ng::Value::deserialize(d).unwrap())
        .filter(|v| v["kind"] == "Job")
        .map(|v| serde_yaml_ng::from_value(v).unwrap())
        .next()
        .unwrap();
    let template = job.spec.unwrap().template;
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
