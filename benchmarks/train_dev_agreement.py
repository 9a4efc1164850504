"""Where a distilled classifier falls short of its teacher: on the training rows it learned from, or on dev.

For each ``--student`` (a ``distill --objective glue`` output) and the ``--teacher`` it learned from, on
``--rows`` random SST-2 training rows and on the dev set: the gold-label accuracy of each and how often the
student predicts the teacher's class. A student that agrees with its teacher on training rows but not on dev
has a generalisation gap (what it knows of language), not a fitting one (its capacity for the task data).

    .venv/bin/python benchmarks/train_dev_agreement.py --teacher runs/minilm-sst2 --student runs/sst2-long3 \
        [--student ...] [--rows 4000]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from sharebert.formats.model_folder import load_config, load_tokenizer
from sharebert.formats.paths import data_path
from sharebert.training.distill_teacher import load_teacher
from sharebert.training.encoded import encode, predict_logits
from sharebert.training.finetune import load_classifier
from sharebert.training.glue import get_task, read_split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", required=True)
    p.add_argument("--student", action="append", required=True)
    p.add_argument("--rows", type=int, default=4000)
    args = p.parse_args()
    task = get_task("sst2")
    tok = load_tokenizer(args.teacher, load_config(args.teacher).vocab_size)
    train = read_split(task, data_path("glue", "SST-2"), "train")
    rows = np.random.default_rng(0).choice(len(train), min(args.rows, len(train)), replace=False)
    sample = replace(train, text_a=[train.text_a[i] for i in rows], labels=[train.labels[i] for i in rows])
    splits = {f"train ({len(rows)} random rows)": sample, "dev": read_split(task, data_path("glue", "SST-2"), "dev")}
    teacher = load_teacher(args.teacher)
    print("| model | rows | accuracy | teacher's accuracy | agreement with the teacher |\n|---|---|---|---|---|")
    for name, split in splits.items():
        ds = encode(split, tok, 128, progress=False)
        gold, t = np.asarray(split.labels), predict_logits(teacher, ds, progress=False).argmax(1)
        for student in args.student:
            s = predict_logits(load_classifier(student, task).eval(), ds, progress=False).argmax(1)
            print(
                f"| {student} | {name} | {np.mean(s == gold):.4f} | {np.mean(t == gold):.4f} | {np.mean(s == t):.4f} |"
            )


if __name__ == "__main__":
    main()
