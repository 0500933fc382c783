//! `mo-operator render -f cluster.yaml`: every object the operator creates for a cluster, as
//! YAML documents (like `helm template`), for reviews and GitOps. The controller builds the
//! same objects with the same functions; only what depends on the running cluster differs
//! (owner references need the stored object's UID; disruption budgets follow what the
//! operator observes, so they are shown as they start: no voluntary disruption allowed).

use anyhow::{Context as _, Result, bail};
use mo_core::Component;
use mo_kube::crd::MatrixOneCluster;
use mo_kube::resources::{self, DrainHook};
use mo_kube::validation::{self, OperatorRules};
use serde::Serialize;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The MatrixOneCluster manifest (YAML or JSON; `-` reads standard input).
    #[arg(short = 'f', long = "filename")]
    pub file: String,
    /// Namespace when the manifest names none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// The operator's image, for the CN pods' drain-hook init container (as `run` has it).
    #[arg(long, env = "MO_OPERATOR_IMAGE")]
    pub drain_hook_image: Option<String>,
    /// The operator's URL for the CN pods' preStop hook (as `run` has it); unset: no hook.
    #[arg(long, env = "MO_DRAIN_HOOK_ENDPOINT")]
    pub drain_hook_endpoint: Option<String>,
    #[arg(
        long,
        value_delimiter = ' ',
        default_value = "/mo-operator-hook/mo-operator drain-hook"
    )]
    pub drain_hook_command: Vec<String>,
    /// As `run` has it: directories under which a `fileSystem` shared storage may live.
    #[arg(long = "allow-host-path-under", value_name = "DIR")]
    pub host_path_prefixes: Vec<String>,
}

/// The objects in the order a reader wants them: configuration, services, workloads, pods,
/// budgets.
pub fn objects(cluster: &MatrixOneCluster, hook: Option<&DrainHook>) -> Result<Vec<String>> {
    let spec = cluster.spec.clone();
    spec.strategy().context("spec.upgrade.strategy")?;
    spec.safe_config()?;
    let bootstrap = resources::initial_log_bootstrap(cluster);
    let mut docs = Vec::new();
    fn push<T: Serialize>(docs: &mut Vec<String>, kind: &str, api: &str, object: &T) -> Result<()> {
        let mut value = serde_json::to_value(object)?;
        if let Some(map) = value.as_object_mut() {
            // k8s-openapi leaves these to the client; a manifest needs them.
            map.insert("apiVersion".into(), api.into());
            map.insert("kind".into(), kind.into());
            map.remove("status");
        }
        docs.push(serde_yaml_ng::to_string(&value)?);
        Ok(())
    }
    let config = resources::config_map(cluster, Some(&bootstrap))?;
    push(&mut docs, "ConfigMap", "v1", &config)?;
    for c in Component::ALL {
        push(
            &mut docs,
            "Service",
            "v1",
            &resources::headless_service(cluster, c),
        )?;
    }
    push(&mut docs, "Service", "v1", &resources::sql_service(cluster))?;
    for c in [Component::Log, Component::Tn, Component::Proxy] {
        let sts = resources::statefulset(cluster, c, &spec.version);
        push(&mut docs, "StatefulSet", "apps/v1", &sts)?;
    }
    for group in &spec.cn.groups {
        for ordinal in 0..group.replicas {
            let pod = resources::cn_pod(cluster, &group.name, ordinal, &spec.version, hook);
            push(&mut docs, "Pod", "v1", &pod)?;
        }
    }
    for (component, pods) in spec.desired_pods() {
        let pdb = resources::pdb(
            cluster,
            component,
            pods.len() as i32,
            "until the operator observes the cluster, no voluntary disruption is allowed",
        );
        push(&mut docs, "PodDisruptionBudget", "policy/v1", &pdb)?;
    }
    Ok(docs)
}

pub fn run(args: &Args) -> Result<()> {
    let text = if args.file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let mut value: serde_json::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not YAML", args.file))?;
    if value["metadata"]["namespace"].is_null() && value["metadata"].is_object() {
        value["metadata"]["namespace"] = args.namespace.clone().into();
    }
    // What the API server (as kubectl asks it: unknown fields refused) and the operator would
    // refuse, refused here, each naming its field; nothing is rendered for it.
    let rules = OperatorRules {
        host_path_prefixes: args.host_path_prefixes.clone(),
    };
    let cluster = validation::check_object(&value, None, true).and_then(|cluster| {
        let errors = validation::operator_checks(&cluster, &rules);
        if errors.is_empty() {
            Ok(cluster)
        } else {
            Err(errors)
        }
    });
    let cluster = match cluster {
        Ok(c) => c,
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
            bail!("{}: refused:\n{}", args.file, lines.join("\n"));
        }
    };
    let hook = match (
        &args.drain_hook_endpoint,
        args.drain_hook_command.is_empty(),
    ) {
        (Some(endpoint), false) => Some(DrainHook {
            command: args.drain_hook_command.clone(),
            endpoint: endpoint.clone(),
            image: args.drain_hook_image.clone(),
        }),
        _ => None,
    };
    for doc in objects(&cluster, hook.as_ref())? {
        println!("---\n{}", doc.trim_end());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> MatrixOneCluster {
        serde_yaml_ng::from_str(
            r#"
apiVersion: ops.matrixorigin.io/v1alpha1
kind: MatrixOneCluster
metadata: {name: mo, namespace: db}
spec:
  version: v1.2.4
  log: {replicas: 3}
  cn: {groups: [{name: tp, replicas: 2}, {name: ap, replicas: 1}]}
  proxy: {replicas: 2}
  sharedStorage: {fileSystem: {path: /srv/mo}}
"#,
        )
        .expect("cluster")
    }

    #[test]
    fn every_object_of_a_cluster_is_rendered_once_with_its_kind() {
        let docs = objects(&cluster(), None).expect("renders");
        let kinds: Vec<(String, String)> = docs
            .iter()
            .map(|d| {
                let v: serde_json::Value = serde_yaml_ng::from_str(d).expect("yaml");
                (
                    v["kind"].as_str().unwrap_or_default().to_string(),
                    v["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        let count = |k: &str| kinds.iter().filter(|(kind, _)| kind == k).count();
        assert_eq!(count("ConfigMap"), 1);
        assert_eq!(count("Service"), 5, "4 headless + SQL: {kinds:?}");
        assert_eq!(count("StatefulSet"), 3);
        assert_eq!(count("Pod"), 3, "one per CN: {kinds:?}");
        assert_eq!(count("PodDisruptionBudget"), 4);
        assert!(kinds.contains(&("Pod".into(), "mo-ap-0".into())));
        // Not stored yet: no owner references to a UID that does not exist.
        assert!(docs.iter().all(|d| !d.contains("ownerReferences")));
        assert!(docs[0].contains("cn-ap.toml") && docs[0].contains("bootstrap-cluster"));
    }
}
