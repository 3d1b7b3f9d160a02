//go:build race

package main

// raceEnabled builds the binary under test with -race when the tests run so.
const raceEnabled = true
