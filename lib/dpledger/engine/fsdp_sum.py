"""The noisy sum of a model sharded by FSDP2 (``fully_shard``): each rank keeps only its shards.

A single process keeps one flat buffer of every trainable parameter (``noisy_sum.py``). Here each
rank keeps the rows it owns of each parameter, laid out as FSDP2 lays out that parameter's DTensor
shard (dimension 0 cut in ``world_size`` chunks of ⌈n/world_size⌉ rows, the last ones shorter or
empty): the buffer is 1/N of the model. After each backward pass, every layer's clipped sum over
this rank's examples (Σ_i C_i·g_i: aᵀ·diag(C)·b of a ghost layer, a weighted sum of instantiated
gradients) is formed full-sized in a temporary, one parameter at a time, and reduce-scattered: each
rank receives the sum over all ranks of its own rows and adds it to its buffer. A parameter FSDP
left whole (a plain tensor, replicated on every rank) is all-reduced instead.

At the step's release each rank adds its slice of the ONE noise vector σ·R·z_t of a single
process (``fsdp_noise.py``: the same entries, drawn without the rest) and its slice of the canary,
then hands each parameter its gradient as a DTensor with the parameter's own placement, so the
optimizer steps on shards. The noise enters each coordinate exactly once (each coordinate lives on
one rank), and the released sum, its scale and the ledger are a single process's; only the order
of the floating-point additions differs.

Every rank must run the same number of backward passes per step (FSDP's collectives require it; a
caller pads short shares of a batch with weight-0 rows, which contribute exactly zero) and must
pass the same canary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

from dpledger.engine import validators
from dpledger.engine.batched import Packed, keep_rows
from dpledger.engine.clipping import nonfinite_rows
from dpledger.engine.distributed import GroupSum, group_sum
from dpledger.engine.fsdp_noise import Range, draw_ranges, refuse_correlated
from dpledger.engine.layers import add_weighted_sum
from dpledger.engine.noise import NoiseSource
from dpledger.engine.norms import norm_precision
from dpledger.engine.owners import Owner
from dpledger.engine.recorder import Call
from dpledger.engine.watched import Coordinates
from dpledger.errors import ParamsError
from dpledger.precision import exactly


@dataclass(frozen=True)
class ShardLayout:
    """Where one trainable parameter lives on this rank: its full shape, the rows [lo, hi) of
    dimension 0 this rank holds (all of them when ``sharded`` is False) and the parameter's offset
    in a single process's flat vector."""

    shape: torch.Size
    lo: int
    hi: int
    chunk: int
    offset: int
    sharded: bool

    @property
    def row(self) -> int:
        """Entries per row of dimension 0."""
        return self.shape[1:].numel()

    @property
    def local_shape(self) -> torch.Size:
        return torch.Size([self.hi - self.lo, *self.shape[1:]])

    @property
    def flat_range(self) -> Range:
        """This rank's entries in a single process's flat vector (rows are contiguous there)."""
        return self.offset + self.lo * self.row, self.offset + self.hi * self.row


def shard_layout(param: Tensor, offset: int, rank: int, world_size: int, name: str) -> ShardLayout:
    """The :class:`ShardLayout` of ``param``: a DTensor sharded on dimension 0 over the whole group
    (FSDP2's default), or a plain tensor (whole on every rank); any other placement is refused."""
    if not isinstance(param, DTensor):
        return ShardLayout(param.shape, 0, param.shape[0] if param.dim() else 1, 0, offset, False)
    placements = tuple(param.placements)
    if placements != (Shard(0),) or param.device_mesh.size() != world_size:
        raise ParamsError(
            f"engine: parameter {name} is placed as {placements} on a mesh of {param.device_mesh.size()} ranks; the sharded engine supports fully_shard's Shard(0) over all {world_size} ranks of its process group"  # noqa: E501
        )
    rows = param.shape[0]
    chunk = -(-rows // world_size)
    lo = min(rank * chunk, rows)
    layout = ShardLayout(param.shape, lo, min(lo + chunk, rows), chunk, offset, True)
    if param.to_local().shape != layout.local_shape:
        raise ParamsError(
            f"engine: parameter {name}'s local shard has shape {tuple(param.to_local().shape)}, "
            f"not the rows {layout.lo}…{layout.hi} of fully_shard's layout"
        )
    return layout


class ShardedNoisySum:
    """This rank's shards of the step's noisy sum (the interface of ``noisy_sum.NoisySum``)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        owners: dict[int, Owner],
        names: list[str],
        *,
        noise: NoiseSource,
        noise_multiplier: float,
        clip_norm: float,
        normalizer: float,
        process_group: dist.ProcessGroup | GroupSum | None,
    ) -> None:
        if process_group is None:
            raise ParamsError("engine: a sharded model needs its process_group")
        refuse_correlated(noise)
        self.params, self.noise = params, noise
        self.noise_multiplier, self.clip_norm, self.normalizer = (
            noise_multiplier,
            clip_norm,
            normalizer,
        )
        self.ranks = group_sum(process_group)
        reference = params[0]
        self.ranks.check_layout(noise.numel, names, reference.device)
        self.adds_noise = True  # every rank adds the noise of the coordinates it holds
        self.layouts = [
            shard_layout(p, owners[id(p)].offset, self.ranks.rank, self.ranks.world_size, name)
            for p, name in zip(params, names)
        ]
        sizes = [layout.local_shape.numel() for layout in self.layouts]
        self.buffer = torch.zeros(sum(sizes), device=reference.device, dtype=reference.dtype)
        self.views = [
            part.view(layout.local_shape)
            for part, layout in zip(self.buffer.split(sizes), self.layouts)
        ]
        self._index = {id(p): k for k, p in enumerate(params)}
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=reference.device)
        self.pending = False
        self.steps_taken = 0
        self.last_watched: Tensor | None = None
        self._watched: Coordinates | None = None
        # the clipped sums' dtype: the parameters', at least float32 (norms.norm_precision)
        self._sum_dtype = torch.promote_types(reference.dtype, torch.float32)

    def watch(self, select: Callable[[list[Tensor]], Tensor]) -> None:
        """Keep, for each step, the released sum and the clipped sum at ``select``'s coordinates
        (``last_watched``, as ``NoisySum.watch``): each rank gathers the entries its shards hold
        (:meth:`Coordinates.held`; a parameter left whole counts on rank 0 only) and one all-reduce
        of the two rows sums them. ``select`` must be a :class:`Coordinates`: an arbitrary
        function of whole tensors cannot run on shards."""
        if not isinstance(select, Coordinates):
            raise ParamsError(
                "engine: watching the released sum of sharded parameters (FSDPEngine) needs the coordinates as engine.watched.Coordinates, not a function of whole tensors"  # noqa: E501
            )
        self._watched = select

    def _held(self) -> Tensor:
        """This rank's share of the watched entries of the buffer (:meth:`Coordinates.held`)."""
        assert self._watched is not None
        starts = [
            layout.lo * layout.row if layout.sharded or self.ranks.rank == 0 else None
            for layout in self.layouts
        ]
        return self._watched.held(self.views, starts)

    def drop(self, flat: Tensor, weights: Tensor | None) -> Tensor:
        """The rows whose factor is zero (as ``NoisySum.drop``)."""
        nonfinite = nonfinite_rows(flat)
        dropped = nonfinite if weights is None else nonfinite | (weights == 0)
        self.nonfinite += (nonfinite if weights is None else nonfinite & (weights != 0)).sum()
        return dropped

    def _open(self) -> None:
        """A step begins with a zero buffer; the noise is added at release, after the reductions."""
        if not self.pending:
            self.buffer.zero_()
            self.pending = True

    @exactly
    def add_clipped(
        self,
        factors: dict[int, Tensor],
        per_example: dict[int, Tensor],
        ghost_calls: list[Call],
        packed: Packed | None,
        dropped: Tensor,
    ) -> None:
        """Σ_i factors[i]·g_i of this rank's examples, for every parameter, summed over the ranks
        into the shards: one full-sized temporary and one reduction per parameter, for EVERY
        parameter in the same order on every rank (a rank's hooks may fire in another order, and a
        parameter may get no gradient on one rank: the collectives must still match)."""
        self._open()
        adders: dict[int, list[Callable[[Tensor], None]]] = {}
        for key, grads in per_example.items():
            grads = keep_rows(grads, dropped)
            adders.setdefault(key, []).append(
                lambda full, f=factors[key], g=grads: _in_dtype(
                    full, g.dtype, lambda out: add_weighted_sum(out, f, g)
                )
            )
        for call in ghost_calls:
            key = id(call.params["weight"])
            a, b = (
                keep_rows(norm_precision(t), dropped) for t in (call.activations, call.backprops)
            )
            call.activations = call.backprops = None
            adders.setdefault(key, []).append(
                lambda full, c=call, a=a, b=b, f=factors[key]: _in_dtype(
                    full, b.dtype, lambda out: c.rule.clipped_sum(c.module, a, b, f, out)
                )
            )
        small = self._packed_sums(packed, factors, dropped)
        for k, param in enumerate(self.params):
            layout = self.layouts[k]
            full = small.get(id(param))
            if full is None:
                full = torch.zeros(layout.shape, dtype=self._sum_dtype, device=self.buffer.device)
            for add in adders.pop(id(param), ()):
                add(full)
            self._reduce_into(k, full)

    def _packed_sums(
        self, packed: Packed | None, factors: dict[int, Tensor], dropped: Tensor
    ) -> dict[int, Tensor]:
        """The full-sized clipped sums of the small packed parameters, by parameter id."""
        if packed is None:
            return {}
        fulls = [
            torch.zeros(
                self.layouts[self._index[k]].shape,
                dtype=packed.matrix.dtype,
                device=packed.matrix.device,
            )
            for k in packed.keys
        ]
        packed.add_clipped([f.view(-1) for f in fulls], factors[packed.keys[0]], dropped)
        return dict(zip(packed.keys, fulls))

    def _reduce_into(self, k: int, full: Tensor) -> None:
        """Add the sum over the ranks of ``full`` (this rank's clipped sum of parameter ``k``) at
        this rank's rows to its view: a reduce-scatter of the rows padded to world_size equal
        chunks, or an all-reduce of a parameter left whole."""
        layout, view = self.layouts[k], self.views[k]
        if not layout.sharded:
            self.ranks.all_reduce(full)
            view.add_(full.reshape(view.shape).to(view.dtype))
            return
        world = self.ranks.world_size
        padded = full.new_zeros(layout.chunk * world, *layout.shape[1:])
        padded[: layout.shape[0]] = full
        mine = full.new_empty(layout.chunk, *layout.shape[1:])
        dist.reduce_scatter_single(mine, padded, group=self.ranks.group)
        view.add_(mine[: layout.hi - layout.lo].to(view.dtype))

    def last(self) -> list[Tensor] | None:
        """This rank's shards of the noisy sum released by the last step, one tensor per parameter
        (the rows ``layouts`` name); None before the first step and once the next step has
        begun."""
        if self.steps_taken == 0 or self.pending:
            return None
        return [view * self.normalizer for view in self.views]

    def _add_noise(self) -> None:
        """σ·R·z_t / normalizer at this rank's coordinates: its slices of the single process's
        noise."""
        if self.noise_multiplier <= 0:
            return
        scale = self.noise_multiplier * self.clip_norm / self.normalizer
        drawn = torch.empty_like(self.buffer)
        draw_ranges(
            self.noise,
            drawn,
            [layout.flat_range for layout in self.layouts],
            self.steps_taken,
            scale,
        )
        self.buffer.add_(drawn)

    def release(
        self, canary: Sequence[Tensor] | None, optimizer: torch.optim.Optimizer | None
    ) -> None:
        """Finish the step: this rank's slices of the noise and the canary, each parameter's shard
        as its DTensor gradient, the optimizer's step on the shards, the step counted."""
        self._open()
        clipped = None if self._watched is None else self._held()  # reduced, before noise
        self._add_noise()
        if canary is not None:
            validators.check_canary(canary, len(self.params))
            for view, vector, layout in zip(self.views, canary, self.layouts):
                rows = vector.reshape(layout.shape)[layout.lo : layout.hi]
                view.add_(rows.to(view.device, view.dtype), alpha=1 / self.normalizer)
        if clipped is not None:
            watched = torch.stack([self._held(), clipped])
            self.ranks.all_reduce(watched)
            self.last_watched = watched * self.normalizer
        for param, view in zip(self.params, self.views):
            param.grad = _as_gradient(param, view)
        if optimizer is not None:
            optimizer.step()
            for param in self.params:
                param.grad = None
        self.pending = False
        self.steps_taken += 1


def _in_dtype(full: Tensor, dtype: torch.dtype, add: Callable[[Tensor], None]) -> None:
    """Run ``add`` on ``full``, through a temporary of ``dtype`` when ``full`` is in another."""
    if full.dtype == dtype:
        add(full)
        return
    temporary = torch.zeros_like(full, dtype=dtype)
    add(temporary)
    full.add_(temporary)


def _as_gradient(param: Tensor, shard: Tensor) -> Tensor:
    """``shard`` as ``param``'s gradient: a DTensor with the parameter's mesh and placement."""
    if not isinstance(param, DTensor):
        return shard
    return DTensor.from_local(
        shard,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )
