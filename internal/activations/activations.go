// Package activations is the simulated bot's record of when each process of a
// cluster was activated and when it exited (cluster-harness --record), and a
// pure check over such records that no two processes of one cluster were ever
// activated at once, on one host or across hosts.
package activations

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// The events of a Record.
const (
	// Activate: the process became the one handling the cluster's gateway
	// events (ACTIVATE, or a REGISTER reply saying active:true).
	Activate = "activate"
	// Exit: the process is leaving; nothing it does after counts. A process
	// killed with SIGKILL writes none: whoever killed it may append one
	// with the time it saw the process gone (see Check).
	Exit = "exit"
)

// Record is one line of a record file.
type Record struct {
	Host       string `json:"host"`
	Cluster    int    `json:"cluster"`
	Generation int64  `json:"generation"`
	PID        int    `json:"pid"`
	Event      string `json:"event"`
	// UnixNano is the wall clock of the writer: processes of one machine
	// share it, so their records compare; across machines they compare only
	// as far as the clocks agree.
	UnixNano int64 `json:"unix_nano"`
}

// Writer appends records to a file that several processes share: opened
// with O_APPEND, each record one write of one line, so lines never
// interleave.
type Writer struct {
	f *os.File
}

// Create opens path for appending, making it if need be.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	return &Writer{f: f}, nil
}

// Append writes r as one line, in one write.
func (w *Writer) Append(r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("activations: %w", err)
	}
	if _, err := w.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("activations: %w", err)
	}
	return nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Read reads every record of r. A line that does not decode is an error
// naming it: a torn line would mean the one-write rule broke.
func Read(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return nil, fmt.Errorf("activations: line %d %q: %w", n, line, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	return out, nil
}

// ReadFile reads every record of the file at path.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	defer f.Close()
	return Read(f)
}

// Process names one process: a pid is unique on its host while it lives.
type Process struct {
	Host       string
	PID        int
	Generation int64
}

// String is host/pid (generation g), for test failures.
func (p Process) String() string {
	return fmt.Sprintf("%s/%d (generation %d)", p.Host, p.PID, p.Generation)
}

// Interval is one process's activated time: from its activation to its exit,
// End 0 when the records show no exit (it ran to the end of the record).
type Interval struct {
	Cluster int
	Process Process
	Start   int64
	End     int64
}

// Overlap is two processes of one cluster activated at once, from From to
// To (To 0: to the end of the record).
type Overlap struct {
	Cluster  int
	A, B     Process
	From, To int64
}

// String describes the overlap, for test failures.
func (o Overlap) String() string {
	to := "the end of the record"
	if o.To != 0 {
		to = fmt.Sprintf("%d (%.3f ms)", o.To, float64(o.To-o.From)/1e6)
	}
	return fmt.Sprintf("cluster %d: %v and %v both activated from %d to %s", o.Cluster, o.A, o.B, o.From, to)
}

// Intervals turns records into each process's activated interval, by
// cluster and start. A process's first activation counts; an exit before any
// activation ends nothing (it was never active); a process activated with
// no exit is active to the end (End 0).
func Intervals(recs []Record) []Interval {
	type key struct {
		cluster int
		p       Process
	}
	open := map[key]int{} // index in out of the process's interval
	var out []Interval
	// By time, not file order: writers' lines interleave. At one instant an
	// activation goes first, so a process's exit is never lost before it.
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b Record) int {
		if c := cmp.Compare(a.UnixNano, b.UnixNano); c != 0 {
			return c
		}
		return cmp.Compare(rank(a.Event), rank(b.Event))
	})
	for _, r := range recs {
		k := key{r.Cluster, Process{Host: r.Host, PID: r.PID, Generation: r.Generation}}
		i, ok := open[k]
		switch r.Event {
		case Activate:
			if !ok {
				open[k] = len(out)
				out = append(out, Interval{Cluster: r.Cluster, Process: k.p, Start: r.UnixNano})
			}
		case Exit:
			if ok && out[i].End == 0 {
				out[i].End = r.UnixNano
			}
		}
	}
	slices.SortFunc(out, func(a, b Interval) int {
		if a.Cluster != b.Cluster {
			return a.Cluster - b.Cluster
		}
		return cmp.Compare(a.Start, b.Start)
	})
	return out
}

// Check returns every time two processes of one cluster were activated at
// once, in cluster and time order; none means the record is clean. Records
// may come in any order (several writers share one file).
//
// A process killed with SIGKILL records no exit, and so counts as active to
// the end: a test that kills processes appends an Exit for each with the
// time it saw it gone, which is later than the real exit, so the check errs
// on the strict side.
func Check(recs []Record) []Overlap {
	var out []Overlap
	iv := Intervals(recs)
	for i, a := range iv {
		for _, b := range iv[i+1:] {
			if b.Cluster != a.Cluster {
				break
			}
			if a.End != 0 && b.Start >= a.End {
				continue // a ended before b began (sorted by start: b.Start >= a.Start)
			}
			o := Overlap{Cluster: a.Cluster, A: a.Process, B: b.Process, From: b.Start, To: a.End}
			if b.End != 0 && (o.To == 0 || b.End < o.To) {
				o.To = b.End
			}
			out = append(out, o)
		}
	}
	return out
}

func rank(event string) int {
	if event == Activate {
		return 0
	}
	return 1
}
