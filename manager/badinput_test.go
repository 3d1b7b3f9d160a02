package manager_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// Bad input over raw sockets, against a real manager and real simulated
// clusters. Every case checks two things: the offender gets its stable error
// code or a clean close, and a bystander client and the clusters carry on as
// if nothing happened (same processes, no restart, answers within a second).

// badConfig is testConfig with a small frame limit, so oversized frames are
// cheap to make.
func badConfig(t *testing.T) *config.Config {
	cfg := testConfig(t)
	cfg.Limits.MaxFrameBytes = 4096
	return cfg
}

// garbage returns n random bytes with no newline in them, starting with a NUL
// and an invalid UTF-8 sequence so no seed can make them JSON by chance.
func garbage(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
		if b[i] == '\n' {
			b[i] = 0
		}
	}
	copy(b, "\x00\xff\xfe\xc3\x28")
	return b
}

// pingWorks sends a ping on rc and checks its answer is the next frame.
func pingWorks(t *testing.T, rc *rawConn, id string) {
	t.Helper()
	rc.send(`{"op":"ping","id":"` + id + `","target":"1"}`)
	f := rc.read(t, 2*time.Second)
	if f.Op != ipc.OpReply || f.ID != id || f.Error != nil {
		t.Fatalf("%s: ping after bad input: got %s", rc.name, ipc.Encode(f))
	}
}

// refusal is a line a registered client sends and the error REPLY it must
// get: the line's id (none if it has none or it cannot be read) and the code.
type refusal struct{ line, id, code string }

// expectRefused starts a manager with a bystander and, from a registered raw
// client named name, sends each line (a subtest named by the line) and
// expects its refusal, then a ping answered: the connection goes on. Last, the
// bystander and the clusters must be undisturbed.
func expectRefused(t *testing.T, name string, refusals ...refusal) *env {
	t.Helper()
	e := start(t, badConfig(t))
	by := newBystander(t, e)
	rc := e.rawClient(name)
	for i, r := range refusals {
		t.Run(r.line, func(t *testing.T) {
			rc.send(r.line)
			rc.expectError(t, r.id, r.code)
			pingWorks(t, rc, "after-"+strconv.Itoa(i))
		})
	}
	by.check()
	return e
}

// queueConfig is testConfig with frames up to 128 KiB and a client's or
// cluster's outbound queue bounded at 64 frames or 1 MiB, so a few frames
// fill it.
func queueConfig(t *testing.T) *config.Config {
	cfg := testConfig(t)
	cfg.Limits.MaxFrameBytes = 128 << 10
	cfg.Limits.MaxQueue = 64
	cfg.Limits.MaxQueueBytes = 1 << 20
	return cfg
}

func TestBadInputGarbageBytes(t *testing.T) {
	e := start(t, badConfig(t))
	by := newBystander(t, e)

	// As the first frame: not_registered, no id (there was none to read), close.
	rc := e.dialRaw("garbage-first")
	rc.write(append(garbage(1, 512), '\n'))
	rc.expectError(t, "", ipc.CodeNotRegistered)
	rc.expectClosed(t)
	by.check()

	// After REGISTER: one bad_frame without id per line, and the connection
	// goes on; several lines in one write resynchronise at each newline.
	rc = e.rawClient("garbage-later")
	var buf []byte
	for seed := range uint64(20) {
		buf = append(buf, garbage(seed+100, 64+int(seed)*37)...)
		buf = append(buf, '\n')
	}
	rc.write(buf)
	for range 20 {
		rc.expectError(t, "", ipc.CodeBadFrame)
	}
	pingWorks(t, rc, "after-garbage")
	by.check()
}

func TestBadInputMalformedFrames(t *testing.T) {
	expectRefused(t, "malformed",
		refusal{`hello, manager`, "", ipc.CodeBadFrame},                     // not JSON
		refusal{`{"op":"ping","id":"3","target":"0"`, "", ipc.CodeBadFrame}, // truncated
		refusal{`["op","ping"]`, "", ipc.CodeBadFrame},                      // an array
		refusal{`"ping"`, "", ipc.CodeBadFrame},                             // a string
		refusal{`42`, "", ipc.CodeBadFrame},                                 // a number
		refusal{`null`, "", ipc.CodeBadFrame},
		refusal{`{"id":"7"}`, "7", ipc.CodeBadFrame},                                          // no op
		refusal{`{"op":"","id":"8","target":"0"}`, "8", ipc.CodeBadFrame},                     // an empty op
		refusal{`{"op":1,"id":"9"}`, "9", ipc.CodeBadFrame},                                   // an op not a string
		refusal{"{\"op\":\"ping\",\"id\":\"10\",\"target\":\"0\x01\"}", "", ipc.CodeBadFrame}, // a raw control character in a string
		refusal{`{"op":"ping","id":11,"target":"0"}`, "", ipc.CodeBadFrame},                   // an id not a string
	)
}

func TestBadInputOversizedFrames(t *testing.T) {
	cfg := badConfig(t)
	max := cfg.Limits.MaxFrameBytes
	e := start(t, cfg)
	by := newBystander(t, e)
	// padded returns a ping with id whose JSON object is exactly n bytes.
	padded := func(id string, n int) string {
		head := `{"op":"ping","id":"` + id + `","target":"2","pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}

	// Before REGISTER there is nothing to resynchronise for: refuse and close.
	rc := e.dialRaw("big-first")
	rc.send(`{"op":"REGISTER","id":"r","role":"client","name":"` + strings.Repeat("n", max) + `"}`)
	rc.expectError(t, "", ipc.CodeFrameTooLarge)
	rc.expectClosed(t)
	by.check()

	// After REGISTER: frame_too_large without id (the frame was never parsed),
	// and the stream picks up at the next newline, here in the same write.
	rc = e.rawClient("big-later")
	rc.write([]byte(padded("big", max+1) + "\n" + `{"op":"ping","id":"next","target":"0"}` + "\n"))
	rc.expectError(t, "", ipc.CodeFrameTooLarge)
	if f := rc.read(t, 2*time.Second); f.ID != "next" || f.Error != nil {
		t.Fatalf("frame after the oversized one: got %s", ipc.Encode(f))
	}
	// The limit counts the object, not its newline: exactly max is served.
	rc.send(padded("exact", max))
	if f := rc.read(t, 2*time.Second); f.ID != "exact" || f.Error != nil {
		t.Fatalf("frame of exactly max_frame_bytes: got %s", ipc.Encode(f))
	}
	by.check()

	// A line that never ends must not make the manager buffer it: 48 MiB with
	// no newline, while the bystander keeps being served.
	const huge = 48 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	wrote := make(chan error, 1)
	go func() {
		chunk := bytes.Repeat([]byte("y"), 64<<10)
		rc.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		for n := 0; n < huge; n += len(chunk) {
			if _, err := rc.nc.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	for done := false; !done; {
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatalf("writing the endless line: %v", err)
			}
			done = true
		default:
			if d := by.ping(3); d > time.Second {
				t.Fatalf("bystander ping took %v during the endless line", d)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Errorf("heap grew by %d MiB while reading a %d MiB line", grew>>20, huge>>20)
	}
	rc.send("")
	rc.expectError(t, "", ipc.CodeFrameTooLarge)
	pingWorks(t, rc, "after-endless-line")
	by.check()
}

func TestBadInputFirstFrameNotRegister(t *testing.T) {
	e := start(t, badConfig(t))
	by := newBystander(t, e)
	rc := e.dialRaw("no-register")
	rc.send(`{"op":"ping","id":"x","target":"0"}`)
	rc.expectError(t, "x", ipc.CodeNotRegistered)
	rc.expectClosed(t)

	// Without an id the refusal carries none.
	rc = e.dialRaw("no-register-no-id")
	rc.send(`{"op":"HEARTBEAT","ready":true}`)
	rc.expectError(t, "", ipc.CodeNotRegistered)
	rc.expectClosed(t)

	// A frame that is an object without op still gets its id back.
	rc = e.dialRaw("no-op")
	rc.send(`{"id":"y"}`)
	rc.expectError(t, "y", ipc.CodeNotRegistered)
	rc.expectClosed(t)
	by.check()
}

// tokenOf reads SM_TOKEN from a spawned process's environment (the test runs
// as root, as an attacker who stole the token would need to be).
func tokenOf(t *testing.T, pid int) string {
	t.Helper()
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Skipf("cannot read the environment of pid %d: %v", pid, err)
	}
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("SM_TOKEN=")); ok {
			return string(v)
		}
	}
	t.Fatalf("pid %d has no SM_TOKEN", pid)
	return ""
}

func clusterRegister(id string, cluster int, gen int64, token string) string {
	return fmt.Sprintf(`{"op":"REGISTER","id":%q,"role":"cluster","cluster":%d,"generation":%d,"token":%q,"pid":%d}`,
		id, cluster, gen, token, os.Getpid())
}

func TestBadInputClusterRegister(t *testing.T) {
	cfg := badConfig(t)
	// Cluster 3 runs a process that never connects, so its slot is free and
	// its token unused: only the peer check stands between a thief and it.
	runFirst(t, cfg, 3, "exec sleep 60")
	cfg.Heartbeat.StartTimeout = durationOf(time.Minute)
	e := start(t, cfg)
	by := newBystander(t, e, 0, 1, 2)
	var sleeper int
	testenv.WaitFor(t, 5*time.Second, "cluster 3 spawned", func() bool {
		sleeper = e.MustStatus().Clusters[3].PID
		return sleeper != 0
	})
	live := tokenOf(t, by.pids[0])
	free := tokenOf(t, sleeper)

	refused := func(name, line, id, code string) string {
		t.Helper()
		rc := e.dialRaw(name)
		rc.send(line)
		f := rc.read(t, 5*time.Second)
		if f.Op != ipc.OpReply || f.ID != id || f.Error == nil || f.Error.Code != code {
			t.Fatalf("%s: got %s, want REPLY id=%q error %s", name, ipc.Encode(f), id, code)
		}
		rc.expectClosed(t)
		return f.Error.Message
	}
	refused("wrong token", clusterRegister("1", 0, 1, strings.Repeat("0", len(live))), "1", ipc.CodeForbidden)
	refused("empty token", clusterRegister("2", 0, 1, ""), "2", ipc.CodeForbidden)
	refused("token of another cluster", clusterRegister("3", 1, 1, live), "3", ipc.CodeForbidden)
	refused("live slot, wrong peer", clusterRegister("4", 0, 1, live), "4", ipc.CodeForbidden)
	if msg := refused("free slot, wrong peer", clusterRegister("5", 3, 1, free), "5", ipc.CodeForbidden); !strings.Contains(msg, "peer") {
		t.Errorf("free slot with the right token refused for %q, want the peer check", msg)
	}
	refused("wrong generation", clusterRegister("6", 3, 2, free), "6", ipc.CodeForbidden)
	refused("generation 0", clusterRegister("7", 3, 0, free), "7", ipc.CodeForbidden)
	refused("cluster out of range", clusterRegister("8", 99, 1, free), "8", ipc.CodeForbidden)
	refused("negative cluster", clusterRegister("9", -1, 1, free), "9", ipc.CodeForbidden)
	refused("no cluster field", `{"op":"REGISTER","id":"10","role":"cluster","generation":1,"token":"`+free+`"}`, "10", ipc.CodeBadFrame)
	refused("unknown role", `{"op":"REGISTER","id":"11","role":"admin","name":"x"}`, "11", ipc.CodeBadFrame)
	refused("no role", `{"op":"REGISTER","id":"12","name":"x"}`, "12", ipc.CodeBadFrame)

	// The free slot is still free and its process untouched.
	if c := e.MustStatus().Clusters[3]; c.State != "starting" || c.PID != sleeper || c.Restarts != 0 {
		t.Fatalf("cluster 3 disturbed by refused REGISTERs: %+v", c)
	}
	by.check()
}

func TestBadInputDuplicateRegister(t *testing.T) {
	expectRefused(t, "dup",
		refusal{`{"op":"REGISTER","id":"again","role":"client","name":"dup"}`, "again", ipc.CodeForbidden},
		// Switching role is no way round it.
		refusal{`{"op":"REGISTER","id":"as-cluster","role":"cluster","cluster":0,"generation":1,"token":"x"}`, "as-cluster", ipc.CodeForbidden},
		refusal{`{"op":"REGISTER","role":"client","name":"dup"}`, "", ipc.CodeForbidden},
	)
}

func TestBadInputUnknownReplyID(t *testing.T) {
	var refusals []refusal
	for _, line := range []string{
		`{"op":"REPLY","id":"nope","payload":{}}`,
		`{"op":"REPLY","id":"1","payload":{}}`, // a plausible manager id: still not this client's to answer
		`{"op":"REPLY","payload":{}}`,
		`{"op":"REPLY","id":"2","error":{"code":"timeout","message":"x"}}`,
	} {
		refusals = append(refusals, refusal{line, "", ipc.CodeUnknownID})
	}
	expectRefused(t, "replier", refusals...)
}

func TestBadInputBadTarget(t *testing.T) {
	var refusals []refusal
	for i, target := range []string{"", `,"target":""`, `,"target":"99"`, `,"target":"4"`, `,"target":"-1"`, `,"target":"+1"`,
		`,"target":"shard:999"`, `,"target":"shard:8"`, `,"target":"guild:abc"`, `,"target":"nowhere"`} {
		id := "t" + strconv.Itoa(i)
		refusals = append(refusals, refusal{`{"op":"ping","id":"` + id + `"` + target + `}`, id, ipc.CodeUnknownTarget})
	}
	// A notification (no id) to nowhere still learns why, without an id.
	refusals = append(refusals, refusal{`{"op":"ping","target":"99"}`, "", ipc.CodeUnknownTarget})
	expectRefused(t, "targets", refusals...)
}

// A client that sends and never reads fills its outbound queue and is cut off;
// while it is being fed, nobody else waits on it.
func TestBadInputClientNeverReads(t *testing.T) {
	e := start(t, queueConfig(t))
	by := newBystander(t, e)
	slow := e.rawClient("never-reads")

	payload := `"` + strings.Repeat("z", 64<<10) + `"`
	const frames = 5000
	fed := make(chan error, 1)
	began := time.Now()
	go func() {
		// Not rc.write: its failure is the expected outcome here.
		slow.nc.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for i := range frames {
			line := fmt.Sprintf(`{"op":"echo","id":"s%d","target":"%d","payload":%s}`+"\n", i, i%4, payload)
			if _, err := slow.nc.Write([]byte(line)); err != nil {
				fed <- err
				return
			}
		}
		fed <- nil
	}()
	var worst time.Duration
	var err error
feeding:
	for {
		select {
		case err = <-fed:
			break feeding
		default:
			for _, i := range by.clusters {
				worst = max(worst, by.ping(i))
			}
		}
	}
	cut := time.Since(began)
	if err == nil {
		t.Fatalf("the manager took all %d requests of a client that never reads", frames)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("client that never reads was not cut off: its writes blocked for %v", cut)
	}
	if cut > 5*time.Second {
		t.Errorf("cut off after %v, want a few seconds at most", cut)
	}
	slow.expectClosed(t)
	if worst > time.Second {
		t.Errorf("bystander ping took %v while the slow client was fed", worst)
	}
	t.Logf("slow client cut off after %v (%v); worst bystander ping %v", cut.Round(time.Millisecond), err, worst)
	by.check()
}

// A burst of requests for a cluster that is briefly not reading (stopped
// here; a GC pause or a busy machine does the same) must not get the cluster
// cut off: its queue is shared with everyone else's requests. The sender of
// the requests that do not fit learns busy; the cluster stays.
func TestBadInputRequestBurstDoesNotCutOffCluster(t *testing.T) {
	cfg := queueConfig(t)
	cfg.Heartbeat.Timeout = durationOf(3 * time.Second) // the pause is not a hang
	e := start(t, cfg)
	by := newBystander(t, e)
	burst := e.rawClient("burst")

	pid := by.pids[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	payload := `"` + strings.Repeat("b", 64<<10) + `"`
	const n = 48 // 3 MiB: three times the queue bound
	// Read the replies as they come, from the start: this client is not the
	// one under test, and must not itself be cut off for reading late.
	replies := make(chan *ipc.Frame, n)
	go func() {
		defer close(replies)
		for range n {
			burst.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := burst.r.ReadFrame()
			if err != nil {
				t.Errorf("burst: read: %v", err)
				return
			}
			f, err := ipc.Decode(line)
			if err != nil {
				t.Errorf("burst: decode: %v", err)
				return
			}
			replies <- f
		}
	}()
	for i := range n {
		burst.send(fmt.Sprintf(`{"op":"echo","id":"b%d","target":"0","payload":%s}`, i, payload))
	}
	// Let the manager take the whole burst while the cluster reads nothing.
	time.Sleep(300 * time.Millisecond)
	by.ping(1)
	resume()

	codes := map[string]int{}
	for f := range replies {
		switch {
		case f.Error == nil:
			codes["ok"]++
		default:
			codes[f.Error.Code]++
		}
	}
	t.Logf("burst of %d: %v", n, codes)
	if codes["ok"]+codes[ipc.CodeBusy] != n || codes[ipc.CodeBusy] == 0 {
		t.Errorf("burst replies %v, want only ok and busy, some busy", codes)
	}
	pingWorks(t, burst, "after-burst")
	by.check()
}

// A peer whose uid is not allowed is refused before REGISTER is read. The peer
// is this test binary re-exec'd as nobody (see helperRegister).
func TestBadInputUIDNotAllowed(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a helper as another uid")
	}
	const nobody = 65534
	e := start(t, badConfig(t))
	by := newBystander(t, e)

	// nobody must be able to reach the socket and run the binary: the
	// directories t.TempDir makes are 0700, as is go test's build directory.
	binDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "manager.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Dir(e.cfg.Socket)
	for _, p := range []string{filepath.Dir(sockDir), sockDir, binDir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(e.cfg.Socket, 0o666); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "-test.run=^TestHelperProcess$")
	cmd.Env = []string{helperEnv + "=register", helperSocketEnv + "=" + e.cfg.Socket}
	cmd.Dir = binDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	got := string(out)
	t.Logf("helper as uid %d:\n%s%s", nobody, got, stderr.String())
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 2 || lines[1] != "closed" {
		t.Fatalf("helper saw %q, want one refusal and a close", lines)
	}
	f, err := ipc.Decode([]byte(strings.TrimPrefix(lines[0], "frame ")))
	if err != nil {
		t.Fatalf("helper's frame: %v", err)
	}
	// The refusal comes before REGISTER is read, so it cannot carry its id.
	if f.Op != ipc.OpReply || f.ID != "" || f.Error == nil || f.Error.Code != ipc.CodeForbidden {
		t.Fatalf("helper got %s, want a forbidden REPLY", ipc.Encode(f))
	}
	by.check()
}

func TestBadInputStructuralOpsFromClient(t *testing.T) {
	var refusals []refusal
	for _, tc := range []struct{ line, id string }{
		{`{"op":"HEARTBEAT","id":"h","ready":true,"payload":{"fake":true}}`, "h"},
		{`{"op":"HEARTBEAT","ready":false}`, ""},
		{`{"op":"QUIESCED","id":"qd"}`, "qd"},
		{`{"op":"QUIESCED"}`, ""},
		{`{"op":"QUIESCE","id":"q"}`, "q"},
		{`{"op":"QUIESCE","target":"0"}`, ""},
		{`{"op":"ACTIVATE","id":"a","target":"1"}`, "a"},
		{`{"op":"ACTIVATE"}`, ""},
	} {
		refusals = append(refusals, refusal{tc.line, tc.id, ipc.CodeForbidden})
	}
	e := expectRefused(t, "impostor", refusals...)
	// No cluster was quiesced (the bystander's check), re-activated or fed a
	// fake heartbeat.
	for _, c := range e.MustStatus().Clusters {
		if bytes.Contains(c.Heartbeat, []byte("fake")) {
			t.Errorf("cluster %d shows the client's heartbeat payload", c.ID)
		}
	}
}

func TestBadInputConnectionFlood(t *testing.T) {
	cfg := badConfig(t)
	cfg.Limits.MaxConnections = 4 // beyond the 4 clusters' own
	e := start(t, cfg)
	e.WaitReady()            // every cluster got in, although 4 clients will fill the limit
	by := newBystander(t, e) // the bystander: 1 of 4
	var kept []*rawConn
	for i := range 3 {
		kept = append(kept, e.rawClient("kept"+strconv.Itoa(i)))
	}
	for i := range 4 {
		rc := e.dialRaw("extra" + strconv.Itoa(i))
		rc.expectError(t, "", ipc.CodeBusy)
		rc.expectClosed(t)
	}
	for i, rc := range kept {
		pingWorks(t, rc, "kept"+strconv.Itoa(i))
	}
	by.check()

	// A freed place is available again.
	kept[0].nc.Close()
	testenv.WaitFor(t, 5*time.Second, "a connection accepted again", func() bool {
		nc, err := net.Dial("unix", e.cfg.Socket)
		if err != nil {
			return false
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(2 * time.Second))
		nc.Write([]byte(`{"op":"REGISTER","id":"r","role":"client","name":"late"}` + "\n"))
		line, err := ipc.NewReader(nc, 1<<20).ReadFrame()
		if err != nil {
			return false
		}
		f, err := ipc.Decode(line)
		return err == nil && f.ID == "r" && f.Error == nil
	})
	by.check()
}

func TestBadInputSilentConnection(t *testing.T) {
	cfg := badConfig(t)
	cfg.Limits.RegisterTimeout = durationOf(300 * time.Millisecond)
	e := start(t, cfg)
	by := newBystander(t, e)

	silent := e.dialRaw("silent")
	partial := e.dialRaw("partial")
	began := time.Now()
	partial.write([]byte(`{"op":"REGISTER","id":"p","ro`)) // and never the rest
	for _, rc := range []*rawConn{silent, partial} {
		rc.expectError(t, "", ipc.CodeNotRegistered)
		rc.expectClosed(t)
	}
	if took := time.Since(began); took < 250*time.Millisecond || took > 3*time.Second {
		t.Errorf("silent connections closed after %v, want about register_timeout (300ms)", took)
	}
	by.check()
}
