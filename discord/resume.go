package discord

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// DefaultResumeMaxAge is how long a resume state is handed out after its last
// report. Discord accepts a RESUME for a few minutes after a disconnect; past
// that the replacement would only waste a round trip before identifying.
const DefaultResumeMaxAge = 2 * time.Minute

// Limits on a reported resume state, far above Discord's (a session id is 32
// hex digits) and low enough that a buggy cluster cannot bloat the state file.
const (
	maxSessionIDLen = 128
	maxResumeURLLen = 512
)

// ResumeState is what a shard needs to RESUME its gateway session instead of
// identifying: clusters report it in HEARTBEAT (and at QUIESCE), the manager
// hands it back to the replacement process in the REGISTER reply. The JSON
// form is the wire form.
type ResumeState struct {
	Shard int `json:"shard"`
	// ShardCount is the total shard count of the topology the session was
	// opened under: a session is only good for a process of that topology
	// (Discord routes guilds by shard and shard count, and libraries such as
	// @discordjs/ws resume only a session of the current count). The manager
	// stamps it with the reporting process's topology; what a cluster sends
	// is ignored. 0 means unknown (a file written before it existed): such an
	// entry is never handed out.
	ShardCount int    `json:"shard_count,omitempty"`
	SessionID  string `json:"session_id"`
	// Seq is the last sequence number the shard received.
	Seq int64 `json:"seq"`
	// ResumeURL is the READY event's resume_gateway_url.
	ResumeURL string `json:"resume_url"`
	// UpdatedAt is set by the store when the state was last reported; what a
	// cluster sends here is ignored.
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// Validate checks the fields a cluster reports. It does not know which shards
// the cluster owns: checking that is the caller's job.
func (s ResumeState) Validate() error {
	switch {
	case s.Shard < 0:
		return fmt.Errorf("resume state: shard %d is negative", s.Shard)
	case s.ShardCount < 0 || (s.ShardCount > 0 && s.Shard >= s.ShardCount):
		return fmt.Errorf("resume state of shard %d: shard_count %d does not hold it", s.Shard, s.ShardCount)
	case s.SessionID == "" || len(s.SessionID) > maxSessionIDLen || !printableASCII(s.SessionID):
		return fmt.Errorf("resume state of shard %d: session_id must be 1 to %d printable ASCII characters", s.Shard, maxSessionIDLen)
	case s.Seq < 0:
		return fmt.Errorf("resume state of shard %d: seq %d is negative", s.Shard, s.Seq)
	case len(s.ResumeURL) > maxResumeURLLen:
		return fmt.Errorf("resume state of shard %d: resume_url longer than %d bytes", s.Shard, maxResumeURLLen)
	}
	u, err := url.Parse(s.ResumeURL)
	if err != nil || (u.Scheme != "wss" && u.Scheme != "ws") || u.Host == "" {
		return fmt.Errorf("resume state of shard %d: resume_url must be a ws:// or wss:// URL", s.Shard)
	}
	return nil
}

func printableASCII(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) < 0
}

// ResumeStore keeps the latest resume state per shard, across clusters and
// generations (shard ids are global). Entries older than MaxAge are kept but
// not handed out. It is not safe for concurrent use; the zero value is an
// empty store with DefaultResumeMaxAge.
type ResumeStore struct {
	// MaxAge is how long after its last report an entry is handed out;
	// DefaultResumeMaxAge when 0 or less.
	MaxAge time.Duration

	m       map[int]ResumeState
	version uint64
}

// NewResumeStore returns an empty store whose entries go stale after maxAge
// (DefaultResumeMaxAge when 0 or less).
func NewResumeStore(maxAge time.Duration) *ResumeStore {
	return &ResumeStore{MaxAge: maxAge}
}

func (s *ResumeStore) maxAge() time.Duration {
	if s.MaxAge > 0 {
		return s.MaxAge
	}
	return DefaultResumeMaxAge
}

// Update records the reported states as of now, each with its ShardCount as
// given (UpdateJSON stamps the sender's). Invalid entries are skipped and
// reported in the returned error (errors.Join of Validate's); the valid ones
// are kept. A later entry for a shard replaces the earlier, except that a
// report for the same session never lowers its sequence number.
func (s *ResumeStore) Update(states []ResumeState, now time.Time) error {
	var errs []error
	for _, st := range states {
		if err := s.put(st, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// put validates st and records it as of now: Update's step for one entry.
func (s *ResumeStore) put(st ResumeState, now time.Time) error {
	if err := st.Validate(); err != nil {
		return err
	}
	if s.m == nil {
		s.m = map[int]ResumeState{}
	}
	if old, ok := s.m[st.Shard]; ok && old.SessionID == st.SessionID && old.ShardCount == st.ShardCount {
		st.Seq = max(st.Seq, old.Seq)
	}
	st.UpdatedAt = now
	s.m[st.Shard] = st
	s.version++
	return nil
}

// Get returns the fresh entries for shards first..last (inclusive) opened
// under a topology of shardCount shards, by shard: what the REGISTER reply of
// that range's replacement process carries. Entries of another shard count
// (a re-clustering changed it) or of an unknown one are left out.
func (s *ResumeStore) Get(first, last, shardCount int, now time.Time) []ResumeState {
	var out []ResumeState
	for shard, st := range s.m {
		if shard >= first && shard <= last && st.ShardCount == shardCount && shardCount > 0 && s.fresh(st, now) {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b ResumeState) int { return a.Shard - b.Shard })
	return out
}

// fresh: reported at most MaxAge ago. An entry from the future (the wall clock
// stepped back across a manager restart) counts as fresh: a RESUME that
// Discord refuses costs one round trip before the shard identifies anyway.
func (s *ResumeStore) fresh(st ResumeState, now time.Time) bool {
	return now.Sub(st.UpdatedAt) <= s.maxAge()
}

// Merge adopts entries that another host reported (the mesh's resume store,
// docs/multihost.md), each with its own UpdatedAt: a shard's entry is
// replaced only by a newer one, so the latest report wins wherever it was
// made. Entries that fail Validate, or have no ShardCount (they could never
// be handed out), are skipped. It returns how many it adopted.
func (s *ResumeStore) Merge(states []ResumeState) int {
	n := 0
	for _, st := range states {
		if st.ShardCount <= 0 || st.Validate() != nil {
			continue
		}
		if old, ok := s.m[st.Shard]; ok && !st.UpdatedAt.After(old.UpdatedAt) {
			continue
		}
		if s.m == nil {
			s.m = map[int]ResumeState{}
		}
		s.m[st.Shard] = st
		n++
	}
	if n > 0 {
		s.version++
	}
	return n
}

// Forget drops the entry of shard (its session was invalidated, or closed on
// purpose) and reports whether there was one.
func (s *ResumeStore) Forget(shard int) bool {
	if _, ok := s.m[shard]; !ok {
		return false
	}
	delete(s.m, shard)
	s.version++
	return true
}

// Prune drops the entries that are stale at now and returns how many.
func (s *ResumeStore) Prune(now time.Time) int {
	n := 0
	for shard, st := range s.m {
		if !s.fresh(st, now) {
			delete(s.m, shard)
			n++
		}
	}
	if n > 0 {
		s.version++
	}
	return n
}

// Len is the number of entries, stale ones included.
func (s *ResumeStore) Len() int { return len(s.m) }

// Version changes whenever the contents do, so the owner can write the state
// file behind only when there is something new.
func (s *ResumeStore) Version() uint64 { return s.version }

// resumeFileVersion is bumped on incompatible changes of the file format.
const resumeFileVersion = 1

type resumeFile struct {
	Version int           `json:"version"`
	Shards  []ResumeState `json:"shards"`
}

// Marshal returns the store's contents for the state directory, entries by
// shard, stale ones included (Prune first to leave them out). Writing the
// bytes atomically is the caller's job.
func (s *ResumeStore) Marshal() ([]byte, error) {
	f := resumeFile{Version: resumeFileVersion, Shards: make([]ResumeState, 0, len(s.m))}
	for _, st := range s.m {
		f.Shards = append(f.Shards, st)
	}
	slices.SortFunc(f.Shards, func(a, b ResumeState) int { return a.Shard - b.Shard })
	return json.Marshal(f)
}

// Unmarshal replaces the store's contents with what Marshal wrote. It is all
// or nothing: on any error (not JSON, another format version, an invalid or
// duplicated entry) the store is left unchanged; resume state is an
// optimisation, and a caller that cannot load it starts empty.
func (s *ResumeStore) Unmarshal(b []byte) error {
	var f resumeFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("resume state file: %w", err)
	}
	if f.Version != resumeFileVersion {
		return fmt.Errorf("resume state file: version %d, want %d", f.Version, resumeFileVersion)
	}
	m := make(map[int]ResumeState, len(f.Shards))
	for _, st := range f.Shards {
		if err := st.Validate(); err != nil {
			return fmt.Errorf("resume state file: %w", err)
		}
		if _, dup := m[st.Shard]; dup {
			return fmt.Errorf("resume state file: shard %d twice", st.Shard)
		}
		m[st.Shard] = st
	}
	s.m = m
	s.version++
	return nil
}
