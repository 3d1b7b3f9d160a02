// Package ipc is sm's wire protocol v1: NDJSON frames over a Unix stream socket,
// the framed connection both ends use, and a Go client for clusters and tools.
package ipc

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Structural ops: the only ones the manager acts on. Every other op is a business
// op and is forwarded by target without reading its payload.
const (
	OpRegister  = "REGISTER"
	OpHeartbeat = "HEARTBEAT"
	OpQuiesce   = "QUIESCE"
	OpQuiesced  = "QUIESCED"
	OpDeploy    = "DEPLOY"
)

// Other protocol ops: replies, manager → cluster notifications, and the
// read-only state queries (v1 additions that change nothing).
const (
	OpReply    = "REPLY"
	OpActivate = "ACTIVATE"
	OpStatus   = "STATUS" // client → manager: reply payload is the status snapshot
	OpWatch    = "WATCH"  // client → manager: reply, then EVENT frames of the state feed
	OpEvent    = "EVENT"  // manager → client: one state-feed event as payload
	// OpIdentify asks the manager's identify gate for a slot (cluster → manager).
	OpIdentify = "IDENTIFY"
	// OpIdentifyCancel withdraws the sender's waiting IDENTIFYs for a shard
	// (cluster → manager); each is answered CodeCancelled.
	OpIdentifyCancel = "IDENTIFY_CANCEL"
)

// Roles a connection may REGISTER as.
const (
	RoleCluster = "cluster"
	RoleClient  = "client"
)

// Target forms for business ops besides a plain cluster id.
const (
	TargetAll         = "*"
	TargetGuildPrefix = "guild:"
	TargetShardPrefix = "shard:"
)

// Frame is one protocol message. Only Op is required; which other fields matter
// depends on the op. Payload is kept as raw bytes so it is forwarded unchanged.
type Frame struct {
	Op      string          `json:"op"`
	ID      string          `json:"id,omitempty"`
	Target  string          `json:"target,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Error          `json:"error,omitempty"`
	// TimeoutMS, on a request, shortens the manager's request deadline for it
	// (a v1 addition; the manager's requests.timeout is the ceiling).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`

	// REGISTER fields.
	Role       string `json:"role,omitempty"`
	Name       string `json:"name,omitempty"`
	Cluster    *int   `json:"cluster,omitempty"`
	Generation *int64 `json:"generation,omitempty"`
	Token      string `json:"token,omitempty"`
	PID        int    `json:"pid,omitempty"`

	// HEARTBEAT field: all of the sender's shards are connected.
	Ready *bool `json:"ready,omitempty"`
	// Resume, on HEARTBEAT and QUIESCED (v1 addition): the cluster's shards'
	// resume state, a JSON array of {shard, session_id, seq, resume_url}.
	Resume json.RawMessage `json:"resume,omitempty"`
	// Handoff, on QUIESCED and ACTIVATE (v1 addition): a JSON object, opaque
	// to the manager, that the quiesced process leaves for its cluster's
	// next ACTIVATE (what it handled, so its successor replays the rest).
	Handoff json.RawMessage `json:"handoff,omitempty"`

	// IDENTIFY and IDENTIFY_CANCEL field (v1 addition): the shard that wants
	// to identify, or no longer does.
	Shard *int `json:"shard,omitempty"`

	// DEPLOY fields. Mode (v1 addition) is "overlap", the default, or
	// "resume" (docs/deploys.md#resume-handoff-deploys).
	Clusters    []int  `json:"clusters,omitempty"`
	MaxParallel int    `json:"max_parallel,omitempty"`
	Mode        string `json:"mode,omitempty"`
}

// Stable error codes carried in Error.Code. Clients switch on these, so they never change.
const (
	CodeBadFrame         = "bad_frame"
	CodeFrameTooLarge    = "frame_too_large"
	CodeUnknownTarget    = "unknown_target"
	CodeUnavailable      = "unavailable"
	CodeTimeout          = "timeout"
	CodeBusy             = "busy"
	CodeForbidden        = "forbidden"
	CodeDeployInProgress = "deploy_in_progress"
	CodeNotRegistered    = "not_registered"
	CodeUnknownID        = "unknown_id"
	CodeUnknownOp        = "unknown_op"
	CodeBadConfig        = "bad_config"
	CodeShuttingDown     = "shutting_down"
	CodeInternal         = "internal"
	// CodeBudgetRefused: the session-start budget governor refused an
	// IDENTIFY (docs/discord.md); forbidden stays for who may ask.
	CodeBudgetRefused = "budget_refused"
	// CodeCancelled answers an IDENTIFY withdrawn by IDENTIFY_CANCEL.
	CodeCancelled = "cancelled"
)

// Error is the error object of a REPLY. It implements error so a Go caller can
// errors.As a failed request into it and switch on Code.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error is the message, or the code if there is none.
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Broadcast is the payload of the REPLY to a request for TargetAll: one
// result per cluster, in cluster order.
type Broadcast struct {
	Results []BroadcastResult `json:"results"`
}

// BroadcastResult is one cluster's part of a Broadcast: the payload its
// process answered, or the error it (or the manager, for it) did.
type BroadcastResult struct {
	Cluster int             `json:"cluster"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Errorf builds an *Error with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the protocol code of err: the Code of an *Error in its chain,
// CodeTimeout for deadline errors, and CodeInternal otherwise.
func CodeOf(err error) string {
	var pe *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pe):
		return pe.Code
	case errors.Is(err, ErrTimeout):
		return CodeTimeout
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed):
		return CodeUnavailable
	default:
		return CodeInternal
	}
}

// Decode parses one frame. It rejects frames that are not a JSON object or have
// no op, and frames nested deeper than MaxDepthLimit; unknown fields are
// ignored, as the protocol requires. When the frame is a JSON object but still
// refused (no op, a field of the wrong type, too deep) the error comes with
// the fields that did decode, so the caller can reply to its id.
func Decode(b []byte) (*Frame, error) { return (*Decoder)(nil).Decode(b) }

// A Decoder decodes the frames of one connection, as Decode does. It keeps the
// last business op and target it read and hands out the same strings while
// they repeat, as they do on a busy connection (the same op to the same
// cluster), sparing an allocation each. Not safe for concurrent use; the zero
// value is ready, and a nil *Decoder keeps nothing.
type Decoder struct {
	// MaxDepth is how deep a frame may nest (its own object is level 1): a
	// deeper one is refused with bad_frame, and the error comes with its id
	// and op, read from its top level. Zero, or more than MaxDepthLimit, is
	// MaxDepthLimit.
	MaxDepth int

	op, target string
	reply      Frame // DecodeReply's, reused
}

// replyPrefix is how AppendFrame (and so every Go peer) starts a REPLY.
const replyPrefix = `{"op":"` + OpReply + `"`

// DecodeReply decodes b if it is a REPLY in the form peers send in practice
// (op first, no error object, no escapes), into a Frame of the Decoder's own
// whose Payload is a view into b: the frame is reused by the next call and the
// payload is valid only as long as b. It reports false, having decoded
// nothing, for any other frame, which the caller then gives to Decode. It is
// for a relay that hands a reply on at once — the manager answering a
// forwarded request — and spares it two allocations per reply, the frame and
// a copy of the payload. FuzzDecodeReply checks it against Decode.
func (d *Decoder) DecodeReply(b []byte) (*Frame, bool) {
	if len(b) < len(replyPrefix) || string(b[:len(replyPrefix)]) != replyPrefix {
		return nil, false
	}
	d.reply = Frame{}
	if !decodeFastInto(&d.reply, b, d, true) || d.fastTooDeep(b) {
		return nil, false
	}
	return &d.reply, true
}

// Decode parses one frame; see the package function Decode.
func (d *Decoder) Decode(b []byte) (*Frame, error) {
	f, ok := decodeFast(b, d)
	if !ok || d.fastTooDeep(b) {
		if max := d.maxDepth(); tooDeep(b, max) {
			return shallowFields(b), Errorf(CodeBadFrame, "frame nested deeper than %d levels", max)
		}
		var err error
		if f, err = decodeJSON(b); err != nil {
			return f, err
		}
	}
	if f.Op == "" {
		return f, Errorf(CodeBadFrame, "frame has no op")
	}
	return f, nil
}

// fastTooDeep reports whether a frame the fast path took nests deeper than
// d's limit, which it can only if the limit is below what the fast path
// follows.
func (d *Decoder) fastTooDeep(b []byte) bool {
	max := d.maxDepth()
	return max < fastDepth && tooDeep(b, max)
}

// decodeJSON is Decode's general path, encoding/json, for every frame
// decodeFast does not take. On error the frame is nil, or holds the fields
// that did decode.
func decodeJSON(b []byte) (*Frame, error) {
	f := new(Frame)
	if err := json.Unmarshal(b, f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			// An object with a mistyped field: the rest of it did decode.
			return f, Errorf(CodeBadFrame, "bad frame: %v", err)
		}
		return nil, Errorf(CodeBadFrame, "not a JSON frame: %v", err)
	}
	return f, nil
}

// Reply builds the REPLY to request id with a payload.
func Reply(id string, payload json.RawMessage) *Frame {
	return &Frame{Op: OpReply, ID: id, Payload: payload}
}

// ReplyError builds the REPLY to request id carrying err.
func ReplyError(id string, err *Error) *Frame {
	return &Frame{Op: OpReply, ID: id, Error: err}
}

// Int returns a pointer to v, for the optional integer fields of Frame.
func Int(v int) *int { return &v }

// Int64 returns a pointer to v, for Frame.Generation.
func Int64(v int64) *int64 { return &v }

// Bool returns a pointer to v, for Frame.Ready.
func Bool(v bool) *bool { return &v }
