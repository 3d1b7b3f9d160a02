package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// deployRequest is the optional body of POST /v1/deploy: the DEPLOY frame's
// fields. All may be left out: every cluster, one at a time, overlapping.
type deployRequest struct {
	Clusters    []int  `json:"clusters"`
	MaxParallel int    `json:"max_parallel"`
	Mode        string `json:"mode"` // "overlap" or "resume"; the manager checks it
}

// deploy is POST /v1/deploy: a DEPLOY to the manager, which re-reads its
// config file and starts the deploy. 202 with the deploy id (and Location:
// where to follow it); 409 while another runs; 422 if the file is invalid.
func (s *Server) deploy(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req deployRequest
	if len(body) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return badRequest("deploy body: %v", err)
		}
		if dec.More() {
			return badRequest("deploy body: more than one JSON value")
		}
	}
	if req.MaxParallel < 0 {
		return badRequest("max_parallel must not be negative")
	}
	for _, c := range req.Clusters {
		if c < 0 {
			return badRequest("cluster %d is not a cluster id", c)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout.Duration)
	defer cancel()
	reply, err := s.client.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy, Clusters: req.Clusters, MaxParallel: req.MaxParallel, Mode: req.Mode})
	if err != nil {
		return err
	}
	var started struct {
		DeployID string `json:"deploy_id"`
	}
	if json.Unmarshal(reply.Payload, &started) == nil && started.DeployID != "" {
		w.Header().Set("Location", "/v1/deploys/"+started.DeployID)
	}
	s.log.Info("deploy started over HTTP", "deploy", started.DeployID, "clusters", req.Clusters, "max_parallel", req.MaxParallel,
		"mode", req.Mode, "remote", r.RemoteAddr)
	writeRaw(w, http.StatusAccepted, reply.Payload)
	return nil
}

// clusterOp is POST /v1/clusters/{id}/ops/{op}.
func (s *Server) clusterOp(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	c, err := strconv.Atoi(id)
	if err != nil || c < 0 || strconv.Itoa(c) != id {
		return badRequest("cluster id %q is not a cluster number", id)
	}
	return s.forward(w, r, id)
}

// guildOp is POST /v1/guilds/{id}/ops/{op}: to the cluster that holds the
// guild, which the manager works out from the snowflake.
func (s *Server) guildOp(w http.ResponseWriter, r *http.Request) error {
	g, err := parseSnowflake(r.PathValue("id"))
	if err != nil {
		return err
	}
	return s.forward(w, r, ipc.TargetGuildPrefix+strconv.FormatUint(g, 10))
}

// broadcastOp is POST /v1/broadcast/{op}: to every cluster; the answer is
// {"results":[{"cluster":0,"payload":...},{"cluster":1,"error":{...}},...]},
// 200 even when some clusters failed (each result says).
func (s *Server) broadcastOp(w http.ResponseWriter, r *http.Request) error {
	return s.forward(w, r, ipc.TargetAll)
}

// forward sends the business op named in the path to target with the body as
// its payload, and answers with the reply's payload, byte for byte.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, target string) error {
	op := r.PathValue("op")
	if err := checkOp(op); err != nil {
		return err
	}
	timeout, err := s.timeoutOf(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	payload, err := payloadOf(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout+graceTime)
	defer cancel()
	reply, err := s.client.Request(ctx, &ipc.Frame{
		Op: op, Target: target, Payload: payload,
		TimeoutMS: max(1, (timeout + time.Millisecond - 1).Milliseconds()),
	})
	if err != nil {
		return err
	}
	out := reply.Payload
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	writeRaw(w, http.StatusOK, out)
	return nil
}

// maxOpLen bounds an op name.
const maxOpLen = 128

// checkOp refuses op names that are not business ops. Names made only of
// upper-case letters, digits and '_' are the protocol's (REGISTER, DEPLOY,
// WATCH, ... and any it adds): sm-api must never send one on a caller's say.
func checkOp(op string) error {
	if op == "" || len(op) > maxOpLen {
		return badRequest("op name must be 1 to %d characters", maxOpLen)
	}
	reserved := true
	for i := 0; i < len(op); i++ {
		switch b := op[i]; {
		case b >= 'a' && b <= 'z':
			reserved = false
		case b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '_':
		case b == '.', b == '-', b == ':':
			reserved = false
		default:
			return badRequest("op name %q may hold only letters, digits and . _ - :", op)
		}
	}
	if reserved {
		return badRequest("op %q is reserved for the protocol (names in upper case, digits and _ are); business ops only", op)
	}
	return nil
}

// timeoutOf reads the ?timeout= query parameter (a Go duration such as
// "2s"), bounded by api.request_timeout, which is also its default.
func (s *Server) timeoutOf(r *http.Request) (time.Duration, error) {
	limit := s.cfg.RequestTimeout.Duration
	v := r.URL.Query().Get("timeout")
	if v == "" {
		return limit, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, badRequest("timeout %q is not a positive duration such as 500ms or 2s", v)
	}
	return min(d, limit), nil
}

// readBody reads the request body up to api.max_body_bytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, badRequest("read body: %v", err)
	}
	return body, nil
}

// payloadOf checks that a body is one JSON value; an empty one (or only
// whitespace) is no payload, which the cluster sees as null. The bytes go to
// the cluster as they came.
func payloadOf(body []byte) (json.RawMessage, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, nil
	}
	if !json.Valid(body) {
		return nil, badRequest("body is not valid JSON (send one JSON value, or nothing for a null payload)")
	}
	return body, nil
}
