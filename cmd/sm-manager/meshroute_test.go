package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/harness"
	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// rawConn is a client connection that counts every REPLY by id, so that a
// test sees a second REPLY for one request, which ipc.Client would hide.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	sc *bufio.Scanner
}

func dialRaw(t *testing.T, sock string) *rawConn {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	r := &rawConn{t: t, nc: nc, sc: bufio.NewScanner(nc)}
	r.sc.Buffer(make([]byte, 1<<20), 1<<20)
	r.send(ipc.Frame{Op: ipc.OpRegister, ID: "reg", Role: ipc.RoleClient, Name: "route-test"})
	if f := r.read(10 * time.Second); f == nil || f.ID != "reg" || f.Error != nil {
		t.Fatalf("REGISTER: %+v", f)
	}
	return r
}

func (r *rawConn) send(f ipc.Frame) {
	r.t.Helper()
	if _, err := r.nc.Write(append(ipc.Encode(&f), '\n')); err != nil {
		r.t.Fatal(err)
	}
}

// read returns the next frame, nil if none came within d.
func (r *rawConn) read(d time.Duration) *ipc.Frame {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(d))
	if !r.sc.Scan() {
		if ne, ok := r.sc.Err().(net.Error); ok && ne.Timeout() {
			r.sc = bufio.NewScanner(r.nc) // a timed-out scanner stays failed
			r.sc.Buffer(make([]byte, 1<<20), 1<<20)
			return nil
		}
		r.t.Fatalf("read: %v", r.sc.Err())
	}
	var f ipc.Frame
	if err := json.Unmarshal(r.sc.Bytes(), &f); err != nil {
		r.t.Fatalf("reply %q: %v", r.sc.Bytes(), err)
	}
	return &f
}

// exchange sends reqs and returns the REPLY to each by id, failing the test
// on a REPLY with no id or an id asked twice or never, and on any frame
// arriving within quiet after the last expected one.
func (r *rawConn) exchange(reqs []ipc.Frame, quiet time.Duration) map[string]*ipc.Frame {
	r.t.Helper()
	for _, f := range reqs {
		r.send(f)
	}
	got := map[string]*ipc.Frame{}
	for len(got) < len(reqs) {
		f := r.read(20 * time.Second)
		if f == nil {
			r.t.Fatalf("%d of %d replies in 20s: %v", len(got), len(reqs), got)
		}
		if f.Op != ipc.OpReply || f.ID == "" || got[f.ID] != nil {
			r.t.Fatalf("unexpected frame (or a second REPLY): %+v", f)
		}
		got[f.ID] = f
	}
	if f := r.read(quiet); f != nil {
		r.t.Fatalf("a frame after every request had its REPLY: %+v", f)
	}
	return got
}

// pongOf decodes a ping's answer.
func pongOf(t *testing.T, f *ipc.Frame) harness.Pong {
	t.Helper()
	var p harness.Pong
	if f.Error != nil || json.Unmarshal(f.Payload, &p) != nil || !p.Pong {
		t.Fatalf("ping REPLY %+v (%s)", f, f.Payload)
	}
	return p
}

// TestMeshRoutesEveryTarget: three managers share twelve clusters; from
// every host's socket, every cluster id, a guild and a shard of every
// cluster, and "*" reach the right cluster, whichever host runs it (the
// simulated bot's pong names the cluster that answered); an unknown target
// stays unknown_target; every request gets exactly one REPLY, with the
// client's own id.
func TestMeshRoutesEveryTarget(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	var hosts []*meshHost
	for _, id := range []string{"a", "b", "c"} {
		hosts = append(hosts, startMeshHost(t, srv.URL, id, 6))
	}
	for _, h := range hosts {
		h.dial(t)
	}
	by := placed(t, hosts, 30*time.Second, "12 clusters ready across 3 hosts")
	t.Logf("placed: %v", by)
	owner := map[int]string{}
	for id, cs := range by {
		for _, c := range cs {
			owner[c] = id
		}
	}
	// Each host's watch of the leases catches up with the placement.
	for _, h := range hosts {
		testenv.WaitFor(t, 10*time.Second, "host "+h.id+" reaches every cluster", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r, err := h.client.Request(ctx, &ipc.Frame{Op: harness.OpPing, Target: "*"})
			if err != nil {
				t.Logf("host %s: * = %v", h.id, err)
				return false
			}
			var res ipc.Broadcast
			if json.Unmarshal(r.Payload, &res) != nil || len(res.Results) != 12 {
				return false
			}
			for _, x := range res.Results {
				if x.Error != nil {
					t.Logf("host %s: * = %s", h.id, r.Payload)
					return false
				}
			}
			return true
		})
	}

	for _, h := range hosts {
		rc := dialRaw(t, h.sock)
		var reqs []ipc.Frame
		want := map[string]int{} // id → the cluster that must answer
		for c := range 12 {
			shard := 2*c + 1
			for kind, target := range map[string]string{
				"id":    strconv.Itoa(c),
				"guild": fmt.Sprintf("guild:%d", uint64(2*c)<<22|12345),
				"shard": fmt.Sprintf("shard:%d", shard),
			} {
				id := fmt.Sprintf("%s-%s-%d", h.id, kind, c)
				reqs = append(reqs, ipc.Frame{Op: harness.OpPing, ID: id, Target: target})
				want[id] = c
			}
			// A payload crosses byte for byte, and a frame with no id
			// gets nothing back (its REPLY would fail exchange).
			reqs = append(reqs, ipc.Frame{Op: harness.OpEcho, ID: fmt.Sprintf("%s-echo-%d", h.id, c), Target: strconv.Itoa(c), Payload: json.RawMessage(`{"n":` + strconv.Itoa(c) + `, "s":"é\u00e9"}`)})
			rc.send(ipc.Frame{Op: harness.OpEcho, Target: strconv.Itoa(c)})
		}
		reqs = append(reqs,
			ipc.Frame{Op: harness.OpPing, ID: "all", Target: "*"},
			ipc.Frame{Op: harness.OpPing, ID: "unknown-shard", Target: "shard:24"},
			ipc.Frame{Op: harness.OpPing, ID: "unknown-cluster", Target: "12"},
		)
		got := rc.exchange(reqs, 300*time.Millisecond)
		remote := 0
		for id, c := range want {
			if p := pongOf(t, got[id]); p.Cluster != c {
				t.Errorf("host %s: %s answered by cluster %d, want %d", h.id, id, p.Cluster, c)
			}
			if owner[c] != h.id {
				remote++
			}
		}
		for c := range 12 {
			f := got[fmt.Sprintf("%s-echo-%d", h.id, c)]
			if f.Error != nil || string(f.Payload) != `{"n":`+strconv.Itoa(c)+`, "s":"é\u00e9"}` {
				t.Errorf("host %s: echo to cluster %d: %+v %s", h.id, c, f.Error, f.Payload)
			}
		}
		var all ipc.Broadcast
		if f := got["all"]; f.Error != nil || json.Unmarshal(f.Payload, &all) != nil || len(all.Results) != 12 {
			t.Fatalf("host %s: * = %+v %s", h.id, f.Error, f.Payload)
		}
		for i, x := range all.Results {
			var p harness.Pong
			if x.Cluster != i || x.Error != nil || json.Unmarshal(x.Payload, &p) != nil || p.Cluster != i {
				t.Errorf("host %s: * result %d = %+v", h.id, i, x)
			}
		}
		for _, id := range []string{"unknown-shard", "unknown-cluster"} {
			if f := got[id]; f.Error == nil || f.Error.Code != ipc.CodeUnknownTarget {
				t.Errorf("host %s: %s = %+v", h.id, id, f)
			}
		}
		if remote != 24 {
			t.Errorf("host %s sent %d requests to other hosts' clusters, want 24 (8 clusters × 3 targets)", h.id, remote)
		}
	}
}
