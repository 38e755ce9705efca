//! The real kube-apiserver + etcd that `scripts/test` starts for the run
//! (`ZKGATE_TEST_KUBECONFIG`), and the controller as a process.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::process::{Child, Command};

/// The kubeconfig of the test API server.
pub fn kubeconfig() -> PathBuf {
    match std::env::var("ZKGATE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!("ZKGATE_TEST_KUBECONFIG is not set: run the tests through scripts/test, which starts kube-apiserver and etcd"),
    }
}

/// A client of the test API server.
pub async fn client() -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig()).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Applies zkgate's CRDs (idempotent) and waits until they are served.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in zkgate::api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("zkgate-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        super::eventually(
            Duration::from_secs(30),
            "the CRD to be established",
            || async {
                let crd = crds.get(&name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
}

/// A fresh namespace for one test.
pub async fn namespace(client: &Client) -> String {
    let name = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// A `zkgate controller` process reconciling one namespace.
pub struct ControllerProcess {
    pub child: Child,
    pub metrics_port: u16,
}

impl ControllerProcess {
    /// Starts a controller for `namespace` against ZooKeeper `zookeeper`.
    pub fn start(namespace: &str, zookeeper: &str, id: &str) -> ControllerProcess {
        let metrics_port = super::zookeeper::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_zkgate"))
            .args([
                "controller",
                "--watch-namespace",
                namespace,
                "--zookeeper",
                zookeeper,
                "--id",
                id,
            ])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
                "--session-timeout",
                "4s",
            ])
            .env("KUBECONFIG", kubeconfig())
            .env("ZKGATE_LOG", "zkgate=debug,warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the controller");
        ControllerProcess {
            child,
            metrics_port,
        }
    }

    /// The value of a metric without labels, if served.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = super::http_get(self.metrics_port, "/metrics").await?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The status code of `GET path`.
    pub async fn status_of(&self, path: &str) -> Option<u16> {
        super::http_get(self.metrics_port, path)
            .await
            .map(|(status, _)| status)
    }

    /// SIGKILL.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
