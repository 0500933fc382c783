//! Hostile and careless cluster specs (`tests/data/hostile-specs.yaml`) against all three
//! judges: `mo-operator render -f`, the API server (as `kubectl` asks it: unknown fields
//! refused) and the running operator. Each spec is refused by every judge that sees it,
//! naming the same field, or accepted everywhere because it is valid; a cluster the operator
//! refuses is marked InvalidSpec and stops no other cluster.

mod support;

use serde_json::Value;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{BIN, TestNs, wait_for};

const READY_LIMIT: Duration = Duration::from_secs(180);
/// The directory `render` and the operator allow hostPath storage under in these cases.
const HOST_PATHS: &str = "/var/lib/matrixone";

#[derive(serde::Deserialize)]
struct Corpus {
    base: Value,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize, Clone)]
struct Case {
    name: String,
    #[serde(default)]
    set: serde_json::Map<String, Value>,
    #[serde(default)]
    update: serde_json::Map<String, Value>,
    #[serde(default)]
    valid: bool,
    refused: Option<String>,
    by: Option<String>,
}

fn corpus() -> Corpus {
    let text = include_str!("data/hostile-specs.yaml");
    serde_yaml_ng::from_str(text).expect("the corpus reads")
}

/// Writes `value` at JSON `pointer`, making the objects on the way.
fn set(target: &mut Value, pointer: &str, value: Value) {
    let mut at = target;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if let Ok(index) = part.parse::<usize>()
            && at.is_array()
        {
            if last {
                at[index] = value;
                return;
            }
            at = &mut at[index];
            continue;
        }
        if !at.is_object() {
            *at = Value::Object(Default::default());
        }
        let map = at.as_object_mut().expect("an object");
        if last {
            map.insert(part.to_string(), value);
            return;
        }
        at = map
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Default::default()));
    }
}

fn with(base: &Value, writes: &serde_json::Map<String, Value>) -> Value {
    let mut out = base.clone();
    for (pointer, value) in writes {
        set(&mut out, pointer, value.clone());
    }
    out
}

/// `render -f -`: (succeeded, stdout length, stderr).
fn render(manifest: &Value) -> (bool, usize, String) {
    let mut child = Command::new(BIN)
        .args([
            "render",
            "-f",
            "-",
            "-n",
            "db",
            "--allow-host-path-under",
            HOST_PATHS,
        ])
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("render runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(serde_json::to_string(manifest).expect("json").as_bytes())
        .expect("write manifest");
    let out = child.wait_with_output().expect("render ends");
    (
        out.status.success(),
        out.stdout.len(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl <verb> -f -` in the test's namespace: (succeeded, stderr).
fn kubectl(t: &TestNs, args: &[&str], manifest: &Value) -> (bool, String) {
    let mut child = Command::new(t.shared.plane.kubectl())
        .args(args)
        .args(["-n", &t.ns, "-f", "-"])
        .env("KUBECONFIG", t.kubeconfig())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(serde_json::to_string(manifest).expect("json").as_bytes())
        .expect("write manifest");
    let out = child.wait_with_output().expect("kubectl ends");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn every_hostile_spec_is_refused_by_render_the_api_server_and_the_operator_naming_its_field()
{
    let t = TestNs::new("e2e-hostile-specs").await;
    let Corpus { base, cases } = corpus();
    assert!(cases.len() >= 54, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut operator_cases = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let mut manifest = with(&base, &case.set);
        if !case.set.contains_key("/metadata/name") {
            manifest["metadata"]["name"] = format!("c{i}").into();
        }
        let expect = |verdict: (bool, &str), judge: &str| -> Option<String> {
            let (ok, text) = verdict;
            match (&case.refused, case.valid) {
                (_, true) if ok => None,
                (_, true) => Some(format!(
                    "{}: {judge} refused a valid spec: {text}",
                    case.name
                )),
                (Some(field), false) if !ok && text.contains(field.as_str()) => None,
                (Some(field), false) if !ok => Some(format!(
                    "{}: {judge} refused without naming {field}: {text}",
                    case.name
                )),
                (Some(field), false) => Some(format!(
                    "{}: {judge} accepted (expected {field})",
                    case.name
                )),
                (None, false) => Some(format!("{}: the case names no verdict", case.name)),
            }
        };
        if case.update.is_empty() {
            let (ok, size, stderr) = render(&manifest);
            failures.extend(expect((ok, &stderr), "render"));
            assert!(size < 1 << 20, "{}: render printed {size} bytes", case.name);
            // The operator's refusals are the API server's acceptances: those are created for
            // the operator to judge; the others are judged without being stored.
            let by_api = case.by.as_deref() == Some("api") || case.valid;
            if by_api {
                let verdict = kubectl(&t, &["create", "--dry-run=server"], &manifest);
                failures.extend(expect((verdict.0, &verdict.1), "the API server"));
            } else {
                let (ok, stderr) = kubectl(&t, &["create"], &manifest);
                if !ok {
                    failures.push(format!("{}: the API server refused: {stderr}", case.name));
                }
                operator_cases.push((manifest, case.clone()));
            }
        } else {
            let (ok, stderr) = kubectl(&t, &["create"], &manifest);
            assert!(ok, "{}: the base is stored: {stderr}", case.name);
            let updated = with(&manifest, &case.update);
            let verdict = kubectl(&t, &["replace", "--dry-run=server"], &updated);
            failures.extend(expect((verdict.0, &verdict.1), "the API server (update)"));
            let (ok, stderr) = kubectl(&t, &["delete"], &manifest);
            assert!(ok, "{stderr}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The operator marks each of its refusals, and a valid cluster beside them, whose stored
    // spec once stopped every cluster's watch (a null size), goes on.
    let mut good = base.clone();
    good["metadata"]["name"] = "good".into();
    set(
        &mut good,
        "/spec/log/storage",
        serde_json::json!({"size": null}),
    );
    set(
        &mut good,
        "/spec/sharedStorage",
        serde_json::json!({"fileSystem": {"path": "/tmp/mo-shared"}}),
    );
    let (ok, stderr) = kubectl(&t, &["create"], &good);
    assert!(ok, "{stderr}");
    let _operator = t.operator_with_args(
        "op",
        &[
            "--allow-host-path-under".to_string(),
            HOST_PATHS.to_string(),
        ],
    );
    for (manifest, case) in &operator_cases {
        let name = manifest["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let field = case.refused.clone().expect("a refusal");
        let message = wait_for(
            &format!("{} marked InvalidSpec", case.name),
            READY_LIMIT,
            || async {
                let (status, reason, message) = t.condition(&name, "Degraded").await?;
                (status == "True" && reason == "InvalidSpec").then_some(message)
            },
        )
        .await;
        assert!(message.contains(&field), "{}: {message}", case.name);
        let pods = t.pod_names().await;
        assert!(
            !pods.iter().any(|p| p.starts_with(&format!("{name}-"))),
            "{}: nothing is made for a refused spec: {pods:?}",
            case.name
        );
    }
    t.wait_ready("good", READY_LIMIT).await;

    // A Secret its owner did not open to clusters is not handed to the kernel: the cluster
    // naming it is refused, naming the field, until the owner labels it.
    let out = t.kubectl(&[
        "create",
        "secret",
        "generic",
        "app-db",
        "-n",
        &t.ns,
        "--from-literal=password=s3cret",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut reader = base.clone();
    reader["metadata"]["name"] = "reader".into();
    set(
        &mut reader,
        "/spec/rootPasswordSecret",
        serde_json::json!({"name": "app-db", "key": "password"}),
    );
    let (ok, stderr) = kubectl(&t, &["create"], &reader);
    assert!(ok, "{stderr}");
    let message = wait_for("reader refused", READY_LIMIT, || async {
        let (status, reason, message) = t.condition("reader", "Degraded").await?;
        (status == "True" && reason == "InvalidSpec").then_some(message)
    })
    .await;
    assert!(
        message.contains("spec.rootPasswordSecret.name"),
        "{message}"
    );
    assert!(
        !t.pod_names().await.iter().any(|p| p.starts_with("reader-")),
        "no pod names the Secret"
    );
    let out = t.kubectl(&[
        "label",
        "secret",
        "app-db",
        "-n",
        &t.ns,
        "ops.matrixorigin.io/cluster-secret=true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "reader's pods made once the Secret is opened",
        READY_LIMIT,
        || async {
            t.pod_names()
                .await
                .iter()
                .any(|p| p.starts_with("reader-"))
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "{} specs: {} refused by the API server and render, {} by the operator and render, {} valid",
        cases.len(),
        cases
            .iter()
            .filter(|c| c.by.as_deref() == Some("api"))
            .count(),
        operator_cases.len(),
        cases.iter().filter(|c| c.valid).count()
    );
}
