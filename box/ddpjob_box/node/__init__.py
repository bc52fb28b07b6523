"""The local node: plays the kubelet's part for the project's own images, running pods as processes.

Each pod gets its own network namespace on a bridge, its own hostname, a hosts
file with its job's DNS names, and per-pod volume directories. It exists only
for tests and the demo; it is never shipped to clusters.
"""
