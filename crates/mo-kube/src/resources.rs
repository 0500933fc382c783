//! The objects a `MatrixOneCluster` owns, built from its spec: pure functions, applied with
//! server-side apply by the controller.
//!
//! LOG, TN and proxy pods come from StatefulSets with the `OnDelete` update strategy and CN
//! pods are created by the operator itself: no workload controller ever restarts a MatrixOne
//! pod on its own. The decision core chooses each restart; the template's version changes
//! only when the core restarts a pod of that component.

use crate::crd::{GROUP, MatrixOneCluster};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodSpec, PodTemplateSpec, Service,
    ServicePort, ServiceSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;
use mo_core::Component;
use std::collections::BTreeMap;

pub const LABEL_CLUSTER: &str = "ops.matrixorigin.io/cluster";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_CN_GROUP: &str = "ops.matrixorigin.io/cn-group";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_PREPULL: &str = "ops.matrixorigin.io/prepull";
pub const MANAGED_BY: &str = "mo-operator";
/// The pod annotation carrying the MatrixOne version the pod was created with.
pub const ANNOTATION_VERSION: &str = "ops.matrixorigin.io/version";
/// Toleration that lets pods run on the simulated nodes of the e2e data plane.
pub const SIMULATED_TAINT: &str = "ops.matrixorigin.io/simulated";

/// Ports the kernel listens on (see the reference: 32001 HAKeeper, 6003 lock service, …).
fn ports(component: Component) -> Vec<(&'static str, i32)> {
    match component {
        Component::Log => vec![("hakeeper", 32001), ("log", 32000)],
        Component::Tn => vec![("txn", 41010), ("lock-alloc", 41011)],
        Component::Cn => vec![("sql", 6001), ("lock", 6003), ("query", 6005)],
        Component::Proxy => vec![("sql", 6009)],
    }
}

pub fn owner_reference(cluster: &MatrixOneCluster) -> OwnerReference {
    cluster
        .controller_owner_ref(&())
        .expect("a stored cluster has a name and a uid")
}

pub fn labels(cluster: &str, component: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "matrixone".into()),
        ("app.kubernetes.io/instance".into(), cluster.into()),
        (LABEL_COMPONENT.into(), component.as_str().into()),
        (LABEL_MANAGED_BY.into(), MANAGED_BY.into()),
        (LABEL_CLUSTER.into(), cluster.into()),
    ])
}

/// Selects exactly this cluster's pods of `component`.
pub fn selector(cluster: &str, component: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_CLUSTER.into(), cluster.into()),
        (LABEL_COMPONENT.into(), component.as_str().into()),
    ])
}

fn meta(cluster: &MatrixOneCluster, name: String, component: Option<Component>) -> ObjectMeta {
    let cluster_name = cluster.metadata.name.clone().unwrap_or_default();
    ObjectMeta {
        name: Some(name),
        namespace: cluster.metadata.namespace.clone(),
        labels: Some(match component {
            Some(c) => labels(&cluster_name, c),
            None => BTreeMap::from([
                (LABEL_CLUSTER.to_string(), cluster_name.clone()),
                (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            ]),
        }),
        owner_references: Some(vec![owner_reference(cluster)]),
        ..ObjectMeta::default()
    }
}

pub fn image(cluster: &MatrixOneCluster, version: &str) -> String {
    format!("{}:{version}", cluster.spec.image)
}

/// The version in an image reference (`repo:tag` → `tag`).
pub fn version_of_image(image: &str) -> Option<&str> {
    let (repo, tag) = image.rsplit_once(':')?;
    (!tag.contains('/') && !repo.is_empty()).then_some(tag)
}

pub fn headless_service_name(cluster: &str, component: Component) -> String {
    format!("{cluster}-{}-headless", component.as_str())
}

pub fn statefulset_name(cluster: &str, component: Component) -> String {
    format!("{cluster}-{}", component.as_str())
}

/// Full pod name of a pod the spec names `log-0`, `cn-a-2`, …
pub fn pod_name(cluster: &str, short: &str) -> String {
    format!("{cluster}-{short}")
}

fn pod_template(
    cluster: &MatrixOneCluster,
    component: Component,
    version: &str,
    extra_labels: &[(&str, &str)],
) -> PodTemplateSpec {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut labels = labels(&name, component);
    for (k, v) in extra_labels {
        labels.insert((*k).into(), (*v).into());
    }
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            // Born pinned for autoscalers: the operator lifts the hints once moving is safe,
            // so a failed or late update never leaves a new pod unprotected.
            annotations: Some(BTreeMap::from([
                (ANNOTATION_VERSION.to_string(), version.to_string()),
                (
                    crate::protection::DO_NOT_DISRUPT.to_string(),
                    "true".to_string(),
                ),
                (
                    crate::protection::SAFE_TO_EVICT.to_string(),
                    "false".to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec(cluster, component, version)),
    }
}

fn pod_spec(cluster: &MatrixOneCluster, component: Component, version: &str) -> PodSpec {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    PodSpec {
        containers: vec![Container {
            name: "main".into(),
            image: Some(image(cluster, version)),
            args: Some(vec![
                "-launch".into(),
                format!("/etc/matrixone/{}.toml", component.as_str()),
            ]),
            ports: Some(
                ports(component)
                    .into_iter()
                    .map(|(n, p)| ContainerPort {
                        name: Some(n.into()),
                        container_port: p,
                        ..ContainerPort::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        }],
        subdomain: Some(headless_service_name(&name, component)),
        // Long enough for a CN to hand its lock tables over after SIGTERM.
        termination_grace_period_seconds: Some(match component {
            Component::Cn => 600,
            _ => 120,
        }),
        tolerations: Some(vec![Toleration {
            key: Some(SIMULATED_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }]),
        ..PodSpec::default()
    }
}

/// LOG, TN and proxy: StatefulSets whose pods restart only when the operator deletes them.
pub fn statefulset(cluster: &MatrixOneCluster, component: Component, version: &str) -> StatefulSet {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let replicas = match component {
        Component::Log => cluster.spec.log.replicas,
        Component::Tn => cluster.spec.tn.replicas,
        Component::Proxy => cluster.spec.proxy.replicas,
        Component::Cn => unreachable!("CN pods are created by the operator"),
    };
    StatefulSet {
        metadata: meta(cluster, statefulset_name(&name, component), Some(component)),
        spec: StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(headless_service_name(&name, component)),
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(selector(&name, component)),
                ..LabelSelector::default()
            },
            template: pod_template(cluster, component, version, &[]),
            ..StatefulSetSpec::default()
        },
        status: None,
    }
}

/// One CN pod of `group`, ordinal `ordinal`.
/// The preStop hook of CN pods: a command of this binary that blocks until the drain of the
/// pod's own instance is confirmed by the operator at `endpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainHook {
    /// E.g. `["/mo-operator-hook/mo-operator", "drain-hook"]`.
    pub command: Vec<String>,
    /// The operator's HTTP endpoint (`http://mo-operator.<ns>.svc:8080`).
    pub endpoint: String,
    /// The operator's image: an init container copies its binary into a volume the CN
    /// container mounts at [`HOOK_DIR`], so the hook exists in any CN image. None: the CN
    /// image must carry the command itself.
    pub image: Option<String>,
}

/// Where CN containers find the hook binary the init container installed.
pub const HOOK_DIR: &str = "/mo-operator-hook";
const HOOK_VOLUME: &str = "mo-operator-hook";

pub const ENV_HOOK_ENDPOINT: &str = "MO_OPERATOR_ENDPOINT";

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

pub fn cn_pod(
    cluster: &MatrixOneCluster,
    group: &str,
    ordinal: i32,
    version: &str,
    hook: Option<&DrainHook>,
) -> Pod {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let template = pod_template(cluster, Component::Cn, version, &[(LABEL_CN_GROUP, group)]);
    let short = format!("{group}-{ordinal}");
    let mut metadata = template.metadata.unwrap_or_default();
    metadata.name = Some(pod_name(&name, &short));
    metadata.namespace = cluster.metadata.namespace.clone();
    metadata.owner_references = Some(vec![owner_reference(cluster)]);
    let mut spec = template.spec.unwrap_or_default();
    spec.hostname = Some(pod_name(&name, &short));
    // Sized for the drain: the hook waits (at most this long) for this instance's confirmation.
    spec.termination_grace_period_seconds = Some(
        crate::crd::parse_go_duration(&cluster.spec.drain.grace_period)
            .map_or(3600, |m| (m.0 / 1000).max(30) as i64),
    );
    if let Some(image) = hook.and_then(|h| h.image.clone()) {
        let mount = VolumeMount {
            name: HOOK_VOLUME.into(),
            mount_path: HOOK_DIR.into(),
            ..VolumeMount::default()
        };
        spec.volumes = Some(vec![Volume {
            name: HOOK_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }]);
        spec.init_containers = Some(vec![Container {
            name: "install-drain-hook".into(),
            image: Some(image),
            command: Some(vec![
                "mo-operator".into(),
                "install-hook".into(),
                format!("{HOOK_DIR}/mo-operator"),
            ]),
            volume_mounts: Some(vec![mount.clone()]),
            ..Container::default()
        }]);
        if let Some(container) = spec.containers.first_mut() {
            container.volume_mounts = Some(vec![VolumeMount {
                read_only: Some(true),
                ..mount
            }]);
        }
    }
    if let (Some(hook), Some(container)) = (hook, spec.containers.first_mut()) {
        container.lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(hook.command.clone()),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        });
        container.env = Some(vec![
            EnvVar {
                name: ENV_HOOK_ENDPOINT.into(),
                value: Some(hook.endpoint.clone()),
                ..EnvVar::default()
            },
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_UID", "metadata.uid"),
        ]);
    }
    Pod {
        metadata,
        spec: Some(spec),
        status: None,
    }
}

/// A pod that only pulls `version`'s image onto `node` (and exits).
pub fn prepull_pod(cluster: &MatrixOneCluster, node: &str, version: &str) -> Pod {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let pod_name = prepull_pod_name(&name, node, version);
    let mut metadata = meta(cluster, pod_name, None);
    if let Some(labels) = metadata.labels.as_mut() {
        labels.insert(LABEL_PREPULL.into(), "true".into());
    }
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_VERSION.to_string(),
        version.to_string(),
    )]));
    Pod {
        metadata,
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "pull".into(),
                image: Some(image(cluster, version)),
                command: Some(vec!["true".into()]),
                ..Container::default()
            }],
            tolerations: pod_spec(cluster, Component::Cn, version).tolerations,
            ..PodSpec::default()
        }),
        status: None,
    }
}

pub fn prepull_pod_name(cluster: &str, node: &str, version: &str) -> String {
    let version: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{cluster}-pull-{node}-{version}");
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

pub fn headless_service(cluster: &MatrixOneCluster, component: Component) -> Service {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    Service {
        metadata: meta(
            cluster,
            headless_service_name(&name, component),
            Some(component),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector(&name, component)),
            publish_not_ready_addresses: Some(true),
            ports: Some(
                ports(component)
                    .into_iter()
                    .map(|(n, p)| ServicePort {
                        name: Some(n.into()),
                        port: p,
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Where each component finds the others (the kernel's launch configuration, abridged).
pub fn config_map(cluster: &MatrixOneCluster) -> ConfigMap {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let hakeeper = (0..cluster.spec.log.replicas)
        .map(|i| {
            format!(
                "\"{name}-log-{i}.{}.{ns}.svc:32001\"",
                headless_service_name(&name, Component::Log)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut data = BTreeMap::new();
    for c in Component::ALL {
        data.insert(
            format!("{}.toml", c.as_str()),
            format!(
                "service-type = \"{}\"\n[hakeeper-client]\nservice-addresses = [{hakeeper}]\n",
                c.as_str().to_uppercase()
            ),
        );
    }
    data.insert("log-shards".into(), cluster.spec.log.shards.to_string());
    ConfigMap {
        metadata: meta(cluster, format!("{name}-config"), None),
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// The disruption budget of one component, computed by the operator each tick.
pub fn pdb(
    cluster: &MatrixOneCluster,
    component: Component,
    min_available: i32,
    reason: &str,
) -> k8s_openapi::api::policy::v1::PodDisruptionBudget {
    use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut metadata = meta(
        cluster,
        format!("{name}-{}", component.as_str()),
        Some(component),
    );
    metadata.annotations = Some(BTreeMap::from([(
        "ops.matrixorigin.io/reason".to_string(),
        reason.to_string(),
    )]));
    PodDisruptionBudget {
        metadata,
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(min_available)),
            selector: Some(LabelSelector {
                match_labels: Some(selector(&name, component)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// API group/version string of the CRD (for owner references in tests and manifests).
pub fn api_version() -> String {
    format!("{GROUP}/v1alpha1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MatrixOneClusterSpec;

    fn cluster() -> MatrixOneCluster {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v1.2.0",
            "log": {"replicas": 3},
            "cn": {"groups": [{"name": "tp", "replicas": 2}]},
        }))
        .expect("valid");
        let mut c = MatrixOneCluster::new("mo", spec);
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-1".into());
        c
    }

    #[test]
    fn workloads_never_roll_pods_on_their_own() {
        let c = cluster();
        for component in [Component::Log, Component::Tn, Component::Proxy] {
            let sts = statefulset(&c, component, "v1.2.0");
            let spec = sts.spec;
            assert_eq!(
                spec.update_strategy.and_then(|s| s.type_).as_deref(),
                Some("OnDelete")
            );
            let owner = &sts.metadata.owner_references.expect("owned")[0];
            assert_eq!(
                (owner.uid.as_str(), owner.controller),
                ("uid-1", Some(true))
            );
        }
    }

    #[test]
    fn cn_pods_are_named_by_group_and_ordinal_and_carry_their_version() {
        let pod = cn_pod(&cluster(), "tp", 1, "v1.2.0", None);
        assert_eq!(pod.metadata.name.as_deref(), Some("mo-tp-1"));
        let labels = pod.metadata.labels.expect("labels");
        assert_eq!(labels[LABEL_CN_GROUP], "tp");
        assert_eq!(labels[LABEL_COMPONENT], "cn");
        let annotations = pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(
            annotations[crate::protection::DO_NOT_DISRUPT],
            "true",
            "born pinned"
        );
        assert_eq!(
            pod.spec.expect("spec").containers[0].image.as_deref(),
            Some("matrixorigin/matrixone:v1.2.0")
        );
    }

    /// The hook the CN runs is installed into it from the operator's image; its grace period
    /// is the spec's drain grace period.
    #[test]
    fn a_cn_pod_carries_its_drain_hook_and_the_binary_for_it() {
        let hook = DrainHook {
            command: vec![format!("{HOOK_DIR}/mo-operator"), "drain-hook".into()],
            endpoint: "http://mo-operator.mo-system.svc:8080".into(),
            image: Some("ghcr.io/example/mo-operator:0.1.0".into()),
        };
        let spec = cn_pod(&cluster(), "tp", 0, "v1", Some(&hook))
            .spec
            .expect("spec");
        assert_eq!(spec.termination_grace_period_seconds, Some(3600));
        let init = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(init.image, hook.image);
        let installs_to = init.command.as_ref().expect("command")[2].clone();
        assert_eq!(installs_to, hook.command[0]);
        let main = &spec.containers[0];
        let mount = &main.volume_mounts.as_ref().expect("mounts")[0];
        assert!(installs_to.starts_with(&mount.mount_path));
        assert_eq!(
            init.volume_mounts.as_ref().expect("mounts")[0].name,
            mount.name
        );
        let exec = main
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| h.exec.as_ref())
            .and_then(|e| e.command.clone());
        assert_eq!(exec, Some(hook.command.clone()));
        let env: Vec<_> = main.env.iter().flatten().map(|e| e.name.as_str()).collect();
        for name in [ENV_HOOK_ENDPOINT, "POD_NAMESPACE", "POD_NAME", "POD_UID"] {
            assert!(env.contains(&name), "{env:?}");
        }
        let bare = cn_pod(&cluster(), "tp", 0, "v1", None).spec.expect("spec");
        assert!(bare.init_containers.is_none() && bare.containers[0].lifecycle.is_none());
    }

    #[test]
    fn image_versions_and_prepull_names() {
        assert_eq!(
            version_of_image("matrixorigin/matrixone:v3.0.1"),
            Some("v3.0.1")
        );
        assert_eq!(version_of_image("localhost:5000/mo"), None);
        let name = prepull_pod_name("mo", "node-1", "v3.0.1-RC");
        assert_eq!(name, "mo-pull-node-1-v3-0-1-rc");
        assert!(prepull_pod_name(&"x".repeat(80), "n", "v").len() <= 63);
    }
}
