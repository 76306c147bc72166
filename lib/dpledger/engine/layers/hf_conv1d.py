"""transformers' ``Conv1D`` (GPT-2's attention and MLP projections): a Linear with a transposed
weight.

s = a W + b with W of shape (d, p), so example i's weight gradient is a_iᵀ b_i (d × p), the
transpose of nn.Linear's: the same ghost norm, and book-keeping with the factors applied the same
way (the Linear rule with its layout switch). Registered by name, so the engine does not import
``transformers``.
"""

from __future__ import annotations

from dpledger.engine.layers.linear import sequence_rule
from dpledger.engine.layers.registry import register_by_name

RULE = register_by_name("transformers.pytorch_utils.Conv1D", rule=sequence_rule(transposed=True))
