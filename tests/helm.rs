//! The Helm chart: lint, render, validate against the real API server, and
//! prove its RBAC by running the controller with the chart's ServiceAccount.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::kube::{client, install_crds, kubeconfig, namespace};
use support::{isolated_connect, tool};
use zkgate::api::Barrier;
use zkgate::zk::{DoubleBarrier, EnterOptions};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/zkgate")
}

fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn template(args: &[&str]) -> String {
    let chart = chart();
    let mut all = vec!["template", "t", chart.to_str().unwrap()];
    all.extend_from_slice(args);
    ok(run(&tool("helm"), &all, None))
}

#[test]
fn the_chart_lints_strictly_and_refuses_a_missing_connect_string() {
    let chart = chart();
    ok(run(
        &tool("helm"),
        &[
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "--set",
            "zookeeper.connect=zk-0:2181/apps",
        ],
        None,
    ));
    let out = run(
        &tool("helm"),
        &["lint", "--strict", chart.to_str().unwrap()],
        None,
    );
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("zookeeper/connect"),
        "names the value: {text}"
    );
    let out = run(
        &tool("helm"),
        &[
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "--set",
            "zookeeper.connect=zk:2181,replicaCount=0",
        ],
        None,
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("replicaCount"),
        "{text}"
    );
}

/// The chart's conventions: names can be overridden, the pods take more
/// labels and the controller more flags, it can be a subchart (`global`),
/// and values that would render a broken install are refused by the
/// schema, naming the value. Each failed on the chart before (issue 29).
#[test]
fn the_chart_follows_the_conventions_and_refuses_what_would_break_it() {
    let chart = chart();
    let lint = |set: &str| {
        let out = run(
            &tool("helm"),
            &[
                "lint",
                "--strict",
                chart.to_str().unwrap(),
                "--set",
                &format!("zookeeper.connect=zk:2181,{set}"),
            ],
            None,
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    for (set, names) in [
        ("zookeeper.sessionTimeout=0s", "sessionTimeout"),
        ("zookeeper.sessionTimeout=0ms", "sessionTimeout"),
        (
            "zookeeper.tls.existingSecret=zk-tls,zookeeper.tls.certKey=tls.crt",
            "keyKey",
        ),
        (
            "zookeeper.tls.existingSecret=zk-tls,zookeeper.tls.keyKey=tls.key",
            "certKey",
        ),
        ("controller.extraArgs[0]=watch-namespace", "extraArgs"),
        (
            "webhook.participantSessionTimeout=soon",
            "participantSessionTimeout",
        ),
        (
            "webhook.participantSessionTimeout=0s",
            "participantSessionTimeout",
        ),
        (
            "webhook.participantResources.limits.cpu=lots",
            "participantResources",
        ),
        (
            "webhook.participantResources.limits.cpu=0",
            "participantResources",
        ),
        (
            "webhook.participantResources.limits.nvidia\\.com/gpu=1",
            "participantResources",
        ),
        (
            "webhook.participantImagePullSecrets[0].name=Registry",
            "participantImagePullSecrets",
        ),
        ("controller.runBarrierTimeout=0s", "runBarrierTimeout"),
        ("controller.runBarrierTimeout=soon", "runBarrierTimeout"),
    ] {
        let (ok, text) = lint(set);
        assert!(!ok && text.contains(names), "{set} refused: {text}");
    }
    for set in [
        "global.imageRegistry=registry.test",
        "zookeeper.sessionTimeout=1m30s",
        "webhook.participantSessionTimeout=30s",
        "webhook.participantResources.limits.cpu=2",
        "controller.runBarrierTimeout=1h30m",
        "zookeeper.tls.existingSecret=zk-tls,zookeeper.tls.certKey=tls.crt,zookeeper.tls.keyKey=tls.key",
    ] {
        let (ok, text) = lint(set);
        assert!(ok, "{set} accepted: {text}");
    }

    let deployment = |set: &str| -> k8s_openapi::api::apps::v1::Deployment {
        let rendered = template(&["--set", &format!("zookeeper.connect=zk:2181,{set}")]);
        let doc = rendered
            .split("\n---")
            .find(|d| d.contains("\nkind: Deployment"))
            .expect("a Deployment");
        serde_yaml_ng::from_str(doc).unwrap()
    };
    let env_of = |d: &k8s_openapi::api::apps::v1::Deployment, name: &str| {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    // Participants' session timeout: theirs unless given, then passed on.
    assert_eq!(
        env_of(
            &deployment("replicaCount=1"),
            "ZKGATE_PARTICIPANT_SESSION_TIMEOUT"
        ),
        None
    );
    assert_eq!(
        env_of(
            &deployment("webhook.participantSessionTimeout=30s"),
            "ZKGATE_PARTICIPANT_SESSION_TIMEOUT"
        )
        .as_deref(),
        Some("30s")
    );
    // The injected containers' resources: the chart's defaults are the
    // controller's own, and what is given reaches the controller in a form
    // it takes (a bare number too, as --set and YAML give one).
    let resources = |set: &str| {
        let text = env_of(&deployment(set), "ZKGATE_PARTICIPANT_RESOURCES").expect("passed on");
        zkgate::webhook::resources::parse(&text).unwrap_or_else(|e| panic!("{set}: {text}: {e}"))
    };
    assert_eq!(
        resources("replicaCount=1"),
        zkgate::webhook::resources::default()
    );
    let given = resources("webhook.participantResources.limits.cpu=2");
    assert_eq!(
        given.limits.unwrap()["cpu"],
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into())
    );
    // Helm merges values into the defaults: null drops a key, or all.
    let no_cpu_limit = resources("webhook.participantResources.limits.cpu=null");
    assert_eq!(
        no_cpu_limit.limits.unwrap().keys().collect::<Vec<_>>(),
        ["memory"]
    );
    assert_eq!(
        resources("webhook.participantResources=null"),
        k8s_openapi::api::core::v1::ResourceRequirements::default(),
        "none at all"
    );
    // The tenants' pull secrets and the run Barriers' timeout: passed on
    // when given, in the flags' forms, and nothing when not.
    for name in [
        "ZKGATE_PARTICIPANT_IMAGE_PULL_SECRETS",
        "ZKGATE_RUN_BARRIER_TIMEOUT",
    ] {
        assert_eq!(env_of(&deployment("replicaCount=1"), name), None, "{name}");
    }
    let given = deployment(
        "webhook.participantImagePullSecrets[0].name=registry,webhook.participantImagePullSecrets[1].name=mirror,controller.runBarrierTimeout=30m",
    );
    assert_eq!(
        env_of(&given, "ZKGATE_PARTICIPANT_IMAGE_PULL_SECRETS").as_deref(),
        Some("registry,mirror")
    );
    assert_eq!(
        env_of(&given, "ZKGATE_RUN_BARRIER_TIMEOUT").as_deref(),
        Some("30m")
    );
    let default = deployment("replicaCount=1");
    assert_eq!(
        default.metadata.name.as_deref(),
        Some("t-zkgate"),
        "release-chart"
    );
    let given = deployment(
        "fullnameOverride=gate,podLabels.team=ml,controller.extraArgs[0]=--rotation-grace=30m",
    );
    assert_eq!(given.metadata.name.as_deref(), Some("gate"));
    // The Prometheus Operator's objects, as `helm template` (GitOps) renders
    // them: there is no cluster to ask whether it serves their API.
    let monitored = template(&[
        "--namespace",
        "ops",
        "--set",
        "zookeeper.connect=zk:2181,metrics.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true",
    ]);
    assert!(
        monitored.contains("\nkind: ServiceMonitor\n")
            && monitored.contains("\nkind: PrometheusRule\n"),
        "{monitored}"
    );
    assert!(
        monitored.contains(r#"group_left () zkgate_install_info{install_namespace="ops"}) < 1"#),
        "the no-leader alert is this install's: {monitored}"
    );
    let pod = given.spec.unwrap().template;
    assert_eq!(
        pod.metadata
            .unwrap()
            .labels
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("ml")
    );
    assert_eq!(
        pod.spec.unwrap().containers[0].args.as_deref(),
        Some(&["controller".to_owned(), "--rotation-grace=30m".to_owned()][..])
    );
}

#[test]
fn the_rendered_manifests_are_accepted_by_the_api_server() {
    let kubectl = tool("kubectl");
    let default = template(&["--set", "zookeeper.connect=zk-0:2181/apps"]);
    let off = template(&["--set", "zookeeper.connect=zk:2181,webhook.enabled=false"]);
    assert!(
        default.contains("readOnlyRootFilesystem: true") && default.contains("runAsNonRoot: true")
    );
    assert!(!default.contains("StatefulSet"));
    // Issue 43, item 5: highly available by default: two replicas, a
    // PodDisruptionBudget, spread over nodes where there are several (and
    // scheduled where there is one), a grace for leaving the Service.
    assert!(
        default.contains("kind: PodDisruptionBudget")
            && default.contains("replicas: 2")
            && default.contains("terminationGracePeriodSeconds: 30"),
        "{default}"
    );
    let spread = default
        .split("topologySpreadConstraints:")
        .nth(1)
        .expect("topologySpreadConstraints rendered");
    assert!(
        spread.contains("topologyKey: kubernetes.io/hostname")
            && spread.contains("whenUnsatisfiable: ScheduleAnyway")
            && spread.contains("app.kubernetes.io/name: zkgate"),
        "{spread}"
    );
    assert!(!default.contains("priorityClassName"));
    let single = template(&[
        "--set",
        "zookeeper.connect=zk:2181,replicaCount=1,priorityClassName=zkgate-critical,topologySpreadConstraints=null",
    ]);
    assert!(
        !single.contains("PodDisruptionBudget")
            && single.contains("priorityClassName: \"zkgate-critical\"")
            && !single.contains("topologySpreadConstraints"),
        "{single}"
    );
    ok(run(
        &kubectl,
        &["apply", "--dry-run=server", "-n", "default", "-f", "-"],
        Some(&single),
    ));
    ok(run(
        &kubectl,
        &["apply", "--dry-run=server", "-n", "default", "-f", "-"],
        Some(&default),
    ));

    let custom = template(&[
        "--set",
        "zookeeper.deploy=true,replicaCount=2,controller.watchNamespace=jobs,webhook.enabled=true",
        "--set",
        "zookeeper.auth.existingSecret=zk-auth",
    ]);
    assert!(
        custom.contains("kind: StatefulSet")
            && custom.contains("t-zkgate-zookeeper.default.svc:2181"),
        "the quick-start ZooKeeper by a name pods of every namespace resolve"
    );
    assert!(
        custom.contains("apiVersion: policy/v1\n"),
        "every supported cluster serves policy/v1"
    );
    assert!(custom.contains("secretKeyRef") && custom.contains("ZKGATE_WATCH_NAMESPACE"));
    // Issue 25, item 4: with a controller credential the controller writes
    // no Secret anywhere (participants get their credential from its
    // handout, after a TokenReview); its one Secret rule is on the
    // webhook's certificate, by name, without create.
    let secret_rules = rules_on(&custom, "secrets");
    assert_eq!(secret_rules.len(), 1, "{secret_rules:?}");
    assert!(
        secret_rules[0].contains("t-zkgate-webhook-tls")
            && !secret_rules[0].contains("create")
            && !secret_rules[0].contains("patch"),
        "{secret_rules:?}"
    );
    assert!(!off.contains("secrets"), "{off}");
    assert!(
        custom.contains("resources: [\"tokenreviews\"]")
            && custom.contains("\nkind: Secret\n")
            && custom.contains("ZKGATE_WEBHOOK_SERVICE"),
        "the handout reviews tokens; the chart makes the certificate Secret: {custom}"
    );
    let refused = run(
        &tool("helm"),
        &[
            "template",
            "t",
            chart().to_str().unwrap(),
            "--set",
            "zookeeper.connect=zk:2181,webhook.enabled=false,zookeeper.auth.existingSecret=zk-auth",
        ],
        None,
    );
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("needs webhook.enabled=true"),
        "a credential without the webhook (which serves the handout) must be refused: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // With a watched namespace the namespaced rules are a Role there; the
    // ClusterRole reads namespaces only.
    let document = |kind: &str| {
        custom
            .split("\n---")
            .find(|d| d.contains(&format!("\nkind: {kind}\n")))
            .unwrap_or_else(|| panic!("no {kind} in:\n{custom}"))
            .to_owned()
    };
    let (cluster_role, role) = (document("ClusterRole"), document("Role"));
    assert!(
        role.contains("namespace: jobs") && role.contains("barriers/status"),
        "{role}"
    );
    assert!(
        !cluster_role.contains("barriers") && !cluster_role.contains("secrets"),
        "{cluster_role}"
    );
    // kube-system by name; the namespaces' metadata followed (issue 25,
    // item 3: a credential goes with its namespace).
    assert!(
        cluster_role.contains("resourceNames: [\"kube-system\"]")
            && cluster_role.contains("verbs: [\"get\", \"list\", \"watch\"]"),
        "{cluster_role}"
    );
    assert!(
        default.contains("resourceNames: [\"kube-system\"]"),
        "every install reads the kube-system namespace (its cluster's identity) and no other"
    );
    let _ = run(&kubectl, &["create", "namespace", "jobs"], None);
    ok(run(
        &kubectl,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&custom),
    ));

    let tls = template(&[
        "--set",
        "zookeeper.connect=tcp+tls://zk-0:2281",
        "--set",
        "zookeeper.tls.existingSecret=zk-tls,zookeeper.tls.certKey=tls.crt,zookeeper.tls.keyKey=tls.key",
    ]);
    for wanted in [
        "ZKGATE_TLS_CA",
        "ZKGATE_TLS_CERT",
        "ZKGATE_TLS_KEY",
        "secretName: zk-tls",
        "mountPath: /etc/zkgate/tls",
    ] {
        assert!(tls.contains(wanted), "{wanted} missing from:\n{tls}");
    }
    ok(run(
        &kubectl,
        &["apply", "--dry-run=server", "-n", "default", "-f", "-"],
        Some(&tls),
    ));

    // The webhook: registered for labelled pods only, kube-system excluded,
    // its certificate made by the controller (the caBundle it may patch)...
    let hooked = template(&[
        "--set",
        "zookeeper.connect=tcp+tls://zk-0:2281,zookeeper.tls.existingSecret=zk-tls",
        "--set",
        "webhook.enabled=true",
    ]);
    for wanted in [
        "kind: MutatingWebhookConfiguration",
        "failurePolicy: Fail",
        "key: zkgate.io/barrier",
        "key: zkgate.io/lock",
        "key: zkgate.io/credentials",
        "operator: Exists",
        "values: [\"kube-system\"]",
        "ZKGATE_WEBHOOK_ADDR",
        "value: \"t-zkgate-webhook.default.svc,t-zkgate-webhook.default.svc.cluster.local\"",
        "value: \"default/t-zkgate-webhook\"",
        "resources: [\"tokenreviews\"]",
        "resourceNames: [\"t-zkgate-webhook-tls\"]",
        "resources: [\"mutatingwebhookconfigurations\", \"validatingwebhookconfigurations\"]",
        "kind: ValidatingWebhookConfiguration",
        "path: /validate/barriers",
        "containerPort: 9443",
    ] {
        assert!(hooked.contains(wanted), "{wanted} missing from:\n{hooked}");
    }
    assert!(
        default.contains("MutatingWebhookConfiguration"),
        "on by default"
    );
    assert!(!off.contains("MutatingWebhookConfiguration") && !off.contains("webhook"));
    ok(run(
        &kubectl,
        &["apply", "--dry-run=server", "-n", "default", "-f", "-"],
        Some(&hooked),
    ));
    // ...or by cert-manager, which then fills the caBundle.
    let managed = template(&[
        "--set",
        "zookeeper.connect=zk:2181,webhook.enabled=true,webhook.certManager.enabled=true",
    ]);
    for wanted in [
        "cert-manager.io/inject-ca-from: default/t-zkgate-webhook",
        "kind: Certificate",
        "secretName: t-zkgate-webhook-tls",
        "ZKGATE_WEBHOOK_CERT_DIR",
        "mountPath: /etc/zkgate/webhook",
    ] {
        assert!(
            managed.contains(wanted),
            "{wanted} missing from:\n{managed}"
        );
    }
    assert!(
        !managed.contains("mutatingwebhookconfigurations")
            && !managed.contains("ZKGATE_WEBHOOK_NAMES"),
        "with cert-manager the controller neither makes certificates nor patches the caBundle"
    );
    // Issue 25, item 8: nor may it read or write any Secret then (it reads
    // the certificate from the mounted files; without TLS to ZooKeeper and
    // without a credential nothing else of its is a Secret).
    let secret_rules = rules_on(&managed, "secrets");
    assert!(
        secret_rules.is_empty(),
        "with cert-manager the controller keeps Secret rules it does not use: {secret_rules:?}"
    );

    let new_cluster = template(&[
        "--set",
        "zookeeper.connect=zk:2181,replicaCount=3,metrics.serviceMonitor.enabled=true",
        "--api-versions",
        "policy/v1/PodDisruptionBudget",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
    ]);
    assert!(
        new_cluster.contains("apiVersion: policy/v1\n")
            && new_cluster.contains("kind: ServiceMonitor")
    );
}

/// The rules of the rendered Roles and ClusterRoles on `resource`.
fn rules_on(rendered: &str, resource: &str) -> Vec<String> {
    documents(rendered)
        .filter(|doc| doc["kind"] == "Role" || doc["kind"] == "ClusterRole")
        .flat_map(|doc| doc["rules"].as_array().cloned().unwrap_or_default())
        .filter(|rule| {
            rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r == resource))
        })
        .map(|rule| rule.to_string())
        .collect()
}

/// Chart.yaml's metadata for Artifact Hub and `helm show chart`: where the
/// project lives, and lists that must follow the code: the CRDs (those
/// generated) and the image (the appVersion's tag).
#[test]
fn the_charts_metadata_names_its_home_crds_and_image() {
    let chart_yaml: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert!(chart_yaml["home"]
        .as_str()
        .is_some_and(|h| h.starts_with("https://")));
    assert!(chart_yaml["sources"]
        .as_array()
        .is_some_and(|s| !s.is_empty()));
    let annotations = &chart_yaml["annotations"];
    let listed = |key: &str| -> serde_json::Value {
        serde_yaml_ng::from_str(
            annotations[key]
                .as_str()
                .unwrap_or_else(|| panic!("no {key}")),
        )
        .unwrap()
    };
    let crds: Vec<String> = listed("artifacthub.io/crds")
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let generated: Vec<String> = zkgate::api::crds()
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(crds, generated, "artifacthub.io/crds drifted from the CRDs");
    let app_version = chart_yaml["appVersion"].as_str().unwrap();
    let images = listed("artifacthub.io/images");
    assert_eq!(
        images[0]["image"].as_str().unwrap(),
        format!("ghcr.io/zkgate/zkgate:{app_version}"),
        "artifacthub.io/images must name the appVersion's image"
    );
    assert_eq!(annotations["artifacthub.io/license"], "Apache-2.0");
}

/// The chart's CRD files are the generated ones, and it renders them as
/// templates (so `helm upgrade` upgrades them), kept on uninstall by
/// default, neither with `crds.install=false`.
#[test]
fn the_charts_crds_are_the_generated_ones_and_upgraded_with_it() {
    let rendered = template(&["--set", "zookeeper.connect=zk:2181"]);
    let documents: Vec<serde_json::Value> = rendered
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str::<serde_json::Value>(doc).ok())
        .filter(|doc| doc["kind"] == "CustomResourceDefinition")
        .collect();
    for crd in zkgate::api::crds() {
        let name = zkgate::api::file_name(&crd);
        let in_chart =
            std::fs::read_to_string(chart().join("files/crds").join(&name)).expect("chart CRD");
        assert_eq!(
            in_chart,
            zkgate::api::to_yaml(&crd),
            "charts/zkgate/files/crds/{name} drifted: run scripts/gen-crds"
        );
        let crd_name = crd.metadata.name.clone().unwrap();
        let found = documents
            .iter()
            .find(|d| d["metadata"]["name"] == crd_name.as_str())
            .unwrap_or_else(|| panic!("the chart does not render {crd_name}"));
        // Helm's toYaml writes 1.0 as 1: numbers compare as numbers.
        assert_eq!(
            numbers_as_floats(found["spec"].clone()),
            numbers_as_floats(serde_json::to_value(&crd.spec).unwrap()),
            "{crd_name} renders another spec than the generated one"
        );
        assert_eq!(
            found["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{crd_name} must survive helm uninstall by default"
        );
        assert_eq!(
            found["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "Helm"
        );
    }
    let unkept = template(&["--set", "zookeeper.connect=zk:2181,crds.keep=false"]);
    assert!(
        unkept.contains("kind: CustomResourceDefinition") && !unkept.contains("resource-policy")
    );
    let none = template(&["--set", "zookeeper.connect=zk:2181,crds.install=false"]);
    assert!(!none.contains("CustomResourceDefinition"));
}

/// `value` with every number an f64.
fn numbers_as_floats(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_floats(v)))
                .collect(),
        ),
        other => other,
    }
}

/// A kubeconfig that authenticates as the chart's ServiceAccount.
fn service_account_kubeconfig(ns: &str, release: &str, dir: &Path) -> PathBuf {
    let token = ok(run(
        &tool("kubectl"),
        &["create", "token", &format!("{release}-zkgate"), "-n", ns],
        None,
    ));
    let admin = std::fs::read_to_string(kubeconfig()).unwrap();
    let mut out = String::new();
    for line in admin.lines() {
        if let Some(rest) = line.strip_prefix("    token: ") {
            let _ = rest;
            out.push_str(&format!("    token: {}\n", token.trim()));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let path = dir.join("sa-kubeconfig");
    std::fs::write(&path, out).unwrap();
    path
}

/// How long a Barrier may take to open, with the chart's RBAC and without
/// one of its rules: one deadline for both, so a removal that only slows the
/// controller past it cannot pass for a needed rule.
const OPENS_WITHIN: Duration = Duration::from_secs(20);

/// What `controller_reconciles_with_chart_rbac` saw.
struct RbacRun {
    /// The Barrier went from Waiting to Open within `OPENS_WITHIN`.
    opened: bool,
    /// How many of the ClusterRole's rules were removed.
    removed: usize,
    /// The controller's log.
    log: String,
}

/// Installs the chart, runs the controller with its ServiceAccount's token
/// (with a controller credential when `with_auth`, which makes it hand each
/// namespace's pods their credential: then with the webhook and the
/// handout it serves, limited to the test's namespace), and tells whether a
/// Barrier goes from Waiting to Open with a participant in it within
/// `OPENS_WITHIN`.
async fn controller_reconciles_with_chart_rbac(
    remove_rule: Option<&[&str]>,
    with_auth: bool,
    sized_by_job: bool,
) -> RbacRun {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let release = format!("r{}", &ns[2..8]);
    let zk = isolated_connect();
    let chart = chart();
    ok(run(
        &tool("helm"),
        &[
            "install",
            &release,
            chart.to_str().unwrap(),
            "-n",
            &ns,
            "--set",
            &format!("zookeeper.connect={zk}"),
            "--set",
            "replicaCount=1",
            // The CRDs are the shared API server's already (installed
            // once for every test), not this release's.
            "--set",
            "crds.install=false",
            // The controller runs outside the cluster here. Without a
            // credential, without the webhook; with one, the webhook (the
            // handout rides on it) for the test's namespace alone, so that
            // a webhook the API server cannot reach refuses no labelled pod
            // of the other tests sharing this API server.
            "--set",
            &format!("webhook.enabled={with_auth}"),
            "--set",
            &format!(
                "controller.watchNamespace={}",
                if with_auth { ns.as_str() } else { "" }
            ),
            "--set",
            &format!(
                "zookeeper.auth.existingSecret={}",
                if with_auth { "zk-auth" } else { "" }
            ),
        ],
        None,
    ));
    let mut removed = 0;
    if let Some(rule) = remove_rule {
        // Drop the rule that holds every one of `rule`'s words (in its
        // resources, names or verbs) from the installed ClusterRole: the
        // controller must notice.
        let role = format!("{release}-zkgate");
        let current = ok(run(
            &tool("kubectl"),
            &["get", "clusterrole", &role, "-o", "json"],
            None,
        ));
        let mut value: serde_json::Value = serde_json::from_str(&current).unwrap();
        let rules = value["rules"].as_array_mut().unwrap();
        let before = rules.len();
        rules.retain(|r| !rule.iter().all(|word| r.to_string().contains(word)));
        removed = before - rules.len();
        ok(run(
            &tool("kubectl"),
            &["replace", "-f", "-"],
            Some(&value.to_string()),
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account_kubeconfig(&ns, &release, dir.path());
    let log_path = dir.path().join("controller.log");
    let metrics = support::zookeeper::free_port();
    let webhook_port = support::zookeeper::free_port();
    let service = format!("{release}-zkgate-webhook");
    // What the chart's Deployment gives the controller with the webhook.
    let webhook_args: Vec<String> = if with_auth {
        [
            "--webhook-addr",
            &format!("127.0.0.1:{webhook_port}"),
            "--image",
            "registry.test/zkgate:test",
            "--webhook-secret",
            &format!("{release}-zkgate-webhook-tls"),
            "--webhook-secret-namespace",
            &ns,
            "--webhook-configuration",
            &format!("{release}-zkgate"),
            "--webhook-names",
            &format!("{service}.{ns}.svc"),
            "--webhook-service",
            &format!("{ns}/{service}"),
        ]
        .map(str::to_owned)
        .to_vec()
    } else {
        Vec::new()
    };
    let _controller = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args([
            "controller",
            "--zookeeper",
            &zk,
            "--watch-namespace",
            &ns,
            "--id",
            "sa-controller",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .args(if with_auth {
            &["--auth", "zkgate-controller:chart-test"][..]
        } else {
            &[]
        })
        .args(&webhook_args)
        .env("KUBECONFIG", &sa)
        .env("ZKGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let spec = if sized_by_job {
        // Sized by a Job of one pod (read from the controller's Job cache).
        let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
            "metadata": { "name": "j" },
            "spec": { "parallelism": 1, "template": { "spec": {
                "restartPolicy": "Never", "containers": [{ "name": "w", "image": "busybox" }]
            } } }
        }))
        .unwrap();
        Api::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &job)
            .await
            .unwrap();
        json!({ "jobRef": "j" })
    } else {
        json!({ "participants": 1 })
    };
    let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "g" }, "spec": spec })).unwrap();
    barriers.create(&PostParams::default(), &b).await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    let token_file = dir.path().join("participant-token");
    if with_auth {
        let token = support::handout::token(&client, &ns, zkgate::handout::AUDIENCE).await;
        std::fs::write(&token_file, token).unwrap();
    }
    let path = format!("/zkgate/namespaces/{ns}/barriers/g");
    let deadline = tokio::time::Instant::now() + OPENS_WITHIN;
    let mut entered = false;
    let opened = loop {
        let phase = barriers
            .get("g")
            .await
            .ok()
            .and_then(|b| b.status)
            .and_then(|s| s.phase);
        // Once: the status may still say Waiting for a moment after the
        // participant opened the barrier.
        if phase == Some(zkgate::api::BarrierPhase::Waiting) && !entered {
            entered = true;
            let mut options = zkgate::zk::SessionOptions::new(zk.parse().unwrap());
            if with_auth {
                // The namespace's credential, as its pods get it: from the
                // handout, checked against the webhook's CA.
                let ca = secrets
                    .get(&format!("{release}-zkgate-webhook-tls"))
                    .await
                    .ok()
                    .and_then(|s| s.data?.get("ca.crt").cloned())
                    .map(|b| String::from_utf8(b.0).unwrap())
                    .unwrap_or_default();
                let source = zkgate::handout::Source {
                    urls: vec![format!("https://127.0.0.1:{webhook_port}")],
                    server_name: Some(format!("{service}.{ns}.svc")),
                    ca,
                    token_file: token_file.clone(),
                };
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let Ok(handout) = source.fetch(Some(left)).await else {
                    break false;
                };
                options.credential = Some(
                    zkgate::zk::Credential::parse(&handout.auth.expect("a credential")).unwrap(),
                );
            }
            let participant = zkgate::zk::Session::connect(&options).await.unwrap();
            // Within the same deadline: an enter that waits for a count
            // the controller never writes must not outlast it.
            let entered = DoubleBarrier::new(&path)
                .enter(&participant, "p0", &EnterOptions::default(), Some(deadline))
                .await;
            std::mem::forget(participant); // keeps the registration until the test ends
            if entered.is_err() {
                break false;
            }
        }
        if phase == Some(zkgate::api::BarrierPhase::Open) {
            break true;
        }
        if tokio::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    RbacRun {
        opened,
        removed,
        log: std::fs::read_to_string(&log_path).unwrap_or_default(),
    }
}

#[tokio::test]
async fn the_controller_works_with_exactly_the_charts_rbac() {
    assert!(
        controller_reconciles_with_chart_rbac(None, false, true)
            .await
            .opened,
        "the chart's RBAC must be enough to reconcile a Barrier (sized by its Job) end to end"
    );
}

#[tokio::test]
async fn with_a_controller_credential_the_charts_rbac_covers_the_handout() {
    assert!(
        controller_reconciles_with_chart_rbac(None, true, false)
            .await
            .opened,
        "the chart's RBAC must let the controller hand out the namespace's credential"
    );
}

/// Each case removes exactly one rule of the installed ClusterRole. The
/// Barrier must not open within `OPENS_WITHIN`, while the same setup with
/// every rule (the positive control, run beside it) opens within that same
/// deadline, and the controller must say which call was forbidden (the API
/// server's "cannot VERB resource" names the verb and the resource).
// A worker each, since the helper's helm and kubectl calls block.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_missing_verb_in_the_charts_rbac_stops_the_controller() {
    // (the words that pick the rule, with_auth, sized_by_job, the forbidden
    // call the controller must report, why the rule is needed)
    let cases: [(&'static [&'static str], bool, bool, &str, &str); 4] = [
        (
            &["barriers/status"],
            false,
            false,
            "cannot patch resource \"barriers/status\"",
            "without status patch the Barrier must not get a status",
        ),
        (
            &["kube-system"],
            false,
            false,
            "cannot get resource \"namespaces\"",
            "without reading kube-system the controller cannot know its cluster's root",
        ),
        (
            &["\"jobs\""],
            false,
            true,
            "resource \"jobs\"",
            "without the Job reads a Barrier sized by its Job must not open",
        ),
        // No Secret rule is left to need; the handout needs TokenReviews.
        (
            &["tokenreviews"],
            true,
            false,
            "cannot create resource \"tokenreviews\"",
            "without reviewing tokens a controller with a credential must hand out nothing",
        ),
    ];
    let controls = [(false, false), (false, true), (true, false)];
    let runs: Vec<_> = cases
        .iter()
        .map(|&(rule, auth, job, _, _)| {
            tokio::spawn(controller_reconciles_with_chart_rbac(Some(rule), auth, job))
        })
        .collect();
    let control_runs: Vec<_> = controls
        .iter()
        .map(|&(auth, job)| tokio::spawn(controller_reconciles_with_chart_rbac(None, auth, job)))
        .collect();
    let runs = futures::future::try_join_all(runs).await.unwrap();
    let control_runs = futures::future::try_join_all(control_runs).await.unwrap();
    for ((auth, job), run) in controls.iter().zip(&control_runs) {
        assert!(
            run.opened,
            "the positive control (auth {auth}, sized by a Job {job}) must open within {OPENS_WITHIN:?}: {}",
            run.log
        );
    }
    for ((rule, _, _, forbidden, why), run) in cases.iter().zip(&runs) {
        assert_eq!(run.removed, 1, "{rule:?} must pick exactly one rule");
        assert!(!run.opened, "{why} (removed {rule:?})");
        // The API server's message, as logged (quotes escaped in a field).
        let log = run.log.replace('\\', "");
        assert!(
            log.contains("forbidden") && log.contains(forbidden),
            "without {rule:?} the controller must report the forbidden call ({forbidden}): {}",
            run.log
        );
    }
}

/// The NetworkPolicy renders what its values ask: the webhook's and the
/// metrics' peers, the watched namespace's pods beside the API server where
/// the controller hands out credentials (and not where it has none), the
/// egress to DNS, ZooKeeper (the quick start's pod, or the peers given) and
/// the API server; and the API server takes each.
#[test]
fn the_network_policy_renders_what_its_values_ask_and_the_api_server_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("policy.yaml");
    let api_server = json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}]);
    let monitoring = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let ensemble =
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "zk"}}}]);
    std::fs::write(
        &values,
        json!({"networkPolicy": {
            "enabled": true,
            "webhook": {"ingressFrom": api_server},
            "metrics": {"ingressFrom": monitoring},
            "egress": {"enabled": true, "zookeeperPorts": [2181, 2281],
                       "zookeeperTo": ensemble, "apiServerTo": api_server},
        }})
        .to_string(),
    )
    .unwrap();
    let policy_of = |rendered: &str| {
        documents(rendered)
            .find(|d| d["kind"] == "NetworkPolicy")
            .unwrap_or_else(|| panic!("no NetworkPolicy rendered:\n{rendered}"))
    };
    let port = |number: u16, protocol: &str| json!({"port": number, "protocol": protocol});

    // With a controller credential (pods ask the handout) and a watched
    // namespace.
    let handing_out = template(&[
        "-f",
        values.to_str().unwrap(),
        "--set",
        "zookeeper.connect=zk:2181,zookeeper.auth.existingSecret=zk-auth,controller.watchNamespace=jobs",
    ]);
    let policy = policy_of(&handing_out);
    let spec = &policy["spec"];
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        spec["podSelector"]["matchExpressions"],
        json!([{"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["zookeeper"]}]),
        "the quick start's ZooKeeper, which shares the selector labels, is not the controller"
    );
    assert_eq!(
        spec["ingress"],
        json!([
            {"ports": [port(9443, "TCP")], "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "jobs"}}},
                api_server[0],
            ]},
            {"ports": [port(8080, "TCP")], "from": monitoring},
        ])
    );
    assert_eq!(
        spec["egress"],
        json!([
            {"ports": [port(53, "UDP"), port(53, "TCP")]},
            {"ports": [port(2181, "TCP"), port(2281, "TCP")], "to": ensemble},
            {"ports": [port(443, "TCP"), port(6443, "TCP")], "to": api_server},
        ])
    );

    // Without a credential (nothing to hand out) and with the quick
    // start's ZooKeeper: the webhook's port for the API server alone, and
    // ZooKeeper is that pod.
    let quick = template(&[
        "-f",
        values.to_str().unwrap(),
        "--set",
        "zookeeper.deploy=true,networkPolicy.egress.zookeeperTo=null",
    ]);
    let quick_policy = policy_of(&quick);
    let spec = &quick_policy["spec"];
    assert_eq!(spec["ingress"][0]["from"], api_server);
    assert_eq!(
        spec["egress"][1]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "zookeeper",
        "{spec}"
    );
    assert!(
        !template(&["--set", "zookeeper.connect=zk:2181"]).contains("kind: NetworkPolicy"),
        "off by default"
    );
    let kubectl = tool("kubectl");
    for rendered in [&handing_out, &quick] {
        ok(run(
            &kubectl,
            &["apply", "--dry-run=server", "-n", "default", "-f", "-"],
            Some(&serde_json::to_string(&policy_of(rendered)).unwrap()),
        ));
    }
}

/// Every metric the chart's Grafana dashboard and PrometheusRule query is
/// one the controller exports (read from a running controller's /metrics).
#[tokio::test]
async fn the_dashboard_and_the_alerts_use_only_exported_metrics() {
    let rendered = template(&[
        "--set",
        "zookeeper.connect=zk:2181,monitoring.dashboard.enabled=true,monitoring.prometheusRule.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
    ]);
    assert!(
        rendered.contains("kind: PrometheusRule") && rendered.contains("grafana_dashboard: \"1\"")
    );
    let used: std::collections::BTreeSet<String> = regex_lite::Regex::new(r"zkgate_[a-z_]+")
        .unwrap()
        .find_iter(&rendered)
        .map(|m| m.as_str().to_owned())
        .filter(|m| m != "zkgate_dashboard")
        .collect();
    for alerting in [
        "zkgate_barrier_oldest_waiting_created_timestamp_seconds",
        "zkgate_lock_earliest_revocation_timestamp_seconds",
        "zkgate_leader",
        "zkgate_install_info",
        "zkgate_zookeeper_session_connected",
        "zkgate_webhook_admissions_total",
        "zkgate_webhook_certificate_expiry_timestamp_seconds",
        "zkgate_barrier_held_seconds_bucket",
        "zkgate_barrier_failures_total",
        "zkgate_barrier_gang_restarts_total",
        "zkgate_handout_requests_total",
        "zkgate_webhook_admission_duration_seconds_bucket",
    ] {
        assert!(used.contains(alerting), "{alerting} not queried: {used:?}");
    }

    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let zk = isolated_connect();
    let controller = support::kube::ControllerProcess::start(&ns, &zk, "metrics-check");
    // A Barrier of one that opens: the time held at barriers is exported
    // by namespace, so its series exists once one opened there.
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let barrier: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "held" }, "spec": { "participants": 1 }
    }))
    .unwrap();
    barriers
        .create(&PostParams::default(), &barrier)
        .await
        .unwrap();
    let mut enter = support::zkgate(
        &zk,
        &["barrier", "enter", "held", "--id", "p0", "--timeout", "60s"],
    );
    enter.env("ZKGATE_NAMESPACE", &ns);
    let (code, err) = support::output(enter).await;
    assert_eq!(code, 0, "barrier enter: {err}");
    let held = format!("zkgate_barrier_held_seconds_count{{barrier_namespace=\"{ns}\"}} 1");
    let body = support::eventually(
        Duration::from_secs(30),
        "the wait at held counted",
        || async {
            support::http_get(controller.metrics_port, "/metrics")
                .await
                .map(|(_, body)| body)
                .filter(|body| body.lines().any(|l| l == held))
        },
    )
    .await;
    // `# TYPE name kind`: counters are sampled as name_total, histograms as
    // name_bucket, name_sum and name_count.
    let exported: std::collections::BTreeSet<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    for name in &used {
        let base = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(b)))
            .unwrap_or(name);
        assert!(
            exported.contains(base),
            "{name} is queried by the chart but not exported:\n{body}"
        );
    }
    assert!(
        body.lines().any(|l| l.starts_with("zkgate_install_info{")
            && l.contains("install_namespace=\"")
            && l.ends_with(" 1")),
        "the controller does not say its install (the no-leader alert picks replicas by it):\n{body}"
    );
    support::docs::check_generated("metrics.md", &metrics_page(&body));
}

/// The chart's alerts, evaluated by Prometheus' own rule engine (`promtool
/// test rules`, tools/promtool) on series as the controllers export them:
/// each fires when its condition holds, not before its `for`, with the
/// labels and annotations it is routed by, and only for its own install
/// (another install's replicas, scraped by the same Prometheus, neither
/// fire nor hide it).
#[test]
fn the_alerts_fire_on_their_condition_for_their_own_install_only() {
    const OURS: &str = "zkgate-system";
    let rendered = template(&[
        "--namespace",
        OURS,
        "--set",
        "zookeeper.connect=zk:2181,monitoring.prometheusRule.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
    ]);
    let rule = documents(&rendered)
        .find(|doc| doc["kind"] == "PrometheusRule")
        .expect("a PrometheusRule rendered");
    let groups = &rule["spec"]["groups"];
    let annotations = |alert: &str| {
        groups
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["alert"] == alert)
            .unwrap_or_else(|| panic!("no alert {alert}"))["annotations"]
            .clone()
    };
    // Every scrape sets job and instance; a replica of another install
    // says so in its install_info.
    let series = |name: &str, instance: &str, extra: &str, values: &str| {
        json!({
            "series": format!("{name}{{job=\"zkgate\",instance=\"{instance}\"{extra}}}"),
            "values": values,
        })
    };
    let install = |instance: &str, namespace: &str| {
        series(
            "zkgate_install_info",
            instance,
            &format!(",install_namespace=\"{namespace}\",version=\"0.2.0\""),
            "1x60",
        )
    };
    let fires =
        |alert: &str, at: &str, labels: serde_json::Value, annotations: serde_json::Value| {
            json!({"eval_time": at, "alertname": alert,
               "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]})
        };
    let quiet =
        |alert: &str, at: &str| json!({"eval_time": at, "alertname": alert, "exp_alerts": []});
    let day = 86_400;
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            // A Barrier waiting since t=600 s (its 30 min are up at 40 min);
            // the other replica has none; another install's has waited
            // since t=1 s (up at 30 min).
            {"interval": "1m", "input_series": [
                install("a", OURS), install("b", OURS), install("c", "other"),
                series("zkgate_barrier_oldest_waiting_created_timestamp_seconds", "a", "", "600x60"),
                series("zkgate_barrier_oldest_waiting_created_timestamp_seconds", "b", "", "0x60"),
                series("zkgate_barrier_oldest_waiting_created_timestamp_seconds", "c", "", "1x60"),
            ], "alert_rule_test": [
                quiet("ZkgateBarrierWaitingTooLong", "35m"),
                quiet("ZkgateBarrierWaitingTooLong", "40m"),
                fires("ZkgateBarrierWaitingTooLong", "41m", json!({"severity": "warning"}),
                      annotations("ZkgateBarrierWaitingTooLong")),
            ]},
            // A hold revoked at t=3000 s (50 min); another install's at
            // t=600 s.
            {"interval": "1m", "input_series": [
                install("a", OURS), install("b", OURS), install("c", "other"),
                series("zkgate_lock_earliest_revocation_timestamp_seconds", "a", "", "3000x60"),
                series("zkgate_lock_earliest_revocation_timestamp_seconds", "b", "", "0x60"),
                series("zkgate_lock_earliest_revocation_timestamp_seconds", "c", "", "600x60"),
            ], "alert_rule_test": [
                quiet("ZkgateLockNearItsLease", "10m"),
                quiet("ZkgateLockNearItsLease", "49m"),
                fires("ZkgateLockNearItsLease", "50m", json!({"severity": "info"}),
                      annotations("ZkgateLockNearItsLease")),
            ]},
            // This install's leader steps down at 10 min and nobody takes
            // over; another install's leader leads all along.
            {"interval": "1m", "input_series": [
                install("a", OURS), install("b", OURS), install("c", "other"),
                series("zkgate_leader", "a", "", "1x10 0x50"),
                series("zkgate_leader", "b", "", "0x60"),
                series("zkgate_leader", "c", "", "1x60"),
            ], "alert_rule_test": [
                quiet("ZkgateNoLeader", "10m"),
                quiet("ZkgateNoLeader", "14m"),
                fires("ZkgateNoLeader", "20m", json!({"severity": "critical"}),
                      annotations("ZkgateNoLeader")),
            ]},
            // Only another install is scraped: this one's replicas are gone.
            {"interval": "1m", "input_series": [
                install("c", "other"),
                series("zkgate_leader", "c", "", "1x60"),
            ], "alert_rule_test": [
                quiet("ZkgateNoLeader", "4m"),
                fires("ZkgateNoLeader", "6m",
                      json!({"severity": "critical", "install_namespace": OURS}),
                      annotations("ZkgateNoLeader")),
            ]},
            // A replica's session lost at 5 min; another install's lost
            // from the start.
            {"interval": "1m", "input_series": [
                install("a", OURS), install("b", OURS), install("c", "other"),
                series("zkgate_zookeeper_session_connected", "a", ",pod=\"zkgate-0\"", "1x5 0x55"),
                series("zkgate_zookeeper_session_connected", "b", ",pod=\"zkgate-1\"", "1x60"),
                series("zkgate_zookeeper_session_connected", "c", ",pod=\"other-0\"", "0x60"),
            ], "alert_rule_test": [
                quiet("ZkgateZooKeeperSessionDown", "4m"),
                quiet("ZkgateZooKeeperSessionDown", "6m"),
                fires("ZkgateZooKeeperSessionDown", "8m",
                      json!({"severity": "critical", "job": "zkgate", "instance": "a", "pod": "zkgate-0"}),
                      json!({
                          "summary": "zkgate controller zkgate-0 has no ZooKeeper session.",
                          "description": annotations("ZkgateZooKeeperSessionDown")["description"],
                      })),
            ]},
            // This install's admissions fail from 10 min on; another
            // install's fail all along.
            {"interval": "1m", "input_series": [
                install("a", OURS), install("c", "other"),
                series("zkgate_webhook_admissions_total", "a", ",outcome=\"failed\"", "0x10 1+1x50"),
                series("zkgate_webhook_admissions_total", "a", ",outcome=\"injected\"", "0+5x60"),
                series("zkgate_webhook_admissions_total", "c", ",outcome=\"failed\"", "0+3x60"),
            ], "alert_rule_test": [
                quiet("ZkgateAdmissionsFailing", "10m"),
                quiet("ZkgateAdmissionsFailing", "13m"),
                fires("ZkgateAdmissionsFailing", "20m", json!({"severity": "warning"}),
                      annotations("ZkgateAdmissionsFailing")),
            ]},
            // One replica serves a certificate good for 60 days; from 5 min
            // another serves one that ends in 10 (its reload failed). Another
            // install's ends tomorrow; a replica with no certificate says 0.
            {"interval": "1m", "input_series": [
                install("a", OURS), install("b", OURS), install("n", OURS), install("c", "other"),
                series("zkgate_webhook_certificate_expiry_timestamp_seconds", "a", "", &format!("{}x60", 60 * day)),
                series("zkgate_webhook_certificate_expiry_timestamp_seconds", "b", "", &format!("_x5 {}x55", 10 * day)),
                series("zkgate_webhook_certificate_expiry_timestamp_seconds", "n", "", "0x60"),
                series("zkgate_webhook_certificate_expiry_timestamp_seconds", "c", "", &format!("{day}x60")),
            ], "alert_rule_test": [
                quiet("ZkgateWebhookCertificateExpiring", "3m"),
                fires("ZkgateWebhookCertificateExpiring", "6m", json!({"severity": "warning"}),
                      annotations("ZkgateWebhookCertificateExpiring")),
            ]},
        ],
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        json!({ "groups": groups }).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("tests.yaml"), tests.to_string()).unwrap();
    let promtool = built_tool("promtool", "promtool");
    let checked = run(
        &promtool,
        &[
            "check",
            "rules",
            "--lint-fatal",
            dir.path().join("rules.yaml").to_str().unwrap(),
        ],
        None,
    );
    ok(checked);
    let tested = Command::new(&promtool)
        .args(["test", "rules", "tests.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    ok(tested);
}

/// The dashboard's variables pick an install, its replicas and the tenants'
/// namespaces; every query of a zkgate series is narrowed to the chosen
/// replicas (and the held-time panels to the chosen namespaces); and every
/// query parses as PromQL with Prometheus' own parser (`promtool check
/// rules` on them as recording rules).
#[test]
fn the_dashboards_queries_follow_its_variables_and_parse() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("dashboards/zkgate.json")).unwrap(),
    )
    .unwrap();
    let variables: std::collections::BTreeMap<&str, &str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["query"]["query"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        variables.get("install"),
        Some(&"label_values(zkgate_install_info, install_namespace)")
    );
    assert!(
        variables
            .get("instance")
            .is_some_and(|q| q.contains("install_namespace=\"$install\"")),
        "{variables:?}"
    );
    assert!(variables.contains_key("barrier_namespace"), "{variables:?}");

    let selector = regex_lite::Regex::new(r"(zkgate_[a-z_]+)(\{[^}]*\})?").unwrap();
    let mut rules = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for found in selector.captures_iter(expr) {
                let labels = found.get(2).map_or("", |m| m.as_str());
                assert!(
                    labels.contains("instance=~\"$instance\""),
                    "panel {:?}: {} is not narrowed to the chosen replicas: {expr}",
                    panel["title"],
                    &found[1]
                );
                if found[1].starts_with("zkgate_barrier_held_seconds") {
                    assert!(
                        labels.contains("barrier_namespace=~\"$barrier_namespace\""),
                        "panel {:?}: not narrowed to the chosen namespaces: {expr}",
                        panel["title"]
                    );
                }
            }
            let substituted = expr
                .replace("$instance", ".*")
                .replace("$barrier_namespace", ".*")
                .replace("$install", "zkgate-system");
            rules.push(json!({
                "record": format!("dashboard:panel_{}:query", rules.len()),
                "expr": substituted,
            }));
        }
    }
    assert!(rules.len() >= 20, "{} queries", rules.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.yaml");
    std::fs::write(
        &file,
        json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
    )
    .unwrap();
    ok(run(
        &built_tool("promtool", "promtool"),
        &["check", "rules", file.to_str().unwrap()],
        None,
    ));
}

/// The YAML documents of rendered manifests.
fn documents(rendered: &str) -> impl Iterator<Item = serde_json::Value> + '_ {
    rendered
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str::<serde_json::Value>(doc).ok())
}

/// The book's metrics reference, from a controller's `/metrics`: every
/// family with its type and help, as the code registers them.
fn metrics_page(exposition: &str) -> String {
    let mut families: std::collections::BTreeMap<&str, (&str, &str)> = Default::default();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name).or_default().1 = help;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name).or_default().0 = kind;
        }
    }
    let mut page = String::from(
        "# Metrics\n\n<!-- Generated by tests/helm.rs from a running controller's /metrics: do not edit. -->\n\n\
         Served on `/metrics` (`--metrics-addr`, default `0.0.0.0:8080`) in the\n\
         OpenMetrics text format. Counters are sampled as `NAME_total`, histograms\n\
         as `NAME_bucket`, `NAME_sum` and `NAME_count`. The metrics are aggregates\n\
         (no label per resource; the time held at barriers is by the Barrier's\n\
         namespace): every other label set is exported from the start at zero.\n\
         The dashboard and the alerts that use them are in\n\
         [Dashboards and alerts](../operations/monitoring.md).\n\n\
         | metric | type | what it counts |\n|---|---|---|\n",
    );
    for (name, (kind, help)) in families {
        page.push_str(&format!(
            "| `{name}` | {kind} | {} |\n",
            help.replace('|', "\\|")
        ));
    }
    page
}

/// Installs the chart's own webhook configurations (`helm template` with
/// `set`, as rendered, only their Service references replaced by loopback
/// URLs of the same paths: a bare API server routes no Service); their
/// name and the port the webhook must serve on.
async fn install_charts_webhook_configuration(client: &kube::Client, set: &str) -> (String, u16) {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let rendered = template(&["-n", "zkgate-system", "--set", set]);
    let port = support::zookeeper::free_port();
    let configuration = |kind: &str| {
        let mut configuration = rendered
            .split("\n---")
            .filter_map(|doc| serde_yaml_ng::from_str::<serde_json::Value>(doc).ok())
            .find(|doc| doc["kind"] == kind)
            .unwrap_or_else(|| panic!("the chart renders a {kind}"));
        for webhook in configuration["webhooks"].as_array_mut().unwrap() {
            let path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap()
                .to_owned();
            webhook["clientConfig"] = json!({ "url": format!("https://127.0.0.1:{port}{path}") });
        }
        configuration
    };
    let mutating = configuration("MutatingWebhookConfiguration");
    let name = mutating["metadata"]["name"].as_str().unwrap().to_owned();
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(mutating).unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();
    let validating: ValidatingWebhookConfiguration =
        serde_json::from_value(configuration("ValidatingWebhookConfiguration")).unwrap();
    assert_eq!(validating.metadata.name.as_deref(), Some(name.as_str()));
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .unwrap();
    (name, port)
}

/// A controller serving the webhook of configuration `name` on `port`
/// (`extra`: more options); returns once it serves and its CA is published.
async fn controller_serving_webhook(
    server: &support::kube::PrivateApiServer,
    client: &kube::Client,
    secret_namespace: &str,
    name: &str,
    port: u16,
    extra: &[&str],
) -> support::kube::ControllerProcess {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--webhook-addr",
        &addr,
        "--webhook-names",
        "127.0.0.1",
        "--webhook-secret",
        "zkgate-webhook-tls",
        "--webhook-secret-namespace",
        secret_namespace,
        "--webhook-configuration",
        name,
        "--image",
        "registry.test/zkgate:test",
    ];
    args.extend_from_slice(extra);
    let controller = support::kube::ControllerProcess::start_with(
        &server.kubeconfig(),
        &isolated_connect(),
        "controller-0",
        &args,
    );
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    support::eventually(
        Duration::from_secs(60),
        "the webhook serving, its CA published in both configurations",
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()?;
            let pods = mutating.get(name).await.ok()?.webhooks?;
            let barriers = validating.get(name).await.ok()?.webhooks?;
            (pods.iter().all(|w| w.client_config.ca_bundle.is_some())
                && barriers.iter().all(|w| w.client_config.ca_bundle.is_some()))
            .then_some(())
        },
    )
    .await;
    controller
}

/// Waits until nothing listens on `port` any more.
async fn webhook_gone(port: u16) {
    support::eventually(Duration::from_secs(30), "the webhook gone", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

/// A labelled pod `name` in `namespace` (of the Barrier `train`).
async fn create_labelled_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<k8s_openapi::api::core::v1::Pod, kube::Error> {
    let pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "zkgate.io/barrier": "train" } },
        "spec": { "containers": [{ "name": "w", "image": "busybox" }] }
    }))
    .unwrap();
    Api::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
}

/// Whether admission injected zkgate into `pod`.
fn injected(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// Makes the Barrier `train` of one in `namespace` (admission refuses a pod
/// whose Barrier nobody makes).
async fn create_train(client: &kube::Client, namespace: &str) {
    let train: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "train" }, "spec": { "participants": 1 }
    }))
    .unwrap();
    Api::<Barrier>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &train)
        .await
        .unwrap();
}

/// An API server of the test's own with the CRDs, a namespace, the chart's
/// webhook configurations (rendered with `set`) and a controller serving
/// them (every namespace, as the chart runs it), its CA published.
async fn served_chart_webhooks(
    set: &str,
) -> (
    support::kube::PrivateApiServer,
    kube::Client,
    String,
    support::kube::ControllerProcess,
    u16,
) {
    let (server, client) = support::kube::PrivateApiServer::with_crds().await;
    let ns = namespace(&client).await;
    let (name, port) = install_charts_webhook_configuration(&client, set).await;
    let controller = controller_serving_webhook(&server, &client, &ns, &name, port, &[]).await;
    (server, client, ns, controller, port)
}

/// The chart's own webhook configuration on an API server of the test's
/// own (the configuration covers every namespace): a labelled pod in kube-system is never sent to the webhook,
/// neither while it serves (the pod is admitted without injection) nor
/// while it is down (admitted, not refused); the same pod in another
/// namespace is injected while it serves and refused while it is down, so
/// the configuration does reach the webhook.
#[tokio::test]
async fn the_charts_webhook_configuration_leaves_kube_system_alone_with_the_webhook_up_and_down() {
    // Up: the controller serves the webhook (every namespace, as the chart
    // runs it) and publishes its CA into the configuration.
    let (_server, client, ns, mut controller, port) =
        served_chart_webhooks("zookeeper.connect=zk:2181,webhook.enabled=true").await;
    create_train(&client, &ns).await;
    let member = create_labelled_pod(&client, &ns, "member-up")
        .await
        .expect("admitted while up");
    assert!(
        injected(&member),
        "the webhook serves: a labelled pod elsewhere is injected"
    );
    let system = create_labelled_pod(&client, "kube-system", "zkgate-labelled-up")
        .await
        .expect("a labelled kube-system pod is admitted while the webhook is up");
    assert!(
        !injected(&system),
        "kube-system is excluded: its labelled pod must not reach the webhook"
    );

    // Down: nothing listens at the configuration's address any more.
    controller.kill().await;
    webhook_gone(port).await;
    let refused = create_labelled_pod(&client, &ns, "member-down")
        .await
        .expect_err("with the webhook down a labelled pod elsewhere is refused");
    assert!(refused.to_string().contains("pods.zkgate.io"), "{refused}");
    let system = create_labelled_pod(&client, "kube-system", "zkgate-labelled-down")
        .await
        .expect("a labelled kube-system pod is admitted while the webhook is down");
    assert!(!injected(&system));
}

/// Issue 28: the chart's validating configuration on Barriers, served by
/// the controller. A hand-made cycle of `after`s is refused when its last
/// Barrier is created, with the chain named, and so is a Barrier that
/// starts after itself, an update that makes a cycle, and `after` with
/// RestartGang; a Barrier whose `after` is fine is admitted. With the
/// webhook down, the Barrier it refused is admitted (failurePolicy Ignore:
/// the controller fails it anyway, and a webhook that is down blocks no
/// Barrier nor the controller's finalizer).
#[tokio::test]
async fn the_charts_barrier_webhook_refuses_a_cycle_and_blocks_nothing_when_down() {
    let (_server, client, ns, mut controller, port) =
        served_chart_webhooks("zookeeper.connect=zk:2181,webhook.enabled=true").await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let create = |name: &str, spec: serde_json::Value| {
        let barriers = barriers.clone();
        let barrier: Barrier = serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
            "metadata": { "name": name }, "spec": spec
        }))
        .unwrap();
        async move { barriers.create(&PostParams::default(), &barrier).await }
    };
    create(
        "workers",
        json!({ "participants": 2, "after": [{ "barrier": "launcher" }] }),
    )
    .await
    .expect("an after naming a Barrier not made yet is admitted");
    let refused = create(
        "launcher",
        json!({ "participants": 1, "after": [{ "barrier": "workers" }] }),
    )
    .await
    .expect_err("the Barrier closing a cycle is refused");
    let refused = refused.to_string();
    assert!(
        refused.contains("barriers.zkgate.io") && refused.contains("launcher → workers → launcher"),
        "{refused}"
    );
    let refused = create(
        "narcissus",
        json!({ "participants": 1, "after": [{ "barrier": "narcissus" }] }),
    )
    .await
    .expect_err("a Barrier after itself is refused");
    assert!(
        refused.to_string().contains("narcissus → narcissus"),
        "{refused}"
    );
    let refused = create(
        "rounds",
        json!({ "participants": 2, "onParticipantLoss": "RestartGang", "after": [{ "barrier": "workers" }] }),
    )
    .await
    .expect_err("after with RestartGang is refused");
    assert!(refused.to_string().contains("RestartGang"), "{refused}");
    create("leader", json!({ "participants": 1 }))
        .await
        .expect("a Barrier without after is admitted");
    create(
        "group",
        json!({ "participants": 3, "after": [{ "barrier": "leader" }] }),
    )
    .await
    .expect("an after without a cycle is admitted");
    let cycle = json!({ "spec": { "after": [{ "barrier": "group" }] } });
    let refused = barriers
        .patch("leader", &PatchParams::default(), &Patch::Merge(&cycle))
        .await
        .expect_err("an update that makes a cycle is refused");
    assert!(
        refused.to_string().contains("leader → group → leader"),
        "{refused}"
    );
    let labels = json!({ "metadata": { "labels": { "team": "a" } } });
    barriers
        .patch("leader", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("an update leaving after alone is admitted");

    controller.kill().await;
    webhook_gone(port).await;
    create(
        "launcher",
        json!({ "participants": 1, "after": [{ "barrier": "workers" }] }),
    )
    .await
    .expect("with the webhook down, Barriers are admitted (the controller fails a cycle)");
    barriers
        .patch("workers", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("with the webhook down, Barriers can be updated (a finalizer comes off)");
}

/// Found in review: the Barriers the controller makes for labelled Jobs
/// pass the Barriers' webhook. Two Jobs whose templates start after each
/// other (made directly, as a tenant may): the controller makes both
/// Barriers and fails them with the chain named, so that their pods are
/// told. It failed before: the second Barrier's create was refused as a
/// cycle, the controller retried it for ever, and the first Job's pods
/// would have waited for a Barrier never made.
#[tokio::test]
async fn the_controllers_own_barriers_pass_the_barrier_webhook_and_a_cycle_fails_them() {
    let (_server, client, ns, _controller, _port) =
        served_chart_webhooks("zookeeper.connect=zk:2181,webhook.enabled=true").await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), &ns);
    for (job, after) in [("ping", "pong"), ("pong", "ping")] {
        let manifest = serde_json::from_value(json!({
            "metadata": { "name": job },
            "spec": { "parallelism": 1, "template": {
                "metadata": {
                    "labels": { "zkgate.io/barrier": job },
                    "annotations": { "zkgate.io/after": after }
                },
                "spec": { "restartPolicy": "Never", "containers": [{ "name": "w", "image": "busybox" }] }
            } }
        }))
        .unwrap();
        jobs.create(&PostParams::default(), &manifest)
            .await
            .unwrap();
    }
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    for job in ["ping", "pong"] {
        let message = support::eventually(
            Duration::from_secs(60),
            "both Barriers made and failed by the cycle",
            || async {
                let status = barriers.get(job).await.ok()?.status?;
                (status.phase == Some(zkgate::api::BarrierPhase::Failed))
                    .then_some(status.message.unwrap_or_default())
            },
        )
        .await;
        assert!(message.contains("cycle"), "{job}: {message}");
    }
}

/// Issue 25, item 6: with `controller.watchNamespace` the chart's webhook
/// configuration covers only that namespace (by its name label, which
/// the API server sets). With the webhook down: a labelled pod of another namespace is
/// admitted as it is (nothing reconciles it there; before, the chart's
/// selector sent it to the webhook and it was refused), while one of the
/// watched namespace is refused.
#[tokio::test]
async fn with_a_watched_namespace_the_charts_webhook_holds_up_no_other_namespace() {
    let (server, client) = support::kube::PrivateApiServer::with_crds().await;
    let ns = namespace(&client).await;
    let other = namespace(&client).await;
    let (name, port) = install_charts_webhook_configuration(
        &client,
        &format!("zookeeper.connect=zk:2181,webhook.enabled=true,controller.watchNamespace={ns}"),
    )
    .await;
    let mut controller = controller_serving_webhook(
        &server,
        &client,
        &ns,
        &name,
        port,
        &["--watch-namespace", &ns],
    )
    .await;
    create_train(&client, &ns).await;
    let member = create_labelled_pod(&client, &ns, "member-up")
        .await
        .expect("admitted while up");
    assert!(injected(&member), "the watched namespace's pod is injected");
    controller.kill().await;
    webhook_gone(port).await;
    let elsewhere = create_labelled_pod(&client, &other, "elsewhere-down")
        .await
        .expect(
            "a labelled pod outside the watched namespace is admitted while the webhook is down",
        );
    assert!(!injected(&elsewhere));
    let refused = create_labelled_pod(&client, &ns, "member-down")
        .await
        .expect_err("the watched namespace's labelled pod is refused while the webhook is down");
    assert!(refused.to_string().contains("pods.zkgate.io"), "{refused}");
}

/// Issue 25, item 4: acting as the controller's ServiceAccount (the chart's
/// RBAC for a cluster-wide install with a controller credential and the
/// webhook, applied as rendered), nobody can obtain a ServiceAccount token:
/// no Secret can be made anywhere (a `service-account-token` Secret the
/// token controller would fill in), none read but the webhook's own
/// certificate, whose type an update cannot change, and no TokenRequest.
/// Impersonation by the admin (`--as`), with a positive control: what the
/// controller needs is allowed.
#[test]
fn acting_as_the_controllers_service_account_nobody_gets_a_token() {
    let kubectl = tool("kubectl");
    let ns = format!("t-imp-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let release = format!("i{}", &ns[6..12]);
    ok(run(&kubectl, &["create", "namespace", &ns], None));
    let rendered = ok(run(
        &tool("helm"),
        &[
            "template",
            &release,
            chart().to_str().unwrap(),
            "-n",
            &ns,
            "--set",
            "zookeeper.connect=zk:2181,webhook.enabled=true,zookeeper.auth.existingSecret=zk-auth",
        ],
        None,
    ));
    // Its identity and permissions only: no Deployment to run, and no
    // webhook registration that would reach the other tests' pods.
    let kept = [
        "ServiceAccount",
        "Secret",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let rbac: Vec<&str> = rendered
        .split("\n---")
        .filter(|doc| {
            serde_yaml_ng::from_str::<serde_json::Value>(doc)
                .ok()
                .and_then(|d| d["kind"].as_str().map(|k| kept.contains(&k)))
                .unwrap_or(false)
        })
        .collect();
    ok(run(
        &kubectl,
        &["apply", "-n", &ns, "-f", "-"],
        Some(&rbac.join("\n---\n")),
    ));
    let account = format!("system:serviceaccount:{ns}:{release}-zkgate");
    let as_controller = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--as", account.as_str()];
        all.extend_from_slice(args);
        run(&kubectl, &all, stdin)
    };
    let forbidden = |what: &str, out: Output| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("forbidden"),
            "as the controller, {what} must be forbidden: {}{err}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    let token_secret = |namespace: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: stolen, namespace: {namespace}, annotations: {{kubernetes.io/service-account.name: default}}}}\ntype: kubernetes.io/service-account-token\n"
        )
    };
    for namespace in ["kube-system", "default", ns.as_str()] {
        forbidden(
            &format!("making a service-account-token Secret in {namespace}"),
            as_controller(&["create", "-f", "-"], Some(&token_secret(namespace))),
        );
        forbidden(
            &format!("listing Secrets in {namespace}"),
            as_controller(&["get", "secrets", "-n", namespace], None),
        );
        forbidden(
            &format!("a TokenRequest for {namespace}'s default account"),
            as_controller(&["create", "token", "default", "-n", namespace], None),
        );
    }
    forbidden(
        "a TokenRequest for its own account",
        as_controller(
            &["create", "token", &format!("{release}-zkgate"), "-n", &ns],
            None,
        ),
    );
    let webhook_secret = format!("{release}-zkgate-webhook-tls");
    // The positive control: the webhook's certificate Secret, by name.
    let own = as_controller(
        &["get", "secret", &webhook_secret, "-n", &ns, "-o", "json"],
        None,
    );
    assert!(
        own.status.success(),
        "the controller reads its webhook certificate Secret: {}",
        String::from_utf8_lossy(&own.stderr)
    );
    // Updating it into a token Secret: the type of a Secret cannot change.
    let mut turned: serde_json::Value = serde_json::from_slice(&own.stdout).unwrap();
    turned["type"] = json!("kubernetes.io/service-account-token");
    turned["metadata"]["annotations"] = json!({ "kubernetes.io/service-account.name": "default" });
    let out = as_controller(&["replace", "-f", "-"], Some(&turned.to_string()));
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("immutable"),
        "an update must not turn the certificate Secret into a token Secret: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let can = |verb: &str, resource: &str| {
        as_controller(&["auth", "can-i", verb, resource, "-n", &ns], None)
            .status
            .success()
    };
    assert!(
        can("create", "tokenreviews.authentication.k8s.io"),
        "the handout reviews tokens"
    );
    let _ = run(
        &kubectl,
        &[
            "delete",
            "clusterrole,clusterrolebinding",
            "-l",
            &format!("app.kubernetes.io/instance={release}"),
        ],
        None,
    );
    let _ = run(
        &kubectl,
        &["delete", "namespace", &ns, "--wait=false"],
        None,
    );
}

/// An API server of the test's own with `chart` installed as the docs say
/// (release `zkgate` in `zkgate-system`, the webhook off: no pods run
/// there), a ZooKeeper chroot of its own: the server, an admin client, the
/// connect string.
async fn release_on_own_api_server(
    chart: &Path,
) -> (support::kube::PrivateApiServer, kube::Client, String) {
    let (server, client) = support::kube::PrivateApiServer::bare().await;
    let kubeconfig = server.kubeconfig();
    let zk = isolated_connect();
    ok(run(
        &tool("helm"),
        &[
            "install",
            "zkgate",
            chart.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            "zkgate-system",
            "--create-namespace",
            "--set",
            &format!("zookeeper.connect={zk},webhook.enabled=false"),
        ],
        None,
    ));
    (server, client, zk)
}

/// The shell block of docs page `page` (under `docs/src/`) that contains
/// `marker`: the commands a user pastes, run as written.
fn documented_block(page: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/src")
            .join(page),
    )
    .unwrap();
    text.split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("\n```").map(|(block, _)| block))
        .find(|block| block.contains(marker))
        .unwrap_or_else(|| panic!("{page} has no sh block with {marker:?}"))
        .to_owned()
}

/// Runs `script` with bash as a user would: the repository as the working
/// directory, `kubeconfig`'s cluster, helm and kubectl on the PATH, the
/// release's URLs read from the local files (support::release). Off the
/// runtime's thread (tokio's process): the tests keep ZooKeeper sessions and
/// waiters on it, whose pings a thread blocked for seconds would starve.
async fn run_documented(script: &str, kubeconfig: &Path) -> Output {
    let script = support::release::localize(script);
    run_as_a_user(&script, kubeconfig, Path::new(env!("CARGO_MANIFEST_DIR"))).await
}

/// [`run_documented`] in the working directory `cwd`.
async fn run_as_a_user(script: &str, kubeconfig: &Path, cwd: &Path) -> Output {
    let tools = tool("helm").parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .output()
        .await
        .unwrap()
}

/// Issue 29: uninstalling as docs/src/operations/upgrade.md says, its
/// commands run as written, on an API server of the test's own (it deletes
/// CRDs): the chart installed with its CRDs, the controller running, a
/// Barrier with a participant waiting and a LockLease. First the page's
/// recipe for resources stuck `Terminating` once the controller is gone:
/// it releases them. Then the uninstall: its first step leaves no Barrier,
/// LockLease or finalizer, and none of their znodes (the waiter is told),
/// `helm uninstall` removes the release's objects but keeps the CRDs
/// (`crds.keep`), and the last step removes those; the root's removal with
/// zkCli.sh, as written, takes this install's root alone: another
/// cluster's install on the same ensemble and chroot stays whole and
/// working.
#[tokio::test]
async fn the_documented_uninstall_leaves_no_resource_finalizer_or_znode() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let (server, client, zk) = release_on_own_api_server(&chart()).await;
    let kubeconfig = server.kubeconfig();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["barriers.zkgate.io", "lockleases.zkgate.io"] {
        let crd = crds.get(name).await.expect("the chart installs its CRDs");
        assert_eq!(
            crd.metadata.annotations.unwrap_or_default()["helm.sh/resource-policy"],
            "keep"
        );
    }
    let ns = namespace(&client).await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let leases: Api<zkgate::api::LockLease> = Api::namespaced(client.clone(), &ns);
    // The CRDs are served once established.
    support::eventually(Duration::from_secs(30), "the CRDs served", || async {
        barriers.list(&Default::default()).await.ok()
    })
    .await;
    let start = || support::kube::ControllerProcess::start_with(&kubeconfig, &zk, "uninstall", &[]);
    let mut controller = start();
    let make = |name: &str, spec: serde_json::Value| -> Barrier {
        serde_json::from_value(json!({
            "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
            "metadata": { "name": name }, "spec": spec
        }))
        .unwrap()
    };
    barriers
        .create(
            &PostParams::default(),
            &make("gang", json!({ "participants": 2 })),
        )
        .await
        .unwrap();
    barriers
        .create(
            &PostParams::default(),
            &make("orphan", json!({ "participants": 2 })),
        )
        .await
        .unwrap();
    let lease: zkgate::api::LockLease = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease",
        "metadata": { "name": "db" }, "spec": {}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let znode_of = |status: Option<String>| status.map(|z| z.trim_start_matches('/').to_owned());
    let (gang, orphan, db) = support::eventually(
        Duration::from_secs(30),
        "the resources' znodes made",
        || async {
            let gang = znode_of(barriers.get("gang").await.ok()?.status?.znode)?;
            let orphan = znode_of(barriers.get("orphan").await.ok()?.status?.znode)?;
            let db = znode_of(leases.get("db").await.ok()?.status?.znode)?;
            Some((gang, orphan, db))
        },
    )
    .await;
    let admin = support::session(&zk).await;
    let exists = |path: String| {
        let admin = admin.client().clone();
        async move {
            admin
                .check_stat(&format!("/{path}"))
                .await
                .unwrap()
                .is_some()
        }
    };
    for path in [&gang, &orphan, &db] {
        assert!(exists(path.clone()).await, "{path} not made");
    }
    // A participant waiting at `gang`.
    let waiter = {
        let zk = zk.clone();
        let path = format!("/{gang}");
        tokio::spawn(async move {
            let participant = support::session(&zk).await;
            DoubleBarrier::new(&path)
                .enter(&participant, "p0", &EnterOptions::default(), None)
                .await
        })
    };

    // Stuck: the controller gone, `orphan` deleted stays Terminating; the
    // page's recipe releases it.
    controller.kill().await;
    barriers
        .delete("orphan", &Default::default())
        .await
        .unwrap();
    assert!(barriers
        .get("orphan")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    let stuck = documented_block("operations/upgrade.md", "\"finalizers\":null");
    let out = run_documented(&stuck, &kubeconfig).await;
    assert!(
        out.status.success(),
        "the stuck-finalizer recipe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        barriers.get_opt("orphan").await.unwrap().is_none(),
        "orphan still there"
    );

    // Another cluster's install on the same ensemble, under the same
    // chroot, its root beside this one's: its Barrier and LockLease
    // reconciled (issue 46, item 1: the uninstall must leave it whole).
    let (other_server, other_client) = support::kube::PrivateApiServer::bare().await;
    install_crds(&other_client).await;
    let other_ns = namespace(&other_client).await;
    let _other_controller = support::kube::ControllerProcess::start_with(
        &other_server.kubeconfig(),
        &zk,
        "other-cluster",
        &["--root", "/other"],
    );
    let other_barriers: Api<Barrier> = Api::namespaced(other_client.clone(), &other_ns);
    let other_leases: Api<zkgate::api::LockLease> =
        Api::namespaced(other_client.clone(), &other_ns);
    other_barriers
        .create(
            &PostParams::default(),
            &make("kept", json!({ "participants": 1 })),
        )
        .await
        .unwrap();
    other_leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let (kept, kept_db) = support::eventually(
        Duration::from_secs(30),
        "the other install's znodes made",
        || async {
            let kept = znode_of(other_barriers.get("kept").await.ok()?.status?.znode)?;
            let db = znode_of(other_leases.get("db").await.ok()?.status?.znode)?;
            Some((kept, db))
        },
    )
    .await;

    // The uninstall, with the controller back (it puts its finalizer back
    // on what the recipe stripped).
    let mut controller = start();
    support::eventually(Duration::from_secs(30), "the finalizers back", || async {
        let has = |f: Option<Vec<String>>| {
            f.unwrap_or_default()
                .iter()
                .any(|f| f == "zkgate.io/znodes")
        };
        (has(barriers.get("gang").await.ok()?.metadata.finalizers)
            && has(leases.get("db").await.ok()?.metadata.finalizers))
        .then_some(())
    })
    .await;
    let uninstall = documented_block("operations/upgrade.md", "helm uninstall");
    let (first, rest) = uninstall
        .split_once("# 2.")
        .expect("the uninstall's steps are numbered");
    let out = run_documented(first, &kubeconfig).await;
    assert!(
        out.status.success(),
        "step 1 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(barriers
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(leases
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(!exists(gang.clone()).await, "{gang} left behind");
    assert!(!exists(db.clone()).await, "{db} left behind");
    let told = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter is told its barrier went")
        .unwrap();
    assert!(
        told.is_err(),
        "the waiter entered a deleted barrier: {told:?}"
    );
    let out = run_documented(&format!("# 2.{rest}"), &kubeconfig).await;
    assert!(
        out.status.success(),
        "steps 2 and 3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["barriers.zkgate.io", "lockleases.zkgate.io"] {
        support::eventually(Duration::from_secs(30), "the CRDs gone", || async {
            crds.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "zkgate-system");
    assert!(
        deployments
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "helm uninstall left the controller's Deployment"
    );

    // `helm uninstall` took the chart's controller; this test's runs as a
    // process of its own, and goes now (it would make its root again).
    controller.kill().await;
    // The install's root, removed as the page says: zkCli.sh with the
    // install's connect string (the page's, its servers and chroot made
    // this test's), first reading the root's record, then deleteall.
    // Run off the runtime's thread (tokio's process), since the admin
    // session above lives on it: a JVM starting for seconds on a busy
    // machine would otherwise starve its pings until the client gives the
    // connection up.
    let zkcli = |marker: &'static str| {
        let block = documented_block("operations/upgrade.md", marker);
        let documented = "'zk-0.zk.zookeeper.svc:2181,zk-1.zk.zookeeper.svc:2181,zk-2.zk.zookeeper.svc:2181/zkgate'";
        assert!(block.contains(documented), "{block}");
        let block = block.replace(documented, &format!("'{zk}'"));
        async move {
            let mut zkcli = tokio::process::Command::new("bash");
            zkcli
                .args(["-euo", "pipefail", "-c", &block])
                .env(
                    "PATH",
                    format!(
                        "/usr/share/zookeeper/bin:{}",
                        std::env::var("PATH").unwrap_or_default()
                    ),
                )
                .env("ZOO_LOG4J_PROP", "ERROR,CONSOLE");
            let out = zkcli.output().await.unwrap();
            assert!(
                out.status.success(),
                "{marker}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let record = zkcli("get /zkgate").await;
    assert!(
        record.contains("\"cluster\":"),
        "the root's record, which says whose root it is: {record}"
    );
    zkcli("deleteall /zkgate").await;
    assert!(
        !exists("zkgate".to_owned()).await,
        "the install's root is left"
    );
    // The other cluster's install: its root and nodes whole, and working.
    for path in ["other".to_owned(), kept.clone(), kept_db.clone()] {
        assert!(exists(path.clone()).await, "{path} went with the uninstall");
    }
    let (code, err) = support::output({
        let mut enter = support::zkgate(
            &zk,
            &[
                "barrier",
                "enter",
                "kept",
                "--id",
                "p0",
                "--root",
                "/other",
                "--timeout",
                "60s",
            ],
        );
        enter.env("ZKGATE_NAMESPACE", &other_ns);
        enter
    })
    .await;
    assert_eq!(code, 0, "the other install's barrier: {err}");
    support::eventually(
        Duration::from_secs(30),
        "the other install's Barrier open",
        || async {
            let phase = other_barriers.get("kept").await.ok()?.status?.phase?;
            (phase == zkgate::api::BarrierPhase::Open).then_some(())
        },
    )
    .await;
}

/// The previous release (chart and crate 0.1.0, CRDs in Helm's `crds/`
/// folder): its commit and its own zkgate binary, built from this
/// repository's history by scripts/previous-release (once, cached).
fn previous_release() -> (String, PathBuf) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/previous-release");
    let ask = |what: &str| {
        let out = Command::new(&script)
            .arg(what)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/previous-release {what} failed"
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    (ask("commit"), PathBuf::from(ask("bin")))
}

/// The chart as it was at `commit`, from this repository's history, in
/// `dir` (returns the chart's path).
fn chart_at(commit: &str, dir: &Path) -> PathBuf {
    let archive = Command::new("git")
        .args(["archive", "--format=tar", commit, "charts/zkgate"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        archive.status.success(),
        "this test needs the repository's history (git archive {commit}): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(dir)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    tar.stdin
        .take()
        .unwrap()
        .write_all(&archive.stdout)
        .unwrap();
    assert!(tar.wait().unwrap().success());
    dir.join("charts/zkgate")
}

/// Issue 29: upgrading from the previous release (0.1: its chart, whose
/// CRDs are in Helm's `crds/` folder, which the release does not own, and
/// its own controller and participants) as docs/src/operations/upgrade.md
/// says, its commands run as written, while a gang waits for its last
/// member and a lock is held with another waiting, all three 0.1
/// participants: the 0.1 controller is replaced mid-way by today's (as the
/// rollout replaces its pods). Nobody is released early: the gang's command
/// runs only once its last member (today's binary) comes after the
/// upgrade, and the 0.1 waiter gets the lock only when the 0.1 holder lets
/// it go, with a higher fencing token. The CRDs are the release's
/// afterwards (kept on uninstall).
#[tokio::test]
async fn the_documented_upgrade_from_the_previous_chart_releases_nobody_early() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let dir = tempfile::tempdir().unwrap();
    let (previous_commit, previous_zkgate) = previous_release();
    let today_zkgate = PathBuf::from(env!("CARGO_BIN_EXE_zkgate"));
    let version = Command::new(&previous_zkgate)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        "zkgate 0.1.0",
        "the previous release's binary"
    );
    let previous = chart_at(&previous_commit, dir.path());
    let (server, client, zk) = release_on_own_api_server(&previous).await;
    let kubeconfig = server.kubeconfig();
    let ns = namespace(&client).await;
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    support::eventually(Duration::from_secs(30), "the CRDs served", || async {
        barriers.list(&Default::default()).await.ok()
    })
    .await;
    let start = |bin: &Path| {
        support::kube::ControllerProcess::start_binary(bin, &kubeconfig, &zk, "upgrade", &[])
    };
    let mut controller = start(&previous_zkgate);
    let gang: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "gang" }, "spec": { "participants": 2 }
    }))
    .unwrap();
    barriers
        .create(&PostParams::default(), &gang)
        .await
        .unwrap();
    let lease: zkgate::api::LockLease = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease",
        "metadata": { "name": "db" }, "spec": {}
    }))
    .unwrap();
    let leases: Api<zkgate::api::LockLease> = Api::namespaced(client.clone(), &ns);
    leases.create(&PostParams::default(), &lease).await.unwrap();
    support::eventually(Duration::from_secs(30), "the resources' znodes", || async {
        barriers.get("gang").await.ok()?.status?.znode?;
        leases.get("db").await.ok()?.status?.znode
    })
    .await;

    // Each command writes when it started (and the lock's, its token).
    let records = dir.path().join("records");
    std::fs::create_dir(&records).unwrap();
    let member = |bin: &Path, id: &str| {
        let file = records.join(id);
        let mut cmd = support::zkgate_binary(
            bin,
            &zk,
            &[
                "barrier",
                "run",
                "gang",
                "--namespace",
                &ns,
                "--id",
                id,
                "--timeout",
                "120s",
            ],
        );
        cmd.args([
            "--",
            "sh",
            "-c",
            &format!("echo started > {}", file.display()),
        ])
        .stderr(Stdio::piped());
        cmd.spawn().unwrap()
    };
    let holder_release = records.join("release");
    let lock_run = |bin: &Path, id: &str, command: String| {
        let mut cmd = support::zkgate_binary(
            bin,
            &zk,
            &[
                "lock",
                "run",
                "db",
                "--namespace",
                &ns,
                "--id",
                id,
                "--timeout",
                "120s",
            ],
        );
        cmd.args(["--", "sh", "-c", &command])
            .stderr(Stdio::piped());
        cmd.spawn().unwrap()
    };
    let first = member(&previous_zkgate, "first");
    let holder = lock_run(
        &previous_zkgate,
        "holder",
        format!(
            "echo $ZKGATE_FENCING_TOKEN > {tokens}/holder; while [ ! -f {release} ]; do sleep 0.1; done",
            tokens = records.display(),
            release = holder_release.display()
        ),
    );
    support::eventually(Duration::from_secs(30), "the holder holding", || async {
        std::fs::read_to_string(records.join("holder")).ok()
    })
    .await;
    let waiter = lock_run(
        &previous_zkgate,
        "waiter",
        format!("echo $ZKGATE_FENCING_TOKEN > {}/waiter", records.display()),
    );
    support::eventually(
        Duration::from_secs(30),
        "the gang's first member and the lock's waiter in",
        || async {
            let b = barriers.get("gang").await.ok()?.status?;
            let l = leases.get("db").await.ok()?.status?;
            (b.entered == 1 && l.waiting_count == 1).then_some(())
        },
    )
    .await;

    // The upgrade, as documented, with the controller replaced mid-way.
    controller.kill().await;
    let upgrade = documented_block("operations/upgrade.md", "meta.helm.sh/release-name");
    let out = run_documented(&upgrade, &kubeconfig).await;
    assert!(
        out.status.success(),
        "the documented upgrade failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _controller = start(&today_zkgate);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["barriers.zkgate.io", "lockleases.zkgate.io"] {
        let annotations = crds
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default();
        assert_eq!(
            annotations["meta.helm.sh/release-name"], "zkgate",
            "{name} not the release's"
        );
        assert_eq!(
            annotations["helm.sh/resource-policy"], "keep",
            "{name} not kept"
        );
    }
    // The controller's status follows again (it read everything as it was).
    support::eventually(
        Duration::from_secs(30),
        "the status after the upgrade",
        || async {
            let b = barriers.get("gang").await.ok()?.status?;
            let l = leases.get("db").await.ok()?.status?;
            (b.entered == 1 && l.holder_count == 1 && l.waiting_count == 1).then_some(())
        },
    )
    .await;
    assert!(
        !records.join("first").exists(),
        "the gang started without its last member"
    );
    assert!(
        !records.join("waiter").exists(),
        "the waiter got the lock while it was held"
    );

    let last = member(&today_zkgate, "last");
    for (name, child) in [("first", first), ("last", last)] {
        let (code, log) = support::finished(child, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{name}: {log}");
        assert!(records.join(name).exists(), "{name}'s command did not run");
    }
    std::fs::write(&holder_release, "").unwrap();
    for (name, child) in [("holder", holder), ("waiter", waiter)] {
        let (code, log) = support::finished(child, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{name}: {log}");
    }
    let token = |name: &str| -> u64 {
        std::fs::read_to_string(records.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        token("waiter") > token("holder"),
        "fencing tokens went backwards"
    );
}

/// The quick start's install (`zookeeper.deploy=true`) goes through Helm's
/// server-side apply on the 1.20 API server. It failed before: the
/// ZooKeeper Service's port named no protocol, which server-side apply on
/// API servers before 1.24 refuses (found by scripts/quick-start).
#[test]
fn the_quick_starts_install_is_accepted_by_server_side_apply() {
    let ns = format!("t-qs-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let release = format!("q{}", &ns[5..11]);
    let chart = chart();
    let installed = run(
        &tool("helm"),
        &[
            "install",
            &release,
            chart.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig().to_str().unwrap(),
            "-n",
            &ns,
            "--create-namespace",
            // The CRDs are the shared API server's already; no webhook
            // configuration to reach the other tests' pods.
            "--set",
            "zookeeper.deploy=true,crds.install=false,webhook.enabled=false",
        ],
        None,
    );
    let uninstalled = run(
        &tool("helm"),
        &[
            "uninstall",
            &release,
            "--kubeconfig",
            kubeconfig().to_str().unwrap(),
            "-n",
            &ns,
        ],
        None,
    );
    assert!(
        installed.status.success(),
        "helm install --set zookeeper.deploy=true failed: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    assert!(uninstalled.status.success());
}

/// Issue 29 (found in review): a second release in the cluster (another
/// namespace, watching only it) installs with the chart's defaults: the
/// CRDs the first release owns are left to it (before, Helm refused: they
/// could not be imported into the second release). The first release still
/// owns them after the second one is uninstalled.
#[tokio::test]
async fn a_second_release_leaves_the_first_ones_crds_alone() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let (server, client) = support::kube::PrivateApiServer::bare().await;
    let kubeconfig = server.kubeconfig();
    let helm = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        run(&tool("helm"), &all, None)
    };
    let chart = chart();
    for (release, namespace, extra) in [
        ("zkgate", "zkgate-system", "webhook.enabled=false"),
        (
            "team-b",
            "team-b",
            "webhook.enabled=false,controller.watchNamespace=team-b,zookeeper.root=/team-b",
        ),
    ] {
        let installed = helm(&[
            "install",
            release,
            chart.to_str().unwrap(),
            "-n",
            namespace,
            "--create-namespace",
            "--set",
            &format!("zookeeper.connect=zk:2181,{extra}"),
        ]);
        assert!(
            installed.status.success(),
            "helm install {release} failed: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
    }
    let uninstalled = helm(&["uninstall", "team-b", "-n", "team-b"]);
    assert!(uninstalled.status.success());
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for name in ["barriers.zkgate.io", "lockleases.zkgate.io"] {
        let annotations = crds
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name} gone with the second release: {e}"))
            .metadata
            .annotations
            .unwrap_or_default();
        assert_eq!(annotations["meta.helm.sh/release-name"], "zkgate");
    }
}

/// Issue 46, item 2: an install without a clone. What a release publishes
/// for the chart (scripts/release-chart, run by scripts/dist): the package
/// installs with `helm install` from the file alone, its OCI artifact
/// (pushed with crane to a registry on loopback) with `helm install
/// oci://`, and the one manifest with `kubectl apply --server-side`, each
/// on an API server of its own, from a working directory that holds only
/// the downloaded file. The manifest applied again (an upgrade in place) is
/// accepted too.
#[tokio::test]
async fn the_released_chart_package_and_manifest_install_without_a_clone() {
    let built = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/release-chart"
    ))
    .arg(built.path())
    .output()
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "scripts/release-chart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: Vec<PathBuf> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect();
    let [package, manifest, oci] = &made[..] else {
        panic!("scripts/release-chart made {made:?}")
    };
    let app_version = support::release::chart_field("appVersion");
    let user = tempfile::tempdir().unwrap();
    for file in [package, manifest] {
        std::fs::copy(file, user.path().join(file.file_name().unwrap())).unwrap();
    }
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let controller_image = |client: kube::Client| async move {
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client, "zkgate-system");
        let deployment = deployments.get("zkgate").await.unwrap();
        deployment.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    // The CRDs established and the controller's Deployment on the
    // release's image.
    let release_image = format!("ghcr.io/zkgate/zkgate:{app_version}");
    let release_image = release_image.as_str();
    let installed = |client: kube::Client| async move {
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        for crd in ["barriers.zkgate.io", "lockleases.zkgate.io"] {
            support::eventually(Duration::from_secs(30), crd, || async {
                crds.get(crd)
                    .await
                    .ok()?
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            })
            .await;
        }
        assert_eq!(controller_image(client).await, release_image);
    };

    // kubectl apply, twice.
    let (server, client) = support::kube::PrivateApiServer::bare().await;
    for attempt in ["first", "again"] {
        let out = run_as_a_user(
            &format!("kubectl apply --server-side -f {}", name(manifest)),
            &server.kubeconfig(),
            user.path(),
        )
        .await;
        assert!(
            out.status.success(),
            "kubectl apply ({attempt}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    installed(client).await;

    // helm install from a registry the OCI artifact was pushed to.
    let (registry, address) = registry().await;
    let reference = format!("{address}/charts/zkgate:{app_version}");
    let pushed = tokio::process::Command::new(built_tool("registry", "crane"))
        .args(["push", "--insecure"])
        .arg(oci)
        .arg(&reference)
        .output()
        .await
        .unwrap();
    assert!(
        pushed.status.success(),
        "crane push: {}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let (server, client) = support::kube::PrivateApiServer::bare().await;
    let out = run_as_a_user(
        &format!(
            "helm install zkgate oci://{address}/charts/zkgate --version {app_version} --plain-http \
               --namespace zkgate-system --create-namespace --set zookeeper.deploy=true"
        ),
        &server.kubeconfig(),
        user.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "helm install oci://: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    installed(client).await;
    drop((server, registry));

    // helm install from the package.
    let (server, client) = support::kube::PrivateApiServer::bare().await;
    let out = run_as_a_user(
        &format!(
            "helm install zkgate ./{} --namespace zkgate-system --create-namespace --set zookeeper.deploy=true",
            name(package)
        ),
        &server.kubeconfig(),
        user.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its notes' next step needs no clone either: the release's example.
    let notes = String::from_utf8_lossy(&out.stdout);
    let example = "examples/gang-job-labelled/job.yaml";
    assert!(
        notes.contains(&format!(
            "-f https://raw.githubusercontent.com/zkgate/zkgate/v{app_version}/{example}"
        )) && Path::new(env!("CARGO_MANIFEST_DIR")).join(example).exists(),
        "{notes}"
    );
    installed(client).await;
}

/// A binary `scripts/kubernetes build TOOLS` makes (tools/TOOLS/go.mod),
/// which scripts/test builds.
fn built_tool(tools: &str, name: &str) -> PathBuf {
    let cache = std::env::var("ZKGATE_KUBE_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/zkgate/kube", std::env::var("HOME").unwrap()));
    let bin = Path::new(&cache).join(tools).join("bin").join(name);
    assert!(
        bin.exists(),
        "{} is not built: scripts/kubernetes build {tools} (scripts/test does)",
        bin.display()
    );
    bin
}

/// An in-memory OCI registry on loopback (killed when dropped) and its
/// address.
async fn registry() -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let bin = built_tool("registry", "registry");
    let mut child = tokio::process::Command::new(bin)
        .args(["-port", "0"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(port) = line.split("serving on port ").nth(1) {
                return port.trim().to_owned();
            }
        }
        panic!("the registry exited before serving")
    })
    .await
    .expect("the registry serves within 30 s");
    // Its later log lines are read and dropped, so that it never blocks.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("localhost:{port}"))
}
