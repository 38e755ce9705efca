//! `/metrics`, `/healthz` and `/readyz`, served beside the controller.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::metrics::Metrics;

/// What the endpoints report.
pub struct Health {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Ready: the ZooKeeper session is connected and the API server answers.
    pub ready: AtomicBool,
}

/// Serves the endpoints until the process ends.
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> std::io::Result<()> {
    let metrics = health.clone();
    let readiness = health.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.metrics.encode();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.ready.load(Ordering::SeqCst);
                async move {
                    if ready {
                        (StatusCode::OK, "ready").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "ZooKeeper not connected").into_response()
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
