package manager

import (
	"context"
	"sync"
)

// SpecCount is the number of generation commands m keeps, read on its loop.
func SpecCount(m *Manager) int {
	n, _ := ask(m, context.Background(), func(res chan<- int) event {
		return evFunc(func(m *Manager) { res <- len(m.specs) })
	})
	return n
}

// WedgeLoop blocks m's event loop until release is called: a loop that is
// stuck while the rest of the manager (its mesh agent, its readers) runs.
func WedgeLoop(m *Manager) (release func()) {
	unblock, wedged := make(chan struct{}), make(chan struct{})
	m.post(evFunc(func(*Manager) { close(wedged); <-unblock }))
	<-wedged
	var once sync.Once
	return func() { once.Do(func() { close(unblock) }) }
}
