"""The names the operator, the trainer, the dashboards and the chart agree on, written down once.

Torch-free and Kubernetes-free: plain constants and enums, so that each side imports them without
importing the others. ``pods``: labels, the annotation and the environment of every pod;
``metrics``: what every rank exports; ``status``: phases, condition types and reasons;
``exits``: what a trainer's exit code means.
"""
