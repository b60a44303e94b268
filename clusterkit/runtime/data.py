"""Training data for the built-in runner: synthetic tokens, a local text/jsonl file, or a
``datasets`` folder saved to disk. Never downloads anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from clusterkit.spec.recipe import DatasetSpec

# A synthetic sample is an arithmetic sequence of token ids (random start, step from a small set):
# random enough that ranks get different batches, structured enough that the loss visibly falls.
_SYNTHETIC_STEPS = (1, 2, 3, 5, 7)


class SyntheticTokens(Dataset):
    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab_size, (num_samples, 1), generator=generator)
        steps = torch.tensor(_SYNTHETIC_STEPS)[
            torch.randint(0, len(_SYNTHETIC_STEPS), (num_samples, 1), generator=generator)
        ]
        self.tokens = (starts + steps * torch.arange(seq_len)) % vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids.clone()}


class TokenBlocks(Dataset):
    """A long token stream cut into equal blocks of ``seq_len`` (the tail that does not fill one is dropped)."""

    def __init__(self, token_ids: list[int], seq_len: int):
        usable = len(token_ids) // seq_len * seq_len
        if usable == 0:
            raise ValueError(f"the dataset has {len(token_ids)} tokens, fewer than one block of seq_len={seq_len}")
        self.tokens = torch.tensor(token_ids[:usable], dtype=torch.long).view(-1, seq_len)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids.clone()}


def _tokenize(texts: list[str], tokenizer: Any, vocab_size: int) -> list[int]:
    if tokenizer is None:
        # No tokenizer given: UTF-8 bytes are the tokens (needs a vocabulary of at least 256).
        if vocab_size < 256:
            raise ValueError(f"byte-level tokens need vocab_size >= 256 (model has {vocab_size}); give model.tokenizer")
        return [b for text in texts for b in text.encode("utf-8")]
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
    return ids


def build_dataset(spec: DatasetSpec, tokenizer: Any, vocab_size: int, seed: int, base_dir: Path) -> Dataset:
    kind, seq_len = spec.type, spec.seq_len
    if kind == "synthetic":
        return SyntheticTokens(spec.num_samples, seq_len, vocab_size, seed)
    path = Path(spec.path).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if kind == "text":
        return TokenBlocks(_tokenize([path.read_text(encoding="utf-8")], tokenizer, vocab_size), seq_len)
    if kind == "jsonl":
        with path.open(encoding="utf-8") as lines:
            texts = [json.loads(line)[spec.field] for line in lines if line.strip()]
        return TokenBlocks(_tokenize(texts, tokenizer, vocab_size), seq_len)
    try:
        import datasets
    except ImportError:
        raise RuntimeError(
            "dataset type 'disk' needs the `datasets` package (pip install 'clusterkit[datasets]')"
        ) from None
    loaded = datasets.load_from_disk(str(path))
    if "input_ids" not in loaded.column_names:
        raise ValueError(f"{path}: a saved dataset needs an input_ids column (tokenized), found {loaded.column_names}")
    ids = [token for row in loaded["input_ids"] for token in row]
    return TokenBlocks(ids, seq_len)
