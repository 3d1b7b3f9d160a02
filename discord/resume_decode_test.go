package discord_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// heartbeatResume is a cluster of 8 shards reporting its sessions, as the
// simulated bot (and a real one) does on every HEARTBEAT.
func heartbeatResume(first int, seq int64) []byte {
	var b strings.Builder
	b.WriteByte('[')
	for i := range 8 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"shard":%d,"session_id":"%032x","seq":%d,"resume_url":"wss://gateway-us-east1-b.discord.gg"}`, first+i, first+i, seq+int64(i))
	}
	b.WriteByte(']')
	return []byte(b.String())
}

// fuzzCount is the shard count UpdateJSON stamps in the fuzz test.
const fuzzCount = 8

// seededStore holds shards 0-3 with sessions s0-s3, so that fuzz inputs can
// hit the in-place path (same session, URL and shard count) as well as the
// other; shard 3's session is of another topology (4 shards), so a report of
// the same session under this one replaces it.
func seededStore(now time.Time) *discord.ResumeStore {
	s := discord.NewResumeStore(time.Minute)
	for i := range 4 {
		st := discord.ResumeState{Shard: i, ShardCount: fuzzCount, SessionID: fmt.Sprintf("s%d", i), Seq: 10, ResumeURL: "wss://g.example"}
		if i == 3 {
			st.ShardCount = 4
		}
		if err := s.Update([]discord.ResumeState{st}, now); err != nil {
			panic(err)
		}
	}
	return s
}

// updateModel is what UpdateJSON must do, the slow and obvious way: the
// sender's shard_count is replaced by the topology's.
func updateModel(s *discord.ResumeStore, raw []byte, first, last, shardCount int, now time.Time) error {
	var states []discord.ResumeState
	if err := json.Unmarshal(raw, &states); err != nil {
		return err
	}
	var mine []discord.ResumeState
	for _, st := range states {
		if st.Shard >= first && st.Shard <= last {
			st.ShardCount = shardCount
			mine = append(mine, st)
		}
	}
	return s.Update(mine, now)
}

func FuzzUpdateJSON(f *testing.F) {
	for _, seed := range []string{
		`[]`, ` [ ] `, `null`, `{}`, `[null]`, `[{}]`, `[1]`, `[{"shard":1}]`,
		`[{"shard":1,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s1","seq":9,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"new","seq":1,"resume_url":"wss://g.example"}]`,
		`[{"shard":2,"session_id":"s2","seq":12,"resume_url":"http://g.example"}]`,
		`[{"shard":3,"session_id":"s3","seq":-1,"resume_url":"wss://g.example"}]`,
		`[{"shard":4,"session_id":"s4","seq":1,"resume_url":"wss://g.example"},{"shard":9,"session_id":"x","seq":1,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s1","seq":11,"resume_url":"wss://g.example","updated_at":"2020-01-01T00:00:00Z"}]`,
		`[{"Shard":1,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"shard":2,"session_id":"s2","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s\u0031","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1.0,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s1","seq":1e3,"resume_url":"wss://g.example"}]`,
		`[{"shard":-1,"session_id":"s1","seq":1,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"é","seq":1,"resume_url":"wss://g.example"}]`,
		`[{"shard":0,"session_id":"s0","seq":20,"resume_url":"wss://g.example"},{"shard":0,"session_id":"z","seq":1,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}`,
		`[{"shard":1,"shard_count":8,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"shard_count":99,"session_id":"s1","seq":12,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"shard_count":-1,"session_id":"s1","seq":12,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"shard_count":"8","session_id":"s1","seq":12,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"shard_count":8,"shard_count":8,"session_id":"s1","seq":12,"resume_url":"wss://g.example"}]`,
		`[{"shard":3,"session_id":"s3","seq":11,"resume_url":"wss://g.example"}]`,
		`[{"shard":3,"session_id":"s3","seq":2,"resume_url":"wss://g.example"}]`,
		`[{"shard":1,"session_id":"s1","seq":11,"resume_url":"wss://g.example"}] x`,
		string(heartbeatResume(0, 5)),
	} {
		f.Add([]byte(seed))
	}
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, want := seededStore(now), seededStore(now)
		later := now.Add(time.Second)
		gotErr := got.UpdateJSON(raw, 0, 5, fuzzCount, later)
		wantErr := updateModel(want, raw, 0, 5, fuzzCount, later)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("UpdateJSON(%q): err %v, encoding/json's path %v", raw, gotErr, wantErr)
		}
		gb, err := got.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		wb, _ := want.Marshal()
		if !bytes.Equal(gb, wb) {
			t.Fatalf("UpdateJSON(%q) left\n%s\nencoding/json's path\n%s", raw, gb, wb)
		}
		if (got.Version() == seededStore(now).Version()) != (want.Version() == seededStore(now).Version()) {
			t.Fatalf("UpdateJSON(%q): changed %v, encoding/json's path %v", raw, got.Version() != seededStore(now).Version(), want.Version() != seededStore(now).Version())
		}
	})
}

func TestUpdateJSONSteadyHeartbeatDoesNotAllocate(t *testing.T) {
	now := time.Now()
	s := discord.NewResumeStore(time.Minute)
	if err := s.UpdateJSON(heartbeatResume(16, 1), 16, 23, 32, now); err != nil {
		t.Fatal(err)
	}
	next := heartbeatResume(16, 2)
	if n := testing.AllocsPerRun(100, func() {
		if err := s.UpdateJSON(next, 16, 23, 32, now); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a heartbeat whose sessions are unchanged allocates %v times", n)
	}
	got := s.Get(16, 23, 32, now)
	if len(got) != 8 || got[7].Seq != 9 || got[0].SessionID != fmt.Sprintf("%032x", 16) {
		t.Errorf("store holds %v", brief(got))
	}
}

func TestUpdateJSONKeepsOwnShardsAndReportsInvalid(t *testing.T) {
	now := time.Now()
	s := discord.NewResumeStore(time.Minute)
	raw := []byte(`[{"shard":0,"session_id":"a","seq":1,"resume_url":"wss://g.example"},` +
		`{"shard":1,"session_id":"b","seq":2,"resume_url":"ftp://g.example"},` +
		`{"shard":2,"session_id":"c","seq":3,"resume_url":"wss://g.example"},` +
		`{"shard":7,"session_id":"d","seq":4,"resume_url":"wss://g.example"}]`)
	err := s.UpdateJSON(raw, 0, 3, 8, now)
	if err == nil || !strings.Contains(err.Error(), "shard 1") {
		t.Errorf("err = %v, want shard 1's resume_url refused", err)
	}
	if got := brief(s.Get(0, 10, 8, now)); strings.Join(got, " ") != "0:a:1 2:c:3" {
		t.Errorf("store holds %v, want shards 0 and 2 (1 invalid, 7 not the cluster's)", got)
	}
	if err := s.UpdateJSON([]byte(`[{"shard":0`), 0, 3, 8, now); err == nil {
		t.Error("a truncated array was accepted")
	}
}

// A cluster's own shard_count is read past, on the fast path too, and the
// manager's (the sender's topology) is what the store keeps.
func TestUpdateJSONStampsShardCount(t *testing.T) {
	now := time.Now()
	s := discord.NewResumeStore(time.Minute)
	raw := []byte(`[{"shard":2,"shard_count":99,"session_id":"a","seq":1,"resume_url":"wss://g.example"}]`)
	if err := s.UpdateJSON(raw, 0, 3, 8, now); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(0, 3, 8, now); len(got) != 1 || got[0].ShardCount != 8 {
		t.Fatalf("stored %+v, want shard_count 8", got)
	}
	if got := s.Get(0, 3, 99, now); len(got) != 0 {
		t.Fatalf("the sender's shard_count was believed: %+v", got)
	}
	next := []byte(`[{"shard":2,"shard_count":99,"session_id":"a","seq":2,"resume_url":"wss://g.example"}]`)
	if n := testing.AllocsPerRun(100, func() {
		if err := s.UpdateJSON(next, 0, 3, 8, now); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a steady report with shard_count allocates %v times", n)
	}
}

// BenchmarkResumeHeartbeat compares a steady heartbeat's resume state (8
// shards, sessions unchanged) through UpdateJSON against encoding/json and
// Update, the path it replaced.
func BenchmarkResumeHeartbeat(b *testing.B) {
	now := time.Now()
	raw := heartbeatResume(0, 1)
	b.Run("encoding-json", func(b *testing.B) {
		s := discord.NewResumeStore(time.Minute)
		b.ReportAllocs()
		for b.Loop() {
			if err := updateModel(s, raw, 0, 7, 8, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("UpdateJSON", func(b *testing.B) {
		s := discord.NewResumeStore(time.Minute)
		b.ReportAllocs()
		for b.Loop() {
			if err := s.UpdateJSON(raw, 0, 7, 8, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
