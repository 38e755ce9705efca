//! The real kube-apiserver + etcd that `scripts/test` starts for the run
//! (`ZKGATE_TEST_KUBECONFIG`), and the controller as a process.

use std::path::{Path, PathBuf};
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
    client_of(&kubeconfig()).await
}

/// A client of the API server that `kubeconfig` names.
pub async fn client_of(kubeconfig: &std::path::Path) -> Client {
    zkgate::install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// A client of the API server that `kubeconfig` names, acting as `user`
/// (impersonation: the kubeconfig's user must be allowed to).
pub async fn client_as(kubeconfig: &std::path::Path, user: &str) -> Client {
    zkgate::install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).expect("client")
}

/// Waits until every webhook of the MutatingWebhookConfiguration `name`
/// carries a `caBundle` (the controller published its CA).
/// Barrier `name` once it is the run of the Job of uid `job` (owned by it).
pub async fn barrier_of_run(
    api: &Api<zkgate::api::Barrier>,
    name: &str,
    job: &str,
    within: Duration,
) -> zkgate::api::Barrier {
    super::eventually(within, "the run's Barrier", || async {
        api.get_opt(name).await.ok().flatten().filter(|b| {
            b.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == job)
        })
    })
    .await
}

pub async fn ca_bundle_published(client: &Client, name: &str, within: Duration) {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    super::eventually(within, "the caBundle published", || async {
        let config = api.get(name).await.ok()?;
        config
            .webhooks?
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some())
            .then_some(())
    })
    .await;
}

/// Applies zkgate's CRDs (idempotent) and waits until they are served.
pub async fn install_crds(client: &Client) {
    for crd in zkgate::api::crds() {
        apply_crd(client, &crd).await;
    }
}

/// Applies JobSet's CRD (`tests/crds`, upstream's schema; idempotent) and
/// waits until it is served.
pub async fn install_jobset_crd(client: &Client) {
    install_crd_file(client, "jobset.x-k8s.io_jobsets.yaml").await;
}

/// Applies every CRD of `tests/crds` (JobSet's and Kueue's, as released).
pub async fn install_upstream_crds(client: &Client) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crds");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/crds")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    files.sort();
    for file in files {
        install_crd_file(client, &file).await;
    }
}

/// Applies the CRD of `tests/crds/FILE` (a release's, whole: see
/// `scripts/upstream-crds`; idempotent) and waits until it is served.
pub async fn install_crd_file(client: &Client, file: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/crds")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("a CRD of tests/crds");
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("a CRD");
    apply_crd(client, &crd).await;
}

/// Applies `crd` (server-side, idempotent) and waits until it is served.
pub async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &name,
        &PatchParams::apply("zkgate-tests").force(),
        &Patch::Apply(crd),
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

/// Creates the Barrier `name` of `participants` through `barriers` and
/// waits (up to `within`) until a controller has made its znodes (phase
/// `Waiting`): from then on participants can register.
pub async fn barrier_waiting(
    barriers: &Api<zkgate::api::Barrier>,
    name: &str,
    participants: u32,
    within: Duration,
) -> zkgate::api::Barrier {
    let barrier = serde_json::from_value(serde_json::json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": name }, "spec": { "participants": participants }
    }))
    .expect("a Barrier");
    let created = barriers
        .create(&PostParams::default(), &barrier)
        .await
        .expect("create the Barrier");
    super::eventually(within, &format!("Barrier {name} Waiting"), || async {
        let phase = barriers.get(name).await.ok()?.status?.phase;
        (phase == Some(zkgate::api::BarrierPhase::Waiting)).then_some(())
    })
    .await;
    created
}

/// A `zkgate controller` process reconciling one namespace.
pub struct ControllerProcess {
    pub child: Child,
    pub metrics_port: u16,
}

impl ControllerProcess {
    /// Starts a controller for `namespace` against ZooKeeper `zookeeper`.
    pub fn start(namespace: &str, zookeeper: &str, id: &str) -> ControllerProcess {
        Self::start_on(&kubeconfig(), namespace, zookeeper, id)
    }

    /// [`ControllerProcess::start`] against the API server of `kubeconfig`.
    pub fn start_on(
        kubeconfig: &std::path::Path,
        namespace: &str,
        zookeeper: &str,
        id: &str,
    ) -> ControllerProcess {
        Self::start_with(kubeconfig, zookeeper, id, &["--watch-namespace", namespace])
    }

    /// A controller against the API server of `kubeconfig` with more
    /// arguments (without `--watch-namespace`: every namespace).
    pub fn start_with(
        kubeconfig: &std::path::Path,
        zookeeper: &str,
        id: &str,
        extra: &[&str],
    ) -> ControllerProcess {
        Self::spawn(
            Path::new(env!("CARGO_BIN_EXE_zkgate")),
            kubeconfig,
            zookeeper,
            id,
            extra,
            Stdio::inherit(),
        )
    }

    /// [`ControllerProcess::start_with`] running the zkgate binary `bin`
    /// (another release's, for an upgrade).
    pub fn start_binary(
        bin: &std::path::Path,
        kubeconfig: &std::path::Path,
        zookeeper: &str,
        id: &str,
        extra: &[&str],
    ) -> ControllerProcess {
        Self::spawn(bin, kubeconfig, zookeeper, id, extra, Stdio::inherit())
    }

    /// [`ControllerProcess::start_with`], its log (standard error) handed
    /// to the test line by line.
    pub fn start_logged(
        kubeconfig: &std::path::Path,
        zookeeper: &str,
        id: &str,
        extra: &[&str],
    ) -> (
        ControllerProcess,
        tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    ) {
        use tokio::io::AsyncBufReadExt;
        let mut controller = Self::spawn(
            Path::new(env!("CARGO_BIN_EXE_zkgate")),
            kubeconfig,
            zookeeper,
            id,
            extra,
            Stdio::piped(),
        );
        let stderr = controller.child.stderr.take().expect("piped");
        (controller, tokio::io::BufReader::new(stderr).lines())
    }

    fn spawn(
        bin: &std::path::Path,
        kubeconfig: &std::path::Path,
        zookeeper: &str,
        id: &str,
        extra: &[&str],
        stderr: Stdio,
    ) -> ControllerProcess {
        let metrics_port = super::zookeeper::free_port();
        let child = Command::new(bin)
            .args(["controller", "--zookeeper", zookeeper, "--id", id])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
                "--session-timeout",
                "4s",
            ])
            .args(extra)
            // Its certificates when `zookeeper` names TLS servers (the TLS
            // pass of scripts/test).
            .envs(super::tls_env(zookeeper))
            .env("KUBECONFIG", kubeconfig)
            .env("ZKGATE_LOG", "zkgate=debug,warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
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

/// A kube-apiserver + etcd of a test's own (`scripts/kube-apiserver`), for
/// faults that would disturb the shared one. Stopped when dropped.
pub struct PrivateApiServer {
    dir: tempfile::TempDir,
}

impl PrivateApiServer {
    fn script(action: &str, dir: &std::path::Path) -> bool {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kube-apiserver");
        std::process::Command::new(script)
            .args([action, &dir.to_string_lossy()])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts one (blocking: a few seconds).
    pub fn start() -> PrivateApiServer {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(
            Self::script("start", dir.path()),
            "scripts/kube-apiserver start failed"
        );
        PrivateApiServer { dir }
    }

    /// Starts one (off the runtime's thread), with a client of it and
    /// nothing installed.
    pub async fn bare() -> (PrivateApiServer, Client) {
        let server = tokio::task::spawn_blocking(PrivateApiServer::start)
            .await
            .expect("start the API server");
        let client = client_of(&server.kubeconfig()).await;
        (server, client)
    }

    /// [`PrivateApiServer::bare`] with the CRDs installed.
    pub async fn with_crds() -> (PrivateApiServer, Client) {
        let (server, client) = Self::bare().await;
        install_crds(&client).await;
        (server, client)
    }

    /// Its kubeconfig (cluster admin).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// SIGKILLs kube-apiserver (etcd keeps running) and waits until it is gone.
    pub fn crash(&self) {
        let pid = std::fs::read_to_string(self.dir.path().join("apiserver.pid")).expect("pid");
        let pid: i32 = pid.trim().parse().expect("pid");
        // SAFETY: kill(2) on a pid we started; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts kube-apiserver again on the same port and waits until ready
    /// (blocking).
    pub fn restart(&self) {
        assert!(
            Self::script("restart", self.dir.path()),
            "scripts/kube-apiserver restart failed"
        );
    }
}

impl Drop for PrivateApiServer {
    fn drop(&mut self) {
        Self::script("stop", self.dir.path());
    }
}

/// The API server's count of requests with `verb` on `resource` (and
/// `subresource`, `""` for none), from its `/metrics`.
pub async fn api_requests(client: &Client, verb: &str, resource: &str, subresource: &str) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("the API server's /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains(&format!("verb=\"{verb}\""))
                && l.contains(&format!("resource=\"{resource}\""))
                && l.contains(&format!("subresource=\"{subresource}\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Creates a pod with `metadata` (name, labels, finalizers...) and one
/// container; with no kubelet it never runs, which these tests rely on:
/// its fate changes only when they delete it. Returns its uid.
pub async fn create_pod(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    metadata: serde_json::Value,
) -> String {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": metadata,
        "spec": { "containers": [{ "name": "main", "image": "busybox" }] }
    }))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("the pod is created")
        .metadata
        .uid
        .expect("a created pod has a uid")
}
