package harness

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/harness/harnesstest"
	"github.com/sm-supervisor/sm/ipc"
)

// startBridge runs the harness in --exec mode with this test binary as the
// child, playing harnesstest.Bot.
func startBridge(t *testing.T, m *harnesstest.Manager, flags ...string) *running {
	t.Helper()
	args := append(flags, "--exec", "--", os.Args[0], harnesstest.BotArg)
	return start(t, m, args...)
}

// startedBridge is startBridge on a default manager, once the child is up:
// registered through the bridge and heartbeating.
func startedBridge(t *testing.T) (*running, *harnesstest.Conn) {
	t.Helper()
	m := harnesstest.Start(t, harnesstest.Options{})
	r := startBridge(t, m)
	c := m.Accept(wait)
	c.ExpectOp(wait, ipc.OpHeartbeat)
	return r, c
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

	// A handoff crosses the bridge both ways unchanged: the bot hands back
	// its ACTIVATE's in its QUIESCED.
	c.Send(`{"op":"ACTIVATE","handoff":{"v":1, "shards":{"4":{"last":["ab"]}}}}`)
	c.Send(`{"op":"QUIESCE"}`)
	if q := c.ExpectOp(wait, ipc.OpQuiesced); string(q.Handoff) != `{"v":1, "shards":{"4":{"last":["ab"]}}}` {
		t.Errorf("QUIESCED %s: the handoff did not cross the bridge unchanged", ipc.Encode(q))
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after the child quiesced = %v", err)
	}
}

func TestBridgeExitStatus(t *testing.T) {
	t.Parallel()
	r, c := startedBridge(t)
	c.Send(`{"op":"exit","payload":{"code":5}}`)
	var exit *ExitError
	if err := r.result(t, wait); !errors.As(err, &exit) || exit.Code != 5 {
		t.Fatalf("Run = %v, want exit status 5", err)
	}
}

func TestBridgeCancelStopsChild(t *testing.T) {
	t.Parallel()
	r, _ := startedBridge(t)
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

func TestBridgeIdentifyAndResume(t *testing.T) {
	t.Parallel()
	given := []discord.ResumeState{{Shard: 4, SessionID: "0123456789abcdef0123456789abcdef", Seq: 42, ResumeURL: "wss://gateway.sim.invalid/?shard=4"}}
	// Shard 6's slot never comes: the test drops the connection instead.
	identify := func(f *ipc.Frame) *ipc.Frame {
		if *f.Shard == 6 {
			return nil
		}
		return harnesstest.Grant(f)
	}
	m := harnesstest.Start(t, harnesstest.Options{Identify: identify, Resume: given})
	r := startBridge(t, m)
	c := m.Accept(wait)

	// The child got the whole REGISTER reply (the bot heartbeats with it as
	// payload), and the resume it reports (the reply's, echoed) reaches the
	// manager unchanged.
	hb := c.ExpectOp(wait, ipc.OpHeartbeat)
	var reg struct {
		Identify map[string]any        `json:"identify"`
		Resume   []discord.ResumeState `json:"resume"`
	}
	if err := json.Unmarshal(hb.Payload, &reg); err != nil || reg.Identify["gate"] != true || len(reg.Resume) != 1 || reg.Resume[0] != given[0] {
		t.Fatalf("bot's heartbeat %s: the REGISTERED payload lacks identify or resume", ipc.Encode(hb))
	}
	wantResume := `[{"shard":4,"session_id":"0123456789abcdef0123456789abcdef","seq":42,"resume_url":"wss://gateway.sim.invalid/?shard=4"}]`
	if string(hb.Resume) != wantResume {
		t.Fatalf("HEARTBEAT resume %s, want %s", hb.Resume, wantResume)
	}

	// The child's own IDENTIFY reaches the manager as the child wrote it, and
	// the grant comes back to the child.
	c.Send(`{"op":"identify","id":"i1","payload":{"shard":5}}`)
	ask := c.Expect(wait, "IDENTIFY", func(f *ipc.Frame) bool { return f.Op == ipc.OpIdentify })
	if string(ipc.Encode(ask)) != `{"op":"IDENTIFY","id":"bot-i1","shard":5}` {
		t.Fatalf("the child's IDENTIFY reached the manager as %s", ipc.Encode(ask))
	}
	if g := c.ExpectReply(wait, "i1"); g.Error != nil || string(g.Payload) != `{"granted":true,"shard":5,"bucket":0}` {
		t.Fatalf("the child got %s for its IDENTIFY", ipc.Encode(g))
	}

	// An IDENTIFY still waiting when the connection ends is answered
	// unavailable before the next REGISTERED, so the child asks again.
	c.Send(`{"op":"identify","id":"i2","payload":{"shard":6}}`)
	c.Expect(wait, "IDENTIFY of shard 6", func(f *ipc.Frame) bool { return f.Op == ipc.OpIdentify && *f.Shard == 6 })
	c.Drop()
	c2 := m.Accept(wait)
	lost := c2.ExpectReply(wait, "i2") // the bot passes on what it got
	if lost.Error == nil || lost.Error.Code != ipc.CodeUnavailable {
		t.Fatalf("the child got %s for an IDENTIFY whose connection was lost", ipc.Encode(lost))
	}
	c2.ExpectOp(wait, ipc.OpHeartbeat) // after the new REGISTERED

	c2.Send(`{"op":"QUIESCE"}`)
	if q := c2.ExpectOp(wait, ipc.OpQuiesced); string(q.Resume) != wantResume {
		t.Fatalf("QUIESCED resume %s, want %s", q.Resume, wantResume)
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after the child quiesced = %v", err)
	}
}

// An IDENTIFY_CANCEL from the child reaches the manager as written, and both
// answers come back to the child: cancelled for the withdrawn IDENTIFY, then
// the count for the IDENTIFY_CANCEL.
func TestBridgeIdentifyCancel(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{Identify: harnesstest.Manual, IdentifyCancel: harnesstest.Manual})
	r := startBridge(t, m)
	c := m.Accept(wait)
	c.ExpectOp(wait, ipc.OpHeartbeat)

	c.Send(`{"op":"identify","id":"i1","payload":{"shard":3}}`)
	ask := c.Expect(wait, "IDENTIFY", func(f *ipc.Frame) bool { return f.Op == ipc.OpIdentify })
	c.Send(`{"op":"identify_cancel","id":"c1","payload":{"shard":3}}`)
	cancel := c.Expect(wait, "IDENTIFY_CANCEL", func(f *ipc.Frame) bool { return f.Op == ipc.OpIdentifyCancel })
	if string(ipc.Encode(cancel)) != `{"op":"IDENTIFY_CANCEL","id":"bot-c1","shard":3}` {
		t.Fatalf("the child's IDENTIFY_CANCEL reached the manager as %s", ipc.Encode(cancel))
	}
	c.SendFrame(ipc.ReplyError(ask.ID, ipc.Errorf(ipc.CodeCancelled, "withdrawn")))
	c.SendFrame(ipc.Reply(cancel.ID, json.RawMessage(`{"withdrawn":1}`)))
	if g := c.ExpectReply(wait, "i1"); g.Error == nil || g.Error.Code != ipc.CodeCancelled {
		t.Fatalf("the child got %s for its withdrawn IDENTIFY", ipc.Encode(g))
	}
	if w := c.ExpectReply(wait, "c1"); w.Error != nil || string(w.Payload) != `{"withdrawn":1}` {
		t.Fatalf("the child got %s for its IDENTIFY_CANCEL", ipc.Encode(w))
	}
	c.Send(`{"op":"QUIESCE"}`)
	c.ExpectOp(wait, ipc.OpQuiesced)
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run after the child quiesced = %v", err)
	}
}
