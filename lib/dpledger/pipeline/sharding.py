"""The train stage under ``train.sharding: fsdp``: the model sharded by FSDP2 over the ranks of
``train.processes`` (or torchrun), trained by :class:`~dpledger.engine.fsdp.FSDPEngine`.

What the stage needs besides the engine, each a function here:

- :func:`check_sharding`: the combinations the sharded engine cannot run, refused before anything
  is built, in one line naming the keys (correlated noise, one process without torchrun).
- :func:`shard` and :func:`make_engine`: ``shard_model`` (``fully_shard`` per block), then the
  engine. The self-check runs on the UNSHARDED model with the same weights (gathered whole on
  every rank), so the default ``train.self_check: true`` proves the engine exact as in one process.
- :func:`upload`: every rank gets the same number of rows per step (its contiguous share padded
  with weight-0 rows, which contribute exactly zero), so every rank runs the same forward and
  backward passes that FSDP's collectives need — an empty share included.
- :func:`whole_state` and :func:`load_state`: the checkpoint holds the FULL model and optimizer
  state in one process's format (gathered on every rank, written by rank 0; read by every rank and
  cut back into its shards), so a run resumes sharded or not, at any number of ranks. A
  distributed (sharded) checkpoint for models whose full state does not fit one host is not built.
- :func:`for_outputs`: the trained model gathered whole into an unsharded copy on rank 0, from
  which the outputs and the published model are written, and the run's placement (sharding, ranks,
  peak memory per rank) for metrics/train.json.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from dpledger.engine import BKEngine, ClipNoise
from dpledger.engine.distributed import share_bounds
from dpledger.engine.fsdp import FSDPEngine, full_state_dict, shard_model
from dpledger.errors import ParamsError
from dpledger.params import Params
from dpledger.pipeline.batches import DeviceBatches
from dpledger.pipeline.distributed import Ranks, under_torchrun

FRESH = Callable[[], nn.Module]
"""A new unsharded model of the run (same architecture; its weights are then loaded)."""


def check_sharding(params: Params, mechanism: str, several_ranks: bool) -> None:
    """Refuse what the sharded engine cannot privatize or record, naming the keys: the train
    stage calls it before it starts its ranks (with the params' mechanism) and again in each rank
    (with the calibration record's)."""
    if params.train.sharding != "fsdp":
        return
    if mechanism != "identity":
        raise ParamsError(
            f"params: calibrate.mechanism: {mechanism} is not supported with train.sharding: fsdp (correlated noise is a stream over whole rows); "  # noqa: E501
            "use calibrate.mechanism: identity or train.sharding: none"
        )
    if not several_ranks:
        raise ParamsError(
            "params: train.sharding: fsdp needs several ranks: "
            "set train.processes to 2 or more, or start the stage under torchrun"
        )


def check_before_ranks(params: Params) -> None:
    """:func:`check_sharding` on the params alone, before any rank starts."""
    several = params.train.processes > 1 or under_torchrun()
    check_sharding(params, params.calibrate.mechanism, several)


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard`."""
    return isinstance(model, FSDPModule)


def shard(params: Params, settings: ClipNoise, model: nn.Module, ranks: Ranks) -> None:
    """With ``train.sharding: fsdp``: check the combination, then shard ``model`` in place (before
    its optimizer is made: the optimizer steps on the shards)."""
    check_sharding(params, settings.mechanism, ranks.group is not None)
    if params.train.sharding == "fsdp":
        shard_model(model)


class ShardedEngine(FSDPEngine):
    """:class:`FSDPEngine` whose self-check runs on the unsharded model with the same weights."""

    whole: Callable[[], tuple[nn.Module, BKEngine]] | None = None

    def self_check(self, *args: Any, **options: Any) -> Any:
        """``BKEngine.self_check`` on the model gathered whole (every rank calls it: a
        collective), with the same clipping and noise settings."""
        assert self.whole is not None
        return self.whole()[1].self_check(*args, **options)


def make_engine(
    params: Params,
    settings: ClipNoise,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ranks: Ranks,
    seed: int,
    fresh: FRESH,
) -> BKEngine:
    """The run's engine: :class:`ShardedEngine` on a sharded model, else the data-parallel
    ``BKEngine``; ``fresh`` makes the unsharded copy of the self-check and the outputs."""
    ghost = params.train.ghost
    if not is_sharded(model):
        return BKEngine.from_settings(
            model, optimizer, settings, seed=seed, ghost=ghost, process_group=ranks.group
        )
    engine = ShardedEngine.from_settings(
        model, optimizer, settings, seed=seed, ghost=ghost, process_group=ranks.group
    )
    engine.whole = lambda: unsharded(model, fresh, settings, seed, ghost)
    return engine


def unsharded(
    model: nn.Module, fresh: FRESH, settings: ClipNoise, seed: int, ghost: Any
) -> tuple[nn.Module, BKEngine]:
    """An unsharded copy of the sharded ``model`` (gathered: every rank calls it) and its
    single-process engine; the global random state is left as it was."""
    state = full_state_dict(model)
    with torch.random.fork_rng(devices=[]):
        plain = fresh()
    plain.load_state_dict(state)
    return plain, BKEngine.from_settings(plain, None, settings, seed=seed, ghost=ghost)


class EqualShares(DeviceBatches):
    """This rank's contiguous share of each batch padded with weight-0 rows to ⌈n/N⌉ rows (at least
    one), the same count on every rank."""

    def batch(self, step: int) -> tuple[Tensor, Tensor, float]:
        lo, hi = int(self.schedule.offsets[step]), int(self.schedule.offsets[step + 1])
        world = self.ranks.world_size
        first, last = share_bounds(hi - lo, self.ranks.rank, world)
        rows, weights = self.indices[lo + first : lo + last], self.weights[lo + first : lo + last]
        real = float((~self.schedule.padding[lo + first : lo + last]).sum())
        pad = max(1, math.ceil((hi - lo) / world)) - (last - first)
        if pad > 0:  # row 0 of the training set, weight 0: contributes exactly zero
            rows = torch.cat([rows, rows.new_zeros(pad)])
            weights = torch.cat([weights, weights.new_zeros(pad)])
        return rows, weights, real


def upload(engine: BKEngine, schedule: Any, ranks: Ranks, device: torch.device) -> DeviceBatches:
    """The schedule's batches on the device: equal padded shares under sharding."""
    kind = EqualShares if isinstance(engine, FSDPEngine) else DeviceBatches
    return kind.upload(schedule, ranks, device)


@dataclasses.dataclass(frozen=True)
class Held:
    """A state dict already gathered, standing in for its module or optimizer."""

    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.state


def _full(value: Any) -> Any:
    return value.full_tensor().cpu() if isinstance(value, DTensor) else value


def whole_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """The model and optimizer to checkpoint: as they are unsharded; under sharding their full
    state dicts in one process's format (every rank must call it: a collective)."""
    if not is_sharded(model):
        return model, optimizer
    saved = optimizer.state_dict()
    states = {k: {n: _full(v) for n, v in s.items()} for k, s in saved["state"].items()}
    return Held(full_state_dict(model)), Held({**saved, "state": states})


def _like(full: Any, reference: Any) -> Any:
    """``full`` cut to this rank's shard of ``reference`` (a DTensor), without communication."""
    if not isinstance(reference, DTensor) or not torch.is_tensor(full):
        return full
    if full.shape != reference.shape:
        return full
    local = full.to(reference.device)
    return distribute_tensor(local, reference.device_mesh, reference.placements, src_data_rank=None)


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load a checkpoint's full model and optimizer state (one process's format) into ``model``
    and ``optimizer``, sharded or not."""
    if not is_sharded(model):
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        return
    current = model.state_dict()
    model.load_state_dict({k: _like(v, current.get(k)) for k, v in saved["model"].items()})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {
        k: {n: _like(v, params[int(k)]) for n, v in s.items()}
        for k, s in saved["optimizer"]["state"].items()
    }
    optimizer.load_state_dict({**saved["optimizer"], "state": state})


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory: CUDA's peak allocated bytes on a GPU, the process's peak
    resident set on the CPU (interpreter and libraries included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def placement(params: Params, ranks: Ranks, device: torch.device) -> dict[str, Any]:
    """How the run was placed, for metrics/train.json (a collective with several ranks)."""
    mine = round(peak_memory_mib(device), 1)
    peaks: list[Any] = [mine]
    if ranks.group is not None:
        peaks = [None] * ranks.world_size
        dist.all_gather_object(peaks, mine, group=ranks.group)
    measure = "cuda max allocated" if device.type == "cuda" else "process peak RSS"
    return {
        "sharding": params.train.sharding,
        "ranks": ranks.world_size,
        "peak_memory_mib_per_rank": peaks,
        "peak_memory_measure": measure,
    }


def for_outputs(run: Any) -> tuple[Any, dict[str, Any]]:
    """The finished run as rank 0 writes its outputs — under sharding with the model gathered into
    an unsharded copy and its single-process engine — and its placement. Every rank calls it."""
    where = placement(run.params, run.ranks, run.device)
    if not isinstance(run.engine, ShardedEngine):
        return run, where
    if not run.ranks.writes:
        full_state_dict(run.model)  # this rank's part of the gather; rank 0 alone keeps a copy
        return run, where
    assert run.engine.whole is not None
    model, engine = run.engine.whole()
    engine.layer_methods.update(run.engine.layer_methods)  # what the sharded engine did per layer
    return dataclasses.replace(run, model=model, engine=engine), where
