//! The checker judges from the ground truth, not from what a policy says: each rule here is
//! shown to catch a deliberately wrong policy (or a scenario that the old, forgiving rule
//! excused).

use mo_core::{
    Decision, EvictionRequest, EvictionVerdict, Observation, Policy, PolicyInput, PolicyNote,
    SafePolicy,
};
use mo_sim::campaign::check_with;
use mo_sim::policy::LegacyPolicy;
use mo_sim::{Report, RunOptions, Scenario, Simulation};

const INCIDENT_002: &str =
    include_str!("../../../scenarios/incident-002-upgrade-without-gates.yaml");

fn scenario(text: &str, policy: &str) -> Scenario {
    let mut s = Scenario::from_yaml(text).expect("scenario parses");
    s.policy = policy.into();
    s
}

fn run_with(s: Scenario, policy: Box<dyn Policy>) -> Report {
    let mut sim = Simulation::with_policy(
        s,
        policy,
        RunOptions {
            check_invariants: true,
            ..RunOptions::default()
        },
    );
    sim.run(&mut |_| {})
}

fn run(s: Scenario) -> Report {
    let mut sim = Simulation::new(
        s,
        RunOptions {
            check_invariants: true,
            ..RunOptions::default()
        },
    );
    sim.run(&mut |_| {})
}

fn broke(r: &Report, invariant: &str) -> bool {
    r.violations.iter().any(|v| v.invariant == invariant)
}

/// A deliberately wrong policy: it acts as the wrapped one but announces no phase.
struct Unannounced<P>(P);

impl<P: Policy> Policy for Unannounced<P> {
    fn name(&self) -> &str {
        "unannounced"
    }
    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        let mut d = self.0.decide(input);
        d.notes.retain(|n| {
            !matches!(
                n,
                PolicyNote::PhaseStarted { .. } | PolicyNote::PhaseFinished { .. }
            )
        });
        d
    }
    fn review_eviction(&mut self, o: &Observation, r: &EvictionRequest) -> EvictionVerdict {
        self.0.review_eviction(o, r)
    }
}

#[test]
fn a_phase_advance_is_judged_from_the_pods_even_when_the_policy_announces_none() {
    let s = scenario(INCIDENT_002, "legacy");
    let legacy = LegacyPolicy::new(s.legacy.clone());
    let r = run_with(s, Box::new(Unannounced(legacy)));
    assert!(
        r.upgrade.as_ref().unwrap().phases.is_empty(),
        "no phase announced"
    );
    // Legacy stops the first CN while the LOG replicas it restarted still catch up.
    assert!(
        r.unsafe_actions.phase_advanced_on_failed_gate >= 1,
        "{:?}",
        r.unsafe_action_log
    );
    assert!(
        r.unsafe_action_log
            .iter()
            .any(|l| l.contains("cn phase started") && l.contains("log gate fails")),
        "{:?}",
        r.unsafe_action_log
    );
    // The safe policy, announcing or not, never advances on a failed gate.
    let mut safe = scenario(INCIDENT_002, "safe");
    safe.events.retain(|e| e.fault.is_none());
    let config = safe.safe.clone();
    let r = run_with(safe, Box::new(Unannounced(SafePolicy::new(config))));
    assert_eq!(r.unsafe_actions.phase_advanced_on_failed_gate, 0);
    assert!(r.completed, "{:?}", r.upgrade);
}

#[test]
fn a_tn_fatal_exit_is_excused_only_by_a_fault_that_kept_its_log_shard_from_committing() {
    // A node far from LOG fails first: the old rule excused every later TN exit while a node
    // was down. The exits come from legacy's LOG restarts, so they are still held against it.
    let mut s = scenario(INCIDENT_002, "legacy");
    let proxy_node = "node-8";
    s.events.insert(
        0,
        serde_yaml_ng::from_str(&format!(
            "{{at: 30s, node_failure: {{node: {proxy_node}}}}}"
        ))
        .unwrap(),
    );
    let r = run(s);
    assert!(r.tn_fatal_exits >= 1);
    assert!(
        broke(&r, "no TN fatal exit from voluntary disruptions"),
        "{:?}",
        r.violations
    );

    // Two LOG nodes fail (no spare node to reschedule on): the WAL's shard loses its quorum to
    // the fault, the TN's exit and the commits it cuts are the fault's.
    let text = "
name: two-log-nodes-fail
duration: 20m
topology:
  version: v1
  nodes: 7
  cn_groups:
    - {name: tenant, replicas: 2}
workload: {clients: 4, txn_rate: 4, tables: [t0, t1]}
events:
  - {at: 60s, node_failure: {node: node-1}}
  - {at: 60s, node_failure: {node: node-2}}
";
    let r = run(scenario(text, "safe"));
    assert!(r.tn_fatal_exits >= 1, "{r:?}");
    assert!(
        !broke(&r, "no TN fatal exit from voluntary disruptions"),
        "{:?}",
        r.violations
    );
    assert!(r.txn_failures_by_cause.involuntary > 0);
    assert_eq!(
        r.txn_failures_by_cause.voluntary, 0,
        "{:?}",
        r.errors_by_kind
    );
}

/// A deliberately wrong policy: after the first unreadable HAKeeper it stops acting for good,
/// and says why (the old liveness rule took any stated reason once a fault had occurred).
struct GivesUpAfterAnOutage {
    inner: SafePolicy,
    gave_up: bool,
}

impl Policy for GivesUpAfterAnOutage {
    fn name(&self) -> &str {
        "gives-up-after-an-outage"
    }
    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        self.gave_up |= input.observation.hakeeper.is_err();
        if self.gave_up {
            return Decision::default();
        }
        self.inner.decide(input)
    }
    fn review_eviction(&mut self, o: &Observation, r: &EvictionRequest) -> EvictionVerdict {
        self.inner.review_eviction(o, r)
    }
    fn waiting_on(&self) -> Vec<(String, String)> {
        let mut waiting = self.inner.waiting_on();
        if self.gave_up {
            waiting.retain(|(s, _)| s != "rollout");
            waiting.push(("rollout".into(), "HAKeeper was unreadable once".into()));
        }
        waiting
    }
}

#[test]
fn a_transient_fault_excuses_no_unfinished_upgrade() {
    let mut s = scenario(INCIDENT_002, "safe");
    s.events.retain(|e| e.fault.is_none());
    s.duration = "3h".parse().unwrap();
    s.events
        .push(serde_yaml_ng::from_str("{at: 200s, hakeeper_outage: {duration: 30s}}").unwrap());
    let config = s.safe.clone();
    let wrong = GivesUpAfterAnOutage {
        inner: SafePolicy::new(config),
        gave_up: false,
    };
    let result = check_with(s.clone(), Some(Box::new(wrong)));
    assert!(
        result
            .violations
            .iter()
            .any(|v| v.invariant == "liveness: finishes when the kernel cooperates"),
        "{:?}",
        result.violations
    );
    // The safe policy rides the outage out and finishes.
    let result = check_with(s, None);
    assert!(result.violations.is_empty(), "{:?}", result.violations);
}

#[test]
fn a_tn_stopped_for_anything_but_the_restart_an_upgrade_needs_is_caught() {
    // The TN runs on node-4 (three LOG pods come first). A node drain evicts it: legacy lets
    // it go, which costs the commits in flight for no upgrade at all.
    let text = "
name: tn-node-drained
duration: 20m
topology:
  version: v1
  cn_groups:
    - {name: tenant, replicas: 2}
workload: {clients: 4, txn_rate: 4, tables: [t0, t1]}
events:
  - {at: 60s, drain_node: {node: node-4}}
";
    let r = run(scenario(text, "legacy"));
    assert_eq!(
        r.unsafe_actions.tn_stopped_without_need, 1,
        "{:?}",
        r.unsafe_action_log
    );
    assert!(broke(&r, "no unsafe action"));
    let r = run(scenario(text, "safe"));
    assert_eq!(r.unsafe_actions.tn_stopped_without_need, 0);
    assert_eq!(r.txn_failures_by_cause.voluntary, 0);
    // The upgrade's one TN restart is allowed; its cost is the operator's, counted apart (as
    // is what the restart of the only proxy cuts).
    let text = text.replace(
        "  - {at: 60s, drain_node: {node: node-4}}",
        "  - {at: 60s, upgrade: {version: v2}}",
    );
    let r = run(scenario(&text, "safe"));
    assert!(r.completed, "{:?}", r.upgrade);
    assert_eq!(r.unsafe_actions.total(), 0, "{:?}", r.unsafe_action_log);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.txn_failures_by_cause.tn_restart > 0);
    assert_eq!(
        r.txns.failed_definite + r.txns.unknown,
        r.txn_failures_by_cause.tn_restart + r.txn_failures_by_cause.proxy_restart
    );
}
