//! Human-readable output.

use indicatif::{ProgressBar, ProgressStyle};
use mo_sim::Report;
use std::fmt::Write;

pub fn progress_bar(total_secs: u64) -> ProgressBar {
    let bar = ProgressBar::new(total_secs);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} simulated s ({elapsed})")
            .expect("static template"),
    );
    bar
}

pub fn summary(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario  {} (policy {}, seed {})",
        r.scenario, r.policy, r.seed
    );
    let _ = writeln!(
        s,
        "ran       {:.0} simulated s in {:.2} s wall, {} events; completed: {}",
        r.sim_seconds, r.wall_seconds, r.events, r.completed
    );
    let _ = writeln!(
        s,
        "txns      committed {}, failed {}, unknown {}",
        r.txns.committed, r.txns.failed_definite, r.txns.unknown
    );
    let by = &r.txn_failures_by_cause;
    let _ = writeln!(
        s,
        "lost to   voluntary disruptions {}, the upgrade's TN restart {}, its restart of the only proxy {}, injected faults {}",
        by.voluntary, by.tn_restart, by.proxy_restart, by.involuntary
    );
    for (kind, n) in &r.errors_by_kind {
        let _ = writeln!(s, "          {n:>6} × {kind}");
    }
    let _ = writeln!(
        s,
        "TN        {} fatal exits {:?}",
        r.tn_fatal_exits, r.tn_fatal_exit_times
    );
    let _ = writeln!(
        s,
        "proxy     {:.0} s with no route; longest stall of a table {:.1} s",
        r.proxy_no_route_seconds, r.longest_table_stall_seconds
    );
    let u = &r.unsafe_actions;
    let _ = writeln!(
        s,
        "unsafe    {} deletes without drain confirmation, {} phase advances on a failed gate, \
         {} LOG restarts without quorum margin, {} upgrades declared finished with pods behind, \
         {} proxy stops with no other route, {} TN stops no upgrade needed",
        u.pod_deleted_without_drain_confirmation,
        u.phase_advanced_on_failed_gate,
        u.log_restart_without_quorum_margin,
        u.finished_with_pods_not_upgraded,
        u.proxy_stopped_without_another_route,
        u.tn_stopped_without_need
    );
    for line in &r.unsafe_action_log {
        let _ = writeln!(s, "          {line}");
    }
    if let Some(up) = &r.upgrade {
        let fmt = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.0}s"));
        let _ = writeln!(
            s,
            "upgrade   started {}, finished {}",
            fmt(up.started_at),
            fmt(up.finished_at)
        );
        for p in &up.phases {
            let _ = writeln!(
                s,
                "          {:<6} {} → {}",
                p.component.to_string(),
                fmt(p.started_at),
                fmt(p.finished_at)
            );
        }
    }
    s
}

/// A table row: its label and how to read it from a report.
type Row = (&'static str, fn(&Report) -> String);

/// Side-by-side table of each incident under each policy.
pub fn demo_table(incidents: &[(&str, Vec<(&str, &Report)>)]) -> String {
    let mut s = String::new();
    for (name, runs) in incidents {
        let _ = write!(s, "{name:<36}");
        for (policy, _) in runs {
            let _ = write!(s, "{policy:>12}");
        }
        let _ = writeln!(s);
        let rows: [Row; 12] = [
            ("transactions committed", |r| r.txns.committed.to_string()),
            ("failed (definite)", |r| r.txns.failed_definite.to_string()),
            ("unknown outcome", |r| r.txns.unknown.to_string()),
            ("  of which the TN's restart", |r| {
                r.txn_failures_by_cause.tn_restart.to_string()
            }),
            ("  of which the sole proxy restart", |r| {
                r.txn_failures_by_cause.proxy_restart.to_string()
            }),
            ("TN fatal exits", |r| r.tn_fatal_exits.to_string()),
            ("seconds with no route", |r| {
                format!("{:.0}", r.proxy_no_route_seconds)
            }),
            ("longest stall of a table (s)", |r| {
                format!("{:.1}", r.longest_table_stall_seconds)
            }),
            ("deletes w/o drain confirmation", |r| {
                r.unsafe_actions
                    .pod_deleted_without_drain_confirmation
                    .to_string()
            }),
            ("phase advanced on failed gate", |r| {
                r.unsafe_actions.phase_advanced_on_failed_gate.to_string()
            }),
            ("LOG restart w/o quorum margin", |r| {
                r.unsafe_actions
                    .log_restart_without_quorum_margin
                    .to_string()
            }),
            ("upgrade finished at (s)", |r| match &r.upgrade {
                None => "-".into(),
                Some(u) => u.finished_at.map_or("halted".into(), |f| format!("{f:.0}")),
            }),
        ];
        for (label, value) in rows {
            let _ = write!(s, "  {label:<34}");
            for (_, r) in runs {
                let _ = write!(s, "{:>12}", value(r));
            }
            let _ = writeln!(s);
        }
        for (policy, r) in runs {
            if let Some(reason) = r.waiting_on.get("rollout") {
                let _ = writeln!(s, "  {policy}: {reason}");
            }
        }
        let _ = writeln!(s);
    }
    s
}
