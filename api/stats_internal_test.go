package api

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestNumericFields(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    map[string]float64
	}{
		{`{"guilds":12,"users":3400,"memory_bytes":1048576,"ping_ms":41.5}`,
			map[string]float64{"guilds": 12, "users": 3400, "memory_bytes": 1048576, "ping_ms": 41.5}},
		// Only top-level numbers: strings, booleans, nulls, objects and arrays are not.
		{` {"a":-1,"b":"2","c":true,"d":null,"e":{"f":3},"g":[4],"h":1e3}`, map[string]float64{"a": -1, "h": 1000}},
		{`[1,2]`, nil},
		{`42`, nil},
		{`"x"`, nil},
		{`{"guilds":`, nil}, // not JSON: nothing, and no error to the caller
		{``, nil},
		{`{"huge":1e400}`, nil}, // out of float64's range
	} {
		if got := numericFields(json.RawMessage(tc.payload)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("numericFields(%s) = %v, want %v", tc.payload, got, tc.want)
		}
	}
}

func TestAggregate(t *testing.T) {
	clusters := []clusterState{
		{ID: 0, State: "ready", PID: 10, Generation: 1, HeartbeatMS: 5},
		{ID: 1, State: "ready", PID: 11, Generation: 2, HeartbeatMS: 7},
		{ID: 2, State: "restarting", PID: 0, Generation: 1, HeartbeatMS: -1},
		{ID: 3, State: "registered", PID: 13, Generation: 1, HeartbeatMS: 1},
		{ID: 4, State: "stopping", PID: 14, Generation: 1, HeartbeatMS: 1},
	}
	payloads := []json.RawMessage{
		json.RawMessage(`{"zeta":1,"guilds":100,"users":5000,"memory_bytes":2000}`),
		json.RawMessage(`{"guilds":300,"users":7000,"memory_bytes":4000,"alpha":9,"beta":1}`),
		json.RawMessage(`{"guilds":999}`), // a dead process's: not counted
		nil,                               // registered, no heartbeat yet
		json.RawMessage(`{"guilds":5}`),   // being stopped: not counted
	}
	st := aggregate(clusters, payloads, 4)
	if st.Clusters != 5 || st.Reporting != 2 || st.FieldsDropped != 2 {
		t.Fatalf("clusters %d reporting %d dropped %d, want 5, 2, 2", st.Clusters, st.Reporting, st.FieldsDropped)
	}
	want := map[string]FieldTotal{
		"alpha":        {Sum: 9, Min: 9, Max: 9, Mean: 9, Clusters: 1},
		"guilds":       {Sum: 400, Min: 100, Max: 300, Mean: 200, Clusters: 2},
		"memory_bytes": {Sum: 6000, Min: 2000, Max: 4000, Mean: 3000, Clusters: 2},
		"users":        {Sum: 12000, Min: 5000, Max: 7000, Mean: 6000, Clusters: 2},
		// The well-known three, then the others by name: "beta" and "zeta"
		// are past maxFields.
	}
	if !reflect.DeepEqual(st.Totals, want) {
		t.Errorf("totals %+v, want %+v", st.Totals, want)
	}
	if v := st.PerCluster[0].Values; !reflect.DeepEqual(v, map[string]float64{"guilds": 100, "users": 5000, "memory_bytes": 2000}) {
		t.Errorf("cluster 0 values %v (zeta must be dropped)", v)
	}
	for _, i := range []int{2, 3, 4} {
		if st.PerCluster[i].Values != nil {
			t.Errorf("cluster %d has values %v", i, st.PerCluster[i].Values)
		}
	}
	if c := st.PerCluster[1]; c.Cluster != 1 || c.Generation != 2 || c.PID != 11 || c.State != "ready" || c.HeartbeatMS != 7 {
		t.Errorf("cluster 1 line %+v", c)
	}
	if e := aggregate(nil, nil, 64); e.Clusters != 0 || e.Totals == nil || e.PerCluster == nil {
		t.Errorf("empty fleet: %+v (totals and per_cluster must be {} and [], not null)", e)
	}
}
