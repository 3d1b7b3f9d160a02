// Package grafana holds sm's Grafana dashboard, sm.json, for the metrics
// sm-manager exposes (docs/metrics.md); its test checks every query against
// them. It has no code to import.
package grafana
