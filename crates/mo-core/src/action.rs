//! What a policy asks for, and how the world answered.

use crate::component::Component;
use crate::observe::WorkState;
use crate::time::Millis;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// `PatchCNStore` / `UpdateCNWorkState`.
    SetCnWorkState {
        uuid: String,
        state: WorkState,
    },
    /// Today's restart handshake on the TN lock allocator (names a UUID, not an instance).
    SetRestartService {
        uuid: String,
    },
    /// `DeleteCNStore`.
    DeleteCnStore {
        uuid: String,
    },
    /// Graceful delete of a pod, guarded by its UID (a recreated pod is never deleted by mistake).
    DeletePod {
        pod: String,
        uid: String,
        reason: String,
    },
    /// Set the pod's version in its workload and delete it; the workload recreates it.
    RestartPod {
        pod: String,
        uid: String,
        version: String,
    },
    /// Put a proxy pod in or out of its Service (a pod label the Service selects on): out, no
    /// new client connection reaches it; the ones it has stay until their clients close them.
    SetProxyServing {
        pod: String,
        uid: String,
        serving: bool,
    },
    /// Pull an image onto a node ahead of the restart that needs it.
    PrePullImage {
        node: String,
        version: String,
    },
    /// Move a LOG shard's leadership to another (caught-up) replica.
    TransferLogLeader {
        shard_id: u64,
        to_store: String,
    },
    /// Widen (or, with `None`, restore) the TN's total WAL-append tolerance.
    SetTnWalTolerance {
        total: Option<Millis>,
    },
    /// Instance-bound drain (the protocol the incident reports ask the kernel for).
    /// Answers a drain id ([`ActionOutput::DrainId`]).
    BeginDrain {
        uuid: String,
        start_epoch: u64,
    },
    CancelDrain {
        drain_id: u64,
    },
}

impl Action {
    /// The pod or CN the action is about, for logs.
    pub fn subject(&self) -> &str {
        match self {
            Action::SetCnWorkState { uuid, .. }
            | Action::SetRestartService { uuid }
            | Action::DeleteCnStore { uuid } => uuid,
            Action::DeletePod { pod, .. }
            | Action::RestartPod { pod, .. }
            | Action::SetProxyServing { pod, .. } => pod,
            Action::PrePullImage { node, .. } => node,
            Action::TransferLogLeader { to_store, .. } => to_store,
            Action::SetTnWalTolerance { .. } | Action::CancelDrain { .. } => "tn",
            Action::BeginDrain { uuid, .. } => uuid,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum ActionError {
    #[error("does not exist: {0}")]
    DoesNotExist(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("timed out: {0}")]
    Timeout(String),
    /// The object is not the instance the action named (UID precondition failed).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The kernel does not offer this call.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// What a successful action answered, when it answers something.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum ActionOutput {
    Done,
    DrainId { drain_id: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionResult {
    pub action: Action,
    pub result: Result<ActionOutput, ActionError>,
}

/// Progress a policy reports about itself (the simulator records them; the operator turns them
/// into conditions and events).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "note", rename_all = "snake_case")]
pub enum PolicyNote {
    PhaseStarted {
        component: Component,
    },
    PhaseFinished {
        component: Component,
    },
    UpgradeFinished,
    /// The policy holds something back and says why.
    Holding {
        subject: String,
        reason: String,
    },
    /// The policy let something go and says why.
    Released {
        subject: String,
        reason: String,
    },
    /// A CN the kernel's catalog left behind (it can never start in place again, and no
    /// process of it runs) was restarted onto the rollout's target without a drain.
    MovedPastTheCatalog {
        pod: String,
        reason: String,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub notes: Vec<PolicyNote>,
}
