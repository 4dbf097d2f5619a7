"""The mixture-of-experts layer (tbcoll/tp/moe.py), expert parallel and tensor parallel, in
real jobs against the single-process float64 reference."""

import json

import numpy as np
import pytest

from tbcoll.tp.moe import MoeWeights, reference_moe, route

from ..conftest import tbrun

JOB = """
import json, sys
import numpy as np
import tbcoll
from tbcoll.tp.moe import ExpertParallelMoE, MoeWeights, TensorParallelMoE, reference_moe

experts, hidden, ffn, top_k, tokens = int(sys.argv[2]), 16, 24, 2, int(sys.argv[1])
w = MoeWeights.random(experts, hidden, ffn, top_k, seed=3)
x = np.random.default_rng(4).standard_normal((tokens, hidden))
want = reference_moe(x, w)
with tbcoll.init() as comm:
    mine = np.array_split(np.arange(tokens), comm.size)[comm.rank]  # uneven shares too
    ep = ExpertParallelMoE(w, comm)(x[mine].astype(np.float32))
    tp = TensorParallelMoE(w, comm)(x.astype(np.float32))
    errors = {"ep": float(np.abs(ep - want[mine]).max(initial=0)),
              "tp": float(np.abs(tp - want).max())}
    print(json.dumps(errors))
"""


def test_routing_picks_the_top_k_and_weights_sum_to_one():
    w = MoeWeights.random(6, 8, 4, 2, seed=1)
    x = np.random.default_rng(2).standard_normal((5, 8))
    chosen, weights = route(x, w.gate, 2)
    logits = x @ w.gate.T
    assert (np.sort(chosen, axis=1) == np.sort(np.argsort(-logits, axis=1)[:, :2], axis=1)).all()
    np.testing.assert_allclose(weights.sum(axis=1), 1)
    assert reference_moe(x, w).shape == x.shape


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_expert_and_tensor_parallel_match_the_reference(tmp_path, np_):
    script = tmp_path / "moe.py"
    script.write_text(JOB)
    done = tbrun("-np", np_, "--backend", "shm" if np_ != 3 else "tcp", "--no-tag-output",
                 script, "11", "12", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    errors = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(errors) == np_
    for e in errors:
        assert e["ep"] < 1e-4 and e["tp"] < 1e-4, errors


def test_experts_that_do_not_divide_are_refused(tmp_path):
    script = tmp_path / "moe.py"
    script.write_text(JOB)
    done = tbrun("-np", 2, script, "4", "7", timeout=60)
    assert done.returncode != 0
    assert "Cannot shard the experts of size 7 across 2 ranks" in done.stderr
