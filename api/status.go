package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sm-supervisor/sm/ipc"
)

// status is GET /v1/status: the manager's STATUS reply, passed through whole
// (topology, every cluster, the running or last deploy). It is asked for on
// every request rather than rebuilt from the feed: it costs the manager one
// trip through its loop, and it is exact (heartbeat ages, queue depths).
func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	raw, err := s.fetchStatus(r.Context())
	if err != nil {
		return err
	}
	writeRaw(w, http.StatusOK, raw)
	return nil
}

// fetchStatus asks the manager for STATUS within api.request_timeout.
func (s *Server) fetchStatus(ctx context.Context) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.Duration)
	defer cancel()
	reply, err := s.client.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		return nil, err
	}
	return reply.Payload, nil
}

// guild is GET /v1/guilds/{id}: which shard, cluster and generation hold the
// guild, and whether that cluster is alive and ready right now. It answers
// from the WATCH copy of the state when that is in sync, else asks STATUS.
func (s *Server) guild(w http.ResponseWriter, r *http.Request) error {
	g, err := parseSnowflake(r.PathValue("id"))
	if err != nil {
		return err
	}
	if !s.client.Connected() {
		return ipc.ErrUnavailable
	}
	if info, ok := s.state.guild(g); ok {
		writeJSON(w, http.StatusOK, info)
		return nil
	}
	raw, err := s.fetchStatus(r.Context())
	if err != nil {
		return err
	}
	var st statusDoc
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("read STATUS reply: %w", err)
	}
	info, ok := guildFromStatus(g, &st)
	if !ok {
		return fmt.Errorf("STATUS reply does not match its topology")
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// parseSnowflake reads a guild id: a plain decimal uint64, as Discord writes
// snowflakes (no sign, no spaces).
func parseSnowflake(s string) (uint64, error) {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, badRequest("guild id %q is not a snowflake (a decimal number)", s)
		}
	}
	g, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, badRequest("guild id %q is not a snowflake (a decimal number below 2^64)", s)
	}
	return g, nil
}

// latestDeploy names the running or last deploy in GET /v1/deploys/{id}.
const latestDeploy = "latest"

// deployStatus is GET /v1/deploys/{id}: the deploy's progress, cluster by
// cluster. The manager keeps only its running or last deploy, so an older id
// is 404; "latest" names whichever that is.
func (s *Server) deployStatus(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	raw, err := s.fetchStatus(r.Context())
	if err != nil {
		return err
	}
	var st struct {
		Deploy json.RawMessage `json:"deploy"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("read STATUS reply: %w", err)
	}
	var dep struct {
		ID string `json:"id"`
	}
	if len(st.Deploy) > 0 && string(st.Deploy) != "null" {
		if err := json.Unmarshal(st.Deploy, &dep); err != nil {
			return fmt.Errorf("read STATUS reply: %w", err)
		}
	}
	switch {
	case dep.ID == "":
		return errorf(http.StatusNotFound, CodeNotFound, "no deploy %q: the manager has run no deploy since it started", id)
	case id != dep.ID && id != latestDeploy:
		return errorf(http.StatusNotFound, CodeNotFound, "no deploy %q: the manager keeps only its running or last deploy, %s", id, dep.ID)
	}
	writeRaw(w, http.StatusOK, st.Deploy)
	return nil
}
