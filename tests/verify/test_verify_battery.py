"""The battery on correct trainers (ours, Opacus, the engine) and on every zoo member."""

import pytest

from dpledger.params import load_params
from dpledger.params.verify import VerifyParams
from dpledger.pipeline.verify import battery_task
from dpledger.verify.battery import TEST_NAMES, run_battery
from dpledger.verify.engine_check import run_engine_self_check
from dpledger.verify.flawed_trainers import ZOO, zoo_trainer
from dpledger.verify.protocol import load_trainer
from dpledger.verify.self_check import classified_correctly, self_check
from dpledger.verify.task import make_task

MAX_TRAINING_STEPS = 400


@pytest.mark.parametrize("trainer", ["reference", "opacus", "dpledger"])
def test_correct_trainers_pass_every_test_within_the_step_budget(trainer):
    result = run_battery(load_trainer(trainer), trainer_name=trainer, seed=1, progress=False)
    assert result.passed, result.findings
    assert [test.name for test in result.tests] == list(TEST_NAMES)
    assert result.training_steps <= MAX_TRAINING_STEPS
    assert (
        result.training_steps
        == sum(test.steps for test in result.tests) + result.heuristics["steps"]
    )


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_trainer_is_caught_by_the_tests_meant_for_it(name):
    result = run_battery(zoo_trainer(name), trainer_name=name, seed=1, progress=False)
    assert not result.passed
    assert set(ZOO[name].caught_by) <= set(result.failed_tests), result.findings


def test_mini_batch_clipping_gets_the_plain_language_diagnosis():
    result = run_battery(
        zoo_trainer("mini_batch_clipping"), trainer_name="mb", seed=2, progress=False
    )
    t2 = next(test for test in result.tests if test.name == "t2_minibatch_clipping")
    assert "clipping happens after averaging" in t2.diagnosis and "factor of B" in t2.diagnosis
    assert t2.p_value == 1.0
    assert any(finding.startswith("t2_minibatch_clipping: FAILED") for finding in result.findings)


def test_adam_mode_warms_up_skips_sgd_only_tests_and_still_catches_clipping_and_noise_bugs():
    correct = run_battery(
        load_trainer("opacus"), trainer_name="opacus", seed=0, optimizer="adam", progress=False
    )
    assert correct.passed, correct.findings
    assert correct.heuristics["warmup_steps"] == 5
    assert {t.name for t in correct.tests if t.skipped} == {
        "sensitivity",
        "ks_update_distribution",
        "noise_scale",
        "noise_independence",
    }
    assert correct.heuristics["t3_noise_multiplier"] < 0.01
    for name, test in (
        ("no_clipping", "t1_no_clipping"),
        ("mini_batch_clipping", "t2_minibatch_clipping"),
        ("uncalibrated_noise", "t3_noise_calibration"),
    ):
        result = run_battery(
            zoo_trainer(name), trainer_name=name, seed=0, optimizer="adam", progress=False
        )
        assert test in result.failed_tests, (name, result.findings)


@pytest.mark.slow
def test_self_check_classifies_every_trainer_over_three_seeds():
    rows = self_check(
        range(3), trainers=("reference", "opacus") + tuple(f"zoo:{name}" for name in ZOO)
    )
    assert all(row.correct == row.seeds for row in rows), [row.to_json() for row in rows]


def test_classification_requires_the_designated_tests_to_fail():
    result = run_battery(
        zoo_trainer("per_tensor_clipping"), trainer_name="pt", seed=0, progress=False
    )
    assert classified_correctly("zoo:per_tensor_clipping", result)
    assert not classified_correctly("reference", result)


def test_the_engine_self_check_passes_on_the_synthetic_model_in_every_clipping_mode():
    result = run_engine_self_check(make_task(0))
    assert result.passed and result.name == "engine_self_check" and result.p_value == 1.0
    assert result.statistic < 1e-3  # max relative error / tolerance
    assert {"flat", "per-layer", "automatic"} <= set(result.details)
    modes = ("flat", "per-layer", "automatic")
    assert all(result.details[mode]["dtype"] == "float64" for mode in modes)


def test_with_model_train_the_engine_self_check_names_a_wrong_rule_of_the_users_model(repo_root):
    params = load_params(repo_root / "params.yaml")
    train = params.train.model_copy(update={"model": "helpers.wrong_rules:make_nudged_model"})
    params = params.model_copy(update={"train": train, "verify": VerifyParams(model="train")})
    result = run_engine_self_check(battery_task(params))
    assert not result.passed and result.p_value == 0.0
    assert "NudgedLinear" in result.diagnosis and "flat clipping" in result.diagnosis
