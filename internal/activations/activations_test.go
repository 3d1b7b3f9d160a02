package activations_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/internal/activations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rec(host string, cluster, pid int, event string, t int64) activations.Record {
	return activations.Record{Host: host, Cluster: cluster, Generation: 1, PID: pid, Event: event, UnixNano: t}
}

// TestCheck: every shape of two activated intervals of one cluster, the
// ones that must be caught among them.
func TestCheck(t *testing.T) {
	A, X := activations.Activate, activations.Exit
	tests := []struct {
		name string
		recs []activations.Record
		want []string // "cluster from to" of each overlap
	}{
		{"empty", nil, nil},
		{"one process, exited", []activations.Record{rec("a", 0, 10, A, 1), rec("a", 0, 10, X, 5)}, nil},
		{"handoff: the old exits before the new activates", []activations.Record{
			rec("a", 0, 10, A, 1), rec("a", 0, 10, X, 5), rec("b", 0, 20, A, 6)}, nil},
		{"handoff at the same instant", []activations.Record{
			rec("a", 0, 10, A, 1), rec("a", 0, 10, X, 5), rec("b", 0, 20, A, 5)}, nil},
		{"out of order in the file", []activations.Record{
			rec("b", 0, 20, A, 6), rec("a", 0, 10, X, 5), rec("a", 0, 10, A, 1)}, nil},
		{"other clusters at once are fine", []activations.Record{
			rec("a", 0, 10, A, 1), rec("b", 1, 20, A, 2), rec("c", 2, 30, A, 3)}, nil},
		{"a second ACTIVATE of one process is one activation", []activations.Record{
			rec("a", 0, 10, A, 1), rec("a", 0, 10, A, 3), rec("a", 0, 10, X, 5)}, nil},
		{"exit without activation (quiesced before ACTIVATE)", []activations.Record{
			rec("a", 0, 11, X, 2), rec("a", 0, 10, A, 3)}, nil},
		{"caught: the new activated before the old exited", []activations.Record{
			rec("a", 0, 10, A, 1), rec("b", 0, 20, A, 4), rec("a", 0, 10, X, 5), rec("b", 0, 20, X, 9)},
			[]string{"0 4 5"}},
		{"caught: the old never exited (SIGKILLed, no exit appended)", []activations.Record{
			rec("a", 0, 10, A, 1), rec("b", 0, 20, A, 4)}, []string{"0 4 0"}},
		{"caught: the new one ends inside the old", []activations.Record{
			rec("a", 0, 10, A, 1), rec("b", 0, 20, A, 2), rec("b", 0, 20, X, 3), rec("a", 0, 10, X, 9)},
			[]string{"0 2 3"}},
		{"caught: same host, same pid reused by another generation", []activations.Record{
			rec("a", 3, 10, A, 1), {Host: "a", Cluster: 3, Generation: 2, PID: 10, Event: A, UnixNano: 2}},
			[]string{"3 2 0"}},
		{"caught: three at once are three pairs", []activations.Record{
			rec("a", 0, 1, A, 1), rec("b", 0, 2, A, 2), rec("c", 0, 3, A, 3)},
			[]string{"0 2 0", "0 3 0", "0 3 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, o := range activations.Check(tt.recs) {
				got = append(got, fmt.Sprintf("%d %d %d", o.Cluster, o.From, o.To))
				if o.String() == "" {
					t.Error("empty description")
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Check = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestWriterShared: several writers appending to one file at once leave
// whole lines only, every record once.
func TestWriterShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "record.jsonl")
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			wr, err := activations.Create(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer wr.Close()
			for i := range each {
				r := rec(strings.Repeat("h", 100), w, i, activations.Activate, int64(i))
				if err := wr.Append(r); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	recs, err := activations.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != writers*each {
		t.Fatalf("%d records, want %d", len(recs), writers*each)
	}
	if _, err := activations.Read(strings.NewReader("{\"host\":\"a\"}\n{torn")); err == nil {
		t.Fatal("a torn line read without error")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
