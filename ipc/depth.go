package ipc

import (
	"encoding/json"
	"strings"

	"github.com/sm-supervisor/sm/internal/jsonscan"
)

// MaxDepthLimit is the deepest nesting a frame may have, and the default of
// Decoder.MaxDepth: encoding/json, which decodes the frames the fast path does
// not take, refuses anything deeper. The frame's own object is level 1.
const MaxDepthLimit = 10000

// fastDepth is the deepest frame decodeFastInto may accept: the frame's object
// and a payload that jsonscan follows MaxDepth levels into.
const fastDepth = jsonscan.MaxDepth + 1

// maxDepth is the nesting limit d applies.
func (d *Decoder) maxDepth() int {
	if d == nil || d.MaxDepth <= 0 || d.MaxDepth > MaxDepthLimit {
		return MaxDepthLimit
	}
	return d.MaxDepth
}

// tooDeep reports whether b nests deeper than max.
func tooDeep(b []byte, max int) bool {
	_, deep := scanNesting(b, 0, max)
	return deep
}

// scanNesting reads b from i, counting brackets outside strings; it checks
// nothing else. It stops after the container that opens first has closed
// (end is the index after it), or as soon as the nesting passes max (deep),
// if max > 0. It does not recurse: a frame of a million '[' costs one pass,
// not a million stack frames.
func scanNesting(b []byte, i, max int) (end int, deep bool) {
	depth, inString, escaped := 0, false, false
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; max > 0 && depth > max {
				return i, true
			}
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1, false
			}
		}
	}
	return -1, false
}

// shallowFields reads the op and id of a frame too deep to decode, from its
// top level only, with encoding/json's rules for keys (case-insensitive, the
// last one wins), so that a REPLY can carry the id. It stops at the first
// thing it cannot read, keeping what it had.
func shallowFields(b []byte) *Frame {
	s := jsonscan.New(b)
	s.WS()
	if !s.Eat('{') {
		return nil
	}
	f := new(Frame)
	for {
		s.WS()
		start := s.Pos()
		if s.Peek() != '"' || !s.Value(0) {
			return f
		}
		var key string
		if json.Unmarshal(b[start:s.Pos()], &key) != nil {
			return f
		}
		s.WS()
		if !s.Eat(':') {
			return f
		}
		s.WS()
		start = s.Pos()
		var ok bool
		if c := s.Peek(); c == '{' || c == '[' {
			var end int
			if end, _ = scanNesting(b, start, 0); end > 0 {
				s.Seek(end)
				ok = true
			}
		} else {
			ok = s.Value(0)
		}
		if !ok {
			return f
		}
		var v string
		switch {
		case strings.EqualFold(key, "id") && json.Unmarshal(b[start:s.Pos()], &v) == nil:
			f.ID = v
		case strings.EqualFold(key, "op") && json.Unmarshal(b[start:s.Pos()], &v) == nil:
			f.Op = v
		}
		s.WS()
		if !s.Eat(',') {
			return f
		}
	}
}
