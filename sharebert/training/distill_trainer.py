"""The distillation's Trainer (``DistillTrainer``: the student's terms against the frozen teacher's outputs, the
projections saved and resumed beside each checkpoint) and the training arguments of a distillation on
unlabelled text."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Trainer

from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import (
    write_json,
)

from .arguments import DistillArgs
from .callbacks import (
    StopsAtMaxSteps,
    StopsOnNonFiniteLoss,
    WarmupMayFillTheRun,
    check_fits,
)
from .distill_losses import distill_losses, pairs_that_ran
from .distill_run import DATA_FILE, PROJECTIONS_FILE
from .log_lines import no_bars, show_progress


class DistillTrainer(StopsOnNonFiniteLoss, WarmupMayFillTheRun, StopsAtMaxSteps, Trainer):
    """``Trainer`` whose ``compute_loss`` adds the distillation terms; the projections train alongside; a NaN loss
    stops the run (``StopsOnNonFiniteLoss``).

    Checkpoints hold the student (``model.safetensors``) and the projections (``PROJECTIONS_FILE``),
    so ``--resume`` continues both; under torchrun the projections' gradients are averaged. ``data``: what the
    run trains on (``check_same_data``), kept in each checkpoint (``DATA_FILE``). ``limit``: a ``WallClockLimit``
    that stops the run (or None); without ``max_steps`` the learning rate and the progress lines follow it.
    ``progress``: the progress display (``show_progress``; None leaves the Trainer's own).
    """

    def __init__(  # a Trainer's constructor: its keywords are transformers' (``kw``) and what the distillation adds
        self,
        *a,
        teacher,
        projections,
        weights,
        pairs,
        groups,
        regression=False,
        mlm=False,
        data=None,
        limit=None,
        max_steps=None,
        progress: bool | None = None,
        **kw,
    ):
        self.data = data
        super().__init__(*a, **kw)
        self.teacher, self.weights, self.pairs, self.groups = teacher, weights, pairs, groups
        self.projections = projections.to(self.args.device)
        self.regression, self.mlm = regression, mlm
        self._parts: dict[str, float] = {}
        if limit is not None:
            self.add_callback(limit)
        self.limit = limit
        self.clock = limit if limit is not None and not max_steps else None
        if progress is not None:
            show_progress(self, progress, self.clock)

    clock = None  # a ``WallClockLimit`` when training is bounded by time only: the learning rate follows it

    def create_scheduler(self, num_training_steps, optimizer=None):
        """With a time budget and no step budget, the learning rate follows the clock
        (``WallClockLimit.lr_factor``): a run stopped by ``--max-time`` ends annealed."""
        if self.clock is None:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            warmup, clock = self.args.warmup_steps, self.clock
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or self.optimizer, lambda step: clock.lr_factor(step, warmup)
            )
        return self.lr_scheduler

    limit = None  # the ``WallClockLimit`` that stops the run, whether or not the learning rate follows it

    resumed = False  # set when a checkpoint is loaded

    def trained(self, result) -> dict:
        """``train_seconds`` (the clock's count over the whole run, its resumes included; without one, this
        call's runtime), ``stopped_by_time``, ``train_loss`` and ``last_terms``, for the metrics. After a
        resume, transformers' ``training_loss`` divides this call's losses by all the run's steps: the loss is
        then the mean of the logged losses, each weighted by the steps it covers (None with none logged), and
        the last terms are the last logged ones when this call took no step."""
        seconds = self.limit.used() if self.limit else result.metrics.get("train_runtime", 0.0)
        loss, parts = result.training_loss, dict(self._parts)
        logged = [h for h in self.state.log_history if "loss" in h and "step" in h]
        if self.resumed and not logged:
            loss = None
        elif self.resumed:
            steps = [h["step"] for h in logged]
            spans = [b - a for a, b in zip([0, *steps], steps)]
            loss = sum(h["loss"] * n for h, n in zip(logged, spans)) / max(1, sum(spans))
            parts = parts or {k[5:]: v for k, v in logged[-1].items() if k.startswith("loss_")}
        return {
            "train_seconds": round(seconds, 1),
            "stopped_by_time": bool(self.limit and self.limit.reached),
            "train_loss": loss,
            "last_terms": parts,
        }

    def create_optimizer(self):
        opt = super().create_optimizer()
        if not any(p is q for g in opt.param_groups for p in g["params"] for q in self.projections.parameters()):
            opt.add_param_group({"params": list(self.projections.parameters()), "weight_decay": 0.0})
        return opt

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        w = self.weights
        if not model.training:  # dev scoring: the student alone
            inputs = {k: v for k, v in inputs.items() if k != "teacher_logits"}
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        need_h, need_a = bool(w.hidden or w.embedding), bool(w.attention)
        cached = inputs.pop("teacher_logits", None)
        labels = inputs.get("labels")
        if "attention_mask" not in inputs:  # packed pre-training sequences have no padding
            inputs = {**inputs, "attention_mask": torch.ones_like(inputs["input_ids"])}
        feed = {k: v for k, v in inputs.items() if k != "labels"}  # the hard loss is ``hard_loss``'s
        out = model(**feed, output_hidden_states=need_h, output_attentions=need_a)  # at a sampled depth, maybe
        pairs = self._pairs_that_ran(out, need_h, need_a) if need_h or need_a else self.pairs
        t_out = self._teacher_outputs(inputs, cached, need_h, need_a)
        logits_mask = (labels != -100) if self.mlm else None
        parts = distill_losses(
            out,
            t_out,
            inputs["attention_mask"],
            labels if w.hard else None,
            self.projections,
            w,
            pairs,
            self.groups,
            self.regression,
            logits_mask,
        )
        for k, v in parts.items():
            if k != "loss":
                self._parts[k] = float(v.detach())
        return (parts["loss"], out) if return_outputs else parts["loss"]

    def _pairs_that_ran(self, out, need_h: bool, need_a: bool):
        """The layer pairs of the terms among the student layers this forward ran (fewer under depth sampling)."""
        ran = len(out.attentions) if need_a else len(out.hidden_states) - 1
        return pairs_that_ran(
            self.pairs, ran, self.model.config.num_hidden_layers, self.teacher.config.num_hidden_layers
        )

    def _teacher_outputs(self, inputs: dict, cached, need_h: bool, need_a: bool):
        """The teacher's outputs on the batch: its ``cached`` logits alone when they are all the terms need
        (``--cache-teacher``), else a forward without gradients."""
        if cached is not None and not (need_h or need_a):
            return SimpleNamespace(logits=cached)
        with torch.no_grad():
            t_in = {k: v for k, v in inputs.items() if k != "labels"}
            return self.teacher(**t_in, output_hidden_states=need_h, output_attentions=need_a)

    def training_step(self, *a, **kw):
        loss = super().training_step(*a, **kw)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            for p in self.projections.parameters():
                if p.grad is not None:
                    torch.distributed.all_reduce(p.grad)
                    p.grad /= torch.distributed.get_world_size()
        return loss

    def log(self, logs, *a, **kw):
        if "loss" in logs:
            logs.update({f"loss_{k}": round(v, 6) for k, v in self._parts.items()})
        super().log(logs, *a, **kw)

    def save_model(self, output_dir=None, _internal_call=False):
        """The student as the Trainer saves it (each checkpoint too), then the projections and the data."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            from safetensors.torch import save_file

            out = Path(output_dir or self.args.output_dir)
            save_file(
                {k: v.contiguous() for k, v in self.projections.state_dict().items()}, str(out / PROJECTIONS_FILE)
            )
            if self.data is not None:
                write_json(out / DATA_FILE, self.data)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """The Trainer's; resuming, the checkpoint's projections are loaded first (the Trainer loads the student
        and the optimizer, whose state covers the projections: ``create_optimizer``)."""
        if resume_from_checkpoint:
            check_fits(self.model, resume_from_checkpoint)  # the student first, as FitsCheckpoint does
            self.load_projections(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def load_projections(self, checkpoint) -> None:
        self.resumed = True
        path = Path(checkpoint) / PROJECTIONS_FILE
        if path.is_file():
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                self.projections.load_state_dict(load_file(str(path), device=str(self.args.device)))
            except (RuntimeError, SafetensorError) as e:  # another run's (or another version's) layout
                why = first_line(" ".join(str(e).split()), 300)
                raise ValueError(
                    f"{path} does not fit this run's projections ({why}); resume with the --student "
                    "(and --set) of the run that saved it, or start again with --overwrite"
                ) from None


def stream_training_args(out: Path, args: DistillArgs, progress: bool, **extra):
    """``TrainingArguments`` of a distillation on unlabelled text (general and embedding): no dev set, a
    checkpoint every ``eval_steps`` (500 when unset) in ``out/checkpoints``, the last two kept (by
    ``MarkCheckpoints(keep=2)``, after the marker)."""
    from transformers import TrainingArguments

    cuda = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        save_strategy="steps",
        save_steps=args.eval_steps or 500,
        save_total_limit=None,  # MarkCheckpoints keep=2
        logging_steps=max(1, min(50, args.eval_steps or 50)),
        seed=args.seed,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        report_to="none",
        disable_tqdm=no_bars(progress),
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda,
        **extra,
    )
