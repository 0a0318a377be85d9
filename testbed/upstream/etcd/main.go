// Command etcd is the etcd server of the real-Kubernetes test tier: etcd's own entry point, built from its server
// module at the release go.mod pins (testbed/upstream/build.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
