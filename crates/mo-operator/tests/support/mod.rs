//! End-to-end harness: the real control plane (mo-testenv), the CRD, one simulated data plane
//! for the whole test binary, and per-test namespaces with their own operator processes.

#![allow(dead_code)]

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use mo_kube::crd::MatrixOneCluster;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_mo-operator");
/// Simulated seconds per wall-clock second in the data plane (it runs at wall-clock speed
/// while Kubernetes owes a cluster a pod).
pub const TIME_SCALE: &str = "30";

pub struct Shared {
    pub plane: &'static mo_testenv::ControlPlane,
    pub admin: String,
}

fn log_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir
}

/// Which data plane plays kubelet for a test binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPlane {
    /// `mo-operator kubelet`: the simulated MatrixOne behind every pod.
    Simulated,
    /// `mo-operator kubelet --runtime process`: every pod's containers run as processes, the
    /// MatrixOne image mapped to the kernel's own `mo-service` built by
    /// `tools/matrixone/build.sh` (one per version the tests use).
    RealKernel,
}

static KIND: OnceLock<DataPlane> = OnceLock::new();

/// Chooses the data plane of this test binary (before its first `TestNs`); the simulated one
/// when never called.
pub fn use_data_plane(kind: DataPlane) {
    let chosen = *KIND.get_or_init(|| kind);
    assert_eq!(chosen, kind, "one data plane per test binary");
}

/// Where the real-kernel data plane keeps claims, host paths and container logs. The first
/// call removes what earlier test runs left (a cluster's state is gigabytes, and CI keeps its
/// target directory between runs); a run still alive keeps its own.
pub fn real_plane_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-plane");
        std::fs::create_dir_all(&dir).expect("real plane dir");
        // An ended run's kubelet state (`run-<pid>`) and its clusters' shared storage
        // (`shared-<ns>-<pid>`). Its containers had their mounts in private mount namespaces
        // that ended with them, so removing an entry reaches nothing outside it.
        mo_testenv::remove_stale_runs(&dir, &["run-", "shared-"]);
        dir
    })
    .clone()
}

fn kubelet_args(kind: DataPlane) -> Vec<String> {
    match kind {
        DataPlane::Simulated => vec![
            "--time-scale".into(),
            TIME_SCALE.into(),
            // Enough nodes that every pod of the parallel tests gets its own (spread).
            "--nodes".into(),
            "48".into(),
        ],
        DataPlane::RealKernel => {
            let mut args: Vec<String> = [
                "--runtime",
                "process",
                "--nodes",
                "12",
                "--restart-backoff",
                "2s",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let state = real_plane_dir().join(format!("run-{}", std::process::id()));
            args.push("--state-dir".into());
            args.push(state.display().to_string());
            for (version, bin) in mo_testenv::matrixone_kernels().expect("the kernel (needs Go)") {
                args.push("--image".into());
                args.push(format!(
                    "matrixorigin/matrixone:{version}={}:/mo-service",
                    bin.display()
                ));
            }
            // The CN pods' init container installs the drain hook from the operator's image.
            args.push("--image".into());
            args.push(format!("mo-operator:*={BIN}:/usr/local/bin/mo-operator"));
            args
        }
    }
}

/// The control plane, the CRD and the data plane, once per test binary.
pub fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let kind = *KIND.get_or_init(|| DataPlane::Simulated);
        let plane = mo_testenv::shared().expect("test control plane");
        let kubeconfig = plane.kubeconfig().to_path_buf();
        let crd = Command::new(BIN)
            .arg("crds")
            .output()
            .expect("mo-operator crds");
        assert!(
            crd.status.success(),
            "crds: {}",
            String::from_utf8_lossy(&crd.stderr)
        );
        let crd_file = log_dir().join("crd.yaml");
        std::fs::write(&crd_file, &crd.stdout).expect("write crd");
        let kubectl = |args: &[&str]| {
            Command::new(plane.kubectl())
                .args(args)
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .expect("kubectl runs")
        };
        let out = kubectl(&[
            "apply",
            "--server-side",
            "-f",
            crd_file.to_str().expect("utf-8"),
        ]);
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `kubectl wait` fails at once while the new CRD has no status yet ("accessor error:
        // <nil>"): asked again until Established, within a minute.
        let start = Instant::now();
        loop {
            let out = kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=10s",
                "crd/matrixoneclusters.ops.matrixorigin.io",
            ]);
            if out.status.success() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the CRD is not Established: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let port = mo_testenv::free_port().expect("port");
        let mut command = Command::new(BIN);
        command
            .args(["kubelet", "--listen", &format!("127.0.0.1:{port}")])
            .args(kubelet_args(kind))
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info");
        mo_testenv::spawn_for_process(command, log_dir().join("kubelet.log")).expect("kubelet");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "kubelet did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Shared {
            plane,
            admin: format!("http://127.0.0.1:{port}"),
        }
    })
}

/// An operator process; killed (SIGKILL, no goodbye) when dropped.
pub struct Operator {
    pub identity: String,
    pub metrics_port: u16,
    child: Child,
}

/// How many operator processes one test namespace may start (their ports are fixed up front
/// so that CN pods' preStop hooks can reach whichever of them leads later).
const OPERATORS_PER_NS: usize = 4;

impl Operator {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One of the operator's `/debug/*` JSON endpoints.
    async fn debug(&self, what: &str) -> serde_json::Value {
        reqwest::get(format!(
            "http://127.0.0.1:{}/debug/{what}",
            self.metrics_port
        ))
        .await
        .expect("debug endpoint")
        .json()
        .await
        .expect("debug json")
    }

    pub async fn latency(&self) -> serde_json::Value {
        self.debug("reconcile-latency").await
    }

    /// Reconcile latency over the newest `n` reconciles only.
    pub async fn latency_of_newest(&self, n: usize) -> serde_json::Value {
        self.debug(&format!("reconcile-latency?newest={n}")).await
    }

    /// From a watch event (a pod, node, budget or cluster change) to the reconcile's actions
    /// carried out, as the operator measured it.
    pub async fn reaction_latency(&self) -> serde_json::Value {
        self.debug("reaction-latency").await
    }

    /// Reaction latency over the newest `n` reactions only.
    pub async fn reaction_latency_of_newest(&self, n: usize) -> serde_json::Value {
        self.debug(&format!("reaction-latency?newest={n}")).await
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Webhook / preStop review latency as the operator measured it.
    pub async fn review_latency(&self) -> serde_json::Value {
        self.debug("review-latency").await
    }

    /// `/metrics`, or None while the process does not answer (starting, or killed).
    pub async fn try_metrics(&self) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        reqwest::get(url).await.ok()?.text().await.ok()
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .expect("metrics endpoint")
            .text()
            .await
            .expect("metrics text")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One test's namespace, client and operators.
pub struct TestNs {
    pub ns: String,
    pub client: Client,
    pub shared: &'static Shared,
    /// HTTP ports of this namespace's operator processes, in spawn order.
    operator_ports: Vec<u16>,
    spawned: std::sync::atomic::AtomicUsize,
    /// Whether operators started here review plain pod deletes (the webhook's off switch).
    pub protect_deletes: bool,
}

impl TestNs {
    pub async fn new(ns: &str) -> TestNs {
        let shared = shared();
        let client = shared.plane.client().await.expect("client");
        let api: Api<Namespace> = Api::all(client.clone());
        if api.get_opt(ns).await.expect("get ns").is_some() {
            let _ = api.delete(ns, &DeleteParams::default()).await;
            wait_for("old namespace gone", Duration::from_secs(120), || async {
                api.get_opt(ns).await.ok()?.is_none().then_some(())
            })
            .await;
        }
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
        api.create(&PostParams::default(), &namespace)
            .await
            .expect("create ns");
        let operator_ports = (0..OPERATORS_PER_NS)
            .map(|_| mo_testenv::free_port().expect("port"))
            .collect();
        TestNs {
            ns: ns.into(),
            client,
            shared,
            operator_ports,
            spawned: std::sync::atomic::AtomicUsize::new(0),
            protect_deletes: true,
        }
    }

    /// An operator that authenticates as a ServiceAccount bound to `deploy/rbac.yaml`'s
    /// roles (renamed for this namespace): the least-privilege RBAC is what it runs with.
    pub fn operator_with_deployed_rbac(&self, identity: &str) -> Operator {
        let rbac = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/rbac.yaml"
        ))
        .expect("deploy/rbac.yaml");
        let sa = format!("mo-operator-{}", self.ns);
        let rbac = rbac
            .replace("name: mo-operator", &format!("name: {sa}"))
            .replace("[\"mo-operator\"]", &format!("[\"{sa}\"]"))
            .replace("namespace: mo-system", &format!("namespace: {}", self.ns));
        let file = log_dir().join(format!("{}-rbac.yaml", self.ns));
        std::fs::write(&file, rbac).expect("write rbac");
        let out = self.kubectl(&["apply", "-f", file.to_str().expect("utf-8")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.operator_as(&sa, identity, Vec::new())
    }

    /// Installs the Helm chart (`charts/mo-operator`) into this namespace, with no operator
    /// pod (this control plane runs no containers), and starts an operator process as the
    /// chart's ServiceAccount with the arguments of the chart's Deployment (only the addresses
    /// and the test's timings replaced): the chart is what runs.
    pub fn operator_from_chart(&self, identity: &str) -> Operator {
        let release = format!("mo-operator-{}", self.ns);
        let helm = mo_testenv::helm().expect("helm");
        let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/mo-operator");
        let out = Command::new(&helm)
            .args([
                "upgrade",
                "--install",
                &release,
                chart,
                "--namespace",
                &self.ns,
            ])
            .args([
                "--set",
                "replicas=0",
                "--set",
                "image.repository=mo-operator",
            ])
            .args(["--set", "image.tag=e2e"])
            .args([
                "--set",
                &format!("protectPodDeletes={}", self.protect_deletes),
            ])
            .env("KUBECONFIG", self.shared.plane.kubeconfig())
            .output()
            .expect("helm runs");
        assert!(
            out.status.success(),
            "helm install: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = self.kubectl(&["get", "deployment", &release, "-n", &self.ns, "-o", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deployment: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        // What the test sets itself (addresses on this machine, short timings).
        const REPLACED: [&str; 6] = [
            "--tick=",
            "--lease-duration=",
            "--watch-namespace=",
            "--webhook-listen=",
            "--webhook-service=",
            "--drain-hook-endpoint=",
        ];
        let mut chart_args: Vec<String> = container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string())
            .filter(|a| a != "run" && !REPLACED.iter().any(|r| a.starts_with(r)))
            .collect();
        let image = container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "MO_OPERATOR_IMAGE")
            .and_then(|e| e["value"].as_str())
            .expect("MO_OPERATOR_IMAGE")
            .to_string();
        chart_args.push(format!("--drain-hook-image={image}"));
        self.operator_as(&release, identity, chart_args)
    }

    /// An operator authenticating with a token of ServiceAccount `sa` (this namespace), with
    /// the webhooks and the CN preStop hook served on this machine.
    fn operator_as(&self, sa: &str, identity: &str, mut args: Vec<String>) -> Operator {
        let out = self.kubectl(&["create", "token", sa, "-n", &self.ns, "--duration=2h"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let admin: serde_json::Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(self.shared.plane.kubeconfig()).expect("kubeconfig"),
        )
        .expect("kubeconfig yaml");
        let cluster = &admin["clusters"][0]["cluster"];
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: sa\ncurrent-context: c\n",
            cluster["server"].as_str().expect("server"),
            cluster["certificate-authority-data"].as_str().expect("ca"),
        );
        let path = log_dir().join(format!("{}-{identity}.kubeconfig", self.ns));
        std::fs::write(&path, kubeconfig).expect("write kubeconfig");
        // With the eviction / delete webhooks and the CN preStop hook, as deployed.
        let webhook_port = mo_testenv::free_port().expect("port");
        let hook_endpoints = self
            .operator_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let extra = vec![
            "--webhook-listen".to_string(),
            format!("127.0.0.1:{webhook_port}"),
            "--webhook-url".into(),
            format!("https://127.0.0.1:{webhook_port}"),
            "--webhook-hosts".into(),
            "127.0.0.1".into(),
            "--drain-hook-endpoint".into(),
            hook_endpoints,
        ];
        if args.is_empty() {
            args = vec![
                "--webhook-configuration".into(),
                sa.to_string(),
                "--webhook-ca-secret".into(),
                format!("{}/mo-operator-webhook-ca", self.ns),
                "--drain-hook-image".into(),
                "mo-operator:e2e".into(),
                format!("--protect-pod-deletes={}", self.protect_deletes),
            ];
        }
        args.extend(extra);
        self.spawn(identity, &path, "250ms", &args)
    }

    /// The test control plane's admin kubeconfig.
    pub fn kubeconfig(&self) -> &std::path::Path {
        self.shared.plane.kubeconfig()
    }

    pub fn operator(&self, identity: &str) -> Operator {
        self.spawn_operator(identity, self.shared.plane.kubeconfig())
    }

    fn spawn_operator(&self, identity: &str, kubeconfig: &std::path::Path) -> Operator {
        self.spawn(identity, kubeconfig, "250ms", &[])
    }

    /// An operator with the admin credentials and these extra `run` arguments.
    pub fn operator_with_args(&self, identity: &str, extra: &[String]) -> Operator {
        self.spawn(identity, self.shared.plane.kubeconfig(), "250ms", extra)
    }

    pub fn operator_ticking(&self, identity: &str, tick: &str) -> Operator {
        self.spawn(identity, self.shared.plane.kubeconfig(), tick, &[])
    }

    /// An operator that reaches the API server at `server` (e.g. a [`FreezableProxy`]) with
    /// the admin credentials, and holds the lease for `lease_duration` (e.g. `"4s"`).
    pub fn operator_via(&self, identity: &str, server: &str, lease_duration: &str) -> Operator {
        let admin = std::fs::read_to_string(self.shared.plane.kubeconfig()).expect("kubeconfig");
        let kubeconfig = admin.replace(self.shared.plane.server(), server);
        assert!(
            server == self.shared.plane.server() || kubeconfig != admin,
            "the server address appears in the kubeconfig"
        );
        let path = log_dir().join(format!("{}-{identity}.kubeconfig", self.ns));
        std::fs::write(&path, kubeconfig).expect("write kubeconfig");
        self.spawn(
            identity,
            &path,
            "250ms",
            &["--lease-duration".to_string(), lease_duration.to_string()],
        )
    }

    /// What operator `identity` of this namespace logged: (Unix seconds, message) per line.
    pub fn operator_log(&self, identity: &str) -> Vec<(f64, String)> {
        let log = log_dir().join(format!("{}-{identity}.log", self.ns));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|line| {
                let at = line["timestamp"]
                    .as_str()?
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()?;
                let message = line["fields"]["message"].as_str()?.to_string();
                Some((at.as_duration().as_secs_f64(), message))
            })
            .collect()
    }

    fn spawn(
        &self,
        identity: &str,
        kubeconfig: &std::path::Path,
        tick: &str,
        extra: &[String],
    ) -> Operator {
        let n = self
            .spawned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = match self.operator_ports.get(n) {
            Some(p) => *p,
            None => mo_testenv::free_port().expect("port"),
        };
        let mut command = Command::new(BIN);
        command
            .args([
                "run",
                "--tick",
                tick,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--lease-namespace",
                &self.ns,
                "--watch-namespace",
                &self.ns,
                "--identity",
                identity,
            ])
            .args(
                (!extra.iter().any(|a| a == "--lease-duration"))
                    .then_some(["--lease-duration", "4s"])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            // The tests' shared storage is a directory of this machine (a hostPath).
            .args(["--allow-host-path-under", "/tmp"])
            .arg("--allow-host-path-under")
            .arg(real_plane_dir())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn");
        let log = log_dir().join(format!("{}-{identity}.log", self.ns));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        command.stdout(out).stderr(err).stdin(Stdio::null());
        let child = command.spawn().expect("operator starts");
        Operator {
            identity: identity.into(),
            metrics_port: port,
            child,
        }
    }

    pub fn clusters(&self) -> Api<MatrixOneCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Every pod of the namespace, now.
    pub async fn pod_list(&self) -> Vec<Pod> {
        self.pods()
            .list(&Default::default())
            .await
            .expect("pods")
            .items
    }

    pub async fn create(
        &self,
        name: &str,
        spec: serde_json::Value,
    ) -> Result<MatrixOneCluster, kube::Error> {
        let cluster: MatrixOneCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ops.matrixorigin.io/v1alpha1",
            "kind": "MatrixOneCluster",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("cluster object");
        self.clusters()
            .create(&PostParams::default(), &cluster)
            .await
    }

    pub async fn patch_spec(&self, name: &str, spec: serde_json::Value) {
        self.clusters()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": spec})),
            )
            .await
            .expect("patch spec");
    }

    pub async fn cluster(&self, name: &str) -> MatrixOneCluster {
        self.clusters().get(name).await.expect("get cluster")
    }

    pub async fn condition(&self, name: &str, type_: &str) -> Option<(String, String, String)> {
        let c = self.clusters().get(name).await.ok()?;
        c.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status, c.reason, c.message))
    }

    pub async fn wait_ready(&self, name: &str, limit: Duration) {
        wait_for(&format!("{name} Ready"), limit, || async {
            let (status, _, _) = self.condition(name, "Ready").await?;
            (status == "True").then_some(())
        })
        .await;
    }

    /// The simulated data plane's report: transaction outcomes, TN exits, unsafe actions.
    pub async fn report(&self, name: &str) -> mo_sim::Report {
        let url = format!(
            "{}/v1/namespaces/{}/clusters/{name}/report",
            self.shared.admin, self.ns
        );
        reqwest::get(&url)
            .await
            .expect("report endpoint")
            .json()
            .await
            .expect("report json")
    }

    pub async fn pod_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .pods()
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
            .iter()
            .filter(|p| p.labels().get("ops.matrixorigin.io/prepull").is_none())
            .map(|p| p.name_any())
            .collect();
        names.sort();
        names
    }

    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.shared.plane.kubectl())
            .args(args)
            .env("KUBECONFIG", self.shared.plane.kubeconfig())
            .output()
            .expect("kubectl runs")
    }

    /// `kubectl` without blocking the test's runtime: what runs beside it (a SQL workload on
    /// the same current-thread runtime) keeps running while a long command (a drain) waits.
    pub async fn kubectl_async(&self, args: &[&str]) -> std::process::Output {
        tokio::process::Command::new(self.shared.plane.kubectl())
            .args(args)
            .env("KUBECONFIG", self.shared.plane.kubeconfig())
            .output()
            .await
            .expect("kubectl runs")
    }
}

/// A real-kernel cluster left behind keeps 7–9 kernel processes (about 2 GB) running and its
/// pods on the fake nodes the next test drains: each test's pods go when its namespace handle
/// does (the operators, declared after it, are already killed). Its webhook configuration goes
/// first: with no operator to answer it, it would refuse the deletes (it fails closed).
impl Drop for TestNs {
    fn drop(&mut self) {
        if KIND.get() != Some(&DataPlane::RealKernel) {
            return;
        }
        let ns = self.ns.clone();
        let webhooks = format!("mo-operator-{ns}");
        let steps: [&[&str]; 3] = [
            &[
                "delete",
                "validatingwebhookconfiguration",
                &webhooks,
                "--ignore-not-found",
            ],
            &["delete", "statefulsets", "--all", "-n", &ns, "--wait=false"],
            &[
                "delete",
                "pods",
                "--all",
                "-n",
                &ns,
                "--grace-period=1",
                "--timeout=120s",
            ],
        ];
        for args in steps {
            let out = self.kubectl(args);
            if !out.status.success() {
                eprintln!(
                    "teardown of {ns}: kubectl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

impl TestNs {
    /// Turns a fault of the simulated kernel on (`{"handover_never_confirms": true}`, …).
    pub async fn fault(&self, name: &str, faults: serde_json::Value) {
        let url = format!(
            "{}/v1/namespaces/{}/clusters/{name}/faults",
            self.shared.admin, self.ns
        );
        let status = reqwest::Client::new()
            .post(&url)
            .json(&faults)
            .send()
            .await
            .expect("faults endpoint")
            .status();
        assert!(status.is_success(), "faults: {status}");
    }

    /// The kubelet ends pod `name` for good, as under node pressure (phase `Failed`, reason
    /// `Evicted`); the object stays until someone deletes it.
    pub async fn fail_pod(&self, name: &str) {
        let url = format!(
            "{}/v1/namespaces/{}/pods/{name}/fail",
            self.shared.admin, self.ns
        );
        let response = reqwest::Client::new()
            .post(&url)
            .send()
            .await
            .expect("fail endpoint");
        assert!(
            response.status().is_success(),
            "fail {name}: {} {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }

    /// Which pod's lock service owns each bound lock table (the data plane's ground truth).
    pub async fn lock_tables(&self, name: &str) -> BTreeMap<String, String> {
        let url = format!(
            "{}/v1/namespaces/{}/clusters/{name}/lock-tables",
            self.shared.admin, self.ns
        );
        reqwest::get(&url)
            .await
            .expect("lock tables endpoint")
            .json()
            .await
            .expect("lock tables json")
    }

    /// What the data plane's kubelet saw the preStop hook of pod instance `uid` do.
    pub async fn prestop(&self, uid: &str) -> Option<serde_json::Value> {
        let url = format!("{}/v1/prestop/{uid}", self.shared.admin);
        let response = reqwest::get(&url).await.expect("prestop endpoint");
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return None;
        }
        Some(response.json().await.expect("prestop json"))
    }

    pub async fn pod(&self, name: &str) -> Option<Pod> {
        self.pods().get_opt(name).await.expect("get pod")
    }
}

/// The data plane's independent observer saw no harm: no unsafe action, no transaction
/// failed or ended unknown but what an upgrade's TN restart costs, no TN fatal exit.
pub fn assert_no_harm(report: &mo_sim::Report) {
    assert_eq!(
        report.unsafe_actions.total(),
        0,
        "{:?}",
        report.unsafe_action_log
    );
    // What the stock kernel's TN restart, and the restart of the only proxy, cost an upgrade
    // is theirs, counted apart.
    assert_eq!(
        report.txns.failed_definite + report.txns.unknown,
        report.txn_failures_by_cause.tn_restart + report.txn_failures_by_cause.proxy_restart,
        "{:?}: {:?} {:?}",
        report.txns,
        report.errors_by_kind,
        report.txn_failures_by_cause
    );
    assert_eq!(report.tn_fatal_exits, 0);
    assert!(
        report.txns.committed > 0,
        "the workload ran: {:?}",
        report.txns
    );
}

/// Polls `check` until it answers, or fails the test with what it waited for.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Writes a measured figure to `target/figures/<name>` (the README's figures come from these).
pub fn write_figure(name: &str, value: &serde_json::Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/figures");
    std::fs::create_dir_all(&dir).expect("figures dir");
    std::fs::write(
        dir.join(name),
        serde_json::to_string_pretty(value).expect("json"),
    )
    .expect("write figure");
}

/// The spec most tests start from.
pub fn small_cluster(version: &str) -> serde_json::Value {
    serde_json::json!({
        "version": version,
        "log": {"replicas": 3},
        "sharedStorage": {"fileSystem": {"path": "/tmp/mo-shared"}},
        "cn": {"groups": [{"name": "tp", "replicas": 2}]},
        "proxy": {"replicas": 1},
        "upgrade": {"stabilityWindow": "2s", "stallTimeout": "3m"},
        "drain": {"alarmAfter": "5m"},
    })
}

/// A TCP proxy in front of the API server that can be frozen: while frozen it passes no byte in
/// either direction and accepts connections it never serves, as a partition would; what it
/// held is dropped, never delivered late.
pub struct FreezableProxy {
    pub address: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezableProxy {
    /// Proxies `target` (`host:port`) on a free loopback port.
    pub async fn start(target: &str) -> FreezableProxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let address = listener.local_addr().expect("address").to_string();
        let frozen = std::sync::Arc::new(AtomicBool::new(false));
        let target = target.to_string();
        let flag = frozen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (target, flag) = (target.clone(), flag.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, flag.clone());
                    let down = pump(sr, cw, flag);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        async fn pump(
            mut from: tokio::net::tcp::OwnedReadHalf,
            mut to: tokio::net::tcp::OwnedWriteHalf,
            frozen: std::sync::Arc<AtomicBool>,
        ) {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                while frozen.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if frozen.load(Ordering::SeqCst) {
                    // Read while freezing: lost, as in a partition.
                    return;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        FreezableProxy {
            address,
            frozen,
            task,
        }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
