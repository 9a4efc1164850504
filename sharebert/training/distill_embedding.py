"""Embedding distillation: a ShareBERT student learns a sentence-embedding teacher's sentence vectors.

The teacher (a sentence-transformers folder such as all-MiniLM-L6-v2, or any BERT-family encoder) gives each
sentence ``t = Dense_t(pool(teacher(x)))`` (its recipe: pooling, optional Dense layers, optional Normalize).
The student, a ``ShareBertModel``, gives ``s = head(pool(student(x)))``, where ``head`` is a learned V -> H
projection when the student is narrower than the teacher (kept: it is saved as the student's Dense module
and exported in the graph). The loss (docs/DISTILLATION.md):

- ``cosine``: ``mean(1 - cos(s, t))``; ``mse``: ``mean((s - t)^2)`` on the vectors before Normalize;
- optional token-level terms of ``distill.distill_losses`` (hidden states through a projection, attention maps).

Training examples are sentences of ``--train`` text, or the packed sequences of a ``--data`` folder
(``sharebert prepare`` with the teacher's tokenizer, memory-mapped, ``[CLS] + seq_len - 2 tokens + [SEP]``
each). With ``--train`` and no token-level term the teacher runs once over the training sentences before
training (its vectors kept in ``out/teacher_targets.npy`` for ``--resume``); with ``--data`` it runs on each
batch, so nothing grows with the corpus.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from torch import nn

from sharebert_runtime.outdir import finite

from .arguments import EmbeddingArgs
from .distill_embedding_budget import _budgeted_count
from .distill_embedding_model import (
    EmbeddingProjections,
    _embedding_trainer,
    _save_result,
    fit_head,
    load_encoder,
    recipe_head,
    student_head,
)
from .distill_embedding_setup import (
    _check_args,
    _EmbeddingRun,
    _init_student,
    _new_student,
    _read_teacher,
    _start_metrics,
    _Teacher,
    _teacher_to_device,
    _trained_on,
    check_cut,
    check_data,
)
from .distill_losses import student_teacher_maps
from .distill_run import DISTILL, TARGETS_FILE, check_same_data
from .distill_sentences import BlockDataset, SentenceDataset, default_corpus, read_sentences, sts_available, sts_scorer
from .distill_teacher import (
    WithTeacherLogits,
    teacher_blocks,
)
from .fingerprint import data_files, run_fingerprint, teacher_fingerprint
from .run_skeleton import open_run
from .sentence_vectors import encode, encode_blocks

HEAD_FIT = 4096  # sentences the output projection is fitted on at step 0
IN_MEMORY = 1_000_000  # --train sentences held (with the teacher's vectors, ~2 GB) unless --max-train-samples says


def _teacher_targets(vectors, files: list, sentences, width: int, out: Path, progress: bool) -> np.ndarray:
    """The teacher's sentence vectors ``(N, width)`` (``vectors``: a ``teacher_vectors.TeacherPass``), kept in ``out``
    under a key of the teacher's files (``files``: its :func:`~.fingerprint.teacher_fingerprint`), the pass's length,
    pooling and the sentences; a damaged file is recomputed."""
    seq_len, pooling = vectors.seq_len, vectors.pooling
    key = hashlib.sha256("\n".join([*files, str(seq_len), pooling, *sentences]).encode())
    path = out / f"{TARGETS_FILE}-{key.hexdigest()[:12]}.npy"
    if path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError):  # truncated or not an array: recomputed and replaced below
            cached = None
        if (
            cached is not None
            and cached.dtype.kind == "f"
            and cached.shape == (len(sentences), width)
            and np.isfinite(cached).all()
        ):
            return cached
    desc = f"teacher over {len(sentences):,} training sentences ({vectors.describe()})"
    t = vectors(sentences, desc=desc if progress else None)
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, t)
    tmp.replace(path)
    return t


def distill_embedding(  # 17 keywords: the public call, one per `sharebert distill-embedding` option and compress's
    teacher_dir,
    student: str,
    out,
    train=None,
    args: EmbeddingArgs = EmbeddingArgs(),
    overrides: dict | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    data=None,
    eval_limit: int | None = None,
    callbacks=(),
    score_sts: bool = True,
    budget=None,
    vocab=None,
    teacher_artifact=None,
    run_teacher=None,
) -> dict:
    """Distil ``teacher_dir``'s sentence embeddings into ``student`` (a preset shaped by ``overrides``, or a
    model folder) on ``train`` text (default: :func:`default_corpus`) or a prepared ``data`` folder.

    ``out`` receives the student as a sentence-transformers folder (backbone, tokenizer, pooling, Dense
    head when narrower, Normalize as the teacher), ``metrics.json`` (STS-B dev Spearman of teacher, student
    at step 0 and at the end, unless ``score_sts`` is False: a classifier's general distillation; steps;
    seconds) and ``log_history.json``. Returns the metrics. ``vocab``: a ``vocab.CutVocabulary`` of the teacher's
    tokenizer, which the student then speaks (its table one row per kept token, started from the teacher's rows).
    ``teacher_artifact``: the teacher's ONNX artifact, which its pass over the training sentences runs on where it
    keeps the teacher and no GPU is present (``teacher_vectors.TeacherPass``). ``run_teacher``: the folder as
    compress read it (``pipelines.run.Teacher``: its config, tokenizer, recipe and fingerprint), not read again.
    """
    overrides = overrides or {}
    score_sts = score_sts and sts_available()  # STS-B is one more measure where the data folder has it
    _check_args(args, score_sts, eval_limit)
    student_folder = Path(student).exists()  # else a preset's name
    inputs = (
        teacher_dir,
        *([data] if data is not None else []),
        *(train or []),
        *([student] if student_folder else []),
    )
    run = open_run(DISTILL, out, inputs, overwrite or resume)
    out, start_from = run.out, run.resume(resume)  # nothing to resume: said now, before any work
    t = _read_teacher(teacher_dir, run_teacher)
    t.artifact = teacher_artifact
    manifest = check_data(data, train, t.tokenizer, teacher_dir)
    s_tok = t.tokenizer if vocab is None else check_cut(vocab, manifest, args.weights, student_folder)
    model = _new_student(student, overrides, args, t, vocab)
    t.model = load_encoder(teacher_dir, t.config)
    pairs, groups, _ = student_teacher_maps(model, t.model, args.weights, args.seed)
    t.head = recipe_head(teacher_dir, t.recipe)
    projections = EmbeddingProjections(model.config.hidden_size, t.model.config.hidden_size, t.width)
    init = _init_student(model, t, projections, args.init, student_folder, vocab)
    _teacher_to_device(t)
    from .teacher import usable_length

    # the teacher's learned positions past RoBERTa's offset (130 rows read 128 tokens): compress gives its student as
    # many positions as the teacher's config says, and asks for that length
    seq_len = min(
        args.seq_len,
        model.config.max_position_embeddings,
        usable_length(t.model, t.tokenizer),
        t.recipe.max_seq_length or args.seq_len,
    )
    from .teacher_vectors import TeacherPass

    t.vectors = TeacherPass(t.model, t.head, t.tokenizer, t.recipe.pooling, seq_len, t.artifact)
    r = _EmbeddingRun(
        args=args,
        teacher=t,
        student=student,
        student_folder=student_folder,
        overrides=overrides,
        vocab=vocab,
        out=out,
        start_from=start_from,
        progress=progress,
        budget=budget,
        callbacks=callbacks,
        model=model,
        s_tok=s_tok,
        projections=projections,
        seq_len=seq_len,
    )
    if manifest is not None:
        sentences, train_ds = (
            None,
            BlockDataset(teacher_blocks(data, manifest, t.tokenizer, seq_len, args.max_train_samples)),
        )
    else:
        sentences, word_strings = _training_sentences(r, train)
        train_ds = SentenceDataset(s_tok, sentences, seq_len)
    trained_on = _trained_on(r, train_ds, sentences, manifest)
    if start_from is not None:  # before the teacher's pass: --resume on other text is refused, not trained on
        check_same_data(Path(start_from), trained_on)
    files = data_files(train, data, default_corpus())
    t.files = t.files or teacher_fingerprint(teacher_dir)  # hashed once: the run's fingerprint and the vectors' key
    run.start(
        run_fingerprint(teacher_dir, trained_on["student"], files, f"embedding ({args.loss} loss)", teacher=t.files)
    )
    score = sts_scorer(score_sts, s_tok, t.recipe.pooling, seq_len, eval_limit, progress)
    metrics = _start_metrics(r, init, len(train_ds), score_sts, eval_limit, data)
    if manifest is None and args.words:
        metrics["train_word_strings"] = word_strings
    metrics["teacher_sts_spearman"] = score(t.model, t.head, "teacher", t.tokenizer)
    fit = _take_own_head(r, metrics)
    train_ds = _teacher_vectors(r, projections.head if fit else None, sentences, train_ds)
    t.vectors.close()  # the artifact's session, if the pass loaded one: its memory back before training
    metrics["start_sts_spearman"] = score(model, projections.head, "student at step 0")
    trainer = _embedding_trainer(r, train_ds, pairs, groups, trained_on, packed=manifest is not None)
    if (
        kept := run.kept(trainer, expect=(*metrics, "steps", "train_loss", "last_terms", "student_sts_spearman"))
    ) is not None:
        return kept
    result = run.train(trainer)
    model = trainer.model.eval()
    metrics.update(steps=trainer.state.global_step, **trainer.trained(result), seed=args.seed)
    metrics["student_sts_spearman"] = score(model, projections.head, "student")
    if trainer.is_world_process_zero():
        _save_result(r, trainer, model, metrics)
    return finite(metrics)


def _training_sentences(r: _EmbeddingRun, train) -> tuple[list[str], int]:
    """The ``--train`` sentences (default: :func:`default_corpus`), at most ``IN_MEMORY`` unless
    ``--max-train-samples`` says, with ``args.words`` strings of the student's vocabulary words after each, and
    under a ``budget`` as many as its time allows; and how many of them are word strings."""
    args = r.args
    sentences = read_sentences(train or default_corpus(), args.max_train_samples or IN_MEMORY + 1)
    if not args.max_train_samples and len(sentences) > IN_MEMORY:  # refused now, not out of memory hours later
        raise ValueError(
            f"--train holds over {IN_MEMORY:,} sentences, and each is kept in memory with its "
            f"teacher vector: pass --max-train-samples N, or `sharebert prepare --tokenizer "
            f"{r.teacher.dir}` the text and pass --data, which streams a corpus of any size"
        )
    if args.words:
        from .corpus import vocabulary_words, with_word_strings

        real = set(sentences)
        sentences = with_word_strings(sentences, vocabulary_words(r.s_tok), args.words, args.seed)
    if r.budget is not None:  # the teacher's pass sized to the time (a resume: to the checkpoint's sentences)
        sentences = sentences[: _budgeted_count(r, sentences)]
    return sentences, (sum(x not in real for x in sentences) if args.words else 0)


def _take_own_head(r: _EmbeddingRun, metrics: dict) -> bool:
    """A student folder keeps its own output head (said in ``metrics``); otherwise the new head is fitted, on a
    resume too (the checkpoint then replaces it): the step-0 score is the run's, not a random head's. Whether
    ``r.projections.head`` is to be fitted."""
    t, projections = r.teacher, r.projections
    own = None
    if r.student_folder:
        own = student_head(r.student, r.model.config.hidden_size, t.width, t.recipe.pooling)
    if own is not None:  # moved to the training device with the other projections by the trainer
        projections.head = own
        metrics["head"] = "the student's own"
    return projections.head is not None and r.args.init == "teacher" and own is None


def _teacher_vectors(r: _EmbeddingRun, head: nn.Linear | None, sentences, train_ds):
    """The teacher's vectors the run needs before training; returns the training set (with the vectors where
    the teacher runs once). ``head``: the student's output projection to fit, None for none."""
    if sentences is None:  # --data: the teacher runs on each batch; the head is fitted on the first blocks
        if head is not None:
            _fit_head_on_blocks(head, r.model, r.teacher, train_ds)
        return train_ds
    return _fit_head_on_sentences(r, head, sentences, train_ds)


def _fit_head_on_blocks(head: nn.Linear, model, t: _Teacher, train_ds: BlockDataset) -> None:
    """The student's output projection fitted on the first ``HEAD_FIT`` packed blocks."""
    n = min(HEAD_FIT, len(train_ds))
    fit_head(
        head,
        encode_blocks(model, train_ds.blocks, n, t.recipe.pooling),
        encode_blocks(t.model, train_ds.blocks, n, t.recipe.pooling, t.head),
    )


def _fit_head_on_sentences(r: _EmbeddingRun, head: nn.Linear | None, sentences, train_ds):
    """The teacher's vectors of the sentences: the student's output ``head`` (None: no fit) fitted on the first
    ``HEAD_FIT``; without token-level terms every sentence's, kept with the training set, which is returned."""
    t, weights = r.teacher, r.args.weights
    live = weights.hidden or weights.embedding or weights.attention  # the teacher runs on each batch
    if head is not None or not live:  # with live terms the vectors are only for the fit
        targets = _teacher_targets(
            t.vectors, t.files, sentences[:HEAD_FIT] if live else sentences, t.width, r.out, r.progress
        )
    if head is not None:
        student = encode(r.model, r.s_tok, sentences[:HEAD_FIT], t.recipe.pooling, seq_len=r.seq_len)
        fit_head(head, student, targets[:HEAD_FIT])
    return train_ds if live else WithTeacherLogits(train_ds, targets)
