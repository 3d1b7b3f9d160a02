package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/harness/harnesstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// The built cluster-harness runs this test binary as its --exec child
// (harnesstest.BotArg), and race-built harnesses exit often: see BotMain.
func TestMain(m *testing.M) {
	harnesstest.BotMain()
	build := []string{"."}
	if raceEnabled {
		build = []string{"-race", "."}
	}
	testenv.Main(m, build...)
}

const wait = 5 * time.Second

// harnessProc is a running cluster-harness binary.
type harnessProc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
	err    error
}

// startHarness runs the binary as cluster 1 generation 3 (shards 2..3 of 4)
// of m, with extra environment variables and args.
func startHarness(t *testing.T, m *harnesstest.Manager, env []string, args ...string) *harnessProc {
	t.Helper()
	cmd := exec.Command(testenv.Bin("cluster-harness"), args...)
	cmd.Env = append(os.Environ(),
		"SM_SOCKET="+m.Path, "SM_CLUSTER=1", "SM_GENERATION=3",
		"SM_SHARD_FIRST=2", "SM_SHARD_LAST=3", "SM_TOTAL_SHARDS=4", "SM_TOKEN=secret-"+t.Name())
	cmd.Env = append(cmd.Env, env...)
	p := &harnessProc{cmd: cmd, stderr: new(bytes.Buffer), done: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.WaitDelay = time.Second // a stray grandchild must not hold Wait on stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("cluster-harness stderr:\n%s", p.stderr)
		}
	})
	return p
}

// exitCode waits for the process and returns its exit status.
func (p *harnessProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(wait):
		t.Fatalf("cluster-harness did not exit within %v", wait)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	default:
		t.Fatalf("wait: %v", p.err)
		return -1
	}
}

func request(t *testing.T, c *harnesstest.Conn, id, raw string) *ipc.Frame {
	t.Helper()
	c.Send(raw)
	return c.ExpectReply(wait, id)
}

func TestExecBridge(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	p := startHarness(t, m, nil, "--exec", "--", os.Args[0], harnesstest.BotArg)
	c := m.Accept(wait)
	if c.Register.Token != "secret-"+t.Name() || *c.Register.Cluster != 1 || *c.Register.Generation != 3 || c.Register.PID != p.cmd.Process.Pid {
		t.Fatalf("REGISTER = %s", ipc.Encode(c.Register))
	}
	c.ExpectOp(wait, ipc.OpHeartbeat)

	if r := request(t, c, "e", `{"op":"echo","id":"e","payload":{"a": [1, 2]}}`); string(r.Payload) != `{"a": [1, 2]}` {
		t.Errorf("echo → %s", ipc.Encode(r))
	}
	// The child sees its cluster but never the token.
	if r := request(t, c, "env", `{"op":"env","id":"env"}`); string(r.Payload) != `{"cluster":"1","token":""}` {
		t.Errorf("child's environment: %s", r.Payload)
	}

	c.Send(`{"op":"QUIESCE"}`)
	c.ExpectOp(wait, ipc.OpQuiesced)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after the child quiesced", code)
	}
}

func TestSimulateSIGTERMQuiesces(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 50})
	p := startHarness(t, m, nil, "--connect-delay=0", "--log-format=json")
	c := m.Accept(wait)
	c.Expect(wait, "HEARTBEAT ready:true", func(f *ipc.Frame) bool { return f.Op == ipc.OpHeartbeat && *f.Ready })
	if r := request(t, c, "p", `{"op":"ping","id":"p"}`); !bytes.Contains(r.Payload, []byte(`"pong":true`)) {
		t.Fatalf("ping → %s", ipc.Encode(r))
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	c.ExpectOp(wait, ipc.OpQuiesced)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM", code)
	}
	if !strings.Contains(p.stderr.String(), `"cluster":1,"generation":3`) {
		t.Errorf("JSON logs lack cluster and generation keys: %s", p.stderr)
	}
}

// TestExitStatus: how the binary's exit status reports the harness's end,
// with what its stderr must say.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		opts       harnesstest.Options
		env, args  []string
		want       int
		wantStderr string
	}{
		{name: "exec passes the child's status", args: []string{"--exec", "--", "sh", "-c", "echo from-child >&2; exit 4"},
			want: 4, wantStderr: "from-child"},
		{name: "exit-on-start from SM_HARNESS_FLAGS", env: []string{"SM_HARNESS_FLAGS=--exit-on-start 7"}, want: 7},
		{name: "crash-after for this cluster only", env: []string{"SM_HARNESS_FLAGS_1=--crash-after 100ms", "SM_HARNESS_FLAGS_0=--exit-on-start 9"},
			want: 3},
		{name: "register refused", opts: harnesstest.Options{Register: harnesstest.Refusing(ipc.CodeForbidden)},
			want: 1, wantStderr: "register refused"},
		{name: "bad environment", env: []string{"SM_TOTAL_SHARDS=x"}, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := harnesstest.Start(t, tc.opts)
			p := startHarness(t, m, tc.env, tc.args...)
			if code := p.exitCode(t); code != tc.want {
				t.Fatalf("exit status %d, want %d", code, tc.want)
			}
			if !strings.Contains(p.stderr.String(), tc.wantStderr) {
				t.Errorf("stderr does not say %q: %s", tc.wantStderr, p.stderr)
			}
		})
	}
}

func TestIgnoreQuiesceNeedsSIGKILL(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	p := startHarness(t, m, nil, "--ignore-quiesce", "--connect-delay=0")
	c := m.Accept(wait)
	c.Send(`{"op":"QUIESCE"}`)
	p.cmd.Process.Signal(syscall.SIGTERM)
	if r := request(t, c, "p", `{"op":"ping","id":"p"}`); r.Error != nil {
		t.Fatalf("ping after QUIESCE and SIGTERM: %v", r.Error)
	}
	p.cmd.Process.Kill()
	if code := p.exitCode(t); code != -1 {
		t.Fatalf("exit status %d, want death by SIGKILL", code)
	}
}

func TestExecChildDiesWithHarness(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := startHarness(t, m, nil, "--exec", "--", "sh", "-c", `echo $$ > "$0"; exec sleep 30`, pidFile)
	m.Accept(wait)
	var pid string
	for deadline := time.Now().Add(wait); pid == ""; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		pid = strings.TrimSpace(string(b))
		if time.Now().After(deadline) {
			t.Fatal("the child never wrote its pid")
		}
	}
	p.cmd.Process.Kill() // the harness alone, as a careless supervisor would
	p.exitCode(t)
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		// Gone, or a zombie waiting for init to reap it.
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(atoi(t, pid), syscall.SIGKILL)
			t.Fatalf("child %s outlived the harness: %s", pid, stat)
		}
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSimulateIdentifyGateAndResume(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		asks []int
	)
	identify := func(f *ipc.Frame) *ipc.Frame {
		mu.Lock()
		defer mu.Unlock()
		asks = append(asks, *f.Shard)
		if len(asks) == 1 { // the budget governor refuses once
			return harnesstest.Deny(f, ipc.CodeBudgetRefused)
		}
		return harnesstest.Grant(f)
	}
	resume := []discord.ResumeState{{Shard: 2, SessionID: "0123456789abcdef0123456789abcdef", Seq: 42, ResumeURL: "wss://gateway.sim.invalid/?shard=2"}}
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 50, Identify: identify, Resume: resume})
	p := startHarness(t, m, []string{"SM_HARNESS_FLAGS=--identify-retry=50ms"}, "--connect-delay=0")
	c := m.Accept(wait)
	hb := c.Expect(wait, "HEARTBEAT ready:true", func(f *ipc.Frame) bool { return f.Op == ipc.OpHeartbeat && *f.Ready })
	for _, want := range []string{`"id":2,"status":"ready"`, `"session":"resumed"`, `"id":3,"status":"ready"`, `"session":"identified"`, `"identifies":1,"resumes":1`} {
		if !bytes.Contains(hb.Payload, []byte(want)) {
			t.Errorf("heartbeat stats lack %s: %s", want, hb.Payload)
		}
	}
	if !bytes.Contains(hb.Resume, []byte(`{"shard":2,"session_id":"0123456789abcdef0123456789abcdef","seq":42,`)) || !bytes.Contains(hb.Resume, []byte(`"shard":3`)) {
		t.Errorf("heartbeat resume %s", hb.Resume)
	}
	mu.Lock()
	if fmt.Sprint(asks) != "[3 3]" {
		t.Errorf("asked the gate for shards %v, want 3 twice (refused, then granted)", asks)
	}
	mu.Unlock()
	p.cmd.Process.Signal(syscall.SIGTERM)
	if q := c.ExpectOp(wait, ipc.OpQuiesced); !bytes.Contains(q.Resume, []byte(`"shard":3`)) {
		t.Errorf("QUIESCED resume %s", q.Resume)
	}
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM", code)
	}
}
