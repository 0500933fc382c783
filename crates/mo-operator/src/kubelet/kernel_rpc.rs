//! The simulated kernel's RPC: each LOG pod serves HAKeeper on `podIP:32001`, the TN pod the
//! lock-table allocator on `podIP:22002`, each CN pod its query service on `podIP:19998`,
//! all in the kernel's own protocol ([`mo_rpc`]). The operator finds them as it would in a
//! real cluster: LOG pod IPs, then the addresses the stores register with HAKeeper.
//!
//! Every pod gets its own loopback address (127.x.y.z), so the kernel's fixed ports can be
//! used by many pods on one machine. A pod whose process is not running drops connections.

use super::{DataPlane, Key, SimCluster};
use mo_core::component::cn_uuid;
use mo_core::{Action, ActionError, ActionOutput, DrainAnswer, KernelView, Millis};
use mo_kube::kernel::{HAKEEPER_TICK, TN_START_EPOCH_ITEM, core_work_state, kernel_work_state};
use mo_rpc::error::code;
use mo_rpc::pb::{lock, logservice, query, status};
use mo_rpc::{HaKeeper, KernelError, LockAllocator, QueryService, Service};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Weak};

pub const HAKEEPER_PORT: u16 = mo_kube::kernel::DEFAULT_HAKEEPER_PORT;
pub const LOCK_SERVICE_PORT: u16 = 22002;
pub const QUERY_PORT: u16 = 19998;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Log,
    Tn,
    Cn,
    Proxy,
}

impl Role {
    pub fn of(component: &str) -> Option<Role> {
        match component {
            "log" => Some(Role::Log),
            "tn" => Some(Role::Tn),
            "cn" => Some(Role::Cn),
            "proxy" => Some(Role::Proxy),
            _ => None,
        }
    }

    fn port(self) -> Option<u16> {
        match self {
            Role::Log => Some(HAKEEPER_PORT),
            Role::Tn => Some(LOCK_SERVICE_PORT),
            Role::Cn => Some(QUERY_PORT),
            Role::Proxy => None,
        }
    }
}

/// One pod's address and the server answering on it (stopped when dropped).
pub struct PodServer {
    pub ip: Ipv4Addr,
    pub name: String,
    pub role: Role,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for PodServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Gives the pod an address and starts its service there.
pub fn start(
    plane: &Arc<DataPlane>,
    key: &Key,
    uid: &str,
    name: &str,
    role: Role,
) -> anyhow::Result<PodServer> {
    let mut last_error = None;
    for _ in 0..64 {
        let ip = plane.next_pod_ip();
        let Some(port) = role.port() else {
            return Ok(PodServer {
                ip,
                name: name.into(),
                role,
                task: None,
            });
        };
        let listener = match std::net::TcpListener::bind((ip, port)) {
            Ok(l) => l,
            Err(e) => {
                last_error = Some(e);
                continue; // taken (another data plane on this machine): the next address
            }
        };
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let answering = Answering {
            plane: Arc::downgrade(plane),
            key: key.clone(),
            uid: uid.to_string(),
            name: name.to_string(),
        };
        let max = mo_rpc::frame::DEFAULT_MAX_BODY;
        let task = match role {
            Role::Log => tokio::spawn(mo_rpc::serve::<HaKeeper>(
                listener,
                Arc::new(move |r| answering.hakeeper(r)),
                max,
            )),
            Role::Tn => tokio::spawn(mo_rpc::serve::<LockAllocator>(
                listener,
                Arc::new(move |r| answering.allocator(r)),
                max,
            )),
            Role::Cn => tokio::spawn(mo_rpc::serve::<QueryService>(
                listener,
                Arc::new(move |r| answering.query(r)),
                max,
            )),
            Role::Proxy => unreachable!("no port"),
        };
        return Ok(PodServer {
            ip,
            name: name.into(),
            role,
            task: Some(task.abort_handle()),
        });
    }
    Err(anyhow::anyhow!(
        "no free loopback address for {name}: {last_error:?}"
    ))
}

/// What one pod's server answers with: the data plane's view of its cluster.
struct Answering {
    plane: Weak<DataPlane>,
    key: Key,
    uid: String,
    name: String,
}

fn address(ip: Ipv4Addr, port: u16) -> String {
    format!("{ip}:{port}")
}

/// The HAKeeper tick "now": wall-clock based, far from zero so that ages never underflow.
fn now_tick(plane: &DataPlane) -> u64 {
    1_000_000 + plane.started.elapsed().as_millis() as u64 / HAKEEPER_TICK.0
}

fn tick_of(now: u64, age: Millis) -> u64 {
    now.saturating_sub(age.0.div_ceil(HAKEEPER_TICK.0))
}

/// Ten seconds without a heartbeat: what a store that stopped reporting looks like.
const SILENT_TICKS: u64 = 100;

fn config_item(name: &str, value: String) -> logservice::ConfigData {
    logservice::ConfigData {
        content: BTreeMap::from([(
            name.to_string(),
            logservice::ConfigItem {
                name: name.to_string(),
                current_value: value,
                ..Default::default()
            },
        )]),
    }
}

/// The kernel's error for a failed call, as HAKeeper would put it.
fn hakeeper_error(e: &ActionError, uuid: &str) -> KernelError {
    match e {
        ActionError::DoesNotExist(_) => KernelError::new(
            code::INTERNAL,
            format!("internal error: CN [{uuid}] does not exist"),
        ),
        ActionError::Timeout(_) => KernelError::new(code::DRAGONBOAT_TIMEOUT, ""),
        ActionError::Unsupported(m) => KernelError::new(code::NOT_SUPPORTED, m.clone()),
        ActionError::Unavailable(_) | ActionError::Conflict(_) => {
            KernelError::new(code::DRAGONBOAT_SHARD_NOT_READY, "")
        }
    }
}

/// The data plane's kernel view as HAKeeper's checker state (GET_CLUSTER_STATE).
fn checker_state(
    view: &KernelView,
    details: &mo_core::ClusterDetails,
    servers: &BTreeMap<String, PodServer>,
    now: u64,
) -> logservice::CheckerState {
    let by_name = |name: &str| servers.values().find(|s| s.name == name);
    let by_role = |role: Role| servers.values().find(|s| s.role == role);
    let cn_ip = |uuid: &str| {
        servers
            .values()
            .find(|s| s.role == Role::Cn && cn_uuid(&s.name) == uuid)
            .map(|s| s.ip)
    };
    let cn_stores = details
        .cns
        .iter()
        .map(|cn| {
            let ip = cn_ip(&cn.uuid);
            let at = |port| ip.map(|ip| address(ip, port)).unwrap_or_default();
            (
                cn.uuid.clone(),
                logservice::CnStoreInfo {
                    tick: tick_of(now, cn.heartbeat_age),
                    service_address: at(6001),
                    sql_address: at(6001),
                    lock_service_address: at(6003),
                    query_address: at(QUERY_PORT),
                    work_state: kernel_work_state(cn.work_state) as i32,
                    up_time: cn.start_epoch as i64,
                    // The simulated HAKeeper numbers fields as v1.2's does.
                    commit_id_before_v2: cn.version.clone(),
                    ..Default::default()
                },
            )
        })
        .collect();
    let tn_stores = details
        .tns
        .iter()
        .map(|tn| {
            let ip = by_role(Role::Tn).map(|s| s.ip);
            let at = |port| ip.map(|ip| address(ip, port)).unwrap_or_default();
            (
                tn.uuid.clone(),
                logservice::TnStoreInfo {
                    tick: tick_of(now, tn.heartbeat_age),
                    service_address: at(41010),
                    lock_service_address: at(LOCK_SERVICE_PORT),
                    shards: vec![logservice::TnShardInfo {
                        shard_id: 2,
                        replica_id: 3,
                    }],
                    config_data: Some(config_item(TN_START_EPOCH_ITEM, tn.start_epoch.to_string())),
                    ..Default::default()
                },
            )
        })
        .collect();
    // Log shards: replica ids are positions in the shard's list; a replica that is up is
    // reported by its store, following the current leader when it is caught up.
    let mut shards = BTreeMap::new();
    let mut store_replicas: BTreeMap<String, Vec<logservice::LogReplicaInfo>> = BTreeMap::new();
    for shard in &details.log_shards {
        let ids: BTreeMap<u64, String> = shard
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| (i as u64 + 1, r.store.clone()))
            .collect();
        let leader_id = shard
            .leader
            .as_ref()
            .and_then(|l| ids.iter().find(|(_, s)| *s == l).map(|(id, _)| *id))
            .unwrap_or(0);
        let info = |leader_id| logservice::LogShardInfo {
            shard_id: shard.shard_id,
            replicas: ids.clone(),
            term: shard.term,
            leader_id,
            ..Default::default()
        };
        for (i, replica) in shard.replicas.iter().enumerate() {
            let list = store_replicas.entry(replica.store.clone()).or_default();
            if replica.up {
                list.push(logservice::LogReplicaInfo {
                    log_shard_info: Some(info(if replica.caught_up { leader_id } else { 0 })),
                    replica_id: i as u64 + 1,
                    ..Default::default()
                });
            }
        }
        shards.insert(shard.shard_id, info(leader_id));
    }
    let log_stores = store_replicas
        .into_iter()
        .map(|(store, replicas)| {
            let tick = if replicas.is_empty() {
                now - SILENT_TICKS
            } else {
                now
            };
            let service_address = by_name(&store)
                .map(|s| address(s.ip, HAKEEPER_PORT))
                .unwrap_or_default();
            (
                store,
                logservice::LogStoreInfo {
                    tick,
                    service_address,
                    replicas,
                    ..Default::default()
                },
            )
        })
        .collect();
    let proxy_stores = view
        .proxy_routes
        .iter()
        .map(|(pod, routes)| {
            (
                pod.clone(),
                logservice::ProxyStore {
                    uuid: pod.clone(),
                    tick: if routes.is_ok() {
                        now
                    } else {
                        now - SILENT_TICKS
                    },
                    listen_address: by_name(pod)
                        .map(|s| address(s.ip, 6009))
                        .unwrap_or_default(),
                    ..Default::default()
                },
            )
        })
        .collect();
    logservice::CheckerState {
        tick: now,
        cn_state: Some(logservice::CnState { stores: cn_stores }),
        tn_state: Some(logservice::TnState { stores: tn_stores }),
        log_state: Some(logservice::LogState {
            shards,
            stores: log_stores,
        }),
        proxy_state: Some(logservice::ProxyState {
            stores: proxy_stores,
        }),
        state: logservice::HaKeeperState::HaKeeperRunning as i32,
        ..Default::default()
    }
}

/// GET_CLUSTER_DETAILS from the same state.
fn cluster_details(state: &logservice::CheckerState) -> logservice::ClusterDetails {
    let cns = state.cn_state.clone().unwrap_or_default().stores;
    let tns = state.tn_state.clone().unwrap_or_default().stores;
    let logs = state.log_state.clone().unwrap_or_default().stores;
    let proxies = state.proxy_state.clone().unwrap_or_default().stores;
    let node_state = |tick: u64| {
        if state.tick.saturating_sub(tick) >= SILENT_TICKS {
            logservice::NodeState::TimeoutState as i32
        } else {
            logservice::NodeState::NormalState as i32
        }
    };
    logservice::ClusterDetails {
        cn_stores: cns
            .into_iter()
            .map(|(uuid, c)| logservice::CnStore {
                uuid,
                service_address: c.service_address,
                sql_address: c.sql_address,
                lock_service_address: c.lock_service_address,
                tick: c.tick,
                state: node_state(c.tick),
                work_state: c.work_state,
                query_address: c.query_address,
                up_time: c.up_time,
                commit_id_before_v2: c.commit_id_before_v2,
                ..Default::default()
            })
            .collect(),
        tn_stores: tns
            .into_iter()
            .map(|(uuid, t)| logservice::TnStore {
                uuid,
                service_address: t.service_address,
                tick: t.tick,
                state: node_state(t.tick),
                shards: t.shards,
                lock_service_address: t.lock_service_address,
                config_data: t.config_data,
                ..Default::default()
            })
            .collect(),
        log_stores: logs
            .into_iter()
            .map(|(uuid, l)| logservice::LogStore {
                uuid,
                service_address: l.service_address,
                tick: l.tick,
                state: node_state(l.tick),
                replicas: l.replicas,
                ..Default::default()
            })
            .collect(),
        proxy_stores: proxies.into_values().collect(),
        ..Default::default()
    }
}

impl Answering {
    /// Runs `f` on this pod's cluster while the pod's process runs; `None` (drop the
    /// connection) when it does not, as a dead process would.
    fn with<T>(&self, f: impl FnOnce(&DataPlane, &Key, &mut SimCluster) -> T) -> Option<T> {
        let plane = self.plane.upgrade()?;
        let mut sims = plane.clusters.lock().expect("clusters lock");
        let sim = sims.get_mut(&self.key)?;
        plane.advance(sim);
        let running = sim
            .model
            .pod_reports()
            .iter()
            .any(|r| r.uid == self.uid && r.running);
        running.then(|| f(&plane, &self.key, sim))
    }

    fn hakeeper(&self, request: logservice::Request) -> Option<logservice::Response> {
        use logservice::MethodType as M;
        let name = self.name.clone();
        self.with(|plane, key, sim| {
            let mut response = logservice::Response {
                request_id: request.request_id,
                method: request.method,
                ..Default::default()
            };
            let fail = |response: &mut logservice::Response, e: KernelError| {
                response.error_code = e.code;
                response.error_message = e.message;
            };
            let call = |sim: &mut SimCluster, action: Action| plane.call(key, sim, action);
            let Ok(method) = M::try_from(request.method) else {
                return HaKeeper::not_supported(&request);
            };
            match method {
                // Every LOG store hosts a replica of the HAKeeper shard.
                M::CheckHakeeper => response.is_ha_keeper = true,
                // A read through this store's replica of a log shard (a read index): it answers
                // once the replica has caught up; until then it waits, and the call times out.
                M::GetTruncate => {
                    let shard = request.log_request.as_ref().map_or(0, |r| r.shard_id);
                    let view = plane.kernel_view(key, sim);
                    let caught_up = view.hakeeper.as_ref().is_ok_and(|d| {
                        d.log_shards
                            .iter()
                            .filter(|s| s.shard_id == shard)
                            .flat_map(|s| &s.replicas)
                            .any(|r| r.store == name && r.caught_up)
                    });
                    if !caught_up {
                        fail(
                            &mut response,
                            KernelError::new(code::DRAGONBOAT_TIMEOUT, "timeout"),
                        );
                    }
                }
                M::GetShardInfo => {
                    let logs: Vec<&PodServer> = sim
                        .servers
                        .values()
                        .filter(|s| s.role == Role::Log)
                        .collect();
                    let replicas = logs
                        .iter()
                        .enumerate()
                        .map(|(i, s)| {
                            (
                                i as u64 + 1,
                                logservice::ReplicaInfo {
                                    uuid: s.name.clone(),
                                    service_address: address(s.ip, HAKEEPER_PORT),
                                },
                            )
                        })
                        .collect();
                    response.shard_info = Some(logservice::ShardInfoQueryResult {
                        shard_id: 0,
                        replicas,
                        leader_id: 1,
                        term: 1,
                        epoch: 1,
                    });
                }
                M::GetClusterState | M::GetClusterDetails | M::CheckHealth => {
                    let view = plane.kernel_view(key, sim);
                    match &view.hakeeper {
                        Ok(details) => {
                            let state =
                                checker_state(&view, details, &sim.servers, now_tick(plane));
                            match method {
                                M::GetClusterState => response.checker_state = Some(state),
                                M::GetClusterDetails => {
                                    response.cluster_details = Some(cluster_details(&state))
                                }
                                _ => {}
                            }
                        }
                        Err(e) => fail(
                            &mut response,
                            KernelError::new(
                                match e {
                                    mo_core::ObservationError::Timeout(_) => {
                                        code::DRAGONBOAT_TIMEOUT
                                    }
                                    _ => code::DRAGONBOAT_SHARD_NOT_READY,
                                },
                                "",
                            ),
                        ),
                    }
                }
                M::UpdateCnWorkState | M::PatchCnStore => {
                    let (uuid, state) = match (&request.cn_work_state, &request.cn_state_label) {
                        (Some(w), _) if method == M::UpdateCnWorkState => (w.uuid.clone(), w.state),
                        (_, Some(p)) if method == M::PatchCnStore => (p.uuid.clone(), p.state),
                        _ => {
                            fail(
                                &mut response,
                                KernelError::new(
                                    code::INTERNAL,
                                    "internal error: request without its message",
                                ),
                            );
                            return response;
                        }
                    };
                    let state = core_work_state(state);
                    if let Err(e) = call(
                        sim,
                        Action::SetCnWorkState {
                            uuid: uuid.clone(),
                            state,
                        },
                    ) {
                        fail(&mut response, hakeeper_error(&e, &uuid));
                    }
                }
                M::UpdateCnLabel => {
                    let uuid = request
                        .cn_store_label
                        .as_ref()
                        .map(|l| l.uuid.clone())
                        .unwrap_or_default();
                    let view = plane.kernel_view(key, sim);
                    let known = view
                        .hakeeper
                        .as_ref()
                        .is_ok_and(|d| d.cns.iter().any(|c| c.uuid == uuid));
                    if !known {
                        fail(
                            &mut response,
                            hakeeper_error(&ActionError::DoesNotExist(String::new()), &uuid),
                        );
                    }
                }
                M::DeleteCnStore => {
                    let uuid = request
                        .delete_cn_store
                        .as_ref()
                        .map(|d| d.store_id.clone())
                        .unwrap_or_default();
                    match call(sim, Action::DeleteCnStore { uuid: uuid.clone() }) {
                        // The kernel deletes an unknown CN without complaint.
                        Ok(_) | Err(ActionError::DoesNotExist(_)) => {}
                        Err(e) => fail(&mut response, hakeeper_error(&e, &uuid)),
                    }
                }
                M::TransferLeader => {
                    let t = request.transfer_leader.clone().unwrap_or_default();
                    if let Err(e) = call(
                        sim,
                        Action::TransferLogLeader {
                            shard_id: t.shard_id,
                            to_store: t.target_store,
                        },
                    ) {
                        fail(&mut response, hakeeper_error(&e, ""));
                    }
                }
                M::SetTnWalTolerance => {
                    let total = request
                        .tn_wal_tolerance
                        .map(|t| t.total_millis)
                        .filter(|&t| t > 0)
                        .map(Millis);
                    if let Err(e) = call(sim, Action::SetTnWalTolerance { total }) {
                        fail(&mut response, hakeeper_error(&e, ""));
                    }
                }
                M::GetTnWalTolerance if !sim.model.offers_wal_tolerance() => {
                    return HaKeeper::not_supported(&request);
                }
                M::GetTnWalTolerance => {
                    let view = plane.kernel_view(key, sim);
                    response.tn_wal_tolerance = Some(logservice::TnWalTolerance {
                        total_millis: view.tn_wal_tolerance.map_or(0, |t| t.0),
                    });
                }
                _ => return HaKeeper::not_supported(&request),
            }
            response
        })
    }

    fn allocator(&self, request: lock::Request) -> Option<lock::Response> {
        use lock::Method as M;
        self.with(|plane, key, sim| {
            let mut response = lock::Response {
                request_id: request.request_id,
                method: request.method,
                ..Default::default()
            };
            let unavailable = |e: &dyn std::fmt::Display| {
                KernelError::new(
                    code::SERVICE_UNAVAILABLE,
                    format!("service unavailable: {e}"),
                )
                .to_bytes()
            };
            let Ok(method) = M::try_from(request.method) else {
                return LockAllocator::not_supported(&request);
            };
            let view = plane.kernel_view(key, sim);
            let allocator = match &view.lock_allocator {
                Ok(a) => a,
                Err(e) => {
                    response.error = unavailable(e);
                    return response;
                }
            };
            let known = |uuid: &str| {
                view.hakeeper
                    .as_ref()
                    .is_ok_and(|d| d.cns.iter().any(|c| c.uuid == uuid))
            };
            // The kernel's answers: for a service not restarting, "cannot restart" and -1;
            // for a service it does not know, "can restart" and 0.
            let answer = |uuid: &str| match allocator.restarting.get(uuid) {
                Some(a) => (a.can_restart, a.remaining_txns),
                None if known(uuid) => (false, -1),
                None => (true, 0),
            };
            match method {
                M::SetRestartService => {
                    let uuid = request
                        .set_restart_service
                        .clone()
                        .unwrap_or_default()
                        .service_id;
                    match plane.call(key, sim, Action::SetRestartService { uuid }) {
                        Ok(_) | Err(ActionError::DoesNotExist(_)) => {
                            response.set_restart_service =
                                Some(lock::SetRestartServiceResponse { ok: true })
                        }
                        Err(e) => response.error = unavailable(&e),
                    }
                }
                M::CanRestartService => {
                    let uuid = request
                        .can_restart_service
                        .clone()
                        .unwrap_or_default()
                        .service_id;
                    response.can_restart_service = Some(lock::CanRestartServiceResponse {
                        ok: answer(&uuid).0,
                    });
                }
                M::RemainTxnInService => {
                    let uuid = request
                        .remain_txn_in_service
                        .clone()
                        .unwrap_or_default()
                        .service_id;
                    response.remain_txn_in_service = Some(lock::RemainTxnInServiceResponse {
                        remain_txn: answer(&uuid)
                            .1
                            .clamp(i64::from(i32::MIN), i64::from(i32::MAX))
                            as i32,
                    });
                }
                M::BeginDrain | M::CancelDrain | M::ListDrains if !allocator.drain_protocol => {
                    return LockAllocator::not_supported(&request);
                }
                M::BeginDrain => {
                    let b = request.begin_drain.clone().unwrap_or_default();
                    match plane.call(
                        key,
                        sim,
                        Action::BeginDrain {
                            uuid: b.service_id.clone(),
                            start_epoch: b.start_epoch,
                        },
                    ) {
                        Ok(ActionOutput::DrainId { drain_id }) => {
                            response.begin_drain = Some(lock::BeginDrainResponse { drain_id })
                        }
                        Ok(ActionOutput::Done) => response.error = unavailable(&"no drain id"),
                        Err(ActionError::DoesNotExist(m)) => {
                            response.error = KernelError::new(
                                code::NO_SERVICE,
                                format!("service {} not found: {m}", b.service_id),
                            )
                            .to_bytes()
                        }
                        Err(e) => response.error = unavailable(&e),
                    }
                }
                M::CancelDrain => {
                    let drain_id = request.cancel_drain.map(|c| c.drain_id).unwrap_or_default();
                    if let Err(e) = plane.call(key, sim, Action::CancelDrain { drain_id }) {
                        response.error = unavailable(&e);
                    }
                }
                M::ListDrains => {
                    let drains = allocator
                        .drains
                        .iter()
                        .map(|(id, answer)| {
                            let (status, remaining_txns) = match answer {
                                DrainAnswer::Pending { remaining_txns } => {
                                    (lock::DrainStatus::DrainPending, *remaining_txns)
                                }
                                DrainAnswer::Done => (lock::DrainStatus::DrainDone, 0),
                                DrainAnswer::Cancelled => (lock::DrainStatus::DrainCancelled, 0),
                                DrainAnswer::InstanceGone => {
                                    (lock::DrainStatus::DrainInstanceGone, 0)
                                }
                            };
                            lock::DrainState {
                                drain_id: *id,
                                status: status as i32,
                                remaining_txns,
                            }
                        })
                        .collect();
                    response.list_drains = Some(lock::ListDrainsResponse { drains });
                }
                _ => return LockAllocator::not_supported(&request),
            }
            response
        })
    }

    fn query(&self, request: query::Request) -> Option<query::Response> {
        use query::CmdMethod as M;
        self.with(|plane, key, sim| {
            let mut response = query::Response {
                request_id: request.request_id,
                cmd_method: request.cmd_method,
                ..Default::default()
            };
            let view = plane.kernel_view(key, sim);
            let activity = match view.cn_activity.get(&self.name) {
                Some(Ok(a)) => *a,
                Some(Err(e)) => {
                    response.error = KernelError::new(
                        code::SERVICE_UNAVAILABLE,
                        format!("service unavailable: {e}"),
                    )
                    .to_bytes();
                    return response;
                }
                None => {
                    response.error =
                        KernelError::new(code::SERVICE_UNAVAILABLE, "CN query service is closing")
                            .to_bytes();
                    return response;
                }
            };
            match M::try_from(request.cmd_method) {
                Ok(M::ShowProcessList) => {
                    let uuid = cn_uuid(&self.name);
                    // Each session names the proxy it came through by that pod's IP and a
                    // port, as a CN behind a proxy reports it (`ProxyHost`).
                    let short = self
                        .name
                        .strip_prefix(&SimCluster::prefix(key))
                        .unwrap_or(&self.name);
                    let proxy_ip = |proxy: &str| {
                        sim.bound
                            .iter()
                            .filter(|(_, name)| name.as_str() == proxy)
                            .find_map(|(uid, _)| sim.servers.get(uid).map(|s| s.ip))
                    };
                    response.show_process_list_response = Some(query::ShowProcessListResponse {
                        sessions: sim
                            .model
                            .session_proxies(short)
                            .iter()
                            .zip(1u32..)
                            .map(|(proxy, i)| {
                                let ip = proxy.as_deref().and_then(proxy_ip);
                                status::Session {
                                    node_id: uuid.clone(),
                                    conn_id: i,
                                    session_id: format!("{uuid}-{i}"),
                                    account: "sys".into(),
                                    user: "dump".into(),
                                    command: "Query".into(),
                                    from_proxy: proxy.is_some(),
                                    proxy_host: ip.map_or_else(String::new, |ip| {
                                        format!("{ip}:{}", 40_000 + i)
                                    }),
                                    ..Default::default()
                                }
                            })
                            .collect(),
                    });
                    let _ = activity;
                }
                Ok(M::GetPipelineInfo) => {
                    response.get_pipeline_info_response = Some(query::GetPipelineInfoResponse {
                        count: i64::from(activity.pipelines),
                    });
                }
                Ok(M::GetReplicaCount) => {
                    response.get_replica_count = Some(query::GetReplicaCountResponse {
                        count: i64::from(activity.replicas),
                    });
                }
                Ok(M::GetLockInfo) => {
                    let short = self
                        .name
                        .strip_prefix(&SimCluster::prefix(key))
                        .unwrap_or(&self.name);
                    let lock_info_list = sim
                        .model
                        .cn_lock_holders(short)
                        .into_iter()
                        .map(|x| query::LockInfo {
                            holders: vec![lock::WaitTxn {
                                txn_id: x.to_be_bytes().to_vec(),
                                created_on: cn_uuid(&self.name),
                            }],
                            ..Default::default()
                        })
                        .collect();
                    response.get_lock_info_response = Some(query::GetLockInfoResponse {
                        cn_id: cn_uuid(&self.name),
                        lock_info_list,
                    });
                }
                Ok(M::GetTxnInfo) => {
                    let short = self
                        .name
                        .strip_prefix(&SimCluster::prefix(key))
                        .unwrap_or(&self.name);
                    // Creation times on the wall clock, as a CN reports them.
                    let now_model = sim.model.now();
                    let now_wall = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let txn_info_list = sim
                        .model
                        .cn_transactions(short)
                        .into_iter()
                        .map(|(x, created)| {
                            let ago = plane.to_wall(now_model - created);
                            let at = now_wall.saturating_sub(ago.0);
                            query::TxnInfo {
                                create_at: Some(query::WireTimestamp {
                                    seconds: (at / 1000) as i64,
                                    nanos: ((at % 1000) * 1_000_000) as i32,
                                }),
                                meta: Some(query::TxnMetaId {
                                    id: x.to_be_bytes().to_vec(),
                                }),
                                user_txn: true,
                            }
                        })
                        .collect();
                    response.get_txn_info_response = Some(query::GetTxnInfoResponse {
                        cn_id: cn_uuid(&self.name),
                        txn_info_list,
                    });
                }
                _ => return QueryService::not_supported(&request),
            }
            response
        })
    }
}
