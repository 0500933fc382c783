//! The decision core on its own: gates from observations, the rollout state machine, stalls,
//! rollback, TN tolerance, evictions, and resuming from every progress record.

use mo_core::gates;
use mo_core::rollout::RolloutStatus;
use mo_core::*;
use std::collections::BTreeMap;

fn pod(name: &str, component: Component, version: &str, uid: &str) -> PodObservation {
    PodObservation {
        name: name.into(),
        uid: uid.into(),
        component,
        node: format!("node-{name}"),
        phase: PodPhase::Running,
        ready: true,
        version: version.into(),
        terminating: false,
        restarts: 0,
        started_at: Some(Millis(0)),
        cn_uuid: (component == Component::Cn).then(|| format!("uuid-{name}")),
        pool_phase: None,
        serving: true,
    }
}

fn shard(id: u64, leader: &str, caught_up: &[bool]) -> LogShardView {
    LogShardView {
        shard_id: id,
        leader: Some(leader.into()),
        term: 1,
        replicas: caught_up
            .iter()
            .enumerate()
            .map(|(i, c)| LogReplicaView {
                store: format!("log-{i}"),
                up: true,
                caught_up: *c,
            })
            .collect(),
    }
}

/// A healthy cluster on `version`: 3 LOG, 1 TN, 2 CN, 2 proxies.
fn cluster(version: &str) -> Observation {
    let mut pods = vec![];
    for i in 0..3 {
        pods.push(pod(
            &format!("log-{i}"),
            Component::Log,
            version,
            &format!("u-log-{i}"),
        ));
    }
    pods.push(pod("tn-0", Component::Tn, version, "u-tn"));
    for i in 0..2 {
        pods.push(pod(
            &format!("cn-{i}"),
            Component::Cn,
            version,
            &format!("u-cn-{i}"),
        ));
    }
    for i in 0..2 {
        pods.push(pod(
            &format!("proxy-{i}"),
            Component::Proxy,
            version,
            &format!("u-px-{i}"),
        ));
    }
    let cns = (0..2)
        .map(|i| CnStoreView {
            uuid: format!("uuid-cn-{i}"),
            start_epoch: 10 + i,
            work_state: WorkState::Working,
            heartbeat_age: Millis(500),
            version: version.into(),
        })
        .collect();
    let nodes: BTreeMap<String, Vec<String>> = pods
        .iter()
        .map(|p| {
            (
                p.node.clone(),
                vec![version.to_string(), "v1.2.4".to_string()],
            )
        })
        .collect();
    Observation {
        now: Millis::from_secs(100),
        pods,
        hakeeper: Ok(ClusterDetails {
            cns,
            tns: vec![TnStoreView {
                uuid: "tn".into(),
                start_epoch: 5,
                heartbeat_age: Millis(300),
            }],
            log_shards: vec![
                shard(0, "log-0", &[true, true, true]),
                shard(1, "log-0", &[true, true, true]),
            ],
        }),
        lock_allocator: Ok(AllocatorView::default()),
        cn_activity: BTreeMap::from([
            ("cn-0".to_string(), Ok(CnActivity::default())),
            ("cn-1".to_string(), Ok(CnActivity::default())),
        ]),
        proxy_routes: BTreeMap::from([
            ("proxy-0".to_string(), Ok(2)),
            ("proxy-1".to_string(), Ok(2)),
        ]),
        proxy_connections: BTreeMap::from([
            ("proxy-0".to_string(), Ok(3)),
            ("proxy-1".to_string(), Ok(3)),
        ]),
        node_images: nodes,
        unschedulable_nodes: vec![],
        not_ready_nodes: vec![],
        tn_wal_tolerance: None,
        heartbeat_intervals: HeartbeatIntervals::default(),
        desired: DesiredState::default(),
    }
}

#[test]
fn log_margin_needs_a_leader_and_a_majority_of_others() {
    let mut o = cluster("v1.2.3");
    assert!(gates::log_restart_margin(&o, "log-0").is_ok());
    // One other replica lagging: restarting log-0 would leave one caught-up replica of three.
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, false, true]);
    let e = gates::log_restart_margin(&o, "log-0").unwrap_err();
    assert!(e.contains("shard 1") && e.contains("2 needed"), "{e}");
    // The lagging replica itself may restart: the other two keep the majority.
    assert!(gates::log_restart_margin(&o, "log-1").is_ok());
    o.hakeeper.as_mut().unwrap().log_shards[0].leader = None;
    assert!(
        gates::log_restart_margin(&o, "log-1")
            .unwrap_err()
            .contains("no leader")
    );
    o.hakeeper = Err(ObservationError::Timeout("x".into()));
    assert!(
        gates::log_restart_margin(&o, "log-1").is_err(),
        "unreadable means no"
    );
}

#[test]
fn leadership_moves_to_a_caught_up_peer() {
    let o = cluster("v1.2.3");
    assert_eq!(
        gates::leadership_to_move(&o, "log-0"),
        vec![(0, "log-1".to_string()), (1, "log-1".to_string())]
    );
    assert!(gates::leadership_to_move(&o, "log-2").is_empty());
}

#[test]
fn cn_gate_wants_the_new_instance_working_and_fresh() {
    let mut o = cluster("v1.2.4");
    assert!(gates::cn_healthy(&o, "cn-0", "v1.2.4").is_ok());
    // A container started 2 s ago while HAKeeper's last heartbeat is 1 s old: that heartbeat
    // may be the old process's (HAKeeper keeps a quickly restarted CN's record and UpTime).
    let now = o.now;
    let started = |o: &mut Observation, at: Millis| {
        o.pods
            .iter_mut()
            .find(|p| p.name == "cn-0")
            .unwrap()
            .started_at = Some(at);
    };
    started(&mut o, now - Millis(2_000));
    o.hakeeper.as_mut().unwrap().cns[0].heartbeat_age = Millis(1_000);
    assert!(
        gates::cn_healthy(&o, "cn-0", "v1.2.4")
            .unwrap_err()
            .contains("no heartbeat yet from the container")
    );
    // Heard from after its start: the new instance.
    o.hakeeper.as_mut().unwrap().cns[0].heartbeat_age = Millis(200);
    assert!(gates::cn_healthy(&o, "cn-0", "v1.2.4").is_ok());
    // No start time known: no evidence.
    o.pods
        .iter_mut()
        .find(|p| p.name == "cn-0")
        .unwrap()
        .started_at = None;
    assert!(gates::cn_healthy(&o, "cn-0", "v1.2.4").is_err());
    started(&mut o, Millis(0));
    o.hakeeper.as_mut().unwrap().cns[0].heartbeat_age = Millis(10_000);
    assert!(
        gates::cn_healthy(&o, "cn-0", "v1.2.4")
            .unwrap_err()
            .contains("heartbeat")
    );
    o.hakeeper.as_mut().unwrap().cns.remove(0);
    assert!(
        gates::cn_healthy(&o, "cn-0", "v1.2.4")
            .unwrap_err()
            .contains("not registered")
    );
}

#[test]
fn tn_gate_wants_heartbeats_and_a_writable_wal() {
    let mut o = cluster("v1.2.4");
    assert!(gates::tn_healthy(&o, "v1.2.4").is_ok());
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, false, false]);
    assert!(gates::tn_healthy(&o, "v1.2.4").unwrap_err().contains("WAL"));
}

#[test]
fn proxy_gate_needs_a_route() {
    let mut o = cluster("v1.2.3");
    assert!(gates::other_proxy_routes(&o, Some("proxy-0")).is_ok());
    o.proxy_routes.insert("proxy-1".into(), Ok(0));
    assert!(gates::other_proxy_routes(&o, Some("proxy-0")).is_err());
    assert!(gates::component_gate(&o, Component::Proxy, "v1.2.3").is_ok());
}

#[test]
fn a_component_gate_waits_for_a_missing_pod() {
    let mut o = cluster("v1.2.3");
    o.desired.replicas.insert(Component::Cn, 3);
    let err = gates::component_gate(&o, Component::Cn, "v1.2.3").expect_err("one CN is missing");
    assert!(err.contains("2 of 3 cn pods exist"), "{err}");
    o.desired.replicas.insert(Component::Cn, 2);
    assert!(gates::component_gate(&o, Component::Cn, "v1.2.3").is_ok());
    o.pods
        .iter_mut()
        .find(|p| p.name == "cn-1")
        .expect("cn-1")
        .terminating = true;
    assert!(gates::component_gate(&o, Component::Cn, "v1.2.3").is_err());
}

fn upgrade(o: &mut Observation, strategy: &str) {
    o.desired.upgrade = Some(UpgradeSpec {
        target_version: "v1.2.4".into(),
        strategy: Strategy::parse(strategy).unwrap(),
    });
}

fn decide(p: &mut SafePolicy, o: &Observation) -> Decision {
    p.decide(PolicyInput {
        observation: o,
        results: &[],
    })
}

/// The world's answer to `SetProxyServing`: the label changes, and a proxy out of its Service
/// is left by its clients.
fn follow_proxy_drains(o: &mut Observation, d: &Decision) {
    for a in &d.actions {
        if let Action::SetProxyServing { pod, serving, .. } = a {
            proxy_mut(o, pod).serving = *serving;
            o.proxy_connections
                .insert(pod.clone(), Ok(if *serving { 3 } else { 0 }));
        }
    }
}

fn proxy_mut<'a>(o: &'a mut Observation, name: &str) -> &'a mut PodObservation {
    o.pods
        .iter_mut()
        .find(|p| p.name == name)
        .expect("proxy pod")
}

/// A proxy-first upgrade that takes proxy-0 out of its Service, waits for its clients to
/// leave, then restarts it onto v1.2.3.2.4.
fn proxy_first_upgrade(config: SafeConfig) -> (SafePolicy, Observation) {
    let mut p = SafePolicy::new(config);
    let mut o = cluster("v1.2.3");
    upgrade(
        &mut o,
        r#"{"proxy":[],"log":["proxy"],"tn":["log"],"cn":["tn"]}"#,
    );
    let d = decide(&mut p, &o);
    let unroute = Action::SetProxyServing {
        pod: "proxy-0".into(),
        uid: "u-px-0".into(),
        serving: false,
    };
    assert_eq!(d.actions, vec![unroute]);
    proxy_mut(&mut o, "proxy-0").serving = false;
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    // No client left, but the Service's endpoints may not have followed yet.
    o.proxy_connections.insert("proxy-0".into(), Ok(0));
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    o.now += SafeConfig::default().endpoints_settle;
    let d = decide(&mut p, &o);
    assert!(d.actions.contains(&Action::RestartPod {
        pod: "proxy-0".into(),
        uid: "u-px-0".into(),
        version: "v1.2.4".into()
    }));
    // The recreated pod starts in its Service, from its template.
    proxy_mut(&mut o, "proxy-0").serving = true;
    o.proxy_connections.insert("proxy-0".into(), Ok(3));
    (p, o)
}

#[test]
fn a_proxy_stops_only_out_of_its_service_with_no_client_left_and_never_past_its_grace() {
    let config = SafeConfig::default();
    let grace = config.proxy_drain_grace;
    let mut p = SafePolicy::new(config);
    let mut o = cluster("v1.2.3");
    upgrade(
        &mut o,
        r#"{"proxy":[],"log":["proxy"],"tn":["log"],"cn":["tn"]}"#,
    );
    decide(&mut p, &o);
    proxy_mut(&mut o, "proxy-0").serving = false;
    let start = o.now;
    // Connections left, or a count that cannot be read: it waits, and says why.
    for reading in [
        Ok(2),
        Err(ObservationError::Timeout("cn-1 query service".into())),
    ] {
        o.proxy_connections.insert("proxy-0".into(), reading);
        o.now += Millis::from_secs(30);
        let d = decide(&mut p, &o);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::RestartPod { .. })),
            "{:?}",
            d.actions
        );
    }
    assert!(
        p.holds().iter().any(|(_, h)| h.contains("proxy-0")),
        "{:?}",
        p.holds()
    );
    // The other proxy stops routing: proxy-0 goes back into its Service at once.
    let mut alone = o.clone();
    alone.proxy_routes.insert("proxy-1".into(), Ok(0));
    let mut q = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(p.record()).unwrap(),
    );
    let d = decide(&mut q, &alone);
    assert!(d.actions.contains(&Action::SetProxyServing {
        pod: "proxy-0".into(),
        uid: "u-px-0".into(),
        serving: true,
    }));
    // Past the grace with a client still on it: the rollout halts, the proxy is not stopped
    // and goes back into its Service.
    o.proxy_connections.insert("proxy-0".into(), Ok(1));
    o.now = start + grace;
    let d = decide(&mut p, &o);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { .. }))
    );
    assert!(matches!(
        p.record().rollout.as_ref().unwrap().status,
        RolloutStatus::Halted { .. }
    ));
    assert!(d.actions.contains(&Action::SetProxyServing {
        pod: "proxy-0".into(),
        uid: "u-px-0".into(),
        serving: true,
    }));
}

const LOG_FIRST: &str = r#"{"log":[],"tn":["log"],"cn":["tn"],"proxy":["cn"]}"#;

#[test]
fn the_first_log_restart_waits_for_the_margin_and_widens_tn_tolerance() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    // Followers go first: here they are done, and log-0, the leader, is left.
    for pod in o.pods.iter_mut().filter(|p| p.name != "log-0") {
        if pod.component == Component::Log {
            pod.version = "v1.2.4".into();
        }
    }
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, false, true]);
    let d = decide(&mut p, &o);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::SetTnWalTolerance { total: Some(_) }))
    );
    assert!(
        !d.actions.iter().any(|a| matches!(
            a,
            Action::RestartPod { .. } | Action::TransferLogLeader { .. }
        )),
        "{:?}",
        d.actions
    );
    // Margin back: leadership moves off log-0 first, then log-0 restarts.
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, true, true]);
    o.tn_wal_tolerance = Some(SafeConfig::default().tn_wal_tolerance);
    o.now = Millis::from_secs(101);
    let d = decide(&mut p, &o);
    assert!(
        d.actions.iter().any(
            |a| matches!(a, Action::TransferLogLeader { to_store, .. } if to_store == "log-1")
        ),
        "{:?}",
        d.actions
    );
    for s in &mut o.hakeeper.as_mut().unwrap().log_shards {
        s.leader = Some("log-1".into());
    }
    o.now = Millis::from_secs(102);
    let d = decide(&mut p, &o);
    assert_eq!(
        d.actions,
        vec![Action::RestartPod {
            pod: "log-0".into(),
            uid: "u-log-0".into(),
            version: "v1.2.4".into()
        }]
    );
}

fn restarts(d: &Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::RestartPod { pod, .. } => Some(pod.clone()),
            _ => None,
        })
        .collect()
}

fn answered(actions: &[Action], result: Result<ActionOutput, ActionError>) -> Vec<ActionResult> {
    actions
        .iter()
        .map(|a| ActionResult {
            action: a.clone(),
            result: result.clone(),
        })
        .collect()
}

/// A LOG pod has restarted onto v1.2.3.2.4 and caught up: the rollout's next decisions see it.
fn log_restarted(p: &mut SafePolicy, o: &mut Observation, pod: &str, uid: &str) {
    let old = o.pods.iter().position(|x| x.name == pod).unwrap();
    o.pods[old].uid = uid.into();
    o.pods[old].version = "v1.2.4".into();
    o.pods[old].started_at = Some(o.now);
    o.now += Millis::from_secs(1);
    decide(p, o); // Restart -> Verify
    o.now += Millis::from_secs(25);
    decide(p, o); // healthy: the stability window starts
    o.now += Millis::from_secs(25);
    decide(p, o); // window held: next pod
}

#[test]
fn a_kernel_without_leader_transfer_restarts_followers_first_then_the_leader_with_its_margin() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    // log-1 leads the WAL shard, log-0 HAKeeper's: log-2 leads nothing and goes first.
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-1", &[true, true, true]);
    let d = decide(&mut p, &o);
    assert_eq!(restarts(&d), ["log-2"], "{:?}", d.actions);
    // The stock kernel refuses the WAL tolerance call: it is not sent again.
    let results = answered(
        &d.actions,
        Err(ActionError::Unsupported("logservice method type 22".into())),
    );
    o.now += Millis::from_secs(1);
    let d = p.decide(PolicyInput {
        observation: &o,
        results: &results,
    });
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::SetTnWalTolerance { .. })),
        "{:?}",
        d.actions
    );
    log_restarted(&mut p, &mut o, "log-2", "u-log-2b");
    // Both others lead one shard each: log-0 (first by name) is asked to move its leadership.
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    let transfer: Vec<Action> = d
        .actions
        .iter()
        .filter(|a| matches!(a, Action::TransferLogLeader { .. }))
        .cloned()
        .collect();
    assert!(!transfer.is_empty(), "{:?}", d.actions);
    assert!(restarts(&d).is_empty());
    // "Not supported": the leader restarts as it is, its peers caught up (Raft elects another).
    let results = answered(
        &transfer,
        Err(ActionError::Unsupported("logservice method type 20".into())),
    );
    o.now += Millis::from_secs(1);
    let d = p.decide(PolicyInput {
        observation: &o,
        results: &results,
    });
    assert_eq!(restarts(&d), ["log-0"], "{:?}", d.actions);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::TransferLogLeader { .. })),
        "never asked again"
    );
}

#[test]
fn a_failed_leader_transfer_is_retried_never_taken_as_unsupported() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    for pod in o.pods.iter_mut().filter(|p| p.name != "log-0") {
        if pod.component == Component::Log {
            pod.version = "v1.2.4".into();
        }
    }
    let d = decide(&mut p, &o);
    let transfer: Vec<Action> = d
        .actions
        .iter()
        .filter(|a| matches!(a, Action::TransferLogLeader { .. }))
        .cloned()
        .collect();
    assert!(!transfer.is_empty(), "{:?}", d.actions);
    for error in [
        ActionError::Timeout("5s".into()),
        ActionError::Unavailable("no leader".into()),
    ] {
        let results = answered(&transfer, Err(error));
        o.now += Millis::from_secs(10);
        let d = p.decide(PolicyInput {
            observation: &o,
            results: &results,
        });
        assert!(restarts(&d).is_empty(), "{:?}", d.actions);
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::TransferLogLeader { .. })),
            "sent again: {:?}",
            d.actions
        );
    }
}

#[test]
fn a_stall_halts_with_the_failing_gate_and_then_does_nothing() {
    let config = SafeConfig::default();
    let mut p = SafePolicy::new(config.clone());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    // Two LOG peers never catch up: no restart keeps a majority, ever.
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, false, false]);
    o.tn_wal_tolerance = Some(config.tn_wal_tolerance);
    let mut notes = vec![];
    for t in 0..(config.stall_timeout.0 / 1000 + 120) {
        o.now = Millis::from_secs(100 + t);
        let d = decide(&mut p, &o);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::RestartPod { .. } | Action::DeletePod { .. })),
            "a stall never restarts or deletes"
        );
        notes.extend(d.notes);
    }
    let halted = notes.iter().find_map(|n| match n {
        PolicyNote::Holding { subject, reason }
            if subject == "rollout" && reason.starts_with("halted") =>
        {
            Some(reason.clone())
        }
        _ => None,
    });
    let reason = halted.expect("halted with a reason");
    assert!(
        reason.contains("log phase") && reason.contains("shard 1"),
        "{reason}"
    );
}

#[test]
fn a_gate_that_flaps_halts_at_the_stall_timeout_instead_of_holding_for_good() {
    let config = SafeConfig::default();
    let (mut p, mut o) = proxy_first_upgrade(config.clone());
    let old = o.pods.iter().position(|x| x.name == "proxy-0").unwrap();
    o.pods[old].uid = "u-px-0b".into();
    o.pods[old].version = "v1.2.4".into();
    o.pods[old].started_at = Some(o.now);
    let start = o.now;
    let window = config.stability_window.0 / 1000;
    let mut halted = None;
    let mut seconds = 0;
    while halted.is_none() && seconds < 3 * config.stall_timeout.0 / 1000 {
        seconds += 1;
        o.now = start + Millis::from_secs(seconds);
        // Healthy for half the stability window, then a failed read: the window never fills.
        let healthy = seconds % window < window / 2;
        o.proxy_routes.insert(
            "proxy-0".into(),
            if healthy {
                Ok(2)
            } else {
                Err(ObservationError::Timeout("route check".into()))
            },
        );
        let d = decide(&mut p, &o);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::RestartPod { pod, .. } if pod == "proxy-1")),
            "the rollout never advances past a gate that never holds for its window"
        );
        halted = d.notes.iter().find_map(|n| match n {
            PolicyNote::Holding { subject, reason }
                if subject == "rollout" && reason.starts_with("halted") =>
            {
                Some(reason.clone())
            }
            _ => None,
        });
    }
    let reason = halted.expect("a flapping gate halts the rollout");
    assert!(reason.contains("proxy phase"), "{reason}");
    // The stall clock ran from the gate's first pass, not from its last.
    assert!(
        seconds <= config.stall_timeout.0 / 1000 + window + 2,
        "halted after {seconds} s"
    );
}

#[test]
fn rollback_restores_the_phase_through_the_same_gates() {
    let config = SafeConfig {
        on_stall: OnStall::Rollback,
        ..SafeConfig::default()
    };
    // proxy-0 restarts onto v1.2.3.2.4 and never routes again.
    let (mut p, mut o) = proxy_first_upgrade(config.clone());
    o.pods.retain(|x| x.name != "proxy-0");
    o.pods
        .push(pod("proxy-0", Component::Proxy, "v1.2.4", "u-px-0b"));
    o.proxy_routes.insert("proxy-0".into(), Ok(0));
    let mut rolled_back = None;
    for t in 1..(config.stall_timeout.0 / 1000 + 30) {
        o.now = Millis::from_secs(100 + t);
        let d = decide(&mut p, &o);
        follow_proxy_drains(&mut o, &d);
        if let Some(a) = d
            .actions
            .iter()
            .find(|a| matches!(a, Action::RestartPod { .. }))
        {
            rolled_back = Some(a.clone());
            break;
        }
    }
    assert_eq!(
        rolled_back,
        Some(Action::RestartPod {
            pod: "proxy-0".into(),
            uid: "u-px-0b".into(),
            version: "v1.2.3".into()
        }),
        "the stalled phase goes back to its previous version"
    );
}

#[test]
fn cn_evictions_start_a_drain_and_log_tn_evictions_follow_the_gates() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let o = cluster("v1.2.3");
    let req = |pod: &str, uid: &str| EvictionRequest {
        pod: pod.into(),
        uid: uid.into(),
        source: "kubectl-drain".into(),
    };
    assert!(matches!(
        p.review_eviction(&o, &req("cn-0", "u-cn-0")),
        EvictionVerdict::Deny { .. }
    ));
    assert_eq!(p.record().drains.len(), 1);
    assert!(matches!(
        p.review_eviction(&o, &req("cn-0", "stale-uid")),
        EvictionVerdict::Deny { .. }
    ));
    assert_eq!(
        p.review_eviction(&o, &req("log-2", "u-log-2")),
        EvictionVerdict::Allow
    );
    assert!(matches!(
        p.review_eviction(&o, &req("tn-0", "u-tn")),
        EvictionVerdict::Deny { .. }
    ));
    // A proxy with clients: out of its Service first, evicted once none is left on it.
    assert!(matches!(
        p.review_eviction(&o, &req("proxy-1", "u-px-1")),
        EvictionVerdict::Deny { .. }
    ));
    let d = decide(&mut p, &o);
    assert!(d.actions.contains(&Action::SetProxyServing {
        pod: "proxy-1".into(),
        uid: "u-px-1".into(),
        serving: false,
    }));
    let mut out = o.clone();
    proxy_mut(&mut out, "proxy-1").serving = false;
    assert!(matches!(
        p.review_eviction(&out, &req("proxy-1", "u-px-1")),
        EvictionVerdict::Deny { .. }
    ));
    out.proxy_connections.insert("proxy-1".into(), Ok(0));
    decide(&mut p, &out);
    // Counted only once the endpoints had time to follow the label.
    assert!(matches!(
        p.review_eviction(&out, &req("proxy-1", "u-px-1")),
        EvictionVerdict::Deny { .. }
    ));
    out.now += SafeConfig::default().endpoints_settle;
    assert_eq!(
        p.review_eviction(&out, &req("proxy-1", "u-px-1")),
        EvictionVerdict::Allow
    );
    // Out of its Service, proxy-1 is no route for proxy-0's eviction.
    assert!(matches!(
        p.review_eviction(&out, &req("proxy-0", "u-px-0")),
        EvictionVerdict::Deny { .. }
    ));
    // An evictor that gives up: the proxy goes back into its Service.
    out.now += SafeConfig::default().eviction_abandon;
    out.proxy_connections.insert("proxy-1".into(), Ok(3));
    let d = decide(&mut p, &out);
    assert!(d.actions.contains(&Action::SetProxyServing {
        pod: "proxy-1".into(),
        uid: "u-px-1".into(),
        serving: true,
    }));
    let mut lagging = o.clone();
    lagging.hakeeper.as_mut().unwrap().log_shards[0] = shard(0, "log-0", &[true, false, true]);
    assert!(matches!(
        p.review_eviction(&lagging, &req("log-2", "u-log-2")),
        EvictionVerdict::Deny { .. }
    ));
}

#[test]
fn an_unreadable_record_halts_the_rollout_instead_of_starting_over() {
    let mut p = SafePolicy::resume(SafeConfig::default(), "{not json");
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    let d = decide(&mut p, &o);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert!(
        d.notes.iter().any(
            |n| matches!(n, PolicyNote::Holding { reason, .. } if reason.contains("unreadable"))
        )
    );
}

#[test]
fn every_progress_record_round_trips() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    o.tn_wal_tolerance = Some(SafeConfig::default().tn_wal_tolerance);
    for t in 0..30 {
        o.now = Millis::from_secs(100 + t);
        decide(&mut p, &o);
        let record = p.progress_record().unwrap();
        let resumed = SafePolicy::resume(SafeConfig::default(), &record);
        assert_eq!(resumed.record(), p.record());
    }
}

#[test]
fn a_pod_replaced_on_the_old_version_is_restarted_again_not_waited_on() {
    let (mut p, mut o) = proxy_first_upgrade(SafeConfig::default());
    // Someone else deleted it first: the workload recreated it from the old template.
    o.pods.retain(|x| x.name != "proxy-0");
    o.pods
        .push(pod("proxy-0", Component::Proxy, "v1.2.3", "u-px-0-other"));
    let mut again = None;
    for t in 1..15 {
        o.now = Millis::from_secs(100 + t);
        let d = decide(&mut p, &o);
        follow_proxy_drains(&mut o, &d);
        if let Some(a) = d
            .actions
            .into_iter()
            .find(|a| matches!(a, Action::RestartPod { .. }))
        {
            again = Some(a);
            break;
        }
    }
    assert_eq!(
        again,
        Some(Action::RestartPod {
            pod: "proxy-0".into(),
            uid: "u-px-0-other".into(),
            version: "v1.2.4".into()
        })
    );
}

/// A CN restarted for the upgrade and, right after, asked to leave (scale-in): the restart's
/// drain must not keep setting the new instance Working while the removal drains it.
#[test]
fn a_released_restart_drain_leaves_the_new_instance_to_a_newer_drain() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.4");
    // A restart drain of cn-0 (old instance u-cn-0) was released; cn-0 came back as u-cn-0b
    // with its record still Draining, and its removal was requested.
    let mut restart = drain::Drain::new(
        "cn-0",
        "u-cn-0",
        "uuid-cn-0",
        drain::DrainPurpose::Restart {
            version: "v1.2.4".into(),
        },
        Millis::from_secs(1),
    );
    restart.start_epoch = Some(9);
    restart.stage = drain::DrainStage::Released;
    let mut record = p.record().clone();
    record.format = safe::RECORD_FORMAT;
    record.drains.push(restart);
    p = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(&record).unwrap(),
    );
    o.pods.retain(|x| x.name != "cn-0");
    o.pods.push(pod("cn-0", Component::Cn, "v1.2.4", "u-cn-0b"));
    o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Draining;
    o.desired.removals.push(RemovalRequest {
        id: 1,
        pod: "cn-0".into(),
        uid: "u-cn-0b".into(),
        reason: RemovalReason::ScaleIn,
        requested_at: Millis::from_secs(100),
    });
    for t in 0..5 {
        o.now = Millis::from_secs(100 + t);
        let d = decide(&mut p, &o);
        assert!(
            !d.actions.iter().any(|a| matches!(
                a,
                Action::SetCnWorkState {
                    state: WorkState::Working,
                    ..
                }
            )),
            "{:?}",
            d.actions
        );
    }
    let active: Vec<_> = p.record().drains.iter().filter(|d| d.is_active()).collect();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].pod_uid, "u-cn-0b");
}

/// Found in review: an eviction allowed once (the drain Released) but then refused by someone
/// else (a budget, a timeout) is retried later; if the container restarted meanwhile (same
/// pod UID, new start epoch), the retry must not be allowed on the old confirmation.
#[test]
fn a_released_drain_is_checked_again_before_a_second_eviction_is_allowed() {
    let mut evict = drain::Drain::new(
        "cn-0",
        "u-cn-0",
        "uuid-cn-0",
        drain::DrainPurpose::Evict {
            source: "kubectl-drain".into(),
        },
        Millis::from_secs(1),
    );
    evict.start_epoch = Some(10);
    evict.stage = drain::DrainStage::Released;
    let mut record = SafePolicy::new(SafeConfig::default()).record().clone();
    record.format = safe::RECORD_FORMAT;
    record.drains.push(evict);
    let mut p = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(&record).unwrap(),
    );
    let mut o = cluster("v1.2.3");
    // The same pod object, a new process: HAKeeper shows a new start epoch, Working again.
    o.hakeeper.as_mut().unwrap().cns[0].start_epoch = 11;
    let verdict = p.review_eviction(
        &o,
        &EvictionRequest {
            pod: "cn-0".into(),
            uid: "u-cn-0".into(),
            source: "kubectl-drain".into(),
        },
    );
    assert!(
        matches!(&verdict, EvictionVerdict::Deny { reason } if reason.contains("confirmed again")),
        "{verdict:?}"
    );
    let d = p
        .record()
        .drains
        .iter()
        .find(|d| d.is_active())
        .expect("the drain goes on");
    assert_eq!(d.stage, drain::DrainStage::MarkDraining);
}

#[test]
fn evictions_of_the_last_two_cns_in_the_same_instant_drain_only_one() {
    // Both drains are decided in one step, before HAKeeper shows either mark: the second must
    // count the first as draining, or both CNs are marked and neither's sessions can move.
    let mut p = SafePolicy::new(SafeConfig::default());
    let o = cluster("v1.2.3");
    for (pod, uid) in [("cn-0", "u-cn-0"), ("cn-1", "u-cn-1")] {
        let req = EvictionRequest {
            pod: pod.into(),
            uid: uid.into(),
            source: "cluster-autoscaler".into(),
        };
        assert!(matches!(
            p.review_eviction(&o, &req),
            EvictionVerdict::Deny { .. }
        ));
    }
    let marked = |d: &Decision| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::SetCnWorkState {
                    uuid,
                    state: WorkState::Draining,
                } => Some(uuid.clone()),
                _ => None,
            })
            .collect()
    };
    let first = decide(&mut p, &o);
    assert_eq!(marked(&first), vec!["uuid-cn-0".to_string()]);
    // Next tick, the mark still not visible: still only the first.
    let mut later = o.clone();
    later.now = o.now + Millis::from_secs(1);
    assert_eq!(
        marked(&decide(&mut p, &later)),
        vec!["uuid-cn-0".to_string()]
    );
}

#[test]
fn two_lock_owners_never_hand_over_at_once() {
    // Each owner, once marked, makes new lockers of its tables retry until its own
    // transactions end; two at once can wait on each other for good. The second waits.
    let mut o = cluster("v1.2.3");
    o.pods.push(pod("cn-2", Component::Cn, "v1.2.3", "u-cn-2"));
    o.hakeeper.as_mut().unwrap().cns.push(CnStoreView {
        uuid: "uuid-cn-2".into(),
        start_epoch: 12,
        work_state: WorkState::Working,
        heartbeat_age: Millis(500),
        version: "v1.2.3".into(),
    });
    o.cn_activity
        .insert("cn-2".to_string(), Ok(CnActivity::default()));
    let mut p = SafePolicy::new(SafeConfig::default());
    for (pod, uid) in [("cn-0", "u-cn-0"), ("cn-1", "u-cn-1")] {
        let req = EvictionRequest {
            pod: pod.into(),
            uid: uid.into(),
            source: "cluster-autoscaler".into(),
        };
        assert!(matches!(
            p.review_eviction(&o, &req),
            EvictionVerdict::Deny { .. }
        ));
    }
    decide(&mut p, &o);
    for cn in &mut o.hakeeper.as_mut().unwrap().cns[..2] {
        cn.work_state = WorkState::Draining;
    }
    // The allocator answers for every draining CN: entries no request reached yet.
    for uuid in ["uuid-cn-0", "uuid-cn-1"] {
        o.lock_allocator.as_mut().unwrap().restarting.insert(
            uuid.into(),
            RestartAnswer {
                can_restart: false,
                remaining_txns: -1,
            },
        );
    }
    let handshakes = |d: &Decision| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::SetRestartService { uuid } => Some(uuid.clone()),
                _ => None,
            })
            .collect()
    };
    // (Unanswered, the request is sent again: only which CNs are asked matters here.)
    let mut sent = std::collections::BTreeSet::new();
    for s in 1..=30 {
        o.now = Millis::from_secs(100 + s);
        sent.extend(handshakes(&decide(&mut p, &o)));
    }
    assert_eq!(
        sent.into_iter().collect::<Vec<_>>(),
        vec!["uuid-cn-0".to_string()],
        "only the first hands over"
    );
}

/// A CN drained for its restart is deleted by someone else and recreated, and an evictor asks
/// for the new pod: the new pod's drain owns it. The old drain ends instead of returning the
/// new instance to Working under it (found by `campaign --seeds 10000`, seed 3504: the new
/// instance was set Working while the eviction drain's hand-over made it refuse new writes).
#[test]
fn a_drain_whose_pod_was_replaced_leaves_the_new_instance_to_the_new_pods_drain() {
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = cluster("v1.2.3");
    upgrade(
        &mut o,
        r#"{"cn":[],"log":["cn"],"tn":["log"],"proxy":["tn"]}"#,
    );
    decide(&mut p, &o);
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(
        d.actions.contains(&Action::SetCnWorkState {
            uuid: "uuid-cn-0".into(),
            state: WorkState::Draining
        }),
        "{:?} {:?}",
        d.actions,
        p.holds()
    );
    o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Draining;
    o.cn_activity.insert(
        "cn-0".into(),
        Ok(CnActivity {
            sessions: 2,
            ..CnActivity::default()
        }),
    );
    o.now += Millis::from_secs(1);
    decide(&mut p, &o);
    // Deleted by hand and recreated: a new pod, whose instance HAKeeper has heard from, with
    // the kept record's Draining mark.
    o.pods.retain(|x| x.name != "cn-0");
    let mut new = pod("cn-0", Component::Cn, "v1.2.3", "u-cn-0b");
    new.started_at = Some(o.now);
    o.pods.push(new);
    o.cn_activity
        .insert("cn-0".into(), Ok(CnActivity::default()));
    o.now += Millis::from_secs(5);
    let verdict = p.review_eviction(
        &o,
        &EvictionRequest {
            pod: "cn-0".into(),
            uid: "u-cn-0b".into(),
            source: "consolidation-agent".into(),
        },
    );
    assert!(matches!(verdict, EvictionVerdict::Deny { .. }));
    for _ in 0..3 {
        o.now += Millis::from_secs(1);
        let d = decide(&mut p, &o);
        assert!(
            !d.actions.contains(&Action::SetCnWorkState {
                uuid: "uuid-cn-0".into(),
                state: WorkState::Working
            }),
            "the new instance was returned to Working under its eviction drain"
        );
    }
    let old = p
        .record()
        .drains
        .iter()
        .find(|d| d.pod_uid == "u-cn-0")
        .expect("the old drain is kept");
    assert!(!old.is_active(), "{old:?}");
    assert!(
        p.record()
            .drains
            .iter()
            .any(|d| d.pod_uid == "u-cn-0b" && d.is_active())
    );
}

/// A proxy's report says only that it heartbeats and how many CNs HAKeeper lists as Working:
/// Working CNs that take no workload session (idle pooled ones) or are not running give it no
/// route (found by `campaign --seeds 10000`, seed 5732, once the simulator reported proxies as
/// the operator sees them).
#[test]
fn a_proxy_counts_as_a_route_only_with_a_running_cn_that_serves_the_workload() {
    let mut o = cluster("v1.2.3");
    assert!(gates::other_proxy_routes(&o, Some("proxy-0")).is_ok());
    for p in o.pods.iter_mut().filter(|p| p.component == Component::Cn) {
        p.pool_phase = Some(PoolPhase::Idle);
    }
    let e = gates::other_proxy_routes(&o, Some("proxy-0")).unwrap_err();
    assert!(e.contains("serves the workload"), "{e}");
    assert!(gates::proxy_healthy(&o, "proxy-1", "v1.2.3").is_err());
    for p in o.pods.iter_mut().filter(|p| p.component == Component::Cn) {
        p.pool_phase = None;
        p.ready = false;
    }
    assert!(gates::other_proxy_routes(&o, Some("proxy-0")).is_err());
}

/// `cluster` with `cns` CNs and `proxies` proxies.
fn wide(cns: usize, proxies: usize) -> Observation {
    let mut o = cluster("v1.2.3");
    for i in 2..cns {
        let name = format!("cn-{i}");
        let mut p = pod(&name, Component::Cn, "v1.2.3", &format!("u-cn-{i}"));
        p.node = format!("node-{name}");
        o.node_images
            .insert(p.node.clone(), vec!["v1.2.3".into(), "v1.2.4".into()]);
        o.pods.push(p);
        o.hakeeper.as_mut().unwrap().cns.push(CnStoreView {
            uuid: format!("uuid-{name}"),
            start_epoch: 10 + i as u64,
            work_state: WorkState::Working,
            heartbeat_age: Millis(500),
            version: "v1.2.3".into(),
        });
        o.cn_activity.insert(name, Ok(CnActivity::default()));
    }
    for i in 2..proxies {
        let name = format!("proxy-{i}");
        let p = pod(&name, Component::Proxy, "v1.2.3", &format!("u-px-{i}"));
        o.node_images
            .insert(p.node.clone(), vec!["v1.2.3".into(), "v1.2.4".into()]);
        o.pods.push(p);
        o.proxy_routes.insert(name.clone(), Ok(cns as u32));
        o.proxy_connections.insert(name, Ok(3));
    }
    o
}

fn out_of_service(d: &Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::SetProxyServing {
                pod,
                serving: false,
                ..
            } => Some(pod.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn proxies_restart_as_many_at_once_as_max_unavailable_allows_and_one_keeps_routing() {
    for (width, expected) in [
        (MaxUnavailable::Pods(1), vec!["proxy-0"]),
        (MaxUnavailable::Pods(2), vec!["proxy-0", "proxy-1"]),
        // All of them asked for: one still routes.
        (MaxUnavailable::Percent(100), vec!["proxy-0", "proxy-1"]),
    ] {
        let mut p = SafePolicy::new(SafeConfig {
            proxy_max_unavailable: width,
            ..SafeConfig::default()
        });
        let mut o = wide(2, 3);
        upgrade(
            &mut o,
            r#"{"proxy":[],"log":["proxy"],"tn":["log"],"cn":["tn"]}"#,
        );
        let d = decide(&mut p, &o);
        assert_eq!(out_of_service(&d), expected, "width {width}");
        follow_proxy_drains(&mut o, &d);
        // Clients gone, the endpoints followed: each proxy out restarts, in the same tick.
        o.now += SafeConfig::default().endpoints_settle + Millis::from_secs(1);
        let d = decide(&mut p, &o);
        let restarted = restarts(&d);
        assert_eq!(restarted, expected, "width {width}");
        assert!(out_of_service(&d).is_empty(), "{:?}", d.actions);
    }
}

#[test]
fn a_proxy_lane_puts_its_proxy_back_when_the_last_routing_one_fails() {
    let mut p = SafePolicy::new(SafeConfig {
        proxy_max_unavailable: MaxUnavailable::Pods(2),
        ..SafeConfig::default()
    });
    let mut o = wide(2, 3);
    upgrade(
        &mut o,
        r#"{"proxy":[],"log":["proxy"],"tn":["log"],"cn":["tn"]}"#,
    );
    let d = decide(&mut p, &o);
    follow_proxy_drains(&mut o, &d);
    // The proxy left in service stops routing: neither out-of-service proxy may stop.
    o.proxy_routes.insert(
        "proxy-2".into(),
        Err(ObservationError::Timeout("read".into())),
    );
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(restarts(&d).is_empty(), "{:?}", d.actions);
    let back: std::collections::BTreeSet<&str> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::SetProxyServing {
                pod, serving: true, ..
            } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        back.into_iter().collect::<Vec<_>>(),
        vec!["proxy-0", "proxy-1"]
    );
}

#[test]
fn cns_drain_as_many_at_once_as_max_unavailable_allows_and_hand_over_one_at_a_time() {
    let mut p = SafePolicy::new(SafeConfig {
        cn_max_unavailable: MaxUnavailable::Pods(2),
        ..SafeConfig::default()
    });
    let mut o = wide(4, 2);
    upgrade(
        &mut o,
        r#"{"cn":[],"log":["cn"],"tn":["log"],"proxy":["tn"]}"#,
    );
    let marked = marked_within(&mut p, &mut o, 3);
    assert_eq!(
        marked,
        vec!["uuid-cn-0", "uuid-cn-1"],
        "two of four at once"
    );
    let rollout = p.record().rollout.as_ref().expect("rollout");
    let pods: Vec<&str> = rollout.steps().filter_map(|s| s.pod()).collect();
    assert_eq!(pods, vec!["cn-0", "cn-1"]);
    // The record keeps both lanes across an operator restart.
    let record = p.progress_record().expect("record");
    let resumed = SafePolicy::resume(SafeConfig::default(), &record);
    assert_eq!(resumed.record(), p.record());
}

#[test]
fn four_cns_of_which_two_are_draining_leave_no_room_for_a_third_at_any_width() {
    // Width 100% of 3 CNs: every restart still needs another CN Working, so at most two go.
    let mut p = SafePolicy::new(SafeConfig {
        cn_max_unavailable: MaxUnavailable::Percent(100),
        ..SafeConfig::default()
    });
    let mut o = wide(3, 2);
    upgrade(
        &mut o,
        r#"{"cn":[],"log":["cn"],"tn":["log"],"proxy":["tn"]}"#,
    );
    let marked = marked_within(&mut p, &mut o, 5);
    assert_eq!(marked, vec!["uuid-cn-0", "uuid-cn-1"]);
}

/// The CNs marked Draining over `seconds` one-second steps (the marks are not applied, so
/// every drain stays at its first stage).
fn marked_within(p: &mut SafePolicy, o: &mut Observation, seconds: u64) -> Vec<String> {
    let mut marked = std::collections::BTreeSet::new();
    for _ in 0..seconds {
        let d = decide(p, o);
        marked.extend(d.actions.iter().filter_map(|a| match a {
            Action::SetCnWorkState {
                uuid,
                state: WorkState::Draining,
            } => Some(uuid.clone()),
            _ => None,
        }));
        o.now += Millis::from_secs(1);
    }
    marked.into_iter().collect()
}

#[test]
fn max_unavailable_reads_counts_and_percentages() {
    assert_eq!(MaxUnavailable::parse("2"), Ok(MaxUnavailable::Pods(2)));
    assert_eq!(
        MaxUnavailable::parse("25%"),
        Ok(MaxUnavailable::Percent(25))
    );
    assert!(MaxUnavailable::parse("101%").is_err());
    assert!(MaxUnavailable::parse("two").is_err());
    assert_eq!(MaxUnavailable::Percent(25).of(8), 2);
    assert_eq!(MaxUnavailable::Percent(10).of(3), 1, "never less than one");
    assert_eq!(MaxUnavailable::Pods(0).of(3), 1);
}

#[test]
fn a_proxy_prepared_during_the_window_goes_back_when_the_restarted_one_fails_its_gate() {
    // Three proxies, one at a time: proxy-2 keeps routing throughout, so only the
    // preparation rule (not the route gate) sends proxy-1 back.
    let mut p = SafePolicy::new(SafeConfig::default());
    let mut o = wide(2, 3);
    upgrade(
        &mut o,
        r#"{"proxy":[],"log":["proxy"],"tn":["log"],"cn":["tn"]}"#,
    );
    let d = decide(&mut p, &o);
    assert_eq!(out_of_service(&d), vec!["proxy-0"]);
    follow_proxy_drains(&mut o, &d);
    o.now += SafeConfig::default().endpoints_settle + Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert_eq!(restarts(&d), vec!["proxy-0"]);
    // The new proxy-0, in its Service and routing.
    let now = o.now;
    let new = proxy_mut(&mut o, "proxy-0");
    new.uid = "u-px-0b".into();
    new.version = "v1.2.4".into();
    new.serving = true;
    new.started_at = Some(now);
    o.proxy_connections.insert("proxy-0".into(), Ok(3));
    // Seen restarted, then healthy: its window starts, and proxy-1 leaves its Service.
    let mut out = vec![];
    for _ in 0..3 {
        o.now += Millis::from_secs(1);
        let d = decide(&mut p, &o);
        assert!(restarts(&d).is_empty(), "{:?}", d.actions);
        out.extend(out_of_service(&d));
        follow_proxy_drains(&mut o, &d);
    }
    assert_eq!(out, vec!["proxy-1"]);
    // Its clients gone, proxy-1 still waits for proxy-0's window.
    o.now += SafeConfig::default().endpoints_settle + Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(restarts(&d).is_empty(), "{:?}", d.actions);
    // proxy-0 stops routing within its window: proxy-1 goes back into its Service.
    o.proxy_routes.insert(
        "proxy-0".into(),
        Err(ObservationError::Timeout("route check".into())),
    );
    o.now += Millis::from_secs(1);
    let d = decide(&mut p, &o);
    assert!(restarts(&d).is_empty(), "{:?}", d.actions);
    assert!(
        d.actions.contains(&Action::SetProxyServing {
            pod: "proxy-1".into(),
            uid: "u-px-1".into(),
            serving: true,
        }),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_creation_slower_than_the_stall_timeout_alarms_and_finishes_once_its_pods_are_ready() {
    let config = SafeConfig::default();
    let mut p = SafePolicy::new(config.clone());
    // A new cluster: every pod created on the target version, LOG pods not Ready yet.
    let mut o = cluster("v1.2.4");
    upgrade(&mut o, LOG_FIRST);
    for x in o.pods.iter_mut().filter(|x| x.component == Component::Log) {
        x.ready = false;
    }
    let start = o.now;
    let stall = config.stall_timeout.0 / 1000;
    let mut notes = vec![];
    for t in 0..=(stall + 60) {
        o.now = start + Millis::from_secs(t);
        let d = decide(&mut p, &o);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::RestartPod { .. } | Action::DeletePod { .. })),
            "a creation restarts nothing"
        );
        notes.extend(d.notes);
    }
    let rollout = p.record().rollout.clone().expect("the creation's rollout");
    assert_eq!(
        rollout.status,
        RolloutStatus::Running,
        "a creation never halts"
    );
    assert!(rollout.alarmed, "past the stall timeout it raises an alarm");
    let alarm = notes
        .iter()
        .find_map(|n| match n {
            PolicyNote::Holding { subject, reason } if subject == "rollout" => {
                reason.starts_with("ALARM").then(|| reason.clone())
            }
            _ => None,
        })
        .expect("an alarm note");
    assert!(alarm.contains("log phase"), "{alarm}");
    assert!(
        !notes.iter().any(
            |n| matches!(n, PolicyNote::Holding { reason, .. } if reason.starts_with("halted"))
        ),
        "no halt"
    );
    // The LOG pods turn Ready: the creation goes on and finishes, the alarm cleared.
    for x in o.pods.iter_mut() {
        x.ready = true;
    }
    let mut finished = false;
    for t in 1..=120 {
        o.now = start + Millis::from_secs(stall + 60 + t);
        let d = decide(&mut p, &o);
        if d.notes.contains(&PolicyNote::UpgradeFinished) {
            finished = true;
            break;
        }
    }
    assert!(finished, "the creation finishes once its gates hold");
    assert!(!p.record().rollout.as_ref().unwrap().alarmed);
}

#[test]
fn a_creation_halted_by_an_older_operator_resumes_alarmed() {
    let config = SafeConfig::default();
    let mut p = SafePolicy::new(config.clone());
    let mut o = cluster("v1.2.4");
    upgrade(&mut o, LOG_FIRST);
    o.pods[0].ready = false;
    decide(&mut p, &o);
    let mut record: serde_json::Value =
        serde_json::from_str(&p.progress_record().unwrap()).unwrap();
    record["rollout"]["status"] =
        serde_json::json!({"status": "halted", "reason": "stalled in the log phase"});
    record["rollout"]["last_progress"] = serde_json::json!(0);
    let mut p = SafePolicy::resume(config.clone(), &record.to_string());
    assert!(matches!(
        p.record().rollout.as_ref().unwrap().status,
        RolloutStatus::Halted { .. }
    ));
    o.now += config.stall_timeout;
    let d = decide(&mut p, &o);
    let rollout = p.record().rollout.as_ref().unwrap();
    assert_eq!(rollout.status, RolloutStatus::Running);
    assert!(rollout.alarmed);
    assert!(
        d.notes.iter().any(
            |n| matches!(n, PolicyNote::Holding { reason, .. } if reason.starts_with("ALARM"))
        )
    );
    // Once log-0 is Ready the creation finishes.
    o.pods[0].ready = true;
    let finished = (0..300).any(|_| {
        o.now += Millis::from_secs(1);
        decide(&mut p, &o)
            .notes
            .contains(&PolicyNote::UpgradeFinished)
    });
    assert!(finished);
}

#[test]
fn an_upgrade_stall_still_halts() {
    // The creation rule is about creations only: an upgrade from v1.2.3 still halts at the stall.
    let config = SafeConfig::default();
    let mut p = SafePolicy::new(config.clone());
    let mut o = cluster("v1.2.3");
    upgrade(&mut o, LOG_FIRST);
    o.hakeeper.as_mut().unwrap().log_shards[1] = shard(1, "log-0", &[true, false, false]);
    o.tn_wal_tolerance = Some(config.tn_wal_tolerance);
    let start = o.now;
    for t in 0..=(config.stall_timeout.0 / 1000 + 5) {
        o.now = start + Millis::from_secs(t);
        decide(&mut p, &o);
    }
    assert!(matches!(
        p.record().rollout.as_ref().unwrap().status,
        RolloutStatus::Halted { .. }
    ));
}

/// A pod whose kubelet ended it for good (Failed) runs nothing: the core deletes it, bound to
/// that instance, so it is replaced; every door lets it go, the TN's included; a drain of such
/// a CN waits for nothing it cannot have.
#[test]
fn a_terminal_pod_is_replaced_and_every_door_lets_it_go() {
    let mut obs = cluster("v1.2.3");
    for name in ["tn-0", "cn-1"] {
        let p = obs.pods.iter_mut().find(|p| p.name == name).expect("pod");
        p.phase = PodPhase::Failed;
        p.ready = false;
    }
    let mut policy = SafePolicy::new(SafeConfig::default());
    let decision = policy.decide(PolicyInput {
        observation: &obs,
        results: &[],
    });
    let deleted: Vec<(&str, &str)> = decision
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::DeletePod { pod, uid, .. } => Some((pod.as_str(), uid.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, [("tn-0", "u-tn"), ("cn-1", "u-cn-1")]);
    // Sent once per resend interval, not on every tick.
    obs.now += Millis(500);
    let again = policy.decide(PolicyInput {
        observation: &obs,
        results: &[],
    });
    assert!(
        !again
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeletePod { .. })),
        "{:?}",
        again.actions
    );
    for (pod, uid) in [("tn-0", "u-tn"), ("cn-1", "u-cn-1")] {
        let verdict = policy.review_eviction(
            &obs,
            &EvictionRequest {
                pod: pod.into(),
                uid: uid.into(),
                source: "the StatefulSet controller".into(),
            },
        );
        assert_eq!(verdict, EvictionVerdict::Allow, "{pod}");
    }
    // A running TN stays protected.
    obs.pods
        .iter_mut()
        .find(|p| p.name == "tn-0")
        .expect("tn")
        .phase = PodPhase::Running;
    let verdict = policy.review_eviction(
        &obs,
        &EvictionRequest {
            pod: "tn-0".into(),
            uid: "u-tn".into(),
            source: "kubectl drain".into(),
        },
    );
    assert!(matches!(verdict, EvictionVerdict::Deny { .. }));
}

// ---------------------------------------------------------------------------------------------
// Rollouts under second thoughts: halts, rollbacks and spec changes never move a pod forward.

use mo_core::drain::{Drain, DrainPurpose, DrainStage};
use mo_core::rollout::{Rollout, Step};

const CN_FIRST: &str = r#"{"cn":[],"log":["cn"],"tn":["log"],"proxy":["tn"]}"#;

/// Three CNs in a CN-first upgrade to v1.2.3.2.4: cn-0 restarted onto v1.2.3.2.4 (in its stability window),
/// cn-1 prepared for v1.2.3.2.4 in a second lane (its drain at `stage`, its hand-over requested or
/// not). The rollout as `status` has it.
fn prepared(
    status: RolloutStatus,
    stage: DrainStage,
    handed_over: bool,
) -> (SafePolicy, Observation) {
    let mut o = wide(3, 2);
    upgrade(&mut o, CN_FIRST);
    let cn0 = o.pods.iter_mut().find(|p| p.name == "cn-0").expect("cn-0");
    cn0.version = "v1.2.4".into();
    cn0.uid = "u-cn-0b".into();
    let d = o.hakeeper.as_mut().unwrap();
    d.cns[0].version = "v1.2.4".into();
    d.cns[1].work_state = WorkState::Draining;
    let spec = o.desired.upgrade.clone().expect("upgrade");
    let mut rollout = Rollout::start(&spec, &o, None);
    rollout.creation = Some(false);
    rollout.previous = Component::ALL
        .iter()
        .map(|c| (*c, "v1.2.3".to_string()))
        .collect();
    rollout.phase_started = true;
    rollout.status = status;
    rollout.step = Step::Verify {
        pod: "cn-0".into(),
        old_epoch: Some(10),
        restarts: 0,
        healthy_since: Some(o.now),
    };
    rollout.more = vec![
        serde_json::from_value(serde_json::json!({
            "step": {"step": "drain_cn", "pod": "cn-1", "uid": "u-cn-1"}
        }))
        .expect("a lane"),
    ];
    let mut drain = Drain::new(
        "cn-1",
        "u-cn-1",
        "uuid-cn-1",
        DrainPurpose::Restart {
            version: "v1.2.4".into(),
        },
        o.now,
    );
    drain.stage = stage;
    drain.rollout = Some("v1.2.4".into());
    drain.start_epoch = Some(11);
    drain.instance = Some(mo_core::drain::Instance::of(o.pod("cn-1").expect("cn-1")));
    if handed_over {
        drain.handshake_sent_at = Some(o.now);
        drain.handshake_acked_at = Some(o.now);
        drain.process_marked = true;
    }
    // Every CN's lock service and transaction list read: nothing old runs, cn-1 holds nothing.
    for (_, activity) in o.cn_activity.iter_mut() {
        if let Ok(a) = activity {
            a.locks = Some(0);
            a.live_lock_holders = Some(0);
            a.oldest_txn = OldestTxn::NoneRunning;
        }
    }
    let record = ProgressRecord {
        format: mo_core::safe::RECORD_FORMAT,
        rollout: Some(rollout),
        drains: vec![drain],
        ..ProgressRecord::default()
    };
    let p = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(&record).expect("record"),
    );
    o.now += Millis::from_secs(1);
    (p, o)
}

/// The lock allocator answers "can restart, 0" for cn-1: its hand-over is confirmed.
fn allocator_confirms_cn_1(o: &mut Observation) {
    o.lock_allocator = Ok(AllocatorView {
        restarting: BTreeMap::from([(
            "uuid-cn-1".to_string(),
            RestartAnswer {
                can_restart: true,
                remaining_txns: 0,
            },
        )]),
        ..AllocatorView::default()
    });
}

fn sends(d: &Decision, what: fn(&Action) -> bool) -> bool {
    d.actions.iter().any(what)
}

#[test]
fn a_halt_takes_a_prepared_cn_back_and_never_hands_it_over() {
    let halted = RolloutStatus::Halted {
        reason: "cn-0 crashed in its window".into(),
    };
    let (mut p, o) = prepared(halted, DrainStage::HandOver, false);
    let d = decide(&mut p, &o);
    assert!(
        !sends(&d, |a| matches!(a, Action::SetRestartService { .. })),
        "{:?}",
        d.actions
    );
    assert!(!sends(&d, |a| matches!(a, Action::RestartPod { .. })));
    assert!(
        d.actions.contains(&Action::SetCnWorkState {
            uuid: "uuid-cn-1".into(),
            state: WorkState::Working,
        }),
        "the prepared CN goes back to work: {:?}",
        d.actions
    );
    // Whatever its drain says, a halted rollout hands nothing over.
    let rollout = p.record().rollout.as_ref().expect("rollout");
    let timing = SafeConfig::default().rollout_timing();
    assert!(rollout.hand_over_gate(&o, &timing, "cn-1").is_err());
}

#[test]
fn a_cn_handed_over_before_a_halt_is_not_restarted_while_halted() {
    let halted = RolloutStatus::Halted {
        reason: "cn-0 crashed in its window".into(),
    };
    let (mut p, mut o) = prepared(halted, DrainStage::Confirmed, true);
    allocator_confirms_cn_1(&mut o);
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        assert!(
            !sends(&d, |a| matches!(
                a,
                Action::RestartPod { .. } | Action::DeletePod { .. }
            )),
            "{:?}",
            d.actions
        );
        assert!(
            !sends(&d, |a| matches!(
                a,
                Action::SetCnWorkState {
                    state: WorkState::Working,
                    ..
                }
            )),
            "a marked CN never serves again: {:?}",
            d.actions
        );
        o.now += Millis::from_secs(5);
    }
    let drain = &p.record().drains[0];
    assert!(
        drain
            .release_held
            .as_deref()
            .is_some_and(|h| h.contains("halted")),
        "{:?}",
        drain.release_held
    );
}

#[test]
fn a_version_set_back_takes_a_prepared_cn_back_and_restarts_a_handed_over_one_in_place() {
    // Not yet handed over: back to work, nothing restarted.
    let (mut p, mut o) = prepared(RolloutStatus::Running, DrainStage::HandOver, false);
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v1.2.3".into();
    let d = decide(&mut p, &o);
    assert!(
        !sends(&d, |a| matches!(a, Action::SetRestartService { .. })),
        "{:?}",
        d.actions
    );
    assert!(!sends(
        &d,
        |a| matches!(a, Action::RestartPod { version, .. } if version == "v1.2.4")
    ));
    assert!(
        d.actions.contains(&Action::SetCnWorkState {
            uuid: "uuid-cn-1".into(),
            state: WorkState::Working,
        }),
        "the prepared CN goes back to work: {:?}",
        d.actions
    );
    // Handed over: it cannot serve again; it goes back onto the version it runs (v1.2.3, where the
    // cluster now goes), never onto the abandoned v1.2.3.2.4.
    let (mut p, mut o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v1.2.3".into();
    allocator_confirms_cn_1(&mut o);
    let mut restarted = Vec::new();
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        restarted.extend(d.actions.iter().filter_map(|a| match a {
            Action::RestartPod { pod, version, .. } => Some((pod.clone(), version.clone())),
            _ => None,
        }));
        o.now += Millis::from_secs(5);
    }
    assert!(
        restarted.iter().all(|(_, v)| v == "v1.2.3"),
        "nothing onto the abandoned version: {restarted:?}"
    );
}

#[test]
fn a_rollback_keeps_a_handed_over_cn_in_its_lane_and_sends_it_back_not_forward() {
    let (p, mut o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    allocator_confirms_cn_1(&mut o);
    // cn-0 crashed in its window (its gate fails past the stall timeout): the phase rolls back.
    o.pods
        .iter_mut()
        .find(|p| p.name == "cn-0")
        .expect("cn-0")
        .restarts = 1;
    let config = SafeConfig {
        on_stall: OnStall::Rollback,
        ..SafeConfig::default()
    };
    let record = p.progress_record().expect("record");
    let mut p = SafePolicy::resume(config, &record);
    o.now += SafeConfig::default().stall_timeout;
    let mut restarted = Vec::new();
    let mut drained = Vec::new();
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        restarted.extend(d.actions.iter().filter_map(|a| match a {
            Action::RestartPod { pod, version, .. } => Some((pod.clone(), version.clone())),
            _ => None,
        }));
        drained.extend(d.actions.iter().filter_map(|a| match a {
            Action::SetCnWorkState {
                uuid,
                state: WorkState::Draining,
            } => Some(uuid.clone()),
            _ => None,
        }));
        o.now += Millis::from_secs(5);
    }
    assert!(p.record().rollout.as_ref().is_some_and(|r| r.rolling_back));
    assert!(
        drained.is_empty(),
        "no other CN is drained while cn-1 is down: {drained:?}"
    );
    assert!(
        !restarted.iter().any(|(_, v)| v == "v1.2.4"),
        "nothing goes forward while rolling back: {restarted:?}"
    );
    // cn-1 keeps its lane (the phase's one pod down): cn-0 goes back only after it.
    let pods: std::collections::BTreeSet<&str> =
        restarted.iter().map(|(pod, _)| pod.as_str()).collect();
    assert_eq!(
        pods.into_iter().collect::<Vec<_>>(),
        ["cn-1"],
        "one CN down at a time at width 1: {restarted:?}"
    );
}

/// The same state on two catalogs: v3.0.15 (catalog 3.0.3) for v1.2.3, v4.0.0-rc2 (catalog
/// 4.0.0) for v1.2.4 (both v1.2 releases bring catalog 1.2.3).
fn across_catalogs(
    p: &SafePolicy,
    o: &Observation,
    config: SafeConfig,
) -> (SafePolicy, Observation) {
    let swap = |text: String| {
        text.replace("\"v1.2.3\"", "\"v3.0.15\"")
            .replace("\"v1.2.4\"", "\"v4.0.0-rc2\"")
    };
    let record = swap(p.progress_record().expect("record"));
    let o = serde_json::from_str(&swap(serde_json::to_string(o).expect("json"))).expect("obs");
    (SafePolicy::resume(config, &record), o)
}

#[test]
fn a_version_set_back_past_a_newer_catalog_is_refused_and_nothing_restarts() {
    // cn-0 runs v4.0.0-rc2: its start may have moved the catalog to 4.0.0, where no CN of
    // v3.0.15 (catalog 3.0.3) starts again.
    let (p, o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    let (mut p, mut o) = across_catalogs(&p, &o, SafeConfig::default());
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v3.0.15".into();
    let mut notes = Vec::new();
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        assert!(
            restarts(&d).is_empty(),
            "nothing goes back: {:?}",
            d.actions
        );
        notes.extend(d.notes);
        o.now += Millis::from_secs(5);
    }
    let rollout = p.record().rollout.as_ref().expect("rollout");
    let RolloutStatus::Halted { reason } = &rollout.status else {
        panic!("refused: {:?}", rollout.status);
    };
    for named in [
        "v3.0.15 refused",
        "catalog 3.0.3",
        "v4.0.0-rc2",
        "catalog 4.0.0",
    ] {
        assert!(reason.contains(named), "{named}: {reason}");
    }
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, PolicyNote::Holding { reason: r, .. } if r.contains("refused"))),
        "said why: {notes:?}"
    );
    // Forward again: the rollout resumes where the cluster is.
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v4.0.0-rc2".into();
    decide(&mut p, &o);
    let rollout = p.record().rollout.as_ref().expect("rollout");
    assert_eq!(rollout.status, RolloutStatus::Running);
    assert_eq!(
        rollout.previous.get(&Component::Cn).map(String::as_str),
        Some("v3.0.15")
    );
}

#[test]
fn a_record_written_before_the_cn_history_still_refuses_the_way_back() {
    // The same set-back, from a record without `cn_versions`: the history is its previous
    // version then its target, never an order read from the pods (most of them on the target).
    let (p, o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    let (p, mut o) = across_catalogs(&p, &o, SafeConfig::default());
    let mut record: serde_json::Value =
        serde_json::from_str(&p.progress_record().expect("record")).expect("json");
    record["rollout"]
        .as_object_mut()
        .expect("rollout")
        .remove("cn_versions");
    let mut p = SafePolicy::resume(SafeConfig::default(), &record.to_string());
    // Most CNs on the target, one still on the previous version: read from the pods alone,
    // the previous version would come last, as if it had run after the target.
    for pod in o
        .pods
        .iter_mut()
        .filter(|p| p.name != "cn-2" && p.component == Component::Cn)
    {
        pod.version = "v4.0.0-rc2".into();
    }
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v3.0.15".into();
    let d = decide(&mut p, &o);
    assert!(restarts(&d).is_empty(), "{:?}", d.actions);
    let status = &p.record().rollout.as_ref().expect("rollout").status;
    assert!(
        matches!(status, RolloutStatus::Halted { reason } if reason.contains("v3.0.15 refused")),
        "{status:?}"
    );
}

#[test]
fn a_stalled_cn_phase_past_a_newer_catalog_halts_instead_of_rolling_back() {
    let config = SafeConfig {
        on_stall: OnStall::Rollback,
        ..SafeConfig::default()
    };
    let (p, mut o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    // cn-0 crashed in its window: its gate fails past the stall timeout.
    o.pods
        .iter_mut()
        .find(|p| p.name == "cn-0")
        .expect("cn-0")
        .restarts = 1;
    o.now += SafeConfig::default().stall_timeout;
    // On one catalog (v1.2.3 -> v1.2.4) the phase rolls back; across two it halts, saying why.
    let record = p.progress_record().expect("record");
    let mut same = SafePolicy::resume(config.clone(), &record);
    decide(&mut same, &o);
    assert!(
        same.record()
            .rollout
            .as_ref()
            .is_some_and(|r| r.rolling_back)
    );
    let (mut p, mut o) = across_catalogs(&p, &o, config);
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        assert!(
            restarts(&d).is_empty(),
            "nothing goes back: {:?}",
            d.actions
        );
        o.now += Millis::from_secs(5);
    }
    let rollout = p.record().rollout.as_ref().expect("rollout");
    assert!(!rollout.rolling_back);
    let RolloutStatus::Halted { reason } = &rollout.status else {
        panic!("halted: {:?}", rollout.status);
    };
    assert!(
        reason.contains("stalled in the cn phase")
            && reason.contains("no rollback")
            && reason.contains("catalog 4.0.0"),
        "{reason}"
    );
}

/// Runs the CN phase of `prepared` with cn-2 (still on the old version) crashed, its process
/// gone (`running` false: Kubernetes shows no running container), for a minute past cn-0's
/// window; returns cn-2's restarts (each with its version), whether cn-2 was ever asked to
/// drain, and the policy's notes.
fn cn_phase_with_cn2_crashed(across: bool, running: bool) -> (Vec<String>, bool, Vec<PolicyNote>) {
    let (p, mut o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    // Only cn-0 moved so far: cn-1 is not prepared (no lane, no drain, Working).
    let mut record: serde_json::Value =
        serde_json::from_str(&p.progress_record().expect("record")).expect("json");
    record["rollout"]["more"] = serde_json::json!([]);
    record["drains"] = serde_json::json!([]);
    let p = SafePolicy::resume(SafeConfig::default(), &record.to_string());
    o.hakeeper.as_mut().expect("hakeeper").cns[1].work_state = WorkState::Working;
    let (mut p, mut o) = if across {
        across_catalogs(&p, &o, SafeConfig::default())
    } else {
        (p, o)
    };
    let cn2 = o.pods.iter_mut().find(|p| p.name == "cn-2").expect("cn-2");
    cn2.ready = false;
    cn2.restarts = 3;
    cn2.started_at = running.then_some(o.now);
    let (mut moved, mut drained, mut notes) = (Vec::new(), false, Vec::new());
    for _ in 0..12 {
        let d = decide(&mut p, &o);
        for a in &d.actions {
            match a {
                Action::RestartPod { pod, version, .. } if pod == "cn-2" => {
                    moved.push(version.clone())
                }
                Action::SetCnWorkState { uuid, .. } if uuid == "uuid-cn-2" => drained = true,
                _ => {}
            }
        }
        notes.extend(d.notes);
        o.now += Millis::from_secs(5);
    }
    (moved, drained, notes)
}

#[test]
fn a_crashed_cn_the_catalog_left_behind_goes_forward_without_a_drain() {
    // v3.0.15 -> v4.0.0-rc2: cn-0 runs v4.0.0-rc2 (Ready), so no CN of v3.0.15 starts again.
    // cn-2 crashed and cannot come back in place: it goes onto the target, undrained (it
    // runs nothing), and the operator says why.
    let (moved, drained, notes) = cn_phase_with_cn2_crashed(true, false);
    assert_eq!(
        moved.first().map(String::as_str),
        Some("v4.0.0-rc2"),
        "{moved:?}"
    );
    assert!(!drained, "no drain of a CN with no process");
    assert!(
        notes.iter().any(|n| matches!(n,
            PolicyNote::MovedPastTheCatalog { pod, reason }
                if pod == "cn-2" && reason.contains("catalog") && reason.contains("without a drain"))),
        "{notes:?}"
    );
    // On one catalog its in-place restart may yet come back: the phase waits for it.
    let (moved, _, _) = cn_phase_with_cn2_crashed(false, false);
    assert!(moved.is_empty(), "{moved:?}");
    // Its process running (starting, or serving and not Ready): never moved without a drain.
    let (moved, _, _) = cn_phase_with_cn2_crashed(true, true);
    assert!(moved.is_empty(), "{moved:?}");
}

#[test]
fn a_handed_over_cn_its_catalog_left_behind_waits_for_the_new_targets_cn_phase() {
    // v3.0.15 -> v4.0.0-rc2, CN first: cn-0 runs v4.0.0-rc2, cn-1's hand-over was requested
    // (it refuses new writes). The target moves on to v4.2.0, LOG first: cn-1 cannot go
    // back to v3.0.15 (the catalog moved to 4.0.0), nor to v4.2.0 ahead of the TN, nor to
    // v4.0.0-rc2, which the cluster leaves. Its restart waits for the CN phase, saying why.
    let (p, o) = prepared(RolloutStatus::Running, DrainStage::Confirmed, true);
    let (mut p, mut o) = across_catalogs(&p, &o, SafeConfig::default());
    // The allocator confirms cn-1's hand-over: only the version holds its restart.
    allocator_confirms_cn_1(&mut o);
    o.desired.upgrade = Some(UpgradeSpec {
        target_version: "v4.2.0".into(),
        strategy: Strategy::parse(r#"{"log":[],"tn":["log"],"cn":["tn"],"proxy":["cn"]}"#).unwrap(),
    });
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        assert!(
            !restarts(&d).iter().any(|pod| pod == "cn-1"),
            "cn-1 restarts nowhere yet: {:?}",
            d.actions
        );
        o.now += Millis::from_secs(5);
    }
    let holds = p.holds();
    assert!(
        holds.iter().any(|(subject, hold)| subject == "cn-1"
            && hold.contains("v3.0.15")
            && hold.contains("CN phase")
            && hold.contains("v4.2.0")),
        "{holds:?}"
    );
}

#[test]
fn a_downgrade_to_an_older_catalog_is_refused_before_anything_moves() {
    let mut o = wide(3, 2);
    for pod in o.pods.iter_mut() {
        pod.version = "v3.0.15".into();
    }
    for cn in o.hakeeper.as_mut().expect("hakeeper").cns.iter_mut() {
        cn.version = "v3.0.15".into();
    }
    upgrade(&mut o, CN_FIRST);
    // v1.2.4 brings catalog 1.2.3; v3.0.15's CNs run catalog 3.0.3.
    let mut p = SafePolicy::new(SafeConfig::default());
    for _ in 0..5 {
        let d = decide(&mut p, &o);
        assert!(restarts(&d).is_empty(), "{:?}", d.actions);
        assert!(
            !sends(&d, |a| matches!(
                a,
                Action::SetCnWorkState {
                    state: WorkState::Draining,
                    ..
                }
            )),
            "{:?}",
            d.actions
        );
        o.now += Millis::from_secs(5);
    }
    let status = &p.record().rollout.as_ref().expect("rollout").status;
    assert!(
        matches!(status, RolloutStatus::Halted { reason } if reason.contains("v1.2.4 refused") && reason.contains("catalog 1.2.3")),
        "{status:?}"
    );
    // Forward from v1.2.3 to v1.2.4, or on to v3.0.15: no refusal.
    for (from, to) in [("v1.2.3", "v1.2.4"), ("v1.2.4", "v3.0.15")] {
        let mut o = wide(3, 2);
        for pod in o.pods.iter_mut() {
            pod.version = from.into();
        }
        upgrade(&mut o, CN_FIRST);
        o.desired.upgrade.as_mut().expect("upgrade").target_version = to.into();
        let mut p = SafePolicy::new(SafeConfig::default());
        decide(&mut p, &o);
        let status = &p.record().rollout.as_ref().expect("rollout").status;
        assert_eq!(status, &RolloutStatus::Running, "{from} -> {to}");
    }
}

#[test]
fn a_target_set_back_is_no_creation_and_keeps_what_ran_before() {
    let (mut p, mut o) = prepared(RolloutStatus::Running, DrainStage::MarkDraining, false);
    // The pods that run v1.2.3.2.4 list first.
    o.pods.sort_by_key(|p| p.version != "v1.2.4");
    o.desired.upgrade.as_mut().expect("upgrade").target_version = "v1.2.3".into();
    decide(&mut p, &o);
    let rollout = p.record().rollout.as_ref().expect("rollout");
    assert_eq!(rollout.target, "v1.2.3");
    assert!(!rollout.is_creation(), "the cluster was running");
    assert_eq!(
        rollout.previous.get(&Component::Cn).map(String::as_str),
        Some("v1.2.3")
    );
    // From the pods alone, the version most of them run, not the first listed.
    let spec = o.desired.upgrade.clone().expect("upgrade");
    let fresh = Rollout::start(&spec, &o, None);
    assert_eq!(
        fresh.previous.get(&Component::Cn).map(String::as_str),
        Some("v1.2.3")
    );
    assert!(!fresh.is_creation());
    // Kept from the rollout it replaces, not read again: with most CNs on v1.2.3.2.4 already, or with
    // every pod back on v1.2.3 (nothing moved), the set-back is still no creation and restores v1.2.3.
    for moved in [vec!["cn-0", "cn-1"], vec![]] {
        let (mut p, mut o) = prepared(RolloutStatus::Running, DrainStage::MarkDraining, false);
        for pod in o.pods.iter_mut() {
            if pod.component == Component::Cn {
                pod.version = if moved.contains(&pod.name.as_str()) {
                    "v1.2.4"
                } else {
                    "v1.2.3"
                }
                .into();
            }
        }
        o.desired.upgrade.as_mut().expect("upgrade").target_version = "v1.2.3".into();
        decide(&mut p, &o);
        let rollout = p.record().rollout.as_ref().expect("rollout");
        assert!(!rollout.is_creation(), "{moved:?}");
        assert_eq!(
            rollout.previous.get(&Component::Cn).map(String::as_str),
            Some("v1.2.3"),
            "{moved:?}"
        );
    }
}

#[test]
fn with_two_cns_none_is_prepared_while_the_other_is_unproven() {
    for (cns, prepared_expected) in [(2, false), (3, true)] {
        let mut o = wide(cns, 2);
        upgrade(&mut o, CN_FIRST);
        // cn-0 restarted onto v1.2.3.2.4 and holds healthy for its window.
        let spec = o.desired.upgrade.clone().expect("upgrade");
        let mut rollout = Rollout::start(&spec, &o, None);
        rollout.creation = Some(false);
        rollout.phase_started = true;
        let cn0 = o.pods.iter_mut().find(|p| p.name == "cn-0").expect("cn-0");
        cn0.version = "v1.2.4".into();
        o.hakeeper.as_mut().unwrap().cns[0].version = "v1.2.4".into();
        rollout.step = Step::Verify {
            pod: "cn-0".into(),
            old_epoch: Some(10),
            restarts: 0,
            healthy_since: Some(o.now),
        };
        let record = ProgressRecord {
            format: mo_core::safe::RECORD_FORMAT,
            rollout: Some(rollout),
            ..ProgressRecord::default()
        };
        let mut p = SafePolicy::resume(
            SafeConfig::default(),
            &serde_json::to_string(&record).expect("record"),
        );
        let marked = marked_within(&mut p, &mut o, 3);
        assert_eq!(
            !marked.is_empty(),
            prepared_expected,
            "{cns} CNs: {marked:?}"
        );
    }
}

#[test]
fn a_cn_registered_draining_is_put_into_service_unless_its_process_was_marked() {
    let mut o = cluster("v1.2.3");
    o.hakeeper.as_mut().unwrap().cns[1].work_state = WorkState::Draining;
    let mut p = SafePolicy::new(SafeConfig::default());
    let d = decide(&mut p, &o);
    let working = Action::SetCnWorkState {
        uuid: "uuid-cn-1".into(),
        state: WorkState::Working,
    };
    assert!(d.actions.contains(&working), "{:?}", d.actions);
    // The same instance, told to restart by a drain that since finished: it stays Draining.
    let mut drain = Drain::new(
        "cn-1",
        "u-cn-1",
        "uuid-cn-1",
        DrainPurpose::Remove {
            why: "scale-in".into(),
        },
        o.now,
    );
    drain.instance = Some(mo_core::drain::Instance::of(o.pod("cn-1").expect("cn-1")));
    drain.handshake_sent_at = Some(o.now);
    drain.process_marked = true;
    drain.stage = DrainStage::Finished;
    let record = ProgressRecord {
        format: mo_core::safe::RECORD_FORMAT,
        drains: vec![drain],
        ..ProgressRecord::default()
    };
    let mut p = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(&record).expect("record"),
    );
    let d = decide(&mut p, &o);
    assert!(!d.actions.contains(&working), "{:?}", d.actions);
    // Its container restarted since: a new process, put into service.
    o.pods
        .iter_mut()
        .find(|p| p.name == "cn-1")
        .expect("cn-1")
        .restarts = 1;
    let d = decide(&mut p, &o);
    assert!(d.actions.contains(&working), "{:?}", d.actions);
}

/// A CN on its new image reports the version its process was built with: the tag itself (a
/// build stamped with it), or, from the kernel's own Makefile (the official images), a commit
/// hash, which every CN on that image reports alike. A version that cannot be read holds.
#[test]
fn the_cn_gate_takes_the_version_the_process_reports() {
    let mut o = cluster("v3.0.15");
    for pod in o.pods.iter_mut() {
        pod.version = "v3.0.15".into();
    }
    let set = |o: &mut Observation, i: usize, v: &str| {
        o.hakeeper.as_mut().unwrap().cns[i].version = v.into();
    };
    assert!(
        gates::cn_healthy(&o, "cn-0", "v3.0.15").is_ok(),
        "a stamped tag"
    );
    set(&mut o, 0, "43e871c1");
    set(&mut o, 1, "43e871c1b0");
    assert!(
        gates::cn_healthy(&o, "cn-0", "v3.0.15").is_ok(),
        "official images: a commit hash, the same on every CN of the image"
    );
    set(&mut o, 1, "0bbda669");
    let e = gates::cn_healthy(&o, "cn-0", "v3.0.15").unwrap_err();
    assert!(e.contains("another CN on v3.0.15 reports 0bbda669"), "{e}");
    set(&mut o, 0, "unknown (the CN reports no version)");
    let e = gates::cn_healthy(&o, "cn-0", "v3.0.15").unwrap_err();
    assert!(e.contains("unknown"), "{e}");
    // What v1.2.3.2 numbering made of a v1.2.3.2.4.0+ CN's record: its shard-service address (empty by
    // default) in the version's place.
    set(&mut o, 0, "");
    assert!(gates::cn_healthy(&o, "cn-0", "v3.0.15").is_err());
    set(&mut o, 0, "v3.0.14");
    assert!(
        gates::cn_healthy(&o, "cn-0", "v3.0.15").is_err(),
        "another tag"
    );
}

/// A phase's width is a share of the CNs that stay: one deleted (or being removed by a
/// scale-in) is no share of what will serve, so it does not widen the phase.
#[test]
fn a_cn_on_its_way_out_is_no_share_of_the_width() {
    let mut p = SafePolicy::new(SafeConfig {
        cn_max_unavailable: MaxUnavailable::Percent(50),
        ..SafeConfig::default()
    });
    let mut o = wide(4, 2);
    upgrade(
        &mut o,
        r#"{"cn":[],"log":["cn"],"tn":["log"],"proxy":["tn"]}"#,
    );
    let uid = o.pod("cn-3").expect("cn-3").uid.clone();
    o.desired.removals.push(RemovalRequest {
        id: 1,
        pod: "cn-3".into(),
        uid,
        reason: RemovalReason::ScaleIn,
        requested_at: o.now,
    });
    let marked = marked_within(&mut p, &mut o, 3);
    assert_eq!(
        marked,
        vec!["uuid-cn-0", "uuid-cn-3"],
        "cn-3 drained for its removal, and 50% of the three CNs that stay"
    );
}

/// A drain withdrawn through the kernel's cancel (the drain extension) returned its CN to work:
/// though it asked for a hand-over, it keeps nothing out of service.
#[test]
fn a_cn_whose_drain_was_cancelled_is_put_into_service() {
    let mut o = cluster("v1.2.3");
    o.hakeeper.as_mut().unwrap().cns[1].work_state = WorkState::Draining;
    let mut drain = Drain::new(
        "cn-1",
        "u-cn-1",
        "uuid-cn-1",
        DrainPurpose::Remove {
            why: "scale-in".into(),
        },
        o.now,
    );
    drain.instance = Some(mo_core::drain::Instance::of(o.pod("cn-1").expect("cn-1")));
    drain.begin_drain_sent_at = Some(o.now);
    drain.stage = DrainStage::Finished;
    drain.end = Some(mo_core::drain::DrainEnd::Cancelled);
    let record = ProgressRecord {
        format: mo_core::safe::RECORD_FORMAT,
        drains: vec![drain],
        ..ProgressRecord::default()
    };
    let mut p = SafePolicy::resume(
        SafeConfig::default(),
        &serde_json::to_string(&record).expect("record"),
    );
    let d = decide(&mut p, &o);
    let working = Action::SetCnWorkState {
        uuid: "uuid-cn-1".into(),
        state: WorkState::Working,
    };
    assert!(d.actions.contains(&working), "{:?}", d.actions);
}
