package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/matrixorigin/matrixone/pkg/common/moerr"
	"github.com/matrixorigin/matrixone/pkg/common/morpc"
	"github.com/matrixorigin/matrixone/pkg/pb/lock"
	logpb "github.com/matrixorigin/matrixone/pkg/pb/logservice"
	"github.com/matrixorigin/matrixone/pkg/pb/metadata"
	"github.com/matrixorigin/matrixone/pkg/pb/query"
	"github.com/matrixorigin/matrixone/pkg/pb/status"
)

// vectorRequestID is the ID of every vector: the first ID a kernel backend (and the Rust
// client) assigns on a new connection, so a response vector can be replayed as the answer to
// the first request of a real client.
const vectorRequestID = 1

// vectorCase is one request/response pair written by the vectors command.
type vectorCase struct {
	service, name     string
	request, response morpc.Message
}

// A small but complete cluster: three CNs (labelled, in different work states, one timed
// out), one TN, three log stores holding the HAKeeper shard 0 and log shard 1, one proxy.
const (
	cn1        = "dd1dccb4-4d3c-41f8-b482-5251dc7a41bf"
	cn2        = "dd2dccb4-4d3c-41f8-b482-5251dc7a41bf"
	cn3        = "dd3dccb4-4d3c-41f8-b482-5251dc7a41bf"
	cnMissing  = "dd9dccb4-4d3c-41f8-b482-5251dc7a41bf"
	tn1        = "d51d2a3c-7b1f-4b5e-9c1a-3f0e9b8c7a61"
	log1       = "7c4dccb4-4d3c-41f8-b482-5251dc7a41b1"
	log2       = "7c4dccb4-4d3c-41f8-b482-5251dc7a41b2"
	log3       = "7c4dccb4-4d3c-41f8-b482-5251dc7a41b3"
	proxy1     = "a0b1c2d3-0000-4000-8000-00000000000a"
	commitID   = "f2dd3978"
	gib        = uint64(1) << 30
	uptimeSecs = int64(86400 + 3600)
)

func labels(kv ...any) map[string]metadata.LabelList {
	out := map[string]metadata.LabelList{}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = metadata.LabelList{Labels: kv[i+1].([]string)}
	}
	return out
}

func cnConfig() *logpb.ConfigData {
	return &logpb.ConfigData{Content: map[string]*logpb.ConfigItem{
		"cn.frontend.port": {Name: "cn.frontend.port", CurrentValue: "6001", DefaultValue: "6001", Internal: "advanced"},
	}}
}

func cnStores() []logpb.CNStore {
	return []logpb.CNStore{
		{
			UUID: cn1, ServiceAddress: "10.0.1.11:6002", SQLAddress: "10.0.1.11:6001",
			LockServiceAddress: "10.0.1.11:6003", Role: metadata.CNRole_TP, Tick: 120345,
			State: logpb.NormalState, Labels: labels("account", []string{"sys"}, "role", []string{"tp"}),
			WorkState: metadata.WorkState_Working, QueryAddress: "10.0.1.11:19998", ConfigData: cnConfig(),
			UpTime: uptimeSecs, CommitID: commitID,
			Resource: logpb.Resource{CPUTotal: 8, CPUAvailable: 5.5, MemTotal: 16 * gib, MemAvailable: 9 * gib},
		},
		{
			UUID: cn2, ServiceAddress: "10.0.1.12:6002", SQLAddress: "10.0.1.12:6001",
			LockServiceAddress: "10.0.1.12:6003", Role: metadata.CNRole_AP, Tick: 120344,
			State: logpb.NormalState, Labels: labels("account", []string{"acc1", "acc2"}),
			WorkState: metadata.WorkState_Draining, QueryAddress: "10.0.1.12:19998",
			UpTime: 600, CommitID: commitID,
			Resource: logpb.Resource{CPUTotal: 4, CPUAvailable: 3.25, MemTotal: 8 * gib, MemAvailable: 6 * gib},
		},
		{
			UUID: cn3, ServiceAddress: "10.0.1.13:6002", SQLAddress: "10.0.1.13:6001",
			LockServiceAddress: "10.0.1.13:6003", Role: metadata.CNRole_TP, Tick: 110000,
			State: logpb.TimeoutState, WorkState: metadata.WorkState_Drained, QueryAddress: "10.0.1.13:19998",
			Resource: logpb.Resource{CPUTotal: 4, MemTotal: 8 * gib}, CommitID: commitID,
		},
	}
}

func logHost(i int) string { return fmt.Sprintf("10.0.3.%d", 11+i) }

// Shard 0 is the HAKeeper shard, shard 1 the log shard of the TN.
func logShard(id, leader, term uint64) logpb.LogShardInfo {
	base := 131072 + id*16
	return logpb.LogShardInfo{
		ShardID:  id,
		Replicas: map[uint64]string{base: log1, base + 1: log2, base + 2: log3},
		Epoch:    3, LeaderID: leader, Term: term,
	}
}

func logReplicas(store int) []logpb.LogReplicaInfo {
	s0, s1 := logShard(0, 131073, 7), logShard(1, 131088, 4)
	return []logpb.LogReplicaInfo{
		{LogShardInfo: s0, ReplicaID: 131072 + uint64(store)},
		{LogShardInfo: s1, ReplicaID: 131088 + uint64(store)},
	}
}

func clusterDetails() *logpb.ClusterDetails {
	logStores := make([]logpb.LogStore, 0, 3)
	for i, id := range []string{log1, log2, log3} {
		logStores = append(logStores, logpb.LogStore{
			UUID: id, ServiceAddress: logHost(i) + ":32001",
			Tick: 130000 + uint64(i), State: logpb.NormalState, Replicas: logReplicas(i),
		})
	}
	return &logpb.ClusterDetails{
		TNStores: []logpb.TNStore{{
			UUID: tn1, ServiceAddress: "10.0.2.10:41010", Tick: 125000, State: logpb.NormalState,
			Shards:               []logpb.TNShardInfo{{ShardID: 2, ReplicaID: 131104}},
			LogtailServerAddress: "10.0.2.10:32003", LockServiceAddress: "10.0.2.10:22002",
			QueryAddress: "10.0.2.10:22003",
		}},
		CNStores:      cnStores(),
		LogStores:     logStores,
		ProxyStores:   []logpb.ProxyStore{{UUID: proxy1, Tick: 99, ListenAddress: "10.0.4.10:6009"}},
		DeletedStores: []logpb.DeletedStore{{UUID: "dd0dccb4-4d3c-41f8-b482-5251dc7a41bf", StoreType: "CN", Address: "10.0.1.10:6001", UpTime: 1717200000, DownTime: 1717203600}},
	}
}

func checkerState() *logpb.CheckerState {
	cnState := logpb.CNState{Stores: map[string]logpb.CNStoreInfo{}}
	for _, s := range cnStores() {
		cnState.Stores[s.UUID] = logpb.CNStoreInfo{
			Tick: s.Tick, ServiceAddress: s.ServiceAddress, SQLAddress: s.SQLAddress,
			LockServiceAddress: s.LockServiceAddress, Role: s.Role, TaskServiceCreated: true,
			Labels: s.Labels, WorkState: s.WorkState, QueryAddress: s.QueryAddress,
			GossipAddress: strings.Replace(s.ServiceAddress, ":6002", ":6004", 1), GossipJoined: true,
			Resource: s.Resource, UpTime: s.UpTime, CommitID: s.CommitID,
		}
	}
	logStores := map[string]logpb.LogStoreInfo{}
	for i, id := range []string{log1, log2, log3} {
		host := logHost(i)
		logStores[id] = logpb.LogStoreInfo{
			Tick: 130000 + uint64(i), RaftAddress: host + ":32000", ServiceAddress: host + ":32001",
			GossipAddress: host + ":32002", Replicas: logReplicas(i), TaskServiceCreated: true,
		}
	}
	return &logpb.CheckerState{
		Tick: 130010,
		ClusterInfo: logpb.ClusterInfo{
			TNShards:  []metadata.TNShardRecord{{ShardID: 2, LogShardID: 1}},
			LogShards: []metadata.LogShardRecord{{ShardID: 0, NumberOfReplicas: 3}, {ShardID: 1, NumberOfReplicas: 3}},
		},
		TNState: logpb.TNState{Stores: map[string]logpb.TNStoreInfo{tn1: {
			Tick: 125000, ServiceAddress: "10.0.2.10:41010",
			Shards:             []logpb.TNShardInfo{{ShardID: 2, ReplicaID: 131104}},
			TaskServiceCreated: true, LogtailServerAddress: "10.0.2.10:32003",
			LockServiceAddress: "10.0.2.10:22002", QueryAddress: "10.0.2.10:22003",
		}}},
		LogState: logpb.LogState{
			Shards: map[uint64]logpb.LogShardInfo{0: logShard(0, 131073, 7), 1: logShard(1, 131088, 4)},
			Stores: logStores,
		},
		CNState:            cnState,
		State:              logpb.HAKeeperRunning,
		TaskSchedulerState: logpb.TaskSchedulerRunning,
		TaskTableUser:      logpb.TaskTableUser{Username: "mo_task", Password: "s3cr3t"},
		NextId:             2001,
		NextIDByKey:        map[string]uint64{"mo_increment_columns": 42},
		ProxyState:         logpb.ProxyState{Stores: map[string]logpb.ProxyStore{proxy1: {UUID: proxy1, Tick: 99, ListenAddress: "10.0.4.10:6009"}}},
		Resource:           logpb.Resource{CPUTotal: 16, CPUAvailable: 8.75, MemTotal: 32 * gib, MemAvailable: 15 * gib},
	}
}

func logCase(method logpb.MethodType, req logpb.Request, resp logpb.Response) vectorCase {
	req.RequestID, req.Method = vectorRequestID, method
	resp.RequestID, resp.Method = vectorRequestID, method
	return vectorCase{"logservice", method.String(), &logRPCRequest{Request: req}, &logRPCResponse{Response: resp}}
}

func lockCase(method lock.Method, req lock.Request, resp lock.Response) vectorCase {
	req.RequestID, req.Method = vectorRequestID, method
	resp.RequestID, resp.Method = vectorRequestID, method
	return vectorCase{"lock", method.String(), &req, &resp}
}

func queryCase(method query.CmdMethod, req query.Request, resp query.Response) vectorCase {
	req.RequestID, req.CmdMethod = vectorRequestID, method
	resp.RequestID, resp.CmdMethod = vectorRequestID, method
	return vectorCase{"query", method.String(), &req, &resp}
}

func vectorCases() []vectorCase {
	ctx := context.Background()
	// What store.updateCNWorkState returns for an unknown CN, converted by toErrorCode.
	missing := moerr.NewInternalErrorf(ctx, "CN [%s] does not exist", cnMissing)
	// pkg/cnservice/server_query.go of v1.2.4 leaves the GetReplicaCount handler commented
	// out, so a v1.2.4 CN answers with the message handler's NotSupported error.
	var replicaCount query.Response
	replicaCount.WrapError(moerr.NewNotSupportedNoCtxf("%d not support in current service", uint32(query.CmdMethod_GetReplicaCount)))

	sessionStart := time.Date(2024, 6, 1, 8, 0, 0, 0, time.UTC)
	queryStart := time.Date(2024, 6, 1, 8, 30, 15, 123456789, time.UTC)
	return []vectorCase{
		logCase(logpb.CHECK_HAKEEPER, logpb.Request{}, logpb.Response{IsHAKeeper: true}),
		logCase(logpb.GET_CLUSTER_DETAILS, logpb.Request{}, logpb.Response{ClusterDetails: clusterDetails()}),
		logCase(logpb.GET_SHARD_INFO,
			logpb.Request{LogRequest: logpb.LogRequest{ShardID: 0}},
			logpb.Response{ShardInfo: &logpb.ShardInfoQueryResult{
				ShardID: 0,
				Replicas: map[uint64]logpb.ReplicaInfo{
					131072: {UUID: log1, ServiceAddress: "10.0.3.11:32001"},
					131073: {UUID: log2, ServiceAddress: "10.0.3.12:32001"},
					131074: {UUID: log3, ServiceAddress: "10.0.3.13:32001"},
				},
				Epoch: 3, LeaderID: 131073, Term: 7,
			}}),
		logCase(logpb.GET_CLUSTER_STATE, logpb.Request{}, logpb.Response{CheckerState: checkerState()}),
		logCase(logpb.UPDATE_CN_LABEL,
			logpb.Request{CNStoreLabel: &logpb.CNStoreLabel{UUID: cn2, Operation: logpb.SetLabel,
				Labels: labels("account", []string{"acc1", "acc2"}, "role", []string{"ap"})}},
			logpb.Response{}),
		logCase(logpb.UPDATE_CN_WORK_STATE,
			logpb.Request{CNWorkState: &logpb.CNWorkState{UUID: cnMissing, State: metadata.WorkState_Draining}},
			logpb.Response{ErrorCode: uint32(missing.ErrorCode()), ErrorMessage: missing.Error()}),
		logCase(logpb.PATCH_CN_STORE,
			logpb.Request{CNStateLabel: &logpb.CNStateLabel{UUID: cn1, State: metadata.WorkState_Working,
				Labels: labels("account", []string{"sys"})}},
			logpb.Response{}),
		logCase(logpb.DELETE_CN_STORE,
			logpb.Request{DeleteCNStore: &logpb.DeleteCNStore{StoreID: cn3}},
			logpb.Response{}),

		lockCase(lock.Method_SetRestartService,
			lock.Request{SetRestartService: lock.SetRestartServiceRequest{ServiceID: cn1}},
			lock.Response{SetRestartService: lock.SetRestartServiceResponse{OK: true}}),
		lockCase(lock.Method_RemainTxnInService,
			lock.Request{RemainTxnInService: lock.RemainTxnInServiceRequest{ServiceID: cn1}},
			lock.Response{RemainTxnInService: lock.RemainTxnInServiceResponse{RemainTxn: 3}}),
		lockCase(lock.Method_CanRestartService,
			lock.Request{CanRestartService: lock.CanRestartServiceRequest{ServiceID: cn1}},
			lock.Response{CanRestartService: lock.CanRestartServiceResponse{OK: true}}),

		queryCase(query.CmdMethod_ShowProcessList,
			query.Request{ShowProcessListRequest: &query.ShowProcessListRequest{SysTenant: true}},
			query.Response{ShowProcessListResponse: &query.ShowProcessListResponse{Sessions: []*status.Session{
				{
					NodeID: cn1, ConnID: 1001, SessionID: "018fd1a2-0000-7000-8000-000000000001",
					Account: "sys", User: "root", Host: "10.0.1.11:6001", DB: "mo_catalog",
					SessionStart: sessionStart, Command: "COM_QUERY", Info: "select sleep(10)",
					TxnID: "018fd1a2-0000-7000-8000-0000000000aa", StatementID: "018fd1a2-0000-7000-8000-0000000000bb",
					StatementType: "Select", QueryType: "DQL", SQLSourceType: "external_sql",
					QueryStart: queryStart, ClientHost: "10.0.9.9:51234", Role: "moadmin",
				},
				{
					NodeID: cn1, ConnID: 1002, SessionID: "018fd1a2-0000-7000-8000-000000000002",
					Account: "acc1", User: "admin", Host: "10.0.1.11:6001", DB: "db1",
					SessionStart: sessionStart, Command: "COM_SLEEP", SQLSourceType: "external_sql",
					QueryStart: sessionStart, ClientHost: "10.0.4.10:40001", Role: "accountadmin",
					FromProxy: true, ProxyHost: "10.0.4.10:6009",
				},
			}}}),
		queryCase(query.CmdMethod_GetPipelineInfo,
			query.Request{GetPipelineInfoRequest: &query.GetPipelineInfoRequest{}},
			query.Response{GetPipelineInfoResponse: &query.GetPipelineInfoResponse{Count: 7}}),
		queryCase(query.CmdMethod_GetReplicaCount,
			query.Request{GetReplicaCount: query.GetReplicaCountRequest{CN: cn1}},
			replicaCount),
	}
}
