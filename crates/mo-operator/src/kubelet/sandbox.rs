//! What a container runtime prepares before it starts a container, for the process runtime:
//! the image's files (`--image` mappings), the environment as the kubelet builds it, the
//! command line, the pod's volumes as host directories, and the pod's `/etc/hosts` and
//! `/etc/resolv.conf`. Everything here is computed from the pod and the objects it names;
//! the namespace work is in [`super::exec`].

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolumeClaim, Pod, Secret,
    Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// `PATH` when the pod sets none (no image config exists to provide one).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a container cannot start, as the kubelet reports it (`state.waiting.reason`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ContainerError {
    pub reason: &'static str,
    pub message: String,
}

impl ContainerError {
    fn image(message: String) -> Self {
        ContainerError {
            reason: "ErrImagePull",
            message,
        }
    }

    fn config(message: String) -> Self {
        ContainerError {
            reason: "CreateContainerConfigError",
            message,
        }
    }

    fn create(message: String) -> Self {
        ContainerError {
            reason: "CreateContainerError",
            message,
        }
    }

    /// A volume's source does not exist yet (the real kubelet keeps the pod in
    /// ContainerCreating and retries the mount).
    fn mount(message: String) -> Self {
        ContainerError {
            reason: "ContainerCreating",
            message,
        }
    }
}

/// One `--image REF=HOST_PATH:CONTAINER_PATH` mapping: containers of a matching image get the
/// host file bind-mounted (read-only) at the container path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    /// An image reference, or a prefix followed by `*`.
    pub pattern: String,
    pub host: PathBuf,
    pub container: PathBuf,
}

impl std::str::FromStr for ImageFile {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not IMAGE=HOST_PATH:CONTAINER_PATH");
        let (pattern, paths) = text.split_once('=').ok_or_else(bad)?;
        let (host, container) = paths.rsplit_once(':').ok_or_else(bad)?;
        if pattern.is_empty() || !host.starts_with('/') || !container.starts_with('/') {
            return Err(bad());
        }
        Ok(ImageFile {
            pattern: pattern.into(),
            host: host.into(),
            container: container.into(),
        })
    }
}

impl ImageFile {
    pub fn matches(&self, image: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => image == self.pattern,
        }
    }
}

/// The files an image brings (every mapping that matches it); none is `ErrImagePull`.
pub fn image_files<'a>(
    images: &'a [ImageFile],
    image: &str,
) -> Result<Vec<&'a ImageFile>, ContainerError> {
    let files: Vec<&ImageFile> = images.iter().filter(|f| f.matches(image)).collect();
    if files.is_empty() {
        return Err(ContainerError::image(format!(
            "image {image:?} has no --image mapping on this kubelet (nothing to run)"
        )));
    }
    if let Some(missing) = files.iter().find(|f| !f.host.exists()) {
        return Err(ContainerError::image(format!(
            "image {image:?}: host file {} does not exist",
            missing.host.display()
        )));
    }
    Ok(files)
}

/// The objects a pod's environment and volumes name (the runtime's watched caches; plain
/// lists in tests).
pub trait Objects {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>>;
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>>;
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    /// The ServiceAccount token issued to pod instance `uid` for `audience`, once issued.
    fn token(&self, uid: &str, audience: &str) -> Option<String>;
}

/// The pod as the runtime runs it: the object plus what only the runtime knows yet (its
/// address may not be written to `status` when the first container starts).
pub struct PodContext<'a> {
    pub pod: &'a Pod,
    pub ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    pub node: &'a str,
}

impl PodContext<'_> {
    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pod's hostname: `spec.hostname`, else its name (as the kubelet sets it).
    pub fn hostname(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.as_deref())
            .unwrap_or_else(|| self.name())
    }

    fn container(&self, name: &str) -> Option<&Container> {
        let spec = self.pod.spec.as_ref()?;
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
    }
}

/// A downward API field (`fieldRef.fieldPath`). `metadata.labels`/`metadata.annotations`
/// (all of them, `key="value"` lines) only in volumes, as in Kubernetes.
pub fn field_value(ctx: &PodContext, path: &str, in_volume: bool) -> Result<String, String> {
    let meta = &ctx.pod.metadata;
    let map_entry = |map: &Option<BTreeMap<String, String>>, rest: &str| -> Option<String> {
        let key = rest.strip_prefix("['")?.strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        )
    };
    let all = |map: &Option<BTreeMap<String, String>>| -> String {
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}\n"))
            .collect()
    };
    let spec = ctx.pod.spec.as_ref();
    let value = match path {
        "metadata.name" => ctx.name().to_string(),
        "metadata.namespace" => ctx.namespace().to_string(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" if in_volume => all(&meta.labels),
        "metadata.annotations" if in_volume => all(&meta.annotations),
        "status.podIP" | "status.podIPs" => ctx.ip.to_string(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_string(),
        "spec.nodeName" => ctx.node.to_string(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        other => {
            if let Some(rest) = other.strip_prefix("metadata.labels")
                && let Some(v) = map_entry(&meta.labels, rest)
            {
                v
            } else if let Some(rest) = other.strip_prefix("metadata.annotations")
                && let Some(v) = map_entry(&meta.annotations, rest)
            {
                v
            } else {
                return Err(format!("unsupported fieldRef {other:?}"));
            }
        }
    };
    Ok(value)
}

/// A quantity in nano-units (`500m` → 5×10⁸, `2Gi` → 2×2³⁰×10⁹), exact.
pub fn quantity_nanos(text: &str) -> Result<i128, String> {
    let bad = || format!("bad quantity {text:?}");
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (negative, number) = match number.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(bad());
    }
    // The number as an integer and a power of ten: 1.5 → 15 × 10⁻¹.
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = digits.parse().map_err(|_| bad())?;
    let mut exp10: i32 = -(fraction.len() as i32);
    let mut binary: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => binary = 10,
        "Mi" => binary = 20,
        "Gi" => binary = 30,
        "Ti" => binary = 40,
        "Pi" => binary = 50,
        "Ei" => binary = 60,
        s if s.starts_with(['e', 'E']) => exp10 += s[1..].parse::<i32>().map_err(|_| bad())?,
        _ => return Err(bad()),
    }
    exp10 += 9; // nano-units
    let mut value = mantissa.checked_mul(1i128 << binary).ok_or_else(bad)?;
    if exp10 >= 0 {
        value = value
            .checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(bad)?)
            .ok_or_else(bad)?;
    } else {
        // Below a nano-unit: Kubernetes rounds up.
        let div = 10i128.checked_pow((-exp10) as u32).ok_or_else(bad)?;
        value = (value + div - 1) / div;
    }
    Ok(if negative { -value } else { value })
}

/// What the node offers a container without limits (the fake nodes' allocatable).
const NODE_CPU: &str = "64";
const NODE_MEMORY: &str = "256Gi";
const NODE_EPHEMERAL: &str = "100Gi";

/// A `resourceFieldRef`: the container's limit or request divided by `divisor`, rounded
/// up; a limit that is not set is the node's allocatable, as the kubelet does.
pub fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
) -> Result<String, String> {
    let resources = container.resources.as_ref();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported resourceFieldRef {resource:?}"))?;
    let node = match name {
        "cpu" => NODE_CPU,
        "memory" => NODE_MEMORY,
        "ephemeral-storage" => NODE_EPHEMERAL,
        _ => return Err(format!("unsupported resourceFieldRef {resource:?}")),
    };
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(name))
        .map(|q| q.0.clone());
    let value = match kind {
        "limits" => limit.unwrap_or_else(|| node.to_string()),
        // An unset request defaults to the limit (API defaulting), else 0.
        "requests" => resources
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(name))
            .map(|q| q.0.clone())
            .or(limit)
            .unwrap_or_else(|| "0".into()),
        _ => return Err(format!("unsupported resourceFieldRef {resource:?}")),
    };
    let divisor = divisor.map_or("1", |d| d.0.as_str());
    let (value, divisor) = (quantity_nanos(&value)?, quantity_nanos(divisor)?);
    if divisor <= 0 {
        return Err(format!(
            "resourceFieldRef divisor {divisor} is not positive"
        ));
    }
    Ok(((value + divisor - 1).div_euclid(divisor)).to_string())
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`,
/// anything else stays as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(after_dollar) = after.strip_prefix('$') {
            out.push('$');
            rest = after_dollar;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Name → value with the first position kept (a later definition overrides the value).
#[derive(Default)]
struct EnvList(Vec<(String, String)>);

impl EnvList {
    fn set(&mut self, name: &str, value: String) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value,
            None => self.0.push((name.to_string(), value)),
        }
    }

    fn get(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// The container's environment as the kubelet builds it: `PATH` and `HOSTNAME` first (the
/// runtime's), then `envFrom`, then `env` (each `$(VAR)` expanded against what came before).
pub fn environment(
    ctx: &PodContext,
    container: &Container,
    objects: &dyn Objects,
) -> Result<Vec<(String, String)>, ContainerError> {
    let ns = ctx.namespace();
    let mut env = EnvList::default();
    env.set("PATH", DEFAULT_PATH.into());
    env.set("HOSTNAME", ctx.hostname().into());
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match objects.config_map(ns, &r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        env.set(&format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional == Some(true) => {}
                None => {
                    return Err(ContainerError::config(format!(
                        "configmap {:?} not found",
                        r.name
                    )));
                }
            }
        }
        if let Some(r) = &from.secret_ref {
            match objects.secret(ns, &r.name) {
                Some(secret) => {
                    for (k, v) in secret.data.iter().flatten() {
                        env.set(
                            &format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        );
                    }
                }
                None if r.optional == Some(true) => {}
                None => {
                    return Err(ContainerError::config(format!(
                        "secret {:?} not found",
                        r.name
                    )));
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => expand(v, |n| env.get(n)),
            (None, None) => String::new(),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_value(ctx, &f.field_path, false).map_err(ContainerError::config)?
                } else if let Some(r) = &from.resource_field_ref {
                    let target = match &r.container_name {
                        Some(n) if !n.is_empty() => ctx.container(n).ok_or_else(|| {
                            ContainerError::config(format!("no container {n:?} in the pod"))
                        })?,
                        _ => container,
                    };
                    resource_value(target, &r.resource, r.divisor.as_ref())
                        .map_err(ContainerError::config)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let value = objects
                        .config_map(ns, &r.name)
                        .and_then(|cm| cm.data.as_ref()?.get(&r.key).cloned());
                    match value {
                        Some(v) => v,
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(ContainerError::config(format!(
                                "couldn't find key {} in ConfigMap {ns}/{} (env {})",
                                r.key, r.name, var.name
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let value = objects.secret(ns, &r.name).and_then(|s| {
                        s.data
                            .as_ref()?
                            .get(&r.key)
                            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                    });
                    match value {
                        Some(v) => v,
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(ContainerError::config(format!(
                                "couldn't find key {} in Secret {ns}/{} (env {})",
                                r.key, r.name, var.name
                            )));
                        }
                    }
                } else {
                    return Err(ContainerError::config(format!(
                        "env {}: unsupported valueFrom",
                        var.name
                    )));
                }
            }
        };
        env.set(&var.name, value);
    }
    Ok(env.0)
}

/// `command` + `args` with `$(VAR)` expanded. Images have no ENTRYPOINT here, so a container
/// without `command` cannot run.
pub fn command_line(
    container: &Container,
    env: &[(String, String)],
) -> Result<Vec<String>, ContainerError> {
    let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let command = container
        .command
        .as_ref()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            ContainerError::create(format!(
                "container {:?}: this runtime needs an explicit command (images have no ENTRYPOINT here)",
                container.name
            ))
        })?;
    Ok(command
        .iter()
        .chain(container.args.iter().flatten())
        .map(|a| expand(a, lookup))
        .collect())
}

/// A file a volume holds: content and permission bits.
pub type Files = BTreeMap<PathBuf, (Vec<u8>, u32)>;

/// Where a volume's content lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumePlan {
    /// Files the runtime writes (configMap, secret, downwardAPI, projected): read-only.
    Files(Files),
    /// A host directory of the pod (emptyDir), or one that outlives it (a claim, hostPath).
    Dir { path: PathBuf, persistent: bool },
}

/// Where the runtime keeps pods' and claims' directories.
pub struct Dirs<'a> {
    pub pod: &'a Path,
    pub claims: &'a Path,
}

/// A relative path inside a volume (`items[].path`), refused when it escapes the volume.
pub fn inside(path: &str) -> Result<PathBuf, ContainerError> {
    let p = Path::new(path);
    if p.components().all(|c| matches!(c, Component::Normal(_))) && !path.is_empty() {
        Ok(p.to_path_buf())
    } else {
        Err(ContainerError::config(format!(
            "volume path {path:?} must be relative, without '..'"
        )))
    }
}

fn key_files(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    what: &str,
) -> Result<Files, ContainerError> {
    let mode = default_mode.unwrap_or(0o644) as u32;
    let mut files = Files::new();
    match items {
        None => {
            for (k, v) in data {
                files.insert(inside(&k)?, (v, mode));
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        let m = item.mode.map_or(mode, |m| m as u32);
                        files.insert(inside(&item.path)?, (v.clone(), m));
                    }
                    None if optional => {}
                    None => {
                        return Err(ContainerError::config(format!(
                            "{what} has no key {:?}",
                            item.key
                        )));
                    }
                }
            }
        }
    }
    Ok(files)
}

fn config_map_files(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    mode: Option<i32>,
    optional: bool,
) -> Result<Files, ContainerError> {
    let Some(cm) = objects.config_map(ns, name) else {
        return if optional {
            Ok(Files::new())
        } else {
            Err(ContainerError::mount(format!(
                "configmap {ns}/{name} not found"
            )))
        };
    };
    let mut data: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        data.insert(k.clone(), v.0.clone());
    }
    key_files(
        data,
        items,
        mode,
        optional,
        &format!("configmap {ns}/{name}"),
    )
}

fn secret_files(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    mode: Option<i32>,
    optional: bool,
) -> Result<Files, ContainerError> {
    let Some(secret) = objects.secret(ns, name) else {
        return if optional {
            Ok(Files::new())
        } else {
            Err(ContainerError::mount(format!(
                "secret {ns}/{name} not found"
            )))
        };
    };
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    key_files(data, items, mode, optional, &format!("secret {ns}/{name}"))
}

fn downward_files(
    ctx: &PodContext,
    items: &[DownwardAPIVolumeFile],
    mode: Option<i32>,
) -> Result<Files, ContainerError> {
    let mut files = Files::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_value(ctx, &f.field_path, true).map_err(ContainerError::config)?
        } else if let Some(r) = &item.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or_default();
            let container = ctx.container(name).ok_or_else(|| {
                ContainerError::config(format!("downwardAPI: no container {name:?}"))
            })?;
            resource_value(container, &r.resource, r.divisor.as_ref())
                .map_err(ContainerError::config)?
        } else {
            continue;
        };
        let m = item.mode.or(mode).unwrap_or(0o644) as u32;
        files.insert(inside(&item.path)?, (value.into_bytes(), m));
    }
    Ok(files)
}

/// Where the volume's content comes from now. Called at every container start and on
/// every tick for file volumes (the runtime rewrites them when their sources change).
pub fn volume_plan(
    ctx: &PodContext,
    volume: &Volume,
    objects: &dyn Objects,
    dirs: &Dirs,
) -> Result<VolumePlan, ContainerError> {
    let ns = ctx.namespace();
    if let Some(cm) = &volume.config_map {
        return config_map_files(
            objects,
            ns,
            &cm.name,
            cm.items.as_ref(),
            cm.default_mode,
            cm.optional == Some(true),
        )
        .map(VolumePlan::Files);
    }
    if let Some(s) = &volume.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        return secret_files(
            objects,
            ns,
            &name,
            s.items.as_ref(),
            s.default_mode,
            s.optional == Some(true),
        )
        .map(VolumePlan::Files);
    }
    if let Some(d) = &volume.downward_api {
        return downward_files(ctx, d.items.as_deref().unwrap_or_default(), d.default_mode)
            .map(VolumePlan::Files);
    }
    if let Some(p) = &volume.projected {
        let mut files = Files::new();
        for source in p.sources.iter().flatten() {
            let part = if let Some(cm) = &source.config_map {
                config_map_files(
                    objects,
                    ns,
                    &cm.name,
                    cm.items.as_ref(),
                    p.default_mode,
                    cm.optional == Some(true),
                )?
            } else if let Some(s) = &source.secret {
                secret_files(
                    objects,
                    ns,
                    &s.name,
                    s.items.as_ref(),
                    p.default_mode,
                    s.optional == Some(true),
                )?
            } else if let Some(d) = &source.downward_api {
                downward_files(ctx, d.items.as_deref().unwrap_or_default(), p.default_mode)?
            } else if let Some(t) = &source.service_account_token {
                let audience = t.audience.clone().unwrap_or_default();
                let uid = ctx.pod.metadata.uid.clone().unwrap_or_default();
                let token = objects.token(&uid, &audience).ok_or_else(|| {
                    ContainerError::mount(format!(
                        "volume {:?}: the ServiceAccount token for {audience:?} is not issued yet",
                        volume.name
                    ))
                })?;
                let mode = p.default_mode.unwrap_or(0o600) as u32;
                Files::from([(inside(&t.path)?, (token.into_bytes(), mode))])
            } else {
                return Err(ContainerError::config(format!(
                    "volume {:?}: unsupported projected source",
                    volume.name
                )));
            };
            files.extend(part);
        }
        return Ok(VolumePlan::Files(files));
    }
    if volume.empty_dir.is_some() {
        return Ok(VolumePlan::Dir {
            path: dirs.pod.join("volumes").join(&volume.name),
            persistent: false,
        });
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        let name = &claim.claim_name;
        return match objects.claim(ns, name) {
            Some(pvc) if pvc.metadata.deletion_timestamp.is_none() => Ok(VolumePlan::Dir {
                path: claim_dir(dirs.claims, ns, name),
                persistent: true,
            }),
            Some(_) => Err(ContainerError::mount(format!(
                "persistentvolumeclaim {ns}/{name} is being deleted"
            ))),
            None => Err(ContainerError::mount(format!(
                "persistentvolumeclaim {ns}/{name} not found"
            ))),
        };
    }
    if let Some(host) = &volume.host_path {
        return Ok(VolumePlan::Dir {
            path: PathBuf::from(&host.path),
            persistent: true,
        });
    }
    Err(ContainerError::create(format!(
        "volume {:?}: this runtime supports configMap, secret, downwardAPI, projected, emptyDir, persistentVolumeClaim and hostPath volumes",
        volume.name
    )))
}

/// The directory behind a claim: it outlives the pods that use it, until the claim is deleted.
pub fn claim_dir(root: &Path, namespace: &str, claim: &str) -> PathBuf {
    root.join(namespace).join(claim)
}

/// Writes `files` into `dir` (each by rename, so a reader never sees half a file) and
/// removes files that are no longer wanted.
pub fn write_files(dir: &Path, files: &Files) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    for (rel, (content, mode)) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(path.file_name().unwrap_or_default());
        tmp_name.push(".tmp");
        let tmp = path.with_file_name(tmp_name);
        std::fs::write(&tmp, content)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode & 0o7777))?;
        std::fs::rename(&tmp, &path)?;
    }
    remove_unwanted(dir, dir, files)
}

fn remove_unwanted(root: &Path, dir: &Path, files: &Files) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if entry.file_type()?.is_dir() {
            remove_unwanted(root, &path, files)?;
            if !files.keys().any(|f| f.starts_with(&rel)) {
                std::fs::remove_dir_all(&path)?;
            }
        } else if !files.contains_key(&rel) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// A pod's address and DNS identity, for the hosts files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddress {
    pub namespace: String,
    pub ip: Ipv4Addr,
    pub hostname: String,
    pub subdomain: Option<String>,
}

/// A headless Service's name and the addresses it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAddresses {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<Ipv4Addr>,
}

/// The names a `<name>.<ns>` DNS entry has: the cluster names, and the short ones within
/// its own namespace (Go and glibc look `/etc/hosts` up without the search list).
fn dns_names(prefix: &str, namespace: &str, same_namespace: bool) -> Vec<String> {
    let mut names = vec![
        format!("{prefix}.{namespace}.svc.cluster.local"),
        format!("{prefix}.{namespace}.svc"),
    ];
    if same_namespace {
        names.push(format!("{prefix}.{namespace}"));
        names.push(prefix.to_string());
    }
    names
}

/// The `/etc/hosts` of pod `me`: localhost, its own name (as the kubelet writes it), then
/// what cluster DNS would answer: every pod with a hostname and a subdomain, every headless
/// Service's pods.
pub fn hosts_file(me: &PodAddress, pods: &[PodAddress], services: &[ServiceAddresses]) -> String {
    let mut out = String::from(
        "# Written by mo-operator kubelet --runtime process: this pod's name and the cluster's DNS names.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    let own: Vec<String> = match &me.subdomain {
        Some(sub) => {
            let mut n = dns_names(&format!("{}.{sub}", me.hostname), &me.namespace, true);
            n.push(me.hostname.clone());
            n.dedup();
            n
        }
        None => vec![me.hostname.clone()],
    };
    out.push_str(&format!("{}\t{}\n", me.ip, own.join(" ")));
    for pod in pods {
        let Some(sub) = &pod.subdomain else { continue };
        if pod == me {
            continue;
        }
        let names = dns_names(
            &format!("{}.{sub}", pod.hostname),
            &pod.namespace,
            pod.namespace == me.namespace,
        );
        out.push_str(&format!("{}\t{}\n", pod.ip, names.join(" ")));
    }
    for svc in services {
        let names = dns_names(&svc.name, &svc.namespace, svc.namespace == me.namespace);
        for ip in &svc.ips {
            out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
        }
    }
    out
}

/// The pod's `/etc/resolv.conf`: cluster search domains (there is no cluster DNS server;
/// names resolve through the hosts file).
pub fn resolv_conf(namespace: &str) -> String {
    format!(
        "search {namespace}.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    #[derive(Default)]
    struct Fake {
        config_maps: Vec<ConfigMap>,
        secrets: Vec<Secret>,
        claims: Vec<PersistentVolumeClaim>,
    }

    fn named<'a, T: kube::Resource>(list: &'a [T], ns: &str, name: &str) -> Option<&'a T> {
        list.iter().find(|o| {
            o.meta().namespace.as_deref() == Some(ns) && o.meta().name.as_deref() == Some(name)
        })
    }

    impl Objects for Fake {
        fn config_map(&self, ns: &str, name: &str) -> Option<Arc<ConfigMap>> {
            named(&self.config_maps, ns, name).cloned().map(Arc::new)
        }
        fn secret(&self, ns: &str, name: &str) -> Option<Arc<Secret>> {
            named(&self.secrets, ns, name).cloned().map(Arc::new)
        }
        fn claim(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            named(&self.claims, ns, name).cloned().map(Arc::new)
        }
        fn token(&self, _: &str, _: &str) -> Option<String> {
            None
        }
    }

    fn fake() -> Fake {
        Fake {
            config_maps: vec![
                serde_json::from_value(json!({
                    "metadata": {"name": "cfg", "namespace": "ns"},
                    "data": {"greeting": "hello", "launch.toml": "a = 1\n"},
                    "binaryData": {"blob": "AAE="},
                }))
                .unwrap(),
            ],
            secrets: vec![Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("s".into()),
                    namespace: Some("ns".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "password".to_string(),
                    ByteString(b"p4ss".to_vec()),
                )])),
                ..Default::default()
            }],
            claims: vec![
                serde_json::from_value(
                    json!({"metadata": {"name": "data-web-0", "namespace": "ns"}}),
                )
                .unwrap(),
            ],
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "u-1",
                "labels": {"app": "web", "tier": "db"}, "annotations": {"note": "x"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn ctx(pod: &Pod) -> PodContext<'_> {
        PodContext {
            pod,
            ip: Ipv4Addr::new(127, 16, 0, 5),
            host_ip: Ipv4Addr::LOCALHOST,
            node: "node-2",
        }
    }

    #[test]
    fn image_mappings_match_exactly_or_by_prefix() {
        let images: Vec<ImageFile> = [
            "matrixorigin/matrixone:v1.2.4=/bin/true:/mo-service",
            "mo-operator:*=/bin/sh:/usr/local/bin/mo-operator",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(
            images[1].container,
            PathBuf::from("/usr/local/bin/mo-operator")
        );
        assert!(images[0].matches("matrixorigin/matrixone:v1.2.4"));
        assert!(!images[0].matches("matrixorigin/matrixone:v1.2.5"));
        assert!(images[1].matches("mo-operator:e2e"));
        assert_eq!(image_files(&images, "mo-operator:1").unwrap().len(), 1);
        let err = image_files(&images, "busybox:1").unwrap_err();
        assert_eq!(err.reason, "ErrImagePull");
        assert!(err.message.contains("busybox:1"), "{err}");
        assert!("nope".parse::<ImageFile>().is_err());
        assert!("a=relative:/x".parse::<ImageFile>().is_err());
    }

    #[test]
    fn quantities_are_exact_and_divisors_round_up() {
        assert_eq!(quantity_nanos("500m").unwrap(), 500_000_000);
        assert_eq!(
            quantity_nanos("2Gi").unwrap(),
            2 * (1i128 << 30) * 1_000_000_000
        );
        assert_eq!(quantity_nanos("1.5").unwrap(), 1_500_000_000);
        assert_eq!(
            quantity_nanos("129e6").unwrap(),
            129_000_000 * 1_000_000_000
        );
        assert!(quantity_nanos("12x").is_err());
        let c: Container = serde_json::from_value(json!({
            "name": "main",
            "resources": {"limits": {"memory": "1Gi", "cpu": "250m"}, "requests": {"cpu": "100m"}},
        }))
        .unwrap();
        let mi = Quantity("1Mi".into());
        assert_eq!(
            resource_value(&c, "limits.memory", Some(&mi)).unwrap(),
            "1024"
        );
        // 0.25 of a core is 1 core (rounded up), 250 in millicores.
        assert_eq!(resource_value(&c, "limits.cpu", None).unwrap(), "1");
        let m = Quantity("1m".into());
        assert_eq!(resource_value(&c, "limits.cpu", Some(&m)).unwrap(), "250");
        assert_eq!(resource_value(&c, "requests.cpu", Some(&m)).unwrap(), "100");
        // A request not set defaults to the limit; a limit not set is the node's.
        assert_eq!(
            resource_value(&c, "requests.memory", Some(&mi)).unwrap(),
            "1024"
        );
        let bare: Container = serde_json::from_value(json!({"name": "x"})).unwrap();
        assert_eq!(resource_value(&bare, "limits.cpu", None).unwrap(), "64");
        assert_eq!(resource_value(&bare, "requests.memory", None).unwrap(), "0");
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let lookup = |n: &str| (n == "A").then(|| "x".to_string());
        assert_eq!(expand("$(A)-$(B)-$$(A)-$-$(A", lookup), "x-$(B)-$(A)-$-$(A");
    }

    #[test]
    fn environment_as_the_kubelet_builds_it() {
        let p = pod(json!({"containers": [{
            "name": "main",
            "resources": {"limits": {"memory": "512Mi"}},
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
            "env": [
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "TIER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
                {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
                {"name": "ADDR", "value": "$(IP):6001"},
                {"name": "PATH", "value": "/opt/bin:$(PATH)"},
            ],
        }]}));
        let objects = fake();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = environment(&ctx(&p), c, &objects).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOSTNAME"), Some("web-0"));
        assert_eq!(get("NAME"), Some("web-0"));
        assert_eq!(get("NS"), Some("ns"));
        assert_eq!(get("UID"), Some("u-1"));
        assert_eq!(get("IP"), Some("127.16.0.5"));
        assert_eq!(get("NODE"), Some("node-2"));
        assert_eq!(get("TIER"), Some("db"));
        assert_eq!(get("NOTE"), Some("x"));
        assert_eq!(get("MEM"), Some("512"));
        assert_eq!(get("GREETING"), Some("hello"));
        assert_eq!(get("CFG_greeting"), Some("hello"));
        assert_eq!(get("PASSWORD"), Some("p4ss"));
        assert_eq!(get("MAYBE"), None);
        assert_eq!(get("ADDR"), Some("127.16.0.5:6001"));
        assert_eq!(
            get("PATH"),
            Some(format!("/opt/bin:{DEFAULT_PATH}").as_str())
        );
        // PATH keeps its first place although the pod overrides it.
        assert_eq!(env[0].0, "PATH");

        let missing = pod(json!({"containers": [{"name": "main", "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope"}}},
        ]}]}));
        let err = environment(
            &ctx(&missing),
            &missing.spec.as_ref().unwrap().containers[0],
            &objects,
        )
        .unwrap_err();
        assert_eq!(err.reason, "CreateContainerConfigError");
        assert!(err.message.contains("nope"), "{err}");
    }

    #[test]
    fn command_and_args_combine_and_expand() {
        let c: Container = serde_json::from_value(json!({
            "name": "main", "command": ["/mo-service"], "args": ["-launch", "$(CONF)", "$$(CONF)"],
        }))
        .unwrap();
        let env = vec![("CONF".to_string(), "/etc/cn.toml".to_string())];
        assert_eq!(
            command_line(&c, &env).unwrap(),
            ["/mo-service", "-launch", "/etc/cn.toml", "$(CONF)"]
        );
        let no_command: Container =
            serde_json::from_value(json!({"name": "main", "args": ["-launch", "x"]})).unwrap();
        let err = command_line(&no_command, &env).unwrap_err();
        assert_eq!(err.reason, "CreateContainerError");
        assert!(err.message.contains("explicit command"));
    }

    fn plan(
        p: &Pod,
        volume: serde_json::Value,
        objects: &Fake,
    ) -> Result<VolumePlan, ContainerError> {
        let v: Volume = serde_json::from_value(volume).unwrap();
        let dirs = Dirs {
            pod: Path::new("/state/pods/u-1"),
            claims: Path::new("/state/pvcs"),
        };
        volume_plan(&ctx(p), &v, objects, &dirs)
    }

    #[test]
    fn volumes_materialize() {
        let p =
            pod(json!({"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]}));
        let objects = fake();
        let VolumePlan::Files(files) = plan(
            &p,
            json!({"name": "c", "configMap": {"name": "cfg"}}),
            &objects,
        )
        .unwrap() else {
            panic!("files")
        };
        assert_eq!(files[Path::new("greeting")], (b"hello".to_vec(), 0o644));
        assert_eq!(files[Path::new("blob")].0, vec![0u8, 1]);
        let VolumePlan::Files(items) = plan(
            &p,
            json!({"name": "c", "configMap": {"name": "cfg", "defaultMode": 0o600,
                "items": [{"key": "launch.toml", "path": "conf/cn.toml"}]}}),
            &objects,
        )
        .unwrap() else {
            panic!("files")
        };
        assert_eq!(
            items.into_iter().collect::<Vec<_>>(),
            vec![(PathBuf::from("conf/cn.toml"), (b"a = 1\n".to_vec(), 0o600))]
        );
        let err = plan(
            &p,
            json!({"name": "c", "configMap": {"name": "cfg",
            "items": [{"key": "x", "path": "../../etc/passwd"}]}}),
            &objects,
        )
        .unwrap_err();
        assert!(
            err.message.contains("no key") || err.message.contains(".."),
            "{err}"
        );
        assert_eq!(
            plan(
                &p,
                json!({"name": "c", "configMap": {"name": "gone"}}),
                &objects
            )
            .unwrap_err()
            .reason,
            "ContainerCreating"
        );
        assert_eq!(
            plan(
                &p,
                json!({"name": "c", "configMap": {"name": "gone", "optional": true}}),
                &objects
            ),
            Ok(VolumePlan::Files(Files::new()))
        );
        let VolumePlan::Files(secret) = plan(
            &p,
            json!({"name": "s", "secret": {"secretName": "s"}}),
            &objects,
        )
        .unwrap() else {
            panic!("files")
        };
        assert_eq!(secret[Path::new("password")].0, b"p4ss");
        let VolumePlan::Files(down) = plan(&p, json!({"name": "d", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu", "divisor": "1m"}},
        ]}}), &objects)
        .unwrap() else {
            panic!("files")
        };
        assert_eq!(down[Path::new("labels")].0, b"app=\"web\"\ntier=\"db\"\n");
        assert_eq!(down[Path::new("cpu")].0, b"2000");
        assert_eq!(
            plan(&p, json!({"name": "e", "emptyDir": {}}), &objects).unwrap(),
            VolumePlan::Dir {
                path: "/state/pods/u-1/volumes/e".into(),
                persistent: false
            }
        );
        assert_eq!(
            plan(
                &p,
                json!({"name": "d", "persistentVolumeClaim": {"claimName": "data-web-0"}}),
                &objects
            )
            .unwrap(),
            VolumePlan::Dir {
                path: "/state/pvcs/ns/data-web-0".into(),
                persistent: true
            }
        );
        assert_eq!(
            plan(
                &p,
                json!({"name": "d", "persistentVolumeClaim": {"claimName": "other"}}),
                &objects
            )
            .unwrap_err()
            .reason,
            "ContainerCreating"
        );
    }

    #[test]
    fn written_files_follow_their_source() {
        let dir = std::env::temp_dir().join(format!("mo-sandbox-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = Files::new();
        files.insert("a".into(), (b"1".to_vec(), 0o600));
        files.insert("sub/b".into(), (b"2".to_vec(), 0o644));
        write_files(&dir, &files).unwrap();
        assert_eq!(std::fs::read(dir.join("sub/b")).unwrap(), b"2");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dir.join("a"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        files.remove(Path::new("sub/b"));
        files.insert("a".into(), (b"changed".to_vec(), 0o600));
        write_files(&dir, &files).unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"changed");
        assert!(!dir.join("sub").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hosts_file_names_pods_and_headless_services() {
        let me = PodAddress {
            namespace: "ns".into(),
            ip: Ipv4Addr::new(127, 16, 0, 2),
            hostname: "mo-log-0".into(),
            subdomain: Some("mo-log".into()),
        };
        let other = PodAddress {
            namespace: "ns".into(),
            ip: Ipv4Addr::new(127, 16, 0, 3),
            hostname: "mo-log-1".into(),
            subdomain: Some("mo-log".into()),
        };
        let elsewhere = PodAddress {
            namespace: "other".into(),
            ip: Ipv4Addr::new(127, 16, 0, 4),
            hostname: "x-0".into(),
            subdomain: Some("x".into()),
        };
        let plain = PodAddress {
            namespace: "ns".into(),
            ip: Ipv4Addr::new(127, 16, 0, 9),
            hostname: "bare".into(),
            subdomain: None,
        };
        let svc = ServiceAddresses {
            namespace: "ns".into(),
            name: "mo-log-discovery".into(),
            ips: vec![me.ip, other.ip],
        };
        let all = [me.clone(), other.clone(), elsewhere, plain];
        let text = hosts_file(&me, &all, &[svc]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"127.0.0.1\tlocalhost"));
        assert!(lines.contains(
            &"127.16.0.2\tmo-log-0.mo-log.ns.svc.cluster.local mo-log-0.mo-log.ns.svc mo-log-0.mo-log.ns mo-log-0.mo-log mo-log-0"
        ));
        assert!(lines.contains(
            &"127.16.0.3\tmo-log-1.mo-log.ns.svc.cluster.local mo-log-1.mo-log.ns.svc mo-log-1.mo-log.ns mo-log-1.mo-log"
        ));
        // Another namespace's pods only by their full names; a pod without subdomain has none.
        assert!(lines.contains(&"127.16.0.4\tx-0.x.other.svc.cluster.local x-0.x.other.svc"));
        assert!(!text.contains("bare"));
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("mo-log-discovery.ns.svc "))
                .count(),
            2
        );
        assert!(resolv_conf("ns").starts_with("search ns.svc.cluster.local svc.cluster.local"));
    }
}
