"""What torchtitan's llama3 debug config reads from ``./tests/assets`` (its repository's test assets,
not in the wheel), made here: a word-level tokenizer of 2000 words (the debug model has 2048
embeddings) with Llama-3's begin/end tokens, and a small ``c4_test`` text dataset (JSON lines)."""

from __future__ import annotations

import json
import random
from pathlib import Path

VOCAB_WORDS = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def make_titan_assets(root: Path, *, documents: int = 200, words: int = 120) -> Path:
    """Write ``root/tests/assets/{tokenizer,c4_test}``; returns ``root`` (run torchtitan there)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    assets = root / "tests" / "assets"
    tokenizer_dir, data_dir = assets / "tokenizer", assets / "c4_test"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    vocab = {f"w{i}": i for i in range(VOCAB_WORDS)}
    vocab.update({"<unk>": VOCAB_WORDS, BOS: VOCAB_WORDS + 1, EOS: VOCAB_WORDS + 2})
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens([BOS, EOS])
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}))
    rng = random.Random(0)
    with open(data_dir / "train.json", "w") as handle:
        for _ in range(documents):
            text = " ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(words))
            handle.write(json.dumps({"text": text}) + "\n")
    return root
