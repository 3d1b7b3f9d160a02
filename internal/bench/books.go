package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// books is the exact account of one load: every request sent ends in exactly
// one of OK, Errors or Lost, and anything answered twice is a Duplicate.
type books struct {
	Sent uint64 `json:"sent"`
	OK   uint64 `json:"ok"`
	// Errors counts error replies by code, plus the bench's own bad_payload:
	// an echo that came back changed.
	Errors map[string]uint64 `json:"errors"`
	// Lost counts requests with no reply by the end of the drain.
	Lost uint64 `json:"lost"`
	// Duplicates counts replies to a request already answered.
	Duplicates uint64 `json:"duplicates"`
	// Unknown counts replies to no request of this connection (or with no id).
	Unknown uint64 `json:"unknown"`
}

// codeBadPayload is the bench's own error code, beside the protocol's.
const codeBadPayload = "bad_payload"

func (b *books) addError(code string) {
	if b.Errors == nil {
		b.Errors = make(map[string]uint64)
	}
	b.Errors[code]++
}

// ErrorCount is the number of error replies of every code.
func (b *books) ErrorCount() uint64 {
	var n uint64
	for _, c := range b.Errors {
		n += c
	}
	return n
}

// Add adds o's counts to b.
func (b *books) Add(o books) {
	b.Sent += o.Sent
	b.OK += o.OK
	b.Duplicates += o.Duplicates
	b.Lost += o.Lost
	b.Unknown += o.Unknown
	for code, n := range o.Errors {
		if b.Errors == nil {
			b.Errors = make(map[string]uint64)
		}
		b.Errors[code] += n
	}
}

// Broken describes the invariants b breaks ("" when none): the route scenario
// allows no error, no duplicate and no loss at all.
func (b *books) Broken() string {
	why := b.replyFaults()
	for _, code := range slices.Sorted(maps.Keys(b.Errors)) {
		why = append(why, fmt.Sprintf("%d %s", b.Errors[code], code))
	}
	if b.Sent != b.OK+b.ErrorCount()+b.Lost {
		why = append(why, fmt.Sprintf("books do not balance: sent %d != ok %d + errors %d + lost %d", b.Sent, b.OK, b.ErrorCount(), b.Lost))
	}
	return strings.Join(why, ", ")
}

// replyFaults describes what no load may ever see, whatever errors it is
// allowed: lost requests, duplicate replies, replies to unknown ids.
func (b *books) replyFaults() []string {
	var why []string
	if b.Lost > 0 {
		why = append(why, fmt.Sprintf("%d lost", b.Lost))
	}
	if b.Duplicates > 0 {
		why = append(why, fmt.Sprintf("%d duplicate replies", b.Duplicates))
	}
	if b.Unknown > 0 {
		why = append(why, fmt.Sprintf("%d replies to unknown ids", b.Unknown))
	}
	return why
}
