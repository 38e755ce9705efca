//go:build !apiserver_only

// The node's and the control plane's components beside the API server: the
// oldest supported release is built with -tags apiserver_only (the
// API-server tier runs on it and kubectl alone).
package main

import (
	"context"

	"k8s.io/component-base/cli"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func init() {
	components["kube-controller-manager"] = func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) }
	components["kube-scheduler"] = func() int { return cli.Run(scheduler.NewSchedulerCommand()) }
	components["kube-proxy"] = func() int { return cli.Run(proxy.NewProxyCommand()) }
	components["kubelet"] = func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) }
}
