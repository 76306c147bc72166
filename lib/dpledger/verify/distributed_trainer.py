"""The engine's data-parallel path as a protocol trainer (``verify.trainer: distributed``), and two
wrong builds of it.

:func:`train` runs the protocol's DP-SGD (consecutive batches, see :mod:`dpledger.verify.protocol`)
on :data:`WORLD_SIZE` ranks of a ``gloo`` process group: each rank takes its contiguous share of
every batch (``dpledger.engine.distributed.share_bounds``; a batch of one row leaves a rank empty),
runs a ``BKEngine(process_group=...)`` on it, and the ranks all-reduce once per step. So the battery
tests what a multi-process run computes — a per-rank noise or clipping bug fails it like any other
trainer's.

The ranks are spawned once and kept for the whole battery (each call ships the model and rows to
them and takes rank 0's trained state back); every rank's final parameters must be equal, or the
call fails.

Two deliberately wrong builds, which the battery must catch
(tests/verify/test_distributed_verify.py), show it can: :func:`train_noise_on_every_rank` (every
rank adds σ·C·z_t, so the sum holds √N times the noise) and :func:`train_clipping_after_all_reduce`
(the ranks sum unclipped gradients and the sum is clipped).
"""

from __future__ import annotations

import atexit
import io
import queue
import tempfile
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

from dpledger.engine.bk import BKEngine
from dpledger.engine.distributed import GroupSum, share_bounds
from dpledger.engine.noise import NoiseSource
from dpledger.engine.optimizers import make_optimizer
from dpledger.verify.consecutive import ConsecutiveRun, protocol_trainer
from dpledger.verify.errors import TrainerError

WORLD_SIZE = 2
CALL_TIMEOUT_S = 120.0
"""A call whose ranks have not all answered by then fails (a hung or dead rank), instead of waiting
forever."""
FLAWS = ("none", "noise_on_every_rank", "clipping_after_all_reduce")


class _NoiseOnEveryRank(GroupSum):
    """Wrong: every rank's buffer starts with the noise, so the all-reduced sum has N noise
    draws."""

    @property
    def adds_noise(self) -> bool:
        return True


class _ClipAfterAllReduce(GroupSum):
    """Wrong: the ranks' unclipped sums are all-reduced, then the total is clipped to C and the
    noise added."""

    def __init__(
        self, clip_norm: float, noise_multiplier: float, normalizer: float, noise: NoiseSource
    ) -> None:
        super().__init__(dist.group.WORLD)
        self.clip_norm, self.noise_multiplier, self.normalizer, self.noise = (
            clip_norm,
            noise_multiplier,
            normalizer,
            noise,
        )
        self.step = 0

    def all_reduce(self, buffer: Tensor) -> None:
        super().all_reduce(buffer)
        norm = float(buffer.norm()) * self.normalizer
        buffer.mul_(min(1.0, self.clip_norm / max(norm, 1e-12)))
        buffer.add_(
            self.noise.draw(self.step),
            alpha=self.noise_multiplier * self.clip_norm / self.normalizer,
        )
        self.step += 1


class _UnclippedEngine(BKEngine):
    """Per-example factors 1 / normalizer (0 for weight-0 and non-finite rows, which ``dropped``
    marks): the clipping is left to :class:`_ClipAfterAllReduce`."""

    def _factors(
        self, norm_sq: dict[int, Tensor], flat: Tensor, dropped: Tensor
    ) -> dict[int, Tensor]:
        return dict.fromkeys(self._owners, (~dropped).to(flat.dtype) / self.normalizer)


def _engine(
    flaw: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    clip_norm: float,
    noise_multiplier: float,
    batch_size: int,
    seed: int,
) -> BKEngine:
    settings = dict(clip_norm=clip_norm, normalizer=batch_size, seed=seed)
    if flaw == "clipping_after_all_reduce":
        numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        reducer = _ClipAfterAllReduce(
            clip_norm, noise_multiplier, batch_size, NoiseSource(numel, seed=seed)
        )
        return _UnclippedEngine(
            model, optimizer, noise_multiplier=0.0, process_group=reducer, **settings
        )
    group = (
        _NoiseOnEveryRank(dist.group.WORLD) if flaw == "noise_on_every_rank" else dist.group.WORLD
    )
    return BKEngine(
        model, optimizer, noise_multiplier=noise_multiplier, process_group=group, **settings
    )


def _train_share(
    rank: int,
    world_size: int,
    *,
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    run: ConsecutiveRun,
    flaw: str,
) -> nn.Module:
    """One rank's part of the protocol run: its share of every consecutive batch, the engine
    all-reducing."""
    model.train()
    torch_optimizer = make_optimizer(
        run.optimizer, [p for p in model.parameters() if p.requires_grad], run.lr
    )
    engine = _engine(
        flaw,
        model,
        torch_optimizer,
        clip_norm=run.clip_norm,
        noise_multiplier=run.noise_multiplier,
        batch_size=run.batch_size,
        seed=run.seed,
    )
    batch_size = run.batch_size
    lo, hi = share_bounds(batch_size, rank, world_size)
    try:
        for step in range(run.steps):
            rows = (torch.arange(step * batch_size + lo, step * batch_size + hi)) % inputs.shape[0]
            if len(rows):
                engine.backward(loss_fn(model(inputs[rows]), targets[rows]))
            engine.step()
    finally:
        engine.detach()
    return model


def _to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _from_bytes(payload: bytes) -> Any:
    return torch.load(io.BytesIO(payload), weights_only=False)


def _serve(rank: int, world_size: int, init_method: str, jobs: Any, results: Any) -> None:
    """A pool rank: join the gloo group, then train every job it is sent until it gets None."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=CALL_TIMEOUT_S),
    )
    try:
        while (payload := jobs.get()) is not None:
            try:
                model = _train_share(rank, world_size, **_from_bytes(payload))
                results.put((rank, None, _to_bytes(model.state_dict())))
            except (
                Exception
            ) as error:  # reported to the caller in one line, which then closes the pool
                results.put((rank, f"{type(error).__name__}: {error}".splitlines()[0], None))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world_size`` spawned gloo ranks that train protocol jobs; closed at exit or on the first
    failure."""

    def __init__(self, world_size: int = WORLD_SIZE) -> None:
        context = mp.get_context("spawn")
        self.world_size = world_size
        self._folder = tempfile.TemporaryDirectory(prefix="dpledger-verify-ranks-")
        init_method = Path(self._folder.name, "store").as_uri()
        self.jobs = [context.Queue() for _ in range(world_size)]
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=_serve,
                args=(rank, world_size, init_method, self.jobs[rank], self.results),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def run(self, job: dict[str, Any]) -> dict[str, Tensor]:
        """Train ``job`` on every rank; rank 0's final state_dict (all ranks' must be equal)."""
        payload = _to_bytes(job)
        for jobs in self.jobs:
            jobs.put(payload)
        states: dict[int, dict[str, Tensor]] = {}
        while len(states) < self.world_size:
            try:
                rank, error, state = self.results.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                dead = [rank for rank, p in enumerate(self.processes) if not p.is_alive()]
                raise TrainerError(
                    f"distributed trainer: no answer within {CALL_TIMEOUT_S:.0f} s (dead ranks: "
                    f"{dead})"
                ) from None
            if error is not None:
                raise TrainerError(f"distributed trainer: rank {rank} failed: {error}")
            states[rank] = _from_bytes(state)
        for rank in range(1, self.world_size):
            if any(not torch.equal(states[0][name], states[rank][name]) for name in states[0]):
                raise TrainerError(
                    f"distributed trainer: rank {rank} ended with other parameters than rank 0"
                )
        return states[0]

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and remove the rendezvous folder."""
        for jobs in self.jobs:
            jobs.put(None)
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        self._folder.cleanup()


_pool: RankPool | None = None


def _shared_pool() -> RankPool:
    global _pool
    if _pool is None:
        _pool = RankPool()
        atexit.register(_close_pool)
    return _pool


def _close_pool() -> None:
    global _pool
    if _pool is not None:
        pool, _pool = _pool, None
        pool.close()


@protocol_trainer
def train(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    run: ConsecutiveRun,
    flaw: str = "none",
) -> None:
    """The protocol trainer on :data:`WORLD_SIZE` gloo ranks (see the module docstring); trains
    ``model`` in place."""
    if flaw not in FLAWS:
        raise ValueError(f"flaw {flaw!r} is unknown; use one of {FLAWS}")
    job = dict(model=model, inputs=inputs, targets=targets, loss_fn=loss_fn, run=run, flaw=flaw)
    try:
        state = _shared_pool().run(job)
    except TrainerError:
        _close_pool()
        raise
    model.load_state_dict(state)


train_noise_on_every_rank = partial(train, flaw="noise_on_every_rank")
train_clipping_after_all_reduce = partial(train, flaw="clipping_after_all_reduce")
