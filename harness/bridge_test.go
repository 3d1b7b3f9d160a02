package harness

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/sm-supervisor/sm/harness/harnesstest"
	"github.com/sm-supervisor/sm/ipc"
)

// startBridge runs the harness in --exec mode with this test binary as the
// child, playing harnesstest.Bot.
func startBridge(t *testing.T, m *harnesstest.Manager, flags ...string) *running {
	t.Helper()
	args := append(flags, "--exec", "--", os.Args[0], botArg)
	return start(t, m, args...)
}

func TestBridgeRoundTrip(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 1000})
	r := startBridge(t, m, "--max-frame-bytes=4096")
	c := m.Accept(wait)
	if c.Register.Token != "tok-"+t.Name() || c.Register.PID != os.Getpid() {
		t.Fatalf("REGISTER = %s", ipc.Encode(c.Register))
	}

	// The bot heartbeats with the REGISTERED payload it was given.
	hb := c.ExpectOp(wait, ipc.OpHeartbeat)
	var reg map[string]any
	if err := json.Unmarshal(hb.Payload, &reg); err != nil || reg["heartbeat_interval_ms"] != 1000.0 {
		t.Fatalf("bot's heartbeat %s: the REGISTERED payload did not reach it", ipc.Encode(hb))
	}

	if echo := request(t, c, `{"op":"echo","id":"e1","payload":{"a": [1, 2],  "s":"\u00e9"}}`); string(echo.Payload) != `{"a": [1, 2],  "s":"\u00e9"}` {
		t.Errorf("echo through the bridge → %s", ipc.Encode(echo))
	}
	// A line that is not JSON and one over the frame limit are dropped; the
	// bridge goes on to relay the reply after them.
	if n := request(t, c, `{"op":"noise","id":"n1"}`); string(n.Payload) != `{"ok":true}` {
		t.Errorf("noise → %s", ipc.Encode(n))
	}
	if u := request(t, c, `{"op":"nope","id":"u1"}`); u.Error == nil || u.Error.Code != ipc.CodeUnknownOp {
		t.Errorf("unknown op → %s", ipc.Encode(u))
	}

	c.Send(`{"op":"QUIESCE"}`)
	c.ExpectOp(wait, ipc.OpQuiesced)
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after the child quiesced = %v", err)
	}
}

func TestBridgeExitStatus(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := startBridge(t, m)
	c := m.Accept(wait)
	c.ExpectOp(wait, ipc.OpHeartbeat)
	c.Send(`{"op":"exit","payload":{"code":5}}`)
	var exit *ExitError
	if err := r.result(t, wait); !errors.As(err, &exit) || exit.Code != 5 {
		t.Fatalf("Run = %v, want exit status 5", err)
	}
}

func TestBridgeCancelStopsChild(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := startBridge(t, m)
	c := m.Accept(wait)
	c.ExpectOp(wait, ipc.OpHeartbeat)
	r.cancel()
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}

func TestBridgeRefusedStopsChild(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{Register: harnesstest.Refusing(ipc.CodeForbidden)})
	r := startBridge(t, m)
	if err := r.result(t, wait); !errors.Is(err, ipc.ErrRegisterRefused) {
		t.Fatalf("Run = %v, want a refusal", err)
	}
}

func TestBridgeBadCommand(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := start(t, m, "--exec", "--", "/nonexistent/bot")
	if err := r.result(t, wait); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Run = %v, want a start error", err)
	}
}
