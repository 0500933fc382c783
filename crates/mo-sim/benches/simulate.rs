//! Simulator speed: events per second and the wall time of one simulated hour of incident 002
//! under the default workload. Run with `cargo bench -p mo-sim`.

use criterion::{Criterion, criterion_group, criterion_main};
use mo_sim::{RunOptions, Scenario, Simulation};
use std::hint::black_box;

const INCIDENT_002: &str =
    include_str!("../../../scenarios/incident-002-upgrade-without-gates.yaml");
const INCIDENT_000: &str = include_str!("../../../scenarios/incident-000-lock-owner-eviction.yaml");

fn run(text: &str, policy: &str) -> u64 {
    let mut scenario = Scenario::from_yaml(text).expect("embedded scenario parses");
    scenario.policy = policy.into();
    let mut sim = Simulation::new(scenario, RunOptions::default());
    sim.run(&mut |_| {}).events
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    for policy in mo_sim::policy::KNOWN_POLICIES {
        let events = run(INCIDENT_002, policy);
        group.throughput(criterion::Throughput::Elements(events));
        group.bench_function(format!("incident-002-1h/{policy}"), |b| {
            b.iter(|| black_box(run(INCIDENT_002, policy)))
        });
        let events = run(INCIDENT_000, policy);
        group.throughput(criterion::Throughput::Elements(events));
        group.bench_function(format!("incident-000-5m/{policy}"), |b| {
            b.iter(|| black_box(run(INCIDENT_000, policy)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
