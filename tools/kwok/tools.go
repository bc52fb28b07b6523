//go:build tools

// Package tools pins the commands this module builds: KWOK's controller, which the box's --simulated-nodes runs
// against its apiserver (ddpjob_box.kwok).
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
