//! zkgate: coordinate batch workloads on Kubernetes through ZooKeeper.
//!
//! - [`zk`]: ZooKeeper sessions and recipes (double barrier, locks), with no
//!   Kubernetes types.
#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod cli;
pub mod controller;
pub mod handout;
pub mod layout;
pub mod plugin;
pub mod zk;

/// Makes ring the process's rustls crypto provider (idempotent). Both the
/// Kubernetes client and ZooKeeper's TLS link rustls, with different
/// providers compiled in, and rustls then refuses to pick one itself: call
/// this before making either kind of client.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
