package ipc

import (
	"strconv"

	"github.com/sm-supervisor/sm/internal/jsonscan"
)

// decodeFast decodes the frames peers send in practice — lower-case keys of
// Frame, each once, strings without escapes, integers as plain digits —
// without reflection, validating the payload as it skips over it. For anything
// else (an escape, an unknown or repeated key, null, a float where an integer
// goes, an error object, bad JSON) it gives up (ok false) and Decode hands the
// frame to encoding/json, so what Decode returns never depends on which path
// ran. It exists because encoding/json was half of the manager's CPU under
// load (docs/performance.md); FuzzDecodeFast checks it against json.Unmarshal.
func decodeFast(b []byte, d *Decoder) (*Frame, bool) {
	f := new(Frame)
	if !decodeFastInto(f, b, d, false) {
		return nil, false
	}
	return f, true
}

// decodeFastInto is decodeFast into f, which must be zero. With view, the
// payload, resume and handoff are views into b rather than copies.
func decodeFastInto(f *Frame, b []byte, d *Decoder, view bool) bool {
	s := jsonscan.New(b)
	s.WS()
	if !s.Eat('{') {
		return false
	}
	raw := (*jsonscan.Scanner).RawValue
	if view {
		raw = (*jsonscan.Scanner).RawView
	}
	var seen uint32
	for {
		s.WS()
		key, ok := s.PlainString()
		if !ok {
			return false
		}
		s.WS()
		if !s.Eat(':') {
			return false
		}
		s.WS()
		key2 := fastKey(key)
		if key2 == 0 || seen&key2 != 0 {
			return false // unknown, case-folded or repeated: encoding/json's rules apply
		}
		seen |= key2
		switch key2 {
		case keyOp:
			f.Op, ok = opValue(&s, d)
		case keyID:
			f.ID, ok = s.StringValue()
		case keyTarget:
			if d != nil {
				f.Target, ok = interned(&s, &d.target)
			} else {
				f.Target, ok = s.StringValue()
			}
		case keyRole:
			f.Role, ok = s.StringValue()
		case keyName:
			f.Name, ok = s.StringValue()
		case keyToken:
			f.Token, ok = s.StringValue()
		case keyPayload:
			f.Payload, ok = raw(&s)
		case keyResume:
			f.Resume, ok = raw(&s)
		case keyHandoff:
			f.Handoff, ok = raw(&s)
		case keyTimeoutMS:
			f.TimeoutMS, ok = s.Integer(64)
		case keyCluster:
			f.Cluster, ok = intPointer(&s)
		case keyGeneration:
			var v int64
			if v, ok = s.Integer(64); ok {
				f.Generation = Int64(v)
			}
		case keyPID:
			f.PID, ok = intValue(&s)
		case keyMaxParallel:
			f.MaxParallel, ok = intValue(&s)
		case keyShard:
			f.Shard, ok = intPointer(&s)
		case keyReady:
			var v bool
			if v, ok = s.Bool(); ok {
				f.Ready = Bool(v)
			}
		}
		if !ok {
			return false
		}
		s.WS()
		if s.Eat('}') {
			break
		}
		if !s.Eat(',') {
			return false
		}
	}
	s.WS()
	return s.Done()
}

// intValue reads an integer that fits an int.
func intValue(s *jsonscan.Scanner) (int, bool) {
	v, ok := s.Integer(strconv.IntSize)
	return int(v), ok
}

// intPointer is intValue for a field that is absent when nil.
func intPointer(s *jsonscan.Scanner) (*int, bool) {
	v, ok := intValue(s)
	if !ok {
		return nil, false
	}
	return Int(v), true
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
	keyHandoff
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
	case "handoff":
		return keyHandoff
	}
	return 0
}

// opValue is StringValue for the op, sparing the protocol's own ops an
// allocation (they are most of the frames), and with a Decoder a repeated
// business op too.
func opValue(s *jsonscan.Scanner, d *Decoder) (string, bool) {
	start := s.Pos()
	b, ok := s.PlainString()
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
	s.Seek(start)
	if d != nil {
		return interned(s, &d.op)
	}
	return s.StringValue()
}

// interned is StringValue returning *last when the value equals it, and
// remembering the value otherwise.
func interned(s *jsonscan.Scanner, last *string) (string, bool) {
	start := s.Pos()
	if b, ok := s.PlainString(); ok && *last != "" && string(b) == *last {
		return *last, true
	}
	s.Seek(start)
	v, ok := s.StringValue()
	if ok {
		*last = v
	}
	return v, ok
}
