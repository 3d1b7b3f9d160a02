package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// apiOptions shape the api scenario: closed-loop HTTP load on a real sm-api in
// front of a real sm-manager, beside the same load on the manager's socket.
// Zero fields take the defaults of defaultAPIOptions, except the binaries.
type apiOptions struct {
	ManagerBin string // sm-manager binary
	HarnessBin string // cluster-harness binary
	APIBin     string // sm-api binary

	Clusters     int           // one-shard clusters behind the manager
	Concurrency  []int         // requests in flight, one case per value and route
	Rounds       int           // socket/guild/op triples per concurrency
	PayloadBytes int           // the forwarded echo's JSON body
	Warmup       time.Duration // load before each measured window
	Duration     time.Duration // each measured window
	Drain        time.Duration // socket route: wait for the last replies

	// Progress receives a line per step; nil discards them.
	Progress io.Writer
}

// defaultAPIOptions are the api scenario's defaults (issue 4's benchmark).
var defaultAPIOptions = apiOptions{
	Clusters:     4,
	Concurrency:  []int{1, 64},
	Rounds:       1,
	PayloadBytes: 200,
	Warmup:       time.Second,
	Duration:     5 * time.Second,
	Drain:        10 * time.Second,
}

func (o apiOptions) withDefaults() apiOptions {
	d := defaultAPIOptions
	orDefault(&o.Clusters, d.Clusters)
	if len(o.Concurrency) == 0 {
		o.Concurrency = d.Concurrency
	}
	orDefault(&o.Rounds, d.Rounds)
	orDefault(&o.PayloadBytes, d.PayloadBytes)
	orDefault(&o.Warmup, d.Warmup)
	orDefault(&o.Duration, d.Duration)
	orDefault(&o.Drain, d.Drain)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Routes of the api scenario.
const (
	apiRouteSocket = "socket" // echo to target "0" on the manager's socket (the pipe client)
	apiRouteGuild  = "guild"  // GET /v1/guilds/{id} on sm-api
	apiRouteOp     = "op"     // POST /v1/clusters/0/ops/echo on sm-api
)

// apiCase is one measured case: a route at a concurrency.
type apiCase struct {
	Scenario     string  `json:"scenario"` // "api"
	Route        string  `json:"route"`
	Concurrency  int     `json:"concurrency"` // HTTP clients, or requests in flight on the socket
	Round        int     `json:"round"`
	PayloadBytes int     `json:"payload_bytes,omitempty"`
	WindowS      float64 `json:"window_s"`
	Requests     uint64  `json:"requests"` // answers inside the window
	ReqPerS      float64 `json:"req_per_s"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	P999US       float64 `json:"p999_us"`
	MaxUS        float64 `json:"max_us"`
	// Books: for HTTP, an error is any answer but 2xx (by status and error
	// code), a transport error ("transport"), or a wrong body ("bad_payload",
	// "bad_guild").
	books
	// WatchAnswers counts guild answers from sm-api's WATCH copy ("source":
	// "watch"), out of OK.
	WatchAnswers uint64 `json:"watch_answers,omitempty"`
	// CPUUSPerReq is each process's CPU time over the window per request, µs.
	CPUUSPerReq      map[string]float64 `json:"cpu_us_per_req"`
	OthersCPUPercent float64            `json:"others_cpu_percent"`
	// On guild and op cases: req/s over the socket route's at the same
	// concurrency and round, and p50 minus the socket route's.
	RatioToSocket float64 `json:"ratio_to_socket,omitempty"`
	P50DiffUS     float64 `json:"p50_diff_us,omitempty"`
}

// apiSummary is the median over the rounds at one concurrency.
type apiSummary struct {
	Scenario     string  `json:"scenario"`
	Route        string  `json:"route"` // "summary"
	Concurrency  int     `json:"concurrency"`
	Rounds       int     `json:"rounds"`
	SocketReqPS  float64 `json:"socket_req_per_s"`
	GuildReqPS   float64 `json:"guild_req_per_s"`
	OpReqPS      float64 `json:"op_req_per_s"`
	GuildRatio   float64 `json:"guild_ratio"`
	OpRatio      float64 `json:"op_ratio"`
	APICPUPerOp  float64 `json:"api_cpu_us_per_op"`
	APICPUPerGet float64 `json:"api_cpu_us_per_guild"`
}

// apiReport is everything the api scenario measured.
type apiReport struct {
	Options apiOptions
	Cases   []apiCase
}

// Books returns every case's books added up.
func (r *apiReport) Books() books {
	var b books
	for _, c := range r.Cases {
		b.Add(c.books)
	}
	return b
}

// Broken describes the invariants the cases broke together ("" when none):
// see books.Broken.
func (r *apiReport) Broken() string {
	b := r.Books()
	return b.Broken()
}

// Summaries gives the medians at each concurrency.
func (r *apiReport) Summaries() []apiSummary {
	var out []apiSummary
	for _, n := range r.Options.Concurrency {
		var sock, guild, op, gr, or, gcpu, ocpu []float64
		for _, c := range r.Cases {
			if c.Concurrency != n {
				continue
			}
			switch c.Route {
			case apiRouteSocket:
				sock = append(sock, c.ReqPerS)
			case apiRouteGuild:
				guild = append(guild, c.ReqPerS)
				gr = append(gr, c.RatioToSocket)
				gcpu = append(gcpu, c.CPUUSPerReq["sm-api"])
			case apiRouteOp:
				op = append(op, c.ReqPerS)
				or = append(or, c.RatioToSocket)
				ocpu = append(ocpu, c.CPUUSPerReq["sm-api"])
			}
		}
		if len(sock) == 0 || len(guild) == 0 || len(op) == 0 {
			continue
		}
		out = append(out, apiSummary{
			Scenario: "api", Route: "summary", Concurrency: n, Rounds: len(sock),
			SocketReqPS: median(sock), GuildReqPS: median(guild), OpReqPS: median(op),
			GuildRatio: median(gr), OpRatio: median(or), APICPUPerGet: median(gcpu), APICPUPerOp: median(ocpu),
		})
	}
	return out
}

// apiSetup is what the api scenario's cases run against.
type apiSetup struct {
	manager  *attachedManager
	api      *child
	apiAddr  string
	token    string
	harness0 int // pid of cluster 0's process
}

// runAPI runs the api scenario: a manager with o.Clusters clusters and a sm-api
// on it; at each concurrency, the socket route, GET /v1/guilds/{id} and POST
// /v1/clusters/0/ops/echo, in that order, round by round. It returns an error
// when a process fails; error answers are in the cases' books.
func runAPI(ctx context.Context, o apiOptions) (rep *apiReport, err error) {
	o = o.withDefaults()
	if o.ManagerBin == "" || o.HarnessBin == "" || o.APIBin == "" {
		return nil, errors.New("api: need the sm-manager, cluster-harness and sm-api binaries")
	}
	sc, err := newScratch("sm-bench-api-", "api.log", "")
	if err != nil {
		return nil, err
	}
	defer func() { err = sc.close(err) }()
	rep = &apiReport{Options: o}

	var s apiSetup
	defer func() { err = errors.Join(err, s.stop()) }()
	if err := s.start(ctx, o, sc.dir, sc.log); err != nil {
		return rep, err
	}

	payload := echoPayload(o.PayloadBytes)
	for _, n := range o.Concurrency {
		for round := 1; round <= o.Rounds; round++ {
			var socket apiCase
			for _, route := range []string{apiRouteSocket, apiRouteGuild, apiRouteOp} {
				fmt.Fprintf(o.Progress, "api: %s, %d concurrent, round %d/%d: %v after %v warm-up\n", route, n, round, o.Rounds, o.Duration, o.Warmup)
				var c apiCase
				var err error
				if route == apiRouteSocket {
					c, err = s.socketCase(ctx, o, payload, n)
				} else {
					c, err = s.httpCase(ctx, o, route, payload, n)
				}
				c.Scenario, c.Route, c.Concurrency, c.Round = "api", route, n, round
				if route == apiRouteSocket {
					socket = c
				} else if socket.ReqPerS > 0 {
					c.RatioToSocket = c.ReqPerS / socket.ReqPerS
					c.P50DiffUS = c.P50US - socket.P50US
				}
				rep.Cases = append(rep.Cases, c)
				if err != nil {
					return rep, fmt.Errorf("%s, %d concurrent: %w", route, n, err)
				}
			}
		}
	}
	return rep, nil
}

// start starts the manager, waits for every cluster, then starts sm-api
// with a fresh token and waits until it answers for every cluster.
func (s *apiSetup) start(ctx context.Context, o apiOptions, dir string, logw io.Writer) error {
	cfg, err := managerConfig(dir, o.Clusters, simHarness(o.HarnessBin))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Progress, "api: starting sm-manager with %d clusters\n", o.Clusters)
	if s.manager, err = startAttached(ctx, o.ManagerBin, dir, cfg, logw); err != nil {
		return err
	}
	if _, err := s.manager.ready(ctx, ipc.TargetAll, readyTimeout(o.Clusters)); err != nil {
		return err
	}
	pongs, err := s.manager.ready(ctx, "0", startTimeout)
	if err != nil {
		return err
	}
	if s.harness0, err = pidOf(pongs[0]); err != nil {
		return err
	}

	tok := make([]byte, 32)
	rand.Read(tok)
	s.token = hex.EncodeToString(tok)
	tokenFile := filepath.Join(dir, "api-token")
	if err := os.WriteFile(tokenFile, []byte(s.token+"\n"), 0o600); err != nil {
		return err
	}
	if s.apiAddr, err = freeLoopbackAddr(); err != nil {
		return err
	}
	apiCfg := *cfg
	apiCfg.API.Listen, apiCfg.API.TokenFile = s.apiAddr, tokenFile
	if err := apiCfg.Validate(); err != nil {
		return err
	}
	path := filepath.Join(dir, "sm-api.toml")
	if err := writeTOML(path, &apiCfg); err != nil {
		return err
	}
	fmt.Fprintf(o.Progress, "api: starting sm-api on %s\n", s.apiAddr)
	if s.api, err = startChild("sm-api", []string{o.APIBin, "-config", path}, os.Environ(), logw); err != nil {
		return err
	}
	return s.waitAPI(ctx, o.Clusters)
}

// waitAPI polls sm-api until /readyz is 200 and a guild of every cluster is
// answered ready from its WATCH copy.
func (s *apiSetup) waitAPI(ctx context.Context, clusters int) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	var last error
	for c := 0; c < clusters; {
		// Guild c<<22 is on shard c (one shard per cluster): cluster c.
		last = s.probeGuild(ctx, hc, uint64(c)<<22, c)
		if last == nil {
			c++
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sm-api not ready after %v: %w", startTimeout, s.api.why(last))
		}
		select {
		case <-s.api.exited:
			return s.api.why(last)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func (s *apiSetup) probeGuild(ctx context.Context, hc *http.Client, g uint64, cluster int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.apiAddr+"/v1/guilds/"+strconv.FormatUint(g, 10), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /v1/guilds/%d: %s %s", g, res.Status, body)
	}
	if why := checkGuild(body, g, cluster); why != "" {
		return fmt.Errorf("GET /v1/guilds/%d: %s: %s", g, why, body)
	}
	return nil
}

// guildAnswer is what the bench checks of a guild answer.
type guildAnswer struct {
	GuildID string `json:"guild_id"`
	Cluster int    `json:"cluster"`
	Ready   bool   `json:"ready"`
	Source  string `json:"source"`
}

// checkGuild says what is wrong with a guild answer ("" if nothing).
func checkGuild(body []byte, g uint64, cluster int) string {
	var a guildAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return err.Error()
	}
	switch {
	case a.GuildID != strconv.FormatUint(g, 10):
		return "wrong guild_id"
	case a.Cluster != cluster:
		return fmt.Sprintf("cluster %d, want %d", a.Cluster, cluster)
	case !a.Ready:
		return "not ready"
	}
	return ""
}

// socketCase is the baseline: the routed echo on the manager's socket.
func (s *apiSetup) socketCase(ctx context.Context, o apiOptions, payload []byte, n int) (apiCase, error) {
	ro := routeOptions{Warmup: o.Warmup, Duration: o.Duration, Drain: o.Drain}
	req := ipc.Frame{Op: "echo", Target: "0", Payload: payload}
	pids := map[string]int{"bench": os.Getpid(), "manager": s.manager.pid(), "harness": s.harness0, "sm-api": s.api.pid()}
	rc, err := measure(ctx, ro, s.manager.client, req, n, pids)
	return apiCase{
		PayloadBytes: rc.PayloadBytes, WindowS: rc.WindowS, Requests: rc.Requests, ReqPerS: rc.ReqPerS,
		P50US: rc.P50US, P99US: rc.P99US, P999US: rc.P999US, MaxUS: rc.MaxUS, books: rc.books,
		CPUUSPerReq: rc.CPUUSPerReq, OthersCPUPercent: rc.OthersCPUPercent,
	}, err
}

// httpCase drives n closed-loop keep-alive clients at one sm-api route, each
// on its own connection (see httpConn).
func (s *apiSetup) httpCase(ctx context.Context, o apiOptions, route string, payload []byte, n int) (apiCase, error) {
	total := uint64(o.Clusters)
	type worker struct {
		books     books
		lat       histogram
		completed uint64
		watch     uint64
		err       error
	}
	workers := make([]worker, n)
	start := time.Now()
	open, end := start.Add(o.Warmup), start.Add(o.Warmup+o.Duration)
	meter := newCPUMeter(map[string]int{"bench": os.Getpid(), "sm-api": s.api.pid(), "manager": s.manager.pid(), "harness": s.harness0})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	for i := range workers {
		w := &workers[i]
		wg.Go(func() {
			hc := &httpConn{addr: s.apiAddr, auth: "Bearer " + s.token}
			defer hc.close()
			stop := context.AfterFunc(lctx, hc.abort)
			defer stop()
			var path []byte
			for seq := uint64(0); lctx.Err() == nil && time.Now().Before(end); seq++ {
				var g uint64
				method, body := "POST", payload
				if route == apiRouteGuild {
					g = splitmix64(uint64(i)<<40 | seq)
					method, body = "GET", nil
					path = strconv.AppendUint(append(path[:0], "/v1/guilds/"...), g, 10)
				} else {
					path = append(path[:0], "/v1/clusters/0/ops/echo"...)
				}
				w.books.Sent++
				t0 := time.Now()
				status, resp, err := hc.do(method, path, body)
				now := time.Now()
				code := ""
				switch {
				case err != nil:
					if lctx.Err() != nil {
						w.books.Lost++ // cut off by the run's end: not an answer
						return
					}
					code = "transport"
					if w.err == nil {
						w.err = err
					}
				case status/100 != 2:
					code = httpErrorCode(status, resp)
				case route == apiRouteGuild:
					if checkGuild(resp, g, int((g>>22)%total)) != "" {
						code = "bad_guild"
					} else if bytes.Contains(resp, []byte(`"source":"watch"`)) {
						w.watch++
					}
				default:
					// sm-api ends a JSON answer with a newline.
					if !bytes.Equal(bytes.TrimSuffix(resp, []byte("\n")), payload) {
						code = codeBadPayload
					}
				}
				if code == "" {
					w.books.OK++
				} else {
					w.books.addError(code)
				}
				if !now.Before(open) && now.Before(end) {
					w.completed++
					if code == "" {
						w.lat.Record(now.Sub(t0))
					}
				}
			}
		})
	}
	// The window's CPU samples, taken beside the workers.
	werr := sleep(ctx, time.Until(open))
	if werr == nil {
		meter.mark(true)
		if werr = sleep(ctx, time.Until(end)); werr == nil {
			meter.mark(false)
		}
	}
	if werr != nil {
		cancel()
	}
	wg.Wait()

	c := apiCase{WindowS: o.Duration.Seconds()}
	if route == apiRouteOp {
		c.PayloadBytes = len(payload)
	}
	var h histogram
	for i := range workers {
		w := &workers[i]
		c.books.Add(w.books)
		c.Requests += w.completed
		c.WatchAnswers += w.watch
		h.Merge(&w.lat)
		if werr == nil && w.err != nil {
			fmt.Fprintf(o.Progress, "api: %s: client %d: %v\n", route, i, w.err)
		}
	}
	c.ReqPerS = float64(c.Requests) / o.Duration.Seconds()
	c.P50US, c.P99US, c.P999US, c.MaxUS = micros(h.Quantile(0.5)), micros(h.Quantile(0.99)), micros(h.Quantile(0.999)), micros(h.Max())
	c.CPUUSPerReq = meter.perRequest(c.Requests)
	c.OthersCPUPercent = meter.othersPercent()
	if route == apiRouteGuild {
		delete(c.CPUUSPerReq, "harness") // no cluster is asked
	}
	if werr == nil {
		werr = meter.err
	}
	return c, werr
}

// httpConn is one keep-alive HTTP/1.1 client connection, as lean as a load
// generator's: the request is written by hand and the response parsed with
// http.ReadResponse on the same goroutine. net/http's Client hands every
// request to two goroutines of its transport and back, which on two cores
// costs as much CPU as the sm-api request it measures; this costs the bench
// about what its pipe client costs on the socket route. A connection the
// server closes (or that fails) is dialled again for the next request; the
// request it failed is an error.
type httpConn struct {
	addr, auth string

	mu  sync.Mutex // nc, against abort
	nc  net.Conn
	br  *bufio.Reader
	req []byte
	out bytes.Buffer
}

// do sends one request and returns the status and the body, which is valid
// until the next call.
func (c *httpConn) do(method string, path, body []byte) (int, []byte, error) {
	if c.nc == nil {
		nc, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return 0, nil, err
		}
		c.mu.Lock()
		c.nc = nc
		c.mu.Unlock()
		if c.br == nil {
			c.br = bufio.NewReaderSize(nc, 16<<10)
		} else {
			c.br.Reset(nc)
		}
	}
	c.nc.SetDeadline(time.Now().Add(30 * time.Second))
	r := append(c.req[:0], method...)
	r = append(r, ' ')
	r = append(r, path...)
	r = append(r, " HTTP/1.1\r\nHost: "...)
	r = append(r, c.addr...)
	r = append(r, "\r\nAuthorization: "...)
	r = append(r, c.auth...)
	r = append(r, "\r\nUser-Agent: sm-bench\r\n"...)
	if body != nil {
		r = append(r, "Content-Type: application/json\r\nContent-Length: "...)
		r = strconv.AppendInt(r, int64(len(body)), 10)
		r = append(r, "\r\n"...)
	}
	r = append(r, "\r\n"...)
	r = append(r, body...)
	c.req = r
	if _, err := c.nc.Write(r); err != nil {
		c.close()
		return 0, nil, err
	}
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.close()
		return 0, nil, err
	}
	c.out.Reset()
	_, err = c.out.ReadFrom(res.Body)
	res.Body.Close()
	if err != nil {
		c.close()
		return 0, nil, err
	}
	if res.Close {
		c.close()
	}
	return res.StatusCode, c.out.Bytes(), nil
}

// abort makes a blocked do return at once.
func (c *httpConn) abort() {
	c.mu.Lock()
	if c.nc != nil {
		c.nc.SetDeadline(time.Unix(1, 0))
	}
	c.mu.Unlock()
}

func (c *httpConn) close() {
	c.mu.Lock()
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	c.mu.Unlock()
}

// httpErrorCode names a non-2xx answer: its status and sm-api's error code.
func httpErrorCode(status int, body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	code := "http_" + strconv.Itoa(status)
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		code += "_" + e.Error.Code
	}
	return code
}

// splitmix64 spreads a counter over 64 bits: guild ids all over the shards.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func (s *apiSetup) stop() error {
	var errs []error
	if s.api != nil {
		errs = append(errs, s.api.stop(syscall.SIGTERM, 15*time.Second))
	}
	if s.manager != nil {
		errs = append(errs, s.manager.shutdown())
	}
	return errors.Join(errs...)
}

// WriteText prints the report as a table for people.
func (r *apiReport) WriteText(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "api: sm-api and the raw socket route, %d clusters; %v per case after %v warm-up; %d CPUs (%s)\n",
		o.Clusters, o.Duration, o.Warmup, runtime.NumCPU(), cpuModel())
	fmt.Fprintf(w, "  socket: echo {%d bytes} to target \"0\" on the manager's socket; guild: GET /v1/guilds/{id}; op: POST /v1/clusters/0/ops/echo {%d bytes}\n\n",
		len(echoPayload(o.PayloadBytes)), len(echoPayload(o.PayloadBytes)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\tconcurrent\tround\treq/s\tp50 µs\tp99 µs\tp99.9 µs\tvs socket\tCPU µs/req: bench\tsm-api\tmanager\tharness\tok\terrors\tothers' CPU %\t")
	for _, c := range r.Cases {
		ratio := "-"
		if c.RatioToSocket > 0 {
			ratio = fmt.Sprintf("%.2f", c.RatioToSocket)
		}
		harness := "-"
		if v, ok := c.CPUUSPerReq["harness"]; ok {
			harness = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%.1f\t%.1f\t%.1f\t%s\t%d\t%d\t%.0f\t\n",
			c.Route, c.Concurrency, c.Round, c.ReqPerS, c.P50US, c.P99US, c.P999US, ratio,
			c.CPUUSPerReq["bench"], c.CPUUSPerReq["sm-api"], c.CPUUSPerReq["manager"], harness,
			c.OK, c.ErrorCount()+c.Lost, c.OthersCPUPercent)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, s := range r.Summaries() {
		rounds := ""
		if s.Rounds > 1 {
			rounds = fmt.Sprintf(" (median of %d rounds)", s.Rounds)
		}
		fmt.Fprintf(w, "%d concurrent: socket %.0f req/s; GET /v1/guilds/{id} %.0f req/s (%.2f of socket); forwarded op %.0f req/s (%.2f of socket)%s\n",
			s.Concurrency, s.SocketReqPS, s.GuildReqPS, s.GuildRatio, s.OpReqPS, s.OpRatio, rounds)
	}
}

// WriteJSON prints one JSON object per line: each case, then each summary.
func (r *apiReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	if err := encodeEach(enc, r.Cases); err != nil {
		return err
	}
	return encodeEach(enc, r.Summaries())
}

func runAPICmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultAPIOptions
	fs := newScenarioFlags("api", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.binary(&o.APIBin, "sm-api")
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "one-shard clusters behind the manager")
	fs.Var((*intList)(&o.Concurrency), "concurrency", "comma-separated concurrency levels (HTTP clients; requests in flight on the socket), one case each")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "socket/guild/op triples per concurrency; the summary takes the median")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload (and forwarded op body) size in bytes")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "load before each measured window")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window of each case")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "socket route: wait for the last replies before counting them lost")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runAPI(ctx, o)
	return finishReport("api", stdout, rep, rep != nil && len(rep.Cases) > 0, err)
}
