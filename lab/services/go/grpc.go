//go:build grpc

// The gRPC-go flavour (built by the lab in GOPATH mode against Debian's gRPC-go, which has no
// module here): serves /lab.Hop/Work with raw bytes (no generated code) and calls gRPC
// downstreams with grpc-go's ClientConn; UNAVAILABLE is worth a retry, as python-grpc's policy
// says. Each stream's frames are read and written by its connection's goroutines.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// raw passes messages as bytes: both grpc.Codec (the server's) and encoding.Codec (calls').
type raw struct{}

func (raw) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) String() string { return "raw" }
func (raw) Name() string   { return "raw" }

func grpcAttempt(ds Downstream) func(reqID, trace string) (bool, bool) {
	target := strings.SplitN(strings.TrimPrefix(ds.URL, "http://"), "/", 2)[0]
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	return func(reqID, trace string) (bool, bool) {
		md := metadata.Pairs("x-lab-parent", reqID, "x-request-id", reqID)
		if trace != "" {
			md.Append("traceparent", trace)
		}
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md),
			time.Duration(ds.TimeoutMs)*time.Millisecond)
		defer cancel()
		in, out := []byte(reqID), []byte(nil)
		err := conn.Invoke(ctx, "/lab.Hop/Work", &in, &out, grpc.ForceCodec(raw{}))
		return err == nil, status.Code(err) == codes.Unavailable
	}
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

var desc = grpc.ServiceDesc{
	ServiceName: "lab.Hop",
	HandlerType: (*interface{})(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Work",
		Handler: func(_ interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			md, _ := metadata.FromIncomingContext(ctx)
			s := serve(first(md, "x-lab-parent"), first(md, "traceparent"))
			// As python-grpc's: UNAVAILABLE for its own failures and for those passed on.
			code := map[string]int{"none": 0, "own": 14, "downstream": 14}[s.cause]
			s.record(code, map[string]interface{}{
				"prev_attempts": atoi(first(md, "grpc-previous-rpc-attempts")),
			})
			if s.cause != "none" {
				return nil, status.Error(codes.Unavailable, s.cause)
			}
			out := []byte("ok")
			return &out, nil
		},
	}},
}

func serveGRPC() {
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	s := grpc.NewServer(grpc.CustomCodec(raw{}))
	s.RegisterService(&desc, struct{}{})
	if err := s.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

func atoi(s string) int {
	n := 0
	fmt.Sscanf(s, "%d", &n)
	return n
}
