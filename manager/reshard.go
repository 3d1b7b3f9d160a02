package manager

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
)

// Resharding when Discord asks ([reshard], docs/deploys.md): a goroutine asks
// GET /gateway/bot every reshard.check_interval, off the loop, and reads the
// config file when a reshard looks due; the loop decides again with the
// topology in force and starts the re-clustering DEPLOY an operator's DEPLOY
// would start.

// reshardDue says whether Discord's recommended shard count has grown enough
// past the shards running to reshard: to at least ratio times as many, and
// more than are running. A shrinking recommendation never reshards: fewer
// shards are only an efficiency, and a DEPLOY applies it when wanted.
func reshardDue(running, recommended int, ratio float64) bool {
	return recommended > running && float64(recommended) >= ratio*float64(running)
}

// Results of one reshard check, the label of sm_reshard_checks_total.
const (
	reshardUnchanged = "unchanged" // not due
	reshardStarted   = "resharded" // a re-clustering DEPLOY started
	reshardDeferred  = "deferred"  // due, but a deploy is running or the config cannot be used
	reshardFailed    = "error"     // /gateway/bot did not answer
)

// ReshardStatus is STATUS's view of the [reshard] schedule; nil when it is off.
type ReshardStatus struct {
	CheckIntervalMS int64   `json:"check_interval_ms"`
	GrowthRatio     float64 `json:"growth_ratio"`
	// LastCheck is when /gateway/bot last answered or failed to.
	LastCheck time.Time `json:"last_check,omitzero"`
	// Recommended is Discord's count at the last answer (rounded up to a
	// multiple of max_concurrency, as "auto" takes it).
	Recommended int `json:"recommended,omitempty"`
	// Result is the last check's outcome: unchanged, resharded, deferred, error.
	Result string `json:"result,omitempty"`
	// Reason says why the last check deferred or failed. It never holds the
	// token, a URL or a path (see publicGatewayError).
	Reason string `json:"reason,omitempty"`
	// Reshards counts the re-clustering deploys the schedule started;
	// LastDeploy is the newest one's id.
	Reshards   int    `json:"reshards"`
	LastDeploy string `json:"last_deploy,omitempty"`
}

// reshardCheck is one answer of /gateway/bot, with the config read from disk
// when the answer looked due (cfg nil otherwise or on error).
type reshardCheck struct {
	at     time.Time
	gw     discord.GatewayBot
	err    error
	cfg    *config.Config
	cfgErr *ipc.Error
}

// runReshard starts the schedule when [reshard] is on; the returned function
// waits for it to stop once ctx is done.
func (m *Manager) runReshard(ctx context.Context) (wait func()) {
	r := m.cfg.Reshard
	if !r.Enabled {
		return func() {}
	}
	m.reshard = &ReshardStatus{CheckIntervalMS: r.CheckInterval.Milliseconds(), GrowthRatio: r.GrowthRatio}
	if m.fetchGateway == nil {
		m.log.Warn("reshard.enabled, but nothing can ask Discord's /gateway/bot: resharding is off")
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.CheckInterval.Duration)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
			ev := evReshard(m.checkReshard(ctx))
			select {
			case m.events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { <-done }
}

// checkReshard asks Discord, and when the answer is due by the topology in
// force now, reads the config file as a DEPLOY would.
func (m *Manager) checkReshard(ctx context.Context) reshardCheck {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	gw, err := m.fetchGateway(fctx)
	cancel()
	c := reshardCheck{at: time.Now(), gw: gw, err: err}
	if err != nil || !reshardDue(m.Topology().Total, gw.TotalShards(), m.cfg.Reshard.GrowthRatio) {
		return c
	}
	c.cfg, c.cfgErr = m.loadDeployConfig()
	switch {
	case c.cfgErr != nil:
	case !c.cfg.Topology.Auto:
		c.cfg, c.cfgErr = nil, ipc.Errorf(ipc.CodeBadConfig, `the config file no longer has total_shards = "auto"`)
	default:
		c.cfg.Topology.TotalShards = gw.TotalShards()
	}
	return c
}

// reshardChecked takes a check's outcome on the loop.
func (m *Manager) reshardChecked(c reshardCheck) {
	st := m.reshard
	st.LastCheck, st.Reason = c.at, ""
	result := reshardUnchanged
	defer func() {
		st.Result = result
		m.metrics.reshardChecks.WithLabelValues(result).Inc()
	}()
	if c.err != nil {
		result, st.Reason = reshardFailed, publicGatewayError(c.err)
		m.log.Warn("reshard check: /gateway/bot failed", "err", c.err)
		return
	}
	m.observeGateway(c.gw)
	running, want := m.Topology().Total, c.gw.TotalShards()
	st.Recommended = want
	if !reshardDue(running, want, m.cfg.Reshard.GrowthRatio) {
		return
	}
	result = reshardDeferred
	switch {
	case c.cfgErr != nil:
		st.Reason = c.cfgErr.Message
	case c.cfg == nil: // the topology grew between the check and now
		st.Reason = "the topology changed during the check"
	case m.dep != nil && !m.dep.Done():
		st.Reason = "deploy " + m.dep.Status().ID + " is running"
	}
	if st.Reason != "" {
		m.log.Warn("reshard due but not started", "running", running, "recommended", want, "reason", st.Reason)
		return
	}
	m.log.Info("resharding: Discord recommends more shards; starting a re-clustering deploy",
		"running", running, "recommended", want, "growth_ratio", m.cfg.Reshard.GrowthRatio)
	r := m.startDeploy(&ipc.Frame{Op: ipc.OpDeploy, MaxParallel: m.cfg.Reshard.MaxParallel}, c.cfg)
	if r.err != nil {
		st.Reason = r.err.Message
		m.log.Warn("reshard deploy refused", "reason", r.err.Message)
		return
	}
	result = reshardStarted
	st.Reshards++
	st.LastDeploy = m.dep.Status().ID
}

// publicGatewayError is why /gateway/bot failed, as STATUS and the public
// feed may say it: the HTTP status or the rate limit, never the API's URL
// (a proxy's address) or the body.
func publicGatewayError(err error) string {
	var se *discord.StatusError
	var rl *discord.RateLimitError
	switch {
	case errors.As(err, &se):
		return "/gateway/bot answered HTTP " + strconv.Itoa(se.StatusCode)
	case errors.As(err, &rl):
		return rl.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "/gateway/bot did not answer in time"
	default:
		return "/gateway/bot could not be reached"
	}
}
