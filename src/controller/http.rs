//! `/metrics`, `/healthz` and `/readyz`, served beside the controller.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub use crate::serve::health::Health;

use super::diagnosis::Diagnostician;

/// Serves the endpoints until the process ends: `/doctor` too, with a
/// diagnostician (see [`super::diagnosis`]).
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    diagnostician: Option<Arc<Diagnostician>>,
) -> std::io::Result<()> {
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
                let readiness = readiness.readiness();
                async move {
                    match readiness {
                        Ok(said) => (StatusCode::OK, said).into_response(),
                        Err(cause) => (StatusCode::SERVICE_UNAVAILABLE, cause).into_response(),
                    }
                }
            }),
        );
    let app = match diagnostician {
        Some(doctor) => app.route(
            "/doctor",
            get(move || {
                let doctor = doctor.clone();
                async move { axum::Json(doctor.diagnosis().await) }
            }),
        ),
        None => app,
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
