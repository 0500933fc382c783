//! The demo's self-contained HTML report: per run, a timeline per pod (phases, drains,
//! restarts, fatal exits), transaction outcomes over time, and where each gate held or failed.

use mo_sim::{Report, Trace};
use std::collections::BTreeMap;
use std::fmt::Write;

pub struct Run<'a> {
    pub policy: &'a str,
    pub report: &'a Report,
    pub trace: &'a Trace,
}

pub struct Incident<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub runs: Vec<Run<'a>>,
}

const LABEL: f64 = 150.0;
const PLOT: f64 = 900.0;
const LANE: f64 = 18.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn lane_of(subject: &str) -> &str {
    subject.split(" (").next().unwrap_or(subject)
}

fn lane_rank(lane: &str) -> (u8, &str) {
    let rank = if lane == "phases" {
        0
    } else if lane == "rollout" {
        1
    } else if lane.starts_with("log-") {
        2
    } else if lane.starts_with("tn-") {
        3
    } else if lane.starts_with("proxy-") {
        5
    } else if lane == "unsafe" {
        6
    } else {
        4
    };
    (rank, lane)
}

pub fn render(incidents: &[Incident<'_>]) -> String {
    let mut h = String::new();
    h.push_str(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>mo-operator demo</title><style>\
         body{font:14px system-ui,sans-serif;margin:24px;color:#222}\
         table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
         th:first-child,td:first-child{text-align:left}.bad{background:#fdd}.good{background:#dfd}\
         .lane{font:11px monospace}details{margin:6px 0}svg{background:#fafafa;border:1px solid #ddd}\
         .legend span{display:inline-block;margin-right:14px}</style></head><body>\
         <h1>mo-operator: the two incidents, legacy vs safe</h1>\
         <p class=\"legend\"><span>▮ <b style=\"color:#d55\">pod down</b></span><span>▼ deleted</span>\
         <span style=\"color:#b00\">✖ fatal exit</span><span style=\"color:#090\">● released after confirmation</span>\
         <span style=\"color:#c90\">| waiting on a gate (hover)</span><span style=\"color:#b00\">▲ unsafe action</span></p>",
    );
    for incident in incidents {
        let _ = write!(
            h,
            "<h2>{}</h2><p>{}</p>",
            esc(incident.name),
            esc(incident.description)
        );
        summary_table(&mut h, &incident.runs);
        for run in &incident.runs {
            let _ = write!(
                h,
                "<h3>{} — policy <code>{}</code></h3>",
                esc(incident.name),
                esc(run.policy)
            );
            timeline(&mut h, run);
            outcomes(&mut h, run);
            gates(&mut h, run);
        }
    }
    h.push_str("</body></html>\n");
    h
}

fn summary_table(h: &mut String, runs: &[Run<'_>]) {
    h.push_str("<table><tr><th></th>");
    for r in runs {
        let _ = write!(h, "<th>{}</th>", esc(r.policy));
    }
    h.push_str("</tr>");
    type Row = (&'static str, fn(&Report) -> f64, bool);
    let rows: [Row; 8] = [
        ("transactions committed", |r| r.txns.committed as f64, false),
        ("failed (definite)", |r| r.txns.failed_definite as f64, true),
        ("unknown outcome", |r| r.txns.unknown as f64, true),
        ("TN fatal exits", |r| r.tn_fatal_exits as f64, true),
        ("seconds with no route", |r| r.proxy_no_route_seconds, true),
        (
            "deletes without drain confirmation",
            |r| r.unsafe_actions.pod_deleted_without_drain_confirmation as f64,
            true,
        ),
        (
            "phase advances on a failed gate",
            |r| r.unsafe_actions.phase_advanced_on_failed_gate as f64,
            true,
        ),
        (
            "LOG restarts without quorum margin",
            |r| r.unsafe_actions.log_restart_without_quorum_margin as f64,
            true,
        ),
    ];
    for (label, value, zero_is_good) in rows {
        let _ = write!(h, "<tr><td>{label}</td>");
        for r in runs {
            let v = value(r.report);
            let class = match (zero_is_good, v == 0.0) {
                (true, true) => "good",
                (true, false) => "bad",
                _ => "",
            };
            let _ = write!(h, "<td class=\"{class}\">{v:.0}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("<tr><td>upgrade</td>");
    for r in runs {
        let text = match &r.report.upgrade {
            None => "—".to_string(),
            Some(u) => match u.finished_at {
                Some(f) => format!("finished at {f:.0} s"),
                None => r
                    .report
                    .waiting_on
                    .get("rollout")
                    .cloned()
                    .unwrap_or_else(|| "not finished".into()),
            },
        };
        let _ = write!(
            h,
            "<td style=\"text-align:left;max-width:380px\">{}</td>",
            esc(&text)
        );
    }
    h.push_str("</tr></table>");
}

fn timeline(h: &mut String, run: &Run<'_>) {
    let end = run.report.sim_seconds.max(1.0);
    let x = |t: f64| LABEL + t / end * PLOT;
    let mut lanes: BTreeMap<(u8, String), Vec<&mo_sim::TraceEvent>> = BTreeMap::new();
    for e in &run.trace.events {
        let lane = lane_of(&e.lane);
        let (rank, name) = lane_rank(lane);
        lanes.entry((rank, name.to_string())).or_default().push(e);
    }
    let height = (lanes.len() as f64 + 1.5) * LANE + 10.0;
    let _ = write!(
        h,
        "<svg width=\"{}\" height=\"{height}\" xmlns=\"http://www.w3.org/2000/svg\">",
        LABEL + PLOT + 20.0
    );
    // Time axis every 5 (or 1) minutes.
    let step = if end > 1800.0 { 300.0 } else { 60.0 };
    let mut t = 0.0;
    while t <= end {
        let _ = write!(
            h,
            "<line x1=\"{0}\" x2=\"{0}\" y1=\"0\" y2=\"{1}\" stroke=\"#eee\"/><text x=\"{0}\" y=\"{2}\" font-size=\"10\" fill=\"#888\">{3}m</text>",
            x(t),
            height - 12.0,
            height - 2.0,
            (t / 60.0) as u64
        );
        t += step;
    }
    for (i, ((_, lane), events)) in lanes.iter().enumerate() {
        let y = i as f64 * LANE + 4.0;
        let mid = y + LANE / 2.0;
        let _ = write!(
            h,
            "<text x=\"4\" y=\"{}\" class=\"lane\">{}</text><line x1=\"{LABEL}\" x2=\"{}\" y1=\"{mid}\" y2=\"{mid}\" stroke=\"#ccc\"/>",
            mid + 4.0,
            esc(lane),
            LABEL + PLOT
        );
        if lane == "phases" {
            let mut open: Option<(f64, String)> = None;
            for e in events {
                match e.kind.as_str() {
                    "phase-start" => open = Some((e.at, e.text.clone())),
                    "phase-end" => {
                        if let Some((s, c)) = open.take() {
                            phase_rect(h, x(s), x(e.at), y, &c);
                        }
                    }
                    _ => {}
                }
            }
            if let Some((s, c)) = open {
                phase_rect(h, x(s), x(end), y, &format!("{c} (not finished)"));
            }
            continue;
        }
        let mut down: Option<f64> = None;
        for e in events {
            let tip = format!("{:.1}s {}: {}", e.at, e.kind, e.text);
            match e.kind.as_str() {
                "deleted" | "crash" | "fatal" | "sigterm" => {
                    down.get_or_insert(e.at);
                }
                "running" | "restart" => {
                    if let Some(s) = down.take() {
                        down_rect(h, x(s), x(e.at), y);
                    }
                }
                _ => {}
            }
            let (glyph, color) = match e.kind.as_str() {
                "deleted" => ("▼", "#e80"),
                "fatal" => ("✖", "#b00"),
                "crash" => ("✖", "#b60"),
                "release" => ("●", "#090"),
                "hold" => ("|", "#c90"),
                "unsafe" => ("▲", "#b00"),
                "restart" => ("↻", "#b60"),
                _ => continue,
            };
            let _ = write!(
                h,
                "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{color}\" text-anchor=\"middle\"><title>{}</title>{glyph}</text>",
                x(e.at),
                mid + 4.0,
                esc(&tip)
            );
        }
        if let Some(s) = down {
            down_rect(h, x(s), x(end), y);
        }
    }
    h.push_str("</svg>");
}

fn phase_rect(h: &mut String, x0: f64, x1: f64, y: f64, label: &str) {
    let _ = write!(
        h,
        "<rect x=\"{x0}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#9bd\" opacity=\"0.6\"><title>{}</title></rect><text x=\"{}\" y=\"{}\" font-size=\"10\">{}</text>",
        y + 2.0,
        (x1 - x0).max(1.0),
        LANE - 4.0,
        esc(label),
        x0 + 2.0,
        y + LANE - 5.0,
        esc(label)
    );
}

fn down_rect(h: &mut String, x0: f64, x1: f64, y: f64) {
    let _ = write!(
        h,
        "<rect x=\"{x0}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#d55\" opacity=\"0.45\"/>",
        y + 4.0,
        (x1 - x0).max(1.0),
        LANE - 8.0
    );
}

fn outcomes(h: &mut String, run: &Run<'_>) {
    let buckets = &run.trace.outcomes;
    if buckets.is_empty() {
        return;
    }
    let end = run.report.sim_seconds.max(1.0);
    let height = 110.0;
    let max_ok = buckets.iter().map(|b| b[0]).max().unwrap_or(1).max(1) as f64;
    let max_bad = buckets.iter().map(|b| b[1] + b[2]).max().unwrap_or(0) as f64;
    let width = run.trace.bucket_seconds / end * PLOT;
    let _ = write!(
        h,
        "<div>Transaction outcomes per {:.0} s (green: committed, scale {max_ok:.0}; orange: failed, red: unknown, scale {max_bad:.0})</div>\
         <svg width=\"{}\" height=\"{height}\" xmlns=\"http://www.w3.org/2000/svg\">",
        run.trace.bucket_seconds,
        LABEL + PLOT + 20.0
    );
    for (i, b) in buckets.iter().enumerate() {
        let x = LABEL + i as f64 * width;
        let ok = b[0] as f64 / max_ok * 50.0;
        let _ = write!(
            h,
            "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{ok}\" fill=\"#6b6\"><title>{:.0}s: {} committed, {} failed, {} unknown</title></rect>",
            52.0 - ok,
            width.max(0.5),
            i as f64 * run.trace.bucket_seconds,
            b[0],
            b[1],
            b[2]
        );
        if max_bad > 0.0 {
            let failed = b[1] as f64 / max_bad * 50.0;
            let unknown = b[2] as f64 / max_bad * 50.0;
            let _ = write!(
                h,
                "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{failed}\" fill=\"#e80\"/><rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{unknown}\" fill=\"#c00\"/>",
                108.0 - failed - unknown,
                width.max(0.5),
                108.0 - unknown,
                width.max(0.5)
            );
        }
    }
    h.push_str("</svg>");
}

fn gates(h: &mut String, run: &Run<'_>) {
    let holds: Vec<&mo_sim::TraceEvent> = run
        .trace
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.kind.as_str(),
                "hold" | "release" | "unsafe" | "phase-start" | "phase-end"
            )
        })
        .collect();
    let _ = write!(
        h,
        "<details><summary>Gates: where each held, waited or failed ({} entries)</summary><table><tr><th>time</th><th>subject</th><th>what</th></tr>",
        holds.len()
    );
    for e in holds.iter().take(400) {
        let class = if e.kind == "unsafe" {
            " class=\"bad\""
        } else {
            ""
        };
        let _ = write!(
            h,
            "<tr{class}><td>{:.0}s</td><td>{}</td><td style=\"text-align:left\">{}: {}</td></tr>",
            e.at,
            esc(&e.lane),
            esc(&e.kind),
            esc(&e.text)
        );
    }
    if holds.len() > 400 {
        let _ = write!(
            h,
            "<tr><td colspan=3>… {} more</td></tr>",
            holds.len() - 400
        );
    }
    h.push_str("</table></details>");
}
