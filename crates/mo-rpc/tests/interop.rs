//! Our client against MatrixOne's own code: `morpc-interop serve` runs the kernel's morpc
//! servers (its codecs, its message types, its NotSupported answers) with a fixture of
//! answers, and prints every request as the kernel decoded it. Each client method is called
//! and both directions are checked: our decoding of the kernel's answer, and the kernel's
//! decoding of our request. (The kernel's client against our simulated kernel is in the
//! operator's end-to-end tests.) The kernel is v1.2.4, the newest the module proxy serves;
//! see `tools/morpc-interop/main.go` and `docs/morpc-protocol.md`.

use mo_rpc::pb::metadata;
use mo_rpc::{
    Discovery, ErrorKind, HaKeeperClient, LockAllocatorClient, Options, QueryClient, RpcError,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A kernel server (`morpc-interop serve`), killed when dropped.
struct KernelServer {
    address: String,
    lines: Lines<BufReader<ChildStdout>>,
    _child: Child,
}

impl KernelServer {
    async fn start(service: &str, fixture: Value) -> KernelServer {
        KernelServer::start_with(service, fixture, &[]).await
    }

    async fn start_with(service: &str, fixture: Value, extra: &[&str]) -> KernelServer {
        let bin = mo_testenv::morpc_interop().expect("morpc-interop (needs Go)");
        let file = std::env::temp_dir().join(format!(
            "morpc-fixture-{}-{service}-{}.json",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::write(&file, fixture.to_string()).expect("fixture");
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--service", service])
            .arg("--fixture")
            .arg(&file)
            .args(extra)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn morpc-interop serve");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the kernel server starts")
            .expect("read")
            .expect("a first line");
        let address = first
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_string();
        KernelServer {
            address,
            lines,
            _child: child,
        }
    }

    /// The next request as the kernel decoded it.
    async fn request(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("the kernel printed the request")
            .expect("read")
            .expect("a line");
        let v: Value = serde_json::from_str(&line).expect("JSON line");
        v["request"].clone()
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn options() -> Options {
    Options {
        timeout: Duration::from_secs(5),
        ..Options::default()
    }
}

fn kernel_code(e: &RpcError) -> Option<u32> {
    e.kernel_code()
}

#[tokio::test]
async fn hakeeper_methods_against_the_kernels_logservice_server() {
    let mut hakeeper = KernelServer::start(
        "logservice",
        json!({
            "CHECK_HAKEEPER": {"IsHAKeeper": true},
            "GET_CLUSTER_DETAILS": {"ClusterDetails": {
                "TNStores": [{"UUID": "tn-1", "LockServiceAddress": "10.0.2.10:22002",
                              "Shards": [{"ShardID": 2, "ReplicaID": 3}]}],
                "CNStores": [{"UUID": "cn-1", "QueryAddress": "10.0.1.5:19998", "WorkState": 1,
                              "Tick": 120, "UpTime": 1717, "CommitID": "f2dd3978",
                              "Labels": {"account": {"Labels": ["acc1", "acc2"]}}}],
                "LogStores": [{"UUID": "log-1", "ServiceAddress": "10.0.3.11:32001",
                               "Replicas": [{"LogShardInfo": {"ShardID": 1, "Replicas": {"1": "log-1"},
                                                              "LeaderID": 1, "Term": 7},
                                             "ReplicaID": 1}]}]}},
            "GET_CLUSTER_STATE": {"CheckerState": {
                "Tick": 130010, "State": 4,
                "CNState": {"Stores": {"cn-1": {"Tick": 130000, "WorkState": 2, "UpTime": 1717,
                                                "CommitID": "f2dd3978",
                                                "QueryAddress": "10.0.1.5:19998"}}},
                "TNState": {"Stores": {"tn-1": {"Tick": 130009,
                                                "LockServiceAddress": "10.0.2.10:22002"}}},
                "LogState": {"Shards": {"1": {"ShardID": 1, "Replicas": {"1": "log-1", "2": "log-2"},
                                              "LeaderID": 2, "Term": 7}}}}},
            "UPDATE_CN_WORK_STATE": {"ErrorCode": 20101,
                                     "ErrorMessage": "internal error: CN [cn-9] does not exist"},
            "PATCH_CN_STORE": {}, "UPDATE_CN_LABEL": {}, "DELETE_CN_STORE": {},
            "GET_TRUNCATE": {"LogResponse": {"ShardID": 1, "Lsn": 5}}
        }),
    )
    .await;
    // Discovery through an address that answers GET_SHARD_INFO with the HAKeeper's replicas.
    let mut discovery = KernelServer::start(
        "logservice",
        json!({"GET_SHARD_INFO": {"ShardInfo": {"ShardID": 0, "LeaderID": 1, "Term": 7,
            "Replicas": {"1": {"UUID": "log-1", "ServiceAddress": hakeeper.address}}}}}),
    )
    .await;
    let client = HaKeeperClient::new(
        Discovery::DiscoveryAddress(discovery.address.clone()),
        options(),
    );

    let details = client.get_cluster_details().await.expect("details");
    assert_eq!(
        client.connected_to().await.as_deref(),
        Some(hakeeper.address.as_str())
    );
    let asked = discovery.request().await;
    assert_eq!(asked["Method"], 12, "GET_SHARD_INFO: {asked}");
    assert_eq!(
        hakeeper.request().await["Method"],
        10,
        "then CHECK_HAKEEPER"
    );
    assert_eq!(hakeeper.request().await["Method"], 11);
    let cn = &details.cn_stores[0];
    assert_eq!(
        (cn.uuid.as_str(), cn.query_address.as_str()),
        ("cn-1", "10.0.1.5:19998")
    );
    assert_eq!(cn.work_state, metadata::WorkState::Working as i32);
    assert_eq!((cn.tick, cn.up_time), (120, 1717));
    // The version a CN registers (the kernel's build commit), at v1.2.4's field number.
    assert_eq!(cn.commit_id_before_v2, "f2dd3978");
    assert_eq!(cn.labels["account"].labels, ["acc1", "acc2"]);
    assert_eq!(details.tn_stores[0].lock_service_address, "10.0.2.10:22002");
    assert_eq!(details.tn_stores[0].shards[0].replica_id, 3);
    let replica = &details.log_stores[0].replicas[0];
    let shard = replica
        .log_shard_info
        .as_ref()
        .expect("embedded shard info");
    assert_eq!((shard.shard_id, shard.leader_id, shard.term), (1, 1, 7));
    assert_eq!(shard.replicas[&1], "log-1");

    let state = client.get_cluster_state().await.expect("state");
    assert_eq!(hakeeper.request().await["Method"], 14);
    assert_eq!(state.tick, 130010);
    let cns = state.cn_state.as_ref().expect("CN state");
    assert_eq!(
        cns.stores["cn-1"].work_state,
        metadata::WorkState::Draining as i32
    );
    assert_eq!(cns.stores["cn-1"].up_time, 1717);
    assert_eq!(cns.stores["cn-1"].commit_id_before_v2, "f2dd3978");
    let shards = &state.log_state.as_ref().expect("log state").shards;
    assert_eq!(shards[&1].replicas[&shards[&1].leader_id], "log-2");
    // GetCNState is GET_CLUSTER_STATE on the wire.
    let cn_state = client.get_cn_state().await.expect("cn state");
    assert_eq!(hakeeper.request().await["Method"], 14);
    assert_eq!(cn_state.stores["cn-1"].tick, 130000);

    let unknown = client
        .update_cn_work_state("cn-9", metadata::WorkState::Draining)
        .await
        .expect_err("unknown CN");
    assert_eq!(unknown.kind(), ErrorKind::DoesNotExist, "{unknown}");
    let sent = hakeeper.request().await;
    assert_eq!(sent["Method"], 16);
    assert_eq!(sent["CNWorkState"], json!({"UUID": "cn-9", "State": 2}));

    let labels = BTreeMap::from([("role".to_string(), vec!["tp".to_string()])]);
    client
        .patch_cn_store("cn-1", metadata::WorkState::Working, &labels)
        .await
        .expect("patch");
    let sent = hakeeper.request().await;
    assert_eq!(sent["Method"], 17);
    assert_eq!(
        sent["CNStateLabel"],
        json!({"UUID": "cn-1", "State": 1, "Labels": {"role": {"Labels": ["tp"]}}})
    );
    client
        .update_cn_label("cn-1", &labels)
        .await
        .expect("label");
    let sent = hakeeper.request().await;
    assert_eq!(sent["Method"], 15);
    assert_eq!(sent["CNStoreLabel"]["UUID"], "cn-1");
    assert_eq!(
        sent["CNStoreLabel"]["Labels"]["role"]["Labels"],
        json!(["tp"])
    );
    client.delete_cn_store("cn-1").await.expect("delete");
    let sent = hakeeper.request().await;
    assert_eq!(sent["Method"], 18);
    assert_eq!(sent["DeleteCNStore"], json!({"StoreID": "cn-1"}));

    // CheckLogServiceHealth: details, then CHECK_HEALTH per TN shard, which v1.2.4 lacks
    // (added in 2.0): the kernel's server says "not supported", and so does our client.
    let health = client.check_log_service_health().await.expect_err("v1.2.4");
    assert_eq!(health.kind(), ErrorKind::Unsupported, "{health}");
    assert_eq!(kernel_code(&health), Some(20105));
    assert_eq!(hakeeper.request().await["Method"], 11);
    assert_eq!(hakeeper.request().await["Method"], 26);
    // An operator extension is "not supported" by the kernel's own server.
    let extension = client
        .transfer_leader(1, "log-2")
        .await
        .expect_err("extension");
    assert_eq!(extension.kind(), ErrorKind::Unsupported, "{extension}");
    assert_eq!(hakeeper.request().await["Method"], 1001);

    // A read through this store's own replica of the WAL shard, as the kernel decodes it:
    // GET_TRUNCATE naming shard 1; shard 0 is read with GET_CLUSTER_STATE.
    let store = mo_rpc::LogStoreClient::new(hakeeper.address.clone(), options());
    store.read_through_replica(1).await.expect("log shard read");
    let sent = hakeeper.request().await;
    assert_eq!(sent["Method"], 4, "GET_TRUNCATE: {sent}");
    assert_eq!(sent["LogRequest"]["ShardID"], 1);
    store
        .read_through_replica(0)
        .await
        .expect("HAKeeper shard read");
    assert_eq!(hakeeper.request().await["Method"], 14);
}

#[tokio::test]
async fn restart_handshake_against_the_kernels_lock_server() {
    let mut allocator = KernelServer::start(
        "lock",
        json!({
            "SetRestartService": {"SetRestartService": {"OK": true}},
            "CanRestartService": {"CanRestartService": {"OK": true}},
            "RemainTxnInService": {"RemainTxnInService": {"RemainTxn": 3}}
        }),
    )
    .await;
    let client = LockAllocatorClient::new(allocator.address.clone(), options());
    assert!(client.set_restart_service("cn-1").await.expect("set"));
    let sent = allocator.request().await;
    assert_eq!(sent["Method"], 12);
    assert_eq!(sent["SetRestartService"]["ServiceID"], "cn-1");
    assert!(client.can_restart_service("cn-1").await.expect("can"));
    assert_eq!(
        allocator.request().await["CanRestartService"]["ServiceID"],
        "cn-1"
    );
    assert_eq!(
        client.remain_txn_in_service("cn-1").await.expect("remain"),
        3
    );
    assert_eq!(
        allocator.request().await["RemainTxnInService"]["ServiceID"],
        "cn-1"
    );
    // The instance-bound drain is our extension: the kernel's lock server has no handler.
    let e = client.list_drains().await.expect_err("not in the kernel");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert_eq!(kernel_code(&e), Some(20105));

    let busy = KernelServer::start(
        "lock",
        json!({"CanRestartService": {"moerr": {"code": 20101,
            "message": "internal error: lock service request queue full"}}}),
    )
    .await;
    let e = LockAllocatorClient::new(busy.address.clone(), options())
        .can_restart_service("cn-1")
        .await
        .expect_err("queue full");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("queue full"), "{e}");
}

#[tokio::test]
async fn query_service_against_the_kernels_message_handler() {
    let mut cn = KernelServer::start(
        "query",
        json!({
            "ShowProcessList": {"ShowProcessListResponse": {"Sessions": [
                {"NodeID": "cn-1", "ConnID": 1001, "Account": "sys", "User": "root",
                 "SessionStart": "2024-06-01T08:00:00Z", "Info": "select sleep(10)"},
                {"NodeID": "cn-1", "ConnID": 1002, "Account": "acc1", "User": "u"}]}},
            "GetPipelineInfo": {"GetPipelineInfoResponse": {"Count": 7}},
            "GetReplicaCount": {"GetReplicaCount": {"Count": 5}}
        }),
    )
    .await;
    let client = QueryClient::new(cn.address.clone(), options());
    let sessions = client.show_process_list().await.expect("process list");
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        (sessions[0].conn_id, sessions[0].account.as_str()),
        (1001, "sys")
    );
    assert_eq!(
        sessions[0].session_start.as_ref().map(|t| t.seconds),
        Some(1_717_228_800)
    );
    assert_eq!(sessions[0].info, "select sleep(10)");
    let sent = cn.request().await;
    assert_eq!(sent["CmdMethod"], 1);
    assert_eq!(sent["ShowProcessListRequest"]["SysTenant"], true);
    assert_eq!(client.get_pipeline_info().await.expect("pipelines"), 7);
    let sent = cn.request().await;
    assert_eq!(sent["CmdMethod"], 19);
    assert!(sent.get("GetPipelineInfoRequest").is_some(), "{sent}");
    assert_eq!(client.get_replica_count().await.expect("replicas"), 5);
    assert_eq!(cn.request().await["CmdMethod"], 24);
}

/// A kernel configured with `enable-compress` answers every request LZ4-compressed, even one
/// sent uncompressed (ours never are: a kernel without compression cannot read them).
#[tokio::test]
async fn answers_from_a_compressing_kernel_are_decompressed() {
    let mut hakeeper = KernelServer::start_with(
        "logservice",
        json!({
            "CHECK_HAKEEPER": {"IsHAKeeper": true},
            "GET_CLUSTER_STATE": {"CheckerState": {"Tick": 42, "CNState": {"Stores": {
                "cn-1": {"Tick": 41, "WorkState": 2, "QueryAddress": "10.0.1.5:19998"}}}}}
        }),
        &["--compress"],
    )
    .await;
    let client = HaKeeperClient::new(
        Discovery::Addresses(vec![hakeeper.address.clone()]),
        options(),
    );
    let state = client.get_cluster_state().await.expect("state");
    assert_eq!(state.tick, 42);
    assert_eq!(
        state.cn_state.expect("CN state").stores["cn-1"].query_address,
        "10.0.1.5:19998"
    );
    assert_eq!(hakeeper.request().await["Method"], 10);
    assert_eq!(hakeeper.request().await["Method"], 14);

    let sessions: Vec<Value> = (0..50)
        .map(|i| {
            json!({"NodeID": "cn-1", "ConnID": i, "Account": "sys", "User": "root",
                        "Info": "select * from t where id = 1"})
        })
        .collect();
    let cn = KernelServer::start_with(
        "query",
        json!({"ShowProcessList": {"ShowProcessListResponse": {"Sessions": sessions}}}),
        &["--compress"],
    )
    .await;
    let list = QueryClient::new(cn.address.clone(), options())
        .show_process_list()
        .await
        .expect("process list");
    assert_eq!(list.len(), 50);
    assert_eq!(list[49].conn_id, 49);
}
