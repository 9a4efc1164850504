"""``sharebert compress``: a pre-trained sentence-embedding encoder into a small ShareBERT, in one command.

A classifier teacher (``...ForSequenceClassification``) takes the two-phase path of ``compress_classifier``;
this module holds what both paths share: the probe, the exports, the report (table, JSON, picture).

Steps, each in its own subfolder of ``out`` so a stopped run resumes where it was:

1. pick the student under the limits (``budget.student_for``: learned parameters incl. its output projection);
2. distil it (``distill_embedding``) for ``max_time`` seconds / ``max_steps`` steps -> ``out/student``
   (a sentence-transformers folder);
3. export it int8 (``export.export_model``) -> ``out/artifact`` (pooling, projection and Normalize in the artifact);
   the teacher is exported int8-dynamic (``out/teacher_artifact``) for the speed and memory comparison;
4. measure teacher and student side by side -> ``report.json``, ``report.md``, ``report.png``: learned
   parameters, file bytes, peak RSS at load and p50 of one sentence at 16 and 128 tokens (1 thread, in a
   fresh torch-free process each), STS-B dev Spearman (teacher and student in PyTorch, the student's artifact).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..outdir import MARK, atomic_output, check_out_dir, check_same_run, finite, made_by, mark_out, read_json, save_figure, write_json

REPORT = "report.json"
PARTS = ("general", "student", "artifact", "teacher_artifact", "teacher_logits", "phases.json", REPORT, "report.md",
         "report.png", MARK)  # what a compress run writes in ``out`` (``--overwrite`` replaces these, nothing else)

# Runs in a fresh process (torch never imported): peak RSS after loading the artifact (VmHWM: ru_maxrss would
# count the parent's peak, kept across exec), then p50 latencies.
_PROBE = r"""
import json, sys, time
import numpy as np
from sharebert.deploy import Runtime
rt = Runtime(sys.argv[1], threads=1)
rss = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
run = rt.embed if rt.task == "feature-extraction" else rt.classify
out = {"peak_rss_bytes": rss}
for n in (16, 128):
    words = ("the quick brown fox jumps over the lazy dog " * 40).split()
    text = " ".join(words[: n - 2])
    for _ in range(3):
        run([text])
    times = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter(); run([text]); times.append(time.perf_counter() - t)
    out[f"p50_ms_{n}"] = float(np.median(times) * 1000)
print(json.dumps(out))
"""


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
        (path / part / "metrics.json").is_file() for part in ("student", "general"))


def is_classifier(config: dict) -> bool:
    """Whether a model folder's config dict names a sequence classifier (``...ForSequenceClassification``)."""
    return any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def probe(artifact: Path, runs: int = 30) -> dict:
    """Peak RSS at load and p50 of one sentence at 16 and 128 tokens (1 thread), in a fresh torch-free process."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(artifact), str(runs)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "SHAREBERT_REGISTER": "0"})  # a device's process: import sharebert registers nothing
    if proc.returncode:
        raise RuntimeError(f"measuring {artifact} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def artifact_spearman(artifact: Path, limit: int | None = None) -> float:
    """STS-B dev Spearman of an artifact's ``embed`` (the torch-free runtime)."""
    import numpy as np

    from ..deploy import Runtime
    from .distill_embedding import sts_dev
    from .metrics import cosine_spearman

    split = sts_dev(limit)
    rt = Runtime(artifact)
    return cosine_spearman(np.stack(rt.embed(split.text_a)), np.stack(rt.embed(split.text_b)), split.labels)


def weight_bytes(folder: Path, suffixes=(".onnx", ".data", ".ort", ".safetensors", ".bin")) -> int:
    """Bytes of a model folder's or artifact's weight and graph files (checkpoints included if present)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and f.suffix in suffixes)


def export_once(model_dir: Path, out: Path, quantize: str, progress: bool, task: str = "feature-extraction",
                allow_low_parity: bool = False) -> Path:
    """``model_dir`` exported to ``out``, unless ``out`` holds an artifact made after ``model_dir``'s weights
    were written: a run resumed after its export is not exported twice, one that trained on is."""
    from sharebert.export import export_model

    manifest = out / "manifest.json"
    weights = [f.stat().st_mtime for f in Path(model_dir).iterdir() if f.suffix in (".safetensors", ".bin")]
    if not manifest.is_file() or manifest.stat().st_mtime < max(weights, default=0.0):
        export_model(model_dir, out, task=task, quantize=quantize, overwrite=True, progress=progress,
                     check_limit=128, runs=5, allow_low_parity=allow_low_parity)
    return out


def check_out(out, teacher, train, overwrite: bool, resume: bool, data=None) -> Path:
    """``out`` checked, nothing changed: a new or empty folder, or a compress result (its marker) with
    ``overwrite``/``resume``; one written before the marker existed is refused (``outdir.check_out_dir``)."""
    return check_out_dir(out, "compress result", made_by(COMMAND), overwrite or resume, legacy=_legacy,
                         inputs=(teacher, *([data] if data is not None else []), *(train or [])))


def check_train(train) -> None:
    """``--train`` files refused in one line before any model loads (torch-free): missing, not a regular file (a
    FIFO, a device), empty, binary, or a ``.tsv`` whose first line is no GLUE header."""
    from ..textlines import resolve_sources
    from .glue import text_fields

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
        if src.suffix == ".tsv" and text_fields(head.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
                                                .split("\t")) is None:
            raise ValueError(f"--train {src}: a .tsv needs a GLUE header naming its text column (e.g. 'sentence', "
                             "'sentence1'); a plain text file: give it another suffix, e.g. .txt")


def precheck(teacher, out, limits: dict, train=None, data=None, overwrite: bool = False, resume: bool = False):
    """Every check that needs no model, torch-free and in well under 2 s, before anything is loaded or changed:
    the teacher's config, a student under ``limits``, the ``--train`` files, ``--out``. Returns ``(out, the
    teacher's config dict)``."""
    from ..budget import student_for
    from ..model_folder import read_config, shape_fields

    raw = read_config(teacher)
    labels = raw.get("id2label") if isinstance(raw.get("id2label"), dict) else {}
    student_for(shape_fields(teacher), limits, num_labels=max(1, len(labels)) if is_classifier(raw) else None)
    out = check_out(out, teacher, train, overwrite, resume, data)
    check_train(train)
    return out, raw


def fingerprint(teacher, student: dict, train, data, objective: str) -> dict:
    """What a ``--resume`` must find unchanged (``fingerprint.run_fingerprint``): the teacher's files, the
    student's shape, the training data (``--train`` files, the ``--data`` manifest, or the default corpus's files)
    and the objective."""
    from .distill_embedding import default_corpus
    from .fingerprint import data_files, run_fingerprint

    return run_fingerprint(teacher, json.dumps(student, sort_keys=True), data_files(train, data, default_corpus()),
                           objective)


def start_out(out: Path, fp: dict, overwrite: bool, resume: bool) -> Path | None:
    """After every check: with ``resume``, the run's fingerprint compared; with ``overwrite``, the earlier
    result's parts moved into ``out/.replaced`` (kept until :func:`finish_out`; :func:`restore_out` puts them
    back when the new run fails). Then ``out`` is marked a compress result. Returns the side folder, if any."""
    if resume:
        check_same_run(out, fp)
    aside = out / ASIDE
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


STUDENT_FIELDS = ("embedding_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "attention", "max_position_embeddings", "pooler")  # a budget candidate's shape, as --set overrides


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
                raise ValueError(f"{out} holds a student of another shape than these options pick ({', '.join(differ)}): "
                                 "resume with the first run's --max-params / --max-bytes, or start again with --overwrite")
            break


def compress(teacher, out, limits: dict, args, train=None, data=None, overwrite: bool = False, resume: bool = False,
             progress: bool = True, eval_limit: int | None = None, stopper=None, say=print,
             task: str | None = None) -> dict:
    """Run the steps of the module docstring for a sentence-embedding teacher (a classifier teacher:
    ``compress_classifier``; ``task`` is refused here); returns the report (also written to ``out/report.json``).

    ``args``: ``EmbeddingArgs``; ``stopper``: a ``SignalCheckpoint`` (on SIGTERM/SIGINT the distillation saves a
    checkpoint and the report says ``"stopped"``; run again with ``resume``)."""
    from ..budget import student_for
    from ..model_folder import shape_fields
    from .callbacks import latest_checkpoint, resume_from
    from .distill import check_encoder

    out, _ = precheck(teacher, out, limits, train, data, overwrite, resume)  # nothing loaded or changed before
    raw = check_encoder(teacher)
    if is_classifier(raw):  # the command sends a classifier to compress_classifier (which imports this module)
        raise ValueError(f"{teacher} is a classifier: compress it with compress_classifier.compress_classifier")
    if task is not None:
        raise ValueError(f"--task is for a classifier teacher; {teacher} is an encoder "
                         f"({', '.join(raw.get('architectures') or ['no architectures'])}): compress distils its "
                         "sentence embeddings")
    if data is not None:  # refused before anything is written
        from ..model_folder import load_config, load_tokenizer
        from .distill_embedding import check_data

        check_data(data, train, load_tokenizer(teacher, load_config(teacher).vocab_size), teacher)
    cand, head = student_for(shape_fields(teacher), limits)
    overrides = {k: cand.config[k] for k in STUDENT_FIELDS}
    fp = fingerprint(teacher, overrides, train, data, f"embedding ({args.loss} loss)")
    if resume:
        check_same_run(out, fp)
    check_same_student(out, overrides)
    student_dir = out / "student"
    if resume and latest_checkpoint(student_dir / "checkpoints") is None:  # said in terms of --out, before any work
        resume_from(student_dir / "checkpoints", True, say=say, out=out)
    say(f"student: {cand.describe()}, {cand.params + head:,} learned parameters (output projection {head:,})")
    aside = start_out(out, fp, overwrite, resume)
    try:
        report = _compress(teacher, out, student_dir, cand, overrides, limits, args, train, data, resume, progress,
                           eval_limit, stopper, say)
    except Exception as e:
        from .callbacks import StopRequested

        if not isinstance(e, StopRequested):  # a stop keeps the new run to --resume; a failure, the old result
            restore_out(out, aside)
        raise
    if not report.get("stopped"):
        finish_out(out)
    return report


def _compress(teacher, out: Path, student_dir: Path, cand, overrides: dict, limits: dict, args, train, data,
              resume: bool, progress: bool, eval_limit, stopper, say) -> dict:
    from .distill_embedding import distill_embedding

    m = distill_embedding(teacher, "sharebert-tiny", student_dir, train, args, overrides=overrides,
                          overwrite=True, resume=resume or (student_dir / "checkpoints").is_dir(),
                          progress=progress, eval_limit=eval_limit, data=data,
                          callbacks=(stopper,) if stopper is not None else ())
    if stopper is not None and stopper.received:
        return {"stopped": True, "steps": m["steps"]}
    say("exporting the student (int8) and the teacher (int8-dynamic) ...")
    art = export_once(student_dir, out / "artifact", "int8", progress)
    t_art = export_once(Path(teacher), out / "teacher_artifact", "int8-dynamic", progress)
    say("measuring memory, speed and STS-B dev Spearman ...")
    s_probe, t_probe = probe(art), probe(t_art)
    art_rho = artifact_spearman(art, eval_limit)
    s_manifest = json.loads((art / "manifest.json").read_text())
    report = {
        "teacher": {"folder": str(teacher), "learned_params": safetensor_params(Path(teacher)),
                    "file_bytes": weight_bytes(Path(teacher)), "artifact_bytes": weight_bytes(t_art),
                    "sts_spearman": m["teacher_sts_spearman"], **t_probe},
        "student": {"folder": str(student_dir), "shape": cand.describe(), "config": overrides,
                    "learned_params": safetensor_params(student_dir), "file_bytes": weight_bytes(art),
                    "sts_spearman_fp32": m["student_sts_spearman"], "sts_spearman_start": m["start_sts_spearman"],
                    "sts_spearman": art_rho, "quantization": s_manifest.get("quantization"), **s_probe},
        "training": {k: m[k] for k in ("steps", "train_seconds", "train_sentences", "loss", "init",
                                       "stopped_by_time", "seq_len")},
        "sts_dev_pairs": m["sts_dev_pairs"], "limits": {k: v for k, v in limits.items() if v is not None},
        "quality": {"label": "STS-B dev Spearman", "key": "sts_spearman"},
    }
    tr = report["training"]
    summary = (f"Student STS-B dev Spearman: {report['student']['sts_spearman_start']:.4f} at step 0 (initialised from "
               f"the teacher), {report['student']['sts_spearman_fp32']:.4f} in PyTorch fp32 after {tr['steps']} steps "
               f"({tr['train_seconds']:.0f} s, {tr['train_sentences']:,} sentences, {tr['loss']} loss), "
               f"{art_rho:.4f} from the int8 artifact ({report['sts_dev_pairs']} dev pairs).")
    return write_report(out, report, summary)


def write_report(out: Path, report: dict, summary: str) -> dict:
    """``report.json`` (``report`` with ``summary``), ``report.md`` (the table, then ``summary``), ``report.png``."""
    report = finite({**report, "summary": summary})
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
            n += sum(prod(st.get_slice(k).get_shape()) for k in st.keys()
                     if st.get_slice(k).get_dtype() in ("F32", "F16", "BF16"))  # not integer buffers (position ids)
    return n


ROWS = (("learned parameters", "learned_params", "{:,}"), ("file bytes (int8 artifact)", "file_bytes", None),
        ("peak RSS at load", "peak_rss_bytes", None), ("p50, 16 tokens, 1 thread", "p50_ms_16", "{:.2f} ms"),
        ("p50, 128 tokens, 1 thread", "p50_ms_128", "{:.2f} ms"))  # then the report's quality row


def rows(r: dict) -> tuple:
    """The report's rows ``(label, key, format)``: size, memory and speed, then its quality measure."""
    return ROWS + ((r["quality"]["label"], r["quality"]["key"], "{:.4f}"),)


def _fmt(value, fmt) -> str:
    return f"{value / 1e6:.1f} MB" if fmt is None else fmt.format(value)


def report_markdown(r: dict) -> str:
    """The report as a Markdown table, teacher beside student, with the ratio."""
    t, s = dict(r["teacher"]), dict(r["student"])
    t["file_bytes"] = t["artifact_bytes"]
    lines = [f"# Compression report", "", f"teacher `{t['folder']}` -> student {s['shape']} (`{s['folder']}`)", "",
             f"| | teacher (int8-dynamic artifact; {r['quality']['label']} in PyTorch fp32) | student (int8 artifact) "
             "| student / teacher |", "|---|---|---|---|"]
    for label, key, fmt in rows(r):
        ratio = f"{s[key] / t[key]:.3f}" if t[key] else "-"
        lines.append(f"| {label} | {_fmt(t[key], fmt)} | {_fmt(s[key], fmt)} | {ratio} |")
    return "\n".join(lines + ["", r["summary"], ""])


def plot_report(r: dict, path: Path) -> None:
    """One bar pair per measure (teacher, student), each panel on its own scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, s = dict(r["teacher"]), dict(r["student"])
    t["file_bytes"] = t["artifact_bytes"]
    fig, axes = plt.subplots(1, len(rows(r)), figsize=(3 * len(rows(r)), 3.2))
    for ax, (label, key, _) in zip(axes, rows(r)):
        ax.bar(["teacher", "student"], [t[key], s[key]], color=["tab:gray", "tab:blue"])
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{Path(t['folder']).name} -> {s['shape']}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
