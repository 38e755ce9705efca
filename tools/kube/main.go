// Command kube is the Kubernetes components zkgate's tests run, in one
// binary so that the cluster links once instead of six times. It runs one
// component per process (feature gates and metrics registries are global),
// chosen by the name it was called by (a link kube-apiserver -> kube) or by
// its first argument (kube kube-apiserver --flags...).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as the components' own mains

	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// Each component's main, returning its exit code; filled in by the files
// of the components this build holds (apiserver.go, node.go).
var components = map[string]func() int{}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Called as kube COMPONENT ARGS...: the component sees itself as argv[0].
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [flags], or call it by a component's name; components: %v\n", names)
		os.Exit(2)
	}
	os.Exit(run())
}
