package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are sm-api's own, on a registry of their own: a library package
// must not fill the process-wide default registry, and the manager's metrics
// live in the manager. Labels are bounded: the route is the matched pattern,
// never the path (guild and cluster ids would explode the series).
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	connects prometheus.Counter
	feedLost prometheus.Counter
}

// unmatchedRoute labels requests no route matched.
const unmatchedRoute = "unmatched"

func newMetrics(connected func() bool, synced func() bool) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sm_api_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sm_api_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "method"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sm_api_http_requests_in_flight",
			Help: "HTTP requests being answered now.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sm_api_manager_connects_total",
			Help: "Registrations with the manager (the first and every reconnection).",
		}),
		feedLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sm_api_state_feed_lost_total",
			Help: "Times the WATCH feed dropped sm-api (it fell behind) or sent what it could not read; each is followed by a new WATCH.",
		}),
	}
	m.reg.MustRegister(m.requests, m.duration, m.inFlight, m.connects, m.feedLost,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sm_api_manager_connected",
			Help: "1 while sm-api is connected and registered to the manager's socket, else 0.",
		}, func() float64 { return b2f(connected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sm_api_state_synced",
			Help: "1 while sm-api's copy of the manager's state (the WATCH feed) is in sync, else 0.",
		}, func() float64 { return b2f(synced()) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// handler serves the registry in the Prometheus exposition formats.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// instrument counts and times every request h answers. It reads the route
// from r.Pattern, which the ServeMux inside h sets on this same request.
func (m *metrics) instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" || route == "/" {
			route = unmatchedRoute
		}
		method := methodLabel(r.Method)
		code := rec.status
		if code == 0 {
			code = http.StatusOK
		}
		m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	})
}

// methodLabel keeps the method label bounded: a client may send any token.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}

// statusRecorder remembers the status a handler sent.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
