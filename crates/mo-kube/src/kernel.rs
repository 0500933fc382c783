//! The operator's MatrixOne adapter: one reading of the kernel per tick, and the kernel calls
//! the decision core asks for, over the kernel's own RPC protocol ([`mo_rpc`]).
//!
//! - HAKeeper: the cluster's LOG pods are its candidates (`podIP:port`, each asked
//!   `CHECK_HAKEEPER`), or a discovery address when one is configured. `GET_CLUSTER_STATE`
//!   gives every store with its last heartbeat tick.
//! - The TN lock-table allocator at the TN's registered `LockServiceAddress`.
//! - Each CN's query service at its registered `QueryAddress`.
//!
//! Every failure stays typed: a timeout, an unreachable service, "does not exist" and an
//! unsupported method become distinct [`ObservationError`] / [`ActionError`] values, which
//! the core treats as uncertainty, never as an answer.

use crate::observation::{cluster_pods, component_of, container_instance};
use k8s_openapi::api::core::v1::Pod;
use mo_core::component::{cn_uuid, store_uuid};
use mo_core::{
    Action, ActionError, ActionOutput, AllocatorView, ClusterDetails, CnActivity, CnStoreView,
    Component, DrainAnswer, HeartbeatIntervals, KernelView, LogReplicaView, LogShardView, Millis,
    ObservationError, OldestTxn, RestartAnswer, TnStoreView, WorkState,
};
use mo_rpc::pb::{lock, logservice, metadata};
use mo_rpc::{
    Discovery, ErrorKind, HaKeeperClient, LockAllocatorClient, LogStoreClient, Options,
    QueryClient, RpcError,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// HAKeeper ticks ten times a second (`hakeeper.DefaultTickPerSecond`).
pub const HAKEEPER_TICK: Millis = Millis(100);
/// Default RPC port of the log service (HAKeeper), as the kernel configures it.
pub const DEFAULT_HAKEEPER_PORT: u16 = 32001;
/// A TN reports no start time to HAKeeper. A kernel that does (the simulated one) puts it in
/// this config item of its heartbeat; without it, the TN pod's UID stands for the instance.
pub const TN_START_EPOCH_ITEM: &str = "mo-operator.start-epoch";

#[derive(Clone, Debug)]
pub struct KernelSettings {
    /// Bounds each RPC (and is the deadline sent with it).
    pub timeout: Duration,
    /// The log service RPC port on LOG pods.
    pub hakeeper_port: u16,
    /// A discovery address instead of the LOG pods' addresses; `{cluster}` and `{namespace}`
    /// are replaced (e.g. `{cluster}-log-discovery.{namespace}.svc:32001`).
    pub discovery_address: Option<String>,
}

impl Default for KernelSettings {
    fn default() -> KernelSettings {
        KernelSettings {
            timeout: Duration::from_secs(2),
            hakeeper_port: DEFAULT_HAKEEPER_PORT,
            discovery_address: None,
        }
    }
}

/// A cluster: (namespace, name).
type ClusterKey = (String, String);

/// How long a client no reading has used is kept: a restarted pod comes back at another
/// address, and the old one's client (and its connection) would otherwise stay for good.
const CLIENT_IDLE_LIMIT: Duration = Duration::from_secs(120);

/// Clients by address, each with when it was last handed out.
type Clients<C> = HashMap<String, (Arc<C>, Instant)>;

/// Clients by address, and when the pool last dropped those no longer used.
struct ClientPool<C> {
    clients: Mutex<(Clients<C>, Instant)>,
}

impl<C> Default for ClientPool<C> {
    fn default() -> Self {
        ClientPool {
            clients: Mutex::new((HashMap::new(), Instant::now())),
        }
    }
}

impl<C> ClientPool<C> {
    fn get(&self, address: &str, make: impl FnOnce() -> C) -> Arc<C> {
        self.get_at(address, Instant::now(), make)
    }

    fn get_at(&self, address: &str, now: Instant, make: impl FnOnce() -> C) -> Arc<C> {
        let mut guard = self.clients.lock().expect("clients lock");
        let (clients, pruned) = &mut *guard;
        if now.duration_since(*pruned) >= CLIENT_IDLE_LIMIT {
            clients.retain(|_, (_, used)| now.duration_since(*used) < CLIENT_IDLE_LIMIT);
            *pruned = now;
        }
        let entry = clients
            .entry(address.to_string())
            .or_insert_with(|| (Arc::new(make()), now));
        entry.1 = now;
        entry.0.clone()
    }

    #[cfg(test)]
    fn addresses(&self) -> Vec<String> {
        let mut a: Vec<String> = self
            .clients
            .lock()
            .expect("clients lock")
            .0
            .keys()
            .cloned()
            .collect();
        a.sort();
        a
    }
}

/// Clients kept between ticks, so that connections are reused.
pub struct KernelClients {
    settings: KernelSettings,
    /// Per cluster: how its HAKeeper is found, and the client found with it.
    hakeepers: Mutex<HashMap<ClusterKey, (Discovery, Arc<HaKeeperClient>)>>,
    allocators: ClientPool<LockAllocatorClient>,
    queries: ClientPool<QueryClient>,
    log_stores: ClientPool<LogStoreClient>,
    /// The TN's lock-service address per cluster, as last read from HAKeeper.
    allocator_of: Mutex<HashMap<ClusterKey, String>>,
    /// Per cluster: the CN instances (query address → Kubernetes instance) whose kernel said
    /// "not supported" to `GetReplicaCount` (v1.2 has no shard service). Asking them every tick
    /// only fills their logs; a new instance behind the address (an upgrade, a restart) is asked
    /// again, since a newer kernel may have replicas to move.
    without_replica_service: Mutex<HashMap<ClusterKey, HashMap<String, String>>>,
}

fn observation_error(e: &RpcError) -> ObservationError {
    match e.kind() {
        ErrorKind::DoesNotExist => ObservationError::DoesNotExist(e.to_string()),
        ErrorKind::Timeout => ObservationError::Timeout(e.to_string()),
        ErrorKind::Unsupported | ErrorKind::Unavailable => {
            ObservationError::Unavailable(e.to_string())
        }
    }
}

fn action_error(e: &RpcError) -> ActionError {
    // A connection lost after the request went out, or an answer that could not be read: the
    // call may have been applied, as after a timeout (a second restart request to an entry
    // that already may restart wedges it, so the core must not take it for "not applied").
    if matches!(
        e,
        RpcError::ConnectionLost { .. } | RpcError::Malformed { .. }
    ) {
        return ActionError::Timeout(e.to_string());
    }
    match e.kind() {
        ErrorKind::DoesNotExist => ActionError::DoesNotExist(e.to_string()),
        // The call may or may not have happened: the core re-checks before relying on it.
        ErrorKind::Timeout => ActionError::Timeout(e.to_string()),
        ErrorKind::Unsupported => ActionError::Unsupported(e.to_string()),
        ErrorKind::Unavailable => ActionError::Unavailable(e.to_string()),
    }
}

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()?
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// `host:port` → host (IPv6 literals in brackets too).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The pod a store runs in: by the UUID the operator rendered for the pod
/// ([`store_uuid`], the same function that rendered it), else by its name (the simulated
/// kernel names stores by pod), else by the IP its address names.
fn pod_of_store<'a>(pods: &[&'a Pod], uuid: &str, address: &str) -> Option<&'a Pod> {
    pods.iter()
        .find(|p| {
            component_of(p)
                .and_then(|c| store_uuid(c, pod_name(p)))
                .as_deref()
                == Some(uuid)
        })
        .or_else(|| pods.iter().find(|p| pod_name(p) == uuid))
        .or_else(|| {
            let host = host_of(address);
            pods.iter().find(|p| {
                pod_ip(p) == Some(host) || pod_name(p) == host.split('.').next().unwrap_or("")
            })
        })
        .copied()
}

/// The kernel's work state (a protobuf enum value) as the core's; unknown values are Unknown.
pub fn core_work_state(state: i32) -> WorkState {
    match metadata::WorkState::try_from(state) {
        Ok(metadata::WorkState::Working) => WorkState::Working,
        Ok(metadata::WorkState::Draining) => WorkState::Draining,
        Ok(metadata::WorkState::Drained) => WorkState::Drained,
        _ => WorkState::Unknown,
    }
}

pub fn kernel_work_state(state: WorkState) -> metadata::WorkState {
    match state {
        WorkState::Unknown => metadata::WorkState::Unknown,
        WorkState::Working => metadata::WorkState::Working,
        WorkState::Draining => metadata::WorkState::Draining,
        WorkState::Drained => metadata::WorkState::Drained,
    }
}

/// A stable number standing for a pod instance (its UID), when the kernel reports none.
fn epoch_of_uid(uid: &str) -> u64 {
    // FNV-1a: stable across processes and versions, unlike the std hasher.
    uid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// HAKeeper's checker state as the core's [`ClusterDetails`]: heartbeat ages from ticks,
/// stores mapped to the pods they run in. Pure, so the mapping is tested without a kernel.
pub fn cluster_details(
    state: &logservice::CheckerState,
    pods: &[&Pod],
    intervals: &HeartbeatIntervals,
) -> ClusterDetails {
    let age = |tick: u64| Millis(state.tick.saturating_sub(tick) * HAKEEPER_TICK.0);
    let empty = logservice::CnState::default();
    let cns = state
        .cn_state
        .as_ref()
        .unwrap_or(&empty)
        .stores
        .iter()
        .map(|(uuid, info)| CnStoreView {
            uuid: uuid.clone(),
            start_epoch: info.up_time as u64,
            work_state: core_work_state(info.work_state),
            heartbeat_age: age(info.tick),
            version: info.reported_version(),
        })
        .collect();
    let tn_pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| component_of(p) == Some(Component::Tn))
        .copied()
        .collect();
    let tns = state
        .tn_state
        .as_ref()
        .map(|s| s.stores.iter().collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|(uuid, info)| {
            let reported = info
                .config_data
                .as_ref()
                .and_then(|c| c.content.get(TN_START_EPOCH_ITEM))
                .and_then(|item| item.current_value.parse().ok());
            let start_epoch = reported.unwrap_or_else(|| {
                pod_of_store(&tn_pods, uuid, &info.service_address)
                    .or(tn_pods.first().copied())
                    .and_then(|p| p.metadata.uid.as_deref())
                    .map_or(0, epoch_of_uid)
            });
            TnStoreView {
                uuid: uuid.clone(),
                start_epoch,
                heartbeat_age: age(info.tick),
            }
        })
        .collect();
    let log_pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| component_of(p) == Some(Component::Log))
        .copied()
        .collect();
    let log_state = state.log_state.clone().unwrap_or_default();
    let store_name = |uuid: &str| -> String {
        let address = log_state
            .stores
            .get(uuid)
            .map(|s| s.service_address.as_str())
            .unwrap_or("");
        pod_of_store(&log_pods, uuid, address)
            .map_or_else(|| uuid.to_string(), |p| pod_name(p).to_string())
    };
    let log_shards = log_state
        .shards
        .values()
        .map(|shard| {
            let replicas = shard
                .replicas
                .iter()
                .map(|(replica_id, store_uuid)| {
                    let store = log_state.stores.get(store_uuid);
                    let fresh = store.is_some_and(|s| age(s.tick) <= intervals.log_fresh());
                    // The store's own report of this replica: it runs it, and it follows the
                    // shard's current leader in the current term (the nearest HAKeeper has
                    // to "caught up").
                    let own = store.and_then(|s| {
                        s.replicas.iter().find(|r| {
                            r.replica_id == *replica_id
                                && r.log_shard_info
                                    .as_ref()
                                    .is_some_and(|i| i.shard_id == shard.shard_id)
                        })
                    });
                    let up = fresh && own.is_some();
                    let caught_up = up
                        && shard.leader_id != 0
                        && own
                            .and_then(|r| r.log_shard_info.as_ref())
                            .is_some_and(|i| {
                                i.term == shard.term && i.leader_id == shard.leader_id
                            });
                    LogReplicaView {
                        store: store_name(store_uuid),
                        up,
                        caught_up,
                    }
                })
                .collect();
            LogShardView {
                shard_id: shard.shard_id,
                leader: shard
                    .replicas
                    .get(&shard.leader_id)
                    .map(|store| store_name(store)),
                term: shard.term,
                replicas,
            }
        })
        .collect();
    ClusterDetails {
        cns,
        tns,
        log_shards,
    }
}

/// Per proxy pod: how many Working, heartbeating CNs it can route to, if the proxy itself
/// heartbeats to HAKeeper.
pub fn proxy_routes(
    state: &logservice::CheckerState,
    details: &ClusterDetails,
    pods: &[&Pod],
    intervals: &HeartbeatIntervals,
) -> BTreeMap<String, Result<u32, ObservationError>> {
    let routable = details
        .cns
        .iter()
        .filter(|c| c.work_state == WorkState::Working && c.heartbeat_age <= intervals.cn_fresh())
        .count() as u32;
    let proxies = state.proxy_state.clone().unwrap_or_default().stores;
    pods.iter()
        .filter(|p| component_of(p) == Some(Component::Proxy))
        .map(|pod| {
            let name = pod_name(pod);
            let rendered = store_uuid(Component::Proxy, name);
            let store = proxies.iter().find(|(uuid, s)| {
                Some(uuid.as_str()) == rendered.as_deref()
                    || uuid.as_str() == name
                    || pod_ip(pod).is_some_and(|ip| host_of(&s.listen_address) == ip)
            });
            let answer = match store {
                Some((_, s))
                    if Millis(state.tick.saturating_sub(s.tick) * HAKEEPER_TICK.0)
                        <= intervals.proxy_fresh() =>
                {
                    Ok(routable)
                }
                Some(_) => Err(ObservationError::Unavailable(format!(
                    "proxy {name} is not heartbeating to HAKeeper"
                ))),
                None => Err(ObservationError::Unavailable(format!(
                    "proxy {name} is not registered with HAKeeper"
                ))),
            };
            (name.to_string(), answer)
        })
        .collect()
}

/// Client sessions among a CN's sessions. Every CN also lists the kernel's own sessions, which
/// never leave it (measured on v1.2.4: an idle CN lists several): those of `mo_logger`, the
/// statement logger's user (`util/export/etl/db/db_holder.go`), and those of HAKeeper's task
/// user, a random UUID (`logservice/store_hakeeper_check.go` `randomUser`; or the
/// `mo_admin_user` environment variable, which this operator never sets).
pub fn client_sessions(sessions: &[mo_rpc::pb::status::Session]) -> u32 {
    let internal = |user: &str| user == "mo_logger" || is_uuid(user);
    sessions.iter().filter(|s| !internal(&s.user)).count() as u32
}

/// The proxy address (`ip:port` as the CN sees it) of each client session that came
/// through a proxy.
pub fn client_proxy_hosts(sessions: &[mo_rpc::pb::status::Session]) -> Vec<String> {
    let internal = |user: &str| user == "mo_logger" || is_uuid(user);
    sessions
        .iter()
        .filter(|s| s.from_proxy && !internal(&s.user))
        .map(|s| s.proxy_host.clone())
        .collect()
}

/// Client connections of each proxy pod, counted from every running CN's process list by the
/// proxy's pod IP. Any running CN unread leaves every count unknown; a session from an address
/// no proxy pod has counts for every proxy (the count is never low, only high). The proxy's
/// own metric cannot serve instead: v1.2.4 `pkg/proxy/handler.go` `handle` increments
/// `mo_proxy_connect_counter{type="current"}` when a connection ends and never decrements it.
pub fn proxy_connections(
    pods: &[&Pod],
    proxy_hosts: &BTreeMap<String, Result<Vec<String>, ObservationError>>,
) -> BTreeMap<String, Result<u32, ObservationError>> {
    let proxies: Vec<(&str, Option<&str>)> = pods
        .iter()
        .filter(|p| component_of(p) == Some(Component::Proxy))
        .map(|p| (pod_name(p), pod_ip(p)))
        .collect();
    let running_cns = pods.iter().filter(|p| {
        component_of(p) == Some(Component::Cn)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    let mut hosts: Vec<&str> = Vec::new();
    let mut unread: Option<ObservationError> = None;
    for cn in running_cns {
        match proxy_hosts.get(pod_name(cn)) {
            Some(Ok(list)) => hosts.extend(list.iter().map(String::as_str)),
            Some(Err(e)) => unread = Some(e.clone()),
            None => {
                unread = Some(ObservationError::Unavailable(format!(
                    "CN {} has no query address in HAKeeper",
                    pod_name(cn)
                )))
            }
        }
    }
    let ip_of = |host: &str| {
        host.rsplit_once(':')
            .map_or(host, |(ip, _)| ip)
            .trim_matches(['[', ']'])
            .to_string()
    };
    let known: Vec<&str> = proxies.iter().filter_map(|(_, ip)| *ip).collect();
    proxies
        .iter()
        .map(|(name, ip)| {
            let count = match &unread {
                Some(e) => Err(e.clone()),
                None => Ok(hosts
                    .iter()
                    .filter(|h| {
                        let host_ip = ip_of(h);
                        Some(host_ip.as_str()) == *ip || !known.contains(&host_ip.as_str())
                    })
                    .count() as u32),
            };
            (name.to_string(), count)
        })
        .collect()
}

/// Locks some transaction holds or waits for, of a CN's GetLockInfo answer.
pub fn locks_in_use(locks: &[mo_rpc::pb::query::LockInfo]) -> u32 {
    locks
        .iter()
        .filter(|l| !l.holders.is_empty() || !l.waiters.is_empty())
        .count() as u32
}

/// How many transactions holding a lock of a CN's GetLockInfo answer some CN still runs (by
/// transaction id, against every running CN's GetTxnInfo answer).
pub fn live_lock_holders(
    locks: &[mo_rpc::pb::query::LockInfo],
    running: &[&[mo_rpc::pb::query::TxnInfo]],
) -> u32 {
    let runs: std::collections::BTreeSet<&[u8]> = running
        .iter()
        .flat_map(|txns| txns.iter())
        .filter_map(|t| t.meta.as_ref().map(|m| m.id.as_slice()))
        .collect();
    let holders: std::collections::BTreeSet<&[u8]> = locks
        .iter()
        .flat_map(|l| l.holders.iter().map(|h| h.txn_id.as_slice()))
        .collect();
    holders.iter().filter(|h| runs.contains(*h)).count() as u32
}

/// The oldest of a CN's GetTxnInfo answer; a transaction without its creation time is
/// taken as the oldest possible (never as none).
pub fn oldest_txn(txns: &[mo_rpc::pb::query::TxnInfo]) -> OldestTxn {
    txns.iter()
        .map(|t| {
            t.create_at.as_ref().map_or(Millis(0), |c| {
                let millis = c.seconds.max(0) as u64 * 1000 + c.nanos.max(0) as u64 / 1_000_000;
                Millis(millis)
            })
        })
        .min()
        .map_or(OldestTxn::NoneRunning, OldestTxn::CreatedAt)
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A CN the kernel view reads: its pod, where its query service listens (from HAKeeper), the
/// Kubernetes instance of its container, and whether it drains.
struct CnEndpoint {
    pod: String,
    query_address: String,
    instance: Option<String>,
    draining: bool,
}

/// A CN's shard replicas. A kernel without `GetReplicaCount` (v1.2 registers no handler for
/// it) has no shard service, hence no replicas: its "not supported" is an answer, not doubt.
fn replica_count(answer: Result<i64, RpcError>) -> Result<u32, RpcError> {
    match answer {
        Ok(n) => Ok(n.max(0) as u32),
        Err(e) if e.kind() == ErrorKind::Unsupported => Ok(0),
        Err(e) => Err(e),
    }
}

impl KernelClients {
    pub fn new(settings: KernelSettings) -> KernelClients {
        KernelClients {
            settings,
            hakeepers: Mutex::default(),
            allocators: ClientPool::default(),
            queries: ClientPool::default(),
            log_stores: ClientPool::default(),
            without_replica_service: Mutex::default(),
            allocator_of: Mutex::default(),
        }
    }

    fn options(&self) -> Options {
        Options {
            timeout: self.settings.timeout,
            ..Options::default()
        }
    }

    fn hakeeper(
        &self,
        namespace: &str,
        cluster: &str,
        pods: &[&Pod],
    ) -> Result<Arc<HaKeeperClient>, ObservationError> {
        let discovery = match &self.settings.discovery_address {
            Some(template) => Discovery::DiscoveryAddress(
                template
                    .replace("{cluster}", cluster)
                    .replace("{namespace}", namespace),
            ),
            None => {
                let mut addresses: Vec<String> = pods
                    .iter()
                    .filter(|p| component_of(p) == Some(Component::Log))
                    .filter_map(|p| pod_ip(p))
                    .map(|ip| {
                        if ip.contains(':') {
                            format!("[{ip}]:{}", self.settings.hakeeper_port)
                        } else {
                            format!("{ip}:{}", self.settings.hakeeper_port)
                        }
                    })
                    .collect();
                addresses.sort();
                if addresses.is_empty() {
                    return Err(ObservationError::Unavailable(
                        "no LOG pod has an address yet".into(),
                    ));
                }
                Discovery::Addresses(addresses)
            }
        };
        let key = (namespace.to_string(), cluster.to_string());
        let mut clients = self.hakeepers.lock().expect("hakeepers lock");
        match clients.get(&key) {
            Some((known, client)) if *known == discovery => Ok(client.clone()),
            _ => {
                let client = Arc::new(HaKeeperClient::new(discovery.clone(), self.options()));
                clients.insert(key, (discovery, client.clone()));
                Ok(client)
            }
        }
    }

    fn allocator(&self, address: &str) -> Arc<LockAllocatorClient> {
        self.allocators.get(address, || {
            LockAllocatorClient::new(address, self.options())
        })
    }

    fn query(&self, address: &str) -> Arc<QueryClient> {
        self.queries
            .get(address, || QueryClient::new(address, self.options()))
    }

    fn log_store(&self, address: &str) -> Arc<LogStoreClient> {
        self.log_stores
            .get(address, || LogStoreClient::new(address, self.options()))
    }

    /// Whether each replica HAKeeper shows following its shard's leader has caught up: HAKeeper
    /// reports no log index, so each is asked to read through itself (a read index, answered
    /// once it has applied the log up to the leader's commit index). One that does not answer
    /// in time is not counted as caught up.
    async fn probe_catch_up(
        &self,
        state: &logservice::CheckerState,
        pods: &[&Pod],
        details: &mut ClusterDetails,
    ) {
        let log_state = state.log_state.clone().unwrap_or_default();
        let log_pods: Vec<&Pod> = pods
            .iter()
            .filter(|p| component_of(p) == Some(Component::Log))
            .copied()
            .collect();
        // Each store's name as `cluster_details` shows it, and its log service address.
        let address_of: BTreeMap<String, String> = log_state
            .stores
            .iter()
            .map(|(uuid, st)| {
                let name = pod_of_store(&log_pods, uuid, &st.service_address)
                    .map_or_else(|| uuid.clone(), |p| pod_name(p).to_string());
                (name, st.service_address.clone())
            })
            .collect();
        let mut probes = Vec::new();
        for (s, view) in details.log_shards.iter().enumerate() {
            for (r, replica) in view.replicas.iter().enumerate() {
                if replica.caught_up {
                    let address = address_of.get(&replica.store).cloned();
                    probes.push((s, r, view.shard_id, address));
                }
            }
        }
        let answers = futures::future::join_all(probes.into_iter().map(
            |(s, r, shard, address)| async move {
                let ok = match address {
                    Some(a) => self.log_store(&a).read_through_replica(shard).await.is_ok(),
                    None => false,
                };
                (s, r, ok)
            },
        ))
        .await;
        for (s, r, ok) in answers {
            details.log_shards[s].replicas[r].caught_up &= ok;
        }
    }

    /// Forgets a removed cluster's clients.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        let key = (namespace.to_string(), cluster.to_string());
        self.hakeepers.lock().expect("hakeepers lock").remove(&key);
        self.allocator_of
            .lock()
            .expect("allocator lock")
            .remove(&key);
        self.without_replica_service
            .lock()
            .expect("replica service lock")
            .remove(&key);
    }

    /// The kernel's state as far as it answers. `pods` are the cluster's pods (their IPs are
    /// where LOG stores are reached).
    /// `intervals`: how often each role is configured to heartbeat (what "fresh" means).
    pub async fn kernel_view(
        &self,
        namespace: &str,
        cluster: &str,
        pods: &[Arc<Pod>],
        intervals: &HeartbeatIntervals,
    ) -> KernelView {
        let pods: Vec<&Pod> = cluster_pods(cluster, pods).collect();
        let hakeeper = match self.hakeeper(namespace, cluster, &pods) {
            Ok(h) => h,
            Err(e) => return KernelView::unreachable(e),
        };
        let state = match hakeeper.get_cluster_state().await {
            Ok(s) => s,
            Err(e) => return KernelView::unreachable(observation_error(&e)),
        };
        let mut details = cluster_details(&state, &pods, intervals);
        self.probe_catch_up(&state, &pods, &mut details).await;
        let proxy_routes = proxy_routes(&state, &details, &pods, intervals);

        // The allocator runs on the (first heartbeating) TN.
        let tn_address = state
            .tn_state
            .as_ref()
            .and_then(|s| {
                s.stores
                    .values()
                    .filter(|t| !t.lock_service_address.is_empty())
                    .max_by_key(|t| t.tick)
            })
            .map(|t| t.lock_service_address.clone());
        if let Some(address) = &tn_address {
            self.allocator_of
                .lock()
                .expect("allocator lock")
                .insert((namespace.into(), cluster.into()), address.clone());
        }
        let draining: Vec<String> = details
            .cns
            .iter()
            .filter(|c| matches!(c.work_state, WorkState::Draining | WorkState::Drained))
            .map(|c| c.uuid.clone())
            .collect();
        let cn_addresses: Vec<CnEndpoint> = {
            let by_uuid: BTreeMap<String, &str> = state
                .cn_state
                .as_ref()
                .map(|s| {
                    s.stores
                        .iter()
                        .map(|(u, i)| (u.clone(), i.query_address.as_str()))
                        .collect()
                })
                .unwrap_or_default();
            pods.iter()
                .filter(|p| component_of(p) == Some(Component::Cn))
                .filter_map(|p| {
                    let uuid = cn_uuid(pod_name(p));
                    let address = by_uuid.get(&uuid)?;
                    let draining = draining.contains(&uuid);
                    (!address.is_empty()).then(|| CnEndpoint {
                        pod: pod_name(p).to_string(),
                        query_address: address.to_string(),
                        instance: container_instance(p),
                        draining,
                    })
                })
                .collect()
        };
        let key: ClusterKey = (namespace.into(), cluster.into());
        let (lock_allocator, (cn_activity, proxy_hosts), tn_wal_tolerance) = futures::join!(
            self.allocator_view(tn_address.as_deref(), &draining),
            self.cn_activity(&key, &cn_addresses),
            hakeeper.get_tn_wal_tolerance(),
        );
        let proxy_connections = proxy_connections(&pods, &proxy_hosts);
        KernelView {
            hakeeper: Ok(details),
            lock_allocator,
            cn_activity,
            proxy_routes,
            proxy_connections,
            // Not offered (a kernel without the extension) or not readable: the default.
            tn_wal_tolerance: tn_wal_tolerance.ok().flatten().map(Millis),
        }
    }

    async fn allocator_view(
        &self,
        address: Option<&str>,
        draining: &[String],
    ) -> Result<AllocatorView, ObservationError> {
        let address = address.ok_or_else(|| {
            ObservationError::Unavailable("no TN has registered a lock service address".into())
        })?;
        let allocator = self.allocator(address);
        let (drain_protocol, drains) = match allocator.list_drains().await {
            Ok(list) => (
                true,
                list.into_iter()
                    .map(|d| {
                        let answer = match d.status {
                            lock::DrainStatus::DrainPending => DrainAnswer::Pending {
                                remaining_txns: d.remaining_txns,
                            },
                            lock::DrainStatus::DrainDone => DrainAnswer::Done,
                            lock::DrainStatus::DrainCancelled => DrainAnswer::Cancelled,
                            lock::DrainStatus::DrainInstanceGone => DrainAnswer::InstanceGone,
                        };
                        (d.id, answer)
                    })
                    .collect(),
            ),
            Err(e) if e.kind() == ErrorKind::Unsupported => (false, BTreeMap::new()),
            Err(e) => return Err(observation_error(&e)),
        };
        // Today's handshake, for the CNs HAKeeper shows draining. (The kernel answers "can
        // restart" for a service it does not know: the core counts an answer only after its
        // own acknowledged SetRestartService.)
        let answers = futures::future::join_all(draining.iter().map(|uuid| {
            let allocator = allocator.clone();
            async move {
                let (can, remain) = futures::join!(
                    allocator.can_restart_service(uuid),
                    allocator.remain_txn_in_service(uuid)
                );
                (uuid.clone(), can, remain)
            }
        }))
        .await;
        let mut restarting = BTreeMap::new();
        for (uuid, can, remain) in answers {
            let can_restart = can.map_err(|e| observation_error(&e))?;
            let remaining_txns = i64::from(remain.map_err(|e| observation_error(&e))?);
            restarting.insert(
                uuid,
                RestartAnswer {
                    can_restart,
                    remaining_txns,
                },
            );
        }
        Ok(AllocatorView {
            restarting,
            drain_protocol,
            drains,
        })
    }

    /// Only a draining CN is asked for its locks (the answer lists every lock it holds: large
    /// on a busy CN), and every CN for its transactions only while one of them drains (a
    /// hand-over may depend on them).
    async fn cn_activity(
        &self,
        cluster: &ClusterKey,
        cns: &[CnEndpoint],
    ) -> (
        BTreeMap<String, Result<CnActivity, ObservationError>>,
        BTreeMap<String, Result<Vec<String>, ObservationError>>,
    ) {
        let any_draining = cns.iter().any(|c| c.draining);
        let known_without: HashMap<String, String> = {
            let mut all = self
                .without_replica_service
                .lock()
                .expect("replica service lock");
            let known = all.entry(cluster.clone()).or_default();
            // Addresses no CN of the cluster has any more are forgotten (the map stays bounded).
            known.retain(|address, _| cns.iter().any(|c| &c.query_address == address));
            known.clone()
        };
        let results = futures::future::join_all(cns.iter().map(|cn| {
            let query = self.query(&cn.query_address);
            let asks_replicas = cn.instance.is_none()
                || known_without.get(&cn.query_address) != cn.instance.as_ref();
            async move {
                let locks = async {
                    if cn.draining {
                        query.get_lock_info().await.ok()
                    } else {
                        None
                    }
                };
                let txns = async {
                    if any_draining {
                        query.get_txn_info().await.ok()
                    } else {
                        None
                    }
                };
                let replicas = async {
                    // None: this instance already said "not supported", i.e. has no replicas.
                    if asks_replicas {
                        Some(query.get_replica_count().await)
                    } else {
                        None
                    }
                };
                let (sessions, pipelines, replicas, lock_info, txns) = futures::join!(
                    query.show_process_list(),
                    query.get_pipeline_info(),
                    replicas,
                    locks,
                    txns
                );
                let locks = lock_info.as_deref().map(locks_in_use);
                let oldest_txn = txns.as_deref().map_or(OldestTxn::NotRead, oldest_txn);
                let unsupported =
                    matches!(&replicas, Some(Err(e)) if e.kind() == ErrorKind::Unsupported);
                let hosts = match &sessions {
                    Ok(list) => Ok(client_proxy_hosts(list)),
                    Err(e) => Err(observation_error(e)),
                };
                let activity = (|| {
                    Ok(CnActivity {
                        sessions: client_sessions(&sessions?),
                        pipelines: pipelines?.max(0) as u32,
                        replicas: replicas.map_or(Ok(0), replica_count)?,
                        locks,
                        oldest_txn,
                        live_lock_holders: None,
                    })
                })()
                .map_err(|e: RpcError| observation_error(&e));
                (cn, unsupported, activity, hosts, lock_info, txns)
            }
        }))
        .await;
        // Every CN's transactions, if every one was read: a draining CN's lock holders are
        // judged against them.
        let live: BTreeMap<String, u32> = {
            let running: Option<Vec<&[mo_rpc::pb::query::TxnInfo]>> =
                results.iter().map(|r| r.5.as_deref()).collect();
            results
                .iter()
                .filter_map(|(cn, _, _, _, locks, _)| {
                    let count = live_lock_holders(locks.as_deref()?, running.as_deref()?);
                    Some((cn.pod.clone(), count))
                })
                .collect()
        };
        let mut all = self
            .without_replica_service
            .lock()
            .expect("replica service lock");
        let known = all.entry(cluster.clone()).or_default();
        let mut activities = BTreeMap::new();
        let mut hosts = BTreeMap::new();
        for (cn, unsupported, mut activity, proxy_hosts, _, _) in results {
            if let (true, Some(instance)) = (unsupported, &cn.instance) {
                known.insert(cn.query_address.clone(), instance.clone());
            }
            if let Ok(a) = &mut activity {
                a.live_lock_holders = live.get(&cn.pod).copied();
            }
            activities.insert(cn.pod.clone(), activity);
            hosts.insert(cn.pod.clone(), proxy_hosts);
        }
        (activities, hosts)
    }

    /// A kernel call the core asked for.
    pub async fn call(
        &self,
        namespace: &str,
        cluster: &str,
        pods: &[Arc<Pod>],
        action: &Action,
    ) -> Result<ActionOutput, ActionError> {
        let pods: Vec<&Pod> = cluster_pods(cluster, pods).collect();
        let hakeeper = || {
            self.hakeeper(namespace, cluster, &pods)
                .map_err(|e| ActionError::Unavailable(e.to_string()))
        };
        let allocator = || {
            self.allocator_of
                .lock()
                .expect("allocator lock")
                .get(&(namespace.to_string(), cluster.to_string()))
                .map(|a| self.allocator(a))
                .ok_or_else(|| {
                    ActionError::Unavailable("the TN's lock service address is not known".into())
                })
        };
        let done =
            |r: Result<(), RpcError>| r.map(|_| ActionOutput::Done).map_err(|e| action_error(&e));
        match action {
            Action::SetCnWorkState { uuid, state } => done(
                hakeeper()?
                    .update_cn_work_state(uuid, kernel_work_state(*state))
                    .await,
            ),
            Action::DeleteCnStore { uuid } => done(hakeeper()?.delete_cn_store(uuid).await),
            Action::TransferLogLeader { shard_id, to_store } => {
                done(hakeeper()?.transfer_leader(*shard_id, to_store).await)
            }
            Action::SetTnWalTolerance { total } => {
                done(hakeeper()?.set_tn_wal_tolerance(total.map(|t| t.0)).await)
            }
            Action::SetRestartService { uuid } => {
                match allocator()?.set_restart_service(uuid).await {
                    Ok(true) => Ok(ActionOutput::Done),
                    Ok(false) => Err(ActionError::Unavailable(
                        "the lock allocator refused SetRestartService".into(),
                    )),
                    Err(e) => Err(action_error(&e)),
                }
            }
            Action::BeginDrain { uuid, start_epoch } => allocator()?
                .begin_drain(uuid, *start_epoch)
                .await
                .map(|drain_id| ActionOutput::DrainId { drain_id })
                .map_err(|e| action_error(&e)),
            Action::CancelDrain { drain_id } => done(allocator()?.cancel_drain(*drain_id).await),
            Action::DeletePod { .. }
            | Action::RestartPod { .. }
            | Action::PrePullImage { .. }
            | Action::SetProxyServing { .. } => Err(ActionError::Unsupported(
                "a Kubernetes action, not a kernel call".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clients_of_addresses_no_longer_read_are_dropped_and_used_ones_kept() {
        let pool = ClientPool::<String>::default();
        let t0 = Instant::now();
        let first = pool.get_at("10.0.0.1:6003", t0, || "a".into());
        pool.get_at("10.0.0.2:6003", t0, || "b".into());
        // The same address hands out the same client (its connection is reused).
        assert!(Arc::ptr_eq(
            &first,
            &pool.get_at("10.0.0.1:6003", t0 + Duration::from_secs(60), || "x".into())
        ));
        // 10.0.0.2's pod restarted elsewhere: nothing reads it any more.
        let later = t0 + CLIENT_IDLE_LIMIT + Duration::from_secs(30);
        pool.get_at("10.0.0.3:6003", later, || "c".into());
        assert_eq!(pool.addresses(), ["10.0.0.1:6003", "10.0.0.3:6003"]);
    }

    fn pod(name: &str, component: &str, ip: &str, uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid, "labels": {
                crate::resources::LABEL_CLUSTER: "mo", crate::resources::LABEL_COMPONENT: component}},
            "status": {"podIP": ip},
        }))
        .unwrap()
    }

    #[test]
    fn the_oldest_transaction_is_read_from_its_creation_time_and_an_undated_one_is_oldest() {
        use mo_rpc::pb::query::{TxnInfo, WireTimestamp};
        let at = |seconds, nanos| TxnInfo {
            create_at: Some(WireTimestamp { seconds, nanos }),
            ..Default::default()
        };
        assert_eq!(oldest_txn(&[]), OldestTxn::NoneRunning);
        assert_eq!(
            oldest_txn(&[at(20, 0), at(10, 5_000_000), at(15, 0)]),
            OldestTxn::CreatedAt(Millis(10_005))
        );
        assert_eq!(
            oldest_txn(&[at(20, 0), TxnInfo::default()]),
            OldestTxn::CreatedAt(Millis(0))
        );
    }

    fn shard_info(term: u64, leader: u64) -> logservice::LogShardInfo {
        logservice::LogShardInfo {
            shard_id: 1,
            replicas: BTreeMap::from([(1, "mo-log-0".into()), (2, "log-b".into())]),
            term,
            leader_id: leader,
            ..Default::default()
        }
    }

    /// A lock whose holder no CN runs (a leaked transaction) is not live; one that some CN
    /// runs is, counted once however many locks it holds.
    #[test]
    fn only_holders_some_cn_runs_are_live() {
        use mo_rpc::pb::lock::WaitTxn;
        use mo_rpc::pb::query::{LockInfo, TxnInfo, TxnMetaId};
        let holder = |id: u8| WaitTxn {
            txn_id: vec![id; 16],
            ..Default::default()
        };
        let locks = [
            LockInfo {
                holders: vec![holder(1), holder(2)],
                ..Default::default()
            },
            LockInfo {
                holders: vec![holder(2)],
                ..Default::default()
            },
            LockInfo {
                holders: vec![holder(3)],
                ..Default::default()
            },
        ];
        let txn = |id: u8| TxnInfo {
            meta: Some(TxnMetaId { id: vec![id; 16] }),
            ..Default::default()
        };
        let cn0 = [txn(2), txn(9)];
        let cn1 = [txn(3)];
        assert_eq!(live_lock_holders(&locks, &[&cn0, &cn1]), 2);
        assert_eq!(live_lock_holders(&locks, &[&cn0]), 1);
        assert_eq!(live_lock_holders(&locks, &[]), 0);
        assert_eq!(live_lock_holders(&[], &[&cn0, &cn1]), 0);
    }

    /// The sessions an idle v1.2.4 CN listed (the kernel's own users), and a client's.
    #[test]
    fn only_client_sessions_count() {
        let session = |user: &str| mo_rpc::pb::status::Session {
            account: "sys".into(),
            user: user.into(),
            ..Default::default()
        };
        let idle = [
            session("73aab91c-d219-4c7a-99bb-a8fe90a575aa"),
            session("73aab91c-d219-4c7a-99bb-a8fe90a575aa"),
            session("mo_logger"),
        ];
        assert_eq!(client_sessions(&idle), 0);
        let mut busy = idle.to_vec();
        busy.push(session("dump"));
        busy.push(session("app-73aab91c"));
        assert_eq!(client_sessions(&busy), 2);
    }

    /// A proxy's connections are counted by its pod IP on every running CN; a CN unread leaves
    /// every count unknown, and a session from an address no proxy has counts for all.
    #[test]
    fn proxy_connections_are_counted_from_every_cn_and_never_too_low() {
        let running = |mut p: Pod| {
            p.status.as_mut().unwrap().phase = Some("Running".into());
            p
        };
        let pods = [
            running(pod("mo-cn-0", "cn", "10.0.0.5", "c0")),
            running(pod("mo-cn-1", "cn", "10.0.0.6", "c1")),
            pod("mo-cn-2", "cn", "10.0.0.7", "c2"), // Pending: no sessions yet
            pod("mo-proxy-0", "proxy", "10.0.0.8", "p0"),
            pod("mo-proxy-1", "proxy", "10.0.0.9", "p1"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let session = |user: &str, from_proxy: bool, host: &str| mo_rpc::pb::status::Session {
            user: user.into(),
            from_proxy,
            proxy_host: host.into(),
            ..Default::default()
        };
        let cn0 = [
            session("dump", true, "10.0.0.8:41234"),
            session("dump", true, "10.0.0.8:41236"),
            session("mo_logger", false, ""),
            session("dump", false, ""), // straight to the CN, no proxy
        ];
        let cn1 = [session("app", true, "10.0.0.9:5000")];
        let mut hosts = BTreeMap::from([
            ("mo-cn-0".to_string(), Ok(client_proxy_hosts(&cn0))),
            ("mo-cn-1".to_string(), Ok(client_proxy_hosts(&cn1))),
        ]);
        let counts = proxy_connections(&refs, &hosts);
        assert_eq!(counts["mo-proxy-0"], Ok(2));
        assert_eq!(counts["mo-proxy-1"], Ok(1));
        // From an address no proxy pod has (another network path): counted for every proxy.
        hosts.insert(
            "mo-cn-1".into(),
            Ok(client_proxy_hosts(&[session(
                "app",
                true,
                "127.0.0.1:5000",
            )])),
        );
        let counts = proxy_connections(&refs, &hosts);
        assert_eq!(counts["mo-proxy-0"], Ok(3));
        assert_eq!(counts["mo-proxy-1"], Ok(1));
        // One running CN unread, or not known to HAKeeper: nothing is known.
        hosts.insert(
            "mo-cn-1".into(),
            Err(ObservationError::Timeout("query service".into())),
        );
        assert!(
            proxy_connections(&refs, &hosts)
                .values()
                .all(Result::is_err)
        );
        hosts.remove("mo-cn-1");
        assert!(
            proxy_connections(&refs, &hosts)
                .values()
                .all(Result::is_err)
        );
    }

    /// LOG, TN and proxy records map to their pods by the UUID the operator rendered.
    #[test]
    fn stores_map_to_pods_by_the_rendered_uuid() {
        let pods = [
            pod("mo-log-0", "log", "10.0.0.1", "u0"),
            pod("mo-log-1", "log", "10.0.0.2", "u1"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let uuid = store_uuid(Component::Log, "mo-log-1").unwrap();
        assert_eq!(
            pod_of_store(&refs, &uuid, "elsewhere:32001").map(pod_name),
            Some("mo-log-1")
        );
    }

    #[test]
    fn checker_state_maps_to_the_cores_details() {
        let pods = [
            pod("mo-log-0", "log", "10.0.0.1", "u1"),
            pod("mo-log-1", "log", "10.0.0.2", "u2"),
            pod("mo-tn-0", "tn", "10.0.0.3", "tn-uid"),
            pod("mo-proxy-0", "proxy", "10.0.0.4", "u4"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let store = |tick, replicas| logservice::LogStoreInfo {
            tick,
            service_address: "10.0.0.2:32001".into(),
            replicas,
            ..Default::default()
        };
        let replica = |id, info| logservice::LogReplicaInfo {
            log_shard_info: Some(info),
            replica_id: id,
            ..Default::default()
        };
        let state = logservice::CheckerState {
            tick: 1_000,
            cn_state: Some(logservice::CnState {
                stores: BTreeMap::from([(
                    "cn-a".into(),
                    logservice::CnStoreInfo {
                        tick: 990,
                        up_time: 77,
                        work_state: metadata::WorkState::Draining as i32,
                        commit_id_before_v2: "v2".into(),
                        ..Default::default()
                    },
                )]),
            }),
            tn_state: Some(logservice::TnState {
                stores: BTreeMap::from([(
                    "tn".into(),
                    logservice::TnStoreInfo {
                        tick: 1_000,
                        ..Default::default()
                    },
                )]),
            }),
            log_state: Some(logservice::LogState {
                shards: BTreeMap::from([(1, shard_info(5, 1))]),
                stores: BTreeMap::from([
                    (
                        "mo-log-0".into(),
                        store(998, vec![replica(1, shard_info(5, 1))]),
                    ),
                    // Found by its address; its replica lags a term behind.
                    (
                        "log-b".into(),
                        store(999, vec![replica(2, shard_info(4, 1))]),
                    ),
                ]),
            }),
            proxy_state: Some(logservice::ProxyState {
                stores: BTreeMap::from([(
                    "mo-proxy-0".into(),
                    logservice::ProxyStore {
                        tick: 900,
                        ..Default::default()
                    },
                )]),
            }),
            ..Default::default()
        };
        let d = cluster_details(&state, &refs, &HeartbeatIntervals::default());
        assert_eq!(d.cns[0].heartbeat_age, Millis(1_000));
        assert_eq!(d.cns[0].start_epoch, 77);
        assert_eq!(d.cns[0].work_state, WorkState::Draining);
        assert_eq!(d.cns[0].version, "v2");
        // No start time reported by the TN: its pod's UID stands for the instance.
        assert_eq!(d.tns[0].start_epoch, epoch_of_uid("tn-uid"));
        let shard = &d.log_shards[0];
        assert_eq!(shard.leader.as_deref(), Some("mo-log-0"));
        assert_eq!(shard.replicas[0].store, "mo-log-0");
        assert!(shard.replicas[0].up && shard.replicas[0].caught_up);
        assert_eq!(shard.replicas[1].store, "mo-log-1");
        assert!(shard.replicas[1].up && !shard.replicas[1].caught_up);
        // The proxy's last heartbeat is 10 s old: it cannot be counted on to route.
        let routes = proxy_routes(&state, &d, &refs, &HeartbeatIntervals::default());
        assert!(routes["mo-proxy-0"].is_err());
    }

    #[test]
    fn a_store_gone_silent_has_no_replica_up() {
        let pods = [pod("mo-log-0", "log", "10.0.0.1", "u1")];
        let refs: Vec<&Pod> = pods.iter().collect();
        let state = logservice::CheckerState {
            tick: 1_000,
            log_state: Some(logservice::LogState {
                shards: BTreeMap::from([(1, shard_info(5, 1))]),
                stores: BTreeMap::from([(
                    "mo-log-0".into(),
                    logservice::LogStoreInfo {
                        tick: 900,
                        replicas: vec![logservice::LogReplicaInfo {
                            log_shard_info: Some(shard_info(5, 1)),
                            replica_id: 1,
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )]),
            }),
            ..Default::default()
        };
        let d = cluster_details(&state, &refs, &HeartbeatIntervals::default());
        assert!(!d.log_shards[0].replicas[0].up);
        assert!(!d.log_shards[0].replicas[0].caught_up);
        // Replica 2's store never reported: down, and named by its UUID.
        assert_eq!(d.log_shards[0].replicas[1].store, "log-b");
        assert!(!d.log_shards[0].replicas[1].up);
    }

    #[test]
    fn only_a_kernel_without_the_method_means_no_replicas() {
        let kernel = |code| RpcError::Kernel {
            address: "a".into(),
            error: mo_rpc::KernelError::new(code, "x"),
        };
        assert_eq!(replica_count(Ok(3)).unwrap(), 3);
        assert_eq!(replica_count(Err(kernel(20105))).unwrap(), 0);
        assert!(replica_count(Err(kernel(20506))).is_err());
        let timeout = RpcError::Timeout {
            address: "a".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(replica_count(Err(timeout)).is_err());
    }

    #[test]
    fn work_states_map_both_ways_and_unknown_values_are_unknown() {
        for state in [
            WorkState::Unknown,
            WorkState::Working,
            WorkState::Draining,
            WorkState::Drained,
        ] {
            assert_eq!(core_work_state(kernel_work_state(state) as i32), state);
        }
        assert_eq!(core_work_state(99), WorkState::Unknown);
    }

    #[test]
    fn rpc_failures_keep_their_kind() {
        let unknown = RpcError::Kernel {
            address: "a".into(),
            error: mo_rpc::KernelError::new(20101, "internal error: CN [x] does not exist"),
        };
        assert!(matches!(
            action_error(&unknown),
            ActionError::DoesNotExist(_)
        ));
        assert!(matches!(
            observation_error(&unknown),
            ObservationError::DoesNotExist(_)
        ));
        let timeout = RpcError::Timeout {
            address: "a".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(matches!(action_error(&timeout), ActionError::Timeout(_)));
        let unsupported = RpcError::Kernel {
            address: "a".into(),
            error: mo_rpc::KernelError::new(20105, "not supported"),
        };
        assert!(matches!(
            action_error(&unsupported),
            ActionError::Unsupported(_)
        ));
        let lost = RpcError::ConnectionLost {
            address: "a".into(),
            detail: "eof".into(),
        };
        assert!(matches!(
            observation_error(&lost),
            ObservationError::Unavailable(_)
        ));
        // An action whose connection broke after it was sent may have been applied.
        assert!(matches!(action_error(&lost), ActionError::Timeout(_)));
        let refused = RpcError::Connect {
            address: "a".into(),
            detail: "connection refused".into(),
        };
        assert!(matches!(
            action_error(&refused),
            ActionError::Unavailable(_)
        ));
    }

    /// A CN query service of v1.2: sessions and pipelines, "not supported" for
    /// `GetReplicaCount`, whose requests it counts.
    async fn v1_2_query_service(replica_asks: Arc<Mutex<u32>>) -> String {
        use mo_rpc::pb::query;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let handler = move |request: query::Request| {
            use query::CmdMethod as M;
            let mut r = query::Response {
                request_id: request.request_id,
                cmd_method: request.cmd_method,
                ..Default::default()
            };
            match M::try_from(request.cmd_method) {
                Ok(M::ShowProcessList) => {
                    r.show_process_list_response = Some(Default::default());
                }
                Ok(M::GetPipelineInfo) => {
                    r.get_pipeline_info_response =
                        Some(query::GetPipelineInfoResponse { count: 0 });
                }
                Ok(M::GetReplicaCount) => {
                    *replica_asks.lock().unwrap() += 1;
                    return Some(<mo_rpc::QueryService as mo_rpc::Service>::not_supported(
                        &request,
                    ));
                }
                _ => {
                    return Some(<mo_rpc::QueryService as mo_rpc::Service>::not_supported(
                        &request,
                    ));
                }
            }
            Some(r)
        };
        tokio::spawn(mo_rpc::serve::<mo_rpc::QueryService>(
            listener,
            Arc::new(handler),
            1 << 20,
        ));
        address
    }

    #[tokio::test]
    async fn a_kernel_without_replica_service_is_asked_once_per_instance() {
        let asks = Arc::new(Mutex::new(0));
        let address = v1_2_query_service(asks.clone()).await;
        let clients = KernelClients::new(KernelSettings::default());
        let cluster: ClusterKey = ("ns".into(), "mo".into());
        let cn = |instance: Option<&str>| CnEndpoint {
            pod: "mo-cn-0".into(),
            query_address: address.clone(),
            instance: instance.map(str::to_string),
            draining: false,
        };
        let read = |cns: Vec<CnEndpoint>| {
            let clients = &clients;
            let cluster = &cluster;
            async move {
                let (view, _) = clients.cn_activity(cluster, &cns).await;
                view.get("mo-cn-0")
                    .map(|a| a.as_ref().expect("read").replicas)
            }
        };
        // "Not supported" is an answer (no replicas), and it is remembered for this instance.
        assert_eq!(read(vec![cn(Some("uid-a/0/100"))]).await, Some(0));
        assert_eq!(read(vec![cn(Some("uid-a/0/100"))]).await, Some(0));
        assert_eq!(*asks.lock().unwrap(), 1);
        // A restarted container (or an upgraded kernel) behind the same address is asked again.
        assert_eq!(read(vec![cn(Some("uid-a/1/200"))]).await, Some(0));
        assert_eq!(*asks.lock().unwrap(), 2);
        // Without a known instance nothing is remembered.
        read(vec![cn(None)]).await;
        read(vec![cn(None)]).await;
        assert_eq!(*asks.lock().unwrap(), 4);
        // A CN gone from the cluster is forgotten: its address, reused, is asked again.
        assert_eq!(read(vec![]).await, None);
        read(vec![cn(Some("uid-a/1/200"))]).await;
        assert_eq!(*asks.lock().unwrap(), 5);
    }
}
