//! How a sidecar tells Kubernetes it is ready: a file (for an `exec` probe
//! running `zkgate probe`, or for the main container to read) and, when
//! asked, an HTTP endpoint (`GET /readyz`) for an `httpGet` probe.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use tracing::{debug, info, warn};

use super::exit::{AgentError, Exit};

/// Where readiness is published.
#[derive(Clone, Debug, Default)]
pub struct ReadinessOptions {
    /// The file made once ready and removed on the way out.
    pub file: Option<PathBuf>,
    /// Serve `GET /readyz` (200 once ready, 503 before) and `GET /healthz`.
    pub probe_addr: Option<SocketAddr>,
}

/// Published readiness; cleared when dropped.
pub struct Readiness {
    file: Option<PathBuf>,
    ready: Arc<AtomicBool>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Readiness {
    /// Starts the probe endpoint (not ready yet).
    pub async fn start(options: &ReadinessOptions) -> Result<Readiness, AgentError> {
        let ready = Arc::new(AtomicBool::new(false));
        if let Some(file) = &options.file {
            // A file left by an earlier run must not claim readiness.
            remove(file);
        }
        let server = match options.probe_addr {
            None => None,
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    AgentError::usage(format!(
                        "cannot serve the probe on {addr}: {e} (check --probe-addr)"
                    ))
                })?;
                let flag = ready.clone();
                let app = axum::Router::new()
                    .route("/healthz", get(|| async { "ok" }))
                    .route(
                        "/readyz",
                        get(move || {
                            let ready = flag.load(Ordering::SeqCst);
                            async move {
                                if ready {
                                    (StatusCode::OK, "ready")
                                } else {
                                    (StatusCode::SERVICE_UNAVAILABLE, "waiting")
                                }
                            }
                        }),
                    );
                info!(%addr, "serving the readiness probe");
                Some(tokio::spawn(async move {
                    if let Err(e) = axum::serve(listener, app).await {
                        warn!(error = %e, "the probe server stopped");
                    }
                }))
            }
        };
        Ok(Readiness {
            file: options.file.clone(),
            ready,
            server,
        })
    }

    /// Reports ready.
    pub fn set_ready(&self) -> Result<(), AgentError> {
        if let Some(file) = &self.file {
            write_atomically(file, "ready\n")?;
        }
        self.ready.store(true, Ordering::SeqCst);
        debug!("reported ready");
        Ok(())
    }

    /// Reports not ready.
    pub fn clear(&self) {
        self.ready.store(false, Ordering::SeqCst);
        if let Some(file) = &self.file {
            remove(file);
        }
    }
}

impl Drop for Readiness {
    fn drop(&mut self) {
        self.clear();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// Writes `contents` to `path` by renaming a temporary file into place, so
/// a reader never sees half a file. Makes the directory when missing.
///
/// The rename replaces whatever is at `path`, so a `path` that exists and
/// is not a regular file (a device such as `/dev/null`, a pipe, a
/// directory) is refused: as root, the rename would replace the device
/// for the whole machine.
pub fn write_atomically(path: &Path, contents: &str) -> Result<(), AgentError> {
    let failed = |e: std::io::Error| {
        AgentError::new(
            Exit::Internal,
            format!(
                "cannot write {}: {e} (is the directory a writable volume?)",
                path.display()
            ),
        )
    };
    refuse_special(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    // Named after the whole file name: files beside each other (the token,
    // its trust, its grace) never share a temporary file.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, contents).map_err(failed)?;
    std::fs::rename(&tmp, path).map_err(failed)
}

/// Refuses a `path` that exists and is not a regular file (a symbolic
/// link to one is fine): what a command checks before it registers
/// anything, for every file it will publish.
pub fn refuse_special(path: &Path) -> Result<(), AgentError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(AgentError::usage(format!(
            "{} exists and is not a regular file: zkgate replaces and removes the files it publishes, so give it a path of its own (not a device such as /dev/null, a pipe or a directory)",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Removes a file we published; a missing file is fine, and anything but
/// a regular file (or a link) is left alone.
pub fn remove(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.is_file() && !meta.file_type().is_symlink() {
            warn!(path = %path.display(), "not removing: not a regular file");
            return;
        }
    }
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            warn!(path = %path.display(), error = %e, "could not remove");
        }
    }
}
