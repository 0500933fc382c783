//! Which Secrets a cluster may name. Pods read the Secrets their spec names, and the operator
//! creates the pods: without a rule, whoever may create a cluster could have any Secret of the
//! namespace handed to the kernel (an S3 access key sent to an endpoint of their choosing). So
//! a Secret a cluster names must carry [`LABEL_USABLE`] (`"true"`), set by whoever owns it; a
//! cluster naming another is refused (InvalidSpec, naming the field), and its pods are not
//! made. The operator reads the Secret's metadata only, never its data.

use crate::crd::MatrixOneCluster;
use crate::validation::FieldError;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

/// The label that opens a Secret to the namespace's MatrixOne clusters.
pub const LABEL_USABLE: &str = "ops.matrixorigin.io/cluster-secret";

/// The Secrets the spec names, each with the field naming it.
pub fn referenced(cluster: &MatrixOneCluster) -> Vec<(&'static str, String)> {
    let spec = &cluster.spec;
    let mut out = Vec::new();
    if let Some(s) = &spec.root_password_secret {
        out.push(("spec.rootPasswordSecret.name", s.name.clone()));
    }
    if let Some(c) = spec
        .shared_storage
        .s3
        .as_ref()
        .and_then(|s| s.credentials_secret.as_ref())
    {
        out.push((
            "spec.sharedStorage.s3.credentialsSecret.name",
            c.name.clone(),
        ));
    }
    out
}

/// Refusals for the named Secrets that are missing or not opened to clusters; an error when
/// the API server could not say (nothing is made then either: the caller retries).
pub async fn verify(
    client: &Client,
    namespace: &str,
    secrets: &[(&'static str, String)],
) -> Result<Vec<FieldError>, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut errors = Vec::new();
    for (field, name) in secrets {
        let meta = api.get_metadata_opt(name).await?;
        let message = match meta {
            None => format!(
                "Secret {name} does not exist (it must, with the label {LABEL_USABLE}=true)"
            ),
            Some(m) if usable(m.metadata.labels.as_ref()) => continue,
            Some(_) => format!(
                "Secret {name} is not open to MatrixOne clusters: its owner labels it \
                 {LABEL_USABLE}=true to allow it"
            ),
        };
        errors.push(FieldError {
            field: (*field).to_string(),
            message,
        });
    }
    Ok(errors)
}

fn usable(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(LABEL_USABLE)).map(String::as_str) == Some("true")
}
