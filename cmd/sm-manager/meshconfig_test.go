package main_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestMeshRefusesOtherConfig: a manager whose [topology] or [cluster]
// differs from a live host's refuses to start, naming the difference (and
// no value of [cluster]), with no socket made and no host record written.
func TestMeshRefusesOtherConfig(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	a := startMeshHost(t, srv.URL, "a", 0)
	a.dial(t)
	testenv.WaitFor(t, 20*time.Second, "host a in the mesh", func() bool { return len(a.status(t).Hosts) == 1 })

	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"shards per cluster", "shards_per_cluster = 2", "shards_per_cluster = 3", "topology.shards_per_cluster 3 here, 2 there"},
		{"total shards", "total_shards = 24", "total_shards = 26", "topology.total_shards 26 here, 24 there"},
		{"command", `"--event-interval=0"]`, `"--event-interval=0", "--secret-arg"]`, "cluster.command differs"},
	} {
		path, sock := meshConfig(t, srv.URL, "b", 0, "")
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), tc.from) {
			t.Fatalf("%s: the config has no %q", tc.name, tc.from)
		}
		if err := os.WriteFile(path, []byte(strings.Replace(string(doc), tc.from, tc.to, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, testenv.Bin("sm-manager"), "-config", path).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "configuration differs from the mesh's") ||
			!strings.Contains(string(out), "host a runs another configuration") || !strings.Contains(string(out), tc.want) {
			t.Fatalf("%s: sm-manager = %v, want a refusal naming %q:\n%s", tc.name, err, tc.want, out)
		}
		if strings.Contains(string(out), "--secret-arg") || strings.Contains(string(out), testenv.Bin("cluster-harness")) {
			t.Fatalf("%s: the refusal shows a [cluster] value:\n%s", tc.name, out)
		}
		if _, err := os.Stat(sock); err == nil {
			t.Fatalf("%s: the refused manager made its socket", tc.name)
		}
		t.Logf("%s: %s", tc.name, lastLine(string(out)))
	}
	// Nothing of b was written: a alone is in the mesh, and still runs all 12.
	if hs := a.status(t).Hosts; len(hs) != 1 || hs[0].ID != "a" {
		t.Fatalf("hosts after the refusals: %+v", hs)
	}
	placed(t, []*meshHost{a}, 10*time.Second, "a still runs the 12 clusters")
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
