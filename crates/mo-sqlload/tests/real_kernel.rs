//! Against a real MatrixOne cluster, only when `MO_SQL_ADDRESS` names its SQL endpoint (the proxy
//! or a CN), e.g. `MO_SQL_ADDRESS=127.0.10.7:6001`. Optional: `MO_SQL_USER` / `MO_SQL_PASSWORD`
//! (default `dump` / `111`), `MO_SQL_CN_ADDRESSES` (comma-separated CN SQL addresses, for the
//! lock-owner helper). The tests are ignored by default (the real-kernel end-to-end suite of mo-operator drives the
//! same workload against clusters it creates); run them with `--ignored`.

use std::time::Duration;

use mo_sqlload::{
    Error, ErrorKind, Pacing, Target, TargetLoad, Workload, WorkloadConfig, make_owner, prepare,
    table_id, table_states,
};

const DB: &str = "mo_sqlload_test";

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn target(test: &str) -> Option<Target> {
    let Some(address) = env("MO_SQL_ADDRESS") else {
        eprintln!("skipping {test}: MO_SQL_ADDRESS is not set (no real MatrixOne cluster named)");
        return None;
    };
    Some(Target::new("sql", address).with_credentials(
        env("MO_SQL_USER").unwrap_or_else(|| "dump".into()),
        env("MO_SQL_PASSWORD").unwrap_or_else(|| "111".into()),
    ))
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a running MatrixOne: MO_SQL_ADDRESS=host:port cargo test -p mo-sqlload -- --ignored"]
async fn the_workload_commits_and_the_tables_match_its_outcomes() {
    let Some(t) = target("the_workload_commits_and_the_tables_match_its_outcomes") else {
        return;
    };
    let tables = names(&["wl_a", "wl_b"]);
    let mut config = WorkloadConfig::new(
        vec![TargetLoad {
            target: t.clone(),
            clients: 4,
        }],
        DB,
        tables.clone(),
    );
    config.rows_per_table = 20; // small: clients wait on each other's row locks
    config.insert_ratio = 0.3;
    prepare(&t, DB, &tables, config.rows_per_table)
        .await
        .unwrap();
    let workload = Workload::start(config).await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let running = workload.snapshot();
    assert!(running.committed > 0, "{running:#?}");
    assert!(running.consistency.is_none());
    let o = workload.stop().await;
    println!("{}", serde_json::to_string_pretty(&o).unwrap());
    assert!(o.committed >= running.committed);
    assert_eq!(
        (o.failed, o.unknown, o.connect_errors),
        (0, 0, 0),
        "{:#?}",
        o.recent_failures
    );
    assert_eq!(o.per_target["sql"].committed, o.committed);
    let check = o.consistency.as_ref().expect("consistency checked");
    assert!(check.ok, "{check:#?}");
    for name in &tables {
        let table = &o.tables[name];
        assert!(
            table.commits > 0 && table.committed_updates > 0,
            "{name}: {table:?}"
        );
        // An idle healthy cluster commits on every table many times a second.
        assert!(table.max_commit_gap_ms < 5_000, "{name}: {table:?}");
        // The check is exact here: the sum moved by exactly the committed increments.
        let c = &check.tables[name];
        assert_eq!(
            c.after.sum - c.before.sum,
            (table.committed_updates + table.committed_inserts) as i64
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a running MatrixOne: MO_SQL_ADDRESS=host:port cargo test -p mo-sqlload -- --ignored"]
async fn prepare_is_idempotent_and_removes_rows_a_workload_inserted() {
    let Some(t) = target("prepare_is_idempotent_and_removes_rows_a_workload_inserted") else {
        return;
    };
    let tables = names(&["prep_a"]);
    prepare(&t, DB, &tables, 10).await.unwrap();
    let mut config = WorkloadConfig::new(
        vec![TargetLoad {
            target: t.clone(),
            clients: 1,
        }],
        DB,
        tables.clone(),
    );
    config.rows_per_table = 10;
    config.insert_ratio = 1.0;
    config.consistency_target = None;
    let workload = Workload::start(config).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let o = workload.stop().await;
    assert!(o.tables["prep_a"].committed_inserts > 0, "{o:#?}");
    assert!(table_states(&t, DB, &tables).await.unwrap()["prep_a"].rows > 10);
    prepare(&t, DB, &tables, 10).await.unwrap();
    let once = table_states(&t, DB, &tables).await.unwrap();
    prepare(&t, DB, &tables, 10).await.unwrap();
    let twice = table_states(&t, DB, &tables).await.unwrap();
    assert_eq!(once["prep_a"].rows, 10);
    assert_eq!(once, twice);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a running MatrixOne: MO_SQL_ADDRESS=host:port cargo test -p mo-sqlload -- --ignored"]
async fn table_ids_come_from_the_catalog_and_make_owner_locks_on_each_cn() {
    let Some(t) = target("table_ids_come_from_the_catalog_and_make_owner_locks_on_each_cn") else {
        return;
    };
    let tables = names(&["own_a", "own_b"]);
    prepare(&t, DB, &tables, 3).await.unwrap();
    let a = table_id(&t, DB, "own_a").await.unwrap();
    let b = table_id(&t, DB, "own_b").await.unwrap();
    assert!(a > 0 && b > 0 && a != b, "{a} {b}");
    assert_eq!(table_id(&t, DB, "own_a").await.unwrap(), a);
    assert!(matches!(
        table_id(&t, DB, "no_such_table").await,
        Err(Error::TableNotFound { .. })
    ));
    let cns: Vec<Target> = env("MO_SQL_CN_ADDRESSES")
        .map(|v| {
            v.split(',')
                .enumerate()
                .map(|(i, addr)| Target {
                    name: format!("cn{i}"),
                    address: addr.trim().into(),
                    ..t.clone()
                })
                .collect()
        })
        .unwrap_or_else(|| vec![t.clone()]);
    for cn in &cns {
        make_owner(cn, DB, "own_a").await.unwrap();
        // The id does not depend on the CN asked.
        assert_eq!(table_id(cn, DB, "own_a").await.unwrap(), a);
    }
    // A table without row 1: nothing to lock, so no bind would be made; said so, not ignored.
    prepare(&t, DB, &names(&["own_empty"]), 1).await.unwrap();
    use mysql_async::prelude::Queryable;
    let mut conn = raw_session(&t).await;
    conn.query_drop(format!("DELETE FROM {DB}.own_empty WHERE id = 1"))
        .await
        .unwrap();
    assert!(matches!(
        make_owner(&t, DB, "own_empty").await,
        Err(Error::NoRowToLock { .. })
    ));
}

async fn raw_session(t: &Target) -> mysql_async::Conn {
    let (host, port) = t.address.rsplit_once(':').unwrap();
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(host)
        .tcp_port(port.parse().unwrap())
        .user(Some(&t.user))
        .pass(Some(&t.password))
        .prefer_socket(false);
    mysql_async::Conn::new(opts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a running MatrixOne: MO_SQL_ADDRESS=host:port cargo test -p mo-sqlload -- --ignored"]
async fn refused_logins_are_connect_errors_not_transactions() {
    let Some(t) = target("refused_logins_are_connect_errors_not_transactions") else {
        return;
    };
    let bad = t.with_credentials("dump", "not-the-password");
    let mut config = WorkloadConfig::new(
        vec![TargetLoad {
            target: bad,
            clients: 1,
        }],
        DB,
        names(&["wl_a"]),
    );
    config.consistency_target = None;
    config.reconnect_delay = Duration::from_millis(100);
    config.pacing = Pacing::Closed {
        think_time: Duration::ZERO,
    };
    let workload = Workload::start(config).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let o = workload.stop().await;
    println!("{}", serde_json::to_string_pretty(&o).unwrap());
    assert!(o.connect_errors > 0);
    assert_eq!((o.committed, o.failed, o.unknown), (0, 0, 0));
    let last = o.recent_failures.last().unwrap();
    assert_eq!(last.error.kind, ErrorKind::Server);
    assert!(last.error.mysql_code.is_some(), "{last:?}");
    assert_eq!(
        o.connect_errors_by_code.values().sum::<u64>(),
        o.connect_errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a running MatrixOne: MO_SQL_ADDRESS=host:port cargo test -p mo-sqlload -- --ignored"]
async fn a_statement_the_kernel_refuses_fails_the_transaction_definitely() {
    let Some(t) = target("a_statement_the_kernel_refuses_fails_the_transaction_definitely") else {
        return;
    };
    prepare(&t, DB, &names(&["wl_a"]), 5).await.unwrap();
    // A table that does not exist: every transaction's first statement gets an error packet.
    let mut config = WorkloadConfig::new(
        vec![TargetLoad {
            target: t.clone(),
            clients: 1,
        }],
        DB,
        names(&["no_such_table_here"]),
    );
    config.consistency_target = None;
    let workload = Workload::start(config).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let o = workload.stop().await;
    println!(
        "{}",
        serde_json::to_string_pretty(&o.first_failures).unwrap()
    );
    assert!(o.failed > 0);
    assert_eq!((o.committed, o.unknown, o.connect_errors), (0, 0, 0));
    assert_eq!(o.failed_by_phase.keys().collect::<Vec<_>>(), ["statement"]);
    let (key, first) = o.first_failures.iter().next().unwrap();
    assert!(key.starts_with("failed/statement/"), "{key}");
    assert_eq!(first.error.kind, ErrorKind::Server);
    // An error packet: the session stays usable (rolled back, not reconnected).
    assert!(first.error.session_usable());
}
