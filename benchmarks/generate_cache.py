"""Tokens per second of causal-LM generation with and without the key/value cache, PyTorch and the
torch-free Runtime, measured side by side in one run.

A character-level ``charlm-tiny`` (random weights: speed does not depend on them) over Tiny
Shakespeare's characters, exported to ``runs/bench-generate/``; each measurement generates
``--new-tokens`` characters for one prompt, greedily, after one warm-up, best of ``--repeats``: by
default 256 (past the model's 128 positions: from there on the window slides and is run again per
token with or without a cache) and as many as fit in the positions (the cache's whole gain).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/generate_cache.py [--new-tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def best_rate(fn, tokens: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return tokens / min(times)


def main() -> None:
    from transformers import AutoTokenizer

    from sharebert import ShareBertForCausalLM
    from sharebert.export.exporter import export_model
    from sharebert.formats.build import build_model
    from sharebert.formats.paths import data_path
    from sharebert.training.corpus import char_tokenizer
    from sharebert_runtime import Runtime

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default="runs/bench-generate")
    a = p.parse_args()
    torch.set_num_threads(1)
    work = Path(a.work)
    if not (work / "artifact" / "manifest.json").is_file():
        text = data_path("tinyshakespeare", "input.txt").read_text()
        build_model("charlm-tiny", work / "model", head="clm", tokenizer=char_tokenizer(text), seed=0)
        export_model(
            work / "model", work / "artifact", check_limit=32, runs=3, shapes=("1x64",), progress=False, overwrite=True
        )
    model = ShareBertForCausalLM.from_pretrained(work / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    runtime = Runtime(work / "artifact", threads=1)
    prompt = "ROMEO:\nWhat light through yonder window"
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    fit = model.config.max_position_embeddings - ids.shape[1]
    print(
        f"charlm-tiny ({model.config.num_hidden_layers} layers, V={model.config.hidden_size}, "
        f"{model.config.max_position_embeddings} positions), prompt of {ids.shape[1]} characters, 1 thread, "
        f"best of {a.repeats}"
    )
    print(f"{'new characters':16s} {'':8s} {'cache':>12s} {'no cache':>12s} {'speed-up':>9s}")
    for n in (a.new_tokens, fit):

        def torch_gen(cache, n=n):
            with torch.no_grad():
                return model.generate(
                    ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=cache, pad_token_id=0
                )

        rates = {
            ("PyTorch", True): best_rate(lambda: torch_gen(True), n, a.repeats),
            ("PyTorch", False): best_rate(lambda: torch_gen(False), n, a.repeats),
            ("Runtime", True): best_rate(lambda n=n: runtime.generate(prompt, n, use_cache=True), n, a.repeats),
            ("Runtime", False): best_rate(lambda n=n: runtime.generate(prompt, n, use_cache=False), n, a.repeats),
        }
        for who in ("PyTorch", "Runtime"):
            c, nc = rates[(who, True)], rates[(who, False)]
            print(f"{n:<16d} {who:8s} {c:8.0f} t/s {nc:8.0f} t/s {c / nc:8.2f}x")
        same = runtime.generate(prompt, n, use_cache=True) == runtime.generate(prompt, n, use_cache=False)
        print(f"{'':16s} Runtime: the same {n} characters with and without the cache: {same}")


if __name__ == "__main__":
    main()
