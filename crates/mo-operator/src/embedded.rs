//! Scenarios built into the binary, so the main job runs anywhere.

pub const INCIDENT_000: &str =
    include_str!("../../../scenarios/incident-000-lock-owner-eviction.yaml");
pub const INCIDENT_002: &str =
    include_str!("../../../scenarios/incident-002-upgrade-without-gates.yaml");

pub const INCIDENTS: &[(&str, &str)] = &[
    ("incident-000-lock-owner-eviction", INCIDENT_000),
    ("incident-002-upgrade-without-gates", INCIDENT_002),
];

pub const SCENARIOS: &[(&str, &str)] = INCIDENTS;

pub fn find(name: &str) -> Option<&'static str> {
    let stem = name.trim_end_matches(".yaml");
    let stem = stem.rsplit('/').next().unwrap_or(stem);
    SCENARIOS
        .iter()
        .find(|(n, _)| *n == stem && !std::path::Path::new(name).exists())
        .map(|(_, text)| *text)
}

pub fn names() -> Vec<&'static str> {
    SCENARIOS.iter().map(|(n, _)| *n).collect()
}
