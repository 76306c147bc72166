"""The guard (sampler accounted == sampler used) and plugin samplers following the documented
protocol."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from dpledger.accounting.description import describe
from dpledger.errors import ParamsError, SamplerMismatchError
from dpledger.sampling import (
    ACCOUNTED_SAMPLERS,
    SAMPLERS,
    build_sampler,
    build_schedule,
    check_schedule,
)

PLUGIN_SOURCE = textwrap.dedent(
    """
    import numpy as np

    def coins(dataset_size, batch_size, epochs, seed):
        rng = np.random.default_rng(seed)
        for _ in range(epochs * -(-dataset_size // batch_size)):
            yield np.flatnonzero(rng.random(dataset_size) < batch_size / dataset_size)

    coins.accounted_as = "poisson"

    def undeclared(dataset_size, batch_size, epochs, seed):
        return [np.arange(batch_size)] * epochs

    def out_of_range(dataset_size, batch_size, epochs, seed):
        return [np.array([dataset_size])]

    def duplicated(dataset_size, batch_size, epochs, seed):
        return [np.array([1, 1])]

    def fractional(dataset_size, batch_size, epochs, seed):
        return [np.array([0.5])]

    def nothing(dataset_size, batch_size, epochs, seed):
        return []

    def misdeclared(dataset_size, batch_size, epochs, seed):
        return [np.arange(batch_size)]

    misdeclared.accounted_as = "shuffle"
    not_callable = 3
    """
)


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_samplers.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_samplers"
    sys.modules.pop("my_samplers", None)


def schedule_of(name: str, **options):
    return build_schedule(name, dataset_size=50, batch_size=5, epochs=2, seed=0, **options)


def run(sampler: str, dataset_size: int = 50, batch_size: int = 5, epochs: int = 2):
    """The accounted description of a run (what a calibration record carries)."""
    return describe(
        sampler=sampler, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs
    )


@pytest.mark.parametrize("accounted", ACCOUNTED_SAMPLERS)
def test_each_accounted_sampler_matches_its_own_schedule_and_no_other(accounted):
    schedule = schedule_of(accounted)
    assert check_schedule(run(accounted), schedule, allow_mismatch=False).matches
    for other in set(ACCOUNTED_SAMPLERS) - {accounted}:
        with pytest.raises(
            SamplerMismatchError, match=f"sampler '{accounted}' \\(accounted '{other}'\\)"
        ):
            check_schedule(run(other), schedule, allow_mismatch=False)


@pytest.mark.parametrize("used", sorted(set(SAMPLERS) - set(ACCOUNTED_SAMPLERS)))
def test_unaccounted_samplers_match_no_accountant(used):
    options = {"buffer_size": 10} if used == "partial-shuffle" else {}
    schedule = schedule_of(used, **options)
    for accounted in ACCOUNTED_SAMPLERS:
        with pytest.raises(SamplerMismatchError, match="train.allow_sampler_mismatch: true"):
            check_schedule(run(accounted), schedule, allow_mismatch=False)


def test_allowed_mismatch_passes_and_carries_the_warning_for_the_report():
    check = check_schedule(run("poisson"), schedule_of("shuffle"), allow_mismatch=True)
    assert not check.matches and check.allowed_mismatch
    assert "assumed the 'poisson' sampler but training used 'shuffle'" in check.warning()
    assert "No sound accountant exists for 'shuffle'" in check.warning()
    assert check.to_metrics() == {
        "sampler_accounted": "poisson",
        "sampler_used": "shuffle",
        "sampler_mismatch": True,
    }


@pytest.mark.parametrize("accounted", ACCOUNTED_SAMPLERS)
def test_schedule_sizes_must_be_the_accounted_ones(accounted):
    check_schedule(run(accounted), schedule_of(accounted), allow_mismatch=False)
    # fewer epochs: a prefix
    check_schedule(run(accounted, epochs=3), schedule_of(accounted), allow_mismatch=False)
    # q = 0.2, not 0.1
    bigger = build_schedule(accounted, dataset_size=50, batch_size=10, epochs=2, seed=0)
    with pytest.raises(SamplerMismatchError, match="batch_size 10 \\(accounted 5\\)"):
        check_schedule(run(accounted), bigger, allow_mismatch=False)
    with pytest.raises(SamplerMismatchError, match="dataset_size 50 \\(accounted 40\\)"):
        check_schedule(
            run(accounted, dataset_size=40), schedule_of(accounted), allow_mismatch=False
        )
    with pytest.raises(SamplerMismatchError, match="epochs 2 \\(accounted 1\\)"):
        check_schedule(run(accounted, epochs=1), schedule_of(accounted), allow_mismatch=False)


def test_one_comparison_names_every_field_that_differs():
    bigger = build_schedule("balls-in-bins", dataset_size=60, batch_size=10, epochs=3, seed=0)
    with pytest.raises(SamplerMismatchError) as refused:
        check_schedule(run("balls-in-bins"), bigger, allow_mismatch=True)
    named = str(refused.value)
    for field in (
        "dataset_size 60",
        "batch_size 10",
        "sample_rate",
        "batches_per_epoch 6",
        "epochs 3",
    ):
        assert field in named
    assert "\n" not in named


def test_a_sampler_mismatch_with_other_sizes_is_refused_even_when_mismatch_is_allowed():
    with pytest.raises(SamplerMismatchError, match="sampler 'shuffle' .*batch_size 10"):
        check_schedule(
            run("poisson"),
            build_schedule("shuffle", dataset_size=50, batch_size=10, epochs=2, seed=0),
            allow_mismatch=True,
        )


@pytest.mark.parametrize(
    "accounted,options,message",
    [
        ("poisson", {"sample_rate": 0.3}, "sample_rate 0.3"),
        ("balls-in-bins", {"bins": 4}, "batches_per_epoch 4"),
        ("balls-in-bins-redrawn", {"bins": 4, "pad_truncate": True}, "batches_per_epoch 4"),
    ],
)
def test_sampler_options_other_than_the_accounted_rate_or_bins_are_refused(
    accounted, options, message
):
    schedule = schedule_of(accounted, **options)
    with pytest.raises(SamplerMismatchError, match=message):
        check_schedule(run(accounted), schedule, allow_mismatch=False)


def test_pad_truncate_is_accounted_as_balls_in_bins():
    schedule = schedule_of("balls-in-bins", pad_truncate=True)
    check = check_schedule(run("balls-in-bins"), schedule, allow_mismatch=False)
    assert check.matches and check.warning() is None and check.assumption() is None


def test_plugin_declaring_poisson_passes_the_guard_and_says_it_is_a_declaration(plugin_module):
    schedule = schedule_of(f"{plugin_module}:coins")
    assert (
        schedule.sampler == "my_samplers:coins"
        and schedule.sampler_params["accounted_as"] == "poisson"
    )
    check = check_schedule(run("poisson"), schedule, allow_mismatch=False)
    assert check.matches and "declares itself equivalent to 'poisson'" in check.assumption()
    with pytest.raises(SamplerMismatchError, match="declared equivalent to 'poisson'"):
        check_schedule(run("fixed"), schedule, allow_mismatch=False)


def test_plugin_without_declaration_matches_no_accountant(plugin_module):
    schedule = schedule_of(f"{plugin_module}:undeclared")
    assert schedule.num_steps == 2 and schedule.steps_per_epoch == 1
    with pytest.raises(SamplerMismatchError):
        check_schedule(run("poisson"), schedule, allow_mismatch=False)


def test_plugin_schedule_is_deterministic_and_streams_as_a_batch_sampler(plugin_module):
    first, again = schedule_of(f"{plugin_module}:coins"), schedule_of(f"{plugin_module}:coins")
    assert np.array_equal(first.indices, again.indices) and first.num_steps == 20
    sampler = build_sampler(
        f"{plugin_module}:coins", dataset_size=50, batch_size=5, epochs=2, seed=0
    )
    assert [np.asarray(b) for b in sampler][3].tolist() == first.batch(3)[0].tolist()
    assert [b.indices.tolist() for b in sampler.batches(18)] == [
        first.batch(t)[0].tolist() for t in (18, 19)
    ]


@pytest.mark.parametrize(
    "attribute, message",
    [
        ("out_of_range", "outside \\[0, 50\\)"),
        ("duplicated", "the same example twice"),
        ("fractional", "1-D integer array"),
        ("nothing", "yielded no batch"),
        ("misdeclared", "accounted_as = 'shuffle' is not one of"),
        ("not_callable", "is not callable"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_bad_plugins_are_refused_with_one_line(plugin_module, attribute, message):
    with pytest.raises(ParamsError, match=message) as caught:
        schedule_of(f"{plugin_module}:{attribute}")
    assert "\n" not in str(caught.value)


def test_unimportable_plugin_module_is_refused():
    with pytest.raises(ParamsError, match="cannot import module 'no_such_module_here'"):
        schedule_of("no_such_module_here:sampler")
