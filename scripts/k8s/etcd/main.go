// Command etcd is upstream's etcd server (go.etcd.io/etcd/server/v3/etcdmain), built from Go
// modules by scripts/k8s.sh: go.mod pins the version (MLOPS_GPU_ETCD_VERSION's default), go.sum
// every module it needs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
