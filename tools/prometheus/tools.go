//go:build tools

// Prometheus for the box, built from the module proxy: Debian's package leaves out kubernetes_sd_configs,
// which the box uses to find pods as the chart's PodMonitor does. Built with the tags
// remove_all_sd,enable_kubernetes_sd, so only the kubernetes service discovery is compiled in.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
