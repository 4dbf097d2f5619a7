"""Collective microbenchmarks in the manner of nccl-tests and the OSU suite.

descriptors.py says what each collective moves and what it must produce; harness.py times a
size sweep and checks every result; report.py prints the nccl-tests table, JSON or CSV;
model.py fits and predicts the alpha-beta model; cli.py is the tbcoll-bench command.
"""
