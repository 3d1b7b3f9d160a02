package discord

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sm-supervisor/sm/internal/jsonscan"
)

// UpdateJSON records the resume states in raw — a JSON array of ResumeState,
// the form HEARTBEAT and QUIESCED carry — for shards first..last of a
// topology of shardCount shards, as of now; entries for other shards are
// ignored, and every entry's ShardCount is shardCount, whatever the sender
// wrote. It does what json.Unmarshal and then Update of the kept entries do,
// and returns the same: an array that does not decode is an error and
// changes nothing; invalid entries are skipped and reported, the valid ones
// kept.
//
// It exists for the heartbeat path, where encoding/json was a third of a
// 512-cluster manager's CPU (docs/performance.md): the report bots send in
// practice — known keys once each, strings without escapes, plain integers —
// is read without reflection, and a shard whose session and URL are unchanged
// (only seq moves) is updated in place, without allocating or re-validating
// the URL. Anything else takes encoding/json's path; FuzzUpdateJSON checks
// that both paths agree.
func (s *ResumeStore) UpdateJSON(raw []byte, first, last, shardCount int, now time.Time) error {
	var buf [16]scannedResume // a cluster's shards, on the stack
	entries, ok := scanResume(raw, buf[:0])
	if !ok {
		return s.updateDecoded(raw, first, last, shardCount, now)
	}
	var errs []error
	for _, e := range entries {
		if e.shard < first || e.shard > last {
			continue
		}
		if old, ok := s.m[e.shard]; ok && e.seq >= 0 && old.ShardCount == shardCount &&
			old.SessionID == string(e.session) && old.ResumeURL == string(e.url) {
			// Valid when it was stored, and only the sequence moved.
			old.Seq = max(old.Seq, e.seq)
			old.UpdatedAt = now
			s.m[e.shard] = old
			s.version++
			continue
		}
		st := ResumeState{Shard: e.shard, ShardCount: shardCount, SessionID: string(e.session), Seq: e.seq, ResumeURL: string(e.url)}
		if err := s.put(st, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// updateDecoded is UpdateJSON through encoding/json.
func (s *ResumeStore) updateDecoded(raw []byte, first, last, shardCount int, now time.Time) error {
	var states []ResumeState
	if err := json.Unmarshal(raw, &states); err != nil {
		return err
	}
	mine := states[:0]
	for _, st := range states {
		if st.Shard >= first && st.Shard <= last {
			st.ShardCount = shardCount
			mine = append(mine, st)
		}
	}
	return s.Update(mine, now)
}

// scannedResume is one entry of a resume array as scanResume reads it: the
// strings are views into the input.
type scannedResume struct {
	shard        int
	seq          int64
	session, url []byte
}

// scanResume reads a resume array in the common form into dst, or reports
// false for anything encoding/json must decide: another key (updated_at,
// a case-folded or unknown one), a repeated key, null, an escape or a
// non-ASCII byte in a string, a number that is not a plain integer, bad JSON.
func scanResume(raw []byte, dst []scannedResume) ([]scannedResume, bool) {
	s := jsonscan.New(raw)
	s.WS()
	if !s.Eat('[') {
		return dst, false
	}
	s.WS()
	if s.Eat(']') {
		s.WS()
		return dst, s.Done()
	}
	for {
		e, ok := scanResumeEntry(&s)
		if !ok {
			return dst, false
		}
		dst = append(dst, e)
		s.WS()
		if s.Eat(']') {
			break
		}
		if !s.Eat(',') {
			return dst, false
		}
		s.WS()
	}
	s.WS()
	return dst, s.Done()
}

// The keys of a ResumeState that scanResume reads, each a bit so that a
// repeat is spotted. shard_count is read and dropped: the store stamps its own.
const (
	resumeKeyShard = 1 << iota
	resumeKeySession
	resumeKeySeq
	resumeKeyURL
	resumeKeyShardCount
)

func scanResumeEntry(s *jsonscan.Scanner) (e scannedResume, ok bool) {
	if !s.Eat('{') {
		return e, false
	}
	s.WS()
	if s.Eat('}') {
		return e, true
	}
	seen := 0
	for {
		key, ok := s.PlainString()
		if !ok {
			return e, false
		}
		s.WS()
		if !s.Eat(':') {
			return e, false
		}
		s.WS()
		var bit int
		switch string(key) {
		case "shard":
			bit = resumeKeyShard
			var v int64
			v, ok = s.Integer(strconv.IntSize)
			e.shard = int(v)
		case "session_id":
			bit = resumeKeySession
			e.session, ok = asciiString(s)
		case "seq":
			bit = resumeKeySeq
			e.seq, ok = s.Integer(64)
		case "resume_url":
			bit = resumeKeyURL
			e.url, ok = asciiString(s)
		case "shard_count":
			bit = resumeKeyShardCount
			_, ok = s.Integer(strconv.IntSize)
		}
		if bit == 0 || seen&bit != 0 || !ok {
			return e, false
		}
		seen |= bit
		s.WS()
		if s.Eat('}') {
			return e, true
		}
		if !s.Eat(',') {
			return e, false
		}
		s.WS()
	}
}

// asciiString reads a string of ASCII bytes without escapes, as a view.
func asciiString(s *jsonscan.Scanner) ([]byte, bool) {
	b, ok := s.PlainString()
	if !ok {
		return nil, false
	}
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return nil, false
		}
	}
	return b, true
}
