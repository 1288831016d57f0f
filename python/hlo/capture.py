"""Capture the HLO fixtures of crates/import/tests/fixtures/hlo/ from JAX on host CPU devices.

Run from the repository root with a JAX (CPU) environment:

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]"
    /tmp/jaxenv/bin/python python/hlo/capture.py [OUT_DIR]

For every program it writes
- ``NAME.spec.hlo``: the single-device program, ``jax.jit(f).lower(*args).as_text(dialect="hlo",
  debug_info=True)`` (the spec of a case);
- ``NAME.tpN.lowered.hlo``: the sharded program before SPMD partitioning (``lower`` text with
  its shardings), imported to check that the lowered form parses too;
- ``NAME.tpN.devK.hlo``: the SPMD-partitioned per-device program (``.compile().as_text()``), one
  copy per device K (the importer takes the device id from the ``.devK.`` in the file name and
  substitutes it for ``partition-id``).

Programs: a tensor-parallel MLP (column-sharded first weight, row-sharded second, gelu), a small
transformer block (layernorm, multi-head attention with softmax, MLP; heads column-sharded,
output projections row-sharded), each with ``NamedSharding`` over 1, 2 and 4 devices, and a planted
bugs: a ``shard_map`` MLP whose ``psum`` after the row-parallel matmul is dropped, and a
``shard_map`` block whose attention output projection's ``psum`` is dropped.
"""

import os
import sys

N_DEVICES = 4
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEVICES}"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map  # jax >= 0.7
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map

D, H, F = 16, 4, 32  # model width, heads, MLP width
B, S = 2, 8  # batch, sequence


def mlp(x, w1, w2):
    h = jax.nn.gelu(x @ w1)
    return h @ w2


def layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def block(x, g1, b1, wq, wk, wv, wo, g2, b2, w1, w2):
    h = layernorm(x, g1, b1)
    q = jnp.einsum("bsd,dhk->bshk", h, wq)
    k = jnp.einsum("bsd,dhk->bshk", h, wk)
    v = jnp.einsum("bsd,dhk->bshk", h, wv)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(jnp.float32(D // H))
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhqs,bshk->bqhk", p, v)
    x = x + jnp.einsum("bqhk,hkd->bqd", o, wo)
    h = layernorm(x, g2, b2)
    return x + jax.nn.relu(h @ w1) @ w2


def zeros(*shape):
    return jnp.zeros(shape, jnp.float32)


MLP_ARGS = (zeros(8, D), zeros(D, F), zeros(F, D))
BLOCK_ARGS = (
    zeros(B, S, D), zeros(D), zeros(D),
    zeros(D, H, D // H), zeros(D, H, D // H), zeros(D, H, D // H), zeros(H, D // H, D),
    zeros(D), zeros(D), zeros(D, F), zeros(F, D),
)


def mlp_shardings(mesh):
    sh = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    return (sh(), sh(None, "tp"), sh("tp", None)), sh()


def block_shardings(mesh):
    sh = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    rep = sh()
    heads = sh(None, "tp", None)
    return (rep, rep, rep, heads, heads, heads, sh("tp", None, None), rep, rep,
            sh(None, "tp"), sh("tp", None)), rep


def mlp_dropped_psum(mesh):
    """The planted bug: the row-parallel matmul's partial sums are never reduced."""

    def local(x, w1, w2):
        h = jax.nn.gelu(x @ w1)
        return h @ w2  # should be jax.lax.psum(h @ w2, "tp")

    return shard_map(local, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                     out_specs=P(), check_vma=False)


def block_dropped_psum(mesh):
    """The planted bug in the block: each device's attention output projection (its heads' rows
    of ``wo``) is a partial sum that is added to the residual without its ``psum``; the MLP's
    partial sums are reduced as they should be."""

    def local(x, g1, b1, wq, wk, wv, wo, g2, b2, w1, w2):
        h = layernorm(x, g1, b1)
        q = jnp.einsum("bsd,dhk->bshk", h, wq)
        k = jnp.einsum("bsd,dhk->bshk", h, wk)
        v = jnp.einsum("bsd,dhk->bshk", h, wv)
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(jnp.float32(D // H))
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqs,bshk->bqhk", p, v)
        x = x + jnp.einsum("bqhk,hkd->bqd", o, wo)  # should be psum(..., "tp")
        h = layernorm(x, g2, b2)
        return x + jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "tp")

    heads = P(None, "tp", None)
    specs = (P(), P(), P(), heads, heads, heads, P("tp", None, None), P(), P(),
             P(None, "tp"), P("tp", None))
    return shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)


def write(path, text):
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    print("wrote", path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "crates/import/tests/fixtures/hlo"
    os.makedirs(out, exist_ok=True)
    devices = jax.devices()
    assert len(devices) >= N_DEVICES, devices
    programs = [("mlp", mlp, MLP_ARGS, mlp_shardings), ("block", block, BLOCK_ARGS, block_shardings)]
    for name, f, args, shardings in programs:
        write(f"{out}/{name}.spec.hlo", jax.jit(f).lower(*args).as_text(dialect="hlo", debug_info=True))
        for n in (1, 2, 4):
            mesh = Mesh(np.array(devices[:n]), ("tp",))
            ins, outs = shardings(mesh)
            lowered = jax.jit(f, in_shardings=ins, out_shardings=outs).lower(*args)
            write(f"{out}/{name}.tp{n}.lowered.hlo", lowered.as_text(dialect="hlo", debug_info=True))
            text = lowered.compile().as_text()
            for k in range(n):
                write(f"{out}/{name}.tp{n}.dev{k}.hlo", text)
    for n in (2, 4):
        mesh = Mesh(np.array(devices[:n]), ("tp",))
        text = jax.jit(mlp_dropped_psum(mesh)).lower(*MLP_ARGS).compile().as_text()
        for k in range(n):
            write(f"{out}/mlp_bug.tp{n}.dev{k}.hlo", text)
        text = jax.jit(block_dropped_psum(mesh)).lower(*BLOCK_ARGS).compile().as_text()
        for k in range(n):
            write(f"{out}/block_bug.tp{n}.dev{k}.hlo", text)


if __name__ == "__main__":
    main()
