package ipc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sm-supervisor/sm/ipc"
)

// fullFrame returns a Frame with every field set, found by reflection so that a
// field added to Frame but forgotten in AppendFrame fails these tests. A field of
// a type it does not know fails the test too: teach it the new type.
func fullFrame(t testing.TB, s string) *ipc.Frame {
	t.Helper()
	f := new(ipc.Frame)
	v := reflect.ValueOf(f).Elem()
	for i := 0; i < v.NumField(); i++ {
		fv, sf := v.Field(i), v.Type().Field(i)
		n := i + 1
		switch fv.Interface().(type) {
		case string:
			fv.SetString(s + "/" + sf.Name)
		case int:
			fv.SetInt(int64(1000 + n))
		case int64:
			fv.SetInt(int64(1<<40 + n))
		case *int:
			fv.Set(reflect.ValueOf(ipc.Int(-n)))
		case *int64:
			fv.Set(reflect.ValueOf(ipc.Int64(1<<50 + int64(n))))
		case *bool:
			fv.Set(reflect.ValueOf(ipc.Bool(false))) // false must still be sent
		case []int:
			fv.Set(reflect.ValueOf([]int{0, n, -n}))
		case json.RawMessage:
			js, _ := json.Marshal(s)
			fv.Set(reflect.ValueOf(json.RawMessage(`{ "nested" : [1, 2.50, "é\u00e9", {"deep":null}] , "s": ` + string(js) + ` }`)))
		case *ipc.Error:
			fv.Set(reflect.ValueOf(&ipc.Error{Code: s + "/code", Message: s + "/message"}))
		default:
			t.Fatalf("fullFrame: Frame.%s has type %s, which this test does not fill", sf.Name, sf.Type)
		}
	}
	return f
}

// semantic decodes a JSON document into a generic value for comparison.
func semantic(t testing.TB, b []byte) any {
	t.Helper()
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not valid JSON: %v\n%s", err, b)
	}
	if _, err := d.Token(); err != io.EOF {
		t.Fatalf("trailing data after the JSON value: %s", b)
	}
	return v
}

// escapeCases are strings put in every string field of a frame, to compare
// AppendFrame's escaping with encoding/json's.
var escapeCases = []struct {
	name string
	s    string
}{
	{"plain", "guild.sync"},
	{"empty", ""},
	{"quotes and backslash", `say "hi" \ bye \\ \"`},
	{"control characters", "\x00\x01\x07\b\f\n\r\t\x1b\x1f"},
	{"DEL passes", "\x7f"},
	{"html characters", "<script>&amp;</script>"},
	{"unicode", "héllo 世界 🎉 \u00e9"},
	{"line and paragraph separators", "a\u2028b\u2029c"},
	{"invalid UTF-8", "a\xffb\xc3\x28c\xed\xa0\x80d\xe2\x82"},
	{"lone continuation bytes", "\x80\x80\xbf"},
	{"replacement char itself", "\ufffd"},
	{"every ASCII byte", asciiBytes()},
}

func asciiBytes() string {
	var b strings.Builder
	for c := 0; c < 128; c++ {
		b.WriteByte(byte(c))
	}
	return b.String()
}

func TestAppendFrameMatchesEncodingJSON(t *testing.T) {
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			f := fullFrame(t, tc.s)
			got := ipc.AppendFrame(nil, f)
			if !json.Valid(got) {
				t.Fatalf("AppendFrame output is not valid JSON: %q", got)
			}
			if bytes.IndexByte(got, '\n') >= 0 {
				t.Fatalf("AppendFrame output holds a newline: %q", got)
			}
			for _, c := range got {
				if c < 0x20 {
					t.Fatalf("AppendFrame output holds raw control byte %#x: %q", c, got)
				}
			}
			if !utf8.Valid(got) {
				t.Fatalf("AppendFrame output is not valid UTF-8: %q", got)
			}
			want, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := semantic(t, got), semantic(t, want); !reflect.DeepEqual(g, w) {
				t.Errorf("AppendFrame and json.Marshal differ:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestAppendFrameEscapes(t *testing.T) {
	tests := []struct{ in, want string }{
		{"a\"b", `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{"\n\r\t", `"\n\r\t"`},
		{"\x00\x1f", `"\u0000\u001f"`},
		{"\b\f", `"\u0008\u000c"`},
		{"a\u2028b\u2029", `"a\u2028b\u2029"`},
		{"x\xffy", `"x\ufffdy"`},
		{"\xe2\x82", `"\ufffd\ufffd"`}, // a truncated rune: one U+FFFD per byte, as encoding/json
		{"é", `"é"`},                   // valid UTF-8 is not escaped
	}
	for _, tt := range tests {
		got := ipc.Encode(&ipc.Frame{Op: tt.in})
		want := `{"op":` + tt.want + `}`
		if string(got) != want {
			t.Errorf("Encode(op %q) = %s, want %s", tt.in, got, want)
		}
	}
}

func TestAppendFrameRoundTrip(t *testing.T) {
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			f := fullFrame(t, tc.s)
			got, err := ipc.Decode(ipc.Encode(f))
			if err != nil {
				t.Fatal(err)
			}
			// What encoding/json makes of the same frame is the reference: it
			// turns invalid UTF-8 into U+FFFD, and so must AppendFrame.
			want := new(ipc.Frame)
			b, _ := json.Marshal(f)
			if err := json.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Payload, f.Payload) {
				t.Errorf("payload changed:\n got %s\nwant %s", got.Payload, f.Payload)
			}
			want.Payload = f.Payload // json.Marshal compacts it; AppendFrame must not
			want.Resume = f.Resume
			want.Handoff = f.Handoff
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
			}
			if utf8.ValidString(tc.s) && !reflect.DeepEqual(got, f) {
				t.Errorf("round trip of valid UTF-8 changed the frame:\n got %+v\nwant %+v", got, f)
			}
		})
	}
}

func TestAppendFrameOmitsEmpty(t *testing.T) {
	tests := []struct {
		f    ipc.Frame
		want string
	}{
		{ipc.Frame{Op: "x"}, `{"op":"x"}`},
		{ipc.Frame{Op: "x", Clusters: []int{}}, `{"op":"x"}`},
		{ipc.Frame{Op: "x", Cluster: ipc.Int(0), Generation: ipc.Int64(0), Ready: ipc.Bool(false)},
			`{"op":"x","cluster":0,"generation":0,"ready":false}`},
		{ipc.Frame{Op: "REPLY", ID: "1", Error: &ipc.Error{Code: "busy"}},
			`{"op":"REPLY","id":"1","error":{"code":"busy","message":""}}`},
		{ipc.Frame{Op: "x", Payload: json.RawMessage(`null`)}, `{"op":"x","payload":null}`},
	}
	for _, tt := range tests {
		if got := string(ipc.Encode(&tt.f)); got != tt.want {
			t.Errorf("Encode(%+v) = %s, want %s", tt.f, got, tt.want)
		}
	}
}

func TestAppendFrameAppends(t *testing.T) {
	prefix := []byte("prefix:")
	got := ipc.AppendFrame(prefix, &ipc.Frame{Op: "a"})
	if string(got) != `prefix:{"op":"a"}` {
		t.Fatalf("AppendFrame = %s", got)
	}
}

// TestPayloadByteForByte checks that a payload read off the wire goes out
// exactly as it came in: whitespace, key order, number spelling, escapes.
func TestPayloadByteForByte(t *testing.T) {
	payloads := []string{
		`{"b":1,"a":2}`,
		`{ "spaced" :  [ 1 ,2 , 3 ] ,	"tab":true }`,
		`"a string with \"escapes\" \u00e9 and \/ slash"`,
		`"héllo 世界 🎉 raw\u2028"`,
		`[1.50, 1e3, -0, 12345678901234567890123]`,
		`{"deep":{"er":{"est":[[[{}]]]}}}`,
		`null`, `true`, `0`, `""`, `[]`, `{}`,
		"\"invalid \xff utf8 is carried unread\"",
	}
	for _, p := range payloads {
		line := []byte(`{"op":"echo","id":"42","target":"3","payload":` + p + `}`)
		f, err := ipc.Decode(line)
		if err != nil {
			t.Fatalf("Decode(%s): %v", line, err)
		}
		if string(f.Payload) != p {
			t.Errorf("decoded payload = %s, want %s", f.Payload, p)
		}
		out := ipc.Encode(f)
		if !bytes.Contains(out, []byte(`"payload":`+p)) {
			t.Errorf("encoded frame %s does not carry payload %s verbatim", out, p)
		}
		if string(out) != string(line) {
			t.Errorf("re-encoded frame differs:\n got %s\nwant %s", out, line)
		}
	}
}

// TestPayloadWithNewlines covers a payload built in Go with MarshalIndent: its
// newlines must not split the frame.
func TestPayloadWithNewlines(t *testing.T) {
	p, err := json.MarshalIndent(map[string]any{"a": []int{1, 2}, "b": "x\ny"}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out := ipc.Encode(&ipc.Frame{Op: "x", Payload: p})
	if bytes.IndexByte(out, '\n') >= 0 {
		t.Fatalf("frame holds a newline: %q", out)
	}
	f, err := ipc.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(semantic(t, f.Payload), semantic(t, p)) {
		t.Fatalf("payload changed meaning: %s vs %s", f.Payload, p)
	}
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   *ipc.Frame // nil: must fail with bad_frame
		wantID string     // for failures: the id the caller can still reply to
	}{
		{"minimal", `{"op":"ping"}`, &ipc.Frame{Op: "ping"}, ""},
		{"whitespace around", " \t{ \"op\" : \"ping\" }\r", &ipc.Frame{Op: "ping"}, ""},
		{"unknown fields ignored", `{"op":"ping","zzz":1,"nested":{"a":[1,{"b":2}]},"id":"7"}`,
			&ipc.Frame{Op: "ping", ID: "7"}, ""},
		{"register", `{"op":"REGISTER","id":"1","role":"cluster","cluster":3,"generation":5,"token":"t","pid":1234}`,
			&ipc.Frame{Op: "REGISTER", ID: "1", Role: "cluster", Cluster: ipc.Int(3), Generation: ipc.Int64(5), Token: "t", PID: 1234}, ""},
		{"deploy", `{"op":"DEPLOY","id":"9","clusters":[2,3],"max_parallel":1}`,
			&ipc.Frame{Op: "DEPLOY", ID: "9", Clusters: []int{2, 3}, MaxParallel: 1}, ""},
		{"deploy resume", `{"op":"DEPLOY","id":"9","mode":"resume"}`,
			&ipc.Frame{Op: "DEPLOY", ID: "9", Mode: "resume"}, ""},
		{"heartbeat", `{"op":"HEARTBEAT","ready":true,"payload":{"guilds":10}}`,
			&ipc.Frame{Op: "HEARTBEAT", Ready: ipc.Bool(true), Payload: json.RawMessage(`{"guilds":10}`)}, ""},
		{"error reply", `{"op":"REPLY","id":"1","error":{"code":"busy","message":"later"}}`,
			&ipc.Frame{Op: "REPLY", ID: "1", Error: &ipc.Error{Code: "busy", Message: "later"}}, ""},
		{"not JSON", `hello`, nil, ""},
		{"truncated", `{"op":"ping"`, nil, ""},
		{"trailing data", `{"op":"a"} {"op":"b"}`, nil, ""},
		{"JSON array", `[{"op":"ping"}]`, nil, ""},
		{"JSON string", `"ping"`, nil, ""},
		{"JSON number", `1`, nil, ""},
		{"JSON null", `null`, nil, ""},
		{"empty", ``, nil, ""},
		{"missing op", `{"id":"5","target":"1"}`, nil, "5"},
		{"empty op", `{"op":"","id":"6"}`, nil, "6"},
		{"op not a string", `{"op":5,"id":"7"}`, nil, "7"},
		{"mistyped field keeps id", `{"op":"x","id":"8","cluster":"three"}`, nil, "8"},
		{"mistyped id", `{"op":"x","id":8}`, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ipc.Decode([]byte(tt.in))
			if tt.want != nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if !reflect.DeepEqual(f, tt.want) {
					t.Fatalf("Decode = %+v, want %+v", f, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode(%s) succeeded: %+v", tt.in, f)
			}
			var pe *ipc.Error
			if !errors.As(err, &pe) || pe.Code != ipc.CodeBadFrame {
				t.Fatalf("Decode error = %#v, want an *Error with code %s", err, ipc.CodeBadFrame)
			}
			if got := ""; f != nil {
				got = f.ID
				if got != tt.wantID {
					t.Fatalf("failed frame carries id %q, want %q", got, tt.wantID)
				}
			} else if tt.wantID != "" {
				t.Fatalf("no frame returned; want one carrying id %q", tt.wantID)
			}
		})
	}
}

func TestCodeOf(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{ipc.Errorf(ipc.CodeBusy, "x"), ipc.CodeBusy},
		{fmt.Errorf("wrapped: %w", ipc.Errorf(ipc.CodeForbidden, "no")), ipc.CodeForbidden},
		{fmt.Errorf("%w: %w", ipc.ErrRegisterRefused, &ipc.Error{Code: ipc.CodeForbidden}), ipc.CodeForbidden},
		{ipc.ErrTimeout, ipc.CodeTimeout},
		{fmt.Errorf("req: %w", ipc.ErrTimeout), ipc.CodeTimeout},
		{ipc.ErrUnavailable, ipc.CodeUnavailable},
		{ipc.ErrClosed, ipc.CodeUnavailable},
		{fmt.Errorf("send: %w", ipc.ErrClosed), ipc.CodeUnavailable},
		{errors.New("boom"), ipc.CodeInternal},
		{context.Canceled, ipc.CodeInternal},
		{io.EOF, ipc.CodeInternal},
	}
	for _, tt := range tests {
		if got := ipc.CodeOf(tt.err); got != tt.want {
			t.Errorf("CodeOf(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestErrorString(t *testing.T) {
	if got := (&ipc.Error{Code: "busy"}).Error(); got != "busy" {
		t.Errorf("Error() = %q", got)
	}
	if got := ipc.Errorf(ipc.CodeUnknownTarget, "cluster %d", 9).Error(); got != "unknown_target: cluster 9" {
		t.Errorf("Error() = %q", got)
	}
}

func TestReplyBuilders(t *testing.T) {
	r := ipc.Reply("7", json.RawMessage(`{"ok":true}`))
	if r.Op != ipc.OpReply || r.ID != "7" || string(r.Payload) != `{"ok":true}` || r.Error != nil {
		t.Errorf("Reply = %+v", r)
	}
	e := ipc.ReplyError("8", ipc.Errorf(ipc.CodeTimeout, "slow"))
	if got := string(ipc.Encode(e)); got != `{"op":"REPLY","id":"8","error":{"code":"timeout","message":"slow"}}` {
		t.Errorf("ReplyError encodes as %s", got)
	}
}
