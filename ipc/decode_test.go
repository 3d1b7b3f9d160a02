package ipc_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/sm-supervisor/sm/ipc"
)

// decodeSeeds are frames of every shape: those the fast path must take, and
// those it must leave to encoding/json.
var decodeSeeds = []string{
	`{"op":"echo","id":"1a","target":"0","payload":{"data":"xxxx"}}`,
	`{"op":"REPLY","id":"7","payload":{"pong":true,"cluster":0,"generation":1,"pid":42}}`,
	`{"op":"REGISTER","id":"1","role":"cluster","cluster":3,"generation":5,"token":"t","pid":1234}`,
	`{"op":"REGISTER","id":"1","role":"client","name":"sm-api"}`,
	`{"op":"HEARTBEAT","ready":true,"payload":{"shards":[{"id":0,"ping":41.5,"status":"ready"}],"mem":-1e3}}`,
	`{"op":"HEARTBEAT","ready":false,"payload":null}`,
	`{"op":"HEARTBEAT","ready":true,"payload":{"g":1},"resume":[{"shard":0,"session_id":"ab","seq":7,"resume_url":"wss://x/?a=1"}]}`,
	`{"op":"HEARTBEAT","resume":null}`,
	`{"op":"QUIESCED","resume":[],"handoff":{"v":1,"shards":{"2":{"last":["a1b2"]}}}}`,
	`{"op":"QUIESCED","handoff":null}`,
	`{"op":"ACTIVATE","handoff":[1,"x"]}`,
	`{"op":"IDENTIFY","id":"3","shard":12}`,
	`{"op":"IDENTIFY","id":"3","shard":"12"}`,
	`{"op":"ping","target":"*","timeout_ms":1000,"id":"2"}`,
	`{"op":"DEPLOY","id":"9","clusters":[2,3],"max_parallel":1}`,
	`{"op":"REPLY","id":"1","error":{"code":"busy","message":"later"}}`,
	` { "op" : "x" , "payload" : [ 1 , "a\"b\\u00e9" , true , false , null , {} , [] ] } `,
	`{"op":"x","payload":"\ud800"}`,
	`{"op":"é","id":"ü"}`,
	"{\"op\":\"x\xff\",\"payload\":\"\xff\"}",
	`{"op":"x","Op":"y"}`,
	`{"op":"x","op":"y"}`,
	`{"op":"x","cluster":1.0}`,
	`{"op":"x","cluster":-0}`,
	`{"op":"x","cluster":99999999999999999999}`,
	`{"op":"x","pid":01}`,
	`{"op":"x","ready":"yes"}`,
	`{"op":"x","payload":01}`,
	`{"op":"x","payload":1.}`,
	`{"op":"x","payload":-}`,
	`{"op":"x","payload":1e}`,
	`{"op":"x","payload":{"a":1,}}`,
	`{"op":"x","payload":[1,]}`,
	`{"op":"x","payload":"a\x"}`,
	`{"op":"x","payload":"\u12"}`,
	`{"op":"x"}x`,
	`{"op":"x",}`,
	`{}`,
	`{"id":"5"}`,
	`[1]`,
	`"op"`,
	``,
	`{"op":"x","payload":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
}

// TestDecodeFastKnowsEveryField: a field added to Frame must be decoded by the
// fast path or listed here as left to encoding/json; else every frame that
// carries it silently takes the slow path.
func TestDecodeFastKnowsEveryField(t *testing.T) {
	slowOnly := map[string]bool{"error": true, "clusters": true, "mode": true} // rare: error replies, DEPLOY
	ft := reflect.TypeFor[ipc.Frame]()
	for i := range ft.NumField() {
		key, _, _ := strings.Cut(ft.Field(i).Tag.Get("json"), ",")
		if !ipc.FastKeyHandled(key) && !slowOnly[key] {
			t.Errorf("Frame field %s (%q) is not handled by decodeFast (ipc/decode.go)", ft.Field(i).Name, key)
		}
	}
}

// TestDecodeFastAgreesWithJSON: on every seed, what the fast path returns (when
// it takes the frame at all) is what encoding/json makes of it.
func TestDecodeFastAgreesWithJSON(t *testing.T) {
	took := 0
	for _, in := range decodeSeeds {
		if checkDecodeFast(t, []byte(in)) {
			took++
		}
	}
	if took < 8 {
		t.Fatalf("the fast path took only %d of the seeds", took)
	}
}

// checkDecodeFast fails t if decodeFast disagrees with json.Unmarshal on data,
// and reports whether the fast path took it.
func checkDecodeFast(t *testing.T, data []byte) bool {
	t.Helper()
	fast, ok := ipc.DecodeFast(data)
	if !ok {
		return false
	}
	var want ipc.Frame
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("fast path took %q, which encoding/json refuses: %v", data, err)
	}
	if !reflect.DeepEqual(fast, &want) {
		t.Fatalf("fast path disagrees on %q:\n fast %+v\n json %+v", data, fast, &want)
	}
	return true
}

func FuzzDecodeFast(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecodeFast(t, data) })
}

// FuzzDecoder: a Decoder, whatever frame it read before, decodes a frame
// exactly as Decode does (its kept op and target never leak into another frame).
func FuzzDecoder(f *testing.F) {
	for i, s := range decodeSeeds {
		f.Add([]byte(decodeSeeds[(i+1)%len(decodeSeeds)]), []byte(s))
	}
	f.Add([]byte(`{"op":"echo","target":"1"}`), []byte(`{"op":"echo","target":"1","id":"2"}`))
	f.Add([]byte(`{"op":"echo","target":"1"}`), []byte(`{"op":"echO","target":"12"}`))
	f.Add([]byte(`{"op":"echo","target":"1"}`), []byte(`{"op":"ech\u006f","target":"\u0031"}`))
	f.Fuzz(func(t *testing.T, prime, data []byte) {
		var d ipc.Decoder
		d.Decode(prime)
		got, gotErr := d.Decode(data)
		want, wantErr := ipc.Decode(data)
		if (gotErr == nil) != (wantErr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("after %q, Decoder gave %+v, %v for %q; Decode %+v, %v", prime, got, gotErr, data, want, wantErr)
		}
	})
}

func TestDecoderKeepsRepeatedStrings(t *testing.T) {
	var d ipc.Decoder
	frame := []byte(`{"op":"guild.sync","id":"7","target":"guild:123","payload":1}`)
	d.Decode(frame)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := d.Decode(frame); err != nil {
			t.Fatal(err)
		}
	}); n > 3 {
		t.Errorf("a repeated op and target: %v allocations per frame, want 3 (frame, id, payload)", n)
	}
}

// BenchmarkDecode is the decoding of one request the manager forwards: the
// route scenario's echo with a 200-byte payload.
func BenchmarkDecode(b *testing.B) {
	frame := []byte(`{"op":"echo","id":"1a2b","target":"0","payload":{"data":"` + strings.Repeat("x", 190) + `"}}`)
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ipc.Decode(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decoder", func(b *testing.B) {
		var d ipc.Decoder
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.Decode(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f ipc.Frame
			if err := json.Unmarshal(frame, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzDecodeReply: what DecodeReply takes, Decode decodes to the same frame.
func FuzzDecodeReply(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"op":"REPLY","id":"1a","payload":{"data":"xyz"}}`))
	f.Add([]byte(`{"op":"REPLY","id":"1a","error":{"code":"timeout","message":"m"}}`))
	f.Add([]byte(`{"op":"REPLY" ,"id":"1a","payload":[1,2]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var d ipc.Decoder
		got, ok := d.DecodeReply(data)
		if !ok {
			return
		}
		want, err := ipc.Decode(data)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeReply(%q) = %+v; Decode gives %+v, %v", data, got, want, err)
		}
	})
}

func TestDecodeReplyReusesItsFrame(t *testing.T) {
	var d ipc.Decoder
	a := []byte(`{"op":"REPLY","id":"1","payload":{"n":1}}`)
	b := []byte(`{"op":"REPLY","id":"2"}`)
	f, ok := d.DecodeReply(a)
	if !ok || f.ID != "1" || string(f.Payload) != `{"n":1}` {
		t.Fatalf("DecodeReply(a) = %+v, %v", f, ok)
	}
	if n := testing.AllocsPerRun(100, func() { d.DecodeReply(a) }); n > 1 {
		t.Errorf("DecodeReply allocates %v times, want 1 (the id)", n)
	}
	if g, ok := d.DecodeReply(b); !ok || g != f || g.ID != "2" || g.Payload != nil {
		t.Errorf("the second reply: %+v, %v (same frame: %v), want id 2 and no payload left over", g, ok, g == f)
	}
	for _, other := range []string{`{"op":"ping","id":"1"}`, `{"id":"1","op":"REPLY"}`, `{"op":"REPLY","id":"1","error":{"code":"x","message":"y"}}`} {
		if _, ok := d.DecodeReply([]byte(other)); ok {
			t.Errorf("DecodeReply took %s", other)
		}
	}
}
