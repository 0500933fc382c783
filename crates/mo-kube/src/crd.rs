//! The `MatrixOneCluster` custom resource.
//!
//! Validation lives in the schema so the API server refuses a bad spec with a message naming
//! the field: OpenAPI bounds and patterns per field, CEL rules where a rule spans fields.

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
    Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use mo_core::{Component, MaxUnavailable, Millis, OnStall, SafeConfig, Strategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const GROUP: &str = "ops.matrixorigin.io";
pub const FINALIZER: &str = "ops.matrixorigin.io/cleanup";
pub const FIELD_MANAGER: &str = "mo-operator";

/// The longest cluster name: its StatefulSets (`<cluster>-proxy`) take a 10-character revision
/// hash in a 63-character label, its Services (`<cluster>-proxy-headless`) are DNS labels.
pub const MAX_NAME: usize = 46;
/// A cluster's name and a CN group's name together: CN pods are `<cluster>-<group>-<ordinal>`
/// (ordinals up to 255), a DNS label of at most 63 characters.
pub const MAX_NAME_AND_GROUP: usize = 58;

pub const RULE_NAME: &str =
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 46";
pub const MSG_NAME: &str = "metadata.name: a DNS label (lowercase letters, digits and '-', starting with a letter) of at most 46 characters: the cluster's Services and StatefulSets are named after it";
pub const RULE_GROUP_NAMES: &str =
    "self.spec.cn.groups.all(g, size(self.metadata.name) + size(g.name) <= 58)";
pub const MSG_GROUP_NAMES: &str = "spec.cn.groups[].name: the cluster's name and a CN group's name together have at most 58 characters (CN pods are named <cluster>-<group>-<ordinal>, a DNS label)";
pub const MSG_STALL: &str =
    "spec.upgrade.stallTimeout must be longer than spec.upgrade.stabilityWindow";
pub const MSG_GROUP_COMPONENT: &str =
    "spec.cn.groups[].name must not be a component name (log, tn, dn, proxy)";
pub const MSG_SHARED_ONE: &str = "spec.sharedStorage: set exactly one of s3 or fileSystem";
pub const MSG_SHARED_FIXED: &str =
    "spec.sharedStorage cannot change: the cluster's data lives there";
pub const MSG_LOG_ODD: &str =
    "spec.log.replicas must be odd (a Raft majority of an even count tolerates no more failures)";
pub const MSG_LOG_REPLICAS_FIXED: &str = "spec.log.replicas cannot change: the LOG shards' replicas were placed when the cluster was created";
pub const MSG_SHARDS_FIXED: &str = "spec.log.shards is immutable";
pub const MSG_LOG_STORAGE_FIXED: &str =
    "spec.log.storage cannot change: a StatefulSet's volume claims are fixed when it is created";
pub const MSG_TN_STORAGE_FIXED: &str =
    "spec.tn.storage cannot change: a StatefulSet's volume claims are fixed when it is created";
pub const MSG_STRATEGY_KEYS: &str =
    "spec.upgrade.strategy: keys must be components (log, tn or dn, cn, proxy)";
pub const MSG_STRATEGY_CYCLE: &str = "spec.upgrade.strategy: a component cannot wait for itself or for a component that waits for it";
pub const MSG_MAX_UNAVAILABLE_CN: &str =
    "spec.upgrade.maxUnavailable.cn: a number of pods (1 or more) or a percentage like 25%";
pub const MSG_MAX_UNAVAILABLE_PROXY: &str =
    "spec.upgrade.maxUnavailable.proxy: a number of pods (1 or more) or a percentage like 25%";
pub const MSG_GRACE: &str = "spec.drain.gracePeriod: at most 24h";

/// A Kubernetes quantity without a sign (what a request, a limit or a size may be).
pub const QUANTITY_PATTERN: &str = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// An absolute path of components of letters, digits, `.`, `_` and `-`, none of them `.` or
/// `..` (hidden directories such as `.cache` are fine), no empty component, no trailing `/`.
pub const HOST_PATH_PATTERN: &str =
    r"^(/([A-Za-z0-9_][A-Za-z0-9._-]*|\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\.\.[A-Za-z0-9._-]+))+$";
/// A relative key prefix of the same components (no `..`, no leading `/`).
pub const S3_PREFIX_PATTERN: &str = r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*$";
/// An image repository without tag or digest (the tag is `spec.version`).
pub const IMAGE_PATTERN: &str =
    r"^([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$";

/// A quantity: an integer or a string of [`QUANTITY_PATTERN`], never null.
fn quantity_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    // `nullable: false` stated, or kube marks an optional int-or-string nullable: a null
    // stored there would be unreadable (the API server puts the default in its place).
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "pattern": QUANTITY_PATTERN,
    })
}

/// A count or a percentage, never null.
fn int_or_string_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"x-kubernetes-int-or-string": true, "nullable": false})
}

/// Kubernetes' resource requirements, every request and limit a quantity of
/// [`QUANTITY_PATTERN`] (the API server would refuse another in the pods).
fn resources_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <ResourceRequirements as schemars::JsonSchema>::json_schema(generator);
    for key in ["limits", "requests"] {
        if let Some(values) = schema
            .as_object_mut()
            .and_then(|o| o.get_mut("properties"))
            .and_then(|p| p.get_mut(key))
            .and_then(|k| k.get_mut("additionalProperties"))
            .and_then(|v| v.as_object_mut())
        {
            values.insert("pattern".into(), QUANTITY_PATTERN.into());
        }
    }
    if let Some(o) = schema.as_object_mut() {
        o.insert("nullable".into(), true.into());
    }
    schema
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ops.matrixorigin.io",
    version = "v1alpha1",
    kind = "MatrixOneCluster",
    namespaced,
    shortname = "moc",
    status = "MatrixOneClusterStatus",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.rollout.step"}"#,
    printcolumn = r#"{"name":"Waiting-On","type":"string","jsonPath":".status.rollout.waitingOn","priority":0}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(RULE_NAME).message(MSG_NAME),
    validation = Rule::new(RULE_GROUP_NAMES).message(MSG_GROUP_NAMES)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.upgrade) || !has(self.upgrade.stallTimeout) || !has(self.upgrade.stabilityWindow) || duration(self.upgrade.stallTimeout) > duration(self.upgrade.stabilityWindow)").message(MSG_STALL).field_path(".upgrade.stallTimeout"))]
pub struct MatrixOneClusterSpec {
    /// MatrixOne version (the image tag) every component runs. Changing it starts an upgrade.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    )]
    pub version: String,
    /// Image repository without a tag (the tag is `version`).
    #[serde(default = "default_image")]
    #[schemars(length(min = 1, max = 255), regex(pattern = IMAGE_PATTERN))]
    pub image: String,
    /// The pods' image pull policy (Kubernetes' default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets the pods pull the image with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The LOG service: Raft replicas of the log shards; shard 0 is HAKeeper.
    pub log: LogSpec,
    /// The transaction node (one): it writes the WAL to LOG.
    #[serde(default)]
    pub tn: TnSpec,
    #[x_kube(validation = Rule::new("self.groups.all(g, !(g.name in ['log', 'tn', 'dn', 'proxy']))").message(MSG_GROUP_COMPONENT))]
    /// The compute nodes, in groups: they run SQL and host the lock tables other CNs use.
    pub cn: CnSpec,
    /// The proxies in front of the CNs (the SQL Service's endpoints).
    #[serde(default)]
    pub proxy: ProxySpec,
    /// Where the cluster's data lives (the kernel's SHARED and ETL file services): every LOG,
    /// TN and CN reads and writes it. Fixed once the cluster exists.
    #[x_kube(validation = Rule::new("self == oldSelf").message(MSG_SHARED_FIXED))]
    pub shared_storage: SharedStorage,
    /// The client Service in front of the proxies (or of the CNs when there is no proxy).
    #[serde(default)]
    pub sql_service: SqlServiceSpec,
    /// The initial password of `root` (and `dump`), read when the cluster is first created
    /// (the kernel's default, `111`, when unset). Changing it later changes nothing: use
    /// `ALTER USER`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_password_secret: Option<SecretKeyRef>,
    /// How an upgrade (a change of `version`) proceeds.
    #[serde(default)]
    pub upgrade: UpgradeSettings,
    /// How long CN drains may take before an alarm, and how long a deleted CN may wait.
    #[serde(default)]
    pub drain: DrainSettings,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// One key of a Secret in the cluster's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key whose value is used.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Settings every role's pods take (LOG, TN, each CN group, proxy).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// CPU and memory; `GOMEMLIMIT` is set to 90% of the memory limit. Without requests the
    /// pods are BestEffort, the first to go under node pressure (an eviction no webhook sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// The pods run only on nodes with these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Replaces the default (LOG replicas prefer different nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// How the pods spread over zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// TOML merged over the configuration the operator renders for this role; its values win
    /// (a table is merged key by key). Read by the kernel when a pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub config: Option<String>,
    /// Annotations of the pods (e.g. for a service mesh or a scraper).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// The pods' security context, in place of the default one, which the `restricted` Pod
    /// Security standard admits: UID/GID 1000 (not root), fsGroup 1000, seccomp RuntimeDefault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// The MatrixOne container's security context, in place of the default one: no privilege
    /// escalation, every capability dropped, not root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_security_context: Option<SecurityContext>,
}

/// A PersistentVolumeClaim per pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// The claim's size (a Kubernetes quantity, e.g. `20Gi`).
    #[serde(default = "default_volume_size")]
    #[schemars(schema_with = "quantity_schema")]
    pub size: Quantity,
    /// The cluster's default StorageClass when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// What happens to the claims when the cluster is deleted or scaled down.
    #[serde(default)]
    pub retention: Retention,
}

impl Default for VolumeSpec {
    fn default() -> Self {
        VolumeSpec {
            size: default_volume_size(),
            storage_class_name: None,
            retention: Retention::Retain,
        }
    }
}

fn default_volume_size() -> Quantity {
    Quantity("10Gi".into())
}

#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum Retention {
    /// Keep the claims (and the data): a cluster created again with the same name finds them.
    #[default]
    Retain,
    Delete,
}

/// Exactly one of `s3` or `fileSystem`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.s3) != has(self.fileSystem)").message(MSG_SHARED_ONE))]
pub struct SharedStorage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Storage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_system: Option<FileSystemStorage>,
}

/// S3 or an S3-compatible store (MinIO, …). The bucket must exist: the kernel checks it at start.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Storage {
    /// E.g. `https://s3.us-east-1.amazonaws.com` or `http://minio.minio.svc:9000`.
    #[schemars(length(min = 1), regex(pattern = r"^https?://[^\s/]+(/.*)?$"))]
    pub endpoint: String,
    /// The bucket (it must exist; the operator does not create it).
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix of every object of this cluster (default: `<namespace>/<cluster>`): path
    /// components without `.` or `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = S3_PREFIX_PATTERN))]
    pub prefix: Option<String>,
    /// The bucket's region (some S3-compatible stores ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A Secret with the access key id and secret key. Unset: the pods' own identity
    /// (e.g. IAM roles for service accounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<S3Credentials>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// The Secret's name (in the cluster's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Secret's key holding the access key id.
    #[serde(default = "default_access_key_id_key")]
    pub access_key_id_key: String,
    /// The Secret's key holding the secret access key.
    #[serde(default = "default_secret_access_key_key")]
    pub secret_access_key_key: String,
}

fn default_access_key_id_key() -> String {
    "AWS_ACCESS_KEY_ID".into()
}
fn default_secret_access_key_key() -> String {
    "AWS_SECRET_ACCESS_KEY".into()
}

/// A directory every pod sees at the same path: a node's directory (`hostPath`), so only for
/// single-node clusters, tests and demos. The operator must allow the path's prefix
/// (`--allow-host-path-under`): a hostPath volume is a way into the node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemStorage {
    /// An absolute path (components without `.` or `..`); each cluster keeps its data under it.
    #[schemars(length(min = 2, max = 4096), regex(pattern = HOST_PATH_PATTERN))]
    pub path: String,
}

#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SqlServiceSpec {
    /// The Service's type.
    #[serde(default, rename = "type")]
    pub type_: ServiceType,
    /// The MySQL-protocol port clients connect to.
    #[serde(default = "default_sql_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Annotations of the Service (e.g. a cloud load balancer's settings).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Default for SqlServiceSpec {
    fn default() -> Self {
        SqlServiceSpec {
            type_: ServiceType::ClusterIP,
            port: default_sql_port(),
            annotations: BTreeMap::new(),
        }
    }
}

fn default_sql_port() -> i32 {
    6001
}

fn default_image() -> String {
    "matrixorigin/matrixone".into()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.replicas % 2 == 1").message(MSG_LOG_ODD).field_path(".replicas"))]
pub struct LogSpec {
    /// LOG stores (Raft replicas of every shard): 3, 5 or 7; fixed once the cluster exists.
    #[schemars(range(min = 3, max = 7))]
    #[x_kube(validation = Rule::new("self == oldSelf").message(MSG_LOG_REPLICAS_FIXED))]
    pub replicas: i32,
    /// Log shards besides HAKeeper's; immutable once created.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self == oldSelf").message(MSG_SHARDS_FIXED))]
    pub shards: i32,
    /// Every LOG store keeps its Raft data here (a store restarted empty cannot rejoin).
    /// Fixed once the cluster exists.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message(MSG_LOG_STORAGE_FIXED))]
    pub storage: VolumeSpec,
    #[serde(flatten)]
    pub pods: PodSettings,
}

fn one() -> i32 {
    1
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TnSpec {
    /// The kernel runs exactly one TN.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1))]
    pub replicas: i32,
    /// The TN's local file service (its LOCAL data) lives here across restarts. Fixed once
    /// the cluster exists.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message(MSG_TN_STORAGE_FIXED))]
    pub storage: VolumeSpec,
    #[serde(flatten)]
    pub pods: PodSettings,
}

impl Default for TnSpec {
    fn default() -> Self {
        TnSpec {
            replicas: 1,
            storage: VolumeSpec::default(),
            pods: PodSettings::default(),
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CnSpec {
    /// Groups of CNs, each its own StatefulSet; names are unique.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub groups: Vec<CnGroupSpec>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CnGroupSpec {
    /// DNS label; CN pods are named `<cluster>-<group>-<ordinal>`.
    #[schemars(
        length(min = 1, max = 30),
        regex(pattern = r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Lowering it removes the highest ordinals, each only after its drain is confirmed.
    #[schemars(range(min = 0, max = 256))]
    pub replicas: i32,
    #[serde(flatten)]
    pub pods: PodSettings,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Proxies in front of the CNs (0: clients reach the CNs through the SQL Service directly).
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 64))]
    pub replicas: i32,
    #[serde(flatten)]
    pub pods: PodSettings,
}

impl Default for ProxySpec {
    fn default() -> Self {
        ProxySpec {
            replicas: 1,
            pods: PodSettings::default(),
        }
    }
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub enum OnStallSpec {
    #[default]
    Halt,
    Rollback,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.strategy.all(k, k in ['log', 'tn', 'dn', 'cn', 'proxy'])").message(MSG_STRATEGY_KEYS).field_path(".strategy"))]
#[x_kube(validation = Rule::new("self.strategy.all(k, !(k in self.strategy[k]) && self.strategy[k].all(d, !(d in self.strategy) || !(k in self.strategy[d])))").message(MSG_STRATEGY_CYCLE).field_path(".strategy"))]
pub struct UpgradeSettings {
    /// Component → the components whose upgrade it waits for. Empty: LOG → TN → CN → Proxy.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 5))]
    pub strategy: BTreeMap<String, Dependencies>,
    /// A restarted pod's gate, and a finished phase's, must hold this long.
    #[serde(default = "default_stability")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub stability_window: String,
    /// No progress for this long halts the rollout (or rolls it back). A cluster's creation
    /// raises an alarm instead and keeps waiting. Never deletes or advances.
    #[serde(default = "default_stall")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub stall_timeout: String,
    /// What a stall does: `Halt` (stop and wait for someone) or `Rollback` (restore the previous
    /// version, through the same gates).
    #[serde(default)]
    pub on_stall: OnStallSpec,
    /// TN WAL-append tolerance while LOG replicas restart.
    #[serde(default = "default_tn_tolerance")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub tn_wal_tolerance: String,
    /// Pull the new image onto every node before restarting anything.
    #[serde(default = "yes")]
    pub pre_pull: bool,
    /// How long a proxy taken out of the SQL Service may wait for its clients to close their
    /// connections before the rollout halts (the kernel's proxy closes every connection at once
    /// when it stops: it is never stopped with one on it). Set it above your connection pools'
    /// maximum connection lifetime.
    #[serde(default = "default_proxy_drain_grace")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub proxy_drain_grace: String,
    /// Pods of a CN or proxy phase restarted at once. Whatever the number, a CN is restarted
    /// only while another CN serving the workload is Working, and a proxy only while another
    /// one routes; LOG and TN always go one at a time.
    #[serde(default)]
    pub max_unavailable: MaxUnavailableSettings,
}

/// Per component, a number of pods (`2`) or a percentage of them (`"50%"`, rounded down, at
/// least one).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("type(self.cn) == int ? self.cn >= 1 : self.cn.matches('^[0-9]+%$')").message(MSG_MAX_UNAVAILABLE_CN).field_path(".cn"))]
#[x_kube(validation = Rule::new("type(self.proxy) == int ? self.proxy >= 1 : self.proxy.matches('^[0-9]+%$')").message(MSG_MAX_UNAVAILABLE_PROXY).field_path(".proxy"))]
pub struct MaxUnavailableSettings {
    /// CN pods restarted at once: a number (`2`) or a percentage of the CNs (`"25%"`).
    #[serde(default = "one_pod")]
    #[schemars(schema_with = "int_or_string_schema")]
    pub cn: IntOrString,
    /// Proxies restarted at once: a number (`2`) or a percentage of the proxies (`"50%"`).
    #[serde(default = "one_pod")]
    #[schemars(schema_with = "int_or_string_schema")]
    pub proxy: IntOrString,
}

fn one_pod() -> IntOrString {
    IntOrString::Int(1)
}

impl Default for MaxUnavailableSettings {
    fn default() -> Self {
        MaxUnavailableSettings {
            cn: one_pod(),
            proxy: one_pod(),
        }
    }
}

fn max_unavailable(field: &'static str, v: &IntOrString) -> Result<MaxUnavailable, SpecError> {
    let parsed = match v {
        IntOrString::Int(n) if *n >= 1 => Ok(MaxUnavailable::Pods(*n as u32)),
        IntOrString::Int(n) => Err(format!("{n} pods: at least 1")),
        IntOrString::String(text) => MaxUnavailable::parse(text),
    };
    parsed.map_err(|message| SpecError::Value { field, message })
}

fn default_proxy_drain_grace() -> String {
    "5m".into()
}

impl Default for UpgradeSettings {
    fn default() -> Self {
        UpgradeSettings {
            strategy: BTreeMap::new(),
            stability_window: default_stability(),
            stall_timeout: default_stall(),
            on_stall: OnStallSpec::Halt,
            tn_wal_tolerance: default_tn_tolerance(),
            pre_pull: true,
            proxy_drain_grace: default_proxy_drain_grace(),
            max_unavailable: MaxUnavailableSettings::default(),
        }
    }
}

/// The components a phase waits for (at most every other one).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(transparent)]
pub struct Dependencies(#[schemars(length(max = 5))] pub Vec<ComponentName>);

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ComponentName {
    Log,
    Tn,
    Dn,
    Cn,
    Proxy,
}

impl ComponentName {
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentName::Log => "log",
            ComponentName::Tn => "tn",
            ComponentName::Dn => "dn",
            ComponentName::Cn => "cn",
            ComponentName::Proxy => "proxy",
        }
    }
}

fn default_stability() -> String {
    "20s".into()
}
fn default_stall() -> String {
    "10m".into()
}
fn default_tn_tolerance() -> String {
    "15m".into()
}
fn yes() -> bool {
    true
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.gracePeriod) || duration(self.gracePeriod) <= duration('24h')").message(MSG_GRACE).field_path(".gracePeriod"))]
pub struct DrainSettings {
    /// A drain waiting longer raises an alarm (condition, event, metric). It keeps waiting.
    #[serde(default = "default_alarm")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub alarm_after: String,
    /// An eviction-started drain whose evictor stopped retrying this long is cancelled.
    #[serde(default = "default_abandon")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub eviction_abandon: String,
    /// CN pods' termination grace period: how long a deleted CN's preStop hook may wait for
    /// its drain to be confirmed before the kubelet stops it anyway (Kubernetes' bound, not
    /// ours: the operator never deletes on a timeout). Applies to CN pods created after it.
    #[serde(default = "default_grace")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub grace_period: String,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            alarm_after: default_alarm(),
            eviction_abandon: default_abandon(),
            grace_period: default_grace(),
        }
    }
}

fn default_grace() -> String {
    "1h".into()
}

fn default_alarm() -> String {
    "10m".into()
}
fn default_abandon() -> String {
    "2m".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatrixOneClusterStatus {
    /// The spec generation this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Progressing`, `Halted`, `Degraded` and `Draining` (docs/day-2.md says what
    /// each reason means and what to do).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Per component: versions running and pods ready.
    #[serde(default)]
    pub components: BTreeMap<String, ComponentStatus>,
    /// The version new pods of each component are created with (changed one pod at a time
    /// by the rollout, recorded before the pod is restarted).
    #[serde(default)]
    pub template_versions: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatusView>,
    #[serde(default)]
    pub drains: Vec<DrainView>,
    /// The decision core's progress record, persisted before any of its actions is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The LOG bootstrap decision, recorded before the first LOG pod is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_bootstrap: Option<LogBootstrap>,
}

/// Taken once per cluster: the initial HAKeeper members. Until HAKeeper is seen serving the
/// cluster, LOG pods start with the bootstrap settings; after that never again, so a LOG store
/// recreated empty waits to be repaired instead of founding a cluster of its own.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogBootstrap {
    /// `replicaID:storeUUID` of each initial HAKeeper replica.
    pub members: Vec<String>,
    /// Replicas of every log shard.
    pub replicas: i32,
    /// Log shards besides HAKeeper's.
    pub shards: i32,
    /// HAKeeper was seen serving the cluster: the bootstrap is over.
    #[serde(default)]
    pub done: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// Pods the spec asks for.
    pub replicas: i32,
    /// Pods Ready.
    pub ready: i32,
    /// Version → pods running it.
    pub versions: BTreeMap<String, i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatusView {
    /// The version the rollout upgrades to.
    pub target: String,
    /// `phase log: restart log-1`, `complete`, `halted`, …
    pub step: String,
    /// The gate or confirmation the rollout waits on, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainView {
    /// The CN pod drained.
    pub pod: String,
    /// The pod instance the drain is bound to (a new pod of the same name is not it).
    pub pod_uid: String,
    /// The CN's UUID in HAKeeper.
    pub cn_uuid: String,
    /// Why: `remove (…)`, `restart on <version>`, `eviction by <source>` or `node <name> failed`.
    pub purpose: String,
    /// `MarkDraining`, `MigrateSessions`, `HandOver`, `Confirmed`, `Released` or `Cancelling`.
    pub stage: String,
    /// What the drain waits on now, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<String>,
}

/// A spec that passed the schema can still be refused by the core (a strategy cycle longer
/// than two): this says which field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.upgrade.strategy: {0}")]
    Strategy(String),
    #[error("spec.{field}: {message}")]
    Duration {
        field: &'static str,
        message: String,
    },
    #[error("spec.{field}: {message}")]
    Value {
        field: &'static str,
        message: String,
    },
}

impl MatrixOneClusterSpec {
    pub fn strategy(&self) -> Result<Strategy, SpecError> {
        if self.upgrade.strategy.is_empty() {
            return Ok(Strategy::default_order());
        }
        let pairs = self
            .upgrade
            .strategy
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.0.iter().map(|c| c.as_str().to_string()).collect(),
                )
            })
            .collect();
        Strategy::from_pairs(pairs).map_err(|e| SpecError::Strategy(e.to_string()))
    }

    /// The decision core's settings from this spec.
    pub fn safe_config(&self) -> Result<SafeConfig, SpecError> {
        let d = |field: &'static str, text: &str| -> Result<Millis, SpecError> {
            parse_go_duration(text).ok_or_else(|| SpecError::Duration {
                field,
                message: format!("`{text}` is not a duration like 90s, 10m or 1h30m"),
            })
        };
        Ok(SafeConfig {
            stability_window: d("upgrade.stabilityWindow", &self.upgrade.stability_window)?,
            stall_timeout: d("upgrade.stallTimeout", &self.upgrade.stall_timeout)?,
            on_stall: match self.upgrade.on_stall {
                OnStallSpec::Halt => OnStall::Halt,
                OnStallSpec::Rollback => OnStall::Rollback,
            },
            tn_wal_tolerance: d("upgrade.tnWalTolerance", &self.upgrade.tn_wal_tolerance)?,
            pre_pull: self.upgrade.pre_pull,
            proxy_drain_grace: d("upgrade.proxyDrainGrace", &self.upgrade.proxy_drain_grace)?,
            eviction_abandon: d("drain.evictionAbandon", &self.drain.eviction_abandon)?,
            drain_alarm: d("drain.alarmAfter", &self.drain.alarm_after)?,
            cn_max_unavailable: max_unavailable(
                "upgrade.maxUnavailable.cn",
                &self.upgrade.max_unavailable.cn,
            )?,
            proxy_max_unavailable: max_unavailable(
                "upgrade.maxUnavailable.proxy",
                &self.upgrade.max_unavailable.proxy,
            )?,
            ..SafeConfig::default()
        })
    }

    /// Pods the spec asks for, per component, in ordinal order (names without the cluster).
    pub fn desired_pods(&self) -> BTreeMap<Component, Vec<String>> {
        let mut out = BTreeMap::new();
        out.insert(
            Component::Log,
            (0..self.log.replicas).map(|i| format!("log-{i}")).collect(),
        );
        out.insert(
            Component::Tn,
            (0..self.tn.replicas).map(|i| format!("tn-{i}")).collect(),
        );
        out.insert(
            Component::Cn,
            self.cn
                .groups
                .iter()
                .flat_map(|g| (0..g.replicas).map(move |i| format!("{}-{i}", g.name)))
                .collect(),
        );
        out.insert(
            Component::Proxy,
            (0..self.proxy.replicas)
                .map(|i| format!("proxy-{i}"))
                .collect(),
        );
        out
    }
}

/// `1h30m`, `90s`, `250ms`: the subset of Go's syntax the schema admits.
pub fn parse_go_duration(text: &str) -> Option<Millis> {
    if text.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else {
            return None;
        };
        total = total.checked_add(value.checked_mul(unit_ms)?)?;
        rest = &rest[len..];
    }
    Some(Millis(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// Go-style durations (`90s`, `10m`, `1h30m`): CEL's `duration()` parses the same syntax.
    const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_go_duration("1h30m"), Some(Millis::from_mins(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Millis(250)));
        assert_eq!(parse_go_duration("20s"), Some(Millis::from_secs(20)));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("m"), None);
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("5d"), None);
    }

    #[test]
    fn the_crd_carries_cel_rules_and_printer_columns() {
        let crd = serde_json::to_string(&MatrixOneCluster::crd()).expect("serializes");
        assert!(crd.contains("x-kubernetes-validations"));
        assert!(crd.contains("spec.log.replicas must be odd"));
        assert!(crd.contains("spec.log.shards is immutable"));
        assert!(crd.contains("Waiting-On"));
        assert!(
            crd.contains(
                DURATION_PATTERN
                    .trim_start_matches('^')
                    .trim_end_matches('$')
            )
        );
    }

    #[test]
    fn a_strategy_cycle_is_named() {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v1",
            "log": {"replicas": 3},
            "sharedStorage": {"fileSystem": {"path": "/tmp/mo-shared"}},
            "cn": {"groups": [{"name": "a", "replicas": 1}]},
            "upgrade": {"strategy": {"log": ["proxy"], "proxy": ["cn"], "cn": ["log"]}}
        }))
        .expect("schema-valid");
        let err = spec.strategy().expect_err("a cycle");
        assert!(
            err.to_string().starts_with("spec.upgrade.strategy"),
            "{err}"
        );
        assert_eq!(
            spec.safe_config().expect("defaults").stall_timeout,
            Millis::from_mins(10)
        );
    }
}
