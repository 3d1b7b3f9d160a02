package harnesstest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"

	"github.com/sm-supervisor/sm/ipc"
)

// Business ops Bot answers, besides echo.
const (
	// BotOpEnv answers {"token":$SM_TOKEN,"cluster":$SM_CLUSTER}: proof of what
	// the bridge let through to its child.
	BotOpEnv = "env"
	// BotOpNoise prints a line that is not JSON and a line of over 1 MiB, then
	// answers {"ok":true}: proof that the bridge drops bad lines and goes on.
	BotOpNoise = "noise"
	// BotOpExit exits with the code in its payload ({"code":N}) without a reply.
	BotOpExit = "exit"
	// BotOpIdentify ({"shard":N}) makes the bot ask the manager's identify
	// gate for shard N, as a bot behind the bridge does: it sends
	// {"op":"IDENTIFY","id":"bot-<id>","shard":N} and answers the op with
	// the REPLY it gets, payload or error.
	BotOpIdentify = "identify"
	// BotOpIdentifyCancel ({"shard":N}) makes the bot withdraw its asks for
	// shard N as a bot behind the bridge does: it sends
	// {"op":"IDENTIFY_CANCEL","id":"bot-<id>","shard":N} and answers the op
	// with the REPLY it gets.
	BotOpIdentifyCancel = "identify_cancel"
)

// BotArg, as a test binary's first argument, makes BotMain run Bot instead of
// the tests: the child of exec bridge tests (go-plugin's helper-process
// pattern).
const BotArg = "harnesstest-bot"

// BotMain begins the TestMain of a package whose tests run the test binary
// as the exec bridge's child. Called with BotArg first, it plays Bot on stdin
// and stdout and exits, before the testing package prints anything.
// Otherwise it sets GORACE=atexit_sleep_ms=0 unless GORACE is set: a -race
// child sleeps a second at exit to let late races surface, and the children
// here are short-lived processes whose exits the tests wait for.
func BotMain() {
	if len(os.Args) > 1 && os.Args[1] == BotArg {
		os.Exit(Bot(os.Stdin, os.Stdout, os.Getenv))
	}
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}

// Bot is the smallest bot the exec bridge can run, for tests that re-exec
// their binary as the child: it reads frames as lines on in and writes frames
// as lines to out. On REGISTERED it heartbeats ready with the registration as
// payload and the registration's "resume" (if any) as its resume field; it
// answers echo (payload unchanged) and the BotOp* ops; on QUIESCE it writes
// QUIESCED, with the same resume field and as handoff the last ACTIVATE's,
// and returns 0. It returns the process's exit code.
func Bot(in io.Reader, out io.Writer, getenv func(string) string) int {
	w := bufio.NewWriter(out)
	emit := func(f *ipc.Frame) {
		w.Write(append(ipc.AppendFrame(nil, f), '\n'))
		w.Flush()
	}
	var resume json.RawMessage        // of the last REGISTERED
	var handoff json.RawMessage       // of the last ACTIVATE
	asking := map[string]*ipc.Frame{} // IDENTIFY(_CANCEL) id → the op it answers
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		f, err := ipc.Decode(sc.Bytes())
		if err != nil {
			continue
		}
		switch f.Op {
		case "REGISTERED":
			var reg struct{ Resume json.RawMessage }
			json.Unmarshal(f.Payload, &reg)
			resume = reg.Resume
			emit(&ipc.Frame{Op: ipc.OpHeartbeat, Ready: ipc.Bool(true), Resume: resume, Payload: f.Payload})
		case ipc.OpQuiesce:
			emit(&ipc.Frame{Op: ipc.OpQuiesced, Resume: resume, Handoff: handoff})
			return 0
		case ipc.OpReply:
			if op, ok := asking[f.ID]; ok {
				delete(asking, f.ID)
				emit(&ipc.Frame{Op: ipc.OpReply, ID: op.ID, Payload: f.Payload, Error: f.Error})
			}
		case BotOpIdentify, BotOpIdentifyCancel:
			var p struct{ Shard int }
			json.Unmarshal(f.Payload, &p)
			id := "bot-" + f.ID
			asking[id] = f
			op := ipc.OpIdentify
			if f.Op == BotOpIdentifyCancel {
				op = ipc.OpIdentifyCancel
			}
			emit(&ipc.Frame{Op: op, ID: id, Shard: ipc.Int(p.Shard)})
		case ipc.OpActivate:
			handoff = f.Handoff
		case "echo":
			emit(ipc.Reply(f.ID, f.Payload))
		case BotOpEnv:
			b, _ := json.Marshal(map[string]string{"token": getenv("SM_TOKEN"), "cluster": getenv("SM_CLUSTER")})
			emit(ipc.Reply(f.ID, b))
		case BotOpNoise:
			w.WriteString("this is not a frame\n")
			w.WriteString(`{"op":"REPLY","id":"` + f.ID + `","payload":"` + strings.Repeat("x", 1<<20+1) + "\"}\n")
			emit(ipc.Reply(f.ID, json.RawMessage(`{"ok":true}`)))
		case BotOpExit:
			var p struct{ Code int }
			json.Unmarshal(f.Payload, &p)
			return p.Code
		default:
			if f.ID != "" {
				emit(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeUnknownOp, "bot does not know %q", f.Op)))
			}
		}
	}
	return 0
}
