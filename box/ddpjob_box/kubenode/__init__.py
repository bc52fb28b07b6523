"""A real node for the box: kubelet, containerd, runc and a CNI bridge."""
