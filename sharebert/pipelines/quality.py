"""How good an embedding student is, beside its teacher: ``--eval-pairs`` (:func:`read_eval_pairs`, torch-free),
agreement on held-out sentences and search queries, STS-B, the cosine calibration (:func:`embedding_quality`), and
the report's verdict (:func:`search_verdict`: usable for search or not, and the budget that would be)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .run import Teacher
from .teacher_pass import cached_teacher_vectors, teacher_vectors_key, vectors_path

# The verdict (:func:`search_verdict`). A student is usable for search when it gives the teacher's top-1 answer on
# at least 9 of 10 of the package's search queries (32 of 35): a user who swaps teacher for student then sees the
# same first result for nine searches in ten. The 5-minute demo's students reach 30-34 of 35 and a 30-step student
# 17 (docs/RESULTS.md): the line parts a trained student from an untrained one.
USABLE_SEARCH = 0.9


# Steps of a batch after which all-MiniLM-L6-v2's 4M student passed USABLE_SEARCH: 2,185 steps of 32 gave 34 of 35,
# 1,164 gave 30 (docs/RESULTS.md). Measured for that teacher only: the suggested budget says so.
USEFUL_STEPS, USEFUL_BATCH = 2_200, 32


UNTRAINED_SHARE = 0.5  # a run that took fewer than this share of its planned steps has an untrained student


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


@dataclass(frozen=True)
class Spread:
    """The measures sized to ``--max-time`` (:meth:`plan.TimeBudget.measure_rows`): at most ``rows`` of each sized
    list (the held-out sentences, ``--eval-pairs``' and STS-B dev's pairs), evenly spaced over it. Evenly spaced, not
    the first ``rows``: STS-B dev is ordered by genre (625 captions, then 375 forum and 500 news pairs), so its first
    200 pairs would all be captions, the easiest to score; spread, they keep the three genres' shares."""

    rows: int


def taken(total: int, limit) -> list[int]:
    """The indices a measure keeps of a list of ``total``: all (``limit`` None), the first ``limit`` (an int: tests
    and the docs check), or ``limit.rows`` evenly spaced (:class:`Spread`: the budget's sizing)."""
    if isinstance(limit, Spread):
        rows = max(1, limit.rows)
        return list(range(total)) if rows >= total else [i * total // rows for i in range(rows)]
    return list(range(total if limit is None else min(total, limit)))


def which(kept: int, total: int, limit, noun: str = "pairs") -> str:
    """A list as a label says it: ``all 1500 pairs``, ``the first 200 of 1500 pairs``, ``200 of 1500 pairs, evenly
    spaced: sized to --max-time``."""
    if kept >= total:
        return f"all {total} {noun}"
    if isinstance(limit, Spread):
        return f"{kept} of {total} {noun}, evenly spaced: sized to --max-time"
    return f"the first {kept} of {total} {noun}"


def _held(limit) -> list[str]:
    from ..formats.paths import packaged_heldout

    held = [line.strip() for line in packaged_heldout().read_text(encoding="utf-8").splitlines() if line.strip()]
    if isinstance(limit, int):
        limit = max(limit, 3) if limit else None
    return [held[i] for i in taken(len(held), limit)]


def _pair_sets(eval_pairs, limit) -> list[tuple[str, str, list, list, list, str]]:
    """``(key, what, a, b, gold, which)`` of ``--eval-pairs`` (all its pairs but under a :class:`Spread`) and STS-B
    dev (where the data folder holds it), each cut by ``limit`` (:func:`taken`)."""
    from ..training.distill_sentences import sts_available, sts_dev

    sets = []
    if eval_pairs is not None:
        a, b, gold = read_eval_pairs(eval_pairs)
        sets.append(
            ("eval_pairs_spearman", Path(eval_pairs).name, a, b, gold, limit if isinstance(limit, Spread) else None)
        )
    if sts_available():
        split = sts_dev()
        sets.append(("sts_spearman", "STS-B dev", split.text_a, split.text_b, split.labels, limit))
    out = []
    for key, name, a, b, gold, cut in sets:
        keep = taken(len(gold), cut)
        a, b, kept = [a[i] for i in keep], [b[i] for i in keep], [gold[i] for i in keep]
        out.append((key, name, a, b, kept, which(len(keep), len(gold), cut)))
    return out


def quality_texts(eval_pairs=None, limit=None) -> list[list[str]]:
    """The lists of texts :func:`embedding_quality` encodes, each through teacher and student, in its order: the
    held-out sentences, the search queries and corpus, ``--eval-pairs``' two sides, STS-B dev's two sides
    (``limit``: :func:`taken`'s)."""
    from ..formats.paths import packaged_search

    texts = [_held(limit), *packaged_search()[1::-1]]
    for _, _, a, b, _, _ in _pair_sets(eval_pairs, limit):
        texts += [a, b]
    return texts


def quality_sentences(eval_pairs=None, limit=None) -> int:
    """Sentences :func:`embedding_quality` encodes (each through teacher and student), for :class:`TimeBudget`."""
    return sum(map(len, quality_texts(eval_pairs, limit)))


def cached_quality_sentences(teacher: Teacher, eval_pairs=None, limit=None) -> int:
    """How many of :func:`quality_sentences` have the teacher's vectors in the cache already (for the plan)."""
    key = teacher_vectors_key(teacher)
    return sum(len(texts) for texts in quality_texts(eval_pairs, limit) if vectors_path(key, texts).is_file())


class MeasureCount:
    """What the measures cost at each size, for ``plan.TimeBudget.measures``: called with ``rows`` (None: all), the
    sentences they encode and those whose teacher vectors are cached already (as :func:`quality_sentences` and
    :func:`cached_quality_sentences` of ``Spread(rows)`` count them, from the texts read once: the plan's bisection
    asks a dozen sizes); ``most``: the longest sized list (no sizing above it)."""

    def __init__(self, teacher: Teacher, eval_pairs=None):
        texts = quality_texts(eval_pairs)
        self.key, self.lists = teacher_vectors_key(teacher), texts
        self.sized = [True, False, False, *([True] * (len(texts) - 3))]  # all but the search queries and corpus
        self.most = max(len(t) for t, sized in zip(texts, self.sized) if sized)

    def __call__(self, rows: int | None) -> tuple[int, int]:
        limit = None if rows is None else Spread(rows)
        kept = [[t[i] for i in taken(len(t), limit)] if sized else t for t, sized in zip(self.lists, self.sized)]
        return sum(map(len, kept)), sum(len(t) for t in kept if vectors_path(self.key, t).is_file())


def embedding_quality(  # 6 parameters: the run's teacher and its pass, the student, the data, how it speaks
    teacher: Teacher, student_embed, eval_pairs=None, say=print, limit=None, vectors=None
) -> dict:
    """The embedding measures of the report, each named by what it was measured on (``{key: {"label", "teacher",
    "student"}}``, and ``teacher_pass``: the path the teacher's vectors were computed on); the student is
    ``student_embed`` (texts -> vectors: its int8 artifact's ``Runtime.embed``), the teacher ``vectors``: the run's
    ``teacher_vectors.TeacherPass`` (its artifact through the torch-free runtime where the artifact keeps it, as the
    training's pass; None: one made here without an artifact, the teacher in PyTorch fp32), its vectors kept in the
    cache by the teacher's fingerprint (:func:`teacher_pass.cached_teacher_vectors`):

    - ``agreement_cosine`` / ``agreement_top1``: the student's mean cosine to the teacher's vector of the same
      sentence, and its top-1 neighbour agreement, on the held-out sentences shipped in the package
      (``paths.packaged_heldout``; never trained on by default);
    - ``eval_pairs_spearman``: Spearman of cosine with the gold of ``--eval-pairs`` (all its pairs);
    - ``sts_spearman``: STS-B dev Spearman on all 1,500 pairs, where the data folder holds STS-B;

    ``limit`` a :class:`Spread` (``--max-time``'s sizing, :meth:`plan.TimeBudget.measure_rows`): each of the held-out
    sentences, ``--eval-pairs`` and STS-B cut to ``rows`` evenly spaced, the search queries kept whole; each label
    says it ("STS-B dev Spearman (200 of 1500 pairs, evenly spaced: sized to --max-time)").
    - ``calibration``: mean cosine of related pairs (the gold's top quarter, of ``--eval-pairs`` or STS-B) and of
      unrelated ones (held-out sentences paired with others), for both: a threshold tuned on the teacher moves.

    ``limit`` an int (tests and the docs check only): the first ``limit`` STS-B pairs and held-out sentences, said in
    the labels."""
    import numpy as np

    from ..training.metrics import cosine_spearman
    from ..training.teacher_vectors import TeacherPass

    vectors = vectors if vectors is not None else TeacherPass.of(teacher, teacher.max_length)
    cache_key = teacher_vectors_key(teacher)  # not "key": the loop below names each measure so
    t_vec = lambda texts: cached_teacher_vectors(cache_key, texts, lambda: distinct_vectors(vectors, texts))  # noqa: E731
    s_vec = lambda texts: np.stack(student_embed(list(texts)))  # noqa: E731
    held, every = _held(limit), len(_held(None))
    say(f"measuring the student's agreement with the teacher on {len(held)} held-out sentences ...")
    t_held, s_held = t_vec(held), s_vec(held)
    where = f"{len(held)} held-out WikiText-2 sentences"
    if isinstance(limit, Spread) and len(held) < every:
        where = which(len(held), every, limit, "held-out WikiText-2 sentences")
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
    for key, name, a, b, gold, kept in _pair_sets(eval_pairs, limit):
        kept = f"{len(gold)} pairs" if kept.startswith("all ") and key == "eval_pairs_spearman" else kept  # as before
        label = (
            f"STS-B dev Spearman ({kept})"
            if key == "sts_spearman"
            else f"Spearman of cosine with the gold of {name} ({kept})"
        )
        pair_sets.append((key, label, a, b, gold))
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
    return {"measures": rows, "calibration": calibration, "teacher_pass": vectors.path}


def distinct_vectors(vectors, texts):
    """``vectors(texts)`` with each distinct text encoded once (STS-B dev repeats some of its sentences)."""
    import numpy as np

    distinct = list(dict.fromkeys(texts))
    rows = vectors(distinct)
    where = {text: i for i, text in enumerate(distinct)}
    return np.asarray(rows)[[where[text] for text in texts]]


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
    none_planned = planned == 0  # --allow-untrained with no time for a step: what it took was the floor's
    untrained = not usable and planned is not None and (none_planned or steps < UNTRAINED_SHARE * planned)
    first = (
        f"Verdict: {'usable' if usable else 'NOT usable'} for search: the student gives the teacher's top-1 answer on "
        f"{round((search or 0) * queries)} of {queries} search queries (usable from {USABLE_SEARCH:.2f}, the "
        f"teacher's first result for 9 searches in 10); mean cosine to the teacher's vectors {cosine:.3f}."
    )
    of_planned = f" of the {planned:,} planned" if planned else ""
    rate = f" ({per_step:.2f} s a step, measured)" if per_step else ""
    seen = f"{used:,} of the {available:,} sentences of its training text ({used / max(available, 1):.0%})"
    second = (
        f"It trained {steps:,}{of_planned} steps of {batch} sentences{rate} on "
        + (seen if available else f"{used:,} training rows")
        + f": {steps * batch / max(tr['train_sentences'], 1):.1f} passes over them"
        + (" and their strings of vocabulary words." if tr.get("train_word_strings") else ".")
        + (
            " The budget left no time to train (--allow-untrained ran it anyway): it is untrained."
            if untrained and none_planned
            else " Far fewer steps than planned (they ran slower than the plan measured): it is untrained."
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
