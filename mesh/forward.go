package mesh

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Cross-host routing's wire format (docs/multihost.md). A manager listens on
// ReqSubject for requests other hosts forward to the clusters it runs, and on
// its ReplySubject, one per boot, for the answers to those it forwarded. One
// NATS message carries a batch: a header naming the sender's boot, then
// records, one per forwarded frame, until the end of the message. Payloads
// are carried as they came, byte for byte.
//
//	message  = magic kind str(host) str(boot) record*
//	request  = uvarint(id) flags uvarint(cluster) uvarint(deadline µs) str(op) str(target) str(payload)
//	reply    = uvarint(id) status (status ok: str(payload); error: str(code) str(message); moved: nothing)
//	str      = uvarint(length) bytes
//
// A request's id is 0 when its sender wants no reply (a frame with no id).

// ReqSubject is the subject host listens on for requests forwarded to it.
func ReqSubject(name, host string) string { return name + ".req." + host }

// ReplySubject is the subject boot h listens on for the replies to what it
// forwarded: per boot, so a previous boot's late replies never reach it.
func ReplySubject(name string, h Holder) string { return name + ".rep." + h.Host + "." + h.Boot }

const magic = "smf1"

// Kinds of message.
const (
	KindRequests byte = 'Q'
	KindReplies  byte = 'R'
)

// FlagPart marks a request that is one cluster's part of a "*" broadcast: a
// cluster with no ready process answers unavailable at once, as at home.
const FlagPart byte = 1

// Request is one forwarded frame. Its byte fields are views into the
// message it was read from.
type Request struct {
	ID       uint64 // 0: no reply wanted
	Flags    byte
	Cluster  int
	Deadline uint64 // microseconds left when it was sent
	Op       []byte
	Target   []byte
	Payload  []byte
}

// Status of a reply.
const (
	StatusOK    byte = 0
	StatusError byte = 1
	// StatusMoved: the cluster is not on the answering host any more; the
	// request was not run.
	StatusMoved byte = 2
)

// Reply is the answer to one Request. Its byte fields are views into the
// message it was read from.
type Reply struct {
	ID      uint64
	Status  byte
	Payload []byte
	Code    []byte
	Message []byte
}

// AppendHeader starts a message of kind from boot h.
func AppendHeader(b []byte, kind byte, h Holder) []byte {
	b = append(b, magic...)
	b = append(b, kind)
	b = appendStr(b, h.Host)
	return appendStr(b, h.Boot)
}

// AppendRequest adds one request to a message.
func AppendRequest(b []byte, r Request) []byte {
	b = binary.AppendUvarint(b, r.ID)
	b = append(b, r.Flags)
	b = binary.AppendUvarint(b, uint64(r.Cluster))
	b = binary.AppendUvarint(b, r.Deadline)
	b = appendBytes(b, r.Op)
	b = appendBytes(b, r.Target)
	return appendBytes(b, r.Payload)
}

// AppendReply adds one reply to a message.
func AppendReply(b []byte, r Reply) []byte {
	b = binary.AppendUvarint(b, r.ID)
	b = append(b, r.Status)
	switch r.Status {
	case StatusOK:
		b = appendBytes(b, r.Payload)
	case StatusError:
		b = appendBytes(b, r.Code)
		b = appendBytes(b, r.Message)
	}
	return b
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrFormat is matched (errors.Is) by the parsers' errors: the message is
// not one of ours, or is cut short.
var ErrFormat = errors.New("not a forwarded-frame message")

// ParseHeader reads a message's header: its kind, the sending boot, and the
// records that follow.
func ParseHeader(b []byte) (kind byte, from Holder, rest []byte, err error) {
	if len(b) < len(magic)+1 || string(b[:len(magic)]) != magic {
		return 0, Holder{}, nil, ErrFormat
	}
	kind, b = b[len(magic)], b[len(magic)+1:]
	if kind != KindRequests && kind != KindReplies {
		return 0, Holder{}, nil, fmt.Errorf("%w: kind %q", ErrFormat, kind)
	}
	var host, boot []byte
	if host, b, err = readBytes(b); err != nil {
		return 0, Holder{}, nil, err
	}
	if boot, b, err = readBytes(b); err != nil {
		return 0, Holder{}, nil, err
	}
	if len(host) == 0 || len(boot) == 0 {
		return 0, Holder{}, nil, fmt.Errorf("%w: no host or boot", ErrFormat)
	}
	return kind, Holder{Host: string(host), Boot: string(boot)}, b, nil
}

// NextRequest reads the request at the head of b.
func NextRequest(b []byte) (Request, []byte, error) {
	var r Request
	var err error
	var cl uint64
	if r.ID, b, err = readUvarint(b); err != nil {
		return r, nil, err
	}
	if len(b) == 0 {
		return r, nil, ErrFormat
	}
	r.Flags, b = b[0], b[1:]
	if cl, b, err = readUvarint(b); err != nil {
		return r, nil, err
	}
	if cl > 1<<31 {
		return r, nil, fmt.Errorf("%w: cluster %d", ErrFormat, cl)
	}
	r.Cluster = int(cl)
	if r.Deadline, b, err = readUvarint(b); err != nil {
		return r, nil, err
	}
	if r.Op, b, err = readBytes(b); err != nil {
		return r, nil, err
	}
	if r.Target, b, err = readBytes(b); err != nil {
		return r, nil, err
	}
	if r.Payload, b, err = readBytes(b); err != nil {
		return r, nil, err
	}
	return r, b, nil
}

// NextReply reads the reply at the head of b.
func NextReply(b []byte) (Reply, []byte, error) {
	var r Reply
	var err error
	if r.ID, b, err = readUvarint(b); err != nil {
		return r, nil, err
	}
	if len(b) == 0 {
		return r, nil, ErrFormat
	}
	r.Status, b = b[0], b[1:]
	switch r.Status {
	case StatusOK:
		r.Payload, b, err = readBytes(b)
	case StatusError:
		if r.Code, b, err = readBytes(b); err == nil {
			r.Message, b, err = readBytes(b)
		}
	case StatusMoved:
	default:
		err = fmt.Errorf("%w: status %d", ErrFormat, r.Status)
	}
	if err != nil {
		return r, nil, err
	}
	return r, b, nil
}

func readUvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, nil, ErrFormat
	}
	return v, b[n:], nil
}

func readBytes(b []byte) ([]byte, []byte, error) {
	n, b, err := readUvarint(b)
	if err != nil {
		return nil, nil, err
	}
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: a field runs past the end", ErrFormat)
	}
	return b[:n:n], b[n:], nil
}
