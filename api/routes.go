package api

import (
	"net/http"
	"slices"
	"strings"

	"github.com/sm-supervisor/sm/ipc"
)

// route is one endpoint of the API.
type route struct {
	method, path string
	public       bool // served without the bearer token
	h            handlerFunc
}

// handlerFunc is a handler that returns its failure rather than writing it:
// every error goes out through writeError in the one shape.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) endpoints() []route {
	return []route{
		{"GET", "/healthz", true, s.healthz},
		{"GET", "/readyz", true, s.readyz},
		{"GET", "/v1/status", false, s.status},
		{"GET", "/v1/stats", false, s.stats},
		{"GET", "/v1/guilds/{id}", false, s.guild},
		{"GET", "/v1/hosts", false, s.hosts},
		{"POST", "/v1/deploy", false, s.deploy},
		{"GET", "/v1/deploys/{id}", false, s.deployStatus},
		{"POST", "/v1/clusters/{id}/ops/{op}", false, s.clusterOp},
		{"POST", "/v1/guilds/{id}/ops/{op}", false, s.guildOp},
		{"POST", "/v1/broadcast/{op}", false, s.broadcastOp},
	}
}

// routes builds the mux: the endpoints, /metrics, and JSON answers for a
// wrong method (405, with Allow) or an unknown path (404).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	allowed := map[string][]string{}
	var paths []string
	for _, rt := range s.endpoints() {
		var h http.Handler = rt.h
		if !rt.public {
			h = noStore(s.auth.require(h))
		}
		mux.Handle(rt.method+" "+rt.path, h)
		if allowed[rt.path] == nil {
			paths = append(paths, rt.path)
		}
		allowed[rt.path] = append(allowed[rt.path], rt.method)
	}
	// Metrics hold request counts by route pattern and the process's own
	// figures, no ids and nothing secret; they are served without the token
	// so a Prometheus needs none.
	mux.Handle("GET /metrics", s.metrics.handler())
	paths = append(paths, "/metrics")
	allowed["/metrics"] = []string{"GET"}
	for _, p := range paths {
		methods := allowed[p]
		if slices.Contains(methods, "GET") {
			methods = append(methods, "HEAD")
		}
		allow := strings.Join(methods, ", ")
		mux.Handle(p, handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Allow", allow)
			return errorf(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "%s %s: use %s", r.Method, r.URL.Path, allow)
		}))
	}
	mux.Handle("/", handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return errorf(http.StatusNotFound, CodeNotFound, "no endpoint %s; see docs/api.md", r.URL.Path)
	}))
	return mux
}

func (h handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		writeError(w, asError(err))
	}
}

// noStore keeps API answers out of caches: they are live state.
func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// healthz answers while the process is up.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers 200 while sm-api is connected and registered to the
// manager, 503 otherwise: a load balancer should send no traffic then.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) error {
	if !s.client.Connected() {
		return errorf(http.StatusServiceUnavailable, ipc.CodeUnavailable, "not connected to the manager at %s", s.socket)
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "state_synced": s.state.isSynced()})
	return nil
}
