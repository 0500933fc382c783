//! Operator behaviours the simulator can run. Each implements [`mo_core::Policy`].

mod legacy;

pub use legacy::LegacyPolicy;
use mo_core::SafePolicy;

use crate::scenario::Scenario;
use mo_core::Policy;

/// Names accepted by `--policy` and the scenario's `policy` field.
pub const KNOWN_POLICIES: &[&str] = &["legacy", "fixed-window", "safe"];

/// Builds a policy; `record` is the progress record a previous incarnation persisted.
pub fn make_policy(
    name: &str,
    scenario: &Scenario,
    record: Option<&str>,
) -> Option<Box<dyn Policy>> {
    match name {
        "legacy" => Some(Box::new(LegacyPolicy::new(scenario.legacy.clone()))),
        "fixed-window" => Some(Box::new(LegacyPolicy::fixed_window(
            scenario.legacy.clone(),
            scenario.fixed_window.window.millis(),
        ))),
        "safe" => Some(Box::new(match record {
            Some(record) => SafePolicy::resume(scenario.safe.clone(), record),
            None => SafePolicy::new(scenario.safe.clone()),
        })),
        _ => None,
    }
}
