package mesh

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// viewKey is what the agent's view says about who runs what: every host's
// id, boot, capacity and clusters, and every lease's holder, in a form two
// views can be compared by. It leaves out the store times, which change at
// every renewal, so that it changes only when the fleet does.
func (a *Agent) viewKey() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	for _, h := range a.hosts {
		b.WriteString(h.Host + "/" + h.Boot + "/" + strconv.Itoa(h.Capacity) + "/")
		for _, c := range h.Clusters {
			b.WriteString(strconv.Itoa(c) + ",")
		}
		b.WriteByte(';')
	}
	b.WriteByte('|')
	for _, c := range slices.Sorted(maps.Keys(a.leases)) {
		if l := a.leases[c]; !l.Gone {
			b.WriteString(strconv.Itoa(c) + "=" + l.Holder.String() + ";")
		}
	}
	b.WriteByte('|')
	for _, c := range slices.Sorted(maps.Keys(a.held)) {
		b.WriteString(strconv.Itoa(c) + ",")
	}
	return b.String()
}

// noteView calls Viewed if the view changed since the last call.
func (a *Agent) noteView(last *string) {
	if a.Viewed == nil {
		return
	}
	if k := a.viewKey(); k != *last {
		*last = k
		a.Viewed()
	}
}
