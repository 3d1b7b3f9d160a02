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
	dst = appendKeyString(dst, `{"op":`, f.Op)
	if f.ID != "" {
		dst = appendKeyString(dst, `,"id":`, f.ID)
	}
	if f.Target != "" {
		dst = appendKeyString(dst, `,"target":`, f.Target)
	}
	if f.TimeoutMS != 0 {
		dst = appendKeyInt(dst, `,"timeout_ms":`, f.TimeoutMS)
	}
	if f.Role != "" {
		dst = appendKeyString(dst, `,"role":`, f.Role)
	}
	if f.Name != "" {
		dst = appendKeyString(dst, `,"name":`, f.Name)
	}
	if f.Cluster != nil {
		dst = appendKeyInt(dst, `,"cluster":`, int64(*f.Cluster))
	}
	if f.Generation != nil {
		dst = appendKeyInt(dst, `,"generation":`, *f.Generation)
	}
	if f.Token != "" {
		dst = appendKeyString(dst, `,"token":`, f.Token)
	}
	if f.PID != 0 {
		dst = appendKeyInt(dst, `,"pid":`, int64(f.PID))
	}
	if f.Ready != nil {
		dst = append(dst, `,"ready":`...)
		dst = strconv.AppendBool(dst, *f.Ready)
	}
	if f.Shard != nil {
		dst = appendKeyInt(dst, `,"shard":`, int64(*f.Shard))
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
		dst = appendKeyInt(dst, `,"max_parallel":`, int64(f.MaxParallel))
	}
	if f.Mode != "" {
		dst = appendKeyString(dst, `,"mode":`, f.Mode)
	}
	if f.Error != nil {
		dst = appendKeyString(dst, `,"error":{"code":`, f.Error.Code)
		dst = appendKeyString(dst, `,"message":`, f.Error.Message)
		dst = append(dst, '}')
	}
	if len(f.Payload) > 0 {
		dst = append(dst, `,"payload":`...)
		dst = appendPayload(dst, f.Payload)
	}
	return append(dst, '}')
}

// appendKeyString appends key (`,"name":`, with what comes before it) and s
// as a JSON string.
func appendKeyString(dst []byte, key, s string) []byte {
	return appendString(append(dst, key...), s)
}

// appendKeyInt appends key and v.
func appendKeyInt(dst []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(dst, key...), v, 10)
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
