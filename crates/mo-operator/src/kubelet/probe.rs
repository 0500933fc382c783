//! Container probes for the process runtime: `tcpSocket` and `httpGet` against the pod's
//! address, `exec` inside the container's namespaces (through the launcher, see
//! [`super::exec`]), with Kubernetes' timing and thresholds. One task per running container
//! runs the startup probe, then the liveness and readiness probes, and keeps a [`Health`]
//! the runtime reads on every tick.

use super::exec::{Launch, Process};
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::io::{self, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where a container's probes go.
#[derive(Debug, Clone)]
pub struct Target {
    pub ip: Ipv4Addr,
    /// The container's named ports.
    pub ports: BTreeMap<String, i32>,
    /// The container's launcher, whose namespaces exec probes join.
    pub launcher: u32,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
}

impl Target {
    pub fn for_container(container: &Container, ip: Ipv4Addr, launcher: u32) -> Target {
        Target {
            ip,
            ports: container
                .ports
                .iter()
                .flatten()
                .filter_map(|p| Some((p.name.clone()?, p.container_port)))
                .collect(),
            launcher,
            env: Vec::new(),
            working_dir: container.working_dir.clone(),
        }
    }

    pub fn port(&self, port: &IntOrString) -> Result<u16, String> {
        let number = match port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => match name.parse::<i32>() {
                Ok(n) => n,
                Err(_) => *self
                    .ports
                    .get(name)
                    .ok_or_else(|| format!("no container port named {name:?}"))?,
            },
        };
        u16::try_from(number)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {number} out of range"))
    }

    /// The address of an `httpGet` action (its `host`, else the pod's address).
    pub fn http_address(&self, action: &HTTPGetAction) -> Result<SocketAddr, String> {
        let port = self.port(&action.port)?;
        match action.host.as_deref().filter(|h| !h.is_empty()) {
            None => Ok(SocketAddr::from((self.ip, port))),
            Some(host) => (host, port)
                .to_socket_addrs()
                .map_err(|e| format!("{host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host}: no address")),
        }
    }
}

/// What the probes found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The startup probe succeeded (or there is none).
    pub started: bool,
    pub ready: bool,
    /// The startup or liveness probe failed `failureThreshold` times: the container must be
    /// restarted.
    pub failed: Option<String>,
}

/// Kubernetes' probe timing, defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

pub fn timing(probe: &Probe) -> Timing {
    let secs =
        |v: Option<i32>, default: u64| Duration::from_secs(v.map_or(default, |s| s.max(0) as u64));
    Timing {
        initial_delay: secs(probe.initial_delay_seconds, 0),
        period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
        timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
        success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
        failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
    }
}

/// Consecutive results and the verdict they lead to.
#[derive(Debug, Default)]
pub struct Counter {
    successes: u32,
    failures: u32,
}

impl Counter {
    /// Some(true) once `success_threshold` successes in a row, Some(false) once
    /// `failure_threshold` failures in a row, None while undecided.
    pub fn record(&mut self, ok: bool, timing: &Timing) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
            (self.successes >= timing.success_threshold).then_some(true)
        } else {
            self.failures += 1;
            self.successes = 0;
            (self.failures >= timing.failure_threshold).then_some(false)
        }
    }
}

/// The probing task of one container run; stopped when dropped.
pub struct Prober {
    pub health: Arc<Mutex<Health>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Prober {
    pub fn health(&self) -> Health {
        self.health.lock().expect("health lock").clone()
    }
}

/// Starts probing a container that started at `since`.
pub fn start(container: &Container, target: Target, since: Instant) -> Prober {
    let health = Arc::new(Mutex::new(Health::default()));
    let task = tokio::spawn(supervise(
        container.startup_probe.clone(),
        container.liveness_probe.clone(),
        container.readiness_probe.clone(),
        Arc::new(target),
        since,
        health.clone(),
    ));
    Prober {
        health,
        task: task.abort_handle(),
    }
}

async fn supervise(
    startup: Option<Probe>,
    liveness: Option<Probe>,
    readiness: Option<Probe>,
    target: Arc<Target>,
    since: Instant,
    health: Arc<Mutex<Health>>,
) {
    let set = |f: &dyn Fn(&mut Health)| f(&mut health.lock().expect("health lock"));
    if let Some(probe) = startup {
        let t = timing(&probe);
        tokio::time::sleep_until(since + t.initial_delay).await;
        let mut counter = Counter::default();
        loop {
            let result = once(&probe, &target, t.timeout).await;
            match (counter.record(result.is_ok(), &t), result) {
                (Some(true), _) => break,
                (Some(false), Err(e)) => {
                    set(&|h| h.failed = Some(format!("Startup probe failed: {e}")));
                    return;
                }
                _ => {}
            }
            tokio::time::sleep(t.period).await;
        }
    }
    set(&|h| {
        h.started = true;
        h.ready = readiness.is_none();
    });
    let readiness = async {
        let Some(probe) = readiness else { return };
        let t = timing(&probe);
        tokio::time::sleep_until(since + t.initial_delay).await;
        let mut counter = Counter::default();
        loop {
            let result = once(&probe, &target, t.timeout).await;
            if let Err(e) = &result {
                tracing::debug!(error = %e, "readiness probe failed");
            }
            if let Some(ready) = counter.record(result.is_ok(), &t) {
                set(&|h| h.ready = ready);
            }
            tokio::time::sleep(t.period).await;
        }
    };
    let liveness = async {
        let Some(probe) = liveness else { return };
        let t = timing(&probe);
        tokio::time::sleep_until(since + t.initial_delay).await;
        let mut counter = Counter::default();
        loop {
            let result = once(&probe, &target, t.timeout).await;
            if let (Some(false), Err(e)) = (counter.record(result.is_ok(), &t), result) {
                set(&|h| h.failed = Some(format!("Liveness probe failed: {e}")));
                return;
            }
            tokio::time::sleep(t.period).await;
        }
    };
    tokio::join!(readiness, liveness);
}

/// One probe, bounded by `timeout`.
pub async fn once(probe: &Probe, target: &Target, timeout: Duration) -> Result<(), String> {
    if let Some(tcp) = &probe.tcp_socket {
        let port = target.port(&tcp.port)?;
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.ip.to_string());
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: timeout")),
        };
    }
    if let Some(http) = &probe.http_get {
        if http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
        {
            return Err("HTTPS probes are not supported by this runtime".into());
        }
        let addr = target.http_address(http)?;
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let host = addr.to_string();
        let request_path = path.clone();
        let code = tokio::task::spawn_blocking(move || {
            http_get(addr, &host, &request_path, &headers, timeout)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        return if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        };
    }
    if let Some(exec) = &probe.exec {
        let argv = exec.command.clone().unwrap_or_default();
        if argv.is_empty() {
            return Err("exec probe without a command".into());
        }
        return exec_in(target, argv, timeout).await;
    }
    Err("unsupported probe (this runtime does tcpSocket, httpGet and exec)".into())
}

/// Runs `argv` inside the container's namespaces, with its environment.
async fn exec_in(target: &Target, argv: Vec<String>, timeout: Duration) -> Result<(), String> {
    let launch = Launch::Join {
        pid: target.launcher,
        process: Process {
            argv,
            env: target.env.clone(),
            working_dir: target.working_dir.clone(),
        },
    };
    let command = super::exec::command(&launch).map_err(|e| e.to_string())?;
    let mut command = tokio::process::Command::from(command);
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(timeout, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(format!("exec: {e}")),
        Err(_) => return Err(format!("command timed out after {timeout:?}")),
    };
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let text: String = text.trim().chars().take(300).collect();
    Err(format!("command exited with {}: {text}", output.status))
}

/// A plain HTTP/1.1 GET; returns the status code.
pub fn http_get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {host}\r\n"));
    }
    request.push_str("User-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let line = line.lines().next().unwrap_or_default();
    line.split_whitespace()
        .nth(1)
        .filter(|_| line.starts_with("HTTP/"))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {line:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn probe(v: serde_json::Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn timing_defaults_and_thresholds() {
        let t = timing(&probe(json!({})));
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let t = timing(&probe(
            json!({"periodSeconds": 2, "successThreshold": 2, "failureThreshold": 2}),
        ));
        let mut c = Counter::default();
        assert_eq!(c.record(true, &t), None);
        assert_eq!(c.record(false, &t), None);
        assert_eq!(c.record(false, &t), Some(false));
        assert_eq!(c.record(true, &t), None);
        assert_eq!(c.record(true, &t), Some(true));
    }

    #[test]
    fn named_ports_resolve() {
        let container: Container = serde_json::from_value(json!({
            "name": "main", "ports": [{"name": "sql", "containerPort": 6001}],
        }))
        .unwrap();
        let t = Target::for_container(&container, Ipv4Addr::LOCALHOST, 1);
        assert_eq!(t.port(&IntOrString::String("sql".into())), Ok(6001));
        assert_eq!(t.port(&IntOrString::Int(80)), Ok(80));
        assert!(t.port(&IntOrString::String("web".into())).is_err());
        assert!(t.port(&IntOrString::Int(70000)).is_err());
    }

    #[tokio::test]
    async fn tcp_and_http_probes_reach_a_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for (i, stream) in listener.incoming().take(3).enumerate() {
                let mut stream = stream.unwrap();
                let mut buf = [0u8; 1024];
                let n = stream.read(&mut buf).unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                let status = if request.starts_with("GET /healthz ") {
                    "200 OK"
                } else {
                    "503 No"
                };
                if i > 0 {
                    let _ = stream.write_all(
                        format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
                    );
                }
            }
        });
        let container: Container = serde_json::from_value(json!({"name": "main"})).unwrap();
        let target = Target::for_container(&container, Ipv4Addr::LOCALHOST, 1);
        let timeout = Duration::from_secs(2);
        let tcp = probe(json!({"tcpSocket": {"port": port}}));
        assert_eq!(once(&tcp, &target, timeout).await, Ok(()));
        let ok = probe(json!({"httpGet": {"port": port, "path": "/healthz"}}));
        assert_eq!(once(&ok, &target, timeout).await, Ok(()));
        let bad = probe(json!({"httpGet": {"port": port, "path": "/other"}}));
        let err = once(&bad, &target, timeout).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        server.join().unwrap();
        // Nothing listens there any more.
        assert!(once(&tcp, &target, timeout).await.is_err());
    }
}
