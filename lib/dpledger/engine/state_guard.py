"""The state guard: a private step may change only what the optimizer updates from the noisy
gradient. Every buffer and frozen parameter is digested before training and compared after the
first step and before each save; one that changed carries data into the released model without
noise (as BatchNorm's running statistics do) and is refused, named. The trained parameters are
digested across a step's forward and backward passes (:func:`trained_snapshot`): only the optimizer
may change them, from the noisy gradient; a model that sets one from the data in its forward (as
ActNorm's data-dependent initialisation does) is refused, named.

The one exception is state computed from the weights alone: the power-iteration vectors of torch's
own ``parametrizations.spectral_norm`` (:func:`derived_buffers`). Each training forward pass runs
one power iteration on the current weight matrix, which the released model holds anyway; no
example enters it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import _SpectralNorm

from dpledger.errors import DpledgerError

Trained = torch.optim.Optimizer | Iterable[nn.Parameter]
"""What a private step may change: an optimizer's parameters, or the trained parameters
themselves."""


def _trained_ids(trained: Trained) -> set[int]:
    if isinstance(trained, torch.optim.Optimizer):
        return {id(p) for group in trained.param_groups for p in group["params"]}
    return {id(p) for p in trained}


def derived_buffers(model: nn.Module) -> set[int]:
    """Ids of the buffers a training forward pass updates from the weights alone: the ``_u`` and
    ``_v`` power-iteration vectors of torch's own spectral_norm parametrization (its exact class,
    its own forward; a subclass or a replaced forward could write anything there)."""
    return {
        id(getattr(module, name))
        for module in model.modules()
        if type(module) is _SpectralNorm and "forward" not in vars(module)
        for name in ("_u", "_v")
        if isinstance(getattr(module, name, None), Tensor)
    }


DIGEST_CHUNK = 1 << 22
"""Words digested per pass: bounds the temporaries of :func:`digest` whatever the tensor's size."""


def digest(tensor: Tensor) -> Tensor:
    """Two int64 sums of a tensor's bytes, read as 32-bit words (bytes when the size is not a
    multiple of 4), plain and position-weighted, computed where the tensor lives: any change of its
    bits changes them except by a coincidence of both sums. No copy to the host (a LoRA base model
    stays where it is) and no sync until :func:`check_state_unchanged` reads them; NaN stays equal
    to itself."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    words = data.view(torch.int32) if data.numel() % 4 == 0 else data
    sums = torch.zeros(2, dtype=torch.int64, device=tensor.device)
    for start in range(0, words.numel(), DIGEST_CHUNK):
        chunk = words[start : start + DIGEST_CHUNK].to(torch.int64)
        position = torch.arange(start, start + chunk.numel(), device=tensor.device) * 0x9E3779B1 + 1
        sums += torch.stack([chunk.sum(), (chunk * position).sum()])  # int64 wraps: still a digest
    return sums


def state_snapshot(model: nn.Module, trained: Trained) -> dict[str, tuple]:
    """(shape, dtype, :func:`digest`) of every buffer of ``model`` and every parameter that is not
    ``trained`` (under FSDP, of this rank's shard).

    A private step may change only what the optimizer updates from the noisy gradient; anything else
    that changes during it (a running mean updated in ``forward``, an example copied into a frozen
    parameter under ``no_grad``) carries data into the released model without noise, as BatchNorm's
    running statistics do. Buffers computed from the weights alone (:func:`derived_buffers`) are
    left out.
    """
    trained, derived = _trained_ids(trained), derived_buffers(model)
    tensors = {f"buffer {name}": b for name, b in model.named_buffers() if id(b) not in derived}
    for name, param in model.named_parameters():
        if id(param) not in trained:
            tensors[f"frozen parameter {name}"] = param
    return {name: (tuple(t.shape), t.dtype, digest(_local(t))) for name, t in tensors.items()}


def _local(tensor: Tensor) -> Tensor:
    """This rank's shard of a tensor FSDP shards (a DTensor: a frozen LoRA base weight, a trained
    parameter), else the tensor: each rank digests what it holds."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def check_state_unchanged(model: nn.Module, trained: Trained, before: dict[str, tuple]) -> None:
    """Refuse, naming it, the first buffer or frozen parameter that differs from
    :func:`state_snapshot`'s record (changed, added or removed): the model changes its own state
    from the data."""
    after = state_snapshot(model, trained)
    for name in [*before, *(n for n in after if n not in before)]:
        old, new = before.get(name), after.get(name)
        if old is None or new is None or not _same_state(old, new):
            what = "appeared" if old is None else "disappeared" if new is None else "changed"
            raise DpledgerError(
                f"engine: {name} {what} during a private step: "
                "the model changes its own state from the data "
                "(like BatchNorm's running statistics), which would release data without noise; "
                "compute it without state, register it as a trainable parameter, "
                "or freeze it unchanged"
            )


def _same_state(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and a[2].device == b[2].device and bool(torch.equal(a[2], b[2]))


def trained_snapshot(model: nn.Module, trained: Trained) -> dict[str, Tensor]:
    """:func:`digest` of every ``trained`` parameter of ``model`` (its local shard under FSDP), by
    name: taken before a step's forward pass and compared (:func:`check_trained_unchanged`) before
    the optimizer runs."""
    ids = _trained_ids(trained)
    return {name: digest(_local(p)) for name, p in model.named_parameters() if id(p) in ids}


def check_trained_unchanged(model: nn.Module, trained: Trained, before: dict[str, Tensor]) -> None:
    """Refuse, naming it, the first trained parameter whose bits changed since
    :func:`trained_snapshot`, before the optimizer was called: the model wrote into it outside the
    noisy update."""
    after = trained_snapshot(model, trained)
    for name, old in before.items():
        if name not in after or not torch.equal(old, after[name]):
            raise DpledgerError(
                f"engine: trainable parameter {name} changed during the forward or backward pass: the model sets it from the data (as ActNorm's data-dependent initialisation does), outside the noisy update, which would release data without noise; initialise it from the weights or a public batch before training"  # noqa: E501
            )
