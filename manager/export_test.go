package manager

import "context"

// SpecCount is the number of generation commands m keeps, read on its loop.
func SpecCount(m *Manager) int {
	n, _ := ask(m, context.Background(), func(res chan<- int) event {
		return evFunc(func(m *Manager) { res <- len(m.specs) })
	})
	return n
}
