"""``SHAREBERT_DOCS_CHECK=1``: every training and evaluation budget capped to a few steps and samples, so that
the commands of README.md and docs/*.md run as written in seconds each (``tests/test_docs.py``). The one
home of those caps; stdlib only. Off (the default), nothing changes.

The training and evaluation functions pass their options through :func:`cap` (a dataclass of options) or
:func:`cap_value` (one number): a field named in ``CAPS`` becomes ``min(value, cap)``, ``None`` (no limit)
becomes the cap.
"""
from __future__ import annotations

import dataclasses
import os

ENV = "SHAREBERT_DOCS_CHECK"
CAPS = {
    "max_steps": 2,  # optimizer steps (pretrain, finetune, distill)
    "batch_size": 8,
    "max_train_samples": 64,  # fine-tuning / distillation examples, packed pre-training blocks
    "max_eval_samples": 32,  # dev examples scored
    "max_eval_sequences": 8,  # pre-training validation sequences scored
    "max_questions": 300,  # evaluate analogy: the first questions of the file
    "latency_samples": 5,  # evaluate glue --depths: sentences timed per depth
    "check_limit": 16,  # export: parity sentences
    "runs": 3,  # export: latency runs per shape
}


def active() -> bool:
    """Whether the docs check caps budgets (``SHAREBERT_DOCS_CHECK`` set to anything but empty or 0)."""
    return os.environ.get(ENV, "") not in ("", "0")


def cap_value(name: str, value):
    """``value`` capped by ``CAPS[name]`` when :func:`active` (``None``, no limit, becomes the cap)."""
    if not active() or name not in CAPS:
        return value
    return CAPS[name] if value is None else min(value, CAPS[name])


def cap(options):
    """A copy of the options dataclass ``options`` with every field named in ``CAPS`` capped (when :func:`active`)."""
    if not active():
        return options
    names = {f.name for f in dataclasses.fields(options)} & CAPS.keys()
    return dataclasses.replace(options, **{n: cap_value(n, getattr(options, n)) for n in names})
