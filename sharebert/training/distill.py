"""Knowledge distillation into a ShareBERT student: losses, layer map, teacher checks, and ``distill_glue``.

The student learns from a frozen teacher (any transformers BERT-family classifier, or a sharebert
one) through five weighted terms (docs/DISTILLATION.md):

- ``kl``: ``T^2 * KL(softmax(teacher / T) || softmax(student / T))`` per example (MSE for STS-B);
- ``hard``: the student's own loss on the gold labels;
- ``hidden``: MSE between student hidden states, projected to the teacher's width by one learned
  linear map, and the teacher's, at the layers of the layer map (padding excluded);
- ``attention``: MSE between attention maps, per head; teacher heads averaged in groups (or
  repeated) when the head counts differ;
- ``embedding``: MSE between the embedding outputs (a second learned projection).

The layer map pairs each student iteration ``j`` (1-based; ShareBERT runs one shared layer
``num_hidden_layers`` times) with a teacher layer; by default uniformly, ``j -> j * L_t // L_s``. A student
trained with depth sampling (``train_min_depth``) runs fewer iterations in some steps: ``pairs_that_ran``.
The projections are trained with the student and never saved with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer

from sharebert_runtime.artifact import sha256
from sharebert_runtime.errors import first_line
from sharebert_runtime.outdir import (
    check_out_dir,
    check_same_run,
    finite,
    local_rank,
    made_by,
    mark_out,
    read_json,
    write_json,
)

from ..formats.model_folder import load_config, load_tokenizer
from ..formats.paths import data_path
from .arguments import DistillArgs, DistillWeights
from .augment import IGNORE_LABEL, augment, check_augment
from .callbacks import (
    MarkCheckpoints,
    StopsAtMaxSteps,
    check_fits,
    kept_result,
    resume_from,
    start_checkpoints,
    write_results,
)
from .depth_table import check_depth_sampling
from .encoded import encoded_task, evaluate_dev
from .finetune import load_classifier, metrics_for, task_training_args
from .fingerprint import data_files, run_fingerprint, teacher_fingerprint  # noqa: F401  (distill's names)
from .glue import GlueTask, get_task, task_file
from .log_lines import no_bars, show_progress

PROJECTIONS_FILE = "distill_projections.safetensors"
TARGETS_FILE = "teacher_targets"  # an embedding distillation's teacher vectors: -<key>.npy in its --out
DATA_FILE = "distill_data.json"  # in each checkpoint: what it trained on (check_same_data)


def layer_map(student_layers: int, teacher_layers: int, given=None) -> tuple[tuple[int, int], ...]:
    """The checked layer map; uniform ``j -> j * L_t // L_s`` when ``given`` is None."""
    pairs = (
        given
        if given is not None
        else tuple((j, max(1, j * teacher_layers // student_layers)) for j in range(1, student_layers + 1))
    )
    for s, t in pairs:
        if not (1 <= s <= student_layers and 1 <= t <= teacher_layers):
            raise ValueError(
                f"--layer-map pair {s}:{t} is out of range: the student runs {student_layers} "
                f"iterations, the teacher has {teacher_layers} layers (both counted from 1)"
            )
    return tuple(pairs)


def pairs_that_ran(pairs, depth: int, student_layers: int, teacher_layers: int) -> tuple[tuple[int, int], ...]:
    """The layer map of a student that ran only its first ``depth`` iterations (``--depth-sampling``): the pairs
    of the iterations before ``depth`` unchanged (they computed what they compute at full depth), and iteration
    ``depth``, whose output the head reads, paired with the teacher's last layer. At full depth: ``pairs``."""
    if depth >= student_layers:
        return tuple(pairs)
    return tuple(p for p in pairs if p[0] < depth) + ((depth, teacher_layers),)


def head_groups(student_heads: int, teacher_heads: int) -> list[list[int]]:
    """For each student head, the teacher heads whose maps it learns (averaged)."""
    if teacher_heads >= student_heads:
        return [
            list(range(h * teacher_heads // student_heads, (h + 1) * teacher_heads // student_heads))
            for h in range(student_heads)
        ]
    return [[h * teacher_heads // student_heads] for h in range(student_heads)]


def soft_kl(student_logits, teacher_logits, temperature: float) -> torch.Tensor:
    """``T^2 * KL(p_teacher || p_student)`` at temperature ``T``, averaged over the rows."""
    t = temperature
    log_p_s = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return (t * t) * F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean")


def masked_mse(a, b, mask) -> torch.Tensor:
    """Mean squared error over the positions where ``mask`` (broadcastable to ``a``'s leading dims) is 1."""
    mask = mask.to(a.dtype)
    while mask.dim() < a.dim():
        mask = mask.unsqueeze(-1)
    sq = (a.float() - b.float()).pow(2) * mask
    return sq.sum() / (mask.expand_as(a).sum()).clamp_min(1)


class Projections(nn.Module):
    """Learned maps from the student's hidden width to the teacher's (embedding output, hidden states)."""

    def __init__(self, student_width: int, teacher_width: int):
        super().__init__()
        self.embedding = nn.Linear(student_width, teacher_width)
        self.hidden = nn.Linear(student_width, teacher_width)
        if student_width == teacher_width:  # identity start: an exact copy of the teacher has zero loss
            for lin in (self.embedding, self.hidden):
                nn.init.eye_(lin.weight)
                nn.init.zeros_(lin.bias)


def hard_loss(logits, labels, regression: bool = False) -> torch.Tensor:
    """The student's gold-label loss: cross-entropy over the rows (or MLM positions) whose label is not
    ``IGNORE_LABEL`` (-100), MSE over the finite regression labels; 0 when a batch holds none (copies from
    ``--augment`` only)."""
    if regression:
        s, y = logits.float().squeeze(-1), labels.float().squeeze(-1)
        keep = torch.isfinite(y)
        return F.mse_loss(s[keep], y[keep]) if keep.any() else s.sum() * 0
    keep = labels != IGNORE_LABEL
    if not keep.any():
        return logits.sum() * 0
    return F.cross_entropy(logits.float()[keep], labels[keep])


def distill_losses(
    student_out,
    teacher_out,
    attention_mask,
    labels,
    projections: Projections,
    weights: DistillWeights,
    pairs,
    groups,
    regression: bool = False,
    logits_mask=None,
) -> dict[str, torch.Tensor]:
    """Each weighted term that is on, and ``"loss"``, their sum.

    ``student_out``/``teacher_out`` are model outputs (``logits`` and, where their terms are on,
    ``hidden_states``/``attentions``); ``logits_mask`` keeps the rows scored by the soft loss
    (MLM: the masked positions).
    """
    parts = {}
    if weights.kl:
        s, t = student_out.logits, teacher_out.logits.to(student_out.logits.dtype)
        if logits_mask is not None:
            s, t = s[logits_mask], t[logits_mask]
        n = min(s.shape[-1], t.shape[-1])  # MLM: vocabularies padded to different multiples; the rest is never a token
        s, t = s[..., :n], t[..., :n]
        parts["kl"] = weights.kl * (
            F.mse_loss(s.float(), t.float()) if regression else soft_kl(s, t, weights.temperature)
        )
    if weights.hard and labels is not None:
        parts["hard"] = weights.hard * hard_loss(student_out.logits, labels, regression)
    if weights.embedding:
        parts["embedding"] = weights.embedding * masked_mse(
            projections.embedding(student_out.hidden_states[0]), teacher_out.hidden_states[0], attention_mask
        )
    if weights.hidden:
        parts["hidden"] = (
            weights.hidden
            * sum(
                masked_mse(
                    projections.hidden(student_out.hidden_states[s]), teacher_out.hidden_states[t], attention_mask
                )
                for s, t in pairs
            )
            / len(pairs)
        )
    if weights.attention:
        pair_mask = attention_mask[:, None, :, None] * attention_mask[:, None, None, :]
        total = 0
        for s, t in pairs:
            ta = teacher_out.attentions[t - 1]
            ta = torch.stack([ta[:, g].mean(1) for g in groups], dim=1)
            total = total + masked_mse(student_out.attentions[s - 1], ta, pair_mask.expand_as(ta))
        parts["attention"] = weights.attention * total / len(pairs)
    parts["loss"] = sum(parts.values()) if parts else student_out.logits.sum() * 0
    return parts


def tokenizer_fingerprint(tokenizer) -> tuple[int, str]:
    """``(vocabulary size, sha256 prefix of the token -> id table)``."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256("\n".join(f"{t}\t{i}" for t, i in vocab).encode()).hexdigest()[:12]
    return len(vocab), digest


def check_tokenizers(teacher_tok, student_tok, teacher_dir, student_name) -> None:
    """Refuse a student whose token ids mean other tokens than the teacher's."""
    t, s = tokenizer_fingerprint(teacher_tok), tokenizer_fingerprint(student_tok)
    if t != s:
        raise ValueError(
            f"the teacher's tokenizer ({teacher_dir}: {t[0]} tokens, sha256 {t[1]}) differs from the "
            f"student's ({student_name}: {s[0]} tokens, sha256 {s[1]}); distillation needs one tokenizer"
        )


def check_encoder(teacher_dir) -> dict:
    """The teacher's config dict; ``ValueError`` for a model that is not a bidirectional encoder
    (``teacher.read_teacher``: any encoder architecture of transformers)."""
    from .teacher import read_teacher

    return read_teacher(teacher_dir)


def check_teacher_labels(teacher_dir, config, task: GlueTask) -> None:
    """The teacher must be a classifier (or regressor) over exactly the task's labels."""
    raw = check_encoder(teacher_dir)
    archs = raw.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(
            f"{teacher_dir} is not a sequence classifier (architectures: {', '.join(archs) or 'none'}); "
            f"fine-tune the teacher on {task.name} first (`sharebert finetune`)"
        )
    want = 1 if task.is_regression else task.num_labels
    if config.num_labels != want:
        raise ValueError(f"the teacher in {teacher_dir} has {config.num_labels} labels, task {task.name} has {want}")
    if not task.is_regression:
        names = [config.id2label[i] for i in range(config.num_labels)]
        generic = [f"LABEL_{i}" for i in range(config.num_labels)]
        if names != generic and names != list(task.label_names):
            raise ValueError(
                f"the teacher in {teacher_dir} has labels {names}, task {task.name} has {list(task.label_names)}"
            )


def training_device() -> str:
    """Where this process trains: its own GPU (``LOCAL_RANK`` under torchrun) where CUDA is available, else the
    CPU. The teacher goes there, beside the student the Trainer places."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{local_rank()}"


def load_teacher(teacher_dir, head: str = "classifier"):
    """The teacher through the transformers Auto classes (sharebert folders included): eval mode, no gradients.
    ``head``: ``classifier``, ``mlm`` or ``encoder`` (the backbone alone: hidden and attention terms only).

    On a CUDA device with bf16 support it is loaded in bf16 (the student's losses are computed in fp32).
    """
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    import sharebert.model.modeling_sharebert  # noqa: F401  (registers the sharebert Auto classes)

    cls = {"classifier": AutoModelForSequenceClassification, "mlm": AutoModelForMaskedLM, "encoder": AutoModel}[head]
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    try:
        model = cls.from_pretrained(teacher_dir, dtype=dtype, attn_implementation="eager")
    except (OSError, ValueError) as e:
        raise ValueError(f"--teacher {teacher_dir} cannot be loaded: {first_line(e)}") from None
    model.requires_grad_(False)
    from .teacher import accept_known_inputs

    accept_known_inputs(model)
    return model.to(training_device()).eval()


def teacher_logits(
    teacher, teacher_dir, ds, split_path, seq_len: int, cache_dir=None, progress: bool = True, variant: str = ""
):
    """The teacher's logits on ``ds`` (N, labels); with ``cache_dir`` read from / written to
    ``<cache_dir>/<key>.npy``, the key hashing the teacher's files (:func:`teacher_fingerprint`), the split file,
    ``seq_len`` and ``variant`` (how the split was augmented; "" for none)."""
    import numpy as np

    from .encoded import predict_logits

    if cache_dir is None:
        return predict_logits(teacher, ds, progress=progress)
    parts = (
        teacher_fingerprint(teacher_dir)
        + [sha256(Path(split_path)), str(seq_len), str(len(ds))]
        + ([variant] if variant else [])
    )
    path = Path(cache_dir) / (hashlib.sha256("|".join(parts).encode()).hexdigest()[:24] + ".npy")
    if path.is_file():
        try:
            logits = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError):  # a damaged cache file: recomputed and replaced below
            logits = None
        if logits is not None and logits.shape[0] == len(ds) and np.isfinite(logits).all():
            return logits
    logits = predict_logits(teacher, ds, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")  # two runs writing one key never share a half-written file
    np.save(tmp, logits)
    tmp.replace(path)
    return logits


class WithTeacherLogits(torch.utils.data.Dataset):
    """A tokenized split whose items also carry the teacher's logits (``"teacher_logits"``). ``agreed``: a
    classification item's gold label only where the teacher's own answer is that label (elsewhere
    ``IGNORE_LABEL``: the item teaches by the teacher's logits alone)."""

    def __init__(self, ds, logits, agreed: bool = False):
        self.ds, self.logits, self.agreed = ds, logits, agreed

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        item = {**self.ds[i], "teacher_logits": self.logits[i].tolist()}
        if self.agreed and item["labels"] != IGNORE_LABEL and item["labels"] != int(self.logits[i].argmax()):
            item["labels"] = IGNORE_LABEL
        return item


class DistillTrainer(StopsAtMaxSteps, Trainer):
    """``Trainer`` whose ``compute_loss`` adds the distillation terms; the projections train alongside.

    Checkpoints hold the student (``model.safetensors``) and the projections (``PROJECTIONS_FILE``),
    so ``--resume`` continues both; under torchrun the projections' gradients are averaged. ``data``: what the
    run trains on (``check_same_data``), kept in each checkpoint (``DATA_FILE``). ``limit``: a ``WallClockLimit``
    that stops the run (or None); without ``max_steps`` the learning rate and the progress lines follow it.
    ``progress``: the progress display (``show_progress``; None leaves the Trainer's own).
    """

    def __init__(
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


COMMAND = "distill"  # the marker's command (``outdir.MARK``): a folder is a distillation's only when it says so
is_distill_out = made_by(COMMAND)


def _is_distill_out(path: Path) -> bool:
    """A folder that looks like a distillation's (its result, its checkpoints, or the teacher's vectors), with or
    without this command's marker: ``check_out_dir``'s ``legacy``, which it asks only of a folder the marker does not
    vouch for (written by hand, by another tool, or copied): refused naming the marker, never replaced. No older
    format is served: sharebert 0.1.0, the first release, writes the marker."""
    return (
        (path / "metrics.json").is_file() or (path / "checkpoints").is_dir() or any(path.glob(f"{TARGETS_FILE}-*.npy"))
    )


def _student_name(student: str) -> str:
    return str(Path(student).resolve()) if Path(student).exists() else student


def start_run(out: Path, resume: bool, fp: dict) -> None:
    """Once every input is checked, before the first write: a ``--resume`` of another run refused (its
    fingerprint), then ``out`` marked a distillation's."""
    if resume:
        check_same_run(out, fp)
    mark_out(out, COMMAND, fp)


def _resume_from(out: Path, resume: bool) -> str | None:
    """The newest complete checkpoint under ``out/checkpoints`` with ``resume`` (``ValueError`` if none)."""
    found = resume_from(out / "checkpoints", resume)
    return str(found) if found else None


def _resume_same_data(out: Path, resume: bool, data: dict) -> str | None:
    """:func:`_resume_from`, its checkpoint refused when it trained on other ``data`` (:func:`check_same_data`)."""
    start_from = _resume_from(out, resume)
    if start_from is not None:
        check_same_data(Path(start_from), data)
    return start_from


def check_same_data(checkpoint: Path, data: dict) -> None:
    """Refuse to resume a distillation on another training set than its checkpoint's: a task distillation's
    ``--augment`` and the seed that drew the copies (a checkpoint without ``DATA_FILE`` trained without
    copies), an embedding distillation's sentences (count and hash; unchecked where the file lacks them) and
    student (``--student`` and ``--set``), nor a checkpoint of one kind as the other's."""
    try:
        saved = read_json(checkpoint / DATA_FILE)
    except FileNotFoundError:
        saved = {"augment": 0, "seed": data["seed"]} if "augment" in data else dict(data)
    except (OSError, ValueError) as e:
        raise ValueError(f"{checkpoint / DATA_FILE} cannot be read ({first_line(e)})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{checkpoint / DATA_FILE} is not a JSON object")
    if "sentences_sha256" in saved and "sentences_sha256" not in data:
        raise ValueError(
            f"--resume: {checkpoint} is an embedding distillation's checkpoint; resume it with "
            "--objective embedding, or start again with --overwrite"
        )
    if saved.get("student", data.get("student")) != data.get("student"):  # unchecked where the file lacks it
        raise ValueError(
            f"--resume: {checkpoint} distilled the student {saved['student']}; resume with the same "
            f"--student and --set (now {data['student']}), or start again with --overwrite"
        )
    if "sentences_sha256" in data:
        if saved.get("sentences_sha256") != data["sentences_sha256"]:
            raise ValueError(
                f"--resume: {checkpoint} trained on {saved.get('sentences', '?')} other sentences; "
                f"resume on the same --train / --data and --max-train-samples (now {data['sentences']} "
                "sentences), or start again with --overwrite"
            )
    elif saved.get("augment", 0) != data["augment"] or (data["augment"] and saved.get("seed") != data["seed"]):
        raise ValueError(
            f"--resume: {checkpoint} trained with --augment {saved.get('augment', 0)} and --seed "
            f"{saved.get('seed')}; resume with the same (now --augment {data['augment']}, --seed "
            f"{data['seed']}), or start again with --overwrite"
        )


def load_student(student: str, task: GlueTask, teacher_tok, teacher_config, seed: int):
    """``(model, tokenizer)``: a preset built on the teacher's tokenizer, or a model folder (checked against it)."""
    from ..model.shape import PRESETS

    if not Path(student).exists() and student in PRESETS:
        from ..formats.build import config_for_vocab
        from ..model.modeling_sharebert import ShareBertForSequenceClassification

        config = config_for_vocab(student, {}, len(teacher_tok))
        labels = {
            "num_labels": 1 if task.is_regression else task.num_labels,
            "problem_type": "regression" if task.is_regression else "single_label_classification",
        }
        if not task.is_regression:
            labels.update(
                id2label=dict(enumerate(task.label_names)), label2id={n: i for i, n in enumerate(task.label_names)}
            )
        config.update(labels)
        torch.manual_seed(seed)
        return ShareBertForSequenceClassification(config), teacher_tok
    if not Path(student).exists():
        raise ValueError(f"--student {student} is neither a model folder nor a preset ({', '.join(PRESETS)})")
    config = load_config(student)
    tokenizer = load_tokenizer(student, config.vocab_size, needs=("pad",))
    torch.manual_seed(seed)
    return load_classifier(student, task), tokenizer


def distill_glue(
    teacher_dir,
    student: str,
    task: str,
    out,
    data_dir=None,
    args: DistillArgs = DistillArgs(),
    overwrite: bool = False,
    resume: bool = False,
    keep_checkpoints: bool = False,
    progress: bool = True,
    cache_teacher=None,
    callbacks=(),
    clock=None,
    vocab=None,
    agreed_labels: bool = False,
) -> dict:
    """Distil ``teacher_dir`` (a classifier fine-tuned on ``task``) into ``student``; returns the metrics.

    ``out`` receives the best student by the task's dev metric (projections dropped), its tokenizer,
    ``log_history.json`` and ``metrics.json``: the student's dev metrics at top level, as ``finetune``
    writes them, and the teacher's under ``"teacher"``. Every input is checked before training.
    ``cache_teacher`` (a folder) keeps the teacher's training-set logits between runs; with the
    hidden, attention and embedding weights at 0 the teacher then never runs during training. ``callbacks``:
    more ``TrainerCallback``s (``sharebert compress``: the signal checkpoint). ``clock``: a ``WallClockLimit``
    that stops training; without ``args.max_steps`` the learning rate and the progress lines follow it.
    ``vocab``: the ``vocab.CutVocabulary`` a student folder speaks (``compress`` of a classifier with a cut
    vocabulary): each example is encoded twice, the teacher's tokens for its logits and the student's for its input.
    ``agreed_labels`` (with ``cache_teacher``, a classification task): the gold-label loss only on the training
    examples the teacher labels right (``WithTeacherLogits``), so the student never learns against its teacher.
    """
    args.weights.check_teaches()
    if vocab is not None:
        check_cut_task(args, cache_teacher)
    from transformers import DataCollatorWithPadding

    from .teacher import teacher_config, teacher_tokenizer

    task_ = get_task(task)
    data_dir = Path(data_dir) if data_dir is not None else data_path("glue", task_.folder)
    out = check_out_dir(
        out,
        "distillation result",
        is_distill_out,
        overwrite or resume,
        legacy=_is_distill_out,
        inputs=(teacher_dir, data_dir) + ((student,) if Path(student).exists() else ()),
    )
    for split in ("train", *task_.dev_splits):  # a wrong --data-dir fails before any model loads
        task_file(task_, data_dir, split)
    data = {"augment": args.augment, "seed": args.seed}
    start_from = _resume_same_data(out, resume, data)
    t_config = teacher_config(teacher_dir)  # any encoder architecture (training.teacher)
    t_tok = teacher_tokenizer(teacher_dir, t_config)
    check_teacher_labels(teacher_dir, t_config, task_)
    if args.augment:  # before any model loads
        check_augment(args.augment, t_tok, teacher_dir)
    speaks = t_tok if vocab is None else vocab.tokenizer  # the tokenizer the student must have
    model, s_tok = load_student(student, task_, speaks, t_config, args.seed)
    model.config.train_min_depth = check_depth_sampling(args.depth_sampling, model.config.num_hidden_layers)
    check_tokenizers(speaks, s_tok, teacher_dir, student)
    s_tok = t_tok if vocab is None else s_tok  # one tokenizer (the teacher's settings), or the student's own
    teacher = _task_teacher(teacher_dir, task_)
    w = args.weights
    pairs, groups, projections = _maps(model, teacher, w, args.seed)

    seq_len = min(args.seq_len, model.config.max_position_embeddings, teacher.config.max_position_embeddings)
    train, train_ds, dev_ds = encoded_task(
        task_, data_dir, s_tok, seq_len, args.max_train_samples, args.max_eval_samples, progress
    )
    t_train_ds, t_dev_ds = (
        (train_ds, dev_ds)
        if vocab is None
        else encoded_task(task_, data_dir, t_tok, seq_len, args.max_train_samples, args.max_eval_samples, progress)[1:]
    )
    main_dev = dev_ds[task_.dev_splits[0]]
    if args.augment:  # the row limit, now the examples are counted: before --out is made
        check_augment(args.augment, t_tok, teacher_dir, len(train_ds))
    start_run(
        out,
        start_from is not None,
        run_fingerprint(teacher_dir, _student_name(student), [train.path], f"task distillation on {task_.name}"),
    )
    if args.augment:  # one tokenizer (a cut refuses --augment): the teacher reads the same augmented rows
        train_ds = t_train_ds = augment(
            train_ds, args.augment, t_tok, teacher.get_input_embeddings().weight, task_.is_regression, seed=args.seed
        )
    if cache_teacher is not None:
        variant = ",".join(f"{k}={v}" for k, v in data.items()) if args.augment else ""
        train_ds = WithTeacherLogits(
            train_ds,
            teacher_logits(teacher, teacher_dir, t_train_ds, train.path, seq_len, cache_teacher, progress, variant),
            agreed=agreed_labels and not task_.is_regression,
        )
    teacher_metrics = evaluate_dev(teacher, t_dev_ds, task_, progress=progress)

    targs = task_training_args(
        args,
        out,
        task_,
        progress,
        save_only_model=False,  # projections resume too
        keep_columns=cache_teacher is not None,
    )  # the cached logits reach the loss

    trainer = DistillTrainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        eval_dataset=main_dev,
        processing_class=s_tok,
        data_collator=DataCollatorWithPadding(s_tok),
        compute_metrics=metrics_for(task_),
        teacher=teacher,
        projections=projections,
        weights=w,
        pairs=pairs,
        groups=groups,
        regression=task_.is_regression,
        data=data,
        limit=clock,
        max_steps=args.max_steps,
        progress=progress,
    )
    for callback in (MarkCheckpoints(args.save_minutes, keep=1), *callbacks):
        trainer.add_callback(callback)
    if (
        kept := kept_result(
            trainer,
            start_from,
            out,
            expect=(task_.main_metric, "steps", "best_step", "teacher", "train_seconds", "train_samples"),
        )
    ) is not None:
        return kept
    start_checkpoints(out / "checkpoints", start_from)
    result = trainer.train(resume_from_checkpoint=start_from)
    best = trainer.state.best_model_checkpoint

    metrics = {
        "task": task_.name,
        **evaluate_dev(trainer.model, dev_ds, task_, targs.per_device_eval_batch_size, progress),
    }
    metrics.update(
        train_samples=len(train_ds),
        augment=args.augment,
        eval_samples=len(main_dev),
        steps=trainer.state.global_step,
        best_step=int(best.rsplit("-", 1)[1]) if best else trainer.state.global_step,
        **trainer.trained(result),
        seed=args.seed,
        teacher=teacher_metrics,
        student=student,
        teacher_dir=str(teacher_dir),
        losses={k: getattr(w, k) for k in ("kl", "hard", "hidden", "attention", "embedding")},
        temperature=w.temperature,
        layer_map=[list(p) for p in pairs],
    )
    _publish_student(trainer, s_tok, out, metrics, keep_checkpoints)
    return finite(metrics)


def _task_teacher(teacher_dir, task_):
    """The teacher classifier, its generic LABEL_i names read as the task's labels, in order."""
    teacher = load_teacher(teacher_dir)
    if not task_.is_regression:
        teacher.config.id2label = dict(enumerate(task_.label_names))
        teacher.config.label2id = {n: i for i, n in enumerate(task_.label_names)}
    return teacher


def _publish_student(trainer, s_tok, out: Path, metrics: dict, keep_checkpoints: bool) -> None:
    """On the main process: the student alone (the projections live in the trainer), its tokenizer and results
    in ``out``; the checkpoints dropped unless kept."""
    if trainer.is_world_process_zero():
        trainer.model.save_pretrained(str(out))
        s_tok.save_pretrained(str(out))
        write_results(trainer, out, finite(metrics))
        if not keep_checkpoints:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)


def check_cut_task(args: DistillArgs, cache_teacher) -> None:
    """A cut vocabulary's task distillation: the teacher reads other tokens than the student, so it teaches by its
    logits alone (computed once, on its own tokens), and no --augment (its perturbed copies are the teacher's ids)."""
    w = args.weights
    if cache_teacher is None or w.hidden or w.attention or w.embedding:
        raise ValueError(
            "a cut vocabulary's student learns a task from the teacher's cached logits alone (no hidden, "
            "attention or embedding terms): the teacher reads other tokens than the student"
        )
    if args.augment:
        raise ValueError(
            f"--augment {args.augment} perturbs the teacher's token ids, which a cut vocabulary's student "
            "does not read: drop --augment, or --vocab-size (or give limits the whole vocabulary fits)"
        )


def _maps(model, teacher, w: DistillWeights, seed: int):
    """The layer map, the head groups and the (freshly seeded) width projections between student and teacher."""
    from transformers import set_seed

    pairs = layer_map(model.config.num_hidden_layers, teacher.config.num_hidden_layers, w.layer_map)
    groups = head_groups(model.config.num_attention_heads, teacher.config.num_attention_heads)
    set_seed(seed)
    return pairs, groups, Projections(model.config.hidden_size, teacher.config.hidden_size)


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


def teacher_data(data, t_tok, teacher_dir) -> dict:
    """The manifest of a prepared ``data`` folder (``shards.read_manifest``: checksum, shard sizes and sha256,
    ids below the vocabulary), refused unless it was prepared with the teacher's tokenizer ``t_tok``."""
    from .shards import read_manifest, vocab_sha256

    manifest = read_manifest(data)
    if manifest["tokenizer"]["vocab_sha256"] != vocab_sha256(t_tok):
        raise ValueError(
            f"--data {data} was prepared with another tokenizer than the teacher's (vocab sha256 "
            f"{manifest['tokenizer']['vocab_sha256'][:12]} vs {vocab_sha256(t_tok)[:12]}); prepare it "
            f"with --tokenizer {teacher_dir}"
        )
    return manifest


def teacher_blocks(data, manifest: dict, t_tok, seq_len: int, limit: int | None = None):
    """The first ``limit`` (all when None) training sequences of a prepared folder, memory-mapped
    (``shards.StreamBlocks``): ``[CLS] + (seq_len - 2) tokens + [SEP]`` each, read on demand."""
    from .shards import StreamBlocks, TokenStream

    stream = TokenStream(data, manifest, "train")
    total = StreamBlocks.sequences(stream, seq_len, True)
    return StreamBlocks(
        stream, seq_len, count=min(total, limit or total), cls_id=t_tok.cls_token_id, sep_id=t_tok.sep_token_id
    )


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


def distill_mlm(
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

    out = check_out_dir(
        out,
        "distillation result",
        is_distill_out,
        overwrite or resume,
        legacy=_is_distill_out,
        inputs=(
            teacher_dir,
            *([data] if data is not None else []),
            *(train or []),
            *([student] if Path(student).exists() else []),
        ),
    )
    start_from = _resume_from(out, resume)
    from .teacher import teacher_config, teacher_tokenizer

    t_config = teacher_config(teacher_dir)  # any encoder architecture (training.teacher)
    t_tok = teacher_tokenizer(teacher_dir, t_config, needs=("pad", "mask"))  # masking needs its mask token
    archs = check_encoder(teacher_dir).get("architectures") or []
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
    teacher = load_teacher(teacher_dir, head="mlm" if mlm_teacher else "encoder")
    w = args.weights
    pairs, groups, projections = _maps(model, teacher, w, args.seed)
    seq_len = min(args.seq_len, model.config.max_position_embeddings, teacher.config.max_position_embeddings)
    if manifest is not None:
        blocks = teacher_blocks(data, manifest, t_tok, seq_len, args.max_train_samples)
    else:
        blocks = _text_blocks(train, t_tok, seq_len, args.max_train_samples, progress)
    train_ds = PackedDataset.for_objective(blocks, t_tok, "mlm", seed=args.seed)
    start_run(
        out,
        start_from is not None,
        run_fingerprint(teacher_dir, _student_name(student), data_files(train, data), "mlm"),
    )

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
    if (
        kept := kept_result(trainer, start_from, out, expect=("steps", "train_loss", "train_seconds", "last_terms"))
    ) is not None:
        return kept
    start_checkpoints(out / "checkpoints", start_from)
    result = trainer.train(resume_from_checkpoint=start_from)
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
        write_results(trainer, out, finite(metrics))
    return finite(metrics)
