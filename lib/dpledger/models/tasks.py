"""Tasks: how a model is called on a batch, its per-example loss (what the engine clips), and its
metric.

Calling convention (the same for ``hf`` and plugin models): text batches (int64 token ids, padding
:data:`dpledger.data.text.PAD`) are passed as ``model(input_ids=..., attention_mask=...)``, the
padding as the model's ``config.pad_token_id`` (0 without one), with ``use_cache=False`` where the
model's forward names that argument (no key/value or state cache is kept: a state-space mixer such
as Jamba's writes into one during training, which a per-example re-run cannot split); images as
``model(pixel_values=x)`` for ``hf`` models and ``model(x)`` otherwise. An output with ``.logits``
(as transformers returns) is read through it.

Per-example losses:

- ``classification`` / ``sequence-classification``: cross-entropy of the example's logits.
- ``causal-lm``: the **mean** next-token cross-entropy over the sequence's real (unpadded) targets.
  Clipping bounds each example's gradient, so a per-sequence sum would grow with the sequence's
  length and be clipped more for long texts; the mean keeps the gradient scale, hence the effect of
  a given clip norm, independent of length, and matches what the perplexity averages.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpledger.data.text import PAD

TASKS = ("classification", "causal-lm", "sequence-classification")
EVAL_CHUNK = 64


@functools.cache
def takes_use_cache(cls: type) -> bool:
    """Whether ``cls.forward`` names a ``use_cache`` argument (transformers' decoders do)."""
    forward = getattr(cls, "forward", None)
    try:
        return forward is not None and "use_cache" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode, then every module back in the mode it had: not ``model.train()``,
    which would put a frozen BatchNorm the user keeps in eval mode back in training mode, where
    the engine refuses it mid-run."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@dataclass(frozen=True)
class Task:
    """A task bound to a calling convention (``keyword_images``: hf image models take
    ``pixel_values=``)."""

    name: str
    keyword_images: bool = False

    def logits(self, model: nn.Module, x: Tensor) -> Tensor:
        """The model's logits on batch ``x`` (see the module docstring for how it is called)."""
        if x.dtype == torch.int64:
            output = model(
                input_ids=x.masked_fill(x == PAD, pad_token_id(model)),
                attention_mask=(x != PAD).long(),
                **({"use_cache": False} if takes_use_cache(type(model)) else {}),
            )
        elif self.keyword_images:
            output = model(pixel_values=x)
        else:
            output = model(x)
        return output.logits if hasattr(output, "logits") else output

    def losses(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Per-example losses (float32), one per row of ``x``."""
        return self.losses_from_logits(self.logits(model, x), x, y)

    def losses_from_logits(self, logits: Tensor, x: Tensor, y: Tensor) -> Tensor:
        if self.name == "causal-lm":
            tokens, counts = _token_losses(logits, x)
            return tokens.sum(1) / counts.clamp_min(1)
        return F.cross_entropy(_loss_precision(logits), y, reduction="none")

    @torch.no_grad()
    def evaluate(self, model: nn.Module, x: Tensor, y: Tensor) -> dict[str, float]:
        """In eval mode: ``accuracy`` and mean ``loss`` (classification), or the token-weighted mean
        ``loss`` and its ``perplexity`` exp(loss) (causal LM); each module's mode restored after."""
        with evaluating(model):
            if self.name == "causal-lm":
                total, count = 0.0, 0.0
                for xs in x.split(EVAL_CHUNK):
                    tokens, counts = _token_losses(self.logits(model, xs), xs)
                    total, count = total + float(tokens.sum()), count + float(counts.sum())
                loss = total / max(count, 1.0)
                return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
            correct, loss = 0.0, 0.0
            for xs, ys in zip(x.split(EVAL_CHUNK), y.split(EVAL_CHUNK)):
                logits = self.logits(model, xs).float()
                correct += float((logits.argmax(1) == ys).sum())
                loss += float(F.cross_entropy(logits, ys, reduction="sum"))
            return {"accuracy": correct / len(y), "loss": loss / len(y)}

    @property
    def metric(self) -> str:
        """The headline evaluation metric."""
        return "perplexity" if self.name == "causal-lm" else "accuracy"


def pad_token_id(model: nn.Module) -> int:
    """The id padding enters a model as: its config's ``pad_token_id`` (last-token pooling heads
    such as GPT-2's sequence classifier pool at the last token that is not it, so padding must be
    exactly it), else 0."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0


def _loss_precision(logits: Tensor) -> Tensor:
    """Half-precision logits in float32 for the loss; float32 and float64 (self-check) as is."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


IGNORED = -100
"""The target of a position without a next token (the last one) or whose next token is padding:
``cross_entropy`` gives it a loss and a gradient of exactly 0."""


def _token_losses(logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token cross-entropy at every position whose target is a real token (0 at padding), and
    the number of real targets per sequence.

    The logits are read in the flat (B·T, V) layout, a view of the model's output: every position is
    scored against the next token, the last one and those before padding with target
    :data:`IGNORED` (loss 0). The layout cross_entropy prefers (a row per position), without a copy
    of the logits; the (B, V, T) layout of ``logits.transpose(1, 2)`` runs a strided softmax over
    the vocabulary, several times slower on CPU and GPU alike. Row i of the result is still example
    i's alone: (B, T − 1) token losses."""
    batch, steps = ids.shape
    logits = _loss_precision(logits)
    targets = ids[:, 1:]
    real = targets != PAD
    shifted = torch.full_like(ids, IGNORED)
    shifted[:, :-1] = targets.masked_fill(~real, IGNORED)
    flat = F.cross_entropy(
        logits.reshape(batch * steps, -1),
        shifted.reshape(-1),
        reduction="none",
        ignore_index=IGNORED,
    )
    return flat.view(batch, steps)[:, :-1], real.to(logits.dtype).sum(1)
