//! The Kubernetes side of the MatrixOne operator. The decision core decides; this crate
//! observes the cluster through the API server and the kernel's own RPC (`kernel`), persists the
//! core's progress record, and carries out its actions.

pub mod cache;
pub mod controller;
pub mod crd;
pub mod disruption;
pub mod events;
pub mod hook_auth;
pub mod kernel;
pub mod kernel_config;
pub mod leader;
pub mod metrics;
pub mod observation;
pub mod problems;
pub mod protection;
pub mod resources;
pub mod secrets;
pub mod status;
pub mod validation;
pub mod webhook;
