package natstest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StartCluster starts n servers forming one JetStream cluster on loopback
// (server names n1..nN, cluster "sm"), each with its own store, and waits
// until JetStream answers through every one of them: a meta leader is
// elected. opts shapes each server (Bin, Auth); its Host, Port, StoreDir and
// Extra are the cluster's own. The test's cleanup stops them.
func StartCluster(t testing.TB, n int, opts Options) []*Server {
	t.Helper()
	clientPorts, routePorts := freePorts(t, n), freePorts(t, n)
	routes := make([]string, n)
	for i, p := range routePorts {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	servers := make([]*Server, n)
	for i := range n {
		o := opts
		o.Host, o.Port, o.StoreDir = "127.0.0.1", clientPorts[i], ""
		o.Extra = fmt.Sprintf("server_name: n%d\ncluster {\n  name: sm\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
			i+1, routePorts[i], strings.Join(routes, ", "))
		servers[i] = Start(t, o)
	}
	for _, s := range servers {
		WaitJetStream(t, s.URL, 30*time.Second)
	}
	return servers
}

// URLs is the servers' client URLs, comma-separated, as mesh.nats_url takes them.
func URLs(servers []*Server) string {
	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.URL
	}
	return strings.Join(urls, ",")
}

// WaitJetStream waits until JetStream answers an account-info request
// through the server at url (a cluster's needs its meta leader).
func WaitJetStream(t testing.TB, url string, within time.Duration) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream at %s not ready within %v: %v", url, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freePorts finds n loopback ports nothing listens on now, all held open
// until every one is found so that none repeats.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	lns := make([]net.Listener, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], ports[i] = ln, ln.Addr().(*net.TCPAddr).Port
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}
