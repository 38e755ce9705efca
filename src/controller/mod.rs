//! The controller (`zkgate controller`): turns Barriers and LockLeases into
//! znodes and mirrors what happens in ZooKeeper into their status.
//!
//! One replica leads at a time. Leadership is zkgate's own exclusive lock
//! on `<root>/leader` rather than a Kubernetes Lease: everything the
//! controller does goes through its ZooKeeper session, and a lock tied to
//! that session is lost exactly when the session is, so a replica that can
//! no longer reach ZooKeeper stops leading at once and another takes over as
//! soon as the server expires the old session. Standby replicas wait in the
//! lock's queue (herd-free), and no Lease RBAC is needed.

mod after;
mod barrier;
mod context;
pub mod credentials;
pub mod diagnosis;
mod error;
pub mod http;
pub mod install;
mod jobs;
mod locklease;
pub mod pods;
mod reconciler;
mod removal;
pub mod runs;
pub mod status;
mod waits;
mod worth;
mod zkevents;

use crate::serve::{backoff, metrics};
use crate::webhook;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use context::{Context, FINALIZER, MANAGER};
pub use credentials::ROTATE_ANNOTATION;
pub use error::Error;
pub use locklease::LockNodeData;

use crate::api::{Barrier, LockLease};
use crate::layout::Layout;
use crate::workload::{BARRIER_LABEL, LOCK_LABEL};
use crate::zk::{LockOptions, Mutex, Session, SessionOptions, SessionState};

pub use crate::workload::{made_by_zkgate, managed_by};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// How to reach ZooKeeper.
    pub zookeeper: SessionOptions,
    /// Where resources live in ZooKeeper.
    pub layout: Layout,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_addr: SocketAddr,
    /// This replica's name (the pod name), in events and the leader lock.
    pub identity: String,
    /// Reconcile only this namespace's resources (default: all namespaces).
    pub watch_namespace: Option<String>,
    /// How long a namespace's replaced credential keeps working after a
    /// rotation, for the participants' work in flight.
    pub rotation_grace: Duration,
    /// The admission webhook, when it is served.
    pub webhook: Option<webhook::WebhookOptions>,
    /// The `spec.timeout` of the Barriers made for labelled Jobs whose pod
    /// template does not say (`None`: no limit).
    pub run_barrier_timeout: Option<String>,
}

impl ControllerOptions {
    fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: crate::api::Namespaced,
    {
        match &self.watch_namespace {
            Some(namespace) => Api::namespaced(client.clone(), namespace),
            None => Api::all(client.clone()),
        }
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(options: ControllerOptions) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (check the kubeconfig or the service account)")?;
    let metrics = Arc::new(metrics::Metrics::default());
    metrics.set_install(client.default_namespace());
    let health = Arc::new(http::Health {
        metrics: metrics.clone(),
        ready: Default::default(),
        failing: Default::default(),
        webhook: std::sync::Mutex::new(
            options
                .webhook
                .as_ref()
                .map(|_| "the admission webhook does not serve yet".to_owned()),
        ),
        serves_admission: options.webhook.is_some(),
        zookeeper_reached: Default::default(),
    });
    let listener_addr = options.metrics_addr;
    // Bind before anything else, so a bad address fails at start.
    let probe = tokio::net::TcpListener::bind(listener_addr)
        .await
        .with_context(|| format!("cannot serve metrics on {listener_addr}"))?;
    drop(probe);
    // This replica's ZooKeeper session, for the credential handout (served
    // beside the webhook by every replica, leading or not) and `/doctor`.
    let (sessions, session_rx) = tokio::sync::watch::channel(None);
    let diagnostician = Arc::new(diagnosis::Diagnostician::new(
        options.zookeeper.clone(),
        options.layout.root(),
        options.webhook.as_ref().map(|w| {
            w.injection
                .session_timeout
                .unwrap_or(crate::zk::SessionOptions::DEFAULT_SESSION_TIMEOUT)
        }),
        session_rx.clone(),
        health.clone(),
    ));
    tokio::spawn({
        let health = health.clone();
        async move {
            if let Err(e) = http::serve(listener_addr, health, Some(diagnostician)).await {
                error!(error = %e, "the metrics server stopped");
            }
        }
    });
    let shutdown = CancellationToken::new();
    let mut stop = crate::agent::Termination::install()?;
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            stop.received().await;
            info!("asked to stop");
            shutdown.cancel();
        }
    });
    // Cancelled once the webhook no longer serves (at once without one):
    // asked to stop, a replica serves admission and the handout (which
    // reads ZooKeeper) until it has left the webhook's Service
    // (`webhook::drain`), so its session and the process outlive that.
    let webhook_stopped = CancellationToken::new();
    match options.webhook.clone() {
        Some(webhook) => {
            tokio::spawn({
                let (client, health) = (client.clone(), health.clone());
                let (shutdown, stopped) = (shutdown.clone(), webhook_stopped.clone());
                async move {
                    let _stopped = stopped.drop_guard();
                    serve_webhook(webhook, client, health, session_rx, shutdown).await;
                }
            });
        }
        None => webhook_stopped.cancel(),
    }
    let webhook_served = || async {
        let _ = tokio::time::timeout(WEBHOOK_STOP_LIMIT, webhook_stopped.cancelled()).await;
    };

    // The ZooKeeper client's connection (its pings, its replies, its watch
    // events) runs on a thread of its own: a burst of reconciles must not
    // delay a ping until the server or the client declares the session dead.
    let zookeeper_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("zookeeper")
        .enable_all()
        .build()
        .context("cannot start the ZooKeeper client's thread")?;
    // Once a start: a release that leaks other namespaces' node names to
    // any tenant's watch is said in the log (the doctor says it too).
    zookeeper_runtime.spawn({
        let servers = options.zookeeper.connect.servers().to_vec();
        async move { crate::zk::probe::warn_of_path_leaks(&servers).await }
    });
    let mut retry = TermBackoff::default();
    while !shutdown.is_cancelled() {
        let started = tokio::time::Instant::now();
        let connect = zookeeper_runtime.spawn({
            let options = options.zookeeper.clone();
            async move { Session::connect(&options).await }
        });
        let term = match tokio::select! {
            s = connect => s.context("the ZooKeeper client's thread stopped")?,
            () = shutdown.cancelled() => break,
        } {
            Err(e) => Err(anyhow::Error::from(e).context("cannot reach ZooKeeper")),
            Ok(session) => {
                let session = Arc::new(session);
                let readiness = tokio::spawn(follow_session(session.watch_state(), health.clone()));
                health
                    .ready
                    .store(session.state() == SessionState::Connected, Ordering::SeqCst);
                health.zookeeper_reached.store(true, Ordering::SeqCst);
                metrics.set_session_connected(true);
                sessions.send_replace(Some(session.clone()));
                // A refused root keeps the last term's failure in /readyz.
                let outcome = match claim(&client, &session, &options).await {
                    Ok(scope) => {
                        health.set_failing(None);
                        lead(&client, &session, &options, &scope, &metrics, &shutdown).await
                    }
                    Err(e) => Err(e),
                };
                metrics.set_leader(false);
                if shutdown.is_cancelled() {
                    webhook_served().await;
                }
                sessions.send_replace(None);
                readiness.abort();
                health.ready.store(false, Ordering::SeqCst);
                metrics.set_session_connected(false);
                if let Ok(session) = Arc::try_unwrap(session) {
                    let _ = session.close().await;
                }
                outcome
            }
        };
        let Err(e) = term else { continue };
        // A term that fails fast (an ensemble too old for the controller,
        // a root it may not touch) would otherwise be retried at once,
        // forever: back off, and say why, once per attempt.
        let wait = retry.after(started.elapsed());
        metrics.term_failed();
        warn!(error = format!("{e:#}"), retry_in = ?wait, attempt = retry.attempt, "the controller's ZooKeeper term failed; retrying");
        health.set_failing(Some(format!(
            "the last attempt failed ({e:#}); retrying in {}",
            humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
        )));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => break,
        }
    }
    webhook_served().await;
    zookeeper_runtime.shutdown_background();
    info!("stopped");
    Ok(())
}

/// The longest a stopping replica waits for its webhook to stop serving:
/// leaving the Service, then the calls in flight.
const WEBHOOK_STOP_LIMIT: Duration = webhook::drain::DRAIN_LIMIT
    .saturating_add(webhook::drain::SETTLE)
    .saturating_add(Duration::from_secs(6));

/// Serves the admission webhook on every replica (it needs no leadership),
/// retrying with backoff what fails (a certificate Secret it may not write
/// yet, an address in use), until shutdown.
async fn serve_webhook(
    options: webhook::WebhookOptions,
    client: kube::Client,
    health: Arc<http::Health>,
    session: tokio::sync::watch::Receiver<Option<Arc<Session>>>,
    shutdown: CancellationToken,
) {
    let mut retry = TermBackoff::default();
    while !shutdown.is_cancelled() {
        let started = std::time::Instant::now();
        let result = webhook::run(
            options.clone(),
            client.clone(),
            health.clone(),
            session.clone(),
            credentials::current_for_handout,
            shutdown.clone(),
        )
        .await;
        if shutdown.is_cancelled() {
            return;
        }
        let wait = retry.after(started.elapsed());
        let why = result
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_else(|| "it stopped".into());
        health.set_webhook(Some(format!("the admission webhook does not serve: {why}")));
        error!(error = why, retry_in = ?wait, "the admission webhook is not serving; retrying");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// How long to wait before the next term after one failed: exponential
/// from 0.2 s to 60 s with jitter; back to the start after a term that ran
/// for a while.
#[derive(Debug, Default)]
struct TermBackoff {
    /// Failed terms in a row.
    attempt: u32,
}

impl TermBackoff {
    const WAITS: backoff::Backoff =
        backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(60));
    /// A term that lasted this long was healthy: its failure starts afresh.
    const HEALTHY: Duration = Duration::from_secs(60);

    fn after(&mut self, lasted: Duration) -> Duration {
        if lasted >= Self::HEALTHY {
            self.attempt = 0;
        }
        let wait = Self::WAITS.wait(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        wait
    }
}

/// Keeps `/readyz` in step with the session.
async fn follow_session(mut states: crate::zk::StateWatcher, health: Arc<http::Health>) {
    loop {
        let state = states.changed().await;
        let connected = state == SessionState::Connected;
        health.ready.store(connected, Ordering::SeqCst);
        health.metrics.set_session_connected(connected);
        if state.is_terminal() {
            return;
        }
    }
}

/// Claims the root for this cluster and records this install's scope
/// there (see [`install`]), before anything else is written to it.
async fn claim(
    client: &kube::Client,
    session: &Session,
    options: &ControllerOptions,
) -> anyhow::Result<install::Scope> {
    let scope = install::Scope::of(options.watch_namespace.as_deref());
    let cluster = install::cluster_identity(client).await?;
    install::claim_root(session, &options.layout, &cluster, &scope).await?;
    Ok(scope)
}

/// Waits for leadership of `scope`, then reconciles until leadership is
/// lost (an error) or shutdown (`Ok`).
async fn lead(
    client: &kube::Client,
    session: &Arc<Session>,
    options: &ControllerOptions,
    scope: &install::Scope,
    metrics: &Arc<metrics::Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let leader_path = scope.leader_path(&options.layout);
    let who = serde_json::to_vec(&crate::zk::ParticipantData {
        id: Some(options.identity.clone()),
        pod: Some(options.identity.clone()),
        ..Default::default()
    })?;
    let lock = Mutex::new(
        &leader_path,
        LockOptions {
            data: who,
            persistent: false,
            create_parent: true,
            check: None,
        },
    );
    info!(lock = %leader_path, "waiting to lead");
    let hold = tokio::select! {
        hold = lock.acquire(session, None) => hold?,
        () = shutdown.cancelled() => return Ok(()),
    };
    if let Some(refused) = install::overlapping_leader(session, &options.layout, scope).await? {
        let _ = hold.release().await;
        return Err(refused.into());
    }
    metrics.set_leader(true);
    info!(identity = %options.identity, "leading: reconciling Barriers and LockLeases");

    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: Some(options.identity.clone()),
    };
    if options.zookeeper.credential.is_some() {
        protect_root(session, &options.layout).await?;
    }
    let (barrier_pod_cache, barrier_pods) = pods::watch(options.api(client), BARRIER_LABEL);
    let (lock_pod_cache, lock_pods) = pods::watch(options.api(client), LOCK_LABEL);
    let (jobs, job_changes) = jobs::Jobs::watch(options.api(client));
    // The namespaces (metadata only), whose credentials go with them: only
    // with a controller credential (the chart grants the watch then).
    let (namespaces, namespace_writer) = kube::runtime::reflector::store();
    let namespace_events = options.zookeeper.credential.is_some().then(|| {
        use kube::runtime::WatchStreamExt;
        let config = match &options.watch_namespace {
            Some(scope) => watcher::Config::default().fields(&format!("metadata.name={scope}")),
            None => watcher::Config::default(),
        };
        watcher(
            Api::<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>::all(
                client.clone(),
            ),
            config,
        )
        .default_backoff()
        .reflect(namespace_writer)
    });
    // A Barrier's reconcile asks for a look at those waiting on it.
    let (after_tx, after_rx) = unbounded_channel();
    let ctx = Arc::new(Context {
        after: waits::Waits::new(after_tx),
        client: client.clone(),
        zk: session.clone(),
        layout: options.layout.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        metrics: metrics.clone(),
        credentials: credentials::Credentials::new(
            options.zookeeper.credential.clone(),
            options.rotation_grace,
            namespaces,
            options.watch_namespace.clone(),
        ),
        failures: Default::default(),
        barrier_status: Default::default(),
        lock_status: Default::default(),
        pods: pods::Pods {
            client: client.clone(),
            caches: vec![barrier_pod_cache, lock_pod_cache],
            metrics: metrics.clone(),
        },
        jobs,
        leader_node: hold.path().to_owned(),
    });
    // A Job's change reconciles the Barriers it sizes; a labelled Job's
    // change or end plans its Barrier (admission makes nothing: see
    // webhook; the plans are carried out by `runs::keep`, off this stream).
    let (touches, touched) = unbounded_channel();
    let job_followers = job_changes
        .filter_map({
            let ctx = ctx.clone();
            move |event| {
                let (ctx, touches) = (ctx.clone(), touches.clone());
                async move {
                    match event.ok()? {
                        watcher::Event::Apply(job) | watcher::Event::InitApply(job) => {
                            if let Some(touch) = runs::Touch::of(&job) {
                                let _ = touches.send(touch);
                            }
                            Some(futures::stream::iter(ctx.jobs.followers(&job)))
                        }
                        watcher::Event::Delete(job) => {
                            if let Some(touch) = runs::Touch::of(&job) {
                                let _ = touches.send(touch);
                            }
                            None
                        }
                        watcher::Event::InitDone => {
                            let _ = touches.send(runs::Touch::All);
                            None
                        }
                        watcher::Event::Init => None,
                    }
                }
            }
        })
        .flatten();
    let keep_runs = runs::keep(
        client.clone(),
        options.api(client),
        ctx.jobs.store().clone(),
        touched,
        options.run_barrier_timeout.clone(),
    );
    // Stops the controllers gracefully; cancelled only by the shutdown branch
    // below, so that branch (not "the controllers stopped") decides the outcome.
    let stop = CancellationToken::new();
    let (barrier_tx, barrier_rx) = unbounded_channel();
    let (lock_tx, lock_rx) = unbounded_channel();
    let (all_barriers_tx, all_barriers_rx) = unbounded_channel();
    let (all_locks_tx, all_locks_rx) = unbounded_channel();
    let barriers = controller::<Barrier>(
        options.api(client),
        (barrier_pods, BARRIER_LABEL, {
            let ctx = ctx.clone();
            move |namespace: &str, name: &str| ctx.after.dependents(namespace, name)
        }),
        (barrier_rx, all_barriers_rx),
        futures::stream::select(job_followers, UnboundedReceiverStream::new(after_rx)),
        &stop,
        ctx.clone(),
    );
    let locks = controller::<LockLease>(
        options.api(client),
        (lock_pods, LOCK_LABEL, |_: &str, _: &str| Vec::new()),
        (lock_rx, all_locks_rx),
        futures::stream::empty(),
        &stop,
        ctx.clone(),
    );
    let triggers = zkevents::Triggers {
        barriers: barrier_tx,
        locks: lock_tx,
        all_barriers: all_barriers_tx,
        all_locks: all_locks_tx,
        interval: ZOOKEEPER_TRIGGER_INTERVAL,
    };
    let follow = zkevents::follow(session, &options.layout, triggers);
    let follow_namespaces = {
        let ctx = ctx.clone();
        async move {
            match namespace_events {
                Some(events) => ctx.credentials.follow(events, &ctx.zk, &ctx.layout).await,
                None => std::future::pending().await,
            }
        }
    };

    // The controllers live in this block: leaving it drops them (and their
    // reconciles) before leadership is given up.
    let outcome = {
        let controllers = async move { tokio::join!(barriers, locks) };
        tokio::pin!(controllers);
        tokio::select! {
            reason = hold.lost() => Err(anyhow::anyhow!("lost leadership: {reason}")),
            () = follow_namespaces => Err(anyhow::anyhow!("stopped following the namespaces")),
            () = keep_runs => Err(anyhow::anyhow!("stopped keeping the labelled Jobs' Barriers")),
            result = follow => Err(anyhow::anyhow!("stopped following ZooKeeper: {}", result.err().map(|e| e.to_string()).unwrap_or_default())),
            _ = &mut controllers => Err(anyhow::anyhow!("the controllers stopped")),
            () = shutdown.cancelled() => {
                // Let running reconciles finish, within reason.
                stop.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut controllers).await;
                Ok(())
            }
        }
    };
    stop.cancel();
    if outcome.is_ok() {
        let _ = hold.release().await;
    }
    drop(ctx);
    outcome
}

/// Reconciles at most this many objects of one kind at once: a reconnect
/// or a restart looks at every resource, and without a bound those looks
/// would all go out at once (measured with 1,000 Barriers changing 200 times
/// a second: unbounded, the API server fell 20 s behind and the controller
/// grew to 91 MiB; 16 left throughput unused while reconciles waited on the
/// API server; 64 kept status p50 at 0.4 s and 32 MiB).
const CONCURRENCY: u16 = 64;
/// Triggers for one object within this window make one reconcile: a gang
/// arriving at once is one status write, not one per participant.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// A resource whose nodes change without pause is reconciled this often;
/// longer than [`DEBOUNCE`], which would put it off for ever otherwise.
const ZOOKEEPER_TRIGGER_INTERVAL: Duration = Duration::from_millis(250);
const _: () = assert!(ZOOKEEPER_TRIGGER_INTERVAL.as_millis() > DEBOUNCE.as_millis());

/// The controller of kind `K`: its resources (stripped of managed fields)
/// and its labelled pods (`pods`: their own resource's, and the
/// `dependents` of it) trigger reconciles, and so do the
/// ZooKeeper events (`triggers`: one object, every object), and `related`:
/// objects another resource's change concerns (the Barriers a Job sizes).
fn controller<K: reconciler::Reconciled>(
    resources: Api<K>,
    (pods, label, dependents): (
        impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static,
        &'static str,
        impl Fn(&str, &str) -> Vec<ObjectRef<K>> + Send + Sync + 'static,
    ),
    triggers: (
        tokio::sync::mpsc::UnboundedReceiver<ObjectRef<K>>,
        tokio::sync::mpsc::UnboundedReceiver<()>,
    ),
    related: impl futures::Stream<Item = ObjectRef<K>> + Send + 'static,
    stop: &CancellationToken,
    ctx: Arc<Context>,
) -> impl std::future::Future<Output = ()> {
    use kube::runtime::{reflector, WatchStreamExt};
    let (reader, writer) = reflector::store();
    // Only the changes worth a reconcile (see `worth`): a new resource is
    // reconciled once, not once more for each of the controller's own
    // writes. The store still holds every version.
    let mut worth = worth::Worth::default();
    let memory = ctx.clone();
    let own = move |object: &K| {
        object
            .uid()
            .is_some_and(|uid| K::memory(&memory).is_written(&uid, object.status()))
    };
    let resources = watcher(resources, watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer)
        .filter_map(move |event| {
            futures::future::ready(match event {
                Ok(event) => worth.event(event, &own).map(Ok),
                Err(e) => Some(Err(e)),
            })
        });
    let kind = K::kind(&());
    Controller::for_stream(resources, reader)
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(CONCURRENCY)
                .debounce(DEBOUNCE),
        )
        .watches_stream(pods, move |pod| {
            let (Some(namespace), Some(name)) = (pod.namespace(), pod.labels().get(label)) else {
                return Vec::new();
            };
            let mut concerned = vec![ObjectRef::<K>::new(name).within(&namespace)];
            // Its readiness concerns those that start after its own.
            concerned.extend(dependents(&namespace, name));
            concerned
        })
        .reconcile_on(futures::stream::select(
            UnboundedReceiverStream::new(triggers.0),
            related,
        ))
        .reconcile_all_on(UnboundedReceiverStream::new(triggers.1))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconciler::reconcile::<K>, error_policy, ctx)
        .for_each(move |result| {
            let kind = kind.clone();
            async move { log_result(&kind, result) }
        })
}

/// With a controller credential, `<root>`, `<root>/namespaces`,
/// `<root>/credentials` and the leader locks' nodes are the controller's
/// alone (participants need nothing on them: ACLs are checked per node, not
/// along the path), whatever they were before: zkgate may have run with
/// ACLs off (every node open) and a tenant planted something meanwhile.
/// A root of `/` is left as it is.
async fn protect_root(session: &Session, layout: &Layout) -> anyhow::Result<()> {
    if layout.root() == "/" {
        return Ok(());
    }
    let own = session.node_acls().to_vec();
    let credentials = layout.child("credentials");
    let paths = vec![
        layout.root().to_owned(),
        layout.namespaces_root(),
        credentials,
    ];
    let client = session.client();
    let root_children = session
        .retry("list", layout.root(), || {
            client.list_children(layout.root())
        })
        .await
        .with_context(|| format!("cannot list {}", layout.root()))?;
    let leaders: Vec<String> = root_children
        .into_iter()
        .filter(|c| c == "leader" || c.starts_with("leader-"))
        .map(|c| layout.child(&c))
        .collect();
    for path in paths {
        let client = session.client();
        let options = zookeeper_client::CreateMode::Persistent.with_acls((&own[..]).into());
        match client.mkdir(&path, &options).await {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => anyhow::bail!("cannot create {path}: {e}"),
        }
        crate::zk::acl_change::ensure(session, &path, &own)
            .await
            .with_context(|| format!("cannot set the ACL of {path}"))?;
    }
    // The leader locks' nodes (this scope's and other installs'): one that
    // shuts the controller out (planted while ACLs were off) is said, not
    // a reason to stop leading.
    for path in leaders {
        match crate::zk::acl_change::ensure(session, &path, &own).await {
            Ok(_) => {}
            Err(crate::zk::ZkError::NotAuthorized { .. }) => {
                warn!(node = %path, "a leader lock node shuts the controller out (made so while ACLs were off?): its ACL stays as it is; a ZooKeeper superuser must fix it");
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("cannot set the ACL of {path}")))
            }
        }
    }
    Ok(())
}

/// Retries a failed reconcile after a backoff of the object's own (1 s
/// doubling to 5 min, with jitter), saying which object failed and why.
fn error_policy<K: reconciler::Reconciled>(
    object: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    const WAITS: backoff::Backoff =
        backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
    let key = reconciler::key(object.as_ref());
    let attempt = ctx.failures.failed(&key);
    let wait = WAITS.wait(attempt);
    warn!(object = %key, %error, attempt = attempt + 1, retry_in = ?wait, "reconcile failed; retrying");
    Action::requeue(wait)
}

fn log_result<K: kube::Resource, E: std::fmt::Display, Q: std::fmt::Display>(
    kind: &str,
    result: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, Q>>,
) {
    match result {
        Ok((object, _)) => tracing::debug!(kind, object = %object, "reconciled"),
        Err(e) => tracing::debug!(kind, error = %e, "reconcile error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_terms_back_off_and_start_afresh_after_a_healthy_one() {
        let mut retry = TermBackoff::default();
        let quick = Duration::from_millis(10);
        let waits: Vec<Duration> = (0..12).map(|_| retry.after(quick)).collect();
        assert!(waits[0] <= Duration::from_millis(240));
        assert!(waits[11] >= Duration::from_secs(48), "{waits:?}");
        assert!(retry.after(TermBackoff::HEALTHY) <= Duration::from_millis(240));
    }
}
