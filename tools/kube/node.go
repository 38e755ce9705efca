//go:build !apiserver_only

// The components beside the API server: the oldest supported release is
// built with -tags apiserver_only (the API-server tier runs on it alone).
package main

import (
	"context"
	"os"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
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
	components["kubectl"] = func() int {
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	}
}
