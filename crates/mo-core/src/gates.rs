//! Functional gates, evaluated from one fresh observation each time (never a cached "healthy").
//! A gate answers `Ok(())` or the reason it fails, phrased for a person reading a condition.

use crate::component::Component;
use crate::observe::{
    ClusterDetails, CnStoreView, LogShardView, Observation, PodObservation, PodPhase, WorkState,
};
use crate::time::Millis;

pub type Gate = Result<(), String>;

pub fn majority(replicas: usize) -> usize {
    replicas / 2 + 1
}

fn details(obs: &Observation) -> Result<&ClusterDetails, String> {
    obs.hakeeper
        .as_ref()
        .map_err(|e| format!("cannot read HAKeeper: {e}"))
}

fn pod_running(pod: &PodObservation) -> bool {
    pod.phase == PodPhase::Running && pod.ready && !pod.terminating
}

/// Before a LOG store restarts: every shard it serves has a leader and enough *other*
/// caught-up replicas that a majority survives without it; its peers are Ready.
pub fn log_restart_margin(obs: &Observation, store: &str) -> Gate {
    for peer in obs.pods_of(Component::Log).filter(|p| p.name != store) {
        if !pod_running(peer) {
            return Err(format!("LOG peer {} is not Ready", peer.name));
        }
    }
    let d = details(obs)?;
    for shard in d.log_shards.iter().filter(|s| serves(s, store)) {
        if shard.leader.is_none() {
            return Err(format!("shard {} has no leader", shard.shard_id));
        }
        let others = shard
            .replicas
            .iter()
            .filter(|r| r.store != store && r.up && r.caught_up)
            .count();
        let needed = majority(shard.replicas.len());
        if others < needed {
            return Err(format!(
                "shard {}: only {others} other caught-up replicas, {needed} needed to keep a majority without {store}",
                shard.shard_id
            ));
        }
    }
    Ok(())
}

fn serves(shard: &LogShardView, store: &str) -> bool {
    shard.replicas.iter().any(|r| r.store == store)
}

/// Shards led by `store`, with a caught-up peer to hand leadership to.
pub fn leadership_to_move(obs: &Observation, store: &str) -> Vec<(u64, String)> {
    let Ok(d) = details(obs) else {
        return Vec::new();
    };
    d.log_shards
        .iter()
        .filter(|s| s.leader.as_deref() == Some(store))
        .filter_map(|s| {
            s.replicas
                .iter()
                .find(|r| r.store != store && r.up && r.caught_up)
                .map(|r| (s.shard_id, r.store.clone()))
        })
        .collect()
}

/// After a LOG store restarted: its replicas rejoined and caught up, every shard has a leader.
pub fn log_replica_healthy(obs: &Observation, store: &str, version: &str) -> Gate {
    let pod = obs
        .pod(store)
        .ok_or_else(|| format!("{store} has no pod"))?;
    pod_on_version(pod, version)?;
    let d = details(obs)?;
    for shard in d.log_shards.iter().filter(|s| serves(s, store)) {
        if shard.leader.is_none() {
            return Err(format!("shard {} has no leader", shard.shard_id));
        }
        let replica = shard
            .replicas
            .iter()
            .find(|r| r.store == store)
            .expect("filtered on serves");
        if !replica.up {
            return Err(format!("{store} has not rejoined shard {}", shard.shard_id));
        }
        if !replica.caught_up {
            return Err(format!(
                "{store} is not caught up on shard {}",
                shard.shard_id
            ));
        }
    }
    Ok(())
}

pub fn pod_on_version(pod: &PodObservation, version: &str) -> Gate {
    if !pod_running(pod) {
        return Err(format!("{} is not Running and Ready", pod.name));
    }
    if pod.version != version {
        return Err(format!("{} runs {}, not {version}", pod.name, pod.version));
    }
    Ok(())
}

/// The WAL shard (the one the TN writes; shard 1) accepts commits.
pub fn wal_writable(d: &ClusterDetails) -> Gate {
    let shard = d
        .log_shards
        .iter()
        .find(|s| s.shard_id == 1)
        .ok_or("no WAL shard in HAKeeper's view")?;
    if shard.leader.is_none() {
        return Err("WAL shard has no leader".into());
    }
    let caught_up = shard
        .replicas
        .iter()
        .filter(|r| r.up && r.caught_up)
        .count();
    if caught_up < majority(shard.replicas.len()) {
        return Err(format!(
            "WAL shard has {caught_up} caught-up replicas, no majority"
        ));
    }
    Ok(())
}

/// `startedAt` has one-second precision, and HAKeeper's ticks and ours differ a little.
pub const START_MARGIN: Millis = Millis(1_500);

/// The last heartbeat HAKeeper holds for `pod` came from its current container. HAKeeper keeps
/// a store's record (and its UpTime) across a quick restart and cannot tell the new process
/// from the old; Kubernetes can. The old process was gone before the new container started,
/// so a heartbeat younger than the container can only be the new process's.
pub fn heard_since_start(obs: &Observation, pod: &PodObservation, heartbeat_age: Millis) -> Gate {
    let started = pod
        .started_at
        .ok_or_else(|| format!("{}: its container's start time is unknown", pod.name))?;
    let running_for = obs.now - started;
    if running_for <= heartbeat_age + START_MARGIN {
        return Err(format!(
            "{}: no heartbeat yet from the container started {running_for} ago (HAKeeper's last is {heartbeat_age} old)",
            pod.name
        ));
    }
    Ok(())
}

/// TN: Running on `version`, heartbeating from its current container, WAL writable.
pub fn tn_healthy(obs: &Observation, version: &str) -> Gate {
    let pod = obs.pods_of(Component::Tn).next().ok_or("no TN pod")?;
    pod_on_version(pod, version)?;
    let d = details(obs)?;
    let tn = d.tns.first().ok_or("TN not registered with HAKeeper")?;
    if tn.heartbeat_age > obs.heartbeat_intervals.tn_fresh() {
        return Err(format!("TN heartbeat is {} old", tn.heartbeat_age));
    }
    heard_since_start(obs, pod, tn.heartbeat_age)?;
    wal_writable(d)
}

pub fn cn_record<'a>(d: &'a ClusterDetails, uuid: &str) -> Option<&'a CnStoreView> {
    d.cns.iter().find(|c| c.uuid == uuid)
}

/// CN: registered with HAKeeper, heartbeating from its current container, on `version`
/// (the version it registers), Working.
pub fn cn_healthy(obs: &Observation, pod: &str, version: &str) -> Gate {
    let p = obs.pod(pod).ok_or_else(|| format!("{pod} has no pod"))?;
    pod_on_version(p, version)?;
    let uuid = p.cn_uuid.as_deref().ok_or("not a CN pod")?;
    let d = details(obs)?;
    let record = cn_record(d, uuid)
        .ok_or_else(|| format!("{pod} ({uuid}) is not registered with HAKeeper"))?;
    if record.heartbeat_age > obs.heartbeat_intervals.cn_fresh() {
        return Err(format!(
            "{pod}: last heartbeat {} ago",
            record.heartbeat_age
        ));
    }
    heard_since_start(obs, p, record.heartbeat_age)?;
    reports_its_version(obs, p, record, version)?;
    if record.work_state != WorkState::Working {
        return Err(format!(
            "{pod}: work state {:?}, not Working",
            record.work_state
        ));
    }
    Ok(())
}

/// What a CN's process reports as its version (its `CommitID`) is the version its pod runs:
/// the tag itself (a build stamped with it), or, as the kernel's own `Makefile` (the official
/// images) stamps it, a git commit hash, then the same one every other CN on that image
/// reports. The instance is known from its container (see [`heard_since_start`]); a version
/// that cannot be read holds.
fn reports_its_version(
    obs: &Observation,
    pod: &PodObservation,
    record: &CnStoreView,
    version: &str,
) -> Gate {
    let reported = record.version.as_str();
    if reported == version {
        return Ok(());
    }
    if !is_commit_hash(reported) {
        return Err(format!(
            "{}: HAKeeper reports version {reported:?}, not {version} nor a commit of it",
            pod.name
        ));
    }
    let Ok(details) = obs.hakeeper.as_ref() else {
        return Ok(());
    };
    let others: Vec<&str> = obs
        .pods_of(Component::Cn)
        .filter(|q| q.name != pod.name && q.version == pod.version)
        .filter_map(|q| q.cn_uuid.as_deref())
        .filter_map(|uuid| cn_record(details, uuid))
        .map(|r| r.version.as_str())
        .filter(|v| is_commit_hash(v))
        .collect();
    match others.iter().find(|v| !same_commit(v, reported)) {
        Some(other) => Err(format!(
            "{}: reports commit {reported}, another CN on {version} reports {other}",
            pod.name
        )),
        None => Ok(()),
    }
}

/// A git commit hash, as `git rev-parse --short` prints it (7 to 40 hex digits).
pub fn is_commit_hash(text: &str) -> bool {
    (7..=40).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Two hashes of one commit (one may be a longer prefix than the other).
fn same_commit(a: &str, b: &str) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Proxy: the pod runs `version` and routes to at least one Working CN.
pub fn proxy_healthy(obs: &Observation, pod: &str, version: &str) -> Gate {
    let p = obs.pod(pod).ok_or_else(|| format!("{pod} has no pod"))?;
    pod_on_version(p, version)?;
    if !p.serving {
        return Err(format!("{pod} is out of its Service"));
    }
    other_working_cn(obs, "")
        .map_err(|_| format!("{pod} has no CN serving the workload to route to"))?;
    match obs.proxy_routes.get(pod) {
        Some(Ok(n)) if *n > 0 => Ok(()),
        Some(Ok(_)) => Err(format!("{pod} has no Working CN to route to")),
        Some(Err(e)) => Err(format!("{pod}: {e}")),
        None => Err(format!("{pod}: no routing information")),
    }
}

/// At least one proxy other than `except` can route new sessions.
pub fn other_proxy_routes(obs: &Observation, except: Option<&str>) -> Gate {
    other_proxy_routes_excluding(obs, except.as_slice())
}

/// At least one proxy not in `except` can route new sessions.
pub fn other_proxy_routes_excluding(obs: &Observation, except: &[&str]) -> Gate {
    // What a proxy reports is only that it heartbeats and how many CNs HAKeeper lists as
    // Working: a CN must also take the workload's sessions (not an idle pooled one) and run.
    other_working_cn(obs, "")
        .map_err(|_| "no CN that serves the workload is Working for any proxy to route to")?;
    // A proxy on its way out (deleted, or evicted a moment ago) routes nothing new, however
    // long its process still runs.
    let ok = obs.proxy_routes.iter().any(|(p, r)| {
        !except.contains(&p.as_str())
            && matches!(r, Ok(n) if *n > 0)
            && obs
                .pod(p)
                .is_some_and(|pod| !pod.terminating && pod.ready && pod.serving)
    });
    if ok {
        Ok(())
    } else {
        Err(
            "no other proxy (Ready, in its Service, not terminating) can route to a Working CN"
                .into(),
        )
    }
}

/// The whole component is on `version` and functionally healthy (the gate between phases).
pub fn component_gate(obs: &Observation, component: Component, version: &str) -> Gate {
    let pods: Vec<&PodObservation> = obs.pods_of(component).collect();
    if pods.is_empty() {
        return Err(format!("no {component} pods"));
    }
    // A pod that is not there cannot be judged healthy: the gate waits for it.
    if let Some(&want) = obs.desired.replicas.get(&component) {
        let live = pods.iter().filter(|p| !p.terminating).count();
        if live < want {
            return Err(format!("{live} of {want} {component} pods exist"));
        }
    }
    match component {
        Component::Log => {
            for p in &pods {
                log_replica_healthy(obs, &p.name, version)?;
            }
            Ok(())
        }
        Component::Tn => tn_healthy(obs, version),
        Component::Cn => {
            for p in &pods {
                cn_healthy(obs, &p.name, version)?;
            }
            Ok(())
        }
        Component::Proxy => {
            for p in &pods {
                pod_on_version(p, version)?;
            }
            other_proxy_routes(obs, None)
        }
    }
}

/// Whether the CN pod takes workload sessions (an Idle pooled CN does not).
pub fn serves_workload(pod: &PodObservation) -> bool {
    !matches!(
        pod.pool_phase,
        Some(crate::observe::PoolPhase::Idle | crate::observe::PoolPhase::Draining)
    )
}

/// Another CN that serves the workload is Working and fresh, so sessions have somewhere to go.
pub fn other_working_cn(obs: &Observation, except: &str) -> Gate {
    other_working_cn_excluding(obs, except, &[])
}

/// As [`other_working_cn`], not counting CNs in `draining` (drains already under way).
pub fn other_working_cn_excluding(obs: &Observation, except: &str, draining: &[String]) -> Gate {
    let d = details(obs)?;
    let found = obs.pods_of(Component::Cn).any(|p| {
        p.name != except
            && !draining.contains(&p.name)
            && pod_running(p)
            && serves_workload(p)
            && p.cn_uuid
                .as_deref()
                .and_then(|u| cn_record(d, u))
                .is_some_and(|r| {
                    r.work_state == WorkState::Working
                        && r.heartbeat_age <= obs.heartbeat_intervals.cn_fresh()
                })
    });
    if found {
        Ok(())
    } else {
        Err(format!("no other Working CN can take {except}'s sessions"))
    }
}
