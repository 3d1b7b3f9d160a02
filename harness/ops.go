package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/sm-supervisor/sm/ipc"
)

// Business ops the simulated bot answers.
const (
	OpPing      = "ping"       // → {"pong":true,"cluster":N,"generation":G,"pid":P}
	OpEcho      = "echo"       // → the request's payload, byte for byte (null if none)
	OpStats     = "stats"      // → Stats, as in the heartbeat
	OpGuildInfo = "guild.info" // {"guild_id":"<snowflake>"} → GuildInfo
	// OpSimGrow {"bytes":N} allocates N more bytes and touches every page, so
	// that the process's RSS and heap really grow; {"bytes":0} lets go of all
	// of it. → {"ballast_bytes":total}
	OpSimGrow = "sim.grow"
	// OpSimLag {"ms":N} makes the bot report N ms of event-loop lag in its
	// heartbeats (loop_lag_ms) from now on; 0 stops. → {"loop_lag_ms":N}
	OpSimLag = "sim.lag"
)

// maxGrowBytes bounds one sim.grow: a typo must not take the machine's memory.
const maxGrowBytes = 1 << 30

// CodeBadRequest is the error code of a business op whose payload the simulated
// bot cannot use. It is the bot's own code, not one of the protocol's.
const CodeBadRequest = "bad_request"

// Pong is the answer to ping.
type Pong struct {
	Pong       bool  `json:"pong"`
	Cluster    int   `json:"cluster"`
	Generation int64 `json:"generation"`
	PID        int   `json:"pid"`
}

// GuildInfo is the answer to guild.info: the guild's shard by Discord's formula
// and whether this cluster holds that shard.
type GuildInfo struct {
	GuildID string `json:"guild_id"`
	Shard   int    `json:"shard"`
	Cluster int    `json:"cluster"`
	Owned   bool   `json:"owned"`
}

// guildInfo answers guild.info for guild on a cluster of env.
func guildInfo(env Env, guild uint64) GuildInfo {
	shard := env.Topology().ShardOfGuild(guild)
	return GuildInfo{
		GuildID: strconv.FormatUint(guild, 10),
		Shard:   shard,
		Cluster: env.Cluster,
		Owned:   env.Owns(shard),
	}
}

// parseGuildID reads guild_id from a guild.info payload: a snowflake as a string,
// as Discord sends it, or as a JSON number.
func parseGuildID(payload json.RawMessage) (uint64, error) {
	var req struct {
		GuildID json.RawMessage `json:"guild_id"`
	}
	if len(payload) == 0 {
		return 0, errors.New("payload must be {\"guild_id\":\"<snowflake>\"}")
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		return 0, fmt.Errorf("payload must be {\"guild_id\":\"<snowflake>\"}: %w", err)
	}
	raw := bytes.TrimSpace(req.GuildID)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("guild_id is missing")
	}
	text := string(raw)
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, fmt.Errorf("guild_id: %w", err)
		}
	}
	id, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("guild_id %s is not a snowflake", raw)
	}
	return id, nil
}

// answer handles one business op for the simulated bot: the reply payload, or
// the error to reply with. stats is called only for the stats op.
func answer(env Env, pid int, f *ipc.Frame, stats func() Stats) (json.RawMessage, *ipc.Error) {
	switch f.Op {
	case OpPing:
		return marshal(Pong{Pong: true, Cluster: env.Cluster, Generation: env.Generation, PID: pid})
	case OpEcho:
		if len(f.Payload) == 0 {
			return json.RawMessage("null"), nil
		}
		return f.Payload, nil
	case OpStats:
		return marshal(stats())
	case OpGuildInfo:
		id, err := parseGuildID(f.Payload)
		if err != nil {
			return nil, ipc.Errorf(CodeBadRequest, "guild.info: %v", err)
		}
		return marshal(guildInfo(env, id))
	default:
		return nil, ipc.Errorf(ipc.CodeUnknownOp, "cluster-harness does not know op %q", f.Op)
	}
}

func marshal(v any) (json.RawMessage, *ipc.Error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, ipc.Errorf(ipc.CodeInternal, "encode reply: %v", err)
	}
	return b, nil
}
