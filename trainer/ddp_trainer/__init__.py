"""The DDP training program the trainer image runs: ``python -m ddp_trainer``.

Importing the package does not import torch, so the operator and tests can read the
modules (``errors``, ``config``) cheaply. The names it shares with the operator (environment,
metric names, exit codes) are in ``ddpjob_contract``.
"""
