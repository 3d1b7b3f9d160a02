// Package mesh lets several sm-manager hosts share one bot's clusters through
// NATS JetStream: a connection with the configured credentials, the host
// records and cluster leases kept in JetStream key-value buckets, and, as pure
// code with the clock injected, where clusters go (Place), what a host does
// about each lease (Decide) and when a holder that could not renew must stop
// its process (Timing). docs/multihost.md is the design.
package mesh
