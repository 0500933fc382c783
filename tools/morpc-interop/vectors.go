package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fagongzi/goetty/v2/buf"
	"github.com/matrixorigin/matrixone/pkg/common/morpc"
)

// vectorTimeout is the deadline header written into every vector frame.
const vectorTimeout = 10 * time.Second

// Frame flag bits, pkg/common/morpc/codec.go (unexported there).
const (
	flagHasPayload      = 0x01
	flagChecksumEnabled = 0x02
	flagHasCustomHeader = 0x04
)

func runVectors(args []string) error {
	fs := flag.NewFlagSet("vectors", flag.ContinueOnError)
	dir := fs.String("out", "", "directory to write the vectors into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("--out is required")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	for _, c := range vectorCases() {
		svc := services[c.service]
		request, err := encodeFrame(svc.clientCodec(false), c.request)
		if err != nil {
			return fmt.Errorf("%s %s request: %w", c.service, c.name, err)
		}
		response, err := encodeFrame(svc.serverCodec(false), c.response)
		if err != nil {
			return fmt.Errorf("%s %s response: %w", c.service, c.name, err)
		}
		// Self-check: the kernel's decoders must take the frames back.
		if _, err := decodeFrame(svc.serverCodec(false), request); err != nil {
			return fmt.Errorf("%s %s request does not decode: %w", c.service, c.name, err)
		}
		if _, err := decodeFrame(svc.clientCodec(false), response); err != nil {
			return fmt.Errorf("%s %s response does not decode: %w", c.service, c.name, err)
		}
		values := svc.responseView(c.response)
		values["request"] = svc.requestView(c.request)
		data, err := marshalJSON(values)
		if err != nil {
			return err
		}
		base := filepath.Join(*dir, c.service+"-"+c.name)
		for path, content := range map[string][]byte{
			base + "-request.bin":  request,
			base + "-response.bin": response,
			base + ".json":         append(data, '\n'),
		} {
			if err := os.WriteFile(path, content, 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(os.Stderr, "%s: request %d bytes, response %d bytes\n", base, len(request), len(response))
	}
	return nil
}

func runDecode(args []string) error {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	name := fs.String("service", "", "logservice, lock or query")
	kind := fs.String("kind", "", "request or response")
	compress := fs.Bool("compress", false, "decode with a compression-enabled codec (needed for LZ4 frames)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	svc, err := lookupService(*name)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want exactly one FILE argument")
	}
	frame, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	switch *kind {
	case "request":
		msg, err := decodeFrame(svc.serverCodec(*compress), frame)
		if err != nil {
			return err
		}
		emit(map[string]any{"request": svc.requestView(msg)})
	case "response":
		msg, err := decodeFrame(svc.clientCodec(*compress), frame)
		if err != nil {
			return err
		}
		emit(svc.responseView(msg))
	default:
		return fmt.Errorf("--kind must be request or response")
	}
	return nil
}

// encodeFrame encodes msg exactly as the kernel's codec writes it to a connection.
// The deadline header holds the time left until the context's deadline at encoding time, so
// it is overwritten with exactly vectorTimeout to make the frames reproducible; it is not
// covered by the checksum. The trace header is the all-zero span context of a context
// without a span, as in every kernel request that is not traced.
func encodeFrame(codec morpc.Codec, msg morpc.Message) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), vectorTimeout+time.Minute)
	defer cancel()
	out := buf.NewByteBuf(1024)
	// With a payload, Encode writes header and body to conn and then the payload; otherwise
	// the whole frame stays in out.
	var conn bytes.Buffer
	if err := codec.Encode(morpc.RPCMessage{Ctx: ctx, Message: msg}, out, &conn); err != nil {
		return nil, err
	}
	if _, err := out.WriteTo(&conn); err != nil {
		return nil, err
	}
	frame := conn.Bytes()
	if len(frame) < 5 {
		return nil, fmt.Errorf("frame of %d bytes", len(frame))
	}
	flag := frame[4]
	offset := 5
	if flag&flagChecksumEnabled != 0 {
		offset += 8
	}
	if flag&flagHasPayload != 0 {
		offset += 4
	}
	if flag&flagHasCustomHeader == 0 || len(frame) < offset+9 || frame[offset+8] != 24 {
		return nil, fmt.Errorf("unexpected header layout, flag %#02x", flag)
	}
	binary.BigEndian.PutUint64(frame[offset:], uint64(vectorTimeout))
	return frame, nil
}

// decodeFrame decodes one complete frame with the kernel's codec. The kernel decoder panics
// on some malformed input (it trusts the peer); that is reported as an error.
func decodeFrame(codec morpc.Codec, frame []byte) (msg morpc.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, fmt.Errorf("kernel decoder panicked: %v", r)
		}
	}()
	in := buf.NewByteBuf(len(frame) + 16)
	if _, err := in.Write(frame); err != nil {
		return nil, err
	}
	v, complete, err := codec.Decode(in)
	if err != nil {
		return nil, fmt.Errorf("kernel decoder: %w", err)
	}
	if !complete {
		return nil, fmt.Errorf("incomplete frame: %d bytes", len(frame))
	}
	if n := in.Readable(); n != 0 {
		return nil, fmt.Errorf("%d bytes after the frame", n)
	}
	rpc := v.(morpc.RPCMessage)
	if rpc.Cancel != nil {
		rpc.Cancel()
	}
	if rpc.InternalMessage() {
		return nil, fmt.Errorf("frame is an internal ping/pong message")
	}
	return rpc.Message, nil
}
