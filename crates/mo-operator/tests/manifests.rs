//! The committed manifests stay what the code generates, and the RBAC stays least-privilege.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_mo-operator");

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_committed_crd_is_the_generated_one() {
    let out = Command::new(BIN).arg("crds").output().expect("runs");
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        repo_file("deploy/crd.yaml"),
        generated,
        "regenerate with: cargo run -p mo-operator -- crds > deploy/crd.yaml"
    );
    assert_eq!(
        repo_file("charts/mo-operator/crds/matrixoneclusters.yaml"),
        generated
    );
}

#[test]
fn the_committed_crd_reference_is_the_generated_one() {
    let out = Command::new(BIN).arg("crd-docs").output().expect("runs");
    assert!(out.status.success());
    assert_eq!(
        repo_file("docs/crd-reference.md"),
        String::from_utf8(out.stdout).expect("utf-8"),
        "regenerate with: cargo run -p mo-operator -- crd-docs > docs/crd-reference.md"
    );
}

fn rules(text: &str) -> String {
    // The ClusterRole's rules: from its `rules:` line to the next document.
    let start = text.find("kind: ClusterRole\n").expect("a ClusterRole");
    let rules = &text[start..];
    let from = rules.find("rules:").expect("rules");
    let to = rules[from..].find("---").map_or(rules.len(), |i| from + i);
    rules[from..to]
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn rbac_is_least_privilege_and_the_chart_grants_the_same() {
    for file in ["deploy/rbac.yaml", "charts/mo-operator/templates/rbac.yaml"] {
        let text: String = repo_file(file)
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!text.contains("\"*\""), "{file}: no wildcard");
        assert!(!text.contains("pods/exec"), "{file}: no exec");
        // Secrets: never listed or watched. Cluster-wide only `get` (the opt-in label of a
        // Secret a cluster names; creating pods that name a Secret already uses it), and the
        // webhook CA in a namespaced Role, created and renewed by name.
        for (i, _) in text.match_indices("resources: [\"secrets\"]") {
            let rule = &text[i..];
            let rule = &rule[..rule.find("- apiGroups").unwrap_or(rule.len())];
            let verbs = rule.lines().find(|l| l.contains("verbs:")).expect("verbs");
            assert!(
                verbs.contains("[\"create\"]")
                    || verbs.contains("[\"get\"]")
                    || rule.contains("resourceNames:"),
                "{file}: secrets beyond get and create are named: {rule}"
            );
            assert!(
                !verbs.contains("list") && !verbs.contains("watch"),
                "{file}: {rule}"
            );
        }
        assert!(
            !text.contains("escalate") && !text.contains("impersonate"),
            "{file}"
        );
    }
    assert_eq!(
        rules(&repo_file("deploy/rbac.yaml")),
        rules(&repo_file("charts/mo-operator/templates/rbac.yaml"))
            .replace("{{ .Release.Name }}", "mo-operator")
    );
}
