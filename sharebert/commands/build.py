"""``sharebert build``: write a ready-to-train model folder from a preset."""

from __future__ import annotations

from sharebert_runtime import options as opt


def add_arguments(p):
    from ..model.shape import PRESETS

    p.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="override a config field, e.g. --set attention=symmetric (repeatable)",
    )
    p.add_argument(
        "--vocab", type=opt.path, help="WordPiece vocab.txt (default: ../shared/data/bert-base-uncased/vocab.txt)"
    )
    p.add_argument(
        "--head",
        choices=["mlm", "clm"],
        help="masked-LM or causal-LM head (default: causal for a decoder preset such as charlm-tiny, else masked)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--portable",
        action="store_true",
        help="also write the modeling code into the folder (config.json auto_map): it then loads with "
        "transformers' trust_remote_code=True where sharebert is not installed",
    )
    p.add_argument("--out", type=opt.path, required=True, help="output folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model folder")


def run(args) -> int:
    import os
    import shutil

    from sharebert_runtime.outdir import check_out_dir, check_unlisted, made_by, mark_out, seal_out

    from ..accounting.counts import count_params
    from ..formats.model_folder import is_model_folder
    from ..model.shape import parse_overrides, preset_fields

    overrides = parse_overrides(args.overrides)
    preset_fields(args.preset)  # an unknown preset fails here, before torch is imported
    out = check_out_dir(
        args.out,
        "model folder",
        made_by("build"),
        args.overwrite,
        legacy=is_model_folder,
        inputs=[args.vocab] if args.vocab else (),
    )
    if args.overwrite:  # the folder is replaced whole: a file the earlier build did not write would be lost
        check_unlisted(out, args.out, "build")
    from ..formats.build import build_model  # torch and transformers: only once the input is known to be good

    # --overwrite replaces the folder whole (no file of the old model stays, e.g. its modules.json): built
    # beside it, then swapped in; a failed build leaves the old folder as it was
    target = out
    if out.is_dir() and any(out.iterdir()):
        out = out.with_name(f".{out.name}.partial")
        shutil.rmtree(out, ignore_errors=True)
    try:
        model, tok = build_model(args.preset, out, overrides, args.vocab, args.head, args.seed)
        if args.portable:
            from ..model.modeling_sharebert import AUTO_CLASSES
            from ..model.portable import make_portable

            make_portable(out, AUTO_CLASSES)
        mark_out(out, "build")  # --overwrite replaces only a folder `build` made
    except BaseException:
        if out != target:
            shutil.rmtree(out, ignore_errors=True)
        raise
    if out != target:
        shutil.rmtree(target)
        os.replace(out, target)
        out = target
    seal_out(out)  # the marker lists what was built: the next --overwrite replaces only those
    c = model.config
    n = count_params(c)
    print(f"built {args.preset} -> {out}")
    print(
        f"  sharing={c.sharing} attention={c.attention} E={c.vocab_size} F={c.word_embedding_size} "
        f"V={c.hidden_size} N={c.num_hidden_layers} I={c.intermediate_size} heads={c.num_attention_heads}"
    )
    print(f"  learned parameters (backbone): {n['learned_params']:,}; tokenizer: {len(tok):,} tokens")
    return 0
