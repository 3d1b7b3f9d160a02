package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/harness/harnesstest"
	"github.com/sm-supervisor/sm/internal/activations"
	"github.com/sm-supervisor/sm/ipc"
)

const wait = 5 * time.Second // generous bound on things that take milliseconds

// running is a harness Run going on in the test process.
type running struct {
	done    chan error
	cancel  context.CancelFunc
	signals chan os.Signal
}

// start runs the harness in-process against m, as cluster 1 generation 7 with
// shards 4..6 of 8, with args as its command line.
func start(t *testing.T, m *harnesstest.Manager, args ...string) *running {
	t.Helper()
	return startEnv(t, m, goodEnv(), args...)
}

// startEnv is start with the environment env (SM_SOCKET and SM_TOKEN set
// for m).
func startEnv(t *testing.T, m *harnesstest.Manager, env map[string]string, args ...string) *running {
	t.Helper()
	env[EnvSocket] = m.Path
	env[EnvToken] = "tok-" + t.Name()
	cfg, err := ParseArgs("cluster-harness", args, mapEnv(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = NewLogger(t.Output(), "text", slog.LevelDebug, cfg.Env)
	cfg.Stderr = t.Output()
	cfg.Backoff.Min, cfg.Backoff.Max = 10*time.Millisecond, 50*time.Millisecond
	r := &running{done: make(chan error, 1), signals: make(chan os.Signal, 1)}
	cfg.Signals = r.signals
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// startAccepted is start against a manager with default options, once the
// manager has accepted the harness's connection.
func startAccepted(t *testing.T, args ...string) (*running, *harnesstest.Conn) {
	t.Helper()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := start(t, m, args...)
	return r, m.Accept(wait)
}

// result waits for Run to return.
func (r *running) result(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(within):
		t.Fatalf("Run did not return within %v", within)
		return nil
	}
}

func isHeartbeat(ready bool) func(*ipc.Frame) bool {
	return func(f *ipc.Frame) bool { return f.Op == ipc.OpHeartbeat && f.Ready != nil && *f.Ready == ready }
}

func decodeStats(t *testing.T, payload json.RawMessage) Stats {
	t.Helper()
	var s Stats
	if err := json.Unmarshal(payload, &s); err != nil {
		t.Fatalf("stats %s: %v", payload, err)
	}
	return s
}

// request sends a raw request frame and returns its REPLY.
func request(t *testing.T, c *harnesstest.Conn, raw string) *ipc.Frame {
	t.Helper()
	f, err := ipc.Decode([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	c.Send(raw)
	return c.ExpectReply(wait, f.ID)
}

// barrier returns once the harness has read every frame sent before it: a
// structural op with an id is answered (unknown_op) on the read goroutine
// itself, after the frames before it were taken in, delayed ops included.
func barrier(t *testing.T, c *harnesstest.Conn) {
	t.Helper()
	if r := request(t, c, `{"op":"HEARTBEAT","id":"barrier"}`); r.Error == nil || r.Error.Code != ipc.CodeUnknownOp {
		t.Fatalf("barrier → %s", ipc.Encode(r))
	}
}

func stats(t *testing.T, c *harnesstest.Conn, id string) Stats {
	t.Helper()
	r := request(t, c, `{"op":"stats","id":"`+id+`"}`)
	if r.Error != nil {
		t.Fatalf("stats: %v", r.Error)
	}
	return decodeStats(t, r.Payload)
}

func TestSimLifecycle(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 30})
	r := start(t, m, "--connect-delay=20ms", "--event-interval=2ms")
	c := m.Accept(wait)

	reg := c.Register
	if reg.Role != ipc.RoleCluster || reg.Cluster == nil || *reg.Cluster != 1 || reg.Generation == nil || *reg.Generation != 7 ||
		reg.Token != "tok-"+t.Name() || reg.PID != os.Getpid() {
		t.Fatalf("REGISTER = %s", ipc.Encode(reg))
	}

	// The first heartbeat comes at once, not ready; then ready once all three
	// shards have connected.
	first, err := c.Next(wait)
	if err != nil || !isHeartbeat(false)(first) {
		t.Fatalf("first frame %s, %v; want HEARTBEAT ready:false", ipc.Encode(first), err)
	}
	if s := decodeStats(t, first.Payload); len(s.Shards) != 3 || s.Shards[0].ID != 4 || s.Shards[2].Status != ShardConnecting {
		t.Fatalf("first heartbeat stats %+v", s)
	}
	hb := c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	if s := decodeStats(t, hb.Payload); s.Shards[2].Status != ShardReady || s.Guilds == 0 || s.MemoryBytes == 0 {
		t.Fatalf("ready heartbeat stats %+v", s)
	}

	// Business ops.
	pong := request(t, c, `{"op":"ping","id":"p1"}`)
	if want := fmt.Sprintf(`{"pong":true,"cluster":1,"generation":7,"pid":%d}`, os.Getpid()); string(pong.Payload) != want {
		t.Errorf("ping → %s, want %s", ipc.Encode(pong), want)
	}
	if echo := request(t, c, `{"op":"echo","id":"e1","payload":{"a": [1, 2]}}`); string(echo.Payload) != `{"a": [1, 2]}` {
		t.Errorf("echo → %s", ipc.Encode(echo))
	}
	if echo := request(t, c, `{"op":"echo","id":"e2"}`); string(echo.Payload) != `null` {
		t.Errorf("echo with no payload → %s", ipc.Encode(echo))
	}
	if e := request(t, c, `{"op":"nope","id":"u1","payload":[1]}`); e.Error == nil || e.Error.Code != ipc.CodeUnknownOp {
		t.Errorf("unknown op → %s", ipc.Encode(e))
	}
	gi := request(t, c, `{"op":"guild.info","id":"g1","payload":{"guild_id":"`+strconv.FormatUint(guildOnShard(5, 8), 10)+`"}}`)
	if !bytes.Contains(gi.Payload, []byte(`"shard":5,"cluster":1,"owned":true`)) {
		t.Errorf("guild.info → %s", ipc.Encode(gi))
	}
	c.Send(`{"op":"ping"}`) // no id: handled, not answered

	// Dispatches wait in the buffer until ACTIVATE, then flow.
	before := stats(t, c, "s1")
	if before.Active || before.EventsBuffered == 0 || before.EventsDispatched != 0 {
		t.Fatalf("before ACTIVATE: %+v", before)
	}
	c.Send(`{"op":"ACTIVATE"}`)
	after := stats(t, c, "s2")
	if !after.Active || after.EventsDispatched < before.EventsBuffered {
		t.Fatalf("after ACTIVATE: %+v (before: %+v)", after, before)
	}
	if after.RequestsHandled < 7 {
		t.Errorf("requests_handled = %d, want at least 7", after.RequestsHandled)
	}

	// The manager goes away: the harness registers again with the same token,
	// and keeps its state (ready, active).
	c.Drop()
	c2 := m.Accept(wait)
	if c2.Register.Token != reg.Token || c2.Register.PID != reg.PID {
		t.Fatalf("re-REGISTER = %s", ipc.Encode(c2.Register))
	}
	hb = c2.ExpectOp(wait, ipc.OpHeartbeat)
	if !*hb.Ready || !decodeStats(t, hb.Payload).Active {
		t.Fatalf("heartbeat after reconnect: %s", ipc.Encode(hb))
	}
	if p := request(t, c2, `{"op":"ping","id":"p2"}`); p.Error != nil {
		t.Fatalf("ping after reconnect: %v", p.Error)
	}

	// QUIESCE: QUIESCED, flushed to the socket, then Run returns.
	c2.Send(`{"op":"QUIESCE"}`)
	c2.ExpectOp(wait, ipc.OpQuiesced)
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after QUIESCE = %v", err)
	}
}

// replies collects REPLY and QUIESCED frames, skipping heartbeats, until QUIESCED.
func untilQuiesced(t *testing.T, c *harnesstest.Conn) []string {
	t.Helper()
	var got []string
	for {
		f := c.Expect(wait, "REPLY or QUIESCED", func(f *ipc.Frame) bool { return f.Op != ipc.OpHeartbeat })
		switch {
		case f.Op == ipc.OpQuiesced:
			return append(got, f.Op)
		case f.Error != nil:
			got = append(got, f.ID+":"+f.Error.Code)
		default:
			got = append(got, f.ID+":ok")
		}
	}
}

func TestSimQuiesceFinishesInFlight(t *testing.T) {
	t.Parallel()
	r, c := startAccepted(t, "--connect-delay=0", "--op-delay=300ms")
	// One connection, one reader: slow is in flight before QUIESCE is read.
	c.Send(`{"op":"ping","id":"slow"}`)
	c.Send(`{"op":"QUIESCE"}`)
	c.Send(`{"op":"ping","id":"late"}`)

	got := untilQuiesced(t, c)
	if want := []string{"late:unavailable", "slow:ok", "QUIESCED"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("frames %q, want %q", got, want)
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestSimSignalQuiesces(t *testing.T) {
	t.Parallel()
	r, c := startAccepted(t, "--connect-delay=0", "--op-delay=100ms")
	c.Send(`{"op":"ping","id":"inflight"}`)
	barrier(t, c)
	r.signals <- syscall.SIGTERM
	if got := untilQuiesced(t, c); fmt.Sprint(got) != "[inflight:ok QUIESCED]" {
		t.Fatalf("frames %q", got)
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestSimSignalShutdownIsBounded(t *testing.T) {
	t.Parallel()
	r, c := startAccepted(t, "--connect-delay=0", "--op-delay=1h", "--shutdown-timeout=200ms")
	c.Send(`{"op":"ping","id":"forever"}`)
	barrier(t, c)
	began := time.Now()
	r.signals <- syscall.SIGINT
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if d := time.Since(began); d < 200*time.Millisecond || d > 3*time.Second {
		t.Errorf("shutdown took %v, want about 200ms", d)
	}
}

func TestSimFailReady(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20})
	start(t, m, "--connect-delay=5ms", "--fail-ready")
	c := m.Accept(wait)
	// Wait until all the shards that will connect have (the first two of
	// three), then for several more heartbeats: none may say ready.
	notReady := func(f *ipc.Frame) Stats {
		if *f.Ready {
			t.Fatalf("--fail-ready sent %s", ipc.Encode(f))
		}
		return decodeStats(t, f.Payload)
	}
	for {
		if s := notReady(c.ExpectOp(wait, ipc.OpHeartbeat)); s.Shards[1].Status == ShardReady {
			break
		}
	}
	for range 8 {
		if s := notReady(c.ExpectOp(wait, ipc.OpHeartbeat)); s.Shards[2].Status != ShardConnecting {
			t.Fatalf("the last shard connected: %+v", s)
		}
	}
}

func TestSimCrashAfter(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := start(t, m, "--crash-after=100ms")
	m.Accept(wait)
	var exit *ExitError
	if err := r.result(t, wait); !errors.As(err, &exit) || exit.Code != CrashExitCode {
		t.Fatalf("Run = %v, want exit status %d", err, CrashExitCode)
	}
}

func TestSimHangAfter(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20})
	began := time.Now()
	r := start(t, m, "--connect-delay=0", "--hang-after=100ms")
	c := m.Accept(wait)
	c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	// The heartbeats stop: a gap of many intervals, after the hang is due.
	for {
		_, err := c.Next(250 * time.Millisecond)
		if errors.Is(err, harnesstest.ErrNoFrame) && time.Since(began) > 100*time.Millisecond {
			break
		}
	}
	c.Send(`{"op":"ping","id":"p"}`)
	c.Send(`{"op":"HEARTBEAT","id":"structural"}`)
	c.Send(`{"op":"QUIESCE"}`)
	if f, err := c.Next(300 * time.Millisecond); err == nil {
		t.Fatalf("a hung harness sent %s", ipc.Encode(f))
	}
	r.signals <- syscall.SIGTERM
	var exit *ExitError
	if err := r.result(t, wait); !errors.As(err, &exit) || exit.Code != 128+int(syscall.SIGTERM) {
		t.Fatalf("Run = %v, want death by SIGTERM", err)
	}
}

func TestSimIgnoreQuiesce(t *testing.T) {
	t.Parallel()
	r, c := startAccepted(t, "--connect-delay=0", "--ignore-quiesce")
	c.Send(`{"op":"QUIESCE"}`)
	r.signals <- syscall.SIGTERM
	if p := request(t, c, `{"op":"ping","id":"p"}`); p.Error != nil {
		t.Fatalf("ping after QUIESCE and SIGTERM: %v", p.Error)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v; only a kill may end it", err)
	case <-time.After(100 * time.Millisecond):
	}
	r.cancel()
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}

func TestExitOnStart(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := start(t, m, "--exit-on-start=7")
	var exit *ExitError
	if err := r.result(t, wait); !errors.As(err, &exit) || exit.Code != 7 {
		t.Fatalf("Run = %v, want exit status 7", err)
	}
}

func TestRegisterRefused(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{Register: harnesstest.Refusing(ipc.CodeForbidden)})
	r := start(t, m)
	err := r.result(t, wait)
	var exit *ExitError
	if !errors.Is(err, ipc.ErrRegisterRefused) || errors.As(err, &exit) {
		t.Fatalf("Run = %v, want a refusal", err)
	}
}

func TestCancelIsCleanStop(t *testing.T) {
	t.Parallel()
	r, c := startAccepted(t, "--op-delay=1h")
	c.Send(`{"op":"ping","id":"p"}`)
	barrier(t, c)
	r.cancel()
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}

// TestSimActiveOnReRegister: a process whose ACTIVATE its old manager queued
// but never delivered is told active:true by the new manager's REGISTER reply,
// and no second ACTIVATE comes; it must start dispatching on the reply alone.
func TestSimActiveOnReRegister(t *testing.T) {
	t.Parallel()
	var regs atomic.Int32
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 30, Register: func(reg *ipc.Frame) *ipc.Frame {
		active := regs.Add(1) > 1 // the second manager's record says activated
		return harnesstest.AcceptingWith(30, map[string]any{"active": active})(reg)
	}})
	start(t, m, "--connect-delay=5ms", "--event-interval=2ms")
	c := m.Accept(wait)
	c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	if s := stats(t, c, "s1"); s.Active || s.EventsDispatched != 0 {
		t.Fatalf("before any ACTIVATE: %+v", s)
	}
	c.Drop()
	c2 := m.Accept(wait)
	deadline := time.Now().Add(wait)
	for {
		s := stats(t, c2, "s2")
		if s.Active && s.EventsDispatched > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a REGISTER reply with active:true: %+v, want active and dispatching", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sim.grow allocates and holds memory, which the heap figures show; sim.lag
// sets the lag the heartbeats report. Bad payloads get bad_request.
func TestSimGrowAndLag(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20})
	start(t, m)
	c := m.Accept(wait)
	before := stats(t, c, "s0")
	if before.LoopLagMS != 0 || before.HeapBytes == 0 {
		t.Fatalf("before: %+v", before)
	}
	g := request(t, c, `{"op":"sim.grow","id":"g1","payload":{"bytes":67108864}}`)
	if g.Error != nil || string(g.Payload) != `{"ballast_bytes":67108864}` {
		t.Fatalf("sim.grow → %s", ipc.Encode(g))
	}
	if after := stats(t, c, "s1"); after.HeapBytes < 64<<20 {
		t.Errorf("heap %d after growing 64 MiB", after.HeapBytes)
	}
	if l := request(t, c, `{"op":"sim.lag","id":"l1","payload":{"ms":750}}`); l.Error != nil || string(l.Payload) != `{"loop_lag_ms":750}` {
		t.Fatalf("sim.lag → %s", ipc.Encode(l))
	}
	hb := c.Expect(wait, "a heartbeat with the lag", func(f *ipc.Frame) bool {
		return f.Op == ipc.OpHeartbeat && bytes.Contains(f.Payload, []byte(`"loop_lag_ms":750`))
	})
	if s := decodeStats(t, hb.Payload); s.HeapBytes < 64<<20 {
		t.Errorf("heartbeat heap_bytes %d", s.HeapBytes)
	}
	if g := request(t, c, `{"op":"sim.grow","id":"g2","payload":{"bytes":0}}`); string(g.Payload) != `{"ballast_bytes":0}` {
		t.Fatalf("sim.grow 0 → %s", ipc.Encode(g))
	}
	for i, bad := range []string{
		`{"op":"sim.grow","id":"b1"}`,
		`{"op":"sim.grow","id":"b2","payload":{"bytes":-1}}`,
		`{"op":"sim.grow","id":"b3","payload":{"bytes":1e12}}`,
		`{"op":"sim.lag","id":"b4","payload":{"ms":"x"}}`,
	} {
		if r := request(t, c, bad); r.Error == nil || r.Error.Code != CodeBadRequest {
			t.Errorf("bad %d → %s", i, ipc.Encode(r))
		}
	}
}

// TestSimRecord: with --record the bot appends its activation and its exit,
// named by SM_HOST_ID (else the hostname), cluster, generation and pid; two
// processes sharing the file leave both their lines, and the check over
// them finds the second activated while the first still was.
func TestSimRecord(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/record.jsonl"
	m := harnesstest.Start(t, harnesstest.Options{})
	env := goodEnv()
	env[EnvHostID] = "gw-1"
	r1 := startEnv(t, m, env, "--connect-delay=0", "--record="+path)
	c1 := m.Accept(wait)
	r2 := start(t, m, "--connect-delay=0", "--record="+path) // no SM_HOST_ID: the hostname
	c2 := m.Accept(wait)
	c1.Send(`{"op":"ACTIVATE"}`)
	c1.Send(`{"op":"ACTIVATE"}`) // a second ACTIVATE records nothing
	barrier(t, c1)
	c2.Send(`{"op":"ACTIVATE"}`)
	barrier(t, c2)
	c1.Send(`{"op":"QUIESCE"}`)
	if err := r1.result(t, wait); err != nil {
		t.Fatal(err)
	}
	r2.cancel()
	if err := r2.result(t, wait); err != nil {
		t.Fatal(err)
	}
	recs, err := activations.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	var got []string
	for _, r := range recs {
		if r.Cluster != 1 || r.Generation != 7 || r.PID != os.Getpid() || r.UnixNano == 0 {
			t.Errorf("record %+v: want cluster 1 generation 7 pid %d and a time", r, os.Getpid())
		}
		got = append(got, r.Host+":"+r.Event)
	}
	// r1 activates before r2 (barriers), and exits before r2 (QUIESCE first).
	want := []string{"gw-1:activate", host + ":activate", "gw-1:exit", host + ":exit"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	if o := activations.Check(recs); len(o) != 1 || o[0].A.Host != "gw-1" || o[0].B.Host != host {
		t.Fatalf("Check = %v, want the overlap of the two", o)
	}
}
