//! One validation for every way a cluster spec reaches the operator: `mo-operator render -f`,
//! the controller's watch and the disruption reviews all refuse the same specs, naming the same
//! field, and the API server refuses them too.
//!
//! - The structure (types, bounds, patterns, required fields, unknown fields, list keys) is
//!   checked against the CRD's own OpenAPI schema, walked as the API server walks it: the schema
//!   is the single source, nothing here repeats a bound.
//! - The CRD's CEL rules are evaluated natively, each under its own message (a test keeps every
//!   rule of the CRD covered here).
//! - What only the operator knows (its configuration, strategy cycles, the kernel's TOML) comes
//!   last, in [`operator_checks`].
//!
//! A cluster object is read from the API server as a [`StoredCluster`], whose spec is plain
//! JSON: a spec the operator cannot read is that cluster's refusal, never a watch that fails
//! for every cluster.

use crate::crd::{self, MatrixOneCluster, MatrixOneClusterSpec, MatrixOneClusterStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResourceExt, Resource};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A refusal, naming the field as the API server would (`spec.log.replicas`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every refusal, one per line.
pub fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the operator was told at start that decides what it accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorRules {
    /// Directories under which a `fileSystem` shared storage (a hostPath volume) may live;
    /// none: hostPath storage is refused.
    pub host_path_prefixes: Vec<String>,
}

/// A `MatrixOneCluster` as stored, its spec unread: the controller's watch never fails on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StoredCluster {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub status: Value,
}

impl Resource for StoredCluster {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        MatrixOneCluster::kind(&()).into_owned().into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        MatrixOneCluster::group(&()).into_owned().into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        MatrixOneCluster::version(&()).into_owned().into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        MatrixOneCluster::plural(&()).into_owned().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl StoredCluster {
    /// The status the operator wrote (a status it cannot read is as good as none).
    pub fn status(&self) -> MatrixOneClusterStatus {
        serde_json::from_value(self.status.clone()).unwrap_or_default()
    }

    /// The cluster, if its spec passes every check the API server and the operator make.
    pub fn parse(&self, rules: &OperatorRules) -> Result<MatrixOneCluster, Vec<FieldError>> {
        let object = serde_json::json!({
            "apiVersion": MatrixOneCluster::api_version(&()),
            "kind": MatrixOneCluster::kind(&()),
            "metadata": self.metadata,
            "spec": self.spec,
        });
        // Stored objects had unknown fields pruned by the API server.
        let mut cluster = check_object(&object, None, false)?;
        cluster.status = Some(self.status());
        let errors = operator_checks(&cluster, rules);
        if errors.is_empty() {
            Ok(cluster)
        } else {
            Err(errors)
        }
    }
}

/// The API server's checks of a manifest (`strict`: unknown fields refused, as `kubectl`
/// asks; otherwise dropped, as a stored object has them) and the CRD's rules, `old` being the
/// stored object for an update. Returns the cluster with its defaults.
pub fn check_object(
    object: &Value,
    old: Option<&MatrixOneCluster>,
    strict: bool,
) -> Result<MatrixOneCluster, Vec<FieldError>> {
    let mut errors = Vec::new();
    let api_version = MatrixOneCluster::api_version(&());
    let kind = MatrixOneCluster::kind(&());
    if object["apiVersion"] != api_version.as_ref() {
        errors.push(FieldError::new(
            "apiVersion",
            format!("must be {api_version}, not {}", object["apiVersion"]),
        ));
    }
    if object["kind"] != kind.as_ref() {
        errors.push(FieldError::new(
            "kind",
            format!("must be {kind}, not {}", object["kind"]),
        ));
    }
    if object["metadata"]["name"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        errors.push(FieldError::new("metadata.name", "Required value"));
    }
    let schema = &validator().schema;
    if let Some(fields) = object.as_object() {
        for key in fields.keys() {
            let known = ["apiVersion", "kind", "metadata", "spec", "status"];
            if strict && !known.contains(&key.as_str()) {
                errors.push(FieldError::new(key, format!("unknown field \"{key}\"")));
            }
        }
    }
    match object.get("spec").filter(|s| !s.is_null()) {
        None => errors.push(FieldError::new("spec", "Required value")),
        Some(spec) => walk(
            spec,
            &schema["properties"]["spec"],
            "spec",
            strict,
            &mut errors,
        ),
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let cluster = typed(object)?;
    let mut errors = rules(&cluster);
    if let Some(old) = old {
        errors.extend(transition_rules(&old.spec, &cluster.spec));
    }
    if errors.is_empty() {
        Ok(cluster)
    } else {
        Err(errors)
    }
}

/// The object as the typed cluster, with the defaults the schema declares.
fn typed(object: &Value) -> Result<MatrixOneCluster, Vec<FieldError>> {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    drop_nulls(&mut object);
    serde_path_to_error::deserialize::<_, MatrixOneCluster>(object).map_err(|e| {
        vec![FieldError::new(
            e.path().to_string(),
            format!("unreadable: {}", e.inner()),
        )]
    })
}

/// Nulls of non-nullable fields are pruned by the API server (a default then applies): our
/// types read an absent field the same way, and an `Option` reads null as absent anyway.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

struct Validator {
    schema: Value,
    patterns: std::sync::Mutex<BTreeMap<String, Regex>>,
}

fn validator() -> &'static Validator {
    static VALIDATOR: OnceLock<Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let crd = MatrixOneCluster::crd();
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .map(|s| serde_json::to_value(s).expect("the CRD's schema serializes"))
            .expect("the CRD has a schema");
        Validator {
            schema,
            patterns: std::sync::Mutex::new(BTreeMap::new()),
        }
    })
}

fn matches(pattern: &str, text: &str) -> bool {
    let mut patterns = validator().patterns.lock().expect("patterns lock");
    let regex = patterns
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).expect("the CRD's patterns compile"));
    regex.is_match(text)
}

fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 64 {
        format!("{}…", text.chars().take(64).collect::<String>())
    } else {
        text
    }
}

/// The OpenAPI checks of one value against its schema, as the API server makes them.
fn walk(value: &Value, schema: &Value, path: &str, strict: bool, errors: &mut Vec<FieldError>) {
    if value.is_null() {
        // Kept where nullable; elsewhere pruned (and defaulted) before validation.
        return;
    }
    let invalid = |errors: &mut Vec<FieldError>, why: String| {
        errors.push(FieldError::new(
            path,
            format!("Invalid value: {}: {why}", shown(value)),
        ))
    };
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            invalid(errors, "must be an integer or a string".into());
            return;
        }
    } else if let Some(kind) = schema["type"].as_str() {
        let fits = match kind {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            _ => true,
        };
        if !fits {
            invalid(errors, format!("must be of type {kind}"));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        invalid(
            errors,
            format!("supported values: {}", shown(&schema["enum"])),
        );
    }
    match value {
        Value::String(text) => walk_string(text, schema, path, errors),
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or_default();
            if let Some(min) = schema["minimum"].as_f64()
                && n < min
            {
                invalid(errors, format!("should be greater than or equal to {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && n > max
            {
                invalid(errors, format!("should be less than or equal to {max}"));
            }
        }
        Value::Array(items) => walk_array(items, schema, path, strict, errors),
        Value::Object(map) => walk_object(map, schema, path, strict, errors),
        _ => {}
    }
}

fn walk_string(text: &str, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let length = text.chars().count() as u64;
    let invalid = |why: String| {
        FieldError::new(
            path,
            format!("Invalid value: {}: {why}", shown(&Value::from(text))),
        )
    };
    if let Some(min) = schema["minLength"].as_u64()
        && length < min
    {
        errors.push(invalid(format!("should be at least {min} chars long")));
    }
    if let Some(max) = schema["maxLength"].as_u64()
        && length > max
    {
        errors.push(FieldError::new(
            path,
            format!("Too long: may not be more than {max} bytes"),
        ));
    }
    if let Some(pattern) = schema["pattern"].as_str()
        && !matches(pattern, text)
    {
        errors.push(invalid(format!("should match '{pattern}'")));
    }
}

fn walk_array(
    items: &[Value],
    schema: &Value,
    path: &str,
    strict: bool,
    errors: &mut Vec<FieldError>,
) {
    if let Some(min) = schema["minItems"].as_u64()
        && (items.len() as u64) < min
    {
        errors.push(FieldError::new(
            path,
            format!(
                "Invalid value: {} items: should have at least {min} items",
                items.len()
            ),
        ));
    }
    if let Some(max) = schema["maxItems"].as_u64()
        && (items.len() as u64) > max
    {
        // Nothing past the bound is looked at: a huge list costs nothing more.
        errors.push(FieldError::new(
            path,
            format!("Too many: {}: must have at most {max} items", items.len()),
        ));
        return;
    }
    for (i, item) in items.iter().enumerate() {
        walk(
            item,
            &schema["items"],
            &format!("{path}[{i}]"),
            strict,
            errors,
        );
    }
    if schema["x-kubernetes-list-type"] == "map" {
        let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut seen = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let key: Vec<&Value> = keys.iter().map(|k| &item[*k]).collect();
            if seen.contains(&key) {
                errors.push(FieldError::new(
                    format!("{path}[{i}]"),
                    format!(
                        "Duplicate value: {}",
                        shown(&Value::from(key.into_iter().cloned().collect::<Vec<_>>()))
                    ),
                ));
            } else {
                seen.push(key);
            }
        }
    }
}

fn walk_object(
    map: &serde_json::Map<String, Value>,
    schema: &Value,
    path: &str,
    strict: bool,
    errors: &mut Vec<FieldError>,
) {
    if let Some(max) = schema["maxProperties"].as_u64()
        && (map.len() as u64) > max
    {
        errors.push(FieldError::new(
            path,
            format!("Too many: {}: must have at most {max} items", map.len()),
        ));
        return;
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        let Some(key) = required.as_str() else {
            continue;
        };
        if map.get(key).is_none_or(Value::is_null) {
            errors.push(FieldError::new(format!("{path}.{key}"), "Required value"));
        }
    }
    let properties = schema["properties"].as_object();
    let open = schema["x-kubernetes-preserve-unknown-fields"] == true;
    for (key, value) in map {
        if let Some(sub) = properties.and_then(|p| p.get(key)) {
            walk(value, sub, &format!("{path}.{key}"), strict, errors);
        } else if schema["additionalProperties"].is_object() {
            walk(
                value,
                &schema["additionalProperties"],
                &format!("{path}[{key}]"),
                strict,
                errors,
            );
        } else if strict && !open && properties.is_some() {
            errors.push(FieldError::new(
                format!("{path}.{key}"),
                format!("unknown field \"{path}.{key}\""),
            ));
        }
    }
}

fn duration_ms(text: &str) -> Option<u64> {
    crd::parse_go_duration(text).map(|m| m.0)
}

/// The CRD's CEL rules, each under the CRD's own message. Run on a cluster the schema passed
/// (with its defaults), as the API server runs them.
fn rules(cluster: &MatrixOneCluster) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &cluster.spec;
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut fail = |field: &str, message: &str| errors.push(FieldError::new(field, message));
    let dns_label = matches("^[a-z]([-a-z0-9]*[a-z0-9])?$", &name);
    if !dns_label || name.chars().count() > crd::MAX_NAME {
        fail("metadata.name", crd::MSG_NAME);
    }
    if spec
        .cn
        .groups
        .iter()
        .any(|g| name.chars().count() + g.name.chars().count() > crd::MAX_NAME_AND_GROUP)
    {
        fail("spec.cn.groups", crd::MSG_GROUP_NAMES);
    }
    let upgrade = &spec.upgrade;
    if let (Some(stall), Some(window)) = (
        duration_ms(&upgrade.stall_timeout),
        duration_ms(&upgrade.stability_window),
    ) && stall <= window
    {
        fail("spec.upgrade.stallTimeout", crd::MSG_STALL);
    }
    if spec
        .cn
        .groups
        .iter()
        .any(|g| ["log", "tn", "dn", "proxy"].contains(&g.name.as_str()))
    {
        fail("spec.cn", crd::MSG_GROUP_COMPONENT);
    }
    let shared = &spec.shared_storage;
    if shared.s3.is_some() == shared.file_system.is_some() {
        fail("spec.sharedStorage", crd::MSG_SHARED_ONE);
    }
    if spec.log.replicas % 2 != 1 {
        fail("spec.log.replicas", crd::MSG_LOG_ODD);
    }
    let components = ["log", "tn", "dn", "cn", "proxy"];
    if upgrade
        .strategy
        .keys()
        .any(|k| !components.contains(&k.as_str()))
    {
        fail("spec.upgrade.strategy", crd::MSG_STRATEGY_KEYS);
    }
    let waits = |k: &str, d: &str| {
        upgrade
            .strategy
            .get(k)
            .is_some_and(|deps| deps.0.iter().any(|c| c.as_str() == d))
    };
    let cycle = upgrade.strategy.keys().any(|k| {
        waits(k, k)
            || components
                .iter()
                .any(|d| waits(k, d) && upgrade.strategy.contains_key(*d) && waits(d, k))
    });
    if cycle {
        fail("spec.upgrade.strategy", crd::MSG_STRATEGY_CYCLE);
    }
    let count_or_percent = |v: &IntOrString| match v {
        IntOrString::Int(n) => *n >= 1,
        IntOrString::String(s) => matches("^[0-9]+%$", s),
    };
    if !count_or_percent(&upgrade.max_unavailable.cn) {
        fail(
            "spec.upgrade.maxUnavailable.cn",
            crd::MSG_MAX_UNAVAILABLE_CN,
        );
    }
    if !count_or_percent(&upgrade.max_unavailable.proxy) {
        fail(
            "spec.upgrade.maxUnavailable.proxy",
            crd::MSG_MAX_UNAVAILABLE_PROXY,
        );
    }
    if duration_ms(&spec.drain.grace_period).is_none_or(|ms| ms > 24 * 3_600_000) {
        fail("spec.drain.gracePeriod", crd::MSG_GRACE);
    }
    errors
}

/// The CRD's rules on a change (`self == oldSelf`).
fn transition_rules(old: &MatrixOneClusterSpec, new: &MatrixOneClusterSpec) -> Vec<FieldError> {
    let fixed = [
        (
            old.shared_storage != new.shared_storage,
            "spec.sharedStorage",
            crd::MSG_SHARED_FIXED,
        ),
        (
            old.log.replicas != new.log.replicas,
            "spec.log.replicas",
            crd::MSG_LOG_REPLICAS_FIXED,
        ),
        (
            old.log.shards != new.log.shards,
            "spec.log.shards",
            crd::MSG_SHARDS_FIXED,
        ),
        (
            old.log.storage != new.log.storage,
            "spec.log.storage",
            crd::MSG_LOG_STORAGE_FIXED,
        ),
        (
            old.tn.storage != new.tn.storage,
            "spec.tn.storage",
            crd::MSG_TN_STORAGE_FIXED,
        ),
    ];
    fixed
        .into_iter()
        .filter(|(changed, _, _)| *changed)
        .map(|(_, field, message)| FieldError::new(field, message))
        .collect()
}

/// The messages of every CEL rule [`rules`] and [`transition_rules`] evaluate.
pub const NATIVE_RULES: &[&str] = &[
    crd::MSG_NAME,
    crd::MSG_GROUP_NAMES,
    crd::MSG_STALL,
    crd::MSG_GROUP_COMPONENT,
    crd::MSG_SHARED_ONE,
    crd::MSG_SHARED_FIXED,
    crd::MSG_LOG_ODD,
    crd::MSG_LOG_REPLICAS_FIXED,
    crd::MSG_SHARDS_FIXED,
    crd::MSG_LOG_STORAGE_FIXED,
    crd::MSG_TN_STORAGE_FIXED,
    crd::MSG_STRATEGY_KEYS,
    crd::MSG_STRATEGY_CYCLE,
    crd::MSG_MAX_UNAVAILABLE_CN,
    crd::MSG_MAX_UNAVAILABLE_PROXY,
    crd::MSG_GRACE,
];

/// What only the operator refuses: a spec the schema cannot judge (a strategy cycle through
/// three components, the kernel's TOML) or that its own configuration forbids (a hostPath
/// outside the allowed directories).
pub fn operator_checks(cluster: &MatrixOneCluster, rules: &OperatorRules) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &cluster.spec;
    if let Err(e) = spec.strategy() {
        errors.push(FieldError::new("spec.upgrade.strategy", e.to_string()));
    }
    if let Err(e) = spec.safe_config() {
        let text = e.to_string();
        let (field, message) = text.split_once(": ").unwrap_or(("spec", &text));
        errors.push(FieldError::new(field, message));
    }
    if let Some(fs) = &spec.shared_storage.file_system
        && !host_path_allowed(&fs.path, &rules.host_path_prefixes)
    {
        errors.push(FieldError::new(
            "spec.sharedStorage.fileSystem.path",
            if rules.host_path_prefixes.is_empty() {
                format!(
                    "{}: a hostPath volume, which this operator does not allow (its \
                     --allow-host-path-under names none)",
                    fs.path
                )
            } else {
                format!(
                    "{}: not under a directory this operator allows for hostPath volumes ({})",
                    fs.path,
                    rules.host_path_prefixes.join(", ")
                )
            },
        ));
    }
    if let Err(e) = crate::resources::config_map(cluster, None) {
        let text = e.to_string();
        let (field, message) = text.split_once(": ").unwrap_or(("spec", &text));
        errors.push(FieldError::new(field, message));
    }
    errors
}

/// `path` is one of `prefixes` or inside one, component by component (`/data2` is not under
/// `/data`).
pub fn host_path_allowed(path: &str, prefixes: &[String]) -> bool {
    let components = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    let path = components(path);
    prefixes.iter().any(|prefix| {
        let prefix = components(prefix);
        !prefix.is_empty() && path.starts_with(&prefix)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest(spec: Value) -> Value {
        json!({
            "apiVersion": "ops.matrixorigin.io/v1alpha1",
            "kind": "MatrixOneCluster",
            "metadata": {"name": "mo", "namespace": "db"},
            "spec": spec,
        })
    }

    fn good() -> Value {
        json!({
            "version": "v1.2.4",
            "log": {"replicas": 3},
            "cn": {"groups": [{"name": "tp", "replicas": 2}]},
            "sharedStorage": {"s3": {"endpoint": "https://s3.example.com", "bucket": "mo-data"}},
        })
    }

    fn refused(spec: Value) -> Vec<String> {
        check_object(&manifest(spec), None, true)
            .expect_err("refused")
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn every_cel_rule_of_the_crd_is_evaluated_here() {
        let crd = serde_json::to_value(MatrixOneCluster::crd()).expect("crd");
        let mut messages = Vec::new();
        fn collect(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(map) => {
                    if let Some(rules) = map
                        .get("x-kubernetes-validations")
                        .and_then(|r| r.as_array())
                    {
                        out.extend(
                            rules
                                .iter()
                                .filter_map(|r| r["message"].as_str().map(str::to_string)),
                        );
                    }
                    map.values().for_each(|v| collect(v, out));
                }
                Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
                _ => {}
            }
        }
        collect(&crd, &mut messages);
        assert!(messages.len() >= 16, "{messages:?}");
        for m in &messages {
            assert!(
                NATIVE_RULES.contains(&m.as_str()),
                "no native check for: {m}"
            );
        }
    }

    #[test]
    fn a_valid_manifest_passes_with_its_defaults() {
        let cluster = check_object(&manifest(good()), None, true).expect("valid");
        assert_eq!(cluster.spec.log.storage.size.0, "10Gi");
        assert_eq!(cluster.spec.tn.replicas, 1);
    }

    #[test]
    fn the_schema_and_the_rules_name_the_field() {
        let mut s = good();
        s["log"]["replicas"] = json!(4);
        assert_eq!(refused(s), ["spec.log.replicas"]);
        let mut s = good();
        s["log"]["replicas"] = json!(-1);
        assert_eq!(refused(s), ["spec.log.replicas"]);
        let mut s = good();
        s["tn"] = json!({"replicas": 2});
        assert_eq!(refused(s), ["spec.tn.replicas"]);
        let mut s = good();
        s["cn"]["groups"] = json!([{"name": "a", "replicas": 1}, {"name": "a", "replicas": 2}]);
        assert_eq!(refused(s), ["spec.cn.groups[1]"]);
        let mut s = good();
        s["cn"]["groups"] = json!([{"name": "log", "replicas": 1}]);
        assert_eq!(refused(s), ["spec.cn"]);
        let mut s = good();
        s["cn"]["groups"][0]["replicas"] = json!(2_000_000_000u64);
        assert_eq!(refused(s), ["spec.cn.groups[0].replicas"]);
        let mut s = good();
        s["cn"]["groups"][0]["replics"] = json!(1);
        assert_eq!(refused(s), ["spec.cn.groups[0].replics"]);
        let mut s = good();
        s["log"]["resources"] = json!({"requests": {"cpu": "two"}});
        assert_eq!(refused(s), ["spec.log.resources.requests[cpu]"]);
        let mut s = good();
        s["sharedStorage"] = json!({"fileSystem": {"path": "/srv/../etc"}});
        assert_eq!(refused(s), ["spec.sharedStorage.fileSystem.path"]);
        let mut s = good();
        s["sharedStorage"] = json!({"fileSystem": {"path": "//"}});
        assert_eq!(refused(s), ["spec.sharedStorage.fileSystem.path"]);
        for path in ["/srv/.", "/srv/..", "/./srv", "/srv/../etc/.x"] {
            let mut s = good();
            s["sharedStorage"] = json!({"fileSystem": {"path": path}});
            assert_eq!(refused(s), ["spec.sharedStorage.fileSystem.path"], "{path}");
        }
        // Hidden directories and names that merely start with dots are paths like any other.
        for path in ["/root/.cache/mo", "/srv/...", "/srv/..x", "/srv/.x.y/z"] {
            let mut s = good();
            s["sharedStorage"] = json!({"fileSystem": {"path": path}});
            let checked = check_object(&manifest(s), None, true);
            assert!(checked.is_ok(), "{path}: {checked:?}");
        }
        let mut s = good();
        s["sharedStorage"]["s3"]["prefix"] = json!("a/../b");
        assert_eq!(refused(s), ["spec.sharedStorage.s3.prefix"]);
        let mut s = good();
        s["drain"] = json!({"gracePeriod": "9999h"});
        assert_eq!(refused(s), ["spec.drain.gracePeriod"]);
        let mut s = good();
        s["image"] = json!("evil/image:latest");
        assert_eq!(refused(s), ["spec.image"]);
    }

    #[test]
    fn a_null_where_a_value_belongs_takes_the_default() {
        let mut s = good();
        s["log"]["storage"] = json!({"size": null});
        let cluster = check_object(&manifest(s), None, true).expect("defaulted");
        assert_eq!(cluster.spec.log.storage.size.0, "10Gi");
    }

    #[test]
    fn names_that_the_derived_objects_could_not_carry_are_refused() {
        for name in ["1abc", "a.b", "Mo", &"a".repeat(47)] {
            let mut m = manifest(good());
            m["metadata"]["name"] = json!(name);
            let errors = check_object(&m, None, true).expect_err(name);
            assert_eq!(errors[0].field, "metadata.name", "{name}");
        }
        let mut m = manifest(good());
        m["metadata"]["name"] = json!("a".repeat(40));
        m["spec"]["cn"]["groups"][0]["name"] = json!("b".repeat(20));
        assert_eq!(
            check_object(&m, None, true).expect_err("too long")[0].field,
            "spec.cn.groups"
        );
    }

    #[test]
    fn fixed_fields_cannot_change() {
        let old = check_object(&manifest(good()), None, true).expect("valid");
        let mut s = good();
        s["log"]["storage"] = json!({"size": "20Gi"});
        s["sharedStorage"]["s3"]["bucket"] = json!("other");
        let fields: Vec<String> = check_object(&manifest(s), Some(&old), true)
            .expect_err("refused")
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(fields, ["spec.sharedStorage", "spec.log.storage"]);
    }

    #[test]
    fn host_paths_are_allowed_only_under_the_operators_directories() {
        let allowed = vec!["/var/lib/matrixone".to_string()];
        assert!(host_path_allowed("/var/lib/matrixone/a", &allowed));
        assert!(host_path_allowed("/var/lib/matrixone", &allowed));
        assert!(!host_path_allowed("/var/lib/matrixone2", &allowed));
        assert!(!host_path_allowed("/etc", &allowed));
        assert!(!host_path_allowed("/var/lib/matrixone", &[]));
        let mut s = good();
        s["sharedStorage"] = json!({"fileSystem": {"path": "/etc"}});
        let cluster = check_object(&manifest(s), None, true).expect("schema-valid");
        let errors = operator_checks(
            &cluster,
            &OperatorRules {
                host_path_prefixes: allowed,
            },
        );
        assert_eq!(errors[0].field, "spec.sharedStorage.fileSystem.path");
    }

    #[test]
    fn a_stored_cluster_whose_spec_cannot_be_read_is_its_own_refusal() {
        let stored: StoredCluster = serde_json::from_value(json!({
            "metadata": {"name": "mo", "namespace": "db"},
            "spec": {"version": "v1", "log": {"replicas": "three"}},
        }))
        .expect("any spec is read as JSON");
        let errors = stored
            .parse(&OperatorRules::default())
            .expect_err("refused");
        assert!(
            errors.iter().any(|e| e.field == "spec.log.replicas"),
            "{errors:?}"
        );
    }
}
