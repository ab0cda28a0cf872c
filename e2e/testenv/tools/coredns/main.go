// Cluster DNS for the test control plane's real node: CoreDNS with only the plugins a cluster's
// DNS needs (Service and Pod names from the API server, forwarding the rest, caching, health and
// readiness), so its build stays short. The plugin set is chosen by the imports below: CoreDNS
// registers a plugin when its package is imported, as its own main does with all of them.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
