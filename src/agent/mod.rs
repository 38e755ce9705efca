//! The participant commands: what a pod runs to take part in a Barrier or a
//! LockLease, as an init container, a native sidecar or a wrapper around
//! its command. They stand on the recipes of [`crate::zk`] and need no
//! Kubernetes API access.

pub mod barrier;
pub mod child;
pub mod exit;
pub mod guardian;
pub mod in_place;
pub mod lock;
mod procs;
pub mod ready;

use std::time::Duration;

use tokio::time::Instant;

use crate::layout::Layout;
use crate::zk::{Session, SessionOptions};

pub use exit::{AgentError, Exit};

/// How long each attempt of a participant waiting for ZooKeeper
/// (`--connect-timeout 0`) tries before the next.
/// Short, so that the first failure is said soon; long enough for a
/// handshake with a loaded server.
const REACH_ATTEMPT: Duration = Duration::from_secs(5);
/// How often a participant waiting for ZooKeeper says it still waits.
const UNREACHABLE_REPORT: Duration = Duration::from_secs(30);

/// Who takes part, and how to reach ZooKeeper: what every participant
/// command needs.
#[derive(Clone, Debug)]
pub struct Participant {
    /// How to connect.
    pub session: SessionOptions,
    /// Where resources live.
    pub layout: Layout,
    /// The resource's namespace.
    pub namespace: String,
    /// This participant's id (the pod name by default).
    pub id: String,
    /// The pod's name (`metadata.name`): the pod whose end the controller
    /// checks. Without it (and a persistent registration), the controller
    /// cannot tell when the pod ended and leaves the node alone.
    pub pod_name: Option<String>,
    /// The pod's uid: tells a restarted container of the same pod from a
    /// new pod with the same name.
    pub pod_uid: Option<String>,
    /// How long to wait to enter or acquire (and to leave).
    pub timeout: Option<Duration>,
}

impl Participant {
    /// The deadline for a wait that starts now.
    pub fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| Instant::now() + t)
    }

    /// The connect string, for messages.
    pub fn connect_string(&self) -> String {
        self.session.connect.to_string()
    }

    /// Connects, explaining a failure. With a credential, the nodes the
    /// session makes also grant READ to the namespace's other credential
    /// during a rotation's grace window (see [`Participant::readers`]).
    pub async fn connect(&self) -> Result<Session, AgentError> {
        let mut session = self.reach().await?;
        if self.session.credential.is_some() {
            let readers = self.readers(&session).await;
            session.grant_read(&readers);
        }
        Ok(session)
    }

    /// Reaches ZooKeeper: trying for `--connect-timeout`, or with 0 (what
    /// the webhook gives the containers it injects) for as long as it
    /// takes, within `--timeout` if one is given: a pod admitted while
    /// ZooKeeper is down (admission needs none) waits for it as it would
    /// wait at its barrier, saying so every [`UNREACHABLE_REPORT`], instead
    /// of failing its first attempt (which `restartPolicy: Never` makes
    /// the pod's end). A credential refused or a TLS handshake that fails
    /// is said at once: waiting mends neither.
    async fn reach(&self) -> Result<Session, AgentError> {
        if !self.session.connect_timeout.is_zero() {
            return Session::connect(&self.session)
                .await
                .map_err(|e| self.explain(e));
        }
        let deadline = self.deadline();
        let mut options = self.session.clone();
        options.connect_timeout = REACH_ATTEMPT;
        let since = Instant::now();
        let mut reported: Option<Instant> = None;
        loop {
            let attempt = match deadline {
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, Session::connect(&options)).await {
                        Ok(attempt) => attempt,
                        Err(_) => return Err(self.unreached(since)),
                    }
                }
                None => Session::connect(&options).await,
            };
            let why = match attempt {
                Err(e @ crate::zk::ZkError::Unreachable { .. }) => e,
                other => return other.map_err(|e| self.explain(e)),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.unreached(since));
            }
            // The cause too: a name that does not resolve (a typo in the
            // connect string) must not pass for an outage.
            if reported.is_none_or(|at| at.elapsed() >= UNREACHABLE_REPORT) {
                reported = Some(Instant::now());
                tracing::warn!(error = %why, waited = ?since.elapsed(), "ZooKeeper unreachable: waiting for it");
            }
        }
    }

    /// `--timeout` passed before ZooKeeper answered.
    fn unreached(&self, since: Instant) -> AgentError {
        AgentError::new(
            Exit::TimedOut,
            format!(
                "no ZooKeeper server of {} answered within --timeout ({} waited); nothing was registered",
                self.connect_string(),
                humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
            ),
        )
    }

    /// The digest ids the controller publishes in the namespace's node:
    /// whoever works in the namespace now, and so must be able to look at
    /// our nodes ([`crate::zk::acl::Readers`]). None when the node is not
    /// there or says nothing (ACLs off, an older controller), or cannot be
    /// read: a credential the namespace refuses is said by the command's
    /// first request, as before.
    async fn readers(&self, session: &Session) -> Vec<String> {
        let Ok(node) = self.layout.namespace(&self.namespace) else {
            return Vec::new();
        };
        match session.client().get_data(&node).await {
            Ok((data, _)) => crate::zk::acl::Readers::parse(&data).readers,
            Err(e) => {
                tracing::debug!(%node, error = %e, "no readers of the namespace's nodes to grant");
                Vec::new()
            }
        }
    }

    /// Turns a recipe error into the command's error.
    pub fn explain(&self, err: crate::zk::ZkError) -> AgentError {
        AgentError::from_zk(err, &self.connect_string())
    }

    /// The JSON written into our nodes: who we are.
    pub fn identity(&self) -> crate::zk::ParticipantData {
        crate::zk::ParticipantData {
            id: Some(self.id.clone()),
            pod: self.pod_name.clone(),
            pod_uid: self.pod_uid.clone(),
            ..Default::default()
        }
    }
}

/// Explains a timeout better when the resource's node was never created:
/// then nothing reconciled the resource, or it does not exist.
pub async fn explain_missing(
    participant: &Participant,
    session: &Session,
    path: &str,
    kind: &str,
    err: AgentError,
) -> AgentError {
    if err.exit != Exit::TimedOut {
        return err;
    }
    match session.client().check_stat(path).await {
        Ok(None) => AgentError::new(
            Exit::TimedOut,
            format!(
                "{err}; {path} was never created: is there a {kind} of that name in namespace {}, and is the controller running? (without a controller, see --help for how to create it)",
                participant.namespace
            ),
        ),
        _ => err,
    }
}

/// Closes the session, logging (not failing on) a problem: the command's
/// outcome is already decided.
pub async fn close(session: Session) {
    if let Err(e) = session.close().await {
        tracing::debug!(error = %e, "closing the session");
    }
}

/// SIGTERM and SIGINT (and the other signals `run` passes on to its
/// command), caught from the start of a command: as PID 1 of a container
/// a process gets no default handlers, so without ours SIGTERM would be
/// ignored and the pod would wait for its grace period to end in SIGKILL,
/// leaving a persistent registration behind. One set of handlers serves
/// the whole command, so a signal that arrives between two of its phases
/// (acquired, but the command not started yet) waits for the next phase
/// rather than being lost.
pub struct Termination {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    /// SIGTERM or SIGINT has come (the first one's exit code).
    asked_to_stop: Option<Exit>,
}

impl Termination {
    /// Installs the handlers. Call it before the first wait.
    pub fn install() -> Result<Self, AgentError> {
        use tokio::signal::unix::{signal, SignalKind};
        let handle = |kind| {
            signal(kind)
                .map_err(|e| AgentError::new(Exit::Internal, format!("cannot handle signals: {e}")))
        };
        Ok(Termination {
            term: handle(SignalKind::terminate())?,
            int: handle(SignalKind::interrupt())?,
            hup: handle(SignalKind::hangup())?,
            quit: handle(SignalKind::quit())?,
            usr1: handle(SignalKind::user_defined1())?,
            usr2: handle(SignalKind::user_defined2())?,
            asked_to_stop: None,
        })
    }

    /// Resolves when SIGTERM or SIGINT arrives, with the exit code that
    /// reports it.
    pub async fn received(&mut self) -> Exit {
        let exit = tokio::select! {
            _ = self.term.recv() => Exit::Terminated,
            _ = self.int.recv() => Exit::Interrupted,
        };
        self.asked_to_stop.get_or_insert(exit);
        exit
    }

    /// Whether SIGTERM or SIGINT has come (passed on to a command, or
    /// taken by [`Termination::received`]): the exit code of the first.
    pub fn asked_to_stop(&self) -> Option<Exit> {
        self.asked_to_stop
    }

    /// Resolves with the next of the signals a supervised command gets
    /// passed on: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2.
    pub async fn any(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        let signal = tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
            _ = self.usr1.recv() => Signal::SIGUSR1,
            _ = self.usr2.recv() => Signal::SIGUSR2,
        };
        match signal {
            Signal::SIGTERM => _ = self.asked_to_stop.get_or_insert(Exit::Terminated),
            Signal::SIGINT => _ = self.asked_to_stop.get_or_insert(Exit::Interrupted),
            _ => {}
        }
        signal
    }

    /// Runs `work` unless a signal comes first. Then `work` is dropped,
    /// which removes the node it was registering (the recipes' guards), and
    /// the error says what stopped and what was removed.
    pub async fn unless_stopped<T>(
        &mut self,
        what: &str,
        work: impl std::future::Future<Output = Result<T, AgentError>>,
    ) -> Result<T, AgentError> {
        tokio::select! {
            result = work => result,
            exit = self.received() => {
                let signal = exit.signal_name();
                tracing::info!(signal, "stopping: removing any registration of ours");
                Err(AgentError::new(
                    exit,
                    format!("stopped by {signal} while {what}; any registration of ours was removed"),
                ))
            }
        }
    }
}
