package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
	"github.com/sm-supervisor/sm/recycle"
	"github.com/sm-supervisor/sm/supervise"
)

// Every message the event loop handles, and the one switch that dispatches
// them: the loop's inputs, all in one place. The handlers live in the files
// of their concept; what a cluster's supervision decides is
// supervise.Cluster's, and the handlers only translate (supervision.go).

// event is something for the loop to act on.
type event interface{ isEvent() }

// From connection readers.
type (
	// evRegister is a cluster's REGISTER, answered on res (admit.go).
	evRegister struct {
		c   *conn
		f   *ipc.Frame
		res chan<- registerResult
	}
	// evRegistered follows the REGISTER reply on the connection (admit.go).
	evRegistered struct{ p *proc }
	// evHeartbeat asks the loop to take p's heartbeats now (heartbeat.go).
	evHeartbeat struct{ p *proc }
	// evQuiesced is a cluster's QUIESCED, with its resume state and its
	// handoff for the next ACTIVATE (quiesce.go, handoff.go).
	evQuiesced struct {
		p       *proc
		resume  json.RawMessage
		handoff json.RawMessage
	}
	// evIdentify is a cluster's IDENTIFY (identify.go).
	evIdentify struct {
		c *conn
		f *ipc.Frame
	}
	// evIdentifyCancel is a cluster's IDENTIFY_CANCEL (identify.go).
	evIdentifyCancel struct {
		c *conn
		f *ipc.Frame
	}
	// evDisconnect is the end of cluster connection c of p (exit.go).
	evDisconnect struct {
		p *proc
		c *conn
	}
	// evDeploy is a DEPLOY, its config read and Discord asked (deploy.go).
	evDeploy struct {
		f   *ipc.Frame
		cfg *config.Config
		err *ipc.Error
		gw  *discord.GatewayBot
		res chan<- registerResult
	}
	// evStatus asks for a snapshot (status.go).
	evStatus struct{ res chan<- Status }
	// evSubscribe asks for a feed subscription (feed.go).
	evSubscribe struct {
		buf int
		res chan<- subscribeResult
	}
)

// From processes and timers.
type (
	// evExit is the kernel's confirmation that p exited (exit.go).
	evExit struct{ p *proc }
	// evTimer is a timer a cluster's supervision armed, come due
	// (supervision.go); p is nil for supervise.TimerRestart.
	evTimer struct {
		s     *slot
		timer supervise.Timer
		p     *proc
	}
	// evAdoptDone ends the adopt window (adopt.go).
	evAdoptDone struct{}
	// evIdentifyExpire is an IDENTIFY's deadline (identify.go).
	evIdentifyExpire struct{ r *identReq }
	// evGateDue is the identify gate's next slot (identify.go).
	evGateDue struct{}
	// evMeshHold is the mesh agent's decision: this host holds cluster's
	// lease (take) or must stop it (a fence, a lost lease, leaving), and
	// then done, if set, is closed once its processes are gone (mesh.go).
	evMeshHold struct {
		cluster int
		held    bool
		done    chan struct{}
	}
	// evMeshView is the mesh agent's news that its view changed (meshfeed.go).
	evMeshView struct{}
	// evIdentifyClaimed is the mesh's shared identify gate answering a
	// claim of a bucket's slot (meshdiscord.go).
	evIdentifyClaimed struct{ r claimResult }
	// evMeshResume is the mesh's resume state of cluster, read for its
	// take numbered seq, before it is spawned (meshdiscord.go).
	evMeshResume struct {
		cluster int
		seq     uint64
		entries map[int]mesh.ResumeEntry
		err     error
	}
	// evReshard is one check of the [reshard] schedule (reshard.go).
	evReshard reshardCheck
	// evRecycleSamples is a recycling sampler's readings (recycle.go).
	evRecycleSamples struct{ samples []recycle.Sample }
	// evFunc runs a function on the loop: tests read loop-owned state with it.
	evFunc func(*Manager)
)

func (evRegister) isEvent()       {}
func (evRegistered) isEvent()     {}
func (evHeartbeat) isEvent()      {}
func (evQuiesced) isEvent()       {}
func (evIdentify) isEvent()       {}
func (evIdentifyCancel) isEvent() {}
func (evDisconnect) isEvent()     {}
func (evDeploy) isEvent()         {}
func (evStatus) isEvent()         {}
func (evSubscribe) isEvent()      {}
func (evExit) isEvent()           {}
func (evTimer) isEvent()          {}
func (evAdoptDone) isEvent()      {}
func (evIdentifyExpire) isEvent() {}
func (evGateDue) isEvent()        {}
func (evMeshHold) isEvent()       {}
func (evFunc) isEvent()           {}
func (evReshard) isEvent()        {}
func (evRecycleSamples) isEvent() {}

func (evIdentifyClaimed) isEvent() {}
func (evMeshResume) isEvent()      {}
func (evMeshView) isEvent()        {}

// apply handles one event on the loop.
func (m *Manager) apply(ev event) {
	switch ev := ev.(type) {
	case evRegister:
		ev.res <- m.admitCluster(ev.c, ev.f)
	case evRegistered:
		m.greeted(ev.p)
	case evHeartbeat:
		m.drainBeat(ev.p)
	case evQuiesced:
		if len(ev.handoff) > 0 {
			m.keepHandoff(ev.p, ev.handoff) // before the QUIESCED is acted on
		}
		m.quiesced(ev.p, ev.resume)
	case evIdentify:
		m.identify(ev.c, ev.f)
	case evIdentifyCancel:
		m.identifyCancel(ev.c, ev.f)
	case evDisconnect:
		m.disconnected(ev.p, ev.c)
	case evDeploy:
		ev.res <- m.deployEvent(ev)
	case evStatus:
		m.drainBeats()
		ev.res <- m.snapshot(time.Now())
	case evSubscribe:
		ev.res <- m.subscribe(ev.buf)
	case evExit:
		m.exited(ev.p)
	case evTimer:
		m.timerDue(ev.s, ev.timer, ev.p)
	case evAdoptDone:
		m.adoptDone()
	case evIdentifyExpire:
		m.identifyExpired(ev.r)
	case evGateDue:
		m.gateDue()
	case evMeshHold:
		m.meshHold(ev.cluster, ev.held, ev.done)
	case evIdentifyClaimed:
		m.identifyClaimed(ev.r)
	case evMeshResume:
		m.resumeFetched(ev)
	case evReshard:
		m.reshardChecked(reshardCheck(ev))
	case evRecycleSamples:
		m.recycleSampled(ev.samples)
	case evMeshView:
		m.meshView()
	case evFunc:
		ev(m)
	default:
		panic(fmt.Sprintf("manager: unknown event %T", ev))
	}
}

// post hands an event to the loop; it gives up once the manager has stopped.
func (m *Manager) post(ev event) {
	select {
	case m.events <- ev:
	case <-m.done:
	}
}

// errStopped is ask's error once the manager has stopped: a cancelled
// context, as callers whose own context ended see (systemd's watchdog
// tells the two apart from a wedged loop by it).
var errStopped = fmt.Errorf("manager stopped: %w", context.Canceled)

// ask posts the event mk builds around a reply channel, then waits for the
// reply. It gives up with errStopped once the manager has stopped, or with
// ctx's error; a reply already there when either happens still wins.
func ask[T any](m *Manager, ctx context.Context, mk func(res chan<- T) event) (T, error) {
	res := make(chan T, 1)
	var zero T
	select {
	case m.events <- mk(res):
	case <-m.done:
		return zero, errStopped
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case r := <-res:
		return r, nil
	case <-m.done:
	case <-ctx.Done():
	}
	select {
	case r := <-res:
		return r, nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	return zero, errStopped
}
