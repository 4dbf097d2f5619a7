"""Bad input: one line naming the problem, exit status 2, no traceback, nothing started."""

import socket
import subprocess
import sys

import pytest

from ..conftest import REPO, TBRUN, tbrun


def assert_usage_error(p, *fragments):
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tbrun: error: "), p.stderr
    assert "Traceback" not in p.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("args, fragments", [
    (["-np", "0", "x.py"], ["0 is not in the range 1<=x<=1048576"]),
    (["-np", "-3", "x.py"], ["-3 is not in the range 1<=x<=1048576"]),
    (["-np", "1000000000", "true"], ["1000000000 is not in the range 1<=x<=1048576"]),
    (["-H", "a:1000000000000", "true"], ["expected a whole number of slots from 1 to 1048576"]),
    (["-H", "a:²", "true"], ["got '²'"]),
    (["-np", "1", "--comm-timeout", "inf", "true"], ["'inf' is not a finite number of seconds"]),
    (["-np", "1", "--timeout", "nan", "true"], ["'nan' is not a finite number of seconds"]),
    (["-np", "1", "--grace", "nan", "true"], ["'nan' is not a finite number of seconds"]),
    (["-np", "1", "--output-dir", "/proc/no-such-dir", "true"],
     ["--output-dir /proc/no-such-dir: cannot make it"]),
    (["-np", "1", "--dump-dir", "/proc/tbrun-dumps", "true"],
     ["--dump-dir /proc/tbrun-dumps: cannot make it"]),
    (["-np", "1", "--dump-dir", "/etc/hostname/dumps", "true"],
     ["--dump-dir /etc/hostname/dumps: cannot make it (Not a directory)"]),
    (["-np", "1", "--trace", "/nonexistent/dir/t.json", "true"],
     ["--trace /nonexistent/dir/t.json: cannot write there (No such file or directory)"]),
    (["-np", "1", "--trace", "/dev/full", "true"], ["--trace /dev/full: not a regular file"]),
    (["-np", "1", "--stdin", "x", "true"], ["--stdin x: give a rank (0..0), all or none"]),
    (["-np", "two", "x.py"], ["'two' is not a valid integer"]),
    (["x.py"], ["give the number of ranks with -np N"]),
    (["-np", "2"], ["Missing argument 'PROGRAM'"]),
    (["--frobnicate", "-np", "2", "x.py"], ["No such option '--frobnicate'"]),
    (["-np", "2", "missing.py"], ["script 'missing.py' not found"]),
    (["-np", "2", "/no/such/program"], ["'/no/such/program' not found or not executable"]),
    (["-np", "2", "no-such-program-on-path"], ["'no-such-program-on-path' not found on PATH"]),
    (["-np", "2", "-x", "9LIVES=1", "true"], ["'9LIVES' is not a valid variable name"]),
    (["-np", "2", "-x", "TBCOLL_SURELY_UNSET", "true"], ["TBCOLL_SURELY_UNSET is not set"]),
    (["-np", "2", "-x", "TBCOLL_TIMEOUT=5", "--comm-timeout", "9", "true"],
     ["-x TBCOLL_TIMEOUT=5 and --comm-timeout 9 disagree"]),
    (["-np", "2", "-x", "TBCOLL_TIMEOUT=soon", "true"], ["TBCOLL_TIMEOUT='soon': give a positive"]),
    (["-np", "2", "-x", "TBCOLL_FAILOVER=1", "--no-failover", "true"],
     ["--no-failover and -x TBCOLL_FAILOVER=1 disagree"]),
    (["-np", "2", "--backend", "carrier-pigeon", "true"], ["'carrier-pigeon' is not one of"]),
    (["-np", "2", "--backend", "pigeons", "true"],
     ["--backend pigeons: no such transport", "--transport-module MODULE"]),
    (["--hostfile", "no-such-hosts.txt", "true"], ["no-such-hosts.txt: cannot read the hostfile"]),
    (["-H", "a:0", "true"], ["-H a:0: 'a:0': expected a whole number of slots"]),
    (["-H", "a", "--hostfile", "h.txt", "true"], ["give --hostfile or -H, not both"]),
    (["-np", "5", "-H", "a:2,b:2", "true"], ["5 ranks asked for but the hosts have 4 slots"]),
    (["-H", "localhost,192.0.2.1", "true"], ["'localhost' is a loopback name"]),
    (["-H", "a,b", "--backend", "shm", "true"], ["--backend shm needs every rank on one host"]),
    (["--backend", "mlx", "-np", "2", "--hostfile", str(REPO / "hostfiles/mesh4.json"), "true"],
     ["the jaccl backend runs one rank per host; use -np 4"]),
])
def test_bad_arguments(args, fragments):
    assert_usage_error(tbrun(*args, timeout=30), *fragments)


def test_store_port_in_use():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        p = tbrun("-np", "2", "--store-port", port, "true", timeout=30)
    assert_usage_error(p, f"127.0.0.1:{port}", "address already in use", "--store-port")


def test_a_binary_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    assert_usage_error(tbrun("--hostfile", hostfile, "true", timeout=30),
                       f"{hostfile}: not a text hostfile")


def test_help_documents_every_flag():
    p = tbrun("--help", timeout=30)
    assert p.returncode == 0
    for flag in ["-np", "--backend", "-x", "--tag-output", "--no-tag-output", "--output-dir",
                 "--timeout", "--grace", "--comm-timeout", "--store-port", "--python",
                 "--module", "--dry-run", "--stdin", "--master-addr", "--master-port",
                 "--no-failover", "TBRUN_"]:
        assert flag in p.stdout, flag


def test_a_dump_dir_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    assert_usage_error(tbrun("-np", "1", "--dump-dir", tmp_path / "file" / "dumps", "true",
                             timeout=30), f"--dump-dir {tmp_path / 'file' / 'dumps'}: ")


@pytest.mark.parametrize("command", [
    [TBRUN, "-np", "500", "--dry-run", "x.py"],  # ~0.5 MB of commands and variables
    [sys.executable, "-m", "tbcoll.tp", "plan", "-np", "20000"],  # ~2.5 MB of lines
])
def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path, command):
    """`COMMAND | head -1`: the first line, then no BrokenPipeError traceback (Python's recipe
    for SIGPIPE: status 1, nothing on stderr)."""
    (tmp_path / "x.py").write_text("")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=tmp_path) as p:
        first = p.stdout.readline()
        p.stdout.close()  # as head does after its line
        stderr = p.stderr.read().decode()
        status = p.wait(timeout=120)
    assert first and stderr == "" and status == 1, (first, stderr, status)
