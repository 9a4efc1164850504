"""Language-model pre-training with the transformers ``Trainer``: ``pretrain(train, out, ...) -> metrics``.

Masked LM (dynamic 15% masking, 80/10/10, seeded per sequence and epoch; the LM head runs only at the
masked positions) or causal LM (``char_level`` builds a character tokenizer).
Defaults are the reference recipe (SPEC section 6): AdamW lr 1e-3, betas (0.9, 0.98), eps 1e-6,
weight decay 0.01, clipping 0.5, 6% warm-up then linear decay, sequence length 128; bf16 (or fp16)
on CUDA, fp32 on CPU. The same code runs on one CPU and under ``torchrun`` (gloo on CPU, nccl on GPU).

``out`` receives: ``checkpoint-N/`` (resumable, each with a completion marker), ``log.jsonl`` (one JSON
per logging step), ``tb/`` (TensorBoard), and at the end the trained model, its tokenizer and
``metrics.json``. A non-finite loss raises :class:`NonFiniteLoss` before the optimizer step, so the
last checkpoint stays the last good one; SIGINT/SIGTERM save a checkpoint and stop (status
``interrupted``); ``resume=True`` continues from the newest complete checkpoint with the same
schedule, data order and masking. ``max_time`` (seconds) ends training at the first optimizer step
after that much wall-clock time since training began (``stopped_by`` = ``max_time``), saving a
checkpoint and the model as at a normal end; the schedule still runs to ``max_steps``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

from .callbacks import (JsonlLogger, SignalCheckpoint, WallClockLimit, any_rank, checkpoints, latest_checkpoint,
                        mark_complete, remove_incomplete, rotate)
from .corpus import PackedDataset, char_tokenizer, encode_sources, load_tokenizer, pack, read_text, resolve_sources


@dataclass
class PretrainArgs:
    """The reference recipe; every field is a ``sharebert pretrain`` option. The reference batch is
    4000 sequences for 23k steps: reach it with ``batch_size`` x ``grad_accum`` x processes."""

    objective: str = "mlm"  # mlm | clm
    char_level: bool = False
    max_steps: int = 23000
    max_time: float | None = None  # seconds of training (this process, since train begin) before stopping
    batch_size: int = 32  # per process
    grad_accum: int = 1
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 0.5
    warmup_ratio: float = 0.06
    seq_len: int | None = None  # None: 128 (capped by the model), or the model's block size when char_level
    mlm_probability: float = 0.15
    valid_fraction: float = 0.1  # held out from the end of the train stream when no valid files are given
    max_eval_sequences: int | None = None
    save_steps: int = 1000
    eval_steps: int = 1000
    logging_steps: int = 50
    keep_checkpoints: int | None = 3
    precision: str = "auto"  # auto (bf16/fp16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    seed: int = 0
    resume: bool = False
    progress: bool = True
    dataloader_workers: int = 0
    overrides: dict = field(default_factory=dict)  # config fields for a preset build


class NonFiniteLoss(RuntimeError):
    """Training stopped on a NaN/inf loss; ``step`` is the optimizer step that produced it."""

    def __init__(self, step: int, loss: float, checkpoint: Path | None):
        self.step, self.loss, self.checkpoint = step, loss, checkpoint
        where = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was saved before it"
        super().__init__(f"loss became {loss} at step {step}; training stopped before the update, {where} "
                         f"(lower --lr, or check the data)")


class _MaskEpoch(TrainerCallback):
    """Tells the training set which epoch starts (before its data loader is iterated) for fresh masks."""

    def __init__(self, dataset: PackedDataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


class PretrainTrainer(Trainer):
    """``Trainer`` that stops on a non-finite loss, logs perplexity and marks finished checkpoints."""

    keep_checkpoints: int | None = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if any_rank(not torch.isfinite(loss).item(), self.args.device):
            raise NonFiniteLoss(self.state.global_step + 1, loss.item(), latest_checkpoint(self.args.output_dir))
        return loss

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None or self.args.world_size == 1 or self.args.device.type != "cpu":
            return super()._load_optimizer_and_scheduler(checkpoint)
        # Trainer maps the optimizer state to args.device, "cpu:0" under CPU DDP, which torch.load rejects.
        self.optimizer.load_state_dict(torch.load(Path(checkpoint) / "optimizer.pt", map_location="cpu", weights_only=True))
        self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=True))

    def log(self, logs: dict, start_time=None) -> None:
        if "eval_loss" in logs:
            logs["eval_perplexity"] = perplexity(logs["eval_loss"])
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every rank has written its files (rng states)
        if self.args.should_save:
            mark_complete(Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}", self.state.global_step)
            rotate(self.args.output_dir, self.keep_checkpoints)
        self.accelerator.wait_for_everyone()


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def build_char_model(preset: str, out: str | Path, text: str, overrides: dict | None = None, seed: int = 0):
    """A ``ShareBertForCausalLM`` folder with a character tokenizer over the characters of ``text``."""
    from ..build import config_for_vocab
    from ..modeling_sharebert import ShareBertForCausalLM

    tokenizer = char_tokenizer(text)
    config = config_for_vocab(preset, overrides or {}, len(tokenizer))
    tokenizer.model_max_length = config.max_position_embeddings
    torch.manual_seed(seed)
    model = ShareBertForCausalLM(config)
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter (fp32 bytes, by name): equal digests mean identical replicas."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _check_args(a: PretrainArgs, model_dir, preset) -> None:
    if (model_dir is None) == (preset is None) and not (a.char_level and model_dir is None):
        raise ValueError("give exactly one of --model DIR or --preset NAME")
    if a.objective not in ("mlm", "clm"):
        raise ValueError(f"objective must be mlm or clm, got {a.objective!r}")
    if a.char_level and a.objective != "clm":
        raise ValueError("--char-level trains a causal LM: add --objective clm")
    for name in ("max_steps", "batch_size", "grad_accum", "save_steps", "eval_steps", "logging_steps"):
        if getattr(a, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(a, name)}")
    if not (a.lr > 0 and 0 <= a.valid_fraction < 1 and 0 < a.mlm_probability < 1):
        raise ValueError("need lr > 0, 0 <= valid_fraction < 1 and 0 < mlm_probability < 1")
    if a.max_time is not None and not a.max_time > 0:
        raise ValueError(f"max_time must be a positive number of seconds, got {a.max_time}")
    if a.precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {a.precision!r}")


def _precision(a: PretrainArgs) -> dict:
    cuda = torch.cuda.is_available()
    want = a.precision
    if want == "auto":
        want = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    if want != "fp32" and not cuda:
        raise ValueError(f"{want} training needs a CUDA GPU; use precision fp32 on CPU")
    return {"bf16": want == "bf16", "fp16": want == "fp16"}


def _training_args(a: PretrainArgs, out: Path, has_eval: bool) -> TrainingArguments:
    cuda = torch.cuda.is_available()
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1  # set by torchrun
    return TrainingArguments(
        output_dir=str(out), overwrite_output_dir=True, max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum, learning_rate=a.lr, adam_beta1=a.betas[0], adam_beta2=a.betas[1],
        adam_epsilon=a.eps, weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm,
        lr_scheduler_type="linear", warmup_ratio=a.warmup_ratio,
        logging_steps=a.logging_steps, logging_first_step=True, logging_nan_inf_filter=False,
        logging_dir=str(out / "tb"), report_to=["tensorboard"],
        eval_strategy="steps" if has_eval else "no", eval_steps=a.eval_steps, eval_on_start=has_eval,
        save_strategy="steps", save_steps=a.save_steps, save_total_limit=None,  # rotation after the marker
        seed=a.seed, data_seed=a.seed, use_cpu=not cuda, ddp_backend="gloo" if multi and not cuda else None,
        ddp_find_unused_parameters=False, dataloader_num_workers=a.dataloader_workers,
        remove_unused_columns=False, disable_tqdm=not a.progress, **_precision(a),
    )


def _prepare_model_dir(a: PretrainArgs, out: Path, model_dir, preset, vocab, train_sources) -> Path:
    """The folder to start from; with a preset, build it into ``out`` (unless resuming a built one)."""
    if model_dir is not None:
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir} is not a model folder (no config.json); build one with `sharebert build`")
        return model_dir
    if (out / "config.json").is_file():
        if a.resume:
            return out
        raise ValueError(f"{out} already holds a model; pass --resume to continue it or choose another --out")
    if a.char_level:
        build_char_model(preset, out, read_text(train_sources), a.overrides, a.seed)
    else:
        from ..build import build_model

        build_model(preset, out, a.overrides, vocab, head=a.objective, seed=a.seed)
    return out


def _datasets(a: PretrainArgs, tokenizer, train_sources, valid_sources, seq_len: int):
    ids = encode_sources(train_sources, tokenizer, a.char_level, progress=a.progress)
    if valid_sources:
        valid_ids = encode_sources(valid_sources, tokenizer, a.char_level, progress=a.progress)
    elif a.valid_fraction > 0:
        cut = int(round(ids.size * (1 - a.valid_fraction)))
        ids, valid_ids = ids[:cut], ids[cut:]
    else:
        valid_ids = None
    wrap = {} if a.objective == "clm" else {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id}
    lm = dict(tokenizer=tokenizer, objective=a.objective, probability=a.mlm_probability, seed=a.seed)
    train = PackedDataset.for_objective(pack(ids, seq_len, **wrap), **lm)
    if valid_ids is None:
        return train, None
    blocks = pack(valid_ids, seq_len, **wrap)[: a.max_eval_sequences]
    return train, PackedDataset.for_objective(blocks, **lm, fixed=True)


def _publish(trainer: Trainer, out: Path) -> None:
    """Save the final model and tokenizer into ``out``: written to a temp folder, then renamed in."""
    tmp = out / ".final-tmp"
    if trainer.args.should_save:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(tmp))
    if trainer.args.should_save:
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
        tmp.rmdir()
    trainer.accelerator.wait_for_everyone()


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def pretrain(train, out, model_dir=None, preset: str | None = None, valid=None, args: PretrainArgs | None = None,
             vocab=None, callbacks=None) -> dict:
    """Pre-train ``model_dir`` (or a fresh ``preset`` built into ``out``) on the ``train`` sources.

    Returns the final metrics (also in ``out/metrics.json``): ``status`` (completed | interrupted),
    ``stopped_by`` (max_steps | max_time | signal),
    ``global_step``, ``train_loss`` (mean over the run), ``last_loss``, ``eval_loss``,
    ``eval_perplexity``, ``train_tokens``, ``train_runtime``, ``world_size``, ``param_sha256`` (one
    per process; all equal after a correct distributed run), ``checkpoint``.
    """
    from ..modeling_sharebert import ShareBertForCausalLM, ShareBertForMaskedLM
    from ..paths import data_path

    a = args or PretrainArgs()
    if a.char_level and preset is None and model_dir is None:
        preset = "charlm-6l"
    _check_args(a, model_dir, preset)
    out = Path(out)
    train = train or ([data_path("tinyshakespeare", "input.txt")] if a.char_level else None)
    if not train:
        raise ValueError("give at least one --train file")
    train_sources = resolve_sources(train)
    valid_sources = resolve_sources(valid) if valid else []
    done = checkpoints(out)
    if done and not a.resume:
        raise ValueError(f"{out} already holds checkpoints ({done[-1][1].name}); pass --resume or choose another --out")

    out.mkdir(parents=True, exist_ok=True)
    probe = _training_args(a, out, has_eval=False)  # sets up the process group under torchrun
    with probe.main_process_first(desc="prepare the model folder"):
        if probe.should_save and a.resume:
            remove_incomplete(out)
        model_dir = _prepare_model_dir(a, out, model_dir, preset, vocab, train_sources)
    from ..configuration_sharebert import ShareBertConfig

    config = ShareBertConfig.from_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir, config.vocab_size, a.objective)
    seq_len = a.seq_len or (config.max_position_embeddings if a.char_level else min(128, config.max_position_embeddings))
    if seq_len > config.max_position_embeddings:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_position_embeddings {config.max_position_embeddings}")
    train_ds, eval_ds = _datasets(a, tokenizer, train_sources, valid_sources, seq_len)

    model = (ShareBertForCausalLM if a.objective == "clm" else ShareBertForMaskedLM).from_pretrained(model_dir)
    if a.objective == "mlm":  # the head runs only at masked positions in training: same loss, ~1/6 of its work
        model.config.mlm_logits_in_training = "masked"
    targs = _training_args(a, out, has_eval=eval_ds is not None)
    stopper = SignalCheckpoint()
    clock = [WallClockLimit(a.max_time)] if a.max_time else []
    trainer = PretrainTrainer(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
                              data_collator=default_data_collator, processing_class=tokenizer,
                              callbacks=[_MaskEpoch(train_ds), JsonlLogger(out / "log.jsonl"), stopper, *clock,
                                         *(callbacks or [])])
    trainer.keep_checkpoints = a.keep_checkpoints
    resume_from = latest_checkpoint(out) if a.resume else None
    if a.resume and targs.should_save:
        print(f"resuming from {resume_from}" if resume_from else f"no complete checkpoint in {out}; starting from step 0")
    try:
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    finally:
        stopper.restore()

    interrupted = stopper.received is not None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics = {
        "status": "interrupted" if interrupted else "completed",
        "signal": stopper.received,
        "stopped_by": "signal" if interrupted else "max_time" if clock and clock[0].reached else "max_steps",
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "last_loss": losses[-1] if losses else None,
        "train_tokens": trainer.state.global_step * a.batch_size * a.grad_accum * targs.world_size * seq_len,
        "train_runtime": result.metrics.get("train_runtime"),
        "seq_len": seq_len,
        "train_sequences": len(train_ds),
        "valid_sequences": len(eval_ds) if eval_ds is not None else 0,
        "world_size": targs.world_size,
        "args": {k: v for k, v in asdict(a).items() if k != "progress"},
    }
    if eval_ds is not None and not interrupted:
        last = [h for h in trainer.state.log_history if "eval_loss" in h]
        ev = last[-1] if last and last[-1]["step"] == trainer.state.global_step else trainer.evaluate()
        metrics.update(eval_loss=ev["eval_loss"], eval_perplexity=perplexity(ev["eval_loss"]))
    digest = param_digest(trainer.model)
    if targs.world_size > 1:
        digests = [None] * targs.world_size
        torch.distributed.all_gather_object(digests, digest)
    else:
        digests = [digest]
    metrics["param_sha256"] = digests
    if not interrupted:
        _publish(trainer, out)
    ckpt = latest_checkpoint(out)
    metrics["checkpoint"] = str(ckpt) if ckpt else None
    if targs.should_save:
        _write_json(out / "metrics.json", metrics)
    return metrics
