//! The clients against servers built from this crate's transport, over real TCP: every
//! method, HAKeeper discovery, and each kind of failure typed as it must be.

use mo_rpc::frame;
use mo_rpc::pb::{lock, logservice, metadata, query, status};
use mo_rpc::{
    Discovery, ErrorKind, HaKeeper, HaKeeperClient, KernelError, LockAllocator,
    LockAllocatorClient, Options, QueryClient, QueryService, RpcError, Service, serve,
};
use prost::Message;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn options() -> Options {
    Options {
        timeout: Duration::from_secs(2),
        ..Options::default()
    }
}

async fn start<S: Service>(
    handler: impl Fn(S::Request) -> Option<S::Response> + Send + Sync + 'static,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve::<S>(listener, Arc::new(handler), 1 << 20));
    address
}

/// A log store: answers CHECK_HAKEEPER with `is_hakeeper`; as a HAKeeper it knows one CN.
fn log_store(
    is_hakeeper: bool,
    seen: Arc<Mutex<Vec<logservice::Request>>>,
) -> impl Fn(logservice::Request) -> Option<logservice::Response> + Send + Sync + 'static {
    use logservice::MethodType as M;
    move |request: logservice::Request| {
        seen.lock().unwrap().push(request.clone());
        let mut response = logservice::Response {
            request_id: request.request_id,
            method: request.method,
            ..Default::default()
        };
        let method = M::try_from(request.method).ok();
        if method == Some(M::CheckHakeeper) {
            response.is_ha_keeper = is_hakeeper;
            return Some(response);
        }
        if !is_hakeeper {
            // What a store without a HAKeeper replica answers (dragonboat's shard not found).
            response.error_code = 20437;
            return Some(response);
        }
        let cn_exists = |uuid: &str| uuid == "cn-a";
        match method {
            Some(M::GetClusterDetails) => {
                response.cluster_details = Some(logservice::ClusterDetails {
                    cn_stores: vec![logservice::CnStore {
                        uuid: "cn-a".into(),
                        work_state: metadata::WorkState::Working as i32,
                        query_address: "10.0.0.5:19998".into(),
                        ..Default::default()
                    }],
                    tn_stores: vec![logservice::TnStore {
                        uuid: "tn-0".into(),
                        lock_service_address: "10.0.0.9:22002".into(),
                        shards: vec![logservice::TnShardInfo {
                            shard_id: 2,
                            replica_id: 3,
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            }
            Some(M::GetClusterState) => {
                let mut stores = BTreeMap::new();
                stores.insert(
                    "cn-a".to_string(),
                    logservice::CnStoreInfo {
                        tick: 41,
                        up_time: 1_700,
                        work_state: metadata::WorkState::Draining as i32,
                        ..Default::default()
                    },
                );
                response.checker_state = Some(logservice::CheckerState {
                    tick: 42,
                    cn_state: Some(logservice::CnState { stores }),
                    ..Default::default()
                });
            }
            Some(M::CheckHealth) => {
                assert_eq!(request.check_health.unwrap().shard_id, 1);
            }
            Some(M::UpdateCnWorkState) => {
                let ws = request.cn_work_state.unwrap();
                if !cn_exists(&ws.uuid) {
                    response.error_code = 20101;
                    response.error_message =
                        format!("internal error: CN [{}] does not exist", ws.uuid);
                }
            }
            Some(M::PatchCnStore) => {
                let patch = request.cn_state_label.unwrap();
                assert_eq!(patch.labels["role"].labels, vec!["tp".to_string()]);
                if !cn_exists(&patch.uuid) {
                    response.error_code = 20101;
                    response.error_message =
                        format!("internal error: CN [{}] does not exist", patch.uuid);
                }
            }
            Some(M::UpdateCnLabel) => assert!(request.cn_store_label.is_some()),
            Some(M::DeleteCnStore) => assert!(request.delete_cn_store.is_some()),
            _ => return Some(HaKeeper::not_supported(&request)),
        }
        Some(response)
    }
}

#[tokio::test]
async fn hakeeper_is_found_among_log_stores_and_every_method_answers() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let follower = start::<HaKeeper>(log_store(false, seen.clone())).await;
    let hakeeper = start::<HaKeeper>(log_store(true, seen.clone())).await;
    // A store that is down: refused connections are skipped.
    let down = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let client = HaKeeperClient::new(
        Discovery::Addresses(vec![down, follower, hakeeper.clone()]),
        options(),
    );
    let details = client.get_cluster_details().await.unwrap();
    assert_eq!(client.connected_to().await, Some(hakeeper));
    assert_eq!(details.cn_stores[0].query_address, "10.0.0.5:19998");
    assert_eq!(details.tn_stores[0].lock_service_address, "10.0.0.9:22002");

    let state = client.get_cluster_state().await.unwrap();
    assert_eq!(state.tick, 42);
    let cns = client.get_cn_state().await.unwrap();
    assert_eq!(cns.stores["cn-a"].up_time, 1_700);
    assert_eq!(
        cns.stores["cn-a"].work_state,
        metadata::WorkState::Draining as i32
    );

    client.check_log_service_health().await.unwrap();
    client
        .update_cn_work_state("cn-a", metadata::WorkState::Draining)
        .await
        .unwrap();
    let labels = BTreeMap::from([("role".to_string(), vec!["tp".to_string()])]);
    client
        .patch_cn_store("cn-a", metadata::WorkState::Working, &labels)
        .await
        .unwrap();
    client.update_cn_label("cn-a", &labels).await.unwrap();
    client.delete_cn_store("cn-gone").await.unwrap();

    // Typed errors: an unknown CN is "does not exist", an extension the kernel lacks is
    // "unsupported"; neither is a transport failure.
    let unknown = client
        .update_cn_work_state("cn-z", metadata::WorkState::Draining)
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::DoesNotExist, "{unknown}");
    assert_eq!(unknown.kernel_code(), Some(20101));
    let unsupported = client.transfer_leader(1, "log-1").await.unwrap_err();
    assert_eq!(unsupported.kind(), ErrorKind::Unsupported, "{unsupported}");

    // Request ids are distinct per connection and never 0.
    let seen = seen.lock().unwrap();
    let ids: Vec<u64> = seen.iter().map(|r| r.request_id).collect();
    assert!(ids.iter().all(|&id| id > 0));
    // Every request carried the non-nullable LogRequest the kernel's Go type always has.
    assert!(seen.iter().all(|r| r.log_request.is_some()));
}

#[tokio::test]
async fn discovery_address_puts_the_shard_leader_first_and_no_hakeeper_is_typed() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hakeeper = start::<HaKeeper>(log_store(true, seen.clone())).await;
    let follower = start::<HaKeeper>(log_store(false, seen.clone())).await;
    let (leader, other) = (hakeeper.clone(), follower.clone());
    let discovery = start::<HaKeeper>(move |request: logservice::Request| {
        assert_eq!(request.method, logservice::MethodType::GetShardInfo as i32);
        assert_eq!(request.log_request.as_ref().unwrap().shard_id, 0);
        let replicas = BTreeMap::from([
            (
                1,
                logservice::ReplicaInfo {
                    uuid: "log-0".into(),
                    service_address: other.clone(),
                },
            ),
            (
                2,
                logservice::ReplicaInfo {
                    uuid: "log-1".into(),
                    service_address: leader.clone(),
                },
            ),
        ]);
        Some(logservice::Response {
            request_id: request.request_id,
            method: request.method,
            shard_info: Some(logservice::ShardInfoQueryResult {
                leader_id: 2,
                replicas,
                ..Default::default()
            }),
            ..Default::default()
        })
    })
    .await;
    let client = HaKeeperClient::new(Discovery::DiscoveryAddress(discovery), options());
    client.get_cluster_details().await.unwrap();
    assert_eq!(client.connected_to().await, Some(hakeeper));
    // The leader was probed first: the follower was never asked anything.
    let checks = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.method == logservice::MethodType::CheckHakeeper as i32)
        .count();
    assert_eq!(checks, 1);

    let nobody = HaKeeperClient::new(Discovery::Addresses(vec![follower]), options());
    let e = nobody.get_cluster_details().await.unwrap_err();
    assert!(matches!(e, RpcError::NoHaKeeper { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Unavailable);
}

#[tokio::test]
async fn a_hakeeper_that_moves_away_is_found_again() {
    let serving = Arc::new(Mutex::new(0usize));
    let mut addresses = Vec::new();
    for index in 0..2 {
        let serving = serving.clone();
        addresses.push(
            start::<HaKeeper>(move |request: logservice::Request| {
                let me = *serving.lock().unwrap() == index;
                let mut r = logservice::Response {
                    request_id: request.request_id,
                    method: request.method,
                    is_ha_keeper: me,
                    ..Default::default()
                };
                if request.method != logservice::MethodType::CheckHakeeper as i32 && !me {
                    r.error_code = 20417; // NoHAKeeper
                }
                Some(r)
            })
            .await,
        );
    }
    let client = HaKeeperClient::new(Discovery::Addresses(addresses.clone()), options());
    client.get_cluster_details().await.unwrap();
    assert_eq!(
        client.connected_to().await.as_deref(),
        Some(addresses[0].as_str())
    );
    *serving.lock().unwrap() = 1;
    let e = client.get_cluster_details().await.unwrap_err();
    assert_eq!(e.kernel_code(), Some(20417));
    assert_eq!(
        client.connected_to().await,
        None,
        "forgotten after NoHAKeeper"
    );
    client.get_cluster_details().await.unwrap();
    assert_eq!(
        client.connected_to().await.as_deref(),
        Some(addresses[1].as_str())
    );
}

#[tokio::test]
async fn lock_allocator_handshake_and_drain_extension() {
    // A kernel-like allocator: one known service; unknown ones answer "can restart", 0.
    let restarting = Arc::new(Mutex::new(false));
    let flag = restarting.clone();
    let address = start::<LockAllocator>(move |request: lock::Request| {
        use lock::Method as M;
        let mut r = lock::Response {
            request_id: request.request_id,
            method: request.method,
            ..Default::default()
        };
        match M::try_from(request.method) {
            Ok(M::SetRestartService) => {
                if request.set_restart_service.unwrap().service_id == "cn-a" {
                    *flag.lock().unwrap() = true;
                }
                r.set_restart_service = Some(lock::SetRestartServiceResponse { ok: true });
            }
            Ok(M::CanRestartService) => {
                let known = request.can_restart_service.unwrap().service_id == "cn-a";
                r.can_restart_service = Some(lock::CanRestartServiceResponse {
                    ok: !known || *flag.lock().unwrap(),
                });
            }
            Ok(M::RemainTxnInService) => {
                let known = request.remain_txn_in_service.unwrap().service_id == "cn-a";
                r.remain_txn_in_service = Some(lock::RemainTxnInServiceResponse {
                    remain_txn: if known && !*flag.lock().unwrap() {
                        -1
                    } else {
                        0
                    },
                });
            }
            _ => return Some(LockAllocator::not_supported(&request)),
        }
        Some(r)
    })
    .await;
    let client = LockAllocatorClient::new(address, options());
    assert!(!client.can_restart_service("cn-a").await.unwrap());
    assert_eq!(client.remain_txn_in_service("cn-a").await.unwrap(), -1);
    assert!(client.set_restart_service("cn-a").await.unwrap());
    assert!(client.can_restart_service("cn-a").await.unwrap());
    assert_eq!(client.remain_txn_in_service("cn-a").await.unwrap(), 0);
    // The kernel's own quirk, surfaced as is: an unknown service "can restart".
    assert!(client.can_restart_service("cn-unknown").await.unwrap());
    let e = client.list_drains().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert_eq!(e.kernel_code(), Some(20105));
}

#[tokio::test]
async fn query_service_counts_and_a_closing_cn_is_unavailable() {
    let closing = Arc::new(Mutex::new(false));
    let flag = closing.clone();
    let address = start::<QueryService>(move |request: query::Request| {
        use query::CmdMethod as M;
        let mut r = query::Response {
            request_id: request.request_id,
            cmd_method: request.cmd_method,
            ..Default::default()
        };
        if *flag.lock().unwrap() {
            r.error = KernelError::new(20506, "CN query service is closing").to_bytes();
            return Some(r);
        }
        match M::try_from(request.cmd_method) {
            Ok(M::ShowProcessList) => {
                assert!(request.show_process_list_request.unwrap().sys_tenant);
                r.show_process_list_response = Some(query::ShowProcessListResponse {
                    sessions: (0..3)
                        .map(|i| status::Session {
                            conn_id: i,
                            account: "sys".into(),
                            ..Default::default()
                        })
                        .collect(),
                });
            }
            Ok(M::GetPipelineInfo) => {
                assert!(request.get_pipeline_info_request.is_some());
                r.get_pipeline_info_response = Some(query::GetPipelineInfoResponse { count: 2 });
            }
            Ok(M::GetReplicaCount) => {
                r.get_replica_count = Some(query::GetReplicaCountResponse { count: 5 });
            }
            _ => return Some(QueryService::not_supported(&request)),
        }
        Some(r)
    })
    .await;
    let client = QueryClient::new(address, options());
    assert_eq!(client.show_process_list().await.unwrap().len(), 3);
    assert_eq!(client.get_pipeline_info().await.unwrap(), 2);
    assert_eq!(client.get_replica_count().await.unwrap(), 5);
    *closing.lock().unwrap() = true;
    let e = client.get_pipeline_info().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(e.kernel_code(), Some(20506));
}

#[tokio::test]
async fn silence_is_a_timeout_and_a_dead_process_is_a_lost_connection() {
    // Accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let client = QueryClient::new(
        address,
        Options {
            timeout: Duration::from_millis(300),
            ..Options::default()
        },
    );
    let e = client.get_replica_count().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");

    // A handler that cannot answer closes the connection.
    let dead = start::<QueryService>(|_| None).await;
    let e = QueryClient::new(dead, options())
        .get_replica_count()
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::ConnectionLost { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Unavailable);

    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let e = QueryClient::new(refused, options())
        .get_replica_count()
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Connect { .. }), "{e}");
}

#[tokio::test]
async fn many_calls_in_flight_on_one_connection_get_their_own_answers() {
    let address = start::<QueryService>(|request: query::Request| {
        Some(query::Response {
            request_id: request.request_id,
            cmd_method: request.cmd_method,
            get_replica_count: Some(query::GetReplicaCountResponse {
                count: request.request_id as i64,
            }),
            ..Default::default()
        })
    })
    .await;
    let endpoint = Arc::new(mo_rpc::Endpoint::<QueryService>::new(address, options()));
    let calls = (0..64).map(|_| {
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            let r = endpoint
                .call(query::Request {
                    cmd_method: query::CmdMethod::GetReplicaCount as i32,
                    ..Default::default()
                })
                .await
                .unwrap();
            (r.request_id, r.get_replica_count.unwrap().count)
        })
    });
    let mut ids = Vec::new();
    for call in calls {
        let (id, count) = call.await.unwrap();
        assert_eq!(id as i64, count, "answer matched to its own request");
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 64);
}

/// A log store hosting a HAKeeper replica that, once `stuck` is set, keeps its connections open
/// and answers `CHECK_HAKEEPER` ("I am a HAKeeper") but nothing else: a partitioned or overloaded
/// store whose calls can only time out. It never blocks a runtime thread, so the client's
/// timer fires on time whatever the scheduler does.
async fn stuck_hakeeper(stuck: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let stuck = stuck.clone();
            tokio::spawn(async move {
                let (mut read, mut write) = stream.into_split();
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some((frame, used)) =
                        frame::decode(&buffer, frame::DEFAULT_MAX_BODY).unwrap()
                    {
                        buffer.drain(..used);
                        let request = logservice::Request::decode(frame.body.as_slice()).unwrap();
                        let check = request.method == logservice::MethodType::CheckHakeeper as i32;
                        if stuck.load(Ordering::SeqCst) && !check {
                            continue; // read, never answered
                        }
                        let response = logservice::Response {
                            request_id: request.request_id,
                            method: request.method,
                            is_ha_keeper: true,
                            ..Default::default()
                        };
                        let answer = frame::Frame::message(
                            response.encode_to_vec(),
                            frame.timeout_ns.unwrap_or(0),
                            true,
                        );
                        if write.write_all(&frame::encode(&answer)).await.is_err() {
                            return;
                        }
                    }
                    match read.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    address
}

#[tokio::test]
async fn a_hakeeper_gone_silent_is_left_for_another_replica() {
    let stuck = Arc::new(AtomicBool::new(false));
    let addresses = vec![
        stuck_hakeeper(stuck.clone()).await,
        start::<HaKeeper>(|request: logservice::Request| {
            Some(logservice::Response {
                request_id: request.request_id,
                method: request.method,
                is_ha_keeper: true,
                ..Default::default()
            })
        })
        .await,
    ];
    // Long enough that an answering replica always answers in time on a loaded machine; the
    // stuck one never answers, so its call is a timeout whatever this bound is.
    let client = HaKeeperClient::new(Discovery::Addresses(addresses.clone()), options());
    client.get_cluster_state().await.unwrap();
    assert_eq!(
        client.connected_to().await.as_deref(),
        Some(addresses[0].as_str())
    );
    stuck.store(true, Ordering::SeqCst);
    // One call, one replica: the timed-out call is reported, not retried elsewhere.
    let e = client.get_cluster_state().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(
        client.connected_to().await,
        None,
        "a silent HAKeeper is forgotten"
    );
    // The replica that failed is probed last: the next call goes to the other one, although
    // the stuck one still says it is a HAKeeper.
    client.get_cluster_state().await.unwrap();
    assert_eq!(
        client.connected_to().await.as_deref(),
        Some(addresses[1].as_str())
    );
}

/// A read through one store's replica: shard 0 with `GET_CLUSTER_STATE`, a log shard with
/// `GET_TRUNCATE` naming it, sent to that store and no other; a replica still catching up
/// (here: a store that answers the log shard's read with dragonboat's timeout) is an error.
#[tokio::test]
async fn a_read_through_a_replica_goes_to_that_store_and_names_the_shard() {
    use logservice::MethodType as M;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let lagging_on = 1;
    let address = {
        let seen = seen.clone();
        start::<HaKeeper>(move |request: logservice::Request| {
            seen.lock().unwrap().push(request.clone());
            let mut response = logservice::Response {
                request_id: request.request_id,
                method: request.method,
                ..Default::default()
            };
            let shard = request.log_request.as_ref().map_or(0, |r| r.shard_id);
            if M::try_from(request.method) == Ok(M::GetTruncate) && shard == lagging_on {
                response.error_code = mo_rpc::error::code::DRAGONBOAT_TIMEOUT;
            }
            Some(response)
        })
        .await
    };
    let store = mo_rpc::LogStoreClient::new(address, options());
    store.read_through_replica(0).await.expect("shard 0 read");
    let error = store.read_through_replica(1).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].method, M::GetClusterState as i32);
    assert_eq!(seen[1].method, M::GetTruncate as i32);
    assert_eq!(seen[1].log_request.as_ref().map(|r| r.shard_id), Some(1));
}

/// A server that answers every request with a frame announcing `announced` bytes and then
/// sends nothing more.
async fn lying_server(announced: u32) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(&announced.to_be_bytes()).await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    address
}

/// A garbage length from a kernel is refused at once, by the limit of the service asked (a
/// lock allocator's answers are small), not after waiting for 100 MiB that never come; a
/// length within the limit is read (and here times out, as silence does).
#[tokio::test]
async fn an_answer_announcing_more_than_its_service_can_send_is_refused_at_once() {
    let started = std::time::Instant::now();
    let client = LockAllocatorClient::new(lying_server(8 << 20).await, options());
    let e = client.set_restart_service("cn-a").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let client = LockAllocatorClient::new(lying_server(1 << 20).await, options());
    let e = client.set_restart_service("cn-a").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let hakeeper = HaKeeperClient::new(
        Discovery::Addresses(vec![lying_server(20 << 20).await]),
        options(),
    );
    let e = hakeeper.get_cluster_state().await.unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
}
