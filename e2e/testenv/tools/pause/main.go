// The sandbox ("pause") container of the real node's pods: it holds the pod's namespaces open,
// reaps the zombies of processes that share its PID namespace, and exits on SIGINT or SIGTERM
// when the kubelet stops the pod. Our own, because no image can be pulled on the test machine.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
