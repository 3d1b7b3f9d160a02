package systemd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
)

// sdContainerTool finds ../shared/tools/sd-container beside the repository
// (CI lays shared/ there too), or /work/shared/tools/sd-container.
func sdContainerTool(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sd-container needs root")
	}
	for _, p := range []string{filepath.Join("..", "..", "shared", "tools", "sd-container"), "/work/shared/tools/sd-container"} {
		if abs, err := filepath.Abs(p); err == nil {
			if _, err := os.Stat(abs); err == nil {
				return abs
			}
		}
	}
	t.Skip("sd-container not found (../shared/tools/sd-container)")
	return ""
}

// container is a real systemd, booted as PID 1 in private namespaces, with
// this directory's unit files in /etc/systemd/system and testenv.Dir kept
// visible.
type container struct {
	t     *testing.T
	tool  string
	state string
}

func bootContainer(t *testing.T) *container {
	t.Helper()
	src := sdContainerTool(t)
	state, err := os.MkdirTemp("", "smsd-ct")
	if err != nil {
		t.Fatal(err)
	}
	// Run a copy: it copies itself into the state dir and runs that copy, so
	// it must be executable wherever shared/ came from.
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(state, "sd-container.sh")
	if err := os.WriteFile(tool, b, 0o755); err != nil {
		t.Fatal(err)
	}
	units, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	c := &container{t: t, tool: tool, state: filepath.Join(state, "ct")}
	t.Cleanup(func() {
		if t.Failed() {
			out, _, _ := c.run("journalctl", "--no-pager", "-o", "short-monotonic", "-u", "sm-*")
			t.Logf("journal:\n%s", lastLines(out, 150))
		}
		cmd := exec.Command(tool, "stop", c.state)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sd-container stop: %v\n%s", err, out)
		}
		os.RemoveAll(state)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, "start", c.state, units)
	cmd.Env = append(os.Environ(), "SD_KEEP="+testenv.Dir())
	if out, err := cmd.CombinedOutput(); err != nil {
		boot, _ := os.ReadFile(filepath.Join(c.state, "boot.log"))
		t.Fatalf("sd-container start: %v\n%s\nboot.log:\n%s", err, out, boot)
	}
	return c
}

// run runs argv inside the container.
func (c *container) run(argv ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.tool, append([]string{"exec", c.state}, argv...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return strings.TrimSpace(o.String()), strings.TrimSpace(e.String()), err
}

// must runs argv inside the container and fails the test if it fails.
func (c *container) must(argv ...string) string {
	c.t.Helper()
	out, errOut, err := c.run(argv...)
	if err != nil {
		c.t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(argv, " "), err, out, errOut)
	}
	return out
}

// sh runs a shell script inside the container.
func (c *container) sh(script string) string {
	c.t.Helper()
	return c.must("sh", "-ec", script)
}

func (c *container) show(unit, prop string) string {
	c.t.Helper()
	return c.must("systemctl", "show", "-P", prop, unit)
}

// waitStatus waits until the manager's StatusText is want.
func (c *container) waitStatus(want string) {
	c.t.Helper()
	c.waitStatusOf("sm-manager.service", want)
}

// waitStatusOf waits until unit's StatusText is want.
func (c *container) waitStatusOf(unit, want string) {
	c.t.Helper()
	var got string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = c.show(unit, "StatusText"); got == want {
			return
		}
	}
	c.t.Fatalf("%s: StatusText %q, want %q", unit, got, want)
}

// clusterPIDs lists the cluster processes running in the container.
func (c *container) clusterPIDs() []string {
	c.t.Helper()
	out, _, err := c.run("pgrep", "-f", "/usr/local/bin/cluster-harness")
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) { // 1: none
		c.t.Fatalf("pgrep: %v", err)
	}
	pids := strings.Fields(out)
	slices.Sort(pids)
	return pids
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// containerConfig is /etc/sm/sm.toml in the container: 4 simulated clusters.
func containerConfig(extraClusterArgs ...string) *config.Config {
	cfg := config.Default()
	cfg.Socket = "/run/sm/sm.sock"
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = append([]string{"/usr/local/bin/cluster-harness", "--simulate", "--connect-delay=10ms", "--event-interval=0"}, extraClusterArgs...)
	cfg.Heartbeat.Interval = config.Duration{Duration: 200 * time.Millisecond}
	cfg.Heartbeat.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Restart.StopGrace = config.Duration{Duration: time.Second}
	cfg.Requests.Timeout = config.Duration{Duration: 3 * time.Second}
	cfg.Shutdown.Timeout = config.Duration{Duration: 5 * time.Second}
	cfg.Status.Listen = ""
	cfg.Admin.Listen = ""
	// The simulated bot has no real gateway: no need for Discord's 5s.
	cfg.Discord.IdentifySpacing = config.Duration{Duration: time.Millisecond}
	return &cfg
}

// installConfig puts cfg at /etc/sm/sm.toml, readable by group sm only.
func (c *container) installConfig(cfg *config.Config) {
	c.t.Helper()
	c.installConfigAs(cfg, "sm")
}

// installConfigAs puts cfg at /etc/sm/NAME.toml, readable by group sm only.
func (c *container) installConfigAs(cfg *config.Config, name string) {
	c.t.Helper()
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(cfg); err != nil {
		c.t.Fatal(err)
	}
	c.installConfigTextAs(b.Bytes(), name)
}

func (c *container) installConfigText(text []byte) {
	c.t.Helper()
	c.installConfigTextAs(text, "sm")
}

func (c *container) installConfigTextAs(text []byte, name string) {
	c.t.Helper()
	src := filepath.Join(testenv.Dir(), name+".toml")
	if err := os.WriteFile(src, text, 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.sh("mkdir -p /etc/sm && install -m640 -o root -g sm " + src + " /etc/sm/" + name + ".toml")
}

// readmeConfig is config.example.toml edited as the README's install section
// does (its sed), so a drift between the two fails here.
func readmeConfig(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ re, with string }{
		{`(?m)^socket = .*$`, `socket = "/run/sm/sm.sock"`},
		{`(?m)^dir = "/tmp/sm/state"$`, `dir = "/var/lib/sm"`},
	} {
		re := regexp.MustCompile(r.re)
		if !re.Match(b) {
			t.Fatalf("config.example.toml has no line matching %s: update the README's install section", r.re)
		}
		b = re.ReplaceAll(b, []byte(r.with))
	}
	return b
}

// install follows the README: user sm, binaries in /usr/local/bin, config
// (cfg, or the README's when nil).
func (c *container) install(cfg *config.Config) {
	c.t.Helper()
	c.must("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "sm")
	c.sh(fmt.Sprintf("install -m755 %[1]s/sm-manager %[1]s/cluster-harness %[1]s/smclient %[1]s/sm-api /usr/local/bin/", testenv.Dir()))
	if cfg != nil {
		c.installConfig(cfg)
	} else {
		c.installConfigText(readmeConfig(c.t))
	}
	c.must("systemctl", "daemon-reload")
}

// dropIn adds a drop-in to unit (test timings; the shipped files are unchanged).
func (c *container) dropIn(unit, name, body string) {
	c.t.Helper()
	src := filepath.Join(testenv.Dir(), unit+"-"+name+".conf")
	if err := os.WriteFile(src, []byte(body+"\n"), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.must("install", "-D", "-m644", src, "/etc/systemd/system/"+unit+".d/"+name+".conf")
	c.must("systemctl", "daemon-reload")
}

func (c *container) smclient(args ...string) string {
	c.t.Helper()
	return c.must(append([]string{"/usr/local/bin/smclient", "-socket", "/run/sm/sm.sock", "-clusters", "4"}, args...)...)
}

// TestRealSystemd installs sm as the README says into a real systemd and
// checks the units: systemd-analyze verify, start (Type=notify: READY),
// StatusText, routing, sm-api, the watchdog, restart, and that a stop, even one that
// overruns TimeoutStopSec, leaves no cluster process behind. Each step needs
// the ones before it, so the first failure ends the test.
func TestRealSystemd(t *testing.T) {
	t.Parallel()
	c := bootContainer(t)
	c.install(nil) // config.example.toml as the README installs it: 4 simulated clusters
	var mainPID string
	for _, step := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"systemd-analyze verify", func(t *testing.T) {
			out, errOut, err := c.run("systemd-analyze", "verify",
				"/etc/systemd/system/sm-manager.socket", "/etc/systemd/system/sm-manager.service", "/etc/systemd/system/sm-api.service")
			if err != nil || errOut != "" || out != "" {
				t.Fatalf("systemd-analyze verify: %v\nstdout: %s\nstderr: %s", err, out, errOut)
			}
		}},
		{"start", func(t *testing.T) {
			// Pings every 500ms instead of 5s, so a missing one shows in seconds.
			c.dropIn("sm-manager.service", "watchdog", "[Service]\nWatchdogSec=1s")
			start := time.Now()
			c.must("systemctl", "start", "sm-manager.socket", "sm-manager.service")
			t.Logf("systemctl start returned after %v", time.Since(start).Round(time.Millisecond))
			for _, u := range []string{"sm-manager.socket", "sm-manager.service"} {
				if got, _, _ := c.run("systemctl", "is-active", u); got != "active" {
					t.Fatalf("%s is %q", u, got)
				}
			}
			if got := c.sh("stat -c '%a %U %G' /run/sm/sm.sock"); got != "660 root sm" {
				t.Errorf("socket mode/owner %q, want 660 root sm", got)
			}
		}},
		{"status and routing", func(t *testing.T) {
			c.waitStatus("4/4 clusters ready, generation 1")
			if got := c.smclient("-rounds", "5"); got != "ok 20" {
				t.Fatalf("smclient: %q", got)
			}
			mainPID = c.show("sm-manager.service", "MainPID")
			if got := c.must("ps", "-o", "user=", "-p", mainPID); got != "sm" {
				t.Errorf("manager runs as %q, want sm", got)
			}
			if n := len(strings.Fields(c.must("pgrep", "-u", "sm", "-f", "/usr/local/bin/cluster-harness"))); n != 4 {
				t.Errorf("%d cluster processes of user sm, want 4", n)
			}
		}},
		{"sm-api", func(t *testing.T) {
			c.sh("umask 077; echo SM_API_TOKEN=systemd-test-token > /etc/sm/sm-api.env")
			c.must("systemctl", "start", "sm-api.service")
			var code string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				// /readyz: sm-api is connected to the manager.
				code, _, _ = c.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:7482/readyz")
				if code == "200" {
					break
				}
			}
			if code != "200" {
				t.Fatalf("sm-api /readyz: %q", code)
			}
			if got := c.must("ps", "-o", "user=", "-p", c.show("sm-api.service", "MainPID")); got != "sm" {
				t.Errorf("sm-api runs as %q, want sm", got)
			}
		}},
		{"watchdog", func(t *testing.T) {
			first := c.show("sm-manager.service", "WatchdogTimestampMonotonic")
			time.Sleep(2500 * time.Millisecond) // 2.5 watchdog timeouts
			if got := c.show("sm-manager.service", "WatchdogTimestampMonotonic"); got == first {
				t.Errorf("no WATCHDOG=1 reached systemd in 2.5s (timestamp still %s)", got)
			}
			if got := c.show("sm-manager.service", "MainPID"); got != mainPID {
				t.Errorf("manager replaced (pid %s, was %s): did the watchdog fire?", got, mainPID)
			}
			if got := c.show("sm-manager.service", "NRestarts"); got != "0" {
				t.Errorf("NRestarts=%s", got)
			}
		}},
		{"restart", func(t *testing.T) {
			before := c.clusterPIDs()
			c.must("systemctl", "restart", "sm-manager.service")
			if got := c.show("sm-manager.service", "MainPID"); got == mainPID || got == "0" {
				t.Fatalf("MainPID %s after restart, was %s", got, mainPID)
			}
			c.waitStatus("4/4 clusters ready, generation 1")
			if got := c.smclient("-rounds", "2"); got != "ok 8" {
				t.Fatalf("smclient: %q", got)
			}
			// A restart is a clean stop then a start: the old clusters were
			// quiesced, not left beside the new ones.
			after := c.clusterPIDs()
			if len(after) != 4 {
				t.Fatalf("%d cluster processes after restart: %v", len(after), after)
			}
			for _, p := range before {
				if slices.Contains(after, p) {
					t.Errorf("cluster process %s survived a clean restart", p)
				}
			}
		}},
		{"stop", func(t *testing.T) {
			start := time.Now()
			c.must("systemctl", "stop", "sm-manager.service")
			t.Logf("systemctl stop took %v", time.Since(start).Round(time.Millisecond))
			if left := c.clusterPIDs(); len(left) > 0 {
				t.Fatalf("cluster processes left after stop: %v", left)
			}
			if got := c.show("sm-manager.service", "Result"); got != "success" {
				t.Errorf("Result=%s", got)
			}
			if got, _, _ := c.run("systemctl", "is-active", "sm-manager.socket"); got != "active" {
				t.Errorf("sm-manager.socket is %q after stopping the service", got)
			}
			// PartOf=: sm-api went too, or its reconnection would have
			// started the manager again through the socket.
			if got, _, _ := c.run("systemctl", "is-active", "sm-api.service"); got != "inactive" {
				t.Errorf("sm-api.service is %q after stopping the manager", got)
			}
			time.Sleep(500 * time.Millisecond)
			if got, _, _ := c.run("systemctl", "is-active", "sm-manager.service"); got != "inactive" {
				t.Errorf("sm-manager.service is %q: something started it again", got)
			}
		}},
		{"stop past TimeoutStopSec", func(t *testing.T) {
			// Clusters that ignore QUIESCE and SIGTERM, and a shutdown.timeout
			// longer than TimeoutStopSec: systemd SIGKILLs the manager alone
			// (KillMode=process), and ExecStopPost must take the clusters.
			cfg := containerConfig("--ignore-quiesce")
			cfg.Shutdown.Timeout = config.Duration{Duration: time.Minute}
			c.installConfig(cfg)
			c.dropIn("sm-manager.service", "stop", "[Service]\nTimeoutStopSec=2s")
			c.must("systemctl", "start", "sm-manager.service")
			c.waitStatus("4/4 clusters ready, generation 1")
			// The socket too: clusters that outlive the manager reconnect, and
			// a connection to an active socket unit starts the service again.
			start := time.Now()
			c.run("systemctl", "stop", "sm-manager.socket", "sm-manager.service")
			took := time.Since(start)
			t.Logf("systemctl stop took %v", took.Round(time.Millisecond))
			if left := c.clusterPIDs(); len(left) > 0 {
				t.Fatalf("cluster processes left after a stop that timed out: %v", left)
			}
			if got := c.show("sm-manager.service", "Result"); got != "timeout" {
				t.Errorf("Result=%s, want timeout (did the manager not overrun?)", got)
			}
			if took > 15*time.Second {
				t.Errorf("stop took %v with TimeoutStopSec=2s", took)
			}
		}},
	} {
		ok := t.Run(step.name, func(t *testing.T) {
			c.t = t
			defer func() { c.t = nil }()
			step.run(t)
		})
		if !ok {
			return
		}
	}
}

// loadSummary is smclient -for's report.
type loadSummary struct {
	Sent       int            `json:"sent"`
	OK         int            `json:"ok"`
	Failed     int            `json:"failed"`
	Errors     map[string]int `json:"errors"`
	MaxStallMS int64          `json:"max_stall_ms"`
	SlowestMS  int64          `json:"slowest_ms"`
}

// TestRealSystemdReadopt: a crash of the manager alone (SIGKILL of the main
// process) must leave every cluster running; systemd restarts the manager,
// which re-adopts them, and requests route again with only those in flight at
// the kill failed.
func TestRealSystemdReadopt(t *testing.T) {
	t.Parallel()
	c := bootContainer(t)
	c.install(containerConfig())
	c.must("systemctl", "start", "sm-manager.socket", "sm-manager.service")
	c.waitStatus("4/4 clusters ready, generation 1")
	before := c.clusterPIDs()
	mainPID := c.show("sm-manager.service", "MainPID")
	if len(before) != 4 {
		t.Fatalf("cluster processes %v, want 4", before)
	}

	// A steady load through the kill.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	load := exec.CommandContext(ctx, c.tool, "exec", c.state, "/usr/local/bin/smclient", "-socket", "/run/sm/sm.sock", "-clusters", "4", "-for", "6s")
	var loadOut, loadErr bytes.Buffer
	load.Stdout, load.Stderr = &loadOut, &loadErr
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	c.must("systemctl", "kill", "--kill-whom=main", "-s", "KILL", "sm-manager.service")

	var now string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		now = c.show("sm-manager.service", "MainPID")
		active, _, _ := c.run("systemctl", "is-active", "sm-manager.service")
		if now != mainPID && now != "0" && active == "active" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("manager not restarted: MainPID %s, %s", now, active)
		}
	}
	if got := c.show("sm-manager.service", "NRestarts"); got != "1" {
		t.Errorf("NRestarts=%s, want 1", got)
	}
	if after := c.clusterPIDs(); !slices.Equal(after, before) {
		t.Errorf("cluster processes %v after the manager's crash, were %v: every one must survive", after, before)
	}

	if err := load.Wait(); err != nil {
		t.Fatalf("smclient -for: %v\n%s", err, loadErr.String())
	}
	var s loadSummary
	if err := json.Unmarshal(loadOut.Bytes(), &s); err != nil {
		t.Fatalf("smclient summary %q: %v", loadOut.String(), err)
	}
	t.Logf("load through the kill: %+v", s)
	// "disconnected" requests were never sent (the client had no connection);
	// lost ones are those sent and then failed: the one in flight at the kill.
	if lost := s.Failed - s.Errors["disconnected"]; lost > 1 {
		t.Errorf("%d requests lost, want at most the 1 in flight: %v", lost, s.Errors)
	}
	if s.SlowestMS > 3500 {
		t.Errorf("a request took %dms: failures must be errors, not hangs", s.SlowestMS)
	}
	c.waitStatus("4/4 clusters ready, generation 1")
	if got := c.smclient("-rounds", "2"); got != "ok 8" {
		t.Fatalf("smclient after re-adoption: %q", got)
	}
	if after := c.clusterPIDs(); !slices.Equal(after, before) {
		t.Errorf("cluster processes %v after re-adoption, were %v", after, before)
	}

	c.must("systemctl", "stop", "sm-manager.service")
	if left := c.clusterPIDs(); len(left) > 0 {
		t.Fatalf("cluster processes left after stop: %v", left)
	}
}
