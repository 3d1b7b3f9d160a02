package manager_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// The test bot is this test binary re-executed as a cluster process (the
// TestHelperProcess pattern), for tests that must see what a cluster sees:
// every REGISTER reply and ACTIVATE it gets is appended to a file in
// $SM_TESTBOT_DIR, which outlives manager restarts, and the test drives its
// IDENTIFY and IDENTIFY_CANCEL through business ops. It is a real spawned
// process, so the manager admits it as it would a bot.
//
// It registers with the SM_* environment and reconnects after a manager
// restart; heartbeats every heartbeat_interval_ms, ready unless
// SM_TESTBOT_UNREADY=1, with resume state for all its shards if
// SM_TESTBOT_RESUME=1 (with a shard_count of 999, which the manager must
// ignore); on QUIESCE sends QUIESCED (with that resume state and, the first
// time only, the handoff set by the "handoff" op or SM_TESTBOT_HANDOFF) and
// exits 0, or with SM_TESTBOT_LINGER=1 stays until it is killed. Ops:
//
//	identify {"shard":n}         IDENTIFY; answers with the REPLY frame it got, as payload
//	identify_cancel {"shard":n}  IDENTIFY_CANCEL, likewise; with "no_id":true sends it without id
//	handoff <any JSON>           what the first QUIESCED will carry as handoff
//	ping                         {"pid":n}
const (
	testbotDirEnv     = "SM_TESTBOT_DIR"
	testbotUnreadyEnv = "SM_TESTBOT_UNREADY"
	testbotResumeEnv  = "SM_TESTBOT_RESUME"
	testbotHandoffEnv = "SM_TESTBOT_HANDOFF"
	testbotLingerEnv  = "SM_TESTBOT_LINGER"
	// testbotLateEnv names a cluster whose bot exits at QUIESCE before its
	// QUIESCED is written (runLateBot).
	testbotLateEnv = "SM_TESTBOT_LATE_CLUSTER"
	// testbotLifetime bounds a test bot's life, so that none outlives a
	// failed test whose manager did not stop it.
	testbotLifetime = 3 * time.Minute
)

func init() {
	if line := os.Getenv(lateWriteEnv); line != "" {
		os.Exit(lateWrite(line))
	}
	if os.Getenv(testbotDirEnv) != "" && os.Getenv("SM_TOKEN") != "" {
		if os.Getenv(testbotLateEnv) == os.Getenv("SM_CLUSTER") {
			os.Exit(runLateBot())
		}
		os.Exit(runTestbot())
	}
}

// testbotConfig is testConfig with the test bot as the cluster command and
// dir as where it records what it gets.
func testbotConfig(t *testing.T, extraEnv map[string]string) (*config.Config, string) {
	t.Helper()
	cfg := testConfig(t)
	dir := t.TempDir()
	cfg.Cluster.Command = []string{os.Args[0]}
	cfg.Cluster.Env = map[string]string{testbotDirEnv: dir}
	for k, v := range extraEnv {
		cfg.Cluster.Env[k] = v
	}
	// The bot's heartbeats are steady, but a loaded machine may hold up a
	// re-executed test binary's start.
	cfg.Heartbeat.Timeout = durationOf(5 * time.Second)
	cfg.Heartbeat.StartTimeout = durationOf(20 * time.Second)
	return cfg, dir
}

func runTestbot() int {
	env := func(k string) int {
		v, err := strconv.Atoi(os.Getenv(k))
		if err != nil {
			fmt.Fprintf(os.Stderr, "testbot: %s: %v\n", k, err)
			os.Exit(2)
		}
		return v
	}
	cluster, first, last := env("SM_CLUSTER"), env("SM_SHARD_FIRST"), env("SM_SHARD_LAST")
	gen := int64(env("SM_GENERATION"))
	dir := os.Getenv(testbotDirEnv)
	pid := os.Getpid()
	base := filepath.Join(dir, fmt.Sprintf("c%d-g%d-p%d", cluster, gen, pid))
	record := func(ext string, line []byte) {
		f, err := os.OpenFile(base+ext, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return
		}
		f.Write(append(line, '\n'))
		f.Close()
	}

	var (
		mu      sync.Mutex
		seq     int64
		handoff = json.RawMessage(os.Getenv(testbotHandoffEnv))
		every   = 50 * time.Millisecond
		beat    = make(chan time.Duration, 1)
	)
	resume := func() json.RawMessage {
		if os.Getenv(testbotResumeEnv) != "1" {
			return nil
		}
		mu.Lock()
		seq++
		n := seq
		mu.Unlock()
		var b bytes.Buffer
		b.WriteByte('[')
		for s := first; s <= last; s++ {
			if s > first {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"shard":%d,"shard_count":999,"session_id":"tb-%d-%d","seq":%d,"resume_url":"wss://testbot.invalid/"}`, s, pid, s, n)
		}
		b.WriteByte(']')
		return b.Bytes()
	}
	ready := os.Getenv(testbotUnreadyEnv) != "1"
	done := make(chan int, 1)

	var client *ipc.Client
	answer := func(f *ipc.Frame, req *ipc.Frame) {
		reply, err := client.Request(context.Background(), req)
		if reply == nil {
			client.Reply(f.ID, nil, ipc.Errorf(ipc.CodeInternal, "%v", err))
			return
		}
		client.Reply(f.ID, ipc.Encode(reply), nil)
	}
	handle := func(c *ipc.Client, f *ipc.Frame) {
		switch f.Op {
		case ipc.OpActivate:
			record(".act", ipc.Encode(f))
		case ipc.OpQuiesce:
			go func() {
				mu.Lock()
				h := handoff
				handoff = nil
				mu.Unlock()
				c.Send(&ipc.Frame{Op: ipc.OpQuiesced, Resume: resume(), Handoff: h})
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c.Flush(ctx)
				cancel()
				if os.Getenv(testbotLingerEnv) != "1" {
					done <- 0
				}
			}()
		case "handoff":
			mu.Lock()
			handoff = append(json.RawMessage(nil), f.Payload...)
			mu.Unlock()
			c.Reply(f.ID, json.RawMessage(`{"ok":true}`), nil)
		case "ping":
			c.Reply(f.ID, fmt.Appendf(nil, `{"pid":%d}`, pid), nil)
		case "identify", "identify_cancel":
			var p struct {
				Shard int  `json:"shard"`
				NoID  bool `json:"no_id"`
			}
			json.Unmarshal(f.Payload, &p)
			req := &ipc.Frame{Op: ipc.OpIdentify, Shard: ipc.Int(p.Shard)}
			if f.Op == "identify_cancel" {
				req.Op = ipc.OpIdentifyCancel
			}
			if p.NoID {
				err := c.Send(req)
				c.Reply(f.ID, fmt.Appendf(nil, `{"sent":%v}`, err == nil), nil)
				return
			}
			go answer(f, req)
		default:
			if f.ID != "" && f.Op != ipc.OpReply {
				c.Reply(f.ID, nil, ipc.Errorf(ipc.CodeUnknownOp, "testbot does not know %q", f.Op))
			}
		}
	}
	client = ipc.NewClient(ipc.ClientConfig{
		Path: os.Getenv("SM_SOCKET"),
		Register: ipc.Frame{
			Role: ipc.RoleCluster, Cluster: ipc.Int(cluster), Generation: ipc.Int64(gen),
			Token: os.Getenv("SM_TOKEN"), PID: pid,
		},
		Handler: handle,
		OnConnect: func(c *ipc.Client, reply *ipc.Frame) {
			record(".reg", reply.Payload)
			var r struct {
				HeartbeatMS int64 `json:"heartbeat_interval_ms"`
			}
			json.Unmarshal(reply.Payload, &r)
			select {
			case beat <- time.Duration(r.HeartbeatMS) * time.Millisecond:
			default:
			}
			c.Send(&ipc.Frame{Op: ipc.OpHeartbeat, Ready: ipc.Bool(ready), Resume: resume()})
		},
		Reconnect: true,
		Backoff:   backoff.Policy{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.2},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if err := client.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testbot:", err)
			done <- 1
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	life := time.After(testbotLifetime)
	for {
		select {
		case d := <-beat:
			if d > 0 {
				tick.Reset(d)
			}
		case <-tick.C:
			client.Send(&ipc.Frame{Op: ipc.OpHeartbeat, Ready: ipc.Bool(ready), Resume: resume()})
		case code := <-done:
			return code
		case <-life:
			fmt.Fprintln(os.Stderr, "testbot: lived too long; exiting")
			return 3
		}
	}
}

// botRecord is one line a test bot recorded.
type botRecord struct {
	Cluster int
	Gen     int64
	PID     int
	Raw     json.RawMessage
}

// botRegistration is the part of a REGISTER reply the tests read.
type botRegistration struct {
	Active   bool   `json:"active"`
	MaxFrame int    `json:"max_frame_bytes"`
	Start    string `json:"start"`
	Total    int    `json:"total_shards"`
	Resume   []json.RawMessage
	Gateway  *struct {
		URL               string `json:"url"`
		Shards            int    `json:"shards"`
		SessionStartLimit struct {
			Total          int   `json:"total"`
			Remaining      int   `json:"remaining"`
			ResetAfter     int64 `json:"reset_after"`
			MaxConcurrency int   `json:"max_concurrency"`
		} `json:"session_start_limit"`
	} `json:"gateway"`
	Identify struct {
		MaxConcurrency int   `json:"max_concurrency"`
		SpacingMS      int64 `json:"spacing_ms"`
	} `json:"identify"`
}

func (r botRecord) registration(t *testing.T) botRegistration {
	t.Helper()
	var reg botRegistration
	var raw struct {
		Resume []json.RawMessage `json:"resume"`
	}
	if err := json.Unmarshal(r.Raw, &reg); err != nil {
		t.Fatalf("REGISTER reply %s: %v", r.Raw, err)
	}
	json.Unmarshal(r.Raw, &raw)
	reg.Resume = raw.Resume
	return reg
}

// botRecords reads what the test bots in dir recorded with extension ext
// (".reg" or ".act"), in the order each process got them; processes are in no
// particular order.
func botRecords(t *testing.T, dir, ext string) []botRecord {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "c*-g*-p*"+ext))
	if err != nil {
		t.Fatal(err)
	}
	var out []botRecord
	for _, name := range files {
		var r botRecord
		if _, err := fmt.Sscanf(filepath.Base(name), "c%d-g%d-p%d", &r.Cluster, &r.Gen, &r.PID); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			rec := r
			rec.Raw = append(json.RawMessage(nil), sc.Bytes()...)
			out = append(out, rec)
		}
		f.Close()
	}
	return out
}

// botRegs is the REGISTER replies of pid, in order.
func botRegs(t *testing.T, dir string, pid int) []botRegistration {
	t.Helper()
	var out []botRegistration
	for _, r := range botRecords(t, dir, ".reg") {
		if r.PID == pid {
			out = append(out, r.registration(t))
		}
	}
	return out
}

// botOp sends op to cluster target and returns the REPLY frame the bot got
// from the manager for the IDENTIFY(_CANCEL) it sent.
func botOp(t *testing.T, c *ipc.Client, op, target string, payload any) *ipc.Frame {
	t.Helper()
	r, err := request(t, c, op, target, payload, 5*time.Second)
	if err != nil {
		t.Fatalf("%s to %s: %v", op, target, err)
	}
	f, err := ipc.Decode(r.Payload)
	if err != nil {
		t.Fatalf("%s to %s: the bot answered %s: %v", op, target, r.Payload, err)
	}
	return f
}

// lateWriteEnv holds the line the late writer writes (runLateBot).
const lateWriteEnv = "SM_TESTBOT_LATE_WRITE"

// runLateBot is a test bot whose QUIESCED reaches the manager after the
// kernel has reported its exit, as a wrapper's child's may: on QUIESCE it
// hands its connection to a process of its own (outside its process group,
// which the manager kills when it exits), exits at once, and that process
// writes the QUIESCED, with the SM_TESTBOT_HANDOFF handoff, 200 ms later. It
// speaks the protocol by hand, because it needs the socket itself: REGISTER,
// a ready heartbeat every 50 ms, ACTIVATEs recorded as runTestbot's are.
func runLateBot() int {
	dir := os.Getenv(testbotDirEnv)
	cluster, _ := strconv.Atoi(os.Getenv("SM_CLUSTER"))
	gen, _ := strconv.ParseInt(os.Getenv("SM_GENERATION"), 10, 64)
	pid := os.Getpid()
	base := filepath.Join(dir, fmt.Sprintf("c%d-g%d-p%d", cluster, gen, pid))
	nc, err := net.Dial("unix", os.Getenv("SM_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "latebot:", err)
		return 1
	}
	var wmu sync.Mutex
	write := func(f *ipc.Frame) {
		wmu.Lock()
		nc.Write(append(ipc.Encode(f), '\n'))
		wmu.Unlock()
	}
	write(&ipc.Frame{Op: ipc.OpRegister, ID: "r", Role: ipc.RoleCluster, Cluster: ipc.Int(cluster),
		Generation: ipc.Int64(gen), Token: os.Getenv("SM_TOKEN"), PID: pid})
	go func() {
		for range time.Tick(50 * time.Millisecond) {
			write(&ipc.Frame{Op: ipc.OpHeartbeat, Ready: ipc.Bool(true)})
		}
	}()
	go func() {
		time.Sleep(testbotLifetime)
		os.Exit(3)
	}()
	r := ipc.NewReader(nc, 1<<20)
	for {
		line, err := r.ReadFrame()
		if err != nil {
			return 1
		}
		f, err := ipc.Decode(line)
		if err != nil {
			continue
		}
		switch f.Op {
		case ipc.OpReply:
			if f.ID == "r" {
				os.WriteFile(base+".reg", append(f.Payload, '\n'), 0o600)
			}
		case ipc.OpActivate:
			os.WriteFile(base+".act", append(ipc.Encode(f), '\n'), 0o600)
		case ipc.OpQuiesce:
			fd, err := nc.(*net.UnixConn).File()
			if err != nil {
				return 1
			}
			q := ipc.Encode(&ipc.Frame{Op: ipc.OpQuiesced, Handoff: json.RawMessage(os.Getenv(testbotHandoffEnv))})
			cmd := exec.Command(os.Args[0])
			cmd.Env = []string{lateWriteEnv + "=" + string(q)}
			cmd.ExtraFiles = []*os.File{fd}
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				return 1
			}
			wmu.Lock() // no heartbeat may follow the exit
			return 0
		}
	}
}

// lateWrite is the late bot's writer: 200 ms after it starts, it writes line
// to the connection it inherited (fd 3) and exits, closing it.
func lateWrite(line string) int {
	time.Sleep(200 * time.Millisecond)
	f := os.NewFile(3, "conn")
	if _, err := f.Write([]byte(line + "\n")); err != nil {
		return 1
	}
	return 0
}
