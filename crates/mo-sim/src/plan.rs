//! Upgrade plans: the phases a strategy gives, the gates each step waits on, and the lower
//! bound on the makespan under the simulator's timing model.

use crate::scenario::Scenario;
use mo_core::{Component, Millis, Strategy};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct PlannedPhase {
    pub component: Component,
    pub pods: usize,
    /// Pods restarted at once at the largest safe parallelism.
    pub parallelism: usize,
    pub before_each_pod: String,
    pub after_each_pod: String,
    /// Lower bound on this phase's duration (seconds).
    pub lower_bound_seconds: f64,
    /// The same with the stability window the spec asks after each round of restarts (the
    /// last round's is the phase's own): what no schedule that honours the spec can beat.
    pub with_holds_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub strategy: String,
    pub phases: Vec<PlannedPhase>,
    /// The first image pull, which nothing can overlap.
    pub image_pull_seconds: f64,
    pub lower_bound_seconds: f64,
    /// The lower bound with the spec's stability windows (`stabilityWindow` after each round
    /// of every phase): the physical bound plus the holds the spec requires.
    pub with_holds_seconds: f64,
}

/// The lower bound for `strategy` on `scenario`'s topology and timings: one image pull, then
/// each LOG replica's restart + rejoin + catch-up in sequence, then TN, CN and proxy restarts
/// as many at once as the safe policy's `cn_max_unavailable` / `proxy_max_unavailable` allow,
/// and never all of them (another CN must be Working, another proxy routing), one TN.
pub fn plan(scenario: &Scenario, strategy: &Strategy) -> Plan {
    let t = &scenario.timings;
    let topo = &scenario.topology;
    let stop = |shutdown: Millis| t.kubelet_stop_delay.millis() + shutdown;
    let start = t.container_start.millis();
    let cn_pods: usize = topo.cn_groups.iter().map(|g| g.replicas).sum();
    let safe = &scenario.safe;
    // At most the configured width, and one pod of the component stays up.
    let width =
        |max: mo_core::MaxUnavailable, pods: usize| max.of(pods).min(pods.saturating_sub(1)).max(1);
    let phases = strategy
        .phases()
        .into_iter()
        .map(|component| {
            let (pods, parallelism, one, before, after) = match component {
                Component::Log => (
                    topo.log_replicas,
                    1,
                    stop(t.log_shutdown.millis())
                        + start
                        + t.log_rejoin.millis()
                        + t.log_catch_up.millis(),
                    "every shard it serves has a leader and a caught-up majority without it; its leaderships moved away",
                    "rejoined and caught up on every shard, held for the stability window",
                ),
                Component::Tn => (
                    topo.tn_replicas,
                    1,
                    stop(t.tn_shutdown.millis()) + start + t.tn_start.millis(),
                    "the WAL shard is writable",
                    "new instance heartbeating, WAL writable, no fatal exit, held for the window",
                ),
                Component::Cn => (
                    cn_pods,
                    width(safe.cn_max_unavailable, cn_pods),
                    // The drain's shortest path is one keepalive (the handshake).
                    t.bind_keepalive.millis()
                        + stop(t.cn_shutdown.millis())
                        + start
                        + t.cn_start.millis(),
                    "another CN is Working; drained: sessions moved, lock tables handed over, this instance confirmed",
                    "registered with HAKeeper as the new instance, heartbeating, Working, held for the window",
                ),
                Component::Proxy => (
                    topo.proxy_replicas,
                    width(safe.proxy_max_unavailable, topo.proxy_replicas),
                    stop(t.proxy_shutdown.millis()) + start + t.proxy_start.millis(),
                    // Not counted: the wait for its clients to leave once it is out of its
                    // Service, which depends on their connection lifetime (it can be nil).
                    "another proxy routes to a Working CN; out of its Service, no client connection left on it",
                    "in its Service, routes to a Working CN",
                ),
            };
            let rounds = pods.div_ceil(parallelism) as u64;
            let window = scenario.safe.stability_window;
            PlannedPhase {
                component,
                pods,
                parallelism,
                before_each_pod: before.into(),
                after_each_pod: after.into(),
                lower_bound_seconds: Millis(one.0 * rounds).as_secs_f64(),
                with_holds_seconds: Millis((one.0 + window.0) * rounds).as_secs_f64(),
            }
        })
        .collect::<Vec<_>>();
    let image_pull_seconds = t.image_pull.millis().as_secs_f64();
    let lower_bound_seconds =
        image_pull_seconds + phases.iter().map(|p| p.lower_bound_seconds).sum::<f64>();
    let with_holds_seconds =
        image_pull_seconds + phases.iter().map(|p| p.with_holds_seconds).sum::<f64>();
    Plan {
        strategy: strategy.to_string(),
        phases,
        image_pull_seconds,
        lower_bound_seconds,
        with_holds_seconds,
    }
}
