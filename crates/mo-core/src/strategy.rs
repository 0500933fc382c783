//! Upgrade dependency strategies: `{"proxy":["dn"],"dn":["cn"],"cn":["log"],"log":[]}` maps each
//! component to the components it waits for. Parsing rejects every ambiguity with a message that
//! names the offending component, because a silently "fixed" strategy is an unplanned upgrade order.

use crate::component::Component;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// A validated dependency strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategy {
    waits_for: BTreeMap<Component, Vec<Component>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    #[error("strategy is not a JSON object of component -> [components]: {0}")]
    Syntax(String),
    #[error("strategy names unknown component `{0}` (expected log, tn/dn, cn, proxy)")]
    UnknownComponent(String),
    #[error("strategy lists component `{0}` more than once (tn and dn are the same component)")]
    DuplicateComponent(String),
    #[error("strategy: `{component}` lists dependency `{dependency}` more than once")]
    DuplicateDependency {
        component: String,
        dependency: String,
    },
    #[error("strategy is missing component(s): {0}")]
    MissingComponents(String),
    #[error("strategy: `{0}` waits for itself")]
    SelfDependency(String),
    #[error("strategy has a dependency cycle: {0}")]
    Cycle(String),
}

impl Strategy {
    /// LOG → TN → CN → Proxy: what every component needs is upgraded before it.
    pub fn default_order() -> Self {
        let waits_for = BTreeMap::from([
            (Component::Log, vec![]),
            (Component::Tn, vec![Component::Log]),
            (Component::Cn, vec![Component::Tn]),
            (Component::Proxy, vec![Component::Cn]),
        ]);
        Strategy { waits_for }
    }

    /// Parses the JSON form used by `UPGRADE_STRATEGY`.
    pub fn parse(text: &str) -> Result<Self, StrategyError> {
        let raw: RawStrategy =
            serde_json::from_str(text).map_err(|e| StrategyError::Syntax(e.to_string()))?;
        Self::from_pairs(raw.0)
    }

    /// Validates `(component, waits_for)` pairs in the order they were written.
    pub fn from_pairs(pairs: Vec<(String, Vec<String>)>) -> Result<Self, StrategyError> {
        let mut waits_for: BTreeMap<Component, Vec<Component>> = BTreeMap::new();
        for (name, deps) in pairs {
            let component = parse_component(&name)?;
            if waits_for.contains_key(&component) {
                return Err(StrategyError::DuplicateComponent(name));
            }
            let mut parsed = Vec::with_capacity(deps.len());
            for dep_name in deps {
                let dep = parse_component(&dep_name)?;
                if dep == component {
                    return Err(StrategyError::SelfDependency(name));
                }
                if parsed.contains(&dep) {
                    return Err(StrategyError::DuplicateDependency {
                        component: name,
                        dependency: dep_name,
                    });
                }
                parsed.push(dep);
            }
            waits_for.insert(component, parsed);
        }
        let missing: Vec<&str> = Component::ALL
            .iter()
            .filter(|c| !waits_for.contains_key(c))
            .map(|c| c.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(StrategyError::MissingComponents(missing.join(", ")));
        }
        let strategy = Strategy { waits_for };
        strategy.topological_order()?;
        Ok(strategy)
    }

    pub fn waits_for(&self, component: Component) -> &[Component] {
        self.waits_for
            .get(&component)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The phases, one component each, in an order that respects every dependency. Independent
    /// components are still upgraded one at a time (ties broken LOG, TN, CN, Proxy): one change in
    /// flight keeps every gate attributable to one component.
    pub fn phases(&self) -> Vec<Component> {
        self.topological_order()
            .expect("a constructed Strategy is acyclic")
    }

    fn topological_order(&self) -> Result<Vec<Component>, StrategyError> {
        let mut done: Vec<Component> = Vec::with_capacity(4);
        while done.len() < self.waits_for.len() {
            let next = Component::ALL
                .iter()
                .copied()
                .find(|c| !done.contains(c) && self.waits_for(*c).iter().all(|d| done.contains(d)));
            match next {
                Some(c) => done.push(c),
                None => return Err(StrategyError::Cycle(self.describe_cycle(&done))),
            }
        }
        Ok(done)
    }

    /// Walks "waits for" edges among the unplaced components until one repeats.
    fn describe_cycle(&self, done: &[Component]) -> String {
        let remaining: Vec<Component> = Component::ALL
            .iter()
            .copied()
            .filter(|c| !done.contains(c))
            .collect();
        let mut path = vec![remaining[0]];
        loop {
            let last = *path.last().expect("path starts non-empty");
            let next = self
                .waits_for(last)
                .iter()
                .copied()
                .find(|d| remaining.contains(d))
                .expect("every unplaced component waits for another unplaced one");
            if let Some(pos) = path.iter().position(|c| *c == next) {
                let mut cycle: Vec<&str> = path[pos..].iter().map(|c| c.as_str()).collect();
                cycle.push(next.as_str());
                return cycle.join(" -> ");
            }
            path.push(next);
        }
    }
}

impl Default for Strategy {
    fn default() -> Self {
        Strategy::default_order()
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .waits_for
            .iter()
            .map(|(c, deps)| {
                let deps: Vec<String> = deps.iter().map(|d| format!("\"{d}\"")).collect();
                format!("\"{c}\":[{}]", deps.join(","))
            })
            .collect();
        write!(f, "{{{}}}", parts.join(","))
    }
}

fn parse_component(name: &str) -> Result<Component, StrategyError> {
    name.parse()
        .map_err(|_| StrategyError::UnknownComponent(name.to_string()))
}

/// Keeps duplicate keys, which a map would silently merge.
struct RawStrategy(Vec<(String, Vec<String>)>);

impl<'de> Deserialize<'de> for RawStrategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = RawStrategy;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map from component to a list of components")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawStrategy, A::Error> {
                collect_pairs(map).map(RawStrategy)
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

/// Accepts either the JSON text (as in `UPGRADE_STRATEGY`) or a mapping.
impl<'de> Deserialize<'de> for Strategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrategyVisitor;
        impl<'de> Visitor<'de> for StrategyVisitor {
            type Value = Strategy;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a dependency strategy (JSON text or a map of component -> [components])",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Strategy, E> {
                Strategy::parse(v).map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Strategy, A::Error> {
                Strategy::from_pairs(collect_pairs(map)?).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(StrategyVisitor)
    }
}

fn collect_pairs<'de, A: MapAccess<'de>>(
    mut map: A,
) -> Result<Vec<(String, Vec<String>)>, A::Error> {
    let mut pairs = Vec::new();
    while let Some((k, v)) = map.next_entry::<String, Vec<String>>()? {
        pairs.push((k, v));
    }
    Ok(pairs)
}

impl Serialize for Strategy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.waits_for.iter().map(|(c, deps)| (c.as_str(), deps)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INCIDENT_002: &str = r#"{"proxy":["dn"],"dn":["cn"],"cn":["log"],"log":[]}"#;

    #[test]
    fn incident_strategy_orders_log_cn_tn_proxy() {
        let s = Strategy::parse(INCIDENT_002).unwrap();
        assert_eq!(
            s.phases(),
            vec![
                Component::Log,
                Component::Cn,
                Component::Tn,
                Component::Proxy
            ]
        );
    }

    #[test]
    fn default_is_log_tn_cn_proxy() {
        assert_eq!(
            Strategy::default().phases(),
            vec![
                Component::Log,
                Component::Tn,
                Component::Cn,
                Component::Proxy
            ]
        );
    }

    #[test]
    fn cycle_is_named() {
        let err =
            Strategy::parse(r#"{"proxy":[],"tn":["cn"],"cn":["log"],"log":["tn"]}"#).unwrap_err();
        assert_eq!(err, StrategyError::Cycle("log -> tn -> cn -> log".into()));
    }

    #[test]
    fn tn_and_dn_together_are_a_duplicate() {
        let err = Strategy::parse(r#"{"proxy":[],"tn":[],"dn":[],"cn":[],"log":[]}"#).unwrap_err();
        assert_eq!(err, StrategyError::DuplicateComponent("dn".into()));
    }

    #[test]
    fn repeated_key_is_a_duplicate_not_last_wins() {
        let err =
            Strategy::parse(r#"{"proxy":[],"tn":[],"cn":[],"log":[],"cn":["log"]}"#).unwrap_err();
        assert_eq!(err, StrategyError::DuplicateComponent("cn".into()));
    }

    #[test]
    fn unknown_and_missing_components_are_named() {
        let err = Strategy::parse(r#"{"proxy":["db"],"tn":[],"cn":[],"log":[]}"#).unwrap_err();
        assert_eq!(err, StrategyError::UnknownComponent("db".into()));
        let err = Strategy::parse(r#"{"proxy":[],"cn":[]}"#).unwrap_err();
        assert_eq!(err, StrategyError::MissingComponents("log, tn".into()));
        assert!(err.to_string().contains("log, tn"));
    }

    #[test]
    fn self_and_repeated_dependencies_are_refused() {
        let err = Strategy::parse(r#"{"proxy":["proxy"],"tn":[],"cn":[],"log":[]}"#).unwrap_err();
        assert_eq!(err, StrategyError::SelfDependency("proxy".into()));
        let err = Strategy::parse(r#"{"proxy":["cn","cn"],"tn":[],"cn":[],"log":[]}"#).unwrap_err();
        assert!(matches!(err, StrategyError::DuplicateDependency { .. }));
    }

    #[test]
    fn syntax_error_is_reported() {
        assert!(matches!(
            Strategy::parse("[1,2]"),
            Err(StrategyError::Syntax(_))
        ));
    }

    #[test]
    fn display_round_trips() {
        let s = Strategy::parse(INCIDENT_002).unwrap();
        assert_eq!(Strategy::parse(&s.to_string()).unwrap(), s);
    }

    proptest::proptest! {
        /// Any acyclic strategy yields phases in which every dependency comes first.
        #[test]
        fn phases_respect_every_dependency(edges in proptest::collection::vec((0usize..4, 0usize..4), 0..8)) {
            let mut pairs: Vec<(String, Vec<String>)> =
                Component::ALL.iter().map(|c| (c.as_str().to_string(), vec![])).collect();
            for (a, b) in edges {
                // Only edges from a later to an earlier index: acyclic by construction.
                if a > b {
                    let dep = Component::ALL[b].as_str().to_string();
                    if !pairs[a].1.contains(&dep) { pairs[a].1.push(dep); }
                }
            }
            let s = Strategy::from_pairs(pairs).unwrap();
            let phases = s.phases();
            proptest::prop_assert_eq!(phases.len(), 4);
            for (i, c) in phases.iter().enumerate() {
                for d in s.waits_for(*c) {
                    let j = phases.iter().position(|p| p == d).unwrap();
                    proptest::prop_assert!(j < i);
                }
            }
        }
    }
}
