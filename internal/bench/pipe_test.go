package bench

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// TestPipeBooks drives a load at a fake peer that answers one request twice,
// one with an error, one changed, and one never: the books must say so.
func TestPipeBooks(t *testing.T) {
	a, b := net.Pipe()
	conn := ipc.NewConn(a, ipc.Options{})
	peer := ipc.NewConn(b, ipc.Options{})
	defer func() {
		conn.Abort(nil)
		peer.Abort(nil)
		<-conn.Done()
		<-peer.Done()
	}()
	go func() {
		n := 0
		for {
			line, err := peer.ReadFrame()
			if err != nil {
				return
			}
			f, err := ipc.Decode(line)
			if err != nil {
				return
			}
			n++
			switch n {
			case 3:
				peer.SendFrame(ipc.Reply(f.ID, f.Payload))
				peer.SendFrame(ipc.Reply(f.ID, f.Payload))
			case 5:
				// never answered
			case 7:
				peer.SendFrame(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeBusy, "no")))
			case 9:
				peer.SendFrame(ipc.Reply(f.ID, []byte(`"changed"`)))
			case 11:
				peer.SendFrame(ipc.Reply("zz", nil))
				peer.SendFrame(ipc.Reply(f.ID, f.Payload))
			default:
				peer.SendFrame(ipc.Reply(f.ID, f.Payload))
			}
		}
	}()
	p := newPipe(conn, nil)
	payload := echoPayload(50)
	res, err := p.run(context.Background(), load{
		request:  ipc.Frame{Op: "echo", Target: "0", Payload: payload},
		window:   4,
		duration: 50 * time.Millisecond,
		drain:    200 * time.Millisecond,
		expect:   payload,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Duplicates != 1 || res.Lost != 1 || res.Unknown != 1 || res.Errors["busy"] != 1 || res.Errors[codeBadPayload] != 1 {
		t.Fatalf("books %+v", res.books)
	}
	if res.Sent != res.OK+res.ErrorCount()+res.Lost {
		t.Fatalf("books do not balance: %+v", res.books)
	}
	if res.Completed == 0 || res.Latency.Count() == 0 || res.Throughput() <= 0 {
		t.Fatalf("no figures: completed %d, latencies %d", res.Completed, res.Latency.Count())
	}
}

// TestPipeTake checks that the bytes-only match of a reply books what a
// full decode would, and that every other shape is decoded.
func TestPipeTake(t *testing.T) {
	expect := []byte(`{"data":"x"}`)
	cases := []struct {
		line       string
		ok         bool   // booked as the reply to id 1
		code       string // its error code, or bad_payload
		unknownInc uint64
	}{
		{`{"op":"REPLY","id":"1","payload":{"data":"x"}}`, true, "", 0},
		{`{"op":"REPLY","id":"\u0031","payload":{"data":"x"}}`, true, "", 0},        // an escape: decoded
		{`{"id":"1","op":"REPLY","payload":{"data":"x"}}`, true, "", 0},             // another order
		{`{"op":"REPLY","id":"1","payload":{"data":"y"}}`, true, codeBadPayload, 0}, // changed
		{`{"op":"REPLY","id":"1","payload":{"data":"x"} }`, true, "", 0},            // a space: decoded, same payload
		{`{"op":"REPLY","id":"1","error":{"code":"busy","message":"m"}}`, true, "busy", 0},
		{`{"op":"REPLY","id":"zz","payload":{"data":"x"}}`, false, "", 1},  // no such request
		{`{"op":"REPLY","id":"1x!","payload":{"data":"x"}}`, false, "", 1}, // not an id of ours
		{`{"op":"REPLY","payload":{"data":"x"}}`, false, "", 1},            // no id
	}
	for _, c := range cases {
		p := newPipe(nil, nil)
		p.next = 1
		p.out.add(1, 0)
		var b books
		_, ok, err := p.take([]byte(c.line), expect, &b)
		if err != nil {
			t.Fatalf("%s: %v", c.line, err)
		}
		got := ""
		for code := range b.Errors {
			got = code
		}
		if ok != c.ok || got != c.code || b.Unknown != c.unknownInc || (ok && c.code == "" && b.OK != 1) {
			t.Errorf("%s: ok %v, books %+v; want ok %v, code %q", c.line, ok, b, c.ok, c.code)
		}
	}
	p := newPipe(nil, nil)
	if _, _, err := p.take([]byte(`{"op":"REPLY","id":"1","payload":{"data":`), expect, &books{}); err == nil {
		t.Error("an undecodable frame was booked")
	}
	// A duplicate is a duplicate on either path.
	p.out.add(1, 0)
	var b books
	p.take([]byte(`{"op":"REPLY","id":"1","payload":{"data":"x"}}`), expect, &b)
	p.take([]byte(`{"op":"REPLY","id":"1","payload":{"data":"x"}}`), expect, &b)
	p.take([]byte(`{"op":"REPLY","id":"\u0031","payload":{"data":"x"}}`), expect, &b)
	if b.OK != 1 || b.Duplicates != 2 {
		t.Errorf("duplicates: %+v", b)
	}
}

// TestOutstandingOverflow keeps one request unanswered while the ring comes
// round to its slot many times: it must still be found, and counted once.
func TestOutstandingOverflow(t *testing.T) {
	o := newOutstanding(1)
	o.add(1, 7)
	for id := uint64(2); id < 1000; id++ {
		o.add(id, int64(id))
		if _, ok := o.take(id); !ok {
			t.Fatalf("id %d not outstanding", id)
		}
	}
	o.add(1000, 0)
	if at, ok := o.take(1); !ok || at != 7 {
		t.Fatalf("the old request: %v %v", at, ok)
	}
	if _, ok := o.take(1); ok {
		t.Fatal("taken twice")
	}
	if n := o.clear(); n != 1 {
		t.Fatalf("clear: %d outstanding, want 1", n)
	}
}

// TestPipeSteadyStateAllocs checks that booking a reply and queueing the
// next request allocate nothing (the load client's cost is part of what the
// route scenario measures).
func TestPipeSteadyStateAllocs(t *testing.T) {
	payload := echoPayload(200)
	tmpl := newRequestTemplate(&ipc.Frame{Op: "echo", Target: "0", Payload: payload})
	p := newPipe(nil, nil)
	p.out.reserve(64)
	line := []byte(nil)
	var b books
	allocs := testing.AllocsPerRun(10000, func() {
		p.next++
		p.buf = tmpl.append(p.buf[:0], p.next)
		p.out.add(p.next, 1)
		line = append(append(append(line[:0], `{"op":"REPLY","id":"`...), p.buf[len(tmpl.head):len(p.buf)-len(tmpl.tail)-1]...), `","payload":`...)
		line = append(append(line, payload...), '}')
		if _, ok, err := p.take(line, payload, &b); !ok || err != nil {
			t.Fatalf("not booked: %s", line)
		}
	})
	// The answered bitset grows now and then: amortized, well under one.
	if allocs > 0.01 {
		t.Errorf("%.3f allocations per request", allocs)
	}
	f, err := ipc.Decode(bytes.TrimSuffix(tmpl.append(nil, 42), []byte("\n")))
	if err != nil || f.ID != "16" || f.Op != "echo" || f.Target != "0" || !bytes.Equal(f.Payload, payload) {
		t.Fatalf("template: %+v, %v", f, err)
	}
}
