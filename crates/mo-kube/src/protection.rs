//! Protection for clients that never ask the operator: PodDisruptionBudgets per component and
//! the autoscalers' "do not move this pod" annotations, both computed from the same fresh
//! observation the decision core sees. Uncertainty protects: a reading that failed gives no
//! disruption budget and keeps every annotation.

use mo_core::drain::DrainStage;
use mo_core::{Component, Observation, SafePolicy, gates};
use std::collections::BTreeMap;

pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// How many pods of a component voluntary disruptions may take now, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub max_unavailable: i32,
    pub reason: String,
    /// The pods the budget counts: the spec's number or the live pods, whichever is more.
    /// The PDB says `minAvailable = pods - max_unavailable` (an integer minAvailable needs no
    /// scale subresource, which CN pods' owner, the cluster resource, does not have).
    pub pods: i32,
}

impl Budget {
    pub fn min_available(&self) -> i32 {
        (self.pods - self.max_unavailable).max(0)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Protection {
    pub budgets: BTreeMap<Component, Budget>,
    /// Per pod: whether autoscalers must leave it where it is.
    pub pinned: BTreeMap<String, bool>,
}

fn none(reason: impl Into<String>) -> Budget {
    Budget {
        max_unavailable: 0,
        reason: reason.into(),
        pods: 0,
    }
}

fn one(reason: impl Into<String>) -> Budget {
    Budget {
        max_unavailable: 1,
        reason: reason.into(),
        pods: 0,
    }
}

/// A drain of this exact pod instance was confirmed by the kernel.
fn drain_confirmed(policy: &SafePolicy, pod: &str, uid: &str) -> bool {
    policy.record().drains.iter().any(|d| {
        d.is_active()
            && d.pod == pod
            && d.pod_uid == uid
            && matches!(d.stage, DrainStage::Confirmed | DrainStage::Released)
    })
}

pub fn compute(obs: &Observation, policy: &SafePolicy) -> Protection {
    let mut budgets = BTreeMap::new();
    let log_pods: Vec<_> = obs.pods_of(Component::Log).collect();
    let log = if obs.hakeeper.is_err() {
        none("HAKeeper cannot be read: LOG margins are unknown")
    } else if let Some(blocked) = log_pods
        .iter()
        .find_map(|p| gates::log_restart_margin(obs, &p.name).err())
    {
        none(format!("a LOG replica cannot go: {blocked}"))
    } else if log_pods.is_empty() {
        none("no LOG pods observed")
    } else {
        one("every shard keeps a caught-up majority without any one LOG replica")
    };
    budgets.insert(Component::Log, log);
    budgets.insert(
        Component::Tn,
        none("the TN has no standby: taking it stops every commit"),
    );
    // Only CNs whose drain the kernel confirmed may go; which ones, the eviction review says.
    let confirmed = obs
        .pods_of(Component::Cn)
        .filter(|p| drain_confirmed(policy, &p.name, &p.uid))
        .count() as i32;
    budgets.insert(
        Component::Cn,
        Budget {
            max_unavailable: confirmed,
            pods: 0,
            reason: if confirmed == 0 {
                "a CN leaves only once the drain arbiter confirmed that exact instance".into()
            } else {
                format!("{confirmed} CN(s) drained and confirmed for their exact instance")
            },
        },
    );
    let proxies: Vec<_> = obs.pods_of(Component::Proxy).collect();
    let proxy = if proxies.len() < 2 {
        none("a single proxy: taking it leaves no route")
    } else if let Some(blocked) = proxies
        .iter()
        .find_map(|p| gates::other_proxy_routes(obs, Some(&p.name)).err())
    {
        none(format!("the other proxies cannot route: {blocked}"))
    } else {
        one("the other proxies route to Working CNs")
    };
    budgets.insert(Component::Proxy, proxy);
    for (component, budget) in budgets.iter_mut() {
        let live = obs.pods_of(*component).filter(|p| !p.terminating).count();
        let desired = obs.desired.replicas.get(component).copied().unwrap_or(0);
        budget.pods = live.max(desired) as i32;
    }

    let pinned = obs
        .pods
        .iter()
        .map(|p| {
            let pinned = match p.component {
                Component::Cn => !drain_confirmed(policy, &p.name, &p.uid),
                c => budgets.get(&c).is_none_or(|b| b.max_unavailable == 0),
            };
            (p.name.clone(), pinned)
        })
        .collect();
    Protection { budgets, pinned }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mo_core::{ObservationError, SafeConfig};

    fn observation(caught_up: [bool; 3], proxies: usize) -> Observation {
        let mut pods = vec![];
        for i in 0..3 {
            pods.push(
                serde_json::json!({"name": format!("mo-log-{i}"), "uid": format!("l{i}"),
                "component": "log", "node": "n", "phase": "running", "ready": true, "version": "v1",
                "terminating": false, "restarts": 0, "cn_uuid": null, "pool_phase": null}),
            );
        }
        pods.push(
            serde_json::json!({"name": "mo-tp-0", "uid": "c0", "component": "cn", "node": "n",
            "phase": "running", "ready": true, "version": "v1", "terminating": false, "restarts": 0,
            "cn_uuid": "u0", "pool_phase": null}),
        );
        for i in 0..proxies {
            pods.push(serde_json::json!({"name": format!("mo-proxy-{i}"), "uid": format!("p{i}"),
                "component": "proxy", "node": "n", "phase": "running", "ready": true, "version": "v1",
                "terminating": false, "restarts": 0, "cn_uuid": null, "pool_phase": null}));
        }
        let replicas: Vec<_> = (0..3)
            .map(|i| serde_json::json!({"store": format!("mo-log-{i}"), "up": true, "caught_up": caught_up[i]}))
            .collect();
        let routes: serde_json::Map<String, serde_json::Value> = (0..proxies)
            .map(|i| (format!("mo-proxy-{i}"), serde_json::json!({"Ok": 1})))
            .collect();
        serde_json::from_value(serde_json::json!({
            "now": 1000,
            "pods": pods,
            "hakeeper": {"Ok": {
                "cns": [{"uuid": "u0", "start_epoch": 1, "work_state": "working", "heartbeat_age": 100, "version": "v1"}],
                "tns": [],
                "log_shards": [
                    {"shard_id": 0, "leader": "mo-log-0", "term": 1, "replicas": replicas},
                    {"shard_id": 1, "leader": "mo-log-0", "term": 1, "replicas": replicas},
                ]}},
            "lock_allocator": {"Err": {"kind": "unavailable", "detail": "x"}},
            "cn_activity": {},
            "proxy_routes": routes,
            "node_images": {},
            "unschedulable_nodes": [],
            "not_ready_nodes": [],
            "tn_wal_tolerance": null,
            "desired": {"upgrade": null, "removals": []}
        }))
        .expect("observation")
    }

    #[test]
    fn budgets_open_only_where_the_gates_hold_and_uncertainty_closes_them() {
        let policy = SafePolicy::new(SafeConfig::default());
        let healthy = compute(&observation([true; 3], 2), &policy);
        assert_eq!(healthy.budgets[&Component::Log].max_unavailable, 1);
        assert_eq!(healthy.budgets[&Component::Log].min_available(), 2);
        assert_eq!(healthy.budgets[&Component::Cn].min_available(), 1);
        assert_eq!(healthy.budgets[&Component::Tn].max_unavailable, 0);
        assert_eq!(healthy.budgets[&Component::Cn].max_unavailable, 0);
        assert_eq!(healthy.budgets[&Component::Proxy].max_unavailable, 1);
        assert!(healthy.pinned["mo-tp-0"], "no confirmed drain: pinned");
        assert!(!healthy.pinned["mo-log-1"]);

        let lagging = compute(&observation([true, true, false], 1), &policy);
        assert_eq!(lagging.budgets[&Component::Log].max_unavailable, 0);
        assert_eq!(lagging.budgets[&Component::Proxy].max_unavailable, 0);
        assert!(lagging.pinned["mo-log-1"]);

        let mut blind = observation([true; 3], 2);
        blind.hakeeper = Err(ObservationError::Timeout("HAKeeper".into()));
        let blind = compute(&blind, &policy);
        assert_eq!(blind.budgets[&Component::Log].max_unavailable, 0);
        assert!(
            blind.budgets[&Component::Log]
                .reason
                .contains("cannot be read")
        );
    }
}
