"""Tensor parallelism: every rank holds 1/N of every layer (Megatron-LM's layout).

layers.py has the building blocks, named for their data movement; bert.py a BERT encoder
(all-MiniLM-L6-v2) built from them, with a float64 single-process reference.
"""
