//go:build kernellogservice

package main

import "github.com/matrixorigin/matrixone/pkg/logservice"

// The kernel's own payload wrappers. pkg/logservice needs cgo and libmo.a (see logmsg.go);
// build.sh builds libmo.a from the module's cgo/ sources when asked for this variant.
type (
	logRPCRequest  = logservice.RPCRequest
	logRPCResponse = logservice.RPCResponse
)
