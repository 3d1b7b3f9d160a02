// Package harness is cluster-harness: a cluster process for sm-manager that either
// simulates a sharded bot (shards connecting, heartbeats, gateway dispatches and a
// few business ops, with switches to inject every failure the manager handles) or
// wraps any program that speaks the wire protocol as JSON lines on stdin/stdout.
package harness
