"""Wrap a protocol trainer as an external command, to test the command template end to end.

    python -m dpledger.verify.command_entry --trainer reference --init {init} --data {data} --out
    {out} \\
        --clip-norm {clip_norm} --noise-multiplier {noise_multiplier} --batch-size {batch_size} \\
        --steps {steps} --lr {lr} --seed {seed}

It does what any training script under test must do: rebuild the model from ``{init}``, read the
rows and the loss from ``{data}``, train, and save the final ``state_dict`` to ``{out}``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from dpledger.verify.protocol import load_trainer
from dpledger.verify.task import weighted_half_mse

LOSSES = {"weighted_half_mse": weighted_half_mse}


def mlp_from_state(state: dict[str, torch.Tensor]) -> nn.Module:
    """``Sequential(Linear, Tanh, Linear)`` with the sizes of ``state`` (the battery's model),
    loaded."""
    hidden, inputs = state["0.weight"].shape
    outputs = state["2.weight"].shape[0]
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))
    model.load_state_dict(state)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", required=True)
    for name in ("init", "data", "out"):
        parser.add_argument(f"--{name}", required=True)
    for name, kind in (
        ("clip-norm", float),
        ("noise-multiplier", float),
        ("batch-size", int),
        ("steps", int),
        ("lr", float),
        ("seed", int),
    ):
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--optimizer", default="sgd")
    args = parser.parse_args(argv)
    model = mlp_from_state(torch.load(args.init, weights_only=True))
    data = torch.load(args.data, weights_only=True)
    load_trainer(args.trainer)(
        model,
        data["inputs"],
        data["targets"],
        loss_fn=LOSSES[data["loss"]],
        clip_norm=args.clip_norm,
        noise_multiplier=args.noise_multiplier,
        batch_size=args.batch_size,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        optimizer=args.optimizer,
    )
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
