package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// How the scenarios set up a real sm-manager with simulated clusters. The
// deploy and chaos scenarios have their own (rollFleet, rollfleet.go), since
// they rewrite the manager's config as they go; the rest start one of these:
//
//   - attachedManager (route, api, feed, and route's idle measurement): the
//     manager and the bench's own pipe to it, pinged until the clusters
//     answer, then used for the measured load;
//   - fleet (manager-kill, scale, soak): the manager, many clusters and a
//     control client for STATUS and DEPLOY, waited for until STATUS shows
//     every cluster ready, and a safety net that kills every cluster process
//     the scenario leaves.

// simHarness is the cluster command of the scenarios that measure the
// manager rather than the bot: cluster-harness simulating a bot whose shards
// connect at once and that sends no events besides its heartbeats.
func simHarness(bin string) []string {
	return []string{bin, "--simulate", "--connect-delay=0", "--event-interval=0"}
}

// readyTimeout bounds the wait for n simulated clusters to be ready: the
// start of any process, and 100 ms more per cluster.
func readyTimeout(n int) time.Duration {
	return startTimeout + time.Duration(n)*100*time.Millisecond
}

// freeLoopbackAddr returns a TCP address on 127.0.0.1 that was free a moment
// ago (the kernel picked it), for a child process to listen on: the manager's
// status page or metrics, or sm-api.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// fleetConfig is managerConfig with clusters clusters of perCluster shards,
// no status page, and the metrics endpoint on adminAddr ("" for none): the
// defaults' fixed ports would collide with any other manager on the machine.
func fleetConfig(dir string, clusters, perCluster int, harnessArgv []string, adminAddr string) (*config.Config, error) {
	cfg, err := managerConfig(dir, clusters, harnessArgv)
	if err != nil {
		return nil, err
	}
	cfg.Topology = config.Topology{TotalShards: clusters * perCluster, ShardsPerCluster: perCluster}
	cfg.Status.Listen = ""
	cfg.Admin.Listen = adminAddr
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// attachedManager is a real sm-manager with the bench's own client connection
// on it, a pipe: for pings until the clusters answer, then for the load.
type attachedManager struct {
	*managerProc
	client *pipe
}

// startAttached starts bin on cfg in dir (with extra flags) and connects the
// bench's client, named sm-bench. On an error the manager is stopped again.
func startAttached(ctx context.Context, bin, dir string, cfg *config.Config, logw io.Writer, extra ...string) (*attachedManager, error) {
	mgr, err := startManager(bin, dir, cfg, logw, extra...)
	if err != nil {
		return nil, err
	}
	client, err := mgr.dial(ctx, "sm-bench")
	if err != nil {
		return nil, errors.Join(err, mgr.stop(time.Minute))
	}
	return &attachedManager{managerProc: mgr, client: client}, nil
}

// ready pings target through the client until it answers (see
// managerProc.waitReady) and returns the replies' payloads.
func (m *attachedManager) ready(ctx context.Context, target string, timeout time.Duration) ([]json.RawMessage, error) {
	return m.waitReady(ctx, m.client, target, timeout)
}

// shutdown closes the client, then stops the manager (SIGTERM, a minute's
// grace); a manager that did not exit cleanly is an error.
func (m *attachedManager) shutdown() error {
	m.client.close()
	return m.stop(time.Minute)
}

// fleet is a real sm-manager with many simulated clusters, on a socket in a
// scenario's temp dir, and the control client the bench sends STATUS and
// DEPLOY on. Its manager may be killed and started again on the same config
// (manager-kill); whatever happens, close leaves no cluster process behind.
type fleet struct {
	cfg     *config.Config // the scenario may adjust it before start
	dir     string
	logw    io.Writer
	mgr     *managerProc // the last one started
	ctl     *ipc.Client  // nil when not connected
	stopped bool         // mgr was stopped (SIGTERM) rather than left to close
}

// newFleet configures a fleet of clusters simulated clusters of perCluster
// shards in sc's dir, with the metrics endpoint on adminAddr ("" for none).
// Nothing runs until start.
func newFleet(sc *scratch, harnessBin string, clusters, perCluster int, adminAddr string) (*fleet, error) {
	cfg, err := fleetConfig(sc.dir, clusters, perCluster, simHarness(harnessBin), adminAddr)
	if err != nil {
		return nil, err
	}
	return &fleet{cfg: cfg, dir: sc.dir, logw: sc.log}, nil
}

// start starts bin on the fleet's config, with extra flags, and connects the
// control client. A manager started after one that was killed adopts its
// predecessor's clusters: they are its to kill should it be killed itself.
func (f *fleet) start(ctx context.Context, bin string, extra ...string) error {
	f.disconnect()
	mgr, err := startManager(bin, f.dir, f.cfg, f.logw, extra...)
	if err != nil {
		return err
	}
	if f.mgr != nil {
		mgr.clusters = f.mgr.clusters
	}
	f.mgr, f.stopped = mgr, false
	if f.ctl, err = dialRetry(ctx, f.cfg.Socket, "sm-bench-control", false, nil); err != nil {
		return mgr.proc.why(err)
	}
	return nil
}

// waitReady polls STATUS every poll, for at most timeout, until every cluster
// is ready and routed (see waitAllReady), and notes the cluster processes it
// saw as the manager's.
func (f *fleet) waitReady(ctx context.Context, timeout, poll time.Duration, progress func(manager.Status)) (manager.Status, error) {
	st, err := waitAllReady(ctx, f.ctl, timeout, poll, f.mgr.proc.exited, progress)
	if len(st.Clusters) > 0 {
		f.mgr.clusters = clusterPIDs(st)
	}
	return st, err
}

// refresh reads STATUS, within timeout, and notes its cluster processes as
// the manager's.
func (f *fleet) refresh(ctx context.Context, timeout time.Duration) (manager.Status, error) {
	st, err := mgrStatus(ctx, f.ctl, timeout)
	if err == nil {
		f.mgr.clusters = clusterPIDs(st)
	}
	return st, err
}

// disconnect closes the control client, if connected.
func (f *fleet) disconnect() {
	if f.ctl != nil {
		f.ctl.Close()
		f.ctl = nil
	}
}

// stop closes the control client and stops the manager: SIGTERM (it quiesces
// every cluster), and SIGKILL to it and its clusters past grace. A manager
// that did not exit cleanly is an error; see reap for what it left.
func (f *fleet) stop(grace time.Duration) error {
	f.disconnect()
	f.stopped = true
	return f.mgr.stop(grace)
}

// reap kills the fleet's cluster processes still alive and says how many
// there were: after stop, the check that the manager left nothing.
func (f *fleet) reap() int { return reapLeftovers(f.cfg.Socket) }

// close is the scenario's safety net, deferred once the fleet is configured:
// it kills a manager that was not stopped (its clusters would outlive it,
// reconnecting forever) and every cluster process left, and adds to a
// non-nil err how many there were.
func (f *fleet) close(err error) error {
	f.disconnect()
	if f.mgr != nil && !f.stopped {
		f.mgr.proc.stop(os.Kill, 5*time.Second)
	}
	if n := f.reap(); n > 0 && err != nil {
		err = fmt.Errorf("%w (killed %d cluster processes left behind)", err, n)
	}
	return err
}
