package generation

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// outcomes counts how the randomized runs ended, to show they cover every ending.
var outcomes = struct {
	sync.Mutex
	m map[string]int
}{m: map[string]int{}}

// TestDeployRandomized drives random plans (rolling with random clusters and
// max_parallel, or re-clustering) through random interleavings of readiness,
// QUIESCED, exits, crashes, clock jumps, ticks, duplicate and unknown events
// and an abort, checking every invariant after every event; then it drives
// the deploy to Done and checks what it leaves behind.
func TestDeployRandomized(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		from := topo(rapid.IntRange(1, 12).Draw(t, "from_total"), rapid.IntRange(1, 4).Draw(t, "from_per"))
		to := from
		if rapid.Bool().Draw(t, "recluster") {
			to = topo(rapid.IntRange(1, 12).Draw(t, "to_total"), rapid.IntRange(1, 4).Draw(t, "to_per"))
		}
		var missing []int
		for c := range from.Clusters() {
			if rapid.IntRange(0, 4).Draw(t, "missing") == 0 {
				missing = append(missing, c)
			}
		}
		f := newFake(from, missing...)
		for c := range max(from.Clusters(), to.Clusters()) {
			if rapid.IntRange(0, 15).Draw(t, "spawn_fails") == 0 {
				f.spawnErr[c] = errors.New("spawn failed")
			}
		}
		p := plan(from, to, f, rapid.IntRange(1, 4).Draw(t, "max_parallel"))
		p.ReadyTimeout = time.Duration(rapid.IntRange(1, 10).Draw(t, "ready_timeout_s")) * time.Second
		p.QuiesceTimeout = time.Duration(rapid.IntRange(1, 10).Draw(t, "quiesce_timeout_s")) * time.Second
		if to == from && rapid.Bool().Draw(t, "some_clusters") {
			all := make([]int, from.Clusters())
			for c := range all {
				all[c] = c
			}
			perm := rapid.Permutation(all).Draw(t, "order")
			p.Clusters = perm[:rapid.IntRange(1, len(perm)).Draw(t, "how_many")]
		}
		p.Resume = to == from && rapid.Bool().Draw(t, "resume")
		d, err := NewDeploy(p, f.clock, f)
		if err != nil {
			t.Fatal(err)
		}
		f.d = d
		check := func(event string) {
			if v := f.violations(d); len(v) > 0 {
				t.Fatalf("after %s:\n%s\ncalls: %q", event, strings.Join(v, "\n"), f.calls)
			}
		}
		d.Start()
		check("Start")

		pick := func(name string, ok func(*fproc) bool) *fproc {
			var c []*fproc
			for _, q := range f.order {
				if !q.exited && ok(q) {
					c = append(c, q)
				}
			}
			if len(c) == 0 {
				return nil
			}
			return rapid.SampledFrom(c).Draw(t, name)
		}
		actions := map[string]func() bool{
			"ready": func() bool {
				q := pick("ready", func(q *fproc) bool { return !q.old && !q.ready })
				if q == nil {
					return false
				}
				q.ready = true
				d.Ready(q.ref)
				return true
			},
			"quiesced": func() bool {
				q := pick("quiesced", func(q *fproc) bool { return q.quiesceSent && !q.quiesced })
				if q == nil {
					return false
				}
				q.quiesced = true
				d.Quiesced(q.ref)
				return true
			},
			"exit": func() bool { // the expected exit of a process told to go
				q := pick("exit", func(q *fproc) bool { return q.quiesced || q.stopped })
				if q == nil {
					return false
				}
				f.exited(d, q.ref)
				return true
			},
			"crash": func() bool {
				q := pick("crash", func(*fproc) bool { return true })
				if q == nil {
					return false
				}
				f.exited(d, q.ref)
				return true
			},
			"advance": func() bool {
				f.now = f.now.Add(time.Duration(rapid.IntRange(0, 12000).Draw(t, "advance_ms")) * time.Millisecond)
				return false // no event: nothing to check until the next one
			},
			"tick": func() bool { d.Tick(); return true },
			"noise": func() bool { // repeated events, and events about strangers
				if len(f.order) == 0 {
					return false
				}
				q := rapid.SampledFrom(f.order).Draw(t, "noise_proc")
				ref := q.ref
				if rapid.Bool().Draw(t, "stranger") {
					ref.Seq += 1000
				}
				switch {
				case q.exited || ref != q.ref:
					d.Exited(ref)
					d.Ready(ref)
					d.Quiesced(ref)
				case q.ready:
					d.Ready(ref)
				case q.quiesced:
					d.Quiesced(ref)
				default:
					return false
				}
				return true
			},
		}
		weighted := []string{"ready", "ready", "ready", "quiesced", "quiesced", "exit", "exit", "crash", "advance", "tick", "noise"}
		steps := rapid.IntRange(0, 150).Draw(t, "steps")
		abortAt := rapid.IntRange(0, 300).Draw(t, "abort_at")
		for i := range steps {
			if i == abortAt {
				d.Abort("test")
				check("Abort")
				continue
			}
			name := rapid.SampledFrom(weighted).Draw(t, "action")
			if actions[name]() {
				check(name) // "advance" returns false: time passing is no event
			}
		}

		// Drive it to Done: either every process does the right thing at once
		// (which must succeed if nothing failed yet), or the clock runs past
		// every deadline and killed processes die.
		cooperative := rapid.Bool().Draw(t, "cooperative")
		d.Tick() // the clock may have passed a deadline since the last event
		check("Tick")
		wasRunning := d.Status().State == StateRunning
		for i := 0; !d.Done(); i++ {
			if i > 100 {
				t.Fatalf("not done: %+v", d.Status())
			}
			if !cooperative {
				f.now = f.now.Add(p.ReadyTimeout + p.QuiesceTimeout)
				d.Tick()
				check("Tick")
			}
			for _, q := range f.order {
				switch {
				case q.exited:
				case cooperative && !q.old && !q.ready && !q.stopped:
					q.ready = true
					d.Ready(q.ref)
					check("Ready")
				case cooperative && q.quiesceSent && !q.quiesced:
					q.quiesced = true
					d.Quiesced(q.ref)
					check("Quiesced")
				case q.quiesced || q.stopped:
					f.exited(d, q.ref)
					check("Exited")
				}
			}
		}
		check("the end")
		st := d.Status()
		spawnFailed := false
		for _, c := range st.Clusters {
			spawnFailed = spawnFailed || strings.Contains(c.Reason, "spawn failed")
		}
		if cooperative && wasRunning && !spawnFailed && st.State != StateSucceeded {
			t.Fatalf("a cooperative finish of a running deploy ended %s: %s", st.State, st.Reason)
		}
		mode := "rolling"
		if to != from {
			mode = "reclustering"
		}
		outcomes.Lock()
		outcomes.m[mode+" "+string(st.State)]++
		outcomes.Unlock()
	})
	outcomes.Lock()
	t.Logf("outcomes: %v", outcomes.m)
	outcomes.Unlock()
}
