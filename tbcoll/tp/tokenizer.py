"""A chat model's tokenizer and chat template, as transformers and llama.cpp apply them.

From a GGUF file: the byte-level BPE of its vocabulary and merges (tokenizers' BPE, with the
pre-tokenizer its `tokenizer.ggml.pre` names), its control tokens kept whole, and its
`tokenizer.chat_template` rendered with jinja2. From a Hugging Face folder: tokenizer.json and
tokenizer_config.json's chat_template.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONTROL = 3  # llama.cpp's token type of a special token (<|im_start|>, <|im_end|>, ...)


def _digits_then_bytes() -> Any:
    """StarCoder's and SmolLM's: every digit alone, then GPT-2's byte-level split."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])


def _bytes() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False)


# tokenizer.ggml.pre -> the pre-tokenizer (llama.cpp's llama-vocab.cpp groups them the same)
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "smollm": _digits_then_bytes, "starcoder": _digits_then_bytes, "refact": _digits_then_bytes,
    "gpt2": _bytes, "default": _bytes,
}


def _render_template(template: str) -> Callable[..., str]:
    """The template compiled as transformers does (sandboxed, trimmed blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render


class ChatTokenizer:
    """encode/decode text, and the prompt of a chat (its template applied)."""

    def __init__(self, tokenizer: Any, template: str, special: dict[str, str],
                 stop: frozenset[int]) -> None:
        self.tokenizer, self.special, self.stop = tokenizer, special, stop
        self.render = _render_template(template)

    @classmethod
    def from_gguf(cls, reader: Any, path: Path) -> ChatTokenizer:
        from tokenizers import AddedToken, Tokenizer, decoders, models

        def field(key: str, default: Any = None) -> Any:
            found = reader.fields.get(key)
            return default if found is None else found.contents()

        kind, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default")
        if kind != "gpt2" or pre not in PRE_TOKENIZERS:
            raise ValueError(f"{path}: tokenizer {kind!r} with pre-tokenizer {pre!r} is not "
                             f"supported (byte-level BPE with one of {sorted(PRE_TOKENIZERS)})")
        tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
        tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                      for t, kind in zip(tokens, types, strict=True)
                                      if kind == CONTROL])
        template = field("tokenizer.chat_template")
        if template is None:
            raise ValueError(f"{path}: no tokenizer.chat_template (a chat model is needed)")
        ids = {name: field(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "eot")}
        special = {f"{name}_token": tokens[i] for name, i in ids.items() if i is not None}
        stop = frozenset(i for name, i in ids.items() if name != "bos" and i is not None)
        return cls(tokenizer, template, special, stop)

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTokenizer:
        from tokenizers import Tokenizer

        folder = Path(folder)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        special = {k: v if isinstance(v, str) else v["content"] for k, v in settings.items()
                   if k in ("bos_token", "eos_token") and v}
        if "chat_template" not in settings:
            raise ValueError(f"{folder}: tokenizer_config.json has no chat_template")
        stop = frozenset(tokenizer.token_to_id(special[k]) for k in ("eos_token",)
                         if k in special)
        return cls(tokenizer, settings["chat_template"], special, stop)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The text the model reads for these messages, ready for the assistant's turn."""
        return self.render(messages=messages, add_generation_prompt=True, **self.special)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of chat_prompt(messages), each message's content encoded as text: a
        special token's name in it ("<|im_end|>") stays characters, so a user's text cannot
        end its turn or open another role's. Where the content has none, the ids are
        encode(chat_prompt(messages))'s."""
        for number, message in enumerate(messages, 1):
            _check_text(message["content"], f"message {number}")
        # marks in private-use characters, which no template writes, where the contents go
        contents = {f"\ue000{i}\ue001": m["content"] for i, m in enumerate(messages)}
        marked = self.chat_prompt([{**m, "content": mark}
                                   for m, mark in zip(messages, contents, strict=True)])
        if _fill(marked, contents) != self.chat_prompt(messages):
            return self._ids_if_plain(messages)  # the template edits the content
        ids: list[int] = []
        for piece in self._specials.split(marked) if self._specials else [marked]:
            if piece in self._special_ids:  # the template's own special tokens
                ids.append(self._special_ids[piece])
            elif piece:
                ids += self._encode_as_text(_fill(piece, contents))
        return ids

    @functools.cached_property
    def _special_ids(self) -> dict[str, int]:
        return {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items()
                if t.special}

    @functools.cached_property
    def _specials(self) -> re.Pattern[str] | None:
        """Splits a text at the special tokens, keeping them (longest first: one may start
        another), as the tokenizer splits before it encodes the pieces between."""
        names = sorted(self._special_ids, key=len, reverse=True)
        return re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None

    def _encode_as_text(self, text: str) -> list[int]:
        """Token ids of text with special tokens' names encoded as characters."""
        self.tokenizer.encode_special_tokens = True
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        finally:
            self.tokenizer.encode_special_tokens = False

    def _ids_if_plain(self, messages: list[dict[str, str]]) -> list[int]:
        """encode(chat_prompt(messages)), refused where a content names a special token."""
        for number, message in enumerate(messages, 1):
            found = self._specials.search(message["content"]) if self._specials else None
            if found:
                raise ValueError(f"message {number} contains the special token "
                                 f"{found[0]!r}, which this chat template cannot keep as "
                                 f"text; remove it")
        return self.encode(self.chat_prompt(messages))

    def encode(self, text: str) -> list[int]:
        """Token ids of text, special tokens recognised, nothing added."""
        _check_text(text, "the text")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _check_text(text: str, what: str) -> None:
    """ValueError where text cannot be UTF-8 (bytes that were not, as Python keeps them from
    a command line: lone surrogates); the tokenizer would raise a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (character {e.start + 1}: "
                         f"{text[e.start:e.end]!r}); give it in UTF-8") from None


def _fill(text: str, contents: dict[str, str]) -> str:
    """text with each mark replaced by its content."""
    for mark, content in contents.items():
        text = text.replace(mark, content)
    return text


def load_tokenizer(path: Path) -> ChatTokenizer:
    """The tokenizer of a checkpoint that tbcoll.tp.checkpoint.load reads."""
    path = Path(path)
    if path.is_dir():
        return ChatTokenizer.from_folder(path)
    from tbcoll.tp.checkpoint import open_gguf

    return ChatTokenizer.from_gguf(open_gguf(path), path)
