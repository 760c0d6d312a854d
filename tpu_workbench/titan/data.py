"""The tokenizer and text a TorchTitan run trains on, made here (nothing is downloaded).

TorchTitan's own test tokenizer and its ``c4_test`` sample live in its source repository, not
in the wheel, and C4 itself is a download. So the workbench writes, once per cache:

- ``train/`` and ``heldout/``: JSON-lines files of documents (``{"text": ...}``) from a small
  generator of English-like sentences, sums and counting runs, each split from its own seed,
  which TorchTitan reads with its own ``HuggingFaceTextDataset`` (Hugging Face ``datasets``'
  JSON loader on a local folder);
- ``tokenizer/``: a byte-level BPE tokenizer (``tokenizer.json``, Hugging Face ``tokenizers``)
  trained on the train split, with Llama 3's begin/end-of-text tokens named in
  ``tokenizer_config.json``, which TorchTitan's ``HuggingFaceTokenizer`` loads as it loads
  Llama's.

The text has structure a small model learns in tens of steps (which words follow which, that a
sum's digits follow from its terms, counting), so the held-out loss falls within the suite's
budget; it is no benchmark of language.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

VERSION = 1  # bump when the generator or the tokenizer changes: a new cache folder
VOCAB_SIZE = 512  # below the debug model's 2048 embeddings
DOCUMENTS = {"train": (0, 3000), "heldout": (1, 300)}  # split -> (seed, documents)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

ADJECTIVES = ("red", "green", "blue", "small", "large", "old", "young", "quiet", "loud",
              "bright", "dark", "warm", "cold", "tired", "clever")
NOUNS = ("fox", "dog", "cat", "bird", "horse", "river", "mountain", "city", "garden", "teacher",
         "farmer", "child", "ship")
VERBS = ("sees", "follows", "finds", "visits", "paints", "watches", "crosses", "builds")
PLACES = ("the forest", "the market", "the harbor", "the valley", "the old bridge",
          "the school")


def sentence(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return (f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
                f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} near {rng.choice(PLACES)}.")
    if kind < 0.7:
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        return f"{a} plus {b} is {a + b}."
    start, n = rng.randint(1, 20), rng.randint(3, 8)
    return "Counting: " + " ".join(str(start + i) for i in range(n)) + "."


def documents(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def assets(root: Path | None = None) -> dict[str, Path]:
    """The folders a run reads (``tokenizer``, ``train``, ``heldout``), made on first use under
    ``<cache>/titan/v<VERSION>`` (or `root`), whole or not at all."""
    from ..environment.paths import cache_dir

    root = root or cache_dir() / "titan" / f"v{VERSION}"
    paths = {name: root / name for name in ("tokenizer", *DOCUMENTS)}
    if (root / "done").is_file():
        return paths
    tmp = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    texts = {}
    for split, (seed, n) in DOCUMENTS.items():
        texts[split] = documents(seed, n)
        (tmp / split).mkdir(exist_ok=True)
        with open(tmp / split / "data.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in texts[split])
    _tokenizer(texts["train"], tmp / "tokenizer")
    (tmp / "done").write_text("")
    try:
        tmp.rename(root)
    except OSError:  # another process made it first (or an older half-made folder): use it
        import shutil

        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            tmp.rename(root)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _tokenizer(texts: list[str], folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    # TorchTitan adds BOS/EOS itself (encode(add_bos=True, add_eos=True)); the tokenizer not.
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "add_eos_token": False}))
