//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder acts.
//!
//! The holder renews every `renew`; another replica takes the lease only after it has not been
//! renewed for `duration`. Every write carries the Lease's resourceVersion, so two replicas
//! racing for it cannot both win. A holder that fails to renew before its own deadline stops
//! acting (the caller exits) — it never keeps acting on a lease it may have lost.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew: Duration,
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the lease until at least this long from now.
    Holding,
    /// Someone else holds a live lease.
    Standby { holder: String },
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew.
    pub async fn try_acquire(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let existing = self.api.get_opt(&self.config.name).await?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, 0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Holding),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Standby {
                    holder: "unknown (created concurrently)".into(),
                }),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(MicroTime(renewed)), Some(seconds)) => {
                now.duration_since(*renewed) > SignedDuration::from_secs(i64::from(seconds))
            }
            _ => true,
        };
        if !ours && !expired && !holder.is_empty() {
            return Ok(Attempt::Standby { holder });
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(now, transitions, acquired));
        // The resourceVersion in `lease` makes this a compare-and-swap.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Holding),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Standby {
                holder: "unknown (lost a race)".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Waits until we hold the lease.
    pub async fn acquire(&self) {
        let mut last_holder = String::new();
        loop {
            match self.try_acquire().await {
                Ok(Attempt::Holding) => {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "acquired the leader lease");
                    return;
                }
                Ok(Attempt::Standby { holder }) => {
                    if holder != last_holder {
                        tracing::info!(%holder, "standing by: another replica leads");
                        last_holder = holder;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "leader lease unavailable; retrying"),
            }
            tokio::time::sleep(self.config.renew).await;
        }
    }

    /// Renews until a renewal fails to land before the lease would expire; then returns
    /// (the caller must stop acting).
    pub async fn keep(&self) -> String {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.renew).await;
            match self.try_acquire().await {
                Ok(Attempt::Holding) => last_renewed = tokio::time::Instant::now(),
                Ok(Attempt::Standby { holder }) => {
                    return format!("lease taken by {holder}");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the leader lease failed");
                    // Stop well before another replica could take over.
                    if last_renewed.elapsed() + self.config.renew >= self.config.duration {
                        return format!("could not renew the lease: {e}");
                    }
                }
            }
        }
    }
}
