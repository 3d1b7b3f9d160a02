package main_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestMeshDemoScript runs scripts/mesh-demo.sh twice: with SM_DEMO_ONCE it
// builds everything with the Go toolchain, starts a NATS server and three
// managers, prints the fleet (three hosts of four clusters, all twelve held)
// and exits 0; without it, it keeps showing the fleet until SIGINT (Ctrl-C),
// which stops every process it started.
func TestMeshDemoScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../../scripts/mesh-demo.sh")
	cmd.Env = append(cmd.Environ(), "SM_DEMO_ONCE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mesh-demo.sh: %v\n%s", err, out)
	}
	checkFleet(t, string(out))
	checkGone(t, string(out))

	// Ctrl-C: everything it started stops.
	cmd = exec.CommandContext(ctx, "../../scripts/mesh-demo.sh")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var buf testenv.Buffer
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var wg sync.WaitGroup
	shown := make(chan struct{})
	wg.Go(func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			buf.Write([]byte(sc.Text() + "\n"))
			if strings.HasPrefix(sc.Text(), "3 hosts, 12 of 12 clusters held") {
				once.Do(func() { close(shown) })
			}
		}
	})
	select {
	case <-shown:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("the demo showed no fleet:\n%s", buf.String())
	}
	// As a terminal's Ctrl-C does: SIGINT to the foreground process group.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("the demo did not stop within 30 s of SIGINT:\n%s", buf.String())
	}
	wg.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("after SIGINT the demo ended with %v, want exit status 130:\n%s", err, buf.String())
	}
	checkGone(t, buf.String())
}

// checkFleet checks the demo's fleet table: gw-1, gw-2 and gw-3, four
// clusters each, capacity 6, every cluster held.
func checkFleet(t *testing.T, out string) {
	t.Helper()
	for _, host := range []string{"gw-1 (this host)", "gw-2", "gw-3"} {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(host) + `\s+6\s+4\s+\d+ \d+ \d+ \d+\s+\S+`)
		if !re.MatchString(out) {
			t.Fatalf("no row for %s with 4 of capacity 6 in:\n%s", host, out)
		}
	}
	if !strings.Contains(out, "3 hosts, 12 of 12 clusters held, 0 unplaced") {
		t.Fatalf("not every cluster held:\n%s", out)
	}
	t.Logf("the demo's fleet:\n%s", out[strings.Index(out, "STATUS hosts"):])
}

// checkGone checks that every process the demo printed a pid of has ended.
func checkGone(t *testing.T, out string) {
	t.Helper()
	re := regexp.MustCompile(`pid (\d+)`)
	ms := re.FindAllStringSubmatch(out, -1)
	if len(ms) != 4 {
		t.Fatalf("the demo printed %d pids, want 4 (nats-server and 3 managers):\n%s", len(ms), out)
	}
	for _, m := range ms {
		pid, _ := strconv.Atoi(m[1])
		testenv.WaitFor(t, 10*time.Second, "process "+m[1]+" gone", func() bool { return syscall.Kill(pid, 0) != nil })
	}
}
