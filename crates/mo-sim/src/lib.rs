//! A deterministic discrete-event simulator of a MatrixOne cluster running on Kubernetes.
//!
//! Single-threaded, virtual time, one seeded RNG: the same scenario and seed give a
//! byte-identical event log. Operator behaviours plug in through [`mo_core::Policy`].

pub mod attached;
pub mod campaign;
pub mod duration;
pub mod plan;
pub mod policy;
pub mod report;
pub mod scenario;
pub mod timings;
mod world;

pub use report::{Report, Trace, TraceEvent, TxnCounts, UnsafeActions, UpgradeReport};
pub use scenario::{Scenario, ScenarioError};
pub use timings::Timings;
pub use world::{Audit, OutcomeKind, RunOptions, Simulation};
