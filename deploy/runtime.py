"""Torch-free inference on an exported sharebert artifact (ONNX Runtime, numpy, tokenizers only).

An artifact is a folder written by ``sharebert export``: ``model.onnx``, ``config.json``, the
tokenizer files and ``manifest.json`` (task, labels, maximum length, ONNX Runtime session entries and
the sha256 of every file). :class:`Runtime` verifies every file before it loads anything.

``ram="int8"`` (compact artifacts): rather than letting ONNX Runtime fold the generated weights to
fp32 (four bytes per generated number), the runtime makes them a few rows of ``ram_int8/rows.onnx`` at a
time (and the others from one run of ``ram_int8/generator.onnx``, or of each ``generator.N.onnx`` past 4 MB
of them), quantizes them per output channel in numpy and feeds the int8 arrays (bound once as ``OrtValue``s)
to ``ram_int8/compute.onnx``'s dynamic-int8 MatMuls on every run: no weight is ever whole in fp32. After the
tokenizer, the first session and the load, the libraries' load-only code is given back (``memory.settle``).
"""

from __future__ import annotations

import copy
import numbers
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from .artifact import (
    DEPTH,
    EXTERNAL_DATA_FOLDER,
    MODEL,
    PAIRS,
    PAST,
    PRESENT,
    TOKENIZER,
    ArtifactError,
    check_fits_model,
    check_generated_shape,
    check_ram_int8_record,
    depth_limit,
    model_config,
    model_feeds,
    model_files,
    open_ort_format,
    product_rows,
    quantize_per_channel,
    quantize_rows,
    session_options,
    verify_artifact,
)
from .errors import first_line
from .memory import give_back, settle
from .pooling import check_mode, l2_normalize, pool
from .untrusted import TOKENIZER_BYTES, check_size

RAM_MODES = ("auto", "fp32", "int8")
# ONNX Runtime's intra-op threads: more than a machine has cores only slows it; 10**9 was a std::bad_alloc at load
MAX_THREADS = 1024
NO_PREPACKING = "session.disable_prepacking"


def resolved_ram(manifest: dict, ram: str = "auto") -> str:
    """``ram``, with ``"auto"`` made ``"int8"`` for an artifact whose weights are stored int8, that has RAM-int8
    graphs (a compact ``--quantize int8`` export, as ``compress`` writes) and whose RAM-int8 parity, measured at
    export, holds the int8 thresholds; else ``"fp32"``. Such an artifact's weights already carry int8 precision:
    holding the generated ones as int8 adds the rounding of dynamic-int8 activations and saves most of the RAM that
    ORT's fp32 folding spends (docs/DEVICE.md "Memory"); where that rounding costs more than the thresholds allow
    (a 6-layer BERT teacher), or was never measured, the default keeps fp32 answers."""
    if ram != "auto":
        return ram
    entry = manifest.get("ram_int8") or {}
    measured = (entry.get("parity") or {}).get("below_thresholds")
    int8_ready = (
        manifest.get("quantization") == "int8"
        and entry.get("weights")
        and manifest.get("model_format") != "ort"
        and measured == []
    )
    return "int8" if int8_ready else "fp32"


class Predictions(list):
    """One result per input text, in order; ``truncated`` counts inputs cut to the maximum length."""

    def __init__(self, items=(), truncated: int = 0):
        super().__init__(items)
        self.truncated = truncated


class Runtime:
    """Runs an exported artifact: ``fill_mask``, ``classify``, ``embed`` or ``generate`` by task.

    ``threads``: ONNX Runtime intra-op threads (default: ORT's choice). ``providers``: ORT execution
    providers (default CPU). ``ram``: ``"fp32"`` (ORT folds generated weights to fp32), ``"int8"``
    (generated weights held as int8, dynamic-int8 MatMuls; compact artifacts only) or ``"auto"`` (the
    default: :func:`resolved_ram`); ``self.ram`` is the mode used. Every method takes
    a list of texts (or one text) and returns :class:`Predictions` in the order of the texts. Safe to
    call from several threads. A request's texts are tokenized once, ordered by token length
    (``group_by_length``) and cut into ONNX Runtime calls of similar lengths, each padded to its own
    longest text; each call holds at most ``batch_size`` texts and ``max_batch_tokens`` padded tokens.
    Set ``max_batch_tokens`` or ``group_by_length=False`` (calls in input order) on the instance.
    """

    max_batch_tokens = 2048  # padded tokens per ONNX Runtime call: bounds its (B, T, vocabulary) outputs
    group_by_length = True  # calls of texts of similar token lengths (False: calls in input order)

    def __init__(  # 7: the public constructor: keywords with defaults, most of them `sharebert predict`'s options
        self,
        artifact_dir: str | Path,
        threads: int | None = None,
        providers: list[str] | None = None,
        ram: str = "auto",
        batch_size: int = 32,
        manifest_sha256: str | None = None,
        depth: int | None = None,
    ):
        if ram not in RAM_MODES:
            raise ValueError(f"ram must be one of {', '.join(RAM_MODES)}, got {ram!r}")
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS
        ):
            raise ValueError(
                f"threads must be an integer in 1..{MAX_THREADS} (this machine has {os.cpu_count()} CPUs), "
                f"got {threads!r}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.path = Path(artifact_dir)
        self.manifest = verify_artifact(self.path, manifest_sha256)
        self.max_depth = self.manifest.get("max_depth")
        self.depth = self._checked_depth(depth)
        self.task = self.manifest["task"]
        self.labels = self.manifest.get("labels")
        self.pairs = self.manifest.get(
            PAIRS
        )  # text-classification: trained on pairs (True), single texts, None: not said
        self.max_length = int(self.manifest["max_length"])
        self.ram = ram = resolved_ram(self.manifest, ram)
        self.batch_size = batch_size
        self.providers = providers or ["CPUExecutionProvider"]
        self.threads = threads
        special = self.manifest.get("special_tokens") or {}
        self.tokenizer = _load_tokenizer(self.path / TOKENIZER)
        for name, token_id in special.items():  # id_to_token: get_vocab_size(with_added_tokens) copies the vocabulary
            if token_id >= 1 << 32 or self.tokenizer.id_to_token(token_id) is None:  # ids are u32 in tokenizers
                raise ArtifactError(
                    f"{self.path / 'manifest.json'}: special_tokens {name} = {token_id} is not an id of "
                    f"tokenizer.json ({self.tokenizer.get_vocab_size(with_added_tokens=True)} tokens)"
                )
        self.pad_id = int(special.get("pad", 0))
        self.mask_id = special.get("mask")
        self.cls_id = special.get("cls")
        self.sep_id = special.get("sep")
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        # the JSON parse's code and freed blocks, before a session's code (the load peaks at the first session)
        settle()
        self._int8_inputs: dict[str, ort.OrtValue] = {}
        self._pair_tokenizer = None  # made on the first pair: truncation longest first
        # a model with one token type (type_vocab_size 1) reads a pair with type 0 throughout, as it was trained
        self._one_token_type = model_config(self.path).get("type_vocab_size") == 1
        if self.manifest.get("model_format") == "ort":
            self.session = self._load_ort()
        elif ram == "int8":
            self.session = self._load_int8()
        else:
            self.session = _open_session(self.path / model_files(self.manifest)[0], self._options(), self.providers)
        self.inputs = [i for i in self.session.get_inputs() if i.name not in self._int8_inputs]
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.cached = any(n.startswith(PAST) for n in self.input_names)  # a causal LM exported with its cache
        self._check_output()
        check_fits_model(
            self.manifest,
            self.path,  # an input with a default (depth) is an overridable initializer
            self.input_names + [i.name for i in self.session.get_overridable_initializers()],
        )
        settle()

    def _check_output(self) -> None:
        """The graph's first output fits the manifest's task: ``(B, T, ...)`` per token, or ``(B, labels)``."""
        shape = self.session.get_outputs()[0].shape
        if self.task == "text-classification":
            width = 1 if self.manifest.get("problem_type") == "regression" else len(self.labels or [])
            fits = len(shape) == 2 and (not isinstance(shape[1], int) or shape[1] == width)
        else:
            fits = len(shape) == 3 and _width_fits(self.task, shape[-1], model_config(self.path), self.mask_id)
        if not fits:
            raise ArtifactError(
                f"{self.path / 'manifest.json'}: task {self.task!r} (labels {self.labels}) does not fit "
                f"the model's output of shape {shape}"
            )
        embedding = self.manifest.get("embedding")
        if embedding and embedding["output"] not in self.output_names:
            raise ArtifactError(
                f"{self.path / 'manifest.json'}: embedding output {embedding['output']!r} is not an "
                f"output of the model ({', '.join(self.output_names)})"
            )

    # -- depth ---------------------------------------------------------------------------------
    def _checked_depth(self, depth) -> int | None:
        """``depth`` if this artifact can run that many encoder layers (None: all of them)."""
        if depth is None:
            return None
        limit = depth_limit(self.manifest, self.path)
        if isinstance(depth, (bool, np.bool_)) or not isinstance(depth, numbers.Integral) or not 1 <= depth <= limit:
            raise ValueError(f"depth must be an integer in 1..{limit} (the model's layers), got {depth!r}")
        return int(depth)

    def at_depth(self, depth: int | None) -> Runtime:
        """This runtime running only the first ``depth`` encoder layers (None: all): a view sharing the
        loaded sessions and weights, so it costs no memory. Layer-shared models run every layer on the same
        generated weights, so a shallower depth needs nothing new; see ``sharebert evaluate glue --depths``
        for what each depth scores."""
        view = copy.copy(self)
        view.depth = self._checked_depth(depth)
        return view

    # -- loading ------------------------------------------------------------------------------
    def _options(self, **kwargs) -> ort.SessionOptions:
        """The artifact's session options; no CPU arena, so a large batch's activations are given back. RAM int8
        also turns ORT's pre-packing off: its weights are graph inputs (nothing to pack), and packing the load-time
        graph's folded fp32 sources would only add a copy of them to the peak (47 -> 35 MB above the imports
        for the compress student, same speed; docs/DEVICE.md "Memory")."""
        config = dict(self.manifest.get("session_config") or {})
        if self.ram == "int8":
            config[NO_PREPACKING] = "1"
        return session_options(config, self.threads, arena=False, **kwargs)

    def _load_int8(self) -> ort.InferenceSession:
        """Generate the weights once, quantize them, bind the int8 arrays; return the compute session.

        A ``ram_int8`` entry that does not fit its graphs (widths, shapes, names edited by hand) is an
        :class:`ArtifactError` naming ``manifest.json``, whatever part of the load notices it."""
        ram = self.manifest.get("ram_int8")
        if not ram or not ram.get("weights"):
            raise ArtifactError(
                f"{self.path / 'manifest.json'} has no ram_int8 graphs: RAM int8 needs a compact export "
                f"(`sharebert export --weights compact`); use ram='fp32' for this artifact"
            )
        try:
            compute = self._generate_int8(ram)
        except (ArtifactError, MemoryError):
            raise
        except Exception as e:  # ONNX Runtime's errors, numpy's shape errors: the entry does not fit the graphs
            raise ArtifactError(
                f"{self.path / 'manifest.json'}: ram_int8 does not match its graphs ({first_line(e)})"
            ) from None
        check_ram_int8_record(compute, ram, self.path / "manifest.json")
        declared = {i.name: i.shape for i in compute.get_inputs()}
        for name, value in self._int8_inputs.items():
            if declared.get(name) != list(value.shape()):
                raise ArtifactError(
                    f"{self.path / 'manifest.json'}: ram_int8 {name} has shape {value.shape()}, "
                    f"{ram['compute']} takes {declared.get(name, 'no such input')}"
                )
        return compute

    def _generate_int8(self, ram: dict) -> ort.InferenceSession:
        opened = []

        def graph(file, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):  # default: no folding (run once, freed)
            session = _open_session(self.path / file, self._options(level=level), ["CPUExecutionProvider"], self.path)
            if (
                not opened
            ):  # the load's first session: its code (kernel registry, graph passes) before the runs' buffers
                settle()
                opened.append(file)
            return session

        def keep(w, q, scale):
            self._int8_inputs[w["int8"]] = ort.OrtValue.ortvalue_from_numpy(q)
            self._int8_inputs[w["scale"]] = ort.OrtValue.ortvalue_from_numpy(scale)

        cut = [w for w in ram["weights"] if "offset" in w]
        if cut:  # most weights: a few rows of their product at a time, never a whole weight in fp32
            # BASIC folds the small constant parts; an int8 source sliced by columns is dequantized per call
            session = graph(ram["rows"], ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
            rows = product_rows(session, ram["width"], ram["height"])
            out = [
                (np.empty(w["shape"], np.int8), np.empty(w["shape"][1], np.float32)) for w in cut
            ]  # before any chunk
            for w, arrays in zip(cut, out):
                keep(w, *quantize_rows(rows, ram["width"], w["offset"], w["shape"], arrays))
            del session, rows, out
            give_back()  # the freed chunks, before the next phase allocates
        whole = [w for w in ram["weights"] if "offset" not in w]
        graphs = {}  # e.g. the transposed embeddings of a tied decoder, a dense teacher's weights (a few MB a graph)
        for w in whole:
            graphs.setdefault(w.get("generator", ram.get("generator")), []).append(w)
        for name, weights in graphs.items():
            session = graph(name)
            declared = {o.name: o.shape for o in session.get_outputs()}
            for w in weights:
                check_generated_shape(w, declared.get(w["output"]), self.path / "manifest.json")
            generated = session.run([w["output"] for w in weights], {})  # ONNX Runtime runs every node of a graph
            del session
            for w in weights:
                keep(w, *quantize_per_channel(generated.pop(0), w["layout"]))
            give_back()
        compute = _open_session(self.path / ram["compute"], self._options(), self.providers, self.path)
        give_back()
        return compute

    def _load_ort(self) -> ort.InferenceSession:
        """An ORT-format artifact: run the generator once, write its outputs into the compute graph's holes,
        open the result (its weights are initializers, so ORT prepacks them as for a folded ONNX graph)."""
        entry = self.manifest["ort"]
        if self.ram != "fp32":
            raise ValueError(
                f"ram={self.ram!r} is not available for ORT-format artifacts ({self.path}): use ram='fp32', "
                f"or export with --format onnx for the RAM-int8 mode"
            )
        return open_ort_format(
            self.path,
            entry,
            self._options(),
            self.providers,
            self._options(level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        )

    # -- encoding -----------------------------------------------------------------------------
    def _truncate(self, ids: list[int], special_tokens: bool) -> list[int]:
        """Cut one encoding to ``max_length`` (keeping the final ``[SEP]`` when special tokens are added)."""
        if len(ids) <= self.max_length:
            return ids
        return ids[: self.max_length - 1] + [ids[-1]] if special_tokens else ids[-self.max_length :]

    def _pad(self, rows: list[list[int]]):
        """Token ids ``(B, T)`` padded to the longest row, and the attention mask."""
        T = max(1, max(len(r) for r in rows))
        input_ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=np.int64)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        return input_ids, mask

    def _tokenized(self, texts, special_tokens: bool = True) -> tuple[list[list[int]], int]:
        """Each text's token ids, cut to ``max_length``, and how many texts were cut.

        Encoded ``batch_size`` texts at a time: only the ids outlive the tokenizer's encodings.
        """
        rows, cut = [], 0
        for batch in self._batches(texts):
            for enc in self.tokenizer.encode_batch(batch, add_special_tokens=special_tokens):
                rows.append(self._truncate(enc.ids, special_tokens))
                cut += len(rows[-1]) < len(enc.ids)
        return rows, cut

    def _pair_tokenized(self, texts, text_pair) -> tuple[list[tuple[list[int], list[int]]], int]:
        """``(ids, token type ids)`` of each ``(text, text_pair)`` as the tokenizer makes them (``[CLS] a [SEP]
        b [SEP]``, types 0 then 1), cut to ``max_length`` longest first (transformers' default), and the count cut."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not isinstance(text_pair, str) and (
            isinstance(text_pair, (dict, set, bytes)) or not hasattr(text_pair, "__iter__")
        ):
            raise TypeError(f"text_pair must be a string or a list of strings, got {type(text_pair).__name__}")
        pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
        if len(pairs) != len(texts):
            raise ValueError(f"text_pair must give one second text per text: {len(texts)} texts, {len(pairs)} pairs")
        for x in (texts, pairs):
            for _ in self._batches(x):  # a TypeError for a non-string
                pass
        if self._pair_tokenizer is None:
            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(self.max_length, strategy="longest_first")
            self._pair_tokenizer = tokenizer
        rows, cut = [], 0
        for start in range(0, len(texts), self.batch_size):
            end = start + self.batch_size
            for enc in self._pair_tokenizer.encode_batch(list(zip(texts[start:end], pairs[start:end]))):
                rows.append((enc.ids, enc.type_ids))
                cut += bool(enc.overflowing)
        return rows, cut

    def _encode(self, texts: list[str], special_tokens: bool = True):
        """One padded batch of all ``texts``: token ids ``(B, T)``, the attention mask, the truncation count."""
        rows, cut = self._tokenized(texts, special_tokens)
        return (*self._pad(rows), cut)

    def _calls(self, lengths: list[int], size: int, budget: int | None = None):
        """Yield the positions of the rows of each ONNX Runtime call (a list of ints into ``lengths``).

        Rows are taken shortest first (``group_by_length``) or in input order; a call holds at most
        ``size`` rows and, padded to its longest, ``budget`` tokens (one row at least).
        """
        order = sorted(range(len(lengths)), key=lengths.__getitem__) if self.group_by_length else range(len(lengths))
        call, width = [], 0
        for i in order:
            if call and (len(call) == size or budget and (len(call) + 1) * max(width, lengths[i]) > budget):
                yield call
                call, width = [], 0
            call.append(i)
            width = max(width, lengths[i])
        if call:
            yield call

    def _answered(self, texts, answer, text_pair=None) -> Predictions:
        """Run ``answer(input_ids (B, T), attention_mask (B, T)) -> B results`` per call; results in input order.

        Calls hold at most ``batch_size`` texts and ``max_batch_tokens`` padded tokens, so the outputs'
        memory is bounded by the budget, not by the request; each is padded to its own longest text.
        ``text_pair``: second texts (one per text); ``answer`` then also gets the token type ids ``(B, T)``.
        """
        if text_pair is None:
            rows, cut = self._tokenized(texts)
            types = None
        else:
            pairs, cut = self._pair_tokenized(texts, text_pair)
            rows, types = [ids for ids, _ in pairs], (None if self._one_token_type else [t for _, t in pairs])
        results = [None] * len(rows)
        for call in self._calls([len(r) for r in rows], self.batch_size, self.max_batch_tokens):
            ids, mask = self._pad([rows[i] for i in call])
            extra = ()
            if types is not None:
                type_ids = np.zeros_like(ids)
                for j, i in enumerate(call):
                    type_ids[j, : len(types[i])] = types[i]
                extra = (type_ids,)
            for i, result in zip(call, answer(ids, mask, *extra)):
                results[i] = result
        return Predictions(results, cut)

    def token_count(self, texts, special_tokens: bool = True, text_pair=None) -> int:
        """Tokens the model will see for ``texts`` (each cut to ``max_length``, with its ``text_pair``), padding
        not counted."""
        if text_pair is not None:
            return sum(len(ids) for ids, _ in self._pair_tokenized(texts, text_pair)[0])
        return sum(map(len, self._tokenized(texts, special_tokens)[0]))

    def request_size(self, texts, text_pair=None) -> tuple[int, int]:
        """``(tokens, [MASK] tokens)`` the model will see for ``texts`` (as :meth:`token_count`; ``[MASK]``
        tokens are the rows a fill-mask answers, ``top_k`` candidates each; 0 without a mask token)."""
        if text_pair is not None:
            return self.token_count(texts, text_pair=text_pair), 0
        rows = self._tokenized(texts)[0]
        return sum(map(len, rows)), 0 if self.mask_id is None else sum(row.count(self.mask_id) for row in rows)

    def _run(
        self,
        input_ids: np.ndarray,
        mask: np.ndarray,
        past: dict | None = None,
        token_type_ids: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """One ONNX Runtime call: every output by name (a causal LM's ``present.*`` too)."""
        feeds = model_feeds(self.inputs, input_ids, mask, past)
        if token_type_ids is not None and "token_type_ids" in feeds:
            feeds["token_type_ids"] = token_type_ids
        if self.depth is not None:
            feeds[DEPTH] = np.array(self.depth, dtype=np.int64)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ArtifactError(f"{self.path / MODEL} expects inputs {missing} this runtime cannot provide")
        if self._int8_inputs:
            values = {n: ort.OrtValue.ortvalue_from_numpy(v) for n, v in feeds.items()}
            values.update(self._int8_inputs)
            outs = [o.numpy() for o in self.session.run_with_ort_values(self.output_names, values)]
        else:
            outs = self.session.run(self.output_names, feeds)
        return {n: np.asarray(o, dtype=np.float32) for n, o in zip(self.output_names, outs)}

    def _batches(self, texts, size: int | None = None):
        """Lists of at most ``size`` (default ``batch_size``) texts; raises ``TypeError`` for a non-string."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts must be strings, got {type(t).__name__}")
            if not t.isascii():
                _check_encodable(t, i)
        size = size or self.batch_size
        for start in range(0, len(texts), size):
            yield texts[start : start + size]

    def _need(self, *tasks: str) -> None:
        if self.task not in tasks:
            raise ValueError(f"this artifact's task is {self.task!r}; this method needs {' or '.join(tasks)}")

    # -- tasks --------------------------------------------------------------------------------
    def fill_mask(self, texts, top_k: int = 5) -> Predictions:
        """Per text, per ``[MASK]`` (in order): the ``top_k`` tokens ``{"token", "token_id", "score"}``.

        Only the rows at ``[MASK]`` positions are kept from each call's logits, and only their
        ``top_k`` survive it: the full ``(B, T, vocabulary)`` array lives for one call of at most
        ``max_batch_tokens`` padded tokens.
        """
        self._need("fill-mask")
        if self.mask_id is None:
            raise ArtifactError(f"{self.path / 'manifest.json'} names no mask token")
        if top_k < 1:
            raise ValueError(f"top_k must be positive, got {top_k}")

        def answer(ids, mask):
            rows, cols = np.nonzero(ids == self.mask_id)
            logits = self._run(ids, mask)[self.output_names[0]]
            picked = [top_k_softmax(logits[rows[i : i + 64], cols[i : i + 64]], top_k) for i in range(0, len(rows), 64)]
            del logits
            best = [t for tokens, _ in picked for t in tokens]
            scores = [p for _, probs in picked for p in shortest_floats(probs)]
            answers = [[] for _ in range(len(ids))]
            for row, tokens, probs in zip(rows, best, scores):
                answers[row].append(
                    [
                        {"token": self.tokenizer.id_to_token(int(t)), "token_id": int(t), "score": p}
                        for t, p in zip(tokens, probs)
                    ]
                )
            return answers

        return self._answered(texts, answer)

    def classify(self, texts, text_pair=None) -> Predictions:
        """Per text ``{"label", "score", "scores": {label: probability}}``; regression (e.g. STS-B): ``{"score"}``.

        ``text_pair``: the second text of each pair (a string or a list, one per text) for a model fine-tuned
        on pairs (STS-B, MRPC, QNLI, RTE): encoded together as the tokenizer does, with token types 0 and 1."""
        self._need("text-classification")
        regression = self.manifest.get("problem_type") == "regression"

        def answer(ids, mask, type_ids=None):
            outs = self._run(ids, mask) if type_ids is None else self._run(ids, mask, token_type_ids=type_ids)
            logits = outs[self.output_names[0]]
            if regression:
                return [{"score": float(row[0])} for row in logits]
            names = self.labels or [f"LABEL_{i}" for i in range(logits.shape[-1])]
            return [
                {
                    "label": names[int(np.argmax(probs))],
                    "score": float(probs.max()),
                    "scores": {n: float(p) for n, p in zip(names, probs)},
                }
                for probs in _softmax(logits)
            ]

        return self._answered(texts, answer, text_pair)

    def embed(self, texts, pooling: str | None = None, normalize: bool | None = None) -> Predictions:
        """Per text a float32 sentence vector, by the artifact's recipe (``manifest["embedding"]``: the model
        folder's sentence-transformers pooling, Dense layers and normalisation; artifacts without one pool
        the ``[CLS]`` state, unnormalised).

        ``pooling`` (one of :data:`~sharebert_runtime.pooling.POOLING_MODES`): pool the encoder's token states this way
        instead. The recipe's Dense layers were trained on its own pooling, so a different mode gives the pooled token
        states (hidden-size vectors) without them; the recipe's own mode is the default. ``normalize``: L2-normalise or
        not (default: as the recipe says); ``False`` gives the recipe's vector unnormalised in a web folder too, whose
        graph normalises (:meth:`_unnormalized`)."""
        self._need("feature-extraction")
        recipe = self.manifest.get("embedding") or {"pooling": "cls", "normalize": False}
        pooling = check_mode(recipe["pooling"] if pooling is None else pooling)
        normalize = recipe["normalize"] if normalize is None else normalize
        if not isinstance(normalize, (bool, np.bool_)):
            raise ValueError(f"normalize must be true or false, got {normalize!r}")
        in_graph = recipe.get("output") if pooling == recipe["pooling"] else None
        if in_graph and recipe["normalize"] and not normalize:
            in_graph = self._unnormalized(in_graph)
        if recipe.get("do_lower_case"):
            texts = [t.lower() if isinstance(t, str) else t for t in ([texts] if isinstance(texts, str) else texts)]

        def answer(ids, mask):
            outs = self._run(ids, mask)
            vectors = outs[in_graph] if in_graph else pool(outs[self.output_names[0]], mask, pooling)
            del outs
            if normalize:
                vectors = l2_normalize(vectors)
            return list(np.array(vectors, dtype=np.float32))  # copies: the (B, T, H) states are freed

        return self._answered(texts, answer)

    def _unnormalized(self, output: str) -> str:
        """The graph output holding ``output`` before the recipe's Normalize: ``output`` itself, except in a web
        folder, whose graph normalises it (``manifest["web"]["unnormalized_output"]`` keeps the vector before);
        a web folder without that output refuses ``normalize=False`` in one line rather than give normalised
        vectors."""
        if self.manifest.get("model_format") != "web":
            return output
        raw = (self.manifest.get("web") or {}).get("unnormalized_output")
        if raw not in self.output_names:
            raise ValueError(
                f"{self.path}'s graph normalises {output} and keeps no vector before it: normalize=False needs "
                "the folder exported again (sharebert export --format web), or an artifact of --format onnx"
            )
        return raw

    def generate(self, prompts, max_new_tokens: int = 20, use_cache: bool = True) -> Predictions:
        """Greedy continuation of each prompt (a causal-LM artifact): the generated text only.

        With the artifact's key/value cache (``use_cache``, artifacts exported with one) each new token
        costs one position's work; without, the whole window is run again per token. Past
        ``max_length`` tokens the window slides (run again from an empty cache); ``truncated`` counts
        prompts cut to fit.
        """
        self._need("causal-lm")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        start = [self.cls_id] if self.cls_id is not None else []
        seqs = [
            start + e.ids or [self.pad_id]
            for batch in self._batches(prompts)
            for e in self.tokenizer.encode_batch(batch, add_special_tokens=False)
        ]
        out = Predictions([None] * len(seqs), sum(len(s) > self.max_length for s in seqs))
        rows = max(1, min(self.batch_size, self.max_batch_tokens // self.max_length))  # windows grow to max_length
        step = self._cached_steps if use_cache and self.cached else self._window_steps
        for call in self._calls([len(s) for s in seqs], rows):
            for i, new in zip(call, step([seqs[i] for i in call], max_new_tokens)):
                out[i] = self.tokenizer.decode(new)
        return out

    def _windows(self, seqs, new, left: bool):
        """The last ``max_length`` tokens of each sequence, padded left or right: ids and mask ``(B, T)``."""
        window = [(s + n)[-self.max_length :] for s, n in zip(seqs, new)]
        T = max(len(w) for w in window)
        ids = np.full((len(window), T), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, w in enumerate(window):
            cols = slice(T - len(w), T) if left else slice(0, len(w))
            ids[i, cols], mask[i, cols] = w, 1
        return ids, mask

    def _window_steps(self, seqs, steps: int) -> list[list[int]]:
        new = [[] for _ in seqs]
        for _ in range(steps):
            ids, mask = self._windows(seqs, new, left=False)
            logits = self._run(ids, mask)[self.output_names[0]]
            for i, token in enumerate(np.argmax(logits[np.arange(len(seqs)), mask.sum(1) - 1], axis=-1)):
                new[i].append(int(token))
        return new

    def _cached_steps(self, seqs, steps: int) -> list[list[int]]:
        """Left-padded windows, then one token per call against the returned keys and values."""
        new, past = [[] for _ in seqs], None
        ids, mask = self._windows(seqs, new, left=True)
        for _ in range(steps):
            outs = self._run(ids, mask, past)
            tokens = np.argmax(outs[self.output_names[0]][:, -1], axis=-1)
            for i, token in enumerate(tokens):
                new[i].append(int(token))
            if mask.shape[1] + 1 > self.max_length:  # no position left: slide the window, empty cache
                ids, mask, past = *self._windows(seqs, new, left=True), None
            else:
                past = {PAST + n[len(PRESENT) :]: v for n, v in outs.items() if n.startswith(PRESENT)}
                ids, mask = tokens[:, None].astype(np.int64), np.concatenate([mask, np.ones_like(mask[:, :1])], 1)
        return new

    def predict(self, texts, **kwargs) -> Predictions:
        """The artifact's task method: fill_mask, classify, embed or generate."""
        method = {
            "fill-mask": self.fill_mask,
            "text-classification": self.classify,
            "feature-extraction": self.embed,
            "causal-lm": self.generate,
        }[self.task]
        return method(texts, **kwargs)

    def verify(self) -> dict:
        """Replay the inputs the artifact stores (its manifest's ``reference``) and compare with what PyTorch
        answered at export: per output ``max_abs_diff``, ``cosine_min`` / ``cosine_mean``, ``top1_agreement`` and
        ``below`` (the figures outside the artifact's parity thresholds for this RAM mode), ``passed``, this CPU
        and the export's (:mod:`sharebert_runtime.reference`; ``sharebert verify`` prints it). ``ArtifactError`` for an
        artifact exported before it carried a reference."""
        from .reference import verify_runtime

        return verify_runtime(self)

    def metadata(self) -> dict:
        """What a caller needs to know: task, labels, maximum length, quantization, RAM mode."""
        keys = (
            "task",
            "labels",
            "problem_type",
            "pairs",
            "max_length",
            "weights",
            "quantization",
            "learned_params",
            "opset",
        )
        return {
            **{k: self.manifest.get(k) for k in keys},
            "ram": self.ram,
            "int8_generated_weights": len(self._int8_inputs) // 2,
            "depth": self.depth or self.max_depth,
            "max_depth": self.max_depth,
        }


def _open_session(
    path: Path, options: ort.SessionOptions, providers: list[str], data_folder: Path | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime session of ``path``; ``ArtifactError`` naming it when ORT cannot load the graph.

    ``data_folder``: the folder the graph's external data is relative to, when not the graph's own (the
    ``ram_int8/`` graphs read ``model.onnx`` of the artifact folder); the graph is then loaded from bytes."""
    try:
        if data_folder is None:
            return ort.InferenceSession(str(path), options, providers=providers)
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(data_folder))
        return ort.InferenceSession(path.read_bytes(), options, providers=providers)
    except Exception as e:  # ORT's own error classes (InvalidProtobuf, Fail, ...) derive from Exception only
        raise ArtifactError(f"{path} cannot be loaded by ONNX Runtime: {first_line(e)}") from None


def _check_encodable(text: str, i: int) -> None:
    """``ValueError`` for a text the tokenizer cannot take (a lone surrogate, as ``"\\ud800"`` from a JSON escape),
    in the words predict and serve use; the tokenizers library raised its own TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"text {i} is not valid Unicode (a lone surrogate such as \\ud800), not a character") from None


def _width_fits(task: str, width, config: dict, mask_id) -> bool:
    """Whether a per-token output of ``width`` serves ``task``: a fill-mask's (or causal LM's) scores one per token of
    the vocabulary (``config.json``'s ``vocab_size``, past the mask id), a feature-extraction's states
    ``hidden_size`` wide. A task edited in the manifest then is refused, not answered with nonsense."""
    if not isinstance(width, int):
        return True
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if task == "feature-extraction":
        return not isinstance(hidden, int) or width == hidden
    if task == "fill-mask" and isinstance(mask_id, int) and width <= mask_id:
        return False
    return not isinstance(vocab, int) or width == vocab


def _load_tokenizer(path: Path) -> Tokenizer:
    try:  # by its size first: the tokenizers library holds ~5x a file's bytes while it parses it
        check_size(path, path.stat().st_size, TOKENIZER_BYTES)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own base Exception
        raise ArtifactError(f"{path} cannot be read as a tokenizer: {first_line(e)}") from None


def top_k_softmax(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``(N, V)`` logits: the ``k`` most probable ids (best first, ties by lower id) and
    their softmax probabilities, without sorting or normalising a second ``(N, V)`` array."""
    k = min(k, logits.shape[-1])
    if logits.shape[0] == 0:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
    top = np.sort(np.argpartition(-logits, k - 1, axis=-1)[:, :k], axis=-1)  # ascending ids: a stable order
    picked = np.take_along_axis(logits, top, axis=-1)
    order = np.argsort(-picked, axis=-1, kind="stable")
    top, picked = np.take_along_axis(top, order, axis=-1), np.take_along_axis(picked, order, axis=-1)
    peak = logits.max(axis=-1, keepdims=True)
    total = np.exp(logits - peak).sum(axis=-1, keepdims=True)
    return top, np.exp(picked - peak) / total


def shortest_floats(values: np.ndarray) -> list:
    """float32 ``values`` as (nested) Python floats of their shortest decimal form: ``0.33333334`` rather than
    ``0.3333333432674408``, the same float32, about half the characters in JSON."""
    return np.asarray(values, dtype=np.float32).astype(str).astype(float).tolist()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
