//! Issue 46, item 5: `kubectl zkgate doctor` on the cluster. The chart's
//! install is found healthy (every check ok, exit 0); then, beside it and
//! touching nothing of it, a webhook whose `caBundle` is another CA's
//! (scoped to the test's namespace) and a controller whose ZooKeeper
//! cannot be reached are each found and named (FAIL, exit 4).

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::PostParams;

use super::*;

/// `zkgate doctor -n namespace` as a user runs `kubectl zkgate doctor`:
/// its exit code and output.
fn doctor(c: &Cluster, namespace: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args(["doctor", "-n", namespace])
        .env("KUBECONFIG", c.dir.join("kubeconfig"))
        .stdin(Stdio::null())
        .output()
        .expect("run zkgate doctor");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The lines of `report` with this verdict and check.
fn lines<'a>(report: &'a str, verdict: &str, check: &str) -> Vec<&'a str> {
    report
        .lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some(verdict) && l[verdict.len()..].trim_start().starts_with(check)
        })
        .collect()
}

/// A MutatingWebhookConfiguration like the chart's, for labelled pods of
/// `namespace` only, whose `caBundle` is a CA that signed nothing the
/// webhook serves.
fn foreign_ca_webhook(name: &str, namespace: &str, service: &str) -> MutatingWebhookConfiguration {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not the webhook's CA");
    let ca = params.self_signed(&key).expect("a CA");
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "zkgate"}},
        "webhooks": [{
            "name": "pods.doctor.zkgate.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {
                "service": {"name": service, "namespace": SYSTEM_NAMESPACE, "path": "/mutate"},
                "caBundle": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca.pem()),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchExpressions": [{"key": "zkgate.io/barrier", "operator": "Exists"}]},
        }],
    }))
    .expect("a webhook configuration")
}

/// A controller Deployment as the chart labels it, whose ZooKeeper is a
/// port nothing listens on.
fn controller_without_zookeeper(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "zkgate"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{
                        "name": "controller",
                        "image": "zkgate:local",
                        "imagePullPolicy": "Never",
                        "args": ["controller", "--zookeeper", "127.0.0.1:9", "--metrics-addr", "0.0.0.0:8080"],
                        "ports": [{"name": "metrics", "containerPort": 8080}],
                    }],
                },
            },
        },
    }))
    .expect("a Deployment")
}

#[tokio::test]
#[ignore = "needs the local cluster: scripts/test runs it with --run-ignored where `scripts/cluster available`"]
async fn doctor_finds_the_install_healthy_then_names_a_foreign_ca_bundle_and_an_unreachable_zookeeper(
) {
    let c = cluster().await;
    // No replica of the chart's is being stopped by another test meanwhile.
    let _disrupting = c.disrupting_controllers().await;
    let ns = c.namespace().await;

    // The chart's install, as it runs.
    let (code, report) = doctor(&c, &ns.name);
    eprintln!("{report}");
    assert_eq!(code, 0, "a healthy install fails a check:\n{report}");
    for check in [
        "API server",
        "CRD",
        "controller",
        "caBundle",
        "webhook",
        "ZooKeeper",
        "ACLs",
        "session timeout",
        "image",
    ] {
        assert!(
            !lines(&report, "ok", check).is_empty(),
            "no ok {check} line:\n{report}"
        );
    }
    let healthy = format!("{SYSTEM_NAMESPACE}/{RELEASE}");
    // The CRDs are compared with what the running controller makes (it
    // says, in its diagnosis), not only with the plugin's release.
    let crds = lines(&report, "ok", "CRD");
    assert!(
        crds.len() == 2
            && crds.iter().all(|l| l.contains(&format!(
                "as the controller makes it: {healthy} ({})",
                env!("CARGO_PKG_VERSION")
            ))),
        "the CRDs are not compared with the controller's:\n{report}"
    );
    assert!(
        lines(&report, "ok", "ZooKeeper")
            .iter()
            .any(|l| l.contains(&healthy) && l.contains(" 3.") && l.contains("standalone")),
        "the controller's ZooKeeper is not named with its version and mode:\n{report}"
    );
    assert!(
        lines(&report, "ok", "webhook")
            .iter()
            .any(|l| l.contains("gave the pod zkgate's containers")),
        "the dry-run pod did not go through the webhook:\n{report}"
    );
    assert!(
        lines(&report, "ok", "ACLs")
            .iter()
            .any(|l| l.contains("on:")),
        "the install has a controller credential, so ACLs are on:\n{report}"
    );

    // Another CA in a webhook's caBundle, and a controller cut off from
    // ZooKeeper, beside the healthy install.
    let service = chart_webhook_service(&c).await;
    let webhook_name = format!("zkgate-doctor-{}", ns.name);
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
    configurations
        .create(
            &PostParams::default(),
            &foreign_ca_webhook(&webhook_name, &ns.name, &service),
        )
        .await
        .expect("create the webhook configuration");
    let broken = "cut-off";
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    deployments
        .create(
            &PostParams::default(),
            &controller_without_zookeeper(broken),
        )
        .await
        .expect("create the cut-off controller");
    eventually(WITHIN, "the cut-off controller to run", || async {
        c.pods(&ns.name, &format!("app={broken}"))
            .await
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .then_some(())
    })
    .await;

    let (code, report) = doctor(&c, &ns.name);
    eprintln!("{report}");
    // Gone before anything is asserted: they are seen cluster-wide.
    let _ = configurations
        .delete(&webhook_name, &DeleteParams::default())
        .await;
    let _ = deployments.delete(broken, &DeleteParams::default()).await;
    assert_eq!(code, 4, "exit 4 when a check fails:\n{report}");
    assert!(
        lines(&report, "FAIL", "webhook")
            .iter()
            .any(|l| l.contains("does not trust webhook pods.doctor.zkgate.io")),
        "the foreign caBundle is not named:\n{report}"
    );
    let cut_off = format!("{}/{broken}", ns.name);
    assert!(
        lines(&report, "FAIL", "ZooKeeper")
            .iter()
            .any(|l| l.contains(&cut_off) && l.contains("127.0.0.1:9")),
        "the controller that cannot reach ZooKeeper is not named:\n{report}"
    );
    assert!(
        lines(&report, "ok", "ZooKeeper")
            .iter()
            .any(|l| l.contains(&healthy)),
        "the healthy install is no longer ok beside them:\n{report}"
    );
    assert!(
        report.contains("fix: "),
        "no fix is given for what failed:\n{report}"
    );
}

/// The Service the chart's webhook configuration names.
async fn chart_webhook_service(c: &Cluster) -> String {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
    let chart = configurations
        .get(RELEASE)
        .await
        .expect("the chart's webhook configuration");
    chart
        .webhooks
        .iter()
        .flatten()
        .find_map(|w| w.client_config.service.as_ref().map(|s| s.name.clone()))
        .expect("the chart's webhook names a Service")
}
