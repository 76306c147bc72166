"""The reference trainer against a naive DP-SGD loop, Opacus against the reference, and the zoo's
flaws."""

import copy

import pytest
import torch
from torch.func import functional_call, grad, vmap

from dpledger.verify import opacus_trainer
from dpledger.verify.functorch_trainer import Flaws, train, train_with_flaws
from dpledger.verify.task import (
    flat_parameters,
    make_task,
    per_example_gradient_norms,
    weighted_half_mse,
)


@pytest.fixture(scope="module")
def task():
    return make_task(3)


def _batch(task, size=6):
    inputs, targets = task.ordinary_rows(0, size)
    inputs[1], targets[1] = task.probe_input[0], task.probe_target[0]
    return inputs, targets


def _naive_step(task, inputs, targets, clip_norm, noise, lr):
    """000 Alg. 1 by an explicit loop over examples."""
    model = copy.deepcopy(task.model)
    clipped = [torch.zeros_like(p) for p in model.parameters()]
    for row in range(inputs.shape[0]):
        model.zero_grad()
        weighted_half_mse(model(inputs[row : row + 1]), targets[row : row + 1]).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        factor = min(1.0, clip_norm / float(norm)) if norm > 0 else 1.0
        clipped = [c + factor * g for c, g in zip(clipped, grads)]
    with torch.no_grad():
        for p, c, z in zip(model.parameters(), clipped, noise):
            p -= lr * (c + z) / inputs.shape[0]
    return flat_parameters(model)


def _trained(trainer, task, inputs, targets, **settings):
    model = copy.deepcopy(task.model)
    trainer(model, inputs, targets, loss_fn=weighted_half_mse, **settings)
    return flat_parameters(model)


def test_reference_step_equals_naive_loop_with_the_same_noise(task):
    inputs, targets = _batch(task)
    clip_norm, sigma, lr, seed = 1.5, 0.7, 0.1, 11
    generator = torch.Generator().manual_seed(seed)
    noise = [
        torch.normal(0.0, sigma * clip_norm, size=p.shape, generator=generator)
        for p in task.model.parameters()
    ]
    expected = _naive_step(task, inputs, targets, clip_norm, noise, lr)
    got = _trained(
        train,
        task,
        inputs,
        targets,
        clip_norm=clip_norm,
        noise_multiplier=sigma,
        batch_size=6,
        steps=1,
        lr=lr,
        seed=seed,
    )
    assert torch.allclose(got, expected, atol=1e-6)


def test_opacus_matches_the_reference_without_noise(task):
    inputs, targets = _batch(task)
    settings = dict(clip_norm=1.0, noise_multiplier=0.0, batch_size=3, steps=2, lr=0.2, seed=0)
    assert torch.allclose(
        _trained(opacus_trainer.train, task, inputs, targets, **settings),
        _trained(train, task, inputs, targets, **settings),
        atol=1e-6,
    )


def test_zero_weight_rows_have_zero_gradient_and_the_probe_dominates(task):
    inputs, targets = task.zero_rows(4)
    assert torch.all(per_example_gradient_norms(task.model, inputs, targets) == 0)
    assert task.probe_norm >= 20 * float(task.ordinary_norms.max())
    assert float(
        per_example_gradient_norms(task.model, task.probe_input, task.probe_target)[0]
    ) == pytest.approx(task.probe_norm, rel=1e-5)


def test_per_example_gradient_norms_match_torch_func(task):
    params = {k: v.detach() for k, v in task.model.named_parameters()}

    def loss(p, x, y):
        return weighted_half_mse(
            functional_call(task.model, p, (x.unsqueeze(0),)), y.unsqueeze(0)
        ).sum()

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, task.inputs[:5], task.targets[:5])
    norms = torch.sqrt(sum(g.reshape(5, -1).pow(2).sum(1) for g in grads.values()))
    assert torch.allclose(
        per_example_gradient_norms(task.model, task.inputs[:5], task.targets[:5]).float(),
        norms,
        rtol=1e-5,
    )


def test_mini_batch_flaw_clips_the_mean_gradient(task):
    inputs, targets = _batch(task)
    clip_norm, lr = 0.5, 0.1
    unclipped = _trained(
        train_with_flaws,
        task,
        inputs,
        targets,
        clip_norm=1e9,
        noise_multiplier=0.0,
        batch_size=6,
        steps=1,
        lr=lr,
        seed=0,
        flaws=Flaws(clipping="mini_batch"),
    )
    clipped = _trained(
        train_with_flaws,
        task,
        inputs,
        targets,
        clip_norm=clip_norm,
        noise_multiplier=0.0,
        batch_size=6,
        steps=1,
        lr=lr,
        seed=0,
        flaws=Flaws(clipping="mini_batch"),
    )
    start = flat_parameters(task.model)
    assert float(torch.linalg.vector_norm(clipped - start)) == pytest.approx(
        lr * clip_norm, rel=1e-5
    )
    direction = torch.nn.functional.cosine_similarity(clipped - start, unclipped - start, dim=0)
    assert float(direction) == pytest.approx(1.0, abs=1e-6)
