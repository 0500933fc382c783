//! The test control plane starts, serves the API with RBAC, and runs the real controllers.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use std::time::Duration;

#[tokio::test]
async fn the_control_plane_serves_and_its_statefulset_controller_creates_pods() {
    let plane = mo_testenv::shared().expect("control plane");
    // The README's start-time figure: `cargo test -p mo-testenv -- --nocapture` prints it.
    if let Some(took) = plane.started_in() {
        println!(
            "control plane started in {:.1} s (etcd, kube-apiserver, kube-controller-manager)",
            took.as_secs_f64()
        );
    }
    let client = plane.client().await.expect("client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "testenv-smoke"}
    }))
    .expect("namespace");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    let sts: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "serviceName": "web",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "example:1"}]}
            }
        }
    }))
    .expect("statefulset");
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), "testenv-smoke");
    api.create(&PostParams::default(), &sts)
        .await
        .expect("create statefulset");
    let pods: Api<Pod> = Api::namespaced(client, "testenv-smoke");
    let mut names = Vec::new();
    // Generous (the controller creates them within a second when idle); fails only if it never does.
    for _ in 0..1200 {
        names = pods
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>();
        if names.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    names.sort();
    assert_eq!(names, vec!["web-0".to_string(), "web-1".to_string()]);
}
