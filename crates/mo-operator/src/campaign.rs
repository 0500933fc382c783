//! `mo-operator campaign`: randomized fault campaigns on the simulator.

use anyhow::{Result, bail};
use mo_sim::campaign::{self, CampaignReport};
use mo_sim::{RunOptions, Simulation};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Number of generated scenarios.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,
    #[arg(long, default_value_t = 1)]
    pub start_seed: u64,
    #[arg(long, default_value = "safe")]
    pub policy: String,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Rerun one seed with its event log, print its violations.
    #[arg(long)]
    pub replay: Option<u64>,
    /// Shrink violating seeds (the first few) and write minimal scenarios here.
    #[arg(long, default_value = "campaign-failures")]
    pub shrink_dir: PathBuf,
    /// How many violating seeds to shrink.
    #[arg(long, default_value_t = 3)]
    pub shrink: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    if !mo_sim::policy::KNOWN_POLICIES.contains(&args.policy.as_str()) {
        bail!(
            "unknown policy `{}` (known: {})",
            args.policy,
            mo_sim::policy::KNOWN_POLICIES.join(", ")
        );
    }
    if let Some(seed) = args.replay {
        return replay(seed, &args.policy, args.json);
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(args.seeds);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} seeds ({elapsed}, eta {eta})",
            )
            .expect("static template"),
        );
        bar
    });
    let report = campaign::run_campaign(
        args.start_seed,
        args.seeds,
        &args.policy,
        threads,
        &|done| {
            if let Some(bar) = &bar {
                bar.set_position(done);
            }
        },
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let shrunk = shrink_failures(&report, &args)?;
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["shrunk"] = serde_json::to_value(&shrunk)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_report(&report, &shrunk);
    }
    Ok(())
}

/// Shrinks the first violating seeds and writes their minimal scenarios.
fn shrink_failures(report: &CampaignReport, args: &Args) -> Result<Vec<String>> {
    let mut commands = Vec::new();
    for failure in report.failures.iter().take(args.shrink) {
        let mut scenario = campaign::generate(failure.seed);
        scenario.policy = args.policy.clone();
        let minimal = campaign::shrink(&scenario, &failure.invariant, 40);
        std::fs::create_dir_all(&args.shrink_dir)?;
        let path = args
            .shrink_dir
            .join(format!("seed-{}-{}.yaml", failure.seed, args.policy));
        std::fs::write(&path, minimal.to_yaml())?;
        commands.push(format!(
            "mo-operator sim {} --events events.log",
            path.display()
        ));
    }
    Ok(commands)
}

fn print_report(r: &CampaignReport, shrunk: &[String]) {
    println!(
        "{} scenarios under `{}`: {} violations in {} seeds; {} events in {:.1} s ({:.0} scenarios/s)",
        r.scenarios,
        r.policy,
        r.violations,
        r.violating_seeds.len(),
        r.events,
        r.wall_seconds,
        r.scenarios as f64 / r.wall_seconds.max(1e-9)
    );
    for (invariant, n) in &r.by_invariant {
        println!("  {n:>6} × {invariant}");
    }
    println!("scenarios per class of disruption:");
    for (class, n) in &r.by_class {
        println!("  {n:>6} × {class}");
    }
    println!("scenarios per kernel mechanism gone through:");
    for (mechanism, n) in &r.by_mechanism {
        println!("  {n:>6} × {mechanism}");
    }
    for f in r.failures.iter().take(10) {
        println!(
            "seed {} at {:.0}s: {}: {}",
            f.seed, f.at, f.invariant, f.detail
        );
        println!("  replay: {}", f.replay);
    }
    if r.failures.len() > 10 {
        println!("… and {} more violating seeds", r.failures.len() - 10);
    }
    for command in shrunk {
        println!("minimal scenario: {command}");
    }
}

fn replay(seed: u64, policy: &str, json: bool) -> Result<()> {
    let mut scenario = campaign::generate(seed);
    scenario.policy = policy.to_string();
    let result = campaign::check(scenario.clone());
    let mut sim = Simulation::new(
        scenario.clone(),
        RunOptions {
            record_events: true,
            check_invariants: true,
            ..RunOptions::default()
        },
    );
    let report = sim.run(&mut |_| {});
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    println!("# scenario of seed {seed}\n{}", scenario.to_yaml());
    for line in sim.event_log() {
        println!("{line}");
    }
    print!("{}", crate::output::summary(&report));
    for v in &result.violations {
        println!("VIOLATION at {:.0}s: {}: {}", v.at, v.invariant, v.detail);
    }
    Ok(())
}
