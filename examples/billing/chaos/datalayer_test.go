package chaos

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
)

// TestChaosSQLDataLayer is the short chaos run with billing on database/sql
// (DataLayer sql: BILLING_DATA_LAYER=sql on every instance, so its
// repositories, outbox, inbox, consumers and idempotency records go
// through pgx's stdlib driver), with a SIGKILL and a SIGTERM under load:
// the same audit must pass, and every instance must have said it started
// on the sql layer.
func TestChaosSQLDataLayer(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	var log bytes.Buffer
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{
		IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL, DataLayer: DataLayerSQL,
		Orders: 20, Payments: 10, Instances: 2, Kills: 1, Terms: 1,
		DropRate: 0.2, FailRate: 0.1, Seed: 23, LoadDuration: 8 * time.Second,
		Quiescence: 2 * time.Minute, Progress: &log, WorkDir: work,
	})
	if rep != nil {
		var out strings.Builder
		rep.WriteText(&out)
		t.Log(out.String())
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !rep.Pass {
		t.Fatalf("violations %+v\n%s", rep.Violations, log.String())
	}
	if rep.Config.DataLayer != DataLayerSQL || !strings.Contains(rep.Config.Command, "--data-layer sql") {
		t.Errorf("report's configuration: data layer %q, command %q", rep.Config.DataLayer, rep.Config.Command)
	}
	if rep.Kills != 1 || rep.Terms != 1 {
		t.Errorf("chaos not carried out: %d kills, %d terms", rep.Kills, rep.Terms)
	}
	starts, onSQL := 0, 0
	_ = filepath.WalkDir(work, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasPrefix(d.Name(), "billing-") {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "billing starting") {
				starts++
				if strings.Contains(line, "data_layer=sql") {
					onSQL++
				}
			}
		}
		return nil
	})
	if starts == 0 || onSQL != starts {
		t.Errorf("%d of %d billing starts logged data_layer=sql", onSQL, starts)
	}
}
