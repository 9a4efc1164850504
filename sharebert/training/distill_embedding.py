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
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sharebert_runtime.outdir import check_out_dir, finite

from ..formats.model_folder import load_config, load_tokenizer
from ..formats.paths import data_path
from ..model.modeling_sharebert import TORCH_POOLING, pool
from .arguments import EMBEDDING_LOSS, EMBEDDING_LOSSES, STUDENT_DROPOUT
from .depth_table import check_depth_sampling
from .distill import (
    TARGETS_FILE,
    DistillArgs,
    DistillTrainer,
    Projections,
    WithTeacherLogits,
    _is_distill_out,
    _maps,
    _resume_from,
    check_encoder,
    check_same_data,
    check_tokenizers,
    data_files,
    distill_losses,
    is_distill_out,
    pairs_that_ran,
    run_fingerprint,
    start_run,
    stream_training_args,
    teacher_blocks,
    teacher_data,
    teacher_fingerprint,
    training_device,
)
from .sentence_vectors import encode, encode_blocks

HEAD_FIT = 4096  # sentences the output projection is fitted on at step 0
# A time-budgeted run's estimate of the teacher's pass (``_teacher_rate``): texts timed (4 batches, ~2 s of MiniLM on
# 2 cores) and texts whose token lengths size the pass.
RATE_SAMPLE, LENGTH_SAMPLE = 256, 8192
IN_MEMORY = 1_000_000  # --train sentences held (with the teacher's vectors, ~2 GB) unless --max-train-samples says
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


@dataclass(frozen=True)
class EmbeddingArgs(DistillArgs):
    """The distillation recipe plus the embedding loss; token-level terms are off unless asked for."""

    loss: str = EMBEDDING_LOSS
    init: str = "teacher"  # or "random"
    words: float = 0.0  # strings of the student's vocabulary words per training sentence (``corpus.with_word_strings``)
    max_time: float | None = None  # seconds of training (a checkpoint, then the student is saved)


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """``mean(1 - cos)`` or ``mean((s - t)^2)`` over ``(B, H)`` vectors; 0 when they are equal."""
    s, t = student.float(), teacher.float()
    if kind == "cosine":
        return (1 - F.cosine_similarity(s, t, dim=-1, eps=1e-8)).mean()
    if kind == "mse":
        return F.mse_loss(s, t)
    raise ValueError(f"--loss {kind!r}: choose one of {', '.join(EMBEDDING_LOSSES)}")


_ACTIVATION_MODULES = {
    "Identity": nn.Identity,
    "Tanh": nn.Tanh,
    "Relu": nn.ReLU,
    "Sigmoid": nn.Sigmoid,
    "Gelu": nn.GELU,
}


def recipe_head(model_dir, recipe) -> nn.Module | None:
    """The recipe's Dense layers (``sharebert.formats.recipe``) as a frozen torch module, or None when it has none."""
    from ..formats.recipe import ACTIVATIONS, read_dense_weights

    layers = []
    for layer in recipe.dense:
        w, b = read_dense_weights(model_dir, layer)
        lin = nn.Linear(layer.in_features, layer.out_features, bias=b is not None)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            if b is not None:
                lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, _ACTIVATION_MODULES[ACTIVATIONS[layer.activation]]()]
    return nn.Sequential(*layers).requires_grad_(False).eval() if layers else None


def student_head(student_dir, in_features: int, out_features: int, pooling: str) -> nn.Linear | None:
    """A student folder's own output projection ``(in_features -> out_features)``: its one Dense module, without
    activation, after the same ``pooling`` as the teacher's; so a student distilled further keeps the head it was
    trained with, also where the widths match (then no head is made afresh). None where the folder has no such head."""
    from ..formats.recipe import ACTIVATIONS, read_dense_weights, read_recipe

    recipe = read_recipe(student_dir)
    dense = recipe.dense
    if recipe.pooling != pooling or len(dense) != 1:
        return None
    layer = dense[0]
    if (
        ACTIVATIONS[layer.activation] != "Identity"
        or not layer.bias
        or (layer.in_features, layer.out_features) != (in_features, out_features)
    ):
        return None
    w, b = read_dense_weights(student_dir, layer)
    head = nn.Linear(in_features, out_features)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w))
        head.bias.copy_(torch.from_numpy(b))
    return head


def load_encoder(model_dir):
    """The backbone of any BERT-family or sharebert folder (``AutoModel``), eval mode, no gradients, eager
    attention (attention maps for the token-level terms), on the CPU (``distill_embedding`` moves it to the
    GPU, where there is one, once the student is initialised from it)."""
    from transformers import AutoModel

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the sharebert Auto classes)
    from sharebert_runtime.errors import first_line

    try:
        model = AutoModel.from_pretrained(model_dir, attn_implementation="eager")
    except (OSError, ValueError) as e:
        raise ValueError(f"--teacher {model_dir} cannot be loaded: {first_line(e)}") from None
    model.requires_grad_(False)
    from .teacher import accept_known_inputs

    accept_known_inputs(model)
    return model.eval()


def split_sentences(line: str) -> list[str]:
    """A paragraph's sentences (split after ``.!?`` before a capital, digit or quote); headings and blanks dropped."""
    line = line.strip()
    if not line or line.startswith("="):
        return []
    return [s for s in _SENTENCE_END.split(line) if len(s.split()) >= 3]


def default_corpus() -> list[Path]:
    """Unlabelled sentences of the data folder: WikiText-2 (validation split), the SST-2 and STS-B training
    sentences (text only, no labels or scores; STS-B dev, the quality check, is never read for training), those of
    them it holds; where it holds none (the wheel installed elsewhere), the corpus shipped in the package
    (``paths.packaged_corpus``: 2,482 WikiText-2 sentences)."""
    from ..formats.paths import packaged_corpus

    files = [
        data_path("wikitext-2-raw", "wiki.valid.raw"),
        data_path("glue", "STS-B", "train.tsv"),
        data_path("glue", "SST-2", "train.tsv"),
    ]
    return [f for f in files if f.is_file()] or [packaged_corpus()]


def sts_available() -> bool:
    """Whether the data folder holds STS-B dev (the sentence-embedding score; optional everywhere)."""
    return data_path("glue", "STS-B", "dev.tsv").is_file()


def read_sentences(sources, limit: int | None = None) -> list[str]:
    """Sentences of text files (one paragraph per line, split into sentences) or GLUE ``.tsv`` files (their
    text columns by header name, e.g. SST-2's ``sentence``, STS-B's ``sentence1``/``sentence2``, or CoLA's
    headerless layout: ``glue.text_fields``), in order, duplicates dropped, at most ``limit``. A ``.tsv``
    that fits no GLUE layout is a ``ValueError`` naming it."""
    from sharebert_runtime.textlines import resolve_sources

    from .corpus import iter_lines
    from .glue import text_fields

    seen, out = set(), []
    for src in resolve_sources(sources):
        columns = None
        for line in iter_lines(src):
            if isinstance(src, Path) and src.suffix == ".tsv":
                fields = line.rstrip("\r\n").split("\t")
                if columns is None:
                    found = text_fields(fields)
                    if found is None:
                        raise ValueError(
                            f"{src}: a .tsv needs a GLUE header naming its text column (e.g. "
                            f"'sentence', 'sentence1') or CoLA's 4 fields; its first line has "
                            f"{len(fields)} field(s) and none of those names (a plain text file: "
                            f"give it another suffix)"
                        )
                    columns, is_header = found
                    if is_header:
                        continue
                parts = [fields[i].strip() for i in columns if i < len(fields)]
            else:
                parts = split_sentences(line)
            for s in parts:
                if s and s not in seen:
                    seen.add(s)
                    out.append(s)
                    if limit and len(out) >= limit:
                        return out
    if not out:
        raise ValueError(f"no sentences in {', '.join(map(str, sources))}")
    return out


class BlockDataset(torch.utils.data.Dataset):
    """Packed sequences of a prepared folder (``distill.teacher_blocks``, read on demand) as sentences: item ``i``
    is ``{"input_ids", "attention_mask"}`` of block ``i`` (``seq_len`` tokens, no padding)."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        ids = self.blocks[i].tolist()
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


class SentenceDataset(torch.utils.data.Dataset):
    """Tokenized sentences (teacher's tokenizer, truncated to ``seq_len``)."""

    def __init__(self, tokenizer, sentences: list[str], seq_len: int):
        enc = tokenizer(sentences, truncation=True, max_length=seq_len)
        self.items = [{k: enc[k][i] for k in enc.keys()} for i in range(len(sentences))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def sts_dev(limit: int | None = None):
    """The STS-B dev pairs every sentence-embedding score here is on: the first ``limit`` (all 1,500 without)."""
    from .glue import read_split

    return read_split("stsb", data_path("glue", "STS-B"), "dev").head(limit)


def sts_spearman(
    model, tokenizer, pooling: str, head=None, seq_len: int = 128, limit: int | None = None, desc: str | None = None
) -> float:
    """Spearman correlation of cosine similarities with the gold scores on :func:`sts_dev` (first ``limit``
    pairs); ``desc``: show progress under that name."""
    from .metrics import cosine_spearman

    split = sts_dev(limit)
    a, b = (
        encode(model, tokenizer, texts, pooling, head, seq_len, desc=desc and f"{desc} (STS-B dev, {side})")
        for side, texts in (("first", split.text_a), ("second", split.text_b))
    )
    return cosine_spearman(a, b, split.labels)


@torch.no_grad()
def fit_head(head: nn.Linear, student: np.ndarray, teacher: np.ndarray, ridge: float = 1e-2) -> None:
    """Set ``head`` (V -> H) to the ridge least-squares map from student vectors ``(N, V)`` to the teacher's
    ``(N, H)``: the best linear start for the output projection given the student's initial features."""
    s, t = student.astype(np.float64), teacher.astype(np.float64)
    ms, mt = s.mean(0), t.mean(0)
    sc = s - ms
    gram = sc.T @ sc + ridge * len(s) * np.eye(s.shape[1])
    w = np.linalg.solve(gram, sc.T @ (t - mt))  # (V, H)
    head.weight.copy_(torch.from_numpy(w.T).float())
    head.bias.copy_(torch.from_numpy(mt - ms @ w).float())


class EmbeddingProjections(Projections):
    """The token-level projections of ``distill`` plus ``head``: the student's output projection (V -> H), or
    None when the widths match. ``head`` is part of the student: it is saved as its Dense module."""

    def __init__(self, student_width: int, teacher_width: int, output_width: int):
        super().__init__(student_width, teacher_width)
        self.head = nn.Linear(student_width, output_width) if student_width != output_width else None


class EmbeddingTrainer(DistillTrainer):
    """``distill``'s trainer whose loss is the sentence-embedding ``loss`` (``embedding_loss``) between the student's
    and the teacher's vectors pooled by ``pooling`` (plus any token-level terms). ``teacher_head``: the teacher's
    Dense layers, applied to its pooled vector (None: none)."""

    def __init__(self, *a, pooling: str, loss: str, teacher_head=None, **kw):
        super().__init__(*a, **kw)
        self.pooling, self.loss, self.teacher_head = pooling, loss, teacher_head

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        w = self.weights
        need_h, need_a = bool(w.hidden or w.embedding), bool(w.attention)
        targets = inputs.pop("teacher_logits", None)
        out = model(**inputs, output_hidden_states=need_h, output_attentions=need_a)
        s = pool(out.last_hidden_state, inputs["attention_mask"], self.pooling)
        if self.projections.head is not None:
            s = self.projections.head(s)
        parts = {}
        if need_h or need_a or targets is None:  # --data, or token-level terms: the teacher runs on the batch
            with torch.no_grad():
                t_out = self.teacher(**inputs, output_hidden_states=need_h, output_attentions=need_a)
            if targets is None:
                targets = pool(t_out.last_hidden_state, inputs["attention_mask"], self.pooling)
                targets = targets if self.teacher_head is None else self.teacher_head(targets)
        if need_h or need_a:
            terms = replace(w, kl=0.0, hard=0.0)
            ran = len(out.attentions) if need_a else len(out.hidden_states) - 1  # fewer under depth sampling
            pairs = pairs_that_ran(
                self.pairs, ran, model.config.num_hidden_layers, self.teacher.config.num_hidden_layers
            )
            parts = {
                k: v
                for k, v in distill_losses(
                    out, t_out, inputs["attention_mask"], None, self.projections, terms, pairs, self.groups
                ).items()
                if k != "loss"
            }
        parts["sentence"] = embedding_loss(s, targets, self.loss)
        for k, v in parts.items():
            self._parts[k] = float(v.detach())
        total = sum(parts.values())
        return (total, out) if return_outputs else total


def _teacher_targets(vectors, teacher_dir, sentences, width: int, out: Path, progress: bool) -> np.ndarray:
    """The teacher's sentence vectors ``(N, width)`` (``vectors``: a ``teacher_vectors.TeacherPass``), kept in ``out``
    under a key of the teacher's files (:func:`~.distill.teacher_fingerprint`), the pass's length, pooling and the
    sentences; a damaged file is recomputed."""
    seq_len, pooling = vectors.seq_len, vectors.pooling
    key = hashlib.sha256("\n".join([*teacher_fingerprint(teacher_dir), str(seq_len), pooling, *sentences]).encode())
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
    t = vectors(sentences, desc=f"teacher over {len(sentences):,} training sentences" if progress else None)
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, t)
    tmp.replace(path)
    return t


def check_data(data, train, t_tok, teacher_dir) -> dict | None:
    """The manifest of the prepared ``data`` folder (``distill.teacher_data``: complete, intact, the teacher's
    tokenizer), None without one; ``ValueError`` for ``--data`` together with ``--train``."""
    if data is None:
        return None
    if train:
        raise ValueError("--data and --train are alternatives: give the prepared folder or the text files, not both")
    return teacher_data(data, t_tok, teacher_dir)


def check_cut(vocab, manifest, weights, student_folder: bool):
    """The cut vocabulary's tokenizer, for a run that can use it: the student's inputs are its own tokens and the
    teacher's targets come from the teacher's tokens of the same sentences, so only sentence vectors of --train text."""
    if manifest is not None or student_folder or weights.hidden or weights.embedding or weights.attention:
        raise ValueError(
            "a cut vocabulary trains a new student on --train text with sentence vectors only (no --data, "
            "no student folder, no token-level terms): the teacher reads other tokens than the student"
        )
    return vocab.tokenizer


def build_student(student: str, overrides: dict, vocab_size: int):
    """A fresh ``ShareBertModel`` from a preset (``overrides``: ``--set``) with the teacher's vocabulary size,
    no dropout (``options.STUDENT_DROPOUT``) and no pooler (the sentence vector is pooled from the token
    states), or a model folder's backbone."""
    from ..model.configuration_sharebert import ShareBertConfig
    from ..model.modeling_sharebert import ShareBertModel
    from ..model.shape import PRESETS

    if Path(student).exists():
        from ..formats.model_folder import load_model

        if overrides:
            raise ValueError("--set shapes a new student from a preset; a model folder keeps its own shape")
        config = load_config(student)
        if config.vocab_size != vocab_size:
            raise ValueError(
                f"the student {student} has vocab_size {config.vocab_size}, the teacher "
                f"{vocab_size}: they do not share a tokenizer"
            )
        return load_model(ShareBertModel, student, config)[0]
    if student not in PRESETS:
        raise ValueError(f"--student {student} is neither a model folder nor a preset ({', '.join(PRESETS)})")
    fields = {"pooler": "none", **STUDENT_DROPOUT, **overrides, "vocab_size": vocab_size}
    if overrides.get("vocab_size", vocab_size) != vocab_size:
        raise ValueError(
            f"--set vocab_size={overrides['vocab_size']}: the student takes the teacher's vocabulary "
            f"({vocab_size} tokens)"
        )
    return ShareBertModel(ShareBertConfig.from_preset(student, **fields))


@dataclass
class _Teacher:
    """The teacher's side of a run: its folder's recipe and tokenizer, then its encoder and frozen Dense head."""

    dir: object
    recipe: object
    config: object
    tokenizer: object
    model: nn.Module | None = None
    head: nn.Module | None = None
    artifact: Path | None = None  # its ONNX artifact (compress exports one), for the pass over the training sentences
    vectors: object = None  # its pass (``teacher_vectors.TeacherPass``), once the run's length is known

    @property
    def width(self) -> int:
        """The width of the teacher's sentence vectors: its last Dense layer's, else its hidden size."""
        return self.recipe.dense[-1].out_features if self.recipe.dense else self.model.config.hidden_size


def distill_embedding(
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
) -> dict:
    """Distil ``teacher_dir``'s sentence embeddings into ``student`` (a preset shaped by ``overrides``, or a
    model folder) on ``train`` text (default: :func:`default_corpus`) or a prepared ``data`` folder.

    ``out`` receives the student as a sentence-transformers folder (backbone, tokenizer, pooling, Dense
    head when narrower, Normalize as the teacher), ``metrics.json`` (STS-B dev Spearman of teacher, student
    at step 0 and at the end, unless ``score_sts`` is False: a classifier's general distillation; steps;
    seconds) and ``log_history.json``. Returns the metrics. ``vocab``: a ``vocab.CutVocabulary`` of the teacher's
    tokenizer, which the student then speaks (its table one row per kept token, started from the teacher's rows).
    ``teacher_artifact``: the teacher's ONNX artifact, which its pass over the training sentences runs on where it
    keeps the teacher and no GPU is present (``teacher_vectors.TeacherPass``).
    """
    from .callbacks import kept_result, start_checkpoints

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
    out = check_out_dir(
        out, "distillation result", is_distill_out, overwrite or resume, inputs=inputs, legacy=_is_distill_out
    )
    start_from = _resume_from(out, resume)  # nothing to resume: said now, before any work
    t = _read_teacher(teacher_dir)
    t.artifact = teacher_artifact
    manifest = check_data(data, train, t.tokenizer, teacher_dir)
    s_tok = t.tokenizer if vocab is None else check_cut(vocab, manifest, args.weights, student_folder)
    model = _new_student(student, overrides, args, t, vocab)
    t.model = load_encoder(teacher_dir)
    pairs, groups, _ = _maps(model, t.model, args.weights, args.seed)
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
    if manifest is not None:
        sentences, train_ds = (
            None,
            BlockDataset(teacher_blocks(data, manifest, t.tokenizer, seq_len, args.max_train_samples)),
        )
    else:
        sentences, word_strings = _training_sentences(train, args, budget, start_from, t, model, s_tok, seq_len)
        train_ds = SentenceDataset(s_tok, sentences, seq_len)
    trained_on = _trained_on(train_ds, sentences, manifest, seq_len, student, student_folder, overrides)
    if start_from is not None:  # before the teacher's pass: --resume on other text is refused, not trained on
        check_same_data(Path(start_from), trained_on)
    start_run(
        out,
        start_from is not None,
        run_fingerprint(
            teacher_dir,
            trained_on["student"],
            data_files(train, data, default_corpus()),
            f"embedding ({args.loss} loss)",
        ),
    )
    score = _scorer(score_sts, s_tok, t.recipe.pooling, seq_len, eval_limit, progress)
    metrics = _start_metrics(args, t, student, init, seq_len, len(train_ds), score_sts, eval_limit, data, vocab)
    if manifest is None and args.words:
        metrics["train_word_strings"] = word_strings
    metrics["teacher_sts_spearman"] = score(t.model, t.head, "teacher", t.tokenizer)
    fit = _take_own_head(student, student_folder, model, t, projections, args.init, metrics)
    train_ds = _teacher_vectors(
        projections.head if fit else None, model, t, s_tok, sentences, train_ds, args.weights, seq_len, out, progress
    )
    t.vectors.close()  # the artifact's session, if the pass loaded one: its memory back before training
    metrics["start_sts_spearman"] = score(model, projections.head, "student at step 0")
    trainer = _embedding_trainer(
        model,
        t,
        s_tok,
        train_ds,
        projections,
        pairs,
        groups,
        trained_on,
        args,
        out,
        progress,
        budget,
        start_from,
        callbacks,
        packed=manifest is not None,
    )
    if (
        kept := kept_result(
            trainer, start_from, out, expect=(*metrics, "steps", "train_loss", "last_terms", "student_sts_spearman")
        )
    ) is not None:
        return kept
    start_checkpoints(out / "checkpoints", start_from)
    result = trainer.train(resume_from_checkpoint=start_from)
    model = trainer.model.eval()
    metrics.update(steps=trainer.state.global_step, **trainer.trained(result), seed=args.seed)
    metrics["student_sts_spearman"] = score(model, projections.head, "student")
    if trainer.is_world_process_zero():
        _save_result(trainer, model, projections.head, s_tok, out, t.recipe, seq_len, metrics)
    return finite(metrics)


def _check_args(args: EmbeddingArgs, score_sts: bool, eval_limit: int | None) -> None:
    """``ValueError`` for an option no run can take, before anything is read or made."""
    if score_sts and eval_limit is not None and eval_limit < 2:
        raise ValueError(
            f"a Spearman correlation needs at least 2 STS-B dev pairs; --max-eval-samples / --eval-limit "
            f"is {eval_limit}"
        )
    if args.loss not in EMBEDDING_LOSSES:
        raise ValueError(f"--loss {args.loss!r}: choose one of {', '.join(EMBEDDING_LOSSES)}")
    if args.init not in ("teacher", "random"):
        raise ValueError(f"--init {args.init!r}: choose teacher or random")


def _read_teacher(teacher_dir) -> _Teacher:
    """The teacher folder's recipe, config and tokenizer (any encoder architecture: ``training.teacher``);
    ``ValueError`` for a folder that is no encoder or pools in a way the loss does not."""
    from ..formats.recipe import read_recipe
    from .teacher import teacher_config, teacher_tokenizer

    check_encoder(teacher_dir)
    recipe = read_recipe(teacher_dir)
    if recipe.pooling not in TORCH_POOLING:  # the loss pools the student in torch, as the teacher pools
        raise ValueError(
            f"the teacher pools by {recipe.pooling!r}; embedding distillation supports {', '.join(TORCH_POOLING)}"
        )
    config = teacher_config(teacher_dir)
    return _Teacher(teacher_dir, recipe, config, teacher_tokenizer(teacher_dir, config))


def _new_student(student: str, overrides: dict, args: EmbeddingArgs, t: _Teacher, vocab):
    """The seeded student (:func:`build_student`) with its depth sampling; a student folder must read the
    teacher's tokens."""
    from transformers import set_seed

    set_seed(args.seed)
    model = build_student(student, overrides, t.config.vocab_size if vocab is None else vocab.table_rows)
    model.config.train_min_depth = check_depth_sampling(args.depth_sampling, model.config.num_hidden_layers)
    if Path(student).exists():
        check_tokenizers(t.tokenizer, load_tokenizer(student, model.config.vocab_size), t.dir, student)
    return model


def _init_student(model, t: _Teacher, projections, init: str, student_folder: bool, vocab) -> dict:
    """A new student started from the teacher's weights (``student_init``) under ``--init teacher``; what it
    was started from, for the metrics."""
    if init != "teacher" or student_folder:
        return {"init": "random"}
    from .student_init import init_from_teacher

    return init_from_teacher(
        model, t.model, projections.head if t.head is None else None, rows=None if vocab is None else vocab.kept
    )


def _teacher_to_device(t: _Teacher) -> None:
    """The teacher's passes (targets, terms) run on the GPU, where there is one."""
    device = training_device()
    t.model.to(device)
    if t.head is not None:
        t.head.to(device)


def _training_sentences(
    train, args: EmbeddingArgs, budget, start_from, t: _Teacher, model, s_tok, seq_len: int
) -> tuple[list[str], int]:
    """The ``--train`` sentences (default: :func:`default_corpus`), at most ``IN_MEMORY`` unless
    ``--max-train-samples`` says, with ``args.words`` strings of the student's vocabulary words after each, and
    under a ``budget`` as many as its time allows; and how many of them are word strings."""
    sentences = read_sentences(train or default_corpus(), args.max_train_samples or IN_MEMORY + 1)
    if not args.max_train_samples and len(sentences) > IN_MEMORY:  # refused now, not out of memory hours later
        raise ValueError(
            f"--train holds over {IN_MEMORY:,} sentences, and each is kept in memory with its "
            f"teacher vector: pass --max-train-samples N, or `sharebert prepare --tokenizer "
            f"{t.dir}` the text and pass --data, which streams a corpus of any size"
        )
    if args.words:
        from .corpus import vocabulary_words, with_word_strings

        real = set(sentences)
        sentences = with_word_strings(sentences, vocabulary_words(s_tok), args.words, args.seed)
    if budget is not None:  # the teacher's pass sized to the time (a resume: to the checkpoint's sentences)
        sentences = sentences[
            : _budgeted_count(budget, start_from, t.vectors, model, sentences, args.batch_size, s_tok)
        ]
    return sentences, (sum(x not in real for x in sentences) if args.words else 0)


def _trained_on(
    train_ds, sentences, manifest, seq_len: int, student: str, student_folder: bool, overrides: dict
) -> dict:
    """What the run trains on and from, kept with its checkpoints (``distill.check_same_data``)."""
    seen = (
        "\n".join(sentences) if manifest is None else f"{json.dumps(manifest, sort_keys=True, default=str)}|{seq_len}"
    )
    return {
        "sentences": len(train_ds),
        "sentences_sha256": hashlib.sha256(f"{len(train_ds)}|{seen}".encode()).hexdigest()[:16],
        "student": (str(Path(student).resolve()) if student_folder else student)
        + "".join(f" --set {k}={v}" for k, v in sorted(overrides.items())),
    }


def _scorer(score_sts: bool, tokenizer, pooling: str, seq_len: int, eval_limit: int | None, progress: bool):
    """``score(model, head, who, tok=tokenizer)``: the STS-B dev Spearman (:func:`sts_spearman`), None when
    the run does not score."""

    def score(model, head, who, tok=tokenizer):
        if not score_sts:
            return None
        return sts_spearman(model, tok, pooling, head, seq_len, eval_limit, who if progress else None)

    return score


def _start_metrics(
    args: EmbeddingArgs,
    t: _Teacher,
    student: str,
    init: dict,
    seq_len: int,
    examples: int,
    score_sts: bool,
    eval_limit: int | None,
    data,
    vocab,
) -> dict:
    """The metrics known before training: the recipe, the student, its start and the data."""
    return {
        "objective": "embedding",
        "loss": args.loss,
        "pooling": t.recipe.pooling,
        "normalize": t.recipe.normalize,
        "teacher_dir": str(t.dir),
        "student": student,
        **init,
        "seq_len": seq_len,
        "train_sentences": examples,
        "sts_dev_pairs": len(sts_dev(eval_limit).labels) if score_sts else None,
        **({"train_data": str(data)} if data is not None else {}),
        **({"vocabulary": vocab.as_dict()} if vocab is not None else {}),
    }


def _take_own_head(
    student: str, student_folder: bool, model, t: _Teacher, projections, init: str, metrics: dict
) -> bool:
    """A student folder keeps its own output head (said in ``metrics``); otherwise the new head is fitted, on a
    resume too (the checkpoint then replaces it): the step-0 score is the run's, not a random head's. Whether
    ``projections.head`` is to be fitted."""
    own = student_head(student, model.config.hidden_size, t.width, t.recipe.pooling) if student_folder else None
    if own is not None:  # moved to the training device with the other projections by the trainer
        projections.head = own
        metrics["head"] = "the student's own"
    return projections.head is not None and init == "teacher" and own is None


def _teacher_vectors(
    head: nn.Linear | None,
    model,
    t: _Teacher,
    s_tok,
    sentences,
    train_ds,
    weights,
    seq_len: int,
    out: Path,
    progress: bool,
):
    """The teacher's vectors the run needs before training; returns the training set (with the vectors where
    the teacher runs once). ``head``: the student's output projection to fit, None for none."""
    if sentences is None:  # --data: the teacher runs on each batch; the head is fitted on the first blocks
        if head is not None:
            _fit_head_on_blocks(head, model, t, train_ds)
        return train_ds
    return _fit_head_on_sentences(head, model, t, s_tok, sentences, train_ds, weights, seq_len, out, progress)


def _fit_head_on_blocks(head: nn.Linear, model, t: _Teacher, train_ds: BlockDataset) -> None:
    """The student's output projection fitted on the first ``HEAD_FIT`` packed blocks."""
    n = min(HEAD_FIT, len(train_ds))
    fit_head(
        head,
        encode_blocks(model, train_ds.blocks, n, t.recipe.pooling),
        encode_blocks(t.model, train_ds.blocks, n, t.recipe.pooling, t.head),
    )


def _fit_head_on_sentences(
    head: nn.Linear | None,
    model,
    t: _Teacher,
    s_tok,
    sentences,
    train_ds,
    weights,
    seq_len: int,
    out: Path,
    progress: bool,
):
    """The teacher's vectors of the sentences: the student's output ``head`` (None: no fit) fitted on the first
    ``HEAD_FIT``; without token-level terms every sentence's, kept with the training set, which is returned."""
    live = weights.hidden or weights.embedding or weights.attention  # the teacher runs on each batch
    pooling = t.recipe.pooling
    if head is not None or not live:  # with live terms the vectors are only for the fit
        targets = _teacher_targets(
            t.vectors, t.dir, sentences[:HEAD_FIT] if live else sentences, t.width, out, progress
        )
    if head is not None:
        fit_head(head, encode(model, s_tok, sentences[:HEAD_FIT], pooling, seq_len=seq_len), targets[:HEAD_FIT])
    return train_ds if live else WithTeacherLogits(train_ds, targets)


def _embedding_trainer(
    model,
    t: _Teacher,
    s_tok,
    train_ds,
    projections,
    pairs,
    groups,
    trained_on: dict,
    args: EmbeddingArgs,
    out: Path,
    progress: bool,
    budget,
    start_from,
    callbacks,
    packed: bool,
):
    """The embedding trainer, bound by ``--max-time`` (under a ``budget``: what the budget leaves training) and
    ``--max-steps``, marking its checkpoints. ``packed``: the training rows are --data's blocks, all one length."""
    from .callbacks import MarkCheckpoints, WallClockLimit

    # sentences of like length batched together: a batch costs its longest sentence times its size, and WikiText's
    # run from 8 to 60 tokens, so random batches are half padding
    grouped = {} if packed else {"train_sampling_strategy": "group_by_length"}
    targs = stream_training_args(out, args, progress, remove_unused_columns=False, **grouped)
    clock = WallClockLimit(args.max_time) if args.max_time else None
    if budget is not None:  # training gets what the command's budget leaves (resumed: its checkpoint's seconds too)
        clock = WallClockLimit(budget.training_seconds())
    trainer = EmbeddingTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        processing_class=s_tok,
        data_collator=_Collator(s_tok),
        teacher=t.model,
        projections=projections,
        weights=args.weights,
        pairs=pairs,
        groups=groups,
        callbacks=[MarkCheckpoints(args.save_minutes, keep=2), *callbacks],
        data=trained_on,
        pooling=t.recipe.pooling,
        loss=args.loss,
        teacher_head=t.head,
        limit=clock,
        max_steps=args.max_steps,
        progress=progress,
    )
    return trainer


def _save_result(trainer, model, head, s_tok, out: Path, recipe, seq_len: int, metrics: dict) -> None:
    """The student folder (:func:`save_student`), its log history, curves and metrics."""
    from .callbacks import write_results

    save_student(model, head, s_tok, out, recipe, seq_len)
    write_results(trainer, out, finite(metrics))


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


def _budgeted_count(budget, start_from, vectors, model, sentences, batch: int, student_tok) -> int:
    """How many of ``sentences`` a run under ``budget`` (``plan.TimeBudget``) takes: a resumed run, its
    checkpoint's count (its sentences must be the same); otherwise measured first, the teacher's rate on
    ``RATE_SAMPLE`` sentences through its pass (``vectors``) and a student step (``student_tok``'s tokens:
    :func:`_step_seconds`), then ``budget.plan`` (which prints the plan line)."""

    if start_from is not None:
        from sharebert_runtime.outdir import read_json

        from .distill import DATA_FILE

        try:
            saved = read_json(Path(start_from) / DATA_FILE).get("sentences")
        except (OSError, ValueError, AttributeError):
            saved = None
        return saved if isinstance(saved, int) and saved > 0 else len(sentences)
    rate = _teacher_rate(vectors, sentences)
    spread = sentences[:: max(1, len(sentences) // batch)][:batch]  # lengths as a training batch draws them
    enc = student_tok(spread, truncation=True, max_length=vectors.seq_len, padding=True, return_tensors="pt")
    step = _step_seconds(model, {k: v.to(model.device) for k, v in enc.items()})
    return budget.plan(len(sentences), rate, step, batch)


class _Collator:
    """Pads token fields (the teacher's tokenizer) and stacks the teacher's vectors."""

    def __init__(self, tokenizer):
        from transformers import DataCollatorWithPadding

        self.pad = DataCollatorWithPadding(tokenizer)

    def __call__(self, features: list[dict]) -> dict:
        targets = [f.pop("teacher_logits") for f in features] if "teacher_logits" in features[0] else None
        batch = self.pad(features)
        if targets is not None:
            batch["teacher_logits"] = torch.tensor(np.asarray(targets), dtype=torch.float32)
        return batch


def save_student(model, head, tokenizer, out: Path, teacher_recipe, seq_len: int) -> None:
    """The student as a sentence-transformers folder: backbone and tokenizer, then the teacher's recipe with the
    student's own output projection (if any) as its one Dense layer (``sharebert.formats.recipe.write_recipe``). Every
    file says the length the student was trained at, ``seq_len`` (at most its ``max_position_embeddings``): the
    tokenizer's ``model_max_length`` and the recipe's ``max_seq_length``, so ``truncation=True`` never gives more tokens
    than the model has positions."""
    from ..formats.recipe import DenseLayer, EmbeddingRecipe, write_recipe

    model.save_pretrained(str(out))
    kept, tokenizer.model_max_length = tokenizer.model_max_length, seq_len  # its files say what the model reads
    try:
        tokenizer.save_pretrained(str(out))
    finally:
        tokenizer.model_max_length = kept
    dense, weights = (), ()
    if head is not None:
        dense = (DenseLayer("2_Dense", head.in_features, head.out_features, True, "torch.nn.modules.linear.Identity"),)
        weights = [(head.weight.detach().cpu().numpy(), head.bias.detach().cpu().numpy())]
    recipe = EmbeddingRecipe(
        pooling=teacher_recipe.pooling,
        normalize=teacher_recipe.normalize,
        dense=dense,
        max_seq_length=seq_len,
        do_lower_case=teacher_recipe.do_lower_case,
        source="modules.json",
    )
    write_recipe(out, recipe, weights, hidden_size=model.config.hidden_size)
