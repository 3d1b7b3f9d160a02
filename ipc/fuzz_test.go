package ipc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"testing"

	"github.com/sm-supervisor/sm/ipc"
)

// chunkReader returns at most n bytes per Read, to move frame boundaries
// around buffer fills.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.b))
	copy(p, r.b[:k])
	r.b = r.b[k:]
	return k, nil
}

// modelFrames is what a Reader with limit max must return for data: the same
// rules, written the slow and obvious way.
func modelFrames(data []byte, max int) ([]string, error) {
	var out []string
	lines := bytes.Split(data, []byte("\n"))
	tail := lines[len(lines)-1]
	for _, l := range lines[:len(lines)-1] {
		switch {
		case len(l) > max:
			out = append(out, "<too large>")
		case len(bytes.Trim(l, " \t\r")) == 0:
		default:
			out = append(out, string(l))
		}
	}
	if len(tail) > max || len(bytes.Trim(tail, " \t\r")) > 0 {
		return out, io.ErrUnexpectedEOF
	}
	return out, io.EOF
}

func FuzzReader(f *testing.F) {
	f.Add([]byte("{\"op\":\"a\"}\n\n{\"op\":\"b\"}\n"), uint8(16), uint8(1))
	f.Add([]byte("0123456789abcdefXYZ\nok\n"), uint8(16), uint8(3))
	f.Add([]byte("0123456789abcdef\n0123456789abcdefg\nok\n"), uint8(16), uint8(200))
	f.Add([]byte("  \t\r\n\r\nx\r\n"), uint8(1), uint8(2))
	f.Add([]byte("partial"), uint8(32), uint8(5))
	f.Add(bytes.Repeat([]byte("long line "), 30), uint8(20), uint8(7))
	f.Add([]byte("\n\n\n"), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, maxB, step uint8) {
		max := int(maxB%64) + 1
		r := ipc.NewReader(&chunkReader{b: data, n: int(step%9) + 1}, max)
		var got []string
		var err error
		for range len(data) + 2 {
			var line []byte
			line, err = r.ReadFrame()
			if errors.Is(err, ipc.ErrFrameTooLarge) {
				got = append(got, "<too large>")
				continue
			}
			if err != nil {
				break
			}
			if len(line) > max {
				t.Fatalf("frame of %d bytes over the limit %d", len(line), max)
			}
			if bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("frame holds a newline: %q", line)
			}
			got = append(got, string(line))
		}
		want, wantErr := modelFrames(data, max)
		if !slices.Equal(got, want) || err != wantErr {
			t.Fatalf("max %d: got %q, %v; want %q, %v", max, got, err, want, wantErr)
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"op":"REGISTER","id":"1","role":"cluster","cluster":3,"generation":5,"token":"t","pid":1234}`))
	f.Add([]byte(`{"op":"guild.sync","target":"guild:81384788765712384","id":"42","payload":{"a": [1, 2.5e3, "\u00e9"]}}`))
	f.Add([]byte(`{"op":"DEPLOY","id":"9","clusters":[2,3],"max_parallel":1}`))
	f.Add([]byte(`{"op":"HEARTBEAT","ready":false,"payload":null}`))
	f.Add([]byte(`{"op":"REPLY","id":"1","error":{"code":"busy","message":"x\u2028y"}}`))
	f.Add([]byte(`{"op":"x","clusters":[],"cluster":null,"unknown":{"deep":[1]}}`))
	f.Add([]byte(`{"op":"a\ud800b","id":"\"\\\/"}`))
	f.Add([]byte("{\"op\":\"x\xff\",\"payload\":\"\xff\"}"))
	f.Add([]byte("{\"op\":\"x\",\"payload\":{\n\"a\":\r\n1}}"))
	f.Add([]byte(`[1]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ipc.Decode(data)
		if err != nil {
			var pe *ipc.Error
			if !errors.As(err, &pe) || pe.Code != ipc.CodeBadFrame {
				t.Fatalf("Decode error %v is not a bad_frame *Error", err)
			}
			return
		}
		out := ipc.AppendFrame(nil, fr)
		if bytes.IndexByte(out, '\n') >= 0 {
			t.Fatalf("encoded frame holds a newline: %q", out)
		}
		if !json.Valid(out) {
			t.Fatalf("encoded frame is not valid JSON: %q", out)
		}
		again, err := ipc.Decode(out)
		if err != nil {
			t.Fatalf("re-decode of %q: %v", out, err)
		}
		want := *fr
		// Newlines in a payload are whitespace and are sent as spaces; an empty
		// list of clusters is the same as none.
		want.Payload = bytes.ReplaceAll(fr.Payload, []byte("\n"), []byte(" "))
		if len(want.Payload) == 0 {
			want.Payload = nil
		}
		if len(want.Clusters) == 0 {
			want.Clusters = nil
		}
		if !reflect.DeepEqual(again, &want) {
			t.Fatalf("round trip changed the frame:\n in  %q\n out %q\n got  %+v\n want %+v", data, out, again, &want)
		}
		if out2 := ipc.AppendFrame(nil, again); !bytes.Equal(out2, out) {
			t.Fatalf("encoding is not stable:\n %q\n %q", out, out2)
		}
	})
}
