"""One device resolver (issue 31): train.device and the Monte Carlo accountant's device resolve
alike."""

from __future__ import annotations

import pytest
import torch

from dpledger.devices import resolve_device
from dpledger.engine.device import select_device
from dpledger.errors import ParamsError


@pytest.mark.parametrize("name", ["auto", "cpu"])
def test_training_and_accounting_resolve_a_setting_to_the_same_device(name):
    assert select_device(name) == resolve_device(name)


@pytest.mark.parametrize("name", ["gpu", "cuda0", "tpu"])
def test_an_unknown_device_is_one_line_naming_the_key(name):
    with pytest.raises(
        ParamsError, match=rf"params: train.device = '{name}' is invalid: allowed values"
    ):
        select_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is present")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_refused_never_a_silent_cpu(name):
    with pytest.raises(ParamsError, match="no CUDA device is available"):
        resolve_device(name)
