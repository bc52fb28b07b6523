"""The box: a real Kubernetes control plane, a local node and Prometheus, for tests and the demo.

Nothing here ships to clusters. Every component is the real one, built from its
published Go module or installed from Debian's packages.
"""
