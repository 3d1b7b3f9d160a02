package ipc

import (
	"strconv"
	"unicode/utf8"
)

// decodeFast decodes the frames peers send in practice — lower-case keys of
// Frame, each once, strings without escapes, integers as plain digits —
// without reflection, validating the payload as it skips over it. For anything
// else (an escape, an unknown or repeated key, null, a float where an integer
// goes, an error object, bad JSON) it gives up (ok false) and Decode hands the
// frame to encoding/json, so what Decode returns never depends on which path
// ran. It exists because encoding/json was half of the manager's CPU under
// load (docs/performance.md); FuzzDecodeFast checks it against json.Unmarshal.
func decodeFast(b []byte) (f *Frame, ok bool) {
	s := scanner{b: b}
	s.ws()
	if !s.eat('{') {
		return nil, false
	}
	f = new(Frame)
	var seen uint32
	for {
		s.ws()
		key, ok := s.plainString()
		if !ok {
			return nil, false
		}
		s.ws()
		if !s.eat(':') {
			return nil, false
		}
		s.ws()
		key2 := fastKey(key)
		if key2 == 0 || seen&key2 != 0 {
			return nil, false // unknown, case-folded or repeated: encoding/json's rules apply
		}
		seen |= key2
		switch key2 {
		case keyOp:
			f.Op, ok = s.opValue()
		case keyID:
			f.ID, ok = s.stringValue()
		case keyTarget:
			f.Target, ok = s.stringValue()
		case keyRole:
			f.Role, ok = s.stringValue()
		case keyName:
			f.Name, ok = s.stringValue()
		case keyToken:
			f.Token, ok = s.stringValue()
		case keyPayload:
			f.Payload, ok = s.rawValue()
		case keyResume:
			f.Resume, ok = s.rawValue()
		case keyTimeoutMS:
			f.TimeoutMS, ok = s.integer(64)
		case keyCluster:
			var v int64
			if v, ok = s.integer(strconv.IntSize); ok {
				f.Cluster = Int(int(v))
			}
		case keyGeneration:
			var v int64
			if v, ok = s.integer(64); ok {
				f.Generation = Int64(v)
			}
		case keyPID:
			var v int64
			v, ok = s.integer(strconv.IntSize)
			f.PID = int(v)
		case keyMaxParallel:
			var v int64
			v, ok = s.integer(strconv.IntSize)
			f.MaxParallel = int(v)
		case keyShard:
			var v int64
			if v, ok = s.integer(strconv.IntSize); ok {
				f.Shard = Int(int(v))
			}
		case keyReady:
			var v bool
			if v, ok = s.boolean(); ok {
				f.Ready = Bool(v)
			}
		}
		if !ok {
			return nil, false
		}
		s.ws()
		if s.eat('}') {
			break
		}
		if !s.eat(',') {
			return nil, false
		}
	}
	s.ws()
	return f, s.i == len(b)
}

// The keys decodeFast handles, each a bit so that a repeat is spotted.
const (
	keyOp uint32 = 1 << iota
	keyID
	keyTarget
	keyPayload
	keyTimeoutMS
	keyRole
	keyName
	keyCluster
	keyGeneration
	keyToken
	keyPID
	keyReady
	keyMaxParallel
	keyResume
	keyShard
)

// fastKey returns the bit of key, or 0 for a key decodeFast does not handle.
// (A switch on string(b) compiles to comparisons, with no allocation.)
func fastKey(key []byte) uint32 {
	switch string(key) {
	case "op":
		return keyOp
	case "id":
		return keyID
	case "target":
		return keyTarget
	case "payload":
		return keyPayload
	case "timeout_ms":
		return keyTimeoutMS
	case "role":
		return keyRole
	case "name":
		return keyName
	case "cluster":
		return keyCluster
	case "generation":
		return keyGeneration
	case "token":
		return keyToken
	case "pid":
		return keyPID
	case "ready":
		return keyReady
	case "max_parallel":
		return keyMaxParallel
	case "resume":
		return keyResume
	case "shard":
		return keyShard
	}
	return 0
}

// maxFastDepth bounds the nesting decodeFast follows; deeper payloads take
// encoding/json's path, which has its own limit.
const maxFastDepth = 64

type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// ws skips JSON whitespace.
func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// plainString reads a string with no escapes, returning its bytes unconverted.
func (s *scanner) plainString() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case plain[c]:
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
		s.i++
	}
	return nil, false
}

// stringValue reads a string value with no escapes. Invalid UTF-8, which
// encoding/json would replace with U+FFFD, is left to it.
func (s *scanner) stringValue() (string, bool) {
	b, ok := s.plainString()
	if !ok {
		return "", false
	}
	for _, c := range b {
		if c >= utf8.RuneSelf {
			if !utf8.Valid(b) {
				return "", false
			}
			break
		}
	}
	return string(b), true
}

// rawValue reads any JSON value but null, as a json.RawMessage would hold it
// (null is left to encoding/json, which has its own rule for it).
func (s *scanner) rawValue() ([]byte, bool) {
	start := s.i
	if s.peek() == 'n' || !s.value(0) {
		return nil, false
	}
	return append([]byte(nil), s.b[start:s.i]...), true
}

// opValue is stringValue for the op, sparing the protocol's own ops an
// allocation: they are most of the frames.
func (s *scanner) opValue() (string, bool) {
	start := s.i
	b, ok := s.plainString()
	if !ok {
		return "", false
	}
	switch string(b) {
	case OpReply:
		return OpReply, true
	case OpHeartbeat:
		return OpHeartbeat, true
	case OpRegister:
		return OpRegister, true
	case OpActivate:
		return OpActivate, true
	case OpQuiesce:
		return OpQuiesce, true
	case OpQuiesced:
		return OpQuiesced, true
	}
	s.i = start
	return s.stringValue()
}

// integer reads a JSON number that is a plain integer fitting in bits.
func (s *scanner) integer(bits int) (int64, bool) {
	start := s.i
	s.eat('-')
	if !s.digits() {
		return 0, false
	}
	if c := s.peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s.b[start:s.i]), 10, bits)
	return v, err == nil
}

func (s *scanner) boolean() (bool, bool) {
	switch {
	case s.literal("true"):
		return true, true
	case s.literal("false"):
		return false, true
	}
	return false, false
}

func (s *scanner) literal(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// digits reads the integer part of a JSON number: 0, or a non-zero digit and
// any more digits.
func (s *scanner) digits() bool {
	if s.eat('0') {
		return true
	}
	if c := s.peek(); c < '1' || c > '9' {
		return false
	}
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return true
}

// value skips over one JSON value, reporting whether it is valid JSON.
func (s *scanner) value(depth int) bool {
	switch c := s.peek(); {
	case c == '{':
		return s.container(depth, '}', true)
	case c == '[':
		return s.container(depth, ']', false)
	case c == '"':
		return s.anyString()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

// container skips an object (keyed) or an array, from its opening bracket.
func (s *scanner) container(depth int, end byte, keyed bool) bool {
	if depth >= maxFastDepth {
		return false
	}
	s.i++
	s.ws()
	if s.eat(end) {
		return true
	}
	for {
		if keyed {
			if !s.anyString() {
				return false
			}
			s.ws()
			if !s.eat(':') {
				return false
			}
			s.ws()
		}
		if !s.value(depth + 1) {
			return false
		}
		s.ws()
		if s.eat(end) {
			return true
		}
		if !s.eat(',') {
			return false
		}
		s.ws()
	}
}

// anyString skips a string, escapes included, as encoding/json's scanner
// accepts it: no control characters, only JSON's escapes; bytes above ASCII
// pass as they are.
func (s *scanner) anyString() bool {
	if !s.eat('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		if plain[c] {
			continue
		}
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if s.i >= len(s.b) {
				return false
			}
			e := s.b[s.i]
			s.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.b)-s.i < 4 {
					return false
				}
				for _, h := range s.b[s.i : s.i+4] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// plain marks the bytes that stand for themselves inside a JSON string: all
// but the quote, the backslash and control characters.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number skips a JSON number: -?int(.digits)?([eE][+-]?digits)?
func (s *scanner) number() bool {
	s.eat('-')
	if !s.digits() {
		return false
	}
	if s.eat('.') && !s.someDigits() {
		return false
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if !s.someDigits() {
			return false
		}
	}
	return true
}

func (s *scanner) someDigits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
