package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
)

// fakeHost is another host of a mesh, played by the test over a real NATS
// server: it holds the leases of some clusters (renewing them), and sees the
// requests forwarded to it, which it answers — or not, or wrongly — as the
// test says.
type fakeHost struct {
	t    *testing.T
	nc   *nats.Conn
	me   mesh.Holder
	reqs chan *nats.Msg
	sub  *nats.Subscription
}

func startFakeHost(t *testing.T, url string, clusters ...int) *fakeHost {
	t.Helper()
	cfg := config.Default().Mesh
	cfg.NATSURL, cfg.HostID, cfg.Lease = url, "x", config.Duration{Duration: 2 * time.Second}
	nc, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := mesh.Open(ctx, nc, cfg.Name, cfg.Lease.Duration)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeHost{t: t, nc: nc, me: mesh.Holder{Host: "x", Boot: "xboot"}, reqs: make(chan *nats.Msg, 1024)}
	revs := map[int]uint64{}
	for _, c := range clusters {
		h, err := st.Take(ctx, c, f.me, 0)
		if err != nil {
			t.Fatal(err)
		}
		revs[c] = h.Rev
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
			for c, rev := range revs {
				if h, err := st.Renew(ctx, c, f.me, rev); err == nil {
					revs[c] = h.Rev
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	if f.sub, err = nc.ChanSubscribe(mesh.ReqSubject(cfg.Name, "x"), f.reqs); err != nil {
		t.Fatal(err)
	}
	return f
}

// next returns the next forwarded request and the message it came in.
func (f *fakeHost) next() (*nats.Msg, mesh.Holder, mesh.Request) {
	f.t.Helper()
	select {
	case msg := <-f.reqs:
		kind, from, rest, err := mesh.ParseHeader(msg.Data)
		if err != nil || kind != mesh.KindRequests {
			f.t.Fatalf("forwarded message %q: %v", msg.Data, err)
		}
		q, rest, err := mesh.NextRequest(rest)
		if err != nil || len(rest) != 0 {
			f.t.Fatalf("forwarded message: %v, %d bytes left (one request expected)", err, len(rest))
		}
		return msg, from, q
	case <-time.After(10 * time.Second):
		f.t.Fatal("no request forwarded to host x")
	}
	panic("unreachable")
}

// answer replies to the boot of from, as boot as.
func (f *fakeHost) answer(from, as mesh.Holder, reps ...mesh.Reply) {
	f.t.Helper()
	b := mesh.AppendHeader(nil, mesh.KindReplies, as)
	for _, r := range reps {
		b = mesh.AppendReply(b, r)
	}
	if err := f.nc.Publish(mesh.ReplySubject("sm", from), b); err != nil {
		f.t.Fatal(err)
	}
}

// meshEnv starts a manager joined to a mesh on a real NATS server, holding
// clusters 0 and 1 while the fake host x holds 2 and 3.
func meshEnv(t *testing.T, maxForwards int) (*env, *fakeHost, *natstest.Server) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	x := startFakeHost(t, srv.URL, 2, 3)
	cfg := testConfig(t)
	cfg.Mesh.NATSURL, cfg.Mesh.HostID, cfg.Mesh.MaxClusters = srv.URL, "a", 2
	cfg.Mesh.Lease = durationOf(2 * time.Second)
	cfg.Mesh.MaxForwards = maxForwards
	e := start(t, cfg)
	e.WaitReady(0, 1)
	return e, x, srv
}

func (e *env) dropped(reason string) float64 {
	return e.scrape()["sm_mesh_dropped_total{reason="+reason+"}"]
}

// quiet checks that nothing more comes on rc within d: no second REPLY.
func (rc *rawConn) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(d))
	line, err := rc.r.ReadFrame()
	if err == nil {
		t.Fatalf("%s: unexpected frame %s", rc.name, line)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("%s: %v", rc.name, err)
	}
}

// TestMeshForwardTimeoutAndImpostors: a request for another host's cluster
// is forwarded with its op, target, payload bytes and remaining deadline;
// the owner's answer comes back with the client's id; an owner that does not
// answer in time is a timeout, whose late answer is dropped (one REPLY);
// answers from another boot, for unknown forward ids, and garbage are
// dropped and counted; MOVED with the owner unchanged is unavailable; an
// owner gone (no responders) is unavailable at once. And the other way: a
// request another host forwards here runs on the local cluster and is
// answered to that host's boot, MOVED for a cluster not here.
func TestMeshForwardTimeoutAndImpostors(t *testing.T) {
	e, x, _ := meshEnv(t, 4096)
	rc := e.rawClient("route")

	// Answered: the payload crosses byte for byte, both ways.
	testenv.WaitFor(t, 10*time.Second, "a request for cluster 2 forwarded to x", func() bool {
		rc.send(`{"op":"echo","id":"probe","target":"guild:` + fmt.Sprint(5<<22) + `","timeout_ms":200}`)
		return rc.read(t, 10*time.Second).Error.Code == ipc.CodeTimeout // not unavailable: x's lease seen
	})
	for len(x.reqs) > 0 { // the probe's
		x.next()
	}
	rc.send(`{"op":"echo","id":"one","target":"shard:5","payload":{"a": [1, 2]}}`)
	msg, from, q := x.next()
	a, replyTo := from, msg.Reply
	if from.Host != "a" || replyTo != mesh.ReplySubject("sm", from) || string(q.Op) != "echo" || string(q.Target) != "shard:5" ||
		q.Cluster != 2 || string(q.Payload) != `{"a": [1, 2]}` || q.Deadline == 0 || q.Deadline > 3_000_000 {
		t.Fatalf("forwarded %v %q: %+v", from, replyTo, q)
	}
	x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusOK, Payload: []byte(`{"b" : 3}`)})
	if f := rc.read(t, 5*time.Second); f.ID != "one" || f.Error != nil || string(f.Payload) != `{"b" : 3}` {
		t.Fatalf("reply: %s", ipc.Encode(f))
	}

	// Not answered in time: timeout; the late answer is dropped.
	unknown := e.dropped("unknown_forward")
	rc.send(`{"op":"echo","id":"late","target":"2","timeout_ms":300}`)
	_, _, q = x.next()
	if q.Deadline > 300_000 {
		t.Fatalf("deadline %d µs, want at most the client's 300 ms", q.Deadline)
	}
	rc.expectError(t, "late", ipc.CodeTimeout)
	x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusOK, Payload: []byte(`1`)})
	testenv.WaitFor(t, 5*time.Second, "the late answer dropped", func() bool { return e.dropped("unknown_forward") == unknown+1 })

	// Another boot of x, then a made-up id, then x itself.
	boot := e.dropped("wrong_boot")
	rc.send(`{"op":"echo","id":"boot","target":"3"}`)
	_, _, q = x.next()
	x.answer(a, mesh.Holder{Host: "x", Boot: "other"}, mesh.Reply{ID: q.ID, Status: mesh.StatusOK, Payload: []byte(`"impostor"`)})
	x.answer(a, x.me, mesh.Reply{ID: q.ID + 1000, Status: mesh.StatusOK, Payload: []byte(`"impostor"`)})
	testenv.WaitFor(t, 5*time.Second, "the impostors dropped", func() bool {
		return e.dropped("wrong_boot") == boot+1 && e.dropped("unknown_forward") == unknown+2
	})
	x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusError, Code: []byte("bot_error"), Message: []byte("no")})
	if f := rc.read(t, 5*time.Second); f.ID != "boot" || f.Error == nil || f.Error.Code != "bot_error" {
		t.Fatalf("reply: %s", ipc.Encode(f))
	}

	// Garbage to both subjects, and a payload that is no JSON.
	bad := e.dropped("bad_format")
	for _, subj := range []string{mesh.ReqSubject("sm", "a"), replyTo} {
		if err := x.nc.Publish(subj, []byte(`{"op":"echo"}`)); err != nil {
			t.Fatal(err)
		}
	}
	x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusOK, Payload: []byte(`{"unterminated"`)})
	testenv.WaitFor(t, 5*time.Second, "the garbage dropped", func() bool { return e.dropped("bad_format") == bad+3 })

	// MOVED while x's lease still names x: not retried on x: unavailable.
	rc.send(`{"op":"echo","id":"moved","target":"2"}`)
	_, _, q = x.next()
	x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusMoved})
	rc.expectError(t, "moved", ipc.CodeUnavailable)

	// A broadcast: a's own two clusters and x's two parts in one message.
	rc.send(`{"op":"ping","id":"all","target":"*"}`)
	msg = <-x.reqs
	_, _, rest, _ := mesh.ParseHeader(msg.Data)
	var parts []mesh.Request
	for len(rest) > 0 {
		var p mesh.Request
		p, rest, _ = mesh.NextRequest(rest)
		parts = append(parts, p)
	}
	if len(parts) != 2 || parts[0].Flags&mesh.FlagPart == 0 || string(parts[0].Target) != "*" {
		t.Fatalf("broadcast parts to x: %+v", parts)
	}
	x.answer(a, x.me, mesh.Reply{ID: parts[0].ID, Status: mesh.StatusOK, Payload: []byte(`{"pong":true,"cluster":2}`)},
		mesh.Reply{ID: parts[1].ID, Status: mesh.StatusError, Code: []byte(ipc.CodeUnavailable), Message: []byte("restarting")})
	f := rc.read(t, 5*time.Second)
	var bc ipc.Broadcast
	if f.ID != "all" || json.Unmarshal(f.Payload, &bc) != nil || len(bc.Results) != 4 ||
		string(bc.Results[2].Payload) != `{"pong":true,"cluster":2}` || bc.Results[3].Error.Code != ipc.CodeUnavailable ||
		bc.Results[0].Error != nil || bc.Results[1].Error != nil {
		t.Fatalf("broadcast: %s", ipc.Encode(f))
	}

	// The other way: x forwards to a.
	replies := make(chan *nats.Msg, 16)
	if _, err := x.nc.ChanSubscribe(mesh.ReplySubject("sm", x.me), replies); err != nil {
		t.Fatal(err)
	}
	in := mesh.AppendHeader(nil, mesh.KindRequests, x.me)
	in = mesh.AppendRequest(in, mesh.Request{ID: 7, Cluster: 1, Deadline: 5_000_000, Op: []byte("echo"), Target: []byte("1"), Payload: []byte(`[ "x" ]`)})
	in = mesh.AppendRequest(in, mesh.Request{ID: 8, Cluster: 3, Deadline: 5_000_000, Op: []byte("echo"), Target: []byte("3")})
	in = mesh.AppendRequest(in, mesh.Request{ID: 9, Cluster: 0, Deadline: 5_000_000, Op: []byte("echo"), Target: []byte("0"), Payload: []byte(`nope`)})
	// No reply wanted, for a cluster not on a: dropped, never forwarded on.
	in = mesh.AppendRequest(in, mesh.Request{ID: 0, Cluster: 2, Deadline: 5_000_000, Op: []byte("echo"), Target: []byte("2")})
	if err := x.nc.Publish(mesh.ReqSubject("sm", "a"), in); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]mesh.Reply{}
	for len(got) < 2 {
		select {
		case m := <-replies:
			_, by, rest, err := mesh.ParseHeader(m.Data)
			if err != nil || by != a {
				t.Fatalf("reply message from %v: %v", by, err)
			}
			for len(rest) > 0 {
				var r mesh.Reply
				r, rest, _ = mesh.NextReply(rest)
				got[r.ID] = r
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("replies from a: %+v", got)
		}
	}
	if r := got[7]; r.Status != mesh.StatusOK || string(r.Payload) != `[ "x" ]` {
		t.Errorf("echo on a's cluster 1: %+v", r)
	}
	if r := got[8]; r.Status != mesh.StatusMoved {
		t.Errorf("a request for cluster 3 on a: %+v", r)
	}
	testenv.WaitFor(t, 5*time.Second, "the request whose payload is no JSON dropped", func() bool { return e.dropped("bad_format") == bad+4 })
	select {
	case m := <-x.reqs:
		t.Fatalf("a forwarded a request from x on: %q", m.Data)
	case <-time.After(200 * time.Millisecond):
	}

	// x's manager gone: no responders, unavailable at once.
	if err := x.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	x.nc.Flush()
	rc.send(`{"op":"echo","id":"gone","target":"2"}`)
	start := time.Now()
	f = rc.read(t, 5*time.Second)
	if f.ID != "gone" || f.Error == nil || f.Error.Code != ipc.CodeUnavailable || !strings.Contains(f.Error.Message, "no responders") {
		t.Fatalf("reply with x gone: %s", ipc.Encode(f))
	}
	t.Logf("unavailable %v after the request, with x's manager gone", time.Since(start).Round(time.Microsecond))
	rc.quiet(t, 300*time.Millisecond)
}

// TestMeshForwardBound: past mesh.max_forwards requests awaiting another
// host's replies, a request is unavailable at once, naming the key; those
// in flight are still answered, once each.
func TestMeshForwardBound(t *testing.T) {
	e, x, _ := meshEnv(t, 3)
	rc := e.rawClient("bound")
	testenv.WaitFor(t, 10*time.Second, "a request for cluster 2 forwarded to x", func() bool {
		rc.send(`{"op":"echo","id":"probe","target":"2","timeout_ms":200}`)
		return rc.read(t, 10*time.Second).Error.Code == ipc.CodeTimeout
	})
	for len(x.reqs) > 0 {
		x.next()
	}
	var qs []mesh.Request
	var a mesh.Holder
	for i := range 3 {
		rc.send(fmt.Sprintf(`{"op":"echo","id":"in-%d","target":"2","payload":%d}`, i, i))
		var q mesh.Request
		_, a, q = x.next()
		qs = append(qs, q)
	}
	rc.send(`{"op":"echo","id":"over","target":"3"}`)
	f := rc.read(t, 5*time.Second)
	if f.ID != "over" || f.Error == nil || f.Error.Code != ipc.CodeUnavailable || !strings.Contains(f.Error.Message, "mesh.max_forwards") {
		t.Fatalf("the request over the bound: %s", ipc.Encode(f))
	}
	// A's own clusters are not bounded by it.
	rc.send(`{"op":"echo","id":"local","target":"0","payload":"here"}`)
	if f := rc.read(t, 5*time.Second); f.ID != "local" || string(f.Payload) != `"here"` {
		t.Fatalf("a's own cluster: %s", ipc.Encode(f))
	}
	for _, q := range qs {
		x.answer(a, x.me, mesh.Reply{ID: q.ID, Status: mesh.StatusOK, Payload: q.Payload})
	}
	seen := map[string]bool{}
	for range qs {
		f := rc.read(t, 5*time.Second)
		if f.Error != nil || seen[f.ID] || string(f.Payload) != f.ID[len("in-"):] {
			t.Fatalf("reply %s", ipc.Encode(f))
		}
		seen[f.ID] = true
	}
	rc.quiet(t, 300*time.Millisecond)
}
