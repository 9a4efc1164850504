"""Language-model pre-training with the transformers ``Trainer``: ``pretrain(train, out, ...) -> metrics``.

Masked LM (dynamic 15% masking, 80/10/10, seeded per sequence and epoch; the LM head runs only at the
masked positions) or causal LM (``char_level`` builds a character tokenizer).
Defaults are the reference recipe (SPEC section 6): AdamW lr 1e-3, betas (0.9, 0.98), eps 1e-6,
weight decay 0.01, clipping 0.5, 6% warm-up then linear decay, sequence length 128; bf16 (or fp16)
on CUDA, fp32 on CPU. The same code runs on one CPU and under ``torchrun`` (gloo on CPU, nccl on GPU).

Text comes from ``train`` sources (tokenized in memory) or from a ``data`` folder made by ``sharebert
prepare`` (memory-mapped shards: each process reads only the sequences of its share of each batch).
``out`` receives: ``checkpoint-N/`` (resumable, each with a completion marker holding its files'
SHA-256), ``log.jsonl`` (one JSON per logging step and evaluation, with ``eval_runtime``), ``tb/``
(TensorBoard), and at the end the trained model, its tokenizer and ``metrics.json``. A non-finite loss
raises :class:`NonFiniteLoss` before the optimizer step, so the last checkpoint stays the last good
one; SIGINT/SIGTERM save a checkpoint of the last complete step and stop (status ``interrupted``),
also from inside an evaluation; before training starts they raise :class:`StopRequested`.
``resume=True`` continues from the newest intact checkpoint with the same schedule, data order and masking. ``max_time``
(seconds) ends training at the first optimizer step after that much wall-clock time since training began (``stopped_by``
= ``max_time``), saving a checkpoint and the model as at a normal end; the schedule still runs to ``max_steps``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

from sharebert_runtime.outdir import MARK, OutLock, file_fingerprint, rank, seal_out, world_size, write_json
from sharebert_runtime.textlines import resolve_sources

from ..accounting.curves import write_curves
from ..formats.model_folder import UNFINISHED, is_bert_folder, read_config, save_as_bert
from ..model.shape import preset_fields
from .arguments import PretrainArgs
from .callbacks import (
    JsonlLogger,
    NonFiniteLoss,  # its home is callbacks (finetune and distill stop on it too); commands.pretrain imports it here
    SignalCheckpoint,
    StopRequested,
    StopsAtMaxSteps,
    TensorBoardLogs,
    TimedSaves,
    WallClockLimit,
    any_rank,
    checkpoints,
    latest_checkpoint,
    mark_complete,
    remove_incomplete,
    resume_checkpoint,
    rotate,
    save_checkpoint,
)
from .corpus import PackedDataset, char_tokenizer, encode_sources, pack, read_text, sniff_text
from .depth_table import check_depth_sampling
from .log_lines import no_bars, show_progress
from .run_skeleton import RunKind, TrainingRun, open_run
from .shards import MANIFEST, StreamBlocks, TokenStream, read_manifest, vocab_sha256

LOSSES = "sharebert_losses.json"  # in each checkpoint: the run's loss sum so far, for metrics after a resume
EVAL_BATCH = 8  # evaluation scores every position: (B, T, V) fp32 logits, ~125 MB per sequence-batch of 8 at V=30528
RUN_FILES = ("log.jsonl", "metrics.json", "config.json")  # what a pretrain run's --out holds, by name
COMMAND = "pretrain"  # the marker's command (``outdir.MARK``): a folder is a pretrain run only when it says so


class _MaskEpoch(TrainerCallback):
    """Tells the training set which epoch starts (before its data loader is iterated) for fresh masks."""

    def __init__(self, dataset: PackedDataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


class PretrainTrainer(StopsAtMaxSteps, Trainer):
    """``Trainer`` that stops on a non-finite loss, logs perplexity, marks finished checkpoints and keeps
    the loss sum of the whole run (across resumes) for ``metrics.json``. ``keep_checkpoints``: the newest
    checkpoints kept (None: all); ``save_minutes``: a checkpoint at least that often (``TimedSaves``); ``progress``:
    the progress display (``show_progress``; None leaves the Trainer's own); ``resume_from``: the checkpoint whose
    loss sum the run continues (None: a new run)."""

    def __init__(
        self,
        *args,
        keep_checkpoints: int | None = None,
        save_minutes: float | None = None,
        progress: bool | None = None,
        resume_from: Path | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.keep_checkpoints = keep_checkpoints
        self.saved_step = 0
        self.before = {"loss_sum": 0.0, "last_loss": None, "step": 0}  # from the checkpoint resumed
        self._sum, self._micro = 0.0, []  # this process, since this run began
        self.add_callback(_MarkPretrainCheckpoints(self, save_minutes))
        if progress is not None:
            show_progress(self, progress)
        self.resumed_from(resume_from)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        value = loss.item()
        if any_rank(not math.isfinite(value), self.args.device):
            raise NonFiniteLoss(self.state.global_step + 1, value, latest_checkpoint(self.args.output_dir))
        self._sum += value
        self._micro = (self._micro + [value])[-self.args.gradient_accumulation_steps :]
        return loss

    def resumed_from(self, checkpoint: Path | None) -> None:
        if checkpoint is not None:
            self.before = json.loads((checkpoint / LOSSES).read_text())
            self.saved_step = self.before["step"]

    def run_losses(self) -> dict:
        """``loss_sum`` over every step of the run so far (mean over processes), ``last_loss``, ``step``."""
        t = torch.tensor([self._sum, sum(self._micro)], dtype=torch.float64, device=self.args.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(t)
            t /= torch.distributed.get_world_size()
        ran = self.state.global_step > self.before["step"]
        return {
            "loss_sum": self.before["loss_sum"] + t[0].item(),
            "step": self.state.global_step,
            "last_loss": t[1].item() if ran else self.before["last_loss"],
        }

    def log(self, logs: dict, start_time=None) -> None:
        if "eval_loss" in logs:
            logs["eval_perplexity"] = perplexity(logs["eval_loss"])
        if "train_loss" in logs and self.state.global_step:  # Trainer's counts only this process's steps since a resume
            logs["train_loss"] = self.run_losses()["loss_sum"] / self.state.global_step
        super().log(logs, start_time)


class _MarkPretrainCheckpoints(TimedSaves):
    """:class:`TimedSaves` that, once the Trainer has saved a checkpoint (``on_save``, on every rank), adds the run's
    loss sum (``LOSSES``), writes the completion marker and rotates (``--keep-checkpoints``)."""

    def __init__(self, trainer: PretrainTrainer, minutes: float | None):
        super().__init__(minutes)
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        trainer = self.trainer
        trainer.accelerator.wait_for_everyone()  # every rank has written its files (rng states)
        losses = trainer.run_losses()  # an all-reduce: every rank calls it
        if args.should_save:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / LOSSES).write_text(json.dumps(losses))
            mark_complete(folder, state.global_step)
            rotate(args.output_dir, trainer.keep_checkpoints)
        trainer.saved_step = state.global_step
        trainer.accelerator.wait_for_everyone()


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter (fp32 bytes, by name): equal digests mean identical replicas."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _check_args(a: PretrainArgs, model_dir, preset, train, data) -> None:
    """Where the model and the text come from (one of each), then the settings."""
    if (model_dir is None) == (preset is None) and not (a.char_level and model_dir is None):
        raise ValueError("give exactly one of --model DIR or --preset NAME")
    if model_dir is not None and a.overrides:
        raise ValueError(
            "--set changes a --preset build; a --model folder's config.json is its shape "
            "(build a new folder with `sharebert build --set ...` instead)"
        )
    if "train_min_depth" in a.overrides:
        raise ValueError("train with --depth-sampling MIN, not --set train_min_depth")
    if data is not None and train:
        raise ValueError("give --train (text, tokenized now) or --data (a `sharebert prepare` folder), not both")
    if data is not None and a.char_level:
        raise ValueError("--char-level tokenizes its text itself: give --train, not --data")
    _check_settings(a)


def _check_settings(a: PretrainArgs) -> None:
    """The training settings: counts, rates, objective and precision within their ranges."""
    if a.keep_checkpoints is not None and a.keep_checkpoints < 1:
        raise ValueError(
            f"keep_checkpoints must be at least 1 (the newest checkpoint is always kept), got {a.keep_checkpoints}"
        )
    if a.max_eval_sequences is not None and a.max_eval_sequences < 1:
        raise ValueError(f"eval_samples must be at least 1, got {a.max_eval_sequences}")
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
    multi = world_size() > 1  # set by torchrun
    return TrainingArguments(
        output_dir=str(out),
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=min(a.batch_size, EVAL_BATCH),
        gradient_accumulation_steps=a.grad_accum,
        learning_rate=a.lr,
        adam_beta1=a.betas[0],
        adam_beta2=a.betas[1],
        adam_epsilon=a.eps,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        # warmup_ratio's steps as transformers 4 counted them (5 dropped the option; a float warmup_steps is a ratio)
        lr_scheduler_type="linear",
        warmup_steps=math.ceil(a.max_steps * a.warmup_ratio),
        logging_steps=a.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,
        report_to="none",  # TensorBoard through TensorBoardLogs (out/tb: transformers 5 has no logging_dir)
        prediction_loss_only=True,  # evaluation keeps the loss, never every batch's (B, T, V) logits
        eval_strategy="steps" if has_eval else "no",
        eval_steps=a.eval_steps,
        eval_on_start=has_eval and a.eval_on_start,
        save_strategy="steps",
        save_steps=a.save_steps,
        save_total_limit=None,  # rotation after the marker
        seed=a.seed,
        data_seed=a.seed,
        use_cpu=not cuda,
        ddp_backend="gloo" if multi and not cuda else None,
        # sampled depths leave the skipped layers' biases and norms without gradients
        ddp_find_unused_parameters=a.depth_sampling is not None,
        dataloader_num_workers=a.dataloader_workers,
        remove_unused_columns=False,
        disable_tqdm=no_bars(a.progress),
        **_precision(a),
    )


def _looks_like_run(folder: Path) -> bool:
    """A folder holding what a pretrain run writes (its log, metrics, model or checkpoints), by name:
    ``check_out_dir``'s ``legacy``, asked only where no marker of this command vouches for the folder (written by
    hand, by another tool, or copied): refused naming the marker, never resumed into."""
    return any((folder / name).exists() for name in RUN_FILES) or bool(checkpoints(folder))


PRETRAIN = RunKind("pretrain run", COMMAND, _looks_like_run, checkpoints="")  # its checkpoints: in --out itself


def _check_out(out: Path, a: PretrainArgs, inputs) -> TrainingRun:
    """One-line errors for an unusable ``--out``, before any work; run once, before any rank writes. The folder is
    a pretrain run's only by its marker (``outdir.made_by``), never by the names of what it holds."""
    run = open_run(PRETRAIN, out, inputs, replace=True)
    if a.resume:  # our own run (or an empty folder): --resume decides
        return run
    done = checkpoints(out)
    if done:
        raise ValueError(f"{out} already holds checkpoints ({done[-1][1].name}); pass --resume or choose another --out")
    if (out / "config.json").is_file():
        raise ValueError(f"{out} already holds a model; pass --resume to continue it or choose another --out")
    if out.is_dir() and any(p.name not in (OutLock.NAME, UNFINISHED, MARK) for p in out.iterdir()):
        raise ValueError(f"{out} already holds a pretrain run; pass --resume to continue it or choose another --out")
    return run


def _fingerprint(r: _Run) -> dict:
    """What a ``--resume`` must find unchanged (``outdir.check_same_run``): the model started from (its files, or
    the preset and its overrides), the training files and the objective."""
    from .fingerprint import teacher_fingerprint

    if r.model_dir is not None:
        model = teacher_fingerprint(r.model_dir)
    else:
        model = f"{r.preset} {json.dumps(r.a.overrides, sort_keys=True)}"
    files = [Path(r.data) / MANIFEST] if r.data is not None else r.train_sources
    data = [f"{Path(f).name}:{file_fingerprint(f)}" for f in files if isinstance(f, Path) and f.is_file()]
    return {"model": model, "data": data, "objective": f"{r.a.objective}{' char-level' if r.a.char_level else ''}"}


def _mark(r: _Run) -> None:
    """Rank 0, once every rank checked ``--out`` and before the run's first write there: a ``--resume`` of
    another run refused (its fingerprint), then ``out`` marked this command's (sealed when the run finishes)."""
    r.run.start(_fingerprint(r), resume=r.a.resume, restart="choose another --out")  # pretrain has no --overwrite


def _prepare_model_dir(r: _Run) -> Path:
    """The folder to start from; with a preset, build it into ``out`` (unless resuming a built one)."""
    a, out, model_dir, preset, vocab, data = r.a, r.out, r.model_dir, r.preset, r.vocab, r.data
    if model_dir is not None:
        return Path(model_dir)
    if (out / "config.json").is_file():
        return out  # --resume of a run that built its preset (checked once in _check_out)
    from ..formats.build import build_model

    if a.char_level:  # a character tokenizer over the training text
        build_model(
            preset, out, a.overrides, head="clm", seed=a.seed, tokenizer=char_tokenizer(read_text(r.train_sources))
        )
        return out

    if data is not None and vocab is None:
        vocab = Path(data) / "tokenizer" / "vocab.txt"
        if not vocab.is_file():
            raise ValueError(f"{data}'s tokenizer has no vocab.txt to build --preset {preset} from; give --vocab")
    build_model(preset, out, a.overrides, vocab, head=a.objective, seed=a.seed)
    return out


def load_model_folder(model_dir: Path, objective: str, unfinished_ok: bool = False):
    """``(config, tokenizer, model)`` of the folder training starts from (its config is the model's shape; a
    transformers BERT folder is BERT); the tokenizer is checked against the config before the weights load.
    ``unfinished_ok``: the folder is the run's own ``--out``, being resumed."""
    from ..formats.model_folder import load_config, load_model, load_tokenizer
    from ..model.modeling_sharebert import ShareBertForCausalLM, ShareBertForMaskedLM

    config = load_config(model_dir, unfinished_ok)
    tokenizer = load_tokenizer(model_dir, config.vocab_size, ("mask", "cls", "sep") if objective == "mlm" else ())
    model, _ = load_model(
        ShareBertForCausalLM if objective == "clm" else ShareBertForMaskedLM, model_dir, config, unfinished_ok
    )
    return config, tokenizer, model


def _datasets(a: PretrainArgs, tokenizer, train_sources, valid_sources, seq_len: int, stop):
    ids = encode_sources(train_sources, tokenizer, a.char_level, progress=a.progress, stop=stop)
    if valid_sources:
        valid_ids = encode_sources(valid_sources, tokenizer, a.char_level, progress=a.progress, stop=stop)
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
    held = (
        "the validation text (--valid)"
        if valid_sources
        else f"the held-out end of --train (--valid-fraction {a.valid_fraction:g})"
    )
    blocks = pack(valid_ids, seq_len, **wrap, what=held)[: a.max_eval_sequences]
    return train, PackedDataset.for_objective(blocks, **lm, fixed=True)


def _prepared_datasets(a: PretrainArgs, tokenizer, data: Path, manifest: dict, seq_len: int):
    """Train and validation sets read from memory-mapped shards. Without a valid split, the last
    ``valid_fraction`` of the train sequences is held out; at most ``max_eval_sequences`` are scored."""
    wrap = {} if a.objective == "clm" else {"cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id}
    lm = dict(tokenizer=tokenizer, objective=a.objective, probability=a.mlm_probability, seed=a.seed)
    stream = TokenStream(data, manifest, "train")
    if "valid" in manifest["splits"]:
        held = 0
        valid = StreamBlocks(TokenStream(data, manifest, "valid"), seq_len, count=a.max_eval_sequences, **wrap)
    else:
        total = StreamBlocks.sequences(stream, seq_len, bool(wrap))
        held = int(round(total * a.valid_fraction))
        valid = (
            StreamBlocks(stream, seq_len, total - held, min(held, a.max_eval_sequences or held), **wrap)
            if held
            else None
        )
    train = StreamBlocks(stream, seq_len, count=StreamBlocks.sequences(stream, seq_len, bool(wrap)) - held, **wrap)
    train_ds = PackedDataset.for_objective(train, **lm)
    return train_ds, PackedDataset.for_objective(valid, **lm, fixed=True) if valid is not None else None


def _publish(trainer: Trainer, out: Path, as_bert: bool = False) -> None:
    """Save the final model and tokenizer into ``out``: written to a temp folder, then renamed in.
    ``as_bert``: as a transformers BERT folder (``model_folder.save_as_bert``)."""
    tmp = out / ".final-tmp"
    if trainer.args.should_save:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(tmp))
    if trainer.args.should_save and as_bert:
        save_as_bert(trainer.model, tmp)
    if trainer.args.should_save:
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
        tmp.rmdir()
    trainer.accelerator.wait_for_everyone()


def pretrain(  # its keywords are `sharebert pretrain`'s inputs (the settings are ``args``) and a caller's callbacks
    train,
    out,
    model_dir=None,
    preset: str | None = None,
    valid=None,
    args: PretrainArgs | None = None,
    vocab=None,
    callbacks=None,
    data=None,
) -> dict:
    """Pre-train ``model_dir`` (or a fresh ``preset`` built into ``out``) on the ``train`` sources or on
    a prepared ``data`` folder (``sharebert prepare``).

    Returns the final metrics (also in ``out/metrics.json``): ``status`` (completed | interrupted),
    ``stopped_by`` (max_steps | max_time | signal), ``global_step``, ``train_loss`` (mean over every
    step of the run, resumed parts included), ``last_loss`` (the last step's), ``eval_loss``,
    ``eval_perplexity``, ``train_tokens``, ``train_runtime`` (this process), ``train_seconds`` (the
    whole run's, resumes included, where ``--max-time`` keeps the count), ``world_size``, ``param_sha256`` (one
    per process; all equal after a correct distributed run), ``checkpoint``. Bad input raises
    ``ValueError`` / ``FileNotFoundError`` before anything is written (an ``out`` this call created is removed).
    """
    a = args or PretrainArgs()
    if a.char_level and preset is None and model_dir is None:
        preset = "charlm-6l"
    _check_args(a, model_dir, preset, train, data)
    out = Path(out)
    manifest, train_sources, valid_sources = _sources(a, train, valid, data)
    if model_dir is not None:
        layers = read_config(model_dir).get(
            "num_hidden_layers"
        )  # a damaged or foreign config.json, an artifact: one line now
    else:
        layers = preset_fields(preset, **a.overrides)["num_hidden_layers"]
    check_depth_sampling(a.depth_sampling, layers)
    # --model and --data are folders even when given as strings; a source given as a string is a dataset name
    inputs = [Path(p) for p in (model_dir, data) if p is not None] + [
        p for p in (*train_sources, *valid_sources) if not isinstance(p, str)
    ]
    checked = _check_out(out, a, inputs)
    created = not out.exists()
    rank0 = rank() == 0
    with SignalCheckpoint() as stopper:
        run = _Run(
            a, checked, model_dir, preset, vocab, train_sources, valid_sources, data, manifest, stopper, callbacks or []
        )
        try:
            if rank0:
                out.mkdir(parents=True, exist_ok=True)
            with OutLock(out, COMMAND) if rank0 else contextlib.nullcontext():  # one run at a time per --out
                metrics = _run(run)
                if rank0 and metrics["status"] == "completed":
                    seal_out(out)  # the marker lists what the run wrote: the folder is ours while they are unchanged
                return metrics
        except (ValueError, FileNotFoundError):
            if created and not run.training and rank() == 0:
                shutil.rmtree(out, ignore_errors=True)  # failed before training: leave no half-made --out
            raise


def _sources(a: PretrainArgs, train, valid, data) -> tuple[dict | None, list, list]:
    """The prepared ``data`` folder's manifest, or the ``train`` and ``valid`` sources (the character model's
    default: tinyshakespeare), each local file checked to be text."""
    from ..formats.paths import data_path

    if data is not None:
        return read_manifest(data), [], []
    train = train or ([data_path("tinyshakespeare", "input.txt")] if a.char_level else None)
    if not train:
        raise ValueError("give --train files or --data DIR (from `sharebert prepare`)")
    train_sources = resolve_sources(train)
    valid_sources = resolve_sources(valid) if valid else []
    for src in train_sources + valid_sources:
        if not isinstance(src, str):
            sniff_text(src)
    return None, train_sources, valid_sources


@dataclass
class _Run:
    """What one pretrain run is given, after the checks of :func:`pretrain`. ``training``: set once training
    starts (a failure after that keeps ``out``); ``seq_len``: set once the model is read; ``clock``: ``--max-time``'s
    (empty without one), set with the trainer."""

    a: PretrainArgs
    run: TrainingRun
    model_dir: object
    preset: str | None
    vocab: object
    train_sources: list
    valid_sources: list
    data: object
    manifest: dict | None
    stopper: SignalCheckpoint
    callbacks: list
    training: bool = False
    seq_len: int = 0
    clock: list = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.run.out


def _run(r: _Run) -> dict:
    a, out = r.a, r.out
    out.mkdir(parents=True, exist_ok=True)
    resume_from, model_dir = _prepare(r)
    config, tokenizer, model = load_model_folder(model_dir, a.objective, unfinished_ok=Path(model_dir) == out)
    as_bert = is_bert_folder(model_dir) and not a.convert_to_sharebert  # BERT in, BERT out
    model.config.train_min_depth = a.depth_sampling  # the option decides, whatever the folder held
    seq_len = a.seq_len or (
        config.max_position_embeddings if a.char_level else min(128, config.max_position_embeddings)
    )
    if seq_len > config.max_position_embeddings:
        raise ValueError(
            f"seq_len {seq_len} exceeds the model's max_position_embeddings {config.max_position_embeddings}"
        )
    r.seq_len = seq_len
    train_ds, eval_ds = _load_datasets(r, tokenizer, model_dir, seq_len)
    if a.objective == "mlm":  # the head runs only at masked positions in training: same loss, ~1/6 of its work
        model.config.mlm_logits_in_training = "masked"
    trainer = _make_trainer(r, model, tokenizer, train_ds, eval_ds)
    targs = trainer.args
    if (
        kept := r.run.kept(
            trainer,
            expect=("status", "global_step", "train_loss", "param_sha256"),
            published=not (out / UNFINISHED).exists(),
            say=print if targs.should_save else lambda m: None,
        )
    ) is not None:
        return kept
    r.training = True
    if targs.should_save:  # until the trained model is saved, out's model (a preset's, an earlier run's) is not it
        write_json(out / UNFINISHED, {"status": "training", "pid": os.getpid()})
    runtime, ev = _train(trainer, r.stopper, eval_ds, resume_from)
    metrics = _metrics(trainer, r, runtime, train_ds, eval_ds, ev)
    if r.stopper.received is None:
        _publish(trainer, out, as_bert)
        if targs.should_save:
            (out / UNFINISHED).unlink(missing_ok=True)
    ckpt = latest_checkpoint(out)
    metrics["checkpoint"] = str(ckpt) if ckpt else None
    if targs.should_save:
        write_curves(out, metrics)
        write_json(out / "metrics.json", metrics)
    return metrics


def _prepare(r: _Run):
    """The checkpoint to resume from (None: none) and the model folder to train (``_prepare_model_dir``), made by
    the main process first; every rank has checked ``--out`` before."""
    probe = _training_args(r.a, r.out, has_eval=False)  # sets up the process group under torchrun
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank checked --out before rank 0 builds into it
    resume_from = None
    with probe.main_process_first(desc="prepare the model folder"):
        if probe.should_save:
            _mark(r)
        if r.a.resume:
            if probe.should_save:
                remove_incomplete(r.out)
            resume_from = resume_checkpoint(r.out, say=print if probe.should_save else lambda m: None)
            r.run.start_from = resume_from
        model_dir = _prepare_model_dir(r)
    return resume_from, model_dir


def _load_datasets(r: _Run, tokenizer, model_dir, seq_len: int):
    """The training and evaluation sets (None: no evaluation) from the prepared folder, which must have been
    tokenized by the model's tokenizer, or from the sources."""
    if r.manifest is None:
        return _datasets(r.a, tokenizer, r.train_sources, r.valid_sources, seq_len, r.stopper.check)
    want = r.manifest["tokenizer"]
    if vocab_sha256(tokenizer) != want["vocab_sha256"]:
        raise ValueError(
            f"--data {r.data} was prepared with another tokenizer ({want['vocab_size']} tokens) than "
            f"{model_dir}'s ({len(tokenizer)} tokens, a different vocabulary); "
            f"prepare it with --tokenizer {model_dir}"
        )
    return _prepared_datasets(r.a, tokenizer, Path(r.data), r.manifest, seq_len)


def _make_trainer(r: _Run, model, tokenizer, train_ds, eval_ds):
    """The trainer with its callbacks (masking epochs, logs, the signal stopper, ``--max-time``, checkpoint
    marks), resumed from the run's checkpoint; ``r.clock`` set to ``--max-time``'s (a list: empty without one)."""
    a, out, resume_from = r.a, r.out, r.run.start_from
    targs = _training_args(a, out, has_eval=eval_ds is not None)
    clock = r.clock = [WallClockLimit(a.max_time)] if a.max_time else []
    trainer = PretrainTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=[
            _MaskEpoch(train_ds),
            JsonlLogger(out / "log.jsonl"),
            r.stopper,
            *clock,
            TensorBoardLogs(out / "tb"),
            *r.callbacks,
        ],
        keep_checkpoints=a.keep_checkpoints,
        save_minutes=a.save_minutes,
        progress=a.progress,
        resume_from=resume_from,
    )
    if a.resume and targs.should_save:
        print(
            f"resuming from {resume_from}" if resume_from else f"no complete checkpoint in {out}; starting from step 0"
        )
    return trainer


def _train(trainer, stopper, eval_ds, resume_from) -> tuple[float, dict | None]:
    """Train, then evaluate unless stopped (the last logged evaluation when it is of the last step): the
    seconds it took and the evaluation (None: none)."""
    started, ev = time.monotonic(), None
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        if eval_ds is not None and stopper.received is None:
            last = [h for h in trainer.state.log_history if "eval_loss" in h]
            ev = last[-1] if last and last[-1]["step"] == trainer.state.global_step else trainer.evaluate()
    except StopRequested:  # inside an evaluation: keep the last complete step
        if trainer.state.global_step > trainer.saved_step:
            save_checkpoint(trainer)
    return time.monotonic() - started, ev


def _metrics(trainer, r: _Run, runtime: float, train_ds, eval_ds, ev) -> dict:
    """The run's metrics (see :func:`pretrain`) but its checkpoint; ``param_sha256`` gathered from every rank."""
    a, targs, step, clock, seq_len = r.a, trainer.args, trainer.state.global_step, r.clock, r.seq_len
    interrupted = r.stopper.received is not None
    losses = trainer.run_losses()
    metrics = {
        "status": "interrupted" if interrupted else "completed",
        "signal": r.stopper.received,
        "stopped_by": "signal" if interrupted else "max_time" if clock and clock[0].reached else "max_steps",
        "global_step": step,
        "train_loss": losses["loss_sum"] / step if step else None,
        "last_loss": losses["last_loss"],
        "train_tokens": step * a.batch_size * a.grad_accum * targs.world_size * seq_len,
        "train_runtime": runtime,
        "train_seconds": round(clock[0].used(), 1) if clock else round(runtime, 1),  # with --max-time: resumes included
        "seq_len": seq_len,
        "train_sequences": len(train_ds),
        "valid_sequences": len(eval_ds) if eval_ds is not None else 0,
        "world_size": targs.world_size,
        "args": {k: v for k, v in asdict(a).items() if k != "progress"},
    }
    if ev is not None:
        metrics.update(eval_loss=ev["eval_loss"], eval_perplexity=perplexity(ev["eval_loss"]))
    digest = param_digest(trainer.model)
    digests = [digest]
    if targs.world_size > 1:
        digests = [None] * targs.world_size
        torch.distributed.all_gather_object(digests, digest)
    metrics["param_sha256"] = digests
    return metrics
