"""Small-scale study: ``sharebert-tiny`` (VEPS ShareBERT) against a dense BERT with about the same number
of learned parameters, each pre-trained for the same wall-clock budget on 2 CPU cores.

    python examples/small_scale_study.py                                  # the full study, 30-40 minutes
    python examples/small_scale_study.py --quick --out runs/sss-quick     # a smoke run, about 2-3 minutes

For each model, with the same seed, batch (32), sequence length (128) and learning-rate recipe:

1. build the initial weights and count the learned parameters with the MLM head (``sharebert.accounting.counts``);
2. time a few real training steps and a validation pass, and set ``max_steps`` so that the warm-up and
   linear decay end with the budget; ``max_time`` is the hard stop;
3. pre-train (masked LM, 15% dynamic masking) with ``sharebert.training.pretrain`` on the enwiki XML sample
   and the WikiText-2 valid and test splits, in that order; the last 5% of that token stream (the final
   articles of wiki.test.raw) is held out for validation;
4. fine-tune on SST-2 and CoLA with ``sharebert.training.finetune`` (bounded steps; best dev checkpoint);
5. word similarity (Spearman; virtual embeddings for VEPS) before and after pre-training.

The unigram baseline is the cross-entropy, on exactly the masked validation positions the models are
scored on (same masks: same packing, seed and masking code), of the training-stream unigram distribution
with add-one smoothing over the tokenizer's vocabulary. ``--out`` receives ``results.json``, ``results.md``
(for docs/RESULTS.md) and one folder per model (pre-trained model, logs, fine-tuned models).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import default_data_collator  # noqa: E402

from sharebert.accounting.counts import count_params  # noqa: E402
from sharebert.formats.build import build_model  # noqa: E402
from sharebert.formats.model_folder import load_tokenizer  # noqa: E402
from sharebert.formats.paths import data_path  # noqa: E402
from sharebert.model.configuration_sharebert import ShareBertConfig  # noqa: E402
from sharebert.model.modeling_sharebert import ShareBertForMaskedLM  # noqa: E402
from sharebert.training.corpus import PackedDataset, encode_sources, pack  # noqa: E402
from sharebert.training.evaluate import WORDSIM_SETS, load_any, read_wordsim, word_similarity  # noqa: E402
from sharebert.training.finetune import FinetuneArgs, finetune  # noqa: E402
from sharebert.training.glue import get_task, read_split  # noqa: E402
from sharebert.training.pretrain import PretrainArgs, pretrain  # noqa: E402

MODELS = {  # name -> (preset, overrides)
    "sharebert-tiny": ("sharebert-tiny", {}),
    "dense-bert": (
        "bert-h128",
        dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2),
    ),
}
SEQ_LEN, BATCH, LR, WARMUP_RATIO, VALID_FRACTION = 128, 32, 1e-3, 0.06, 0.05
EVALS = 4  # validation passes per pre-training run, besides the one at step 0
SAFETY = 0.95  # share of the budget the planned steps (and evaluations) may use
FT_LR, FT_BATCH = 1e-4, 32
TASKS = {"sst2": "accuracy", "cola": "matthews_correlation"}
NEARBY_DENSE = [(2, 256), (3, 192), (4, 128), (4, 256)]  # (layers, FFN) at hidden 64, 2 heads: learned params listed
FULL = dict(
    pretrain_minutes=11.0,
    finetune_steps=500,
    finetune_samples=None,
    calibration_steps=6,
    max_eval_sequences=None,
    enwiki=True,
)
QUICK = dict(
    pretrain_minutes=0.4,
    finetune_steps=30,
    finetune_samples=2000,
    calibration_steps=2,
    max_eval_sequences=64,
    enwiki=False,
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def corpus(enwiki: bool) -> list[Path]:
    """Pre-training sources, in stream order; the validation slice is cut from the end (wiki.test.raw)."""
    wiki = [data_path("wikitext-2-raw", "wiki.valid.raw"), data_path("wikitext-2-raw", "wiki.test.raw")]
    xml = sorted(p for p in data_path("enwiki-sample").iterdir() if p.is_file()) if enwiki else []
    return xml + wiki


def split_stream(sources, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The train and validation token streams, cut exactly as ``pretrain(valid_fraction=...)`` cuts them."""
    ids = encode_sources(sources, tokenizer)
    cut = int(round(ids.size * (1 - VALID_FRACTION)))
    return ids[:cut], ids[cut:]


def masked_set(ids: np.ndarray, tokenizer, seed: int, limit: int | None = None, fixed: bool = True) -> PackedDataset:
    """Packed ``[CLS] ... [SEP]`` sequences with the pre-training masks (fixed: the validation masks)."""
    blocks = pack(ids, SEQ_LEN, cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id)[:limit]
    return PackedDataset.for_objective(blocks, tokenizer, "mlm", seed=seed, fixed=fixed)


def unigram_baseline(train_ids: np.ndarray, valid: PackedDataset, vocab: int) -> dict:
    """Cross-entropy (nats) of add-one-smoothed training unigram frequencies on the masked validation tokens."""
    counts = np.bincount(train_ids, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    labels = torch.stack([valid[i]["labels"] for i in range(len(valid))]).numpy().ravel()
    targets = labels[labels != -100]
    loss = float(-logp[targets].mean())
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "masked_tokens": int(targets.size),
        "train_tokens": int(train_ids.size),
        "smoothing": "add-one over the tokenizer vocabulary",
    }


def build(name: str, out: Path, seed: int) -> tuple[Path, dict]:
    """The initial model folder and its parameter counts (accounting, checked against the torch module)."""
    preset, overrides = MODELS[name]
    folder = out / name / "init"
    model, _ = build_model(preset, folder, overrides, seed=seed)
    counts = count_params(ShareBertConfig.from_pretrained(folder), head="mlm")
    torch_count = sum(p.numel() for p in model.parameters())
    if torch_count != counts["learned_params"]:
        raise RuntimeError(
            f"{name}: accounting counts {counts['learned_params']:,} learned parameters, "
            f"the torch module {torch_count:,}"
        )
    c = model.config
    return folder, {
        "preset": preset,
        "overrides": overrides,
        "learned_params_mlm": counts["learned_params"],
        "learned_params_without_word_embeddings": counts["learned_params_without_word_embeddings"],
        "generated_params": counts["generated_params"],
        "hidden_size": c.hidden_size,
        "embedding_size": c.embedding_size or c.hidden_size,
        "layers": c.num_hidden_layers,
        "heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "sharing": c.sharing,
    }


def nearby_dense() -> list[dict]:
    """Learned parameters (MLM head) of dense shapes near the chosen one, for the record."""
    rows = []
    for layers, ffn in NEARBY_DENSE:
        config = ShareBertConfig.from_preset(
            "bert-h128", hidden_size=64, num_attention_heads=2, num_hidden_layers=layers, intermediate_size=ffn
        )
        learned = count_params(config, "mlm")["learned_params"]
        rows.append({"layers": layers, "intermediate_size": ffn, "learned_params_mlm": learned})
    return rows


def calibrate(model_dir: Path, train: PackedDataset, valid: PackedDataset, steps: int) -> dict:
    """Seconds per training step (AdamW, clipping; after one warm-up step) and per full validation pass."""
    model = ShareBertForMaskedLM.from_pretrained(
        model_dir, mlm_logits_in_training="masked"
    ).train()  # as pretrain() runs it
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    batches = [default_data_collator([train[i] for i in range(s * BATCH, (s + 1) * BATCH)]) for s in range(steps + 1)]
    for s, batch in enumerate(batches):
        if s == 1:
            start = time.perf_counter()
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    step_s = (time.perf_counter() - start) / steps
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        model(**default_data_collator([valid[i] for i in range(min(BATCH, len(valid)))]))
    eval_s = (time.perf_counter() - start) * math.ceil(len(valid) / BATCH)
    return {"seconds_per_step": step_s, "seconds_per_validation": eval_s}


def steps_for_budget(budget_s: float, rate: dict) -> tuple[int, int]:
    """``(max_steps, eval_steps)``: the steps that fit the budget after ``EVALS + 1`` validation passes."""
    train_s = SAFETY * budget_s - (EVALS + 1) * rate["seconds_per_validation"]
    steps = max(EVALS, int(train_s / rate["seconds_per_step"]))
    eval_steps = steps // EVALS
    return eval_steps * EVALS, eval_steps


def eval_curve(run: Path) -> list[list]:
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [[r["step"], r["eval_loss"]] for r in rows if "eval_loss" in r]


def pretrain_model(
    init: Path, run: Path, sources, budget_s: float, steps: int, eval_steps: int, seed: int, max_eval: int | None
) -> dict:
    args = PretrainArgs(
        max_steps=steps,
        max_time=budget_s,
        batch_size=BATCH,
        lr=LR,
        warmup_ratio=WARMUP_RATIO,
        seq_len=SEQ_LEN,
        valid_fraction=VALID_FRACTION,
        max_eval_sequences=max_eval,
        eval_steps=eval_steps,
        save_steps=10**9,
        logging_steps=max(1, min(25, eval_steps)),
        keep_checkpoints=1,
        seed=seed,
    )
    m = pretrain(sources, run, model_dir=init, args=args)
    keys = (
        "global_step",
        "stopped_by",
        "train_tokens",
        "train_runtime",
        "train_loss",
        "last_loss",
        "eval_loss",
        "eval_perplexity",
        "train_sequences",
        "valid_sequences",
    )
    return {
        "planned_steps": steps,
        "budget_seconds": budget_s,
        **{k: m[k] for k in keys},
        "eval_curve": eval_curve(run),
    }


def finetune_model(model_dir: Path, task: str, out: Path, steps: int, samples: int | None, seed: int) -> dict:
    args = FinetuneArgs(
        batch_size=FT_BATCH,
        lr=FT_LR,
        warmup_steps=max(1, steps // 10),
        max_steps=steps,
        max_train_samples=samples,
        eval_steps=max(1, steps // 4),
        seed=seed,
    )
    m = finetune(model_dir, task, out, args=args)
    kept = {k: m[k] for k in ("steps", "best_step", "train_samples", "train_seconds", "eval_samples")}
    return {"metric": TASKS[task], "value": m[TASKS[task]], **kept}


def word_sims(model_dir: Path) -> dict:
    model, tokenizer = load_any(model_dir)
    return word_similarity(model, tokenizer)


def repeated_word_pairs(sets) -> dict[str, int]:
    """Pairs whose two words are the same (SCWS: one word in two contexts): cosine 1 for any static embedding."""
    counts = {}
    for name in sets:
        rel, *columns = WORDSIM_SETS[name]
        counts[name] = sum(
            a.lower() == b.lower() for a, b, _ in read_wordsim(data_path("wordsim", rel), tuple(columns))
        )
    return counts


def dev_baselines() -> dict:
    """Constant-prediction scores on the dev sets: majority-class accuracy (SST-2), MCC 0 (CoLA)."""
    labels = read_split(get_task("sst2"), data_path("glue", "SST-2"), "dev").labels
    return {"sst2": max(np.bincount(labels)) / len(labels), "cola": 0.0}


def environment(argv: list[str], threads: int) -> dict:
    import tokenizers
    import transformers

    import sharebert

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "command": "python " + shlex.join(argv),
        "git_commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "sharebert": sharebert.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
    }


def study_model(name: str, init: Path, params: dict, setup: dict, data: dict, out: Path, timer: dict) -> dict:
    seed, budget = setup["seed"], setup["pretrain_minutes"] * 60
    t = time.perf_counter()
    rate = calibrate(init, data["calibration"], data["valid"], setup["calibration_steps"])
    steps, eval_steps = steps_for_budget(budget, rate)
    timer[f"{name}: calibrate"] = time.perf_counter() - t
    log(
        f"{name}: {params['learned_params_mlm']:,} learned parameters (MLM head); "
        f"{rate['seconds_per_step']:.3f} s/step, {rate['seconds_per_validation']:.1f} s/validation -> {steps} steps"
    )

    t = time.perf_counter()
    run = out / name / "pretrain"
    pre = pretrain_model(init, run, data["sources"], budget, steps, eval_steps, seed, setup["max_eval_sequences"])
    timer[f"{name}: pre-train (incl. tokenizing)"] = time.perf_counter() - t
    if pre["valid_sequences"] != len(data["valid"]):
        raise RuntimeError(f"validation sets differ: pretrain {pre['valid_sequences']}, baseline {len(data['valid'])}")
    log(f"{name}: {pre['global_step']} steps ({pre['stopped_by']}), valid loss {pre['eval_loss']:.4f}")

    glue = {}
    for task in TASKS:
        t = time.perf_counter()
        glue[task] = finetune_model(
            run, task, out / name / task, setup["finetune_steps"], setup["finetune_samples"], seed
        )
        timer[f"{name}: fine-tune {task}"] = time.perf_counter() - t
        log(f"{name}: {task} dev {glue[task]['metric']} {glue[task]['value']:.4f}")
    t = time.perf_counter()
    sims = {"init": word_sims(init), "pretrained": word_sims(run)}
    timer[f"{name}: word similarity"] = time.perf_counter() - t
    return {"params": params, "calibration": rate, "pretrain": pre, "glue": glue, "word_similarity": sims}


# ------------------------------------------------------------------------------------------ report
def _f(v, digits=4) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]


def _setup_text(r: dict) -> list[str]:
    env, setup, corpus = r["environment"], r["setup"], r["corpus"]
    subset = f", first {setup['finetune_samples']:,} training examples" if setup["finetune_samples"] else ""
    return [
        f"Command: `{env['command']}` (git {env['git_commit']}); seed {setup['seed']}; {env['torch_threads']} torch "
        f"threads on {env['cpu_count']} CPUs ({env['platform']}); python {env['python']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, tokenizers {env['tokenizers']}, sharebert {env['sharebert']}. "
        f"Total wall clock {r['total_seconds'] / 60:.1f} min.",
        "",
        f"Corpus: {', '.join(Path(p).name for p in corpus['sources'])} ({corpus['tokens']:,} WordPiece tokens); the "
        f"last {VALID_FRACTION:.0%} of the stream ({corpus['valid_tokens']:,} tokens, the end of wiki.test.raw) is the "
        f"validation set ({r['unigram_baseline']['masked_tokens']:,} masked positions, fixed masks). Pre-training: "
        f"batch {BATCH}, sequence length {SEQ_LEN}, AdamW lr {LR:g}, {WARMUP_RATIO:.0%} warm-up then linear decay to "
        f"the planned step, 15% masking. Fine-tuning: batch {FT_BATCH}, lr {FT_LR:g}, {setup['finetune_steps']} "
        f"steps, dev scored every {setup['finetune_steps'] // 4} steps and the best kept{subset}.",
    ]


def _models_table(r: dict) -> list[str]:
    rows = []
    for name, m in r["models"].items():
        p = m["params"]
        overrides = ", ".join(f"{k}={v}" for k, v in p["overrides"].items()) or "-"
        rows.append(
            [
                name,
                f"{p['preset']} ({overrides})",
                f"{p['learned_params_mlm']:,}",
                f"{p['learned_params_without_word_embeddings']:,}",
                f"{p['hidden_size']} / {p['embedding_size']}",
                f"{p['layers']} x {p['heads']}",
                p["intermediate_size"],
            ]
        )
    tiny = r["models"]["sharebert-tiny"]["params"]["learned_params_mlm"]
    nearby = "; ".join(
        f"{d['layers']} layers, FFN {d['intermediate_size']}: {d['learned_params_mlm']:,} "
        f"({d['learned_params_mlm'] / tiny - 1:+.1%})"
        for d in r["nearby_dense"]
    )
    return _table(
        [
            "model",
            "preset (overrides)",
            "learned params (MLM head)",
            "without word embeddings",
            "hidden / embedding",
            "layers x heads",
            "FFN",
        ],
        rows,
    ) + [
        "",
        f"Dense shapes nearby (hidden 64, 2 heads; learned parameters with the MLM head, vs sharebert-tiny): "
        f"{nearby}. The study keeps 4 layers with FFN 256 (sharebert-tiny's depth, BERT's 4x FFN ratio) over "
        f"the closer but shallower 2-layer shape.",
    ]


def _pretrain_table(r: dict) -> list[str]:
    rows = []
    for name, m in r["models"].items():
        pre = m["pretrain"]
        rows.append(
            [
                name,
                _f(m["calibration"]["seconds_per_step"], 3),
                pre["planned_steps"],
                pre["global_step"],
                pre["stopped_by"],
                f"{pre['train_tokens']:,}",
                _f(pre["train_runtime"], 0),
                _f(pre["eval_curve"][0][1], 3),
                _f(pre["eval_loss"], 3),
                _f(pre["eval_perplexity"], 1),
            ]
        )
    base = r["unigram_baseline"]
    rows.append(["unigram baseline", "", "", "", "", "", "", "", _f(base["loss"], 3), _f(base["perplexity"], 1)])
    return _table(
        [
            "model",
            "s/step (calibration)",
            "planned steps",
            "steps done",
            "stopped by",
            "tokens seen",
            "train s",
            "valid loss, step 0",
            "valid loss",
            "valid perplexity",
        ],
        rows,
    )


def _glue_table(r: dict) -> list[str]:
    rows = [
        [
            name,
            _f(m["glue"]["sst2"]["value"]),
            _f(m["glue"]["cola"]["value"]),
            f"{m['glue']['sst2']['train_seconds']:.0f} / {m['glue']['cola']['train_seconds']:.0f}",
        ]
        for name, m in r["models"].items()
    ]
    rows.append(["constant prediction", _f(r["dev_baselines"]["sst2"]), _f(r["dev_baselines"]["cola"]), ""])
    return _table(["model", "SST-2 dev accuracy", "CoLA dev MCC", "fine-tune s (SST-2 / CoLA)"], rows)


def _wordsim_table(r: dict) -> list[str]:
    first = next(iter(r["models"].values()))["word_similarity"]["pretrained"]
    sets = list(first)
    counts = "; ".join(
        f"{s} {first[s]['used']}/{first[s]['pairs']} ({first[s]['skipped_oov']} OOV, "
        f"{first[s]['skipped_multitoken']} multi-token)"
        for s in sets
    )
    rows = [
        [
            name,
            *(
                f"{_f(m['word_similarity']['init'][s]['spearman'], 3)} -> "
                f"{_f(m['word_similarity']['pretrained'][s]['spearman'], 3)}"
                for s in sets
            ),
        ]
        for name, m in r["models"].items()
    ]
    return [
        f"Word similarity, Spearman at initialisation -> after pre-training (VEPS: virtual embeddings A@P+p; "
        f"dense: word embeddings). Pairs used (skipped): {counts}.",
        "",
        *_table(["model", *sets], rows),
    ]


def findings(r: dict) -> list[str]:
    """Plain statements computed from the numbers, then what they cannot show."""
    s, d = r["models"]["sharebert-tiny"], r["models"]["dense-bert"]
    base = r["unigram_baseline"]["loss"]
    lines = []
    for name, m in r["models"].items():
        gap = base - m["pretrain"]["eval_loss"]
        lines.append(
            f"- {name}: validation MLM loss {m['pretrain']['eval_loss']:.3f} nats, "
            f"{abs(gap):.3f} {'below' if gap > 0 else 'above'} the unigram baseline ({base:.3f})."
        )
    ratio = d["pretrain"]["global_step"] / max(1, s["pretrain"]["global_step"])
    wider = s["params"]["hidden_size"] / d["params"]["hidden_size"]
    lines.append(
        f"- In the same wall-clock budget the dense model took {ratio:.1f}x as many optimizer steps "
        f"({d['pretrain']['global_step']} vs {s['pretrain']['global_step']}): sharebert-tiny is {wider:g}x "
        f"wider and generates its layer weights every step, so this compares equal learned parameters and "
        f"equal CPU time, not equal FLOPs or equal steps."
    )
    for name, m in r["models"].items():
        ws = m["word_similarity"]
        change = ", ".join(
            f"{k} {_f(ws['init'][k]['spearman'], 3)} -> {_f(ws['pretrained'][k]['spearman'], 3)}"
            for k in ws["pretrained"]
        )
        lines.append(f"- Word similarity of {name}, initialisation -> pre-trained: {change}.")
    pairs = next(iter(r["models"].values()))["word_similarity"]["pretrained"]
    for k, n in r["repeated_word_pairs"].items():
        if n >= 0.05 * pairs[k]["pairs"]:  # enough to lift the score of random embeddings
            lines.append(
                f"- {k}: {n} of its {pairs[k]['pairs']} pairs repeat one word (in two contexts); any static "
                f"embedding gives them cosine 1, so random embeddings already score above 0: read it "
                f"against the initialisation value."
            )
    for task, metric in TASKS.items():
        lines.append(
            f"- {task} dev {metric}: sharebert-tiny {_f(s['glue'][task]['value'], 3)}, dense "
            f"{_f(d['glue'][task]['value'], 3)}, constant prediction {_f(r['dev_baselines'][task], 3)}."
        )
    lines.append(
        f"- Not shown: anything about scale. One seed, {r['corpus']['tokens'] / 1e6:.1f}M corpus tokens and minutes "
        "of CPU time; differences of a few points are within what another seed could give. There is no fine-tuning "
        "control from random initialisation, the dev sets both pick the fine-tuning checkpoint and report its "
        "score (optimistic), and GLUE numbers near constant prediction say nothing about the architectures at "
        "paper scale."
    )
    return lines


def markdown(r: dict) -> str:
    title = (
        f"### Small-scale study: sharebert-tiny vs a dense BERT, {r['setup']['pretrain_minutes']:g} min of "
        f"pre-training each"
    )
    phases = "; ".join(f"{k} {v:.0f}" for k, v in r["phase_seconds"].items())
    parts = [
        [title],
        _setup_text(r),
        _models_table(r),
        _pretrain_table(r),
        _glue_table(r),
        _wordsim_table(r),
        [f"Wall clock per phase (s): {phases}."],
        ["What the numbers show and what they do not:", "", *findings(r)],
    ]
    return "\n\n".join("\n".join(p) for p in parts) + "\n"


# ------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/small_scale_study", help="output folder (must not hold an earlier run)")
    ap.add_argument("--pretrain-minutes", type=float, help="wall-clock budget per model (default 11; --quick 0.4)")
    ap.add_argument("--finetune-steps", type=int, help="optimizer steps per fine-tune (default 500; --quick 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: WikiText only, 24 s pre-training, 30 fine-tune steps on 2,000 examples",
    )
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = dict(QUICK if args.quick else FULL, seed=args.seed, quick=args.quick)
    for key in ("pretrain_minutes", "finetune_steps"):
        if getattr(args, key) is not None:
            setup[key] = getattr(args, key)
    if setup["pretrain_minutes"] <= 0 or setup["finetune_steps"] < 4:
        raise SystemExit("need --pretrain-minutes > 0 and --finetune-steps >= 4")
    out = Path(args.out)
    if any((out / n).exists() for n in MODELS):
        raise SystemExit(f"{out} already holds a study; remove it or choose another --out")
    torch.set_num_threads(args.threads)
    start, timer = time.perf_counter(), {}

    t = time.perf_counter()
    built = {name: build(name, out, args.seed) for name in MODELS}
    timer["build"] = time.perf_counter() - t
    t = time.perf_counter()
    sources = corpus(setup["enwiki"])
    first = next(iter(built.values()))[0]  # every model folder holds the same bert-base-uncased tokenizer
    tokenizer = load_tokenizer(first, ShareBertConfig.from_pretrained(first).vocab_size)
    train_ids, valid_ids = split_stream(sources, tokenizer)
    valid = masked_set(valid_ids, tokenizer, args.seed, setup["max_eval_sequences"])
    baseline = unigram_baseline(train_ids, valid, len(tokenizer))
    calibration = masked_set(
        train_ids[: (setup["calibration_steps"] + 1) * BATCH * SEQ_LEN], tokenizer, args.seed, fixed=False
    )
    timer["tokenize + unigram baseline"] = time.perf_counter() - t
    log(
        f"corpus: {train_ids.size + valid_ids.size:,} tokens, {len(valid)} validation sequences; unigram baseline "
        f"{baseline['loss']:.4f} nats (perplexity {baseline['perplexity']:.1f})"
    )

    data = {"sources": sources, "valid": valid, "calibration": calibration}
    models = {name: study_model(name, *built[name], setup, data, out, timer) for name in MODELS}
    sets = next(iter(models.values()))["word_similarity"]["pretrained"]
    results = {
        "setup": setup,
        "environment": environment(sys.argv, args.threads),
        "corpus": {
            "sources": [str(p) for p in sources],
            "tokens": int(train_ids.size + valid_ids.size),
            "valid_tokens": int(valid_ids.size),
            "valid_fraction": VALID_FRACTION,
        },
        "unigram_baseline": baseline,
        "dev_baselines": dev_baselines(),
        "nearby_dense": nearby_dense(),
        "repeated_word_pairs": repeated_word_pairs(sets),
        "models": models,
        "phase_seconds": {k: round(v, 1) for k, v in timer.items()},
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    log(f"done in {results['total_seconds'] / 60:.1f} min; wrote {out / 'results.json'} and {out / 'results.md'}")
    print(markdown(results))


if __name__ == "__main__":
    main()
