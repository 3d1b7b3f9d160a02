package ipc

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// AppendFrame appends f as one compact JSON object (without the trailing newline)
// to dst. It is written by hand rather than with encoding/json for two reasons:
// the payload must go out byte for byte as it came in (json.Marshal re-compacts a
// RawMessage), and it is on the hot path of every forwarded request.
func AppendFrame(dst []byte, f *Frame) []byte {
	dst = append(dst, `{"op":`...)
	dst = appendString(dst, f.Op)
	if f.ID != "" {
		dst = append(dst, `,"id":`...)
		dst = appendString(dst, f.ID)
	}
	if f.Target != "" {
		dst = append(dst, `,"target":`...)
		dst = appendString(dst, f.Target)
	}
	if f.TimeoutMS != 0 {
		dst = append(dst, `,"timeout_ms":`...)
		dst = strconv.AppendInt(dst, f.TimeoutMS, 10)
	}
	if f.Role != "" {
		dst = append(dst, `,"role":`...)
		dst = appendString(dst, f.Role)
	}
	if f.Name != "" {
		dst = append(dst, `,"name":`...)
		dst = appendString(dst, f.Name)
	}
	if f.Cluster != nil {
		dst = append(dst, `,"cluster":`...)
		dst = strconv.AppendInt(dst, int64(*f.Cluster), 10)
	}
	if f.Generation != nil {
		dst = append(dst, `,"generation":`...)
		dst = strconv.AppendInt(dst, *f.Generation, 10)
	}
	if f.Token != "" {
		dst = append(dst, `,"token":`...)
		dst = appendString(dst, f.Token)
	}
	if f.PID != 0 {
		dst = append(dst, `,"pid":`...)
		dst = strconv.AppendInt(dst, int64(f.PID), 10)
	}
	if f.Ready != nil {
		dst = append(dst, `,"ready":`...)
		dst = strconv.AppendBool(dst, *f.Ready)
	}
	if f.Shard != nil {
		dst = append(dst, `,"shard":`...)
		dst = strconv.AppendInt(dst, int64(*f.Shard), 10)
	}
	if len(f.Resume) > 0 {
		dst = append(dst, `,"resume":`...)
		dst = appendPayload(dst, f.Resume)
	}
	if len(f.Handoff) > 0 {
		dst = append(dst, `,"handoff":`...)
		dst = appendPayload(dst, f.Handoff)
	}
	if len(f.Clusters) > 0 {
		dst = append(dst, `,"clusters":[`...)
		for i, c := range f.Clusters {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(c), 10)
		}
		dst = append(dst, ']')
	}
	if f.MaxParallel != 0 {
		dst = append(dst, `,"max_parallel":`...)
		dst = strconv.AppendInt(dst, int64(f.MaxParallel), 10)
	}
	if f.Error != nil {
		dst = append(dst, `,"error":{"code":`...)
		dst = appendString(dst, f.Error.Code)
		dst = append(dst, `,"message":`...)
		dst = appendString(dst, f.Error.Message)
		dst = append(dst, '}')
	}
	if len(f.Payload) > 0 {
		dst = append(dst, `,"payload":`...)
		dst = appendPayload(dst, f.Payload)
	}
	return append(dst, '}')
}

// appendPayload appends p unchanged, except that newlines become spaces. A raw
// newline in JSON can only be whitespace between tokens, so this keeps the value,
// and it keeps a payload a Go caller built with MarshalIndent from splitting the
// frame in two. Payloads read off the wire hold no newline and pass byte for byte.
func appendPayload(dst, p []byte) []byte {
	if bytes.IndexByte(p, '\n') < 0 {
		return append(dst, p...)
	}
	start := len(dst)
	dst = append(dst, p...)
	for i, b := range dst[start:] {
		if b == '\n' {
			dst[start+i] = ' '
		}
	}
	return dst
}

// Encode returns f as a compact JSON object without the trailing newline.
func Encode(f *Frame) []byte { return AppendFrame(make([]byte, 0, 128+len(f.Payload)), f) }

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does, so the output is always valid JSON.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but break JavaScript consumers of the feed.
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
