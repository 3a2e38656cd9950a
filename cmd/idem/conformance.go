package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/cli"
)

func init() {
	register(&cli.Command{
		Name:    "conformance",
		Summary: "check a live endpoint's Idempotency-Key behaviour",
		Run:     runConformance,
	})
}

const conformanceUsage = `Usage: idem conformance --url URL --body FILE [flags]

Runs the Idempotency-Key conformance checks (package idemtest) against a live
endpoint and prints one line per check: pass, fail or skip, with evidence.
Exit status 0 when nothing failed, 1 when a check failed, 2 for bad flags.

Checks: baseline, missing-key, invalid-key, replay (status, Content-Type,
Content-Language, Location and body), mismatch (--alt-body, then the body with
each JSON member changed in turn, nested ones too), concurrency, principals
(needs --principal-b-header), quoted-key, retry-after, server-error-released
(needs --fault-header), expiry (needs --ttl), routes (needs --alt-url: the
same key on another route is another operation).

gRPC: --grpc ADDR --method /pkg.Service/Method --request-json JSON checks a
unary method behind idemgrpc's interceptor (package
idemgrpc/grpcconformance): the same checks mapped to gRPC codes, plus
stored-error (--error-request-json). The request and response types come
from the server's reflection service (grpc.reflection.v1), so the server
must register it. --header, --principal-b-header and --fault-header are sent
as metadata (names in lower case); --alt-method enables routes. Executions
are inferred from the responses; expiry is not checked.

Every check uses fresh random keys and sends real requests: point it at a
test or staging deployment, never at production money.

Examples:
  idem conformance --url http://127.0.0.1:8090/charges --body charge.json \
    --count-url http://127.0.0.1:8090/ledger
  idem conformance --url http://127.0.0.1:8080/orders --body order.json \
    --header 'Authorization: Bearer alice-token' \
    --principal-b-header 'Authorization: Bearer bob-token' \
    --alt-url http://127.0.0.1:8080/payments --alt-url-body payment.json
  idem conformance --grpc 127.0.0.1:9090 --method /shop.v1.Payments/Charge \
    --request-json '{"orderId":"o-1","amountKopecks":1000}' \
    --header 'authorization: Bearer alice-token' --alt-method /shop.v1.Payments/Refund`

// headerFlag collects repeated 'Name: value' flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("want 'Name: value', got %q", s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

func runConformance(ctx context.Context, args []string) error {
	fs := cli.FlagSet("conformance", conformanceUsage)
	var headers, principalB, fault, slow headerFlag
	url := fs.String("url", "", "endpoint `URL` to check (required)")
	method := fs.String("method", http.MethodPost, "HTTP method of the endpoint")
	bodyFile := fs.String("body", "", "`FILE` with a request body the endpoint accepts with a 2xx ('-' for stdin)")
	altBodyFile := fs.String("alt-body", "", "`FILE` with a second valid body, for mismatch and expiry (default: --body with its first JSON number incremented)")
	fs.Var(&headers, "header", "'Name: value' sent on every request (repeatable), e.g. 'Authorization: Bearer alice-token'")
	fs.Var(&principalB, "principal-b-header", "'Name: value' set over --header to act as a second principal (repeatable); enables the principals check")
	fs.Var(&slow, "slow-header", "'Name: value' that makes the endpoint slow (repeatable), sent on the requests racing for an in-progress answer (retry-after)")
	fs.Var(&fault, "fault-header", "'Name: value' that makes the endpoint answer 5xx without executing (repeatable); enables server-error-released")
	altURL := fs.String("alt-url", "", "`URL` of another route of the same service (another POST endpoint); enables the routes check")
	altURLBodyFile := fs.String("alt-url-body", "", "`FILE` with the body sent to --alt-url (default: --body)")
	countURL := fs.String("count-url", "", "`URL` read with GET before and after each check to count executions: a number, an array, {\"count\":n} or an object with a list (paysim's /ledger)")
	concurrency := fs.Int("concurrency", idemtest.ConcurrencyDefault, "requests racing on one key")
	ttl := fs.Duration("ttl", 0, "key retention the endpoint is configured with; enables the expiry check (waits that long)")
	keyHeader := fs.String("key-header", idem.HeaderKey, "header carrying the key")
	timeout := fs.Duration("timeout", idemtest.RequestTimeoutDefault, "bound on each request")
	settle := fs.Duration("settle", idemtest.SettleTimeoutDefault, "how long to wait for a raced key to complete, and for a key to become usable after --ttl")
	grpcAddr := fs.String("grpc", "", "`ADDR` (host:port) of a gRPC server to check instead of --url: --method is then the full method name")
	grpcTLS := fs.Bool("grpc-tls", false, "dial --grpc with TLS (system roots) instead of plaintext")
	requestJSON := fs.String("request-json", "", "with --grpc: the request, as protojson (its type comes from server reflection)")
	altMethod := fs.String("alt-method", "", "with --grpc: another guarded method of the service; enables the routes check")
	altRequestJSON := fs.String("alt-request-json", "", "with --grpc: the request sent to --alt-method (default: --request-json)")
	errorRequestJSON := fs.String("error-request-json", "", "with --grpc: a request refused with a definitive error; enables stored-error")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	verbose := fs.Bool("v", false, "print the evidence of every check, not only of failed ones")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *grpcAddr != "" {
		if *url != "" {
			return cli.Usagef("--url and --grpc are exclusive")
		}
		if *timeout <= 0 || *settle <= 0 {
			return cli.Usagef("--timeout and --settle must be positive")
		}
		return runGRPCConformance(ctx, grpcOptions{
			addr: *grpcAddr, tls: *grpcTLS, method: *method, request: *requestJSON,
			altMethod: *altMethod, altRequest: *altRequestJSON, errorRequest: *errorRequestJSON,
			metadata: headers.h, principalB: principalB.h, fault: fault.h,
			concurrency: *concurrency, timeout: *timeout, settle: *settle, asJSON: *asJSON, verbose: *verbose,
		})
	}
	if *url == "" {
		return cli.Usagef("--url is required (or --grpc ADDR)")
	}
	// A URL may carry credentials (user:password@, ?token=): they never
	// reach the report or an error line.
	cli.HideURL(*url)
	cli.HideURL(*countURL)
	cli.HideURL(*altURL)
	if *timeout <= 0 || *settle <= 0 {
		return cli.Usagef("--timeout and --settle must be positive")
	}
	body, err := readBodyFlag("body", *bodyFile)
	if err != nil {
		return err
	}
	var altBody []byte
	if *altBodyFile != "" {
		if altBody, err = readBodyFlag("alt-body", *altBodyFile); err != nil {
			return err
		}
	}
	var altURLBody []byte
	if *altURLBodyFile != "" {
		if altURLBody, err = readBodyFlag("alt-url-body", *altURLBodyFile); err != nil {
			return err
		}
	}
	target := idemtest.Target{
		URL:            *url,
		AltURL:         *altURL,
		AltURLBody:     altURLBody,
		Method:         strings.ToUpper(*method),
		Body:           body,
		AltBody:        altBody,
		Header:         headers.h,
		PrincipalB:     principalB.h,
		FaultHeader:    fault.h,
		SlowHeader:     slow.h,
		CountURL:       *countURL,
		Concurrency:    *concurrency,
		TTL:            *ttl,
		KeyHeader:      *keyHeader,
		RequestTimeout: *timeout,
		SettleTimeout:  *settle,
	}
	// The whole run: every request bounded, plus the TTL wait.
	ctx, cancel := context.WithTimeout(ctx, 20*(*timeout)+2*(*settle)+(*ttl)+time.Minute)
	defer cancel()
	rep, err := idemtest.Run(ctx, target)
	if err != nil {
		return cli.Usagef("%s", strings.TrimPrefix(err.Error(), "idemtest: "))
	}
	scrubReport(rep, *url, *countURL, *altURL)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteTable(os.Stdout, *verbose); err != nil {
		return err
	}
	if failed := rep.Names(idemtest.Fail); len(failed) > 0 {
		return fmt.Errorf("%d of %d checks failed: %s", len(failed), len(rep.Results), strings.Join(failed, ", "))
	}
	return nil
}

// scrubReport hides the secrets of urls (user-info password, secret query
// parameters) everywhere the report could repeat them: the target, the
// reasons, the notes and the transport errors of the evidence.
func scrubReport(rep *idemtest.Report, urls ...string) {
	rep.Target = cli.Scrub(rep.Target, urls...)
	for i := range rep.Results {
		res := &rep.Results[i]
		res.Reason = cli.Scrub(res.Reason, urls...)
		for j := range res.Notes {
			res.Notes[j] = cli.Scrub(res.Notes[j], urls...)
		}
		for j := range res.Evidence {
			res.Evidence[j].Error = cli.Scrub(res.Evidence[j].Error, urls...)
		}
	}
}

// readBodyFlag reads a body file; a missing or unreadable file is bad
// input (exit 2), named by its flag.
func readBodyFlag(flagName, path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, cli.Usagef("--%s: %v", flagName, err)
	}
	return b, nil
}
