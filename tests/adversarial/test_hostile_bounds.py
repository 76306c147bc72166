"""Upper bounds (issue 21, Build 7): a huge count or size is refused with one line stating the
bound, at once, instead of growing memory or showing a bar of thousands of hours."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import yaml

from dpledger.errors import ParamsError
from dpledger.params import bounds, check_dataset_size, parse_params


def _params(section: str | None, key: str, value) -> dict:
    raw = yaml.safe_load(open("params.yaml"))
    (raw if section is None else raw[section])[key] = value
    return raw


@pytest.mark.parametrize(
    "section, key, value, bound",
    [
        ("audit", "observations", 10**12, bounds.MAX_AUDIT_OBSERVATIONS),
        ("audit", "dpsgd_observations", 10**9, bounds.MAX_DPSGD_OBSERVATIONS),
        ("audit", "pattern_observations", 10**9, bounds.MAX_PATTERN_OBSERVATIONS),
        ("batching", "epochs", 10**9, bounds.MAX_EPOCHS),
    ],
)
def test_huge_counts_in_params_are_refused_with_their_bound(section, key, value, bound):
    with pytest.raises(ParamsError) as error:
        parse_params(_params(section, key, value))
    assert str(error.value) == (
        f"params: {section}.{key} = {value} is invalid: Input should be less than or equal to "
        f"{bound}"
    )


def test_steps_beyond_the_bound_are_refused_once_the_dataset_size_is_known():
    params = parse_params(_params("batching", "epochs", bounds.MAX_EPOCHS))
    params = params.model_copy(
        update={"batching": params.batching.model_copy(update={"batch_size": 1})}
    )
    with pytest.raises(
        ParamsError,
        match=r"is too large: 143,800,000 training steps exceeds the limit of 10,000,000",
    ):
        check_dataset_size(params, 1438)


def test_a_schedule_beyond_the_machine_memory_is_refused(monkeypatch):
    monkeypatch.setattr(bounds, "machine_memory", lambda: 1 << 30)
    params = parse_params(_params("batching", "epochs", 10_000))
    params = params.model_copy(
        update={"batching": params.batching.model_copy(update={"batch_size": 10_000})}
    )
    with pytest.raises(
        ParamsError,
        match=r"schedule of batching.epochs = 10000 over 50000 examples is too large: "
        r"it needs about 7.5 GiB of memory, more than half of this machine's 1.0 GiB",
    ):
        check_dataset_size(params, 50_000)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"hidden": [-1]},
            "train.model_options.hidden = -1 is invalid: sizes are integers in [1, 1,000,000]",
        ),
        ({"hidden": [10**9]}, "train.model_options.hidden = 1000000000 is invalid"),
        (
            {"hidden": [100_000, 100_000]},
            "10,007,600,010 parameters exceeds the limit of 1,000,000,000 parameters",
        ),
        ({"hidden": 5}, "TypeError: 'int' object is not iterable"),
        ({"activation": "swish"}, "KeyError: 'swish'"),
        ({"hidden": [True]}, "sizes are integers"),
    ],
)
def test_bad_or_huge_model_options_are_one_line_before_any_allocation(options, message):
    from dpledger.models import build_model

    started = time.perf_counter()
    with pytest.raises(ParamsError) as error:
        build_model("mlp", (1, 8, 8), 10, **options)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert time.perf_counter() - started < 5.0  # a meta-device build: no 40 GB allocation attempted


def test_a_transformer_whose_heads_do_not_divide_its_width_is_refused_up_front():
    from dpledger.models import build_model

    with pytest.raises(ParamsError, match="are invalid for model 'transformer': RuntimeError"):
        build_model("transformer", (1, 8, 8), 10, dim=10, heads=3)


def test_the_meta_check_leaves_the_seeded_weights_unchanged():
    import torch

    from dpledger.models import MODELS, build_model

    torch.manual_seed(0)
    built = build_model("cnn", (1, 8, 8), 10)
    torch.manual_seed(0)
    direct = MODELS["cnn"]((1, 8, 8), 10)
    assert all(torch.equal(a, b) for a, b in zip(built.parameters(), direct.parameters()))


def test_audit_functions_refuse_huge_runs_at_once():
    from dpledger.audit.bgm import BgmAudit, audit_bgm
    from dpledger.audit.dpsgd import DpsgdAudit, audit_dpsgd
    from dpledger.audit.selfcheck import run_selfcheck

    small = BgmAudit(
        "poisson",
        dataset_size=100,
        batch_size=1,
        epochs=1,
        noise_multiplier=1.0,
        observations=2,
        delta=1e-5,
    )
    with pytest.raises(ParamsError, match="must be at most 100,000,000"):
        audit_bgm(replace(small, observations=10**12, progress=False))
    with pytest.raises(ParamsError, match="draws exceeds the limit of 50,000,000,000 draws"):
        audit_bgm(
            replace(small, dataset_size=10_000, epochs=100, observations=10**8, progress=False)
        )
    digits = BgmAudit(
        "shuffle",
        dataset_size=64,
        batch_size=64,
        epochs=1,
        noise_multiplier=1.0,
        observations=1000,
        delta=1e-5,
    )
    with pytest.raises(ParamsError, match="10,000 training runs"):
        audit_dpsgd(DpsgdAudit(replace(digits, observations=10**9)))
    with pytest.raises(ParamsError, match="epochs of training"):
        audit_dpsgd(DpsgdAudit(replace(digits, epochs=10**6)))
    with pytest.raises(ParamsError, match="games exceeds the limit"):
        run_selfcheck(repeats=10**6, observations=10**6, progress=False)
