"""``sharebert report``: parameters, bytes and FLOPs of a preset or model folder, from the config alone."""

from __future__ import annotations

import json

from sharebert_runtime import options as opt


def add_arguments(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a preset name (see `sharebert build --help`)")
    src.add_argument(
        "--model",
        type=opt.path,
        help="a model folder holding config.json (a ShareBERT or BERT one counted "
        "analytically; another encoder architecture as transformers builds it)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="override a config field, e.g. --set hidden_size=512 (repeatable)",
    )
    p.add_argument(
        "--head",
        choices=["none", "mlm", "classifier"],
        default="none",
        help="none: backbone as the ShareBERT paper counts it (default); mlm: BertForMaskedLM-style "
        "pre-training model; classifier: pooler + sequence classifier",
    )
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--format", choices=["table", "json", "markdown"], default="table")


def load_config(preset: str | None, model: str | None, overrides: dict):
    """``(shape, preset name or None)``; the preset name is kept only when nothing is overridden.

    A ``ModelShape`` validates like ``ShareBertConfig`` without importing torch or transformers.
    """
    from ..model.shape import ModelShape

    if preset:
        return ModelShape.from_preset(preset, **overrides), (None if overrides else preset)
    from ..formats.model_folder import shape_fields

    fields = {**shape_fields(model), **overrides}
    return ModelShape(**fields), None


def build_report(config, preset: str | None, head: str, seq_len: int, batch: int) -> dict:
    """Everything ``report`` prints, as JSON-ready data."""
    from ..accounting.counts import HEADS, count_bytes, count_flops, count_params, paper_figures

    n = count_params(config, head)
    flops = count_flops(config, head, seq_len, batch)
    paper = paper_figures(preset, head)
    if paper and (seq_len, batch) != (128, 1):  # the paper's GFLOPs are for batch 1, sequence 128
        paper = {k: v for k, v in paper.items() if not k.startswith("gflops")}
    return {
        "preset": preset,
        "config": {
            k: getattr(config, k)
            for k in (
                "sharing",
                "attention",
                "vocab_size",
                "word_embedding_size",
                "hidden_size",
                "num_hidden_layers",
                "intermediate_size",
                "num_attention_heads",
                "max_position_embeddings",
                "pooler",
                "mlm_head",
            )
        },
        **n,
        "learned_params_by_head": {h: count_params(config, h)["learned_params"] for h in HEADS},
        "bytes": count_bytes(config, head),
        "gflops": {
            "convention": flops["convention"],
            "seq_len": seq_len,
            "batch": batch,
            "paper_convention": flops["paper_convention"] / 1e9,
            "inference": flops["inference"] / 1e9,
            "training_forward": flops["training_forward"] / 1e9,
            "breakdown": {k: v / 1e9 for k, v in flops["breakdown"].items()},
        },
        "paper": paper,
    }


def _rel(value, paper):
    return f"{value / paper - 1:+.1%}" if paper else ""


def _rows(r: dict) -> list[tuple[str, str, str, str]]:
    """``(quantity, value, paper, relative difference)`` rows, section titles with empty cells."""
    paper = r["paper"] or {}
    counted = r["counted"]
    heads = (
        f"pooler: {counted['pooler'] or 'not counted'}; MLM head: {counted['mlm_head'] or 'not counted'}; "
        f"classifier: {'counted' if counted['classifier'] else 'not counted'}"
    )
    rows = [(f"Learned parameters (head={r['head']}; {heads})", "", "", "")]
    rows += [(f"  {name}", f"{v:,}", "", "") for name, v in r["components"].items()]
    p = paper.get("exact_params", paper.get("params"))
    rows.append(("  = learned", f"{r['learned_params']:,}", f"{p:,.0f}" if p else "", _rel(r["learned_params"], p)))
    w, without = paper.get("without_embeddings"), paper.get("without", "word_embeddings")
    for key, label in (
        ("word_embeddings", "without word embeddings"),
        ("embeddings_module", "without embeddings module"),
    ):
        v = r[f"learned_params_without_{key}"]
        pw = w if key == without else None
        rows.append((f"  {label}", f"{v:,}", f"{pw:,.0f}" if pw else "", _rel(v, pw)))
    rows.append(("  generated (materialised) weights", f"{r['generated_params']:,}", "", ""))
    rows.append(
        (
            "  as other heads count it: " + ", ".join(f"{h} {v:,}" for h, v in r["learned_params_by_head"].items()),
            "",
            "",
            "",
        )
    )
    rows.append(("Bytes (fp32 / fp16 / int8)", "", "", ""))
    for kind, label in (
        ("stored", "stored (learned)"),
        ("materialised", "materialised at load"),
        ("at_load", "RAM at load"),
    ):
        rows.append((f"  {label}", " / ".join(_size(v) for v in r["bytes"][kind].values()), "", ""))
    g = r["gflops"]
    rows.append((f"GFLOPs (batch {g['batch']}, seq {g['seq_len']}; 2 x MACs of matrix products)", "", "", ""))
    rows += [(f"  {k}", f"{v:.3f}", "", "") for k, v in g["breakdown"].items()]
    rows.append(("  inference (weights materialised)", f"{g['inference']:.3f}", "", ""))
    rows.append(("  training forward (+ weight generation)", f"{g['training_forward']:.3f}", "", ""))
    pg = paper.get("gflops")
    rows.append(
        (
            "  paper convention (see below)",
            f"{g['paper_convention']:.1f}",
            f"{pg}" if pg else "",
            _rel(g["paper_convention"], pg),
        )
    )
    return rows


def _size(n: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def render(r: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(r, indent=2)
    c = r["config"]
    title = (
        f"{r['preset'] or 'custom config'}: sharing={c['sharing']} attention={c['attention']} E={c['vocab_size']} "
        f"F={c['word_embedding_size']} V={c['hidden_size']} N={c['num_hidden_layers']} I={c['intermediate_size']} "
        f"heads={c['num_attention_heads']} positions={c['max_position_embeddings']}"
    )
    rows = _rows(r)
    source = (r["paper"] or {}).get("source")
    note = (
        "paper convention: encoder layers + input projection + pooler + the reference's untied V x V + V x E "
        "MLM head over all positions, without weight generation\n"
        + (f"paper: {source}" if source else "paper: no published figures for this configuration")
    )
    if fmt == "markdown":
        lines = [f"**{title}**", "", "| quantity | value | paper | diff |", "|---|---:|---:|---:|"]
        lines += [
            f"| {q.strip() if not v else q.replace('  ', '&nbsp;&nbsp;', 1)} | {v} | {p} | {d} |" for q, v, p, d in rows
        ]
        return "\n".join(lines + [""] + [f"_{n}_  " for n in note.splitlines()])
    width = max(len(q) for q, v, _, _ in rows if v)
    lines = [title]
    for q, v, p, d in rows:
        lines.append(q if not v else f"{q:<{width}}  {v:>28}" + (f"   paper {p} ({d})" if p else ""))
    return "\n".join(lines + [note])


def _other_architecture(model: str | None) -> bool:
    """Whether ``model`` is a folder of an encoder architecture other than sharebert's and BERT's (a teacher)."""
    from ..formats.model_folder import MODEL_TYPES, read_config

    return model is not None and read_config(model, model_types=None).get("model_type") not in MODEL_TYPES


def encoder_report(model_dir, head: str, seq_len: int, batch: int) -> dict:
    """Learned parameters (by component), bytes and GFLOPs of an encoder folder of another architecture, counted on
    the model transformers builds from its config (on the meta device; the FLOPs: :func:`_counted_gflops`): no
    weights read, nothing re-implemented (an analytic count would have to know each architecture's shared layers,
    factorised embeddings, relative positions)."""
    import torch
    import transformers

    from ..training.teacher import teacher_config

    config = teacher_config(model_dir)  # one line for a decoder, an encoder-decoder or another kind
    positions = getattr(config, "max_position_embeddings", None)
    if positions and seq_len > positions:
        raise ValueError(f"--seq-len {seq_len} exceeds the {positions} positions of {model_dir}")
    auto = getattr(
        transformers,
        {"none": "AutoModel", "mlm": "AutoModelForMaskedLM", "classifier": "AutoModelForSequenceClassification"}[head],
    )
    with torch.device("meta"):
        model = auto.from_config(config, attn_implementation="eager")
    prefix = getattr(model, "base_model_prefix", "")
    components: dict[str, int] = {}
    for name, p in model.named_parameters():  # a tied table is named once
        parts = name.split(".")
        key = parts[1] if parts[0] == prefix and len(parts) > 2 else parts[0]
        components[key] = components.get(key, 0) + p.numel()
    learned = sum(components.values())
    return {
        "model": str(model_dir),
        "model_type": config.model_type,
        "architecture": type(model).__name__,
        "head": head,
        "learned_params": learned,
        "components": components,
        "bytes": {"fp32": 4 * learned, "fp16": 2 * learned, "int8": learned},
        "gflops": _counted_gflops(auto, config, seq_len, batch),
    }


def _counted_gflops(auto, config, seq_len: int, batch: int) -> dict:
    """GFLOPs of one forward (torch's FLOP counter: 2 x MACs of the matrix products), or why not. The forward runs
    on the CPU over weights left uninitialised (transformers' ``no_init_weights``; the values do not matter, but its
    attention masks read them, which meta tensors cannot give)."""
    import contextlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from sharebert_runtime.errors import first_line

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # another transformers layout: initialised, only slower
        no_init_weights = contextlib.nullcontext
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    try:
        with no_init_weights():
            model = auto.from_config(config, attn_implementation="eager").eval()
        with FlopCounterMode(display=False) as counter:  # autograd on: DeBERTa's own softmax function needs it
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception as e:  # an architecture whose forward refuses these inputs: said, not raised
        return {"seq_len": seq_len, "batch": batch, "inference": None, "why_not": first_line(e)}
    return {"seq_len": seq_len, "batch": batch, "inference": counter.get_total_flops() / 1e9}


def render_encoder(r: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(r, indent=2)
    g = r["gflops"]
    rows = [
        (f"Learned parameters ({r['architecture']}, head={r['head']})", ""),
        *((f"  {k}", f"{v:,}") for k, v in r["components"].items()),
        ("  = learned", f"{r['learned_params']:,}"),
        ("Bytes (fp32 / fp16 / int8)", " / ".join(_size(v) for v in r["bytes"].values())),
        (
            f"GFLOPs (batch {g['batch']}, seq {g['seq_len']}; 2 x MACs of matrix products)",
            f"{g['inference']:.3f}" if g["inference"] is not None else f"not counted: {g['why_not']}",
        ),
    ]
    title = f"{r['model']}: {r['model_type']} as transformers builds it from its config (no weights read)"
    if fmt == "markdown":
        return "\n".join(
            [f"**{title}**", "", "| quantity | value |", "|---|---:|", *(f"| {q.strip()} | {v} |" for q, v in rows)]
        )
    width = max(len(q) for q, _ in rows)
    return "\n".join([title, *(f"{q:<{width}}  {v:>20}" if v else q for q, v in rows)])


def run(args) -> int:
    from ..model.shape import parse_overrides

    if args.seq_len < 1 or args.batch < 1:
        raise ValueError("--seq-len and --batch must be positive")
    if _other_architecture(args.model):
        if args.overrides:
            raise ValueError(
                f"--set shapes a ShareBERT or BERT config; {args.model} is reported as transformers "
                "builds it from its config.json"
            )
        print(render_encoder(encoder_report(args.model, args.head, args.seq_len, args.batch), args.format))
        return 0
    config, preset = load_config(args.preset, args.model, parse_overrides(args.overrides))
    print(render(build_report(config, preset, args.head, args.seq_len, args.batch), args.format))
    return 0
