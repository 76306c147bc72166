"""Two torchrun "nodes" on localhost (``--nnodes 2 --nproc-per-node 1``, c10d rendezvous) train the
tiny GPT-2 sharded by FSDP2 and end with the model one process trains with the same seed (float64,
1e-10 relative): the multi-node path is the same code as the spawned ranks, with torchrun's
rendezvous."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from test_fsdp_engine import TOL, _single_run

TESTS = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_with_c10d_rendezvous_train_the_single_process_model(tmp_path):
    out, port = tmp_path / "model.pt", _free_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "dpledger-fsdp-test",
        str(TESTS / "fsdp_torchrun_worker.py"),
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    logs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(logs)[-3000:]
    saved = torch.load(out)
    assert saved["world"] == 2
    single = _single_run("gpt2")["state"]
    for key, value in single.items():
        torch.testing.assert_close(saved["state"][key], value, **TOL)
