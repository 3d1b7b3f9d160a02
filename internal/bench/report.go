package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
)

// Targets of the route scenario (issue 16's, which raised issue 2's 0.50
// and 100 µs), printed beside the measured values.
const (
	targetThroughputRatio = 0.60 // routed/direct throughput at 64 in flight, the same harness
	targetEchoRatio       = 0.35 // echo-routed/echo-direct throughput at 64 in flight
	targetP50DiffUS       = 50.0 // routed p50 - direct p50 at 1 in flight
)

// WriteText prints the report as tables for people.
func (r *routeReport) WriteText(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "route: echo with a %d-byte payload, %v per case after %v warm-up; %d CPUs (%s)\n\n",
		len(echoPayload(o.PayloadBytes)), o.Duration, o.Warmup, runtime.NumCPU(), cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The cluster column is cluster-harness's, or on echo and node rows the
	// echo or the Node cluster's.
	fmt.Fprintln(tw, "path\tin flight\tround\treq/s\tp50 µs\tp99 µs\tp99.9 µs\tCPU µs/req: bench\tcluster\tmanager\tmanager RSS MiB\tok\terrors\tlost\tdup\tothers' CPU %\t")
	for _, c := range r.Rest {
		if c.RestAt == "start" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%.0f\t\n", pathRest, c.OthersCPUPercent)
		}
	}
	for _, c := range r.Cases {
		mgrCPU, rss := "-", "-"
		if v, ok := c.CPUUSPerReq["manager"]; ok {
			mgrCPU = fmt.Sprintf("%.1f", v)
			rss = fmt.Sprintf("%.1f", float64(c.ManagerRSSKiB)/1024)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%s\t%s\t%d\t%d\t%d\t%d\t%.0f\t\n",
			c.Path, c.InFlight, c.Round, c.ReqPerS, c.P50US, c.P99US, c.P999US,
			c.CPUUSPerReq["bench"], c.CPUUSPerReq["harness"]+c.CPUUSPerReq["echo"]+c.CPUUSPerReq["node"], mgrCPU, rss,
			c.OK, c.ErrorCount(), c.Lost, c.Duplicates, c.OthersCPUPercent)
	}
	for _, c := range r.Rest {
		if c.RestAt == "end" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%.0f\t\n", pathRest, c.OthersCPUPercent)
		}
	}
	tw.Flush()
	if len(r.Rest) > 0 {
		fmt.Fprintf(w, "(the rest rows: the machine read for %v at the start and the end with every process of the run idle)\n", r.Options.Rest)
	}
	fmt.Fprintln(w)
	for _, s := range r.Summaries() {
		note := ""
		switch {
		case s.InFlight == 64 && s.Routed == pathRouted:
			note = fmt.Sprintf("  (target: throughput ≥ %.2f → %s)", targetThroughputRatio, met(s.ThroughputRatio >= targetThroughputRatio))
		case s.InFlight == 64 && s.Routed == pathEchoRouted:
			note = fmt.Sprintf("  (target: throughput ≥ %.2f → %s)", targetEchoRatio, met(s.ThroughputRatio >= targetEchoRatio))
		case s.InFlight == 1 && s.Routed == pathRouted:
			note = fmt.Sprintf("  (target: p50 ≤ direct + %.0f µs → %s)", targetP50DiffUS, met(s.P50DiffUS <= targetP50DiffUS))
		}
		rounds := ""
		if s.Rounds > 1 {
			rounds = fmt.Sprintf(", median of %d rounds", s.Rounds)
		}
		fmt.Fprintf(w, "%s/%s at %d in flight: throughput %.2f (%.0f vs %.0f req/s), p50 %+.0f µs, CPU µs/request %s vs %s%s%s\n",
			s.Routed, directOf[s.Routed], s.InFlight, s.ThroughputRatio, s.ReqPerS, s.DirectReqPerS, s.P50DiffUS,
			cpuList(s.CPUUSPerReq), cpuList(s.DirectCPUUSPerReq), rounds, note)
	}
	r.writeNodeText(w)
	r.writePeerText(w)
	if len(r.Idle) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "idle clusters\tready after s\tmanager RSS MiB\tmanager CPU %\tclusters' RSS MiB\t")
		for _, c := range r.Idle {
			fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.2f\t%.0f\t\n", c.Clusters, c.ReadyAfterS,
				float64(c.ManagerRSSKiB)/1024, c.ManagerCPUPercent, float64(c.ClustersRSSKiB)/1024)
		}
		tw.Flush()
	}
}

// cpuList renders CPU µs per request by process, bench first, then the
// cluster, then the manager, and their sum.
func cpuList(m map[string]float64) string {
	var parts []string
	var sum float64
	for _, k := range []string{"bench", "harness", "echo", "node", "manager"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
			sum += v
		}
	}
	return fmt.Sprintf("(%s = %.2f)", strings.Join(parts, " + "), sum)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// WriteJSON prints one JSON object per line: each case, the rest readings, each in-flight
// count's summary and Node summary, the peer's lines, then each idle case.
func (r *routeReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	if err := encodeEach(enc, r.Cases); err != nil {
		return err
	}
	if err := encodeEach(enc, r.Rest); err != nil {
		return err
	}
	if err := encodeEach(enc, r.Summaries()); err != nil {
		return err
	}
	if err := encodeEach(enc, r.NodeSummaries()); err != nil {
		return err
	}
	if err := r.writePeerJSON(enc); err != nil {
		return err
	}
	return encodeEach(enc, r.Idle)
}

// cpuModel is the machine's CPU model name, from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
