"""Debugging tests for DP-SGD implementations (paper 000 and beyond), run against any trainer.

``run_battery(trainer, trainer_name=...)`` runs every test; ``load_trainer`` and ``CommandTrainer``
build trainers from the protocol of :mod:`dpledger.verify.protocol`.
"""

from dpledger.verify.battery import run_battery
from dpledger.verify.protocol import CommandTrainer, load_trainer

__all__ = ["run_battery", "load_trainer", "CommandTrainer"]
