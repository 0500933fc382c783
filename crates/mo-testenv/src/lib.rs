//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager built from source by `tools/control-plane/build.sh`, started on
//! free loopback ports with throw-away certificates.
//!
//! One control plane serves a whole test binary ([`shared`]); tests isolate themselves in
//! namespaces. Every child process is killed when the test process ends, however it ends
//! (`PR_SET_PDEATHSIG` from a thread that lives as long as the process), and leftovers of a
//! killed run are removed by the next one. When `KUBECONFIG` names a file, tests run against
//! that cluster instead and nothing is started.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

pub const KUBERNETES_VERSION: &str = "v1.37.2";
pub const ETCD_VERSION: &str = "v3.7.0";

#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    #[error("building a test tool failed: {0}")]
    Build(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{0} did not become ready (waited {1:?}); its log ends with: {2}")]
    NotReady(&'static str, Duration, String),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestEnvError {
    let what = what.into();
    move |source| TestEnvError::Io { what, source }
}

/// A running control plane (or an existing cluster named by `KUBECONFIG`).
pub struct ControlPlane {
    kubeconfig: PathBuf,
    dir: Option<PathBuf>,
    /// Where the binaries are (kubectl included), when we built them.
    bin_dir: Option<PathBuf>,
    server: String,
    /// How long starting etcd, kube-apiserver and kube-controller-manager took (None: an
    /// existing cluster was adopted).
    started_in: Option<Duration>,
}

impl ControlPlane {
    /// From the first process spawned to the controller manager serving (None when an
    /// existing cluster named by `KUBECONFIG` is used).
    pub fn started_in(&self) -> Option<Duration> {
        self.started_in
    }

    /// The kubeconfig file for clients (the operator, kubectl, the fake kubelet).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// Whether this is our own control plane (false: an existing cluster).
    pub fn is_local(&self) -> bool {
        self.dir.is_some()
    }

    /// `kubectl` of the same version when we built it, else the one on `PATH`.
    pub fn kubectl(&self) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join("kubectl"),
            None => PathBuf::from("kubectl"),
        }
    }

    pub async fn client(&self) -> Result<Client, TestEnvError> {
        self.client_retrying(true).await
    }

    /// A client that retries 429/503/504 answers (`retry`) or returns them at once (to time
    /// one call, or to see a refusal as the caller gets it).
    pub async fn client_retrying(&self, retry: bool) -> Result<Client, TestEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| TestEnvError::Kubeconfig(e.to_string()))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| TestEnvError::Kubeconfig(e.to_string()))?;
        config.default_retry = retry;
        Client::try_from(config).map_err(|e| TestEnvError::Kubeconfig(e.to_string()))
    }
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane of this test process, started on first use.
pub fn shared() -> Result<&'static ControlPlane, String> {
    SHARED
        // Started on a thread of its own: callers may be inside an async runtime.
        .get_or_init(|| {
            std::thread::spawn(|| start().map_err(|e| e.to_string()))
                .join()
                .unwrap_or_else(|_| Err("starting the control plane panicked".into()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Starts a control plane (or adopts `KUBECONFIG`).
pub fn start() -> Result<ControlPlane, TestEnvError> {
    if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let server = Kubeconfig::read_from(&path)
            .ok()
            .and_then(|k| k.clusters.first().and_then(|c| c.cluster.clone()))
            .and_then(|c| c.server)
            .unwrap_or_default();
        return Ok(ControlPlane {
            kubeconfig: path,
            dir: None,
            bin_dir: None,
            server,
            started_in: None,
        });
    }
    let bin = binaries()?;
    let root = std::env::temp_dir().join("mo-testenv");
    remove_stale_runs(&root, &["run-"]);
    let dir = root.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io("creating the run directory"))?;
    let certs = Certs::write(&dir)?;
    let etcd_client = free_port()?;
    let etcd_peer = free_port()?;
    let apiserver_port = free_port()?;
    let kcm_port = free_port()?;
    let server = format!("https://127.0.0.1:{apiserver_port}");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, certs.kubeconfig(&server)).map_err(io("writing kubeconfig"))?;

    let etcd = command(
        bin.join("etcd"),
        &[
            "--name=default",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
    .log_to(&dir, "etcd");
    let apiserver = command(
        bin.join("kube-apiserver"),
        &[
            &format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={apiserver_port}"),
            &format!("--tls-cert-file={}", certs.serving_cert.display()),
            &format!("--tls-private-key-file={}", certs.serving_key.display()),
            &format!("--client-ca-file={}", certs.ca_cert.display()),
            &format!("--service-account-key-file={}", certs.sa_pub.display()),
            &format!(
                "--service-account-signing-key-file={}",
                certs.sa_key.display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC",
            // No serviceaccount controller runs: pods need no default ServiceAccount.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            // The master Service endpoint cannot be a loopback address; nothing needs it.
            "--endpoint-reconciler-type=none",
            "--v=0",
        ],
    )
    .log_to(&dir, "kube-apiserver");
    let kcm = command(bin.join("kube-controller-manager"), &[
            &format!("--kubeconfig={}", kubeconfig.display()),
            &format!("--authentication-kubeconfig={}", kubeconfig.display()),
            &format!("--authorization-kubeconfig={}", kubeconfig.display()),
            // The controllers the operator relies on are real; no node lifecycle controller
            // (the fake kubelet does not heartbeat), no cloud controllers. The service
            // account controller makes each namespace's `default` ServiceAccount.
            "--controllers=statefulset-controller,replicaset-controller,deployment-controller,disruption-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller",
            // Each controller acts as its own ServiceAccount (kube-system/statefulset-controller,
            // …), as kubeadm and managed clusters run them: what a webhook sees as the deleter.
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            &format!("--secure-port={kcm_port}"),
            "--concurrent-statefulset-syncs=10",
            "--v=0",
        ])
    .log_to(&dir, "kube-controller-manager");
    let spawner = Spawner::get();
    let start = Instant::now();
    let etcd_pid = spawner.spawn(etcd)?;
    wait_tcp(etcd_client, "etcd", etcd_pid, &dir.join("etcd.log"))?;
    let apiserver_pid = spawner.spawn(apiserver)?;
    wait_ready(&certs, apiserver_port, apiserver_pid, &dir)?;
    let kcm_pid = spawner.spawn(kcm)?;
    wait_tcp(
        kcm_port,
        "kube-controller-manager",
        kcm_pid,
        &dir.join("kube-controller-manager.log"),
    )?;
    let started_in = start.elapsed();
    eprintln!(
        "mo-testenv: control plane (etcd, kube-apiserver, kube-controller-manager) ready in {:.1} s",
        started_in.as_secs_f64()
    );
    Ok(ControlPlane {
        kubeconfig,
        dir: Some(dir),
        bin_dir: Some(bin),
        server,
        started_in: Some(started_in),
    })
}

/// The cached binaries, building them when missing.
pub fn binaries() -> Result<PathBuf, TestEnvError> {
    if let Some(dir) = std::env::var_os("MO_CONTROL_PLANE_BIN") {
        return Ok(PathBuf::from(dir));
    }
    build_script(
        "tools/control-plane/build.sh",
        &[
            ("KUBERNETES_VERSION", KUBERNETES_VERSION),
            ("ETCD_VERSION", ETCD_VERSION),
        ],
    )
}

/// `morpc-interop`: MatrixOne's own RPC and protobuf code as a client and a server
/// (`tools/morpc-interop`), built and cached on first use unless `MO_MORPC_INTEROP_BIN` names it.
pub fn morpc_interop() -> Result<PathBuf, TestEnvError> {
    if let Some(bin) = std::env::var_os("MO_MORPC_INTEROP_BIN") {
        return Ok(PathBuf::from(bin));
    }
    // Built once per test process, however many tests ask at once.
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_script("tools/morpc-interop/build.sh", &[]).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(TestEnvError::Build)
}

/// `helm` (v3, from the Go module proxy, `tools/helm/build.sh`), built and cached on first use
/// unless `MO_HELM_BIN` names it.
pub fn helm() -> Result<PathBuf, TestEnvError> {
    if let Some(bin) = std::env::var_os("MO_HELM_BIN") {
        return Ok(PathBuf::from(bin));
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_script("tools/helm/build.sh", &[]).map_err(|e| e.to_string()))
        .clone()
        .map_err(TestEnvError::Build)
}

/// The MatrixOne versions the real-kernel tests run by default, oldest first: the two the Go
/// module proxy serves.
pub const KERNEL_VERSIONS: [&str; 2] = ["v1.2.3", "v1.2.4"];

/// The versions the real-kernel tests run, oldest first: `MO_KERNEL_VERSIONS` (two versions
/// separated by spaces, as `tools/matrixone/build.sh` reads it) or [`KERNEL_VERSIONS`]. The
/// tests start on the first and upgrade to the second.
pub fn kernel_versions() -> Result<[String; 2], TestEnvError> {
    let line = std::env::var("MO_KERNEL_VERSIONS").unwrap_or_else(|_| KERNEL_VERSIONS.join(" "));
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        [older, newer] if older != newer => Ok([older.to_string(), newer.to_string()]),
        _ => Err(TestEnvError::Build(format!(
            "MO_KERNEL_VERSIONS must name two different versions, oldest first; it is `{line}`"
        ))),
    }
}

/// MatrixOne's own `mo-service` for each of [`kernel_versions`], built from the Go module proxy
/// by `tools/matrixone/build.sh` with the version stamped in (cached outside the repository),
/// unless `MO_KERNEL_BINS` names them (paths separated by spaces, in the same order: any build
/// of those versions, such as one made locally from the kernel's repository).
pub fn matrixone_kernels() -> Result<Vec<(String, PathBuf)>, TestEnvError> {
    static BUILT: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    let versions = kernel_versions()?;
    let paths = BUILT
        .get_or_init(|| {
            let line = match std::env::var("MO_KERNEL_BINS") {
                Ok(bins) => bins,
                Err(_) => build_script(
                    "tools/matrixone/build.sh",
                    &[("MO_KERNEL_VERSIONS", &versions.join(" "))],
                )
                .map_err(|e| e.to_string())?
                .display()
                .to_string(),
            };
            let paths: Vec<PathBuf> = line.split_whitespace().map(PathBuf::from).collect();
            if paths.len() != versions.len() {
                return Err(format!(
                    "expected {} kernel binaries ({}), got `{line}`",
                    versions.len(),
                    versions.join(" ")
                ));
            }
            Ok(paths)
        })
        .clone()
        .map_err(TestEnvError::Build)?;
    Ok(versions.into_iter().zip(paths).collect())
}

/// The `CommitID` a kernel binary was stamped with, as it prints it itself (`mo-service
/// -version`: "Git commit ID: f2dd397"); what its CNs report to HAKeeper.
pub fn matrixone_commit(bin: &Path) -> Result<String, TestEnvError> {
    let out = Command::new(bin)
        .arg("-version")
        .output()
        .map_err(io(format!("running {} -version", bin.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix("Git commit ID:"))
        .map(|commit| commit.trim().to_string())
        .filter(|commit| !commit.is_empty())
        .ok_or_else(|| {
            TestEnvError::Build(format!(
                "{} -version names no commit: {text}",
                bin.display()
            ))
        })
}

/// Runs one of the repository's build scripts; its last stdout line is the path it built.
fn build_script(relative: &str, env: &[(&str, &str)]) -> Result<PathBuf, TestEnvError> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative);
    let out = Command::new("bash")
        .arg(&script)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .map_err(io(format!("running {}", script.display())))?;
    if !out.status.success() {
        return Err(TestEnvError::Build(format!(
            "{} exited with {}",
            script.display(),
            out.status
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().unwrap_or_default().trim().to_string();
    Ok(PathBuf::from(path))
}

fn command(program: PathBuf, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}

trait LogTo {
    fn log_to(self, dir: &Path, name: &str) -> (Command, PathBuf);
}

impl LogTo for Command {
    fn log_to(self, dir: &Path, name: &str) -> (Command, PathBuf) {
        (self, dir.join(format!("{name}.log")))
    }
}

/// Spawns children from one thread that lives as long as the process, so that
/// `PR_SET_PDEATHSIG` (which fires when the spawning *thread* ends) fires only when the test
/// process itself ends.
/// Spawns a process that lives until the test process ends (a shared helper such as the
/// simulated data plane); its output goes to `log`. Returns its pid.
pub fn spawn_for_process(command: Command, log: PathBuf) -> Result<u32, TestEnvError> {
    Spawner::get().spawn((command, log))
}

/// A command, where its output goes, and where to send the pid.
type SpawnRequest = (Command, PathBuf, mpsc::Sender<std::io::Result<u32>>);

struct Spawner {
    requests: Mutex<mpsc::Sender<SpawnRequest>>,
}

impl Spawner {
    fn get() -> &'static Spawner {
        static SPAWNER: OnceLock<Spawner> = OnceLock::new();
        SPAWNER.get_or_init(|| {
            let (tx, rx) =
                mpsc::channel::<(Command, PathBuf, mpsc::Sender<std::io::Result<u32>>)>();
            std::thread::Builder::new()
                .name("mo-testenv-spawner".into())
                .spawn(move || {
                    let mut children: Vec<Child> = Vec::new();
                    for (mut command, log, reply) in rx {
                        let result = spawn_with_parent_death(&mut command, &log);
                        let _ = reply.send(result.map(|child| {
                            let pid = child.id();
                            children.push(child);
                            pid
                        }));
                    }
                    // The channel never closes while the process runs: children live with it.
                    drop(children);
                })
                .expect("spawn thread");
            Spawner {
                requests: Mutex::new(tx),
            }
        })
    }

    fn spawn(&self, (command, log): (Command, PathBuf)) -> Result<u32, TestEnvError> {
        let (reply_tx, reply_rx) = mpsc::channel();
        let what = format!("starting {:?}", command.get_program());
        self.requests
            .lock()
            .expect("spawner lock")
            .send((command, log, reply_tx))
            .expect("spawner thread alive");
        reply_rx.recv().expect("spawner replies").map_err(io(what))
    }
}

/// Spawns `command` so that it is killed when the spawning thread's process ends.
pub fn spawn_with_parent_death(command: &mut Command, log: &Path) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    command.stdout(out).stderr(err).stdin(Stdio::null());
    // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Removes the entries of `root` named `<prefix><anything>-<pid>` (one of `prefixes`) whose
/// process has ended: what a killed or finished test process left. Their owner is gone, so are
/// their children.
pub fn remove_stale_runs(root: &Path, prefixes: &[&str]) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let Some(pid) = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub fn free_port() -> Result<u16, TestEnvError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("reading the port"))?
        .port())
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A child that exited is a zombie until reaped: its state letter is `Z`.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(after != 'Z' && after != 'X')
        })
        .unwrap_or(false)
}

fn wait_tcp(port: u16, what: &'static str, pid: u32, log: &Path) -> Result<(), TestEnvError> {
    let limit = Duration::from_secs(60);
    let start = Instant::now();
    while start.elapsed() < limit {
        if !alive(pid) {
            return Err(TestEnvError::NotReady(what, start.elapsed(), tail(log)));
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(TestEnvError::NotReady(what, limit, tail(log)))
}

/// Polls `/readyz` with the admin client certificate (curl is not assumed: plain TLS via kube).
fn wait_ready(certs: &Certs, port: u16, pid: u32, dir: &Path) -> Result<(), TestEnvError> {
    let limit = Duration::from_secs(120);
    let log = dir.join("kube-apiserver.log");
    wait_tcp(port, "kube-apiserver", pid, &log)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("building a runtime"))?;
    let kubeconfig = certs.kubeconfig(&format!("https://127.0.0.1:{port}"));
    let start = Instant::now();
    runtime.block_on(async {
        let config = Kubeconfig::from_yaml(&kubeconfig)
            .map_err(|e| TestEnvError::Kubeconfig(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .map_err(|e| TestEnvError::Kubeconfig(e.to_string()))?;
        let client =
            Client::try_from(config).map_err(|e| TestEnvError::Kubeconfig(e.to_string()))?;
        while start.elapsed() < limit {
            if !alive(pid) {
                break;
            }
            let request = http_get("/readyz");
            if let Ok(text) = client.request_text(request).await
                && text.trim() == "ok"
            {
                // RBAC's bootstrap roles must exist before anyone is authorized by them.
                let roles = client
                    .request_text(http_get(
                        "/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin",
                    ))
                    .await;
                if roles.is_ok() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(TestEnvError::NotReady("kube-apiserver", limit, tail(&log)))
    })
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("a valid request")
}

struct Certs {
    ca_cert: PathBuf,
    ca_pem: String,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
    admin_cert_pem: String,
    admin_key_pem: String,
}

impl Certs {
    fn write(dir: &Path) -> Result<Certs, TestEnvError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "mo-testenv-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca_pem = ca_cert.pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "10.96.0.1".to_string(),
        ])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa_key = KeyPair::generate()?;
        let write = |name: &str, text: &str| -> Result<PathBuf, TestEnvError> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io(format!("writing {name}")))?;
            Ok(path)
        };
        Ok(Certs {
            ca_cert: write("ca.crt", &ca_pem)?,
            serving_cert: write("apiserver.crt", &serving_cert.pem())?,
            serving_key: write("apiserver.key", &serving_key.serialize_pem())?,
            sa_key: write("sa.key", &sa_key.serialize_pem())?,
            sa_pub: write("sa.pub", &sa_key.public_key_pem())?,
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            ca_pem,
        })
    }

    fn kubeconfig(&self, server: &str) -> String {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: mo-testenv\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: mo-testenv\n  context:\n    cluster: mo-testenv\n    user: admin\ncurrent-context: mo-testenv\n",
            b64(&self.ca_pem),
            b64(&self.admin_cert_pem),
            b64(&self.admin_key_pem)
        )
    }
}
