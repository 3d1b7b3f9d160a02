package ipc_test

import (
	"strings"
	"testing"

	"github.com/sm-supervisor/sm/ipc"
)

// A frame deeper than the Decoder's limit is refused with bad_frame, and comes
// back with the op and id of its top level by encoding/json's rules, so the
// REPLY can carry the id; brackets inside strings do not count.
func TestDecoderMaxDepth(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name, frame string
		max         int
		tooDeep     bool
		op, id      string
	}{
		{"at the limit", `{"op":"x","id":"1","payload":` + deep(3) + `}`, 4, false, "x", "1"},
		{"one past", `{"op":"x","id":"1","payload":` + deep(4) + `}`, 4, true, "x", "1"},
		{"id after the payload", `{"op":"x","payload":` + deep(4) + `,"id":"late"}`, 4, true, "x", "late"},
		{"escaped id, keys in any case", `{"OP":"x","payload":{"a":` + deep(4) + `},"Id":"a\"b"}`, 4, true, "x", `a"b`},
		{"the last id wins", `{"id":"1","op":"x","payload":` + deep(4) + `,"id":"2"}`, 4, true, "x", "2"},
		{"brackets in strings", `{"op":"x","id":"1","payload":["[[[[[[","]]"]}`, 3, false, "x", "1"},
		{"id not a string", `{"op":"x","id":7,"payload":` + deep(4) + `}`, 4, true, "x", ""},
		{"broken after the id", `{"op":"x","id":"1","payload":` + deep(4) + `,`, 4, true, "x", "1"},
		{"the default", `{"op":"x","id":"1","payload":` + deep(ipc.MaxDepthLimit) + `}`, 0, true, "x", "1"},
		{"the fast path's depth under a low limit", `{"op":"x","id":"1","payload":` + deep(40) + `}`, 32, true, "x", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := (&ipc.Decoder{MaxDepth: tc.max}).Decode([]byte(tc.frame))
			if !tc.tooDeep {
				if err != nil || f.ID != tc.id {
					t.Fatalf("Decode = %+v, %v; want id %q", f, err, tc.id)
				}
				return
			}
			if ipc.CodeOf(err) != ipc.CodeBadFrame || !strings.Contains(err.Error(), "deeper") {
				t.Fatalf("err = %v, want bad_frame: too deep", err)
			}
			if f == nil || f.Op != tc.op || f.ID != tc.id {
				t.Fatalf("frame = %+v, want op %q id %q", f, tc.op, tc.id)
			}
		})
	}
}
