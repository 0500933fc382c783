//! The admission webhooks: `pods/eviction` (every eviction of a MatrixOne pod) and, optionally,
//! `DELETE pods` by anyone but the operator, Kubernetes' own controllers and kubelets. Both
//! answer through [`crate::disruption::review`].
//!
//! TLS: the operator keeps a CA in a Secret (created on first start, renewed before it
//! expires, the previous CA kept in the bundle while certificates it signed may be in use),
//! issues its own short-lived serving certificate from it, re-issues that before expiry
//! without a restart, and keeps the `caBundle` of its ValidatingWebhookConfiguration in step.
//! With cert-manager, the serving certificate is read from a mounted directory instead and the
//! CA is injected by cert-manager's cainjector.
//!
//! Failure policy `Fail`, deliberately: when no replica answers, a MatrixOne pod cannot be
//! evicted (or deleted) — an eviction missed would be an unreviewed CN taken with its lock
//! tables, which is the incident this operator exists for; an eviction refused is a retry. The
//! blast radius is bounded: the webhooks only see namespaces that hold a MatrixOneCluster, the
//! delete webhook only MatrixOne pods (object selector) and never a pod already terminating,
//! a kubelet, Kubernetes' own pod deleters or the operator itself. Break glass: delete the
//! ValidatingWebhookConfiguration. The PodDisruptionBudgets then remain, but a CN budget
//! counts CNs, not which ones: while one CN's drain is confirmed, a budget-only evictor may
//! take any one CN.

use crate::controller::Context;
use crate::disruption::{self, Door, Review};
use crate::resources::{LABEL_MANAGED_BY, MANAGED_BY};
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, RuleWithOperations, ServiceReference, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

const DAY: u64 = 86_400;
/// CA lifetime, and how long before its end a new one replaces it.
const CA_LIFETIME: u64 = 5 * 365 * DAY;
const CA_RENEW_BEFORE: u64 = 365 * DAY;
/// Serving certificate lifetime, and how long before its end it is re-issued.
const SERVING_LIFETIME: u64 = 90 * DAY;
const SERVING_RENEW_BEFORE: u64 = 30 * DAY;

/// Kubernetes' own deleters of pods that must never wait for us: the garbage collector
/// (cluster deleted), the pod GC, namespace deletion, and the node lifecycle / taint
/// eviction (a failed node: involuntary, nothing to drain).
pub const SYSTEM_EXEMPT: &[&str] = &[
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:pod-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:serviceaccount:kube-system:node-controller",
    "system:serviceaccount:kube-system:taint-eviction-controller",
];

/// A user name that can go into a CEL string literal as is.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['\'', '\\', '"'])
}

/// The delete webhook is not called for a pod whose containers stopped for good.
pub const TERMINAL_MATCH: &str = "!has(oldObject.status) || !has(oldObject.status.phase) || \
     !(oldObject.status.phase in ['Failed', 'Succeeded'])";

pub const EVICTION_WEBHOOK: &str = "evictions.ops.matrixorigin.io";
pub const DELETE_WEBHOOK: &str = "pod-deletes.ops.matrixorigin.io";
pub const EVICTION_PATH: &str = "/validate/eviction";
pub const DELETE_PATH: &str = "/validate/pod-delete";

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("CA secret {0} is incomplete or unreadable")]
    BadSecret(String),
}

/// How the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientTarget {
    /// In a cluster: the operator's Service.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// Outside (development, tests): an HTTPS URL, e.g. `https://127.0.0.1:9443`.
    Url(String),
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// The operator's own CA, kept in this Secret.
    SelfManaged { namespace: String, secret: String },
    /// cert-manager (or anything else) mounts `tls.crt`/`tls.key` (and `ca.crt`) here;
    /// `inject_ca_from` (`<namespace>/<certificate>`) asks cert-manager to set the caBundle.
    Files {
        dir: PathBuf,
        inject_ca_from: Option<String>,
    },
}

#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Name of the ValidatingWebhookConfiguration the leader keeps.
    pub configuration: String,
    pub target: ClientTarget,
    /// DNS names / IPs the serving certificate is valid for.
    pub hosts: Vec<String>,
    pub tls: TlsSource,
    /// Also review plain deletes of MatrixOne pods.
    pub protect_deletes: bool,
    /// Users whose deletes are never reviewed (besides kubelets, kube-system controllers and
    /// the operator itself).
    pub exempt_users: Vec<String>,
    /// Only this namespace (the operator's watch namespace); otherwise every namespace that
    /// holds a MatrixOneCluster.
    pub namespace: Option<String>,
    pub timeout_seconds: i32,
}

// ---------------------------------------------------------------------------------------------
// Certificates

/// The operator's CA as stored in its Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaMaterial {
    pub cert_pem: String,
    pub key_pem: String,
    /// Unix seconds.
    pub not_after: u64,
    /// The CA it replaced, still trusted in the bundle (and signing for a while, see
    /// [`CaMaterial::signer`]).
    pub previous_cert_pem: Option<String>,
    pub previous_key_pem: Option<String>,
    pub previous_not_after: Option<u64>,
}

/// A renewed CA signs serving certificates only this long after its birth: until then the
/// previous one does, so no replica serves a certificate before the API server's caBundle
/// (re-read and re-applied within a minute) trusts its CA.
const NEW_CA_GRACE: u64 = 3600;

impl CaMaterial {
    fn born(&self) -> u64 {
        self.not_after.saturating_sub(CA_LIFETIME)
    }

    /// The CA that signs serving certificates at `now`, and until when it does.
    pub fn signer(&self, now: u64) -> (CaMaterial, Option<u64>) {
        let switch = self.born() + NEW_CA_GRACE;
        match (
            &self.previous_cert_pem,
            &self.previous_key_pem,
            self.previous_not_after,
        ) {
            (Some(cert), Some(key), Some(not_after)) if now < switch && not_after > now => (
                CaMaterial {
                    cert_pem: cert.clone(),
                    key_pem: key.clone(),
                    not_after,
                    previous_cert_pem: None,
                    previous_key_pem: None,
                    previous_not_after: None,
                },
                Some(switch),
            ),
            _ => (self.clone(), None),
        }
    }

    /// What the API server trusts: this CA and the previous one.
    pub fn bundle(&self) -> String {
        let mut bundle = self.cert_pem.clone();
        if let Some(previous) = &self.previous_cert_pem {
            bundle.push_str(previous);
        }
        bundle
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn at(secs: u64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn ca_params(now: u64) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "mo-operator-webhook-ca");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = at(now.saturating_sub(3600));
    params.not_after = at(now + CA_LIFETIME);
    Ok(params)
}

/// A new CA valid from (about) `now`.
pub fn new_ca(now: u64, previous: Option<&CaMaterial>) -> Result<CaMaterial, rcgen::Error> {
    let key = KeyPair::generate()?;
    let cert = ca_params(now)?.self_signed(&key)?;
    Ok(CaMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: now + CA_LIFETIME,
        previous_cert_pem: previous.map(|p| p.cert_pem.clone()),
        previous_key_pem: previous.map(|p| p.key_pem.clone()),
        previous_not_after: previous.map(|p| p.not_after),
    })
}

/// A serving certificate for `hosts`, signed by `ca`. Returns (cert PEM, key PEM, not_after).
pub fn issue_serving(
    ca: &CaMaterial,
    hosts: &[String],
    now: u64,
) -> Result<(String, String, u64), rcgen::Error> {
    // The issuer is rebuilt from the same distinguished name and key as the stored CA.
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::new(ca_params(now)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().map_or("mo-operator", String::as_str),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = at(now.saturating_sub(3600));
    let not_after = (now + SERVING_LIFETIME).min(ca.not_after);
    params.not_after = at(not_after);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

fn secret_field(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn ca_from_secret(secret: &Secret) -> Option<CaMaterial> {
    Some(CaMaterial {
        cert_pem: secret_field(secret, "ca.crt")?,
        key_pem: secret_field(secret, "ca.key")?,
        not_after: secret_field(secret, "ca.not-after")?.trim().parse().ok()?,
        previous_cert_pem: secret_field(secret, "previous-ca.crt"),
        previous_key_pem: secret_field(secret, "previous-ca.key"),
        previous_not_after: secret_field(secret, "previous-ca.not-after")
            .and_then(|t| t.trim().parse().ok()),
    })
}

fn secret_of(namespace: &str, name: &str, ca: &CaMaterial) -> Secret {
    let mut data = BTreeMap::from([
        (
            "ca.crt".to_string(),
            ByteString(ca.cert_pem.clone().into_bytes()),
        ),
        (
            "ca.key".to_string(),
            ByteString(ca.key_pem.clone().into_bytes()),
        ),
        (
            "ca.not-after".to_string(),
            ByteString(ca.not_after.to_string().into_bytes()),
        ),
    ]);
    for (key, value) in [
        ("previous-ca.crt", ca.previous_cert_pem.clone()),
        ("previous-ca.key", ca.previous_key_pem.clone()),
        (
            "previous-ca.not-after",
            ca.previous_not_after.map(|t| t.to_string()),
        ),
    ] {
        if let Some(value) = value {
            data.insert(key.into(), ByteString(value.into_bytes()));
        }
    }
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                LABEL_MANAGED_BY.to_string(),
                MANAGED_BY.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

/// The CA from its Secret: created when missing, replaced when it nears its end. Replicas
/// race safely: creation and replacement are conditional (create, or update on the
/// resourceVersion read), the loser reads the winner's CA.
pub async fn load_or_create_ca(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<CaMaterial, WebhookError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let now = unix_now();
        match api.get_opt(name).await? {
            None => {
                let ca = new_ca(now, None)?;
                match api
                    .create(&PostParams::default(), &secret_of(namespace, name, &ca))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(secret = name, "created the webhook CA");
                        return Ok(ca);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Some(secret) => {
                let ca = ca_from_secret(&secret)
                    .ok_or_else(|| WebhookError::BadSecret(format!("{namespace}/{name}")))?;
                if ca.not_after > now + CA_RENEW_BEFORE {
                    return Ok(ca);
                }
                let renewed = new_ca(now, Some(&ca))?;
                let mut replacement = secret_of(namespace, name, &renewed);
                replacement.metadata.resource_version = secret.metadata.resource_version.clone();
                match api
                    .replace(name, &PostParams::default(), &replacement)
                    .await
                {
                    Ok(_) => {
                        tracing::info!(secret = name, "renewed the webhook CA");
                        return Ok(renewed);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Err(WebhookError::BadSecret(format!(
        "{namespace}/{name}: kept changing while read"
    )))
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, WebhookError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| WebhookError::Tls(format!("certificate PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| WebhookError::Tls(format!("key PEM: {e}")))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| WebhookError::Tls(format!("key: {e}")))?;
    let pair = CertifiedKey::new(certs, signing);
    // A certificate read with another one's key (files swapped between two reads) is refused.
    pair.keys_match()
        .map_err(|e| WebhookError::Tls(format!("certificate and key do not match: {e}")))?;
    Ok(Arc::new(pair))
}

/// The expiry (Unix seconds) of the first certificate in `pem` (cert-manager's files).
fn certificate_not_after(pem: &str) -> Result<u64, WebhookError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| WebhookError::Tls(format!("serving certificate PEM: {e}")))?;
    let cert = block
        .parse_x509()
        .map_err(|e| WebhookError::Tls(format!("serving certificate: {e}")))?;
    Ok(cert.validity().not_after.timestamp().max(0) as u64)
}

/// The serving certificate, swapped in place when it is re-issued.
#[derive(Debug)]
pub struct RotatingCert(RwLock<Arc<CertifiedKey>>);

impl RotatingCert {
    fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().expect("cert lock") = key;
    }
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().expect("cert lock").clone())
    }
}

/// What the webhook currently serves and trusts.
struct TlsState {
    cert: Arc<RotatingCert>,
    /// The caBundle to publish (None: injected by cert-manager).
    bundle: RwLock<Option<String>>,
    /// What the serving certificate was made from (signer CA or the files' cert + key).
    source: RwLock<String>,
    /// When the serving certificate must be re-issued.
    renew_at: RwLock<u64>,
    /// When the serving certificate expires (Unix seconds).
    not_after: RwLock<u64>,
    /// When the CA Secret (or the files) are read again.
    next_check: RwLock<u64>,
}

/// How often the CA Secret (or cert-manager's files) are read again.
const CHECK_EVERY: u64 = 60;

/// The serving material: what is served and published, and when it is renewed and expires.
struct Material {
    cert: String,
    key: String,
    /// The caBundle to publish (None: injected by cert-manager).
    bundle: Option<String>,
    /// What the serving certificate was made from.
    source: String,
    renew_at: u64,
    not_after: u64,
}

/// The serving material now. A self-managed certificate is issued only when `reissue` says so
/// or its signer changed.
async fn current_material(
    client: &Client,
    settings: &WebhookSettings,
    previous_source: Option<&str>,
    reissue: bool,
) -> Result<Option<Material>, WebhookError> {
    let now = unix_now();
    match &settings.tls {
        TlsSource::SelfManaged { namespace, secret } => {
            let ca = load_or_create_ca(client, namespace, secret).await?;
            let (signer, switch_at) = ca.signer(now);
            let source = format!("{}{}", signer.cert_pem, ca.bundle());
            if !reissue && previous_source == Some(source.as_str()) {
                return Ok(None);
            }
            let (cert, key, not_after) = issue_serving(&signer, &settings.hosts, now)?;
            let renew_at = not_after
                .saturating_sub(SERVING_RENEW_BEFORE)
                .min(switch_at.unwrap_or(u64::MAX));
            Ok(Some(Material {
                cert,
                key,
                bundle: Some(ca.bundle()),
                source,
                renew_at,
                not_after,
            }))
        }
        TlsSource::Files { dir, .. } => {
            let read = |f: &str| {
                let path = dir.join(f);
                std::fs::read_to_string(&path).map_err(|source| WebhookError::Io { path, source })
            };
            let cert = read("tls.crt")?;
            let key = read("tls.key")?;
            let ca = read("ca.crt").ok();
            let source = format!("{cert}{key}{}", ca.clone().unwrap_or_default());
            if previous_source == Some(source.as_str()) {
                return Ok(None);
            }
            let not_after = certificate_not_after(&cert)?;
            Ok(Some(Material {
                cert,
                key,
                bundle: ca,
                source,
                renew_at: u64::MAX,
                not_after,
            }))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The ValidatingWebhookConfiguration

/// The configuration the leader applies, scoped to `namespaces` (those holding clusters).
pub fn configuration(
    settings: &WebhookSettings,
    bundle: Option<&str>,
    namespaces: &[String],
    operator_user: &str,
) -> ValidatingWebhookConfiguration {
    let client_config = |path: &str| WebhookClientConfig {
        ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
        service: match &settings.target {
            ClientTarget::Service {
                namespace,
                name,
                port,
            } => Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.into()),
                port: Some(*port),
            }),
            ClientTarget::Url(_) => None,
        },
        url: match &settings.target {
            ClientTarget::Url(base) => Some(format!("{}{path}", base.trim_end_matches('/'))),
            ClientTarget::Service { .. } => None,
        },
    };
    let namespace_selector = LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: Some(namespaces.to_vec()),
        }]),
        ..LabelSelector::default()
    };
    let mut webhooks = Vec::new();
    if !namespaces.is_empty() {
        // The Eviction object carries no pod labels: an object selector cannot scope this
        // one (it would match nothing); the handler lets non-MatrixOne pods through.
        // Both fail closed, answer in time and start drains only on real requests.
        let webhook = |name: &str, path: &str, operation: &str, resource: &str| ValidatingWebhook {
            name: name.into(),
            client_config: client_config(path),
            rules: Some(vec![RuleWithOperations {
                operations: Some(vec![operation.into()]),
                api_groups: Some(vec!["".into()]),
                api_versions: Some(vec!["v1".into()]),
                resources: Some(vec![resource.into()]),
                scope: Some("Namespaced".into()),
            }]),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            side_effects: "NoneOnDryRun".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(settings.timeout_seconds),
            namespace_selector: Some(namespace_selector.clone()),
            ..ValidatingWebhook::default()
        };
        // The Eviction object carries no pod labels: an object selector cannot scope this
        // one (it would match nothing); the handler lets non-MatrixOne pods through.
        webhooks.push(webhook(
            EVICTION_WEBHOOK,
            EVICTION_PATH,
            "CREATE",
            "pods/eviction",
        ));
        if settings.protect_deletes {
            let mut exempt = vec![operator_user.to_string()];
            exempt.extend(SYSTEM_EXEMPT.iter().map(|u| u.to_string()));
            exempt.extend(settings.exempt_users.iter().cloned());
            // Names with quotes or backslashes are refused when the flags are read.
            let exempt_list = exempt
                .iter()
                .filter(|u| valid_user_name(u))
                .map(|u| format!("'{u}'"))
                .collect::<Vec<_>>()
                .join(", ");
            webhooks.push(ValidatingWebhook {
                object_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        LABEL_MANAGED_BY.to_string(),
                        MANAGED_BY.to_string(),
                    )])),
                    ..LabelSelector::default()
                }),
                match_conditions: Some(vec![
                    // Already on its way out (its preStop hook holds a CN): nothing to review,
                    // and the kubelet's final delete must never wait for us.
                    MatchCondition {
                        name: "not-already-terminating".into(),
                        expression: "!has(oldObject.metadata.deletionTimestamp)".into(),
                    },
                    MatchCondition {
                        name: "not-the-operator-or-the-system".into(),
                        expression: format!(
                            "!(request.userInfo.username in [{exempt_list}]) && \
                             !request.userInfo.username.startsWith('system:node:')"
                        ),
                    },
                    // Terminal (evicted by its kubelet, its node shut down): nothing runs to
                    // protect, and the controllers that replace such pods must not wait.
                    MatchCondition {
                        name: "not-terminal".into(),
                        expression: TERMINAL_MATCH.into(),
                    },
                ]),
                ..webhook(DELETE_WEBHOOK, DELETE_PATH, "DELETE", "pods")
            });
        }
    }
    let mut annotations = BTreeMap::new();
    if let TlsSource::Files {
        inject_ca_from: Some(from),
        ..
    } = &settings.tls
    {
        annotations.insert("cert-manager.io/inject-ca-from".to_string(), from.clone());
    }
    ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta {
            name: Some(settings.configuration.clone()),
            labels: Some(BTreeMap::from([(
                LABEL_MANAGED_BY.to_string(),
                MANAGED_BY.to_string(),
            )])),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        webhooks: Some(webhooks),
    }
}

// ---------------------------------------------------------------------------------------------
// Serving

/// Shared by the HTTPS handlers: the controller context once this replica leads.
pub struct Webhook {
    settings: WebhookSettings,
    context: OnceLock<Arc<Context>>,
    operator_user: String,
    tls: TlsState,
    /// Reviews refused while this replica does not lead.
    standby_refusals: Counter,
}

impl Webhook {
    /// Loads (or creates) the certificates; `operator_user` is this operator's own identity;
    /// `standby_refusals` counts the reviews refused while this replica does not lead.
    pub async fn new(
        client: &Client,
        settings: WebhookSettings,
        operator_user: String,
        standby_refusals: Counter,
    ) -> Result<Arc<Webhook>, WebhookError> {
        let m = current_material(client, &settings, None, true)
            .await?
            .expect("issued on request");
        Ok(Arc::new(Webhook {
            settings,
            context: OnceLock::new(),
            operator_user,
            tls: TlsState {
                cert: Arc::new(RotatingCert(RwLock::new(certified_key(&m.cert, &m.key)?))),
                bundle: RwLock::new(m.bundle),
                source: RwLock::new(m.source),
                renew_at: RwLock::new(m.renew_at),
                not_after: RwLock::new(m.not_after),
                next_check: RwLock::new(unix_now() + CHECK_EVERY),
            },
            standby_refusals,
        }))
    }

    /// When the certificate served now expires (Unix seconds).
    pub fn serving_not_after(&self) -> u64 {
        *self.tls.not_after.read().expect("lock")
    }

    /// From now on this replica answers reviews (it leads).
    pub fn lead(&self, context: Arc<Context>) {
        let _ = self.context.set(context);
    }

    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, WebhookError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| WebhookError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.tls.cert.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Every minute: reads the CA Secret (or the files) again and re-issues the serving
    /// certificate when it is due or its signer changed; returns whether anything changed
    /// (then the leader applies the caBundle again).
    pub async fn refresh(&self, client: &Client) -> Result<bool, WebhookError> {
        let now = unix_now();
        if now < *self.tls.next_check.read().expect("lock") {
            return Ok(false);
        }
        *self.tls.next_check.write().expect("lock") = now + CHECK_EVERY;
        let reissue = now >= *self.tls.renew_at.read().expect("lock");
        let source = self.tls.source.read().expect("lock").clone();
        let Some(m) = current_material(client, &self.settings, Some(&source), reissue).await?
        else {
            return Ok(false);
        };
        // Checked before anything is swapped: a bad pair keeps the current one in service.
        let pair = certified_key(&m.cert, &m.key)?;
        self.tls.cert.set(pair);
        *self.tls.source.write().expect("lock") = m.source;
        *self.tls.renew_at.write().expect("lock") = m.renew_at;
        *self.tls.not_after.write().expect("lock") = m.not_after;
        *self.tls.bundle.write().expect("lock") = m.bundle;
        tracing::info!("webhook serving certificate renewed");
        Ok(true)
    }

    /// Applies the configuration for `namespaces` (the leader's job).
    pub async fn apply_configuration(
        &self,
        client: &Client,
        namespaces: &[String],
    ) -> Result<(), WebhookError> {
        let bundle = self.tls.bundle.read().expect("lock").clone();
        let vwc = configuration(
            &self.settings,
            bundle.as_deref(),
            namespaces,
            &self.operator_user,
        );
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        api.patch(
            &self.settings.configuration,
            &PatchParams::apply(crate::crd::FIELD_MANAGER).force(),
            &Patch::Apply(&vwc),
        )
        .await?;
        Ok(())
    }

    pub fn namespace_scope(&self) -> Option<&str> {
        self.settings.namespace.as_deref()
    }

    /// The routes of the HTTPS server.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route(EVICTION_PATH, post(review_handler))
            .route(DELETE_PATH, post(review_handler))
            .with_state(self.clone())
    }

    /// The leader's context, or the reason this replica cannot answer.
    pub fn context(&self) -> Result<&Arc<Context>, Review> {
        self.context.get().ok_or_else(|| {
            self.standby_refusals.inc();
            Review::deny("this operator replica is a standby, not the leader: retry")
        })
    }
}

/// Serves `router` over TLS on `listener` until the process ends (see [`serve`]).
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    router: Router,
) {
    serve(
        listener,
        Some(tokio_rustls::TlsAcceptor::from(config)),
        router,
    )
    .await
}

/// How long a client may take over its TLS handshake, and over a request's headers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 512;

/// Serves `router` on `listener` (over TLS when `tls` is given) until the process ends. A
/// client that stalls its handshake or its headers is cut, and no more than
/// [`MAX_CONNECTIONS`] are served at once: a slow or hostile client costs a bounded share.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper_util::service::TowerToHyperService::new(router);
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let served =
                match tls {
                    Some(acceptor) => {
                        let stream =
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                                .await
                            {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                        http.serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await
                    }
                    None => {
                        http.serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await
                    }
                };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
    }
}

fn respond(request: &AdmissionRequest<DynamicObject>, review: Review) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if review.allowed {
        return response;
    }
    let mut response = response.deny(review.reason);
    // 429: every evictor (kubectl drain, the autoscalers) retries on it; 404: nothing to evict.
    response.result.code = review.code;
    response.result.reason = if review.code == 404 {
        "NotFound"
    } else {
        "TooManyRequests"
    }
    .into();
    response
}

type Shared = State<Arc<Webhook>>;

fn parse(body: AdmissionReview<DynamicObject>) -> Result<AdmissionRequest<DynamicObject>, String> {
    body.try_into()
        .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())
}

/// Both webhooks: an eviction (`pods/eviction`) or a pod delete, told apart by the request.
async fn review_handler(
    State(hook): Shared,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request = match parse(body) {
        Ok(r) => r,
        Err(invalid) => return Json(AdmissionResponse::invalid(invalid).into_review()),
    };
    let review = if request.sub_resource.as_deref() == Some("eviction") {
        eviction_review(&hook, &request).await
    } else {
        delete_review(&hook, &request).await
    };
    Json(respond(&request, review).into_review())
}

async fn eviction_review(hook: &Webhook, request: &AdmissionRequest<DynamicObject>) -> Review {
    if request.dry_run {
        return Review::deny(
            "dry run: a real eviction of a MatrixOne pod is reviewed (and may start a drain); \
             nothing was started",
        );
    }
    let ctx = match hook.context() {
        Ok(ctx) => ctx,
        Err(standby) => return standby,
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    // The evictor may name the instance it means (deleteOptions.preconditions.uid).
    let uid = request.object.as_ref().and_then(|o| {
        o.data
            .pointer("/deleteOptions/preconditions/uid")
            .and_then(|u| u.as_str())
            .map(str::to_string)
    });
    disruption::review(
        ctx.clone(),
        namespace,
        request.name.clone(),
        uid,
        None,
        Door::Eviction,
    )
    .await
}

async fn delete_review(hook: &Webhook, request: &AdmissionRequest<DynamicObject>) -> Review {
    let allow = |reason: &str| Review::allow(reason);
    if request.operation != Operation::Delete {
        return allow("not a delete");
    }
    let user = request.user_info.username.clone().unwrap_or_default();
    if user == hook.operator_user
        || hook.settings.exempt_users.contains(&user)
        || SYSTEM_EXEMPT.contains(&user.as_str())
        || user.starts_with("system:node:")
    {
        return allow("the operator's own (or an exempt) delete");
    }
    let pod: Option<Pod> = request
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
        .and_then(|v| serde_json::from_value(v).ok());
    let Some(pod) = pod else {
        return Review::deny("the request carries no pod: retry");
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return allow("already terminating");
    }
    if matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    ) {
        return allow("terminal: its containers stopped for good");
    }
    if request.dry_run {
        return Review::deny(
            "dry run: a real delete of a MatrixOne pod is reviewed (and may start a drain); \
             nothing was started",
        );
    }
    let ctx = match hook.context() {
        Ok(ctx) => ctx,
        Err(standby) => return standby,
    };
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid();
    disruption::review(
        ctx.clone(),
        namespace,
        name,
        uid,
        Some(pod),
        Door::Delete { user },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that sends half a request and then nothing is cut at the header timeout; the
    /// server goes on serving others.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_stalls_its_headers_is_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(serve(listener, None, router));
        let mut stalled = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        stalled
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        let started = tokio::time::Instant::now();
        let mut answer = Vec::new();
        let _ = stalled.read_to_end(&mut answer).await;
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_TIMEOUT && waited < HEADER_TIMEOUT * 2,
            "{waited:?}"
        );
        let mut fine = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        fine.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        fine.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn a_serving_certificate_chains_to_the_stored_ca() {
        let now = unix_now();
        let ca = new_ca(now, None).expect("ca");
        let (cert, key, not_after) = issue_serving(
            &ca,
            &["mo-operator.ops.svc".into(), "127.0.0.1".into()],
            now,
        )
        .expect("issued");
        assert_eq!(not_after, now + SERVING_LIFETIME);
        // The expiry read back from the PEM (how cert-manager's files are judged) is the same.
        assert_eq!(certificate_not_after(&cert).expect("parsed"), not_after);
        assert!(certificate_not_after("not a certificate").is_err());
        certified_key(&cert, &key).expect("rustls accepts it");
        // Verified the way the API server does: against the CA bundle.
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(ca.bundle().as_bytes()) {
            roots.add(der.expect("pem")).expect("root");
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let leaf = CertificateDer::pem_slice_iter(cert.as_bytes())
            .next()
            .expect("one")
            .expect("pem");
        let name = rustls::pki_types::ServerName::try_from("mo-operator.ops.svc").expect("name");
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &name,
                &[],
                rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(now)),
            )
            .expect("chains to the CA");
        let other = rustls::pki_types::ServerName::try_from("evil.example").expect("name");
        assert!(
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &other,
                    &[],
                    rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(now)),
                )
                .is_err()
        );
        // A renewed CA keeps the previous one trusted in the bundle, and the previous one
        // signs for an hour more (until every caBundle trusts the new one).
        let renewed = new_ca(now, Some(&ca)).expect("renewed");
        assert!(renewed.bundle().contains(&ca.cert_pem));
        assert!(renewed.bundle().contains(&renewed.cert_pem));
        let (signer, until) = renewed.signer(now);
        assert_eq!(signer.cert_pem, ca.cert_pem);
        assert_eq!(until, Some(now + NEW_CA_GRACE));
        let (later, none) = renewed.signer(now + NEW_CA_GRACE);
        assert_eq!(later.cert_pem, renewed.cert_pem);
        assert_eq!(none, None);
        issue_serving(&signer, &["x".into()], now).expect("the previous CA still signs");
        // A certificate with another certificate's key is refused.
        let (_, other_key, _) = issue_serving(&ca, &["y".into()], now).expect("issued");
        assert!(certified_key(&cert, &other_key).is_err());
    }

    fn settings(protect_deletes: bool) -> WebhookSettings {
        WebhookSettings {
            configuration: "mo-operator".into(),
            target: ClientTarget::Service {
                namespace: "mo-system".into(),
                name: "mo-operator-webhook".into(),
                port: 443,
            },
            hosts: vec!["mo-operator-webhook.mo-system.svc".into()],
            tls: TlsSource::SelfManaged {
                namespace: "mo-system".into(),
                secret: "mo-operator-webhook-ca".into(),
            },
            protect_deletes,
            exempt_users: vec!["admin-breakglass".into()],
            namespace: None,
            timeout_seconds: 10,
        }
    }

    #[test]
    fn the_configuration_fails_closed_and_is_scoped_to_cluster_namespaces() {
        let vwc = configuration(
            &settings(true),
            Some("PEM"),
            &["db".into()],
            "system:serviceaccount:mo-system:mo-operator",
        );
        let hooks = vwc.webhooks.expect("webhooks");
        assert_eq!(hooks.len(), 2);
        for h in &hooks {
            assert_eq!(h.failure_policy.as_deref(), Some("Fail"));
            assert_eq!(h.side_effects, "NoneOnDryRun");
            let values = h
                .namespace_selector
                .as_ref()
                .unwrap()
                .match_expressions
                .as_ref()
                .unwrap()[0]
                .values
                .clone();
            assert_eq!(values, Some(vec!["db".to_string()]));
            assert_eq!(
                h.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
                Some(b"PEM".to_vec())
            );
        }
        let eviction = &hooks[0];
        assert!(
            eviction.object_selector.is_none(),
            "an Eviction has no pod labels"
        );
        let delete = &hooks[1];
        let conditions = delete.match_conditions.as_ref().expect("conditions");
        assert!(
            conditions[1]
                .expression
                .contains("system:serviceaccount:mo-system:mo-operator")
        );
        assert!(conditions[1].expression.contains("admin-breakglass"));
        // Off switch, and no namespace with a cluster: nothing intercepted.
        let off = configuration(&settings(false), None, &["db".into()], "me");
        assert_eq!(off.webhooks.expect("list").len(), 1);
        let none = configuration(&settings(true), None, &[], "me");
        assert!(none.webhooks.expect("list").is_empty());
    }

    #[test]
    fn a_refusal_is_a_429_with_the_reason() {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction",
                "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "requestSubResource": "eviction",
                "name": "mo-tp-0",
                "namespace": "db",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": "mo-tp-0", "namespace": "db"},
                    "deleteOptions": {"preconditions": {"uid": "u-1"}}},
                "oldObject": null,
                "dryRun": false,
                "options": null
            }
        }))
        .expect("a review");
        let request = parse(review).expect("a request");
        assert_eq!(
            request
                .object
                .as_ref()
                .and_then(|o| o.data.pointer("/deleteOptions/preconditions/uid"))
                .and_then(|u| u.as_str()),
            Some("u-1")
        );
        let response = respond(&request, Review::deny("draining first"));
        let json = serde_json::to_value(response.into_review()).expect("json");
        assert_eq!(json["response"]["allowed"], false);
        assert_eq!(json["response"]["status"]["code"], 429);
        assert_eq!(json["response"]["status"]["message"], "draining first");
        assert_eq!(
            json["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
    }
}
