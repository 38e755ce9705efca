//! zkgate: coordinate batch workloads on Kubernetes through ZooKeeper.
//!
//! - [`zk`]: ZooKeeper sessions and recipes (double barrier, locks), with no
//!   Kubernetes types.
#![warn(missing_docs)]

#[cfg(feature = "operator")]
pub mod agent;
#[cfg(feature = "operator")]
pub mod api;
#[cfg(feature = "operator")]
pub mod cli;
#[cfg(feature = "operator")]
pub mod controller;
#[cfg(feature = "operator")]
pub mod handout;
#[cfg(feature = "operator")]
pub mod layout;
#[cfg(feature = "operator")]
pub mod plugin;
#[cfg(feature = "operator")]
pub mod serve;
#[cfg(feature = "operator")]
pub mod webhook;
#[cfg(feature = "operator")]
pub mod workload;
pub mod zk;

/// Makes ring the process's rustls crypto provider (idempotent). Both the
/// Kubernetes client and ZooKeeper's TLS link rustls, with different
/// providers compiled in, and rustls then refuses to pick one itself: call
/// this before making either kind of client.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
