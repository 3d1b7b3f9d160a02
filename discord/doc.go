// Package discord holds what sm knows about Discord's gateway limits: a client
// for GET /gateway/bot (recommended shard count and the session-start budget),
// the identify gate that spaces IDENTIFYs per rate-limit bucket across every
// cluster and generation, the budget governor that stops crash loops from
// spending the daily session starts, and the store of resume state that lets a
// replacement process RESUME instead of identifying.
//
// Everything but GatewayClient and LoadToken is pure: no goroutines, no I/O,
// time passed in. Gate, Budget and ResumeStore are not safe for concurrent use;
// they are meant to be owned by the manager's single event loop.
package discord
