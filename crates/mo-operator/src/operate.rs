//! `mo-operator run`: the Kubernetes operator (leader-elected controller + HTTP endpoints).

use anyhow::{Context as _, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use mo_kube::admin::AdminClient;
use mo_kube::controller::{self, Settings};
use mo_kube::leader::{LeaderElector, LeaseConfig};
use mo_kube::metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Base URL of the MatrixOne admin API (the simulated data plane serves one).
    #[arg(long, env = "MO_ADMIN_ENDPOINT")]
    pub admin_endpoint: String,
    /// Timeout of each admin API request; a timeout is uncertainty (the pod stays protected).
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub admin_timeout: Duration,
    /// How often each cluster is observed and decided on.
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub tick: Duration,
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
    /// A Lease not renewed this long may be taken over.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
}

fn duration(text: &str) -> Result<Duration, String> {
    mo_kube::crd::parse_go_duration(text)
        .map(|m| Duration::from_millis(m.0))
        .ok_or_else(|| format!("`{text}` is not a duration like 500ms, 2s or 1m"))
}

struct Health {
    metrics: Arc<Metrics>,
    ready: AtomicBool,
}

pub async fn run(args: Args) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health {
        metrics: metrics.clone(),
        ready: AtomicBool::new(false),
    });
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
            get(|State(h): State<Arc<Health>>| async move {
                let (p50, p99, samples) = h.metrics.latency_percentiles();
                Json(serde_json::json!({"p50_ms": p50, "p99_ms": p99, "samples": samples}))
            }),
        )
        .with_state(health.clone());
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "HTTP endpoints stopped");
        }
    });
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    // A standby replica is healthy and ready: it is ready to take over.
    health.ready.store(true, Ordering::Relaxed);
    let elector = LeaderElector::new(
        client.clone(),
        LeaseConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity.clone(),
            duration: args.lease_duration,
            renew: args.lease_duration / 4,
        },
    );
    elector.acquire().await;
    metrics.leader.set(1);
    let admin = AdminClient::new(&args.admin_endpoint, args.admin_timeout)
        .context("building the admin API client")?;
    let settings = Settings {
        tick: args.tick,
        reapply_every: Duration::from_secs(60),
        instance: identity,
        namespace: args.watch_namespace.clone(),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(controller::run(
        client,
        admin,
        metrics.clone(),
        settings,
        async move {
            let _ = stop_rx.await;
        },
    ));
    tokio::select! {
        lost = elector.keep() => {
            // Never act on a lease that may be someone else's: stop at once.
            tracing::error!(reason = %lost, "lost the leader lease; exiting");
            std::process::exit(3);
        }
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("shutting down");
            let _ = stop_tx.send(());
            let _ = controller.await;
        }
    }
    Ok(())
}
