package generation_test

import (
	"fmt"
	"time"

	"github.com/sm-supervisor/sm/generation"
)

// A topology splits shards into contiguous clusters, and a business op's
// target names one of them.
func ExampleTopology() {
	t := generation.Topology{Total: 10, PerCluster: 4}
	fmt.Println(t, "has", t.Clusters(), "clusters")
	for c := range t.Clusters() {
		first, last := t.Range(c)
		fmt.Printf("cluster %d: shards %d-%d\n", c, first, last)
	}
	// Discord's shard formula: (guild >> 22) % total.
	fmt.Println("guild 81384788765712384 is on shard", t.ShardOfGuild(81384788765712384))
	for _, target := range []string{"1", "shard:9", "guild:81384788765712384", "*", "7"} {
		c, err := t.Resolve(target)
		switch {
		case err != nil:
			fmt.Println(target, "→", err)
		case c == generation.All:
			fmt.Println(target, "→ every cluster")
		default:
			fmt.Println(target, "→ cluster", c)
		}
	}
	// Output:
	// 10 shards / 4 per cluster has 3 clusters
	// cluster 0: shards 0-3
	// cluster 1: shards 4-7
	// cluster 2: shards 8-9
	// guild 81384788765712384 is on shard 8
	// 1 → cluster 1
	// shard:9 → cluster 2
	// guild:81384788765712384 → cluster 2
	// * → every cluster
	// 7 → unknown target: "7" is not a cluster of 3
}

// A routing table is never changed: each change makes a new one, which the
// manager publishes atomically, so readers of the old one need no lock.
func ExampleRoutes() {
	old := generation.ProcRef{Cluster: 1, Generation: 4, Seq: 11}
	next := generation.ProcRef{Cluster: 1, Generation: 5, Seq: 19}

	r := generation.NewRoutes(generation.Topology{Total: 8, PerCluster: 4})
	r1 := r.With(old)
	r2 := r1.Without(old).With(next) // a deploy's switch for cluster 1
	for _, t := range []*generation.Routes{r, r1, r2} {
		p, ok := t.Routed(1)
		fmt.Println(p, ok)
	}
	// Output:
	// 0@0#0 false
	// 1@4#11 true
	// 1@5#19 true
}

// printActuator carries out a deploy's decisions by printing them; the
// manager's starts and signals processes instead.
type printActuator struct {
	routes  *generation.Routes
	spawned generation.ProcRef // the last one
}

func (a *printActuator) Spawn(cluster int, gen int64, _ generation.Topology) (generation.ProcRef, error) {
	a.spawned = generation.ProcRef{Cluster: cluster, Generation: gen, Seq: a.spawned.Seq + 100}
	fmt.Println("spawn", a.spawned)
	return a.spawned, nil
}

func (a *printActuator) Route(update func(*generation.Routes) *generation.Routes) {
	a.routes = update(a.routes)
	p, _ := a.routes.Routed(0)
	fmt.Println("route cluster 0 to", p)
}

func (a *printActuator) Quiesce(p generation.ProcRef)  { fmt.Println("quiesce", p) }
func (a *printActuator) Stop(p generation.ProcRef)     { fmt.Println("stop", p) }
func (a *printActuator) Activate(p generation.ProcRef) { fmt.Println("activate", p) }
func (a *printActuator) Release(cluster int)           { fmt.Println("release", cluster) }

// A deploy of one cluster, driven by hand: the events the manager would feed
// it from the processes, and the decisions it answers with, in the design's
// four steps. It does no I/O, and reads the time only from the clock it is
// given, so this runs in microseconds.
func ExampleDeploy() {
	topo := generation.Topology{Total: 4, PerCluster: 4}
	old := generation.ProcRef{Cluster: 0, Generation: 1, Seq: 1}
	act := &printActuator{routes: generation.NewRoutes(topo).With(old)}
	clock := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	d, err := generation.NewDeploy(generation.Plan{
		ID: "deploy-2", Gen: 2, From: topo, To: topo, Current: act.routes,
		MaxParallel: 1, ReadyTimeout: time.Minute, QuiesceTimeout: 30 * time.Second,
	}, func() time.Time { return clock }, act)
	if err != nil {
		fmt.Println(err)
		return
	}
	d.Start() // 1. spawn c@g+1
	clock = clock.Add(2 * time.Second)
	d.Ready(act.spawned) // 2. it is ready: route to it; 3. QUIESCE c@g
	clock = clock.Add(time.Second)
	d.Quiesced(old)
	d.Exited(old) // confirmed gone: 4. ACTIVATE c@g+1, and hand the cluster back
	st := d.Status()
	fmt.Println(st.State, st.Clusters[0].Phase, st.Finished.Sub(st.Started))
	// Output:
	// spawn 0@2#100
	// route cluster 0 to 0@2#100
	// quiesce 0@1#1
	// activate 0@2#100
	// release 0
	// succeeded activated 3s
}
