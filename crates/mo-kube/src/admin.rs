//! The operator's side of the MatrixOne admin API: one reading of the kernel per tick and the
//! kernel calls the decision core asks for.
//!
//! The transport is JSON over HTTP to the endpoint given with `--admin-endpoint` (the
//! simulated data plane serves it). Every failure is kept typed: an unreachable endpoint, a
//! timeout or an error status become [`ObservationError`] / [`ActionError`] values the core
//! treats as uncertainty, never as an answer.

use mo_core::{Action, ActionError, ActionOutput, KernelView, ObservationError};
use std::time::Duration;

/// Path of a cluster's kernel reading on the admin API.
pub fn kernel_path(namespace: &str, cluster: &str) -> String {
    format!("/v1/namespaces/{namespace}/clusters/{cluster}/kernel")
}

/// Path of a cluster's kernel calls on the admin API.
pub fn calls_path(namespace: &str, cluster: &str) -> String {
    format!("/v1/namespaces/{namespace}/clusters/{cluster}/calls")
}

#[derive(Clone)]
pub struct AdminClient {
    base: String,
    http: reqwest::Client,
}

impl AdminClient {
    /// `base` like `http://127.0.0.1:9400`; `timeout` bounds every request.
    pub fn new(base: &str, timeout: Duration) -> Result<AdminClient, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// The kernel's state as far as it answers; an unreachable endpoint is uncertainty.
    pub async fn kernel_view(&self, namespace: &str, cluster: &str) -> KernelView {
        let url = format!("{}{}", self.base, kernel_path(namespace, cluster));
        let response = match self.http.get(&url).send().await {
            Ok(r) => r,
            Err(e) => return KernelView::unreachable(observation_error(&e)),
        };
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            // The endpoint does not know this cluster: not an empty cluster, unknown.
            return KernelView::unreachable(ObservationError::DoesNotExist(format!(
                "admin API has no cluster {namespace}/{cluster}"
            )));
        }
        if !status.is_success() {
            return KernelView::unreachable(ObservationError::Unavailable(format!(
                "admin API answered {status}"
            )));
        }
        match response.json::<KernelView>().await {
            Ok(view) => view,
            Err(e) => KernelView::unreachable(ObservationError::Unavailable(format!(
                "admin API answer unreadable: {e}"
            ))),
        }
    }

    pub async fn call(
        &self,
        namespace: &str,
        cluster: &str,
        action: &Action,
    ) -> Result<ActionOutput, ActionError> {
        let url = format!("{}{}", self.base, calls_path(namespace, cluster));
        let response = self
            .http
            .post(&url)
            .json(action)
            .send()
            .await
            .map_err(|e| action_error(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(ActionError::Unavailable(format!(
                "admin API answered {status}"
            )));
        }
        response
            .json::<Result<ActionOutput, ActionError>>()
            .await
            .map_err(|e| ActionError::Unavailable(format!("admin API answer unreadable: {e}")))?
    }
}

fn observation_error(e: &reqwest::Error) -> ObservationError {
    if e.is_timeout() {
        ObservationError::Timeout(format!("admin API: {e}"))
    } else {
        ObservationError::Unavailable(format!("admin API: {e}"))
    }
}

fn action_error(e: &reqwest::Error) -> ActionError {
    if e.is_timeout() {
        // The call may or may not have happened: the core re-checks before relying on it.
        ActionError::Timeout(format!("admin API: {e}"))
    } else {
        ActionError::Unavailable(format!("admin API: {e}"))
    }
}
