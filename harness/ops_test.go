package harness

import (
	"encoding/json"
	"testing"

	"github.com/sm-supervisor/sm/ipc"
)

// guildOnShard returns a guild snowflake that Discord puts on shard s of total.
func guildOnShard(s, total int) uint64 {
	return uint64(1000*total+s) << 22
}

func TestGuildInfo(t *testing.T) {
	env := Env{Cluster: 1, Generation: 7, ShardFirst: 4, ShardLast: 6, TotalShards: 8}
	for _, tc := range []struct {
		guild uint64
		want  GuildInfo
	}{
		{guildOnShard(4, 8), GuildInfo{GuildID: "33571209216", Shard: 4, Cluster: 1, Owned: true}},
		{guildOnShard(6, 8), GuildInfo{GuildID: "33579597824", Shard: 6, Cluster: 1, Owned: true}},
		{guildOnShard(7, 8), GuildInfo{GuildID: "33583792128", Shard: 7, Cluster: 1, Owned: false}},
		// A real snowflake: (81384788765712384 >> 22) % 8 == 2.
		{81384788765712384, GuildInfo{GuildID: "81384788765712384", Shard: 2, Cluster: 1, Owned: false}},
	} {
		if got := guildInfo(env, tc.guild); got != tc.want {
			t.Errorf("guildInfo(%d) = %+v, want %+v", tc.guild, got, tc.want)
		}
	}
}

func TestParseGuildID(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    uint64
		ok      bool
	}{
		{`{"guild_id":"81384788765712384"}`, 81384788765712384, true},
		{`{"guild_id": 81384788765712384 }`, 81384788765712384, true}, // exact, not via float64
		{`{"guild_id":"18446744073709551615"}`, 1<<64 - 1, true},
		{`{"guild_id":"-1"}`, 0, false},
		{`{"guild_id":1.5}`, 0, false},
		{`{"guild_id":"abc"}`, 0, false},
		{`{"guild_id":null}`, 0, false},
		{`{}`, 0, false},
		{`[1]`, 0, false},
		{``, 0, false},
	} {
		got, err := parseGuildID(json.RawMessage(tc.payload))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseGuildID(%s) = %d, %v; want %d, ok=%v", tc.payload, got, err, tc.want, tc.ok)
		}
	}
}

func TestAnswer(t *testing.T) {
	env := Env{Cluster: 2, Generation: 9, ShardFirst: 0, ShardLast: 1, TotalShards: 2}
	stats := func() Stats { return Stats{Guilds: 42} }
	for _, tc := range []struct {
		op, payload string
		want        string // reply payload, exact
		code        string
	}{
		{OpPing, ``, `{"pong":true,"cluster":2,"generation":9,"pid":77}`, ""},
		{OpEcho, `{"a": [1, 2]}`, `{"a": [1, 2]}`, ""},
		{OpEcho, ``, `null`, ""},
		{OpGuildInfo, `{"guild_id":"4194304"}`, `{"guild_id":"4194304","shard":1,"cluster":2,"owned":true}`, ""},
		{OpGuildInfo, `{"guild":1}`, ``, CodeBadRequest},
		{"nope", ``, ``, ipc.CodeUnknownOp},
	} {
		payload, perr := answer(env, 77, &ipc.Frame{Op: tc.op, Payload: json.RawMessage(tc.payload)}, stats)
		if string(payload) != tc.want || (perr == nil) != (tc.code == "") || (perr != nil && perr.Code != tc.code) {
			t.Errorf("answer(%s %s) = %s, %v; want %s, code %q", tc.op, tc.payload, payload, perr, tc.want, tc.code)
		}
	}
	payload, _ := answer(env, 77, &ipc.Frame{Op: OpStats}, stats)
	var s Stats
	if err := json.Unmarshal(payload, &s); err != nil || s.Guilds != 42 {
		t.Errorf("stats answer %s: %v", payload, err)
	}
}
