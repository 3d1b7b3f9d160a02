package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// idleCase is the manager at rest with a number of ready clusters heartbeating.
type idleCase struct {
	Scenario          string  `json:"scenario"`
	Path              string  `json:"path"` // "idle"
	Clusters          int     `json:"clusters"`
	ReadyAfterS       float64 `json:"ready_after_s"` // manager start to every cluster answering
	SampleS           float64 `json:"sample_s"`
	ManagerRSSKiB     int64   `json:"manager_rss_kib"`
	ManagerCPUPercent float64 `json:"manager_cpu_percent"` // of one core
	ClustersRSSKiB    int64   `json:"clusters_rss_kib"`    // all cluster processes together
}

// idleClusters starts a manager with n one-shard clusters, waits until every
// one answers a ping, lets it settle, and samples its CPU and memory.
func idleClusters(ctx context.Context, o routeOptions, dir string, n int, harnessArgv []string) (c idleCase, err error) {
	logw, err := os.Create(filepath.Join(dir, fmt.Sprintf("idle-%d.log", n)))
	if err != nil {
		return c, err
	}
	defer func() {
		err = withLog(err, logw)
		logw.Close()
	}()
	cfg, err := managerConfig(dir, n, harnessArgv)
	if err != nil {
		return c, err
	}
	fmt.Fprintf(o.Progress, "route: idle, starting sm-manager with %d clusters\n", n)
	start := time.Now()
	mgr, err := startAttached(ctx, o.ManagerBin, dir, cfg, logw)
	if err != nil {
		return c, err
	}
	defer func() { err = errors.Join(err, mgr.shutdown()) }()
	pongs, err := mgr.ready(ctx, ipc.TargetAll, readyTimeout(n))
	if err != nil {
		return c, err
	}
	c = idleCase{Scenario: "route", Path: "idle", Clusters: n, ReadyAfterS: time.Since(start).Seconds()}
	fmt.Fprintf(o.Progress, "route: idle, %d clusters ready after %.1fs; sampling for %v\n", n, c.ReadyAfterS, o.IdleSample)
	if err := sleep(ctx, idleSettle); err != nil {
		return c, err
	}
	s, err := sampleManager(ctx, mgr.pid(), o.IdleSample)
	if err != nil {
		return c, err
	}
	c.SampleS, c.ManagerCPUPercent, c.ManagerRSSKiB = s.elapsed.Seconds(), s.cpuPercent(), s.rssKiB
	for _, pong := range pongs {
		pid, err := pidOf(pong)
		if err != nil {
			return c, err
		}
		rss, err := readRSS(pid)
		if err != nil {
			return c, fmt.Errorf("cluster process %d: %w", pid, err)
		}
		c.ClustersRSSKiB += rss
	}
	return c, nil
}

// idleSettle is the pause between the last cluster becoming ready and the
// idle sample, so that start-up work does not count as idle.
const idleSettle = time.Second

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
