"""``sharebert budget``: the Pareto front of configurations under a device budget (analytic)."""

from __future__ import annotations


def add_arguments(p):
    from sharebert_runtime import options as opt

    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--max-params", help="learned parameters, e.g. 10M")
    g.add_argument("--max-bytes", help="bytes stored at --dtype, e.g. 20MB")
    p.add_argument("--dtype", choices=["fp32", "fp16", "int8"], default="fp32")
    p.add_argument("--max-gflops", type=opt.positive_float, help="GFLOPs per forward (batch 1, weights materialised)")
    p.add_argument("--max-ram", help="RAM at load (learned + generated weights at --dtype), e.g. 64MB")
    p.add_argument("--seq-len", type=opt.positive_int, default=128)
    p.add_argument("--top", type=opt.positive_int, default=10, help="rows to print (largest first)")
    p.add_argument(
        "--model",
        type=opt.path,
        action="append",
        metavar="DIR",
        default=[],
        help="place your own model folder (e.g. a BERT teacher) among the candidates (repeatable)",
    )
    p.add_argument(
        "--plot",
        type=opt.path,
        metavar="FILE.png",
        help="draw candidates, front and reference points (needs matplotlib)",
    )


def run(args) -> int:
    from sharebert_runtime.outdir import check_out_file

    from ..accounting.budget import human, parse_size, plot, search_candidates

    size = lambda v: None if v is None else parse_size(v)  # noqa: E731
    limits = {
        "max_params": size(args.max_params),
        "max_bytes": size(args.max_bytes),
        "max_ram": size(args.max_ram),
        "max_gflops": args.max_gflops,
    }
    for name, value in limits.items():
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.plot:
        check_out_file(args.plot, "--plot", (".png",))
    from ..formats.model_folder import shape_fields

    models = {str(m): shape_fields(m) for m in args.model}
    r = search_candidates(limits, args.dtype, args.seq_len, models)
    unit = {"max_bytes": "B", "max_ram": "B"}
    stated = ", ".join(f"{k.replace('_', '-')} {human(v)}{unit.get(k, '')}" for k, v in limits.items() if v is not None)
    print(
        f"{r['feasible']:,} of {r['total']:,} candidates fit ({stated}; {args.dtype}, seq {args.seq_len}); "
        f"Pareto front of (learned params up, RAM at load down, GFLOPs down): {len(r['front'])}"
    )
    if r["blocking"]:
        print(r["blocking"])
    else:
        print(f"{'':2}{'learned':>12} {'stored':>10} {'RAM@load':>10} {'GFLOPs':>8}  configuration")
        for c in r["front"][: args.top]:
            mark = "*" if c.is_preset else " "
            name = f" [{c.name}]" if c.is_preset else ""
            print(
                f"{mark} {c.params:>12,} {c.stored_bytes / 1e6:>8.2f}MB {c.ram_bytes / 1e6:>8.2f}MB {c.gflops:>8.2f}  "
                f"{c.describe()}{name}"
            )
        off = [c.name for c in r["presets"] if c not in r["front"]]
        print("* = paper preset" + (f"; feasible presets off the front: {', '.join(off)}" if off else ""))
    for c in r["all"]:
        if c.name in models:
            print(
                f"your model {c.name}: {c.params:,} learned, {c.stored_bytes / 1e6:.2f}MB stored, "
                f"{c.ram_bytes / 1e6:.2f}MB RAM@load, {c.gflops:.2f} GFLOPs ({c.describe()}); "
                f"{'within' if r['fits'][r['all'].index(c)] else 'outside'} the limits"
            )
    if args.plot:
        plot(r, args.plot)
        print(f"plot written to {args.plot}")
    return 0
