package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/matrixorigin/matrixone/pkg/common/morpc"
	"github.com/matrixorigin/matrixone/pkg/pb/lock"
	"github.com/matrixorigin/matrixone/pkg/pb/query"
)

func runCall(args []string) error {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	address := fs.String("address", "", "HOST:PORT of the server")
	name := fs.String("service", "", "logservice, lock or query")
	request := fs.String("request", "", "JSON of the service's Request, including Method/CmdMethod")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of the request (sent in the deadline header)")
	compress := fs.Bool("compress", false, "LZ4-compress as the kernel does with enable-compress = true")
	if err := fs.Parse(args); err != nil {
		return err
	}
	svc, err := lookupService(*name)
	if err != nil {
		return err
	}
	if *address == "" {
		return fmt.Errorf("--address is required")
	}
	req, err := svc.parseRequest([]byte(*request))
	if err != nil {
		return fmt.Errorf("--request: %w", err)
	}

	client, err := newClient(svc.name, *address, *compress)
	if err != nil {
		fail(err)
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	future, err := client.Send(ctx, *address, req)
	if err != nil {
		fail(err)
	}
	defer future.Close()
	resp, err := future.Get()
	if err != nil {
		fail(err)
	}
	emit(svc.responseView(resp))
	return nil
}

// newClient builds the morpc client the kernel builds for the service. The kernel wrappers
// around it (hakeeperClient, lockservice client, queryservice client) are not used because
// they pick the address themselves (HAKeeper discovery, cluster lookup by method) and turn
// error responses into Go errors; the client, codec and backend options are theirs. compress
// is [hakeeper-client] enable-compress for logservice and [rpc] enable-compress otherwise.
func newClient(service, address string, compress bool) (morpc.RPCClient, error) {
	switch service {
	case "logservice":
		// pkg/logservice/client.go getRPCClient as connectToHAKeeper calls it.
		bf := morpc.NewGoettyBasedBackendFactory(newLogClientCodec(compress),
			morpc.WithBackendConnectTimeout(time.Second),
			morpc.WithBackendHasPayloadResponse(),
			morpc.WithBackendLogger(logger.Named("hakeeper-client-backend")),
			// pkg/logservice/hakeeper_client.go defaultBackendReadTimeout
			morpc.WithBackendReadTimeout(8*time.Second))
		return morpc.NewClient("logservice-client", bf,
			morpc.WithClientInitBackends([]string{address}, []int{1}),
			morpc.WithClientMaxBackendPerHost(1),
			morpc.WithClientLogger(logger))
	case "lock":
		// pkg/lockservice/rpc.go NewClient.
		cfg := rpcConfig(compress)
		cfg.BackendOptions = append(cfg.BackendOptions,
			morpc.WithBackendReadTimeout(10*time.Second), // lockservice defaultRPCTimeout
			morpc.WithBackendFreeOrphansResponse(func(morpc.Message) {}))
		return cfg.NewClient("lock-client", logger,
			func() morpc.Message { return &lock.Response{} })
	case "query":
		// pkg/queryservice/client/query_client.go NewQueryClient.
		return rpcConfig(compress).NewClient("query-client", logger.Named("query-client"),
			func() morpc.Message { return &query.Response{} })
	}
	return nil, fmt.Errorf("unknown service %q", service)
}
