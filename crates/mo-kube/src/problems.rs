//! What is wrong with a cluster's configuration, found where Kubernetes and the kernel say it
//! (a StorageClass that does not exist, a container the kubelet cannot configure because a
//! Secret or key is missing, a kernel that exits at start because it cannot use its bucket),
//! each named by the spec field to fix. Pure: the controller gathers the facts, this reads them.
//!
//! The operator reads no Secret itself: the kubelet's own refusal names what is missing.

use crate::crd::MatrixOneCluster;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Texts the kernel (its S3 client, `pkg/fileservice`) prints when it cannot use the bucket.
const STORAGE_ERRORS: [&str; 8] = [
    "NoSuchBucket",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "bucket does not exist",
    "The specified bucket does not exist",
    "no such host",
    "InvalidBucketName",
];

/// Storage classes the spec names, with the field naming each.
pub fn storage_classes(cluster: &MatrixOneCluster) -> Vec<(&'static str, String)> {
    let spec = &cluster.spec;
    [
        ("spec.log.storage.storageClassName", &spec.log.storage),
        ("spec.tn.storage.storageClassName", &spec.tn.storage),
    ]
    .into_iter()
    .filter_map(|(field, s)| s.storage_class_name.clone().map(|c| (field, c)))
    .collect()
}

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .chain(
            status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten(),
        )
}

/// Problems, each starting with the spec field to fix. `missing_classes`: storage classes the
/// spec names that the API server does not have.
pub fn find(
    cluster: &MatrixOneCluster,
    pods: &[Arc<Pod>],
    missing_classes: &[String],
) -> Vec<String> {
    let mut found = BTreeSet::new();
    for (field, class) in storage_classes(cluster) {
        if missing_classes.contains(&class) {
            found.insert(format!("{field}: StorageClass \"{class}\" does not exist"));
        }
    }
    let spec = &cluster.spec;
    let mut secrets: Vec<(String, &'static str)> = Vec::new();
    if let Some(s) = &spec.root_password_secret {
        secrets.push((s.name.clone(), "spec.rootPasswordSecret"));
    }
    if let Some(c) = spec
        .shared_storage
        .s3
        .as_ref()
        .and_then(|s| s.credentials_secret.as_ref())
    {
        secrets.push((c.name.clone(), "spec.sharedStorage.s3.credentialsSecret"));
    }
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        for status in statuses(pod) {
            let waiting = status.state.as_ref().and_then(|s| s.waiting.as_ref());
            if let Some(w) = waiting
                && w.reason.as_deref() == Some("CreateContainerConfigError")
            {
                let message = w.message.clone().unwrap_or_default();
                let field = secrets
                    .iter()
                    .find(|(secret, _)| message.contains(&format!("\"{secret}\"")))
                    .map_or("spec", |(_, field)| *field);
                found.insert(format!("{field}: {name} cannot start: {message}"));
            }
            if let Some(w) = waiting
                && matches!(
                    w.reason.as_deref(),
                    Some("ErrImagePull" | "ImagePullBackOff" | "InvalidImageName")
                )
            {
                found.insert(format!(
                    "spec.image / spec.version: {name} cannot pull {}: {}",
                    status.image,
                    w.message.clone().unwrap_or_default()
                ));
            }
            if spec.shared_storage.s3.is_some() {
                let terminated = status
                    .state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .or(status
                        .last_state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref()));
                let message = terminated
                    .and_then(|t| t.message.clone())
                    .unwrap_or_default();
                if let Some(error) = STORAGE_ERRORS.iter().find(|e| message.contains(*e)) {
                    found.insert(format!(
                        "spec.sharedStorage.s3: the kernel in {name} cannot use the bucket ({error}): {}",
                        last_line_with(&message, error)
                    ));
                }
            }
        }
    }
    found.into_iter().collect()
}

fn last_line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .rev()
        .find(|l| l.contains(needle))
        .unwrap_or(text)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MatrixOneClusterSpec;

    fn cluster() -> MatrixOneCluster {
        let spec: MatrixOneClusterSpec = serde_json::from_value(serde_json::json!({
            "version": "v1.2.4",
            "log": {"replicas": 3, "storage": {"storageClassName": "fast"}},
            "cn": {"groups": [{"name": "tp", "replicas": 1}]},
            "sharedStorage": {"s3": {"endpoint": "http://minio:9000", "bucket": "mo",
                "credentialsSecret": {"name": "s3-keys"}}},
            "rootPasswordSecret": {"name": "root", "key": "password"},
        }))
        .expect("valid");
        MatrixOneCluster::new("mo", spec)
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mo-log-0"},
            "status": status,
        }))
        .expect("pod")
    }

    #[test]
    fn each_problem_names_the_field_to_fix() {
        let c = cluster();
        assert_eq!(
            find(&c, &[], &["fast".into()]),
            ["spec.log.storage.storageClassName: StorageClass \"fast\" does not exist"]
        );
        let missing_secret = pod(serde_json::json!({"containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError",
                "message": "secret \"s3-keys\" not found"}}}]}));
        let problems = find(&c, &[Arc::new(missing_secret)], &[]);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("spec.sharedStorage.s3.credentialsSecret: mo-log-0"),
            "{problems:?}"
        );
        let no_bucket = pod(serde_json::json!({"containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 2, "message":
                "starting\npanic: NoSuchBucket: The specified bucket does not exist\n"}}}]}));
        let problems = find(&c, &[Arc::new(no_bucket)], &[]);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("spec.sharedStorage.s3: the kernel in mo-log-0")),
            "{problems:?}"
        );
        let healthy = pod(serde_json::json!({"containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {}}}]}));
        assert!(find(&c, &[Arc::new(healthy)], &[]).is_empty());
    }
}
