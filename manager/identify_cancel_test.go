package manager_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// askWaiting has cluster's bot ask the identify gate for shard and returns
// once the ask waits (it must be the only one), with where the REPLY the ask
// comes to will arrive: nil if the bot's op itself failed.
func askWaiting(t *testing.T, e *env, c *ipc.Client, cluster string, shard int) <-chan *ipc.Frame {
	t.Helper()
	reply := make(chan *ipc.Frame, 1)
	go func() {
		r, err := request(t, c, "identify", cluster, map[string]int{"shard": shard}, 5*time.Second)
		if err != nil {
			t.Errorf("the waiting IDENTIFY's op (shard %d): %v", shard, err)
			reply <- nil
			return
		}
		f, _ := ipc.Decode(r.Payload)
		reply <- f
	}()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("the IDENTIFY for shard %d waiting", shard), func() bool {
		return e.MustStatus().Discord.IdentifyWaiting == 1
	})
	return reply
}

// An IDENTIFY_CANCEL withdraws the process's waiting ask for the shard: the
// IDENTIFY is answered cancelled, the cancel counts it, and nothing is spent.
// Without an id it withdraws all the same; from a client, or for a shard not
// the cluster's, it is refused as IDENTIFY is.
func TestIdentifyCancel(t *testing.T) {
	cfg, dir := testbotConfig(t, nil)
	cfg.Discord.IdentifySpacing = durationOf(time.Hour) // after the first grant, the bucket waits
	e := start(t, cfg)
	st := e.WaitReady()
	c := e.client("canceller")

	// The bucket's first grant comes at once and is spent.
	if g := botOp(t, c, "identify", "0", map[string]int{"shard": 0}); g.Error != nil || string(g.Payload) != `{"granted":true,"shard":0,"bucket":0}` {
		t.Fatalf("first IDENTIFY: %s", ipc.Encode(g))
	}
	// Cluster 1's ask for shard 2 now waits an hour.
	waiting := askWaiting(t, e, c, "1", 2)

	// Another cluster's cancel for its own shard withdraws nothing of cluster 1's.
	if w := botOp(t, c, "identify_cancel", "2", map[string]int{"shard": 4}); w.Error != nil || string(w.Payload) != `{"withdrawn":0}` {
		t.Fatalf("cluster 2's cancel: %s", ipc.Encode(w))
	}
	if w := botOp(t, c, "identify_cancel", "1", map[string]int{"shard": 2}); w.Error != nil || string(w.Payload) != `{"withdrawn":1}` {
		t.Fatalf("IDENTIFY_CANCEL: %s", ipc.Encode(w))
	}
	if reply := <-waiting; reply == nil || reply.Error == nil || reply.Error.Code != ipc.CodeCancelled {
		t.Fatalf("the withdrawn IDENTIFY was answered %v, want cancelled", reply)
	}
	after := e.MustStatus().Discord
	if after.IdentifyWaiting != 0 || after.IdentifyGranted != st.Discord.IdentifyGranted+1 || after.Budget.Spent != st.Discord.Budget.Spent+1 {
		t.Fatalf("after the cancel: %+v (at start %+v); want nothing waiting and only the first grant spent", after, st.Discord)
	}
	// Nothing left to withdraw.
	if w := botOp(t, c, "identify_cancel", "1", map[string]int{"shard": 2}); w.Error != nil || string(w.Payload) != `{"withdrawn":0}` {
		t.Fatalf("a second IDENTIFY_CANCEL: %s", ipc.Encode(w))
	}
	// The shard may be asked for again, and withdrawn by a cancel without id.
	waiting = askWaiting(t, e, c, "1", 3)
	if r, err := request(t, c, "identify_cancel", "1", map[string]any{"shard": 3, "no_id": true}, 5*time.Second); err != nil || string(r.Payload) != `{"sent":true}` {
		t.Fatalf("IDENTIFY_CANCEL without id: %v %v", r, err)
	}
	if reply := <-waiting; reply == nil || reply.Error == nil || reply.Error.Code != ipc.CodeCancelled {
		t.Fatalf("the IDENTIFY withdrawn without id was answered %v, want cancelled", reply)
	}
	testenv.WaitFor(t, 5*time.Second, "nothing waiting", func() bool { return e.MustStatus().Discord.IdentifyWaiting == 0 })

	// Refusals, with IDENTIFY's codes.
	if w := botOp(t, c, "identify_cancel", "1", map[string]int{"shard": 0}); w.Error == nil || w.Error.Code != ipc.CodeBadFrame ||
		!strings.Contains(w.Error.Message, "(2-3)") {
		t.Fatalf("IDENTIFY_CANCEL for another cluster's shard: %s", ipc.Encode(w))
	}
	rc := e.rawClient("raw")
	rc.send(`{"op":"IDENTIFY_CANCEL","id":"x","shard":0}`)
	rc.expectError(t, "x", ipc.CodeForbidden)
	// The bots saw no ACTIVATE or restart over it all.
	if got := e.MustStatus(); got.Clusters[1].PID != st.Clusters[1].PID || got.Clusters[1].Restarts != 0 {
		t.Fatalf("cluster 1 disturbed: %+v", got.Clusters[1])
	}
	if regs := botRegs(t, dir, st.Clusters[1].PID); len(regs) != 1 || regs[0].Gateway != nil || regs[0].Start != "first" {
		t.Fatalf("cluster 1's registrations %+v: want one, a first start, without gateway (no token)", regs)
	}
}
