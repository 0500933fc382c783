//go:build !kernellogservice

package main

import (
	"fmt"

	"github.com/matrixorigin/matrixone/pkg/common/morpc"
	pb "github.com/matrixorigin/matrixone/pkg/pb/logservice"
)

// logRPCRequest and logRPCResponse are pkg/logservice/message.go (RPCRequest, RPCResponse) of
// v1.2.4, minus the sync.Pool. Importing pkg/logservice itself pulls in about 85 kernel
// packages, among them pkg/common/malloc and pkg/common/bitmap, which need cgo and the
// kernel's libmo.a; build with -tags kernellogservice to use the kernel's own types instead
// (build.sh: MO_MORPC_INTEROP_KERNEL_LOGSERVICE=1). Both builds produce identical frames.
type logRPCRequest struct {
	pb.Request
	payload []byte
}

var _ morpc.PayloadMessage = (*logRPCRequest)(nil)

func (r *logRPCRequest) Size() int       { return r.Request.Size() + len(r.payload) }
func (r *logRPCRequest) SetID(id uint64) { r.RequestID = id }
func (r *logRPCRequest) GetID() uint64   { return r.RequestID }
func (r *logRPCRequest) DebugString() string {
	return fmt.Sprintf("%s:%p", r.Request.Method.String(), r.payload)
}
func (r *logRPCRequest) GetPayloadField() []byte     { return r.payload }
func (r *logRPCRequest) SetPayloadField(data []byte) { r.payload = data }

type logRPCResponse struct {
	pb.Response
	payload []byte
}

var _ morpc.PayloadMessage = (*logRPCResponse)(nil)

func (r *logRPCResponse) SetID(id uint64)             { r.RequestID = id }
func (r *logRPCResponse) GetID() uint64               { return r.RequestID }
func (r *logRPCResponse) DebugString() string         { return r.Response.Method.String() }
func (r *logRPCResponse) GetPayloadField() []byte     { return r.payload }
func (r *logRPCResponse) SetPayloadField(data []byte) { r.payload = data }
