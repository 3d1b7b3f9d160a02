package supervise

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sm-supervisor/sm/backoff"
)

// TestClusterRandomized drives one Cluster through random interleavings of
// spawns that fail or not, REGISTERs (and refused ones), heartbeats, frames,
// silence, lost connections, QUIESCE that cannot be sent, QUIESCED, crashes,
// stops, timers due early, late or twice, clock jumps, an adopt window with
// survivors, and a deploy taking, spawning for, routing, activating,
// retiring and releasing the cluster; it checks every invariant after every
// event (fake.violations: never two processes routed, only a ready one;
// never two ACTIVE at once; every restart's delay within the backoff's
// bounds, and a crash loop
// reported past the intensity; a cluster nothing holds back always has a
// process or a respawn due). Then it shuts the cluster down and checks that
// every process it was ever told of is confirmed gone.
func TestClusterRandomized(t *testing.T) {
	seen := map[string]int{} // what the runs went through, to show they cover it
	rapid.Check(t, func(t *rapid.T) {
		r := &Rules{
			Policy: RestartPolicy{
				Backoff: backoff.Policy{
					Min:    100 * time.Millisecond,
					Max:    time.Duration(rapid.IntRange(100, 3000).Draw(t, "backoff_max_ms")) * time.Millisecond,
					Jitter: rapid.SampledFrom([]float64{0, 0.2, 0.5}).Draw(t, "jitter"),
				},
				Intensity: rapid.IntRange(0, 4).Draw(t, "intensity"),
				Period:    time.Duration(rapid.IntRange(1, 20).Draw(t, "period_s")) * time.Second,
			},
			StartTimeout:     3 * time.Second,
			HeartbeatTimeout: time.Second,
			QuiesceTimeout:   2 * time.Second,
			DisconnectGrace:  100 * time.Millisecond,
		}
		r.Rand = func() float64 { return rapid.Float64Range(0, 0.999999).Draw(t, "rand") }
		f := newFake(r)
		failSpawns := rapid.IntRange(0, 4).Draw(t, "fail_spawn_one_in")
		failSends := rapid.IntRange(0, 6).Draw(t, "fail_send_one_in")
		one := func(n int, name string) bool { return n > 0 && rapid.IntRange(0, n-1).Draw(t, name) == 0 }
		var steps []string
		check := func(event string) {
			steps = append(steps, event)
			if v := f.violations(); len(v) > 0 {
				t.Fatalf("after %s:\n%s\nsteps: %q\ncalls: %q", event, strings.Join(v, "\n"), steps, f.calls)
			}
		}
		// Every action list goes through run; set the failures it will meet.
		run := func(acts []Action[int]) {
			f.run(acts)
		}
		beforeSpawn := func() {
			if one(failSpawns, "spawn_fails") {
				f.spawnErr = errors.New("spawn failed")
			}
			f.sendErr = one(failSends, "send_fails")
		}
		note := func(what string) { seen[what]++ }

		// A previous manager's survivors, sometimes.
		if rapid.IntRange(0, 3).Draw(t, "adopt") == 0 {
			note("adoption")
			// As a manager that died mid-deploy leaves them: the routed one
			// ACTIVE or not yet, and then the old one ACTIVE still.
			routed := rapid.IntRange(-1, 2).Draw(t, "routed_survivor")
			active := rapid.IntRange(-1, 2).Draw(t, "active_survivor")
			for i := range rapid.IntRange(1, 3).Draw(t, "survivors") {
				p := f.add(&fproc{id: f.newID(), adopted: true, wasRouted: i == routed, activated: i == active})
				f.c.Adopted(f.now, p.id, p.wasRouted, p.activated)
			}
			f.c.Adopting(f.now)
			check("Adopted")
		}
		beforeSpawn()
		run(f.c.Ensure(f.now))
		check("Ensure")

		// pick draws one of the live processes ok accepts, or nil.
		pick := func(name string, ok func(*fproc) bool) *fproc {
			c := slices.DeleteFunc(slices.Clone(f.order), func(p *fproc) bool { return p.gone || !ok(p) })
			if len(c) == 0 {
				return nil
			}
			return rapid.SampledFrom(c).Draw(t, name)
		}
		deploying, adoptOpen := false, f.c.adopting
		actions := map[string]func() bool{
			"register": func() bool {
				p := pick("register", func(p *fproc) bool { return !p.connected })
				if p == nil {
					return false
				}
				err := f.c.Admissible(p.id)
				want := p.lost || p.stopped
				if (err != nil) != want || (err != nil && !errors.Is(err, ErrLeaving)) {
					t.Fatalf("Admissible(%d) = %v; lost %v, stopped %v", p.id, err, p.lost, p.stopped)
				}
				if err != nil {
					return true
				}
				p.connected, p.registered, p.greet = true, true, true
				run(f.c.Registered(f.now, p.id))
				return true
			},
			"greeted": func() bool { // its REGISTER reply went out; heartbeats may have come first
				p := pick("greeted", func(p *fproc) bool { return p.greet })
				if p == nil {
					return false
				}
				p.greet = false
				p.ready = p.ready || (p.wasRouted && p.alive()) // it was serving: ready as it was
				beforeSpawn()
				run(f.c.Greeted(f.now, p.id))
				return true
			},
			"register_again": func() bool {
				p := pick("register_again", func(p *fproc) bool { return p.connected })
				if p == nil {
					return false
				}
				if err := f.c.Admissible(p.id); err == nil {
					t.Fatalf("Admissible(%d) on a live connection", p.id)
				}
				return true
			},
			"heartbeat": func() bool {
				p := pick("heartbeat", func(p *fproc) bool { return p.connected && p.registered })
				if p == nil {
					return false
				}
				ready := rapid.Bool().Draw(t, "ready")
				p.ready = p.ready || ready
				run(f.c.Heartbeat(f.now, p.id, ready))
				return true
			},
			"frames": func() bool {
				p := pick("frames", func(p *fproc) bool { return p.connected })
				if p == nil {
					return false
				}
				f.c.Alive(f.now, p.id)
				return true
			},
			"disconnect": func() bool {
				p := pick("disconnect", func(p *fproc) bool { return p.connected })
				if p == nil {
					return false
				}
				p.connected, p.lost = false, true
				run(f.c.Disconnected(f.now, p.id))
				return true
			},
			"quiesced": func() bool {
				p := pick("quiesced", func(p *fproc) bool { return p.quiesceSent && p.connected && !p.quiesced })
				if p == nil {
					return false
				}
				p.quiesced = true
				if !f.c.Quiesced(f.now, p.id) {
					t.Fatalf("the first QUIESCED of %d was not news", p.id)
				}
				return true
			},
			"exit": func() bool { // the expected exit of a process told to go, or a crash
				crash := rapid.Bool().Draw(t, "crash")
				p := pick("exit", func(p *fproc) bool { return crash || p.quiesced || p.stopped })
				if p == nil {
					return false
				}
				beforeSpawn()
				f.exited(p.id)
				return true
			},
			"advance": func() bool {
				f.now = f.now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(t, "advance_ms")) * time.Millisecond)
				return false // no event
			},
			"tick": func() bool { run(f.c.Tick(f.now)); return true },
			"due": func() bool {
				timer := rapid.SampledFrom([]Timer{TimerRestart, TimerQuiesce, TimerDisconnect}).Draw(t, "timer")
				id := 0
				if timer != TimerRestart && len(f.order) > 0 {
					id = rapid.SampledFrom(f.order).Draw(t, "timer_proc").id
				}
				beforeSpawn()
				run(f.c.Due(f.now, timer, id))
				return true
			},
			"stop": func() bool { // a deploy's, say
				p := pick("stop", func(*fproc) bool { return true })
				if p == nil {
					return false
				}
				run(f.c.Stop(f.now, p.id, "deploy"))
				return true
			},
			"quiesce": func() bool {
				p := pick("quiesce", func(*fproc) bool { return true })
				if p == nil {
					return false
				}
				f.sendErr = one(failSends, "send_fails")
				run(f.c.Quiesce(f.now, p.id))
				return true
			},
			"adopt_done": func() bool {
				if !adoptOpen {
					return false
				}
				adoptOpen = false
				beforeSpawn()
				run(f.c.AdoptDone(f.now))
				return true
			},
			"take": func() bool {
				if deploying || f.c.retired {
					return false
				}
				note("deploy")
				deploying = true
				f.c.Take(f.now)
				return true
			},
			"deploy_spawn": func() bool {
				if !deploying {
					return false
				}
				run(f.c.DeploySpawning(f.now))
				if rapid.Bool().Draw(t, "deploy_spawn_fails") {
					return true
				}
				p := f.add(&fproc{id: f.newID(), deploy: true})
				run(f.c.DeploySpawned(f.now, p.id))
				return true
			},
			"deploy_route": func() bool {
				if !deploying || f.c.retired {
					return false
				}
				// The deploy routes only its own processes, once they said ready.
				p := pick("deploy_route", func(p *fproc) bool { return p.deploy && p.registered && p.ready && p.alive() })
				if p == nil || rapid.IntRange(0, 3).Draw(t, "route_none") == 0 {
					run(f.c.DeployRouted(f.now, 0, false))
				} else {
					run(f.c.DeployRouted(f.now, p.id, true))
				}
				return true
			},
			"deploy_activate": func() bool {
				// A deploy ACTIVATEs its routed process once every other
				// process of the cluster is gone.
				if !deploying || f.routed == 0 || len(f.c.procs) > 1 {
					return false
				}
				run(f.c.Activate(f.now, f.routed))
				return true
			},
			"retire": func() bool {
				if !deploying || f.c.retired || rapid.IntRange(0, 3).Draw(t, "really_retire") != 0 {
					return false
				}
				note("retired")
				f.routed = 0 // a new table, with new clusters
				run(f.c.Retire(f.now))
				return true
			},
			"release": func() bool {
				if !deploying || f.c.retired {
					return false
				}
				deploying = false
				beforeSpawn()
				run(f.c.Release(f.now))
				return true
			},
		}
		// A mesh's lease, lost and taken again: unheld, nothing is spawned
		// (the fake flags any spawn) and every process is killed.
		actions["unhold"] = func() bool {
			note("fenced")
			run(f.c.Hold(f.now, false))
			for _, p := range f.order {
				if !p.gone && !p.stopped {
					t.Fatalf("process %d not stopped by the fence: %q", p.id, f.calls)
				}
			}
			return true
		}
		actions["hold"] = func() bool {
			beforeSpawn()
			run(f.c.Hold(f.now, true))
			return true
		}
		weighted := []string{
			"register", "register", "register", "greeted", "greeted", "register_again", "heartbeat", "heartbeat", "heartbeat", "heartbeat",
			"frames", "disconnect", "quiesced", "exit", "exit", "exit", "exit", "advance", "advance", "advance",
			"tick", "tick", "due", "due", "due", "stop", "quiesce", "adopt_done",
			"take", "deploy_spawn", "deploy_route", "deploy_activate", "retire", "release",
			"unhold", "hold",
		}
		for range rapid.IntRange(0, 200).Draw(t, "steps") {
			name := rapid.SampledFrom(weighted).Draw(t, "action")
			if actions[name]() {
				check(name)
			}
		}
		if f.c.hist.CrashLoop || f.crashLoop {
			note("crash loop")
		}
		if f.total > 0 {
			note("restarted")
		}

		// Shut down: every process the cluster was told of must end, and
		// nothing may be spawned.
		f.closed = true
		run(f.c.Close(f.now))
		check("Close")
		run(f.c.QuiesceAll(f.now))
		check("QuiesceAll")
		cooperative := rapid.Bool().Draw(t, "cooperative")
		for i := 0; len(f.c.procs) > 0; i++ {
			if i > 20 {
				t.Fatalf("%d processes left after shutdown: %q", len(f.c.procs), f.calls)
			}
			if !cooperative {
				f.now = f.now.Add(r.QuiesceTimeout + r.StartTimeout)
				for _, p := range f.order {
					if !p.gone {
						run(f.c.Due(f.now, TimerQuiesce, p.id))
						check("Due")
					}
				}
			}
			for _, p := range f.order {
				if !p.gone && (p.stopped || (cooperative && p.quiesceSent)) {
					f.exited(p.id)
					check("Exited")
				}
			}
		}
		for _, p := range f.order {
			if !p.gone {
				t.Fatalf("process %d was never confirmed gone", p.id)
			}
		}
	})
	t.Logf("runs that saw: %v", seen)
}
