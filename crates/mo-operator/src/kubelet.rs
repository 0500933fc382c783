//! `mo-operator kubelet`: the simulated MatrixOne data plane attached to a real API server.
//!
//! It plays kubelet (and scheduler) for MatrixOne pods on fake Nodes: binds pending pods, runs
//! the simulated LOG/TN/CN/Proxy processes behind them ([`mo_sim::attached`]), honours graceful
//! deletion (the process shuts down in the model's order, then the object is removed), and
//! reports pod and node status. Each pod serves the kernel's RPC on its own loopback address
//! (its `podIP`, see [`kernel_rpc`]): HAKeeper on LOG pods, the lock allocator on the TN, the
//! query service on CNs. An HTTP API gives tests the model's report and fault switches.
//! Simulated time runs `--time-scale` times faster than the wall clock; durations crossing
//! to the operator are converted to wall-clock time, so it sees a consistent world.
//!
//! With `--runtime process` it runs the pods' containers as real processes instead
//! ([`process`]): the pod's command, environment, volumes, probes and hooks, each container in
//! its own namespaces ([`exec`], [`sandbox`], [`probe`]). Both runtimes share the fake nodes,
//! the scheduling and binding, the status writes, the preStop hooks and the final removal.

pub(crate) mod exec;
mod kernel_rpc;
mod probe;
mod process;
mod sandbox;

use anyhow::{Context as _, Result};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use mo_core::component::cn_uuid;
use mo_core::{Action, ActionError, ActionOutput, KernelView, Millis};
use mo_kube::cache::cache;
use mo_kube::crd::MatrixOneCluster;
use mo_kube::resources::{LABEL_CLUSTER, LABEL_MANAGED_BY, LABEL_PREPULL, MANAGED_BY};
use mo_sim::Scenario;
use mo_sim::attached::AttachedCluster;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What runs behind the pods.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// The simulated MatrixOne model (LOG, TN, CN and proxy processes in virtual time).
    Sim,
    /// The pods' containers as real processes on this machine.
    Process,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Fake nodes to create (`node-1` … `node-N`).
    #[arg(long, default_value_t = 6)]
    pub nodes: usize,
    /// Simulated seconds per wall-clock second.
    #[arg(long, default_value_t = 20.0)]
    pub time_scale: f64,
    /// Where the test API (model report, faults, lock-table owners) listens.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: String,
    /// DML clients per cluster.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Transactions per second per client.
    #[arg(long, default_value_t = 5.0)]
    pub txn_rate: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// What runs behind the pods: the simulated model, or real processes.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Sim)]
    pub runtime: RuntimeKind,
    /// Process runtime: `IMAGE=HOST_PATH:CONTAINER_PATH` (repeatable; IMAGE may end with `*`).
    /// Containers of that image get the host file bind-mounted read-only at the container
    /// path; a container whose image has no mapping is not run (`ErrImagePull`).
    #[arg(long = "image", value_name = "IMAGE=HOST_PATH:CONTAINER_PATH")]
    pub images: Vec<sandbox::ImageFile>,
    /// Process runtime: where containers' logs go (`<ns>_<pod>_<uid>/<container>/<n>.log`).
    /// Default: `logs` in the state directory.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Process runtime: pods' files and volumes, and the claims' directories
    /// (`pvcs/<ns>/<claim>`). Default: a temporary directory, removed at exit.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Process runtime: the first crash-loop back-off (doubling up to 5 minutes).
    #[arg(long, default_value = "10s", value_parser = crate::operate::duration)]
    pub restart_backoff: Duration,
}

type Key = (String, String);

/// CN groups (comma-separated) whose pods run as idle pool members: no client sessions.
pub const ANNOTATION_IDLE_GROUPS: &str = "sim.ops.matrixorigin.io/idle-cn-groups";
/// `table=cn-pod-short-name,…`: lock tables bound to that CN when first used; the workload's
/// DML then runs on exactly these tables.
pub const ANNOTATION_LOCK_TABLES: &str = "sim.ops.matrixorigin.io/lock-tables";

struct SimCluster {
    uid: String,
    image: String,
    model: AttachedCluster,
    /// Model time reached (ms) at `last_wall`.
    model_ms: f64,
    last_wall: Instant,
    /// Pods the spec asks for.
    expected: usize,
    /// Kubernetes owes this cluster a pod (deleted and not yet recreated and bound): model
    /// time then runs at wall-clock speed, so that the API server's and controllers' own
    /// latencies are not magnified by the time scale (a TN recreated in 2 s must not look
    /// like a minute-long outage to the simulated CNs).
    owed: bool,
    /// Kubernetes CN UUID → the model's, and back (names differ by the cluster prefix).
    uuid_to_model: BTreeMap<String, String>,
    uuid_to_kube: BTreeMap<String, String>,
    /// Last status written per pod UID (only changes are written).
    written: BTreeMap<String, serde_json::Value>,
    /// Pods known to the model, by UID → short name.
    bound: BTreeMap<String, String>,
    /// Each bound pod's address and kernel RPC server, by UID.
    servers: BTreeMap<String, kernel_rpc::PodServer>,
    /// When each pod's process last started (wall clock, as a kubelet reports `startedAt`),
    /// with the restart count it started under, by UID.
    started: BTreeMap<String, (u32, String)>,
    /// Pods this kubelet ended for good (evicted under node pressure), by UID, with the
    /// status that says so: phase `Failed`, never started again, finished at once when deleted.
    failed: BTreeMap<String, serde_json::Value>,
}

impl SimCluster {
    fn prefix(key: &Key) -> String {
        format!("{}-", key.1)
    }

    fn learn_cn(&mut self, key: &Key, short: &str) {
        let kube = cn_uuid(&format!("{}{short}", Self::prefix(key)));
        let model = cn_uuid(short);
        self.uuid_to_model.insert(kube.clone(), model.clone());
        self.uuid_to_kube.insert(model, kube);
    }
}

pub struct DataPlane {
    clusters: Mutex<BTreeMap<Key, SimCluster>>,
    args: Args,
    /// preStop hooks running or finished, by pod UID.
    hooks: Mutex<BTreeMap<String, HookRun>>,
    /// What each preStop hook did, by pod UID, kept after the pod is gone (the test API's
    /// evidence that a hook held its process).
    hook_records: Mutex<BTreeMap<String, HookRecord>>,
    /// HAKeeper's ticks count from here.
    started: Instant,
    /// The next pod address: 127.a.b.c, from a random /16 so that two data planes on one
    /// machine rarely meet (a taken address is skipped anyway).
    next_ip: std::sync::atomic::AtomicU32,
    /// The process runtime (`--runtime process`).
    processes: Option<process::Runtime>,
    /// Tokens projected into pods.
    tokens: Arc<Tokens>,
}

/// ServiceAccount tokens this kubelet projects into pods (the `serviceAccountToken` sources of
/// their projected volumes), issued by the API server's TokenRequest and bound to the pod, as a
/// kubelet does; renewed at 80 % of their life.
#[derive(Default)]
pub(crate) struct Tokens {
    /// (pod UID, audience) → the token and when to renew it.
    issued: Mutex<BTreeMap<(String, String), (String, Instant)>>,
}

/// A pod's projected token sources: (audience, lifetime in seconds).
fn token_sources(pod: &Pod) -> Vec<(String, i64)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| {
            (
                t.audience.clone().unwrap_or_default(),
                t.expiration_seconds.unwrap_or(3600),
            )
        })
        .collect()
}

impl Tokens {
    pub(crate) fn get(&self, uid: &str, audience: &str) -> Option<String> {
        self.issued
            .lock()
            .expect("tokens lock")
            .get(&(uid.to_string(), audience.to_string()))
            .map(|(token, _)| token.clone())
    }

    /// Issues (or renews) the tokens of `pods`; forgets those of pods gone.
    pub(crate) async fn issue(&self, client: &Client, pods: &[&Arc<Pod>]) {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::ServiceAccount;
        let live: BTreeSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        self.issued
            .lock()
            .expect("tokens lock")
            .retain(|(uid, _), _| live.contains(uid));
        for pod in pods {
            let (Some(uid), Some(ns)) = (pod.uid(), pod.namespace()) else {
                continue;
            };
            for (audience, lifetime) in token_sources(pod) {
                let key = (uid.clone(), audience.clone());
                let due = self
                    .issued
                    .lock()
                    .expect("tokens lock")
                    .get(&key)
                    .is_none_or(|(_, renew)| Instant::now() >= *renew);
                if !due {
                    continue;
                }
                let account = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_else(|| "default".into());
                let request = TokenRequest {
                    spec: Some(TokenRequestSpec {
                        audiences: Some(vec![audience.clone()]),
                        expiration_seconds: Some(lifetime),
                        bound_object_ref: Some(BoundObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Pod".into()),
                            name: Some(pod.name_any()),
                            uid: Some(uid.clone()),
                        }),
                        ..TokenRequestSpec::default()
                    }),
                    ..TokenRequest::default()
                };
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
                match api
                    .create_token_request(&account, &PostParams::default(), &request)
                    .await
                {
                    Ok(answer) => {
                        let token = answer.status.and_then(|s| s.token).unwrap_or_default();
                        let renew = Instant::now()
                            + Duration::from_secs((lifetime.max(60) as u64) * 8 / 10);
                        self.issued
                            .lock()
                            .expect("tokens lock")
                            .insert(key, (token, renew));
                    }
                    Err(e) => {
                        tracing::warn!(pod = %pod.name_any(), %account, error = %e, "cannot issue the pod's token (retried)")
                    }
                }
            }
        }
    }
}

struct HookRun {
    child: Option<std::process::Child>,
    started: Instant,
    /// Set once the hook returned (or was killed at the end of the grace period): the grace
    /// left for SIGTERM.
    remaining: Option<Duration>,
}

/// A preStop hook as the data plane ran it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HookRecord {
    pub pod: String,
    /// The hook is still running (the process it guards has not been sent SIGTERM).
    pub running: bool,
    /// How long the hook held the process so far (or in all, once it returned).
    pub held_ms: u64,
    /// The hook's exit code once it returned by itself.
    pub exit_code: Option<i32>,
    /// The grace period ran out while the hook still waited (the kubelet killed it).
    pub killed_at_grace_end: bool,
}

enum PreStop {
    NoHook,
    Running,
    Finished { remaining: Duration },
}

/// The preStop exec command of the pod's first container, with its environment resolved
/// (literal values and the downward API fields a kubelet fills in).
/// A hook's command line and environment.
type HookCommand = (Vec<String>, Vec<(String, String)>);

fn pre_stop_command(pod: &Pod) -> Option<HookCommand> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let command = container
        .lifecycle
        .as_ref()?
        .pre_stop
        .as_ref()?
        .exec
        .as_ref()?
        .command
        .clone()?;
    let env = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => match from.field_ref.as_ref()?.field_path.as_str() {
                    "metadata.name" => pod.metadata.name.clone()?,
                    "metadata.namespace" => pod.metadata.namespace.clone()?,
                    "metadata.uid" => pod.metadata.uid.clone()?,
                    _ => return None,
                },
                _ => return None,
            };
            Some((e.name.clone(), value))
        })
        .collect();
    Some((command, env))
}

/// Starts a preStop hook; called once, when the deletion is first seen.
pub(crate) type StartHook<'a> = Box<dyn FnOnce() -> std::io::Result<std::process::Child> + 'a>;

/// The simulated runtime's hook: the preStop exec command of the pod's first container, run
/// on this machine. Our own binary named in the hook is this executable (the image is
/// simulated, the hook is real).
fn sim_hook(plane: &DataPlane, pod: &Pod) -> Option<StartHook<'static>> {
    let (command, mut env) = pre_stop_command(pod)?;
    // The projected token, where the hook on this machine can read it.
    let uid = pod.uid().unwrap_or_default();
    let audience = token_sources(pod).into_iter().next().map(|(a, _)| a);
    if let Some(token) = audience.and_then(|a| plane.tokens.get(&uid, &a)) {
        let dir = std::env::temp_dir()
            .join(format!("mo-kubelet-tokens-{}", std::process::id()))
            .join(&uid);
        let file = dir.join("token");
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&file, token).is_ok() {
            env.retain(|(k, _)| k != mo_kube::hook_auth::ENV_TOKEN_FILE);
            env.push((
                mo_kube::hook_auth::ENV_TOKEN_FILE.to_string(),
                file.display().to_string(),
            ));
        }
    }
    // A hook installed by an init container exists only if the pod has that container
    // (this runtime runs no init containers; it checks the pod would have the binary).
    let installed = !command[0].starts_with(mo_kube::resources::HOOK_DIR)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.name == "install-drain-hook"));
    Some(Box::new(move || {
        if !installed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not installed in the pod", command[0]),
            ));
        }
        let program = if command[0].rsplit('/').next() == Some("mo-operator") {
            std::env::current_exe().unwrap_or_else(|_| command[0].clone().into())
        } else {
            command[0].clone().into()
        };
        tracing::info!(?command, "preStop hook command");
        let mut hook = std::process::Command::new(program);
        hook.args(&command[1..])
            .envs(env)
            .stdin(std::process::Stdio::null());
        // A hook never outlives the data plane (a leftover would keep waiting forever).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            hook.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        hook.spawn()
    }))
}

impl DataPlane {
    /// Runs (or follows) a preStop hook, as a kubelet does before SIGTERM. `uid` keys the
    /// hook: the pod's UID for its first container (`<uid>/<container>` for the others);
    /// `hook` starts it (None: the container has no hook). The grace period counts from the
    /// hook's start.
    fn pre_stop(
        &self,
        pod: &Pod,
        uid: &str,
        grace: Option<Duration>,
        hook: Option<StartHook<'_>>,
    ) -> PreStop {
        let Some(start) = hook else {
            return PreStop::NoHook;
        };
        let grace = grace.unwrap_or(Duration::from_secs(30));
        let mut hooks = self.hooks.lock().expect("hooks lock");
        let run = hooks.entry(uid.to_string()).or_insert_with(|| {
            let child = start();
            if let Err(e) = &child {
                tracing::warn!(pod = %pod.name_any(), error = %e, "preStop hook did not start");
            }
            tracing::info!(pod = %pod.name_any(), hook = %uid, "preStop hook started");
            HookRun {
                remaining: child.is_err().then_some(grace),
                child: child.ok(),
                started: Instant::now(),
            }
        });
        if let Some(remaining) = run.remaining {
            return PreStop::Finished { remaining };
        }
        let elapsed = run.started.elapsed();
        let mut record = HookRecord {
            pod: pod.name_any(),
            running: true,
            held_ms: elapsed.as_millis() as u64,
            exit_code: None,
            killed_at_grace_end: false,
        };
        let exit = match run.child.as_mut() {
            None => Some(None),
            Some(c) => match c.try_wait() {
                Ok(Some(status)) => Some(status.code()),
                Ok(None) => None,
                Err(_) => Some(None),
            },
        };
        let outcome = if let Some(code) = exit {
            let remaining = grace.saturating_sub(elapsed);
            tracing::info!(pod = %pod.name_any(), waited_ms = elapsed.as_millis() as u64, ?code, "preStop hook returned");
            run.remaining = Some(remaining);
            record.running = false;
            record.exit_code = code;
            PreStop::Finished { remaining }
        } else if elapsed >= grace {
            // The grace period is over: the kubelet kills the hook and gives 2 s more.
            if let Some(c) = run.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            tracing::warn!(pod = %pod.name_any(), "preStop hook outlived the grace period");
            run.remaining = Some(Duration::from_secs(2));
            record.running = false;
            record.killed_at_grace_end = true;
            PreStop::Finished {
                remaining: Duration::from_secs(2),
            }
        } else {
            PreStop::Running
        };
        drop(hooks);
        self.hook_records
            .lock()
            .expect("hook records lock")
            .insert(uid.to_string(), record);
        outcome
    }

    fn forget_hook(&self, uid: &str) {
        if let Some(mut run) = self.hooks.lock().expect("hooks lock").remove(uid)
            && let Some(c) = run.child.as_mut()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn next_pod_ip(&self) -> std::net::Ipv4Addr {
        loop {
            let n = self
                .next_ip
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let ip = std::net::Ipv4Addr::from(n);
            // Stay inside 127/8 and skip .0 and .255 host bytes.
            let [a, _, _, d] = ip.octets();
            if a == 127 && d != 0 && d != 255 {
                return ip;
            }
            if a != 127 {
                self.next_ip.store(
                    u32::from(std::net::Ipv4Addr::new(127, 16, 0, 1)),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
    }

    fn scale(&self) -> f64 {
        self.args.time_scale.max(0.001)
    }

    fn advance(&self, sim: &mut SimCluster) {
        let now = Instant::now();
        let rate = if sim.owed { 1.0 } else { self.scale() };
        sim.model_ms += now.duration_since(sim.last_wall).as_secs_f64() * rate * 1000.0;
        sim.last_wall = now;
        sim.model.advance_to(Millis(sim.model_ms as u64));
    }

    fn to_wall(&self, m: Millis) -> Millis {
        Millis((m.0 as f64 / self.scale()) as u64)
    }

    fn to_model(&self, m: Millis) -> Millis {
        Millis((m.0 as f64 * self.scale()) as u64)
    }

    fn scenario(&self, cluster: &MatrixOneCluster) -> Result<Scenario> {
        let spec = &cluster.spec;
        let groups: Vec<serde_json::Value> = spec
            .cn
            .groups
            .iter()
            .map(|g| json!({"name": g.name, "replicas": g.replicas}))
            .collect();
        // Test knobs of the simulated data plane (ignored by the operator): CN groups whose
        // pods are idle pool members (no sessions), and lock tables bound to a given CN.
        let annotation = |key: &str| {
            cluster
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let idle: Vec<String> = annotation(ANNOTATION_IDLE_GROUPS)
            .split(',')
            .map(|g| g.trim().to_string())
            .filter(|g| !g.is_empty())
            .collect();
        let groups: Vec<serde_json::Value> = groups
            .into_iter()
            .map(|mut g| {
                if idle.iter().any(|i| Some(i.as_str()) == g["name"].as_str()) {
                    g["pool"] = json!(true);
                    g["bound"] = json!(0);
                }
                g
            })
            .collect();
        let lock_tables: Vec<serde_json::Value> = annotation(ANNOTATION_LOCK_TABLES)
            .split(',')
            .filter_map(|pair| pair.trim().split_once('='))
            .map(|(table, owner)| json!({"table": table, "owner": owner}))
            .collect();
        let tables: Vec<serde_json::Value> = if lock_tables.is_empty() {
            vec![json!("t1"), json!("t2"), json!("t3")]
        } else {
            lock_tables.iter().map(|lt| lt["table"].clone()).collect()
        };
        let doc = json!({
            "name": cluster.name_any(),
            "seed": self.args.seed,
            "duration": "1000h",
            "policy": "safe",
            "topology": {
                "version": spec.version,
                "nodes": self.args.nodes,
                "log_replicas": spec.log.replicas,
                "tn_replicas": spec.tn.replicas,
                "cn_groups": groups,
                "proxy_replicas": spec.proxy.replicas,
            },
            "workload": {
                "clients": self.args.clients,
                "txn_rate": self.args.txn_rate,
                "tables": tables,
            },
            "lock_tables": lock_tables,
        });
        let yaml = serde_yaml_ng::to_string(&doc)?;
        Scenario::from_yaml(&yaml).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// The kernel's answers with names, UUIDs and durations as the operator knows them.
    fn kernel_view(&self, key: &Key, sim: &mut SimCluster) -> KernelView {
        self.advance(sim);
        let prefix = SimCluster::prefix(key);
        let mut view = sim.model.kernel_view();
        if let Ok(details) = view.hakeeper.as_mut() {
            for cn in &mut details.cns {
                cn.uuid = sim
                    .uuid_to_kube
                    .get(&cn.uuid)
                    .cloned()
                    .unwrap_or_else(|| cn.uuid.clone());
                cn.heartbeat_age = self.to_wall(cn.heartbeat_age);
            }
            for tn in &mut details.tns {
                tn.heartbeat_age = self.to_wall(tn.heartbeat_age);
            }
            for shard in &mut details.log_shards {
                shard.leader = shard.leader.as_ref().map(|l| format!("{prefix}{l}"));
                for r in &mut shard.replicas {
                    r.store = format!("{prefix}{}", r.store);
                }
            }
        }
        if let Ok(allocator) = view.lock_allocator.as_mut() {
            allocator.restarting = std::mem::take(&mut allocator.restarting)
                .into_iter()
                .map(|(u, a)| (sim.uuid_to_kube.get(&u).cloned().unwrap_or(u), a))
                .collect();
        }
        view.cn_activity = std::mem::take(&mut view.cn_activity)
            .into_iter()
            .map(|(k, v)| (format!("{prefix}{k}"), v))
            .collect();
        view.proxy_routes = std::mem::take(&mut view.proxy_routes)
            .into_iter()
            .map(|(k, v)| (format!("{prefix}{k}"), v))
            .collect();
        view.tn_wal_tolerance = view.tn_wal_tolerance.map(|t| self.to_wall(t));
        view
    }

    fn call(
        &self,
        key: &Key,
        sim: &mut SimCluster,
        action: Action,
    ) -> Result<ActionOutput, ActionError> {
        self.advance(sim);
        let prefix = SimCluster::prefix(key);
        let model_uuid = |u: &str| {
            sim.uuid_to_model
                .get(u)
                .cloned()
                .unwrap_or_else(|| u.to_string())
        };
        let action = match action {
            Action::SetCnWorkState { uuid, state } => Action::SetCnWorkState {
                uuid: model_uuid(&uuid),
                state,
            },
            Action::SetRestartService { uuid } => Action::SetRestartService {
                uuid: model_uuid(&uuid),
            },
            Action::DeleteCnStore { uuid } => Action::DeleteCnStore {
                uuid: model_uuid(&uuid),
            },
            Action::BeginDrain { uuid, start_epoch } => Action::BeginDrain {
                uuid: model_uuid(&uuid),
                start_epoch,
            },
            Action::TransferLogLeader { shard_id, to_store } => Action::TransferLogLeader {
                shard_id,
                to_store: to_store
                    .strip_prefix(&prefix)
                    .unwrap_or(&to_store)
                    .to_string(),
            },
            Action::SetTnWalTolerance { total } => Action::SetTnWalTolerance {
                total: total.map(|t| self.to_model(t)),
            },
            other => other,
        };
        sim.model.admin_call(&action)
    }
}

/// Runs the data plane until the process is stopped.
pub async fn run(args: Args) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG)")?;
    ensure_nodes(&client, args.nodes).await?;
    let processes = match args.runtime {
        RuntimeKind::Sim => None,
        RuntimeKind::Process => Some(process::Runtime::new(&args)?),
    };
    let plane = Arc::new(DataPlane {
        clusters: Mutex::new(BTreeMap::new()),
        args: args.clone(),
        hooks: Mutex::new(BTreeMap::new()),
        hook_records: Mutex::new(BTreeMap::new()),
        started: Instant::now(),
        next_ip: std::sync::atomic::AtomicU32::new(u32::from(std::net::Ipv4Addr::new(
            127,
            16 + (std::process::id() % 200) as u8,
            (Instant::now().elapsed().subsec_nanos() % 256) as u8,
            1,
        ))),
        processes,
        tokens: Arc::new(Tokens::default()),
    });
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %args.listen, runtime = ?args.runtime, time_scale = args.time_scale, "data plane serving its test API");
    let mut app = Router::new()
        .route(
            "/v1/namespaces/{ns}/clusters/{name}/report",
            get(report_handler),
        )
        .route(
            "/v1/namespaces/{ns}/clusters/{name}/faults",
            post(fault_handler),
        )
        .route(
            "/v1/namespaces/{ns}/clusters/{name}/lock-tables",
            get(lock_tables_handler),
        )
        .route("/v1/prestop/{uid}", get(prestop_handler))
        .route("/v1/namespaces/{ns}/pods/{pod}/fail", post(fail_handler));
    if plane.processes.is_some() {
        app = app.merge(process::routes());
    }
    let app = app.with_state(plane.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "test API stopped");
        }
    });

    let pods = cache(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")),
    );
    let nodes = cache(Api::<Node>::all(client.clone()), watcher::Config::default());
    pods.wait_until_ready().await?;
    nodes.wait_until_ready().await?;
    if plane.processes.is_some() {
        return process::run(&plane, &client, &pods, &nodes).await;
    }
    let clusters = cache(
        Api::<MatrixOneCluster>::all(client.clone()),
        watcher::Config::default(),
    );
    clusters.wait_until_ready().await?;
    let mut images_written: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    loop {
        if let Err(e) = tick(
            &plane,
            &client,
            &clusters,
            &pods,
            &nodes,
            &mut images_written,
        )
        .await
        {
            tracing::warn!(error = %e, "data plane tick failed");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ensure_nodes(client: &Client, count: usize) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for i in 1..=count {
        let name = format!("node-{i}");
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    (
                        "ops.matrixorigin.io/simulated".to_string(),
                        "true".to_string(),
                    ),
                    ("kubernetes.io/hostname".to_string(), name.clone()),
                ])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context("creating a fake node"),
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "simulated kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
            "addresses": [{"type": "InternalIP", "address": format!("10.0.0.{i}")}],
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .context("marking a fake node Ready")?;
    }
    Ok(())
}

fn expected_pods(cluster: &MatrixOneCluster) -> usize {
    let spec = &cluster.spec;
    let cns: i32 = spec.cn.groups.iter().map(|g| g.replicas).sum();
    (spec.log.replicas + spec.tn.replicas + spec.proxy.replicas + cns).max(0) as usize
}

fn short_name<'a>(key: &Key, pod: &'a str) -> Option<&'a str> {
    pod.strip_prefix(&SimCluster::prefix(key))
}

#[allow(clippy::too_many_arguments)]
async fn tick(
    plane: &Arc<DataPlane>,
    client: &Client,
    clusters: &Store<MatrixOneCluster>,
    pods: &Store<Pod>,
    nodes: &Store<Node>,
    images_written: &mut BTreeMap<String, BTreeSet<String>>,
) -> Result<()> {
    // Clusters appear and go.
    let live: BTreeMap<Key, Arc<MatrixOneCluster>> = clusters
        .state()
        .into_iter()
        .filter_map(|c| Some(((c.namespace()?, c.name_any()), c)))
        .collect();
    let all_pods = pods.state();
    let with_pods: BTreeSet<Key> = all_pods
        .iter()
        .filter_map(|p| {
            let cluster = p.metadata.labels.as_ref()?.get(LABEL_CLUSTER)?.clone();
            Some((p.namespace()?, cluster))
        })
        .collect();
    {
        let mut sims = plane.clusters.lock().expect("clusters lock");
        // A deleted cluster's processes run until the garbage collector's deletions finish.
        sims.retain(|key, sim| {
            live.get(key).and_then(|c| c.uid()).as_deref() == Some(sim.uid.as_str())
                || with_pods.contains(key)
        });
        for (key, cluster) in &live {
            if sims.contains_key(key) {
                continue;
            }
            let scenario = plane.scenario(cluster)?;
            let mut sim = SimCluster {
                uid: cluster.uid().unwrap_or_default(),
                image: cluster.spec.image.clone(),
                model: AttachedCluster::new(scenario.clone()),
                model_ms: 0.0,
                last_wall: Instant::now(),
                expected: expected_pods(cluster),
                owed: true,
                uuid_to_model: BTreeMap::new(),
                uuid_to_kube: BTreeMap::new(),
                written: BTreeMap::new(),
                bound: BTreeMap::new(),
                servers: BTreeMap::new(),
                started: BTreeMap::new(),
                failed: BTreeMap::new(),
            };
            for short in scenario.cn_pod_names() {
                sim.learn_cn(key, &short);
            }
            tracing::info!(namespace = %key.0, cluster = %key.1, "attached a simulated cluster");
            sims.insert(key.clone(), sim);
        }
    }
    let with_tokens: Vec<&Arc<Pod>> = all_pods
        .iter()
        .filter(|p| !token_sources(p).is_empty())
        .collect();
    plane.tokens.issue(client, &with_tokens).await;
    let schedulable = fake_nodes(nodes, true);
    let mut load = node_load(&all_pods);
    let mut writes: Vec<(String, String, serde_json::Value)> = Vec::new();
    let mut removals: Vec<(String, String, String)> = Vec::new();
    let mut bindings: Vec<(String, String, String)> = Vec::new();
    {
        let mut sims = plane.clusters.lock().expect("clusters lock");
        for (key, sim) in sims.iter_mut() {
            plane.advance(sim);
            let mine: Vec<&Arc<Pod>> = all_pods
                .iter()
                .filter(|p| p.namespace().as_deref() == Some(key.0.as_str()))
                .filter(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_CLUSTER))
                        == Some(&key.1)
                })
                .collect();
            let mut seen: BTreeSet<String> = BTreeSet::new();
            for pod in &mine {
                let uid = pod.uid().unwrap_or_default();
                seen.insert(uid.clone());
                let name = pod.name_any();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let is_prepull = pod
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_PREPULL));
                if is_prepull {
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                    if phase.as_deref() == Some("Succeeded") {
                        continue;
                    }
                    let version = mo_kube::observation::spec_version(pod);
                    let Some(node) = node else { continue };
                    let _ = sim.model.admin_call(&Action::PrePullImage {
                        node: node.clone(),
                        version: version.clone(),
                    });
                    let present = sim
                        .model
                        .node_images()
                        .get(&node)
                        .is_some_and(|v| v.contains(&version));
                    if present {
                        writes.push((
                            key.0.clone(),
                            name,
                            json!({"status": {"phase": "Succeeded"}}),
                        ));
                    }
                    continue;
                }
                let Some(short) = short_name(key, &name).map(str::to_string) else {
                    continue;
                };
                let Some(node) = node else {
                    if pod.metadata.deletion_timestamp.is_none() && !schedulable.is_empty() {
                        // As the scheduler scores: a node that has the image (image
                        // locality), then the fewest pods (spread), then by name.
                        let version = mo_kube::observation::spec_version(pod);
                        let images = sim.model.node_images();
                        let target = pick_node(&schedulable, &mut load, |n| {
                            images.get(n).is_some_and(|v| v.contains(&version))
                        });
                        if let Some(target) = target {
                            bindings.push((key.0.clone(), name, target));
                        }
                    }
                    continue;
                };
                if !sim.bound.contains_key(&uid) {
                    match sim.model.pod_bound(
                        &short,
                        &uid,
                        &node,
                        &mo_kube::observation::spec_version(pod),
                    ) {
                        Ok(()) => {
                            sim.bound.insert(uid.clone(), short.clone());
                            let role = pod
                                .metadata
                                .labels
                                .as_ref()
                                .and_then(|l| l.get(mo_kube::resources::LABEL_COMPONENT))
                                .and_then(|c| kernel_rpc::Role::of(c));
                            if role == Some(kernel_rpc::Role::Cn) {
                                sim.learn_cn(key, &short);
                            }
                            if let Some(role) = role {
                                match kernel_rpc::start(plane, key, &uid, &name, role) {
                                    Ok(server) => {
                                        sim.servers.insert(uid.clone(), server);
                                    }
                                    Err(e) => {
                                        tracing::warn!(pod = %name, error = %e, "no kernel RPC for this pod")
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pod = %name, error = %e, "cannot run this pod");
                            continue;
                        }
                    }
                }
                if let Some(serving) = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(mo_kube::resources::LABEL_SERVING))
                {
                    // The SQL Service's endpoints follow the label: the model's clients too.
                    sim.model.set_proxy_serving(&short, &uid, serving == "true");
                }
                if let Some(status) = sim.failed.get(&uid) {
                    // Nothing runs: no hook, no grace; a deletion finishes at once.
                    if pod.metadata.deletion_timestamp.is_some() {
                        sim.model.pod_deleting(&short, &uid, Some(Millis::ZERO));
                        removals.push((key.0.clone(), name, uid.clone()));
                    } else if sim.written.get(&uid) != Some(status) {
                        sim.written.insert(uid.clone(), status.clone());
                        writes.push((key.0.clone(), name, json!({"status": status})));
                    }
                    continue;
                }
                if pod.metadata.deletion_timestamp.is_some() {
                    // The pod's grace period runs in wall-clock time: scaled into the model.
                    let grace = pod
                        .metadata
                        .deletion_grace_period_seconds
                        .map(|s| Duration::from_secs(s.max(0) as u64));
                    // As the kubelet does: the preStop hook first, SIGTERM once it returned,
                    // with what is left of the grace period.
                    match plane.pre_stop(pod, &uid, grace, sim_hook(plane, pod)) {
                        PreStop::Running => {}
                        PreStop::Finished { remaining } => sim.model.pod_deleting(
                            &short,
                            &uid,
                            Some(plane.to_model(Millis(remaining.as_millis() as u64))),
                        ),
                        PreStop::NoHook => sim.model.pod_deleting(
                            &short,
                            &uid,
                            grace.map(|g| plane.to_model(Millis(g.as_millis() as u64))),
                        ),
                    }
                }
            }
            // Objects gone without us finishing them: force-deleted.
            let vanished: Vec<(String, String)> = sim
                .bound
                .iter()
                .filter(|(uid, _)| !seen.contains(*uid))
                .map(|(u, s)| (u.clone(), s.clone()))
                .collect();
            for (uid, short) in vanished {
                plane.forget_hook(&uid);
                sim.model.pod_vanished(&short, &uid);
                sim.bound.remove(&uid);
                sim.servers.remove(&uid);
                sim.started.remove(&uid);
                sim.written.remove(&uid);
            }
            plane.advance(sim);
            if let Some(c) = live.get(key) {
                sim.expected = expected_pods(c);
            }
            let present = sim
                .model
                .pod_reports()
                .iter()
                .filter(|r| {
                    sim.bound.contains_key(&r.uid)
                        && !r.terminated
                        && !sim.failed.contains_key(&r.uid)
                })
                .count();
            sim.owed = present < sim.expected;
            let image = sim.image.clone();
            for report in sim.model.pod_reports() {
                if !sim.bound.contains_key(&report.uid) || sim.failed.contains_key(&report.uid) {
                    continue;
                }
                let name = format!("{}{}", SimCluster::prefix(key), report.name);
                if report.terminated {
                    removals.push((key.0.clone(), name, report.uid.clone()));
                    continue;
                }
                let ip = sim.servers.get(&report.uid).map(|s| s.ip);
                let started_at = if report.running {
                    let entry = sim
                        .started
                        .entry(report.uid.clone())
                        .or_insert_with(|| (report.restarts, now_rfc3339()));
                    if entry.0 != report.restarts {
                        *entry = (report.restarts, now_rfc3339());
                    }
                    Some(entry.1.clone())
                } else {
                    sim.started.remove(&report.uid);
                    None
                };
                let status = pod_status(&report, &image, ip, started_at.as_deref());
                if sim.written.get(&report.uid) != Some(&status) {
                    sim.written.insert(report.uid.clone(), status.clone());
                    writes.push((key.0.clone(), name, json!({"status": status})));
                }
            }
        }
    }
    bind_pods(client, bindings).await;
    write_statuses(client, writes).await;
    for (ns, name, uid) in removals {
        if finalize(client, &ns, &name, &uid).await {
            let mut sims = plane.clusters.lock().expect("clusters lock");
            for (k, sim) in sims.iter_mut() {
                if k.0 == ns
                    && let Some(short) = sim.bound.remove(&uid)
                {
                    plane.forget_hook(&uid);
                    sim.model.pod_removed(&short, &uid);
                    sim.written.remove(&uid);
                    sim.servers.remove(&uid);
                    sim.started.remove(&uid);
                    sim.failed.remove(&uid);
                }
            }
        }
    }
    // Node images: what the simulated nodes hold, as image references.
    let mut images: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    {
        let sims = plane.clusters.lock().expect("clusters lock");
        for sim in sims.values() {
            for (node, versions) in sim.model.node_images() {
                let entry = images.entry(node).or_default();
                for v in versions {
                    entry.insert(format!("{}:{v}", sim.image));
                }
            }
        }
    }
    write_node_images(client, images, images_written).await;
    Ok(())
}

/// Writes each node's `status.images` where it changed since the last write (a failed write
/// is tried again next time).
async fn write_node_images(
    client: &Client,
    images: BTreeMap<String, BTreeSet<String>>,
    written: &mut BTreeMap<String, BTreeSet<String>>,
) {
    for (node, refs) in images {
        if written.get(&node) == Some(&refs) {
            continue;
        }
        let api: Api<Node> = Api::all(client.clone());
        let list: Vec<serde_json::Value> = refs
            .iter()
            .map(|r| json!({"names": [r], "sizeBytes": 500_000_000}))
            .collect();
        if api
            .patch_status(
                &node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"images": list}})),
            )
            .await
            .is_ok()
        {
            written.insert(node, refs);
        }
    }
}

/// The fake nodes (sorted by name); only the schedulable ones with `schedulable`.
fn fake_nodes(nodes: &Store<Node>, schedulable: bool) -> Vec<String> {
    let mut v: Vec<String> = nodes
        .state()
        .iter()
        .filter(|n| !schedulable || n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true))
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("ops.matrixorigin.io/simulated"))
        })
        .map(|n| n.name_any())
        .collect();
    v.sort();
    v
}

/// Pods bound to each node.
fn node_load(pods: &[Arc<Pod>]) -> BTreeMap<String, usize> {
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *load.entry(node).or_default() += 1;
        }
    }
    load
}

/// The node for one more pod, as the scheduler scores: a `preferred` node (e.g. one holding
/// the image), then the fewest pods (spread), then by name. The choice counts in `load`.
fn pick_node(
    schedulable: &[String],
    load: &mut BTreeMap<String, usize>,
    preferred: impl Fn(&str) -> bool,
) -> Option<String> {
    let target = schedulable
        .iter()
        .min_by_key(|n| {
            (
                !preferred(n),
                load.get(*n).copied().unwrap_or(0),
                (*n).clone(),
            )
        })?
        .clone();
    *load.entry(target.clone()).or_default() += 1;
    Some(target)
}

/// Binds pods to nodes (namespace, pod, node); a failure is retried on the next tick.
async fn bind_pods(client: &Client, bindings: Vec<(String, String, String)>) {
    for (ns, name, node) in bindings {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                kind: Some("Node".into()),
                name: Some(node),
                api_version: Some("v1".into()),
                ..ObjectReference::default()
            },
        };
        if let Err(e) = api
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            tracing::debug!(pod = %name, error = %e, "binding failed (retried)");
        }
    }
}

/// Writes pod statuses (namespace, pod, merge patch); returns the indices that failed.
async fn write_statuses(
    client: &Client,
    writes: Vec<(String, String, serde_json::Value)>,
) -> Vec<usize> {
    let mut failed = Vec::new();
    for (i, (ns, name, status)) in writes.into_iter().enumerate() {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            tracing::debug!(pod = %name, error = %e, "status write failed (retried)");
            failed.push(i);
        }
    }
    failed
}

/// The kubelet's own finalization once the containers have exited: deletes the pod
/// instance `uid` at once. True when it is gone (or was already).
async fn finalize(client: &Client, ns: &str, name: &str, uid: &str) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) | Err(kube::Error::Api(_)) => true,
        Err(e) => {
            tracing::debug!(pod = %name, error = %e, "finalizing failed (retried)");
            false
        }
    }
}

/// Now as a kubelet writes times (RFC 3339, whole seconds).
fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

fn pod_status(
    report: &mo_sim::attached::PodReport,
    image: &str,
    ip: Option<std::net::Ipv4Addr>,
    started_at: Option<&str>,
) -> serde_json::Value {
    let ready = if report.ready { "True" } else { "False" };
    let state = if report.running {
        json!({"running": {"startedAt": started_at}})
    } else {
        json!({"waiting": {"reason": if report.started { "CrashLoopBackOff" } else { "ContainerCreating" }}})
    };
    let ip = ip.map(|ip| ip.to_string());
    json!({
        "phase": if report.started { "Running" } else { "Pending" },
        "podIP": ip,
        "podIPs": ip.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": ready},
            {"type": "ContainersReady", "status": ready},
        ],
        "containerStatuses": [{
            "name": "main",
            "image": format!("{image}:{}", report.version),
            "imageID": "",
            "ready": report.ready,
            "started": report.running,
            "restartCount": report.restarts,
            "state": state,
        }],
    })
}

type Shared = State<Arc<DataPlane>>;

fn with_cluster<T>(
    plane: &DataPlane,
    ns: String,
    name: String,
    f: impl FnOnce(&Key, &mut SimCluster) -> T,
) -> Option<T> {
    let key = (ns, name);
    let mut sims = plane.clusters.lock().expect("clusters lock");
    sims.get_mut(&key).map(|sim| f(&key, sim))
}

async fn report_handler(
    State(plane): Shared,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<mo_sim::Report>, StatusCode> {
    with_cluster(&plane, ns, name, |_, sim| {
        plane.advance(sim);
        sim.model.report()
    })
    .map(Json)
    .ok_or(StatusCode::NOT_FOUND)
}

#[derive(serde::Deserialize)]
struct Faults {
    #[serde(default)]
    cn_never_heartbeats_after_restart: bool,
    /// The lock allocator never confirms a hand-over (the kernel never says "can restart").
    #[serde(default)]
    handover_never_confirms: bool,
}

async fn fault_handler(
    State(plane): Shared,
    Path((ns, name)): Path<(String, String)>,
    Json(faults): Json<Faults>,
) -> StatusCode {
    with_cluster(&plane, ns, name, |_, sim| {
        plane.advance(sim);
        sim.model
            .set_cn_never_heartbeats(faults.cn_never_heartbeats_after_restart);
        sim.model
            .set_handover_never_confirms(faults.handover_never_confirms);
    })
    .map_or(StatusCode::NOT_FOUND, |_| StatusCode::NO_CONTENT)
}

/// The kubelet ends pod `pod` for good, as it does under node pressure: the container is
/// killed, never started again, and the pod's phase is `Failed` (reason `Evicted`). The object
/// stays until someone deletes it.
async fn fail_handler(
    State(plane): Shared,
    Path((ns, pod)): Path<(String, String)>,
) -> Result<StatusCode, (StatusCode, String)> {
    let status = json!({
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
            {"type": "ContainersReady", "status": "False"},
        ],
        "containerStatuses": [{
            "name": "main", "image": "", "imageID": "", "ready": false, "started": false,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now_rfc3339()}},
        }],
    });
    let mut sims = plane.clusters.lock().expect("clusters lock");
    let failed = sims
        .iter_mut()
        .filter(|(key, _)| key.0 == ns)
        .find_map(|(key, sim)| {
            let short = pod.strip_prefix(&SimCluster::prefix(key))?;
            let uid = sim
                .bound
                .iter()
                .find(|(u, s)| s.as_str() == short && !sim.failed.contains_key(*u))
                .map(|(u, _)| u.clone())?;
            plane.advance(sim);
            sim.model.pod_failed(short, &uid);
            // The next tick writes the status; the pod's address stops answering now.
            sim.failed.insert(uid.clone(), status.clone());
            sim.servers.remove(&uid);
            sim.started.remove(&uid);
            Some(uid)
        });
    match failed {
        Some(uid) => {
            tracing::info!(namespace = %ns, %pod, %uid, "evicted by the kubelet (Failed)");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err((StatusCode::NOT_FOUND, format!("no running pod {ns}/{pod}"))),
    }
}

/// What the preStop hook of the pod instance `uid` did (404: it never ran).
async fn prestop_handler(
    State(plane): Shared,
    Path(uid): Path<String>,
) -> Result<Json<HookRecord>, StatusCode> {
    plane
        .hook_records
        .lock()
        .expect("hook records lock")
        .get(&uid)
        .cloned()
        .map(Json)
        .ok_or(StatusCode::NOT_FOUND)
}

/// Which pod's lock service owns each bound lock table now.
async fn lock_tables_handler(
    State(plane): Shared,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Json<BTreeMap<String, String>>, StatusCode> {
    with_cluster(&plane, ns, name, |key, sim| {
        plane.advance(sim);
        sim.model
            .lock_table_owners()
            .into_iter()
            .map(|(table, pod)| (table, format!("{}{pod}", SimCluster::prefix(key))))
            .collect()
    })
    .map(Json)
    .ok_or(StatusCode::NOT_FOUND)
}
