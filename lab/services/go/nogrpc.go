//go:build !grpc

// Without `-tags grpc` (the module build: no gRPC-go here) the service speaks HTTP/1 only.
package main

import (
	"fmt"
	"os"
)

func grpcAttempt(ds Downstream) func(reqID, trace string) (bool, bool) {
	fmt.Fprintf(os.Stderr, "downstream %s is gRPC: build with -tags grpc\n", ds.Name)
	os.Exit(64)
	return nil
}

func serveGRPC() {
	fmt.Fprintln(os.Stderr, "proto grpc: build with -tags grpc")
	os.Exit(64)
}
