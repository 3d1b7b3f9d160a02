package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// directCluster is one cluster-harness whose manager is the bench itself: the
// bench listens on its own socket, answers the harness's REGISTER as the
// manager would, ACTIVATEs it and then sends requests straight to it. It is
// the round trip without the router, the baseline of the route scenario.
type directCluster struct {
	proc *child
	ln   net.Listener
	conn *ipc.Conn
	pipe *pipe
}

// startTimeout bounds each wait while a process starts: for it to connect,
// to register, to become ready.
const startTimeout = 15 * time.Second

// startDirect starts argv as cluster 0 of a one-shard topology, pointed at a
// socket in dir, and returns once it has registered and been activated.
func startDirect(ctx context.Context, argv []string, dir string, logw io.Writer) (*directCluster, error) {
	sock := filepath.Join(dir, "direct.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: sock})
	if err != nil {
		return nil, fmt.Errorf("direct: %w", err)
	}
	env := append(os.Environ(),
		"SM_SOCKET="+sock, "SM_CLUSTER=0", "SM_GENERATION=1",
		"SM_SHARD_FIRST=0", "SM_SHARD_LAST=0", "SM_TOTAL_SHARDS=1",
		"SM_TOKEN=sm-bench-direct")
	proc, err := startChild("cluster-harness (direct)", argv, env, logw)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("direct: %w", err)
	}
	d := &directCluster{proc: proc, ln: ln}
	if err := d.accept(ctx); err != nil {
		d.stop()
		return nil, fmt.Errorf("direct: %w", err)
	}
	return d, nil
}

// accept takes the harness's connection and registers it.
func (d *directCluster) accept(ctx context.Context) error {
	ul := d.ln.(*net.UnixListener)
	ul.SetDeadline(time.Now().Add(startTimeout))
	stop := context.AfterFunc(ctx, func() { ul.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	nc, err := ul.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("waiting for cluster-harness to connect: %w", d.proc.why(err))
	}
	d.conn = ipc.NewConn(nc, ipc.Options{})
	d.pipe = newPipe(d.conn, d.answer)

	nc.SetReadDeadline(time.Now().Add(startTimeout))
	line, err := d.conn.ReadFrame()
	nc.SetReadDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("read REGISTER: %w", d.proc.why(err))
	}
	f, err := ipc.Decode(line)
	if err != nil {
		return fmt.Errorf("REGISTER: %w", err)
	}
	if f.Op != ipc.OpRegister || f.Role != ipc.RoleCluster {
		return fmt.Errorf("first frame is %s role %q, not a cluster REGISTER", f.Op, f.Role)
	}
	// What the manager answers a cluster's REGISTER with (manager.admitCluster).
	payload, _ := json.Marshal(map[string]any{
		"cluster": 0, "generation": 1, "shard_first": 0, "shard_last": 0,
		"total_shards": 1, "active": true, "heartbeat_interval_ms": 1000,
	})
	if err := d.conn.SendFrame(ipc.Reply(f.ID, payload)); err != nil {
		return err
	}
	return d.conn.SendFrame(&ipc.Frame{Op: ipc.OpActivate})
}

// answer handles what the harness sends besides REPLYs: HEARTBEATs are
// ignored; anything asking for a reply (its flush before it exits) is refused,
// as the manager refuses an op with no target.
func (d *directCluster) answer(f *ipc.Frame) *ipc.Frame {
	if f.ID != "" {
		return ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeUnknownTarget, "sm-bench answers no requests"))
	}
	return nil
}

func (d *directCluster) pid() int { return d.proc.pid() }

// stop QUIESCEs the harness, answers it until it hangs up, and waits for it to
// exit (killing it if it will not). It reports a harness that did not exit
// cleanly.
func (d *directCluster) stop() error {
	if d.conn != nil {
		if d.conn.SendFrame(&ipc.Frame{Op: ipc.OpQuiesce}) == nil {
			nc := d.conn.NetConn()
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				f, err := d.pipe.read()
				if err != nil {
					break
				}
				if a := d.answer(f); f.Op != ipc.OpReply && a != nil {
					d.conn.SendFrame(a)
				}
			}
		}
		d.conn.Close()
		<-d.conn.Done()
	}
	d.ln.Close()
	return d.proc.stop(nil, 5*time.Second)
}

// pidOf reads the pid from a ping reply payload.
func pidOf(payload json.RawMessage) (int, error) {
	var pong struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(payload, &pong); err != nil || pong.PID == 0 {
		return 0, fmt.Errorf("ping reply %s names no pid", payload)
	}
	return pong.PID, nil
}
