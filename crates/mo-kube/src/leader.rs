//! Leader election on a `coordination.k8s.io/v1` Lease, and the fence no replica acts outside of.
//!
//! Why two leaders can never act at once:
//! - A standby takes the lease only after it has seen the same Lease record (its
//!   resourceVersion) for a whole `duration` on its own monotonic clock. Wall clocks of two
//!   machines are never compared.
//! - The holder measures from the moment it *sent* a renewal that then landed: the standby saw
//!   that renewal later than it was sent, so it cannot take over before `sent + duration`.
//! - The holder's [`Leadership`] closes at `sent + duration - margin`, on its own clock, whether
//!   or not the next renewal has answered (a renewal that hangs is simply never a success).
//!   Every act (a reconcile, a review that records a decision, the webhook configuration) runs
//!   inside [`Leadership::act`], which refuses to start after that instant and cuts what is still
//!   running at it.
//!
//! Every write carries the Lease's resourceVersion, so two replicas racing for it cannot both
//! win; a holder going away on purpose releases the lease so a standby need not wait.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// A Lease record unchanged this long may be taken over.
    pub duration: Duration,
    /// How often the holder renews (and a standby looks); each attempt may take this long.
    pub renew: Duration,
}

impl LeaseConfig {
    /// How long before the standby could take over the holder stops acting: room for a
    /// request cut at the fence to leave the wire, and for two clocks' rates to differ.
    pub fn margin(&self) -> Duration {
        self.duration / 5
    }
}

/// This replica acted outside its lease (or never held it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this replica does not hold the leader lease (or its renewal is overdue): it does not act")]
pub struct NotLeading;

/// The right to act: open until an instant that each landed renewal moves on. Cloned freely;
/// every clone sees the same fence.
#[derive(Clone, Debug)]
pub struct Leadership {
    until: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership::new()
    }
}

impl Leadership {
    /// Closed: nothing may act until a lease is won.
    pub fn new() -> Leadership {
        Leadership {
            until: Arc::new(watch::channel(None).0),
        }
    }

    /// Open until `until` (tests and the elector).
    pub fn open_until(&self, until: Instant) {
        self.until.send_replace(Some(until));
    }

    /// Closed for good: every act in progress is cut, none starts.
    pub fn close(&self) {
        self.until.send_replace(None);
    }

    /// When the fence closes unless a renewal lands first.
    pub fn until(&self) -> Option<Instant> {
        *self.until.borrow()
    }

    pub fn is_leading(&self) -> bool {
        self.until().is_some_and(|until| Instant::now() < until)
    }

    /// Runs `work` only while this replica leads: refused when the fence is closed, cut (the
    /// future dropped) the moment it closes. Work is idempotent and recorded before it acts, so
    /// a cut leaves nothing half-done that the next leader cannot resume.
    pub async fn act<F: Future>(&self, work: F) -> Result<F::Output, NotLeading> {
        let mut changes = self.until.subscribe();
        tokio::pin!(work);
        loop {
            let until = match *changes.borrow_and_update() {
                Some(until) if Instant::now() < until => until,
                _ => return Err(NotLeading),
            };
            tokio::select! {
                biased;
                out = &mut work => return Ok(out),
                // A renewal moved the fence, or it was closed: look again.
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the lease (created, renewed or taken over).
    Holding,
    /// Someone else holds a lease we have not yet seen unchanged for a whole duration.
    Standby { holder: String },
}

/// What a standby last saw of the lease: the record and when (its own clock).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    resource_version: String,
    at: Instant,
}

/// What to do with the Lease as read now.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Renew,
    TakeOver,
    Wait { holder: String },
}

/// The rule, apart from the API: ours → renew; released (no holder) → take; someone else's →
/// take only once the same record was seen unchanged for `duration` on our clock.
fn judge(
    identity: &str,
    holder: &str,
    resource_version: &str,
    seen: &mut Option<Seen>,
    now: Instant,
    duration: Duration,
) -> Verdict {
    if holder == identity {
        return Verdict::Renew;
    }
    if holder.is_empty() {
        return Verdict::TakeOver;
    }
    match seen {
        Some(s) if s.resource_version == resource_version => {
            if now.duration_since(s.at) >= duration {
                Verdict::TakeOver
            } else {
                Verdict::Wait {
                    holder: holder.to_string(),
                }
            }
        }
        _ => {
            *seen = Some(Seen {
                resource_version: resource_version.to_string(),
                at: now,
            });
            Verdict::Wait {
                holder: holder.to_string(),
            }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    seen: Mutex<Option<Seen>>,
    leadership: Leadership,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig, leadership: Leadership) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            seen: Mutex::new(None),
            leadership,
        }
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
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

    /// One attempt to acquire or renew, bounded by the renew interval. A success opens the
    /// fence until `sent + duration - margin`, `sent` being when this attempt began.
    pub async fn try_acquire(&self) -> Result<Attempt, String> {
        let sent = Instant::now();
        let attempt = tokio::time::timeout(self.config.renew, self.attempt())
            .await
            .map_err(|_| format!("no answer within {:?}", self.config.renew))?
            .map_err(|e| e.to_string())?;
        if attempt == Attempt::Holding {
            let until = sent + self.config.duration - self.config.margin();
            // Never move the fence back (an older attempt answering late).
            if self.leadership.until().is_none_or(|u| u < until) {
                self.leadership.open_until(until);
            }
        }
        Ok(attempt)
    }

    async fn attempt(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
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
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let verdict = judge(
            &self.config.identity,
            &holder,
            &version,
            &mut self.seen.lock().expect("lease lock"),
            Instant::now(),
            self.config.duration,
        );
        let ours = match verdict {
            Verdict::Wait { holder } => return Ok(Attempt::Standby { holder }),
            Verdict::Renew => true,
            Verdict::TakeOver => false,
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours { spec.acquire_time } else { None };
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

    /// Waits until we hold the lease (the fence is then open).
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

    /// Renews until the lease is lost or the fence closes before a renewal lands; then closes
    /// the fence and returns why (the caller stops).
    pub async fn keep(&self) -> String {
        loop {
            let next = Instant::now() + self.config.renew;
            let Some(until) = self.leadership.until() else {
                return "leadership was closed".into();
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = tokio::time::sleep_until(until) => {
                    self.leadership.close();
                    return "the lease could not be renewed before this replica's fence closed".into();
                }
            }
            match self.try_acquire().await {
                Ok(Attempt::Holding) => {}
                Ok(Attempt::Standby { holder }) => {
                    self.leadership.close();
                    return format!("lease taken by {holder}");
                }
                Err(e) => tracing::warn!(error = %e, "renewing the leader lease failed"),
            }
            if !self.leadership.is_leading() {
                self.leadership.close();
                return "the lease could not be renewed before this replica's fence closed".into();
            }
        }
    }

    /// Gives the lease up (the fence must be closed and the acts finished first): a standby
    /// takes it at its next look instead of waiting a whole duration.
    pub async fn release(&self) -> Result<(), String> {
        self.leadership.close();
        let release = async {
            let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
                return Ok(());
            };
            let mut spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            lease.spec = Some(spec);
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        tokio::time::timeout(self.config.renew, release)
            .await
            .map_err(|_| format!("no answer within {:?}", self.config.renew))?
            .map_err(|e: kube::Error| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_over_only_after_seeing_one_record_for_a_whole_duration() {
        let mut seen = None;
        let t0 = Instant::now();
        let wait = |v: Verdict| matches!(v, Verdict::Wait { .. });
        assert!(wait(judge("b", "a", "1", &mut seen, t0, D)));
        assert!(wait(judge(
            "b",
            "a",
            "1",
            &mut seen,
            t0 + D - Duration::from_millis(1),
            D
        )));
        // A renewal (a new record) seen late restarts the count from when it was seen.
        assert!(wait(judge(
            "b",
            "a",
            "2",
            &mut seen,
            t0 + D + Duration::from_secs(1),
            D
        )));
        assert!(wait(judge("b", "a", "2", &mut seen, t0 + 2 * D, D)));
        assert_eq!(
            judge(
                "b",
                "a",
                "2",
                &mut seen,
                t0 + 2 * D + Duration::from_secs(1),
                D
            ),
            Verdict::TakeOver
        );
        assert_eq!(judge("a", "a", "9", &mut None, t0, D), Verdict::Renew);
        assert_eq!(
            judge("b", "", "9", &mut None, t0, D),
            Verdict::TakeOver,
            "a released lease is taken at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_act_is_refused_after_the_fence_and_cut_at_it() {
        let leadership = Leadership::new();
        assert_eq!(leadership.act(async { 1 }).await, Err(NotLeading));
        leadership.open_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(leadership.act(async { 2 }).await, Ok(2));
        let started = Instant::now();
        let cut = leadership
            .act(tokio::time::sleep(Duration::from_secs(60)))
            .await;
        assert_eq!(cut, Err(NotLeading));
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(10),
            "cut at the fence"
        );
        assert!(!leadership.is_leading());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_lets_an_act_run_on_and_a_close_cuts_it_at_once() {
        let leadership = Leadership::new();
        leadership.open_until(Instant::now() + Duration::from_secs(10));
        let renewer = leadership.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(8)).await;
            renewer.open_until(Instant::now() + Duration::from_secs(10));
        });
        let work = leadership
            .act(tokio::time::sleep(Duration::from_secs(15)))
            .await;
        assert_eq!(work, Ok(()), "the fence moved on before the work ended");

        let closer = leadership.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            closer.close();
        });
        let started = Instant::now();
        let cut = leadership
            .act(tokio::time::sleep(Duration::from_secs(5)))
            .await;
        assert_eq!(cut, Err(NotLeading));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
