"""The package's structure: who may import whom (``RULES``, the documented layers of docs/ARCHITECTURE.md
"Who may import whom"), and no import cycle among its modules (every import counted, module level or not)."""

import ast
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"sharebert": REPO / "sharebert", "sharebert.export": REPO / "export", "sharebert_runtime": REPO / "deploy"}
# Outside the packages, imported by `import sharebert` on a workstation (the registration).
TOP_LEVEL = {"transformers_sharebert": REPO / "transformers_sharebert.py"}


def _modules() -> dict[str, Path]:
    mods = dict(TOP_LEVEL)
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = path
    return mods


def _import_nodes(tree: ast.AST, module_level: bool):
    """The import statements of ``tree``; with ``module_level``, only those run when the module is imported
    (not those inside a function)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported(module_level: bool = False) -> dict[str, set[str]]:
    """``{module: the absolute names it imports}``: modules of the package (``from . import x`` of a submodule
    counts as that submodule) and other packages' dotted names."""
    mods = _modules()
    out = {}
    for name, path in mods.items():
        base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        names = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8")), module_level):
            if isinstance(node, ast.ImportFrom):
                target = node.module
                if node.level:  # relative: up level - 1 packages from this module's package
                    parts = base.split(".")[: len(base.split(".")) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                names.update(subs if len(subs) == len(node.names) else [target, *subs])
            else:
                names.update(a.name for a in node.names)
        out[name] = names - {name}
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import counted."""
    mods = _modules()
    return {m: {f for f in names if f in mods} for m, names in imported().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@dataclass(frozen=True)
class Rule:
    """Modules matching ``covers`` (fnmatch patterns of dotted names; ``exempt`` excepted) import no package
    module matching ``forbids`` (``allowed`` excepted), only package modules matching ``only`` (when set), and
    of other packages only the standard library and ``third_party`` (when set). With ``at_import``, only what
    importing the module runs counts (its module-level imports, followed through the package, except the
    package's ``__init__``, whose registration is decided at run time: docs/ARCHITECTURE.md); else every
    import of the module itself, function bodies included."""

    why: str
    covers: tuple[str, ...]
    exempt: tuple[str, ...] = ()
    forbids: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    third_party: frozenset[str] | None = None
    at_import: bool = False

    def applies_to(self, module: str) -> bool:
        return _matches(module, self.covers) and not _matches(module, self.exempt)


def _matches(name: str, patterns) -> bool:
    return any(fnmatch(name, p) for p in patterns)


DEPLOY = ("sharebert_runtime", "sharebert_runtime.*")
EXPORT = ("sharebert.export", "sharebert.export.*")
DEPLOY_HELPERS = (
    "sharebert_runtime.errors",
    "sharebert_runtime.memory",
    "sharebert_runtime.options",
    "sharebert_runtime.textlines",
    "sharebert_runtime.outdir",
    "sharebert_runtime.untrusted",
    "sharebert_runtime.cpu",
)  # stdlib only; the library uses them too
DEVICE_INSTALL = frozenset({"numpy", "onnxruntime", "tokenizers", "tqdm"})  # the base install (pyproject.toml)
TRAINING_STACK = frozenset(
    {
        "torch",
        "transformers",
        "optimum",
        "onnx",
        "peft",
        "accelerate",
        "safetensors",
        "sentence_transformers",
        "model2vec",
        "datasets",
    }
)
TORCH_FREE = (
    "sharebert.model.shape",
    "sharebert.model.plan",
    "sharebert.accounting.counts",
    "sharebert.accounting.budget",
    "sharebert.accounting.curves",
    "sharebert.formats.model_folder",
    "sharebert.formats.recipe",
    "sharebert.formats.bars",
    "sharebert.formats.paths",
    "sharebert.training.arguments",
    "sharebert.training.glue",
    "sharebert_runtime.main",
    "sharebert.pipelines.compress",  # compress's modules: --help and its checks before any model loads
    "sharebert.pipelines.compress_classifier",
    "sharebert.pipelines.classifier_plan",
    "sharebert.pipelines.plan",
    "sharebert.pipelines.out_folder",
    "sharebert.pipelines.teacher_pass",
    "sharebert.pipelines.quality",
    "sharebert.pipelines.report",
    "sharebert.pipelines.report_rows",
    "sharebert.pipelines.picture",
    "sharebert.pipelines.classifier_report",
    "sharebert.pipelines.run",
    "sharebert.training.fingerprint",  # compress checks its inputs torch-free
    *DEPLOY_HELPERS,
)

# The library's layers, bottom up, and the layers each may import (besides itself, the package's __init__ and
# sharebert_runtime, the bottom layer of all): docs/ARCHITECTURE.md "Who may import whom". export sits beside
# pipelines: it may import the layers below them, and only pipelines and commands import it.
LAYERS = {
    "model": (),
    "formats": ("model",),
    "accounting": ("model",),
    "training": ("model", "formats", "accounting"),
    "pipelines": ("model", "formats", "accounting", "training", "export"),
    "commands": ("model", "formats", "accounting", "training", "pipelines", "export"),
}


def _layer(name: str) -> tuple[str, ...]:
    return (name, f"{name}.*")


def _sharebert(layer: str) -> tuple[str, ...]:
    return EXPORT if layer == "export" else _layer(f"sharebert.{layer}")


LIBRARY_BELOW_PIPELINES = (
    "sharebert",
    "sharebert.__main__",
    "transformers_sharebert",
    *(p for layer in ("model", "formats", "accounting", "training") for p in _sharebert(layer)),
)

RULES = [
    Rule(
        "sharebert_runtime (deploy/) runs on a device's base install: no torch, nothing of sharebert",
        covers=DEPLOY,
        only=DEPLOY,
        third_party=DEVICE_INSTALL,
    ),
    Rule(
        "the runtime's helpers that the library shares are stdlib only",
        covers=DEPLOY_HELPERS,
        only=DEPLOY_HELPERS,
        third_party=frozenset(),
    ),
    *(
        Rule(
            f"sharebert.{layer} imports only {', '.join(below) or 'nothing'} of the library's layers (and the runtime)",
            covers=_sharebert(layer),
            only=("sharebert", *DEPLOY, *_sharebert(layer), *(p for b in below for p in _sharebert(b))),
        )
        for layer, below in LAYERS.items()
    ),
    Rule(
        "the library below the pipelines never imports export; pipelines and commands do",
        covers=LIBRARY_BELOW_PIPELINES,
        forbids=EXPORT,
    ),
    Rule(
        "export imports the library's layers below the pipelines",
        covers=EXPORT,
        forbids=(*_sharebert("pipelines"), *_sharebert("commands")),
    ),
    Rule(
        "export takes of deploy only its artifact contract (with the stored reference's format) and the shared helpers",
        covers=EXPORT,
        forbids=DEPLOY,
        allowed=("sharebert_runtime.artifact", "sharebert_runtime.reference", *DEPLOY_HELPERS),
    ),
    Rule(
        "torch-free modules import no training stack (`report`, `budget`, `--help` answer without torch)",
        covers=TORCH_FREE,
        at_import=True,
    ),
]

# Imports that break a rule, each tolerated here with why. A listed import that no longer happens fails the
# test too, so the table stays the truth.
EXCEPTIONS = {
    (
        "transformers_sharebert",
        "sharebert.export.onnx_config",
    ): "the registration gives optimum's TasksManager sharebert's ONNX config (`import sharebert` imports it)",
    (
        "sharebert_runtime.main",
        "huggingface_hub.utils",
    ): "the command quiets transformers' own progress bars before a library command runs (skipped on a device)",
    (
        "sharebert.export.sentence_embedding",
        "sharebert_runtime.pooling",
    ): "the exported pooling graph and the runtime's pooling share deploy/pooling.py's one list of modes",
    (
        "sharebert.export.ram_int8",
        "sharebert_runtime",
    ): "RAM int8's parity (ram='auto' reads it) and its figures on the stored reference, measured on the finished "
    "folder as the device's runtime runs it",
}


def _package_module(name: str, mods) -> str | None:
    """The package module ``name`` is or lies in (``sharebert_runtime.Runtime`` is ``sharebert_runtime``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def violations(every: dict[str, set[str]], at_import: dict[str, set[str]]) -> set[tuple[str, str, str]]:
    """``{(rule, importer, imported)}`` for every import that breaks a rule, given what each module imports
    (``every``: all its imports; ``at_import``: its module-level ones)."""
    mods = _modules()
    out = set()
    for rule in RULES:
        for module in filter(rule.applies_to, mods):
            names = _closure(module, at_import, mods) if rule.at_import else {(module, n) for n in every[module]}
            for importer, name in names:
                inside = _package_module(name, mods)
                if inside is not None:
                    bad = (_matches(inside, rule.forbids) and not _matches(inside, rule.allowed)) or (
                        rule.only is not None and not _matches(inside, rule.only)
                    )
                else:
                    root = name.split(".")[0]
                    bad = root not in sys.stdlib_module_names and (
                        (rule.third_party is not None and root not in rule.third_party)
                        or (rule.at_import and root in TRAINING_STACK)
                    )
                if bad:
                    out.add((rule.why, importer, inside or name))
    return out


def _closure(module: str, at_import: dict[str, set[str]], mods) -> set[tuple[str, str]]:
    """``{(importer, imported)}`` run by importing ``module``: its module-level imports, followed through the
    package's modules (not the package ``__init__``s)."""
    seen, todo, out = {module}, [module], set()
    while todo:
        importer = todo.pop()
        for name in at_import[importer]:
            out.add((importer, name))
            inside = _package_module(name, mods)
            if inside is not None and inside not in seen and mods[inside].name != "__init__.py":
                seen.add(inside)
                todo.append(inside)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph()
    assert "sharebert.training.finetune" in graph and "sharebert_runtime.runtime" in graph
    assert "sharebert.training.encoded" in graph["sharebert.training.finetune"]
    assert cycles(graph) == []


def test_every_rule_covers_modules_that_exist():
    mods = _modules()
    for rule in RULES:
        assert any(rule.applies_to(m) for m in mods), rule.why
    for patterns in (DEPLOY_HELPERS, TORCH_FREE):
        assert all(p in mods for p in patterns), set(patterns) - set(mods)


def test_who_imports_whom_follows_the_documented_layers():
    found = violations(imported(), imported(module_level=True))
    unexpected = sorted(v for v in found if (v[1], v[2]) not in EXCEPTIONS)
    assert unexpected == [], "\n".join(f"{i} imports {n}: {why}" for why, i, n in unexpected)
    stale = sorted(set(EXCEPTIONS) - {(i, n) for _, i, n in found})
    assert stale == [], f"exceptions that no longer happen, to drop from EXCEPTIONS: {stale}"


def test_the_layer_rules_catch_a_breach():
    every, at_import = imported(), imported(module_level=True)
    every["sharebert_runtime.runtime"].add("torch")  # a device module importing torch, even lazily
    every["sharebert.training.finetune"].add("sharebert.export.exporter")  # the library importing export
    at_import["sharebert.accounting.counts"].add("transformers")  # a torch-free module's import
    every["sharebert.model.shape"].add("sharebert.formats.paths")  # the model importing a layer above it
    every["sharebert.formats.recipe"].add("sharebert.accounting.counts")  # two layers side by side
    every["sharebert.training.finetune"].add("sharebert.pipelines.compress")  # training importing a pipeline
    every["sharebert.export.exporter"].add("sharebert.commands.report")  # export importing the command line
    found = {(i, n) for _, i, n in violations(every, at_import)}
    assert {
        ("sharebert_runtime.runtime", "torch"),
        ("sharebert.training.finetune", "sharebert.export.exporter"),
        ("sharebert.accounting.counts", "transformers"),
        ("sharebert.model.shape", "sharebert.formats.paths"),
        ("sharebert.formats.recipe", "sharebert.accounting.counts"),
        ("sharebert.training.finetune", "sharebert.pipelines.compress"),
        ("sharebert.export.exporter", "sharebert.commands.report"),
    } <= found
    assert (
        "sharebert.accounting.budget",
        "transformers",
    ) not in found  # through accounting: one finding, at its source


def test_the_slow_tier_names_tests_that_exist():
    from conftest import LONGEST_FIRST, SLOW_FILES, SLOW_TESTS

    tests = REPO / "tests"
    named = SLOW_FILES | set(LONGEST_FIRST)
    assert all((tests / f).is_file() for f in named), sorted(f for f in named if not (tests / f).is_file())
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for name in SLOW_TESTS:
        file, test = name.split("::")
        assert f"def {test}(" in (tests / file).read_text(encoding="utf-8"), name
