"""Training-step time of ShareBERT relative to a dense transformers BERT of the same shape.

For each preset: a backbone step (ShareBertModel vs BertModel, loss = mean square of the hidden
states) and a full masked-LM step (ShareBertForMaskedLM with the reference's untied V x V + V x E
head vs BertForMaskedLM, whose head has the same shapes). Forward, backward and an AdamW step,
batch 8 x 128 on CPU. Steps alternate between the two models so drift in machine load hits both;
the ratio of medians is printed. Goal: <= 1.10.

    .venv/bin/python benchmarks/train_step.py [--presets sharebert-tiny sharebert-small] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from sharebert import ShareBertConfig, ShareBertForMaskedLM, ShareBertModel


def dense_twin(c: ShareBertConfig) -> BertConfig:
    return BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        attn_implementation="sdpa",
    )


def make_step(model, batch, mlm: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step():
        t = time.perf_counter()
        if mlm:
            loss = model(**batch).loss
        else:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            loss = model(**inputs).last_hidden_state.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    return step


def compare(preset: str, mlm: bool, steps: int, batch_size: int, seq: int) -> tuple[float, float]:
    torch.manual_seed(0)
    c = ShareBertConfig.from_preset(preset, mlm_head="untied" if mlm else "tied")
    ids = torch.randint(5, c.vocab_size, (batch_size, seq))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    ours = (ShareBertForMaskedLM if mlm else ShareBertModel)(c)
    dense = (BertForMaskedLM if mlm else BertModel)(dense_twin(c))
    a, b = make_step(ours, batch, mlm), make_step(dense, batch, mlm)
    a(), b()  # warm-up
    ta, tb = [], []
    for _ in range(steps):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta), statistics.median(tb)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["sharebert-tiny", "sharebert-small"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"batch {args.batch_size} x {args.seq_len}, {args.threads} threads, median of {args.steps} alternating steps")
    print(f"{'preset':<18}{'step':<10}{'sharebert s':>12}{'dense s':>10}{'ratio':>8}")
    for preset in args.presets:
        for mlm in (False, True):
            ours, dense = compare(preset, mlm, args.steps, args.batch_size, args.seq_len)
            print(
                f"{preset:<18}{'mlm' if mlm else 'backbone':<10}{ours:>12.3f}{dense:>10.3f}{ours / dense:>8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
