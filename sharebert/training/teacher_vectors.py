"""The teacher's pass: its sentence vectors over a run's training sentences, on the fastest path the machine has.

- a GPU: the teacher in PyTorch there (``distill.training_device``), batches of texts of like length;
- else its ONNX artifact (``compress`` exports it before training) through the torch-free runtime on every core the
  process may use, where the artifact keeps the teacher: its export's parity of the sentence vectors with PyTorch
  (``manifest.parity``) holds the artifact's own cosine threshold. The runtime orders the texts by token length and
  pads each call to its own longest text; its RAM mode is the artifact's ``auto`` (int8 only where
  ``manifest.ram_int8.parity`` holds);
  and where the artifact carries a row-int8 graph (``export/teacher_int8.py``, a teacher 768 wide or more) whose
  vectors keep the artifact's own by the bound ``pipelines.teacher_pass`` records (:func:`row_int8_keeps`), the
  runtime's session runs that graph: int8 products, activations quantized per token;
- else the teacher in PyTorch on the CPU, batches of texts of like length (the pass before this module).

The vectors are the teacher's before its Normalize (the loss's ``mse`` reads them so). Measured side by side in
``benchmarks/teacher_pass.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

TORCH_BATCH = 64  # texts per PyTorch batch on the CPU (the pass before the runtime path)
GPU_BATCH = 256  # texts per batch on a GPU: wide enough to keep it busy, sorted, so little padding
ONNX_BATCH = 32  # texts per ONNX Runtime call (the runtime's default; calls also bounded by its max_batch_tokens)
CHUNK = 4096  # texts handed to the runtime at once, in token-length order: one progress step


# A pass's path (``TeacherPass.path``) in a report's words: where the teacher's figures of its quality rows come from.
PATH_WORDS = {
    "onnx": "its artifact through the torch-free runtime",
    "torch": "PyTorch fp32",
    "gpu": "PyTorch on the GPU",
}


def artifact_keeps(artifact) -> bool:
    """Whether the ONNX artifact in ``artifact`` keeps its model's sentence vectors, by its export's parity with
    PyTorch (``manifest.parity``, of the sentence vectors where recorded): a quantized artifact's mean cosine at or
    above the threshold its export recorded beside it, an fp32 one's largest difference within the manifest's own
    fp32 tolerance (``reference.thresholds.fp32``); anything missing or unreadable: no."""
    from sharebert_runtime.outdir import read_json

    try:
        manifest = read_json(Path(artifact) / "manifest.json")
        parity = manifest["parity"]
        vectors = parity.get("sentence_embedding", parity)
        if parity.get("below_thresholds") or vectors.get("below_thresholds"):
            return False
        if "thresholds" in vectors:
            return float(vectors["cosine_mean"]) >= float(vectors["thresholds"]["cosine"])
        return float(vectors["max_abs_diff"]) <= float(manifest["reference"]["thresholds"]["fp32"]["max_abs_diff"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


# The row-int8 graph beside an artifact's files (export/teacher_int8.py writes it) and its check's record
# (pipelines.teacher_pass.check_row_int8 writes it): a folder, so model.onnx stays the artifact's one top-level graph
ROW_INT8_GRAPH = ("row_int8", "model.onnx")
ROW_INT8_RECORD = ("row_int8", "parity.json")


def row_int8_keeps(artifact) -> bool:
    """Whether ``artifact``'s row-int8 graph keeps the teacher: its record's bound on the mean cosine to PyTorch
    (the artifact's parity composed with the graph's own cosine to the artifact's fp32 compute) at or above the
    threshold recorded beside it, for this very ``model.onnx`` (its sha256 in the manifest); anything missing: no."""
    from sharebert_runtime.outdir import read_json

    try:
        record = read_json(Path(artifact).joinpath(*ROW_INT8_RECORD))
        model = read_json(Path(artifact) / "manifest.json")["files"]["model.onnx"]["sha256"]
        fresh = record["model_sha256"] == model and Path(artifact).joinpath(*ROW_INT8_GRAPH).is_file()
        return fresh and float(record["cosine_bound"]) >= float(record["thresholds"]["cosine"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def row_int8_session(runtime) -> None:
    """``runtime`` (the artifact's, fp32 compute) made to run its row-int8 graph: same inputs and outputs, the
    artifact's session options (its folded int8 storage), the tokenizer and calls unchanged. A runtime already in
    RAM int8 (its own graphs, whose weights it binds as inputs) keeps its session."""
    import onnxruntime as ort

    if runtime.ram == "int8":
        return
    graph = runtime.path.joinpath(*ROW_INT8_GRAPH)
    runtime.session = ort.InferenceSession(str(graph), runtime._options(), providers=["CPUExecutionProvider"])


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), which the runtime's threads take."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class TeacherPass:
    """``pass_(sentences, desc=None) -> (N, width)`` float32: the teacher's sentence vectors (before its Normalize),
    truncated to ``seq_len`` tokens, in input order, on the fastest path (module docstring); ``path`` names it
    (``"gpu"``, ``"onnx"`` or ``"torch"``) and ``batch`` is its texts per call (for a time estimate's padding).

    ``model``, ``head``, ``tokenizer``, ``pooling``: the teacher in PyTorch (on its device); ``artifact``: its ONNX
    artifact, or None. :meth:`of` makes one whose PyTorch model is loaded only where the pass runs there."""

    def __init__(self, model, head, tokenizer, pooling: str, seq_len: int, artifact=None):
        self.model, self.head, self.tokenizer, self.pooling, self.seq_len = model, head, tokenizer, pooling, seq_len
        self.artifact, self._runtime, self._load = artifact, None, None
        if model is not None and model.device.type != "cpu":
            self.path, self.batch = "gpu", GPU_BATCH
        elif artifact is not None and artifact_keeps(artifact) and self._fits(artifact):
            self.path, self.batch = "onnx", ONNX_BATCH
        else:
            self.path, self.batch = "torch", TORCH_BATCH
        self.row_int8 = self.path == "onnx" and row_int8_keeps(artifact)

    @classmethod
    def of(cls, teacher, seq_len: int, artifact=None) -> TeacherPass:
        """The pass of a ``pipelines.run.Teacher`` (its folder, tokenizer and recipe): on the GPU where there is one,
        else on ``artifact`` where it keeps the teacher, its PyTorch model (and Dense head) then never loaded; else
        loaded on first use. A run whose vectors are all cached loads nothing."""
        from .distill_teacher import training_device

        device = training_device()
        artifact = artifact if device == "cpu" else None
        made = cls(None, None, teacher.tokenizer, teacher.recipe.pooling, seq_len, artifact)
        if device != "cpu":
            made.path, made.batch, made.row_int8 = "gpu", GPU_BATCH, False
        made._load = lambda: _pytorch_teacher(teacher.folder, teacher.recipe, device)
        return made

    def _torch(self) -> tuple:
        """``(model, head)`` in PyTorch, loaded now where :meth:`of` left it for later."""
        if self.model is None:
            self.model, self.head = self._load()
        return self.model, self.head

    def _fits(self, artifact) -> bool:
        """The artifact reads as far as the pass truncates (a shorter one would cut what PyTorch reads)."""
        from sharebert_runtime.outdir import read_json

        try:
            return int(read_json(Path(artifact) / "manifest.json")["max_length"]) >= self.seq_len
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def describe(self) -> str:
        """The path in words, for the plan's and the pass's lines."""
        if self.path == "onnx":
            compute = "row-int8 compute" if self.row_int8 else f"{self.runtime().ram} in RAM"
            return f"its ONNX artifact, {compute}, {usable_cores()} threads"
        return "PyTorch on the GPU" if self.path == "gpu" else "PyTorch on the CPU"

    def runtime(self):
        """The artifact's runtime, loaded on first use on every usable core, reading at most ``seq_len`` tokens."""
        if self._runtime is None:
            from sharebert_runtime import Runtime

            # ram "auto": RAM int8 only where its parity holds the artifact's 0.99, the bar compress's ladder keeps a
            # teacher by; the vectors are the student's targets (all-MiniLM-L6-v2's RAM int8: 1.81x faster at 0.9825,
            # the loss of the int8-dynamic rung the ladder refuses; benchmarks/teacher_pass.md)
            self._runtime = Runtime(self.artifact, threads=usable_cores(), batch_size=ONNX_BATCH)
            self._runtime.max_length = min(self._runtime.max_length, self.seq_len)
            if self.row_int8:
                row_int8_session(self._runtime)
        return self._runtime

    def close(self) -> None:
        """The runtime's session let go (its memory back before training)."""
        self._runtime = None

    def __call__(self, sentences: list[str], desc: str | None = None) -> np.ndarray:
        if self.path != "onnx":
            from .sentence_vectors import encode

            model, head = self._torch()
            return encode(
                model,
                self.tokenizer,
                sentences,
                self.pooling,
                head,
                seq_len=self.seq_len,
                batch_size=self.batch,
                desc=desc,
            )
        return self._onnx(sentences, desc)

    def _onnx(self, sentences: list[str], desc: str | None) -> np.ndarray:
        """The runtime's vectors, handed over in chunks of ``CHUNK`` texts in token-length order (one progress step
        each; the runtime orders each chunk again and cuts it into calls of like length)."""
        from ..formats.bars import bar

        rt = self.runtime()
        if not sentences:
            return np.zeros((0, 0), dtype=np.float32)
        lengths = [len(e.ids) for e in rt.tokenizer.encode_batch(list(sentences))]
        order = np.argsort(lengths, kind="stable")
        out = [None] * len(sentences)
        for i in bar(range(0, len(order), CHUNK), desc is not None, desc=desc, unit="chunk"):
            idx = order[i : i + CHUNK]
            for j, row in zip(idx, rt.embed([sentences[j] for j in idx], normalize=False)):
                out[j] = row
        return np.stack(out).astype(np.float32, copy=False)


def _pytorch_teacher(folder, recipe, device: str) -> tuple:
    """The teacher's backbone and Dense head (None without one) in PyTorch, on ``device``."""
    from .distill_embedding_model import load_encoder, recipe_head

    model, head = load_encoder(folder).to(device), recipe_head(folder, recipe)
    return model, head.to(device) if head is not None else None
