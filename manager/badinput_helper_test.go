package manager_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// bystander is a well-behaved client kept beside a misbehaving connection:
// after the bad input it must still get its answers, fast, from the same
// cluster processes. It is a raw connection, not an ipc.Client, so a manager
// that dropped it could not hide that behind a reconnect.
type bystander struct {
	t        *testing.T
	e        *env
	rc       *rawConn
	clusters []int       // the clusters it pings
	pids     map[int]int // cluster → pid when the test began
	seq      int
}

// newBystander waits until clusters are ready and routed, registers the
// bystander and checks it works before the bad input starts. With no
// clusters named it uses them all.
func newBystander(t *testing.T, e *env, clusters ...int) *bystander {
	t.Helper()
	if len(clusters) == 0 {
		for i := range e.Topology().Clusters() {
			clusters = append(clusters, i)
		}
	}
	b := &bystander{t: t, e: e, clusters: clusters, pids: map[int]int{}}
	testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("clusters %v ready", clusters), func() bool {
		st := e.MustStatus()
		for _, i := range clusters {
			if c := st.Clusters[i]; c.State != "ready" || !c.Routed {
				return false
			}
		}
		return true
	})
	st := e.MustStatus()
	for _, i := range clusters {
		b.pids[i] = st.Clusters[i].PID
	}
	b.rc = e.rawClient("bystander")
	b.check()
	return b
}

// ping asks cluster i for a pong and fails the test unless it comes back
// within a second from the process that served it at the start.
func (b *bystander) ping(i int) time.Duration {
	b.t.Helper()
	b.seq++
	id := "by" + strconv.Itoa(b.seq)
	start := time.Now()
	b.rc.send(`{"op":"ping","id":"` + id + `","target":"` + strconv.Itoa(i) + `"}`)
	// The ping shares the cluster's connection with whatever flood a test
	// makes, so it may queue behind up to limits.max_queue_bytes of it:
	// bounded, but on a loaded machine not always within a second.
	f := b.rc.read(b.t, 5*time.Second)
	took := time.Since(start)
	if f.Op != ipc.OpReply || f.ID != id || f.Error != nil {
		b.t.Fatalf("bystander ping %d: got %s", i, ipc.Encode(f))
	}
	if p := pingOf(b.t, f); p.Cluster != i || p.PID != b.pids[i] {
		b.t.Fatalf("bystander ping %d answered by %+v, want pid %d", i, p, b.pids[i])
	}
	return took
}

// check pings every cluster and checks none of them restarted.
func (b *bystander) check() {
	b.t.Helper()
	for _, i := range b.clusters {
		b.ping(i)
	}
	st := b.e.MustStatus()
	for _, i := range b.clusters {
		c := st.Clusters[i]
		if c.Restarts != 0 || c.PID != b.pids[i] || c.State != "ready" || !c.Routed {
			b.t.Fatalf("cluster %d disturbed: %+v (pid at start %d)", i, c, b.pids[i])
		}
	}
}

// The uid test re-execs this test binary as an unprivileged user (go-plugin's
// TestHelperProcess pattern). The switch is read in init rather than in a test
// function because TestMain builds cluster-harness first, which a process
// running as nobody neither can nor needs to do.
const (
	helperEnv       = "SM_BADINPUT_HELPER"
	helperSocketEnv = "SM_BADINPUT_SOCKET"
)

func init() {
	if os.Getenv(helperEnv) == "register" {
		os.Exit(helperRegister(os.Getenv(helperSocketEnv)))
	}
}

// helperRegister dials the socket, sends a client REGISTER and prints what
// came back, one line per frame, then "closed" once the manager hangs up.
func helperRegister(path string) int {
	nc, err := net.Dial("unix", path)
	if err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	defer nc.Close()
	// The manager may refuse and hang up before this write lands (it checks
	// the peer before reading anything); its refusal is still there to read.
	if _, err := io.WriteString(nc, `{"op":"REGISTER","id":"u1","role":"client","name":"nobody"}`+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, "write:", err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := ipc.NewReader(nc, 1<<20)
	for {
		line, err := r.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				fmt.Println("still open")
				return 1
			}
			fmt.Println("closed")
			return 0
		}
		fmt.Printf("frame %s\n", line)
	}
}

// TestHelperProcess is not a test: it names the entry point the uid test
// re-execs (see init), so `go test -run` lists it and skips it.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper process for TestBadInputUIDNotAllowed")
	}
}
