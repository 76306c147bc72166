"""Models the train stage trains: the zoo (MLP, CNN with GroupNorm, small transformer), ``hf``
transformers models from a local folder or a config, and plugin ``module:callable`` factories, each
with its task (per-example loss and metric)."""

from dpledger.models.cnn import CNN
from dpledger.models.mlp import MLP
from dpledger.models.select import build_task_model, task_for
from dpledger.models.tasks import TASKS, Task
from dpledger.models.transformer import Transformer
from dpledger.models.zoo import MODELS, build_model, check_model

__all__ = [
    "MODELS",
    "TASKS",
    "Task",
    "build_model",
    "build_task_model",
    "check_model",
    "task_for",
    "MLP",
    "CNN",
    "Transformer",
]
