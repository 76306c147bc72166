"""The verify battery against the distributed trainer: the correct build passes, wrong builds are
caught.

The battery is seeded (data, noise), so each verdict here is deterministic; the wrong builds are the
distributed path's own likely bugs: the noise added on every rank (√2 times the noise on 2 ranks)
and the clipping done after the all-reduce (on the sum instead of per example).
"""

from __future__ import annotations

import pytest

from dpledger.verify.battery import run_battery
from dpledger.verify.protocol import load_trainer


def test_the_correct_distributed_trainer_passes_the_battery():
    result = run_battery(
        load_trainer("distributed"), trainer_name="distributed", seed=0, progress=False
    )
    assert result.passed, result.failed_tests


@pytest.mark.parametrize(
    "flaw,caught_by",
    [
        ("noise_on_every_rank", "ks_update_distribution"),
        ("clipping_after_all_reduce", "sensitivity"),
    ],
)
def test_a_wrongly_built_distributed_trainer_is_caught(flaw, caught_by):
    spec = f"dpledger.verify.distributed_trainer:train_{flaw}"
    result = run_battery(load_trainer(spec), trainer_name=spec, seed=0, progress=False)
    assert not result.passed and caught_by in result.failed_tests, result.failed_tests
