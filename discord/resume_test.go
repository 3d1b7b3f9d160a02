package discord_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// count is the shard count of the topology the tests' sessions belong to.
const count = 16

func rs(shard int, session string, seq int64) discord.ResumeState {
	return discord.ResumeState{Shard: shard, ShardCount: count, SessionID: session, Seq: seq, ResumeURL: "wss://gateway-us-east1-b.discord.gg"}
}

// brief is a ResumeState as "shard:session:seq", for comparisons.
func brief(states []discord.ResumeState) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = fmt.Sprintf("%d:%s:%d", s.Shard, s.SessionID, s.Seq)
	}
	return out
}

func TestResumeStateWireForm(t *testing.T) {
	// What a cluster sends in HEARTBEAT: no updated_at, maybe a shard_count.
	in := `[{"shard":12,"shard_count":16,"session_id":"a1b2","seq":42,"resume_url":"wss://gateway-us-east1-b.discord.gg"}]`
	var states []discord.ResumeState
	if err := json.Unmarshal([]byte(in), &states); err != nil {
		t.Fatal(err)
	}
	if len(states) != 1 || states[0] != (discord.ResumeState{Shard: 12, ShardCount: 16, SessionID: "a1b2", Seq: 42, ResumeURL: "wss://gateway-us-east1-b.discord.gg"}) {
		t.Fatalf("decoded %+v", states)
	}
	out, _ := json.Marshal(states)
	if string(out) != in {
		t.Errorf("encoded %s\nwant %s", out, in)
	}
}

func TestResumeStateValidate(t *testing.T) {
	ok := rs(3, "0123456789abcdef0123456789abcdef", 0)
	tests := []struct {
		name   string
		mutate func(*discord.ResumeState)
		want   string // "" for valid
	}{
		{"valid", func(*discord.ResumeState) {}, ""},
		{"ws for tests", func(s *discord.ResumeState) { s.ResumeURL = "ws://127.0.0.1:9999/gw" }, ""},
		{"negative shard", func(s *discord.ResumeState) { s.Shard = -1 }, "negative"},
		{"shard count unknown", func(s *discord.ResumeState) { s.ShardCount = 0 }, ""},
		{"negative shard count", func(s *discord.ResumeState) { s.ShardCount = -2 }, "shard_count"},
		{"shard past the count", func(s *discord.ResumeState) { s.ShardCount = 3 }, "shard_count"},
		{"no session", func(s *discord.ResumeState) { s.SessionID = "" }, "session_id"},
		{"session with a newline", func(s *discord.ResumeState) { s.SessionID = "ab\ncd" }, "session_id"},
		{"huge session", func(s *discord.ResumeState) { s.SessionID = strings.Repeat("a", 129) }, "session_id"},
		{"negative seq", func(s *discord.ResumeState) { s.Seq = -1 }, "seq"},
		{"no URL", func(s *discord.ResumeState) { s.ResumeURL = "" }, "resume_url"},
		{"https URL", func(s *discord.ResumeState) { s.ResumeURL = "https://discord.com" }, "resume_url"},
		{"no host", func(s *discord.ResumeState) { s.ResumeURL = "wss:///x" }, "resume_url"},
		{"huge URL", func(s *discord.ResumeState) { s.ResumeURL = "wss://x/" + strings.Repeat("a", 600) }, "resume_url"},
	}
	for _, tt := range tests {
		s := ok
		tt.mutate(&s)
		err := s.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: err = %v, want one about %s", tt.name, err, tt.want)
		}
	}
}

func TestResumeStore(t *testing.T) {
	s := discord.NewResumeStore(2 * time.Minute)
	v0 := s.Version()
	// Cluster 0 (shards 0-3) and cluster 1 (shards 4-7) report.
	if err := s.Update([]discord.ResumeState{rs(0, "s0", 10), rs(1, "s1", 11), rs(2, "s2", 12)}, at(0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Update([]discord.ResumeState{rs(5, "s5", 50), rs(4, "s4", 40)}, at(30)); err != nil {
		t.Fatal(err)
	}
	if s.Version() == v0 {
		t.Error("Version unchanged by Update")
	}
	if got, want := brief(s.Get(0, 3, count, at(60))), []string{"0:s0:10", "1:s1:11", "2:s2:12"}; !slices.Equal(got, want) {
		t.Errorf("Get(0, 3) = %v, want %v", got, want)
	}
	if got, want := brief(s.Get(4, 7, count, at(60))), []string{"4:s4:40", "5:s5:50"}; !slices.Equal(got, want) {
		t.Errorf("Get(4, 7) = %v, want %v", got, want)
	}
	if got := s.Get(0, 3, count, at(60)); !got[0].UpdatedAt.Equal(at(0)) {
		t.Errorf("UpdatedAt = %v, want the Update's now", got[0].UpdatedAt)
	}

	// Heartbeats move the sequence on; a new session replaces the old.
	if err := s.Update([]discord.ResumeState{rs(0, "s0", 99), rs(1, "s1-new", 1)}, at(90)); err != nil {
		t.Fatal(err)
	}
	// A stale report for the same session never lowers its sequence.
	if err := s.Update([]discord.ResumeState{rs(0, "s0", 20)}, at(100)); err != nil {
		t.Fatal(err)
	}
	// Staleness: shard 2 last reported at 0s, so at 121s it is past 2 minutes.
	got := brief(s.Get(0, 3, count, at(121)))
	if want := []string{"0:s0:99", "1:s1-new:1"}; !slices.Equal(got, want) {
		t.Errorf("Get(0, 3) at 121s = %v, want %v", got, want)
	}
	if got := s.Get(0, 3, count, at(120)); len(got) != 3 {
		t.Errorf("at exactly MaxAge: %v, want shard 2 still handed out", brief(got))
	}
	if s.Len() != 5 {
		t.Errorf("Len = %d, want 5 (stale entries kept until pruned)", s.Len())
	}

	v := s.Version()
	if !s.Forget(5) || s.Forget(5) || s.Forget(77) {
		t.Error("Forget reports wrongly")
	}
	if s.Version() == v {
		t.Error("Version unchanged by Forget")
	}
	if got := brief(s.Get(0, 100, count, at(60))); !slices.Equal(got, []string{"0:s0:99", "1:s1-new:1", "2:s2:12", "4:s4:40"}) {
		t.Errorf("after Forget: %v", got)
	}
	// At 200s everything but the 90s/100s reports is stale.
	if n := s.Prune(at(200)); n != 2 {
		t.Errorf("Prune = %d, want 2", n)
	}
	if got := brief(s.Get(0, 100, count, at(200))); !slices.Equal(got, []string{"0:s0:99", "1:s1-new:1"}) {
		t.Errorf("after Prune: %v", got)
	}
	v = s.Version()
	if s.Prune(at(200)) != 0 || s.Version() != v {
		t.Error("a Prune with nothing to prune changed the store")
	}
}

func TestResumeStoreUpdateKeepsValid(t *testing.T) {
	var s discord.ResumeStore // the zero value works, with the default MaxAge
	bad := rs(2, "", 1)
	err := s.Update([]discord.ResumeState{rs(1, "s1", 1), bad, rs(3, "s3", -4)}, at(0))
	if err == nil || !strings.Contains(err.Error(), "shard 2") || !strings.Contains(err.Error(), "shard 3") {
		t.Errorf("err = %v, want both bad entries named", err)
	}
	if got := brief(s.Get(0, 9, count, at(0))); !slices.Equal(got, []string{"1:s1:1"}) {
		t.Errorf("Get = %v", got)
	}
	if got := s.Get(0, 9, count, at(0).Add(discord.DefaultResumeMaxAge+time.Second)); len(got) != 0 {
		t.Errorf("past the default MaxAge: %v", brief(got))
	}
	// The cluster's own updated_at is ignored.
	claimed := rs(4, "s4", 1)
	claimed.UpdatedAt = at(9999)
	_ = s.Update([]discord.ResumeState{claimed}, at(5))
	if got := s.Get(4, 4, count, at(5)); len(got) != 1 || !got[0].UpdatedAt.Equal(at(5)) {
		t.Errorf("Get = %+v, want updated_at 5s", got)
	}
}

func TestResumeStoreRoundTrip(t *testing.T) {
	s := discord.NewResumeStore(0)
	_ = s.Update([]discord.ResumeState{rs(7, "s7", 70), rs(0, "s0", 1), rs(3, "s3", 30)}, at(10))
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"version":1,"shards":[{"shard":0,`) {
		t.Errorf("file = %s", b)
	}
	// A restarted manager loads it.
	r := discord.NewResumeStore(0)
	if err := r.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	got := r.Get(0, 10, count, at(20))
	if want := []string{"0:s0:1", "3:s3:30", "7:s7:70"}; !slices.Equal(brief(got), want) {
		t.Errorf("loaded %v, want %v", brief(got), want)
	}
	if !got[0].UpdatedAt.Equal(at(10)) {
		t.Errorf("UpdatedAt = %v after the round trip", got[0].UpdatedAt)
	}
	// Staleness survives the trip.
	if got := r.Get(0, 10, count, at(10).Add(3*time.Minute)); len(got) != 0 {
		t.Errorf("stale entries handed out after loading: %v", brief(got))
	}
	// An empty store round-trips too.
	empty, _ := discord.NewResumeStore(0).Marshal()
	if string(empty) != `{"version":1,"shards":[]}` {
		t.Errorf("empty file = %s", empty)
	}
}

func TestResumeStoreUnmarshalRefuses(t *testing.T) {
	good := `{"shard":1,"session_id":"s1","seq":1,"resume_url":"wss://x","updated_at":"2026-01-01T00:00:00Z"}`
	for name, in := range map[string]string{
		"not JSON":      `{"version":1,`,
		"other version": `{"version":2,"shards":[]}`,
		"no version":    `{"shards":[]}`,
		"invalid entry": `{"version":1,"shards":[` + good + `,{"shard":2,"session_id":"","seq":1,"resume_url":"wss://x"}]}`,
		"duplicate":     `{"version":1,"shards":[` + good + `,` + good + `]}`,
	} {
		s := discord.NewResumeStore(0)
		_ = s.Update([]discord.ResumeState{rs(9, "keep", 1)}, at(0))
		if err := s.Unmarshal([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
		if got := brief(s.Get(0, 10, count, at(0))); !slices.Equal(got, []string{"9:keep:1"}) {
			t.Errorf("%s: store changed to %v", name, got)
		}
	}
}

// A session is handed out only to a process of the topology it was opened
// under: a re-clustering to another shard count makes it useless (Discord
// routes guilds by shard count, and @discordjs/ws refuses to resume it), and
// an entry whose count is unknown (a file from before shard_count) is never
// handed out.
func TestResumeStoreShardCount(t *testing.T) {
	s := discord.NewResumeStore(time.Minute)
	old := rs(1, "under-16", 5)
	other := rs(2, "under-8", 7)
	other.ShardCount = 8
	if err := s.Update([]discord.ResumeState{old, other}, at(0)); err != nil {
		t.Fatal(err)
	}
	if got := brief(s.Get(0, 7, 16, at(1))); !slices.Equal(got, []string{"1:under-16:5"}) {
		t.Errorf("Get for 16 shards = %v, want only the 16-shard session", got)
	}
	if got := brief(s.Get(0, 7, 8, at(1))); !slices.Equal(got, []string{"2:under-8:7"}) {
		t.Errorf("Get for 8 shards = %v, want only the 8-shard session", got)
	}
	if got := s.Get(0, 7, 0, at(1)); len(got) != 0 {
		t.Errorf("Get for an unknown count = %v, want nothing", brief(got))
	}
	// The same session id under another count is another session: its
	// sequence starts afresh.
	again := rs(1, "under-16", 1)
	again.ShardCount = 8
	if err := s.Update([]discord.ResumeState{again}, at(2)); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(1, 1, 8, at(3)); len(got) != 1 || got[0].Seq != 1 {
		t.Errorf("after a report under 8 shards: %+v", got)
	}

	// A file written before shard_count existed loads, and is kept (it goes
	// stale and is pruned as usual), but none of it is handed out.
	legacy := `{"version":1,"shards":[{"shard":1,"session_id":"s1","seq":1,"resume_url":"wss://x","updated_at":"2026-01-01T00:00:00Z"}]}`
	r := discord.NewResumeStore(time.Minute)
	if err := r.Unmarshal([]byte(legacy)); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
	if r.Len() != 1 || len(r.Get(0, 9, 16, when)) != 0 || len(r.Get(0, 9, 2, when)) != 0 {
		t.Errorf("a legacy entry was handed out (len %d)", r.Len())
	}
	// And what is written now carries the count.
	b, _ := s.Marshal()
	if !strings.Contains(string(b), `"shard_count":8`) {
		t.Errorf("file %s lacks shard_count", b)
	}
	if err := r.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if got := r.Get(2, 2, 8, at(3)); len(got) != 1 || got[0].ShardCount != 8 {
		t.Errorf("round trip lost the count: %+v", got)
	}
}

// Merge adopts another host's reports with their own times: the latest
// report of a shard wins wherever it was made.
func TestResumeStoreMerge(t *testing.T) {
	s := discord.NewResumeStore(2 * time.Minute)
	if err := s.Update([]discord.ResumeState{rs(0, "here0", 5), rs(1, "here1", 5)}, at(10)); err != nil {
		t.Fatal(err)
	}
	v := s.Version()
	older, newer, fresh := rs(0, "there0", 9), rs(1, "there1", 9), rs(2, "there2", 9)
	older.UpdatedAt, newer.UpdatedAt, fresh.UpdatedAt = at(5), at(11), at(3)
	noCount := rs(3, "there3", 1)
	noCount.ShardCount, noCount.UpdatedAt = 0, at(20)
	bad := rs(4, "", 1)
	bad.UpdatedAt = at(20)
	if n := s.Merge([]discord.ResumeState{older, newer, fresh, noCount, bad}); n != 2 {
		t.Fatalf("Merge adopted %d, want 2 (shards 1 and 2)", n)
	}
	if s.Version() == v {
		t.Error("Version unchanged by Merge")
	}
	got := s.Get(0, 15, count, at(60))
	if b := brief(got); !slices.Equal(b, []string{"0:here0:5", "1:there1:9", "2:there2:9"}) {
		t.Fatalf("after Merge: %v", b)
	}
	if !got[1].UpdatedAt.Equal(at(11)) || !got[2].UpdatedAt.Equal(at(3)) {
		t.Errorf("Merge restamped the entries: %v, %v", got[1].UpdatedAt, got[2].UpdatedAt)
	}
	v = s.Version()
	if s.Merge([]discord.ResumeState{newer}) != 0 || s.Version() != v {
		t.Error("merging what is there already changed the store")
	}
}
