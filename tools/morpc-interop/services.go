package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/matrixorigin/matrixone/pkg/common/moerr"
	"github.com/matrixorigin/matrixone/pkg/common/morpc"
	"github.com/matrixorigin/matrixone/pkg/common/mpool"
	"github.com/matrixorigin/matrixone/pkg/pb/lock"
	logpb "github.com/matrixorigin/matrixone/pkg/pb/logservice"
	moerrpb "github.com/matrixorigin/matrixone/pkg/pb/moerr"
	"github.com/matrixorigin/matrixone/pkg/pb/query"
)

// Codec settings, copied from the kernel (v1.2.4) call sites they name.
const (
	// pkg/logservice/config.go defaultMaxMessageSize, used by NewService and getRPCClient.
	logMaxMessageSize = 100 * 1024 * 1024
	// pkg/logservice/service.go NewService: WithCodecPayloadCopyBufferSize(16*1024).
	logServerPayloadCopyBufferSize = 16 * 1024
	// pkg/logservice/client.go defaultWriteSocketSize, used by getRPCClient.
	logClientPayloadCopyBufferSize = 64 * 1024
)

// newLogServerCodec is the codec pkg/logservice/service.go NewService builds: it decodes
// RPCRequest, checksum on, compression as [logservice.rpc] enable-compress (default off).
func newLogServerCodec(compress bool) morpc.Codec {
	return morpc.NewMessageCodec(
		func() morpc.Message { return &logRPCRequest{} },
		withCompress(compress, "log_rpc_server",
			morpc.WithCodecPayloadCopyBufferSize(logServerPayloadCopyBufferSize),
			morpc.WithCodecEnableChecksum(),
			morpc.WithCodecMaxBodySize(logMaxMessageSize))...)
}

// newLogClientCodec is the codec pkg/logservice/client.go getRPCClient builds for the
// HAKeeper client: it decodes RPCResponse; compression as [hakeeper-client] enable-compress.
func newLogClientCodec(compress bool) morpc.Codec {
	return morpc.NewMessageCodec(
		func() morpc.Message { return &logRPCResponse{} },
		withCompress(compress, "log_rpc_client",
			morpc.WithCodecPayloadCopyBufferSize(logClientPayloadCopyBufferSize),
			morpc.WithCodecEnableChecksum(),
			morpc.WithCodecMaxBodySize(logMaxMessageSize))...)
}

// withCompress appends WithCodecEnableCompress over a fresh unlimited, non-fixed mpool when
// compress is set, as getRPCClient, NewService and Config.NewServer/NewClient do.
func withCompress(compress bool, pool string, opts ...morpc.CodecOption) []morpc.CodecOption {
	if !compress {
		return opts
	}
	mp, err := mpool.NewMPool(pool, 0, mpool.NoFixed)
	if err != nil {
		panic(err) // NewMPool only fails for a cap > 0
	}
	return append(opts, morpc.WithCodecEnableCompress(mp))
}

// newConfigCodec is the codec morpc.Config.NewServer and Config.NewClient build from an
// adjusted Config (lock server and client, query service and client). The kernel does not
// expose that codec, so vectors and decode rebuild it with the same options; serve and call
// go through Config.NewServer/NewClient themselves.
func newConfigCodec(factory func() morpc.Message, compress bool) morpc.Codec {
	cfg := rpcConfig(compress)
	return morpc.NewMessageCodec(factory,
		withCompress(cfg.EnableCompress, "morpc-interop",
			morpc.WithCodecEnableChecksum(),
			morpc.WithCodecPayloadCopyBufferSize(int(cfg.PayloadCopyBufferSize)),
			morpc.WithCodecMaxBodySize(int(cfg.MaxMessageSize)))...)
}

// rpcConfig is the [rpc] section of a TN/CN config left at its defaults, except for
// enable-compress.
func rpcConfig(compress bool) morpc.Config {
	cfg := morpc.Config{EnableCompress: compress}
	cfg.Adjust()
	return cfg
}

// service describes one of the three morpc services in terms of the kernel's types.
type service struct {
	name string
	// methods maps the method enum's names (as String() prints them) to their numbers.
	methods map[string]int32
	// clientCodec/serverCodec build the codec of the kernel's client (decodes responses,
	// encodes requests) and server (decodes requests, encodes responses), with or without
	// compression.
	clientCodec func(compress bool) morpc.Codec
	serverCodec func(compress bool) morpc.Codec
	// parseRequest turns the JSON of the service's Request into the message sent on the wire.
	parseRequest func([]byte) (morpc.Message, error)
	// requestView/responseView give the JSON shown for a wire message.
	requestView  func(morpc.Message) any
	responseView func(morpc.Message) map[string]any
}

var services = map[string]*service{
	"logservice": {
		name:        "logservice",
		methods:     logpb.MethodType_value,
		clientCodec: newLogClientCodec,
		serverCodec: newLogServerCodec,
		parseRequest: func(data []byte) (morpc.Message, error) {
			var req logpb.Request
			if err := strictUnmarshal(data, &req); err != nil {
				return nil, err
			}
			// the HAKeeper client wraps every request in RPCRequest (hakeeperClient.request).
			return &logRPCRequest{Request: req}, nil
		},
		requestView: func(m morpc.Message) any { return m.(*logRPCRequest).Request },
		responseView: func(m morpc.Message) map[string]any {
			r := m.(*logRPCResponse)
			v := map[string]any{"response": r.Response}
			if p := r.GetPayloadField(); len(p) > 0 {
				v["payload"] = p
			}
			return v
		},
	},
	"lock": {
		name:        "lock",
		methods:     lock.Method_value,
		clientCodec: func(c bool) morpc.Codec { return newConfigCodec(func() morpc.Message { return &lock.Response{} }, c) },
		serverCodec: func(c bool) morpc.Codec { return newConfigCodec(func() morpc.Message { return &lock.Request{} }, c) },
		parseRequest: func(data []byte) (morpc.Message, error) {
			req := &lock.Request{}
			return req, strictUnmarshal(data, req)
		},
		requestView: func(m morpc.Message) any { return m },
		responseView: func(m morpc.Message) map[string]any {
			r := m.(*lock.Response)
			return withMoErr(map[string]any{"response": r}, r.Error)
		},
	},
	"query": {
		name:        "query",
		methods:     query.CmdMethod_value,
		clientCodec: func(c bool) morpc.Codec { return newConfigCodec(func() morpc.Message { return &query.Response{} }, c) },
		serverCodec: func(c bool) morpc.Codec { return newConfigCodec(func() morpc.Message { return &query.Request{} }, c) },
		parseRequest: func(data []byte) (morpc.Message, error) {
			req := &query.Request{}
			return req, strictUnmarshal(data, req)
		},
		requestView: func(m morpc.Message) any { return m },
		responseView: func(m morpc.Message) map[string]any {
			r := m.(*query.Response)
			return withMoErr(map[string]any{"response": r}, r.Error)
		},
	},
}

func lookupService(name string) (*service, error) {
	if s, ok := services[name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("unknown --service %q (want logservice, lock or query)", name)
}

// methodNumber resolves a fixture key: an enum name such as "CHECK_HAKEEPER", or a number
// (for methods the v1.2.4 enum does not know, e.g. "26").
func (s *service) methodNumber(key string) (int32, error) {
	if v, ok := s.methods[key]; ok {
		return v, nil
	}
	if n, err := strconv.ParseInt(key, 10, 32); err == nil {
		return int32(n), nil
	}
	names := make([]string, 0, len(s.methods))
	for name := range s.methods {
		names = append(names, name)
	}
	sort.Strings(names)
	return 0, fmt.Errorf("%s has no method %q (v1.2.4 knows %v)", s.name, key, names)
}

// withMoErr adds "moerr": the decoded Response.Error of lock and query responses, which is
// (*moerr.Error).MarshalBinary() and would otherwise show only as base64.
func withMoErr(v map[string]any, data []byte) map[string]any {
	if len(data) == 0 {
		return v
	}
	var e moerr.Error
	if err := e.UnmarshalBinary(data); err != nil {
		v["moerr"] = map[string]string{"error": "cannot decode Response.Error: " + err.Error()}
		return v
	}
	v["moerr"] = moerrpb.Error{Code: e.ErrorCode(), MysqlCode: e.MySQLCode(), Message: e.Error(), SqlState: e.SqlState()}
	return v
}

// fixtureError is the optional "moerr" of a lock/query fixture entry: code and message as they
// appear on the wire; mysql_code and sql_state default to 1105 and HY000, the values almost
// every kernel error code has.
type fixtureError struct {
	Code      uint16 `json:"code"`
	Message   string `json:"message"`
	MysqlCode uint16 `json:"mysql_code"`
	SqlState  string `json:"sql_state"`
}

// toMoErr builds the *moerr.Error the kernel would have created. moerr has no public
// constructor taking a code, so it goes through the kernel's own UnmarshalBinary.
func (f fixtureError) toMoErr() (*moerr.Error, error) {
	if f.MysqlCode == 0 {
		f.MysqlCode = moerr.ER_UNKNOWN_ERROR
	}
	if f.SqlState == "" {
		f.SqlState = moerr.MySQLDefaultSqlState
	}
	pbErr := moerrpb.Error{Code: f.Code, MysqlCode: f.MysqlCode, Message: f.Message, SqlState: f.SqlState}
	data, err := pbErr.Marshal()
	if err != nil {
		return nil, err
	}
	e := &moerr.Error{}
	return e, e.UnmarshalBinary(data)
}

// splitFixture parses a fixture file into method number -> raw JSON of the value.
func (s *service) splitFixture(data []byte) (map[int32]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("fixture: %w", err)
	}
	out := make(map[int32]json.RawMessage, len(raw))
	for key, value := range raw {
		method, err := s.methodNumber(key)
		if err != nil {
			return nil, fmt.Errorf("fixture: %w", err)
		}
		out[method] = value
	}
	return out, nil
}

// splitMoErr removes the "moerr" member from a lock/query fixture value.
func splitMoErr(value json.RawMessage) (json.RawMessage, *moerr.Error, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(value, &members); err != nil {
		return nil, nil, err
	}
	raw, ok := members["moerr"]
	if !ok {
		return value, nil, nil
	}
	delete(members, "moerr")
	var f fixtureError
	if err := strictUnmarshal(raw, &f); err != nil {
		return nil, nil, fmt.Errorf("moerr: %w", err)
	}
	e, err := f.toMoErr()
	if err != nil {
		return nil, nil, err
	}
	rest, err := json.Marshal(members)
	return rest, e, err
}
