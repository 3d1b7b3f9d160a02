package manager_test

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// limits.max_connections bounds clients; a supervised process always gets
// its connection, even when clients fill the limit while it is still
// starting (or being replaced) and a third client tries its luck.
func TestClientsCannotTakeAClustersConnection(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxConnections = 2
	// Cluster 3 connects a second late: its connection is owed meanwhile.
	runFirst(t, cfg, 3, "sleep 1")
	e := start(t, cfg)
	e.WaitReady(0, 1, 2)
	if st := e.MustStatus(); st.Clusters[3].State != "starting" {
		t.Fatalf("cluster 3 is %s already: the test needs it still connecting", st.Clusters[3].State)
	}
	e.client("a")
	e.client("b")
	rc := e.dialRaw("intruder")
	rc.send(`{"op":"REGISTER","id":"r","role":"client","name":"intruder"}`)
	if f := rc.read(t, 3*time.Second); f.ID != "r" || f.Error == nil || f.Error.Code != ipc.CodeBusy {
		t.Fatalf("a third client: %s, want busy", ipc.Encode(f))
	}
	e.WaitReady() // cluster 3 got its connection
}
