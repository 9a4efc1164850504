"""``sharebert compress``: a pre-trained sentence-embedding encoder into a small ShareBERT, in one command.

A classifier teacher (``...ForSequenceClassification``) takes the two-phase path of ``compress_classifier``;
this module holds what both paths share: the probe, the exports, the report (table, JSON, picture).

Steps, each in its own subfolder of ``out`` so a stopped run resumes where it was:

0. every check that needs no model, torch-free (:func:`precheck`); ``out`` is a compress result only by its
   marker (``outdir.MARK``), a ``--resume`` checks the run's fingerprint, ``--overwrite`` keeps the earlier result
   in ``out/.replaced`` until the new report is written (:func:`start_out`);
1. pick the student under the limits (``budget.student_for``: learned parameters incl. its output projection);
   export the teacher (any encoder architecture) at the first quantization that keeps it within cosine 0.99
   (``export_teacher``: int8-dynamic, else int8 weight-only, fp16, fp32) -> ``out/teacher_artifact``, for
   the speed and memory comparison: first, so its cost is measured before the time budget's plan;
2. distil it (``distill_embedding``) in ``out/work/student`` within the :class:`TimeBudget` (``--max-time`` for
   the whole command) or ``max_steps`` steps, then publish the model alone, portable, in ``out/student``
   (:func:`publish_student`: a sentence-transformers folder);
3. export it int8 (``export.export_model``) -> ``out/artifact`` (pooling, projection and Normalize in the artifact);
4. measure teacher and student side by side -> ``report.json``, ``report.md``, ``report.png``: learned
   parameters, file bytes, peak RSS at load and p50 of one sentence at 16 and 128 tokens (1 thread, in a
   fresh torch-free process each), then :func:`embedding_quality`: agreement with the teacher on held-out
   text, ``--eval-pairs``, STS-B dev where present, the cosine calibration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import (
    MARK,
    OutLock,
    atomic_output,
    check_out_dir,
    check_same_run,
    check_unlisted,
    finite,
    made_by,
    mark_out,
    read_json,
    save_figure,
    seal_out,
    write_json,
)

REPORT = "report.json"
WORK = "work"  # an embedding teacher's distillation (checkpoints, the teacher's vectors): kept with --keep-work
PARTS = (
    "general",
    "student",
    WORK,
    "artifact",
    "teacher_artifact",
    "teacher_logits",
    "phases.json",
    REPORT,
    "report.md",
    "report.png",
    MARK,
)  # what a compress run writes in ``out`` (``--overwrite`` replaces these, nothing else)

COMMAND = "compress"  # the marker's command (outdir.MARK): a folder is a compress result only when it says so
ASIDE = ".replaced"  # ``--overwrite``: the earlier result's parts wait here until the new report is written


def _legacy(path: Path) -> bool:
    """A compress result written before the marker existed (its report, or a phase's metrics): said so when it is
    refused (never replaced); anything else is a folder that is not a compress result."""
    try:
        report = read_json(path / REPORT) if (path / REPORT).is_file() else None
    except (OSError, ValueError):
        report = None
    return (isinstance(report, dict) and {"teacher", "student"} <= set(report)) or any(
        (path / part / "metrics.json").is_file() for part in ("student", "general")
    )


class TimeBudget:
    """``--max-time T`` for the whole ``compress`` command (an embedding teacher), counted from the command's
    start: the teacher's pass, training, export, the speed probes and the quality measures within about T.

    Before the first step ``plan`` sizes the teacher's pass from what was measured (the teacher's sentences a
    second, one student step) and says the plan in one line: what is left after the fixed costs of the end
    (:meth:`reserve`: the exports still to come with their parity checks, two probes, the quality measures' sentences
    through teacher and student) goes at most a third to the teacher's vectors, the rest to training, whose clock
    (``training_seconds``) is what is left when it starts. A budget smaller than the end's costs is said so."""

    EXPORT_SECONDS = 25.0  # one export's fixed part (ONNX trace, quantization, latency runs) besides its parity pass
    PROBE_SECONDS = 8.0  # one probe: a fresh torch-free process, 2 x 30 timed sentences
    # A quality sentence through the student's int8 artifact, in teacher sentences (PyTorch fp32): the measures of a
    # run whose teacher vectors were cached (3,740 sentences) took ~50 s where the teacher ran 9 a second (load 9).
    STUDENT_SHARE = 0.15

    def __init__(self, seconds: float, after_sentences: int = 0, say=print, start: float | None = None):
        import time

        self.seconds, self.after_sentences, self.say = seconds, after_sentences, say
        self.start = time.monotonic() if start is None else start
        self.rate = None
        self.exports = 2  # the student's and the teacher's; 1 once the teacher's is made before training
        self.cached_sentences = 0  # of after_sentences, those whose teacher vectors an earlier run left in the cache
        self.planned_steps = None  # the plan's steps (:meth:`plan`), for the report's verdict
        self.min_steps = (
            None  # fewer planned steps are refused (:class:`BudgetTooSmall`); None: any (--allow-untrained)
        )

    def left(self) -> float:
        import time

        return self.seconds - (time.monotonic() - self.start)

    def reserve(self) -> float:
        """Seconds the steps after training take: ``exports`` exports (each its parity pass of 128 sentences through
        PyTorch; ``compress`` makes the teacher's before training, so one), two probes, the quality sentences through
        the teacher (but those cached) and the student (:data:`STUDENT_SHARE` of its cost)."""
        rate = self.rate or 50.0
        return (
            self.exports * (self.EXPORT_SECONDS + 2 * 128 / rate)
            + 2 * self.PROBE_SECONDS
            + ((1 + self.STUDENT_SHARE) * self.after_sentences - self.cached_sentences) / rate
        )

    def plan(self, available: int, rate: float, step: float, batch: int) -> int:
        """How many of ``available`` sentences the teacher encodes (at ``rate`` a second), said with the plan."""
        self.rate = rate
        reserve, spend = self.reserve(), self.left() - self.reserve()
        n = int(min(available, max(4 * batch, rate * max(spend, 0.0) / 3)))
        train = max(spend - n / rate, 1.0)
        self.planned_steps = int(train / step)
        if self.min_steps is not None and self.planned_steps < self.min_steps:
            raise BudgetTooSmall(self._too_small(available, rate, step, batch, train))
        self.say(
            f"plan for --max-time {self.seconds:.0f} s ({self.left():.0f} s left): the teacher's vectors for "
            f"{n:,} of {available:,} sentences (~{n / rate:.0f} s at {rate:.0f} sentences/s), then about "
            f"{train / step:,.0f} steps of {batch} in ~{train:.0f} s of training (~{step:.2f} s a step), then "
            f"export, speed and quality (~{reserve:.0f} s)"
        )
        if spend <= n / rate:
            self.say(
                f"--max-time {self.seconds:.0f} s is less than exporting and measuring take here (~{reserve:.0f} s "
                "after a short training): the run will overrun it; give more time, or --max-steps"
            )
        return n

    def training_seconds(self) -> float:
        """The training clock, set when training starts: what is left less the end's :meth:`reserve`."""
        return max(1.0, self.left() - self.reserve())

    def smallest(self, available: int, rate: float, step: float, batch: int) -> int:
        """The least ``--max-time`` (whole 10 s) whose plan gives :attr:`min_steps` steps, from what was measured:
        the seconds spent so far, the end's :meth:`reserve`, and the teacher's pass that such a plan makes
        (a third of what the end leaves, at least ``4 * batch`` sentences, at most ``available``)."""
        import math

        spend = self.min_steps * step
        for _ in range(60):  # spend = training + the pass it sizes; the pass grows a third as fast: converges
            spend = self.min_steps * step + min(available, max(4 * batch, rate * spend / 3)) / rate
        return 10 * math.ceil((self.seconds - self.left() + self.reserve() + spend) / 10)

    def _too_small(self, available: int, rate: float, step: float, batch: int, train: float) -> str:
        return (
            f"--max-time {self.seconds:.0f} s leaves ~{train:.0f} s of training here, {self.planned_steps:,} steps of "
            f"{batch} at the {step:.2f} s a step measured, fewer than the {self.min_steps:,} a trained student "
            f"needs: give --max-time {self.smallest(available, rate, step, batch)} or more (measured here: "
            f"{self.seconds - self.left():.0f} s spent so far, ~{self.reserve():.0f} s of export and measures to "
            f"come, the teacher at {rate:.0f} sentences/s), or --max-steps N, or --allow-untrained to run anyway"
        )


class BudgetTooSmall(ValueError):
    """A ``--max-time`` whose plan leaves fewer steps than :attr:`TimeBudget.min_steps`: refused before the teacher's
    pass and training, naming the smallest budget that would do (:meth:`TimeBudget.smallest`)."""


# The verdict (:func:`search_verdict`). A student is usable for search when it gives the teacher's top-1 answer on
# at least 9 of 10 of the package's search queries (32 of 35): a user who swaps teacher for student then sees the
# same first result for nine searches in ten. The 5-minute demo's students reach 30-34 of 35 and a 30-step student
# 17 (docs/RESULTS.md): the line parts a trained student from an untrained one.
USABLE_SEARCH = 0.9
# Steps of a batch after which all-MiniLM-L6-v2's 4M student passed USABLE_SEARCH: 2,185 steps of 32 gave 34 of 35,
# 1,164 gave 30 (docs/RESULTS.md). Measured for that teacher only: the suggested budget says so.
USEFUL_STEPS, USEFUL_BATCH = 2_200, 32
# The fewest steps of USEFUL_BATCH a --max-time run must plan unless --allow-untrained (or --max-steps): 400 steps gave
# that student 0.80-0.97 of the search answers, 30 steps 0.49 (docs/RESULTS.md): below it the student is untrained.
TRAINED_STEPS = 400
UNTRAINED_SHARE = 0.5  # a run that took fewer than this share of its planned steps has an untrained student


def is_classifier(config: dict) -> bool:
    """Whether a model folder's config dict names a sequence classifier (``...ForSequenceClassification``)."""
    return any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def probe(artifact: Path, runs: int = 30) -> dict:
    """Peak RSS at load, the time from the process's start to its first answer, and p50 of one sentence at 16 and
    128 tokens (1 thread), in a fresh torch-free process (:mod:`sharebert_runtime.probe`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sharebert_runtime.probe", str(artifact), str(runs), repr(time.time())],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if proc.returncode:
        raise RuntimeError(f"measuring {artifact} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


SAME = {"same": 1.0, "different": 0.0, "yes": 1.0, "no": 0.0, "true": 1.0, "false": 0.0}  # --eval-pairs labels
MAX_EVAL_PAIRS, MAX_EVAL_BYTES = 100_000, 64 << 20  # --eval-pairs: read whole, so bounded


def read_eval_pairs(path) -> tuple[list[str], list[str], list[float]]:
    """``--eval-pairs FILE``: tab-separated ``sentence1, sentence2, gold`` per line, gold a score (any scale) or a
    label (``same``/``different``, ``yes``/``no``, ``1``/``0``); a first line whose gold is neither is a header.
    ``ValueError`` naming the file and line for anything else (torch-free: checked before any model loads)."""
    from sharebert_runtime.textlines import check_text_file

    path = check_text_file(path, "--eval-pairs")
    if path.stat().st_size > MAX_EVAL_BYTES:
        raise ValueError(
            f"--eval-pairs {path} is {path.stat().st_size / 1e6:.0f} MB; give at most "
            f"{MAX_EVAL_BYTES / 1e6:.0f} MB of pairs (a sample)"
        )
    a, b, gold = [], [], []
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError:
            raise ValueError(f"--eval-pairs {path} is not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split("\t")
        value = _gold(fields[-1]) if len(fields) == 3 else None
        if value is None:
            if number == 1 and len(fields) == 3:  # a header
                continue
            if len(fields) == 3:
                raise ValueError(
                    f"--eval-pairs {path}, line {number}: the gold value {fields[-1][:20]!r} (the third field) is "
                    f"neither a number nor one of the labels {', '.join(SAME)}"
                )
            raise ValueError(
                f"--eval-pairs {path}, line {number}: expected 3 tab-separated fields (sentence1, "
                f"sentence2, a score or same/different), got {len(fields)} field(s)"
            )
        a.append(fields[0])
        b.append(fields[1])
        gold.append(value)
        if len(gold) > MAX_EVAL_PAIRS:
            raise ValueError(f"--eval-pairs {path} holds over {MAX_EVAL_PAIRS:,} pairs; give a sample")
    if len(set(gold)) < 2:
        raise ValueError(
            f"--eval-pairs {path}: needs at least 2 pairs with different gold values (has {len(gold)} "
            "pair(s)); a correlation needs both"
        )
    return a, b, gold


def _gold(text: str) -> float | None:
    text = text.strip().lower()
    if text in SAME:
        return SAME[text]
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def neighbour_agreement(student, teacher) -> float:
    """Fraction of sentences whose nearest other sentence (cosine) is the same for the student's vectors as for the
    teacher's: the retrieval answer a user sees, ``(N, H_s)`` and ``(N, H_t)`` rows."""
    import numpy as np

    def nearest(v):
        v = np.asarray(v, dtype=np.float64)
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        sim = v @ v.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)

    return float((nearest(student) == nearest(teacher)).mean())


def search_answers(queries, corpus):
    """Each query's top-1 sentence of ``corpus`` by cosine (rows of vectors)."""
    import numpy as np

    q, c = (np.asarray(v, dtype=np.float64) for v in (queries, corpus))
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    return (q @ c.T).argmax(1)


def search_agreement(t_vec, s_vec, say=print) -> dict:
    """The report's search row: the fraction of the package's search queries (``paths.packaged_search``) whose
    top-1 sentence is the same for the student as for the teacher (``t_vec``, ``s_vec``: texts -> vectors)."""
    from ..formats.paths import packaged_search

    corpus, queries, _ = packaged_search()
    say(f"measuring the student's search answers on {len(queries)} queries over {len(corpus)} sentences ...")
    t, s = search_answers(t_vec(queries), t_vec(corpus)), search_answers(s_vec(queries), s_vec(corpus))
    return {
        "label": f"top-1 search answer agreement with the teacher ({len(queries)} queries over {len(corpus)} "
        "sentences)",
        "teacher": 1.0,
        "student": float((t == s).mean()),
    }


def _cos(a, b):
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def quality_texts(eval_pairs=None, limit: int | None = None) -> list[list[str]]:
    """The lists of texts :func:`embedding_quality` encodes, each through teacher and student, in its order: the
    held-out sentences, the search queries and corpus, ``--eval-pairs``' two sides, STS-B dev's two sides."""
    from ..formats.paths import packaged_heldout, packaged_search
    from ..training.distill_embedding import sts_available, sts_dev

    held = [line.strip() for line in packaged_heldout().read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [held[: max(limit, 3)] if limit else held, *packaged_search()[1::-1]]
    if eval_pairs is not None:
        texts += list(read_eval_pairs(eval_pairs)[:2])
    if sts_available():
        split = sts_dev(limit)
        texts += [list(split.text_a), list(split.text_b)]
    return texts


def quality_sentences(eval_pairs=None, limit: int | None = None) -> int:
    """Sentences :func:`embedding_quality` encodes (each through teacher and student), for :class:`TimeBudget`."""
    return sum(map(len, quality_texts(eval_pairs, limit)))


def embedding_quality(teacher, student_embed, eval_pairs=None, say=print, limit: int | None = None) -> dict:
    """The embedding measures of the report, each named by what it was measured on (``{key: {"label", "teacher",
    "student"}}``; the student is ``student_embed`` (texts -> vectors: its int8 artifact's ``Runtime.embed``), the
    teacher its PyTorch fp32 model and recipe):

    - ``agreement_cosine`` / ``agreement_top1``: the student's mean cosine to the teacher's vector of the same
      sentence, and its top-1 neighbour agreement, on the held-out sentences shipped in the package
      (``paths.packaged_heldout``; never trained on by default);
    - ``eval_pairs_spearman``: Spearman of cosine with the gold of ``--eval-pairs`` (all its pairs);
    - ``sts_spearman``: STS-B dev Spearman on all 1,500 pairs, where the data folder holds STS-B;
    - ``calibration``: mean cosine of related pairs (the gold's top quarter, of ``--eval-pairs`` or STS-B) and of
      unrelated ones (held-out sentences paired with others), for both: a threshold tuned on the teacher moves.

    ``limit`` (tests and the docs check only; the command has none): the first ``limit`` STS-B pairs and held-out
    sentences, said in the labels."""
    import numpy as np

    from ..formats.paths import packaged_heldout
    from ..formats.recipe import read_recipe
    from ..training.distill_embedding import encode, load_encoder, recipe_head, sts_available, sts_dev
    from ..training.metrics import cosine_spearman
    from ..training.teacher import teacher_tokenizer

    recipe = read_recipe(teacher)
    t_model, t_head = load_encoder(teacher), recipe_head(teacher, recipe)
    t_tok = teacher_tokenizer(teacher)  # any encoder architecture
    seq_len = _max_length(teacher)
    cache_key = teacher_vectors_key(teacher)  # not "key": the loop below names each measure so
    t_vec = lambda texts: cached_teacher_vectors(  # noqa: E731
        cache_key, texts, lambda: encode(t_model, t_tok, list(texts), recipe.pooling, t_head, seq_len)
    )
    s_vec = lambda texts: np.stack(student_embed(list(texts)))  # noqa: E731
    held = [line.strip() for line in packaged_heldout().read_text(encoding="utf-8").splitlines() if line.strip()]
    held = held[: max(limit, 3)] if limit else held
    say(f"measuring the student's agreement with the teacher on {len(held)} held-out sentences ...")
    t_held, s_held = t_vec(held), s_vec(held)
    where = f"{len(held)} held-out WikiText-2 sentences"
    rows = {
        "agreement_cosine": {
            "label": f"mean cosine to the teacher's vector ({where})",
            "teacher": 1.0,
            "student": float(_cos(s_held, t_held).mean()) if s_held.shape == t_held.shape else None,
        },
        "agreement_top1": {
            "label": f"top-1 neighbour agreement with the teacher ({where})",
            "teacher": 1.0,
            "student": neighbour_agreement(s_held, t_held),
        },
    }
    rows["search_top1"] = search_agreement(t_vec, s_vec, say)
    shift = np.roll(np.arange(len(held)), len(held) // 2)  # each sentence with one far from it: unrelated
    calibration = {
        "unrelated": {
            "teacher": float(_cos(t_held, t_held[shift]).mean()),
            "student": float(_cos(s_held, s_held[shift]).mean()),
            "measured_on": f"{len(held)} pairs of unrelated held-out sentences",
        }
    }
    pair_sets = []
    if eval_pairs is not None:
        a, b, gold = read_eval_pairs(eval_pairs)
        pair_sets.append(
            (
                "eval_pairs_spearman",
                f"Spearman of cosine with the gold of {Path(eval_pairs).name} ({len(gold)} pairs)",
                a,
                b,
                gold,
            )
        )
    if sts_available():
        split, every = sts_dev(limit), len(sts_dev().labels)
        which = f"all {every}" if len(split.labels) == every else f"the first {len(split.labels)} of {every}"
        pair_sets.append(
            ("sts_spearman", f"STS-B dev Spearman ({which} pairs)", split.text_a, split.text_b, split.labels)
        )
    for key, label, a, b, gold in pair_sets:
        say(f"measuring {label} ...")
        (ta, tb), (sa, sb) = (t_vec(a), t_vec(b)), (s_vec(a), s_vec(b))
        rows[key] = {"label": label, "teacher": cosine_spearman(ta, tb, gold), "student": cosine_spearman(sa, sb, gold)}
        top = np.asarray(gold, dtype=np.float64) >= np.quantile(gold, 0.75)
        if "related" not in calibration and top.any():
            calibration["related"] = {
                "teacher": float(_cos(ta[top], tb[top]).mean()),
                "student": float(_cos(sa[top], sb[top]).mean()),
                "measured_on": f"the {int(top.sum())} pairs of the gold's top quarter, {label}",
            }
    return {"measures": rows, "calibration": calibration}


def teacher_vectors_key(teacher) -> str:
    """What the teacher's vectors of the quality measures depend on: its files (``fingerprint.teacher_fingerprint``:
    weights, config, tokenizer, recipe and Dense modules) and the length it reads."""
    import hashlib

    from ..training.fingerprint import teacher_fingerprint

    return hashlib.sha256(json.dumps([teacher_fingerprint(teacher), _max_length(teacher)]).encode()).hexdigest()


def _vectors_path(key: str, texts) -> Path:
    import hashlib

    from ..formats.paths import cache_dir

    digest = hashlib.sha256(json.dumps([key, list(texts)]).encode()).hexdigest()[:24]
    return cache_dir() / "teacher-vectors" / f"{digest}.npy"


def cached_teacher_vectors(key: str, texts, compute):
    """The teacher's vectors of ``texts`` (``compute()``), kept in the cache (``paths.cache_dir``) under ``key``
    (:func:`teacher_vectors_key`) and the texts: the teacher's side of a report's measures (held-out sentences,
    search set, STS-B: 3,740 sentences, ~3 minutes of a 5-minute compress on 2 loaded cores) is computed once
    per teacher. A damaged file is computed again; a cache that cannot be written is skipped."""
    import numpy as np

    path = _vectors_path(key, texts)
    try:
        cached = np.load(path, allow_pickle=False)
        if (
            cached.ndim == 2
            and cached.shape[0] == len(texts)
            and cached.dtype.kind == "f"
            and np.isfinite(cached).all()
        ):
            return cached
    except (OSError, ValueError, EOFError):
        pass
    vectors = compute()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.npy")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, vectors)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return vectors


def cached_quality_sentences(teacher, eval_pairs=None, limit: int | None = None) -> int:
    """How many of :func:`quality_sentences` have the teacher's vectors in the cache already (for the plan)."""
    key = teacher_vectors_key(teacher)
    return sum(len(texts) for texts in quality_texts(eval_pairs, limit) if _vectors_path(key, texts).is_file())


def weight_bytes(folder: Path, suffixes=(".onnx", ".data", ".ort", ".safetensors", ".bin")) -> int:
    """Bytes of a model folder's or artifact's weight and graph files (checkpoints included if present)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and f.suffix in suffixes)


# The teacher's artifact in a compress report: the first of these whose outputs keep the teacher (TEACHER_COSINE).
# Measured (docs/RESULTS.md): all-MiniLM-L6-v2's sentence embeddings at int8-dynamic 0.9866 mean cosine to fp32
# (refused), int8 weight-only 0.9987, fp16 0.99999994; ORT's dynamic int8 compute is what loses them.
TEACHER_QUANTIZATIONS = ("int8-dynamic", "int8", "fp16", "none")
TEACHER_COSINE = 0.99
# The teacher's parity sentences at each rung: its PyTorch and ONNX passes are a third of an export (MiniLM, 1 thread:
# 29 of 79 s at 128 sentences); 64 still tell 0.9866 from 0.99 (the spread of a sentence's cosine is ~0.005).
TEACHER_CHECK = 64


def kept_cosine(manifest: dict) -> float:
    """How well an artifact keeps its model: the mean cosine of its sentence embeddings (else of its outputs) to
    PyTorch's on the export's check sentences; a classifier's class agreement counts too (the lower of the two)."""
    parity = manifest["parity"]
    cosine = parity.get("sentence_embedding", parity)["cosine_mean"]
    return min(cosine, parity.get("agreement", 1.0))


def export_teacher(teacher, out: Path, task: str, progress: bool, say=print) -> tuple[Path, str, dict]:
    """The teacher's artifact in ``out`` at the first of :data:`TEACHER_QUANTIZATIONS` that keeps it within
    :data:`TEACHER_COSINE`: ``(artifact, quantization, {refused mode: why})``. The artifact a resumed run chose is
    kept (exported again only if the teacher changed since); else the one an earlier run of this teacher left in the
    cache (:func:`teacher_cache`)."""
    manifest = Path(out) / "manifest.json"
    chosen = _verified_choice(Path(out), say) if manifest.is_file() else None
    if chosen in TEACHER_QUANTIZATIONS:
        export_once(Path(teacher), Path(out), chosen, progress, task=task, allow_low_parity=True)
        if kept_cosine(read_json(manifest)) >= TEACHER_COSINE:
            return Path(out), chosen, {}
    cache = teacher_cache(teacher, task)
    if (hit := _from_cache(cache, Path(out), say)) is not None:
        say(f"the teacher's {hit[0]} artifact from the cache ({cache}), exported by an earlier run")
        return Path(out), *hit
    mode, refused = _teacher_ladder(teacher, Path(out), task, progress, say)
    _to_cache(cache, Path(out), mode, refused, say)
    return Path(out), mode, refused


def _teacher_ladder(teacher, out: Path, task: str, progress: bool, say) -> tuple[str, dict]:
    """The first of :data:`TEACHER_QUANTIZATIONS` that keeps the teacher, exported into ``out``, and the refusals."""
    from ..export import export_model

    manifest, refused = out / "manifest.json", {}
    for mode in TEACHER_QUANTIZATIONS:
        try:
            export_model(
                teacher,
                out,
                task=task,
                quantize=mode,
                overwrite=True,
                progress=progress,
                check_limit=TEACHER_CHECK,
                runs=5,
                allow_low_parity=True,
            )
        except ValueError as e:  # ParityError: outputs not finite
            refused[mode] = first_line(e)
            continue
        cosine = kept_cosine(read_json(manifest))
        if cosine >= TEACHER_COSINE:
            return mode, refused
        refused[mode] = f"mean cosine {cosine:.4f} to PyTorch < {TEACHER_COSINE}"
        say(f"the teacher at --quantize {mode} does not keep it ({refused[mode]}); the next mode instead")
    raise ValueError(
        f"no quantization keeps the teacher {teacher}: {'; '.join(f'{k}: {v}' for k, v in refused.items())}"
    )


def teacher_cache(teacher, task: str) -> Path:
    """The cache folder of a teacher's artifact (``paths.cache_dir``): keyed by the teacher's files
    (``fingerprint.teacher_fingerprint``), the task, the quantization ladder and its bar, and the exporter's code,
    so a second ``compress`` of the same teacher skips its exports (on all-MiniLM-L6-v2, 2 cores: ~100 s, half of
    it the int8-dynamic export the bar refuses)."""
    import hashlib

    from .. import export
    from ..formats.paths import cache_dir
    from ..training.fingerprint import teacher_fingerprint

    sources = sorted(Path(export.__file__).parent.glob("*.py"))
    key = json.dumps(
        [
            teacher_fingerprint(teacher),
            task,
            TEACHER_QUANTIZATIONS,
            TEACHER_COSINE,
            [hashlib.sha256(f.read_bytes()).hexdigest() for f in sources],
        ]
    )
    return cache_dir() / "teacher-artifacts" / hashlib.sha256(key.encode()).hexdigest()[:24]


CACHE_CHOICE = "choice.json"  # beside the cached artifact: the quantization chosen and the ones refused


def _verified_choice(artifact: Path, say) -> str | None:
    """The quantization of the teacher's artifact in ``artifact`` when it passes its own manifest (every field, the
    size and sha256 of every file: ``verify_artifact``); else None, said in one line, and it is exported again. A
    truncated or edited file is never measured (it failed at the end of the run, as an internal error)."""
    from sharebert_runtime.artifact import ArtifactError, verify_artifact

    try:
        return verify_artifact(artifact).get("quantization")
    except (ArtifactError, OSError) as e:
        say(f"the teacher's artifact in {artifact} fails its manifest's checks ({first_line(e)}): exported again")
        return None


def _from_cache(cache: Path, out: Path, say=print) -> tuple[str, dict] | None:
    """``(quantization, refusals)`` with the cached artifact copied into ``out``; None where there is none (or an
    unreadable one, or one that fails its manifest's hashes: said, removed and exported again)."""
    try:
        choice = read_json(cache / CACHE_CHOICE)
        mode, refused = choice["quantization"], dict(choice["refused"])
        if mode not in TEACHER_QUANTIZATIONS:
            return None
        if _verified_choice(cache / "artifact", say) != mode:
            shutil.rmtree(cache, ignore_errors=True)
            return None
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(cache / "artifact", out)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return mode, refused


def _to_cache(cache: Path, out: Path, mode: str, refused: dict, say) -> None:
    """The teacher's artifact and choice kept in ``cache`` for the next run; a cache that cannot be written is said
    and skipped (the run goes on)."""
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out, tmp / "artifact")
        write_json(tmp / CACHE_CHOICE, {"quantization": mode, "refused": refused})
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"the teacher's artifact is not cached ({first_line(e)}); set SHAREBERT_CACHE to a writable folder")


def export_once(
    model_dir: Path,
    out: Path,
    quantize: str,
    progress: bool,
    task: str = "feature-extraction",
    allow_low_parity: bool = False,
) -> Path:
    """``model_dir`` exported to ``out``, unless ``out`` holds an artifact made after ``model_dir``'s weights
    were written: a run resumed after its export is not exported twice, one that trained on is."""
    from sharebert.export import export_model

    manifest = out / "manifest.json"
    weights = [f.stat().st_mtime for f in Path(model_dir).iterdir() if f.suffix in (".safetensors", ".bin")]
    if not manifest.is_file() or manifest.stat().st_mtime < max(weights, default=0.0):
        export_model(
            model_dir,
            out,
            task=task,
            quantize=quantize,
            overwrite=True,
            progress=progress,
            check_limit=128,
            runs=5,
            allow_low_parity=allow_low_parity,
        )
    return out


def check_out(out, teacher, train, overwrite: bool, resume: bool, data=None) -> Path:
    """``out`` checked, nothing changed: a new or empty folder, or a compress result (its marker) with
    ``overwrite``/``resume``; one written before the marker existed is refused (``outdir.check_out_dir``)."""
    path = check_out_dir(
        out,
        "compress result",
        made_by(COMMAND),
        overwrite or resume,
        legacy=_legacy,
        inputs=(teacher, *([data] if data is not None else []), *(train or [])),
        stopped=stopped_run,
    )
    if overwrite and not resume:
        check_unlisted(path, out, "compress run")
    return path


def stopped_run(out: Path) -> str | None:
    """What a compress run stopped before its report (Ctrl-C, SIGTERM, a kill after a periodic save) left for
    ``--resume``, in words: its newest checkpoint (the distillation's, or a classifier's phase's); None for a
    finished run or one stopped before its first checkpoint. Torch-free: names only (``--resume`` checks the rest)."""
    if (out / REPORT).is_file():
        return None
    found = [
        (int(p.name.removeprefix("checkpoint-")), p)
        for phase in (f"{WORK}/student", "general", "student")
        for p in (out / phase / "checkpoints").glob("checkpoint-*")
        if p.name.removeprefix("checkpoint-").isdigit() and p.is_dir()
    ]
    if not found:
        return None
    step, path = max(found)
    return f"a checkpoint at step {step}, {path.relative_to(out)}"


def check_train(train) -> None:
    """``--train`` files refused in one line before any model loads (torch-free): missing, not a regular file (a
    FIFO, a device), empty, binary, or a ``.tsv`` whose first line is no GLUE header."""
    from sharebert_runtime.textlines import resolve_sources

    from ..training.glue import text_fields

    for src in resolve_sources(train) if train else ():
        if isinstance(src, str):  # hf: names are read when training starts
            continue
        if src.stat().st_size == 0:
            raise ValueError(f"--train {src} is empty: give a file of text, one paragraph or sentence per line")
        if src.suffix in (".gz", ".bz2"):  # compressed: the reader sniffs the text inside
            continue
        with open(src, "rb") as f:
            head = f.read(1 << 16)
        if b"\0" in head:
            raise ValueError(f"--train {src} is binary, not UTF-8 text")
        if (
            src.suffix == ".tsv"
            and text_fields(head.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r").split("\t")) is None
        ):
            raise ValueError(
                f"--train {src}: a .tsv needs a GLUE header naming its text column (e.g. 'sentence', "
                "'sentence1'); a plain text file: give it another suffix, e.g. .txt"
            )


def precheck(
    teacher, out, limits: dict, train=None, data=None, overwrite: bool = False, resume: bool = False, eval_pairs=None
):
    """Every check that needs no model, torch-free and in well under 2 s, before anything is loaded or changed:
    the teacher's config, a student under ``limits``, ``--out``, the ``--train`` and ``--eval-pairs`` files.
    Returns ``(out, the teacher's config dict)``."""
    from ..accounting.budget import student_for
    from ..formats.model_folder import MODEL_TYPES, read_config, shape_fields

    raw = read_config(teacher, model_types=None)
    if raw.get("model_type") in MODEL_TYPES:  # torch-free; another architecture: training.teacher (its budget later,
        labels = raw.get("id2label") if isinstance(raw.get("id2label"), dict) else {}  # a large vocabulary cut first)
        shape = {**shape_fields(teacher), **({} if is_classifier(raw) else {"max_length": _max_length(teacher)})}
        num_labels = max(1, len(labels)) if is_classifier(raw) else None
        try:
            student_for(shape, limits, num_labels=num_labels)
        except ValueError:
            if not _cut_may_fit(shape, limits, num_labels):
                raise
    else:
        from ..training.teacher import read_teacher

        read_teacher(teacher)
    out = check_out(out, teacher, train, overwrite, resume, data)
    check_train(train)
    if eval_pairs is not None:
        read_eval_pairs(eval_pairs)
    return out, raw


def _cut_may_fit(shape: dict, limits: dict, num_labels: int | None = None) -> bool:
    """Whether a vocabulary cut (``training.vocab``) could make a student fit ``limits`` (``num_labels``: a
    classifier's, whose head counts too)."""
    from ..training.vocab import _fits, _ladder

    return any(_fits(budget_fit(num_labels), shape, limits, n) for n in _ladder(1000, int(shape["vocab_size"]), 1.5))


def budget_fit(num_labels: int | None = None):
    """``fits(shape, limits)`` for ``training.vocab.plan_vocabulary``: ``budget.student_for`` with a classifier's
    ``num_labels`` (None: an embedding student's output projection)."""
    from ..accounting.budget import student_for

    return lambda shape, limits: student_for(shape, limits, num_labels=num_labels)


def fingerprint(teacher, student: dict, train, data, objective: str) -> dict:
    """What a ``--resume`` must find unchanged (``fingerprint.run_fingerprint``): the teacher's files, the
    student's shape, the training data (``--train`` files, the ``--data`` manifest, or the default corpus's files)
    and the objective."""
    from ..training.distill_embedding import default_corpus
    from ..training.fingerprint import data_files, run_fingerprint

    return run_fingerprint(
        teacher, json.dumps(student, sort_keys=True), data_files(train, data, default_corpus()), objective
    )


def start_out(out: Path, fp: dict, overwrite: bool, resume: bool) -> Path | None:
    """After every check: with ``resume``, the run's fingerprint compared; with ``overwrite``, the earlier
    result's parts moved into ``out/.replaced`` (kept until :func:`finish_out`; :func:`restore_out` puts them
    back when the new run fails). Then ``out`` is marked a compress result. Returns the side folder, if any."""
    if resume:
        check_same_run(out, fp)
    aside = out / ASIDE
    if os.path.lexists(aside) and not (aside.is_dir() and not aside.is_symlink()):
        raise ValueError(f"{aside} is not the folder compress keeps an earlier result in; move it away and run again")
    if overwrite and not resume:
        if aside.is_dir():  # an earlier --overwrite that never finished: its parts are a partial run, the result waits
            _remove_parts(out)
        else:
            aside.mkdir(parents=True)
            for name in PARTS:
                if os.path.lexists(out / name):
                    os.replace(out / name, aside / name)
    out.mkdir(parents=True, exist_ok=True)
    mark_out(out, COMMAND, fp)
    return aside if aside.is_dir() else None


def _remove_parts(out: Path) -> None:
    for name in PARTS:
        part = out / name
        shutil.rmtree(part) if part.is_dir() and not part.is_symlink() else part.unlink(missing_ok=True)


def restore_out(out: Path, aside: Path | None) -> None:
    """The new run failed: its parts removed, the earlier result put back as it was."""
    if aside is None or not aside.is_dir():
        return
    _remove_parts(out)
    for part in aside.iterdir():
        os.replace(part, out / part.name)
    aside.rmdir()


def finish_out(out: Path) -> None:
    """The new report is written: the earlier result (``--overwrite``) goes."""
    shutil.rmtree(out / ASIDE, ignore_errors=True)


def publish_over(out: Path, fp: dict, overwrite: bool, resume: bool, run) -> dict:
    """``run()``'s report, with the earlier result set aside first (:func:`start_out`): put back when the run fails,
    removed once the new report is written; a stopped run keeps its new parts, to ``--resume``."""
    from ..training.callbacks import StopRequested

    aside = start_out(out, fp, overwrite, resume)
    try:
        report = run()
    except Exception as e:
        if not isinstance(e, StopRequested):
            restore_out(out, aside)
        raise
    if not report.get("stopped"):
        finish_out(out)
        seal_out(out)  # the marker lists what this run wrote: the next --overwrite replaces only those
    return report


STUDENT_FIELDS = (
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "attention",
    "max_position_embeddings",
    "pooler",
)  # a budget candidate's shape, as --set overrides


def student_overrides(cand) -> dict:
    """A budget candidate's shape as ``--set`` overrides (:data:`STUDENT_FIELDS`); a preset that names no attention
    has the standard one (``budget.student_for`` picks only those), said here so the preset it shapes keeps none."""
    return {"attention": "standard", **{k: cand.config[k] for k in STUDENT_FIELDS if k in cand.config}}


def check_same_student(out: Path, overrides: dict, parts=("student",)) -> None:
    """Refuse to resume into ``out`` when a student it holds (saved, or in a checkpoint) has another shape than the
    one these limits pick (``overrides``): the run would fail late, loading the weights into the wrong model."""
    for part in parts:
        folder = out / part
        for config in [folder / "config.json", *sorted(folder.glob("checkpoints/checkpoint-*/config.json"))]:
            try:
                raw = read_json(config)
            except (OSError, ValueError):
                raw = None
            if not isinstance(raw, dict):
                if config.parent == folder and config.exists():  # a checkpoint's may be a save cut short: skipped
                    raise ValueError(f"{config} is not a model config (a JSON object): start again with --overwrite")
                continue
            differ = [f"{k} {raw.get(k)} -> {v}" for k, v in overrides.items() if raw.get(k) != v]
            if differ:
                raise ValueError(
                    f"{out} holds a student of another shape than these options pick ({', '.join(differ)}): "
                    "resume with the first run's --max-params / --max-bytes, or start again with --overwrite"
                )
            break


def compress(
    teacher,
    out,
    limits: dict,
    args,
    train=None,
    data=None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    eval_pairs=None,
    stopper=None,
    say=print,
    eval_limit: int | None = None,
    budget: TimeBudget | None = None,
    portable: bool = True,
    keep_work: bool = False,
    task: str | None = None,
    vocab_size: int | None = None,
) -> dict:
    """Run the steps of the module docstring for a sentence-embedding teacher (a classifier teacher:
    ``compress_classifier``; ``task`` is refused here); returns the report (also written to ``out/report.json``).

    ``args``: ``EmbeddingArgs``; ``stopper``: a ``SignalCheckpoint`` (on SIGTERM/SIGINT the distillation saves a
    checkpoint and the report says ``"stopped"``; run again with ``resume``); ``eval_pairs``: ``--eval-pairs FILE``
    (:func:`read_eval_pairs`); ``eval_limit``: tests and the docs check only (:func:`embedding_quality`);
    ``budget``: a :class:`TimeBudget` (``--max-time`` for the whole command; without, ``args.max_time`` is the
    training's alone). The distillation runs in ``out/work`` (checkpoints, the teacher's vectors; removed when the
    run finishes unless ``keep_work``); ``out/student`` receives the model alone (:func:`publish_student`),
    ``portable`` (``portable.make_portable``) unless told otherwise. ``vocab_size``: cut the teacher's vocabulary to
    this many tokens (``training.vocab``; without it, cut only when the teacher's does not fit ``limits``)."""
    from ..accounting.budget import student_for
    from ..training.callbacks import latest_checkpoint, resume_from
    from ..training.distill import check_encoder
    from ..training.teacher import student_fields, teacher_tokenizer

    out, _ = precheck(teacher, out, limits, train, data, overwrite, resume, eval_pairs)  # nothing loaded or changed
    raw = check_encoder(teacher)
    if is_classifier(raw):  # the command sends a classifier to compress_classifier (which imports this module)
        raise ValueError(f"{teacher} is a classifier: compress it with compress_classifier.compress_classifier")
    if task is not None:
        raise ValueError(
            f"--task is for a classifier teacher; {teacher} is an encoder "
            f"({', '.join(raw.get('architectures') or ['no architectures'])}): compress distils its "
            "sentence embeddings"
        )
    t_tok = teacher_tokenizer(teacher)
    if data is not None:  # refused before anything is written
        from ..training.distill_embedding import check_data

        check_data(data, train, t_tok, teacher)
    vocab = student_vocabulary(teacher, t_tok, limits, args, train, data, vocab_size, say)
    shape = {**embedding_shape(teacher), **({"vocab_size": vocab.table_rows} if vocab is not None else {})}
    cand, head = student_for(shape, limits)
    overrides = {**student_overrides(cand), **student_fields(t_tok)}
    args = replace(args, seq_len=overrides.get("max_position_embeddings", args.seq_len))  # reads what its teacher reads
    fp = fingerprint(teacher, overrides, train, data, f"embedding ({args.loss} loss)")
    check_same_student(out, overrides, ("student", f"{WORK}/student"))  # first: it names each field that differs
    if resume:
        check_same_run(out, fp)
    student_dir = out / WORK / "student"
    if resume and latest_checkpoint(student_dir / "checkpoints") is None:  # said in terms of --out, before any work
        resume_from(student_dir / "checkpoints", True, say=say, out=out)
    say(
        f"student: {cand.describe()}, {cand.params + head:,} learned parameters (output projection {head:,}); it "
        f"reads at most {args.seq_len} tokens, as the teacher does"
    )
    if budget is not None:
        budget.after_sentences = quality_sentences(eval_pairs, eval_limit)
        budget.cached_sentences = cached_quality_sentences(teacher, eval_pairs, eval_limit)
    fresh = not out.is_dir() or all(p.name == OutLock.NAME for p in out.iterdir())
    report = _refused_leaves_nothing(
        out,
        fresh,
        lambda: publish_over(
            out,
            fp,
            overwrite,
            resume,
            lambda: _compress(
                teacher,
                out,
                student_dir,
                cand,
                overrides,
                limits,
                args,
                train,
                data,
                resume,
                progress,
                eval_pairs,
                stopper,
                say,
                eval_limit,
                budget,
                portable,
                vocab,
            ),
        ),
    )
    if not report.get("stopped") and not keep_work:
        shutil.rmtree(out / WORK, ignore_errors=True)
    return report


def _refused_leaves_nothing(out: Path, fresh: bool, run) -> dict:
    """``run()``; a budget refused at the plan (:class:`BudgetTooSmall`) leaves a folder that held nothing before as
    empty as it was (the teacher's artifact stays in the cache), so the command run again needs no --overwrite."""
    try:
        return run()
    except BudgetTooSmall:
        if fresh:
            _remove_parts(out)
        raise


def trained_steps(batch: int) -> int:
    """:data:`TRAINED_STEPS` of :data:`USEFUL_BATCH` sentences, in steps of ``batch``."""
    import math

    return math.ceil(TRAINED_STEPS * USEFUL_BATCH / batch)


def publish_student(work: Path, out: Path, portable: bool) -> Path:
    """``out`` (``--out/student``) as a folder to ship: the model, its tokenizer and its sentence-transformers
    recipe from the distillation's folder ``work``, none of its run files (checkpoints, the teacher's vectors,
    metrics, logs, curves, marker); written beside and swapped in; portable (loads with ``trust_remote_code=True``
    where sharebert is not installed) unless ``portable`` is False."""
    from ..model.modeling_sharebert import AUTO_CLASSES
    from ..model.portable import make_portable
    from ..training.distill import TARGETS_FILE

    run_files = {"checkpoints", "metrics.json", "log_history.json", "curves.png", MARK, ".lock"}
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in work.iterdir():
        if item.name in run_files or item.name.startswith((TARGETS_FILE, ".")):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    if portable:
        make_portable(tmp, AUTO_CLASSES)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _compress(
    teacher,
    out: Path,
    student_dir: Path,
    cand,
    overrides: dict,
    limits: dict,
    args,
    train,
    data,
    resume: bool,
    progress: bool,
    eval_pairs,
    stopper,
    say,
    eval_limit=None,
    budget=None,
    portable: bool = True,
    vocab=None,
) -> dict:
    from ..training.distill_embedding import distill_embedding

    started = budget.start if budget is not None else time.monotonic()
    # The teacher's artifact does not depend on the student: made first, its real cost (a refused quantization
    # is a whole export: ~50 s for MiniLM on a loaded 2-core machine) is spent before the plan, not guessed.
    say("exporting the teacher (the first quantization that keeps it) ...")
    t_art, t_quant, t_refused = export_teacher(teacher, out / "teacher_artifact", "feature-extraction", progress, say)
    if budget is not None:
        budget.exports = 1
    m = distill_embedding(
        teacher,
        "sharebert-tiny",
        student_dir,
        train,
        args,
        overrides=overrides,
        overwrite=True,
        resume=resume or (student_dir / "checkpoints").is_dir(),
        progress=progress,
        data=data,
        score_sts=False,  # measured once, below, from the artifact
        budget=budget if data is None else None,
        callbacks=(stopper,) if stopper is not None else (),
        vocab=vocab,
    )
    if stopper is not None and stopper.received:
        return {"stopped": True, "steps": m["steps"]}
    planned = _planned_steps(budget, args)
    if planned is not None and m["steps"] < UNTRAINED_SHARE * planned:
        say(
            f"training took {m['steps']:,} of the {planned:,} planned steps (they ran slower than the plan measured): "
            "the student may be untrained; the report's verdict says whether it is usable, and what budget would be"
        )
    student_dir = publish_student(student_dir, out / "student", portable)
    say("exporting the student (int8) ...")
    art = export_once(student_dir, out / "artifact", "int8", progress)
    say("measuring memory and speed ...")
    s_probe, t_probe = probe(art), probe(t_art)
    from sharebert_runtime import Runtime

    q = embedding_quality(teacher, Runtime(art).embed, eval_pairs, say, eval_limit)
    s_manifest = json.loads((art / "manifest.json").read_text())
    report = {
        "teacher": {
            "folder": str(teacher),
            "name": teacher_name(teacher),
            "learned_params": safetensor_params(Path(teacher)),
            "file_bytes": weight_bytes(Path(teacher)),
            "artifact_bytes": weight_bytes(t_art),
            "quantization": t_quant,
            "quantization_refused": t_refused,
            **{k: v["teacher"] for k, v in q["measures"].items()},
            **t_probe,
        },
        "student": {
            "folder": str(student_dir),
            "shape": cand.describe(),
            "config": overrides,
            "learned_params": safetensor_params(student_dir),
            "file_bytes": weight_bytes(art),
            **{k: v["student"] for k, v in q["measures"].items()},
            "quantization": s_manifest.get("quantization"),
            **s_probe,
            **({"vocabulary": vocab.as_dict()} if vocab is not None else {}),
        },
        "training": {
            **{
                k: m[k]
                for k in ("steps", "train_seconds", "train_sentences", "loss", "init", "stopped_by_time", "seq_len")
            },
            "train_word_strings": m.get("train_word_strings", 0),
        },
        "limits": {k: v for k, v in limits.items() if v is not None},
        "quality": [{"label": v["label"], "key": k} for k, v in q["measures"].items()],
        "calibration": q["calibration"],
    }
    report["student"].update(portable=portable, max_seq_length=m["seq_len"])
    report["teacher"]["max_seq_length"] = _max_length(teacher)
    tr = report["training"]
    summary = (
        f"{_length_sentence(m['seq_len'], report['teacher']['max_seq_length'])} Distilled {tr['steps']} "
        f"steps ({tr['train_seconds']:.0f} s, {_texts(tr)} of at "
        f"most {tr['seq_len']} tokens, {tr['loss']} loss, initialised from the teacher). Teacher figures: PyTorch "
        "fp32; student figures: its int8 artifact through the torch-free runtime. "
        + calibration_sentence(q["calibration"])
        + (f" The student's {vocab.describe()}." if vocab is not None else "")
    )
    from ..formats.paths import packaged_search

    report["verdict"] = search_verdict(
        report,
        args.batch_size,
        planned,
        _available_sentences(train, args) if data is None else None,
        time.monotonic() - started,
        len(packaged_search()[1]),
    )
    return write_report(out, report, summary)


def _planned_steps(budget, args) -> int | None:
    """The steps the run set out to take: ``--max-steps``, the budget's plan (the lesser of the two), or None (a
    resumed run under a budget, whose plan was made by the run it continues)."""
    known = [n for n in (args.max_steps, budget.planned_steps if budget is not None else None) if n is not None]
    return min(known) if known else None


def _available_sentences(train, args) -> int:
    """The sentences the training text offers (as the distillation reads them, at most ``--max-train-samples``)."""
    from ..training.distill_embedding import IN_MEMORY, default_corpus, read_sentences

    return len(read_sentences(train or default_corpus(), args.max_train_samples or IN_MEMORY))


def search_verdict(
    report: dict, batch: int, planned: int | None, available: int | None, elapsed: float, queries: int
) -> dict:
    """The report's first lines (``lines``) and their figures: whether the student is usable for search (its top-1
    agreement with the teacher on the ``queries`` search queries against :data:`USABLE_SEARCH`), how many steps
    (of ``planned``) and of the ``available`` training sentences it saw, and, when it is not usable, the
    ``--max-time`` the measured seconds a step suggest for :data:`USEFUL_STEPS` (``elapsed``: the run's seconds so
    far, what is not training counted again as is)."""
    import math

    s, tr = report["student"], report["training"]
    search, cosine, steps = s.get("search_top1"), s.get("agreement_cosine"), int(tr["steps"])
    usable = search is not None and search >= USABLE_SEARCH
    used = tr["train_sentences"] - tr.get("train_word_strings", 0)
    per_step = tr["train_seconds"] / steps if steps else None
    untrained = not usable and planned is not None and steps < UNTRAINED_SHARE * planned
    first = (
        f"Verdict: {'usable' if usable else 'NOT usable'} for search: the student gives the teacher's top-1 answer on "
        f"{round((search or 0) * queries)} of {queries} search queries (usable from {USABLE_SEARCH:.2f}, the "
        f"teacher's first result for 9 searches in 10); mean cosine to the teacher's vectors {cosine:.3f}."
    )
    of_planned = f" of the {planned:,} planned" if planned is not None else ""
    rate = f" ({per_step:.2f} s a step, measured)" if per_step else ""
    seen = f"{used:,} of the {available:,} sentences of its training text ({used / max(available, 1):.0%})"
    second = (
        f"It trained {steps:,}{of_planned} steps of {batch} sentences{rate} on "
        + (seen if available else f"{used:,} training rows")
        + f": {steps * batch / max(tr['train_sentences'], 1):.1f} passes over them"
        + (" and their strings of vocabulary words." if tr.get("train_word_strings") else ".")
        + (
            " Far fewer steps than planned (they ran slower than the plan measured): it is untrained."
            if untrained
            else ""
        )
    )
    needed = math.ceil(USEFUL_STEPS * USEFUL_BATCH / batch)
    suggested = None
    if usable:
        third = "This budget was enough."
    elif per_step and steps < needed:
        suggested = 60 * math.ceil((max(elapsed - tr["train_seconds"], 0.0) + needed * per_step) / 60)
        third = (
            f"Suggested budget: --max-time {suggested}: {needed:,} steps of {batch} at the measured {per_step:.2f} s "
            f"a step, plus the {max(elapsed - tr['train_seconds'], 0.0):.0f} s this run spent outside training. "
            f"An estimate from all-MiniLM-L6-v2's student, usable after about {USEFUL_STEPS:,} steps of "
            f"{USEFUL_BATCH} (docs/RESULTS.md): another teacher may need more steps, a cached teacher less time."
        )
    else:
        third = (
            f"It trained the ~{needed:,} steps all-MiniLM-L6-v2's student needed (docs/RESULTS.md): this teacher "
            "needs more; give a larger --max-time, or more training text."
        )
    return {
        "usable_for_search": usable,
        "threshold": USABLE_SEARCH,
        "search_top1": search,
        "mean_cosine": cosine,
        "steps": steps,
        "planned_steps": planned,
        "untrained": untrained,
        "sentences": used,
        "available_sentences": available,
        "seconds_per_step": per_step,
        "suggested_max_time": suggested,
        "lines": [first, second, third],
    }


def _texts(training: dict) -> str:
    """What a run trained on, in words: its sentences, and the strings of vocabulary words among them."""
    words = training.get("train_word_strings", 0)
    sentences = f"{training['train_sentences'] - words:,} sentences"
    return f"{sentences} and {words:,} strings of vocabulary words" if words else sentences


def _length_sentence(student: int, teacher: int) -> str:
    """The report's words on the tokens each model reads (its config, tokenizer and recipe agree on the student's)."""
    said = f"The student reads at most {student} tokens (its config, tokenizer and recipe say so)"
    if student == teacher:
        return f"{said}, as its teacher does."
    return f"{said}; the teacher reads {teacher}: texts longer than {student} tokens are cut earlier."


def student_vocabulary(
    teacher,
    t_tok,
    limits: dict,
    args,
    train,
    data,
    vocab_size: int | None,
    say,
    num_labels: int | None = None,
    more_text=None,
):
    """The teacher's vocabulary cut for the student (``training.vocab.plan_vocabulary``), or None to keep it whole.
    The cut keeps the tokens of the --train text (default corpus) and of ``more_text()`` (a classifier: its task's
    training text); ``num_labels``: a classifier's, whose head the budget counts."""
    from ..training.distill_embedding import IN_MEMORY, default_corpus, read_sentences
    from ..training.vocab import plan_vocabulary

    if data is not None:
        if vocab_size is not None:
            raise ValueError(
                "--vocab-size cuts the vocabulary to the tokens of --train text; a --data folder holds the "
                "teacher's token ids: give --train"
            )
        return None

    def text():
        sentences = read_sentences(train or default_corpus(), args.max_train_samples or IN_MEMORY)
        return [*sentences, *(more_text() if more_text is not None else ())]

    from ..training.teacher import teacher_shape

    shape = teacher_shape(teacher) if num_labels is not None else embedding_shape(teacher)  # an encoder: its positions
    return plan_vocabulary(t_tok, shape, limits, budget_fit(num_labels), text, vocab_size, say)


def embedding_shape(teacher) -> dict:
    """What ``budget.student_for`` reads of an encoder teacher (``teacher.teacher_shape``) and its maximum length
    (:func:`_max_length`): the student gets as many positions, so it reads what its teacher reads."""
    from ..training.teacher import teacher_shape

    return {**teacher_shape(teacher), "max_length": _max_length(teacher)}


def _max_length(model_dir) -> int:
    """The tokens a model folder reads: its recipe's ``max_seq_length``, else its position embeddings; never more
    than its position embeddings."""
    from ..formats.model_folder import read_config
    from ..formats.recipe import read_recipe

    positions = int(read_config(model_dir, model_types=None).get("max_position_embeddings", 512))
    return min(read_recipe(model_dir).max_seq_length or positions, positions)


def teacher_name(teacher) -> str:
    """The teacher's name for titles: its model card's first heading (``README.md``'s ``# all-MiniLM-L6-v2``, as
    the Hub writes them; config.json's ``_name_or_path`` names the base model a fine-tuned one came from), else
    the folder's name, with its parent's when that alone says little (``model``, ``snapshot``)."""
    folder = Path(teacher).absolute()
    card = folder / "README.md"
    if card.is_file():
        with open(card, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)
        title = next((line[2:].strip() for line in head.splitlines() if line.startswith("# ")), "")
        if 0 < len(title) <= 80:
            return title
    generic = ("model", "student", "snapshot", "")
    return folder.name if folder.name not in generic else f"{folder.parent.name}/{folder.name}"


def calibration_sentence(c: dict) -> str:
    """The cosine calibration in words: where a threshold tuned on the teacher's cosines lands for the student."""
    parts = [
        f"{kind} pairs {v['teacher']:.2f} (teacher) vs {v['student']:.2f} (student), on {v['measured_on']}"
        for kind, v in c.items()
    ]
    return (
        (
            "Cosine calibration, mean cosine of " + "; ".join(parts) + ": a similarity threshold tuned on the "
            "teacher's cosines moves with these means."
        )
        if parts
        else ""
    )


def write_report(out: Path, report: dict, summary: str) -> dict:
    """``report.json`` (``report`` with ``summary`` and the ``cpu`` its figures came from), ``report.md`` (the table,
    then ``summary``), ``report.png``."""
    from sharebert_runtime.cpu import cpu_info

    report = finite({**report, "cpu": cpu_info(), "summary": summary})
    write_json(out / REPORT, report)
    with atomic_output(out / "report.md") as f:
        f.write(report_markdown(report))
    plot_report(report, out / "report.png")
    return report


def safetensor_params(folder: Path) -> int:
    """Learned parameters stored in a folder's safetensors files (the model and any Dense module; float tensors)."""
    from math import prod

    from safetensors import safe_open

    n = 0
    for f in sorted(folder.rglob("*.safetensors")):
        if "checkpoint" in str(f.relative_to(folder)):
            continue
        with safe_open(str(f), "np") as st:
            n += sum(
                prod(st.get_slice(k).get_shape())
                for k in st.keys()
                if st.get_slice(k).get_dtype() in ("F32", "F16", "BF16")
            )  # not integer buffers (position ids)
    return n


ROWS = (
    ("learned parameters", "learned_params", "{:,}", "count"),
    ("file bytes (int8 artifact)", "file_bytes", None, "MB"),
    ("peak RSS at load (1 thread, fresh process)", "peak_rss_bytes", None, "MB"),
    ("RAM the artifact adds (load + 1 request)", "added_rss_bytes", None, "MB"),
    ("p50, 16 tokens, 1 thread", "p50_ms_16", "{:.2f} ms", "ms"),
    ("p50, 128 tokens, 1 thread", "p50_ms_128", "{:.2f} ms", "ms"),
    ("time to first answer (fresh process: start, imports, load, 1 request)", "first_answer_ms", "{:.0f} ms", "ms"),
)  # then the report's quality rows


def rows(r: dict) -> tuple:
    """The report's rows ``(label, key, format, unit)``: size, memory and speed, then its quality measures, each
    label saying what it was measured on. ``quality`` is a list (or, in a report of the first layout, one dict)."""
    quality = r["quality"] if isinstance(r["quality"], list) else [r["quality"]]
    return ROWS + tuple((q["label"], q["key"], "{:.4f}", "") for q in quality)


def _fmt(value, fmt) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.1f} MB" if fmt is None else fmt.format(value)


def _sides(r: dict) -> tuple[dict, dict]:
    t, s = dict(r["teacher"]), dict(r["student"])
    t["file_bytes"] = t["artifact_bytes"]  # size, memory and speed: both as int8 artifacts
    return t, s


def report_markdown(r: dict) -> str:
    """The report as a Markdown table, teacher beside student, with the ratio; then the cosine calibration."""
    from sharebert_runtime.cpu import describe

    t, s = _sides(r)
    name = t.get("name") or Path(t["folder"]).name
    verdict = (r.get("verdict") or {}).get("lines") or []
    lines = [
        "# Compression report",
        "",
        *[line for v in verdict for line in (v, "")],
        f"teacher {name} (`{t['folder']}`) -> student {s['shape']} (`{s['folder']}`)",
        "",
        *([f"measured on {describe(r['cpu'])}", ""] if r.get("cpu") else []),
        f"| | teacher ({t.get('quantization', 'int8-dynamic')} artifact; quality rows in PyTorch fp32) "
        "| student (int8 artifact) "
        "| student / teacher |",
        "|---|---|---|---|",
    ]
    for label, key, fmt, _ in rows(r):
        tv, sv = t.get(key), s.get(key)
        ratio = f"{sv / tv:.3f}" if tv and sv is not None else "-"
        lines.append(f"| {label} | {_fmt(tv, fmt)} | {_fmt(sv, fmt)} | {ratio} |")
    calibration = r.get("calibration") or {}
    if calibration:
        lines += ["", "| cosine calibration (mean cosine) | teacher | student | measured on |", "|---|---|---|---|"]
        lines += [
            f"| {kind} pairs | {v['teacher']:.3f} | {v['student']:.3f} | {v['measured_on']} |"
            for kind, v in calibration.items()
        ]
    return "\n".join(lines + ["", r["summary"], ""])


def plot_report(r: dict, path: Path) -> None:
    """One bar pair per measure (teacher, student), each panel on its own scale with its unit and the values on
    the bars; quality panels zoomed on the two values, so the gap shows; titled with the teacher's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, s = _sides(r)
    shown = [row for row in rows(r) if t.get(row[1]) is not None and s.get(row[1]) is not None]
    fig, axes = plt.subplots(1, len(shown), figsize=(2.9 * len(shown), 3.6), squeeze=False)
    for ax, (label, key, _fmt, unit) in zip(axes[0], shown):
        scale = 1e6 if unit in ("MB", "count") and max(t[key], s[key]) >= 1e6 else 1.0
        values = [t[key] / scale, s[key] / scale]
        bars = ax.bar(["teacher", "student"], values, color=["tab:gray", "tab:blue"])
        text = [f"{v:.1f}" if unit == "MB" else f"{v:.2f}" if unit in ("ms", "count") else f"{v:.3f}" for v in values]
        ax.bar_label(bars, labels=text, fontsize=8)
        ax.set_ylabel(
            {"MB": "MB", "ms": "milliseconds", "count": "millions" if scale > 1 else "count"}.get(unit, "score"),
            fontsize=8,
        )
        if not unit:  # a quality measure: the axis spans the two values, so a gap of 0.05 is seen
            low, high = min(values), max(values)
            pad = max(0.02, (high - low) * 0.6)
            ax.set_ylim(max(-1.0, low - pad), min(1.0, high + pad) + pad / 2)
        else:
            ax.set_ylim(0, max(values) * 1.18)
        ax.set_title("\n".join(_wrap(label, 30)), fontsize=8)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{t.get('name') or Path(t['folder']).name} -> ShareBERT {s['shape']}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [text]
