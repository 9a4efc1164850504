"""``sharebert evaluate MODE``: GLUE dev metrics, word similarity, word analogy, noise robustness, cross-domain."""

from __future__ import annotations

from pathlib import Path

from sharebert_runtime import options as opt


def _common(p, json_out=True):
    if json_out:
        p.add_argument("--json", type=opt.path, metavar="FILE", help="also write the results as JSON")


def add_arguments(p):
    from ..training.arguments import MULTI_TOKEN, NOISE_LEVELS, WORDSIM_SETS
    from ..training.glue import TASKS

    sub = p.add_subparsers(dest="mode", metavar="MODE", required=True)
    g = sub.add_parser("glue", help="dev metrics of a fine-tuned model")
    g.add_argument(
        "--model",
        type=opt.path,
        required=True,
        help="fine-tuned model folder (`sharebert finetune --out`); with --depths "
        "also a text-classification artifact folder (`sharebert export`)",
    )
    g.add_argument("--task", required=True, choices=list(TASKS))
    g.add_argument("--data-dir", type=opt.path, help="the task's folder (default ../shared/data/glue/<Task>)")
    g.add_argument("--max-eval-samples", type=int)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument(
        "--depths",
        nargs="+",
        type=int,
        metavar="K",
        help="a table by inference depth: the dev metric and p50 latency of one sentence when only the first "
        "K encoder layers run (the full depth is always added, as the reference)",
    )
    g.add_argument(
        "--plot", type=opt.path, metavar="FILE.png", help="with --depths: draw metric and latency against depth"
    )
    g.add_argument("--threads", type=int, default=1, help="with --depths: threads for the latency (default 1)")
    g.add_argument(
        "--latency-samples",
        type=int,
        default=100,
        help="with --depths: dev sentences timed one at a time, the median reported (default 100)",
    )
    _common(g)

    w = sub.add_parser("wordsim", help="word similarity (Spearman) of the (virtual) embeddings")
    w.add_argument("--model", type=opt.path, required=True, help="any ShareBERT model folder")
    w.add_argument(
        "--sets",
        nargs="+",
        help=f"names ({', '.join(WORDSIM_SETS)}) or 'word1 word2 score' files; default: all present",
    )
    multi = dict(
        choices=MULTI_TOKEN,
        default="mean",
        help="a word WordPiece splits: the mean of its pieces' vectors (default), the first piece, or skip it",
    )
    w.add_argument("--multi-token", **multi)
    _common(w)

    a = sub.add_parser("analogy", help="word analogy accuracy (3CosAdd); answers are single-token words")
    a.add_argument("--model", type=opt.path, required=True, help="any ShareBERT model folder")
    a.add_argument(
        "--file", type=opt.path, help="analogy questions (default ../shared/data/analogy/questions-words.txt)"
    )
    a.add_argument("--multi-token", **multi)
    _common(a)

    n = sub.add_parser("noise", help="accuracy under Gaussian noise on the input embeddings (Kowsher Table 5)")
    n.add_argument("--model", type=opt.path, required=True, help="fine-tuned model folder")
    n.add_argument("--task", required=True, choices=list(TASKS))
    n.add_argument("--data-dir", type=opt.path, help="the task's folder (default ../shared/data/glue/<Task>)")
    n.add_argument(
        "--levels",
        default=",".join(f"{x:g}" for x in NOISE_LEVELS),
        help="noise levels as fractions of the mean embedding norm (default 0,0.05,...,0.4)",
    )
    n.add_argument("--max-eval-samples", type=int)
    n.add_argument("--seed", type=int, default=0)
    _common(n)

    c = sub.add_parser(
        "cross-domain",
        help="train-on-A / evaluate-on-B accuracy matrix (Kowsher Table 6); needs two "
        "tasks of one label space, e.g. QNLI and RTE, each fine-tuned and with a dev set",
    )
    c.add_argument(
        "--models",
        nargs="+",
        required=True,
        metavar="TASK=DIR",
        help="fine-tuned model per task, e.g. qnli=runs/qnli rte=runs/rte",
    )
    c.add_argument(
        "--data-dirs",
        nargs="*",
        default=[],
        metavar="TASK=DIR",
        help="task folders (default ../shared/data/glue/<Task>)",
    )
    c.add_argument("--max-eval-samples", type=int)
    _common(c)


def _pairs(items, flag):
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{flag} expects TASK=DIR, got {item!r}")
        task, path = item.split("=", 1)
        out[task.strip()] = path
    return out


def _depths(args):
    """``evaluate glue --depths``: one row per depth (torch-free for an artifact folder)."""
    from ..training.depth_table import depth_table, plot_depths
    from .tables import format_table

    result = depth_table(
        args.model,
        args.task,
        args.depths,
        args.data_dir,
        args.max_eval_samples,
        args.latency_samples,
        args.threads,
        args.batch_size,
    )
    metric = result["metric"]
    print(
        format_table(
            ["depth", metric, "vs full", "p50 ms", "vs full"],
            [
                [r["depth"], r[metric], r["metric_vs_full"], r["p50_ms"], f"{r['latency_vs_full']:.2f}x"]
                for r in result["rows"]
            ],
        )
    )
    print(
        f"{result['backend']}, {result['eval_samples']} dev examples; latency: batch 1, median of "
        f"{result['latency_samples']} sentences, {result['threads']} thread(s); full depth {result['layers']}"
    )
    if args.plot:
        print(f"plot -> {plot_depths(result, args.plot)}")
    return result


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def run(args) -> int:
    from sharebert_runtime.outdir import write_json

    _check_outputs(args)
    by_depth = args.mode == "glue" and (args.depths or args.plot)
    if by_depth:
        if not args.depths:
            raise ValueError("--plot draws the --depths table: give --depths too")
        result = _depths(args)
    else:
        from ..training import evaluate as ev

        result = _MODES[args.mode](args, ev)
    if args.json:
        write_json(args.json, result)
        print(f"results -> {args.json}")
    return 0


def _check_outputs(args) -> None:
    """Output paths before any work: nothing runs for a path that cannot be written."""
    from sharebert_runtime.outdir import check_out_file

    if getattr(args, "plot", None):
        check_out_file(args.plot, "--plot", PLOT_SUFFIXES)
    if getattr(args, "json", None):
        check_out_file(args.json, "--json")
    if (
        getattr(args, "plot", None)
        and getattr(args, "json", None)
        and Path(args.plot).resolve() == Path(args.json).resolve()
    ):
        raise ValueError(f"--plot and --json name the same file {args.json}")


def _glue(args, ev) -> dict:
    from .tables import format_table

    result = ev.evaluate_glue(args.model, args.task, args.data_dir, args.max_eval_samples, args.batch_size)
    print(format_table(["metric", "value"], [[k, v] for k, v in result.items()]))
    return result


def _wordsim(args, ev) -> dict:
    from .tables import format_table

    model, tok = ev.load_any(args.model)
    result = ev.word_similarity(model, tok, args.sets, args.multi_token)
    keys = ["spearman", "pairs", "used", "used_multitoken", "skipped_oov", "skipped_multitoken"]
    print(format_table(["set", *keys], [[name, *(r[k] for k in keys)] for name, r in result.items()]))
    return result


def _analogy(args, ev) -> dict:
    from .tables import format_table

    model, tok = ev.load_any(args.model)
    result = ev.word_analogy(model, tok, args.file, multi_token=args.multi_token)
    print(
        format_table(
            ["section", "accuracy"], [[s, v] for s, v in result["sections"].items()] + [["all", result["accuracy"]]]
        )
    )
    print(
        f"questions {result['questions']}, used {result['used']} ({result['used_multitoken']} with split words, "
        f"--multi-token {args.multi_token}), skipped: out-of-vocabulary {result['skipped_oov']}, "
        f"multi-token {result['skipped_multitoken']}"
    )
    return result


def _noise(args, ev) -> dict:
    from .tables import format_table

    try:
        levels = [float(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--levels expects comma-separated numbers, got {args.levels!r}") from None
    result = ev.noise_robustness(args.model, args.task, args.data_dir, levels, args.max_eval_samples, seed=args.seed)
    keys = [k for k in result["rows"][0] if k != "level"]
    print(format_table(["noise", *keys], [[f"{r['level']:.0%}", *(r[k] for k in keys)] for r in result["rows"]]))
    print(f"mean input-embedding norm {result['mean_norm']:.4f} over {result['eval_samples']} dev examples")
    return result


def _cross_domain(args, ev) -> dict:
    from .tables import format_table

    result = ev.cross_domain(
        _pairs(args.models, "--models"), _pairs(args.data_dirs, "--data-dirs"), args.max_eval_samples
    )
    tasks = result["tasks"]
    print(
        format_table(
            ["trained on \\ evaluated on", *tasks], [[t, *(result["matrix"][t][e] for e in tasks)] for t in tasks]
        )
    )
    return result


_MODES = {"glue": _glue, "wordsim": _wordsim, "analogy": _analogy, "noise": _noise, "cross-domain": _cross_domain}
