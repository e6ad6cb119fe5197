"""Train a small Gated DeltaNet language model on a copy task, with optax.

    python examples/train_gdn.py                      # CPU: small model, 600 steps (a minute)
    python examples/train_gdn.py --width 256 --heads 2 --v-heads 4 --head-dim 64 \\
        --batch 64 --copy-len 32 --dtype bfloat16    # GPU: the Triton path, forward and backward

The model: a token embedding, ``--layers`` blocks of (RMSNorm, the Gated
DeltaNet layer of examples/flax_gdn_layer.py, RMSNorm, a SiLU MLP) with
residuals, a final RMSNorm and the embedding's transpose as the output layer.
The task: ``x_1 .. x_L SEP x_1 .. x_L`` with random tokens; the loss is the
cross entropy of the second copy (chance level ``ln(vocab - 1)``), which the
model can only get right by recalling the first (the delta rule's associative
memory). Prints ``step <n> loss <value>`` lines and the time per step; exits
non-zero if the loss did not fall.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def load_layer():
    spec = importlib.util.spec_from_file_location(
        "flax_gdn_layer", pathlib.Path(__file__).with_name("flax_gdn_layer.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GatedDeltaNet


GatedDeltaNet = load_layer()


class Block(nnx.Module):
    def __init__(self, width, heads, v_heads, head_dim, dtype, impl, rngs):
        self.norm1 = nnx.RMSNorm(width, rngs=rngs)
        self.mixer = GatedDeltaNet(width, heads, v_heads, head_dim, dtype=dtype, impl=impl, rngs=rngs)
        self.norm2 = nnx.RMSNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        y, _ = self.mixer(self.norm1(x))
        x = x + y.astype(x.dtype)
        return x + self.down(jax.nn.silu(self.up(self.norm2(x)))).astype(x.dtype)


class GdnLM(nnx.Module):
    """Embedding, ``layers`` blocks, tied output."""

    def __init__(self, vocab, width, layers, heads, v_heads, head_dim, *, dtype, impl, rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, v_heads, head_dim, dtype, impl, rngs)
                                for _ in range(layers)])
        self.norm = nnx.RMSNorm(width, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.norm(x))  # tied: logits = h E^T


def copy_batch(key, batch, length, vocab):
    """``[batch, 2 length + 1]`` tokens ``x SEP x`` (SEP = 0, x in 1 .. vocab - 1)."""
    x = jax.random.randint(key, (batch, length), 1, vocab)
    sep = jnp.zeros((batch, 1), x.dtype)
    return jnp.concatenate([x, sep, x], axis=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--copy-len", type=int, default=8)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--v-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--impl", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)

    model = GdnLM(args.vocab, args.width, args.layers, args.heads, args.v_heads, args.head_dim,
                  dtype=jnp.dtype(args.dtype), impl=args.impl, rngs=nnx.Rngs(args.seed))
    optimizer = nnx.Optimizer(model, optax.adamw(args.lr, weight_decay=0.01), wrt=nnx.Param)
    L = args.copy_len

    @nnx.jit
    def train_step(model, optimizer, tokens):
        def loss_fn(model):
            logits = model(tokens[:, :-1]).astype(jnp.float32)
            targets = tokens[:, 1:]
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return ce[:, L:].mean()  # the second copy: positions SEP .. end predict x_1 .. x_L
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    key = jax.random.key(args.seed + 1)
    losses, times = [], []
    for step in range(1, args.steps + 1):
        key, sub = jax.random.split(key)
        tokens = copy_batch(sub, args.batch, L, args.vocab)
        t0 = time.perf_counter()
        loss = float(train_step(model, optimizer, tokens))
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"step {step} loss {loss:.4f}", flush=True)
    chance = math.log(args.vocab - 1)
    first, last = statistics.mean(losses[:10]), statistics.mean(losses[-10:])
    print(f"backend {jax.default_backend()}, impl {args.impl}; chance level {chance:.4f}; "
          f"mean loss of the first 10 steps {first:.4f}, of the last 10 {last:.4f}")
    print(f"median step time {statistics.median(times[1:]) * 1e3:.1f} ms over {len(times) - 1} steps "
          f"(the first, with the compile, {times[0]:.1f} s)")
    if not last < 0.8 * first:
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
