"""FSDPEngine on 2 gloo ranks: tiny GPT-2 and Llama (with and without LoRA), float64, parameters
sharded by fully_shard per block.

Each rank feeds its own rows of every batch (uneven shares: 2 and 3 of 5). The released noisy sums
(gathered whole) and the trained model must equal, to float64 rounding (1e-10 relative), both a
naive per-example autograd loop (one backward per example, flat clipping, the same noise vector
drawn whole by ``NoiseSource``) and the unsharded engine in one process with the same seed: the
noise slices of the ranks are the single process's noise, entry for entry.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine, NoiseSource, UnsupportedLayerError
from dpledger.engine.distributed import share_bounds
from dpledger.errors import ParamsError
from dpledger.pipeline.distributed import spawn_ranks

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB, ROWS, T, STEPS = 40, 5, 6, 2
CLIP, SIGMA, SEED, LR = 0.05, 0.7, 3, 0.5
TOL = dict(rtol=1e-10, atol=1e-12)
TINY = {"attn_implementation": "eager"}
CPU = torch.device("cpu")


class LM(nn.Module):
    """Per-example summed next-token cross-entropy of an HF causal LM."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").sum(1)


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=8,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **TINY,
    )
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        **TINY,
    )
    return transformers.LlamaForCausalLM(config)


def _lora(model: nn.Module, targets: list[str], fan_in_fan_out: bool) -> nn.Module:
    config = peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=targets, lora_dropout=0.0, fan_in_fan_out=fan_in_fan_out
    )
    model = peft.get_peft_model(model, config)
    for name, p in model.named_parameters():  # non-zero B: the adapters' gradients all differ
        if "lora_B" in name:
            nn.init.normal_(p, std=0.5)
    return model


MODELS = {
    "gpt2": lambda: _gpt2(),
    "llama": lambda: _llama(),
    "gpt2-lora": lambda: _lora(_gpt2(), ["c_attn", "c_fc"], True),
    "llama-lora": lambda: _lora(_llama(), ["q_proj", "v_proj", "down_proj"], False),
}


def _model(name: str) -> LM:
    torch.manual_seed(0)
    return LM(MODELS[name]()).double()


def _batch(step: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (ROWS, T), generator=torch.Generator().manual_seed(10 + step))


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _train(model: LM, engine, rows: tuple[int, int], released) -> None:
    for step in range(STEPS):
        ids = _batch(step)[rows[0] : rows[1]]
        engine.backward(model(ids))
        engine.step()
        released.append(_flat(released.gather(engine)))


class _Released(list):
    def __init__(self, gather) -> None:
        super().__init__()
        self.gather = gather


def _sharded_run(name: str, ranks) -> dict[str, object]:
    """One rank: the model sharded per block, its rows of each batch, the engine's sums gathered."""
    from dpledger.engine.fsdp import FSDPEngine, full_state_dict, shard_model

    model = _model(name)
    blocks = shard_model(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=LR)
    engine = FSDPEngine(
        model, optimizer, clip_norm=CLIP, noise_multiplier=SIGMA, normalizer=ROWS, seed=SEED
    )
    released = _Released(lambda e: e.full_noisy_sum())
    _train(model, engine, share_bounds(ROWS, ranks.rank, ranks.world_size), released)
    local = sum(p.to_local().numel() for p in trainable)
    return {
        "released": list(released),
        "state": full_state_dict(model),
        "blocks": blocks,
        "local": local,
        "numel": engine.numel,
    }


def _single_run(name: str) -> dict[str, object]:
    model = _model(name)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine = BKEngine(
        model,
        torch.optim.SGD(trainable, lr=LR),
        clip_norm=CLIP,
        noise_multiplier=SIGMA,
        normalizer=ROWS,
        seed=SEED,
    )
    released = _Released(lambda e: e.last_noisy_sum)
    _train(model, engine, (0, ROWS), released)
    engine.detach()
    return {"released": list(released), "state": model.state_dict()}


def _naive_run(name: str) -> dict[str, object]:
    """Plain autograd, one example at a time: g_i, its flat norm, min(1, R/‖g_i‖), the sum, the
    noise σ·R·z_t drawn whole, SGD by hand."""
    model = _model(name)
    params = [p for p in model.parameters() if p.requires_grad]
    noise = NoiseSource(sum(p.numel() for p in params), seed=SEED, dtype=torch.float64)
    released = []
    for step in range(STEPS):
        ids = _batch(step)
        total = torch.zeros(noise.numel, dtype=torch.float64)
        for i in range(ROWS):
            grads = _flat(torch.autograd.grad(model(ids[i : i + 1]).sum(), params))
            total += grads * min(1.0, CLIP / float(grads.norm()))
        total += SIGMA * CLIP * noise.draw(step)
        released.append(total)
        with torch.no_grad():
            offset = 0
            for p in params:
                p -= LR * total[offset : offset + p.numel()].view_as(p) / ROWS
                offset += p.numel()
    return {"released": released, "state": model.state_dict()}


class _TiedHead(nn.Module):
    """A head that reuses the embedding's weight through F.linear, outside the Embedding layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = torch.tanh(block(hidden))
        logits = F.linear(hidden, self.embed.weight)
        return F.cross_entropy(logits.transpose(1, 2), ids, reduction="none").sum(1)


def _outside_use(ranks) -> str:
    """The first training pass of the sharded tied-head model: the guard's refusal, one line."""
    from dpledger.engine.fsdp import FSDPEngine, shard_model

    torch.manual_seed(0)
    model = _TiedHead().double()
    shard_model(model)
    engine = FSDPEngine(model, None, clip_norm=CLIP, noise_multiplier=SIGMA, normalizer=ROWS)
    try:
        engine.backward(model(_batch(0)))
    except UnsupportedLayerError as error:
        return str(error)
    return "not refused"


def _self_check(ranks) -> str:
    """The engine's self-check on a sharded model: refused with one line."""
    from dpledger.engine.fsdp import FSDPEngine, shard_model

    model = _model("gpt2")
    shard_model(model)
    engine = FSDPEngine(model, None, clip_norm=CLIP, noise_multiplier=SIGMA, normalizer=ROWS)
    try:
        engine.self_check(lambda m, x, y: m(x), _batch(0), _batch(0))
    except ParamsError as error:
        return str(error)
    return "not refused"


def _all_models(ranks) -> dict[str, object]:
    outcome: dict[str, object] = {name: _sharded_run(name, ranks) for name in MODELS}
    outcome["outside_use"] = _outside_use(ranks)
    outcome["self_check"] = _self_check(ranks)
    return outcome


@pytest.fixture(scope="module")
def sharded() -> dict[str, object]:
    return spawn_ranks(_all_models, (), 2, CPU)


@pytest.mark.parametrize("name", list(MODELS))
def test_sharded_engine_equals_the_naive_loop_and_one_process(sharded, name):
    ranked, single, naive = sharded[name], _single_run(name), _naive_run(name)
    assert ranked["blocks"], "no block was sharded"
    for got, alone, reference in zip(ranked["released"], single["released"], naive["released"]):
        torch.testing.assert_close(got, reference, **TOL)
        torch.testing.assert_close(got, alone, **TOL)
    start = _model(name).state_dict()
    for key, value in naive["state"].items():
        torch.testing.assert_close(ranked["state"][key], value, **TOL)
        torch.testing.assert_close(ranked["state"][key], single["state"][key], **TOL)
    trained = [k for k in start if not torch.equal(start[k], naive["state"][k])]
    assert trained, "nothing trained"


def test_rank_zero_holds_about_half_of_the_trainable_entries(sharded):
    for name in MODELS:
        assert sharded[name]["local"] < 0.75 * sharded[name]["numel"], name


def test_a_parameter_used_outside_its_layer_is_refused_under_sharding_too(sharded):
    """FSDP swaps in unsharded parameters for the forward pass: the guard must still see them."""
    with pytest.raises(UnsupportedLayerError) as alone:
        model = _TiedHead().double()
        BKEngine(model, None, clip_norm=CLIP, noise_multiplier=SIGMA, normalizer=ROWS).backward(
            model(_batch(0))
        )
    assert "embed.weight" in sharded["outside_use"]
    assert sharded["outside_use"] == str(alone.value)


def test_the_self_check_on_a_sharded_model_is_refused_with_one_line(sharded):
    assert "self_check is not supported on a sharded model" in sharded["self_check"]
