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
	slowOnly := map[string]bool{"error": true, "clusters": true} // rare: error replies, DEPLOY
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
