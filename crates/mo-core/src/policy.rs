//! The one interface every operator behaviour implements: the legacy operator reproduced in the
//! simulator, our safety engine, and whatever drives the real cluster.

use crate::action::{ActionResult, Decision};
use crate::observe::{EvictionRequest, Observation};
use serde::{Deserialize, Serialize};

pub struct PolicyInput<'a> {
    pub observation: &'a Observation,
    /// Results of the actions returned by the previous `decide` call, in order.
    pub results: &'a [ActionResult],
}

/// The answer to an eviction, as an admission webhook (or a PodDisruptionBudget) gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum EvictionVerdict {
    Allow,
    /// HTTP 429 to the evictor, who retries later.
    Deny {
        reason: String,
    },
}

pub trait Policy: Send {
    fn name(&self) -> &str;

    /// Called on every operator tick with a fresh observation.
    fn decide(&mut self, input: PolicyInput<'_>) -> Decision;

    /// Called synchronously when someone posts an eviction for a MatrixOne pod.
    fn review_eviction(
        &mut self,
        observation: &Observation,
        request: &EvictionRequest,
    ) -> EvictionVerdict;

    /// The progress record to persist after this call, before its actions take effect
    /// (`None`: the policy keeps nothing across restarts).
    fn progress_record(&self) -> Option<String> {
        None
    }

    /// What the policy is waiting on now, per subject, with the reason (a halted rollout
    /// included). Empty when nothing waits.
    fn waiting_on(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
