"""`shardproof.jax.capture` end to end: a jitted MLP with `NamedSharding` on 2 host devices is
captured as HLO text with its case derived (placements, groups, outputs), verified, and a
`shard_map` MLP whose `psum` is dropped is refuted at the second matmul. Skipped when jax is
not installed (the shared test environment has none; the committed HLO fixtures and
crates/cli/tests/hlo.rs cover the importer and the engines without it)."""

from __future__ import annotations

import os

# Host devices must be asked for before jax starts its CPU backend.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import pytest  # noqa: E402

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import shardproof  # noqa: E402
import shardproof.jax as sjax  # noqa: E402

try:
    from jax import shard_map  # jax >= 0.7
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


ARGS = (jnp.zeros((8, 16)), jnp.zeros((16, 32)), jnp.zeros((32, 16)))


def _mesh(n: int) -> Mesh:
    if len(jax.devices()) < n:
        pytest.skip(f"jax started with {len(jax.devices())} devices before this module set XLA_FLAGS")
    return Mesh(np.array(jax.devices()[:n]), ("tp",))


def _shardings(mesh: Mesh):
    sh = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    return (sh(), sh(None, "tp"), sh("tp", None)), sh()


def test_the_case_comes_from_the_named_shardings(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp")) if len(jax.devices()) >= 4 else None
    if mesh is None:
        pytest.skip("fewer than 4 host devices")
    sh = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    cap = sjax.capture(mlp, ARGS, in_shardings=(sh("dp"), sh(None, "tp"), sh("tp", None)),
                       out_shardings=sh("dp"), out=tmp_path)
    assert cap.mesh == {"dp": 2, "tp": 2}
    assert cap.inputs == {"arg0": "[Shard(0), Replicate()]", "arg1": "[Replicate(), Shard(1)]",
                          "arg2": "[Replicate(), Shard(0)]"}
    assert cap.outputs == {"out0": "[Shard(0), Replicate()]"}
    assert [p.name for p in cap.ranks] == [f"impl.dev{k}.hlo" for k in range(4)]
    text = cap.case.read_text()
    # The tp groups are the rows of the mesh, the dp groups its columns.
    assert '"hlo{{0,1},{2,3}}": [[0, 1], [2, 3]]' in text
    assert '"hlo{{0,2},{1,3}}": [[0, 2], [1, 3]]' in text


def test_a_split_over_axes_out_of_mesh_order_is_refused():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp")) if len(jax.devices()) >= 4 else None
    if mesh is None:
        pytest.skip("fewer than 4 host devices")
    assert sjax.placement(NamedSharding(mesh, P(("dp", "tp"))), 2, ["dp", "tp"]) == "[Shard(0), Shard(0)]"
    with pytest.raises(sjax.JaxCaptureError):
        sjax.placement(NamedSharding(mesh, P(("tp", "dp"))), 2, ["dp", "tp"])


def test_the_tensor_parallel_mlp_verifies(tmp_path, engine_ready):
    ins, outs = _shardings(_mesh(2))
    cap = sjax.capture(mlp, ARGS, in_shardings=ins, out_shardings=outs, out=tmp_path)
    assert cap.inputs == {"arg0": "Replicate()", "arg1": "Shard(1)", "arg2": "Shard(0)"}
    for graph in [cap.spec, *cap.ranks]:
        strict = shardproof.inspect(graph, "--strict")
        assert strict.exit_code == 0, (graph, strict, strict.stderr)
    verdict = cap.verify()
    assert verdict.exit_code == 0, (verdict, verdict.stderr, verdict.report)


def test_a_dropped_psum_is_refuted_at_the_second_matmul(tmp_path, engine_ready):
    mesh = _mesh(2)
    ins, outs = _shardings(mesh)

    def local(x, w1, w2):
        return jax.nn.gelu(x @ w1) @ w2  # the psum over "tp" is missing

    buggy = shard_map(local, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                      out_specs=P(), check_vma=False)
    cap = sjax.capture(mlp, ARGS, impl=buggy, in_shardings=ins, out_shardings=outs, out=tmp_path)
    verdict = cap.verify()
    assert verdict.exit_code == 1, (verdict, verdict.stderr, verdict.report)
    assert verdict.location is not None and verdict.location.file.endswith("test_jax.py"), verdict
