//! `mo-operator drain-hook`: the preStop hook of CN pods. It blocks until the operator says
//! the drain of *this* instance (namespace, pod name and pod UID from the downward API) is
//! confirmed, then returns and lets the kubelet stop the CN. It never gives up on its own:
//! an unreachable operator or a refusal means wait; only the pod's termination grace period
//! (Kubernetes' bound, sized for the drain) ends the wait otherwise.

use crate::operate::{HookAnswer, HookRequest};
use anyhow::{Context as _, Result};
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The operator's HTTP endpoint.
    #[arg(long, env = "MO_OPERATOR_ENDPOINT")]
    pub endpoint: String,
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    #[arg(long, env = "POD_NAME")]
    pub pod: String,
    #[arg(long, env = "POD_UID")]
    pub uid: String,
    /// Pause between two questions.
    #[arg(long, default_value = "2s", value_parser = crate::operate::duration)]
    pub interval: Duration,
    /// The token proving which pod asks (projected by the kubelet; read again at every
    /// question, as the kubelet renews it).
    #[arg(long, env = "MO_OPERATOR_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// Installs this executable at `path` (mode 0755).
pub fn install(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().context("locating this executable")?;
    std::fs::copy(&me, path).with_context(|| format!("copying to {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))?;
    println!("installed {}", path.display());
    Ok(())
}

/// Never returns an error: a hook that fails lets the kubelet stop the CN at once.
pub async fn run(args: Args) -> Result<()> {
    let client = loop {
        match reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
        {
            Ok(c) => break c,
            Err(e) => {
                eprintln!("{}: waiting: cannot build an HTTP client: {e}", args.pod);
                tokio::time::sleep(args.interval).await;
            }
        }
    };
    // Several endpoints (comma-separated) are tried in turn: one Service URL in a cluster,
    // each replica's own address elsewhere. Only the leader answers; standbys say so.
    let urls: Vec<String> = args
        .endpoint
        .split(',')
        .map(|e| format!("{}/v1/drain-hook", e.trim().trim_end_matches('/')))
        .collect();
    let request = HookRequest {
        namespace: args.namespace.clone(),
        pod: args.pod.clone(),
        uid: args.uid.clone(),
    };
    let mut last = String::new();
    loop {
        let mut reasons = Vec::new();
        let mut allowed = false;
        let token = args
            .token_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|t| t.trim().to_string());
        for url in &urls {
            let mut post = client.post(url).json(&request);
            if let Some(token) = &token {
                post = post.bearer_auth(token);
            }
            let answer = match post.send().await {
                Ok(r) if r.status().is_success() || r.status() == 401 => r
                    .json::<HookAnswer>()
                    .await
                    .map_err(|e| format!("unreadable answer: {e}")),
                Ok(r) => Err(format!("operator answered {}", r.status())),
                Err(e) => Err(format!("operator unreachable: {e}")),
            };
            match answer {
                Ok(a) if a.allowed => {
                    allowed = true;
                    reasons = vec![a.reason];
                    break;
                }
                Ok(a) => reasons.push(a.reason),
                Err(e) if urls.len() == 1 => reasons.push(e),
                // Another replica's address that is not up: not a reason worth showing.
                Err(_) => {}
            }
        }
        let reason = reasons.join("; ");
        if allowed {
            eprintln!("{}: drain confirmed, stopping: {reason}", args.pod);
            return Ok(());
        }
        if reason != last {
            eprintln!("{}: waiting: {reason}", args.pod);
            last = reason;
        }
        tokio::time::sleep(args.interval).await;
    }
}
