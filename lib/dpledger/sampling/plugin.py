"""Plugin samplers given as ``module:callable``.

Protocol: ``callable(dataset_size: int, batch_size: int, epochs: int, seed: int) ->
Iterable[np.ndarray]`` yields each step's batch indices (distinct integers in [0, dataset_size)),
deterministically for a given seed. The callable may carry ``accounted_as``, the accounted sampler
(one of :data:`dpledger.accounting.description.SAMPLERS`) it declares itself equivalent to, and
``description``, a sentence saying what it does; the guard then compares by the declared name, and
the report states that the equivalence is declared, not proven.
"""

from __future__ import annotations

import inspect
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from dpledger.accounting.description import SAMPLERS as ACCOUNTED_SAMPLERS
from dpledger.errors import ParamsError
from dpledger.plugins import is_plugin_name, load_callable
from dpledger.sampling.base import Batch, BatchSampler, real_batch, require_int

__all__ = ["PluginSampler", "checked_batch", "is_plugin_name", "load_plugin"]


def load_plugin(name: str) -> Callable[..., Iterable[Any]]:
    """Import the callable ``module:attr``; a missing module or attribute is a one-line
    ParamsError."""
    target = load_callable(name, "sampler", "a plugin sampler")
    try:
        inspect.signature(target).bind(0, 0, 0, 0)
    except TypeError:
        raise ParamsError(
            f"sampler = {name!r} is invalid: "
            f"{name.split(':')[1]}{inspect.signature(target)} cannot be called as (dataset_size, "
            "batch_size, epochs, seed)"
        ) from None
    except ValueError:
        pass  # no signature to inspect (a builtin): the call itself will tell
    declared = getattr(target, "accounted_as", None)
    if declared is not None and declared not in ACCOUNTED_SAMPLERS:
        raise ParamsError(
            f"sampler = {name!r} is invalid: "
            f"its accounted_as = {declared!r} is not one of {', '.join(ACCOUNTED_SAMPLERS)}"
        )
    return target


def checked_batch(name: str, step: int, raw: Any, dataset_size: int) -> Batch:
    """Step ``step``'s indices from a plugin, refused unless 1-D distinct integers in [0,
    dataset_size)."""
    indices = np.asarray(raw)
    if indices.size == 0:
        return real_batch(np.zeros(0, dtype=np.int64))
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        raise ParamsError(
            f"sampler = {name!r} is invalid: "
            f"step {step} yielded {indices.dtype} array of shape {indices.shape}; "
            "each step must be a 1-D integer array"
        )
    if indices.min() < 0 or indices.max() >= dataset_size:
        raise ParamsError(
            f"sampler = {name!r} is invalid: step {step} yielded an index outside [0, "
            f"{dataset_size})"
        )
    if np.unique(indices).size != indices.size:
        raise ParamsError(
            f"sampler = {name!r} is invalid: step {step} yielded the same example twice"
        )
    return real_batch(indices)


class PluginSampler(BatchSampler):
    """Wraps a ``module:callable`` plugin; its length is unknown until its batches are drawn."""

    description = "user plugin module:callable; accounted as its declared accounted_as, if any"

    def __init__(self, name: str, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.name = name  # type: ignore[misc]
        self.plugin = load_plugin(name)
        self.accounted_as = getattr(self.plugin, "accounted_as", None)  # type: ignore[misc]
        description = getattr(self.plugin, "description", type(self).description)
        self.description = description  # type: ignore[misc]

    def options(self) -> dict[str, Any]:
        return {"accounted_as": self.accounted_as}

    @property
    def steps_per_epoch(self) -> int:
        raise TypeError(
            f"plugin sampler {self.name!r} has no steps_per_epoch before its batches are drawn"
        )

    def __len__(self) -> int:
        raise TypeError(f"plugin sampler {self.name!r} has no length before its batches are drawn")

    def batches(self, start: int = 0) -> Iterator[Batch]:
        require_int("start", start, 0)
        stream = self.plugin(self.dataset_size, self.batch_size, self.epochs, self.seed)
        if not isinstance(stream, Iterable):
            raise ParamsError(
                f"sampler = {self.name!r} is invalid: it returned {type(stream).__name__}, "
                "not an iterable of index arrays"
            )
        for step, raw in enumerate(islice(stream, start, None), start=start):
            yield checked_batch(self.name, step, raw, self.dataset_size)

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        raise TypeError(f"plugin sampler {self.name!r} has no epochs of known length")
