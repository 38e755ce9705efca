//! The command line of the `zkgate` binary. Every option is also read from
//! the environment, so a pod spec can fill it from the downward API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::agent::barrier::BarrierCommand;
use crate::agent::in_place::PodRecord;
use crate::agent::lock::{LockCommand, Side};
use crate::agent::ready::ReadinessOptions;
use crate::agent::{AgentError, Exit, Participant};
use crate::handout::Handout;
use crate::layout::{Layout, DEFAULT_ROOT};
use crate::zk::{path, ConnectString, Credential, SessionOptions, TlsSettings};

/// Coordinate batch workloads through ZooKeeper.
#[derive(Debug, Parser)]
#[command(name = "zkgate", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "ZKGATE_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `--native-sidecars`, `--in-place-restart`: whether the cluster runs a
/// feature, from the API server's version or as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServerFeature {
    /// Read the API server's version as the webhook starts.
    Auto,
    /// The cluster runs it.
    True,
    /// It does not: the forms that need it are refused.
    False,
}

impl ServerFeature {
    /// `None` for `auto` (read the version), else what was said.
    fn said(self) -> Option<bool> {
        match self {
            ServerFeature::Auto => None,
            ServerFeature::True => Some(true),
            ServerFeature::False => Some(false),
        }
    }
}

/// Log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Take part in a double barrier.
    #[command(subcommand)]
    Barrier(BarrierAction),
    /// Take part in a lock.
    #[command(subcommand)]
    Lock(LockAction),
    /// Run the controller.
    Controller(Box<ControllerArgs>),
    /// Print the CRDs as YAML (crds/ is generated from this).
    Crds {
        /// Write one file per kind into this directory instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Copy this binary into a directory (an init container fills a shared
    /// emptyDir so the workload's container can run `zkgate ... run`).
    Install {
        /// The directory.
        dir: PathBuf,
        /// Beside a barrier sidecar in rounds: also mark a new life of the
        /// pod's containers in the sidecar's --pod-dir (this init container
        /// runs again after each in-place restart, before the sidecar).
        #[arg(long)]
        pod_dir: Option<PathBuf>,
    },
    /// Show Barriers and LockLeases and who waits for whom: one in detail
    /// (for a Barrier, which expected pods have not registered and why;
    /// for a LockLease, its holders and queue), or all of a namespace.
    /// Installed as `kubectl-zkgate`, this is `kubectl zkgate status`.
    Status {
        /// `[KIND] [NAME]`: a kind (`barrier` or `locklease`) lists that
        /// kind; a name alone shows whichever kind has it; both show that
        /// one.
        #[arg(num_args = 0..=2, value_name = "KIND|NAME")]
        what: Vec<String>,
        /// The namespace [default: the kubeconfig's].
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Every namespace's (that you may list), a line each after its
        /// namespace; not with a name.
        #[arg(short = 'A', long, conflicts_with = "namespace")]
        all_namespaces: bool,
    },
    /// Say what a pod waits for, in one paragraph (`kubectl zkgate why POD`).
    Why {
        /// The pod.
        pod: String,
        /// The namespace [default: the kubeconfig's].
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Say which zkgate runs (`kubectl zkgate version`): this plugin's
    /// release, the API server's, whether the CRDs are as this release
    /// makes them, and each controller's Deployment you may list.
    Version,
    /// Check an install as an operator would first (`kubectl zkgate
    /// doctor`): the CRDs, each controller and, asked through the API
    /// server's pod proxy, its ZooKeeper (reachable, each server's version,
    /// ACLs on or off, the session timeouts granted); each webhook's
    /// caBundle and a labelled pod created as a dry run (the webhook
    /// reachable from the API server and trusted); the participants' image
    /// on the nodes. A verdict each (ok, warn, FAIL, ? for cannot tell) and
    /// the fix; exits 4 when a check fails.
    Doctor {
        /// The namespace of the dry-run pod [default: the kubeconfig's].
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Exit 0 if a sidecar reported ready (for an `exec` startupProbe), 1 if not.
    Probe {
        /// The ready file the sidecar writes.
        #[arg(
            long,
            env = "ZKGATE_READY_FILE",
            default_value = "/var/run/zkgate/ready"
        )]
        ready_file: PathBuf,
    },
    /// Internal: the guardian between `run` (or `lock watch`) and its
    /// command; see the `agent::guardian` module.
    #[command(name = "__guard", hide = true)]
    Guard {
        /// The zkgate process that started it.
        #[arg(long)]
        parent: i32,
        /// How long what the command leaves behind gets after SIGTERM.
        #[arg(long)]
        kill_grace_ms: u64,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

/// Options of the controller.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// ZooKeeper connect string: `host:port[,host:port...][/chroot]`.
    #[arg(long, env = "ZKGATE_ZOOKEEPER", value_parser = connect_string)]
    pub zookeeper: ConnectString,
    /// The root of zkgate's znodes, below the connect string's chroot.
    #[arg(long, env = "ZKGATE_ROOT", default_value = DEFAULT_ROOT, value_parser = root_path)]
    pub root: String,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "ZKGATE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// This replica's name [default: the host name, i.e. the pod name].
    #[arg(long, env = "ZKGATE_ID", value_parser = node_name)]
    pub id: Option<String>,
    /// Reconcile only this namespace [default: all namespaces].
    #[arg(long, env = "ZKGATE_WATCH_NAMESPACE", value_parser = node_name)]
    pub watch_namespace: Option<String>,
    /// The ZooKeeper session timeout asked for.
    #[arg(long, env = "ZKGATE_SESSION_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub session_timeout: Duration,
    /// How long each attempt to reach ZooKeeper may take.
    #[arg(long, env = "ZKGATE_CONNECT_TIMEOUT", default_value = "15s", value_parser = duration)]
    pub connect_timeout: Duration,
    /// Credentials and TLS.
    #[command(flatten)]
    pub security: Security,
    /// After a credential rotation, how long the replaced credential keeps
    /// working beside the new one (pods of a gang that started with it
    /// finish their round), before it is taken away.
    #[arg(long, env = "ZKGATE_ROTATION_GRACE", default_value = "15m", value_parser = duration)]
    pub rotation_grace: Duration,
    /// The `spec.timeout` of the Barriers the controller makes for labelled
    /// Jobs (e.g. `30m`), unless the pod template's annotation
    /// `zkgate.io/barrier-timeout` says; counted from the Barrier's making,
    /// once its Job runs (not while a queue holds it suspended). Not for a
    /// gang in rounds (RestartGang) or one waiting for other Barriers
    /// (`zkgate.io/after`) [default: no limit].
    #[arg(long, env = "ZKGATE_RUN_BARRIER_TIMEOUT", value_parser = crate::api::spec_duration)]
    pub run_barrier_timeout: Option<String>,
    /// The admission webhook.
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// Options of the admission webhook (see docs/src/reference/webhook.md).
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Serve the mutating admission webhook (HTTPS) here, e.g. 0.0.0.0:9443
    /// [default: no webhook].
    #[arg(long, env = "ZKGATE_WEBHOOK_ADDR", requires = "image")]
    pub webhook_addr: Option<SocketAddr>,
    /// The image the injected containers run (the controller's own).
    #[arg(long, env = "ZKGATE_IMAGE")]
    pub image: Option<String>,
    /// The Secret, in the controller's namespace, where the controller keeps
    /// the webhook's CA and serving certificate (made and rotated by it).
    #[arg(long, env = "ZKGATE_WEBHOOK_SECRET", default_value = "zkgate-webhook-tls", value_parser = node_name)]
    pub webhook_secret: String,
    /// The namespace of that Secret [default: the controller's own].
    #[arg(long, env = "ZKGATE_WEBHOOK_SECRET_NAMESPACE", value_parser = node_name)]
    pub webhook_secret_namespace: Option<String>,
    /// The MutatingWebhookConfiguration whose caBundle the controller keeps.
    #[arg(long, env = "ZKGATE_WEBHOOK_CONFIGURATION", value_parser = node_name)]
    pub webhook_configuration: Option<String>,
    /// The names the API server reaches the webhook by (the Service's DNS
    /// names, or an IP), comma-separated: the serving certificate's.
    #[arg(long, env = "ZKGATE_WEBHOOK_NAMES", value_delimiter = ',')]
    pub webhook_names: Vec<String>,
    /// Serve `tls.crt` and `tls.key` from this directory instead (a Secret
    /// cert-manager keeps, mounted; its CA injector fills the caBundle).
    #[arg(long, env = "ZKGATE_WEBHOOK_CERT_DIR", conflicts_with_all = ["webhook_configuration", "webhook_names"])]
    pub webhook_cert_dir: Option<PathBuf>,
    /// The webhook's Service, `NAMESPACE/NAME`: injected containers ask the
    /// controller pods behind it (then the Service itself) for their
    /// namespace's ZooKeeper credentials, checking its certificate against
    /// `NAME.NAMESPACE.svc`.
    #[arg(long, env = "ZKGATE_WEBHOOK_SERVICE", value_parser = namespaced_name)]
    pub webhook_service: Option<(String, String)>,
    /// Where injected containers ask for their credentials instead of the
    /// Service's pods (`https://HOST:PORT`, reachable from pods; the
    /// certificate is checked against the first --webhook-names).
    #[arg(long, env = "ZKGATE_HANDOUT_URL")]
    pub handout_url: Option<String>,
    /// This replica's pod address (the downward API's status.podIP):
    /// injected containers ask it first for their credentials.
    #[arg(long, env = "ZKGATE_POD_IP")]
    pub pod_ip: Option<String>,
    /// Whether the API server runs native sidecars (init containers with
    /// `restartPolicy: Always`, Kubernetes 1.29+), which the barrier's and
    /// the lock's sidecar forms are: `auto` reads the server's version as
    /// the webhook starts; `true` or `false` says so instead.
    #[arg(long, env = "ZKGATE_NATIVE_SIDECARS", value_enum, default_value_t = ServerFeature::Auto)]
    pub native_sidecars: ServerFeature,
    /// Whether the cluster restarts a pod's containers in place on a
    /// container's exit (`restartPolicyRules` with `RestartAllContainers`,
    /// on by default from Kubernetes 1.36), which the barrier's sidecar
    /// form in rounds (`onParticipantLoss: RestartGang`) needs: `auto`
    /// reads the server's version as the webhook starts; `true` or `false`
    /// says so instead.
    #[arg(long, env = "ZKGATE_IN_PLACE_RESTART", value_enum, default_value_t = ServerFeature::Auto)]
    pub in_place_restart: ServerFeature,
    /// The ZooKeeper session timeout of the participants the webhook
    /// injects (2s to 120s), unless a pod's annotation
    /// `zkgate.io/session-timeout` says [default: theirs, 10s]. Longer
    /// rides out longer pauses of a node; a dead holder then blocks the
    /// others that much longer.
    #[arg(long, env = "ZKGATE_PARTICIPANT_SESSION_TIMEOUT", value_parser = crate::webhook::inject::session_timeout)]
    pub participant_session_timeout: Option<Duration>,
    /// The resources of the containers the webhook injects: a JSON object
    /// like a container's `resources`, of `cpu` and `memory` only, e.g.
    /// `{"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"cpu":"500m","memory":"64Mi"}}`
    /// (the default); what it leaves out they do not get. A namespace whose
    /// ResourceQuota asks every container for a limit admits labelled pods
    /// only if these give it.
    #[arg(long, env = "ZKGATE_PARTICIPANT_RESOURCES", value_parser = crate::webhook::resources::parse)]
    pub participant_resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// Secrets the kubelet pulls `--image` with, `NAME[,NAME...]`: added
    /// to every pod the webhook injects containers into. Each must exist in
    /// the pod's namespace (a missing one is skipped by the kubelet, which
    /// then pulls without it).
    #[arg(long, env = "ZKGATE_PARTICIPANT_IMAGE_PULL_SECRETS", value_delimiter = ',', value_parser = secret_name)]
    pub participant_image_pull_secrets: Vec<String>,
    /// With TLS to ZooKeeper: the CA certificate (PEM) the controller
    /// issues each namespace's participant client certificate from (one
    /// that names the namespace; the ensemble must trust this CA). Without
    /// it participants get the server CA alone, never the controller's own
    /// client certificate.
    #[arg(
        long,
        env = "ZKGATE_PARTICIPANT_CA_CERT",
        requires = "participant_ca_key"
    )]
    pub participant_ca_cert: Option<PathBuf>,
    /// The key (PEM) of `--participant-ca-cert`.
    #[arg(
        long,
        env = "ZKGATE_PARTICIPANT_CA_KEY",
        requires = "participant_ca_cert"
    )]
    pub participant_ca_key: Option<PathBuf>,
}

impl ControllerArgs {
    /// The controller's options.
    pub fn options(&self) -> Result<crate::controller::ControllerOptions, AgentError> {
        let zookeeper = self.security.apply(
            SessionOptions::new(self.zookeeper.clone())
                .session_timeout(self.session_timeout)
                .connect_timeout(self.connect_timeout),
        )?;
        Ok(crate::controller::ControllerOptions {
            webhook: self.webhook_options(&zookeeper)?,
            zookeeper,
            rotation_grace: self.rotation_grace,
            run_barrier_timeout: self.run_barrier_timeout.clone(),
            layout: Layout::new(&self.root).map_err(|e| AgentError::usage(e.to_string()))?,
            metrics_addr: self.metrics_addr,
            identity: match &self.id {
                Some(id) => id.clone(),
                None => host_name()?,
            },
            watch_namespace: self.watch_namespace.clone(),
        })
    }
}

impl ControllerArgs {
    fn webhook_options(
        &self,
        zookeeper: &SessionOptions,
    ) -> Result<Option<crate::webhook::WebhookOptions>, AgentError> {
        use crate::webhook::handout::HandoutOptions;
        use crate::webhook::inject::Injection;
        use crate::webhook::{CertSource, WebhookOptions};
        let w = &self.webhook;
        let Some(addr) = w.webhook_addr else {
            return Ok(None);
        };
        let certs = match &w.webhook_cert_dir {
            Some(dir) => CertSource::Dir(dir.clone()),
            None if w.webhook_names.is_empty() => {
                return Err(AgentError::usage(
                    "--webhook-addr needs --webhook-names (the names the API server reaches the webhook by) or --webhook-cert-dir",
                ))
            }
            None => CertSource::SelfManaged {
                namespace: w.webhook_secret_namespace.clone(),
                secret: w.webhook_secret.clone(),
                configuration: w.webhook_configuration.clone(),
                names: w.webhook_names.clone(),
            },
        };
        let participant_ca = match (&w.participant_ca_cert, &w.participant_ca_key) {
            (Some(cert), Some(key)) => {
                let read = |path: &PathBuf| {
                    std::fs::read_to_string(path).map_err(|e| {
                        AgentError::usage(format!("cannot read {}: {e}", path.display()))
                    })
                };
                let ca = crate::webhook::certs::ParticipantCa::new(read(cert)?, read(key)?)
                    .map_err(|e| AgentError::usage(format!("the participant CA: {e}")))?;
                Some(ca)
            }
            _ => None,
        };
        let handout = HandoutOptions {
            credentials: zookeeper.credential.is_some(),
            tls_ca: zookeeper.tls.as_ref().map(|t| t.ca.clone()),
            participant_ca,
            layout: Layout::new(&self.root).map_err(|e| AgentError::usage(e.to_string()))?,
            scope: self.watch_namespace.clone(),
        };
        if (handout.credentials || handout.tls_ca.is_some())
            && w.webhook_service.is_none()
            && w.handout_url.is_none()
        {
            return Err(AgentError::usage(
                "with a ZooKeeper credential or TLS, injected containers get theirs from the controller: give --webhook-service NAMESPACE/NAME (or --handout-url)",
            ));
        }
        Ok(Some(WebhookOptions {
            addr,
            certs,
            injection: Injection {
                image: w.image.clone().unwrap_or_default(),
                zookeeper: self.zookeeper.to_string(),
                root: self.root.clone(),
                handout: None,
                native_sidecars: false,
                in_place_restart: false,
                session_timeout: w.participant_session_timeout,
                resources: w
                    .participant_resources
                    .clone()
                    .unwrap_or_else(crate::webhook::resources::default),
                image_pull_secrets: w.participant_image_pull_secrets.clone(),
            },
            handout,
            service: w.webhook_service.clone(),
            handout_url: w.handout_url.clone(),
            pod_ip: w.pod_ip.clone(),
            scope: self.watch_namespace.clone(),
            native_sidecars: w.native_sidecars.said(),
            in_place_restart: w.in_place_restart.said(),
        }))
    }
}

/// The plugin's errors as exit codes: a name that is not there, or a
/// question the caller's credentials may not ask (401, 403: asking again
/// changes nothing), is bad input (2); an API server that cannot be
/// reached or answers with another error, unavailable (5).
fn plugin_error(e: crate::plugin::PluginError) -> AgentError {
    use crate::plugin::PluginError as P;
    match &e {
        P::NotFound { .. } => AgentError::new(Exit::Usage, e.to_string()),
        P::Kube(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => {
            AgentError::new(
                Exit::Usage,
                format!(
                    "{e} (your credentials may not ask this: `kubectl auth can-i` tells; -A needs to list in every namespace, -n NAMESPACE one)"
                ),
            )
        }
        P::Connect(_) | P::Kube(_) => AgentError::new(Exit::Unavailable, e.to_string()),
    }
}

fn host_name() -> Result<String, AgentError> {
    let host = nix::unistd::gethostname()
        .map_err(|e| AgentError::usage(format!("cannot read the host name ({e}); give --id")))?;
    let host = host.to_string_lossy().into_owned();
    node_name(&host)
        .map_err(|e| AgentError::usage(format!("the host name is not a valid id: {e}; give --id")))
}

/// Barrier commands.
#[derive(Debug, Subcommand)]
pub enum BarrierAction {
    /// Register and block until the barrier opens (init container). The
    /// registration outlives the process; a restart is counted once.
    Enter(BarrierArgs),
    /// Leave and block until all have left.
    Leave(BarrierArgs),
    /// Enter, report ready, hold the session, leave on SIGTERM (native sidecar).
    Sidecar {
        /// The barrier.
        #[command(flatten)]
        barrier: BarrierArgs,
        /// Readiness reporting.
        #[command(flatten)]
        readiness: ReadinessArgs,
        /// How long leaving may take after SIGTERM (keep it below the pod's
        /// terminationGracePeriodSeconds).
        #[arg(long, env = "ZKGATE_GRACE_PERIOD", default_value = "25s", value_parser = duration)]
        grace_period: Duration,
        /// Take part in a Barrier's rounds (onParticipantLoss: RestartGang)
        /// from a pod that restarts all its containers in place on this
        /// sidecar's exit 7 and on any main container's failure, and whose
        /// main containers run `zkgate barrier stopping` as their preStop
        /// hook: the directory (an emptyDir of the pod's, shared with that
        /// hook) where the sidecar keeps its record across restarts. The
        /// webhook's sidecar form sets all of it up.
        #[arg(long, env = "ZKGATE_POD_DIR")]
        pod_dir: Option<PathBuf>,
    },
    /// preStop hook of the main containers beside a barrier sidecar in
    /// rounds, and (--sidecar) of the sidecar itself: records that the
    /// kubelet is stopping the pod (with the main containers' mark, its
    /// member is lost; with the sidecar's alone, it completed). Needs no
    /// ZooKeeper connection.
    Stopping {
        /// The sidecar's --pod-dir.
        #[arg(long, env = "ZKGATE_POD_DIR")]
        pod_dir: PathBuf,
        /// The sidecar's own preStop hook: the kubelet ends the pod (with a
        /// grace period), which it does not in an in-place restart.
        #[arg(long)]
        sidecar: bool,
    },
    /// Enter, run the command, leave; exit with the command's status.
    Run {
        /// The barrier.
        #[command(flatten)]
        barrier: BarrierArgs,
        /// After SIGTERM, how long the command gets before SIGKILL.
        #[arg(long, env = "ZKGATE_KILL_GRACE", default_value = "10s", value_parser = duration)]
        kill_grace: Duration,
        /// A file that exists from just before the command starts after an
        /// opening (each round's, in rounds) until this member has left
        /// after it exited 0, for a readiness probe (`zkgate probe
        /// --ready-file`): a queue's `waitForPodsReady` then sees a gang
        /// that waits.
        #[arg(long, env = "ZKGATE_RELEASED_FILE")]
        released_file: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

/// Lock commands.
#[derive(Debug, Subcommand)]
pub enum LockAction {
    /// Acquire, write the fencing token, keep the hold registered past this
    /// process (init container).
    Acquire {
        /// The lock.
        #[command(flatten)]
        lock: LockArgs,
        /// Where the fencing token goes.
        #[command(flatten)]
        token: TokenFile,
    },
    /// Acquire, write the token, report ready, hold until SIGTERM (native sidecar).
    ///
    /// When the hold is lost, or may be, the token file goes (early enough
    /// for `zkgate lock watch` in the main container to stop its command
    /// before anyone else can hold the lock) and the sidecar exits 6.
    Sidecar {
        /// The lock.
        #[command(flatten)]
        lock: LockArgs,
        /// Where the fencing token goes.
        #[command(flatten)]
        token: TokenFile,
        /// Readiness reporting.
        #[command(flatten)]
        readiness: ReadinessArgs,
        /// How long a command under `zkgate lock watch` gets after SIGTERM:
        /// at most 0.35 of the session timeout and at most 60s [default: a
        /// quarter of the session timeout, at most 60s].
        #[arg(long, env = "ZKGATE_KILL_GRACE", value_parser = duration)]
        kill_grace: Option<Duration>,
    },
    /// Run the command while a `lock sidecar` in the same pod holds the
    /// lock (main container): stop it (exit 6) as soon as the sidecar
    /// withdraws the token file. Needs no ZooKeeper connection.
    Watch {
        /// The token file the sidecar writes.
        #[command(flatten)]
        token: TokenFile,
        /// After SIGTERM, how long the command gets before SIGKILL
        /// [default: what the sidecar published; never longer].
        #[arg(long, value_parser = duration)]
        kill_grace: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// Acquire, run the command with ZKGATE_FENCING_TOKEN set, release.
    ///
    /// The command never outlives the hold: if ZooKeeper stops answering,
    /// it gets SIGTERM, then SIGKILL after the kill grace, so that it has
    /// exited before the server can expire the session and hand the lock
    /// to the next holder.
    Run {
        /// The lock.
        #[command(flatten)]
        lock: LockArgs,
        /// After SIGTERM, how long the command gets before SIGKILL: at most
        /// 0.35 of the session timeout and at most 60s [default: a quarter
        /// of the session timeout, at most 60s].
        #[arg(long, env = "ZKGATE_KILL_GRACE", value_parser = duration)]
        kill_grace: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

/// Options of every participant command.
#[derive(Debug, Args)]
pub struct Common {
    /// ZooKeeper connect string: `host:port[,host:port...][/chroot]`.
    #[arg(long, env = "ZKGATE_ZOOKEEPER", value_parser = connect_string)]
    pub zookeeper: ConnectString,
    /// The namespace of the Barrier or LockLease.
    #[arg(long, env = "ZKGATE_NAMESPACE", default_value = "default", value_parser = node_name)]
    pub namespace: String,
    /// This participant's id [default: the host name, i.e. the pod name].
    #[arg(long, env = "ZKGATE_ID", value_parser = node_name)]
    pub id: Option<String>,
    /// The pod's name (metadata.name, from the downward API): the pod whose
    /// end the controller checks for a registration that outlives this
    /// process. The id may differ from it.
    #[arg(long, env = "ZKGATE_POD_NAME", value_parser = node_name)]
    pub pod_name: Option<String>,
    /// The pod's uid (metadata.uid), recorded in the participant's node.
    #[arg(long, env = "ZKGATE_POD_UID")]
    pub pod_uid: Option<String>,
    /// The root of zkgate's znodes, below the connect string's chroot.
    #[arg(long, env = "ZKGATE_ROOT", default_value = DEFAULT_ROOT, value_parser = root_path)]
    pub root: String,
    /// How long to wait to enter, acquire or leave (e.g. 90s, 10m) [default: no limit].
    #[arg(long, env = "ZKGATE_TIMEOUT", value_parser = duration)]
    pub timeout: Option<Duration>,
    /// The ZooKeeper session timeout asked for.
    #[arg(long, env = "ZKGATE_SESSION_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub session_timeout: Duration,
    /// How long to keep trying to reach ZooKeeper before giving up (exit
    /// 5); 0: for as long as it takes, within --timeout (exit 3), as the
    /// containers the webhook injects do.
    #[arg(long, env = "ZKGATE_CONNECT_TIMEOUT", default_value = "15s", value_parser = duration_or_zero)]
    pub connect_timeout: Duration,
    /// Credentials and TLS.
    #[command(flatten)]
    pub security: Security,
    /// Credentials handed out by the controller.
    #[command(flatten)]
    pub handout: HandoutArgs,
}

/// Where a participant asks the controller for its namespace's ZooKeeper
/// credential and TLS material (what the webhook gives injected containers,
/// and pods labelled `zkgate.io/credentials: "true"`). What `--auth`,
/// `--auth-file` and `--tls-*` give explicitly is used instead.
#[derive(Debug, Args)]
pub struct HandoutArgs {
    /// The controller's handout addresses (`https://HOST:PORT`),
    /// comma-separated, tried in turn.
    #[arg(long, env = "ZKGATE_CREDENTIALS_URL", value_delimiter = ',')]
    pub credentials_url: Vec<String>,
    /// The CA (PEM text) the controller's certificate chains to.
    #[arg(long, env = "ZKGATE_CREDENTIALS_CA", hide_env_values = true)]
    pub credentials_ca: Option<String>,
    /// The name the controller's certificate carries [default: the URL's host].
    #[arg(long, env = "ZKGATE_CREDENTIALS_SERVER_NAME")]
    pub credentials_server_name: Option<String>,
    /// The projected ServiceAccount token (audience `zkgate`) that proves
    /// the pod's namespace.
    #[arg(long, env = "ZKGATE_CREDENTIALS_TOKEN_FILE", default_value = crate::handout::TOKEN_FILE)]
    pub credentials_token_file: PathBuf,
}

impl HandoutArgs {
    /// Asks for the handout, if an address is given, for up to `within`
    /// (`None`: no limit); SIGTERM or SIGINT meanwhile ends the command
    /// (nothing is registered yet).
    async fn fetch(
        &self,
        within: Option<Duration>,
        stop: &mut crate::agent::Termination,
    ) -> Result<Option<Handout>, AgentError> {
        if self.credentials_url.iter().all(|u| u.trim().is_empty()) {
            return Ok(None);
        }
        let source = crate::handout::Source {
            urls: self.credentials_url.clone(),
            server_name: self.credentials_server_name.clone(),
            ca: self.credentials_ca.clone().ok_or_else(|| {
                AgentError::usage(
                    "--credentials-url needs --credentials-ca (ZKGATE_CREDENTIALS_CA)",
                )
            })?,
            token_file: self.credentials_token_file.clone(),
        };
        let fetched = tokio::select! {
            fetched = source.fetch(within) => fetched,
            exit = stop.received() => return Err(AgentError::new(exit, format!("stopped by {} while asking for the credentials", exit.signal_name()))),
        };
        use crate::handout::HandoutError as H;
        match fetched {
            Ok(handout) => Ok(Some(handout)),
            Err(e @ (H::Refused { .. } | H::Invalid(_))) => Err(AgentError::usage(format!(
                "{e}; the pod's token (projected, audience zkgate) proves its namespace"
            ))),
            Err(e @ H::Unavailable { .. }) => Err(AgentError::new(
                Exit::Unavailable,
                format!("{e}; check that the controller runs and that the namespace has a Barrier or LockLease"),
            )),
        }
    }
}

/// How to authenticate to ZooKeeper and secure the connection. Files are
/// read once, up front: a missing or unreadable one is a usage error.
#[derive(Debug, Args)]
pub struct Security {
    /// ZooKeeper digest credential, `user:password` (participants get
    /// their namespace's from the controller: --credentials-url); empty:
    /// none.
    #[arg(long, env = "ZKGATE_AUTH", value_parser = credential, hide_env_values = true, conflicts_with = "auth_file")]
    pub auth: Option<MaybeCredential>,
    /// A file holding the digest credential, `user:password` (a mounted Secret).
    #[arg(long, env = "ZKGATE_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// CA certificates (PEM) that `tcp+tls://` servers' certificates must chain to.
    #[arg(long, env = "ZKGATE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for servers that require one.
    #[arg(long, env = "ZKGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "ZKGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl Security {
    /// Adds the credential and TLS settings to `options`.
    pub fn apply(&self, options: SessionOptions) -> Result<SessionOptions, AgentError> {
        self.apply_with(options, None)
    }

    /// Adds the credential and TLS settings to `options`: those given, and
    /// what `handout` gives where nothing is given.
    pub fn apply_with(
        &self,
        mut options: SessionOptions,
        handout: Option<&Handout>,
    ) -> Result<SessionOptions, AgentError> {
        let read = |what: &str, path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|e| {
                AgentError::usage(format!("cannot read the {what} {}: {e}", path.display()))
            })
        };
        options.credential =
            match (&self.auth, &self.auth_file) {
                (Some(MaybeCredential(credential)), _) => credential.clone(),
                (None, Some(file)) => Some(
                    Credential::parse(&read("credential file", file)?).map_err(|e| {
                        AgentError::usage(format!("the credential file {}: {e}", file.display()))
                    })?,
                ),
                (None, None) => match handout.and_then(|h| h.auth.as_deref()) {
                    Some(auth) => Some(Credential::parse(auth).map_err(|e| {
                        AgentError::usage(format!("the credential handed out: {e}"))
                    })?),
                    None => None,
                },
            };
        let uses_tls = options.connect.uses_tls();
        let handed_tls = handout.and_then(|h| h.tls.as_ref());
        match (&self.tls_ca, handed_tls) {
            (None, Some(tls)) if uses_tls => {
                options.tls = Some(TlsSettings {
                    ca: tls.ca.clone(),
                    identity: tls.cert.clone().zip(tls.key.clone()),
                });
            }
            (Some(ca), _) => {
                let identity = match (&self.tls_cert, &self.tls_key) {
                    (Some(cert), Some(key)) => Some((
                        read("client certificate", cert)?,
                        read("client key", key)?,
                    )),
                    _ => None,
                };
                options.tls = Some(TlsSettings {
                    ca: read("CA certificate file", ca)?,
                    identity,
                });
                if !uses_tls {
                    return Err(AgentError::usage(
                        "--tls-ca is given but no server in the connect string is tcp+tls://",
                    ));
                }
            }
            (None, _) if uses_tls => {
                return Err(AgentError::usage(
                    "the connect string names tcp+tls:// servers: give their CA with --tls-ca (ZKGATE_TLS_CA)",
                ))
            }
            (None, _) => {}
        }
        Ok(options)
    }
}

/// A barrier and how it is created without a controller.
#[derive(Debug, Args)]
pub struct BarrierArgs {
    /// The Barrier's name.
    #[arg(value_parser = node_name)]
    pub name: String,
    /// Without a controller: create the barrier node for this many participants if missing.
    #[arg(long, env = "ZKGATE_PARTICIPANTS", value_parser = clap::value_parser!(u32).range(1..))]
    pub participants: Option<u32>,
    /// The run this participant belongs to (the webhook sets the uid of
    /// the pod's Job): a barrier made for another run is waited out, never
    /// entered, until this run's replaces it [default: enter any].
    #[arg(long, env = "ZKGATE_RUN")]
    pub run: Option<String>,
    /// Connection and identity.
    #[command(flatten)]
    pub common: Common,
}

impl BarrierArgs {
    /// The barrier command these arguments name, for participant `p`.
    fn command<'a>(&self, p: &'a Participant) -> Result<BarrierCommand<'a>, AgentError> {
        Ok(BarrierCommand::new(p, &self.name, self.participants)?.in_run(self.run.clone()))
    }
}

/// A lock and which side to take.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The LockLease's name.
    #[arg(value_parser = node_name)]
    pub name: String,
    /// Take a read hold (a ReadWrite LockLease).
    #[arg(long, conflicts_with = "write")]
    pub read: bool,
    /// Take the write hold (a ReadWrite LockLease).
    #[arg(long)]
    pub write: bool,
    /// Without a controller: create the lock node if missing.
    #[arg(long, env = "ZKGATE_CREATE")]
    pub create: bool,
    /// Permits to take at once from a Semaphore LockLease: all of them or
    /// none, never some while waiting for the rest.
    #[arg(long, env = "ZKGATE_TAKE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub take: u32,
    /// Without a controller: with --create, make the lock a Semaphore of
    /// this many permits (kept if it exists).
    #[arg(long, requires = "create", value_parser = clap::value_parser!(u32).range(1..))]
    pub permits: Option<u32>,
    /// Connection and identity.
    #[command(flatten)]
    pub common: Common,
}

/// Where the fencing token goes.
#[derive(Debug, Args)]
pub struct TokenFile {
    /// Where to write the fencing token.
    #[arg(
        long,
        env = "ZKGATE_TOKEN_FILE",
        default_value = "/var/run/zkgate/fencing-token"
    )]
    pub token_file: PathBuf,
}

/// Where a sidecar reports readiness.
#[derive(Debug, Args)]
pub struct ReadinessArgs {
    /// The file made once ready (read by `zkgate probe`).
    #[arg(
        long,
        env = "ZKGATE_READY_FILE",
        default_value = "/var/run/zkgate/ready"
    )]
    pub ready_file: PathBuf,
    /// Also serve GET /readyz and /healthz on this address (for an httpGet probe).
    #[arg(long, env = "ZKGATE_PROBE_ADDR")]
    pub probe_addr: Option<SocketAddr>,
}

impl ReadinessArgs {
    fn options(&self) -> ReadinessOptions {
        ReadinessOptions {
            file: Some(self.ready_file.clone()),
            probe_addr: self.probe_addr,
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e} (expected a duration such as 90s or 10m)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// The name of a Secret (a DNS subdomain: at most 253 characters of
/// lowercase letters, digits, `-` and `.`, alphanumeric at each end).
fn secret_name(s: &str) -> Result<String, String> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let valid = s.len() <= 253
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if valid {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is no Secret name (lowercase letters, digits, '-' and '.', at most 253)"
        ))
    }
}

/// [`duration`], or 0 (meaning no limit where a flag says so).
fn duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (expected a duration such as 90s or 10m, or 0)"))
}

/// A credential given on the command line or in the environment; empty
/// means none.
#[derive(Clone, Debug)]
pub struct MaybeCredential(Option<Credential>);

fn credential(s: &str) -> Result<MaybeCredential, String> {
    if s.is_empty() {
        return Ok(MaybeCredential(None));
    }
    Credential::parse(s).map(|c| MaybeCredential(Some(c)))
}

fn connect_string(s: &str) -> Result<ConnectString, String> {
    s.parse::<ConnectString>().map_err(|e| e.to_string())
}

/// `NAMESPACE/NAME`.
fn namespaced_name(s: &str) -> Result<(String, String), String> {
    let (namespace, name) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not NAMESPACE/NAME"))?;
    Ok((node_name(namespace)?, node_name(name)?))
}

fn node_name(s: &str) -> Result<String, String> {
    path::validate_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// What `zkgate status` was asked for: `[KIND] [NAME]`, where a lone word
/// that names a kind is the kind, and any other lone word is a name.
fn status_target(
    what: &[String],
) -> Result<(Option<crate::plugin::Kind>, Option<String>), AgentError> {
    use clap::ValueEnum;
    let kind = |word: &str| crate::plugin::Kind::from_str(word, true);
    match what {
        [] => Ok((None, None)),
        [word] => Ok(match kind(word) {
            Ok(k) => (Some(k), None),
            Err(_) => (None, Some(word.clone())),
        }),
        [k, name] => kind(k).map(|k| (Some(k), Some(name.clone()))).map_err(|_| {
            AgentError::usage(format!(
                "{k:?} is not a kind: give barrier or locklease, then the name"
            ))
        }),
        _ => Err(AgentError::usage("give at most a kind and a name")),
    }
}

fn root_path(s: &str) -> Result<String, String> {
    path::validate_path(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

impl Common {
    /// Who takes part, with its credentials asked for when they are not
    /// given; and the signal handlers, installed first, that serve the
    /// whole command from here on (a SIGTERM that came between two sets of
    /// handlers would be lost: a process that is PID 1 has no default).
    async fn participant(&self) -> Result<(Participant, crate::agent::Termination), AgentError> {
        let mut stop = crate::agent::Termination::install()?;
        let id = match &self.id {
            Some(id) => id.clone(),
            None => {
                let host = nix::unistd::gethostname().map_err(|e| {
                    AgentError::usage(format!("cannot read the host name ({e}); give --id"))
                })?;
                let host = host.to_string_lossy().into_owned();
                node_name(&host).map_err(|e| {
                    AgentError::usage(format!("the host name is not a valid id: {e}; give --id"))
                })?
            }
        };
        let layout = Layout::new(&self.root).map_err(|e| AgentError::usage(e.to_string()))?;
        // Asked for unless everything it would give is given (a credential,
        // and the CA where the servers are TLS ones). The namespace's
        // credential may be made only at its first resource's reconcile:
        // asked again within --timeout (no limit without one, like the
        // wait that follows).
        let given = (self.security.auth.is_some() || self.security.auth_file.is_some())
            && (self.security.tls_ca.is_some() || !self.zookeeper.uses_tls());
        let handout = match given {
            true => None,
            false => self.handout.fetch(self.timeout, &mut stop).await?,
        };
        if let Some(h) = handout.as_ref().filter(|h| h.namespace != self.namespace) {
            return Err(AgentError::usage(format!(
                "the controller handed out namespace {}'s credentials (the pod's), but the resource is in namespace {}: a pod takes part only in its own namespace's Barriers and LockLeases",
                h.namespace, self.namespace
            )));
        }
        let session = self.security.apply_with(
            SessionOptions::new(self.zookeeper.clone())
                .session_timeout(self.session_timeout)
                .connect_timeout(self.connect_timeout),
            handout.as_ref(),
        )?;
        let participant = Participant {
            session,
            layout,
            namespace: self.namespace.clone(),
            id,
            pod_name: self.pod_name.clone(),
            pod_uid: self.pod_uid.clone().filter(|u| !u.is_empty()),
            timeout: self.timeout,
        };
        Ok((participant, stop))
    }
}

impl LockArgs {
    fn side(&self) -> Side {
        match (self.read, self.write) {
            (true, _) => Side::Read,
            (_, true) => Side::Write,
            _ => Side::Exclusive,
        }
    }
}

/// Runs a parsed command line; `Ok` carries the exit code.
pub async fn run(cli: Cli) -> Result<i32, AgentError> {
    match cli.command {
        Command::Controller(args) => {
            let options = args.options()?;
            crate::controller::run(options)
                .await
                .map(|()| 0)
                .map_err(|e| AgentError::new(Exit::Internal, format!("{e:#}")))
        }
        Command::Status {
            what,
            namespace,
            all_namespaces,
        } => {
            let (kind, name) = status_target(&what)?;
            if all_namespaces && name.is_some() {
                return Err(AgentError::usage(
                    "a name is looked up in one namespace: give -n NAMESPACE, not -A",
                ));
            }
            let plugin = crate::plugin::Plugin::connect(namespace)
                .await
                .map_err(plugin_error)?;
            let out = if all_namespaces {
                plugin.status_everywhere(kind).await
            } else {
                plugin.status(kind, name.as_deref()).await
            }
            .map_err(plugin_error)?;
            print!("{out}");
            Ok(0)
        }
        Command::Version => {
            let plugin = crate::plugin::Plugin::connect(None)
                .await
                .map_err(plugin_error)?;
            print!("{}", plugin.version().await.map_err(plugin_error)?);
            Ok(0)
        }
        Command::Doctor { namespace } => {
            let plugin = crate::plugin::Plugin::connect(namespace)
                .await
                .map_err(plugin_error)?;
            let findings = plugin.doctor().await.map_err(plugin_error)?;
            print!("{}", crate::plugin::doctor_report(&findings));
            let failed = findings
                .iter()
                .filter(|f| f.verdict == crate::plugin::Verdict::Fail)
                .count();
            if failed > 0 {
                return Err(AgentError::new(
                    Exit::Failed,
                    format!("{failed} check(s) failed: see FAIL above"),
                ));
            }
            Ok(0)
        }
        Command::Why { pod, namespace } => {
            let plugin = crate::plugin::Plugin::connect(namespace)
                .await
                .map_err(plugin_error)?;
            print!("{}", plugin.why(&pod).await.map_err(plugin_error)?);
            Ok(0)
        }
        Command::Crds { dir } => {
            let crds = crate::api::crds();
            match dir {
                None => {
                    let docs: Vec<String> = crds.iter().map(crate::api::to_yaml).collect();
                    print!("{}", docs.join("---\n"));
                }
                Some(dir) => {
                    for crd in &crds {
                        let path = dir.join(crate::api::file_name(crd));
                        crate::agent::ready::write_atomically(&path, &crate::api::to_yaml(crd))?;
                    }
                }
            }
            Ok(0)
        }
        Command::Install { dir, pod_dir } => {
            let failed = |e: std::io::Error| {
                AgentError::new(
                    Exit::Internal,
                    format!("cannot install zkgate into {}: {e}", dir.display()),
                )
            };
            let me = std::env::current_exe().map_err(failed)?;
            std::fs::create_dir_all(&dir).map_err(failed)?;
            let target = dir.join("zkgate");
            let tmp = dir.join(".zkgate.tmp");
            std::fs::copy(&me, &tmp).map_err(failed)?;
            std::fs::rename(&tmp, &target).map_err(failed)?;
            tracing::info!(to = %target.display(), "installed");
            if let Some(pod_dir) = pod_dir {
                PodRecord::mark_new_life(&pod_dir)?;
            }
            Ok(0)
        }
        Command::Guard {
            parent,
            kill_grace_ms,
            command,
        } => {
            crate::agent::guardian::run(parent, Duration::from_millis(kill_grace_ms), &command)
                .await
        }
        Command::Probe { ready_file } => {
            if ready_file.exists() {
                Ok(0)
            } else {
                Err(AgentError::new(
                    Exit::Internal,
                    format!("not ready: {} does not exist yet", ready_file.display()),
                ))
            }
        }
        Command::Barrier(action) => match action {
            BarrierAction::Enter(b) => {
                let (p, stop) = b.common.participant().await?;
                b.command(&p)?.enter(stop).await
            }
            BarrierAction::Leave(b) => {
                let (p, stop) = b.common.participant().await?;
                b.command(&p)?.leave(stop).await
            }
            BarrierAction::Sidecar {
                barrier: b,
                readiness,
                grace_period,
                pod_dir,
            } => {
                let (p, stop) = b.common.participant().await?;
                let record = pod_dir.map(PodRecord::new);
                b.command(&p)?
                    .sidecar(stop, &readiness.options(), grace_period, record.as_ref())
                    .await
            }
            BarrierAction::Stopping { pod_dir, sidecar } => {
                PodRecord::mark_stopping(&pod_dir, sidecar).map(|()| 0)
            }
            BarrierAction::Run {
                barrier: b,
                kill_grace,
                released_file,
                command,
            } => {
                // Not released before anything else: a file a killed life
                // left would make the restarted container Ready while it
                // fetches its credentials and waits for its gang.
                if let Some(file) = &released_file {
                    crate::agent::ready::refuse_special(file)?;
                    crate::agent::ready::remove(file);
                }
                let (p, stop) = b.common.participant().await?;
                b.command(&p)?
                    .released_file(released_file)
                    .run(stop, &command, kill_grace)
                    .await
            }
        },
        Command::Lock(action) => match action {
            LockAction::Acquire { lock: l, token } => {
                let (p, stop) = l.common.participant().await?;
                LockCommand::new(&p, &l.name, l.side(), l.create)?
                    .permits(l.take, l.permits)
                    .acquire(stop, &token.token_file)
                    .await
            }
            LockAction::Sidecar {
                lock: l,
                token,
                readiness,
                kill_grace,
            } => {
                let (p, stop) = l.common.participant().await?;
                LockCommand::new(&p, &l.name, l.side(), l.create)?
                    .permits(l.take, l.permits)
                    .sidecar(stop, &token.token_file, &readiness.options(), kill_grace)
                    .await
            }
            LockAction::Watch {
                token,
                kill_grace,
                command,
            } => crate::agent::lock::watch(&token.token_file, &command, kill_grace).await,
            LockAction::Run {
                lock: l,
                kill_grace,
                command,
            } => {
                let (p, stop) = l.common.participant().await?;
                LockCommand::new(&p, &l.name, l.side(), l.create)?
                    .permits(l.take, l.permits)
                    .run(stop, &command, kill_grace)
                    .await
            }
        },
    }
}
