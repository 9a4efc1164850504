"""How many training sentences a time-budgeted embedding distillation takes: the teacher's pass measured on the path
that will run it (its time per padded token, scaled to the pass's padded tokens) and one student step, then the
budget's plan (``pipelines.plan.TimeBudget``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# A time-budgeted run's estimate of the teacher's pass (``_teacher_rate``): texts timed (4 batches, ~2 s of MiniLM on
# 2 cores) and texts whose token lengths size the pass.
RATE_SAMPLE, LENGTH_SAMPLE = 256, 8192


def padded_tokens(lengths, batch: int = 64) -> int:
    """Tokens, padding included, of a pass over texts of these token ``lengths`` sorted by length in batches of
    ``batch`` (as :func:`encode` and the runtime run): each batch costs its longest text times its size."""
    ordered = np.sort(np.asarray(lengths, dtype=np.int64))
    return int(
        sum(
            ordered[min(i + batch, len(ordered)) - 1] * min(batch, len(ordered) - i)
            for i in range(0, len(ordered), batch)
        )
    )


def _teacher_rate(vectors, sentences) -> float:
    """Texts a second of the teacher's pass (``vectors``: a ``teacher_vectors.TeacherPass``, the path that will run
    it) over ``sentences``: its time per padded token, measured on ``RATE_SAMPLE`` texts spread over the list, times
    the padded tokens of the whole pass (from the token lengths of ``LENGTH_SAMPLE`` texts). The pass sorts every
    text by length, so its batches carry little padding where a sample's few batches carry much (one batch of the
    first 64 texts read a 600 s compress's pass 3x slow)."""
    import time

    spread = sentences[:: max(1, len(sentences) // LENGTH_SAMPLE)][:LENGTH_SAMPLE]
    lengths = [len(ids) for ids in vectors.tokenizer(spread, truncation=True, max_length=vectors.seq_len)["input_ids"]]
    every = slice(None, None, max(1, len(spread) // RATE_SAMPLE))
    sample, sample_lengths = spread[every][:RATE_SAMPLE], lengths[every][:RATE_SAMPLE]
    vectors(sample[:8])  # the first pass's one-time costs (the artifact's session) are no rate
    start = time.monotonic()
    vectors(sample)
    per_token = max(time.monotonic() - start, 1e-6) / padded_tokens(sample_lengths, vectors.batch)
    return len(spread) / (per_token * padded_tokens(lengths, vectors.batch))


def _step_seconds(model, batch: dict, timed: int = 3) -> float:
    """Seconds of one training step on ``batch``: the mean of ``timed`` forward and backward passes after an untimed
    one (the first pays one-time costs: timed alone, a 600 s compress planned 0.35 s a step and ran 0.085 s),
    times 1.3 for the optimizer's update and the head."""
    import time

    def one_step():
        model(**batch).last_hidden_state.float().pow(2).mean().backward()

    model.train()
    one_step()
    start = time.monotonic()
    for _ in range(timed):
        one_step()
    model.zero_grad(set_to_none=True)
    return (time.monotonic() - start) / timed * 1.3


def _budgeted_count(r, sentences) -> int:
    """How many of ``sentences`` a run (``distill_embedding_setup._EmbeddingRun``) under its ``budget``
    (``plan.TimeBudget``) takes: a resumed run, its checkpoint's count (its sentences must be the same); otherwise
    measured first, the teacher's rate on ``RATE_SAMPLE`` sentences through its pass and a student step (in the
    student's tokens: :func:`_step_seconds`), then ``budget.plan`` (which prints the plan line)."""
    start_from, vectors, model, batch = r.start_from, r.teacher.vectors, r.model, r.args.batch_size

    if start_from is not None:
        from sharebert_runtime.outdir import read_json

        from .distill_run import DATA_FILE

        try:
            saved = read_json(Path(start_from) / DATA_FILE).get("sentences")
        except (OSError, ValueError, AttributeError):
            saved = None
        return saved if isinstance(saved, int) and saved > 0 else len(sentences)
    rate = _teacher_rate(vectors, sentences)
    spread = sentences[:: max(1, len(sentences) // batch)][:batch]  # lengths as a training batch draws them
    enc = r.s_tok(spread, truncation=True, max_length=vectors.seq_len, padding=True, return_tensors="pt")
    step = _step_seconds(model, {k: v.to(model.device) for k, v in enc.items()})
    return r.budget.plan(len(sentences), rate, step, batch)
