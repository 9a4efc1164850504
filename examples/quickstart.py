"""Quick start: build ShareBERT models in Python, inspect the column plan, run and save them.

.venv/bin/python examples/quickstart.py
"""

import tempfile

import torch
from transformers import AutoModelForMaskedLM, pipeline

from sharebert import ShareBertConfig, ShareBertForMaskedLM
from sharebert.formats.build import build_model
from sharebert.formats.paths import default_vocab

# 1. A preset, with overrides. ShareBERT Small: 5.0M learned parameters, V = 2048.
config = ShareBertConfig.from_preset("sharebert-small")
plan = config.column_plan()
print(
    f"sharebert-small: {plan.columns_used} of {plan.source_width} virtual-embedding columns generate "
    f"{plan.generated_params:,} weights"
)
for slot in plan.slots:
    print(
        f"  {slot.name:<8} {slot.shape[0]}x{slot.shape[1]:<5} "
        f"columns {slot.first_column}..{slot.first_column + slot.num_columns - 1}  (unused tail {slot.unused})"
    )

# 2. Attention variants plug into the same encoder; fewer matrices take fewer columns.
for variant in ("standard", "symmetric", "shared-qkv"):
    c = ShareBertConfig.from_preset("sharebert-small", attention=variant)
    print(f"  attention={variant:<11} columns used: {c.column_plan().columns_used}")

# 3. A tiny model you can train on a laptop, saved as a normal transformers folder.
with tempfile.TemporaryDirectory() as out:
    model, tokenizer = build_model("sharebert-tiny", out)
    print(f"sharebert-tiny learned parameters: {model.num_parameters():,}")
    reloaded = AutoModelForMaskedLM.from_pretrained(out)  # registered on `import sharebert`
    assert isinstance(reloaded, ShareBertForMaskedLM)
    fill = pipeline("fill-mask", model=out, tokenizer=out)
    print("untrained fill-mask:", [p["token_str"] for p in fill("paris is the capital of [MASK].", top_k=3)])

    # 4. Generated weights are a function of the learned ones; in eval mode they are cached.
    reloaded.eval()
    with torch.no_grad():
        weights = reloaded.sharebert.generated_weights()
    print({k: tuple(v.shape) for k, v in weights.items()})
print("vocab:", default_vocab())
