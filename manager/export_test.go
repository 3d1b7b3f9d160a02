package manager

// SpecCount is the number of generation commands m keeps, read on its loop.
func SpecCount(m *Manager) int {
	res := make(chan int, 1)
	m.post(evFunc(func(m *Manager) { res <- len(m.specs) }))
	return <-res
}
