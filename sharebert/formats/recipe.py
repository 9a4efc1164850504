"""The sentence-embedding recipe of a model folder: how token states become one vector per text.

A sentence-transformers folder says it in its own files: ``modules.json`` (the module chain),
``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``), ``<k>_Pooling/config.json``,
``<k>_Dense/{config.json, model.safetensors}`` and a ``Normalize`` module. ``read_recipe`` reads them
into an ``EmbeddingRecipe``; a folder without ``modules.json`` gets the default recipe (the hidden
state of BERT's [CLS] token, not normalised), and ``source`` says which and why. ``write_recipe``
writes the same files, exactly the layout sentence-transformers 5.x loads with
``SentenceTransformer(folder)``. Each malformed file is refused with a one-line ``ValueError`` that
names it.

Torch-free: stdlib, json and ``sharebert_runtime.pooling`` (numpy), whose ``POOLING_MODES`` are the modes a recipe may
name; safetensors only where Dense weights are read or written.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from sharebert_runtime.outdir import write_json
from sharebert_runtime.pooling import check_mode
from sharebert_runtime.untrusted import JSON_BYTES, optional_file, read_json, regular_file
from sharebert_runtime.untrusted import bool_field as _bool
from sharebert_runtime.untrusted import int_field as _int

# sentence-transformers' names for the pooling modes: its ``pooling_mode`` strings and its legacy boolean keys.
_ST_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "lasttoken",
}
_ST_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Dense activations the exported graph computes: sentence-transformers' ``activation_function`` string -> ONNX op.
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "Identity",
    "torch.nn.modules.activation.Tanh": "Tanh",
    "torch.nn.modules.activation.ReLU": "Relu",
    "torch.nn.modules.activation.Sigmoid": "Sigmoid",
    "torch.nn.modules.activation.GELU": "Gelu",
}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # sentence-transformers' Dense default
_ST = "sentence_transformers."
_MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
DEFAULT_SOURCE = "no sentence-transformers files (modules.json): cls pooling (BERT's [CLS] token), not normalised"


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers ``Dense`` module: ``activation(W x + b)``, W of shape [out_features, in_features]."""

    path: str  # its folder, relative to the model folder
    in_features: int
    out_features: int
    bias: bool
    activation: str  # sentence-transformers' activation_function string, a key of ACTIVATIONS


@dataclass(frozen=True)
class EmbeddingRecipe:
    """Token states [batch, seq, hidden] -> pooling -> each Dense in order -> L2 normalisation if ``normalize``."""

    pooling: str  # one of sharebert_runtime.pooling.POOLING_MODES
    normalize: bool
    dense: tuple[DenseLayer, ...] = ()
    max_seq_length: int | None = None  # texts are cut to this many tokens (None: the model's maximum)
    do_lower_case: bool | None = None  # lower-case texts before the tokenizer (None: not said)
    source: str = DEFAULT_SOURCE  # where the recipe came from, for the manifest and the user

    def __post_init__(self):
        check_mode(self.pooling)
        for layer in self.dense:
            if layer.activation not in ACTIVATIONS:
                raise ValueError(
                    f"Dense activation {layer.activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
                )
        for a, b in zip(self.dense, self.dense[1:]):
            if b.in_features != a.out_features:
                raise ValueError(f"Dense {b.path} takes {b.in_features} features but {a.path} gives {a.out_features}")

    def dimension(self, hidden_size: int) -> int:
        """The embedding's length for an encoder of width ``hidden_size``."""
        return self.dense[-1].out_features if self.dense else hidden_size

    def as_dict(self) -> dict:
        """A JSON-able dict (for a manifest); ``dense`` as a list of dicts."""
        d = asdict(self)
        d["dense"] = [asdict(layer) for layer in self.dense]
        return d


DEFAULT_RECIPE = EmbeddingRecipe(pooling="cls", normalize=False)


def _read_json(path: Path, what: str):
    try:
        return read_json(path, what)  # a regular file of bounded size, strict JSON (sharebert_runtime.untrusted)
    except FileNotFoundError as e:  # a listed file missing is a malformed recipe: one ValueError like the others
        raise ValueError(str(e)) from None


def _module_kind(entry, path: Path) -> tuple[str, str]:
    """(kind, folder) of one ``modules.json`` entry."""
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("type"), str)
        or not isinstance(entry.get("path", ""), str)
    ):
        raise ValueError(f"{path}: each module must be an object with a string 'type' and 'path', got {entry!r}")
    kind = entry["type"].rsplit(".", 1)[-1]
    if not entry["type"].startswith(_ST) or kind not in _MODULE_KINDS:
        raise ValueError(
            f"{path}: module type {entry['type']!r} is not supported (a recipe holds a Transformer, "
            "then Pooling, Dense modules and Normalize)"
        )
    folder = entry.get("path", "")
    if Path(folder).is_absolute() or ".." in Path(folder).parts or "\x00" in folder:
        raise ValueError(f"{path}: module path {folder!r} is not a folder inside the model folder")
    return kind, folder


def _pooling(model_dir: Path, folder: str, hidden_size: int | None) -> str:
    path = model_dir / folder / "config.json"
    cfg = _read_json(path, "the Pooling module's config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object: not a Pooling config")
    if "pooling_mode" in cfg:
        mode = cfg["pooling_mode"]
        modes = list(mode) if isinstance(mode, list) else [mode]
        bad = [m for m in modes if not isinstance(m, str) or m not in _ST_MODES]
        if bad or not modes:
            raise ValueError(f"{path}: pooling_mode {mode!r} is not one of {', '.join(_ST_MODES)}")
        modes = [_ST_MODES[m] for m in modes]
    else:
        for key in _ST_LEGACY_KEYS:
            if key in cfg:
                _bool(cfg[key], path, key)
        modes = [mode for key, mode in _ST_LEGACY_KEYS.items() if cfg.get(key)] or ["mean"]
    if len(modes) != 1:
        raise ValueError(f"{path}: pooling modes {modes} are concatenated; one pooling mode is supported")
    width = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
    if width is not None:
        _int(width, path, "word_embedding_dimension")
        if hidden_size is not None and width != hidden_size:
            raise ValueError(f"{path}: word_embedding_dimension {width} is not the model's hidden_size {hidden_size}")
    return modes[0]


def _dense(model_dir: Path, folder: str) -> DenseLayer:
    path = model_dir / folder / "config.json"
    cfg = _read_json(path, "the Dense module's config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object: not a Dense config")
    for key in ("in_features", "out_features"):
        if key not in cfg:
            raise ValueError(f"{path}: {key} is missing")
        _int(cfg[key], path, key)
    activation = cfg.get("activation_function", _DEFAULT_ACTIVATION)
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(
            f"{path}: activation_function {activation!r} is not supported "
            f"(supported: {', '.join(a.rsplit('.', 1)[-1] for a in ACTIVATIONS)})"
        )
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key) not in (None, "sentence_embedding"):
            raise ValueError(
                f"{path}: {key} {cfg[key]!r} is not supported (a Dense reads and writes 'sentence_embedding')"
            )
    layer = DenseLayer(
        path=folder,
        in_features=cfg["in_features"],
        out_features=cfg["out_features"],
        bias=_bool(cfg.get("bias", True), path, "bias"),
        activation=activation,
    )
    _dense_weights_file(model_dir / folder, layer)
    return layer


DENSE_HEADER_BYTES = 1 << 20  # a Dense safetensors file's header and padding, beyond its tensors' bytes


def _dense_weights_file(folder: Path, layer: DenseLayer | None = None) -> Path:
    """The Dense module's ``model.safetensors``: a regular file (a FIFO or device under that name is an error, never
    "not found") no larger than ``layer``'s weights in float64 and a header (a huge file is refused unread)."""
    weights = folder / "model.safetensors"
    if not os.path.lexists(weights):
        other = [p.name for p in folder.glob("*.bin")]
        hint = f" ({', '.join(other)} is a pickle, never loaded: save the model with safetensors)" if other else ""
        raise ValueError(f"{weights} not found (the Dense module's weights){hint}")
    size = regular_file(weights, "the Dense module's weights")
    if layer is not None:
        limit = DENSE_HEADER_BYTES + 8 * layer.out_features * (layer.in_features + 1)
        if size > limit:
            raise ValueError(
                f"{weights} has {size} bytes, more than a [{layer.out_features}, {layer.in_features}] "
                f"Dense layer's weights can take ({limit}); the file is not this layer's"
            )
    return weights


def _hidden_size(model_dir: Path, config: dict | None = None) -> int | None:
    """``config.json``'s ``hidden_size`` (``config``: the file, already read) when it is an integer (None when the
    file is missing or says none: it only cross-checks widths here; model_folder refuses a bad one). An unreadable
    file is an error, never skipped."""
    path = model_dir / "config.json"
    if config is None and optional_file(path, "the model's config") is None:
        return None
    size = read_json(path, "the model's config", JSON_BYTES) if config is None else config
    size = size.get("hidden_size") if isinstance(size, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def read_recipe(model_dir: str | Path, config: dict | None = None) -> EmbeddingRecipe:
    """The embedding recipe of ``model_dir``: its sentence-transformers files, or ``DEFAULT_RECIPE``
    when it has no ``modules.json``. A malformed file is a one-line ``ValueError`` naming it. ``config``: the folder's
    ``config.json`` where the caller has read it already (it is not read again)."""
    model_dir = Path(model_dir)
    modules_path = model_dir / "modules.json"
    if optional_file(modules_path, "the module list") is None:  # a FIFO, folder or device there is an error
        return DEFAULT_RECIPE
    chain = _module_chain(model_dir, modules_path)
    hidden_size = _hidden_size(model_dir, config)
    pooling = _pooling(model_dir, chain[1][1], hidden_size)
    dense = tuple(_dense(model_dir, folder) for kind, folder in chain if kind == "Dense")
    if dense and hidden_size is not None and dense[0].in_features != hidden_size:
        raise ValueError(
            f"{model_dir / dense[0].path / 'config.json'}: in_features {dense[0].in_features} is not "
            f"the model's hidden_size {hidden_size}"
        )
    max_seq_length, do_lower_case = _transformer_settings(model_dir / "sentence_bert_config.json")
    try:
        return EmbeddingRecipe(
            pooling=pooling,
            normalize=chain[-1][0] == "Normalize",
            dense=dense,
            max_seq_length=max_seq_length,
            do_lower_case=do_lower_case,
            source="modules.json",
        )
    except ValueError as e:
        raise ValueError(f"{modules_path}: {e}") from None


def _module_chain(model_dir: Path, modules_path: Path) -> list[tuple[str, str]]:
    """``modules.json``'s ``(kind, folder)`` list, when it is Transformer (the model folder itself), Pooling,
    Dense..., Normalize in that order, each module in a folder of its own."""
    modules = _read_json(modules_path, "the module list")
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path} is not a JSON list of modules")
    chain = [_module_kind(entry, modules_path) for entry in modules]
    kinds = "".join(kind[0] for kind, _ in chain)  # T, P, D, N
    if not re.fullmatch(r"TPD*N?", kinds):
        raise ValueError(
            f"{modules_path}: modules {[k for k, _ in chain]} are not Transformer, Pooling, Dense..., "
            "Normalize in that order, the chain a recipe supports"
        )
    if chain[0][1] != "":
        raise ValueError(
            f"{modules_path}: the Transformer module is in {chain[0][1]!r}; it must be the model folder "
            'itself (path "")'
        )
    for kind, folder in chain[1:]:
        if kind == "Normalize" and folder and os.path.lexists(model_dir / folder) and not (model_dir / folder).is_dir():
            raise ValueError(f"{modules_path}: the Normalize module's path {model_dir / folder} is not a folder")
        if kind in ("Pooling", "Dense") and Path(folder) == Path("."):
            raise ValueError(
                f"{modules_path}: the {kind} module's path is the model folder itself; its config.json "
                "is the model's, not the module's (give the module its own folder, e.g. 1_Pooling)"
            )
    return chain


def _transformer_settings(st_config: Path) -> tuple[int | None, bool | None]:
    """``(max_seq_length, do_lower_case)`` of ``sentence_bert_config.json`` (None where absent or null)."""
    max_seq_length = do_lower_case = None
    if optional_file(st_config, "the Transformer module's config") is not None:
        cfg = _read_json(st_config, "the Transformer module's config")
        if not isinstance(cfg, dict):
            raise ValueError(f"{st_config} is not a JSON object")
        if cfg.get("max_seq_length") is not None:
            max_seq_length = _int(cfg["max_seq_length"], st_config, "max_seq_length")
        if cfg.get("do_lower_case") is not None:
            do_lower_case = _bool(cfg["do_lower_case"], st_config, "do_lower_case")
    return max_seq_length, do_lower_case


def read_dense_weights(model_dir: str | Path, layer: DenseLayer):
    """(W [out_features, in_features], b [out_features] or None) of ``layer`` as float32 numpy arrays."""
    import numpy as np
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    weights = _dense_weights_file(Path(model_dir) / layer.path, layer)
    try:
        tensors = load_file(weights)
    except (OSError, SafetensorError, ValueError) as e:
        raise ValueError(f"{weights} cannot be read ({e}); the file is damaged") from None
    except TypeError:  # a dtype numpy lacks (bfloat16, unless ml_dtypes was imported): read through torch
        from safetensors.torch import load_file as load_torch

        tensors = {k: v.float().numpy() for k, v in load_torch(weights).items()}
    w = tensors.get("linear.weight")
    if w is None or w.shape != (layer.out_features, layer.in_features):
        raise ValueError(
            f"{weights}: linear.weight must have shape [{layer.out_features}, {layer.in_features}], "
            f"got {None if w is None else list(w.shape)}"
        )
    b = tensors.get("linear.bias")
    if layer.bias and (b is None or b.shape != (layer.out_features,)):
        raise ValueError(
            f"{weights}: linear.bias must have shape [{layer.out_features}], got {None if b is None else list(b.shape)}"
        )
    if not np.isfinite(w).all() or (layer.bias and not np.isfinite(b).all()):
        raise ValueError(f"{weights} holds NaN or infinite weights")
    return w.astype(np.float32), (b.astype(np.float32) if layer.bias else None)


def write_recipe(
    model_dir: str | Path, recipe: EmbeddingRecipe, dense_weights=(), hidden_size: int | None = None
) -> None:
    """Write ``recipe`` into the model folder ``model_dir`` (which already holds the transformers model) as
    sentence-transformers files: ``modules.json`` (module 0 the Transformer at path ""),
    ``sentence_bert_config.json``, ``1_Pooling/config.json``, ``<k>_Dense/{config.json, model.safetensors}``
    and ``<k>_Normalize``. ``dense_weights``: one ``(W [out, in], b [out] or None)`` per ``recipe.dense``
    layer. The layers' ``path`` is ignored (written as ``<k>_Dense``). ``hidden_size``: the encoder's width
    (default: ``config.json``'s ``hidden_size``)."""
    import numpy as np

    model_dir = Path(model_dir)
    hidden_size = hidden_size or _hidden_size(model_dir)
    if hidden_size is None:
        raise ValueError(f"{model_dir / 'config.json'} gives no hidden_size; pass hidden_size")
    dense_weights = list(dense_weights)
    if len(dense_weights) != len(recipe.dense):
        raise ValueError(
            f"the recipe has {len(recipe.dense)} Dense layers but {len(dense_weights)} weight pairs were given"
        )
    if recipe.dense and recipe.dense[0].in_features != hidden_size:
        raise ValueError(
            f"the first Dense takes {recipe.dense[0].in_features} features but the model's hidden_size is {hidden_size}"
        )
    arrays = []
    for layer, (w, b) in zip(recipe.dense, dense_weights):
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.shape != (layer.out_features, layer.in_features):
            raise ValueError(
                f"Dense weight of shape {list(w.shape)} given for a [{layer.out_features}, {layer.in_features}] layer"
            )
        if layer.bias != (b is not None):
            raise ValueError(
                f"Dense layer has bias={layer.bias} but its bias {'is missing' if b is None else 'was given'}"
            )
        if b is not None:
            b = np.ascontiguousarray(b, dtype=np.float32)
            if b.shape != (layer.out_features,):
                raise ValueError(f"Dense bias of shape {list(b.shape)} given for {layer.out_features} outputs")
        arrays.append((w, b))

    from safetensors.numpy import save_file

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _ST + "models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST + "models.Pooling"},
    ]
    write_json(
        model_dir / "1_Pooling" / "config.json",  # the boolean keys: every sentence-transformers version reads them
        {
            "word_embedding_dimension": hidden_size,
            **{key: value == recipe.pooling for key, value in _ST_LEGACY_KEYS.items()},
        },
    )
    for layer, (w, b) in zip(recipe.dense, arrays):
        k = len(modules)
        folder = f"{k}_Dense"
        modules.append({"idx": k, "name": str(k), "path": folder, "type": _ST + "models.Dense"})
        write_json(
            model_dir / folder / "config.json",
            {
                "in_features": layer.in_features,
                "out_features": layer.out_features,
                "bias": layer.bias,
                "activation_function": layer.activation,
            },
        )
        save_file(
            {"linear.weight": w, **({"linear.bias": b} if b is not None else {})},
            str(model_dir / folder / "model.safetensors"),
        )
    if recipe.normalize:
        k = len(modules)
        modules.append({"idx": k, "name": str(k), "path": f"{k}_Normalize", "type": _ST + "models.Normalize"})
        (model_dir / f"{k}_Normalize").mkdir(exist_ok=True)
    write_json(
        model_dir / "sentence_bert_config.json",
        {"max_seq_length": recipe.max_seq_length, "do_lower_case": bool(recipe.do_lower_case)},
    )
    write_json(model_dir / "modules.json", modules)
