package systemd_test

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/supervise"
	"github.com/sm-supervisor/sm/systemd"
)

// clusters makes n cluster statuses of generation gen in state state.
func clusters(n int, gen int64, state supervise.State) []manager.ClusterStatus {
	out := make([]manager.ClusterStatus, n)
	for i := range out {
		out[i] = manager.ClusterStatus{ID: i, Generation: gen, State: state, PID: 100 + i, Routed: state == "ready"}
	}
	return out
}

func phases(ps ...generation.Phase) []generation.ClusterStatus {
	out := make([]generation.ClusterStatus, len(ps))
	for i, p := range ps {
		out[i] = generation.ClusterStatus{Cluster: i, Phase: p, New: &generation.ProcRef{Cluster: i}}
	}
	return out
}

func TestStatusLine(t *testing.T) {
	mixed := clusters(12, 5, "ready")
	for i := range 3 {
		mixed[i].Generation = 6
	}
	crashing := clusters(12, 5, "ready")
	crashing[7] = manager.ClusterStatus{ID: 7, Generation: 5, State: "crash_loop", CrashLoop: true, LastExit: "exit status 1"}
	unrouted := clusters(4, 1, "ready")
	unrouted[2].Routed = false
	reclustered := phases(generation.PhaseActivated, generation.PhaseOldExited, generation.PhaseOldExited, generation.PhaseRouted)
	reclustered[2].New = nil // an old cluster the new topology does not keep: done once gone
	for _, tc := range []struct {
		name string
		st   manager.Status
		want string
	}{
		{"all ready", manager.Status{Generation: 5, Clusters: clusters(12, 5, "ready")},
			"12/12 clusters ready, generation 5"},
		{"starting", manager.Status{Generation: 1, Clusters: clusters(4, 1, "starting")},
			"0/4 clusters ready, generation 1"},
		{"ready but not routed is not ready", manager.Status{Generation: 1, Clusters: unrouted},
			"3/4 clusters ready, generation 1"},
		{"crash loop", manager.Status{Generation: 5, Clusters: crashing},
			"11/12 clusters ready, generation 5, 1 in crash loop"},
		{"deploy running", manager.Status{Generation: 6, Clusters: mixed, Deploy: &generation.Status{
			ID: "deploy-6", Generation: 6, State: generation.StateRunning,
			Clusters: append(phases(generation.PhaseActivated, generation.PhaseActivated, generation.PhaseActivated, generation.PhaseQuiescing),
				phases(generation.PhasePending, generation.PhasePending, generation.PhasePending, generation.PhasePending,
					generation.PhasePending, generation.PhasePending, generation.PhasePending, generation.PhasePending)...),
		}}, "deploy 3/12 (deploy-6), 12/12 clusters ready, generations 5-6"},
		{"deploy pending", manager.Status{Generation: 2, Clusters: clusters(2, 1, "ready"), Deploy: &generation.Status{
			ID: "deploy-2", State: generation.StatePending, Clusters: phases(generation.PhasePending, generation.PhasePending),
		}}, "deploy 0/2 (deploy-2), 2/2 clusters ready, generation 1"},
		{"re-clustering deploy", manager.Status{Generation: 2, Clusters: clusters(2, 1, "ready"), Deploy: &generation.Status{
			ID: "deploy-2", State: generation.StateRunning, Clusters: reclustered,
		}}, "deploy 2/4 (deploy-2), 2/2 clusters ready, generation 1"},
		{"deploy done", manager.Status{Generation: 6, Clusters: clusters(12, 6, "ready"), Deploy: &generation.Status{
			ID: "deploy-6", State: generation.StateSucceeded, Finished: time.Unix(1, 0),
		}}, "12/12 clusters ready, generation 6"},
		{"deploy failed", manager.Status{Generation: 6, Clusters: clusters(12, 5, "ready"), Deploy: &generation.Status{
			ID: "deploy-6", State: generation.StateFailed, Finished: time.Unix(1, 0),
		}}, "12/12 clusters ready, generation 5; deploy-6 failed"},
		{"deploy failed, still finishing", manager.Status{Generation: 6, Clusters: clusters(12, 5, "ready"), Deploy: &generation.Status{
			ID: "deploy-6", State: generation.StateFailed,
		}}, "12/12 clusters ready, generation 5; deploy-6 failed"},
		{"no process anywhere", manager.Status{Generation: 3, Clusters: []manager.ClusterStatus{{ID: 0, State: "restarting"}}},
			"0/1 clusters ready, generation 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := systemd.StatusLine(tc.st); got != tc.want {
				t.Errorf("StatusLine = %q\n                  want %q", got, tc.want)
			}
		})
	}
}

func TestStoppingLine(t *testing.T) {
	st := manager.Status{Clusters: clusters(4, 1, "quiescing")}
	st.Clusters[1] = manager.ClusterStatus{ID: 1, State: "restarting"}
	if got, want := systemd.StoppingLine(st), "stopping: 3/4 clusters still running"; got != want {
		t.Errorf("StoppingLine = %q, want %q", got, want)
	}
}

func TestStarted(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   []manager.ClusterStatus
		want bool
	}{
		{"no clusters", nil, false},
		{"all spawned", clusters(3, 1, "starting"), true},
		{"one not spawned yet", append(clusters(2, 1, "starting"), manager.ClusterStatus{ID: 2, State: "restarting"}), false},
		{"one failed to spawn", append(clusters(2, 1, "starting"), manager.ClusterStatus{ID: 2, State: "restarting", LastExit: "exec: not found"}), true},
		{"one in crash loop", append(clusters(2, 1, "ready"), manager.ClusterStatus{ID: 2, State: "crash_loop", CrashLoop: true}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := systemd.Started(manager.Status{Clusters: tc.cs}); got != tc.want {
				t.Errorf("Started = %v, want %v", got, tc.want)
			}
		})
	}
}
