// Builds CoreDNS with only the plugins the box's cluster DNS uses, so the cold build compiles
// the kubernetes plugin and a few small ones instead of every cloud provider's SDK.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which plugins handle a query: CoreDNS's own order (plugin.cfg), restricted to those above.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes", "forward"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
