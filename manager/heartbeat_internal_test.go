package manager

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

func beat(ready bool, resume string) *ipc.Frame {
	f := &ipc.Frame{Op: ipc.OpHeartbeat, Ready: ipc.Bool(ready), Payload: json.RawMessage(`{}`)}
	if resume != "" {
		f.Resume = json.RawMessage(resume)
	}
	return f
}

// The box keeps what the loop needs of heartbeats it has not taken yet:
// readiness latches, the last payload wins, every resume report stays in order.
func TestBeatBox(t *testing.T) {
	var b beatBox
	t0 := time.Now()
	if !b.stamp(beat(true, `[1]`), t0) {
		t.Error("a process not yet steady: the loop must be woken")
	}
	b.stamp(beat(false, `[2]`), t0.Add(time.Second)) // a shard flapped
	got := b.take()
	if got.n != 2 || !got.sawReady || got.ready || !got.at.Equal(t0.Add(time.Second)) {
		t.Errorf("took n=%d sawReady=%v ready=%v at=%v: a ready heartbeat must latch", got.n, got.sawReady, got.ready, got.at)
	}
	if len(got.resume) != 2 || string(got.resume[0]) != `[1]` || string(got.resume[1]) != `[2]` {
		t.Errorf("resume reports %q, want both in order", got.resume)
	}
	if again := b.take(); again.n != 0 || again.sawReady || again.resume != nil {
		t.Errorf("a second take: %+v, want nothing", again)
	}

	b.setSteady(true)
	for i := range maxPendingResume - 1 {
		if b.stamp(beat(true, `[3]`), t0) {
			t.Fatalf("steady, %d resume reports waiting: woke the loop", i+1)
		}
	}
	if !b.stamp(beat(true, `[3]`), t0) {
		t.Errorf("%d resume reports waiting: the loop must be woken", maxPendingResume)
	}
	b.take()
	if b.stamp(beat(true, ""), t0) {
		t.Error("steady, nothing waiting: woke the loop")
	}
}
