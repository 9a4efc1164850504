"""Partial Q-K sharing sweep on Tiny Shakespeare: train a character-level causal LM for each share
ratio ``p`` (config ``qk_share_ratio``: 0 = separate Q and K, 1 = symmetric) and write the train and
validation loss curves to ``curves.csv`` and ``curves.png``.

    python examples/partial_qk_sweep.py --out runs/pqk            # CPU-sized: charlm-tiny, 150 steps
    python examples/partial_qk_sweep.py --out runs/pqk --full     # the paper's length: charlm-6l, 5000 steps

Same data (90/10 split of input.txt), seed, schedule and batch order for every ``p``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from sharebert.formats.paths import data_path
from sharebert.training.pretrain import PretrainArgs, pretrain

SHORT = dict(
    preset="charlm-tiny",
    max_steps=150,
    batch_size=16,
    seq_len=128,
    eval_steps=25,
    logging_steps=5,
    max_eval_sequences=64,
)
FULL = dict(
    preset="charlm-6l",
    max_steps=5000,
    batch_size=64,
    seq_len=256,
    eval_steps=250,
    logging_steps=50,
    max_eval_sequences=None,
)


def curves(out: Path) -> list[dict]:
    """``{"step", "split", "loss"}`` rows from a run's ``log.jsonl``."""
    rows = []
    for line in (out / "log.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            rows.append({"step": r["step"], "split": "train", "loss": r["loss"]})
        if "eval_loss" in r:
            rows.append({"step": r["step"], "split": "valid", "loss": r["eval_loss"]})
    return rows


def plot(rows: list[dict], path: Path, what: str) -> bool:
    """Train and validation loss by step, one line per ratio, in the toolkit's picture style (1,200 pixels wide)."""
    from sharebert.accounting.picture import figure, headline, pyplot, save

    try:
        pyplot()
    except ValueError:
        print("matplotlib is not installed (pip install sharebert[plot]); skipping the PNG")
        return False
    styles = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D")]  # distinct even where the curves coincide
    with figure(5, ncols=2, sharex=True) as (fig, axes):  # own y ranges: the valid curves differ by little
        for ax, split, name in zip(axes[0], ("train", "valid"), ("train", "validation")):
            for i, p in enumerate(sorted({r["p"] for r in rows})):
                pts = [(r["step"], r["loss"]) for r in rows if r["p"] == p and r["split"] == split]
                if not pts:
                    continue
                ls, marker = styles[i % len(styles)]
                ax.plot(
                    *zip(*pts),
                    ls=ls,
                    marker=marker,
                    ms=5,
                    markevery=max(1, len(pts) // 12),
                    lw=1.8,
                    label=f"p = {p:g} (last {pts[-1][1]:.3f})",
                )
            ax.set(title=f"{name} loss, nats per character", xlabel="optimizer step", ylabel="cross-entropy")
            ax.legend(frameon=False)
        headline(fig, f"Partial Q-K sharing: loss by shared fraction p ({what})")
        save(fig, path)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/partial_qk_sweep")
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.0, 0.5, 0.9, 1.0])
    ap.add_argument("--full", action="store_true", help="charlm-6l, block 256, 5000 steps (the paper's run; GPU)")
    ap.add_argument("--max-steps", type=int, help="override the number of steps")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    setup = dict(FULL if args.full else SHORT)
    if args.max_steps:
        setup["max_steps"] = args.max_steps
    preset = setup.pop("preset")
    out = Path(args.out)
    rows, finals = [], []
    for p in args.ratios:
        run = out / f"p{p:g}"
        a = PretrainArgs(
            objective="clm",
            char_level=True,
            save_steps=10**9,
            lr=1e-3,
            seed=args.seed,
            overrides={"qk_share_ratio": p},
            **setup,
        )
        m = pretrain([data_path("tinyshakespeare", "input.txt")], run, preset=preset, args=a)
        rows += [{"p": p, **r} for r in curves(run)]
        finals.append((p, m["eval_loss"], m["train_runtime"]))
        print(f"p={p:g}: valid loss {m['eval_loss']:.4f} after {m['global_step']} steps ({m['train_runtime']:.0f} s)")
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["p", "step", "split", "loss"])
        w.writeheader()
        w.writerows(rows)
    plotted = plot(rows, out / "curves.png", f"{preset}, Tiny Shakespeare, {setup['max_steps']} steps")
    print(f"wrote {out / 'curves.csv'}" + (f" and {out / 'curves.png'}" if plotted else ""))
    print("p     valid loss   seconds")
    for p, loss, secs in finals:
        print(f"{p:<5g} {loss:<12.4f} {secs:.0f}")


if __name__ == "__main__":
    main()
