//! Runs the workload against one address for a while and prints the outcomes as JSON.
//!
//! ```sh
//! cargo run -p mo-sqlload --example drive -- 127.0.10.7:6001 [seconds=30] [clients=4] [tables=2]
//! ```
//! `MO_SQL_USER` / `MO_SQL_PASSWORD` (default `dump` / `111`), `MO_SQL_DATABASE` (default
//! `mo_sqlload`), `RUST_LOG` (e.g. `mo_sqlload=debug` logs every failure). A snapshot goes to
//! stderr every 5 s.

use std::time::Duration;

use anyhow::Context;
use mo_sqlload::{Target, TargetLoad, Workload, WorkloadConfig, prepare};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "mo_sqlload=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let address = args
        .next()
        .context("usage: drive HOST:PORT [seconds] [clients] [tables]")?;
    let mut number = |default: u64| -> anyhow::Result<u64> {
        args.next()
            .map_or(Ok(default), |a| a.parse().context("not a number"))
    };
    let seconds = number(30)?;
    let clients = number(4)? as usize;
    let tables = number(2)?;
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
    let target = Target::new("target", address)
        .with_credentials(env("MO_SQL_USER", "dump"), env("MO_SQL_PASSWORD", "111"));
    let database = env("MO_SQL_DATABASE", "mo_sqlload");
    let tables: Vec<String> = (0..tables).map(|i| format!("t{i}")).collect();

    let mut config = WorkloadConfig::new(
        vec![TargetLoad {
            target: target.clone(),
            clients,
        }],
        &database,
        tables.clone(),
    );
    prepare(&target, &database, &tables, config.rows_per_table).await?;
    config.statement_timeout = Duration::from_secs(20);
    let workload = Workload::start(config).await?;
    let end = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(5).min(end - tokio::time::Instant::now())).await;
        let s = workload.snapshot();
        eprintln!(
            "{:>6} ms: committed {} failed {} unknown {} connect_errors {} max gap {:?}",
            s.elapsed_ms,
            s.committed,
            s.failed,
            s.unknown,
            s.connect_errors,
            s.max_commit_gap()
        );
    }
    let outcomes = workload.stop().await;
    println!("{}", serde_json::to_string_pretty(&outcomes)?);
    Ok(())
}
