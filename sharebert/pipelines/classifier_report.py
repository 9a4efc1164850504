"""A classifier compress run's report (``compress_classifier``'s last step): both artifacts, their task dev metric
through the torch-free runtime (:func:`artifact_glue_metrics`), the majority-label baseline and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from .out_folder import publish_web
from .report import probe, safetensor_params, web_sentence, weight_bytes, write_report
from .run import CompressRun, Student
from .teacher_pass import export_once, export_teacher, teacher_name


def artifact_glue_metrics(artifact: Path, task, data_dir: Path, limit: int | None = None) -> dict:
    """The task's dev metrics (first ``limit`` examples of its main dev split) of a text-classification artifact,
    through the torch-free ``Runtime.classify``; its classes are the task's by label name (generic ``LABEL_i``:
    in the task's order)."""
    import numpy as np

    from sharebert_runtime import Runtime

    from ..training.glue import read_split
    from ..training.metrics import task_metrics

    split = read_split(task, data_dir, task.dev_splits[0]).head(limit)
    rt = Runtime(artifact)
    answers = rt.classify(split.text_a, text_pair=split.text_b)
    if task.is_regression:
        preds = np.array([a["score"] for a in answers])
    else:
        names = list(answers[0]["scores"])
        to_task = [task.label_names.index(n) if n in task.label_names else i for i, n in enumerate(names)]
        preds = np.array([to_task[names.index(a["label"])] for a in answers])
    return task_metrics(task.metrics, preds, np.asarray(split.labels))


def majority_baseline(task, data_dir: Path, limit: int | None = None) -> dict | None:
    """The majority-label baseline on the dev examples teacher and student are scored on (the first ``limit`` of the
    task's main dev split): the task's metrics of always answering the label most frequent there (the best constant
    answer by accuracy), with that label and the count; None for a regression task (a constant has no correlation)."""
    import numpy as np

    from ..training.glue import read_split
    from ..training.metrics import task_metrics

    if task.is_regression:
        return None
    labels = np.asarray(read_split(task, data_dir, task.dev_splits[0]).head(limit).labels, dtype=np.int64)
    label = int(np.bincount(labels).argmax())
    scores = task_metrics(task.metrics, np.full_like(labels, label), labels)
    return {"label": task.label_names[label], "examples": int(labels.size), **scores}


def classifier_verdict(teacher: float, student: float, baseline: dict | None, metric: str, where: str) -> list[str]:
    """The report's first line: teacher and student beside the majority-label baseline on the same dev examples,
    and the share of the teacher's gain over that baseline the student keeps (a ratio of the raw scores says 0.997
    of the teacher when both only ever answer the one label)."""
    scores = f"{where}: teacher {teacher:.4f}, student {student:.4f}"
    if baseline is None:
        return [f"Verdict: {scores} (a regression task: no majority-label baseline)."]
    base = baseline[metric]
    said = f"{scores}, always answering {baseline['label']!r} (the most frequent label there) {base:.4f}"
    if teacher <= base:
        return [f"Verdict: {said}: the teacher is no better than that baseline, so the student's score says nothing."]
    if student <= base:
        return [f"Verdict: NOT usable: {said}: the student is no better than that baseline."]
    kept = (student - base) / (teacher - base)
    return [f"Verdict: {said}: the student keeps {kept:.0%} of the teacher's gain over that baseline."]


def classifier_report(run: CompressRun, task_, data_dir: Path, student: Student, phases: dict) -> dict:
    """Both artifacts exported and measured side by side (sizes, memory, speed, the task's dev metric on the first
    ``task_args.max_eval_samples`` dev examples) -> the report; ``phases``: what each phase recorded."""
    o, teacher, out, say = run.options, run.teacher.folder, run.out, run.say
    limit, progress, web, vocab = o.task_args.max_eval_samples, o.progress, o.web, student.vocab
    say("exporting the student (int8), task text-classification ...")
    student_dir = out / "student"
    art = export_once(
        student_dir, out / "artifact", "int8", progress, task="text-classification", allow_low_parity=True
    )
    if web:  # the same int8 graph, at the artifact's gate (a classifier's int8 is judged by its task metric, below)
        say("exporting the student for the web (--format web, int8) ...")
        web_entry = publish_web(student_dir, out, art, progress, "text-classification", allow_low_parity=True)
    t_art, t_quant, t_refused = export_teacher(  # made before the phases (compress_classifier): kept, not redone
        run.teacher, out / "teacher_artifact", "text-classification", progress, say
    )
    metric, g, t = task_.main_metric, phases["general"], phases["task"]
    say(f"measuring memory, speed and {task_.name} dev {metric} ...")
    s_probe, t_probe = probe(art), probe(t_art)
    s_scores = artifact_glue_metrics(art, task_, data_dir, limit)
    t_scores = artifact_glue_metrics(t_art, task_, data_dir, limit)
    parity = json.loads((art / "manifest.json").read_text())["parity"]
    report = {
        "teacher": {
            "folder": str(teacher),
            "name": teacher_name(teacher),
            "learned_params": safetensor_params(teacher),
            "file_bytes": weight_bytes(teacher),
            "artifact_bytes": weight_bytes(t_art),
            "glue_dev": t["teacher"][metric],
            "quantization": t_quant,
            "quantization_refused": t_refused,
            "glue_dev_artifact": t_scores[metric],
            **t_probe,
        },
        "student": {
            "folder": str(student_dir),
            "shape": student.cand.describe(),
            "config": student.overrides,
            "learned_params": safetensor_params(student_dir),
            "file_bytes": weight_bytes(art),
            "glue_dev_fp32": t[metric],
            "glue_dev": s_scores[metric],
            "artifact_metrics": s_scores,
            "quantization": "int8",
            "int8_agreement": parity.get("agreement"),
            **s_probe,
            **({"vocabulary": vocab.as_dict()} if vocab is not None else {}),
        },
        "task": task_.name,
        "metric": metric,
        "dev_examples": t["eval_samples"],
        "general": g,
        "training": {
            k: t[k]
            for k in (
                "steps",
                "best_step",
                "train_seconds",
                "train_samples",
                "stopped_by_time",
                "losses",
                "temperature",
            )
        },
        "limits": {k: v for k, v in o.limits.items() if v is not None},
        "quality": [{"label": f"{task_.folder} dev {metric} ({t['eval_samples']} examples)", "key": "glue_dev"}],
        "baseline": majority_baseline(task_, data_dir, limit),
    }
    where = report["quality"][0]["label"]
    report["verdict"] = {
        "lines": classifier_verdict(
            report["teacher"]["glue_dev"], report["student"]["glue_dev"], report["baseline"], metric, where
        )
    }
    s = report["student"]
    if web:
        s["web"] = web_entry
    summary = (
        f"General distillation: {g['steps']} steps ({g['train_seconds']:.0f} s) on {g['train_sentences']:,} "
        f"unlabelled sentences ({g['pooling']} state, {g['loss']} loss). Task distillation on {task_.name}: "
        f"{t['steps']} steps ({t['train_seconds']:.0f} s) on {t['train_samples']:,} training examples, best "
        f"dev at step {t['best_step']}. {task_.folder} dev {metric} ({t['eval_samples']} examples): teacher "
        f"{report['teacher']['glue_dev']:.4f} in PyTorch fp32, {t_scores[metric]:.4f} from its {t_quant} "
        f"artifact; student {s['glue_dev_fp32']:.4f} in PyTorch fp32, {s['glue_dev']:.4f} from its int8 "
        f"artifact (int8 and fp32 agree on {s['int8_agreement']:.0%} of {parity.get('sentences')} check "
        "sentences)."
        + (f" The student's {vocab.describe()}." if vocab is not None else "")
        + (web_sentence(web_entry) if web else "")
    )
    return write_report(out, report, summary)
