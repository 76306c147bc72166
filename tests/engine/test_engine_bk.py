"""The BK engine as a trainer: equal to the reference step for step, noise, canaries, accumulation,
errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from dpledger.engine import (
    BKEngine,
    NoiseSource,
    ReferenceTrainer,
    UnsupportedLayerError,
    make_optimizer,
)
from dpledger.errors import ParamsError
from dpledger.models import build_model
from dpledger.verify.consecutive import train_consecutive
from helpers.engine_checks import bk_clipped_sum, cross_entropy, naive_clipped_sum, relative_error


def _data(shape=(1, 8, 8), n=24, classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=generator, dtype=torch.float64), torch.randint(
        0, classes, (n,), generator=generator
    )


@pytest.mark.parametrize(
    "name,optimizer,sigma",
    [
        ("mlp", "sgd", 0.0),
        ("cnn", "momentum", 0.0),
        ("transformer", "adam", 0.0),
        ("mlp", "adam", 1.3),
    ],
)
def test_bk_training_equals_reference_trainer_step_for_step(name, optimizer, sigma):
    torch.manual_seed(0)
    model = build_model(
        name, (1, 8, 8), 4, **({"dim": 16, "depth": 1} if name == "transformer" else {})
    ).double()
    twin = copy.deepcopy(model)
    x, y = _data()
    opt_bk, opt_ref = (
        make_optimizer(optimizer, model.parameters(), 0.05),
        make_optimizer(optimizer, twin.parameters(), 0.05),
    )
    engine = BKEngine(model, opt_bk, clip_norm=0.3, noise_multiplier=sigma, normalizer=8, seed=5)
    reference = ReferenceTrainer(
        twin,
        opt_ref,
        loss_fn=cross_entropy,
        clip_norm=0.3,
        noise_multiplier=sigma,
        normalizer=8,
        seed=5,
    )
    for step in range(3):
        rows = slice(8 * step, 8 * step + 8)
        engine.private_step(cross_entropy(model(x[rows]), y[rows]))
        reference.step(x[rows], y[rows])
        for (name_, p), q in zip(model.named_parameters(), twin.parameters()):
            scale = max(float(q.detach().abs().max()), 1e-30)
            assert float((p - q).detach().abs().max()) / scale < 1e-10, (step, name_)


def test_train_consecutive_applies_the_documented_update():
    torch.manual_seed(1)
    model = nn.Linear(3, 2).double()
    start = copy.deepcopy(model)
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    train_consecutive(
        model,
        x,
        y,
        loss_fn=cross_entropy,
        clip_norm=0.7,
        noise_multiplier=2.0,
        batch_size=4,
        steps=2,
        lr=0.1,
        seed=9,
    )
    expected = copy.deepcopy(start)
    noise = NoiseSource(sum(p.numel() for p in start.parameters()), seed=9, dtype=torch.float64)
    for step, rows in enumerate([[0, 1, 2, 3], [4, 0, 1, 2]]):
        sums = naive_clipped_sum(expected, cross_entropy, x[rows], y[rows], 0.7)
        z = noise.draw(step).clone()
        with torch.no_grad():
            offset = 0
            for name, p in expected.named_parameters():
                p -= 0.1 * (sums[name] + 2.0 * 0.7 * z[offset : offset + p.numel()].view_as(p)) / 4
                offset += p.numel()
    for p, q in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-14)


def test_physical_batches_accumulate_into_one_logical_step():
    torch.manual_seed(2)
    model = build_model("mlp", (1, 8, 8), 4, hidden=[8]).double()
    twin = copy.deepcopy(model)
    x, y = _data(n=10)
    whole = BKEngine(model, None, clip_norm=0.2, noise_multiplier=0.0, normalizer=10)
    whole.private_step(cross_entropy(model(x), y))
    parts = BKEngine(twin, None, clip_norm=0.2, noise_multiplier=0.0, normalizer=10)
    for rows in (slice(0, 4), slice(4, 10)):
        parts.backward(cross_entropy(twin(x[rows]), y[rows]))
    parts.step()
    assert parts.steps_taken == whole.steps_taken == 1
    for p, q in zip(whole.params, parts.params):
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-15)


def test_canary_is_added_before_noise_and_noisy_sum_is_exposed():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.5)
    canary = [torch.full_like(p, 0.25) for p in model.parameters()]
    engine = BKEngine(
        model,
        None,
        clip_norm=0.5,
        noise_multiplier=0.0,
        normalizer=2.0,
        canary_hook=lambda step: canary,
    )
    engine.private_step(cross_entropy(model(x), y))
    for name, noisy, c in zip(engine.parameter_names, engine.last_noisy_sum, canary):
        assert torch.allclose(noisy, expected[name] + c, rtol=1e-12)
    for p, noisy in zip(engine.params, engine.last_noisy_sum):
        assert torch.allclose(p.grad, noisy / 2.0)
    with pytest.raises(ParamsError, match="one per parameter"):
        engine.private_step(cross_entropy(model(x), y), canary=canary[:1])


def test_noise_has_std_sigma_times_clip_norm_and_depends_only_on_seed_and_step():
    model = nn.Linear(200, 100)
    x = torch.zeros(3, 200)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=2.0, normalizer=1.0, seed=11)
    draws = []
    for _ in range(3):
        engine.private_step(model(x).sum(1) * 0.0)  # zero gradient: the noisy sum is pure noise
        draws.append(torch.cat([t.reshape(-1) for t in engine.last_noisy_sum]))
    noise = torch.stack(draws)
    assert abs(float(noise.std()) - 1.0) < 0.02 and abs(float(noise.mean())) < 0.02
    assert not torch.equal(noise[0], noise[1])
    replay = NoiseSource(noise.shape[1], seed=11)
    assert torch.equal(replay.draw(2) * 1.0, noise[2])


def _draw_with_threads(threads: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return NoiseSource(numel, seed=3, dtype=dtype).draw(7).clone()
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("numba_pool", [True, False], ids=["numba-pool", "own-threads"])
def test_cpu_float32_noise_is_philox_box_muller_whatever_the_thread_count(numba_pool, monkeypatch):
    from dpledger import philox_normal
    from dpledger.engine.noise import philox_key

    if not numba_pool:
        monkeypatch.setattr(philox_normal, "pool_is_usable", lambda: False)
    numel = 3 * 4 * philox_normal.LANES + 1001
    serial = _draw_with_threads(1, numel, torch.float32)
    assert torch.equal(serial, _draw_with_threads(2, numel, torch.float32))
    assert torch.equal(serial, _draw_with_threads(3, numel, torch.float32))
    expected = np.empty(numel, np.float32)
    philox_normal.fill_standard_normal(expected, philox_key(3), 7)
    assert torch.equal(serial, torch.from_numpy(expected))
    assert philox_key(3) != philox_key(4)
    scaled = torch.empty(numel)
    NoiseSource(numel, seed=3).draw_into(scaled, 7, 0.5)
    assert torch.allclose(scaled, 0.5 * serial, rtol=1e-6, atol=1e-7)


def test_other_noise_is_drawn_in_fixed_seeded_chunks_whatever_the_thread_count():
    from dpledger.engine.noise import NOISE_CHUNK, chunk_seeds

    numel = 2 * NOISE_CHUNK + 1000
    serial = _draw_with_threads(1, numel, torch.float64)
    assert torch.equal(serial, _draw_with_threads(2, numel, torch.float64))
    seeds = chunk_seeds(3, 7, 3)
    for k, seed in enumerate(seeds):
        size = min(NOISE_CHUNK, numel - k * NOISE_CHUNK)
        expected = torch.empty(size, dtype=torch.float64).normal_(
            generator=torch.Generator().manual_seed(seed)
        )
        assert torch.equal(serial[k * NOISE_CHUNK : (k + 1) * NOISE_CHUNK], expected)
    assert (
        len(set(seeds)) == 3
        and chunk_seeds(3, 7, 1) == seeds[:1]
        and chunk_seeds(3, 8, 1) != seeds[:1]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chunked_noise_below_float64_is_the_rounded_float64_draw(dtype):
    """torch's own float32 normal_ caps |z| at 5.77 (24-bit uniforms; 6.8 on CUDA): a capped tail
    leaks a δ that no accountant counts, so lower precisions round the float64 draw instead (cap
    8.57). (CPU float32 goes to Philox in training; its chunk path is the one CUDA takes.)"""
    from dpledger.engine.noise import NOISE_CHUNK

    numel = NOISE_CHUNK + 1000
    wide = NoiseSource(numel, seed=3, dtype=torch.float64).draw(7)
    source = NoiseSource(numel, seed=3, dtype=dtype)
    narrow = source._torch_chunks_into(torch.empty(numel, dtype=dtype), 7, 1.0)
    assert torch.equal(narrow, wide.to(dtype))
    scaled = source._torch_chunks_into(torch.empty(numel, dtype=dtype), 7, 0.5)
    assert torch.equal(scaled, (0.5 * wide).to(dtype))


def test_parameter_without_gradient_this_step_still_gets_noise():
    model = nn.ModuleDict({"used": nn.Linear(2, 2), "unused": nn.Linear(2, 2)})
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)
    engine.private_step(model["used"](torch.randn(4, 2)).sum(1))
    unused = dict(zip(engine.parameter_names, engine.params))["unused.weight"]
    assert unused.grad is not None and float(unused.grad.abs().sum()) > 0


def test_correlated_noise_follows_the_mechanism_stream_and_replays_on_resume():
    from dpledger.mechanisms import banded_params, noise_stream

    model = nn.Linear(30, 10)
    params = banded_params(3)
    engine = BKEngine(
        model,
        None,
        clip_norm=1.0,
        noise_multiplier=1.0,
        normalizer=1.0,
        seed=4,
        mechanism="banded",
        mechanism_params=params,
        num_steps=5,
    )
    identity = NoiseSource(310, seed=4)  # the engine transforms its own i.i.d. rows z_t by C⁻¹
    expected = list(
        noise_stream("banded", params, 5, 310, normals=lambda t: identity.draw(t).clone())
    )
    got = []
    for _ in range(5):
        engine.private_step(model(torch.zeros(2, 30)).sum(1) * 0.0)
        got.append(torch.cat([t.reshape(-1) for t in engine.last_noisy_sum]))
    for a, b in zip(got, expected):
        assert torch.allclose(a, b)
    resumed = NoiseSource(310, seed=4, mechanism="banded", mechanism_params=params, num_steps=5)
    assert torch.allclose(resumed.draw(3), expected[3])


def test_secure_noise_is_standard_normal_and_refuses_correlated_mechanisms():
    source = NoiseSource(200_000, seed=0, secure=True)
    first, second = source.draw(0).clone(), source.draw(0)
    assert abs(float(first.mean())) < 0.01 and abs(float(first.std()) - 1) < 0.01
    assert not torch.equal(first, second)
    with pytest.raises(ParamsError, match="secure_noise"):
        NoiseSource(10, seed=0, secure=True, mechanism="banded", num_steps=3)


@pytest.mark.parametrize(
    "model,named",
    [
        (lambda: nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), "1.weight"),
        (lambda: nn.Embedding(5, 3, sparse=True), "sparse"),
    ],
)
def test_unsupported_trainable_parameter_stops_with_an_error_naming_it(model, named):
    with pytest.raises(UnsupportedLayerError, match=named):
        BKEngine(model(), None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)


def test_frozen_unsupported_layer_is_allowed_and_detach_restores_requires_grad():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    model[1].requires_grad_(False)
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)
    assert not model[0].weight.requires_grad
    engine.detach()
    assert model[0].weight.requires_grad and not model[1].weight.requires_grad


def test_forward_without_backward_under_no_grad_leaves_no_record():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.5)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0)
    with torch.no_grad():
        model(torch.randn(7, 3, dtype=torch.float64))
    engine.private_step(cross_entropy(model(x), y))
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert relative_error(got, expected) < 1e-10


def test_cnn_first_layer_instantiates_and_deeper_layers_use_ghost_norm_with_less_workspace():
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.GroupNorm(2, 4),
        nn.Tanh(),
        nn.MaxPool2d(4),
        nn.Conv2d(4, 32, 3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 3),
    ).double()
    x, y = torch.rand(4, 3, 32, 32, dtype=torch.float64), torch.randint(0, 3, (4,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.1)
    hybrid, engine = bk_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.1, ghost="auto")
    assert relative_error(hybrid, expected) < 1e-10
    # 2T² vs p·d: conv 0 at 32×32: 2.1e6 > 108 and conv 4 at 8×8: 8192 > 1152 -> instantiate;
    # conv 7 at 4×4: 512 < 9216 and the Linear (T = 1): 2 < 1536 -> ghost; GroupNorm always
    # instantiates
    assert engine.layer_methods == {
        "0": "instantiate",
        "1": "instantiate",
        "4": "instantiate",
        "7": "ghost",
        "9": "ghost",
    }
    _, ghost_only = bk_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.1, ghost="always")
    _, instantiate_only = bk_clipped_sum(
        copy.deepcopy(model), cross_entropy, x, y, 0.1, ghost="never"
    )
    assert engine.last_workspace_elements < ghost_only.last_workspace_elements
    assert engine.last_workspace_elements < instantiate_only.last_workspace_elements


def test_cpu_autocast_computes_norms_in_float32():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.5)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(x)
    engine.private_step(cross_entropy(outputs.float(), y))
    assert engine.last_norms.dtype == torch.float32
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert relative_error(got, expected) < 5e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_autocast_matches_float32_reference():
    from dpledger.engine.device import autocast, select_device

    device = select_device("auto")
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to(device)
    x, y = torch.randn(32, 64, device=device), torch.randint(0, 10, (32,), device=device)
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.5)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0)
    with autocast(device, "bf16"):
        outputs = model(x)
    engine.private_step(cross_entropy(outputs.float(), y))
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert relative_error(got, expected) < 5e-2


def test_device_selection_refuses_missing_cuda_and_bad_options():
    from dpledger.engine.device import autocast, select_device

    assert select_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert select_device("auto").type == "cpu"
        with pytest.raises(ParamsError, match="train.device = 'cuda'"):
            select_device("cuda")
    with pytest.raises(ParamsError, match="train.precision"):
        autocast(torch.device("cpu"), "fp8")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clipping": "layer"}, "clipping"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"normalizer": 0}, "normalizer"),
        ({"ghost": "maybe"}, "ghost"),
    ],
)
def test_bad_engine_options_raise_one_line_errors(kwargs, match):
    options = {"clip_norm": 1.0, "noise_multiplier": 1.0, "normalizer": 1.0, **kwargs}
    with pytest.raises(ParamsError, match=match):
        BKEngine(nn.Linear(2, 2), None, **options)


def test_a_layer_in_eval_mode_inside_a_training_model_still_trains():
    """Only the model's mode decides whether a forward pass is recorded: a layer put in eval mode
    (e.g. to switch off dropout) keeps its clipped gradient instead of silently receiving only
    noise."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    model[2].eval()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.1)
    got, _ = bk_clipped_sum(model, cross_entropy, x, y, 0.1)
    assert relative_error(got, expected) < 1e-10 and float(got["2.weight"].norm()) > 0


def test_backward_without_a_recorded_forward_says_to_train_the_model():
    model = nn.Sequential(nn.Linear(4, 3))
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    model.eval()
    with pytest.raises(ParamsError, match="model.train"):
        engine.backward(cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 3, (5,))))


def test_batchnorm_with_batch_statistics_is_refused_even_when_frozen():
    """A frozen BatchNorm in training mode mixes examples: removing one example moved the clipped
    sum by 0.275 with R = 0.1, and a zero-weight padding row moved it by 0.219. Refused at the
    forward pass; in eval mode (running statistics) it is per-example and the sum equals the naive
    loop's."""
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).double()
    model[1].requires_grad_(False)
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randint(0, 2, (16,))
    twin = copy.deepcopy(model).eval()
    engine = BKEngine(model, None, clip_norm=0.1, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(
        UnsupportedLayerError, match=r"layer 1 \(BatchNorm1d\) normalises with batch statistics"
    ):
        model(x)
    # no statistics taken from the data either
    assert float(model[1].running_mean.abs().max()) == 0.0
    model[1].eval()
    expected = naive_clipped_sum(twin, cross_entropy, x, y, 0.1)
    engine.private_step(cross_entropy(model(x), y))
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert relative_error(got, expected) < 1e-10
    model.eval()
    model(x)  # an evaluation pass of the model is not training
    engine.detach()
    model.train()
    model(x)  # the hooks are gone with detach


def test_embedding_max_norm_is_refused_because_it_renormalises_rows_from_the_data():
    """max_norm rescales, in place and without noise, exactly the rows of the tokens in the batch
    (row norms 7.21 and 2.73 became 0.5, the others unchanged after one step): the released weights
    show which tokens the private batch held."""
    with pytest.raises(UnsupportedLayerError, match=r"layer 0 \(Embedding\).*max_norm"):
        BKEngine(
            nn.Sequential(nn.Embedding(6, 4, max_norm=0.5)),
            None,
            clip_norm=1.0,
            noise_multiplier=1.0,
            normalizer=1.0,
        )
    frozen = nn.Sequential(nn.Embedding(6, 4, max_norm=0.5), nn.Flatten(), nn.Linear(8, 2))
    frozen[0].requires_grad_(False)
    BKEngine(frozen, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=1.0)
    with torch.no_grad():
        frozen[0].weight.mul_(10)
    before = frozen[0].weight.clone()
    with pytest.raises(UnsupportedLayerError, match=r"layer 0 \(Embedding\).*max_norm"):
        frozen(torch.tensor([[1, 3]]))  # a frozen one would leak the same way
    assert torch.equal(frozen[0].weight, before)


def test_instance_norm_that_tracks_running_statistics_is_refused():
    """InstanceNorm normalises each example by its own statistics (per-example, exact), but with
    track_running_stats=True it also updates running_mean/var from the private batch without noise
    (running_mean went 0 -> (-0.03, 0.59) in one step); refused while training, allowed without
    tracking."""
    torch.manual_seed(10)
    x, y = torch.randn(5, 1, 6, 6, dtype=torch.float64) + 5, torch.randint(0, 2, (5,))

    def build(track):
        return nn.Sequential(
            nn.Conv2d(1, 2, 3),
            nn.InstanceNorm2d(2, track_running_stats=track),
            nn.Flatten(),
            nn.Linear(2 * 4 * 4, 2),
        ).double()

    model = build(True)
    BKEngine(model, None, clip_norm=0.1, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(
        UnsupportedLayerError, match=r"layer 1 \(InstanceNorm2d\).*running statistics"
    ):
        model(x)
    assert float(model[1].running_mean.abs().max()) == 0.0
    model = build(False)
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.1)
    got, _ = bk_clipped_sum(model, cross_entropy, x, y, 0.1)
    assert relative_error(got, expected) < 1e-10


class _InPlaceResidual(nn.Module):
    """``h += mix(h)`` changes mix's input after mix saw it; torch's own backward of a Linear whose
    weight does not need a gradient never reads that input, so nothing else notices."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place
        self.first, self.mix, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.first(x)
        if self.in_place:
            h += self.mix(h)
        else:
            h = h + self.mix(h)
        return self.head(h)


@pytest.mark.parametrize("ghost", ["always", "never"])
def test_a_layer_input_changed_in_place_after_the_layer_is_refused(ghost):
    """The in-place residual was computed from the changed input: relative error 0.26 against the
    naive loop (mix.weight off by 0.20 in norm). It is now refused, naming the layer; the
    out-of-place one is exact."""
    torch.manual_seed(0)
    model = _InPlaceResidual(False).double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 2, (5,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.3)
    got, _ = bk_clipped_sum(copy.deepcopy(model), cross_entropy, x, y, 0.3, ghost=ghost)
    assert relative_error(got, expected) < 1e-10
    model.in_place = True
    engine = BKEngine(model, None, clip_norm=0.3, noise_multiplier=0.0, normalizer=1.0, ghost=ghost)
    with pytest.raises(UnsupportedLayerError, match=r"layer mix .*changed in place"):
        engine.backward(cross_entropy(model(x), y))


class _FunctionalHead(nn.Module):
    """A head tied to the embedding by using its weight directly (F.linear or a matmul), not by a
    module."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.embed, self.mix = nn.Embedding(7, 4), nn.Linear(4, 4)

    def forward(self, tokens):
        h = torch.tanh(self.mix(self.embed(tokens)))
        if self.form == "linear":
            return torch.nn.functional.linear(h, self.embed.weight).sum(1)
        if self.form == "matmul":
            return (h @ self.embed.weight.T).sum(1)
        with torch.no_grad():  # a use that takes no gradient is fine
            scale = self.embed.weight.norm()
        return (
            h * scale.detach() + h.to(self.embed.weight.dtype) * 0 + self.mix.weight.shape[0]
        ).sum(1)


@pytest.mark.parametrize("form", ["linear", "matmul"])
def test_a_parameter_used_outside_its_layer_is_refused(form):
    """Ghost differentiation turns requires_grad off, so a use of embed.weight outside embed's
    forward got no gradient at all: the clipped sum was off by 1.12 (relative) from the naive loop,
    silently. Refused at the first training forward pass; tie modules instead (head.weight =
    embed.weight, exact above)."""
    model = _FunctionalHead(form)
    BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    tokens = torch.randint(0, 7, (3, 5))
    with pytest.raises(UnsupportedLayerError, match=r"embed\.weight .*outside"):
        model(tokens)


def test_gradient_free_uses_of_a_parameter_outside_its_layer_are_allowed():
    torch.manual_seed(11)
    model = _FunctionalHead("free").double()
    tokens, targets = torch.randint(0, 7, (4, 5)), torch.randint(0, 4, (4,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, tokens, targets, 0.2)
    got, _ = bk_clipped_sum(model, cross_entropy, tokens, targets, 0.2)
    assert relative_error(got, expected) < 1e-10
