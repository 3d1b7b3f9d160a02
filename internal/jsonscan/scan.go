// Package jsonscan is a small JSON reader for the shapes peers send in
// practice: strings without escapes, plain integers, known keys. It never
// guesses: each method reports whether the input had the expected form, and a
// caller that gets false hands the whole input to encoding/json, so what it
// decodes never depends on which path ran. It exists because encoding/json's
// reflection was most of the manager's CPU on its hottest inputs (frames, and
// the resume state every heartbeat carries; docs/performance.md).
package jsonscan

import (
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// New returns a Scanner at the start of b.
func New(b []byte) Scanner { return Scanner{b: b} }

// Pos is the offset of the next byte to read.
func (s *Scanner) Pos() int { return s.i }

// Seek moves back (or forward) to offset i, a value Pos returned.
func (s *Scanner) Seek(i int) { s.i = i }

// Done reports whether the whole input has been read.
func (s *Scanner) Done() bool { return s.i == len(s.b) }

// MaxDepth bounds the nesting Value follows; deeper values make it give up,
// and the caller falls back to encoding/json, which has its own limit.
const MaxDepth = 64

// Scanner reads JSON from a byte slice, front to back. The zero value is
// useless; make one with New.
type Scanner struct {
	b []byte
	i int
}

// Peek returns the next byte without consuming it, or 0 at the end.
func (s *Scanner) Peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// Eat consumes the next byte if it is c.
func (s *Scanner) Eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// WS skips JSON whitespace.
func (s *Scanner) WS() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// PlainString reads a string with no escapes, returning its bytes unconverted
// (a view into the input, not a copy).
func (s *Scanner) PlainString() ([]byte, bool) {
	if !s.Eat('"') {
		return nil, false
	}
	start := s.i
	s.skipPlain()
	for s.i < len(s.b) && plain[s.b[s.i]] {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '"' {
		s.i++
		return s.b[start : s.i-1], true
	}
	return nil, false
}

// StringValue reads a string value with no escapes. Invalid UTF-8, which
// encoding/json would replace with U+FFFD, is left to it.
func (s *Scanner) StringValue() (string, bool) {
	b, ok := s.PlainString()
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

// RawValue reads any JSON value but null, as a json.RawMessage would hold it,
// and returns a copy of its bytes (null is left to encoding/json, which has
// its own rule for it).
func (s *Scanner) RawValue() ([]byte, bool) {
	v, ok := s.RawView()
	if !ok {
		return nil, false
	}
	return append([]byte(nil), v...), true
}

// RawView is RawValue without the copy: a view into the input.
func (s *Scanner) RawView() ([]byte, bool) {
	start := s.i
	if s.Peek() == 'n' || !s.Value(0) {
		return nil, false
	}
	return s.b[start:s.i], true
}

// Integer reads a JSON number that is a plain integer fitting in bits.
func (s *Scanner) Integer(bits int) (int64, bool) {
	start := s.i
	s.Eat('-')
	if !s.digits() {
		return 0, false
	}
	if c := s.Peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s.b[start:s.i]), 10, bits)
	return v, err == nil
}

// Bool reads true or false.
func (s *Scanner) Bool() (bool, bool) {
	switch {
	case s.Literal("true"):
		return true, true
	case s.Literal("false"):
		return false, true
	}
	return false, false
}

// Literal consumes word if the input continues with it.
func (s *Scanner) Literal(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// digits reads the integer part of a JSON number: 0, or a non-zero digit and
// any more digits.
func (s *Scanner) digits() bool {
	if s.Eat('0') {
		return true
	}
	if c := s.Peek(); c < '1' || c > '9' {
		return false
	}
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return true
}

// Value skips over one JSON value nested depth deep, reporting whether it is
// valid JSON (and no deeper than MaxDepth).
func (s *Scanner) Value(depth int) bool {
	switch c := s.Peek(); {
	case c == '{':
		return s.container(depth, '}', true)
	case c == '[':
		return s.container(depth, ']', false)
	case c == '"':
		return s.anyString()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.Literal("true")
	case c == 'f':
		return s.Literal("false")
	case c == 'n':
		return s.Literal("null")
	}
	return false
}

// container skips an object (keyed) or an array, from its opening bracket.
func (s *Scanner) container(depth int, end byte, keyed bool) bool {
	if depth >= MaxDepth {
		return false
	}
	s.i++
	s.WS()
	if s.Eat(end) {
		return true
	}
	for {
		if keyed {
			if !s.anyString() {
				return false
			}
			s.WS()
			if !s.Eat(':') {
				return false
			}
			s.WS()
		}
		if !s.Value(depth + 1) {
			return false
		}
		s.WS()
		if s.Eat(end) {
			return true
		}
		if !s.Eat(',') {
			return false
		}
		s.WS()
	}
}

// anyString skips a string, escapes included, as encoding/json's scanner
// accepts it: no control characters, only JSON's escapes; bytes above ASCII
// pass as they are.
func (s *Scanner) anyString() bool {
	if !s.Eat('"') {
		return false
	}
	for {
		s.skipPlain()
		for s.i < len(s.b) && plain[s.b[s.i]] {
			s.i++
		}
		if s.i >= len(s.b) {
			return false
		}
		c := s.b[s.i]
		s.i++
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
}

// skipPlain skips string bytes that stand for themselves eight at a time,
// stopping at (or a little before) the first quote, backslash or control
// character, which the caller's byte loop handles. Payloads are mostly long
// plain strings; this makes validating them several times faster.
func (s *Scanner) skipPlain() {
	for s.i+8 <= len(s.b) {
		x := binary.LittleEndian.Uint64(s.b[s.i:])
		if hasLess(x, 0x20)|hasZero(x^(lsb*'"'))|hasZero(x^(lsb*'\\')) != 0 {
			return
		}
		s.i += 8
	}
}

// Bit tricks on eight bytes at once (Hacker's Delight, ch. 6): a byte's high
// bit in the result is set where the byte is zero (hasZero) or below n
// (hasLess, n ≤ 128). Set bits above a true one may be false alarms, which
// only send skipPlain back to the byte loop early.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

func hasZero(x uint64) uint64 { return (x - lsb) & ^x & msb }

func hasLess(x uint64, n byte) uint64 { return (x - lsb*uint64(n)) & ^x & msb }

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
func (s *Scanner) number() bool {
	s.Eat('-')
	if !s.digits() {
		return false
	}
	if s.Eat('.') && !s.someDigits() {
		return false
	}
	if s.Eat('e') || s.Eat('E') {
		if !s.Eat('+') {
			s.Eat('-')
		}
		if !s.someDigits() {
			return false
		}
	}
	return true
}

func (s *Scanner) someDigits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
