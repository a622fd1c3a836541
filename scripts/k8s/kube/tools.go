//go:build tools

// Package tools keeps Kubernetes' three control-plane commands in this module's graph, so that
// go.mod and go.sum pin everything `go build k8s.io/kubernetes/cmd/<name>` needs. It is never
// compiled (the tools build tag); scripts/k8s.sh builds the commands themselves.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
