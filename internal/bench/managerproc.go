package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// managerProc is a real sm-manager process on a socket in a temp dir.
type managerProc struct {
	proc   *child
	socket string
	// clusters are the cluster pids waitReady saw, to kill should the manager
	// have to be killed itself (they would outlive it, reconnecting forever).
	clusters []int
}

// managerConfig is the configuration the bench runs the manager with: the
// defaults, a socket in dir, clusters clusters of one shard each, clusterArgv
// as the cluster command, and a near-zero identify spacing. It is validated as
// the manager will.
func managerConfig(dir string, clusters int, clusterArgv []string) (*config.Config, error) {
	cfg := config.Default()
	cfg.Socket = filepath.Join(dir, "sm.sock")
	cfg.Topology = config.Topology{TotalShards: clusters, ShardsPerCluster: 1}
	cfg.Cluster.Command = clusterArgv
	cfg.LogLevel = "warn"
	// The simulated bot has no real gateway: Discord's 5s between IDENTIFYs
	// would only make 256 clusters take 20 minutes to start.
	cfg.Discord.IdentifySpacing = config.Duration{Duration: time.Millisecond}
	// No fixed ports: two benchmark managers (or one beside a real one) must
	// not collide. Scenarios that want the page or metrics pick free ports.
	cfg.Status.Listen, cfg.Admin.Listen = "", ""
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// startManager writes cfg into dir and starts bin on it, with extra flags.
func startManager(bin, dir string, cfg *config.Config, logw io.Writer, extra ...string) (*managerProc, error) {
	path := filepath.Join(dir, fmt.Sprintf("sm-%d.toml", cfg.Topology.TotalShards))
	if err := writeTOML(path, cfg); err != nil {
		return nil, fmt.Errorf("write manager config: %w", err)
	}
	proc, err := startChild("sm-manager", append([]string{bin, "-config", path}, extra...), os.Environ(), logw)
	if err != nil {
		return nil, err
	}
	return &managerProc{proc: proc, socket: cfg.Socket}, nil
}

// writeTOML writes cfg to path as TOML, readable by its owner only.
func writeTOML(path string, cfg *config.Config) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = toml.NewEncoder(f).Encode(cfg)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cpuProfileFlags are the manager's flags that make it write a CPU profile of
// its whole life to path, for go tool pprof (its hidden -cpuprofile flag);
// none for "".
func cpuProfileFlags(path string) []string {
	if path == "" {
		return nil
	}
	return []string{"-cpuprofile", path}
}

func (m *managerProc) pid() int { return m.proc.pid() }

// dial connects to the manager, retrying until its socket answers, and
// REGISTERs as a client named name.
func (m *managerProc) dial(ctx context.Context, name string) (*pipe, error) {
	deadline := time.Now().Add(startTimeout)
	var nc net.Conn
	for {
		var err error
		d := net.Dialer{Timeout: time.Second}
		nc, err = d.DialContext(ctx, "unix", m.socket)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("dial sm-manager: %w", m.proc.why(err))
		}
		select {
		case <-m.proc.exited:
			return nil, fmt.Errorf("dial sm-manager: %w", m.proc.why(err))
		case <-time.After(20 * time.Millisecond):
		}
	}
	conn := ipc.NewConn(nc, ipc.Options{})
	if err := conn.SendFrame(&ipc.Frame{Op: ipc.OpRegister, ID: "register", Role: ipc.RoleClient, Name: name}); err != nil {
		conn.Abort(nil)
		return nil, err
	}
	nc.SetReadDeadline(time.Now().Add(startTimeout))
	line, err := conn.ReadFrame()
	nc.SetReadDeadline(time.Time{})
	var reply *ipc.Frame
	if err == nil {
		reply, err = ipc.Decode(line)
	}
	if err == nil && reply.Error != nil {
		err = reply.Error
	}
	if err != nil {
		conn.Abort(nil)
		<-conn.Done()
		return nil, fmt.Errorf("REGISTER with sm-manager: %w", m.proc.why(err))
	}
	return newPipe(conn, nil), nil
}

// waitReady pings target until it answers: a cluster id until its process
// replies, or "*" until every cluster does. It returns the ping replies'
// payloads (one per cluster).
func (m *managerProc) waitReady(ctx context.Context, p *pipe, target string, timeout time.Duration) ([]json.RawMessage, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		var probe books
		reply, err := p.call(ctx, &ipc.Frame{Op: "ping", Target: target, TimeoutMS: 1000}, 5*time.Second, &probe)
		if err == nil {
			var payloads []json.RawMessage
			payloads, err = pingResults(target, reply)
			if err == nil {
				for _, p := range payloads {
					if pid, err := pidOf(p); err == nil {
						m.clusters = append(m.clusters, pid)
					}
				}
				return payloads, nil
			}
		}
		last = err
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("target %q not ready after %v: %w", target, timeout, m.proc.why(last))
		}
		select {
		case <-m.proc.exited:
			return nil, m.proc.why(last)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pingResults checks a ping reply: for a broadcast, every cluster's result.
func pingResults(target string, reply *ipc.Frame) ([]json.RawMessage, error) {
	if reply.Error != nil {
		return nil, reply.Error
	}
	if target != ipc.TargetAll {
		return []json.RawMessage{reply.Payload}, nil
	}
	var all ipc.Broadcast
	if err := json.Unmarshal(reply.Payload, &all); err != nil {
		return nil, fmt.Errorf("broadcast reply: %w", err)
	}
	out := make([]json.RawMessage, 0, len(all.Results))
	down := 0
	var first *ipc.Error
	for _, r := range all.Results {
		if r.Error != nil {
			down++
			if first == nil {
				first = r.Error
			}
			continue
		}
		out = append(out, r.Payload)
	}
	if down > 0 {
		return nil, fmt.Errorf("%d of %d clusters not ready (%w)", down, len(all.Results), first)
	}
	return out, nil
}

// stop asks the manager to shut down (SIGTERM: it quiesces every cluster) and
// waits for it, killing it past the grace period. A non-zero exit is an error.
func (m *managerProc) stop(grace time.Duration) error {
	err := m.proc.stop(syscall.SIGTERM, grace)
	if errors.Is(err, errKilled) {
		for _, pid := range m.clusters {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return err
}
