"""What tbrun loads before it starts a job: not the library's collectives (numpy: ~40 ms), nor
click, nor the modules of what a local job without --trace, a subcommand or a failure does not
need. Its start-up time is a benchmark (benchmarks/startup.py), not a test."""

import subprocess
import sys

NOT_AT_START = ("numpy", "tbcoll.comm.communicator", "tbcoll.algorithms",
                "tbcoll.observability.dumps", "tbcoll.launch.timeline",
                "tbcoll.observability.trace", "tbcoll.launch.cluster.doctor",
                "dataclasses",  # tbcoll.job.topology's and env's records are tuples: ~3 ms
                "typing",  # ~5 ms with its NamedTuples: tbcoll.core.records instead
                "hashlib",  # OpenSSL, ~2.5 ms: the first handshake of tbrun's store imports it
                # what only other starters and --backend mlx need
                "tbcoll.launch.starters.ssh", "tbcoll.launch.starters.srun",
                "tbcoll.launch.starters.mpiexec", "tbcoll.launch.mlxvars",
                "click", "inspect",  # the command line is argparse's: click took ~12 ms
                "pathlib", "ipaddress",  # os.path and inet_pton do: ~3 ms
                # ~4 ms: a local job needs no folder (MLX's and mpiexec's jobs make one)
                "tempfile", "shutil",
                "ctypes")  # ~1.5 ms: tbcoll.launch._subreaper makes tbrun a subreaper


def test_tbrun_runs_a_local_job_without_the_library_and_what_the_job_may_not_need(tmp_path):
    """What a whole job of one empty script loads, from its command line to its teardown, on
    top of the interpreter's own (an editable install's finder imports pathlib)."""
    script = tmp_path / "empty.py"
    script.write_text("")
    code = ("import sys\nbefore = set(sys.modules)\nimport tbcoll.launch.cli\n"
            "try:\n    tbcoll.launch.cli.main(['-np', '1', sys.argv[1]])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(*sorted(set(sys.modules) - before), file=sys.stderr)")
    loaded = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True,
                            text=True, check=True, timeout=60,
                            stdin=subprocess.DEVNULL).stderr.split()
    assert "tbcoll.launch.job" in loaded  # what runs a job is there
    assert [name for name in NOT_AT_START if name in loaded] == []


def test_the_tbrun_command_imports_its_command_line_and_runs_a_job():
    """tbcoll.launch.command, the console script's entry point (the suite's tbrun may be an
    older install's script)."""
    p = subprocess.run([sys.executable, "-m", "tbcoll.launch", "-np", "2", "true"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
