//! zkgate: coordinate batch workloads on Kubernetes through ZooKeeper.
//!
//! - [`zk`]: ZooKeeper sessions and recipes (double barrier, locks), with no
//!   Kubernetes types.
#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod cli;
pub mod controller;
pub mod layout;
pub mod zk;
