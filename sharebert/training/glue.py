"""Readers for the GLUE TSV files of the nine tasks, as written by the GLUE download script.

``--data-dir`` is always ONE task's folder (e.g. ``../shared/data/glue/SST-2``) holding
``train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and ``dev_mismatched.tsv``). Fields are
tab-separated without quoting; a UTF-8 byte-order mark and CRLF line ends are accepted. CoLA has no
header (source, label, original label, sentence); every other task is read by header names, so
extra columns (STS-B, MNLI) do not matter. Each row must have as many fields as the header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from sharebert_runtime.textlines import check_text_file, numbered_lines


@dataclass(frozen=True)
class GlueTask:
    """How one task's TSV files are laid out and scored.

    ``text_columns``/``label_column`` are header names, or 0-based indices when ``header`` is False.
    ``labels`` maps a raw label string to a label name; the model's class ids follow ``label_names``.
    ``space`` names the label space: tasks in the same space can be cross-evaluated.
    """

    name: str
    folder: str
    text_columns: tuple
    label_column: str | int
    label_names: tuple[str, ...] | None  # None: regression (STS-B)
    labels: dict = field(default_factory=dict)
    header: bool = True
    n_fields: int | None = None  # headerless files: the exact field count
    dev_splits: tuple[str, ...] = ("dev",)
    metrics: tuple[str, ...] = ("accuracy",)
    space: str = ""
    score_range: tuple[float, float] = (-math.inf, math.inf)  # regression: the scale's bounds (nan never fits)

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def pairs(self) -> bool:
        """Whether an example is a sentence pair (text, text_pair), as the model trained on it reads it."""
        return len(self.text_columns) == 2

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.label_names)

    @property
    def main_metric(self) -> str:
        """The metric that picks the best checkpoint (the first listed)."""
        return self.metrics[0]

    def file(self, split: str) -> str:
        return f"{split}.tsv"


def _names(*raw_to_name) -> dict:
    return dict(raw_to_name)


TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(
        "cola",
        "CoLA",
        (3,),
        1,
        ("unacceptable", "acceptable"),
        _names(("0", "unacceptable"), ("1", "acceptable")),
        header=False,
        n_fields=4,
        metrics=("matthews_correlation",),
        space="acceptability",
    ),
    "sst2": GlueTask(
        "sst2",
        "SST-2",
        ("sentence",),
        "label",
        ("negative", "positive"),
        _names(("0", "negative"), ("1", "positive")),
        space="sentiment",
    ),
    "mrpc": GlueTask(
        "mrpc",
        "MRPC",
        ("#1 String", "#2 String"),
        "Quality",
        ("not_paraphrase", "paraphrase"),
        _names(("0", "not_paraphrase"), ("1", "paraphrase")),
        metrics=("f1", "accuracy"),
        space="paraphrase",
    ),
    "stsb": GlueTask(
        "stsb",
        "STS-B",
        ("sentence1", "sentence2"),
        "score",
        None,
        metrics=("spearman", "pearson"),
        space="similarity",
        score_range=(0.0, 5.0),
    ),
    "qqp": GlueTask(
        "qqp",
        "QQP",
        ("question1", "question2"),
        "is_duplicate",
        ("not_paraphrase", "paraphrase"),
        _names(("0", "not_paraphrase"), ("1", "paraphrase")),
        metrics=("f1", "accuracy"),
        space="paraphrase",
    ),
    "mnli": GlueTask(
        "mnli",
        "MNLI",
        ("sentence1", "sentence2"),
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        _names(("contradiction", "contradiction"), ("entailment", "entailment"), ("neutral", "neutral")),
        dev_splits=("dev_matched", "dev_mismatched"),
        space="nli",
    ),
    "qnli": GlueTask(
        "qnli",
        "QNLI",
        ("question", "sentence"),
        "label",
        ("entailment", "not_entailment"),
        _names(("entailment", "entailment"), ("not_entailment", "not_entailment")),
        space="entailment",
    ),
    "rte": GlueTask(
        "rte",
        "RTE",
        ("sentence1", "sentence2"),
        "label",
        ("entailment", "not_entailment"),
        _names(("entailment", "entailment"), ("not_entailment", "not_entailment")),
        space="entailment",
    ),
    "wnli": GlueTask(
        "wnli",
        "WNLI",
        ("sentence1", "sentence2"),
        "label",
        ("entailment", "not_entailment"),
        _names(("1", "entailment"), ("0", "not_entailment")),
        space="entailment",
    ),
}

# MNLI's three classes collapse onto the two-way entailment space (Kowsher Table 6: MNLI -> QNLI).
COLLAPSE = {"contradiction": "not_entailment", "neutral": "not_entailment"}


def get_task(name: str) -> GlueTask:
    key = name.lower().replace("-", "")
    if key not in TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[key]


def recorded_task(folder: str | Path) -> tuple[GlueTask | None, str]:
    """The GLUE task a model folder records in its ``metrics.json`` (written by ``sharebert finetune`` and
    ``distill``) or None, and what the file said when it names none. Read as untrusted input: a FIFO or device
    under that name is an error, never waited on."""
    from sharebert_runtime.errors import first_line
    from sharebert_runtime.untrusted import optional_file, read_json

    path = Path(folder) / "metrics.json"
    try:
        if optional_file(path, "the run's metrics") is None:
            return None, "no metrics.json from `sharebert finetune`"
        m = read_json(path, "the run's metrics", allow_nan=True)
    except (OSError, ValueError) as e:
        return None, f"its metrics.json cannot be read: {first_line(e)}"
    name = m.get("task") if isinstance(m, dict) else None
    if isinstance(name, str) and name in TASKS:
        return TASKS[name], ""
    return None, f"its metrics.json records no GLUE task (task: {name!r})"


@dataclass
class GlueSplit:
    """One split: ``text_a[i]`` (and ``text_b[i]`` for pair tasks) with ``labels[i]`` (class id or score)."""

    task: GlueTask
    path: Path
    text_a: list[str]
    text_b: list[str] | None
    labels: list

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> GlueSplit:
        """The first ``n`` examples (all when ``n`` is None)."""
        if n is None or n >= len(self):
            return self
        return GlueSplit(
            self.task, self.path, self.text_a[:n], self.text_b[:n] if self.text_b else None, self.labels[:n]
        )


def task_file(task: GlueTask, data_dir: str | Path, split: str) -> Path:
    """``data_dir/<split>.tsv`` or a FileNotFoundError that says what the folder holds."""
    data_dir = Path(data_dir)
    path = data_dir / task.file(split)
    if path.is_file():
        return path
    if data_dir.is_file():
        raise FileNotFoundError(
            f"{task.name}: --data-dir {data_dir} is a file; give the task's folder"
            f"{f' ({data_dir.parent})' if (data_dir.parent / task.file(split)).is_file() else ''}, "
            f"which holds {task.file(split)}"
        )
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"{task.name}: data folder {data_dir} does not exist "
            f"(--data-dir is the task's folder, e.g. glue/{task.folder})"
        )
    hint = ""
    if (data_dir / task.folder / task.file(split)).is_file():
        hint = f"; did you mean --data-dir {data_dir / task.folder}?"
    present = sorted(p.name for p in data_dir.iterdir())
    raise FileNotFoundError(f"{task.name}: {path} not found (the folder holds {present or 'nothing'}){hint}")


def read_split(task: GlueTask | str, data_dir: str | Path, split: str = "train") -> GlueSplit:
    """Read ``split`` (train, dev, dev_matched, dev_mismatched) of ``task`` from its folder."""
    task = get_task(task) if isinstance(task, str) else task
    return read_tsv(task, task_file(task, data_dir, split))


def text_fields(first_row: list[str]) -> tuple[list[int], bool] | None:
    """Where the text sits in a GLUE-style TSV whose first row is ``first_row``: the 0-based fields named
    by any task's header (``sentence``, ``question1``, ...) and True (the row is a header), else the text
    fields of a headerless layout with that many fields (CoLA) and False (the row is data); None when
    neither fits."""
    names = {c for t in TASKS.values() if t.header for c in t.text_columns}
    named = [i for i, name in enumerate(first_row) if name.strip().lstrip("\ufeff") in names]
    if named:
        return named, True
    for t in TASKS.values():
        if not t.header and t.n_fields == len(first_row):
            return list(t.text_columns), False
    return None


def _layout(task: GlueTask) -> str:
    cols = [str(c) for c in (*task.text_columns, task.label_column)]
    if task.header:
        return f"a header naming the columns {cols} (tab-separated)"
    return (
        f"{task.n_fields} tab-separated fields without a header, text in field {task.text_columns[0]}, "
        f"label in field {task.label_column}"
    )


def read_tsv(task: GlueTask, path: str | Path) -> GlueSplit:
    """Parse one GLUE TSV file; raises ValueError naming the file, line and expected layout."""
    path = check_text_file(path, "data file")
    try:
        with open(path, "rb") as f:  # line by line in bounded memory: a line over 1 MiB is refused
            lines = [
                raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n") for n, raw in numbered_lines(f, str(path))
            ]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    rows = [(i + 1, line.split("\t")) for i, line in enumerate(lines) if line.strip()]
    if not rows:
        raise ValueError(f"{path}: the file is empty; expected {_layout(task)}")
    if task.header:
        lineno, header = rows.pop(0)
        missing = [c for c in (*task.text_columns, task.label_column) if c not in header]
        if missing:
            raise ValueError(
                f"{path}, line {lineno}: header {header} lacks {missing}; a {task.name} file has {_layout(task)}"
            )
        width = len(header)
        text_idx = [header.index(c) for c in task.text_columns]
        label_idx = header.index(task.label_column)
    else:
        width, text_idx, label_idx = task.n_fields, list(task.text_columns), task.label_column
    if not rows:
        raise ValueError(f"{path}: no examples after the header")
    texts = [[] for _ in text_idx]
    labels = []
    for lineno, fields in rows:
        if len(fields) != width:
            raise ValueError(
                f"{path}, line {lineno}: {len(fields)} fields, expected {width}; a {task.name} file has {_layout(task)}"
            )
        for out, i in zip(texts, text_idx):
            out.append(fields[i])
        labels.append(_label(task, fields[label_idx], path, lineno))
    return GlueSplit(task, path, texts[0], texts[1] if len(texts) > 1 else None, labels)


def _label(task: GlueTask, raw: str, path: Path, lineno: int):
    raw = raw.strip()
    if task.is_regression:
        try:
            score = float(raw)
        except ValueError:
            raise ValueError(
                f"{path}, line {lineno}: score {raw!r} is not a number ({task.name} is a regression task)"
            ) from None
        low, high = task.score_range
        if not low <= score <= high:  # also refuses nan and inf
            raise ValueError(
                f"{path}, line {lineno}: score {raw!r} is outside [{low:g}, {high:g}], the {task.name} scale"
            )
        return score
    name = task.labels.get(raw)
    if name is None:
        raise ValueError(
            f"{path}, line {lineno}: label {raw!r} is not one of {sorted(task.labels)} for {task.name}"
            f"; a {task.name} file has {_layout(task)}"
        )
    return task.label_names.index(name)
