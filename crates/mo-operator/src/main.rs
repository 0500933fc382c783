//! `mo-operator`: the MatrixOne operator. Without a cluster it runs on the embedded simulator.

mod allocator;
mod campaign;
mod cluster_status;
mod crd_docs;
mod embedded;
mod hook;
mod html;
mod kubelet;
mod operate;
mod output;
mod render;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use mo_sim::{RunOptions, Scenario, Simulation};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "mo-operator",
    version,
    about = "Safety-first operator for MatrixOne clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario file on the simulator.
    Sim {
        /// Scenario YAML (see docs/scenario-format.md), or the name of an embedded one.
        scenario: String,
        /// Policy to run (overrides the scenario's `policy`).
        #[arg(long)]
        policy: Option<String>,
        /// Seed (overrides the scenario's `seed`).
        #[arg(long)]
        seed: Option<u64>,
        /// Print one JSON object instead of the human summary.
        #[arg(long)]
        json: bool,
        /// Write the event log to this file.
        #[arg(long)]
        events: Option<PathBuf>,
    },
    /// The main job on the embedded simulator: both incidents under `legacy` and `safe`,
    /// side by side, plus an HTML report.
    Demo {
        #[arg(long)]
        json: bool,
        /// Where to write the HTML report.
        #[arg(long, default_value = "mo-operator-demo.html")]
        report: PathBuf,
    },
    /// Print an upgrade plan: phases, gates, the lower bound and the simulated makespan.
    Plan {
        /// Cluster description (a scenario file or embedded name).
        #[arg(default_value = "incident-002-upgrade-without-gates")]
        scenario: String,
        /// Dependency strategy (JSON); default: the scenario's upgrade, else LOG → TN → CN → Proxy.
        #[arg(long)]
        strategy: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Makespans of safe, fixed-window and legacy against the lower bound (incident 002
    /// without the heartbeat fault), and optionally campaign throughput.
    Bench {
        /// Also time a campaign of this many seeds under `safe`.
        #[arg(long, default_value_t = 0)]
        campaign_seeds: u64,
        #[arg(long)]
        json: bool,
    },
    /// List the embedded scenarios.
    Scenarios,
    /// Randomized fault campaign: invariants checked on every event.
    Campaign(campaign::Args),
    /// Run the operator against a Kubernetes cluster (in-cluster config or KUBECONFIG).
    Run(Box<operate::Args>),
    /// Show one cluster as the operator sees it: rollout step and gate, each drain and what it
    /// waits on, disruption budgets, per-pod version, readiness and autoscaler hints, events.
    Status(cluster_status::Args),
    /// Print the MatrixOneCluster CustomResourceDefinition (YAML).
    Crds,
    /// Print the MatrixOneCluster reference (Markdown): every field, its default, its
    /// validation (docs/crd-reference.md is this output).
    CrdDocs,
    /// Print every object the operator creates for a cluster (like `helm template`).
    Render(render::Args),
    /// Attach the simulated MatrixOne data plane to a Kubernetes API server: play kubelet for
    /// MatrixOne pods on fake nodes and serve the admin API.
    Kubelet(kubelet::Args),
    /// preStop hook of CN pods: wait until the operator confirms this instance's drain.
    DrainHook(hook::Args),
    /// Copy this binary to PATH (the CN pods' init container installs the hook with it).
    InstallHook { path: std::path::PathBuf },
    /// The process runtime's container launcher (started by `kubelet --runtime process`).
    #[command(hide = true)]
    KubeletExec(kubelet::exec::Args),
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn main() -> Result<()> {
    let matches = Cli::command().get_matches();
    // The allocator already chose by this name (see `allocator`), before `main`.
    let long_running = matches
        .subcommand_name()
        .is_some_and(|name| allocator::LONG_RUNNING.contains(&name));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::KubeletExec(args) = &cli.command {
        // Before anything else: the launcher must stay single-threaded to enter namespaces.
        std::process::exit(kubelet::exec::main(args));
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if long_running { "info" } else { "warn" })
    });
    if long_running {
        // Services log structured JSON lines (one object per event) for log pipelines.
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    match cli.command {
        Command::Run(args) => tokio_runtime()?.block_on(operate::run(*args)),
        Command::Kubelet(args) => tokio_runtime()?.block_on(kubelet::run(args)),
        Command::InstallHook { path } => hook::install(&path),
        Command::KubeletExec(_) => unreachable!("handled before logging starts"),
        Command::DrainHook(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(hook::run(args)),
        Command::Render(args) => render::run(&args),
        Command::Status(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(cluster_status::run(args)),
        Command::CrdDocs => {
            use kube::CustomResourceExt;
            let crd = serde_json::to_value(mo_kube::crd::MatrixOneCluster::crd())?;
            print!("{}", crd_docs::reference(&crd));
            Ok(())
        }
        Command::Crds => {
            use kube::CustomResourceExt;
            print!(
                "{}",
                serde_yaml_ng::to_string(&mo_kube::crd::MatrixOneCluster::crd())?
            );
            Ok(())
        }
        Command::Sim {
            scenario,
            policy,
            seed,
            json,
            events,
        } => sim(&scenario, policy, seed, json, events),
        Command::Demo { json, report } => demo(json, &report),
        Command::Plan {
            scenario,
            strategy,
            json,
        } => plan(&scenario, strategy.as_deref(), json),
        Command::Bench {
            campaign_seeds,
            json,
        } => bench(campaign_seeds, json),
        Command::Campaign(args) => campaign::run(args),
        Command::Scenarios => {
            for (name, _) in embedded::SCENARIOS {
                println!("{name}");
            }
            Ok(())
        }
    }
}

fn load_scenario(arg: &str) -> Result<Scenario> {
    if let Some(text) = embedded::find(arg) {
        return Ok(Scenario::from_yaml(text)?);
    }
    let path = PathBuf::from(arg);
    if !path.exists() {
        bail!(
            "no scenario file `{arg}` (embedded scenarios: {})",
            embedded::names().join(", ")
        );
    }
    Scenario::from_file(&path).with_context(|| format!("loading {}", path.display()))
}

fn sim(
    arg: &str,
    policy: Option<String>,
    seed: Option<u64>,
    json: bool,
    events: Option<PathBuf>,
) -> Result<()> {
    let mut scenario = load_scenario(arg)?;
    if let Some(policy) = policy {
        scenario.policy = policy;
    }
    if let Some(seed) = seed {
        scenario.seed = seed;
    }
    scenario.validate()?;
    let total = scenario.duration.millis().0 / 1000;
    let mut simulation = Simulation::new(
        scenario,
        RunOptions {
            record_events: events.is_some(),
            ..RunOptions::default()
        },
    );
    let bar = (!json && std::io::stderr().is_terminal()).then(|| output::progress_bar(total));
    let report = simulation.run(&mut |now| {
        if let Some(bar) = &bar {
            bar.set_position(now.0 / 1000);
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(path) = events {
        let mut text = simulation.event_log().join("\n");
        text.push('\n');
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", output::summary(&report));
    }
    Ok(())
}

/// The policies the demo compares.
const DEMO_POLICIES: [&str; 2] = ["legacy", "safe"];

fn run_traced(scenario: &Scenario, policy: &str) -> (mo_sim::Report, mo_sim::Trace) {
    let mut s = scenario.clone();
    s.policy = policy.to_string();
    let mut sim = Simulation::new(
        s,
        RunOptions {
            trace: true,
            ..RunOptions::default()
        },
    );
    let report = sim.run(&mut |_| {});
    let trace = sim.timeline().cloned().unwrap_or_default();
    (report, trace)
}

fn demo(json: bool, report_path: &std::path::Path) -> Result<()> {
    let mut runs = Vec::new();
    for (name, text) in embedded::INCIDENTS {
        let scenario = Scenario::from_yaml(text)?;
        let results: Vec<(&str, mo_sim::Report, mo_sim::Trace)> = DEMO_POLICIES
            .iter()
            .map(|p| {
                let (r, t) = run_traced(&scenario, p);
                (*p, r, t)
            })
            .collect();
        runs.push((*name, scenario.description.clone(), results));
    }
    let incidents: Vec<html::Incident<'_>> = runs
        .iter()
        .map(|(name, description, results)| html::Incident {
            name,
            description,
            runs: results
                .iter()
                .map(|(policy, report, trace)| html::Run {
                    policy,
                    report,
                    trace,
                })
                .collect(),
        })
        .collect();
    std::fs::write(report_path, html::render(&incidents))
        .with_context(|| format!("writing {}", report_path.display()))?;
    if json {
        let incidents: Vec<serde_json::Value> = runs
            .iter()
            .map(|(name, _, results)| {
                let mut entry = serde_json::Map::new();
                entry.insert("name".into(), serde_json::Value::String(name.to_string()));
                for (policy, report, _) in results {
                    entry.insert(
                        policy.to_string(),
                        serde_json::to_value(report).expect("serializes"),
                    );
                }
                serde_json::Value::Object(entry)
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "incidents": incidents }))?
        );
    } else {
        let reports: Vec<(&str, Vec<(&str, &mo_sim::Report)>)> = runs
            .iter()
            .map(|(name, _, results)| (*name, results.iter().map(|(p, r, _)| (*p, r)).collect()))
            .collect();
        print!("{}", output::demo_table(&reports));
        println!("HTML report: {}", report_path.display());
    }
    Ok(())
}

/// Incident 002's cluster and timings without the heartbeat fault, long enough for every policy.
fn incident_002_without_fault() -> Result<Scenario> {
    let mut scenario = Scenario::from_yaml(embedded::INCIDENT_002)?;
    scenario.events.retain(|e| e.fault.is_none());
    scenario.duration = "3h".parse().expect("valid duration");
    scenario.name = "incident-002-without-heartbeat-fault".into();
    Ok(scenario)
}

/// Incident 002's timings on a wider cluster (3 LOG, 1 TN, 8 CN, 3 proxies) whose CNs and
/// proxies an upgrade restarts two at a time.
fn wide_cluster() -> Result<Scenario> {
    let mut scenario = incident_002_without_fault()?;
    scenario.name = "incident-002-timings-8-cn-3-proxies-2-at-once".into();
    scenario.topology.nodes = None;
    scenario.topology.cn_groups[0].replicas = 8;
    scenario.topology.proxy_replicas = 3;
    scenario.safe.cn_max_unavailable = mo_core::MaxUnavailable::Pods(2);
    scenario.safe.proxy_max_unavailable = mo_core::MaxUnavailable::Pods(2);
    Ok(scenario)
}

fn makespan(report: &mo_sim::Report) -> Option<f64> {
    let u = report.upgrade.as_ref()?;
    Some(u.finished_at? - u.started_at?)
}

fn plan(arg: &str, strategy: Option<&str>, json: bool) -> Result<()> {
    let mut scenario = load_scenario(arg)?;
    scenario.events.retain(|e| e.fault.is_none());
    let strategy = match strategy {
        Some(text) => mo_core::Strategy::parse(text)?,
        None => scenario
            .events
            .iter()
            .find_map(|e| e.upgrade.as_ref().and_then(|u| u.strategy.clone()))
            .unwrap_or_default(),
    };
    let the_plan = mo_sim::plan::plan(&scenario, &strategy);
    // The simulator's prediction: the same cluster upgraded by `safe` at t = 60 s.
    scenario.events.retain(|e| e.upgrade.is_none());
    scenario.events.push(mo_sim::scenario::EventSpec {
        at: "60s".parse().expect("valid"),
        upgrade: Some(mo_sim::scenario::UpgradeEvent {
            version: "next".into(),
            strategy: Some(strategy.clone()),
        }),
        ..Default::default()
    });
    scenario.duration = "6h".parse().expect("valid");
    scenario.policy = "safe".into();
    scenario.validate()?;
    let report = Simulation::new(scenario, RunOptions::default()).run(&mut |_| {});
    let predicted = makespan(&report);
    if json {
        let mut value = serde_json::to_value(&the_plan)?;
        value["simulated_makespan_seconds"] = serde_json::json!(predicted);
        value["simulated_waiting_on"] = serde_json::to_value(&report.waiting_on)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("strategy {}", the_plan.strategy);
    println!(
        "first image pull: {:.0} s (new image pre-pulled on every node)",
        the_plan.image_pull_seconds
    );
    for (i, p) in the_plan.phases.iter().enumerate() {
        println!(
            "phase {}: {} — {} pods, {} at a time, at least {:.0} s ({:.0} s with the stability windows)",
            i + 1,
            p.component,
            p.pods,
            p.parallelism,
            p.lower_bound_seconds,
            p.with_holds_seconds
        );
        println!("   before each pod: {}", p.before_each_pod);
        println!("   after each pod:  {}", p.after_each_pod);
        println!(
            "   before the next phase: the whole {} gate holds for the stability window",
            p.component
        );
    }
    println!("lower bound: {:.0} s", the_plan.lower_bound_seconds);
    println!(
        "lower bound with the spec's stability windows: {:.0} s",
        the_plan.with_holds_seconds
    );
    match predicted {
        Some(m) => println!(
            "simulated makespan under `safe`: {m:.0} s ({:.3} × the lower bound, {:.3} × with the windows)",
            m / the_plan.lower_bound_seconds,
            m / the_plan.with_holds_seconds
        ),
        None => println!(
            "simulated upgrade under `safe` did not finish: {:?}",
            report.waiting_on
        ),
    }
    Ok(())
}

fn bench(campaign_seeds: u64, json: bool) -> Result<()> {
    // Each scenario as specified, then with `stabilityWindow: 0s`: with no hold the spec asks
    // for, the lower bound is the physical one and the ratio is the engine's own overhead.
    let mut scenarios = Vec::new();
    for scenario in [incident_002_without_fault()?, wide_cluster()?] {
        let mut no_window = scenario.clone();
        no_window.name = format!("{}-no-stability-window", scenario.name);
        no_window.safe.stability_window = mo_core::Millis(0);
        scenarios.push(scenario);
        scenarios.push(no_window);
    }
    let mut sections = Vec::new();
    for scenario in &scenarios {
        let strategy = scenario
            .events
            .iter()
            .find_map(|e| e.upgrade.as_ref().and_then(|u| u.strategy.clone()))
            .unwrap_or_default();
        let the_plan = mo_sim::plan::plan(scenario, &strategy);
        let lower = the_plan.lower_bound_seconds;
        let with_holds = the_plan.with_holds_seconds;
        let mut rows = Vec::new();
        for policy in ["safe", "fixed-window", "legacy"] {
            let mut s = scenario.clone();
            s.policy = policy.into();
            let report = Simulation::new(s, RunOptions::default()).run(&mut |_| {});
            rows.push(serde_json::json!({
                "policy": policy,
                "makespan_seconds": makespan(&report),
                "ratio_to_lower_bound": makespan(&report).map(|m| m / lower),
                "ratio_to_bound_with_holds": makespan(&report).map(|m| m / with_holds),
                "txns": report.txns,
                "tn_fatal_exits": report.tn_fatal_exits,
                "unsafe_actions": report.unsafe_actions,
                "wall_seconds": report.wall_seconds,
            }));
        }
        sections.push(serde_json::json!({
            "scenario": scenario.name,
            "cn_max_unavailable": scenario.safe.cn_max_unavailable.to_string(),
            "proxy_max_unavailable": scenario.safe.proxy_max_unavailable.to_string(),
            "lower_bound_seconds": lower,
            "bound_with_holds_seconds": with_holds,
            "policies": rows,
        }));
    }
    let campaign = (campaign_seeds > 0).then(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let r = mo_sim::campaign::run_campaign(1, campaign_seeds, "safe", threads, &|_| {});
        serde_json::json!({
            "seeds": campaign_seeds,
            "threads": threads,
            "wall_seconds": r.wall_seconds,
            "scenarios_per_second": campaign_seeds as f64 / r.wall_seconds,
            "events_per_second": r.events as f64 / r.wall_seconds,
            "violations": r.violations,
        })
    });
    let doc = serde_json::json!({
        "scenarios": sections,
        "campaign": campaign,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for section in &sections {
        println!(
            "{} (maxUnavailable CN {}, proxy {}) — lower bound {:.0} s, {:.0} s with the stability windows",
            section["scenario"].as_str().unwrap_or("?"),
            section["cn_max_unavailable"].as_str().unwrap_or("?"),
            section["proxy_max_unavailable"].as_str().unwrap_or("?"),
            section["lower_bound_seconds"].as_f64().unwrap_or(0.0),
            section["bound_with_holds_seconds"].as_f64().unwrap_or(0.0)
        );
        for row in section["policies"].as_array().into_iter().flatten() {
            println!(
                "  {:<13} makespan {:>6} s  ratio {:>6} ({:>6} with the windows)  failed {} unknown {} TN fatal exits {}",
                row["policy"].as_str().unwrap_or("?"),
                row["makespan_seconds"]
                    .as_f64()
                    .map_or("-".into(), |m| format!("{m:.0}")),
                row["ratio_to_lower_bound"]
                    .as_f64()
                    .map_or("-".into(), |m| format!("{m:.3}")),
                row["ratio_to_bound_with_holds"]
                    .as_f64()
                    .map_or("-".into(), |m| format!("{m:.3}")),
                row["txns"]["failed_definite"],
                row["txns"]["unknown"],
                row["tn_fatal_exits"],
            );
        }
    }
    if let Some(c) = campaign {
        println!(
            "  campaign: {} seeds in {:.1} s on {} threads ({:.1} scenarios/s, {} violations)",
            c["seeds"],
            c["wall_seconds"].as_f64().unwrap_or(0.0),
            c["threads"],
            c["scenarios_per_second"].as_f64().unwrap_or(0.0),
            c["violations"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_long_running_command_the_allocator_knows_is_a_subcommand() {
        for name in allocator::LONG_RUNNING {
            assert!(Cli::command().find_subcommand(name).is_some(), "{name}");
        }
    }
}
