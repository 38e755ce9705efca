package main

import (
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func init() {
	components["kube-apiserver"] = func() int { return cli.Run(apiserver.NewAPIServerCommand()) }
}
