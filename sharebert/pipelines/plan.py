"""A compress run planned before any model loads: every torch-free check (:func:`precheck`), the student's shape
under the limits and its vocabulary (:func:`student_vocabulary`), and ``--max-time``'s plan (:class:`TimeBudget`,
refused in one line by :class:`BudgetTooSmall` when it leaves the student untrained)."""

from __future__ import annotations

from .out_folder import check_out
from .quality import USEFUL_BATCH, read_eval_pairs
from .run import CompressOptions, CompressRun, Teacher


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
    # The quality measures' share of what the plan has after the end's other costs, when they cannot all be paid: the
    # rest trains. Each sized list (held-out sentences, --eval-pairs', STS-B dev's pairs) keeps at least MEASURE_FLOOR
    # rows: a Spearman on 100 pairs still tells 0.8 from 0.5 (its standard error ~0.05-0.1), on 20 it does not.
    MEASURE_SHARE, MEASURE_FLOOR = 0.5, 100
    # The share of T the end may run past it before the probes and measures are cut (the goal is T + 10%): a run whose
    # exports ran a few seconds over their estimate keeps every figure of the report.
    END_SLACK = 0.05

    AFTER = "export, speed and quality"  # what follows training, as the plan's line says it

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
        self.teacher_export = 0.0  # seconds the teacher's export is estimated to take, while it is still to come
        self.trained_before = 0.0  # a resumed run: the training seconds its checkpoint already used (:meth:`carry`)
        self.record = None  # where :meth:`training_seconds` records the seconds spent before training (out/work)
        # The measures' cost at each size (quality.MeasureCount: called with rows or None, its ``most``); None: they
        # are after_sentences, never sized. measure_rows: the plan's sizing (None: all of them)
        self.measures, self.measure_rows = None, None

    def left(self) -> float:
        import time

        return self.seconds - (time.monotonic() - self.start)

    def reserve(self) -> float:
        """Seconds the steps after training take: ``exports`` exports (each its parity pass of 128 sentences through
        PyTorch; ``compress`` makes the teacher's before training, so one), two probes, the quality sentences through
        the teacher (but those cached) and the student (:data:`STUDENT_SHARE` of its cost), as sized
        (:attr:`measure_rows`)."""
        return self._fixed() + self.measure_seconds(self.measure_rows)

    def _rate(self) -> float:
        """The teacher's sentences a second the end is counted at: the plan's, or 50 before any was measured (or when
        the one measured is not a positive finite number)."""
        return self.rate if _seconds(self.rate) > 0 else 50.0

    def _fixed(self) -> float:
        """The end's costs but the quality measures: the exports still to come with their parity passes, two probes."""
        return (
            self.teacher_export + self.exports * (self.EXPORT_SECONDS + 2 * 128 / self._rate()) + 2 * self.PROBE_SECONDS
        )

    def measure_seconds(self, rows: int | None = None) -> float:
        """Seconds of the quality measures at ``rows`` rows of each sized list (None: all), at the plan's rate."""
        full = rows is None or self.measures is None
        sentences, cached = (self.after_sentences, self.cached_sentences) if full else self.measures(rows)
        return max((1 + self.STUDENT_SHARE) * sentences - cached, 0.0) / self._rate()

    def size_measures(self, room: float) -> int | None:
        """The rows of each sized list whose measures take at most ``room`` seconds: None (all) when all of them fit
        or nothing can be sized, else the most that fit (a bisection: the cost grows with the rows), at least
        :data:`MEASURE_FLOOR` even when that does not fit (:meth:`measures_overrun` says so)."""
        if self.measures is None or self.measure_seconds() <= room or self.measures.most <= self.MEASURE_FLOOR:
            return None
        low, high = self.MEASURE_FLOOR, self.measures.most  # low is the answer when even it does not fit
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.measure_seconds(middle) <= room else (low, middle)
        return low

    def _measure_words(self, rows: int) -> str:
        return (
            f"the quality measures cut to {rows:,} evenly spaced rows of each list (held-out sentences, --eval-pairs, "
            f"STS-B dev pairs; up to {self.measures.most:,}), ~{self.measure_seconds(rows):.0f} s where all of them "
            f"take ~{self.measure_seconds():.0f} s: the budget"
        )

    def _fewest(self) -> str:
        return ", the quality measures at their fewest" if self.measure_rows == self.MEASURE_FLOOR else ""

    def measures_overrun(self, room: float) -> str:
        """What the plan says when even :data:`MEASURE_FLOOR` rows take longer than ``room``; empty otherwise."""
        if self.measure_rows is None or self.measure_rows > self.MEASURE_FLOOR:
            return ""
        over = self.measure_seconds(self.measure_rows) - max(room, 0.0)
        if over <= 0:
            return ""
        return (
            f"; even the fewest that still mean something ({self.MEASURE_FLOOR} rows) take ~{over:.0f} s more than "
            "the budget has for them: the run will overrun --max-time by that much"
        )

    def cut_probes(self) -> bool:
        """Whether what is left, after the exports, is short of the two probes and every measure: then the probes
        time fewer runs (``report.PROBE_FEWEST``) and the measures are sized (:meth:`measure_rows_now`)."""
        return self.left() + self.END_SLACK * self.seconds < 2 * self.PROBE_SECONDS + self.measure_seconds()

    def measure_rows_now(self) -> int | None:
        """The measures sized to what is left now and :data:`END_SLACK` of T, as the last work (after the exports
        and probes): :attr:`measure_rows` set and said in one line when cut. None: all of them."""
        left = self.left()
        room = left + self.END_SLACK * self.seconds
        self.measure_rows = self.size_measures(room)
        if self.measure_rows is not None:
            cut, over = self._measure_words(self.measure_rows), self.measures_overrun(room)
            self.say(f"{left:.0f} s of --max-time are left: {cut}{over}")
        return self.measure_rows

    def plan(self, available: int, rate: float, step: float, batch: int) -> int:
        """How many of ``available`` sentences the teacher encodes (at ``rate`` a second), said with the plan."""
        self.rate = rate
        n, train = self._sized(available, rate, step, batch)
        reserve, spend = self.reserve(), self.left() - self.reserve()
        rate = self._rate()
        sized = f"; {self._measure_words(self.measure_rows)}" if self.measure_rows is not None else ""
        self.say(
            f"plan for --max-time {self.seconds:.0f} s ({self.left():.0f} s left): the teacher's vectors for "
            f"{n:,} of {available:,} sentences (~{n / rate:.0f} s at {rate:.0f} sentences/s), then about "
            f"{train / step:,.0f} steps of {batch} in ~{train:.0f} s of training (~{step:.2f} s a step), then "
            f"{self.AFTER} (~{reserve:.0f} s){sized}"
        )
        if spend <= n / rate:
            self._warn_overrun(reserve)
        return n

    def _warn_overrun(self, reserve: float) -> None:
        self.say(
            f"--max-time {self.seconds:.0f} s is less than exporting and measuring take here (~{reserve:.0f} s "
            f"after a short training{self._fewest()}): the run will overrun it; give more time, or --max-steps"
        )

    def _sized(self, available: int, rate: float, step: float, batch: int) -> tuple[int, float]:
        """``(sentences the teacher encodes, seconds of training)`` at these rates: what the end's :meth:`reserve`
        leaves, at most a third to the teacher's pass; sets :attr:`planned_steps`, refuses fewer than
        :attr:`min_steps` (:class:`BudgetTooSmall`)."""
        self.rate = rate
        self.measure_rows = self.size_measures(self.MEASURE_SHARE * (self.left() - self._fixed()))
        spend, rate = self.left() - self.reserve(), self._rate()
        n = int(min(available, max(4 * batch, rate * max(spend, 0.0) / 3)))
        train = max(spend - n / rate, 1.0)
        self.planned_steps = int(train / step)
        if self.min_steps is not None and self.planned_steps < self.min_steps:
            raise BudgetTooSmall(self._too_small(available, rate, step, batch, train))
        return n, train

    def before_export(self, available: int, rate: float, step: float, batch: int, export: float) -> None:
        """The plan made before the teacher's export, when no earlier run left it in the cache: ``export`` its
        estimated seconds (:func:`measure_before_export`). A budget too small is refused here as :meth:`plan` refuses,
        before any export or pass, naming the smallest that would do; else said in one line. :meth:`plan` sizes the
        run again after the export, from the seconds it took."""
        self.teacher_export = export
        try:
            self._sized(available, rate, step, batch)
        finally:
            self.teacher_export = 0.0
        self.say(
            f"the teacher's artifact is not cached: its export is estimated at ~{export:.0f} s (the teacher at "
            f"~{rate:.0f} sentences/s, a student step {step:.2f} s, measured now), which leaves about "
            f"{self.planned_steps:,} steps of {batch} in --max-time {self.seconds:.0f} s"
        )

    def training_seconds(self) -> float:
        """The training clock, set when training starts: what is left less the end's :meth:`reserve`, plus the training
        seconds a resumed run's checkpoint already used (its clock, ``WallClockLimit``, goes on from those: the run
        stops at ``--max-time`` in all). The seconds spent before training are recorded in :attr:`record`, so that
        a ``--resume`` of this run carries them over (:meth:`carry`)."""
        seconds = self.trained_before + max(1.0, self.left() - self.reserve())
        if self.record is not None:
            from sharebert_runtime.outdir import write_json

            spent = self.seconds - self.left() - self.trained_before
            write_json(self.record, {"before_training": spent, "rate": self.rate, "planned_steps": self.planned_steps})
        return seconds

    def carry(self, record, checkpoint) -> None:
        """A ``--resume`` under this budget: the seconds the run it continues spent count (the time between the two
        runs does not): those before its training (``record``, :meth:`training_seconds`) and the training seconds
        its ``checkpoint`` keeps (``WallClockLimit``'s); its plan's teacher rate and steps kept for the end's reserve
        and the verdict. Said in one line."""
        from pathlib import Path

        from sharebert_runtime.outdir import read_json

        from ..training.callbacks import WallClockLimit, trainer_state

        try:
            saved = read_json(Path(record))
        except (OSError, ValueError):
            saved = None
        saved = saved if isinstance(saved, dict) else {}
        clock = (trainer_state(checkpoint).get("stateful_callbacks") or {}).get(WallClockLimit.__name__)
        used = ((clock or {}).get("attributes") or {}).get("used_seconds") if isinstance(clock, dict) else None
        trained, before = _seconds(used), _seconds(saved.get("before_training"))
        self.start -= before + trained
        self.trained_before = trained
        rate, steps = saved.get("rate"), saved.get("planned_steps")
        self.rate = rate if _seconds(rate) > 0 else None
        self.planned_steps = steps if isinstance(steps, int) and steps > 0 else None
        known = "" if saved else " (it left no record of its time before training: only its training counted)"
        self.say(
            f"--resume: {before + trained:.0f} s of --max-time {self.seconds:.0f} s were spent by the run it "
            f"continues ({before:.0f} s before its training, {trained:.0f} s of training){known}; "
            f"{self.left():.0f} s are left"
        )

    def smallest(self, available: int, rate: float, step: float, batch: int) -> int:
        """The least ``--max-time`` (whole 10 s) whose plan gives :attr:`min_steps` steps, from what was measured:
        the seconds spent so far, the end's :meth:`reserve`, and the teacher's pass that such a plan makes
        (a third of what the end leaves, at least ``4 * batch`` sentences, at most ``available``)."""
        import math

        rows, self.measure_rows = self.measure_rows, None  # the smallest budget that measures everything
        reserve, self.measure_rows = self.reserve(), rows
        spend = self.min_steps * step
        for _ in range(60):  # spend = training + the pass it sizes; the pass grows a third as fast: converges
            spend = self.min_steps * step + min(available, max(4 * batch, rate * spend / 3)) / rate
        return 10 * math.ceil((self.seconds - self.left() + reserve + spend) / 10)

    def _too_small(self, available: int, rate: float, step: float, batch: int, train: float) -> str:
        return (
            f"--max-time {self.seconds:.0f} s leaves ~{train:.0f} s of training here, {self.planned_steps:,} steps of "
            f"{batch} at the {step:.2f} s a step measured, fewer than the {self.min_steps:,} a trained student "
            f"needs: give --max-time {self.smallest(available, rate, step, batch)} or more (measured here: "
            f"{self.seconds - self.left():.0f} s spent so far, ~{self.reserve():.0f} s of export and measures to "
            f"come{self._estimated()}, the teacher at {rate:.0f} sentences/s), or --max-steps N, or "
            "--allow-untrained to run anyway"
        )

    def _estimated(self) -> str:
        if not self.teacher_export:
            return ""
        return f" (the teacher's export ~{self.teacher_export:.0f} s of it, estimated: not cached)"


def _seconds(value) -> float:
    """A recorded count of seconds, or 0 for one that is missing, negative or not a finite number."""
    import math

    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def process_start() -> float:
    """``time.monotonic()``'s reading when this process started, so that ``--max-time`` counts the interpreter's start
    and the imports before the command runs (80-95 s of a 300 s budget at load 14 on the 2-core machine, which the
    budget missed when it counted from the command): Linux's /proc (the start in clock ticks since boot, against the
    uptime); elsewhere, or when the two disagree, now."""
    import os
    import time

    now = time.monotonic()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # starttime, field 22 (the name may hold spaces)
        with open("/proc/uptime", encoding="ascii") as f:
            age = float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now


class BudgetTooSmall(ValueError):
    """A ``--max-time`` whose plan leaves fewer steps than :attr:`TimeBudget.min_steps`: refused before the teacher's
    pass and training, naming the smallest budget that would do (:meth:`TimeBudget.smallest`)."""


# The fewest steps of USEFUL_BATCH a --max-time run must plan unless --allow-untrained (or --max-steps): 400 steps gave
# that student 0.80-0.97 of the search answers, 30 steps 0.49 (docs/RESULTS.md): below it the student is untrained.
TRAINED_STEPS = 400


def trained_steps(batch: int) -> int:
    """:data:`TRAINED_STEPS` of :data:`USEFUL_BATCH` sentences, in steps of ``batch``."""
    import math

    return math.ceil(TRAINED_STEPS * USEFUL_BATCH / batch)


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


def precheck(options: CompressOptions) -> CompressRun:
    """Every check that needs no model, torch-free and in well under 2 s, before anything is loaded or changed:
    the teacher's config (read here, once for the whole run: :class:`run.Teacher`), a student under the limits,
    ``--out``, the ``--train`` and ``--eval-pairs`` files. Returns the run (``say``, ``stopper``, ``budget`` unset)."""
    from ..accounting.budget import student_for
    from ..formats.model_folder import MODEL_TYPES, shape_fields

    teacher, o = Teacher.read(options.teacher), options
    raw = teacher.raw
    if raw.get("model_type") in MODEL_TYPES:  # torch-free; another architecture: training.teacher (its budget later,
        labels = raw.get("id2label") if isinstance(raw.get("id2label"), dict) else {}  # a large vocabulary cut first)
        classifier = teacher.is_classifier
        shape = {**shape_fields(teacher.folder, raw), **({} if classifier else {"max_length": teacher.max_length})}
        num_labels = max(1, len(labels)) if classifier else None
        try:
            student_for(shape, o.limits, num_labels=num_labels)
        except ValueError:
            if not _cut_may_fit(shape, o.limits, num_labels):
                raise
    else:
        teacher.check_encoder()
    out = check_out(o.out, o.teacher, o.train, o.overwrite, o.resume, o.data)
    check_train(o.train)
    if o.eval_pairs is not None:
        read_eval_pairs(o.eval_pairs)
    return CompressRun(options, teacher, out)


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


def student_vocabulary(run: CompressRun, num_labels: int | None = None, more_text=None):
    """The teacher's vocabulary cut for the student (``training.vocab.plan_vocabulary``; ``--vocab-size``, else only
    when the teacher's does not fit the limits), or None to keep it whole. The cut keeps the tokens of the --train
    text (default corpus) and of ``more_text()`` (a classifier: its task's training text); ``num_labels``: a
    classifier's, whose head the budget counts."""
    from ..training.distill_embedding import IN_MEMORY
    from ..training.distill_sentences import default_corpus, read_sentences
    from ..training.vocab import plan_vocabulary

    o, teacher = run.options, run.teacher
    if o.data is not None:
        if o.vocab_size is not None:
            raise ValueError(
                "--vocab-size cuts the vocabulary to the tokens of --train text; a --data folder holds the "
                "teacher's token ids: give --train"
            )
        return None

    def text():
        sentences = read_sentences(o.train or default_corpus(), o.args.max_train_samples or IN_MEMORY)
        return [*sentences, *(more_text() if more_text is not None else ())]

    shape = teacher.shape if num_labels is not None else embedding_shape(teacher)  # an encoder: its positions too
    return plan_vocabulary(teacher.tokenizer, shape, o.limits, budget_fit(num_labels), text, o.vocab_size, run.say)


def embedding_shape(teacher: Teacher) -> dict:
    """What ``budget.student_for`` reads of an encoder teacher (:attr:`run.Teacher.shape`) and its maximum length
    (:attr:`run.Teacher.max_length`): the student gets as many positions, so it reads what its teacher reads."""
    return {**teacher.shape, "max_length": teacher.max_length}


def planned_steps(budget, args) -> int | None:
    """The steps the run set out to take: ``--max-steps``, the budget's plan (the lesser of the two), or None (a
    resumed run under a budget, whose plan was made by the run it continues)."""
    known = [n for n in (args.max_steps, budget.planned_steps if budget is not None else None) if n is not None]
    return min(known) if known else None


def available_sentences(train, args) -> int:
    """The sentences the training text offers (as the distillation reads them, at most ``--max-train-samples``)."""
    from ..training.distill_embedding import IN_MEMORY
    from ..training.distill_sentences import default_corpus, read_sentences

    return len(read_sentences(train or default_corpus(), args.max_train_samples or IN_MEMORY))


BUDGET_RECORD = "budget.json"  # in out/work: the seconds a run spent before its training (TimeBudget.training_seconds)
# A first run's teacher export (its artifact not cached), in sentences through the teacher at the rate measured before
# it: each rung's parity passes (TEACHER_CHECK sentences through PyTorch and ONNX Runtime), RAM int8's parity (256
# through ONNX Runtime), the stored reference inputs and latency runs. all-MiniLM-L6-v2's int8-dynamic rung took 111 s
# where its teacher ran 2.45 sentences/s (2 threads, load 13): EXPORT_SECONDS and ~210 sentences' worth.
EXPORT_SENTENCES = 250
TEACHER_RUNGS = 2  # a first export is planned for two rungs: int8-dynamic is refused for MiniLM and MPNet, int8 kept
TIMED_SENTENCES = 16  # the teacher's sentences timed before its export, after 4 untimed (~7 s at the worst)


def measure_before_export(run, student, rows: int, exported: bool):
    """Before the teacher's export or pass: torch's thread count fitted to the machine on the student's step
    (``training.threads``; kept where OMP_NUM_THREADS names one) and, under a ``budget`` that refuses too few steps
    whose teacher is not exported yet (``exported``: cached by an earlier run, or a resumed run's own), the plan made
    from estimates (:meth:`TimeBudget.before_export`), refused there when too small: the teacher's sentences a
    second from a timed PyTorch pass over :data:`TIMED_SENTENCES` of the training text, a student step at the chosen
    count (``rows``: its vocabulary's), and the export: :data:`TEACHER_RUNGS` rungs of ``EXPORT_SECONDS`` and
    :data:`EXPORT_SENTENCES` at that rate, plus the plan's own measure of the teacher (``RATE_SAMPLE`` sentences).
    ``run``: the :class:`run.CompressRun` (its teacher read once, its --train, its budget: none for prepared
    ``--data``, whose steps the plan does not count); ``student``: its :class:`run.Student`. Returns the training's
    threads callback (``training.threads.FitThreads``; None: nothing fitted)."""
    import time

    import torch

    from ..training.distill_embedding import IN_MEMORY
    from ..training.distill_embedding_budget import RATE_SAMPLE
    from ..training.distill_embedding_model import load_encoder
    from ..training.distill_embedding_setup import build_student
    from ..training.distill_sentences import default_corpus, read_sentences
    from ..training.sentence_vectors import encode
    from ..training.threads import fit_threads, step_seconds, training_batch, user_threads

    teacher, args, say = run.teacher, student.args, run.say
    budget = run.budget if run.options.data is None else None
    estimate = budget is not None and budget.min_steps is not None and not exported  # else no refusal can come
    if not estimate and user_threads() is not None:
        return None
    sentences = read_sentences(run.options.train or default_corpus(), args.max_train_samples or IN_MEMORY)
    model = build_student("sharebert-tiny", student.overrides, rows)
    t_tok = teacher.tokenizer
    batch = training_batch(t_tok, sentences, args.batch_size, args.seq_len, rows)
    fit = fit_threads(model, batch, say)
    if not estimate:
        return fit
    step = fit.reference if fit is not None else step_seconds(model, batch, torch.get_num_threads())
    del model
    encoder = load_encoder(teacher.folder, teacher.config)
    sample = sentences[:: max(1, len(sentences) // TIMED_SENTENCES)][:TIMED_SENTENCES]
    encode(encoder, t_tok, sample[:4], "mean", None, args.seq_len)  # the first pass's one-time costs are no rate
    start = time.monotonic()
    encode(encoder, t_tok, sample, "mean", None, args.seq_len)
    rate = len(sample) / max(time.monotonic() - start, 1e-6)
    export = TEACHER_RUNGS * (budget.EXPORT_SECONDS + EXPORT_SENTENCES / rate) + RATE_SAMPLE / rate
    budget.before_export(int(len(sentences) * (1 + args.words)), rate, step, args.batch_size, export)
    return fit
