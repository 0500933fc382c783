//! `mo-operator`: the MatrixOne operator. Without a cluster it runs on the embedded simulator.

mod campaign;
mod embedded;
mod output;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
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
    /// The main job on the embedded simulator: both incidents under every policy.
    Demo {
        #[arg(long)]
        json: bool,
    },
    /// List the embedded scenarios.
    Scenarios,
    /// Randomized fault campaign: invariants checked on every event.
    Campaign {
        /// Number of generated scenarios.
        #[arg(long, default_value_t = 1000)]
        seeds: u64,
        #[arg(long, default_value_t = 1)]
        start_seed: u64,
        #[arg(long, default_value = "safe")]
        policy: String,
        /// Worker threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Rerun one seed with its event log, print its violations.
        #[arg(long)]
        replay: Option<u64>,
        /// Shrink violating seeds (the first few) and write minimal scenarios here.
        #[arg(long, default_value = "campaign-failures")]
        shrink_dir: PathBuf,
        /// How many violating seeds to shrink.
        #[arg(long, default_value_t = 3)]
        shrink: usize,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Sim {
            scenario,
            policy,
            seed,
            json,
            events,
        } => sim(&scenario, policy, seed, json, events),
        Command::Demo { json } => demo(json),
        Command::Campaign {
            seeds,
            start_seed,
            policy,
            threads,
            replay,
            shrink_dir,
            shrink,
            json,
        } => campaign::run(campaign::Args {
            seeds,
            start_seed,
            policy,
            threads,
            replay,
            shrink_dir,
            shrink,
            json,
        }),
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

fn demo(json: bool) -> Result<()> {
    let mut incidents = Vec::new();
    for (name, text) in embedded::INCIDENTS {
        let scenario = Scenario::from_yaml(text)?;
        let mut runs = serde_json::Map::new();
        for policy in mo_sim::policy::KNOWN_POLICIES {
            let mut s = scenario.clone();
            s.policy = policy.to_string();
            let report = Simulation::new(s, RunOptions::default()).run(&mut |_| {});
            runs.insert(policy.to_string(), serde_json::to_value(&report)?);
        }
        let mut entry = serde_json::Map::new();
        entry.insert("name".into(), serde_json::Value::String(name.to_string()));
        entry.extend(runs);
        incidents.push(serde_json::Value::Object(entry));
    }
    if json {
        let doc = serde_json::json!({ "incidents": incidents });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", output::demo_table(&incidents)?);
    }
    Ok(())
}
