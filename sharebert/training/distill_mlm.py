"""General distillation during pre-training (``distill_mlm``): the teacher's masked-LM distribution and hidden states
on text packed and masked as ``sharebert pretrain`` packs it, or on a prepared ``--data`` folder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..formats.model_folder import load_config, load_tokenizer
from .arguments import DistillArgs
from .callbacks import MarkCheckpoints
from .depth_table import check_depth_sampling
from .distill_losses import student_teacher_maps
from .distill_run import DISTILL, student_name
from .distill_teacher import check_tokenizers, load_teacher, teacher_blocks, teacher_data
from .distill_trainer import DistillTrainer, stream_training_args
from .fingerprint import data_files, run_fingerprint
from .run_skeleton import open_run


def _mlm_student(student: str, t_tok, seed: int):
    """``(model, tokenizer)`` of ``--student``: a preset built for the teacher's vocabulary (and tokenizer), or a
    model folder with its own tokenizer."""
    from ..formats.build import config_for_vocab
    from ..model.modeling_sharebert import ShareBertForMaskedLM
    from ..model.shape import PRESETS

    if not Path(student).exists() and student in PRESETS:
        torch.manual_seed(seed)
        return ShareBertForMaskedLM(config_for_vocab(student, {}, len(t_tok))), t_tok
    if Path(student).exists():
        s_tok = load_tokenizer(student, load_config(student).vocab_size)
        torch.manual_seed(seed)
        from ..formats.model_folder import load_model

        return load_model(ShareBertForMaskedLM, student)[0], s_tok
    raise ValueError(f"--student {student} is neither a model folder nor a preset ({', '.join(PRESETS)})")


def _text_blocks(train, t_tok, seq_len: int, max_train_samples, progress: bool):
    """``--train`` text tokenized by the teacher and packed into ``seq_len``-token blocks, as ``pretrain`` does."""
    from sharebert_runtime.textlines import resolve_sources

    from .corpus import encode_sources, pack

    ids = encode_sources(resolve_sources(train), t_tok, progress=progress)
    return pack(ids, seq_len, cls_id=t_tok.cls_token_id, sep_id=t_tok.sep_token_id)[:max_train_samples]


def distill_mlm(  # its keywords are `sharebert distill --objective mlm`'s flags
    teacher_dir,
    student: str,
    train,
    out,
    args: DistillArgs = DistillArgs(),
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    data=None,
) -> dict:
    """General distillation during pre-training: the teacher's MLM distribution at the masked positions as
    soft targets (plus the hidden-state terms) on ``train`` text, packed and masked as ``sharebert pretrain`` does,
    or on a ``data`` folder prepared with the teacher's tokenizer (``sharebert prepare``, memory-mapped).

    ``out`` receives the student (``ShareBertForMaskedLM``, projections dropped), its tokenizer and
    ``metrics.json`` (steps, train loss, the last value of each term).
    """
    args.weights.check_teaches()
    from .corpus import PackedDataset

    inputs = (teacher_dir, *([data] if data is not None else []), *(train or []))
    run = open_run(DISTILL, out, (*inputs, *([student] if Path(student).exists() else [])), overwrite or resume)
    out = run.out
    run.resume(resume)
    from .teacher import read_teacher, teacher_config, teacher_tokenizer

    raw = read_teacher(teacher_dir)  # any encoder architecture (training.teacher), read once
    t_config = teacher_config(teacher_dir, raw)
    t_tok = teacher_tokenizer(teacher_dir, t_config, needs=("pad", "mask"))  # masking needs its mask token
    archs = raw.get("architectures") or []
    mlm_teacher = any(a.endswith("ForMaskedLM") for a in archs)
    if not mlm_teacher:  # an encoder without an MLM head (e.g. a sentence-transformers model): no soft targets
        args = replace(args, weights=replace(args.weights, kl=0.0))
        if not (args.weights.hidden or args.weights.attention or args.weights.embedding):
            raise ValueError(
                f"{teacher_dir} has no MLM head, so only the hidden, attention and embedding terms can "
                "teach; set one of their weights above 0"
            )
    model, s_tok = _mlm_student(student, t_tok, args.seed)
    model.config.train_min_depth = check_depth_sampling(args.depth_sampling, model.config.num_hidden_layers)
    check_tokenizers(t_tok, s_tok, teacher_dir, student)
    if bool(train) == (data is not None):
        raise ValueError("--objective mlm needs --train text or --data DIR (from `sharebert prepare`), one of them")
    manifest = teacher_data(data, t_tok, teacher_dir) if data is not None else None
    teacher = load_teacher(teacher_dir, head="mlm" if mlm_teacher else "encoder", config=t_config)
    w = args.weights
    pairs, groups, projections = student_teacher_maps(model, teacher, w, args.seed)
    seq_len = min(args.seq_len, model.config.max_position_embeddings, teacher.config.max_position_embeddings)
    if manifest is not None:
        blocks = teacher_blocks(data, manifest, t_tok, seq_len, args.max_train_samples)
    else:
        blocks = _text_blocks(train, t_tok, seq_len, args.max_train_samples, progress)
    train_ds = PackedDataset.for_objective(blocks, t_tok, "mlm", seed=args.seed)
    run.start(run_fingerprint(teacher_dir, student_name(student), data_files(train, data), "mlm"))

    targs = stream_training_args(out, args, progress)
    trainer = DistillTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        processing_class=t_tok,
        teacher=teacher,
        projections=projections,
        weights=w,
        pairs=pairs,
        groups=groups,
        mlm=True,
        progress=progress,
    )
    trainer.add_callback(MarkCheckpoints(args.save_minutes, keep=2))
    if (kept := run.kept(trainer, expect=("steps", "train_loss", "train_seconds", "last_terms"))) is not None:
        return kept
    result = run.train(trainer)
    metrics = {
        "objective": "mlm",
        "steps": trainer.state.global_step,
        "train_sequences": len(train_ds),
        **trainer.trained(result),
        "seed": args.seed,
        "student": student,
        "teacher_dir": str(teacher_dir),
        "temperature": w.temperature,
        "soft_targets": mlm_teacher,
        "layer_map": [list(p) for p in pairs],
    }
    if trainer.is_world_process_zero():
        trainer.model.save_pretrained(str(out))
        t_tok.save_pretrained(str(out))
    return run.publish(trainer, metrics)  # checkpoints kept: MarkCheckpoints keeps the two newest
