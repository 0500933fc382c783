//! The safe policy in the simulator: both incidents, evictions, cancellations, operator
//! restarts, resuming from any progress record, and small campaigns.

use mo_core::{
    Component, Decision, EvictionRequest, EvictionVerdict, Observation, Policy, PolicyInput,
    PolicyNote, SafeConfig, SafePolicy,
};
use mo_sim::{Report, RunOptions, Scenario, Simulation};

const INCIDENT_000: &str = include_str!("../../../scenarios/incident-000-lock-owner-eviction.yaml");
const INCIDENT_002: &str =
    include_str!("../../../scenarios/incident-002-upgrade-without-gates.yaml");

fn scenario(text: &str, policy: &str) -> Scenario {
    let mut s = Scenario::from_yaml(text).expect("scenario parses");
    s.policy = policy.into();
    s
}

fn run(s: Scenario) -> (Report, Vec<String>) {
    let mut sim = Simulation::new(
        s,
        RunOptions {
            record_events: true,
            check_invariants: true,
            ..RunOptions::default()
        },
    );
    let report = sim.run(&mut |_| {});
    (report, sim.event_log().to_vec())
}

/// Nothing lost but what the stock kernel's TN restart costs (an upgrade's one TN restart:
/// the commits in flight and the locks held across it; counted apart as the operator's).
fn assert_clean(r: &Report) {
    let by = &r.txn_failures_by_cause;
    assert_eq!(by.voluntary + by.involuntary, 0, "{:?}", r.errors_by_kind);
    assert_eq!(
        r.txns.unknown + r.txns.failed_definite,
        by.tn_restart + by.proxy_restart,
        "{:?}",
        r.errors_by_kind
    );
    if r.upgrade.is_none() {
        assert_eq!(by.tn_restart + by.proxy_restart, 0);
    }
    assert_eq!(r.tn_fatal_exits, 0);
    assert_eq!(r.unsafe_actions.total(), 0, "{:?}", r.unsafe_action_log);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.txns.committed > 0);
}

fn without_fault(mut s: Scenario) -> Scenario {
    s.events.retain(|e| e.fault.is_none());
    s.duration = "3h".parse().unwrap();
    s
}

#[test]
fn safe_incident_000_drains_the_lock_owner_before_it_leaves() {
    for seed in 1..=3 {
        let mut s = scenario(INCIDENT_000, "safe");
        s.seed = seed;
        let (r, log) = run(s);
        assert_clean(&r);
        assert!(r.completed, "the pool reclaim finished");
        assert!(
            r.longest_table_stall_seconds < 3.0,
            "{}",
            r.longest_table_stall_seconds
        );
        let handed_over = log
            .iter()
            .position(|l| l.contains("cn-gvhx9: unlock success"))
            .unwrap();
        let sigterm = log
            .iter()
            .position(|l| l.contains("cn-gvhx9: SIGTERM"))
            .unwrap();
        assert!(
            handed_over < sigterm,
            "lock tables moved before the process was told to exit"
        );
    }
}

#[test]
fn safe_incident_000_uses_the_instance_bound_protocol_when_the_kernel_has_it() {
    let mut s = scenario(INCIDENT_000, "safe");
    s.kernel.drain_protocol = true;
    let (r, log) = run(s);
    assert_clean(&r);
    assert!(log.iter().any(|l| l.contains("BeginDrain(cn-gvhx9")));
    assert!(!log.iter().any(|l| l.contains("SetRestartService")));
}

#[test]
fn safe_incident_002_halts_in_the_cn_phase_and_keeps_serving() {
    let (r, log) = run(scenario(INCIDENT_002, "safe"));
    assert_clean(&r);
    assert_eq!(r.proxy_no_route_seconds, 0.0);
    let upgrade = r.upgrade.as_ref().unwrap();
    assert!(upgrade.finished_at.is_none());
    let phases: Vec<Component> = upgrade.phases.iter().map(|p| p.component).collect();
    assert_eq!(
        phases,
        [Component::Log, Component::Cn],
        "stopped in the CN phase"
    );
    let reason = &r.waiting_on["rollout"];
    assert!(
        reason.contains("cn phase") && reason.contains("cn-0"),
        "{reason}"
    );
    assert!(
        !log.iter()
            .any(|l| l.contains("proxy-0 deleted") || l.contains("proxy-1 deleted"))
    );
    assert!(
        !log.iter().any(|l| l.contains("cn-1 deleted")),
        "the second CN keeps serving"
    );
}

#[test]
fn safe_incident_002_without_the_fault_completes_near_the_lower_bound() {
    let (r, _) = run(without_fault(scenario(INCIDENT_002, "safe")));
    assert_clean(&r);
    let u = r.upgrade.as_ref().unwrap();
    let makespan = u.finished_at.expect("finished") - u.started_at.unwrap();
    let s = without_fault(scenario(INCIDENT_002, "safe"));
    let strategy = s
        .events
        .iter()
        .find_map(|e| e.upgrade.as_ref()?.strategy.clone())
        .unwrap();
    let plan = mo_sim::plan::plan(&s, &strategy);
    let bound = plan.lower_bound_seconds;
    assert!(
        makespan >= plan.with_holds_seconds && plan.with_holds_seconds > bound,
        "a lower bound is never beaten: {makespan} < {} (physical {bound})",
        plan.with_holds_seconds
    );
    // The physical bound leaves out the stability windows the spec asks for (20 s after each
    // round) and the wait for a proxy's clients to leave it (their connection lifetime).
    assert!(
        makespan / bound <= 1.20,
        "makespan {makespan} vs bound {bound}"
    );
    // With the windows, what is left is the drains' own time, mostly overlapped with the
    // previous pod's window.
    assert!(
        makespan / plan.with_holds_seconds <= 1.05,
        "makespan {makespan} vs bound with the windows {}",
        plan.with_holds_seconds
    );
    let (fixed, _) = run(without_fault(scenario(INCIDENT_002, "fixed-window")));
    let fu = fixed.upgrade.as_ref().unwrap();
    assert!(fu.finished_at.unwrap() - fu.started_at.unwrap() > makespan);
}

/// Simulated seconds of the first log line containing every needle.
fn first_time(log: &[String], needles: &[&str]) -> f64 {
    let line = log
        .iter()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .unwrap_or_else(|| panic!("no event with {needles:?}"));
    let t = line.split_whitespace().next().expect("time column");
    t.trim_end_matches('s').parse().expect("seconds")
}

#[test]
fn a_proxy_is_prepared_during_a_restarted_ones_window_and_a_cn_only_while_a_proven_one_serves() {
    let (r, log) = run(without_fault(scenario(INCIDENT_002, "safe")));
    assert_clean(&r);
    let window = SafeConfig::default().stability_window.0 as f64 / 1000.0;
    // CN: with two CNs, the second is not even prepared while the restarted one holds its
    // window (it would leave only an unproven CN serving); it drains once cn-0 is proven.
    let healthy = first_time(&log, &["cn-0 healthy, holding for the stability window"]);
    let marked = first_time(&log, &["marking cn-1 Draining in HAKeeper"]);
    let handshake = first_time(&log, &["restart handshake requested for cn-1"]);
    assert!(
        marked >= healthy + window,
        "cn-1 drained only after cn-0's window: healthy {healthy}, marked {marked}"
    );
    assert!(handshake >= marked, "{handshake} {marked}");
    // Proxy: the next proxy leaves its Service (its clients leave) during the window; its
    // restart waits for the window's end.
    let healthy = first_time(&log, &["proxy-0 healthy, holding for the stability window"]);
    let out = first_time(&log, &["SetProxyServing", "proxy-1", "serving: false"]);
    let restart = first_time(&log, &["RestartPod", "proxy-1"]);
    assert!(
        healthy <= out && out < healthy + window,
        "proxy-1 out of its Service during proxy-0's window: healthy {healthy}, out {out}"
    );
    assert!(
        restart >= healthy + window,
        "proxy-1 restarted after proxy-0's window: healthy {healthy}, restart {restart}"
    );
}

const SMALL: &str = "
name: small
duration: 10m
topology:
  version: v1
  cn_groups:
    - {name: tenant, replicas: 2}
    - {name: pool, pool: true, replicas: 1}
lock_tables: [{table: documents, owner: pool-0}]
workload: {clients: 6, txn_rate: 8, tables: [documents, orders]}
";

#[test]
fn cns_that_heartbeat_every_few_seconds_are_fresh_and_the_upgrade_completes() {
    // A freshness limit fixed at 3 s flaps the CN gates of a kernel beating every 4 s.
    let mut s = without_fault(scenario(INCIDENT_002, "safe"));
    s.timings.cn_heartbeat = "4s".parse().unwrap();
    let (r, log) = run(s);
    assert_clean(&r);
    assert!(r.completed);
    assert!(r.upgrade.unwrap().finished_at.is_some());
    let stale: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("last heartbeat"))
        .collect();
    assert!(
        stale.is_empty(),
        "a CN beating on its configured interval is never a stale reading: {stale:?}"
    );
}

#[test]
fn eviction_of_a_lock_owner_is_refused_until_its_instance_confirms() {
    let text = format!("{SMALL}events:\n  - at: 30s\n    drain_node: {{node: node-7}}\n");
    let (r, log) = run(scenario(&text, "safe"));
    assert_clean(&r);
    let refused = log
        .iter()
        .position(|l| l.contains("eviction of pool-0 by kubectl-drain: 429"))
        .unwrap();
    let confirmed = log
        .iter()
        .position(|l| l.contains("pool-0: unlock success"))
        .unwrap();
    let allowed = log
        .iter()
        .position(|l| l.contains("eviction of pool-0 by kubectl-drain: allowed"))
        .unwrap();
    assert!(refused < confirmed && confirmed < allowed);
    assert!(
        log[refused].contains("draining it first"),
        "{}",
        log[refused]
    );
    // Legacy lets the same eviction through at once.
    let (legacy, _) = run(scenario(&text, "legacy"));
    assert_eq!(
        legacy.unsafe_actions.pod_deleted_without_drain_confirmation,
        1
    );
}

#[test]
fn a_withdrawn_pool_reclaim_returns_the_cn_to_working() {
    let text = format!(
        "{SMALL}consolidation: {{start: 30s, method: pool-reclaim}}\nevents:\n  - at: 30500ms\n    hakeeper_outage: {{duration: 20s}}\n  - at: 35s\n    claim_bind: {{pod: pool-0}}\n"
    );
    let (r, log) = run(scenario(&text, "safe"));
    assert_clean(&r);
    assert!(r.completed);
    assert!(!log.iter().any(|l| l.contains("pool-0 deleted")));
    let last = log
        .iter()
        .rev()
        .find(|l| l.contains("SetCnWorkState") && l.contains("operator"))
        .unwrap();
    assert!(last.contains("Working"), "{last}");
}

/// A tenant group of three whose highest ordinal owns a lock table, scaled in at 30 s and
/// back out at `revert_at`.
fn reverted_scale_in(revert_at: &str) -> String {
    format!(
        "
name: reverted-scale-in
duration: 10m
topology:
  version: v1.2.4
  cn_groups:
    - {{name: tenant, replicas: 3}}
lock_tables: [{{table: documents, owner: tenant-2}}]
workload: {{clients: 6, txn_rate: 8, tables: [documents, orders]}}
events:
  - {{at: 30s, scale_in: {{group: tenant, replicas: 2}}}}
  - {{at: {revert_at}, scale_out: {{group: tenant, replicas: 3}}}}
"
    )
}

#[test]
fn a_scale_in_reverted_before_the_hand_over_returns_the_cn_to_working() {
    let (r, log) = run(scenario(&reverted_scale_in("31s"), "safe"));
    assert_clean(&r);
    let reverted = log
        .iter()
        .position(|l| l.contains("group tenant scaled back to 3"))
        .unwrap();
    assert!(
        log[reverted].contains("(1 pending removals withdrawn)"),
        "{}",
        log[reverted]
    );
    assert!(
        !log.iter()
            .any(|l| l.contains("restart handshake requested"))
    );
    assert!(!log.iter().any(|l| l.contains("tenant-2 gone")));
    assert!(
        log[reverted..]
            .iter()
            .any(|l| l.contains("SetCnWorkState") && l.contains("Working")),
        "the CN is returned to Working"
    );
}

#[test]
fn a_scale_in_reverted_after_the_hand_over_restarts_the_cn_instead() {
    // The hand-over is requested at 36 s and the drain released at 39 s (asserted below).
    let (r, log) = run(scenario(&reverted_scale_in("38s"), "safe"));
    assert_clean(&r);
    let asked = log
        .iter()
        .position(|l| l.contains("restart handshake requested for tenant-2"))
        .unwrap();
    let reverted = log
        .iter()
        .position(|l| l.contains("group tenant scaled back to 3"))
        .unwrap();
    assert!(
        asked < reverted,
        "the hand-over was requested before the revert"
    );
    assert!(
        log[reverted].contains("(1 pending removals withdrawn)"),
        "{}",
        log[reverted]
    );
    // Marked, it refuses new writes for good: it finishes the drain and is restarted; only
    // its new instance is returned to Working.
    let restarted = log[reverted..]
        .iter()
        .position(|l| l.contains("RestartPod { pod: \"tenant-2\""))
        .expect("restarted, not removed nor handed back")
        + reverted;
    let gone = log[restarted..]
        .iter()
        .position(|l| l.contains("tenant-2 gone"))
        .unwrap()
        + restarted;
    assert!(
        !log[asked..gone]
            .iter()
            .any(|l| l.contains("SetCnWorkState") && l.contains("Working")),
        "the marked instance is never returned to Working"
    );
    assert!(
        !log.iter()
            .any(|l| l.contains("DeletePod { pod: \"tenant-2\"")),
        "a reverted scale-in does not remove the pod"
    );
    assert!(
        log[gone..]
            .iter()
            .any(|l| l.contains("SetCnWorkState") && l.contains("Working")),
        "the new instance works"
    );
}

#[test]
fn operator_restarts_mid_drain_and_mid_upgrade_resume_without_skipping_a_step() {
    let mut s = without_fault(scenario(INCIDENT_002, "safe"));
    let base = s.events.clone();
    let mut events = String::from("events:\n");
    for i in 0..40u32 {
        events.push_str(&format!(
            "  - at: {}s\n    operator_restart: {{drop_pending_actions: {}}}\n",
            61 + i * 47,
            i % 2 == 0
        ));
    }
    let extra = Scenario::from_yaml(&format!("name: x\nduration: 3h\ntopology: {{version: v1, cn_groups: [{{name: cn, replicas: 2}}]}}\n{events}")).unwrap();
    s.events = base.into_iter().chain(extra.events).collect();
    let (r, _) = run(s);
    assert_clean(&r);
    assert_eq!(r.operator_restarts, 40);
    assert!(r.upgrade.unwrap().finished_at.is_some());
}

/// Wraps the safe policy: every tick, a policy resumed from the record persisted before the
/// tick must decide exactly what the running one decides.
struct Shadowed {
    live: SafePolicy,
    config: SafeConfig,
    checked: usize,
}

impl Policy for Shadowed {
    fn name(&self) -> &str {
        "safe"
    }
    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        let record = self.live.progress_record().unwrap();
        let mut resumed = SafePolicy::resume(self.config.clone(), &record);
        let shadow = resumed.decide(PolicyInput {
            observation: input.observation,
            results: input.results,
        });
        let live = self.live.decide(input);
        assert_eq!(
            live.actions, shadow.actions,
            "a resumed operator decides differently"
        );
        assert_eq!(self.live.progress_record(), resumed.progress_record());
        self.checked += 1;
        live
    }
    fn review_eviction(&mut self, o: &Observation, r: &EvictionRequest) -> EvictionVerdict {
        self.live.review_eviction(o, r)
    }
    fn progress_record(&self) -> Option<String> {
        self.live.progress_record()
    }
}

/// A deliberately wrong policy: the safe one, but it says the upgrade finished as soon as its
/// first phase starts.
struct FinishesEarly(SafePolicy);

impl Policy for FinishesEarly {
    fn name(&self) -> &str {
        "finishes-early"
    }
    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        let mut d = self.0.decide(input);
        if d.notes
            .iter()
            .any(|n| matches!(n, PolicyNote::PhaseStarted { .. }))
        {
            d.notes.push(PolicyNote::UpgradeFinished);
        }
        d
    }
    fn review_eviction(&mut self, o: &Observation, r: &EvictionRequest) -> EvictionVerdict {
        self.0.review_eviction(o, r)
    }
    fn progress_record(&self) -> Option<String> {
        self.0.progress_record()
    }
}

#[test]
fn a_policy_that_declares_the_upgrade_finished_early_is_caught_from_the_pods() {
    let s = without_fault(scenario(INCIDENT_002, "safe"));
    let config = s.safe.clone();
    let mut sim = Simulation::with_policy(
        s,
        Box::new(FinishesEarly(SafePolicy::new(config))),
        RunOptions {
            check_invariants: true,
            ..RunOptions::default()
        },
    );
    let r = sim.run(&mut |_| {});
    assert_eq!(r.unsafe_actions.finished_with_pods_not_upgraded, 1);
    assert!(
        r.violations
            .iter()
            .any(|v| v.invariant == "no unsafe action"),
        "{:?}",
        r.violations
    );
    // The safe policy itself says so only when every pod runs the target.
    let (safe, _) = run(without_fault(scenario(INCIDENT_002, "safe")));
    assert_eq!(safe.unsafe_actions.finished_with_pods_not_upgraded, 0);
    assert!(safe.upgrade.unwrap().finished_at.is_some());
}

#[test]
fn two_proxies_evicted_in_the_same_instant_leave_one_routing() {
    let text = "
name: two-proxies-evicted
duration: 10m
topology:
  version: v1
  proxy_replicas: 2
  cn_groups:
    - {name: tenant, replicas: 2}
workload: {clients: 6, txn_rate: 8, tables: [documents, orders]}
events:
  - {at: 30s, evict: {pod: proxy-0, source: cluster-autoscaler}}
  - {at: 30s, evict: {pod: proxy-1, source: kubectl-drain}}
";
    let (safe, log) = run(scenario(text, "safe"));
    assert_clean(&safe);
    assert_eq!(safe.proxy_no_route_seconds, 0.0);
    // The second waits until the first proxy is back (a terminating proxy routes nothing new).
    let refused = log
        .iter()
        .position(|l| l.contains("eviction of proxy-1 by kubectl-drain: 429"))
        .unwrap();
    assert!(
        log[refused..]
            .iter()
            .any(|l| l.contains("eviction of proxy-1 by kubectl-drain: allowed"))
    );
    // The checker judges the stop itself: legacy lets both go at once.
    let (legacy, _) = run(scenario(text, "legacy"));
    assert_eq!(legacy.unsafe_actions.proxy_stopped_without_another_route, 1);
    assert!(legacy.proxy_no_route_seconds > 0.0);
}

#[test]
fn commits_lost_while_the_tn_is_down_of_a_fault_are_the_faults_across_a_proxy_restart() {
    // Found by `campaign --seeds 10000 --policy safe` (seed 6021): the proxy restarts while the
    // TN, its node failed, cannot answer a COMMIT. (Since the CN no longer retries a commit while
    // the TN is down, the commit fails at once instead of holding the proxy to its grace period.)
    let text = r#"
name: proxy-restart-while-the-tn-node-fails
duration: 20m
topology:
  version: v1
  nodes: 12
  proxy_replicas: 2
  cn_groups:
    - {name: tenant, replicas: 3}
workload: {clients: 1, txn_rate: 4, statements_max: 2, tables: [t0, t1], statement_latency: 6129ms}
timings: {image_pull: 80s, container_start: 3s, log_rejoin: 10s, log_catch_up: 62s, log_election: 3s, cn_start: 13s, tn_start: 8s}
events:
  - {at: 65s, upgrade: {version: v2, strategy: '{"proxy":[],"log":["proxy"],"cn":["log"],"tn":["cn"]}'}}
  - {at: 147s, node_failure: {node: node-4}}
"#;
    let (r, log) = run(scenario(text, "safe"));
    let failed = log
        .iter()
        .position(|l| l.contains("TN unavailable: connection refused"))
        .expect("a commit is refused while the TN is down");
    assert!(
        log[..failed]
            .iter()
            .any(|l| l.contains("node node-4 fails"))
    );
    assert!(r.txn_failures_by_cause.involuntary > 0);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.unsafe_actions.total(), 0);
}

#[test]
fn resuming_from_every_progress_record_decides_the_same() {
    for text in [
        INCIDENT_000.to_string(),
        format!(
            "{SMALL}events:\n  - at: 30s\n    drain_node: {{node: node-7}}\n  - at: 60s\n    upgrade: {{version: v2}}\n"
        ),
    ] {
        let s = scenario(&text, "safe");
        let config = s.safe.clone();
        let policy = Shadowed {
            live: SafePolicy::new(config.clone()),
            config,
            checked: 0,
        };
        let mut sim = Simulation::with_policy(s, Box::new(policy), RunOptions::default());
        let r = sim.run(&mut |_| {});
        assert_clean(&r);
    }
}

#[test]
fn small_campaign_safe_holds_and_legacy_breaks() {
    let safe = mo_sim::campaign::run_campaign(1, 6, "safe", 2, &|_| {});
    assert_eq!(safe.violations, 0, "{:?}", safe.failures);
    let legacy = mo_sim::campaign::run_campaign(1, 6, "legacy", 2, &|_| {});
    assert!(legacy.violations > 0, "the campaign must be able to fail");
    for f in &legacy.failures {
        assert!(f.replay.contains(&format!("--replay {}", f.seed)));
    }
}

#[test]
fn campaign_scenarios_are_reproducible() {
    for seed in [1, 2, 99] {
        assert_eq!(
            mo_sim::campaign::generate(seed).to_yaml(),
            mo_sim::campaign::generate(seed).to_yaml()
        );
        let a = mo_sim::campaign::run_seed(seed, "legacy");
        let b = mo_sim::campaign::run_seed(seed, "legacy");
        assert_eq!(a.events, b.events);
        assert_eq!(a.violations, b.violations);
    }
}

#[test]
fn shrinking_keeps_the_violation_and_drops_what_it_does_not_need() {
    let legacy = mo_sim::campaign::run_campaign(1, 6, "legacy", 2, &|_| {});
    let failure = &legacy.failures[0];
    let mut s = mo_sim::campaign::generate(failure.seed);
    s.policy = "legacy".into();
    let minimal = mo_sim::campaign::shrink(&s, &failure.invariant, 30);
    assert!(minimal.events.len() <= s.events.len());
    let again = mo_sim::campaign::check(minimal);
    assert!(
        again
            .violations
            .iter()
            .any(|v| v.invariant == failure.invariant)
    );
}

const PROXY_UPGRADE: &str = r#"
name: proxy-upgrade
duration: 30m
topology:
  version: v1
  proxy_replicas: 2
  cn_groups:
    - {name: tenant, replicas: 2}
workload: {clients: 6, txn_rate: 50, tables: [documents, orders], statement_latency: 400ms, connection_lifetime: 20s}
events:
  - {at: 30s, upgrade: {version: v2, strategy: '{"proxy":[],"log":["proxy"],"cn":["log"],"tn":["cn"]}'}}
"#;

#[test]
fn a_proxy_restarts_only_once_its_clients_left_it_and_loses_nothing() {
    // Clients almost always inside a transaction: a proxy stopped with them connected cuts
    // one transaction per connection (the kernel's proxy closes them all at once).
    let (safe, log) = run(scenario(PROXY_UPGRADE, "safe"));
    assert_clean(&safe);
    assert_eq!(safe.txn_failures_by_cause.proxy_restart, 0);
    assert!(safe.upgrade.as_ref().unwrap().finished_at.is_some());
    assert!(
        log.iter().any(|l| l.contains("SetProxyServing")),
        "never taken out of its Service"
    );
    for policy in ["legacy", "fixed-window"] {
        let (r, _) = run(scenario(PROXY_UPGRADE, policy));
        let cut = r
            .errors_by_kind
            .iter()
            .filter(|(k, _)| k.starts_with("connection closed by proxy"))
            .map(|(_, n)| n)
            .sum::<u64>();
        assert!(cut > 0, "{policy}: {:?}", r.errors_by_kind);
        assert!(r.txn_failures_by_cause.voluntary >= cut, "{policy}");
    }
}

#[test]
fn clients_that_never_leave_a_proxy_halt_the_rollout_instead_of_being_cut() {
    let text = PROXY_UPGRADE.replace("connection_lifetime: 20s", "connection_lifetime: null");
    let (safe, log) = run(scenario(&text, "safe"));
    assert_clean(&safe);
    assert!(safe.upgrade.as_ref().unwrap().finished_at.is_none());
    let reason = &safe.waiting_on["rollout"];
    assert!(
        reason.contains("proxy-0") && reason.contains("client connections"),
        "{reason}"
    );
    assert!(!log.iter().any(|l| l.contains("proxy-0 deleted")));
    // Halted, it is back in its Service.
    assert!(
        log.iter()
            .rev()
            .find(|l| l.contains("SetProxyServing") && l.contains("proxy-0"))
            .is_some_and(|l| l.contains("serving: true")),
        "proxy-0 left out of its Service"
    );
}
