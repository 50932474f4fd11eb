// Package deploy holds what an operator deploys next to gpuhost: the
// Prometheus scrape config, recording and alert rules (deploy/prometheus,
// unit-tested with promtool by make test) and the Grafana dashboard for many
// boxes (deploy/grafana). It has no code; its test parses every PromQL
// expression in those files and checks that each metric they name is one
// the daemon exports.
package deploy
