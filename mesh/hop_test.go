package mesh

import (
	"bytes"
	"errors"
	"testing"
)

func TestFirstHopAndRetry(t *testing.T) {
	me := Holder{Host: "a", Boot: "1"}
	oldMe := Holder{Host: "a", Boot: "0"}
	b := Holder{Host: "b", Boot: "1"}
	c := Holder{Host: "c", Boot: "1"}
	none := Holder{}
	first := []struct {
		name     string
		heldHere bool
		owner    Holder
		owned    bool
		want     HopKind
		to       Holder
	}{
		{"held here", true, none, false, HopLocal, none},
		{"held here, the watch behind", true, b, true, HopLocal, none},
		{"owned by another host", false, b, true, HopForward, b},
		{"nobody", false, none, false, HopFail, none},
		{"taken here, starting", false, me, true, HopLocal, none},
		{"a previous boot of this host", false, oldMe, true, HopFail, none},
	}
	for _, tc := range first {
		h := FirstHop(me, tc.heldHere, tc.owner, tc.owned)
		if h.Kind != tc.want || h.To != tc.to || (h.Kind == HopFail) != (h.Why != "") {
			t.Errorf("FirstHop %s = %+v, want kind %d to %v", tc.name, h, tc.want, tc.to)
		}
	}
	retry := []struct {
		name     string
		tries    int
		heldHere bool
		owner    Holder
		owned    bool
		want     HopKind
		to       Holder
	}{
		{"moved to c", 0, false, c, true, HopForward, c},
		{"moved here", 0, false, me, true, HopLocal, none},
		{"moved here, held", 0, true, none, false, HopLocal, none},
		{"the watch still says b", 0, false, b, true, HopFail, none},
		{"nobody holds it now", 0, false, none, false, HopFail, none},
		{"second move", 1, false, c, true, HopFail, none},
		{"second move, here", 1, true, none, false, HopFail, none},
	}
	for _, tc := range retry {
		h := Retry(me, b, tc.tries, tc.heldHere, tc.owner, tc.owned)
		if h.Kind != tc.want || h.To != tc.to || (h.Kind == HopFail) != (h.Why != "") {
			t.Errorf("Retry %s = %+v, want kind %d to %v", tc.name, h, tc.want, tc.to)
		}
	}
}

func TestForwardFormat(t *testing.T) {
	from := Holder{Host: "gw-1", Boot: "abc"}
	msg := AppendHeader(nil, KindRequests, from)
	reqs := []Request{
		{ID: 1, Cluster: 3, Deadline: 9_000_000, Op: []byte("echo"), Target: []byte("guild:1"), Payload: []byte(`{"x":[1,2]}`)},
		{ID: 0, Flags: FlagPart, Cluster: 0, Op: []byte("ping"), Target: []byte("*")},
		{ID: 1 << 60, Cluster: 1 << 20, Deadline: 1, Op: []byte("a"), Target: []byte("5"), Payload: []byte("null")},
	}
	for _, r := range reqs {
		msg = AppendRequest(msg, r)
	}
	kind, got, rest, err := ParseHeader(msg)
	if err != nil || kind != KindRequests || got != from {
		t.Fatalf("ParseHeader = %q %v %v", kind, got, err)
	}
	for i, want := range reqs {
		var r Request
		if r, rest, err = NextRequest(rest); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if r.ID != want.ID || r.Flags != want.Flags || r.Cluster != want.Cluster || r.Deadline != want.Deadline ||
			!bytes.Equal(r.Op, want.Op) || !bytes.Equal(r.Target, want.Target) || !bytes.Equal(r.Payload, want.Payload) {
			t.Errorf("request %d = %+v, want %+v", i, r, want)
		}
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left", len(rest))
	}

	msg = AppendHeader(nil, KindReplies, from)
	reps := []Reply{
		{ID: 7, Status: StatusOK, Payload: []byte(`"ok"`)},
		{ID: 8, Status: StatusError, Code: []byte("timeout"), Message: []byte("late")},
		{ID: 9, Status: StatusMoved},
	}
	for _, r := range reps {
		msg = AppendReply(msg, r)
	}
	_, _, rest, _ = ParseHeader(msg)
	for i, want := range reps {
		var r Reply
		if r, rest, err = NextReply(rest); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if r.ID != want.ID || r.Status != want.Status || !bytes.Equal(r.Payload, want.Payload) ||
			!bytes.Equal(r.Code, want.Code) || !bytes.Equal(r.Message, want.Message) {
			t.Errorf("reply %d = %+v, want %+v", i, r, want)
		}
	}

	// Garbage and truncations are errors, never a panic.
	full := AppendRequest(AppendHeader(nil, KindRequests, from), reqs[0])
	for n := range len(full) {
		_, _, rest, err := ParseHeader(full[:n])
		if err == nil {
			_, _, err = NextRequest(rest)
		}
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("a message cut at %d bytes: %v", n, err)
		}
	}
	for _, bad := range []string{"", "hello", "smf1X\x01a\x01b", "smf1Q\x00\x00", `{"op":"echo"}`} {
		if _, _, _, err := ParseHeader([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("ParseHeader(%q) = %v", bad, err)
		}
	}
}

func FuzzForwardFormat(f *testing.F) {
	f.Add(AppendRequest(AppendHeader(nil, KindRequests, Holder{Host: "a", Boot: "b"}), Request{ID: 1, Op: []byte("x")}))
	f.Add(AppendReply(AppendHeader(nil, KindReplies, Holder{Host: "a", Boot: "b"}), Reply{ID: 1, Status: StatusMoved}))
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, _, rest, err := ParseHeader(b)
		for err == nil && len(rest) > 0 {
			if kind == KindRequests {
				_, rest, err = NextRequest(rest)
			} else {
				_, rest, err = NextReply(rest)
			}
		}
	})
}
