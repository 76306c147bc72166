"""Several training processes on ``torch.distributed``: launching the ranks, and each rank's share
of a batch.

``train.processes: N`` (N > 1) makes the train stage spawn N ranks with ``torch.multiprocessing``
(start method spawn), which meet at a ``file://`` rendezvous in a fresh temporary folder; under
``torchrun`` (its environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``…) the stage
joins torchrun's group instead, so one node with N GPUs or several machines use torchrun's own
rendezvous flags. The backend is ``nccl`` on CUDA (rank r on ``cuda:LOCAL_RANK``) and ``gloo`` on
the CPU.

Every rank reads the same schedule and takes a contiguous, disjoint share of each logical batch (a
batch of n rows gives rank r the rows [⌊n·r/N⌋, ⌊n·(r+1)/N⌋): uneven and empty batches included — a
rank with no rows still joins the step's all-reduce). No rank samples anything. Rank 0 alone writes
checkpoints, the ledger and the outputs. A rank that dies stops the run: the spawning parent sees it
exit at once, stops the others and raises one line; a rank that hangs is cut off by the collective
timeout.
"""

from __future__ import annotations

import io
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from torch.multiprocessing.spawn import ProcessException, ProcessExitedException

from dpledger.engine.distributed import rank_span
from dpledger.errors import DpledgerError, ParamsError

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for a missing rank before the run fails (instead of hanging)."""
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in the run: its rank, the world size, and the process group (None
    alone)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    group: dist.ProcessGroup | None = None

    @property
    def writes(self) -> bool:
        """Rank 0 writes checkpoints, the ledger and the outputs; the others only train."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This rank's device: ``cuda:LOCAL_RANK`` on CUDA (made current), the CPU as it is."""
        if device.type != "cuda" or self.group is None:
            return device
        local = torch.device("cuda", self.local_rank)
        torch.cuda.set_device(local)
        return local

    def check_same_start(
        self, steps_done: int, model: torch.nn.Module, device: torch.device
    ) -> None:
        """Refuse ranks that start (or resume) from different checkpoints: steps and parameters must
        agree."""
        if self.group is None:
            return
        mine = torch.tensor([steps_done, _checksum(model, self.group)], dtype=torch.float64)
        mine = mine.to(device)
        lowest, highest = rank_span(mine, self.group)
        if not torch.equal(highest, lowest):
            raise DpledgerError(
                "train: the ranks start from different states "
                f"(steps {int(lowest[0])}…{int(highest[0])}): "
                "every rank must read the same artifacts/train/checkpoint.json "
                "(on several machines: a shared project folder)"
            )


def _checksum(model: torch.nn.Module, group: dist.ProcessGroup) -> float:
    """The sum of every parameter entry; a sharded (DTensor) parameter's shards are summed over the
    ranks, so the checksum is of the whole model on every rank (it then cannot tell a rank whose
    shards came from another checkpoint of the same step; the steps still differ otherwise)."""
    plain, shards = 0.0, torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        if isinstance(p, DTensor):
            shards += p.to_local().detach().double().sum().cpu()
        else:
            plain += float(p.detach().double().sum())
    if any(isinstance(p, DTensor) for p in model.parameters()):
        shards = shards.to(next(iter(model.parameters())).to_local().device)
        dist.all_reduce(shards, group=group)
    return plain + float(shards)


SINGLE = Ranks()
"""One process, no process group: the train stage as it always ran."""


def backend_for(device: torch.device) -> str:
    """nccl for CUDA devices, gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def under_torchrun() -> bool:
    """True when torchrun (or another launcher with its environment) started this process."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


TrainFunction = Callable[..., dict[str, Any]]
"""``train(params, root, ranks) -> metrics`` (the metrics of rank 0; the others return {})."""


def run_ranks(
    train: TrainFunction, params: Any, root: Path, processes: int, device: torch.device
) -> dict[str, Any]:
    """Run ``train`` once per rank: in this process alone, under torchrun's group, or in
    ``processes`` spawned ranks."""
    if under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        if processes not in (1, world_size):
            raise ParamsError(
                "params: "
                f"train.processes = {processes} is invalid under torchrun with {world_size} processes: "  # noqa: E501
                "use 1 (torchrun decides) or the same number"
            )
        check_local_rank(int(os.environ["LOCAL_RANK"]), device)
        ranks = join_group(
            int(os.environ["RANK"]), world_size, int(os.environ["LOCAL_RANK"]), "env://", device
        )
        try:
            return train(params, root, ranks)
        finally:
            dist.destroy_process_group()
    if processes == 1:
        return train(params, root, SINGLE)
    return spawn_ranks(train, (params, root), processes, device)


def check_local_rank(local_rank: int, device: torch.device) -> None:
    """One line instead of CUDA's "invalid device ordinal" when torchrun starts more ranks than
    GPUs."""
    if device.type == "cuda" and local_rank >= torch.cuda.device_count():
        raise ParamsError(
            f"torchrun: local rank {local_rank} has no GPU: "
            f"only {torch.cuda.device_count()} CUDA devices are visible on this machine; "
            "start at most that many processes per node (--nproc-per-node)"
        )


def join_group(
    rank: int, world_size: int, local_rank: int, init_method: str, device: torch.device
) -> Ranks:
    """Initialise the default process group (backend from ``device``, collective timeout set) and
    describe it."""
    dist.init_process_group(
        backend_for(device),
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return Ranks(rank, world_size, local_rank, dist.group.WORLD)


def spawn_ranks(
    function: Callable[..., Any], args: tuple, processes: int, device: torch.device
) -> Any:
    """Call ``function(*args, ranks)`` in ``processes`` spawned ranks; return rank 0's result.

    A rank that dies (killed, crashed) or raises stops the others and the run fails with one line
    naming it; a :class:`DpledgerError` raised by a rank is raised here as it is."""
    if device.type == "cuda" and torch.cuda.device_count() < processes:
        raise ParamsError(
            f"params: train.processes = {processes} is invalid: "
            f"only {torch.cuda.device_count()} CUDA devices are visible"
        )
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="dpledger-rendezvous-") as folder:
        init_method = Path(folder, "store").as_uri()
        threads = (
            max(1, torch.get_num_threads() // processes)
            if device.type == "cpu"
            else torch.get_num_threads()
        )
        spawned = mp.start_processes(
            _rank_main,
            args=(function, args, processes, init_method, device, threads, results),
            nprocs=processes,
            join=False,
            start_method="spawn",
        )
        outcome: list[tuple[str, int, Any]] = []
        try:
            # drained while waiting: a result larger than the pipe's buffer blocks its rank's put
            while not spawned.join(timeout=0.05):
                outcome += _drain(results)
        except ProcessException as error:
            raise _failure(error, spawned.processes, results, outcome) from None
    outcome += _drain(results)
    return next(
        torch.load(io.BytesIO(value), weights_only=False)
        for kind, rank, value in outcome
        if kind == "result" and rank == 0
    )


def _failure(
    error: ProcessException, processes: list, results: Any, drained: list[tuple[str, int, Any]]
) -> DpledgerError:
    """One line for a failed run: a rank's own user error as it is, else the rank that died first
    and how.

    A rank that died (killed: negative exit code, or exited non-zero without raising) makes its
    peers raise connection errors; the dead rank, not the peer that noticed, is named. Ranks that
    torch stopped after the failure exit by SIGTERM and are not blamed."""
    user_errors = [value for kind, _, value in drained + _drain(results) if kind == "error"]
    if user_errors:
        return DpledgerError(user_errors[0])
    world = len(processes)
    suspects = [error.error_index] if isinstance(error, ProcessExitedException) else []
    suspects += [
        rank
        for rank, process in enumerate(processes)
        if process.exitcode not in (None, 0, 1, -signal.SIGTERM) and rank not in suspects
    ]
    if suspects:
        rank = suspects[0]
        code = processes[rank].exitcode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return DpledgerError(
            f"train: rank {rank} of {world} died ({how}); the other ranks were stopped; "
            "rerun to resume from the last checkpoint"
        )
    last = (str(error).strip().splitlines() or ["?"])[-1]
    return DpledgerError(f"train: rank {error.error_index} of {world} failed: {last}")


def _drain(results: Any) -> list[tuple[str, int, Any]]:
    items = []
    while not results.empty():
        items.append(results.get())
    return items


def _rank_main(
    rank: int,
    function: Callable[..., Any],
    args: tuple,
    world_size: int,
    init_method: str,
    device: torch.device,
    threads: int,
    results: Any,
) -> None:
    """One spawned rank: join the group, run, report (rank 0's result, or a user error's one line)
    and leave."""
    torch.set_num_threads(threads)
    ranks = join_group(rank, world_size, rank, init_method, device)
    try:
        value = function(*args, ranks)
    except DpledgerError as error:
        results.put(("error", rank, str(error)))
        raise SystemExit(2) from None
    finally:
        dist.destroy_process_group()
    payload = io.BytesIO()
    # bytes: a tensor shared by handle would die with this process
    torch.save(value if rank == 0 else None, payload)
    results.put(("result", rank, payload.getvalue()))
