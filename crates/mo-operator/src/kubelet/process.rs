//! `mo-operator kubelet --runtime process`: runs each pod's containers as real processes on
//! this machine, as a container runtime would: init containers in order, then the main
//! containers, each in its own namespaces ([`super::exec`]) with the pod's volumes, its
//! environment and command ([`super::sandbox`]), probes ([`super::probe`]), crash-loop
//! restarts, preStop hooks and graceful termination; status written back to the pod.
//!
//! The state machine of a container: `Waiting` (not started, back-off, or cannot start:
//! `ErrImagePull`, `CreateContainerConfigError`, …) → `Running` (a launcher process) →
//! exited: `Waiting` again for a restart (`CrashLoopBackOff`, the exit kept in `lastState`)
//! or `Terminated` for good. A pod being deleted runs each running container's preStop hook,
//! then SIGTERM, then SIGKILL at the end of its grace period; once nothing runs, the pod
//! object is removed.

use super::exec::{self, Bind, Launch, Process, Spawner};
use super::probe::{self, Prober, Target};
use super::sandbox::{
    self, ContainerError, Dirs, Files, Objects, PodAddress, PodContext, ServiceAddresses,
    VolumePlan,
};
use super::{DataPlane, PreStop, StartHook};
use anyhow::{Context as _, Result};
use axum::extract::{Path as UrlPath, Query, State as ApiState};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, LifecycleHandler, Node, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use mo_kube::cache::cache;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest crash-loop back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A run at least this long resets the back-off (the kubelet's "10 minutes without trouble").
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How soon a container that could not start is tried again.
const START_RETRY: Duration = Duration::from_secs(1);
/// The fake nodes' address as the processes can reach it: this machine.
const HOST_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// The finalizer the (absent) PVC protection controller would remove.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// The crash-loop back-off before the restart that follows `crashes` earlier ones: `base`
/// doubling, at most five minutes.
pub fn backoff(base: Duration, crashes: u32) -> Duration {
    base.saturating_mul(1 << crashes.min(20)).min(MAX_BACKOFF)
}

fn now_rfc3339() -> String {
    let now = Timestamp::now();
    // Whole seconds, as the API server keeps them.
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

fn signal(pid: u32, sig: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
}

/// SIGKILL to a launcher's process group: the launcher, and with it the container's PID 1
/// and so every process of the container.
fn kill_group(pid: u32) {
    signal_group(pid, Signal::SIGKILL);
}

/// A signal to a launcher's process group (every process of the container).
fn signal_group(pid: u32, sig: Signal) {
    let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), sig);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Always,
    OnFailure,
    Never,
}

fn restart_policy(pod: &Pod) -> Policy {
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
        Some("OnFailure") => Policy::OnFailure,
        Some("Never") => Policy::Never,
        _ => Policy::Always,
    }
}

/// The hook of the pod's first container is keyed by the pod UID (what the test API's
/// `/v1/prestop/{uid}` shows), the others by `<uid>/<container>`.
fn hook_key(uid: &str, index: usize, container: &str) -> String {
    if index == 0 {
        uid.to_string()
    } else {
        format!("{uid}/{container}")
    }
}

/// A container's exit.
#[derive(Debug, Clone)]
struct Finished {
    exit_code: i32,
    reason: &'static str,
    message: Option<String>,
    started_at: String,
    finished_at: String,
    container_id: String,
    ran: Duration,
}

impl Finished {
    fn json(&self) -> serde_json::Value {
        let mut v = json!({
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        });
        if let Some(m) = &self.message {
            v["message"] = json!(m);
        }
        v
    }
}

/// SIGTERM was sent; SIGKILL follows at `kill_at`.
struct Stop {
    kill_at: Instant,
    killed: bool,
    /// Why the runtime stops it (a failed probe), for the exit's message.
    why: Option<String>,
}

struct Running {
    child: std::process::Child,
    /// The launcher's PID (the container's PID 1 is its child).
    pid: u32,
    started_at: String,
    since: Instant,
    log: PathBuf,
    /// Main containers only.
    prober: Option<Prober>,
    stop: Option<Stop>,
}

impl Running {
    /// SIGTERM now, SIGKILL at `kill_at` (once).
    fn stop(&mut self, kill_at: Instant, why: Option<String>) {
        if self.stop.is_none() {
            signal(self.pid, Signal::SIGTERM);
            self.stop = Some(Stop {
                kill_at,
                killed: false,
                why,
            });
        }
    }

    /// A shorter grace period asked for later: SIGTERM now if not sent yet, SIGKILL by
    /// `kill_at` at the latest.
    fn shorten(&mut self, kill_at: Instant) {
        match &mut self.stop {
            Some(stop) => stop.kill_at = stop.kill_at.min(kill_at),
            None => self.stop(kill_at, None),
        }
    }

    fn enforce(&mut self, now: Instant) {
        if let Some(stop) = &mut self.stop
            && !stop.killed
            && now >= stop.kill_at
        {
            tracing::info!(pid = self.pid, "grace period over: SIGKILL");
            kill_group(self.pid);
            stop.killed = true;
        }
    }
}

enum State {
    Waiting { reason: String, message: String },
    Running(Box<Running>),
    Terminated(Finished),
}

struct ContainerRun {
    spec: Container,
    init: bool,
    state: State,
    last: Option<Finished>,
    /// Starts so far (`restartCount` is one less).
    runs: u32,
    /// Crashes since the last long run: the next back-off's exponent.
    crashes: u32,
    not_before: Option<Instant>,
    /// The current run's environment (its exec probes and hooks get it too).
    env: Vec<(String, String)>,
    image_id: String,
}

impl ContainerRun {
    fn new(spec: &Container, init: bool, reason: &str) -> ContainerRun {
        ContainerRun {
            spec: spec.clone(),
            init,
            state: State::Waiting {
                reason: reason.into(),
                message: String::new(),
            },
            last: None,
            runs: 0,
            crashes: 0,
            not_before: None,
            env: Vec::new(),
            image_id: String::new(),
        }
    }

    fn restart_count(&self) -> u32 {
        self.runs.saturating_sub(1)
    }

    fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(f) if f.exit_code == 0)
    }

    fn due(&self, now: Instant) -> bool {
        matches!(self.state, State::Waiting { .. }) && self.not_before.is_none_or(|t| now >= t)
    }

    /// (started, ready) as the status reports them.
    fn started_ready(&self) -> (bool, bool) {
        match &self.state {
            State::Running(r) => match &r.prober {
                Some(p) => {
                    let h = p.health();
                    (h.started, h.started && h.ready && r.stop.is_none())
                }
                None => (true, false),
            },
            State::Terminated(f) => (false, self.init && f.exit_code == 0),
            State::Waiting { .. } => (false, false),
        }
    }

    fn status(&self) -> serde_json::Value {
        let (started, ready) = self.started_ready();
        let (state, id) = match &self.state {
            State::Waiting { reason, message } => {
                let mut w = json!({"reason": reason});
                if !message.is_empty() {
                    w["message"] = json!(message);
                }
                (
                    json!({"waiting": w}),
                    self.last.as_ref().map(|l| l.container_id.clone()),
                )
            }
            State::Running(r) => (
                json!({"running": {"startedAt": r.started_at}}),
                Some(format!("process://{}", r.pid)),
            ),
            State::Terminated(f) => (
                json!({"terminated": f.json()}),
                Some(f.container_id.clone()),
            ),
        };
        let mut v = json!({
            "name": self.spec.name,
            "image": self.spec.image.clone().unwrap_or_default(),
            "imageID": self.image_id,
            "ready": ready,
            "started": started,
            "restartCount": self.restart_count(),
            "state": state,
            "lastState": self.last.as_ref().map_or(json!({}), |f| json!({"terminated": f.json()})),
        });
        if let Some(id) = id {
            v["containerID"] = json!(id);
        }
        v
    }

    fn report(&self) -> ContainerReport {
        let (started, ready) = self.started_ready();
        let mut report = ContainerReport {
            name: self.spec.name.clone(),
            init: self.init,
            pid: None,
            restarts: self.restart_count(),
            state: "",
            reason: None,
            exit_code: None,
            started_at: None,
            log: None,
            started,
            ready,
        };
        match &self.state {
            State::Waiting { reason, .. } => {
                report.state = "waiting";
                report.reason = Some(reason.clone());
            }
            State::Running(r) => {
                report.state = "running";
                report.pid = Some(r.pid);
                report.started_at = Some(r.started_at.clone());
                report.log = Some(r.log.clone());
            }
            State::Terminated(f) => {
                report.state = "terminated";
                report.reason = Some(f.reason.into());
                report.exit_code = Some(f.exit_code);
                report.started_at = Some(f.started_at.clone());
            }
        }
        report
    }
}

/// A pod as this runtime knows it, apart from its containers.
struct PodInfo {
    uid: String,
    namespace: String,
    name: String,
    node: String,
    hostname: String,
    subdomain: Option<String>,
    labels: BTreeMap<String, String>,
    ip: Ipv4Addr,
    /// `<state>/pods/<uid>`: hosts file, resolv.conf, emptyDirs and written volumes.
    dir: PathBuf,
    /// `<log-dir>/<ns>_<name>_<uid>`.
    logs: PathBuf,
    start_time: String,
    /// Each volume's host directory and whether it is read-only by nature, or why not yet.
    volumes: BTreeMap<String, Result<(PathBuf, bool), ContainerError>>,
    /// File volumes as last written (rewritten when their sources change).
    volume_files: BTreeMap<String, Files>,
}

impl PodInfo {
    fn context<'a>(&'a self, pod: &'a Pod) -> PodContext<'a> {
        PodContext {
            pod,
            ip: self.ip,
            host_ip: HOST_IP,
            node: &self.node,
        }
    }

    fn address(&self) -> PodAddress {
        PodAddress {
            namespace: self.namespace.clone(),
            ip: self.ip,
            hostname: self.hostname.clone(),
            subdomain: self.subdomain.clone(),
        }
    }

    fn refresh_volumes(&mut self, pod: &Pod, objects: &dyn Objects, claims: &Path) {
        let ctx = PodContext {
            pod,
            ip: self.ip,
            host_ip: HOST_IP,
            node: &self.node,
        };
        let dirs = Dirs {
            pod: &self.dir,
            claims,
        };
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let result = match sandbox::volume_plan(&ctx, volume, objects, &dirs) {
                Ok(VolumePlan::Files(files)) => {
                    let dir = self.dir.join("volumes").join(&volume.name);
                    if self.volume_files.get(&volume.name) == Some(&files) {
                        Ok((dir, true))
                    } else {
                        match sandbox::write_files(&dir, &files) {
                            Ok(()) => {
                                self.volume_files.insert(volume.name.clone(), files);
                                Ok((dir, true))
                            }
                            Err(e) => Err(ContainerError {
                                reason: "CreateContainerConfigError",
                                message: format!("writing volume {}: {e}", volume.name),
                            }),
                        }
                    }
                }
                Ok(VolumePlan::Dir { path, .. }) => match std::fs::create_dir_all(&path) {
                    Ok(()) => Ok((path, false)),
                    Err(e) => Err(ContainerError {
                        reason: "CreateContainerConfigError",
                        message: format!("volume {} at {}: {e}", volume.name, path.display()),
                    }),
                },
                Err(e) => Err(e),
            };
            self.volumes.insert(volume.name.clone(), result);
        }
    }
}

struct PodRun {
    info: PodInfo,
    init: Vec<ContainerRun>,
    main: Vec<ContainerRun>,
    initialized: bool,
    /// When the deletion was first seen (the grace period counts from here).
    deleting: Option<Instant>,
    /// The shortest grace period a deletion of this pod has asked for, in seconds.
    deletion_grace: Option<i64>,
    /// Each condition's value and when it last changed.
    conditions: BTreeMap<&'static str, (bool, String)>,
    /// The status last written (only changes are written).
    written: Option<serde_json::Value>,
    /// The hosts file as last written.
    hosts: String,
}

impl PodRun {
    fn containers(&self) -> impl Iterator<Item = &ContainerRun> {
        self.init.iter().chain(self.main.iter())
    }

    fn running(&self) -> bool {
        self.containers()
            .any(|c| matches!(c.state, State::Running(_)))
    }

    fn ready(&self) -> bool {
        !self.main.is_empty() && self.main.iter().all(|c| c.started_ready().1)
    }

    fn hook_keys(&self) -> Vec<String> {
        self.main
            .iter()
            .enumerate()
            .map(|(i, c)| hook_key(&self.info.uid, i, &c.spec.name))
            .collect()
    }

    /// SIGKILL to everything still running, and reaped.
    fn kill_all(&mut self) {
        for c in self.init.iter_mut().chain(self.main.iter_mut()) {
            if let State::Running(r) = &mut c.state {
                kill_group(r.pid);
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }

    /// Collects exited containers and decides their restarts.
    fn reap(&mut self, base: Duration, policy: Policy, deleting: bool, now: Instant) {
        let pod_ref = format!(
            "{}_{}({})",
            self.info.name, self.info.namespace, self.info.uid
        );
        for c in self.init.iter_mut().chain(self.main.iter_mut()) {
            let State::Running(r) = &mut c.state else {
                continue;
            };
            let status = match r.child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(pod = %pod_ref, container = %c.spec.name, error = %e, "cannot wait for a container");
                    continue;
                }
            };
            let exit_code = status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            let finished = Finished {
                exit_code,
                reason: if exit_code == 0 { "Completed" } else { "Error" },
                message: r.stop.as_ref().and_then(|s| s.why.clone()),
                started_at: r.started_at.clone(),
                finished_at: now_rfc3339(),
                container_id: format!("process://{}", r.pid),
                ran: r.since.elapsed(),
            };
            let restart = !deleting
                && match (c.init, policy) {
                    (true, p) => exit_code != 0 && p != Policy::Never,
                    (false, Policy::Always) => true,
                    (false, Policy::OnFailure) => exit_code != 0,
                    (false, Policy::Never) => false,
                };
            tracing::info!(pod = %pod_ref, container = %c.spec.name, exit_code, restart, "container exited");
            if restart {
                if finished.ran >= BACKOFF_RESET {
                    c.crashes = 0;
                }
                let delay = backoff(base, c.crashes);
                c.crashes += 1;
                c.not_before = Some(now + delay);
                c.state = State::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {}s restarting failed container={} pod={pod_ref}",
                        delay.as_secs(),
                        c.spec.name
                    ),
                };
                c.last = Some(finished);
            } else {
                c.state = State::Terminated(finished);
            }
        }
    }

    /// Graceful deletion: preStop hooks, SIGTERM, SIGKILL at the end of the grace period.
    /// True once nothing runs any more.
    fn terminate(&mut self, plane: &DataPlane, runtime: &Runtime, pod: &Pod, now: Instant) -> bool {
        let seen = *self.deleting.get_or_insert_with(|| {
            tracing::info!(pod = %self.info.name, namespace = %self.info.namespace, "pod deletion seen");
            now
        });
        let grace_secs = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0);
        let grace = Duration::from_secs(grace_secs as u64);
        // A later delete may shorten the grace period (`kubectl delete --grace-period=1` of a
        // pod already terminating): as the kubelet does, everything still running is then
        // killed by the new deadline, whatever the first one was.
        if self.deletion_grace.is_some_and(|first| grace_secs < first) {
            tracing::info!(pod = %self.info.name, grace_secs, "grace period shortened");
            for c in self.init.iter_mut().chain(self.main.iter_mut()) {
                if let State::Running(r) = &mut c.state {
                    r.shorten(now + grace);
                }
            }
        }
        self.deletion_grace = Some(
            self.deletion_grace
                .map_or(grace_secs, |g| g.min(grace_secs)),
        );
        for c in self.init.iter_mut() {
            if let State::Running(r) = &mut c.state {
                r.stop(seen + grace, None);
                r.enforce(now);
            }
        }
        for (i, c) in self.main.iter_mut().enumerate() {
            let State::Running(r) = &mut c.state else {
                continue;
            };
            if r.stop.is_none() {
                let key = hook_key(&self.info.uid, i, &c.spec.name);
                let hook = c
                    .spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.pre_stop.as_ref())
                    .and_then(|h| runtime.hook(&self.info, &c.spec, &c.env, r.pid, h, grace));
                match plane.pre_stop(pod, &key, Some(grace), hook) {
                    PreStop::Running => continue,
                    PreStop::Finished { remaining } => r.stop(now + remaining, None),
                    PreStop::NoHook => r.stop(seen + grace, None),
                }
            }
            r.enforce(now);
        }
        !self.running()
    }

    /// Starts what is due: the next init container, else the main containers; stops a
    /// container whose liveness or startup probe failed.
    fn advance(&mut self, runtime: &Runtime, pod: &Pod, objects: &dyn Objects, now: Instant) {
        if !self.initialized {
            match self.init.iter().position(|c| !c.succeeded()) {
                Some(i) => {
                    if self.init[i].due(now) {
                        runtime.start(&self.info, &mut self.init[i], pod, objects, now);
                    }
                    return;
                }
                None => {
                    self.initialized = true;
                    for c in &mut self.main {
                        if let State::Waiting { reason, .. } = &mut c.state
                            && reason == "PodInitializing"
                        {
                            *reason = "ContainerCreating".into();
                        }
                    }
                }
            }
        }
        let pod_grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        for c in &mut self.main {
            if let State::Running(r) = &mut c.state {
                if r.stop.is_none()
                    && let Some(why) = r.prober.as_ref().and_then(|p| p.health().failed)
                {
                    let probe_grace = c
                        .spec
                        .liveness_probe
                        .as_ref()
                        .or(c.spec.startup_probe.as_ref())
                        .and_then(|p| p.termination_grace_period_seconds);
                    let grace = probe_grace.unwrap_or(pod_grace).max(0) as u64;
                    tracing::warn!(pod = %self.info.name, container = %c.spec.name, %why, "restarting the container");
                    r.stop(now + Duration::from_secs(grace), Some(why));
                }
                r.enforce(now);
            } else if c.due(now) {
                runtime.start(&self.info, c, pod, objects, now);
            }
        }
    }

    fn phase(&self) -> &'static str {
        let failed_init = self
            .init
            .iter()
            .any(|c| matches!(&c.state, State::Terminated(f) if f.exit_code != 0));
        if failed_init {
            return "Failed";
        }
        if !self.initialized {
            return "Pending";
        }
        let done: Vec<&Finished> = self
            .main
            .iter()
            .filter_map(|c| match &c.state {
                State::Terminated(f) => Some(f),
                _ => None,
            })
            .collect();
        if !self.main.is_empty() && done.len() == self.main.len() {
            return if done.iter().all(|f| f.exit_code == 0) {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        if self.main.iter().any(|c| c.runs > 0) {
            "Running"
        } else {
            "Pending"
        }
    }

    fn status(&mut self) -> serde_json::Value {
        let now = now_rfc3339();
        let ready = self.ready();
        let not_ready: Vec<&str> = self
            .main
            .iter()
            .filter(|c| !c.started_ready().1)
            .map(|c| c.spec.name.as_str())
            .collect();
        let uninitialized: Vec<&str> = self
            .init
            .iter()
            .filter(|c| !c.succeeded())
            .map(|c| c.spec.name.as_str())
            .collect();
        let wanted = [
            ("PodScheduled", true, None),
            (
                "Initialized",
                self.initialized,
                Some((
                    "ContainersNotInitialized",
                    format!("containers with incomplete status: {uninitialized:?}"),
                )),
            ),
            (
                "ContainersReady",
                ready,
                Some((
                    "ContainersNotReady",
                    format!("containers with unready status: {not_ready:?}"),
                )),
            ),
            (
                "Ready",
                ready,
                Some((
                    "ContainersNotReady",
                    format!("containers with unready status: {not_ready:?}"),
                )),
            ),
        ];
        let mut conditions = Vec::new();
        for (kind, value, why) in wanted {
            let entry = self
                .conditions
                .entry(kind)
                .or_insert_with(|| (value, now.clone()));
            if entry.0 != value {
                *entry = (value, now.clone());
            }
            let mut c = json!({
                "type": kind,
                "status": if value { "True" } else { "False" },
                "lastTransitionTime": entry.1,
            });
            if let (false, Some((reason, message))) = (value, why) {
                c["reason"] = json!(reason);
                c["message"] = json!(message);
            }
            conditions.push(c);
        }
        let ip = self.info.ip.to_string();
        let mut status = json!({
            "phase": self.phase(),
            "conditions": conditions,
            "hostIP": HOST_IP.to_string(),
            "hostIPs": [{"ip": HOST_IP.to_string()}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": self.info.start_time,
            "containerStatuses": self.main.iter().map(ContainerRun::status).collect::<Vec<_>>(),
        });
        if !self.init.is_empty() {
            status["initContainerStatuses"] = json!(
                self.init
                    .iter()
                    .map(ContainerRun::status)
                    .collect::<Vec<_>>()
            );
        }
        // The UID makes the write fail on a recreated pod of the same name.
        json!({"metadata": {"uid": self.info.uid}, "status": status})
    }
}

pub struct Config {
    pub images: Vec<sandbox::ImageFile>,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    pub restart_backoff: Duration,
    /// The state directory is ours (a temporary one): removed at exit.
    pub temporary: bool,
}

/// The process runtime's state.
pub struct Runtime {
    config: Config,
    spawner: Spawner,
    /// By pod UID.
    pods: Mutex<BTreeMap<String, PodRun>>,
    /// (namespace, pod) → the log directory of its latest instance and its first container
    /// (logs outlive pods).
    logs: Mutex<BTreeMap<(String, String), (PathBuf, String)>>,
    /// (namespace, pod) → the address its last instance had. A recreated pod gets it again:
    /// with no Services on this machine (no kube-proxy), a stable address is what lets a
    /// test's SQL clients reconnect to a restarted proxy or CN. (Kubernetes gives a new IP;
    /// the operator never relies on either.)
    addresses: Mutex<BTreeMap<(String, String), Ipv4Addr>>,
    /// Node → the image references a container has started from there. A kubelet reports
    /// the images it pulled in `status.images`; here an image is "pulled" onto a node by the
    /// first container that runs it (the operator's pre-pull pods do exactly that).
    pulled: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

/// The objects pods name, watched, and the tokens issued to them.
pub struct Sources {
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    claims: Store<PersistentVolumeClaim>,
    services: Store<Service>,
    tokens: Arc<super::Tokens>,
}

impl Objects for Sources {
    fn config_map(&self, ns: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.config_maps.get(&ObjectRef::new(name).within(ns))
    }
    fn secret(&self, ns: &str, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&ObjectRef::new(name).within(ns))
    }
    fn claim(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(&ObjectRef::new(name).within(ns))
    }
    fn token(&self, uid: &str, audience: &str) -> Option<String> {
        self.tokens.get(uid, audience)
    }
}

/// What one tick decided: status writes (with the pod UID), pods to remove, claims whose
/// protection finalizer goes (namespace, name, remaining finalizers, resourceVersion).
#[derive(Default)]
struct Outcome {
    writes: Vec<(String, String, serde_json::Value)>,
    written_uids: Vec<String>,
    removals: Vec<(String, String, String)>,
    claim_releases: Vec<(String, String, Vec<String>, String)>,
}

/// Temporary state directories of data planes that are gone.
fn remove_stale_state(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(pid) = name
            .strip_prefix("mo-kubelet-")
            .and_then(|p| p.parse::<u32>().ok())
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Runtime {
    pub fn new(args: &super::Args) -> Result<Runtime> {
        let (state_dir, temporary) = match &args.state_dir {
            Some(d) => (d.clone(), false),
            None => {
                let tmp = std::env::temp_dir();
                remove_stale_state(&tmp);
                (tmp.join(format!("mo-kubelet-{}", std::process::id())), true)
            }
        };
        let log_dir = args
            .log_dir
            .clone()
            .unwrap_or_else(|| state_dir.join("logs"));
        for dir in [
            state_dir.join("pods"),
            state_dir.join("pvcs"),
            log_dir.clone(),
        ] {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        for image in &args.images {
            if !image.host.exists() {
                tracing::warn!(image = %image.pattern, host = %image.host.display(), "image file missing: its containers will report ErrImagePull");
            }
        }
        tracing::info!(state = %state_dir.display(), logs = %log_dir.display(), images = args.images.len(), "process runtime");
        Ok(Runtime {
            config: Config {
                images: args.images.clone(),
                state_dir,
                log_dir,
                restart_backoff: args.restart_backoff,
                temporary,
            },
            spawner: Spawner::new().context("starting the spawner thread")?,
            pods: Mutex::new(BTreeMap::new()),
            addresses: Mutex::new(BTreeMap::new()),
            logs: Mutex::new(BTreeMap::new()),
            pulled: Mutex::new(BTreeMap::new()),
        })
    }

    fn claims_dir(&self) -> PathBuf {
        self.config.state_dir.join("pvcs")
    }

    /// A new pod on one of our nodes: its address, directories, hosts file and containers.
    fn admit(
        &self,
        plane: &DataPlane,
        pod: &Pod,
        node: &str,
        taken: &BTreeSet<Ipv4Addr>,
    ) -> Result<PodRun> {
        let uid = pod.uid().unwrap_or_default();
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let spec = pod.spec.clone().unwrap_or_default();
        let remembered = self
            .addresses
            .lock()
            .expect("addresses lock")
            .get(&(namespace.clone(), name.clone()))
            .copied()
            .filter(|ip| !taken.contains(ip));
        let ip = match remembered {
            Some(ip) => ip,
            None => loop {
                let ip = plane.next_pod_ip();
                if !taken.contains(&ip) {
                    break ip;
                }
            },
        };
        self.addresses
            .lock()
            .expect("addresses lock")
            .insert((namespace.clone(), name.clone()), ip);
        let dir = self.config.state_dir.join("pods").join(&uid);
        let logs = self
            .config
            .log_dir
            .join(format!("{namespace}_{name}_{uid}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(&logs)?;
        std::fs::write(dir.join("resolv.conf"), sandbox::resolv_conf(&namespace))?;
        let mut hostname: String = spec.hostname.clone().unwrap_or_else(|| name.clone());
        hostname.truncate(63);
        let info = PodInfo {
            uid,
            namespace: namespace.clone(),
            name: name.clone(),
            node: node.to_string(),
            hostname,
            subdomain: spec.subdomain.clone().filter(|s| !s.is_empty()),
            labels: pod.labels().clone(),
            ip,
            dir,
            logs: logs.clone(),
            start_time: now_rfc3339(),
            volumes: BTreeMap::new(),
            volume_files: BTreeMap::new(),
        };
        // The pod's own line at least, before any container starts.
        let hosts = sandbox::hosts_file(&info.address(), &[], &[]);
        std::fs::write(info.dir.join("hosts"), &hosts)?;
        let has_init = spec.init_containers.as_ref().is_some_and(|c| !c.is_empty());
        let init: Vec<ContainerRun> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| ContainerRun::new(c, true, "PodInitializing"))
            .collect();
        let main: Vec<ContainerRun> = spec
            .containers
            .iter()
            .map(|c| {
                ContainerRun::new(
                    c,
                    false,
                    if has_init {
                        "PodInitializing"
                    } else {
                        "ContainerCreating"
                    },
                )
            })
            .collect();
        let first = main
            .first()
            .map(|c| c.spec.name.clone())
            .unwrap_or_default();
        self.logs
            .lock()
            .expect("logs lock")
            .insert((namespace.clone(), name.clone()), (logs, first));
        tracing::info!(%namespace, pod = %name, %ip, node, "running a pod");
        Ok(PodRun {
            info,
            init,
            main,
            initialized: !has_init,
            deleting: None,
            deletion_grace: None,
            conditions: BTreeMap::new(),
            written: None,
            hosts,
        })
    }

    /// Starts a container, or says why it cannot start.
    fn start(
        &self,
        info: &PodInfo,
        c: &mut ContainerRun,
        pod: &Pod,
        objects: &dyn Objects,
        now: Instant,
    ) {
        match self.launch(info, c, pod, objects) {
            Ok(running) => {
                tracing::info!(pod = %info.name, namespace = %info.namespace, container = %c.spec.name, pid = running.pid, run = c.runs, "container started");
                c.runs += 1;
                c.not_before = None;
                c.state = State::Running(Box::new(running));
            }
            Err(e) => {
                let repeated =
                    matches!(&c.state, State::Waiting { message, .. } if *message == e.message);
                if !repeated {
                    tracing::warn!(pod = %info.name, namespace = %info.namespace, container = %c.spec.name, reason = e.reason, message = %e.message, "container cannot start");
                }
                c.state = State::Waiting {
                    reason: e.reason.into(),
                    message: e.message,
                };
                c.not_before = Some(now + START_RETRY);
            }
        }
    }

    fn launch(
        &self,
        info: &PodInfo,
        c: &mut ContainerRun,
        pod: &Pod,
        objects: &dyn Objects,
    ) -> Result<Running, ContainerError> {
        let image = c.spec.image.clone().unwrap_or_default();
        let files = sandbox::image_files(&self.config.images, &image)?;
        c.image_id = format!("file://{}", files[0].host.display());
        self.pulled
            .lock()
            .expect("pulled lock")
            .entry(info.node.clone())
            .or_default()
            .insert(image.clone());
        let ctx = info.context(pod);
        let env = sandbox::environment(&ctx, &c.spec, objects)?;
        let argv = sandbox::command_line(&c.spec, &env)?;
        let create = |message: String| ContainerError {
            reason: "CreateContainerError",
            message,
        };
        let mut binds: Vec<Bind> = files
            .iter()
            .map(|f| Bind {
                source: f.host.clone(),
                target: f.container.clone(),
                read_only: true,
            })
            .collect();
        for (file, target) in [("hosts", "/etc/hosts"), ("resolv.conf", "/etc/resolv.conf")] {
            binds.push(Bind {
                source: info.dir.join(file),
                target: target.into(),
                read_only: true,
            });
        }
        // Parents before children, whatever the order in the spec.
        let mut mounts: Vec<_> = c.spec.volume_mounts.iter().flatten().collect();
        mounts.sort_by_key(|m| Path::new(&m.mount_path).components().count());
        let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        for m in mounts {
            let (root, read_only) = match info.volumes.get(&m.name) {
                None => {
                    return Err(ContainerError {
                        reason: "CreateContainerConfigError",
                        message: format!("volume {:?} is not in the pod", m.name),
                    });
                }
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(v)) => v.clone(),
            };
            let sub = m
                .sub_path
                .clone()
                .filter(|s| !s.is_empty())
                .or_else(|| m.sub_path_expr.as_ref().map(|e| sandbox::expand(e, lookup)))
                .filter(|s| !s.is_empty());
            let source = match sub {
                None => root,
                Some(sub) => {
                    let path = root.join(sandbox::inside(&sub)?);
                    // As the kubelet: a missing subPath of a writable volume is created.
                    if !path.exists() && !read_only {
                        std::fs::create_dir_all(&path)
                            .map_err(|e| create(format!("subPath {sub}: {e}")))?;
                    }
                    path
                }
            };
            binds.push(Bind {
                source,
                target: m.mount_path.clone().into(),
                read_only: read_only || m.read_only == Some(true),
            });
        }
        let log_dir = info.logs.join(&c.spec.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| create(format!("log dir: {e}")))?;
        let log = log_dir.join(format!("{}.log", c.runs));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| create(format!("log {}: {e}", log.display())))?;
        let err = out.try_clone().map_err(|e| create(e.to_string()))?;
        let launch = Launch::Container {
            hostname: info.hostname.clone(),
            binds,
            process: Process {
                argv,
                env: env.clone(),
                working_dir: c.spec.working_dir.clone(),
            },
        };
        let mut command = exec::command(&launch).map_err(|e| create(e.to_string()))?;
        command.stdout(out).stderr(err);
        let child = self.spawner.spawn(command).map_err(|e| ContainerError {
            reason: "RunContainerError",
            message: e.to_string(),
        })?;
        let pid = child.id();
        let since = Instant::now();
        let prober = (!c.init).then(|| {
            let mut target = Target::for_container(&c.spec, info.ip, pid);
            target.env = env.clone();
            probe::start(&c.spec, target, tokio::time::Instant::from_std(since))
        });
        c.env = env;
        Ok(Running {
            child,
            pid,
            started_at: now_rfc3339(),
            since,
            log,
            prober,
            stop: None,
        })
    }

    /// How to start a container's preStop hook (None: a handler this runtime does not run).
    fn hook<'a>(
        &'a self,
        info: &PodInfo,
        spec: &Container,
        env: &[(String, String)],
        pid: u32,
        handler: &LifecycleHandler,
        grace: Duration,
    ) -> Option<StartHook<'a>> {
        let launch = if let Some(exec) = &handler.exec {
            Launch::Join {
                pid,
                process: Process {
                    argv: exec.command.clone().unwrap_or_default(),
                    env: env.to_vec(),
                    working_dir: spec.working_dir.clone(),
                },
            }
        } else if let Some(http) = &handler.http_get {
            let target = Target::for_container(spec, info.ip, pid);
            match target.http_address(http) {
                Ok(addr) => Launch::HttpGet {
                    addr,
                    host: addr.to_string(),
                    path: http.path.clone().unwrap_or_else(|| "/".into()),
                    headers: http
                        .http_headers
                        .iter()
                        .flatten()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect(),
                    timeout_ms: grace.as_millis() as u64,
                },
                Err(e) => return Some(Box::new(move || Err(std::io::Error::other(e)))),
            }
        } else if let Some(sleep) = &handler.sleep {
            Launch::Sleep {
                seconds: sleep.seconds.max(0) as u64,
            }
        } else {
            return None;
        };
        let log = info.logs.join(format!("{}.prestop.log", spec.name));
        Some(Box::new(move || {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)?;
            let mut command = exec::command(&launch)?;
            command.stdout(out.try_clone()?).stderr(out);
            self.spawner.spawn(command)
        }))
    }

    /// One pass over the pods: admit new ones, kill vanished ones, refresh hosts files and
    /// volumes, move every container's state machine on, and compute the status writes.
    fn step(
        &self,
        plane: &DataPlane,
        pods: &[Arc<Pod>],
        nodes: &BTreeSet<String>,
        sources: &Sources,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let now = Instant::now();
        let mut runs = self.pods.lock().expect("pods lock");
        let mut seen = BTreeSet::new();
        for pod in pods {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            if !nodes.contains(node) {
                continue;
            }
            let uid = pod.uid().unwrap_or_default();
            seen.insert(uid.clone());
            if runs.contains_key(&uid) {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                // Deleted before it ran: nothing to stop.
                outcome
                    .removals
                    .push((pod.namespace().unwrap_or_default(), pod.name_any(), uid));
                continue;
            }
            let taken: BTreeSet<Ipv4Addr> = runs.values().map(|r| r.info.ip).collect();
            match self.admit(plane, pod, node, &taken) {
                Ok(run) => {
                    runs.insert(uid, run);
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.name_any(), error = %e, "cannot prepare the pod")
                }
            }
        }
        let vanished: Vec<String> = runs
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in vanished {
            if let Some(mut run) = runs.remove(&uid) {
                tracing::info!(pod = %run.info.name, namespace = %run.info.namespace, "pod object gone: killing its processes");
                self.discard(plane, &mut run);
            }
        }
        refresh_hosts(&mut runs, &sources.services);
        let claims = self.claims_dir();
        for pod in pods {
            let uid = pod.uid().unwrap_or_default();
            let Some(run) = runs.get_mut(&uid) else {
                continue;
            };
            run.info.labels = pod.labels().clone();
            run.info.refresh_volumes(pod, sources, &claims);
            let deleting = pod.metadata.deletion_timestamp.is_some();
            run.reap(
                self.config.restart_backoff,
                restart_policy(pod),
                deleting,
                now,
            );
            if deleting {
                if run.terminate(plane, self, pod, now) {
                    outcome.removals.push((
                        run.info.namespace.clone(),
                        run.info.name.clone(),
                        uid.clone(),
                    ));
                }
            } else {
                run.advance(self, pod, sources, now);
            }
            let status = run.status();
            if run.written.as_ref() != Some(&status) {
                run.written = Some(status.clone());
                outcome
                    .writes
                    .push((run.info.namespace.clone(), run.info.name.clone(), status));
                outcome.written_uids.push(uid);
            }
        }
        drop(runs);
        outcome.claim_releases = self.release_claims(pods, &sources.claims);
        outcome
    }

    /// Kills what still runs and removes the pod's files (its logs stay).
    fn discard(&self, plane: &DataPlane, run: &mut PodRun) {
        run.kill_all();
        for key in run.hook_keys() {
            plane.forget_hook(&key);
        }
        if let Err(e) = std::fs::remove_dir_all(&run.info.dir) {
            tracing::debug!(dir = %run.info.dir.display(), error = %e, "pod directory not removed");
        }
    }

    /// After the pod object was removed.
    fn forget(&self, plane: &DataPlane, uid: &str) {
        let run = self.pods.lock().expect("pods lock").remove(uid);
        if let Some(mut run) = run {
            tracing::info!(pod = %run.info.name, namespace = %run.info.namespace, "pod removed");
            self.discard(plane, &mut run);
        }
    }

    fn unwritten(&self, uids: impl Iterator<Item = String>) {
        let mut runs = self.pods.lock().expect("pods lock");
        for uid in uids {
            if let Some(run) = runs.get_mut(&uid) {
                run.written = None;
            }
        }
    }

    /// Claims' directories outlive pods until the claim is deleted. With no PVC protection
    /// controller in the test control plane, this runtime also lets a deleted claim go
    /// (removes `kubernetes.io/pvc-protection`) once no pod it sees uses it.
    fn release_claims(
        &self,
        pods: &[Arc<Pod>],
        claims: &Store<PersistentVolumeClaim>,
    ) -> Vec<(String, String, Vec<String>, String)> {
        let used: BTreeSet<(String, String)> = pods
            .iter()
            .flat_map(|p| {
                let ns = p.namespace().unwrap_or_default();
                p.spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .filter_map(move |v| {
                        Some((
                            ns.clone(),
                            v.persistent_volume_claim.as_ref()?.claim_name.clone(),
                        ))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let root = self.claims_dir();
        for ns_dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let ns = ns_dir.file_name().to_string_lossy().to_string();
            for claim_dir in std::fs::read_dir(ns_dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = claim_dir.file_name().to_string_lossy().to_string();
                let gone = claims
                    .get(&ObjectRef::new(&name).within(&ns))
                    .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
                if gone && !used.contains(&(ns.clone(), name.clone())) {
                    tracing::info!(namespace = %ns, claim = %name, "claim deleted: its directory removed");
                    let _ = std::fs::remove_dir_all(claim_dir.path());
                }
            }
        }
        claims
            .state()
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_some())
            .filter(|c| c.finalizers().iter().any(|f| f == PVC_PROTECTION))
            .filter_map(|c| {
                let key = (c.namespace()?, c.name_any());
                if used.contains(&key) {
                    return None;
                }
                let rest = c
                    .finalizers()
                    .iter()
                    .filter(|f| *f != PVC_PROTECTION)
                    .cloned()
                    .collect();
                Some((key.0, key.1, rest, c.resource_version()?))
            })
            .collect()
    }

    /// SIGKILL to every container (the kubelet is going away).
    fn shutdown(&self, plane: &DataPlane) {
        let mut runs = self.pods.lock().expect("pods lock");
        for run in runs.values_mut() {
            self.discard(plane, run);
        }
        runs.clear();
        if self.config.temporary {
            let _ = std::fs::remove_dir_all(&self.config.state_dir);
        }
    }
}

/// Rewrites the pods' hosts files in place (bind mounts of the file see the change) when
/// pods or headless Services' members come and go.
fn refresh_hosts(runs: &mut BTreeMap<String, PodRun>, services: &Store<Service>) {
    let addresses: Vec<PodAddress> = runs.values().map(|r| r.info.address()).collect();
    let headless: Vec<ServiceAddresses> = services
        .state()
        .iter()
        .filter_map(|svc| {
            let spec = svc.spec.as_ref()?;
            if spec.cluster_ip.as_deref() != Some("None") {
                return None;
            }
            let selector = spec.selector.as_ref().filter(|s| !s.is_empty())?;
            let namespace = svc.namespace()?;
            let publish = spec.publish_not_ready_addresses == Some(true);
            let ips = runs
                .values()
                .filter(|r| r.info.namespace == namespace)
                .filter(|r| {
                    selector
                        .iter()
                        .all(|(k, v)| r.info.labels.get(k) == Some(v))
                })
                .filter(|r| publish || r.ready())
                .map(|r| r.info.ip)
                .collect();
            Some(ServiceAddresses {
                namespace,
                name: svc.name_any(),
                ips,
            })
        })
        .collect();
    for run in runs.values_mut() {
        let text = sandbox::hosts_file(&run.info.address(), &addresses, &headless);
        if text != run.hosts {
            match std::fs::write(run.info.dir.join("hosts"), &text) {
                Ok(()) => run.hosts = text,
                Err(e) => {
                    tracing::warn!(pod = %run.info.name, error = %e, "hosts file not written")
                }
            }
        }
    }
}

/// Runs the process runtime until SIGTERM or SIGINT, then kills every container.
pub async fn run(
    plane: &Arc<DataPlane>,
    client: &Client,
    pods: &Store<Pod>,
    nodes: &Store<Node>,
) -> Result<()> {
    let mut images_written = BTreeMap::new();
    let runtime = plane.processes.as_ref().expect("process runtime");
    // A parent that dies ends this kubelet like SIGTERM does: its containers go with it.
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).context("PR_SET_PDEATHSIG")?;
    let sources = Sources {
        config_maps: cache(Api::all(client.clone()), watcher::Config::default()),
        secrets: cache(Api::all(client.clone()), watcher::Config::default()),
        claims: cache(Api::all(client.clone()), watcher::Config::default()),
        services: cache(Api::all(client.clone()), watcher::Config::default()),
        tokens: plane.tokens.clone(),
    };
    sources.config_maps.wait_until_ready().await?;
    sources.secrets.wait_until_ready().await?;
    sources.claims.wait_until_ready().await?;
    sources.services.wait_until_ready().await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        }
    };
    tokio::pin!(shutdown);
    loop {
        let work = async {
            if let Err(e) = tick(plane, runtime, client, pods, nodes, &sources).await {
                tracing::warn!(error = %e, "process runtime tick failed");
            }
            let pulled = runtime.pulled.lock().expect("pulled lock").clone();
            super::write_node_images(client, pulled, &mut images_written).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::select! {
            why = &mut shutdown => {
                tracing::info!(signal = why, "stopping: killing every container");
                runtime.shutdown(plane);
                return Ok(());
            }
            () = work => {}
        }
    }
}

async fn tick(
    plane: &Arc<DataPlane>,
    runtime: &Runtime,
    client: &Client,
    pods: &Store<Pod>,
    nodes: &Store<Node>,
    sources: &Sources,
) -> Result<()> {
    let all = pods.state();
    let schedulable = super::fake_nodes(nodes, true);
    let ours: BTreeSet<String> = super::fake_nodes(nodes, false).into_iter().collect();
    let mut load = super::node_load(&all);
    let mut bindings = Vec::new();
    for pod in &all {
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if bound || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = super::pick_node(&schedulable, &mut load, |_| false) {
            bindings.push((pod.namespace().unwrap_or_default(), pod.name_any(), node));
        }
    }
    let ours_with_tokens: Vec<&Arc<Pod>> = all
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| ours.contains(n))
                && !super::token_sources(p).is_empty()
        })
        .collect();
    plane.tokens.issue(client, &ours_with_tokens).await;
    let outcome = runtime.step(plane, &all, &ours, sources);
    super::bind_pods(client, bindings).await;
    let failed = super::write_statuses(client, outcome.writes).await;
    runtime.unwritten(failed.into_iter().map(|i| outcome.written_uids[i].clone()));
    for (ns, name, uid) in outcome.removals {
        if super::finalize(client, &ns, &name, &uid).await {
            runtime.forget(plane, &uid);
        }
    }
    for (ns, name, finalizers, version) in outcome.claim_releases {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": version}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!(namespace = %ns, claim = %name, "released a deleted claim"),
            Err(e) => tracing::debug!(claim = %name, error = %e, "claim release failed (retried)"),
        }
    }
    Ok(())
}

/// A container as the test API shows it.
#[derive(serde::Serialize)]
struct ContainerReport {
    name: String,
    init: bool,
    /// The launcher's PID while it runs.
    pid: Option<u32>,
    restarts: u32,
    /// `waiting`, `running` or `terminated`.
    state: &'static str,
    reason: Option<String>,
    exit_code: Option<i32>,
    started_at: Option<String>,
    /// The current run's log file.
    log: Option<PathBuf>,
    started: bool,
    ready: bool,
}

#[derive(serde::Serialize)]
struct PodReport {
    uid: String,
    ip: Ipv4Addr,
    node: String,
    phase: &'static str,
    deleting: bool,
    containers: Vec<ContainerReport>,
}

type Shared = ApiState<Arc<DataPlane>>;

/// The test API of the process runtime.
pub fn routes() -> Router<Arc<DataPlane>> {
    Router::new()
        .route("/v1/namespaces/{ns}/pods/{name}", get(pod_handler))
        .route("/v1/namespaces/{ns}/pods/{name}/logs", get(logs_handler))
        .route("/v1/namespaces/{ns}/pods/{name}/kill", post(kill_handler))
}

/// The pod instance named so (the live one before one being deleted).
fn with_pod<T>(
    plane: &DataPlane,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut PodRun) -> T,
) -> Option<T> {
    let runtime = plane.processes.as_ref()?;
    let mut runs = runtime.pods.lock().expect("pods lock");
    let run = runs
        .values_mut()
        .filter(|r| r.info.namespace == ns && r.info.name == name)
        .min_by_key(|r| r.deleting.is_some())?;
    Some(f(run))
}

async fn pod_handler(
    ApiState(plane): Shared,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<Json<PodReport>, StatusCode> {
    with_pod(&plane, &ns, &name, |run| PodReport {
        uid: run.info.uid.clone(),
        ip: run.info.ip,
        node: run.info.node.clone(),
        phase: run.phase(),
        deleting: run.deleting.is_some(),
        containers: run.containers().map(ContainerRun::report).collect(),
    })
    .map(Json)
    .ok_or(StatusCode::NOT_FOUND)
}

#[derive(serde::Deserialize)]
struct LogQuery {
    container: Option<String>,
    #[serde(default)]
    previous: bool,
}

/// A container's log: the current (latest) run, or the one before with `previous=true`.
/// Logs outlive the pod (the latest instance of that name).
async fn logs_handler(
    ApiState(plane): Shared,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Query(query): Query<LogQuery>,
) -> Result<String, (StatusCode, String)> {
    let not_found = |m: String| (StatusCode::NOT_FOUND, m);
    let runtime = plane
        .processes
        .as_ref()
        .ok_or_else(|| not_found("no process runtime".into()))?;
    let (dir, first) = runtime
        .logs
        .lock()
        .expect("logs lock")
        .get(&(ns.clone(), name.clone()))
        .cloned()
        .ok_or_else(|| not_found(format!("no pod {ns}/{name} ran here")))?;
    let container = query.container.unwrap_or(first);
    let mut runs: Vec<(u32, PathBuf)> = std::fs::read_dir(dir.join(&container))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.strip_suffix(".log")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    runs.sort();
    let pick = if query.previous {
        runs.len().checked_sub(2)
    } else {
        runs.len().checked_sub(1)
    };
    let path = pick.map(|i| runs[i].1.clone()).ok_or_else(|| {
        not_found(format!(
            "no {}log of container {container}",
            if query.previous { "previous " } else { "" }
        ))
    })?;
    tokio::fs::read_to_string(&path)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

#[derive(serde::Deserialize)]
struct KillQuery {
    signal: Option<String>,
    container: Option<String>,
}

fn parse_signal(text: &str) -> Option<Signal> {
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse().ok()
}

/// Sends a signal to a running container (KILL: the whole container at once), as a crash
/// would: the runtime then restarts it by the pod's policy.
async fn kill_handler(
    ApiState(plane): Shared,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Query(query): Query<KillQuery>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let text = query.signal.unwrap_or_else(|| "KILL".into());
    let sig =
        parse_signal(&text).ok_or((StatusCode::BAD_REQUEST, format!("unknown signal {text:?}")))?;
    with_pod(&plane, &ns, &name, |run| {
        let c = match &query.container {
            Some(n) => run.init.iter().chain(run.main.iter()).find(|c| &c.spec.name == n),
            None => run.main.first(),
        }
        .ok_or((StatusCode::NOT_FOUND, "no such container".to_string()))?;
        let State::Running(r) = &c.state else {
            return Err((StatusCode::CONFLICT, format!("container {} is not running", c.spec.name)));
        };
        tracing::info!(pod = %name, container = %c.spec.name, signal = %sig, "killing a container on request");
        match sig {
            Signal::SIGKILL => kill_group(r.pid),
            // A stopped launcher cannot relay a stop: the whole container freezes or resumes.
            Signal::SIGSTOP | Signal::SIGCONT => signal_group(r.pid, sig),
            _ => signal(r.pid, sig),
        }
        Ok(Json(json!({"pid": r.pid, "signal": sig.as_str()})))
    })
    .ok_or((StatusCode::NOT_FOUND, format!("no pod {ns}/{name} runs here")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes() {
        let base = Duration::from_secs(10);
        assert_eq!(backoff(base, 0), Duration::from_secs(10));
        assert_eq!(backoff(base, 1), Duration::from_secs(20));
        assert_eq!(backoff(base, 4), Duration::from_secs(160));
        assert_eq!(backoff(base, 5), MAX_BACKOFF);
        assert_eq!(backoff(base, 1000), MAX_BACKOFF);
        assert_eq!(backoff(Duration::from_secs(1), 2), Duration::from_secs(4));
    }

    #[test]
    fn signals_parse_by_name_or_number() {
        assert_eq!(parse_signal("KILL"), Some(Signal::SIGKILL));
        assert_eq!(parse_signal("sigterm"), Some(Signal::SIGTERM));
        assert_eq!(parse_signal("15"), Some(Signal::SIGTERM));
        assert_eq!(parse_signal("NOPE"), None);
    }

    #[test]
    fn hooks_of_the_first_container_are_keyed_by_the_pod() {
        assert_eq!(hook_key("u", 0, "main"), "u");
        assert_eq!(hook_key("u", 1, "side"), "u/side");
    }

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    fn finished(code: i32) -> Finished {
        Finished {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" },
            message: None,
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:00:01Z".into(),
            container_id: "process://1".into(),
            ran: Duration::from_secs(1),
        }
    }

    fn pod_run(init: Vec<ContainerRun>, main: Vec<ContainerRun>) -> PodRun {
        PodRun {
            info: PodInfo {
                uid: "u".into(),
                namespace: "ns".into(),
                name: "p".into(),
                node: "node-1".into(),
                hostname: "p".into(),
                subdomain: None,
                labels: BTreeMap::new(),
                ip: Ipv4Addr::new(127, 16, 0, 1),
                dir: "/nonexistent".into(),
                logs: "/nonexistent".into(),
                start_time: "2026-01-01T00:00:00Z".into(),
                volumes: BTreeMap::new(),
                volume_files: BTreeMap::new(),
            },
            initialized: init.is_empty(),
            init,
            main,
            deleting: None,
            deletion_grace: None,
            conditions: BTreeMap::new(),
            written: None,
            hosts: String::new(),
        }
    }

    #[test]
    fn phase_and_status_follow_the_containers() {
        let spec = container(serde_json::json!({"name": "main", "image": "busybox:test"}));
        let init_spec = container(serde_json::json!({"name": "setup", "image": "busybox:test"}));
        let mut run = pod_run(
            vec![ContainerRun::new(&init_spec, true, "PodInitializing")],
            vec![ContainerRun::new(&spec, false, "PodInitializing")],
        );
        assert_eq!(run.phase(), "Pending");
        let status = run.status();
        assert_eq!(status["metadata"]["uid"], "u");
        assert_eq!(status["status"]["phase"], "Pending");
        assert_eq!(status["status"]["conditions"][1]["type"], "Initialized");
        assert_eq!(status["status"]["conditions"][1]["status"], "False");
        assert_eq!(
            status["status"]["initContainerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        // A failed init container under restartPolicy Never fails the pod.
        run.init[0].state = State::Terminated(finished(1));
        assert_eq!(run.phase(), "Failed");
        // Initialized, the main container crash-looping: Running, with the last exit.
        run.init[0].state = State::Terminated(finished(0));
        run.initialized = true;
        run.main[0].runs = 2;
        run.main[0].last = Some(finished(137));
        run.main[0].state = State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 20s".into(),
        };
        assert_eq!(run.phase(), "Running");
        let status = run.status();
        let c = &status["status"]["containerStatuses"][0];
        assert_eq!(c["restartCount"], 1);
        assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(c["lastState"]["terminated"]["exitCode"], 137);
        assert_eq!(c["containerID"], "process://1");
        assert_eq!(c["ready"], false);
        assert_eq!(status["status"]["conditions"][3]["status"], "False");
        assert_eq!(status["status"]["initContainerStatuses"][0]["ready"], true);
        // Done for good: Succeeded only when every container exited 0.
        run.main[0].state = State::Terminated(finished(0));
        assert_eq!(run.phase(), "Succeeded");
        run.main[0].state = State::Terminated(finished(2));
        assert_eq!(run.phase(), "Failed");
    }
}
