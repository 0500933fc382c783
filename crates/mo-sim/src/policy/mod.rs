//! Operator behaviours the simulator can run. Each implements [`mo_core::Policy`].

mod legacy;

pub use legacy::LegacyPolicy;

use crate::scenario::Scenario;
use mo_core::Policy;

/// Names accepted by `--policy` and the scenario's `policy` field.
pub const KNOWN_POLICIES: &[&str] = &["legacy"];

/// Builds a policy; `record` is the progress record a previous incarnation persisted.
pub fn make_policy(
    name: &str,
    scenario: &Scenario,
    record: Option<&str>,
) -> Option<Box<dyn Policy>> {
    let _ = record;
    match name {
        "legacy" => Some(Box::new(LegacyPolicy::new(scenario.legacy.clone()))),
        _ => None,
    }
}
