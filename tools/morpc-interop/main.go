// morpc-interop runs MatrixOne's own morpc code (github.com/matrixorigin/matrixone v1.2.4:
// pkg/common/morpc, pkg/lockservice, pkg/pb/*) so that the Rust client in crates/mo-rpc can be
// tested against the kernel in both directions:
//
//	serve    kernel morpc server answering from a JSON fixture (Rust client -> kernel server)
//	call     kernel morpc client sending one request (kernel client -> Rust server)
//	vectors  frames encoded by the kernel codec, with the values as JSON
//	decode   decodes one frame (written by anyone) with the kernel codec
//
// stdout carries only the JSON lines described in usage; logs go to stderr.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/matrixorigin/matrixone/pkg/common/runtime"
	"github.com/matrixorigin/matrixone/pkg/logutil"
	"github.com/matrixorigin/matrixone/pkg/pb/metadata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

const usage = `usage:
  morpc-interop serve   --listen 127.0.0.1:0 --service logservice|lock|query --fixture FILE [--compress]
  morpc-interop call    --address HOST:PORT --service logservice|lock|query --request JSON [--timeout 10s] [--compress]
  morpc-interop vectors --out DIR
  morpc-interop decode  --service logservice|lock|query --kind request|response [--compress] FILE

serve    Starts the kernel's server for the service, prints "listening HOST:PORT", then
         {"request": ...} for every request received. FILE is a JSON object mapping a method
         name as the enum's String() prints it (or its number) to the service's Response; for
         lock and query a value may also carry "moerr": {"code": N, "message": "...",
         "mysql_code": N, "sql_state": "..."} to answer with that Response.Error (mysql_code
         and sql_state default to 1105 and HY000). Other methods get the kernel's NotSupported
         answer. Runs until SIGINT or SIGTERM.
call     Sends one Request (the client assigns RequestID) with the kernel's client and prints
         {"response": ...}, plus "moerr" when Response.Error is set. On a transport error or
         timeout prints {"error": "..."} and exits 1.
vectors  Writes DIR/<service>-<method>-request.bin and -response.bin (complete frames as the
         kernel's codecs encode them; deadline header 10s, zero trace) and
         DIR/<service>-<method>.json ({"request", "response", "moerr"}). Map entries are
         encoded in Go map order, so frames with multi-entry maps differ between runs.
decode   Decodes one complete frame with the kernel's codec and prints {"request": ...} or
         {"response": ...}; exits 1 with the kernel's error if it does not decode.

--compress gives serve, call and decode the codec of a kernel whose config has
enable-compress = true ([rpc] for lock and query, [logservice.rpc] for the logservice server,
[hakeeper-client] for its client): every frame it encodes has flag 0x08 and an LZ4 block
body and payload; its decoder takes frames with and without 0x08. Without it (the default, as
in the kernel) frames are uncompressed, and the decoder panics on a 0x08 frame with a body (nil
mpool): a v1.2.4 client process then exits, a server process crashes.

JSON is encoding/json of the kernel's generated types (enums as numbers, bytes as base64).
Logs go to stderr: MORPC_INTEROP_LOG_LEVEL=debug|info|warn|error|dpanic (default dpanic,
because the kernel logs ERROR lines even when a connection closes normally).
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if a := os.Args[1]; a == "-h" || a == "--help" || a == "help" {
		fmt.Fprint(os.Stdout, usage)
		return
	}
	setupLogging()
	args := os.Args[2:]
	var err error
	switch os.Args[1] {
	case "serve":
		err = runServe(args)
	case "call":
		err = runCall(args)
	case "vectors":
		err = runVectors(args)
	case "decode":
		err = runDecode(args)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "morpc-interop %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

var (
	logger *zap.Logger
	// jsonOut is the process's original stdout. setupLogging points fd 1 at stderr, because
	// the kernel's logutil (used by morpc stoppers and mpool, among others) logs to "stdout"
	// and would corrupt the JSON lines.
	jsonOut = os.Stdout
)

func setupLogging() {
	level := zapcore.DPanicLevel
	if v := os.Getenv("MORPC_INTEROP_LOG_LEVEL"); v != "" {
		if err := level.Set(v); err != nil {
			fmt.Fprintf(os.Stderr, "bad MORPC_INTEROP_LOG_LEVEL %q: %v\n", v, err)
			os.Exit(2)
		}
	}
	fd, err := unix.Dup(1)
	if err == nil {
		err = unix.Dup2(2, 1)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot redirect stdout: %v\n", err)
		os.Exit(2)
	}
	jsonOut = os.NewFile(uintptr(fd), "stdout")
	logutil.SetupMOLogger(&logutil.LogConfig{Level: level.String(), Format: "console", StacktraceLevel: "panic"})
	// morpc, lockservice and the query handler take their loggers from the process runtime.
	encoder := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	logger = zap.New(zapcore.NewCore(encoder, zapcore.Lock(os.Stderr), level))
	runtime.SetupProcessLevelRuntime(runtime.NewRuntime(metadata.ServiceType_CN, "morpc-interop", logger))
}

var stdoutMu sync.Mutex

// emit writes v as one JSON line on stdout. Server handlers run concurrently, hence the lock.
func emit(v any) {
	data, err := marshalJSON(v)
	if err != nil {
		data, _ = json.Marshal(map[string]string{"error": "cannot encode JSON: " + err.Error()})
	}
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	jsonOut.Write(append(data, '\n'))
}

// marshalJSON is json.Marshal without HTML escaping, so messages read as the kernel wrote them.
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// fail prints {"error": ...} and exits 1 (transport errors and timeouts of call).
func fail(err error) {
	emit(map[string]string{"error": err.Error()})
	os.Exit(1)
}

// strictUnmarshal rejects unknown fields so a misspelt field in a fixture or request is an
// error instead of silently sending a default value.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after JSON value")
	}
	return nil
}
