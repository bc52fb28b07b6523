//go:build tools

// Package tools pins the commands this module builds (box/ddpjob_box/toolchain.py builds them).
// Prometheus is built with the tags remove_all_sd,enable_kubernetes_sd, so only the kubernetes service
// discovery is compiled in: Debian's package leaves kubernetes_sd_configs out, which the box uses to
// find pods as the chart's PodMonitor does.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "go.etcd.io/etcd/server/v3"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
