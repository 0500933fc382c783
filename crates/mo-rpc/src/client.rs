//! Clients for the calls the operator makes: HAKeeper (found by probing), the TN lock-table
//! allocator, and a CN's query service. Each kernel error comes back typed ([`RpcError`]).

use crate::error::{KernelError, RpcError, code};
use crate::pb::{lock, logservice, metadata, query};
use crate::service::{HaKeeper, LockAllocator, QueryService};
use crate::transport::{Endpoint, Options};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The kernel's first (and only) TN shard's log shard, which `CheckLogServiceHealth` asks about.
pub const FIRST_LOG_SHARD_ID: u64 = 1;

/// How to find the HAKeeper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Log service RPC addresses; each is asked whether it hosts a HAKeeper replica.
    Addresses(Vec<String>),
    /// One address (e.g. a Service in front of the log stores) asked for shard 0's replicas
    /// (`GET_SHARD_INFO`); the leader is probed first, then the others.
    DiscoveryAddress(String),
}

/// HAKeeper client. It finds a log store hosting a HAKeeper replica, keeps talking to it,
/// and looks again when that store fails or says it is not (or no longer) the HAKeeper.
pub struct HaKeeperClient {
    discovery: Discovery,
    options: Options,
    current: tokio::sync::Mutex<Option<Arc<Endpoint<HaKeeper>>>>,
    /// The address that failed last: probed last next time, so that a replica that still
    /// says "I am a HAKeeper" but does not answer calls is not chosen again and again.
    failed: std::sync::Mutex<Option<String>>,
}

fn log_request(method: logservice::MethodType) -> logservice::Request {
    logservice::Request {
        method: method as i32,
        // The kernel's Go type always carries it (non-nullable); send it too.
        log_request: Some(logservice::LogRequest::default()),
        ..Default::default()
    }
}

fn labels(map: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, metadata::LabelList> {
    map.iter()
        .map(|(k, v)| (k.clone(), metadata::LabelList { labels: v.clone() }))
        .collect()
}

impl HaKeeperClient {
    pub fn new(discovery: Discovery, options: Options) -> HaKeeperClient {
        HaKeeperClient {
            discovery,
            options,
            current: tokio::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
        }
    }

    /// The address of the HAKeeper replica in use, once one was found.
    pub async fn connected_to(&self) -> Option<String> {
        self.current
            .lock()
            .await
            .as_ref()
            .map(|e| e.address().to_string())
    }

    async fn candidates(&self) -> Result<Vec<String>, RpcError> {
        match &self.discovery {
            Discovery::Addresses(addresses) => Ok(addresses.clone()),
            Discovery::DiscoveryAddress(address) => {
                let endpoint = Endpoint::<HaKeeper>::new(address.clone(), self.options.clone());
                let mut request = log_request(logservice::MethodType::GetShardInfo);
                if let Some(r) = request.log_request.as_mut() {
                    r.shard_id = 0;
                    r.exclude_hard_down_replica_addresses = true;
                }
                let response = checked(address, endpoint.call(request).await?)?;
                let info = response.shard_info.unwrap_or_default();
                let mut addresses: Vec<String> = Vec::new();
                if let Some(leader) = info.replicas.get(&info.leader_id) {
                    addresses.push(leader.service_address.clone());
                }
                for replica in info.replicas.values() {
                    if !addresses.contains(&replica.service_address) {
                        addresses.push(replica.service_address.clone());
                    }
                }
                Ok(addresses)
            }
        }
    }

    async fn locate(&self) -> Result<Arc<Endpoint<HaKeeper>>, RpcError> {
        let mut current = self.current.lock().await;
        if let Some(endpoint) = current.as_ref() {
            return Ok(endpoint.clone());
        }
        let mut tried = Vec::new();
        let mut candidates = self.candidates().await?;
        let failed = self.failed.lock().expect("failed lock").clone();
        if let Some(failed) = failed {
            candidates.sort_by_key(|a| *a == failed);
        }
        for address in candidates {
            let endpoint = Arc::new(Endpoint::<HaKeeper>::new(
                address.clone(),
                self.options.clone(),
            ));
            match endpoint
                .call(log_request(logservice::MethodType::CheckHakeeper))
                .await
            {
                Ok(r) if r.is_ha_keeper => {
                    *current = Some(endpoint.clone());
                    return Ok(endpoint);
                }
                Ok(_) => tried.push(format!("{address}: not a HAKeeper replica")),
                Err(e) => tried.push(e.to_string()),
            }
        }
        if tried.is_empty() {
            tried.push("no address to try".into());
        }
        Err(RpcError::NoHaKeeper { tried })
    }

    /// One call to the HAKeeper; a store that fails or is not the HAKeeper is forgotten, so
    /// the next call looks again. The kernel's error code comes back as [`RpcError::Kernel`].
    pub async fn call(
        &self,
        request: logservice::Request,
    ) -> Result<logservice::Response, RpcError> {
        let endpoint = self.locate().await?;
        let result = endpoint
            .call(request)
            .await
            .and_then(|r| checked(endpoint.address(), r));
        if let Err(e) = &result {
            let relocate = match e {
                RpcError::Kernel { error, .. } => matches!(
                    error.code,
                    code::NO_HAKEEPER | code::DRAGONBOAT_SHARD_NOT_FOUND
                ),
                // As the kernel's own client: a network failure or silence means looking
                // again (another replica may answer).
                RpcError::Connect { .. }
                | RpcError::ConnectionLost { .. }
                | RpcError::Timeout { .. } => true,
                _ => false,
            };
            if relocate {
                let mut current = self.current.lock().await;
                if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &endpoint)) {
                    *current = None;
                    *self.failed.lock().expect("failed lock") =
                        Some(endpoint.address().to_string());
                }
            }
        }
        result
    }

    /// `CHECK_HAKEEPER` against one address, without discovery.
    pub async fn check_hakeeper(address: &str, options: Options) -> Result<bool, RpcError> {
        let endpoint = Endpoint::<HaKeeper>::new(address, options);
        let response = checked(
            address,
            endpoint
                .call(log_request(logservice::MethodType::CheckHakeeper))
                .await?,
        )?;
        Ok(response.is_ha_keeper)
    }

    pub async fn get_cluster_details(&self) -> Result<logservice::ClusterDetails, RpcError> {
        let r = self
            .call(log_request(logservice::MethodType::GetClusterDetails))
            .await?;
        Ok(r.cluster_details.unwrap_or_default())
    }

    /// `GetClusterState`: the HAKeeper's checker state (ticks, CN/TN/log/proxy stores).
    pub async fn get_cluster_state(&self) -> Result<logservice::CheckerState, RpcError> {
        let r = self
            .call(log_request(logservice::MethodType::GetClusterState))
            .await?;
        Ok(r.checker_state.unwrap_or_default())
    }

    /// `GetCNState`: there is no method of that name on the wire; the kernel's client sends
    /// `GET_CLUSTER_STATE` and keeps the CN part, and so does this.
    pub async fn get_cn_state(&self) -> Result<logservice::CnState, RpcError> {
        Ok(self.get_cluster_state().await?.cn_state.unwrap_or_default())
    }

    /// `CheckLogServiceHealth`, as the kernel's client does it: `CHECK_HEALTH` of the first
    /// log shard for every shard of every TN store (no TN store: healthy).
    pub async fn check_log_service_health(&self) -> Result<(), RpcError> {
        let details = self.get_cluster_details().await?;
        for tn in &details.tn_stores {
            for _ in &tn.shards {
                let mut request = log_request(logservice::MethodType::CheckHealth);
                request.check_health = Some(logservice::CheckHealth {
                    shard_id: FIRST_LOG_SHARD_ID,
                });
                self.call(request).await?;
            }
        }
        Ok(())
    }

    /// `PatchCNStore`: work state and labels in one call.
    pub async fn patch_cn_store(
        &self,
        uuid: &str,
        state: metadata::WorkState,
        label_map: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::PatchCnStore);
        request.cn_state_label = Some(logservice::CnStateLabel {
            uuid: uuid.to_string(),
            state: state as i32,
            labels: labels(label_map),
        });
        self.call(request).await.map(|_| ())
    }

    pub async fn update_cn_work_state(
        &self,
        uuid: &str,
        state: metadata::WorkState,
    ) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::UpdateCnWorkState);
        request.cn_work_state = Some(logservice::CnWorkState {
            uuid: uuid.to_string(),
            state: state as i32,
        });
        self.call(request).await.map(|_| ())
    }

    pub async fn update_cn_label(
        &self,
        uuid: &str,
        label_map: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::UpdateCnLabel);
        request.cn_store_label = Some(logservice::CnStoreLabel {
            uuid: uuid.to_string(),
            operation: logservice::CnLabelOp::SetLabel as i32,
            labels: labels(label_map),
        });
        self.call(request).await.map(|_| ())
    }

    /// `DeleteCNStore`. The kernel answers success for a CN it does not know.
    pub async fn delete_cn_store(&self, uuid: &str) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::DeleteCnStore);
        request.delete_cn_store = Some(logservice::DeleteCnStore {
            store_id: uuid.to_string(),
        });
        self.call(request).await.map(|_| ())
    }

    /// Operator extension: move a log shard's leadership to the replica on `store`.
    pub async fn transfer_leader(&self, shard_id: u64, store: &str) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::TransferLeader);
        request.transfer_leader = Some(logservice::TransferLeader {
            shard_id,
            target_store: store.to_string(),
        });
        self.call(request).await.map(|_| ())
    }

    /// Operator extension: the TN's total WAL-append tolerance (`None`: the default).
    pub async fn set_tn_wal_tolerance(&self, total_millis: Option<u64>) -> Result<(), RpcError> {
        let mut request = log_request(logservice::MethodType::SetTnWalTolerance);
        request.tn_wal_tolerance = Some(logservice::TnWalTolerance {
            total_millis: total_millis.unwrap_or(0),
        });
        self.call(request).await.map(|_| ())
    }

    pub async fn get_tn_wal_tolerance(&self) -> Result<Option<u64>, RpcError> {
        let r = self
            .call(log_request(logservice::MethodType::GetTnWalTolerance))
            .await?;
        Ok(r.tn_wal_tolerance
            .map(|t| t.total_millis)
            .filter(|&t| t > 0))
    }
}

/// The HAKeeper's own log shard.
pub const HAKEEPER_SHARD_ID: u64 = 0;

/// One LOG store's log service, asked about its own replicas (not through discovery).
pub struct LogStoreClient {
    endpoint: Endpoint<HaKeeper>,
}

impl LogStoreClient {
    pub fn new(address: impl Into<String>, options: Options) -> LogStoreClient {
        LogStoreClient {
            endpoint: Endpoint::new(address.into(), options),
        }
    }

    pub fn address(&self) -> &str {
        self.endpoint.address()
    }

    /// A read of `shard_id` through this store's own replica: the store serves it with
    /// `SyncRead`, a read index, which answers only once the local replica has applied the
    /// shard's log up to the leader's commit index (v1.2.4 `logservice/store.go` `read`). An
    /// answer within the call's deadline means this replica has caught up; a lagging one
    /// times out. Shard 0 is read with `GET_CLUSTER_STATE` (the HAKeeper state machine knows
    /// no other query), a log shard with `GET_TRUNCATE`.
    pub async fn read_through_replica(&self, shard_id: u64) -> Result<(), RpcError> {
        let request = if shard_id == HAKEEPER_SHARD_ID {
            log_request(logservice::MethodType::GetClusterState)
        } else {
            let mut request = log_request(logservice::MethodType::GetTruncate);
            request.log_request = Some(logservice::LogRequest {
                shard_id,
                ..Default::default()
            });
            request
        };
        checked(self.address(), self.endpoint.call(request).await?)?;
        Ok(())
    }
}

/// A logservice answer's error fields as a typed error.
fn checked(address: &str, r: logservice::Response) -> Result<logservice::Response, RpcError> {
    if r.error_code == 0 {
        return Ok(r);
    }
    Err(RpcError::Kernel {
        address: address.to_string(),
        error: KernelError::new(r.error_code, r.error_message),
    })
}

fn checked_bytes(address: &str, error: &[u8]) -> Result<(), RpcError> {
    match KernelError::from_bytes(error) {
        Ok(None) => Ok(()),
        Ok(Some(error)) => Err(RpcError::Kernel {
            address: address.to_string(),
            error,
        }),
        Err(e) => Err(RpcError::Malformed {
            address: address.to_string(),
            detail: format!("error field: {e}"),
        }),
    }
}

fn missing(address: &str, what: &str) -> RpcError {
    RpcError::Malformed {
        address: address.to_string(),
        detail: format!("answer without {what}"),
    }
}

/// The TN's lock-table allocator (at `TNStore.LockServiceAddress`).
pub struct LockAllocatorClient {
    endpoint: Endpoint<LockAllocator>,
}

/// One instance-bound drain as the allocator reports it (operator extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainState {
    pub id: u64,
    pub status: lock::DrainStatus,
    pub remaining_txns: u64,
}

impl LockAllocatorClient {
    pub fn new(address: impl Into<String>, options: Options) -> LockAllocatorClient {
        LockAllocatorClient {
            endpoint: Endpoint::new(address, options),
        }
    }

    pub fn address(&self) -> &str {
        self.endpoint.address()
    }

    async fn call(&self, request: lock::Request) -> Result<lock::Response, RpcError> {
        let response = self.endpoint.call(request).await?;
        checked_bytes(self.address(), &response.error)?;
        Ok(response)
    }

    /// Marks the CN's lock service as restarting; the kernel answers OK even for a service
    /// it does not know.
    pub async fn set_restart_service(&self, uuid: &str) -> Result<bool, RpcError> {
        let r = self
            .call(lock::Request {
                method: lock::Method::SetRestartService as i32,
                set_restart_service: Some(lock::SetRestartServiceRequest {
                    service_id: uuid.to_string(),
                }),
                ..Default::default()
            })
            .await?;
        let answer = r
            .set_restart_service
            .ok_or_else(|| missing(self.address(), "SetRestartService"))?;
        Ok(answer.ok)
    }

    /// True once the CN handed every lock table over. The kernel also answers true for a
    /// service it does not know: never a confirmation on its own.
    pub async fn can_restart_service(&self, uuid: &str) -> Result<bool, RpcError> {
        let r = self
            .call(lock::Request {
                method: lock::Method::CanRestartService as i32,
                can_restart_service: Some(lock::CanRestartServiceRequest {
                    service_id: uuid.to_string(),
                }),
                ..Default::default()
            })
            .await?;
        let answer = r
            .can_restart_service
            .ok_or_else(|| missing(self.address(), "CanRestartService"))?;
        Ok(answer.ok)
    }

    /// Transactions still holding locks on the CN; −1 when the allocator is inconsistent.
    pub async fn remain_txn_in_service(&self, uuid: &str) -> Result<i32, RpcError> {
        let r = self
            .call(lock::Request {
                method: lock::Method::RemainTxnInService as i32,
                remain_txn_in_service: Some(lock::RemainTxnInServiceRequest {
                    service_id: uuid.to_string(),
                }),
                ..Default::default()
            })
            .await?;
        let answer = r
            .remain_txn_in_service
            .ok_or_else(|| missing(self.address(), "RemainTxnInService"))?;
        Ok(answer.remain_txn)
    }

    /// Operator extension: start the instance-bound drain of the CN instance `start_epoch`.
    pub async fn begin_drain(&self, uuid: &str, start_epoch: u64) -> Result<u64, RpcError> {
        let r = self
            .call(lock::Request {
                method: lock::Method::BeginDrain as i32,
                begin_drain: Some(lock::BeginDrainRequest {
                    service_id: uuid.to_string(),
                    start_epoch,
                }),
                ..Default::default()
            })
            .await?;
        let answer = r
            .begin_drain
            .ok_or_else(|| missing(self.address(), "BeginDrain"))?;
        Ok(answer.drain_id)
    }

    pub async fn cancel_drain(&self, drain_id: u64) -> Result<(), RpcError> {
        self.call(lock::Request {
            method: lock::Method::CancelDrain as i32,
            cancel_drain: Some(lock::CancelDrainRequest { drain_id }),
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    /// Operator extension: every drain the allocator knows. A kernel without the drain
    /// protocol answers `Unsupported`.
    pub async fn list_drains(&self) -> Result<Vec<DrainState>, RpcError> {
        let r = self
            .call(lock::Request {
                method: lock::Method::ListDrains as i32,
                ..Default::default()
            })
            .await?;
        let list = r
            .list_drains
            .ok_or_else(|| missing(self.address(), "ListDrains"))?;
        list.drains
            .into_iter()
            .map(|d| {
                let status = lock::DrainStatus::try_from(d.status)
                    .map_err(|_| missing(self.address(), "a known drain status"))?;
                Ok(DrainState {
                    id: d.drain_id,
                    status,
                    remaining_txns: d.remaining_txns,
                })
            })
            .collect()
    }
}

/// A CN's query service (at `CNStore.QueryAddress`).
pub struct QueryClient {
    endpoint: Endpoint<QueryService>,
}

impl QueryClient {
    pub fn new(address: impl Into<String>, options: Options) -> QueryClient {
        QueryClient {
            endpoint: Endpoint::new(address, options),
        }
    }

    pub fn address(&self) -> &str {
        self.endpoint.address()
    }

    async fn call(&self, request: query::Request) -> Result<query::Response, RpcError> {
        let response = self.endpoint.call(request).await?;
        checked_bytes(self.address(), &response.error)?;
        Ok(response)
    }

    /// Sessions of every tenant (the kernel's handler needs the request message present).
    pub async fn show_process_list(&self) -> Result<Vec<crate::pb::status::Session>, RpcError> {
        let r = self
            .call(query::Request {
                cmd_method: query::CmdMethod::ShowProcessList as i32,
                show_process_list_request: Some(query::ShowProcessListRequest {
                    tenant: String::new(),
                    sys_tenant: true,
                }),
                ..Default::default()
            })
            .await?;
        let list = r
            .show_process_list_response
            .ok_or_else(|| missing(self.address(), "ShowProcessListResponse"))?;
        Ok(list.sessions)
    }

    /// The locks in the CN's own lock tables, with their holders and waiters.
    pub async fn get_lock_info(&self) -> Result<Vec<query::LockInfo>, RpcError> {
        let r = self
            .call(query::Request {
                cmd_method: query::CmdMethod::GetLockInfo as i32,
                get_lock_info_request: Some(query::GetLockInfoRequest {}),
                ..Default::default()
            })
            .await?;
        let info = r
            .get_lock_info_response
            .ok_or_else(|| missing(self.address(), "GetLockInfoResponse"))?;
        Ok(info.lock_info_list)
    }

    /// Every transaction the CN's transaction client runs (or holds waiting to start).
    pub async fn get_txn_info(&self) -> Result<Vec<query::TxnInfo>, RpcError> {
        let r = self
            .call(query::Request {
                cmd_method: query::CmdMethod::GetTxnInfo as i32,
                get_txn_info_request: Some(query::GetTxnInfoRequest {}),
                ..Default::default()
            })
            .await?;
        let info = r
            .get_txn_info_response
            .ok_or_else(|| missing(self.address(), "GetTxnInfoResponse"))?;
        Ok(info.txn_info_list)
    }

    /// Pipelines running on the CN.
    pub async fn get_pipeline_info(&self) -> Result<i64, RpcError> {
        let r = self
            .call(query::Request {
                cmd_method: query::CmdMethod::GetPipelineInfo as i32,
                get_pipeline_info_request: Some(query::GetPipelineInfoRequest {}),
                ..Default::default()
            })
            .await?;
        let info = r
            .get_pipeline_info_response
            .ok_or_else(|| missing(self.address(), "GetPipelineInfoResponse"))?;
        Ok(info.count)
    }

    /// Shard replicas the CN hosts.
    pub async fn get_replica_count(&self) -> Result<i64, RpcError> {
        let r = self
            .call(query::Request {
                cmd_method: query::CmdMethod::GetReplicaCount as i32,
                get_replica_count: Some(query::GetReplicaCountRequest { cn: String::new() }),
                ..Default::default()
            })
            .await?;
        let count = r
            .get_replica_count
            .ok_or_else(|| missing(self.address(), "GetReplicaCount"))?;
        Ok(count.count)
    }
}
