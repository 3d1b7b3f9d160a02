package bench

import (
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
