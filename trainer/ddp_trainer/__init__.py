"""The DDP training program the trainer image runs: ``python -m ddp_trainer``.

Importing the package does not import torch, so the operator and tests can read the
contract modules (``metric_names``, ``errors``, ``config``) cheaply.
"""
