"""Kernel launches and host syncs of one BK step (issue 30), counted on the CPU by a
TorchDispatchMode.

Every aten op that reaches the dispatcher is counted; views (``func.is_view``: reshape, transpose,
detach…) launch no kernel and are left out of ``launches``. A host sync is an op that copies a
device value to the host (``.item()``, ``int(t)``, ``if t.any()``, ``nonzero``). On a GPU each
launch costs about 5 µs of host time and each sync drains the queue, so both are held to a budget
here, on the tiny 12-layer GPT-2 of the review (n_embd 16, T 16, B 4; SGD from ``make_optimizer``).

Before issue 30 a step (``backward`` + ``step``) made 1,764 launches and 1 sync (the non-private
step: 666 launches); the budget is half of that (benchmarks/RESULTS.md has the counts).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dpledger.engine import BKEngine
from dpledger.engine.optimizers import make_optimizer
from helpers.op_counter import SYNC_OPS, OpCounter

transformers = pytest.importorskip("transformers")

LAUNCHES_BEFORE, SYNCS_BEFORE = 1764, 1
LAUNCH_BUDGET = LAUNCHES_BEFORE // 2
WEIGHTS_EXTRA = 8
"""Padding weights cost a few launches of (B,) vectors: the weighted loss, the masks of weight-0
rows."""
VOCAB, B, T = 64, 4, 16


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=16,
        n_layer=12,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).train()


def _losses(model, ids):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").sum(1)


def count_step(
    model: torch.nn.Module | None = None, weights: torch.Tensor | None = None, poison: bool = False
) -> OpCounter:
    """Launches and syncs of ``backward`` + ``step`` (after one warm-up step) of the engine on
    ``model``, by default the tiny GPT-2."""
    model = _gpt2() if model is None else model
    engine = BKEngine(
        model,
        make_optimizer("sgd", model.parameters(), 0.1),
        clip_norm=1.0,
        noise_multiplier=1.0,
        normalizer=4.0,
    )
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    engine.private_step(_losses(model, ids), weights)
    losses = _losses(model, ids)
    if poison:  # one example's loss is NaN: its norm too, and it is dropped
        losses = losses * torch.tensor([1.0, float("nan"), 1.0, 1.0])
    counter = OpCounter()
    with counter:
        engine.private_step(losses, weights)
    counter.engine = engine
    return counter


def test_a_bk_step_stays_within_half_the_launches_of_before_and_never_syncs():
    counter = count_step()
    assert counter.syncs == 0, [op for op in counter.ops if op.startswith(SYNC_OPS)]
    assert counter.launches <= LAUNCH_BUDGET, (counter.launches, counter.ops.most_common(20))


def test_padding_weights_and_a_dropped_example_add_no_sync():
    """The non-finite example is masked by masked_fill, not found by ``.any()``; the count stays on
    the device."""
    counter = count_step(weights=torch.tensor([1.0, 1.0, 1.0, 0.0]), poison=True)
    assert counter.syncs == 0 and counter.launches <= LAUNCH_BUDGET + WEIGHTS_EXTRA
    assert counter.engine.nonfinite_examples == 1
    assert all(torch.isfinite(p).all() for p in counter.engine.params)


LLAMA_GENERIC_CALLS = 9
"""The tiny Llama's RMSNorms (two per layer and the final one) use the generic rule."""
LLAMA_LAUNCHES_BEFORE, LLAMA_SYNCS_BEFORE = 651, 27
LLAMA_LAUNCH_BUDGET = 680
"""The recomputation check formed on the device costs ~1 launch more per generic call than the
host checks did."""


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).train()


def test_the_generic_rule_checks_all_its_calls_in_one_host_sync_per_step():
    """Before issue 30 each generic-rule call read its recomputation check back three times
    (torch.equal, ``.any()``, ``bool``; on CUDA also two boolean-mask indexings): 27 syncs for the 9
    RMSNorm calls of the tiny Llama. The check is now formed on the device and read once for the
    whole backward pass."""
    model = _llama()
    counter = count_step(model)
    assert list(counter.engine.layer_methods.values()).count("generic") == LLAMA_GENERIC_CALLS
    assert counter.syncs <= 1, [op for op in counter.ops if op.startswith(SYNC_OPS)]
    assert counter.launches <= LLAMA_LAUNCH_BUDGET, (counter.launches, counter.ops.most_common(20))


def test_cuda_noise_comes_in_few_large_draws_and_the_cpu_stream_keeps_its_chunks():
    """GPT-2 small's 124M noise entries: at most 8 seeded draws on CUDA (475 before); the CPU
    chunks, and so the CPU noise of every released run, are unchanged."""
    from dpledger.engine.noise import NOISE_CHUNK, noise_chunk

    gpt2_small = 124_439_808
    assert -(-gpt2_small // noise_chunk(torch.device("cuda"))) <= 8
    assert noise_chunk(torch.device("cpu")) == NOISE_CHUNK == 1 << 18
