package manager_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// nested is a JSON array nested levels deep: [[…[1]…]].
func nested(levels int) string {
	return strings.Repeat("[", levels) + "1" + strings.Repeat("]", levels)
}

// A request nested deeper than limits.max_json_depth gets its REPLY, with its
// id, wherever the id stands in the frame, and the connection goes on; one at
// the limit is forwarded. The frame's own object is level 1.
func TestTooDeepFrameGetsItsID(t *testing.T) {
	// The default, encoding/json's own; and one below what the fast decoder
	// follows, so that it is checked there too.
	for _, limit := range []int{10000, 32} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) { testDepthLimit(t, limit) })
	}
}

func testDepthLimit(t *testing.T, limit int) {
	cfg := testConfig(t)
	cfg.Limits.MaxJSONDepth = limit
	e := start(t, cfg)
	by := newBystander(t, e)
	rc := e.rawClient("deep")

	rc.send(`{"op":"echo","id":"deep-1","target":"0","payload":` + nested(limit) + `}`)
	rc.expectError(t, "deep-1", ipc.CodeBadFrame)
	rc.send(`{"op":"echo","target":"0","payload":` + nested(limit) + `,"id":"deep-2"}`)
	rc.expectError(t, "deep-2", ipc.CodeBadFrame)
	pingWorks(t, rc, "after-deep")

	payload := nested(limit - 1)
	rc.send(`{"op":"echo","id":"at-limit","target":"0","payload":` + payload + `}`)
	if f := rc.read(t, 5*time.Second); f.ID != "at-limit" || f.Error != nil || string(f.Payload) != payload {
		t.Fatalf("a frame at the limit: REPLY id %q, error %v, payload of %d bytes", f.ID, f.Error, len(f.Payload))
	}

	// The first frame: not_registered, with its id, and closed.
	first := e.dialRaw("deep-first")
	first.send(`{"op":"REGISTER","id":"r","role":"client","name":"x","payload":` + nested(limit) + `}`)
	first.expectError(t, "r", ipc.CodeNotRegistered)
	first.expectClosed(t)
	by.check()
}
