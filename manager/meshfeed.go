package manager

import (
	"encoding/json"
	"slices"
	"time"
)

// The mesh in the state feed: a "hosts" event when the mesh's hosts change
// (one joins or leaves, its capacity or its clusters change), and a
// "cluster" event for a cluster whose holder changed, wherever it runs. The
// agent says when its view changed (mesh.Agent.Viewed); the loop compares
// with what it last published, so a renewal alone publishes nothing.

// meshViewed is the agent's news, posted at most once until the loop takes it.
func (m *Manager) meshViewed() {
	if m.mesh.viewPosted.CompareAndSwap(false, true) {
		go m.post(evMeshView{})
	}
}

// meshView compares the agent's view with what the feed last published:
// changed hosts are published by flushFeed, changed holders as cluster events.
func (m *Manager) meshView() {
	ms := m.mesh
	ms.viewPosted.Store(false)
	hosts := m.meshHosts(time.Now())
	key := make([]HostStatus, len(hosts))
	for i, h := range hosts {
		h.LeaseAgeMS = 0
		key[i] = h
	}
	if b, _ := json.Marshal(key); string(b) != ms.hostsKey {
		ms.hostsKey, ms.hostsDirty = string(b), true
	}
	if ms.owners == nil {
		ms.owners = map[int]string{}
	}
	for _, s := range m.table().slots {
		if o := m.meshOwner(s.id); ms.owners[s.id] != o {
			ms.owners[s.id] = o
			m.touch(s)
		}
	}
}

// flushHosts publishes the hosts event if the hosts changed.
func (m *Manager) flushHosts() {
	if m.mesh == nil || !m.mesh.hostsDirty {
		return
	}
	m.mesh.hostsDirty = false
	hosts := m.meshHosts(time.Now())
	b, _ := json.Marshal(struct {
		Type  string       `json:"type"`
		Hosts []HostStatus `json:"hosts"`
	}{EventHosts, slices.Clip(hosts)})
	m.feed.publish(b)
}
