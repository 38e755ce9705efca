//! What a replica's `/healthz` and `/readyz` report, shared by the
//! controller's reconcilers (the ZooKeeper side) and admission (the
//! webhook's side).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::metrics::Metrics;

/// What the endpoints report.
pub struct Health {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The ZooKeeper session is connected.
    pub ready: AtomicBool,
    /// Why the last leadership term failed, while the controller waits to
    /// try again (see `controller::run`).
    pub failing: Mutex<Option<String>>,
    /// With the admission webhook: why it does not serve yet (a replica
    /// that cannot answer admission must not receive it).
    pub webhook: Mutex<Option<String>>,
    /// Whether this replica serves admission: then its readiness is the
    /// webhook's, once ZooKeeper was reached (see [`Health::readiness`]).
    pub serves_admission: bool,
    /// Whether this replica has had a ZooKeeper session since it started.
    pub zookeeper_reached: AtomicBool,
}

impl Health {
    /// What `/readyz` answers, `Ok` with what to say. A replica that
    /// serves admission is ready while its webhook serves, whatever
    /// ZooKeeper does now: admission writes nothing there, and its
    /// readiness decides whether the webhook's Service has an endpoint, so
    /// tying it to ZooKeeper would refuse every labelled pod in the cluster
    /// while ZooKeeper is down (the pods admitted meanwhile wait at their
    /// barrier). But only once it has reached ZooKeeper since it started:
    /// a replica that never has may be misconfigured (a wrong connect
    /// string, credential or certificate), and a rolling update must not
    /// replace working replicas with it. Without the webhook: ready while
    /// the ZooKeeper session is connected and no failed leadership term is
    /// waiting to be retried.
    pub fn readiness(&self) -> Result<String, String> {
        if let Some(cause) = self
            .webhook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(cause);
        }
        let zookeeper = self.zookeeper();
        if self.serves_admission && self.zookeeper_reached.load(Ordering::SeqCst) {
            return Ok(match zookeeper {
                Ok(()) => "ready".to_owned(),
                Err(cause) => {
                    format!("ready to serve admission; {cause}: reconciling waits for it")
                }
            });
        }
        zookeeper.map(|()| "ready".to_owned())
    }

    /// Whether the ZooKeeper side is well: a connected session, and no
    /// failed term waiting to be retried.
    fn zookeeper(&self) -> Result<(), String> {
        if let Some(cause) = self
            .failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(cause);
        }
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("ZooKeeper not connected".into())
        }
    }

    /// Records why the webhook does not serve (`None`: it serves).
    pub fn set_webhook(&self, cause: Option<String>) {
        *self.webhook.lock().unwrap_or_else(|e| e.into_inner()) = cause;
    }

    /// Why the last term failed, while a retry waits.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records a failed leadership term (`None`: a term is running).
    pub fn set_failing(&self, cause: Option<String>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = cause;
    }
}
