package bench

import (
	"strings"
	"testing"

	"github.com/sm-supervisor/sm/ipc"
)

// TestEchoClusterAnswers checks the echo cluster's answers, on its fast path
// and on the decoded one, against what ipc.Decode makes of them.
func TestEchoClusterAnswers(t *testing.T) {
	e := &echoCluster{pid: 42}
	cases := []struct {
		in, want string
		quiesce  bool
	}{
		{`{"op":"echo","id":"7","target":"0","payload":{"a":[1,"x"]}}`, `{"op":"REPLY","id":"7","payload":{"a":[1,"x"]}}`, false},
		{`{"payload":{"a":1},"target":"0","id":"k","op":"echo"}`, `{"op":"REPLY","id":"k","payload":{"a":1}}`, false},
		{`{"op":"echo","id":"\u00e9","payload":1,"timeout_ms":5}`, `{"op":"REPLY","id":"é","payload":1}`, false},
		{`{"op":"echo", "id":"s","payload":"p"}`, `{"op":"REPLY","id":"s","payload":"p"}`, false},
		{`{"op":"ping","id":"p"}`, `{"op":"REPLY","id":"p","payload":{"pid":42}}`, false},
		{`{"op":"echo","payload":1}`, ``, false}, // no id: no reply
		{`{"op":"nope","id":"n"}`, `{"op":"REPLY","id":"n","error":{"code":"unknown_op","message":"the echo cluster answers echo and ping"}}`, false},
		{`{"op":"ACTIVATE"}`, ``, false},
		{`{"op":"QUIESCE"}`, ``, true},
		{`{"op":"echo","id":"1","payload":{"a":}}`, `{"op":"REPLY","error":{"code":"bad_frame"`, false},
	}
	for _, c := range cases {
		out, q := e.answer(nil, []byte(c.in))
		got := strings.TrimSuffix(string(out), "\n")
		if q != c.quiesce || !strings.HasPrefix(got, c.want) || (c.want == "" && got != "") {
			t.Errorf("%s: answered %q (quiesce %v), want %q", c.in, got, q, c.want)
			continue
		}
		if got != "" {
			if _, err := ipc.Decode([]byte(got)); err != nil {
				t.Errorf("%s: the answer %s does not decode: %v", c.in, got, err)
			}
		}
	}
	// Repeated keys go to the decoder, which keeps the last, as Go's does.
	if op, _, _, ok := echoFields([]byte(`{"op":"echo","id":"1","id":"2"}`)); ok {
		t.Errorf("a repeated id took the fast path (op %s)", op)
	}
}
