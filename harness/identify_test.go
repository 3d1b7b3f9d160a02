package harness

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/harness/harnesstest"
	"github.com/sm-supervisor/sm/ipc"
)

func isIdentify(f *ipc.Frame) bool { return f.Op == ipc.OpIdentify }

// fakeGate is an Options.Identify that records the shards asked for and
// grants at once, unless deny names a code for the n-th ask (from 0) of a
// shard.
type fakeGate struct {
	deny func(shard, n int) string

	mu   sync.Mutex
	asks []int
}

func (g *fakeGate) answer(f *ipc.Frame) *ipc.Frame {
	g.mu.Lock()
	defer g.mu.Unlock()
	shard := *f.Shard
	n := 0
	for _, s := range g.asks {
		if s == shard {
			n++
		}
	}
	g.asks = append(g.asks, shard)
	if g.deny != nil {
		if code := g.deny(shard, n); code != "" {
			return harnesstest.Deny(f, code)
		}
	}
	return harnesstest.Grant(f)
}

func (g *fakeGate) asked() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.asks)
}

func decodeResume(t *testing.T, f *ipc.Frame) []discord.ResumeState {
	t.Helper()
	var rs []discord.ResumeState
	if err := json.Unmarshal(f.Resume, &rs); err != nil {
		t.Fatalf("resume of %s: %v", ipc.Encode(f), err)
	}
	return rs
}

// sessions lists each shard's session kind, as the stats report them.
func sessions(s Stats) []string {
	var out []string
	for _, sh := range s.Shards {
		out = append(out, fmt.Sprintf("%d:%s", sh.ID, sh.Session))
	}
	return out
}

// expectNoIdentify fails the test if an IDENTIFY comes within d.
func expectNoIdentify(t *testing.T, c *harnesstest.Conn, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		f, err := c.Next(time.Until(deadline))
		if err != nil {
			return
		}
		if isIdentify(f) {
			t.Fatalf("unexpected %s", ipc.Encode(f))
		}
	}
}

var sessionIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestSimIdentifyGateInShardOrder(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: harnesstest.Manual})
	r := start(t, m, "--connect-delay=5ms", "--event-interval=2ms", "--identify-timeout=90s")
	c := m.Accept(wait)

	// One shard at a time, in shard order, each only after the grant of the
	// one before; ready only once all are up.
	for shard := 4; shard <= 6; shard++ {
		f := c.Expect(wait, "IDENTIFY", func(f *ipc.Frame) bool {
			if f.Op == ipc.OpHeartbeat && *f.Ready {
				t.Fatalf("ready before shard %d was granted: %s", shard, ipc.Encode(f))
			}
			return isIdentify(f)
		})
		if f.Shard == nil || *f.Shard != shard || f.ID == "" || f.TimeoutMS != 90000 || f.Target != "" {
			t.Fatalf("IDENTIFY %s, want shard %d with an id and timeout_ms 90000", ipc.Encode(f), shard)
		}
		expectNoIdentify(t, c, 60*time.Millisecond)
		c.SendFrame(harnesstest.Grant(f))
	}
	hb := c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	s := decodeStats(t, hb.Payload)
	if fmt.Sprint(sessions(s)) != "[4:identified 5:identified 6:identified]" || s.Identifies != 3 || s.Resumes != 0 {
		t.Fatalf("stats after the grants: %+v", s)
	}

	// Every heartbeat reports each shard's session: ids fixed, seq going up
	// with the dispatches.
	first := decodeResume(t, hb)
	if len(first) != 3 {
		t.Fatalf("resume %s, want 3 shards", hb.Resume)
	}
	for i, rs := range first {
		if rs.Shard != 4+i || !sessionIDPattern.MatchString(rs.SessionID) || rs.Seq < 1 ||
			rs.ResumeURL != fmt.Sprintf("wss://gateway.sim.invalid/?shard=%d", 4+i) || rs.Validate() != nil {
			t.Fatalf("resume entry %+v", rs)
		}
	}
	if first[0].SessionID == first[1].SessionID {
		t.Fatal("two shards share a session id")
	}
	// (Two heartbeats may come with no dispatch between them.)
	last := first
	for grown := 0; grown < 3; {
		hb := c.ExpectOp(wait, ipc.OpHeartbeat)
		rs := decodeResume(t, hb)
		for i := range rs {
			if rs[i].SessionID != last[i].SessionID || rs[i].Seq < last[i].Seq {
				t.Fatalf("heartbeat resume %+v after %+v: session ids must stay, seq must not go back", rs, last)
			}
		}
		if rs[0].Seq > last[0].Seq && rs[2].Seq > last[2].Seq {
			grown++
		}
		last = rs
	}

	c.Send(`{"op":"QUIESCE"}`)
	q := c.ExpectOp(wait, ipc.OpQuiesced)
	rs := decodeResume(t, q)
	if len(rs) != 3 || rs[2].SessionID != last[2].SessionID || rs[2].Seq < last[2].Seq {
		t.Fatalf("QUIESCED resume %s, last heartbeat's %+v", q.Resume, last)
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestSimIdentifyBudgetRefusal(t *testing.T) {
	t.Parallel()
	// The governor refuses shard 6 three times, then grants it; the second
	// refusal is an older manager's word for it, forbidden.
	g := &fakeGate{deny: func(shard, n int) string {
		switch {
		case shard == 6 && n == 1:
			return ipc.CodeForbidden
		case shard == 6 && n < 3:
			return ipc.CodeBudgetRefused
		}
		return ""
	}}
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: g.answer})
	start(t, m, "--connect-delay=0", "--identify-retry=60ms")
	c := m.Accept(wait)

	waiting := c.Expect(wait, "a heartbeat with shard 6 waiting_budget", func(f *ipc.Frame) bool {
		return f.Op == ipc.OpHeartbeat && decodeStats(t, f.Payload).Shards[2].Status == ShardWaitingBudget
	})
	if s := decodeStats(t, waiting.Payload); *waiting.Ready || s.Shards[2].Session != "" || s.Shards[2].PingMS != -1 ||
		s.Shards[1].Status != ShardReady || s.Identifies != 2 {
		t.Fatalf("while the governor refuses: ready %v, %+v", *waiting.Ready, s)
	}
	began := time.Now()
	hb := c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	if s := decodeStats(t, hb.Payload); s.Shards[2].Status != ShardReady || s.Shards[2].Session != SessionIdentified || s.Identifies != 3 {
		t.Fatalf("after the grant: %+v", s)
	}
	if got := g.asked(); fmt.Sprint(got) != "[4 5 6 6 6 6]" {
		t.Fatalf("asked for shards %v, want 4 5 then 6 four times", got)
	}
	// Three refusals, --identify-retry apart (the first may be before began).
	if d := time.Since(began); d < 100*time.Millisecond {
		t.Errorf("the refused shard was up after %v; it asks again only every 60ms", d)
	}
}

func TestSimResumesHandedOverShards(t *testing.T) {
	t.Parallel()
	g := &fakeGate{}
	given := []discord.ResumeState{
		{Shard: 4, SessionID: "0123456789abcdef0123456789abcdef", Seq: 42, ResumeURL: "wss://gateway-us-east1-b.discord.gg"},
		{Shard: 6, SessionID: "fedcba9876543210fedcba9876543210", Seq: 7, ResumeURL: "wss://gateway.sim.invalid/?shard=6", UpdatedAt: time.Now()},
		{Shard: 9, SessionID: "not-ours", Seq: 1, ResumeURL: "wss://x.invalid"}, // another cluster's: ignored
	}
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: g.answer, Resume: given})
	start(t, m, "--connect-delay=1ms", "--event-interval=2ms")
	c := m.Accept(wait)

	hb := c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	s := decodeStats(t, hb.Payload)
	if fmt.Sprint(sessions(s)) != "[4:resumed 5:identified 6:resumed]" || s.Identifies != 1 || s.Resumes != 2 {
		t.Fatalf("stats %+v", s)
	}
	if got := g.asked(); fmt.Sprint(got) != "[5]" {
		t.Fatalf("asked the gate for shards %v, want only 5", got)
	}
	// A resumed shard goes on with the session it was handed, from its seq.
	for range 2 {
		rs := decodeResume(t, c.ExpectOp(wait, ipc.OpHeartbeat))
		if len(rs) != 3 || rs[0].SessionID != given[0].SessionID || rs[0].Seq < 42 || rs[0].ResumeURL != given[0].ResumeURL ||
			rs[2].SessionID != given[1].SessionID || rs[2].Seq < 7 || rs[1].SessionID == given[0].SessionID {
			t.Fatalf("resume %+v", rs)
		}
	}
	// A re-registration that hands the state over again changes nothing: the
	// shards are up already.
	c.Drop()
	c2 := m.Accept(wait)
	c2.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	if s := stats(t, c2, "s"); s.Identifies != 1 || s.Resumes != 2 {
		t.Fatalf("stats after re-registering: %+v", s)
	}
	if got := g.asked(); len(got) != 1 {
		t.Fatalf("asked for shards %v after re-registering", got)
	}
}

func TestSimIdentifyAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code string
		want string // the shards asked for
	}{
		{ipc.CodeTimeout, "[4 4 5 6]"},
		{ipc.CodeUnavailable, "[4 4 5 6]"},
		{ipc.CodeShuttingDown, "[4 4 5 6]"},
		{ipc.CodeInternal, "[4 4 5 6]"},
		// A manager that announces a gate but has none: the first answer
		// tells, and the rest identify without asking.
		{ipc.CodeUnknownOp, "[4]"},
		{ipc.CodeUnknownTarget, "[4]"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			g := &fakeGate{deny: func(shard, n int) string {
				if shard == 4 && n == 0 {
					return tc.code
				}
				return ""
			}}
			m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: g.answer})
			start(t, m, "--connect-delay=0", "--identify-retry=20ms")
			c := m.Accept(wait)
			hb := c.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
			if s := decodeStats(t, hb.Payload); s.Identifies != 3 {
				t.Fatalf("stats %+v", s)
			}
			if got := fmt.Sprint(g.asked()); got != tc.want {
				t.Fatalf("asked for shards %s, want %s", got, tc.want)
			}
		})
	}
}

func TestSimIdentifyAfterReconnect(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: harnesstest.Manual})
	start(t, m, "--connect-delay=0")
	c := m.Accept(wait)
	first := c.Expect(wait, "IDENTIFY", isIdentify)
	// The manager dies while the shard waits for its slot: the harness asks
	// the next one at once, not after --identify-retry (5s).
	c.Drop()
	c2 := m.Accept(wait)
	again := c2.Expect(2*time.Second, "IDENTIFY again", isIdentify)
	if *again.Shard != *first.Shard {
		t.Fatalf("asked again for %s, first for %s", ipc.Encode(again), ipc.Encode(first))
	}
	c2.SendFrame(harnesstest.Grant(again))
	for range 2 {
		c2.SendFrame(harnesstest.Grant(c2.Expect(wait, "IDENTIFY", isIdentify)))
	}
	hb := c2.Expect(wait, "HEARTBEAT ready:true", isHeartbeat(true))
	if s := decodeStats(t, hb.Payload); s.Identifies != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSimOlderManagerIsNotAsked(t *testing.T) {
	t.Parallel()
	// No "identify" in the REGISTER reply: no IDENTIFY is sent (the fake
	// would answer unknown_target, as an older manager does).
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20})
	start(t, m, "--connect-delay=1ms")
	c := m.Accept(wait)
	hb := c.Expect(wait, "HEARTBEAT ready:true", func(f *ipc.Frame) bool {
		if isIdentify(f) {
			t.Fatalf("asked an older manager: %s", ipc.Encode(f))
		}
		return isHeartbeat(true)(f)
	})
	if s := decodeStats(t, hb.Payload); fmt.Sprint(sessions(s)) != "[4:identified 5:identified 6:identified]" || s.Identifies != 3 {
		t.Fatalf("stats %+v", s)
	}
	if len(decodeResume(t, hb)) != 3 {
		t.Fatalf("resume %s", hb.Resume)
	}
}

func TestSimQuiesceStopsAsking(t *testing.T) {
	t.Parallel()
	m := harnesstest.Start(t, harnesstest.Options{HeartbeatIntervalMS: 20, Identify: harnesstest.Manual})
	r := start(t, m, "--connect-delay=0")
	c := m.Accept(wait)
	c.SendFrame(harnesstest.Grant(c.Expect(wait, "IDENTIFY", isIdentify)))
	c.Expect(wait, "IDENTIFY of the second shard", isIdentify) // left waiting
	c.Send(`{"op":"QUIESCE"}`)
	q := c.Expect(wait, "QUIESCED", func(f *ipc.Frame) bool {
		if isIdentify(f) {
			t.Fatalf("asked while quiescing: %s", ipc.Encode(f))
		}
		return f.Op == ipc.OpQuiesced
	})
	if rs := decodeResume(t, q); len(rs) != 1 || rs[0].Shard != 4 {
		t.Fatalf("QUIESCED resume %s, want shard 4 alone", q.Resume)
	}
	if err := r.result(t, wait); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
