//! Randomized fault campaigns: one generated scenario per seed (topology, timings, workload,
//! kernel features and several disruptions at once), invariants checked on every event, and
//! liveness at the end. A violating seed is replayed by one command and shrunk to a minimal
//! scenario.

use crate::report::Violation;
use crate::scenario::Scenario;
use crate::world::{RunOptions, Simulation};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one seed found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    pub events: u64,
    pub violations: Vec<Violation>,
    /// What the scenario held ([`classes`]).
    pub classes: Vec<String>,
    /// The kernel mechanisms the run went through (`Report::kernel_mechanisms`).
    pub mechanisms: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CampaignReport {
    pub policy: String,
    pub scenarios: u64,
    pub violations: u64,
    pub violating_seeds: Vec<u64>,
    pub by_invariant: BTreeMap<String, u64>,
    /// How many scenarios held each class of disruption ([`classes`]).
    pub by_class: BTreeMap<String, u64>,
    /// How many scenarios went through each kernel mechanism the safety claims depend on.
    #[serde(default)]
    pub by_mechanism: BTreeMap<String, u64>,
    pub wall_seconds: f64,
    pub events: u64,
    /// For each violating seed: the first violation and the command that replays it.
    pub failures: Vec<Failure>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failure {
    pub seed: u64,
    pub invariant: String,
    pub at: f64,
    pub detail: String,
    pub replay: String,
}

/// The command that reruns one seed of a campaign.
pub fn replay_command(seed: u64, policy: &str) -> String {
    format!("mo-operator campaign --replay {seed} --policy {policy}")
}

/// Generates the scenario of `seed`: the same seed always gives the same scenario.
/// The releases a seed runs (the cluster's, the upgrade's target, and a third one a change of
/// mind may go on to): one line on a single catalog, where a set-back is safe after CNs ran the
/// target, and two across catalogs (`mo_core::generation::catalog`), where it is not: the
/// kernel stops a CN of an older catalog at start.
const RELEASES: [[&str; 3]; 3] = [
    ["v1.2.3", "v1.2.4", "v3.0.15"],
    ["v3.0.14", "v3.0.15", "v4.0.0-rc2"],
    ["v3.0.15", "v4.0.0-rc2", "v4.2.0"],
];

pub fn generate(seed: u64) -> Scenario {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d6f_2d6f_7065_7261);
    // Drawn on a stream of their own: the rest of the seed's scenario stays as it was.
    let [from, to, third] = RELEASES
        [ChaCha8Rng::seed_from_u64(seed ^ 0x6b65_726e_656c).random_range(0..RELEASES.len())];
    let log = if rng.random_bool(0.8) { 3 } else { 5 };
    let tenant = rng.random_range(2..=4usize);
    let pool = if rng.random_bool(0.5) {
        rng.random_range(1..=2usize)
    } else {
        0
    };
    let bound = if pool > 0 {
        rng.random_range(0..=1usize)
    } else {
        0
    };
    let proxies = rng.random_range(1..=3usize);
    let pods = log + 1 + tenant + pool + proxies;
    let nodes = pods + rng.random_range(1..=2usize);
    let tables: Vec<String> = (0..rng.random_range(2..=5usize))
        .map(|i| format!("t{i}"))
        .collect();
    let mut cn_pods: Vec<String> = (0..tenant).map(|i| format!("tenant-{i}")).collect();
    cn_pods.extend((0..pool).map(|i| format!("pool-{i}")));
    let mut all_pods: Vec<String> = (0..log).map(|i| format!("log-{i}")).collect();
    all_pods.push("tn-0".into());
    all_pods.extend(cn_pods.iter().cloned());
    all_pods.extend((0..proxies).map(|i| format!("proxy-{i}")));

    let mut y = String::new();
    let _ = writeln!(y, "name: campaign-{seed}\nseed: {seed}\nduration: 60m");
    // Half the seeds run the stock kernel; the others some of the operator's extensions.
    let extended = rng.random_bool(0.5);
    let mut extension = || extended && rng.random_bool(0.5);
    let (drain_protocol, leader_transfer, wal_tolerance) = (extension(), extension(), extension());
    let _ = writeln!(
        y,
        "kernel: {{drain_protocol: {drain_protocol}, leader_transfer: {leader_transfer}, wal_tolerance: {wal_tolerance}}}"
    );
    let on_stall = if rng.random_bool(0.5) {
        "Halt"
    } else {
        "Rollback"
    };
    // How many CNs and proxies an upgrade restarts at once: its own stream, so the draw
    // leaves every other part of the seed's scenario as it was.
    let mut widths = ChaCha8Rng::seed_from_u64(seed ^ 0x7769_6474_6873);
    let cn_width = match widths.random_range(0..4u32) {
        0 => "'50%'".to_string(),
        n => n.to_string(),
    };
    let proxy_width = widths.random_range(1..=2u32);
    let _ = writeln!(
        y,
        "safe: {{on_stall: {on_stall}, cn_max_unavailable: {cn_width}, proxy_max_unavailable: {proxy_width}}}"
    );
    let _ = writeln!(
        y,
        "topology:\n  version: {from}\n  nodes: {nodes}\n  log_replicas: {log}\n  proxy_replicas: {proxies}\n  cn_groups:"
    );
    let _ = writeln!(y, "    - {{name: tenant, replicas: {tenant}}}");
    if pool > 0 {
        let _ = writeln!(
            y,
            "    - {{name: pool, pool: true, replicas: {pool}, bound: {bound}}}"
        );
    }
    let _ = writeln!(y, "lock_tables:");
    let mut any_lock = false;
    for t in &tables {
        if rng.random_bool(0.5) {
            let owner = &cn_pods[rng.random_range(0..cn_pods.len())];
            let _ = writeln!(y, "  - {{table: {t}, owner: {owner}}}");
            any_lock = true;
        }
    }
    if !any_lock {
        y.truncate(y.len() - "lock_tables:\n".len());
    }
    let _ = writeln!(
        y,
        "workload: {{clients: {}, txn_rate: {}, statements_max: {}, tables: [{}]STATEMENT_LATENCYCONN_LIFETIME}}",
        rng.random_range(2..=6u32),
        rng.random_range(2..=5u32),
        rng.random_range(1..=3u32),
        tables.join(", ")
    );
    let _ = writeln!(
        y,
        "timings: {{image_pull: {}s, container_start: {}s, log_rejoin: {}s, log_catch_up: {}s, \
         log_election: {}s, cn_start: {}s, tn_start: {}sCN_HEARTBEAT}}",
        rng.random_range(0..=90u32),
        rng.random_range(2..=10u32),
        rng.random_range(5..=60u32),
        rng.random_range(5..=120u32),
        rng.random_range(2..=8u32),
        rng.random_range(5..=20u32),
        rng.random_range(3..=10u32),
    );
    if rng.random_bool(0.25) {
        let method = if rng.random_bool(0.5) {
            "eviction"
        } else {
            "pool-reclaim"
        };
        let _ = writeln!(
            y,
            "consolidation: {{start: {}s, method: {method}}}",
            rng.random_range(60..=900u32)
        );
    }
    let _ = writeln!(y, "events:");
    let mut upgrade_at: Option<u32> = None;
    let mut upgrade_strategy = String::new();
    if rng.random_bool(0.6) {
        let mut order = ["log", "tn", "cn", "proxy"];
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let strategy: Vec<String> = order
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let deps = if i == 0 {
                    String::new()
                } else {
                    format!("\"{}\"", order[i - 1])
                };
                format!("\"{c}\":[{deps}]")
            })
            .collect();
        let at = rng.random_range(30..=600u32);
        upgrade_strategy = strategy.join(",");
        upgrade_at = Some(at);
        let _ = writeln!(
            y,
            "  - {{at: {at}s, upgrade: {{version: {to}, strategy: '{{{upgrade_strategy}}}'}}}}"
        );
    }
    for _ in 0..rng.random_range(1..=6u32) {
        let at = rng.random_range(30..=1500u32);
        let pick = |rng: &mut ChaCha8Rng, v: &[String]| v[rng.random_range(0..v.len())].clone();
        let event = match rng.random_range(0..100u32) {
            0..=19 => format!(
                "evict: {{pod: {}, source: cluster-autoscaler}}",
                pick(&mut rng, &all_pods)
            ),
            20..=29 => format!("drain_node: {{node: node-{}}}", rng.random_range(1..=nodes)),
            30..=39 if tenant >= 3 => {
                format!("scale_in: {{group: tenant, replicas: {}}}", tenant - 1)
            }
            40..=44 if bound > 0 => "claim_release: {pod: pool-0}".to_string(),
            45..=54 => format!(
                "node_failure: {{node: node-{}}}",
                rng.random_range(1..=nodes)
            ),
            55..=64 => format!("cn_crash: {{pod: {}}}", pick(&mut rng, &cn_pods)),
            65..=72 => format!(
                "hakeeper_outage: {{duration: {}s}}",
                rng.random_range(10..=60u32)
            ),
            73..=89 => format!(
                "operator_restart: {{drop_pending_actions: {}}}",
                rng.random_bool(0.5)
            ),
            90..=94 => "fault: {cn_never_heartbeats_after_restart: true}".to_string(),
            95..=99 => format!("delete_pod: {{pod: {}}}", pick(&mut rng, &all_pods)),
            _ => format!(
                "operator_restart: {{drop_pending_actions: {}}}",
                rng.random_bool(0.5)
            ),
        };
        let _ = writeln!(y, "  - {{at: {at}s, {event}}}");
    }
    // The classes a hand-written review found the safe policy weak on, drawn on top of the
    // rest (each is named by `classes`, from the scenario itself, in the report).
    let owners: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for line in y.lines().filter(|l| l.contains("owner: ")) {
            let owner = line
                .rsplit("owner: ")
                .next()
                .unwrap_or("")
                .trim_end_matches('}');
            if !v.iter().any(|o| o == owner) {
                v.push(owner.to_string());
            }
        }
        v
    };
    let pick = |rng: &mut ChaCha8Rng, v: &[String]| v[rng.random_range(0..v.len())].clone();
    if rng.random_bool(0.2) {
        // Two pods evicted in the same instant: two lock owners (their transactions may need
        // each other's tables), the last two CNs, or two proxies.
        let at = rng.random_range(30..=1500u32);
        let pair: Option<(String, String)> = match rng.random_range(0..3u32) {
            0 if owners.len() >= 2 => Some((owners[0].clone(), owners[1].clone())),
            1 if proxies >= 2 => Some(("proxy-0".into(), "proxy-1".into())),
            _ => {
                let a = pick(&mut rng, &cn_pods);
                let others: Vec<String> = cn_pods.iter().filter(|c| **c != a).cloned().collect();
                Some((a, pick(&mut rng, &others)))
            }
        };
        if let Some((a, b)) = pair {
            let _ = writeln!(
                y,
                "  - {{at: {at}s, evict: {{pod: {a}, source: cluster-autoscaler}}}}"
            );
            let _ = writeln!(
                y,
                "  - {{at: {at}s, evict: {{pod: {b}, source: kubectl-drain}}}}"
            );
        }
    }
    if rng.random_bool(0.2) {
        // An evictor that gives up, before or after the hand-over was requested.
        let pod = if !owners.is_empty() && rng.random_bool(0.5) {
            pick(&mut rng, &owners)
        } else {
            pick(&mut rng, &cn_pods)
        };
        let _ = writeln!(
            y,
            "  - {{at: {}s, evict: {{pod: {pod}, source: cluster-autoscaler, give_up_after: {}s}}}}",
            rng.random_range(30..=1500u32),
            rng.random_range(1..=90u32)
        );
    }
    if bound > 0 && rng.random_bool(0.2) {
        // A pool reclaim withdrawn: the pooled CN is claimed again.
        let at = rng.random_range(30..=1500u32);
        let _ = writeln!(y, "  - {{at: {at}s, claim_release: {{pod: pool-0}}}}");
        let _ = writeln!(
            y,
            "  - {{at: {}s, claim_bind: {{pod: pool-0}}}}",
            at + rng.random_range(1..=40u32)
        );
    }
    if tenant >= 3 && rng.random_bool(0.2) {
        // A scale-in reverted, before or after the hand-over of the removed CN was requested.
        let at = rng.random_range(30..=1500u32);
        let _ = writeln!(
            y,
            "  - {{at: {at}s, scale_in: {{group: tenant, replicas: {}}}}}",
            tenant - 1
        );
        let _ = writeln!(
            y,
            "  - {{at: {}s, scale_out: {{group: tenant, replicas: {tenant}}}}}",
            at + rng.random_range(1..=60u32)
        );
    }
    if rng.random_bool(0.15) {
        // A withdrawal lost across a TN restart: the hand-over requested, the TN (whose lock
        // allocator keeps its restart marks in memory) restarted, then the drain withdrawn.
        let at = rng.random_range(30..=1500u32);
        let tn_at = at + rng.random_range(1..=30u32);
        let back = tn_at + rng.random_range(1..=60u32);
        let _ = writeln!(y, "  - {{at: {tn_at}s, delete_pod: {{pod: tn-0}}}}");
        match rng.random_range(0..3u32) {
            0 if tenant >= 3 => {
                let _ = writeln!(
                    y,
                    "  - {{at: {at}s, scale_in: {{group: tenant, replicas: {}}}}}",
                    tenant - 1
                );
                let _ = writeln!(
                    y,
                    "  - {{at: {back}s, scale_out: {{group: tenant, replicas: {tenant}}}}}"
                );
            }
            1 if bound > 0 => {
                let _ = writeln!(y, "  - {{at: {at}s, claim_release: {{pod: pool-0}}}}");
                let _ = writeln!(y, "  - {{at: {back}s, claim_bind: {{pod: pool-0}}}}");
            }
            _ => {
                let pod = if owners.is_empty() {
                    pick(&mut rng, &cn_pods)
                } else {
                    pick(&mut rng, &owners)
                };
                let _ = writeln!(
                    y,
                    "  - {{at: {at}s, evict: {{pod: {pod}, source: cluster-autoscaler, give_up_after: {}s}}}}",
                    back - at
                );
            }
        }
    }
    if rng.random_bool(0.15) {
        // A CN container restarted in place within seconds of its drain starting, before
        // HAKeeper's record changes.
        let pod = if !owners.is_empty() && rng.random_bool(0.7) {
            pick(&mut rng, &owners)
        } else {
            pick(&mut rng, &cn_pods)
        };
        let at = rng.random_range(30..=1500u32);
        let _ = writeln!(
            y,
            "  - {{at: {at}s, evict: {{pod: {pod}, source: kubectl-drain}}}}"
        );
        let _ = writeln!(
            y,
            "  - {{at: {}s, cn_crash: {{pod: {pod}}}}}",
            at + rng.random_range(0..=20u32)
        );
    }
    // Rollouts that change their mind, drawn on a stream of their own (the rest of the
    // seed's scenario stays as it was): the version set back, or on to a third one, at any
    // point of the rollout; a restarted CN that never registers again (the rollout halts or
    // rolls back with CNs prepared); HAKeeper cut off past a CN record's expiry (30 s) while CNs
    // are handed over.
    let mut minds = ChaCha8Rng::seed_from_u64(seed ^ 0x6d69_6e64_7321);
    if let Some(at) = upgrade_at
        && minds.random_bool(0.3)
    {
        let version = if minds.random_bool(0.6) { from } else { third };
        let _ = writeln!(
            y,
            "  - {{at: {}s, upgrade: {{version: {version}, strategy: '{{{upgrade_strategy}}}'}}}}",
            at + minds.random_range(5..=900u32)
        );
    }
    if let Some(at) = upgrade_at
        && minds.random_bool(0.15)
    {
        let _ = writeln!(
            y,
            "  - {{at: {}s, fault: {{cn_never_heartbeats_after_restart: true}}}}",
            at.saturating_sub(5)
        );
    }
    if minds.random_bool(0.15) {
        let at = upgrade_at.map_or(minds.random_range(30..=1500u32), |u| {
            u + minds.random_range(0..=900u32)
        });
        let _ = writeln!(
            y,
            "  - {{at: {at}s, hakeeper_outage: {{duration: {}s}}}}",
            minds.random_range(35..=120u32)
        );
    }
    // An operator whose tick is not HAKeeper's second.
    let operator_tick = if minds.random_bool(0.3) {
        format!(", operator_tick: {}ms", minds.random_range(600..=1_700u32))
    } else {
        String::new()
    };
    let y = y.replace("CN_HEARTBEAT", &format!("CN_HEARTBEAT{operator_tick}"));
    // Statements that run for seconds while CNs hand over, scale in or proxies restart.
    let latency = if rng.random_bool(0.2) {
        format!(
            ", statement_latency: {}ms",
            rng.random_range(1_000..=8_000u32)
        )
    } else {
        String::new()
    };
    let y = y.replace("STATEMENT_LATENCY", &latency);
    // CNs configured to heartbeat less often: readings near a fixed freshness limit flap.
    let cn_heartbeat = if rng.random_bool(0.2) {
        format!(", cn_heartbeat: {}s", rng.random_range(2..=4u32))
    } else {
        String::new()
    };
    let y = y.replace("CN_HEARTBEAT", &cn_heartbeat);
    // Connection pools that recycle connections fast or slowly, and clients that never do
    // (a proxy out of its Service is then never left: the rollout must halt, not cut them).
    let lifetime = if rng.random_bool(0.1) {
        ", connection_lifetime: null".to_string()
    } else {
        format!(", connection_lifetime: {}s", rng.random_range(5..=240u32))
    };
    let y = y.replace("CONN_LIFETIME", &lifetime);
    Scenario::from_yaml(&y)
        .unwrap_or_else(|e| panic!("generated scenario {seed} is invalid: {e}\n{y}"))
}

/// The kinds of disruption a scenario holds, read from the scenario itself (not from what the
/// generator meant), so a campaign's report shows what it covered.
pub fn classes(scenario: &Scenario) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let ev = &scenario.events;
    let mut add = |yes: bool, name: &'static str| {
        if yes {
            out.push(name);
        }
    };
    let owners: Vec<&str> = scenario
        .lock_tables
        .iter()
        .map(|l| l.owner.as_str())
        .collect();
    let evictions: Vec<(u64, &str)> = ev
        .iter()
        .filter_map(|e| e.evict.as_ref().map(|p| (e.at.millis().0, p.pod.as_str())))
        .collect();
    let same_instant = |both: &dyn Fn(&str, &str) -> bool| {
        evictions.iter().enumerate().any(|(i, (t, a))| {
            evictions[i + 1..]
                .iter()
                .any(|(u, b)| t == u && a != b && both(a, b))
        })
    };
    add(same_instant(&|_, _| true), "same-instant evictions");
    add(
        same_instant(&|a, b| owners.contains(&a) && owners.contains(&b)),
        "same-instant evictions of two lock owners",
    );
    add(
        same_instant(&|a, b| a.starts_with("proxy-") && b.starts_with("proxy-")),
        "same-instant evictions of two proxies",
    );
    add(
        ev.iter()
            .any(|e| e.evict.as_ref().is_some_and(|p| p.give_up_after.is_some())),
        "eviction withdrawn (evictor gives up)",
    );
    add(
        ev.iter().any(|e| {
            e.claim_bind.as_ref().is_some_and(|b| {
                ev.iter().any(|r| {
                    r.at <= e.at && r.claim_release.as_ref().is_some_and(|p| p.pod == b.pod)
                })
            })
        }),
        "pool reclaim withdrawn (claimed again)",
    );
    add(
        ev.iter().any(|e| {
            e.scale_out.as_ref().is_some_and(|o| {
                ev.iter().any(|r| {
                    r.at <= e.at
                        && r.scale_in
                            .as_ref()
                            .is_some_and(|i| i.group == o.group && i.replicas < o.replicas)
                })
            })
        }),
        "scale-in reverted",
    );
    // Drains started and withdrawn: (pod or group, start, withdrawal), in milliseconds.
    let mut withdrawn: Vec<(u64, u64)> = Vec::new();
    for e in ev {
        let at = e.at.millis().0;
        if let Some(p) = &e.evict
            && let Some(give_up) = p.give_up_after
        {
            withdrawn.push((at, at + give_up.millis().0));
        }
        if let Some(o) = &e.scale_out {
            for r in ev.iter().filter(|r| r.at <= e.at) {
                if r.scale_in
                    .as_ref()
                    .is_some_and(|i| i.group == o.group && i.replicas < o.replicas)
                {
                    withdrawn.push((r.at.millis().0, at));
                }
            }
        }
        if let Some(b) = &e.claim_bind {
            for r in ev.iter().filter(|r| r.at <= e.at) {
                if r.claim_release.as_ref().is_some_and(|p| p.pod == b.pod) {
                    withdrawn.push((r.at.millis().0, at));
                }
            }
        }
    }
    add(
        ev.iter().any(|e| {
            e.delete_pod
                .as_ref()
                .is_some_and(|p| p.pod.starts_with("tn-"))
                && withdrawn
                    .iter()
                    .any(|(s, w)| *s < e.at.millis().0 && e.at.millis().0 < *w)
        }),
        "drain withdrawn across a TN restart",
    );
    add(
        ev.iter().any(|e| {
            e.cn_crash.as_ref().is_some_and(|c| {
                evictions.iter().any(|(t, pod)| {
                    *pod == c.pod && *t <= e.at.millis().0 && e.at.millis().0 <= t + 30_000
                })
            })
        }),
        "CN restarted in place within seconds of its drain",
    );
    add(
        scenario.timings.cn_heartbeat.millis().0 >= 2_000,
        "CN heartbeat interval of 2 s or more",
    );
    add(
        scenario.workload.statement_latency.millis().0 >= 1_000,
        "statements running for seconds",
    );
    let proxies = scenario.topology.proxy_replicas >= 2;
    add(
        proxies && ev.iter().any(|e| e.upgrade.is_some()),
        "proxy restarts with clients connected (two proxies or more)",
    );
    add(
        proxies && scenario.workload.connection_lifetime.is_none(),
        "clients that never close their proxy connections",
    );
    add(
        ev.iter().any(|e| e.upgrade.is_some()),
        "rolling upgrade (voluntary TN restart)",
    );
    add(ev.iter().any(|e| e.drain_node.is_some()), "node drain");
    add(ev.iter().any(|e| e.scale_in.is_some()), "scale-in");
    add(scenario.consolidation.is_some(), "consolidation agent");
    add(ev.iter().any(|e| e.node_failure.is_some()), "node failure");
    add(
        ev.iter().any(|e| e.cn_crash.is_some()),
        "CN container crash",
    );
    add(
        ev.iter().any(|e| e.delete_pod.is_some()),
        "pod deleted by hand",
    );
    add(
        ev.iter().any(|e| e.hakeeper_outage.is_some()),
        "HAKeeper outage",
    );
    add(
        ev.iter().any(|e| e.operator_restart.is_some()),
        "operator restart",
    );
    add(
        ev.iter().any(|e| e.fault.is_some()),
        "kernel fault (CN never heartbeats)",
    );
    let k = &scenario.kernel;
    add(
        !(k.drain_protocol || k.leader_transfer || k.wal_tolerance),
        "stock kernel",
    );
    let cn_pods: usize = scenario.topology.cn_groups.iter().map(|g| g.replicas).sum();
    add(
        ev.iter().any(|e| e.upgrade.is_some())
            && (scenario.safe.cn_max_unavailable.of(cn_pods) > 1
                || scenario
                    .safe
                    .proxy_max_unavailable
                    .of(scenario.topology.proxy_replicas)
                    > 1),
        "upgrade restarting several CNs or proxies at once",
    );
    add(
        ev.iter().any(|e| e.upgrade.is_some())
            && ev
                .iter()
                .any(|e| e.evict.is_some() || e.drain_node.is_some()),
        "upgrade with evictions",
    );
    let targets: Vec<&str> = ev
        .iter()
        .filter_map(|e| e.upgrade.as_ref().map(|u| u.version.as_str()))
        .collect();
    add(
        targets.len() >= 2 && targets.last() == Some(&scenario.topology.version.as_str()),
        "version set back during a rollout",
    );
    add(
        targets.len() >= 2 && targets.last() != Some(&scenario.topology.version.as_str()),
        "version changed to a third one during a rollout",
    );
    add(
        !targets.is_empty()
            && cn_pods >= 3
            && ev.iter().any(|e| {
                e.fault
                    .as_ref()
                    .is_some_and(|f| f.cn_never_heartbeats_after_restart)
            }),
        "rollout halting or rolling back with CNs prepared",
    );
    add(
        ev.iter().any(|e| {
            e.hakeeper_outage
                .as_ref()
                .is_some_and(|o| o.duration.millis().0 > 30_000)
        }),
        "HAKeeper cut off past a CN record's expiry",
    );
    add(
        scenario.timings.operator_tick.millis().0 != 1_000,
        "operator tick not aligned with HAKeeper's",
    );
    out
}

/// Lasting faults in play (a node that never comes back, a kernel bug): liveness is then only
/// "waits on a named condition", not "completes". Transient faults (a CN crash, a pod deleted
/// by hand, a HAKeeper outage) excuse nothing: the kernel recovers from them, so must the run.
fn cooperative(scenario: &Scenario) -> bool {
    // Clients that never close their connections never leave a proxy, which no safe policy
    // stops with connections on it.
    let clients_leave =
        scenario.workload.connection_lifetime.is_some() || scenario.topology.proxy_replicas < 2;
    clients_leave
        && scenario
            .events
            .iter()
            .all(|e| e.node_failure.is_none() && e.fault.is_none())
}

/// Runs one scenario with every invariant checked, then checks liveness.
pub fn check(scenario: Scenario) -> SeedResult {
    check_with(scenario, None)
}

/// [`check`] with a given policy instead of the one the scenario names (to show that a
/// deliberately wrong policy is caught).
pub fn check_with(scenario: Scenario, policy: Option<Box<dyn mo_core::Policy>>) -> SeedResult {
    let seed = scenario.seed;
    let cooperative = cooperative(&scenario);
    let classes = classes(&scenario).into_iter().map(String::from).collect();
    let options = RunOptions {
        check_invariants: true,
        ..RunOptions::default()
    };
    let mut sim = match policy {
        Some(policy) => Simulation::with_policy(scenario, policy, options),
        None => Simulation::new(scenario, options),
    };
    let report = sim.run(&mut |_| {});
    let mut violations = report.violations.clone();
    let at = report.sim_seconds;
    // A final target of an older catalog than the one the CNs moved to is one the kernel
    // refuses: the run must halt and say so, not finish.
    let target = sim.upgrade.as_ref().map(|u| u.target_version.clone());
    let behind = target.as_deref().and_then(mo_core::generation::catalog);
    let way_back = matches!((behind, sim.catalog_reached), (Some(b), Some(r)) if b < r);
    if way_back {
        let (behind, reached) = (
            behind.unwrap_or_default(),
            sim.catalog_reached.unwrap_or_default(),
        );
        let waiting = report.waiting_on.get("rollout");
        if !waiting.is_some_and(|w| w.contains("refused") || w.contains("no rollback")) {
            violations.push(Violation {
                at,
                invariant: "liveness: a way back the kernel refuses halts, saying why".into(),
                detail: format!(
                    "{} (catalog {behind:?}) after CNs moved the catalog to {reached:?}: {waiting:?}",
                    target.unwrap_or_default()
                ),
            });
        }
    }
    let mut stuck = |what: String, waiting: Option<&String>| match waiting {
        None => violations.push(Violation {
            at,
            invariant: "liveness: never silently stuck".into(),
            detail: format!("{what} neither finished nor waits on a named condition"),
        }),
        Some(reason) if cooperative => violations.push(Violation {
            at,
            invariant: "liveness: finishes when the kernel cooperates".into(),
            detail: format!("{what} did not finish: {reason}"),
        }),
        Some(_) => {}
    };
    if !way_back && let Some(upgrade) = &report.upgrade {
        if upgrade.finished_at.is_none() {
            stuck("the upgrade".into(), report.waiting_on.get("rollout"));
        } else if let Some(gap) = &upgrade.not_applied {
            stuck(
                format!("the upgrade (declared finished, but {gap})"),
                report.waiting_on.get("rollout"),
            );
        }
    }
    for pod in sim.pending_removals() {
        let waiting = report.waiting_on.get(&pod);
        stuck(format!("the removal of {pod}"), waiting);
    }
    SeedResult {
        seed,
        events: report.events,
        violations,
        classes,
        mechanisms: report.kernel_mechanisms.keys().cloned().collect(),
    }
}

pub fn run_seed(seed: u64, policy: &str) -> SeedResult {
    let mut scenario = generate(seed);
    scenario.policy = policy.to_string();
    check(scenario)
}

/// Runs `count` seeds from `start` on `threads` threads.
pub fn run_campaign(
    start: u64,
    count: u64,
    policy: &str,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> CampaignReport {
    let started = std::time::Instant::now();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let results: Mutex<Vec<SeedResult>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let result = run_seed(start + i, policy);
                    results.lock().expect("no panics while held").push(result);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    });
    let mut results = results.into_inner().expect("threads joined");
    results.sort_by_key(|r| r.seed);
    let mut by_invariant: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_class: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_mechanism: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for r in &results {
        for c in &r.classes {
            *by_class.entry(c.clone()).or_default() += 1;
        }
        for m in &r.mechanisms {
            *by_mechanism.entry(m.clone()).or_default() += 1;
        }
        for v in &r.violations {
            *by_invariant.entry(v.invariant.clone()).or_default() += 1;
        }
        if let Some(v) = r.violations.first() {
            failures.push(Failure {
                seed: r.seed,
                invariant: v.invariant.clone(),
                at: v.at,
                detail: v.detail.clone(),
                replay: replay_command(r.seed, policy),
            });
        }
    }
    CampaignReport {
        policy: policy.to_string(),
        scenarios: count,
        violations: results.iter().map(|r| r.violations.len() as u64).sum(),
        violating_seeds: failures.iter().map(|f| f.seed).collect(),
        by_invariant,
        by_class,
        by_mechanism,
        wall_seconds: started.elapsed().as_secs_f64(),
        events: results.iter().map(|r| r.events).sum(),
        failures,
    }
}

/// Greedily removes what the violation does not need (events, the consolidation agent,
/// clients, lock tables) while `invariant` still breaks. At most `budget` runs.
pub fn shrink(scenario: &Scenario, invariant: &str, budget: usize) -> Scenario {
    let breaks = |s: &Scenario| {
        check(s.clone())
            .violations
            .iter()
            .any(|v| v.invariant == invariant)
    };
    let mut best = scenario.clone();
    let mut runs = 0;
    loop {
        let mut candidates: Vec<Scenario> = Vec::new();
        for i in 0..best.events.len() {
            let mut c = best.clone();
            c.events.remove(i);
            candidates.push(c);
        }
        if best.consolidation.is_some() {
            let mut c = best.clone();
            c.consolidation = None;
            candidates.push(c);
        }
        if !best.lock_tables.is_empty() {
            let mut c = best.clone();
            c.lock_tables.clear();
            candidates.push(c);
        }
        if best.workload.clients > 1 {
            let mut c = best.clone();
            c.workload.clients = best.workload.clients.div_ceil(2);
            candidates.push(c);
        }
        let mut improved = false;
        for c in candidates {
            if runs >= budget {
                return best;
            }
            runs += 1;
            if c.validate().is_ok() && breaks(&c) {
                best = c;
                improved = true;
                break;
            }
        }
        if !improved {
            return best;
        }
    }
}
