package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// TestMain builds nats-server from its Go module too, for the mesh tests.
func TestMain(m *testing.M) {
	testenv.Main(m, ".", "../cluster-harness", "github.com/nats-io/nats-server/v2")
}

// fakeDiscord is Discord's GET /gateway/bot, for tests only. It answers 429
// first when told to, and refuses any other token.
type fakeDiscord struct {
	shards, maxConc int
	first429        bool
	calls           atomic.Int32
}

const testToken = "test.bot.token-0123456789"

func (f *fakeDiscord) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.calls.Add(1)
	switch {
	case r.URL.Path != "/api/v10/gateway/bot":
		http.NotFound(w, r)
	case r.Header.Get("Authorization") != "Bot "+testToken:
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"message": "401: Unauthorized", "code": 0}`)
	case f.first429 && n == 1:
		w.Header().Set("Retry-After", "0.2")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"message":"You are being rate limited.","retry_after":0.2,"global":false}`)
	default:
		fmt.Fprintf(w, `{"url":"wss://gateway.discord.gg","shards":%d,"session_start_limit":{"total":1000,"remaining":990,"reset_after":3600000,"max_concurrency":%d}}`, f.shards, f.maxConc)
	}
}

func writeConfig(t *testing.T, dir, apiURL string) string {
	t.Helper()
	doc := fmt.Sprintf(`socket = %q
[topology]
total_shards = "auto"
shards_per_cluster = 2
[cluster]
command = [%q, "--simulate", "--connect-delay=1ms", "--event-interval=0"]
[heartbeat]
interval = "50ms"
timeout = "1s"
[status]
listen = ""
[admin]
listen = ""
[discord]
token_env = "SM_TEST_DISCORD_TOKEN"
api_base_url = %q
identify_spacing = "1ms"
`, filepath.Join(dir, "sm.sock"), testenv.Bin("cluster-harness"), apiURL+"/api/v10")
	path := filepath.Join(dir, "sm.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// total_shards = "auto" takes Discord's recommendation (after a 429), which
// also sizes the identify buckets and the budget.
func TestAutoTopology(t *testing.T) {
	fake := &fakeDiscord{shards: 5, maxConc: 2, first429: true}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	dir := t.TempDir()
	cfg := writeConfig(t, dir, srv.URL)
	cmd := exec.Command(testenv.Bin("sm-manager"), "-config", cfg)
	cmd.Env = append(os.Environ(), "SM_TEST_DISCORD_TOKEN="+testToken)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Log(out.String())
		}
		if strings.Contains(out.String(), testToken) {
			t.Error("the bot token appears in the manager's output")
		}
		// Logs at info are public: no path (the socket's and the command's
		// are under dir).
		if strings.Contains(out.String(), dir) {
			t.Errorf("a path under %s appears in the output at info:\n%s", dir, out.String())
		}
	}()
	var c *ipc.Client
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		c, err = ipc.Dial(t.Context(), ipc.ClientConfig{Path: filepath.Join(dir, "sm.sock"), Register: ipc.Frame{Role: ipc.RoleClient}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("manager not up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	var st struct {
		Topology struct {
			Total int `json:"total_shards"`
		} `json:"topology"`
		Clusters []struct {
			State string `json:"state"`
		} `json:"clusters"`
		Discord struct {
			Recommended int `json:"recommended_shards"`
			MaxConc     int `json:"max_concurrency"`
			Budget      struct {
				Known     bool `json:"known"`
				Remaining int  `json:"remaining"`
			} `json:"budget"`
		} `json:"discord"`
	}
	for ready := false; !ready; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(r.Payload, &st)
		ready = len(st.Clusters) > 0
		for _, cs := range st.Clusters {
			ready = ready && cs.State == "ready"
		}
		if !ready && time.Now().After(deadline) {
			t.Fatalf("not ready: %s", r.Payload)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 5 recommended, rounded up to a multiple of max_concurrency 2: 6 shards, 3 clusters.
	if st.Topology.Total != 6 || len(st.Clusters) != 3 || st.Discord.Recommended != 6 || st.Discord.MaxConc != 2 {
		t.Fatalf("status: %+v", st)
	}
	// 990 at start, 6 first-start identifies since.
	if !st.Discord.Budget.Known || st.Discord.Budget.Remaining != 984 {
		t.Fatalf("budget: %+v", st.Discord.Budget)
	}
	if fake.calls.Load() != 2 {
		t.Fatalf("%d calls to /gateway/bot, want 2 (a 429, then the answer)", fake.calls.Load())
	}
}

// A refused token stops the start with a clear error, and never prints the token.
func TestAutoTopologyTokenRefused(t *testing.T) {
	srv := httptest.NewServer(&fakeDiscord{shards: 4, maxConc: 1})
	defer srv.Close()
	dir := t.TempDir()
	cmd := exec.Command(testenv.Bin("sm-manager"), "-config", writeConfig(t, dir, srv.URL))
	cmd.Env = append(os.Environ(), "SM_TEST_DISCORD_TOKEN=wrong.token-value-99999")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("manager started with a refused token:\n%s", out)
	}
	if !strings.Contains(string(out), "refused") || strings.Contains(string(out), "wrong.token-value-99999") {
		t.Fatalf("output:\n%s", out)
	}
}

// -check refuses a cluster command that cannot run, by the rule a DEPLOY
// refuses it with (bad_config), and accepts one that can.
func TestCheckRefusesCommandThatCannotRun(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(command string) (string, error) {
		doc := fmt.Sprintf("socket = %q\n[topology]\ntotal_shards = 2\nshards_per_cluster = 2\n[cluster]\ncommand = [%q]\n",
			filepath.Join(dir, "sm.sock"), command)
		path := filepath.Join(dir, "sm.toml")
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(testenv.Bin("sm-manager"), "-config", path, "-check").CombinedOutput()
		return string(out), err
	}
	for name, command := range map[string]string{
		"missing":        filepath.Join(dir, "missing", "bot"),
		"not executable": plain,
		"a directory":    dir,
		"not on PATH":    "sm-no-such-command-7f3a",
	} {
		out, err := check(command)
		if err == nil || !strings.Contains(out, "cluster.command") {
			t.Errorf("%s command: -check = %v:\n%s", name, err, out)
		}
	}
	if out, err := check(testenv.Bin("cluster-harness")); err != nil || !strings.Contains(out, "configuration OK") {
		t.Errorf("a runnable command: -check = %v:\n%s", err, out)
	}
}
