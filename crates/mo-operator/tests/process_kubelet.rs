//! `mo-operator kubelet --runtime process` on the real test control plane: pods' containers
//! run as real processes (host programs mapped in as images), with their volumes, downward
//! API environment, probes, restarts, preStop hooks and graceful termination.

mod support;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::{BIN, wait_for};

struct Kubelet {
    plane: &'static mo_testenv::ControlPlane,
    admin: String,
    state: PathBuf,
}

/// The control plane and one process-runtime kubelet for this test binary.
fn kubelet() -> &'static Kubelet {
    static KUBELET: OnceLock<Kubelet> = OnceLock::new();
    KUBELET.get_or_init(|| {
        let plane = mo_testenv::shared().expect("test control plane");
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        // Runs of test processes that are gone.
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(pid) = name.strip_prefix("process-kubelet-")
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = root.join(format!("process-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test dir");
        let port = mo_testenv::free_port().expect("port");
        let mut command = Command::new(BIN);
        command
            .args(["kubelet", "--runtime", "process", "--nodes", "3"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--restart-backoff", "1s"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--log-dir")
            .arg(dir.join("logs"))
            // Host programs as images: the shell, and python3 bound at a path of its own.
            .args(["--image", "busybox:test=/bin/sh:/bin/sh"])
            .args(["--image", "python:*=/usr/bin/python3:/opt/mo-test/python3"])
            // This executable, as the operator's image (off the host's PATH: the mount point
            // is created on the host).
            .args([
                "--image",
                &format!("mo-operator:*={BIN}:/opt/mo-test/bin/mo-operator"),
            ])
            .env("KUBECONFIG", plane.kubeconfig())
            .env("RUST_LOG", "info,kube=warn");
        mo_testenv::spawn_for_process(command, dir.join("kubelet.log")).expect("kubelet");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "kubelet did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Kubelet {
            plane,
            admin: format!("http://127.0.0.1:{port}"),
            state: dir.join("state"),
        }
    })
}

struct Ns {
    name: String,
    client: Client,
    kubelet: &'static Kubelet,
}

impl Ns {
    async fn new(name: &str) -> Ns {
        let kubelet = kubelet();
        let client = kubelet.plane.client().await.expect("client");
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create namespace");
        Ns {
            name: name.into(),
            client,
            kubelet,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    async fn create<K>(&self, object: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let object: K = serde_json::from_value(object).expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &object)
            .await
            .expect("create")
    }

    async fn pod(&self, name: &str) -> Option<Pod> {
        self.api::<Pod>().get_opt(name).await.expect("get pod")
    }

    /// The pod's status as JSON (null while it has none).
    async fn status(&self, name: &str) -> Value {
        self.pod(name)
            .await
            .map(|p| serde_json::to_value(p.status).expect("json"))
            .unwrap_or(Value::Null)
    }

    /// The runtime's own view of the pod (test API).
    async fn runtime_view(&self, name: &str) -> Option<Value> {
        let url = format!(
            "{}/v1/namespaces/{}/pods/{name}",
            self.kubelet.admin, self.name
        );
        let response = reqwest::get(&url).await.expect("test API");
        if !response.status().is_success() {
            return None;
        }
        Some(response.json().await.expect("json"))
    }

    async fn logs(&self, name: &str, previous: bool) -> String {
        let url = format!(
            "{}/v1/namespaces/{}/pods/{name}/logs?container=main&previous={previous}",
            self.kubelet.admin, self.name
        );
        let response = reqwest::get(&url).await.expect("logs API");
        assert!(
            response.status().is_success(),
            "logs: {}",
            response.status()
        );
        response.text().await.expect("text")
    }

    /// Waits until the last log line `key=…` of the current run says `value`.
    async fn log_latest(&self, pod: &str, key: &str, value: &str) {
        wait_for(
            &format!("{pod} logs {key}={value}"),
            Duration::from_secs(20),
            || async {
                let logs = self.logs(pod, false).await;
                let last = logs
                    .lines()
                    .filter_map(|l| l.strip_prefix(&format!("{key}=")))
                    .next_back()?;
                (last == value).then_some(())
            },
        )
        .await
    }

    /// Waits for a log line `key=…` of the current run and returns its value.
    async fn log_value(&self, pod: &str, key: &str) -> String {
        wait_for(
            &format!("{pod} logs {key}="),
            Duration::from_secs(20),
            || async {
                let logs = self.logs(pod, false).await;
                logs.lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}=")))
                    .map(str::to_string)
            },
        )
        .await
    }

    async fn ready(&self, name: &str) -> Value {
        wait_for(
            &format!("{name} Ready"),
            Duration::from_secs(30),
            || async {
                let status = self.status(name).await;
                let ready = status["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                ready.then_some(status)
            },
        )
        .await
    }
}

fn labels(app: &str) -> Value {
    json!({"app": app, "app.kubernetes.io/managed-by": "mo-operator"})
}

/// What the StatefulSet's container prints, then it serves TCP on its pod address.
const SCRIPT: &str = r#"
echo x >> /mo-test/data/boots
echo "boots=$(wc -l < /mo-test/data/boots)"
echo "events=$(cat /mo-test/data/events 2>/dev/null | tr '\n' ' ')"
echo "greeting=$(cat /mo-test/cfg/greeting)"
echo "env=$POD_NAME/$POD_NS/$POD_IP/$MEM/$GREETING/$NODE/$HOSTNAME"
echo "init=$(cat /mo-test/scratch/init)"
echo "hostname=$(cat /proc/sys/kernel/hostname)"
echo "resolves=$(getent hosts web-0.web.$POD_NS.svc.cluster.local | cut -d' ' -f1)"
echo "image=$(test -x /opt/mo-test/python3 && echo mapped)"
trap 'echo term >> /mo-test/data/events; exit 0' TERM
(while sleep 0.3; do echo "live=$(cat /mo-test/cfg/greeting)"; done) &
/opt/mo-test/python3 -c "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$POD_IP', 8080)); s.listen(); time.sleep(100000)" &
wait
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_pod_runs_as_processes_with_its_volumes_probes_and_hooks() {
    let ns = Ns::new("proc-sts").await;
    ns.create::<ConfigMap>(json!({
        "metadata": {"name": "cfg"},
        "data": {"greeting": "hello"},
    }))
    .await;
    ns.create::<Service>(json!({
        "metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]},
    }))
    .await;
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    ns.create::<StatefulSet>(json!({
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": labels("web")},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "volumes": [
                        {"name": "cfg", "configMap": {"name": "cfg"}},
                        {"name": "scratch", "emptyDir": {}},
                    ],
                    "initContainers": [{
                        "name": "setup",
                        "image": "busybox:test",
                        "command": ["sh", "-c", "echo done > /mo-test/scratch/init"],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/mo-test/scratch"}],
                    }],
                    "containers": [{
                        "name": "main",
                        "image": "python:3",
                        "command": ["/bin/sh", "-c", SCRIPT],
                        "env": [
                            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                            {"name": "POD_NS", "valueFrom": field("metadata.namespace")},
                            {"name": "POD_IP", "valueFrom": field("status.podIP")},
                            {"name": "NODE", "valueFrom": field("spec.nodeName")},
                            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
                        ],
                        "resources": {"limits": {"memory": "64Mi"}},
                        "volumeMounts": [
                            {"name": "cfg", "mountPath": "/mo-test/cfg"},
                            {"name": "scratch", "mountPath": "/mo-test/scratch"},
                            {"name": "data", "mountPath": "/mo-test/data"},
                        ],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        // Passes only inside the container's mount namespace (the mount
                        // point on the host is an empty directory).
                        "livenessProbe": {"exec": {"command": ["cat", "/mo-test/cfg/greeting"]},
                            "periodSeconds": 1, "failureThreshold": 2},
                        "lifecycle": {"preStop": {"exec": {"command":
                            ["sh", "-c", "echo prestop >> /mo-test/data/events; sleep 1"]}}},
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
            }],
        },
    }))
    .await;

    // Running and Ready through the TCP probe; the init container ran first.
    let status = ns.ready("web-0").await;
    let ip = status["podIP"].as_str().expect("podIP").to_string();
    assert!(ip.starts_with("127."), "{ip}");
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["hostIP"], "127.0.0.1");
    let init = &status["initContainerStatuses"][0];
    assert_eq!(init["state"]["terminated"]["exitCode"], 0, "{init}");
    let main = &status["containerStatuses"][0];
    assert_eq!(main["started"], true);
    assert_eq!(main["restartCount"], 0);
    assert!(
        main["containerID"]
            .as_str()
            .unwrap()
            .starts_with("process://")
    );
    let first_start = main["state"]["running"]["startedAt"].clone();
    let node = ns
        .pod("web-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .node_name
        .unwrap();

    // What the process saw: files, environment, hostname, names, the image's file.
    assert_eq!(ns.log_value("web-0", "image").await, "mapped");
    assert_eq!(ns.log_value("web-0", "boots").await, "1");
    assert_eq!(ns.log_value("web-0", "greeting").await, "hello");
    assert_eq!(ns.log_value("web-0", "init").await, "done");
    assert_eq!(ns.log_value("web-0", "hostname").await, "web-0");
    assert_eq!(ns.log_value("web-0", "resolves").await, ip);
    assert_eq!(
        ns.log_value("web-0", "env").await,
        format!("web-0/{}/{ip}/64/hello/{node}/web-0", ns.name)
    );

    // A ConfigMap change reaches the running container's files.
    ns.log_latest("web-0", "live", "hello").await;
    ns.api::<ConfigMap>()
        .patch(
            "cfg",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"data": {"greeting": "hola"}})),
        )
        .await
        .expect("patch configmap");
    ns.log_latest("web-0", "live", "hola").await;

    // The liveness probe (exec inside the container) keeps passing: no restart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        ns.status("web-0").await["containerStatuses"][0]["restartCount"],
        0
    );

    // A crash: restarted in place after the back-off, counted, with its exit in lastState.
    let view = ns.runtime_view("web-0").await.expect("runtime view");
    let pid = view["containers"][1]["pid"].as_u64().expect("pid");
    let killed = reqwest::Client::new()
        .post(format!(
            "{}/v1/namespaces/{}/pods/web-0/kill?signal=KILL&container=main",
            ns.kubelet.admin, ns.name
        ))
        .send()
        .await
        .expect("kill API");
    assert!(killed.status().is_success(), "{}", killed.status());
    let status = wait_for(
        "web-0 restarted and Ready",
        Duration::from_secs(30),
        || async {
            let status = ns.status("web-0").await;
            let c = &status["containerStatuses"][0];
            (c["restartCount"] == 1 && c["ready"] == true).then_some(status)
        },
    )
    .await;
    let main = &status["containerStatuses"][0];
    assert_eq!(main["lastState"]["terminated"]["exitCode"], 137, "{main}");
    assert_ne!(main["state"]["running"]["startedAt"], first_start);
    assert_eq!(status["podIP"], ip.as_str(), "same pod, same address");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(ns.log_value("web-0", "boots").await, "2");
    assert!(ns.logs("web-0", true).await.contains("boots=1"));

    // Graceful deletion: preStop, then SIGTERM (handled at once, long before the 10 s grace
    // period); the StatefulSet's new pod finds the claim's data.
    let old_uid = ns.pod("web-0").await.unwrap().uid().unwrap();
    let deleted = Instant::now();
    ns.api::<Pod>()
        .delete("web-0", &DeleteParams::default())
        .await
        .expect("delete web-0");
    wait_for("the old web-0 gone", Duration::from_secs(20), || async {
        let pod = ns.pod("web-0").await;
        (pod.and_then(|p| p.uid()).as_deref() != Some(old_uid.as_str())).then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "preStop (1 s) then SIGTERM: {took:?}"
    );
    ns.ready("web-0").await;
    assert_eq!(ns.log_value("web-0", "boots").await, "3");
    assert_eq!(ns.log_value("web-0", "events").await, "prestop term ");

    // The claim's directory goes with the claim (released by the runtime once unused).
    let claim_dir = ns
        .kubelet
        .state
        .join("pvcs")
        .join(&ns.name)
        .join("data-web-0");
    assert!(claim_dir.join("boots").exists());
    ns.api::<StatefulSet>()
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete sts");
    wait_for("web-0 gone", Duration::from_secs(30), || async {
        ns.pod("web-0").await.is_none().then_some(())
    })
    .await;
    ns.api::<PersistentVolumeClaim>()
        .delete("data-web-0", &DeleteParams::default())
        .await
        .expect("delete pvc");
    wait_for(
        "claim and its directory gone",
        Duration::from_secs(20),
        || async {
            let claim = ns
                .api::<PersistentVolumeClaim>()
                .get_opt("data-web-0")
                .await
                .expect("get pvc");
            (claim.is_none() && !claim_dir.exists()).then_some(())
        },
    )
    .await;
}

/// Processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_ignores_sigterm_is_killed_at_the_end_of_its_grace_period() {
    let ns = Ns::new("proc-grace").await;
    let marker = format!("stubborn-marker-{}", std::process::id());
    ns.create::<Pod>(json!({
        "metadata": {"name": "stubborn", "labels": labels("stubborn")},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": "busybox:test",
                "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done", &marker],
            }],
        },
    }))
    .await;
    let view = wait_for("stubborn running", Duration::from_secs(30), || async {
        let view = ns.runtime_view("stubborn").await?;
        (view["containers"][0]["state"] == "running").then_some(view)
    })
    .await;
    let pid = view["containers"][0]["pid"].as_u64().expect("pid");
    assert!(!processes_with(&marker).is_empty());
    let deleted = Instant::now();
    ns.api::<Pod>()
        .delete("stubborn", &DeleteParams::default())
        .await
        .expect("delete");
    // Still there after SIGTERM, within the grace period.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(ns.pod("stubborn").await.is_some(), "it ignores SIGTERM");
    assert!(!processes_with(&marker).is_empty());
    wait_for("stubborn gone", Duration::from_secs(15), || async {
        ns.pod("stubborn").await.is_none().then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
        "SIGKILL at the end of the 2 s grace period: {took:?}"
    );
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "no process left behind"
    );

    // A pod already terminating with a long grace period, deleted again with a short one
    // (`kubectl delete --grace-period=1`): killed by the new deadline, not the first.
    let marker = format!("patient-marker-{}", std::process::id());
    ns.create::<Pod>(json!({
        "metadata": {"name": "patient", "labels": labels("patient")},
        "spec": {
            "terminationGracePeriodSeconds": 120,
            "containers": [{
                "name": "main",
                "image": "busybox:test",
                "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done", &marker],
            }],
        },
    }))
    .await;
    wait_for("patient running", Duration::from_secs(30), || async {
        let view = ns.runtime_view("patient").await?;
        (view["containers"][0]["state"] == "running").then_some(())
    })
    .await;
    ns.api::<Pod>()
        .delete("patient", &DeleteParams::default())
        .await
        .expect("delete");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(ns.pod("patient").await.is_some(), "within its 120 s");
    let shortened = Instant::now();
    ns.api::<Pod>()
        .delete("patient", &DeleteParams::default().grace_period(1))
        .await
        .expect("delete with a shorter grace period");
    wait_for("patient gone", Duration::from_secs(30), || async {
        ns.pod("patient").await.is_none().then_some(())
    })
    .await;
    let took = shortened.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "SIGKILL at the end of the shortened 1 s grace period: {took:?}"
    );
    assert_eq!(processes_with(&marker), Vec::<u32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_report_why_they_cannot_run_and_how_they_ended() {
    let ns = Ns::new("proc-states").await;
    let pod = |name: &str, policy: &str, container: Value| {
        json!({
            "metadata": {"name": name, "labels": labels(name)},
            "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 1, "containers": [container]},
        })
    };
    let sh = |script: &str| json!(["sh", "-c", script]);
    for object in [
        pod(
            "no-image",
            "Always",
            json!({"name": "main", "image": "nope:1", "command": sh("sleep 100")}),
        ),
        pod(
            "no-key",
            "Always",
            json!({"name": "main", "image": "busybox:test", "command": sh("sleep 100"),
            "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]}),
        ),
        pod(
            "no-command",
            "Always",
            json!({"name": "main", "image": "busybox:test", "args": ["-c", "true"]}),
        ),
        pod(
            "never-ready",
            "Always",
            json!({"name": "main", "image": "busybox:test", "command": sh("sleep 100"),
            "readinessProbe": {"tcpSocket": {"port": 9}, "periodSeconds": 1}}),
        ),
        pod(
            "exits",
            "Never",
            json!({"name": "main", "image": "busybox:test", "command": sh("echo bye; exit 3")}),
        ),
        pod(
            "completes",
            "OnFailure",
            json!({"name": "main", "image": "busybox:test", "command": sh("exit 0")}),
        ),
    ] {
        ns.create::<Pod>(object).await;
    }
    // As CN pods get their preStop hook: an init container of the operator's image copies the
    // binary (found through the pod's PATH) into an emptyDir; the main container runs it.
    ns.create::<Pod>(json!({
        "metadata": {"name": "hook-install", "labels": labels("hook-install")},
        "spec": {
            "restartPolicy": "Never",
            "volumes": [{"name": "hook", "emptyDir": {}}],
            "initContainers": [{
                "name": "install", "image": "mo-operator:e2e",
                "command": ["mo-operator", "install-hook", "/mo-test/hook/mo-operator"],
                "env": [{"name": "PATH", "value": "/opt/mo-test/bin:/usr/bin:/bin"}],
                "volumeMounts": [{"name": "hook", "mountPath": "/mo-test/hook"}],
            }],
            "containers": [{
                "name": "main", "image": "busybox:test",
                "command": ["/mo-test/hook/mo-operator", "--version"],
                "volumeMounts": [{"name": "hook", "mountPath": "/mo-test/hook", "readOnly": true}],
            }],
        },
    }))
    .await;
    let waiting = |name: &'static str| {
        let ns = &ns;
        async move {
            wait_for(
                &format!("{name} waiting"),
                Duration::from_secs(30),
                || async {
                    let status = ns.status(name).await;
                    let w = status["containerStatuses"][0]["state"]["waiting"].clone();
                    w["message"].is_string().then_some(w)
                },
            )
            .await
        }
    };
    let w = waiting("no-image").await;
    assert_eq!(w["reason"], "ErrImagePull");
    assert!(w["message"].as_str().unwrap().contains("nope:1"), "{w}");
    let w = waiting("no-key").await;
    assert_eq!(w["reason"], "CreateContainerConfigError");
    assert!(w["message"].as_str().unwrap().contains("absent"), "{w}");
    let w = waiting("no-command").await;
    assert_eq!(w["reason"], "CreateContainerError");
    assert!(
        w["message"].as_str().unwrap().contains("explicit command"),
        "{w}"
    );

    let status = wait_for("exits Failed", Duration::from_secs(30), || async {
        let status = ns.status("exits").await;
        (status["phase"] == "Failed").then_some(status)
    })
    .await;
    let t = &status["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 3, "{status}");
    assert_eq!(t["reason"], "Error");
    assert_eq!(status["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(ns.logs("exits", false).await, "bye\n");
    wait_for("completes Succeeded", Duration::from_secs(30), || async {
        (ns.status("completes").await["phase"] == "Succeeded").then_some(())
    })
    .await;
    wait_for(
        "hook-install Succeeded",
        Duration::from_secs(30),
        || async { (ns.status("hook-install").await["phase"] == "Succeeded").then_some(()) },
    )
    .await;
    assert!(
        ns.logs("hook-install", false)
            .await
            .starts_with("mo-operator "),
        "the installed binary ran"
    );

    // Running, started, never ready: nothing listens on its probe's port.
    wait_for("never-ready running", Duration::from_secs(30), || async {
        let status = ns.status("never-ready").await;
        (status["containerStatuses"][0]["started"] == true).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = ns.status("never-ready").await;
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["containerStatuses"][0]["ready"], false);
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready["status"], "False", "{ready}");
}
