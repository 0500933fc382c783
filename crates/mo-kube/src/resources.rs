//! The objects a `MatrixOneCluster` owns, built from its spec: pure functions, applied with
//! server-side apply by the controller.
//!
//! LOG, TN and proxy pods come from StatefulSets with the `OnDelete` update strategy and CN
//! pods are created by the operator itself: no workload controller ever restarts a MatrixOne
//! pod on its own. The decision core chooses each restart; the template's version changes
//! only when the core restarts a pod of that component.

use crate::crd::{GROUP, LogBootstrap, MatrixOneCluster, PodSettings, Retention, VolumeSpec};
use crate::hook_auth;
use crate::kernel_config::{self, CONFIG_DIR, DATA_DIR, SHARED_DIR, START_SCRIPT};
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, HostPathVolumeSource, Lifecycle,
    LifecycleHandler, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, Service, ServiceAccountTokenProjection, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use mo_core::Component;
use std::collections::BTreeMap;

pub const LABEL_CLUSTER: &str = "ops.matrixorigin.io/cluster";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_CN_GROUP: &str = "ops.matrixorigin.io/cn-group";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_PREPULL: &str = "ops.matrixorigin.io/prepull";
/// On proxy pods: "true" while the SQL Service selects the pod. The operator sets "false"
/// before stopping a proxy, whose kernel closes every client connection at once.
pub const LABEL_SERVING: &str = "ops.matrixorigin.io/serving";
pub const MANAGED_BY: &str = "mo-operator";
/// The pod annotation carrying the MatrixOne version the pod was created with.
pub const ANNOTATION_VERSION: &str = "ops.matrixorigin.io/version";

const CONFIG_VOLUME: &str = "config";
const DATA_VOLUME: &str = "data";
const SHARED_VOLUME: &str = "shared";

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
        owner_references: owner_references(cluster),
        ..ObjectMeta::default()
    }
}

/// The cluster as the owner of what it makes; none for a cluster not stored yet (`render`:
/// objects reviewed or applied by GitOps before the operator ever saw the cluster).
fn owner_references(cluster: &MatrixOneCluster) -> Option<Vec<OwnerReference>> {
    cluster.metadata.uid.as_ref()?;
    Some(vec![owner_reference(cluster)])
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

/// The settings of a role's pods (a CN group's for CN pods).
pub fn pod_settings<'a>(
    cluster: &'a MatrixOneCluster,
    component: Component,
    group: Option<&str>,
) -> Option<&'a PodSettings> {
    let spec = &cluster.spec;
    match component {
        Component::Log => Some(&spec.log.pods),
        Component::Tn => Some(&spec.tn.pods),
        Component::Proxy => Some(&spec.proxy.pods),
        Component::Cn => spec
            .cn
            .groups
            .iter()
            .find(|g| Some(g.name.as_str()) == group)
            .map(|g| &g.pods),
    }
}

fn pod_template(
    cluster: &MatrixOneCluster,
    component: Component,
    group: Option<&str>,
    version: &str,
    extra_labels: &[(&str, &str)],
) -> PodTemplateSpec {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut labels = labels(&name, component);
    for (k, v) in extra_labels {
        labels.insert((*k).into(), (*v).into());
    }
    let mut annotations = pod_settings(cluster, component, group)
        .map(|p| p.pod_annotations.clone())
        .unwrap_or_default();
    annotations.insert(ANNOTATION_VERSION.to_string(), version.to_string());
    // Born pinned for autoscalers: the operator lifts the hints once moving is safe, so a
    // failed or late update never leaves a new pod unprotected.
    annotations.insert(
        crate::protection::DO_NOT_DISRUPT.to_string(),
        "true".to_string(),
    );
    annotations.insert(
        crate::protection::SAFE_TO_EVICT.to_string(),
        "false".to_string(),
    );
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec(cluster, component, group, version)),
    }
}

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

fn literal_env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Bytes of a Kubernetes quantity (`2Gi`, `1500M`, `2048`); `None` for what it cannot read.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    Some((number * factor) as u64)
}

/// What every MatrixOne container is given: its identity from the downward API, its role's
/// configuration file, how its UUID is formed, the memory limit for Go's collector, and the
/// credentials the spec names.
fn kernel_env(
    cluster: &MatrixOneCluster,
    component: Component,
    group: Option<&str>,
) -> Vec<EnvVar> {
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
        literal_env("MO_CONFIG", kernel_config::config_key(component, group)),
    ];
    if let Some(digit) = mo_core::component::store_uuid_digit(component) {
        env.push(literal_env("MO_UUID_DIGIT", digit.to_string()));
    }
    let memory_limit = pod_settings(cluster, component, group)
        .and_then(|p| p.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .and_then(|q| quantity_bytes(&q.0));
    if let Some(limit) = memory_limit {
        // Go's collector works to stay under this: 90% leaves room for what it does not count.
        env.push(literal_env("GOMEMLIMIT", format!("{}", limit / 10 * 9)));
    }
    if let Some(s3) = &cluster.spec.shared_storage.s3 {
        if let Some(c) = &s3.credentials_secret {
            env.push(secret_env(
                "AWS_ACCESS_KEY_ID",
                &c.name,
                &c.access_key_id_key,
            ));
            env.push(secret_env(
                "AWS_SECRET_ACCESS_KEY",
                &c.name,
                &c.secret_access_key_key,
            ));
        }
        if let Some(region) = &s3.region {
            env.push(literal_env("AWS_REGION", region.clone()));
        }
    }
    if component == Component::Cn
        && let Some(secret) = &cluster.spec.root_password_secret
    {
        // Read by the CN that creates the catalog (the kernel's DEFAULT_PASSWORD).
        env.push(secret_env("DEFAULT_PASSWORD", &secret.name, &secret.key));
    }
    env
}

/// The user and group MatrixOne runs as by default: not root (the `restricted` Pod Security
/// standard), and the owner (through fsGroup) of its volumes.
pub const RUN_AS: i64 = 1000;

/// The pods' default security context: what the `restricted` Pod Security standard asks of a
/// pod (not root, the runtime's seccomp profile); volumes writable through fsGroup.
pub fn restricted_pod_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// Every container's default security context: no privilege escalation, no capability.
pub fn restricted_container_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        run_as_non_root: Some(true),
        ..SecurityContext::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

/// What the kernel needs at rest, per role (measured on a running v1.2.4 cluster: LOG ≈ 280 MB,
/// TN ≈ 470 MB, CN 250–330 MB, proxy ≈ 195 MB): requests only, so a pod is never BestEffort
/// (the first to go under node pressure) and never throttled by a limit nobody chose.
fn default_resources(component: Component) -> ResourceRequirements {
    let (cpu, memory) = match component {
        Component::Log => ("250m", "512Mi"),
        Component::Tn => ("250m", "1Gi"),
        Component::Cn => ("250m", "1Gi"),
        Component::Proxy => ("100m", "256Mi"),
    };
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", cpu), ("memory", memory)])),
        ..ResourceRequirements::default()
    }
}

/// A helper container's (the hook installer, an image pre-pull): a few MiB for a moment.
fn helper_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", "10m"), ("memory", "16Mi")])),
        limits: Some(quantities(&[("memory", "64Mi")])),
        ..ResourceRequirements::default()
    }
}

/// LOG replicas prefer different nodes (a node lost takes one replica, not a majority).
fn default_affinity(cluster: &MatrixOneCluster, component: Component) -> Option<Affinity> {
    (component == Component::Log).then(|| {
        let name = cluster.metadata.name.clone().unwrap_or_default();
        Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: Some(LabelSelector {
                                match_labels: Some(selector(&name, component)),
                                ..LabelSelector::default()
                            }),
                            topology_key: "kubernetes.io/hostname".into(),
                            ..PodAffinityTerm::default()
                        },
                    },
                ]),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        }
    })
}

fn pod_spec(
    cluster: &MatrixOneCluster,
    component: Component,
    group: Option<&str>,
    version: &str,
) -> PodSpec {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let settings = pod_settings(cluster, component, group)
        .cloned()
        .unwrap_or_default();
    let mut mounts = vec![
        VolumeMount {
            name: CONFIG_VOLUME.into(),
            mount_path: CONFIG_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: DATA_VOLUME.into(),
            mount_path: DATA_DIR.into(),
            ..VolumeMount::default()
        },
    ];
    let mut volumes = vec![Volume {
        name: CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(&name),
            default_mode: Some(0o755),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    // LOG and TN keep their data on claims (volumeClaimTemplates); CN and proxy on the pod.
    if matches!(component, Component::Cn | Component::Proxy) {
        volumes.push(Volume {
            name: DATA_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    if let Some(fs) = &cluster.spec.shared_storage.file_system
        && component != Component::Proxy
    {
        mounts.push(VolumeMount {
            name: SHARED_VOLUME.into(),
            mount_path: SHARED_DIR.into(),
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name: SHARED_VOLUME.into(),
            host_path: Some(HostPathVolumeSource {
                path: fs.path.clone(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Volume::default()
        });
    }
    PodSpec {
        containers: vec![Container {
            name: "main".into(),
            image: Some(image(cluster, version)),
            image_pull_policy: cluster
                .spec
                .image_pull_policy
                .map(|p| p.as_str().to_string()),
            // The image's entrypoint launches a demo cluster: the command is ours.
            command: Some(vec![
                "/bin/sh".into(),
                format!("{CONFIG_DIR}/{START_SCRIPT}"),
            ]),
            env: Some(kernel_env(cluster, component, group)),
            ports: Some(
                kernel_config::ports(component)
                    .into_iter()
                    .map(|(n, p)| ContainerPort {
                        name: Some(n.into()),
                        container_port: p,
                        ..ContainerPort::default()
                    })
                    .collect(),
            ),
            // Ready once the kernel serves the role's port (LOG: the log service; TN: the
            // transaction service; CN and proxy: SQL).
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(kernel_config::readiness_port(component)),
                    ..TCPSocketAction::default()
                }),
                period_seconds: Some(5),
                failure_threshold: Some(3),
                ..Probe::default()
            }),
            resources: Some(
                settings
                    .resources
                    .clone()
                    .unwrap_or_else(|| default_resources(component)),
            ),
            security_context: Some(
                settings
                    .container_security_context
                    .clone()
                    .unwrap_or_else(restricted_container_context),
            ),
            volume_mounts: Some(mounts),
            working_dir: Some(DATA_DIR.into()),
            // A kernel that exits at start (a missing bucket, bad credentials) says why in
            // the container's last state, where the operator reads it.
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Container::default()
        }],
        volumes: Some(volumes),
        subdomain: Some(headless_service_name(&name, component)),
        // Long enough for a CN to hand its lock tables over after SIGTERM.
        termination_grace_period_seconds: Some(match component {
            Component::Cn => 600,
            _ => 120,
        }),
        node_selector: (!settings.node_selector.is_empty()).then(|| settings.node_selector.clone()),
        affinity: settings
            .affinity
            .clone()
            .or_else(|| default_affinity(cluster, component)),
        tolerations: (!settings.tolerations.is_empty()).then(|| settings.tolerations.clone()),
        topology_spread_constraints: (!settings.topology_spread_constraints.is_empty())
            .then(|| settings.topology_spread_constraints.clone()),
        image_pull_secrets: (!cluster.spec.image_pull_secrets.is_empty())
            .then(|| cluster.spec.image_pull_secrets.clone()),
        security_context: Some(
            settings
                .security_context
                .clone()
                .unwrap_or_else(restricted_pod_context),
        ),
        // The kernel talks to no API server: no token is mounted.
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    }
}

fn claim_template(spec: &VolumeSpec) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: spec.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), spec.size.clone())])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
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
    let storage = match component {
        Component::Log => Some(&cluster.spec.log.storage),
        Component::Tn => Some(&cluster.spec.tn.storage),
        _ => None,
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
            template: pod_template(
                cluster,
                component,
                None,
                version,
                if component == Component::Proxy {
                    &[(LABEL_SERVING, "true")]
                } else {
                    &[]
                },
            ),
            volume_claim_templates: storage.map(|s| vec![claim_template(s)]),
            persistent_volume_claim_retention_policy: storage.map(|s| {
                let policy = match s.retention {
                    Retention::Retain => "Retain",
                    Retention::Delete => "Delete",
                };
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(policy.into()),
                    when_scaled: Some(policy.into()),
                }
            }),
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

pub fn cn_pod(
    cluster: &MatrixOneCluster,
    group: &str,
    ordinal: i32,
    version: &str,
    hook: Option<&DrainHook>,
) -> Pod {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let template = pod_template(
        cluster,
        Component::Cn,
        Some(group),
        version,
        &[(LABEL_CN_GROUP, group)],
    );
    let short = format!("{group}-{ordinal}");
    let full_name = pod_name(&name, &short);
    let mut metadata = template.metadata.unwrap_or_default();
    metadata.name = Some(full_name.clone());
    metadata.namespace = cluster.metadata.namespace.clone();
    metadata.owner_references = owner_references(cluster);
    let mut spec = template.spec.unwrap_or_default();
    spec.hostname = Some(full_name.clone());
    if let Some(container) = spec.containers.first_mut() {
        // The operator names each CN; its adapter finds the CN's HAKeeper record by this.
        container.env.get_or_insert_with(Vec::new).push(literal_env(
            "MO_UUID",
            mo_core::component::cn_uuid(&full_name),
        ));
    }
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
        spec.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: HOOK_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
        spec.init_containers = Some(vec![Container {
            name: "install-drain-hook".into(),
            image: Some(image),
            command: Some(vec![
                "mo-operator".into(),
                "install-hook".into(),
                format!("{HOOK_DIR}/mo-operator"),
            ]),
            volume_mounts: Some(vec![mount.clone()]),
            resources: Some(helper_resources()),
            security_context: Some(restricted_container_context()),
            ..Container::default()
        }]);
        if let Some(container) = spec.containers.first_mut() {
            container
                .volume_mounts
                .get_or_insert_with(Vec::new)
                .push(VolumeMount {
                    read_only: Some(true),
                    ..mount
                });
        }
    }
    if hook.is_some() {
        // The hook proves it speaks for this pod with a token the kubelet binds to it.
        spec.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: hook_auth::TOKEN_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(hook_auth::AUDIENCE.into()),
                        expiration_seconds: Some(3600),
                        path: hook_auth::TOKEN_FILE.into(),
                        ..ServiceAccountTokenProjection::default()
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        });
        // Named, for a kubelet to issue the token; still no API credential in the pod.
        spec.service_account_name
            .get_or_insert_with(|| "default".into());
    }
    if let (Some(hook), Some(container)) = (hook, spec.containers.first_mut()) {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: hook_auth::TOKEN_VOLUME.into(),
                mount_path: hook_auth::TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
        container.lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(hook.command.clone()),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        });
        // POD_NAMESPACE and POD_NAME are there already (the kernel's start script uses them).
        let env = container.env.get_or_insert_with(Vec::new);
        env.push(literal_env(ENV_HOOK_ENDPOINT, hook.endpoint.clone()));
        env.push(field_env("POD_UID", "metadata.uid"));
        env.push(literal_env(
            hook_auth::ENV_TOKEN_FILE,
            format!("{}/{}", hook_auth::TOKEN_DIR, hook_auth::TOKEN_FILE),
        ));
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
                resources: Some(helper_resources()),
                security_context: Some(restricted_container_context()),
                ..Container::default()
            }],
            security_context: Some(restricted_pod_context()),
            automount_service_account_token: Some(false),
            // Wherever MatrixOne pods may go.
            tolerations: {
                let all: Vec<_> = Component::ALL
                    .iter()
                    .flat_map(|c| match c {
                        Component::Cn => cluster
                            .spec
                            .cn
                            .groups
                            .iter()
                            .flat_map(|g| g.pods.tolerations.clone())
                            .collect::<Vec<_>>(),
                        c => pod_settings(cluster, *c, None)
                            .map(|p| p.tolerations.clone())
                            .unwrap_or_default(),
                    })
                    .collect();
                (!all.is_empty()).then_some(all)
            },
            image_pull_secrets: (!cluster.spec.image_pull_secrets.is_empty())
                .then(|| cluster.spec.image_pull_secrets.clone()),
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
    if name.len() <= 63 {
        return name;
    }
    // Cut, with a digest of the whole: two long node names (or versions) that share a prefix
    // must not share a pre-pull pod (the second would be taken for done).
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    let digest = format!("{:08x}", hasher.finish() as u32);
    let head: String = name.chars().take(54).collect();
    format!("{}-{digest}", head.trim_end_matches('-'))
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
                kernel_config::ports(component)
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

pub fn config_map_name(cluster: &str) -> String {
    format!("{cluster}-config")
}

/// The kernel's configuration of every role (one file per CN group) and the start script.
/// `bootstrap`: the recorded LOG bootstrap decision (rendered until it is done).
pub fn config_map(
    cluster: &MatrixOneCluster,
    bootstrap: Option<&LogBootstrap>,
) -> Result<ConfigMap, kernel_config::ConfigError> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut data = BTreeMap::new();
    for component in [Component::Log, Component::Tn, Component::Proxy] {
        data.insert(
            kernel_config::config_key(component, None),
            kernel_config::render(cluster, component, None, bootstrap)?,
        );
    }
    for group in &cluster.spec.cn.groups {
        data.insert(
            kernel_config::config_key(Component::Cn, Some(&group.name)),
            kernel_config::render(cluster, Component::Cn, Some(&group.name), bootstrap)?,
        );
    }
    data.insert(START_SCRIPT.into(), kernel_config::start_script());
    Ok(ConfigMap {
        metadata: meta(cluster, config_map_name(&name), None),
        data: Some(data),
        ..ConfigMap::default()
    })
}

/// The initial HAKeeper members of a new cluster: one replica per LOG store, replica ids from
/// the range the kernel reserves for them (`pkg/hakeeper` K8SIDRangeStart, 131072).
pub fn initial_log_bootstrap(cluster: &MatrixOneCluster) -> LogBootstrap {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    LogBootstrap {
        members: (0..cluster.spec.log.replicas)
            .map(|i| {
                let pod = format!("{name}-log-{i}");
                let uuid = mo_core::component::store_uuid(Component::Log, &pod)
                    .expect("a LOG pod name has an ordinal");
                format!("{}:{uuid}", 131_072 + i64::from(i))
            })
            .collect(),
        replicas: cluster.spec.log.replicas,
        shards: cluster.spec.log.shards,
        done: false,
    }
}

/// The client Service for SQL: the proxies, or the CNs when the cluster has no proxy.
pub fn sql_service(cluster: &MatrixOneCluster) -> Service {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let target = if cluster.spec.proxy.replicas > 0 {
        Component::Proxy
    } else {
        Component::Cn
    };
    let spec = &cluster.spec.sql_service;
    let mut selector = selector(&name, target);
    if target == Component::Proxy {
        selector.insert(LABEL_SERVING.into(), "true".into());
    }
    let mut metadata = meta(cluster, sql_service_name(&name), None);
    if !spec.annotations.is_empty() {
        metadata.annotations = Some(spec.annotations.clone());
    }
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(spec.type_.as_str().into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("sql".into()),
                port: spec.port,
                target_port: Some(IntOrString::String("sql".into())),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

pub fn sql_service_name(cluster: &str) -> String {
    format!("{cluster}-sql")
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
    use k8s_openapi::api::core::v1::EnvVar;

    fn cluster() -> MatrixOneCluster {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v1.2.0",
            "log": {"replicas": 3},
            "cn": {"groups": [{"name": "tp", "replicas": 2}]},
            "sharedStorage": {"fileSystem": {"path": "/srv/mo"}},
        }))
        .expect("valid");
        let mut c = MatrixOneCluster::new("mo", spec);
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-1".into());
        c
    }

    fn env_of(spec: &PodSpec) -> BTreeMap<String, EnvVar> {
        spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.clone()))
            .collect()
    }

    /// The kernel runs as it must: our command (not args after the image's entrypoint), its
    /// role's file, its identity from the downward API, data on the right volumes.
    #[test]
    fn pods_run_the_kernel_with_their_role_file_and_identity() {
        let c = cluster();
        let log = statefulset(&c, Component::Log, "v1.2.4").spec;
        let pod = log.template.spec.expect("pod spec");
        let main = &pod.containers[0];
        assert_eq!(
            main.command.as_deref(),
            Some(
                &[
                    "/bin/sh".to_string(),
                    format!("{CONFIG_DIR}/{START_SCRIPT}")
                ][..]
            )
        );
        assert!(main.args.is_none());
        let env = env_of(&pod);
        assert_eq!(env["MO_CONFIG"].value.as_deref(), Some("log.toml"));
        assert_eq!(env["MO_UUID_DIGIT"].value.as_deref(), Some("0"));
        assert_eq!(
            env["POD_IP"]
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            Some("status.podIP")
        );
        let claims = log.volume_claim_templates.expect("LOG data on claims");
        assert_eq!(claims[0].metadata.name.as_deref(), Some(DATA_VOLUME));
        assert_eq!(
            log.persistent_volume_claim_retention_policy
                .and_then(|p| p.when_deleted)
                .as_deref(),
            Some("Retain")
        );
        assert!(
            pod.affinity.and_then(|a| a.pod_anti_affinity).is_some(),
            "LOG replicas prefer different nodes"
        );
        assert!(pod.tolerations.is_none(), "nothing only a test needs");
        let proxy = statefulset(&c, Component::Proxy, "v1.2.4").spec;
        assert!(proxy.volume_claim_templates.is_none());

        let cn = cn_pod(&c, "tp", 1, "v1.2.4", None).spec.expect("spec");
        let env = env_of(&cn);
        assert_eq!(
            env["MO_UUID"].value.as_deref(),
            Some(mo_core::component::cn_uuid("mo-tp-1").as_str())
        );
        assert_eq!(env["MO_CONFIG"].value.as_deref(), Some("cn-tp.toml"));
        assert!(!env.contains_key("DEFAULT_PASSWORD"));
    }

    #[test]
    fn resources_credentials_and_the_root_password_come_from_the_spec() {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v1.2.4",
            "log": {"replicas": 3, "resources": {"limits": {"memory": "2Gi"}},
                    "nodeSelector": {"disk": "ssd"}},
            "cn": {"groups": [{"name": "tp", "replicas": 1}]},
            "sharedStorage": {"s3": {"endpoint": "http://minio:9000", "bucket": "mo",
                "region": "eu-west-1", "credentialsSecret": {"name": "s3"}}},
            "rootPasswordSecret": {"name": "root", "key": "password"},
            "imagePullPolicy": "Always",
            "imagePullSecrets": [{"name": "registry"}],
            "sqlService": {"type": "LoadBalancer", "annotations": {"a": "b"}},
        }))
        .expect("valid");
        let mut c = MatrixOneCluster::new("mo", spec);
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-1".into());
        let log = statefulset(&c, Component::Log, "v1.2.4")
            .spec
            .template
            .spec
            .expect("pod spec");
        let env = env_of(&log);
        assert_eq!(
            env["GOMEMLIMIT"].value.as_deref(),
            Some((2u64 * 1024 * 1024 * 1024 / 10 * 9).to_string().as_str())
        );
        let secret = |name: &str| {
            env[name]
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.clone())
                .map(|s| (s.name, s.key))
        };
        assert_eq!(
            secret("AWS_ACCESS_KEY_ID"),
            Some(("s3".into(), "AWS_ACCESS_KEY_ID".into()))
        );
        assert_eq!(env["AWS_REGION"].value.as_deref(), Some("eu-west-1"));
        assert!(
            !env.contains_key("DEFAULT_PASSWORD"),
            "only CNs create the catalog"
        );
        assert_eq!(log.node_selector.expect("selector")["disk"], "ssd");
        assert_eq!(
            log.containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
        assert_eq!(log.image_pull_secrets.expect("secrets")[0].name, "registry");
        assert!(
            log.volumes.iter().flatten().all(|v| v.host_path.is_none()),
            "S3: no shared directory"
        );
        let cn = cn_pod(&c, "tp", 0, "v1.2.4", None).spec.expect("spec");
        let env = env_of(&cn);
        let password = env["DEFAULT_PASSWORD"]
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.clone())
            .expect("from the secret");
        assert_eq!(
            (password.name.as_str(), password.key.as_str()),
            ("root", "password")
        );
        let svc = sql_service(&c);
        let svc_spec = svc.spec.expect("spec");
        assert_eq!(svc_spec.type_.as_deref(), Some("LoadBalancer"));
        let selector = svc_spec.selector.expect("selector");
        assert_eq!(selector[LABEL_COMPONENT], "proxy");
        // A proxy the operator takes out (label "false") gets no new client connection; new
        // proxy pods start in.
        assert_eq!(selector[LABEL_SERVING], "true");
        let proxies = statefulset(&c, Component::Proxy, "v1");
        let template_labels = proxies.spec.template.metadata.expect("meta").labels;
        assert_eq!(template_labels.expect("labels")[LABEL_SERVING], "true");
        assert_eq!(svc.metadata.annotations.expect("annotations")["a"], "b");
    }

    #[test]
    fn the_config_map_holds_every_role_file_and_the_bootstrap_members() {
        let c = cluster();
        let bootstrap = initial_log_bootstrap(&c);
        assert_eq!(
            bootstrap.members,
            [
                "131072:00000000-0000-0000-0000-000000000000",
                "131073:00000000-0000-0000-0000-000000000001",
                "131074:00000000-0000-0000-0000-000000000002"
            ]
        );
        let cm = config_map(&c, Some(&bootstrap)).expect("renders");
        let data = cm.data.expect("data");
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "cn-tp.toml",
                "log.toml",
                "proxy.toml",
                START_SCRIPT,
                "tn.toml"
            ]
        );
        assert!(data["log.toml"].contains("bootstrap-cluster = true"));
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
        let mount = main
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == HOOK_VOLUME)
            .expect("the hook volume is mounted");
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
