package jsonscan_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/sm-supervisor/sm/internal/jsonscan"
)

// FuzzValue checks Value against encoding/json's own validator: whatever
// Value accepts whole is valid JSON, and valid JSON of modest depth is
// accepted.
func FuzzValue(f *testing.F) {
	for _, seed := range []string{
		`0`, `-0`, `1.5e+3`, `01`, `1.`, `"a\u00e9\n"`, `"\x"`, "\"\x01\"", `true`, `nul`,
		`{"a":[1,2,{"b":null}]}`, `{"a" 1}`, `[1,]`, `{}`, `[]`, ` [ 1 , 2 ] `, `"é"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := jsonscan.New(b)
		s.WS()
		ok := s.Value(0)
		s.WS()
		got := ok && s.Done()
		if got && !json.Valid(b) {
			t.Fatalf("Value accepted %q, which is not JSON", b)
		}
		if !got && json.Valid(b) && depth(b) < jsonscan.MaxDepth {
			t.Fatalf("Value refused valid JSON %q", b)
		}
	})
}

// depth is the deepest bracket nesting of b, strings not skipped (an
// overestimate is fine: it only excuses a refusal).
func depth(b []byte) int {
	d, most := 0, 0
	for _, c := range b {
		switch c {
		case '[', '{':
			d++
			most = max(most, d)
		case ']', '}':
			d--
		}
	}
	return most
}

func TestScalars(t *testing.T) {
	for _, tc := range []struct {
		in   string
		bits int
		want int64
		ok   bool
	}{
		{"0", 64, 0, true}, {"-42", 64, -42, true}, {"127", 8, 127, true}, {"128", 8, 0, false},
		{"1.0", 64, 0, false}, {"1e2", 64, 0, false}, {"01", 64, 0, true}, {"-", 64, 0, false},
		{strconv.FormatInt(1<<62, 10), 64, 1 << 62, true},
	} {
		s := jsonscan.New([]byte(tc.in))
		v, ok := s.Integer(tc.bits)
		if ok != tc.ok || (ok && v != tc.want) {
			t.Errorf("Integer(%q, %d) = %d, %v; want %d, %v", tc.in, tc.bits, v, ok, tc.want, tc.ok)
		}
	}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{`"abc"`, "abc", true}, {`"a\"b"`, "", false}, {"\"a\x01\"", "", false},
		{`"é"`, "é", true}, {"\"\xff\"", "", false}, {`"abc`, "", false},
	} {
		s := jsonscan.New([]byte(tc.in))
		v, ok := s.StringValue()
		if ok != tc.ok || v != tc.want {
			t.Errorf("StringValue(%q) = %q, %v; want %q, %v", tc.in, v, ok, tc.want, tc.ok)
		}
	}
	s := jsonscan.New([]byte(`true false x`))
	if v, ok := s.Bool(); !v || !ok {
		t.Error("Bool(true)")
	}
	s.WS()
	if v, ok := s.Bool(); v || !ok {
		t.Error("Bool(false)")
	}
	s.WS()
	if _, ok := s.Bool(); ok {
		t.Error("Bool(x) accepted")
	}
}

// BenchmarkValue skips a 200-byte payload, the size sm-bench route sends:
// one long string, and an object of short fields.
func BenchmarkValue(b *testing.B) {
	for name, in := range map[string]string{
		"string": `"` + strings.Repeat("abcdefghij", 20) + `"`,
		"object": `{"guild":"123456789012345678","user":"876543210987654321","op":"ping","n":42,"tags":["a","b","c"],"text":"hello, world — ünïcode","ok":true,"nested":{"x":1.5,"y":-2e3}}`,
	} {
		b.Run(name, func(b *testing.B) {
			buf := []byte(in)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				s := jsonscan.New(buf)
				if !s.Value(0) || !s.Done() {
					b.Fatal("refused")
				}
			}
		})
	}
}
