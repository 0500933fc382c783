//! Prometheus metrics, plus exact reconcile-latency percentiles for the bench figures.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    pub namespace: String,
    pub cluster: String,
    pub stage: String,
}

/// Samples kept for the percentile endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// eviction, delete or prestop.
    pub door: String,
    pub component: String,
    pub verdict: String,
}

const LATENCY_SAMPLES: usize = 20_000;

/// The newest latency samples, for percentiles (the histograms are for Prometheus).
#[derive(Default)]
struct Samples(Mutex<VecDeque<Duration>>);

impl Samples {
    fn push(&self, took: Duration) {
        let mut samples = self.0.lock().expect("latency lock");
        if samples.len() == LATENCY_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(took);
    }

    /// p50 and p99 in milliseconds, and the sample count, over the newest `newest` samples
    /// (all kept when `None`).
    fn percentiles(&self, newest: Option<usize>) -> (f64, f64, usize) {
        let kept = self.0.lock().expect("latency lock");
        let skip = newest.map_or(0, |n| kept.len().saturating_sub(n));
        let mut samples: Vec<Duration> = kept.iter().skip(skip).copied().collect();
        drop(kept);
        if samples.is_empty() {
            return (0.0, 0.0, 0);
        }
        samples.sort();
        let at = |q: f64| {
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[i].as_secs_f64() * 1000.0
        };
        (at(0.50), at(0.99), samples.len())
    }
}

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ResultLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub actions: Family<ActionLabels, Counter>,
    /// Index of the rollout's current phase (−1: none, phases count: complete).
    pub rollout_phase: Family<ClusterLabels, Gauge>,
    pub rollout_halted: Family<ClusterLabels, Gauge>,
    /// 1 while a creation waits past its stall timeout (it keeps waiting; it never halts).
    pub creation_slow: Family<ClusterLabels, Gauge>,
    /// Things the core holds back now (a rollout gate, drains waiting for confirmation).
    pub holds: Family<ClusterLabels, Gauge>,
    pub drains: Family<DrainLabels, Gauge>,
    /// Active drains waiting longer than their cluster's `drain.alarmAfter` (they keep waiting).
    pub drains_alarmed: Family<ClusterLabels, Gauge>,
    /// Readings of the kernel that failed (uncertainty the core holds on).
    pub kernel_unreachable: Family<ClusterLabels, Counter>,
    pub leader: Gauge,
    /// Reconciles that panicked (each is that cluster's error; the controller goes on).
    pub reconcile_panics: Counter,
    /// Acts refused or cut because this replica's lease fence had closed.
    pub fenced_acts: Counter,
    /// 1 while a cluster's spec is refused (nothing is changed in it until it is fixed).
    pub spec_invalid: Family<ClusterLabels, Gauge>,
    /// Drain-hook requests refused because they could not prove which pod sent them.
    pub hook_refusals: Counter,
    /// Disruption reviews (webhook or preStop hook) refused because this replica is a standby.
    pub standby_refusals: Counter,
    /// When the webhook's serving certificate expires (Unix seconds; 0: no webhook).
    pub webhook_certificate_expiry: Gauge,
    pub reviews: Family<ReviewLabels, Counter>,
    pub review_seconds: Histogram,
    /// From a watch event of a cluster's objects to its reconcile's actions carried out.
    pub reaction_seconds: Histogram,
    latencies: Samples,
    review_latencies: Samples,
    reaction_latencies: Samples,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mo_operator");
        let reconciles = Family::<ResultLabel, Counter>::default();
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let actions = Family::<ActionLabels, Counter>::default();
        let rollout_phase = Family::<ClusterLabels, Gauge>::default();
        let rollout_halted = Family::<ClusterLabels, Gauge>::default();
        let creation_slow = Family::<ClusterLabels, Gauge>::default();
        let holds = Family::<ClusterLabels, Gauge>::default();
        let drains = Family::<DrainLabels, Gauge>::default();
        let drains_alarmed = Family::<ClusterLabels, Gauge>::default();
        let standby_refusals = Counter::default();
        let webhook_certificate_expiry = Gauge::default();
        let kernel_unreachable = Family::<ClusterLabels, Counter>::default();
        let leader = Gauge::default();
        let reconcile_panics = Counter::default();
        let fenced_acts = Counter::default();
        let spec_invalid = Family::<ClusterLabels, Gauge>::default();
        let hook_refusals = Counter::default();
        let reviews = Family::<ReviewLabels, Counter>::default();
        let review_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let reaction_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "reaction_duration_seconds",
            "From a watch event of a cluster's pods, nodes, budgets or object to its reconcile's actions carried out",
            reaction_seconds.clone(),
        );
        registry.register(
            "disruption_reviews",
            "Eviction / delete / preStop reviews answered, by door, component and verdict",
            reviews.clone(),
        );
        registry.register(
            "disruption_review_duration_seconds",
            "Time to answer one review (webhook or preStop hook)",
            review_seconds.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciliations by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconciliation",
            reconcile_seconds.clone(),
        );
        registry.register(
            "actions",
            "Decision-core actions carried out, by result",
            actions.clone(),
        );
        registry.register(
            "rollout_phase",
            "Index of the current rollout phase (-1 none)",
            rollout_phase.clone(),
        );
        registry.register(
            "rollout_halted",
            "1 while a rollout is halted",
            rollout_halted.clone(),
        );
        registry.register(
            "creation_slow",
            "1 while a cluster's creation waits past its stall timeout (it keeps waiting)",
            creation_slow.clone(),
        );
        registry.register(
            "holds",
            "Gates and drains the core is holding on",
            holds.clone(),
        );
        registry.register("drains", "Drains by stage", drains.clone());
        registry.register(
            "drains_alarmed",
            "Active drains waiting past drain.alarmAfter (they keep waiting)",
            drains_alarmed.clone(),
        );
        registry.register(
            "standby_refusals",
            "Disruption reviews refused because this replica is a standby (no leader answers them)",
            standby_refusals.clone(),
        );
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's serving certificate expires (Unix seconds)",
            webhook_certificate_expiry.clone(),
        );
        registry.register(
            "kernel_unreachable",
            "Kernel readings that failed (the core holds)",
            kernel_unreachable.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        registry.register(
            "reconcile_panics",
            "Reconciles that panicked (that cluster's error; the others go on)",
            reconcile_panics.clone(),
        );
        registry.register(
            "fenced_acts",
            "Acts refused or cut because this replica's lease fence had closed",
            fenced_acts.clone(),
        );
        registry.register(
            "spec_invalid",
            "1 while a cluster's spec is refused (nothing is changed in it until it is fixed)",
            spec_invalid.clone(),
        );
        registry.register(
            "hook_refusals",
            "Drain-hook requests refused because they could not prove which pod sent them",
            hook_refusals.clone(),
        );
        Metrics {
            registry,
            reconcile_panics,
            fenced_acts,
            spec_invalid,
            hook_refusals,
            reconciles,
            reconcile_seconds,
            actions,
            rollout_phase,
            rollout_halted,
            creation_slow,
            holds,
            drains,
            drains_alarmed,
            kernel_unreachable,
            leader,
            standby_refusals,
            webhook_certificate_expiry,
            reviews,
            review_seconds,
            reaction_seconds,
            latencies: Samples::default(),
            review_latencies: Samples::default(),
            reaction_latencies: Samples::default(),
        }
    }

    pub fn observe_reconcile(&self, took: Duration, ok: bool) {
        self.reconcile_seconds.observe(took.as_secs_f64());
        self.reconciles
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
        self.latencies.push(took);
    }

    /// Reconcile latency: p50, p99 in ms and the sample count (over the newest `newest`).
    pub fn latency_percentiles(&self, newest: Option<usize>) -> (f64, f64, usize) {
        self.latencies.percentiles(newest)
    }

    pub fn observe_reaction(&self, took: Duration) {
        self.reaction_seconds.observe(took.as_secs_f64());
        self.reaction_latencies.push(took);
    }

    /// Reaction (watch event → actions done) latency: p50, p99 in ms and the sample count.
    pub fn reaction_percentiles(&self, newest: Option<usize>) -> (f64, f64, usize) {
        self.reaction_latencies.percentiles(newest)
    }

    pub fn observe_review(&self, door: &str, component: &str, allowed: bool, took: Duration) {
        self.review_seconds.observe(took.as_secs_f64());
        self.reviews
            .get_or_create(&ReviewLabels {
                door: door.into(),
                component: component.into(),
                verdict: if allowed { "allow" } else { "deny" }.into(),
            })
            .inc();
        self.review_latencies.push(took);
    }

    /// Review (webhook decision) latency: p50, p99 in ms and the sample count.
    pub fn review_percentiles(&self) -> (f64, f64, usize) {
        self.review_latencies.percentiles(None)
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_samples() {
        let m = Metrics::new();
        for ms in 1..=100 {
            m.observe_reconcile(Duration::from_millis(ms), ms != 7);
        }
        let (p50, p99, n) = m.latency_percentiles(None);
        assert_eq!(n, 100);
        assert!((50.0..=51.0).contains(&p50), "{p50}");
        assert!((99.0..=100.0).contains(&p99), "{p99}");
        let (p50, _, n) = m.latency_percentiles(Some(10));
        assert_eq!(n, 10);
        assert!(
            (95.0..=96.0).contains(&p50),
            "the newest ten are 91..=100 ms: {p50}"
        );
        let text = m.encode();
        assert!(
            text.contains("mo_operator_reconciles_total{result=\"error\"} 1"),
            "{text}"
        );
    }
}
