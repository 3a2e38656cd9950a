package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemgrpc/grpcconformance"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/cli"
)

type grpcOptions struct {
	addr, method, request               string
	altMethod, altRequest, errorRequest string
	tls                                 bool
	metadata, principalB, fault         http.Header
	concurrency                         int
	timeout, settle                     time.Duration
	asJSON, verbose                     bool
}

// toMD turns 'Name: value' flags into gRPC metadata (lower-case keys).
func toMD(h http.Header) metadata.MD {
	if h == nil {
		return nil
	}
	md := metadata.MD{}
	for k, vs := range h {
		md[strings.ToLower(k)] = vs
	}
	return md
}

func runGRPCConformance(ctx context.Context, o grpcOptions) error {
	if !strings.HasPrefix(o.method, "/") || strings.Count(o.method, "/") != 2 {
		return cli.Usagef("--method must be a full gRPC method name (/pkg.Service/Method) with --grpc, got %q", o.method)
	}
	if o.request == "" {
		return cli.Usagef("--request-json is required with --grpc")
	}
	creds := insecure.NewCredentials()
	if o.tls {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return cli.Usagef("--grpc: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*o.timeout+2*o.settle+time.Minute)
	defer cancel()
	rctx, rcancel := context.WithTimeout(ctx, o.timeout)
	md, err := grpcconformance.Resolve(rctx, conn, o.method)
	rcancel()
	if err != nil {
		return fmt.Errorf("--method: %w", err)
	}
	parse := func(flag, js string) (proto.Message, error) {
		if js == "" {
			return nil, nil
		}
		m, err := grpcconformance.RequestFromJSON(md, []byte(js))
		if err != nil {
			return nil, cli.Usagef("--%s: %v", flag, err)
		}
		return m, nil
	}
	target := grpcconformance.Target{
		Conn: conn, Method: o.method, NewResponse: grpcconformance.ResponseOf(md),
		Metadata: toMD(o.metadata), PrincipalB: toMD(o.principalB), FaultMetadata: toMD(o.fault),
		Concurrency: o.concurrency, CallTimeout: o.timeout, SettleTimeout: o.settle,
	}
	if target.Request, err = parse("request-json", o.request); err != nil {
		return err
	}
	if target.ErrorRequest, err = parse("error-request-json", o.errorRequest); err != nil {
		return err
	}
	if o.altMethod != "" {
		target.AltMethod = o.altMethod
		amd, err := grpcconformance.Resolve(ctx, conn, o.altMethod)
		if err != nil {
			return fmt.Errorf("--alt-method: %w", err)
		}
		js := o.altRequest
		if js == "" {
			js = o.request
		}
		if target.AltRequest, err = grpcconformance.RequestFromJSON(amd, []byte(js)); err != nil {
			return cli.Usagef("--alt-request-json: %v", err)
		}
	}
	rep, err := grpcconformance.Run(ctx, target)
	if err != nil {
		return cli.Usagef("%s", strings.TrimPrefix(err.Error(), "grpcconformance: "))
	}
	if o.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteTable(os.Stdout, o.verbose); err != nil {
		return err
	}
	if failed := rep.Names(idemtest.Fail); len(failed) > 0 {
		return fmt.Errorf("%d of %d checks failed: %s", len(failed), len(rep.Results), strings.Join(failed, ", "))
	}
	return nil
}
