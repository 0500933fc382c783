//! From Kubernetes objects and the kernel's answers to the decision core's [`Observation`]:
//! a pure function, so the mapping is tested without a cluster.

use crate::crd::MatrixOneCluster;
use crate::resources::{
    ANNOTATION_VERSION, LABEL_CLUSTER, LABEL_COMPONENT, LABEL_PREPULL, pod_name, version_of_image,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use mo_core::component::cn_uuid;
use mo_core::{
    Component, DesiredState, KernelView, Millis, Observation, PodObservation, PodPhase,
    RemovalReason, RemovalRequest, UpgradeSpec,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The MatrixOne pods of `cluster` among `pods` (pre-pull pods excluded).
pub fn cluster_pods<'a>(cluster: &str, pods: &'a [Arc<Pod>]) -> impl Iterator<Item = &'a Pod> {
    pods.iter().map(|p| &**p).filter(move |p| {
        let labels = p.metadata.labels.as_ref();
        labels
            .and_then(|l| l.get(LABEL_CLUSTER))
            .map(String::as_str)
            == Some(cluster)
            && labels.is_some_and(|l| !l.contains_key(LABEL_PREPULL))
    })
}

pub fn component_of(pod: &Pod) -> Option<Component> {
    pod.metadata
        .labels
        .as_ref()?
        .get(LABEL_COMPONENT)?
        .parse()
        .ok()
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What the operator keeps of a cached pod: its metadata, its status, and of its spec only the
/// node and each container's name and image (what the observation, the problems and the
/// disruption reviews read). The rest of the spec (environment, volumes, probes, affinity) is
/// most of a pod and read from the StatefulSets the operator renders, never from the pod.
pub fn trim_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    let Some(spec) = pod.spec.take() else {
        return;
    };
    let slim = |containers: Vec<Container>| -> Vec<Container> {
        containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                image: c.image,
                ..Container::default()
            })
            .collect()
    };
    pod.spec = Some(PodSpec {
        node_name: spec.node_name,
        containers: slim(spec.containers),
        init_containers: spec.init_containers.map(slim),
        ..PodSpec::default()
    });
}

/// What the operator keeps of a cached node: its name, labels and deletion, whether it takes
/// pods (cordon, taints), its conditions and the names of the images it holds. Its capacity,
/// addresses, annotations, system info and attached volumes are never read.
pub fn trim_node(node: &mut Node) {
    use k8s_openapi::api::core::v1::{ContainerImage, NodeSpec, NodeStatus};
    node.metadata.annotations = None;
    node.spec = node.spec.take().map(|spec| NodeSpec {
        unschedulable: spec.unschedulable,
        taints: spec.taints,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|status| NodeStatus {
        conditions: status.conditions,
        images: status.images.map(|images| {
            images
                .into_iter()
                .map(|image| ContainerImage {
                    names: image.names,
                    size_bytes: None,
                })
                .collect()
        }),
        ..NodeStatus::default()
    });
}

/// The version the container runs: the kubelet's report when there is one, else the spec.
pub fn running_version(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "main"))
        .and_then(|c| version_of_image(&c.image).map(str::to_string))
        .unwrap_or_else(|| spec_version(pod))
}

/// The version the pod was created with: its image tag, else its version annotation.
pub fn spec_version(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .and_then(version_of_image)
        .map(str::to_string)
        .or_else(|| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_VERSION).cloned())
        })
        .unwrap_or_default()
}

fn main_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "main")
}

/// The instance of a pod's kernel container as Kubernetes knows it (pod UID, restart count,
/// start time); None while it does not run.
pub(crate) fn container_instance(pod: &Pod) -> Option<String> {
    let status = main_status(pod)?;
    let started = status
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?;
    Some(format!(
        "{}/{}/{}",
        pod.metadata.uid.as_deref()?,
        status.restart_count,
        started.0.as_millisecond()
    ))
}

fn pod_observation(pod: &Pod, component: Component) -> PodObservation {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    PodObservation {
        cn_uuid: (component == Component::Cn).then(|| cn_uuid(&name)),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        component,
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        phase: match status.and_then(|s| s.phase.as_deref()) {
            Some("Running") => PodPhase::Running,
            // Terminal: the kubelet will not start its containers again.
            Some("Failed" | "Succeeded") => PodPhase::Failed,
            _ => PodPhase::Pending,
        },
        ready: is_ready(pod),
        version: running_version(pod),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        restarts: main_status(pod).map_or(0, |c| c.restart_count.max(0) as u32),
        started_at: main_status(pod)
            .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .map(|t| Millis(t.0.as_millisecond().max(0) as u64)),
        serving: component != Component::Proxy
            || pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::resources::LABEL_SERVING))
                .is_some_and(|v| v == "true"),
        name,
        pool_phase: None,
    }
}

/// CN pods the spec no longer asks for (a group scaled in or removed): removal requests, each
/// bound to the pod object it names.
pub fn removals(cluster: &MatrixOneCluster, pods: &[Arc<Pod>], now: Millis) -> Vec<RemovalRequest> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let wanted: Vec<String> = cluster
        .spec
        .desired_pods()
        .remove(&Component::Cn)
        .unwrap_or_default()
        .into_iter()
        .map(|short| pod_name(&name, &short))
        .collect();
    cluster_pods(&name, pods)
        .filter(|p| component_of(p) == Some(Component::Cn))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .name
                .as_ref()
                .is_some_and(|n| !wanted.contains(n))
        })
        .enumerate()
        .map(|(i, p)| RemovalRequest {
            id: i as u64,
            pod: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone().unwrap_or_default(),
            reason: RemovalReason::ScaleIn,
            requested_at: now,
        })
        .collect()
}

/// One consistent look at `cluster` for the decision core.
pub fn build(
    now: Millis,
    cluster: &MatrixOneCluster,
    pods: &[Arc<Pod>],
    nodes: &[Arc<Node>],
    kernel: KernelView,
    strategy: mo_core::Strategy,
    heartbeat_intervals: mo_core::HeartbeatIntervals,
) -> Observation {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let pod_views = cluster_pods(&name, pods)
        .filter_map(|p| component_of(p).map(|c| pod_observation(p, c)))
        .collect();
    let node_ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let node_name = |n: &Arc<Node>| n.metadata.name.clone().unwrap_or_default();
    let repository = format!("{}:", cluster.spec.image);
    let node_images: BTreeMap<String, Vec<String>> = nodes
        .iter()
        .map(|n| {
            let versions = n
                .status
                .as_ref()
                .and_then(|s| s.images.as_ref())
                .into_iter()
                .flatten()
                .flat_map(|image| image.names.clone().unwrap_or_default())
                .filter_map(|reference| reference.strip_prefix(&repository).map(str::to_string))
                .collect();
            (node_name(n), versions)
        })
        .collect();
    Observation {
        now,
        pods: pod_views,
        hakeeper: kernel.hakeeper,
        lock_allocator: kernel.lock_allocator,
        cn_activity: kernel.cn_activity,
        proxy_routes: kernel.proxy_routes,
        proxy_connections: kernel.proxy_connections,
        node_images,
        unschedulable_nodes: nodes
            .iter()
            .filter(|n| {
                n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) || !node_ready(n)
            })
            .map(node_name)
            .collect(),
        not_ready_nodes: nodes
            .iter()
            .filter(|n| !node_ready(n))
            .map(node_name)
            .collect(),
        tn_wal_tolerance: kernel.tn_wal_tolerance,
        heartbeat_intervals,
        desired: DesiredState {
            upgrade: Some(UpgradeSpec {
                target_version: cluster.spec.version.clone(),
                strategy,
            }),
            removals: removals(cluster, pods, now),
            // On Kubernetes a deleted pod is absent until its workload recreates it.
            replicas: cluster
                .spec
                .desired_pods()
                .into_iter()
                .map(|(c, names)| (c, names.len()))
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MatrixOneClusterSpec;
    use mo_core::ObservationError;

    fn cluster(replicas: i32) -> MatrixOneCluster {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v2",
            "log": {"replicas": 3},
            "sharedStorage": {"fileSystem": {"path": "/tmp/mo-shared"}},
            "cn": {"groups": [{"name": "tp", "replicas": replicas}]},
        }))
        .expect("valid");
        let mut c = MatrixOneCluster::new("mo", spec);
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("c-uid".into());
        c
    }

    fn pod(name: &str, component: &str, ready: bool, image: &str) -> Pod {
        let cluster = name.split('-').next().expect("a prefix");
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                "labels": {LABEL_CLUSTER: cluster, LABEL_COMPONENT: component}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": image}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                "containerStatuses": [{"name": "main", "image": image, "imageID": "", "ready": ready,
                    "restartCount": 2}]}
        }))
        .expect("pod")
    }

    #[test]
    fn pods_map_to_observations_with_versions_uuids_and_removals() {
        let pods = vec![
            pod("mo-log-0", "log", true, "matrixorigin/matrixone:v1"),
            pod("mo-tp-0", "cn", true, "matrixorigin/matrixone:v2"),
            pod("mo-tp-1", "cn", false, "matrixorigin/matrixone:v1"),
            pod("other-tp-0", "cn", true, "matrixorigin/matrixone:v1"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect::<Vec<_>>();
        let kernel = KernelView::unreachable(ObservationError::Timeout("admin".into()));
        let obs = build(
            Millis(5),
            &cluster(1),
            &pods,
            &[],
            kernel,
            mo_core::Strategy::default_order(),
            mo_core::HeartbeatIntervals::default(),
        );
        assert_eq!(obs.pods.len(), 3, "another cluster's pods are not ours");
        let cn = obs.pod("mo-tp-1").expect("observed");
        assert_eq!(
            (cn.version.as_str(), cn.ready, cn.restarts),
            ("v1", false, 2)
        );
        assert_eq!(cn.cn_uuid.as_deref(), Some(cn_uuid("mo-tp-1").as_str()));
        assert!(obs.pod("mo-log-0").expect("log").cn_uuid.is_none());
        assert_eq!(obs.desired.removals.len(), 1);
        assert_eq!(obs.desired.removals[0].pod, "mo-tp-1");
        assert_eq!(obs.desired.removals[0].uid, "uid-mo-tp-1");
        assert!(matches!(obs.hakeeper, Err(ObservationError::Timeout(_))));
        assert_eq!(
            obs.desired.upgrade.expect("always set").target_version,
            "v2"
        );
    }

    #[test]
    fn a_trimmed_pod_observes_as_the_whole_pod_and_keeps_a_fraction_of_it() {
        let c = cluster(2);
        let mut full = crate::resources::cn_pod(&c, "tp", 0, "v2", None);
        full.metadata.uid = Some("uid-mo-tp-0".into());
        full.spec.as_mut().expect("spec").node_name = Some("node-1".into());
        full.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Running", "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}],
                "initContainerStatuses": [{"name": "install-hook", "image": "op:1", "imageID": "",
                    "ready": true, "restartCount": 0}],
                "containerStatuses": [{"name": "main", "image": "matrixorigin/matrixone:v2",
                    "imageID": "", "ready": true, "restartCount": 3,
                    "state": {"running": {"startedAt": "2026-12-06T10:00:00Z"}}}]
            }))
            .expect("status"),
        );
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        let observe = |pod: &Pod| {
            build(
                Millis(5),
                &c,
                &[Arc::new(pod.clone())],
                &[],
                KernelView::unreachable(ObservationError::Timeout("admin".into())),
                mo_core::Strategy::default_order(),
                mo_core::HeartbeatIntervals::default(),
            )
        };
        assert_eq!(observe(&trimmed), observe(&full));
        assert_eq!(spec_version(&trimmed), "v2");
        assert_eq!(container_instance(&trimmed), container_instance(&full));
        assert_eq!(
            crate::problems::find(&c, &[Arc::new(trimmed.clone())], &[]),
            crate::problems::find(&c, &[Arc::new(full.clone())], &[])
        );
        // Of the spec (without the defaults an API server adds), a small part is kept.
        let size = |pod: &Pod| serde_json::to_vec(&pod.spec).expect("json").len();
        assert!(
            size(&trimmed) * 4 < size(&full),
            "spec trimmed to {} of {} bytes",
            size(&trimmed),
            size(&full)
        );
    }

    #[test]
    fn a_trimmed_node_observes_as_the_whole_node() {
        let node = |name: &str, ready: &str, cordoned: bool| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"zone": "a"},
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"unschedulable": cordoned, "podCIDR": "10.0.0.0/24",
                    "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {
                    "conditions": [{"type": "Ready", "status": ready}],
                    "capacity": {"cpu": "8", "memory": "32Gi"},
                    "addresses": [{"type": "InternalIP", "address": "10.1.1.1"}],
                    "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                        "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v1",
                        "machineID": "m", "operatingSystem": "linux", "osImage": "o", "systemUUID": "s"},
                    "images": [
                        {"names": ["matrixorigin/matrixone:v2", "matrixorigin/matrixone@sha256:1"], "sizeBytes": 100},
                        {"names": ["other:1"], "sizeBytes": 5}
                    ]
                }
            }))
            .expect("node")
        };
        let nodes = [
            node("n1", "True", false),
            node("n2", "False", false),
            node("n3", "True", true),
        ];
        let trimmed: Vec<Node> = nodes
            .iter()
            .cloned()
            .map(|mut n| {
                trim_node(&mut n);
                n
            })
            .collect();
        let observe = |nodes: &[Node]| {
            let nodes: Vec<Arc<Node>> = nodes.iter().cloned().map(Arc::new).collect();
            build(
                Millis(5),
                &cluster(1),
                &[],
                &nodes,
                KernelView::unreachable(ObservationError::Timeout("admin".into())),
                mo_core::Strategy::default_order(),
                mo_core::HeartbeatIntervals::default(),
            )
        };
        let whole = observe(&nodes);
        assert_eq!(observe(&trimmed), whole);
        assert_eq!(whole.not_ready_nodes, vec!["n2".to_string()]);
        assert_eq!(whole.unschedulable_nodes.len(), 2);
        assert!(
            trimmed
                .iter()
                .all(|n| n.status.as_ref().expect("status").capacity.is_none())
        );
    }
}
