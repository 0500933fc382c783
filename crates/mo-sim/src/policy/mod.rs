//! Operator behaviours the simulator can run. Each implements [`mo_core::Policy`].

mod legacy;

pub use legacy::LegacyPolicy;

use crate::scenario::Scenario;
use mo_core::Policy;

/// Names accepted by `--policy` and the scenario's `policy` field.
pub const KNOWN_POLICIES: &[&str] = &["legacy"];

pub fn make_policy(name: &str, scenario: &Scenario) -> Option<Box<dyn Policy>> {
    match name {
        "legacy" => Some(Box::new(LegacyPolicy::new(scenario.legacy.clone()))),
        _ => None,
    }
}
