package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/matrixorigin/matrixone/pkg/common/moerr"
	"github.com/matrixorigin/matrixone/pkg/common/morpc"
	"github.com/matrixorigin/matrixone/pkg/lockservice"
	"github.com/matrixorigin/matrixone/pkg/pb/lock"
	logpb "github.com/matrixorigin/matrixone/pkg/pb/logservice"
	"github.com/matrixorigin/matrixone/pkg/pb/query"
	"go.uber.org/zap"
)

func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on; port 0 picks a free port")
	name := fs.String("service", "", "logservice, lock or query")
	fixturePath := fs.String("fixture", "", "JSON object: method name -> Response")
	compress := fs.Bool("compress", false, "LZ4-compress as the kernel does with enable-compress = true")
	if err := fs.Parse(args); err != nil {
		return err
	}
	svc, err := lookupService(*name)
	if err != nil {
		return err
	}
	if *fixturePath == "" {
		return fmt.Errorf("--fixture is required")
	}
	data, err := os.ReadFile(*fixturePath)
	if err != nil {
		return err
	}
	fixture, err := svc.splitFixture(data)
	if err != nil {
		return err
	}

	var start func(address string) (io.Closer, error)
	switch svc.name {
	case "logservice":
		responses, err := parseLogFixture(fixture)
		if err != nil {
			return err
		}
		start = func(address string) (io.Closer, error) { return startLogServer(address, responses, *compress) }
	case "lock":
		responses, err := parseLockFixture(fixture)
		if err != nil {
			return err
		}
		start = func(address string) (io.Closer, error) { return startLockServer(address, responses, *compress) }
	case "query":
		responses, err := parseQueryFixture(fixture)
		if err != nil {
			return err
		}
		start = func(address string) (io.Closer, error) { return startQueryServer(address, responses, *compress) }
	}

	address, server, err := listenOn(*listen, start)
	if err != nil {
		return err
	}
	stdoutMu.Lock()
	fmt.Fprintf(jsonOut, "listening %s\n", address)
	stdoutMu.Unlock()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	return server.Close()
}

// listenOn starts the server on address. The kernel servers bind inside their constructors
// and do not report the bound address, so port 0 is resolved first by binding and releasing a
// free port (retried if another process takes it in between).
func listenOn(address string, start func(string) (io.Closer, error)) (string, io.Closer, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return "", nil, err
	}
	if port != "0" {
		server, err := start(address)
		return address, server, err
	}
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", nil, err
		}
		free := l.Addr().String()
		l.Close()
		server, err := start(free)
		if err == nil || attempt == 9 {
			return free, server, err
		}
	}
}

type fixtureResponse[T any] struct {
	response T
	err      *moerr.Error
}

func parseLogFixture(fixture map[int32]json.RawMessage) (map[int32]logpb.Response, error) {
	out := make(map[int32]logpb.Response, len(fixture))
	for method, value := range fixture {
		var resp logpb.Response
		if err := strictUnmarshal(value, &resp); err != nil {
			return nil, fmt.Errorf("fixture %s: %w", logpb.MethodType(method), err)
		}
		out[method] = resp
	}
	return out, nil
}

func parseLockFixture(fixture map[int32]json.RawMessage) (map[int32]fixtureResponse[lock.Response], error) {
	out := make(map[int32]fixtureResponse[lock.Response], len(fixture))
	for method, value := range fixture {
		rest, e, err := splitMoErr(value)
		var resp lock.Response
		if err == nil {
			err = strictUnmarshal(rest, &resp)
		}
		if err != nil {
			return nil, fmt.Errorf("fixture %s: %w", lock.Method(method), err)
		}
		out[method] = fixtureResponse[lock.Response]{resp, e}
	}
	return out, nil
}

func parseQueryFixture(fixture map[int32]json.RawMessage) (map[int32]fixtureResponse[query.Response], error) {
	out := make(map[int32]fixtureResponse[query.Response], len(fixture))
	for method, value := range fixture {
		rest, e, err := splitMoErr(value)
		var resp query.Response
		if err == nil {
			err = strictUnmarshal(rest, &resp)
		}
		if err != nil {
			return nil, fmt.Errorf("fixture %s: %w", query.CmdMethod(method), err)
		}
		out[method] = fixtureResponse[query.Response]{resp, e}
	}
	return out, nil
}

// startLogServer mirrors pkg/logservice/service.go NewService and handleRPCRequest: a
// "logservice-server" morpc server with the kernel's codec, answering every RPCRequest with
// an RPCResponse written with the request's context. (Service itself needs a running
// dragonboat store, so only its RPC layer is reproduced.) compress is [logservice.rpc]
// enable-compress.
func startLogServer(address string, responses map[int32]logpb.Response, compress bool) (io.Closer, error) {
	server, err := morpc.NewRPCServer("logservice-server", address, newLogServerCodec(compress),
		morpc.WithServerLogger(logger.Named("logservice-server")))
	if err != nil {
		return nil, err
	}
	server.RegisterRequestHandler(func(ctx context.Context, msg morpc.RPCMessage, _ uint64, cs morpc.ClientSession) error {
		rr, ok := msg.Message.(*logRPCRequest)
		if !ok {
			return fmt.Errorf("unexpected message type %T", msg.Message)
		}
		emit(map[string]any{"request": rr.Request})
		resp := logResponse(ctx, rr.Request, responses)
		resp.RequestID = rr.RequestID
		return cs.Write(ctx, &logRPCResponse{Response: resp})
	})
	return started(server)
}

// logResponse is Service.handle for a fixture: getResponse(req) (Method copied from the
// request) filled from the fixture, or the kernel's default branch for other methods.
func logResponse(ctx context.Context, req logpb.Request, responses map[int32]logpb.Response) logpb.Response {
	if resp, ok := responses[int32(req.Method)]; ok {
		resp.Method = req.Method
		return resp
	}
	resp := logpb.Response{Method: req.Method}
	// toErrorCode(err) for a *moerr.Error is (code, err.Error()).
	e := moerr.NewNotSupported(ctx, fmt.Sprintf("logservice method type %d", req.Method))
	resp.ErrorCode, resp.ErrorMessage = uint32(e.ErrorCode()), e.Error()
	return resp
}

// startLockServer runs the kernel's own lock RPC server (pkg/lockservice NewServer, as the
// TN's lock table allocator does) with a handler per fixture method. Methods without a handler
// get the server's own NotSupported answer. The message filter sees every request first, so
// it prints them. compress is the [rpc] enable-compress the TN passes on in its morpc.Config.
func startLockServer(address string, responses map[int32]fixtureResponse[lock.Response], compress bool) (io.Closer, error) {
	server, err := lockservice.NewServer(address, rpcConfig(compress),
		lockservice.WithServerMessageFilter(func(req *lock.Request) bool {
			emit(map[string]any{"request": req})
			return true
		}))
	if err != nil {
		return nil, err
	}
	for method, fixture := range responses {
		server.RegisterMethodHandler(lock.Method(method), func(
			ctx context.Context, cancel context.CancelFunc, req *lock.Request, resp *lock.Response, cs morpc.ClientSession) {
			// resp comes from the server's getResponse (RequestID and Method set); the rest is
			// what lock_table_allocator's handlers do followed by writeResponse.
			id, m := resp.RequestID, resp.Method
			*resp = fixture.response
			resp.RequestID, resp.Method = id, m
			if cancel != nil {
				defer cancel()
			}
			if fixture.err != nil {
				resp.WrapError(fixture.err)
			}
			if err := cs.AsyncWrite(resp); err != nil {
				logger.Error("write lock response failed", zap.Error(err))
			}
		})
	}
	return started(server)
}

// startQueryServer builds the query service the way pkg/queryservice NewQueryService does
// (morpc.NewMessageHandler named "query-service" over the [rpc] Config: defaults but for
// enable-compress), plus a message filter that prints each request;
// queryservice.NewQueryService offers no filter option.
// Handler errors go through the handler's resp.WrapError like any kernel handler's, and
// unregistered methods get the handler's own NotSupported answer.
func startQueryServer(address string, responses map[int32]fixtureResponse[query.Response], compress bool) (io.Closer, error) {
	pool := morpc.NewMessagePool(
		func() *query.Request { return &query.Request{} },
		func() *query.Response { return &query.Response{} })
	handler, err := morpc.NewMessageHandler("query-service", address, rpcConfig(compress), pool,
		morpc.WithHandleMessageFilter[*query.Request, *query.Response](func(req *query.Request) bool {
			emit(map[string]any{"request": req})
			return true
		}))
	if err != nil {
		return nil, err
	}
	for method, fixture := range responses {
		handler.RegisterHandleFunc(uint32(method), func(ctx context.Context, req *query.Request, resp *query.Response) error {
			id, m := resp.RequestID, resp.CmdMethod
			*resp = fixture.response
			resp.RequestID, resp.CmdMethod = id, m
			if fixture.err != nil {
				return fixture.err
			}
			return nil
		}, false)
	}
	return started(handler)
}

func started(server interface {
	Start() error
	Close() error
}) (io.Closer, error) {
	if err := server.Start(); err != nil {
		server.Close()
		return nil, err
	}
	return server, nil
}
