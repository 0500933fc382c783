//! `mo-operator run`: the Kubernetes operator (leader-elected controller + HTTP endpoints).

use anyhow::{Context as _, Result};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use mo_kube::controller::{self, Clients, Context, Settings};
use mo_kube::disruption::Door;
use mo_kube::kernel::{KernelClients, KernelSettings};
use mo_kube::leader::{LeaderElector, Leadership, LeaseConfig};
use mo_kube::metrics::Metrics;
use mo_kube::resources::DrainHook;
use mo_kube::webhook::{ClientTarget, TlsSource, Webhook, WebhookSettings};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Timeout of each RPC to the kernel (HAKeeper, the TN lock allocator, CN query
    /// services); it is also the deadline sent with the request. A timeout is uncertainty:
    /// the pod stays protected.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub kernel_timeout: Duration,
    /// The log service's RPC port on LOG pods: HAKeeper is looked for at `podIP:port` of
    /// each LOG pod of the cluster.
    #[arg(long, default_value_t = mo_kube::kernel::DEFAULT_HAKEEPER_PORT)]
    pub hakeeper_port: u16,
    /// Ask this address for the HAKeeper's replicas instead of probing the LOG pods
    /// (`{cluster}` and `{namespace}` are replaced), e.g.
    /// `{cluster}-log-discovery.{namespace}.svc:32001`.
    #[arg(long)]
    pub hakeeper_discovery_address: Option<String>,
    /// How often each cluster is observed and decided on when nothing changes; any change of
    /// its pods, their nodes, its budgets or the cluster object wakes it at once.
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub tick: Duration,
    /// How often a calm cluster (nothing under way or held, every pod Ready) is observed; any
    /// change wakes it at once, and disruption reviews read the kernel afresh.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub idle_tick: Duration,
    /// Watch events of one cluster closer together than this wake one reconcile.
    #[arg(long, default_value = "20ms", value_parser = duration)]
    pub debounce: Duration,
    /// The kernel of one cluster is read at most once per this.
    #[arg(long, default_value = "100ms", value_parser = duration)]
    pub min_kernel_read_gap: Duration,
    /// Health, readiness and metrics endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Namespace of the leader-election Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    #[arg(long, default_value = "mo-operator-leader")]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: the pod name, else host-pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Manage only clusters in this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// A Lease not renewed this long may be taken over. The leader stops acting a fifth of it
    /// earlier unless a renewal sent since has landed.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// How long one Kubernetes API request may wait for its answer (watches excepted).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub api_timeout: Duration,
    /// The preStop hook command CN pods run (empty: CN pods get no hook). The binary must be
    /// in the CN image or mounted into it.
    #[arg(
        long,
        value_delimiter = ' ',
        default_value = "/mo-operator-hook/mo-operator drain-hook"
    )]
    pub drain_hook_command: Vec<String>,
    /// The operator's own image: CN pods get an init container that installs the hook binary
    /// from it (unset: the CN image must carry the hook command).
    #[arg(long, env = "MO_OPERATOR_IMAGE")]
    pub drain_hook_image: Option<String>,
    /// The URL CN pods' preStop hook reaches this operator at (its HTTP `--listen` port
    /// through its Service). Unset: no hook.
    #[arg(long, env = "MO_DRAIN_HOOK_ENDPOINT")]
    pub drain_hook_endpoint: Option<String>,
    /// Serve the admission webhooks (HTTPS) here; unset: no webhooks.
    #[arg(long)]
    pub webhook_listen: Option<String>,
    /// Name of the ValidatingWebhookConfiguration the leader keeps.
    #[arg(long, default_value = "mo-operator")]
    pub webhook_configuration: String,
    /// The API server reaches the webhooks through this Service (`<namespace>/<name>:<port>`)…
    #[arg(long, default_value = "mo-system/mo-operator-webhook:443")]
    pub webhook_service: String,
    /// …or at this HTTPS URL (outside a cluster, tests), which takes precedence.
    #[arg(long)]
    pub webhook_url: Option<String>,
    /// Names the serving certificate is valid for (default: the Service's DNS names; add the
    /// URL's host).
    #[arg(long, value_delimiter = ',')]
    pub webhook_hosts: Vec<String>,
    /// Secret (`<namespace>/<name>`) holding the operator's webhook CA.
    #[arg(long, default_value = "mo-system/mo-operator-webhook-ca")]
    pub webhook_ca_secret: String,
    /// Take the serving certificate from this directory (`tls.crt`, `tls.key`, `ca.crt`; e.g. a
    /// cert-manager Secret mounted) instead of the operator's own CA.
    #[arg(long)]
    pub webhook_cert_dir: Option<String>,
    /// With --webhook-cert-dir: `<namespace>/<certificate>` for cert-manager's CA injection.
    #[arg(long)]
    pub webhook_inject_ca_from: Option<String>,
    /// Also review plain deletes of MatrixOne pods (off switch: `--protect-pod-deletes=false`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub protect_pod_deletes: bool,
    /// Users whose pod deletes are never reviewed (break-glass accounts).
    #[arg(long, value_delimiter = ',')]
    pub delete_exempt_users: Vec<String>,
    /// The API server's timeout for one webhook call.
    #[arg(long, default_value_t = 10)]
    pub webhook_timeout_seconds: i32,
    /// A directory under which clusters may keep `fileSystem` shared storage, a hostPath
    /// volume (repeatable). None by default: a hostPath is a way into the node, so only a
    /// directory the platform team sets aside for it is allowed.
    #[arg(long = "allow-host-path-under", value_name = "DIR")]
    pub host_path_prefixes: Vec<String>,
}

pub fn duration(text: &str) -> Result<Duration, String> {
    mo_kube::crd::parse_go_duration(text)
        .map(|m| Duration::from_millis(m.0))
        .ok_or_else(|| format!("`{text}` is not a duration like 500ms, 2s or 1m"))
}

/// `?newest=N`: percentiles over the newest N samples only (e.g. a steady state after a ramp).
#[derive(serde::Deserialize)]
struct Newest {
    newest: Option<usize>,
}

struct Health {
    metrics: Arc<Metrics>,
    hook_auth: mo_kube::hook_auth::HookAuth,
    ready: AtomicBool,
    /// Set once this replica leads: the drain hook's reviews need the controller's state.
    context: OnceLock<Arc<Context>>,
}

#[derive(serde::Deserialize, serde::Serialize)]
pub struct HookRequest {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

#[derive(serde::Deserialize, serde::Serialize)]
pub struct HookAnswer {
    pub allowed: bool,
    pub reason: String,
}

/// The preStop hook of a deleted CN asks whether its instance may stop now. Only the pod
/// itself may ask: its token (projected by the kubelet for the hook's audience) is reviewed by
/// the API server and must be bound to the very instance the request names.
async fn drain_hook(
    State(h): State<Arc<Health>>,
    headers: axum::http::HeaderMap,
    Json(request): Json<HookRequest>,
) -> (StatusCode, Json<HookAnswer>) {
    let refuse = |code: StatusCode, reason: String| {
        (
            code,
            Json(HookAnswer {
                allowed: false,
                reason,
            }),
        )
    };
    let Some(ctx) = h.context.get() else {
        h.metrics.standby_refusals.inc();
        return refuse(
            StatusCode::OK,
            "this operator replica is a standby, not the leader: retry".into(),
        );
    };
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let claim = mo_kube::hook_auth::Claim {
        namespace: request.namespace.clone(),
        pod: request.pod.clone(),
        uid: request.uid.clone(),
    };
    if let Err(why) = h.hook_auth.verify(ctx.client(), token, &claim).await {
        h.metrics.hook_refusals.inc();
        tracing::warn!(namespace = %request.namespace, pod = %request.pod, %why, "drain-hook request refused");
        return refuse(StatusCode::UNAUTHORIZED, why);
    }
    let review = mo_kube::disruption::review(
        ctx.clone(),
        request.namespace,
        request.pod,
        Some(request.uid),
        None,
        Door::PreStop,
    )
    .await;
    (
        StatusCode::OK,
        Json(HookAnswer {
            allowed: review.allowed,
            reason: review.reason,
        }),
    )
}

fn split_ref(text: &str, what: &str) -> Result<(String, String)> {
    text.split_once('/')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .with_context(|| format!("{what} must be <namespace>/<name>, not `{text}`"))
}

fn webhook_settings(args: &Args) -> Result<WebhookSettings> {
    let (svc_ns, rest) = split_ref(&args.webhook_service, "--webhook-service")?;
    let (svc_name, port) = match rest.split_once(':') {
        Some((n, p)) => (
            n.to_string(),
            p.parse::<i32>().context("--webhook-service port")?,
        ),
        None => (rest, 443),
    };
    let target = match &args.webhook_url {
        Some(url) => ClientTarget::Url(url.clone()),
        None => ClientTarget::Service {
            namespace: svc_ns.clone(),
            name: svc_name.clone(),
            port,
        },
    };
    let mut hosts = args.webhook_hosts.clone();
    if hosts.is_empty() {
        hosts = vec![
            format!("{svc_name}.{svc_ns}.svc"),
            format!("{svc_name}.{svc_ns}.svc.cluster.local"),
        ];
    }
    let tls = match &args.webhook_cert_dir {
        Some(dir) => TlsSource::Files {
            dir: dir.into(),
            inject_ca_from: args.webhook_inject_ca_from.clone(),
        },
        None => {
            let (namespace, secret) = split_ref(&args.webhook_ca_secret, "--webhook-ca-secret")?;
            TlsSource::SelfManaged { namespace, secret }
        }
    };
    if let Some(bad) = args
        .delete_exempt_users
        .iter()
        .find(|u| !mo_kube::webhook::valid_user_name(u))
    {
        anyhow::bail!("--delete-exempt-users: `{bad}` is not a plain user name");
    }
    Ok(WebhookSettings {
        configuration: args.webhook_configuration.clone(),
        target,
        hosts,
        tls,
        protect_deletes: args.protect_pod_deletes,
        exempt_users: args.delete_exempt_users.clone(),
        namespace: args.watch_namespace.clone(),
        timeout_seconds: args.webhook_timeout_seconds,
    })
}

/// Who this operator is to the API server (its deletes are not reviewed by its own webhook).
async fn own_username(client: &kube::Client) -> Result<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await
        .context("asking the API server who this operator is (SelfSubjectReview)")?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .context("the SelfSubjectReview named no user")
}

/// The leader keeps the webhook configuration in step with the clusters' namespaces and the
/// CA bundle; every replica renews its serving certificate.
async fn keep_webhook(
    webhook: Arc<Webhook>,
    client: kube::Client,
    leadership: Leadership,
    metrics: Arc<Metrics>,
) {
    use mo_kube::crd::MatrixOneCluster;
    let mut applied: Option<(Vec<String>, std::time::Instant)> = None;
    loop {
        let renewed = match webhook.refresh(&client).await {
            Ok(changed) => changed,
            Err(e) => {
                tracing::warn!(error = %e, "renewing the webhook certificate failed; retrying");
                false
            }
        };
        metrics
            .webhook_certificate_expiry
            .set(i64::try_from(webhook.serving_not_after()).unwrap_or(i64::MAX));
        if leadership.is_leading() {
            let namespaces = match webhook.namespace_scope() {
                Some(ns) => Ok(vec![ns.to_string()]),
                None => kube::Api::<MatrixOneCluster>::all(client.clone())
                    .list_metadata(&Default::default())
                    .await
                    .map(|list| {
                        let set: std::collections::BTreeSet<String> = list
                            .items
                            .iter()
                            .filter_map(|c| c.metadata.namespace.clone())
                            .collect();
                        set.into_iter().collect()
                    }),
            };
            match namespaces {
                Ok(namespaces) => {
                    let due = renewed
                        || applied.as_ref().is_none_or(|(ns, at)| {
                            *ns != namespaces || at.elapsed() >= Duration::from_secs(300)
                        });
                    if due {
                        let applied_now = leadership
                            .act(webhook.apply_configuration(&client, &namespaces))
                            .await;
                        match applied_now {
                            Err(not_leading) => {
                                tracing::warn!(error = %not_leading, "webhook configuration not applied")
                            }
                            Ok(Ok(())) => {
                                tracing::info!(?namespaces, "webhook configuration applied");
                                applied = Some((namespaces, std::time::Instant::now()));
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(error = %e, "applying the webhook configuration failed")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing clusters for the webhook scope failed")
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

pub async fn run(args: Args) -> Result<()> {
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes API configuration (in-cluster or KUBECONFIG)")?;
    let clients = Clients::new(config, args.api_timeout).context("building the API clients")?;
    let client = clients.requests.clone();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health {
        metrics: metrics.clone(),
        hook_auth: Default::default(),
        ready: AtomicBool::new(false),
        context: OnceLock::new(),
    });
    serve_endpoints(&args.listen, health.clone()).await?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let leadership = Leadership::new();
    // Webhooks are served by every replica (a standby refuses with 429: retry), so the API
    // server always finds one answering while the lease changes hands.
    let webhook = match &args.webhook_listen {
        Some(listen) => Some(start_webhook(&args, listen, &client, &leadership, &metrics).await?),
        None => None,
    };
    // A standby replica is healthy and ready: it is ready to take over.
    health.ready.store(true, Ordering::Relaxed);
    let elector = Arc::new(LeaderElector::new(
        client.clone(),
        LeaseConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity.clone(),
            duration: args.lease_duration,
            renew: args.lease_duration / 4,
        },
        leadership.clone(),
    ));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        _ = elector.acquire() => {}
        _ = terminate.recv() => return Ok(()),
        _ = tokio::signal::ctrl_c() => return Ok(()),
    }
    metrics.leader.set(1);
    // Renewing starts now, while the caches sync: a lease won is never left to lapse unseen.
    let mut keeper = tokio::spawn({
        let elector = elector.clone();
        async move { elector.keep().await }
    });
    let context = Context::start(
        clients,
        kernel_clients(&args),
        metrics.clone(),
        controller_settings(&args, identity),
        leadership.clone(),
    )
    .await;
    let _ = health.context.set(context.clone());
    if let Some(webhook) = &webhook {
        webhook.lead(context.clone());
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut controller = tokio::spawn(controller::run(context, async move {
        let _ = stop_rx.await;
    }));
    let exit = tokio::select! {
        lost = &mut keeper => {
            // The fence is closed: nothing acts from here on, whatever is still running.
            let reason = lost.unwrap_or_else(|e| format!("the lease keeper failed: {e}"));
            tracing::error!(%reason, "stopped leading; exiting");
            3
        }
        ended = &mut controller => {
            leadership.close();
            let reason = match ended {
                Err(e) if e.is_panic() => "the controller panicked".to_string(),
                Err(e) => format!("the controller task failed: {e}"),
                Ok(()) => "the controller stopped".to_string(),
            };
            tracing::error!(%reason, "the controller is gone: releasing the lease and exiting");
            release(&elector).await;
            1
        }
        _ = terminate.recv() => stop_leading(&elector, stop_tx, controller).await,
        _ = tokio::signal::ctrl_c() => stop_leading(&elector, stop_tx, controller).await,
    };
    metrics.leader.set(0);
    std::process::exit(exit);
}

/// A graceful stop: the fence closes (every act in progress is cut, none starts), the
/// controller winds down, and the lease is released so a standby takes over at once.
async fn stop_leading(
    elector: &LeaderElector,
    stop: tokio::sync::oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<()>,
) -> i32 {
    tracing::info!("shutting down: closing the fence, then releasing the lease");
    elector.leadership().close();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    release(elector).await;
    0
}

async fn release(elector: &LeaderElector) {
    match elector.release().await {
        Ok(()) => tracing::info!("leader lease released"),
        Err(e) => {
            tracing::warn!(error = %e, "releasing the lease failed; a standby takes it when it expires")
        }
    }
}

/// Health, readiness, metrics, the latency figures and the CN preStop hook's endpoint.
async fn serve_endpoints(listen: &str, health: Arc<Health>) -> Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(h): State<Arc<Health>>| async move {
                if h.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(h): State<Arc<Health>>| async move { h.metrics.encode() }),
        )
        .route(
            "/debug/reconcile-latency",
            get(
                |State(h): State<Arc<Health>>, Query(q): Query<Newest>| async move {
                    let (p50, p99, samples) = h.metrics.latency_percentiles(q.newest);
                    Json(serde_json::json!({"p50_ms": p50, "p99_ms": p99, "samples": samples}))
                },
            ),
        )
        .route(
            "/debug/review-latency",
            get(|State(h): State<Arc<Health>>| async move {
                let (p50, p99, samples) = h.metrics.review_percentiles();
                Json(serde_json::json!({"p50_ms": p50, "p99_ms": p99, "samples": samples}))
            }),
        )
        .route(
            "/debug/reaction-latency",
            get(
                |State(h): State<Arc<Health>>, Query(q): Query<Newest>| async move {
                    let (p50, p99, samples) = h.metrics.reaction_percentiles(q.newest);
                    Json(serde_json::json!({"p50_ms": p50, "p99_ms": p99, "samples": samples}))
                },
            ),
        )
        .route("/v1/drain-hook", post(drain_hook))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    // Header timeouts and a connection cap, as the webhooks have.
    tokio::spawn(mo_kube::webhook::serve(listener, None, app));
    Ok(())
}

async fn start_webhook(
    args: &Args,
    listen: &str,
    client: &kube::Client,
    leadership: &Leadership,
    metrics: &Arc<Metrics>,
) -> Result<Arc<Webhook>> {
    let settings = webhook_settings(args)?;
    let user = own_username(client).await?;
    tracing::info!(%user, "the operator's own identity (its deletes are not reviewed)");
    let webhook = Webhook::new(client, settings, user, metrics.standby_refusals.clone())
        .await
        .context("setting up the webhook certificates")?;
    let config = webhook.server_config()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    tokio::spawn(mo_kube::webhook::serve_tls(
        listener,
        config,
        webhook.router(),
    ));
    tokio::spawn(keep_webhook(
        webhook.clone(),
        client.clone(),
        leadership.clone(),
        metrics.clone(),
    ));
    Ok(webhook)
}

fn kernel_clients(args: &Args) -> Arc<KernelClients> {
    Arc::new(KernelClients::new(KernelSettings {
        timeout: args.kernel_timeout,
        hakeeper_port: args.hakeeper_port,
        discovery_address: args.hakeeper_discovery_address.clone(),
    }))
}

fn controller_settings(args: &Args, identity: String) -> Settings {
    let drain_hook = match (
        &args.drain_hook_endpoint,
        args.drain_hook_command.is_empty(),
    ) {
        (Some(endpoint), false) => Some(DrainHook {
            command: args.drain_hook_command.clone(),
            endpoint: endpoint.clone(),
            image: args.drain_hook_image.clone(),
        }),
        _ => None,
    };
    Settings {
        tick: args.tick,
        idle_tick: args.idle_tick,
        debounce: args.debounce,
        min_kernel_read_gap: args.min_kernel_read_gap,
        reapply_every: Duration::from_secs(600),
        instance: identity,
        namespace: args.watch_namespace.clone(),
        drain_hook,
        rules: mo_kube::validation::OperatorRules {
            host_path_prefixes: args.host_path_prefixes.clone(),
        },
    }
}
