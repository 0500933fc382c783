//! The decision core of the MatrixOne operator.
//!
//! Everything here is pure: time, observations and results of earlier actions are inputs;
//! actions and notes are outputs. The simulator, the Kubernetes adapter and tests drive the
//! same code through [`policy::Policy`].

pub mod action;
pub mod component;
pub mod drain;
pub mod gates;
pub mod generation;
pub mod observe;
pub mod policy;
pub mod rollout;
pub mod safe;
pub mod strategy;
pub mod time;

pub use action::{Action, ActionError, ActionOutput, ActionResult, Decision, PolicyNote};
pub use component::Component;
pub use observe::{
    AllocatorView, ClusterDetails, CnActivity, CnStoreView, DesiredState, DrainAnswer,
    EvictionRequest, HeartbeatIntervals, KernelView, LogReplicaView, LogShardView, Observation,
    ObservationError, OldestTxn, PodObservation, PodPhase, PoolPhase, RemovalReason,
    RemovalRequest, RestartAnswer, TnStoreView, UpgradeSpec, WorkState,
};
pub use policy::{EvictionVerdict, Policy, PolicyInput};
pub use rollout::{MaxUnavailable, OnStall};
pub use safe::{ProgressRecord, SafeConfig, SafePolicy};
pub use strategy::{Strategy, StrategyError};
pub use time::Millis;
