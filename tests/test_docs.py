"""The docs run as written: every ```bash and ```python block of README.md and docs/*.md (not docs/lab/, the
lab notes), in reading order (``DOC_ORDER``, then any other page alphabetically), in one scratch folder, with
the training and evaluation budgets capped here (``CAPS``: a few steps and samples each; the library's
functions know nothing of it).
A command that exits non-zero fails its block's test; later blocks read what earlier ones wrote.

Markers for what cannot run here (the reason is printed):
- ``<!-- docs-check: skip REASON -->`` on the line before a block: the whole block is skipped;
- a command whose trailing comment starts with ``needs`` (``torchrun ... # needs 8 GPUs``, ``# needs your
  corpus``): that command is skipped;
- a command holding a ``...`` placeholder is an outline, skipped; so is a program this environment lacks
  (``torchrun``, ``optimum-cli`` outside a ``make install``), said so. Blocks without a language are output.

How it runs, in as few processes as possible: ``sharebert`` commands in this process (``sharebert_runtime.main.main``,
so torch loads once), ``python script.py ...`` with ``runpy``, other commands in ``bash -e -o pipefail``,
Python blocks with ``exec``. The caps are applied in this process, on the way into the library's budgeted
functions (``BUDGETED``); a budgeted ``sharebert`` command run in another process (``torchrun -m sharebert
pretrain ...``, ``VAR=value sharebert ...``) has its budget options capped on its command line instead
(:func:`capped_command_line`), and one inside a pipeline fails its test: it would run uncapped. ``sharebert
serve`` starts in the background (on a free port that replaces the block's port in its ``curl`` lines) and
stops at the end of its block. The scratch folder ``work/`` sits beside a link ``shared`` to the data's
parent folder, so ``../shared/data`` resolves as it does beside a checkout; ``examples/`` and ``benchmarks/``
are linked in. ``make docs-check`` runs only this file (``-rs`` lists the skipped blocks).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import inspect
import os
import re
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC_ORDER = [
    "README.md",
    "docs/TRAINING.md",
    "docs/FINETUNING.md",
    "docs/DISTILLATION.md",
    "docs/EXPORT.md",
    "docs/DEVICE.md",
    "docs/ACCOUNTING.md",
    "docs/RESULTS.md",
]
RUN_LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKIP_BLOCK = re.compile(r"<!--\s*docs-check:\s*skip\b\s*(.*?)\s*-->")
NEEDS = re.compile(r"\s#\s*(needs\b.*)$")
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=\S")  # `M=$(python -c ...)`: a shell variable for the lines after
VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "$("}
LINKED = ("examples", "benchmarks")

# The budgets the docs run under: a field of an options dataclass, or a parameter, named here becomes
# ``min(value, cap)``; ``None`` (no limit) becomes the cap.
CAPS = {
    "max_steps": 2,  # optimizer steps (pretrain, finetune, distill, compress)
    "batch_size": 8,
    "max_train_samples": 64,  # fine-tuning / distillation examples, packed pre-training blocks
    "max_eval_samples": 32,  # dev examples scored
    "max_eval_sequences": 8,  # pre-training validation sequences scored
    "max_questions": 300,  # evaluate analogy: the first questions of the file
    "latency_samples": 5,  # evaluate glue --depths: sentences timed per depth
    "check_limit": 16,  # export: parity sentences
    "runs": 3,  # export: latency runs per shape
}
# The library's functions that spend a budget, each capped on the way in: {"module:function": {parameter:
# the cap it takes, or "module:Class", the options dataclass whose fields are capped (``None`` stands for
# its defaults)}}. Keyword arguments (``**fields``) named in CAPS are capped too.
BUDGETED = {
    "sharebert.training.pretrain:pretrain": {"args": "sharebert.training.arguments:PretrainArgs"},
    "sharebert.training.finetune:finetune": {"args": "sharebert.training.arguments:FinetuneArgs"},
    "sharebert.training.distill:distill_glue": {"args": "sharebert.training.arguments:DistillArgs"},
    "sharebert.training.distill_mlm:distill_mlm": {"args": "sharebert.training.arguments:DistillArgs"},
    "sharebert.training.distill_embedding:distill_embedding": {
        "args": "sharebert.training.arguments:EmbeddingArgs",
        "eval_limit": "max_eval_samples",
    },
    "sharebert.pipelines.plan:precheck": {"options": "sharebert.pipelines.run:CompressOptions"},  # compress's STS-B
    "sharebert.training.evaluate:_dev_sets": {"max_eval_samples": "max_eval_samples"},
    "sharebert.training.evaluate:word_analogy": {"max_questions": "max_questions"},
    "sharebert.training.depth_table:depth_table": {
        "max_eval_samples": "max_eval_samples",
        "latency_samples": "latency_samples",
    },
    "sharebert.export.exporter:export_model": {"options": "sharebert.export.exporter:ExportOptions"},
}
# The commands whose budget options capped_command_line caps where they run in another process.
BUDGETED_COMMANDS = {"pretrain", "finetune", "distill", "compress", "evaluate", "export", "demo"}


@dataclass
class Block:
    doc: str
    line: int  # of the opening fence
    language: str  # shell | python
    code: str
    skip: str | None  # reason, from a marker before the block

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files() -> list[str]:
    present = {str(p.relative_to(REPO)) for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    return [d for d in DOC_ORDER if d in present] + sorted(present - set(DOC_ORDER))


def blocks() -> list[Block]:
    out = []
    for doc in doc_files():
        text = (REPO / doc).read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            language = RUN_LANGUAGES.get(m.group(1).lower())
            if language is None:
                continue
            before = text[: m.start()].rstrip().rsplit("\n", 1)[-1]
            marker = SKIP_BLOCK.search(before)
            out.append(
                Block(
                    doc,
                    text.count("\n", 0, m.start()) + 1,
                    language,
                    m.group(2),
                    (marker.group(1) or "marked skip") if marker else None,
                )
            )
    return out


def commands(code: str) -> list[str]:
    """The block's command lines: continuations joined, blank and comment-only lines dropped."""
    lines, current = [], ""
    for raw in code.splitlines():
        current += raw
        if current.rstrip().endswith("\\"):
            current = current.rstrip()[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            lines.append(current.strip())
        current = ""
    return lines


def words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _resolve(name: str):
    module, attribute = name.split(":")
    return getattr(importlib.import_module(module), attribute)


def capped_value(cap: str, value):
    return CAPS[cap] if value is None else min(value, CAPS[cap])


def capped_options(options):
    """A copy of the options dataclass ``options`` with every field named in ``CAPS`` capped."""
    names = {f.name for f in dataclasses.fields(options)} & CAPS.keys()
    return dataclasses.replace(options, **{n: capped_value(n, getattr(options, n)) for n in names})


class Capping:
    """Wraps functions so their budgets are capped while ``active`` (a wrapper left behind passes through)."""

    def __init__(self):
        self.active = False

    def wrap(self, function, parameters: dict):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def capped(*args, **kwargs):
            if not self.active:
                return function(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for name, value in bound.arguments.items():
                cap = parameters.get(name)
                if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    value = {k: capped_value(k, v) if k in CAPS else v for k, v in value.items()}
                elif cap is not None and ":" in cap:
                    value = capped_options(_resolve(cap)() if value is None else value)
                elif cap is not None:
                    value = capped_value(cap, value)
                bound.arguments[name] = value
            return function(*bound.args, **bound.kwargs)

        return capped

    def install(self, monkeypatch) -> None:
        """Each of ``BUDGETED`` replaced by its capped wrapper wherever a sharebert module holds it."""
        for target, parameters in BUDGETED.items():
            original = _resolve(target)
            capped = self.wrap(original, parameters)
            for module in [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "sharebert"]:
                for attribute, value in list(vars(module).items()):
                    if value is original:
                        monkeypatch.setattr(module, attribute, capped)


def capped_command_line(argv: list[str]) -> list[str] | None:
    """``argv`` (a command line's words) with the budget options of the budgeted ``sharebert`` command it runs
    capped: each option of that command's own parser (``add_arguments``; a subcommand's, as ``evaluate glue``)
    whose destination is in ``CAPS`` set to ``min(value, cap)``, or appended with the cap where the line does not
    give it. ``None`` when the line runs no budgeted command."""
    from sharebert_runtime.main import COMMANDS

    at = next((i for i, (a, b) in enumerate(zip(argv, argv[1:])) if a == "sharebert" and b in BUDGETED_COMMANDS), None)
    if at is None:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(COMMANDS[argv[at + 1]][0]).add_arguments(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parser = next((action.choices[w] for w in argv[at + 2 :] if w in action.choices), parser)
    out = list(argv)
    for action in parser._actions:
        if action.dest not in CAPS or not action.option_strings:
            continue
        given = next((i for i in range(at + 2, len(out) - 1) if out[i] in action.option_strings), None)
        if given is None:
            out += [action.option_strings[0], str(CAPS[action.dest])]
        else:
            out[given + 1] = str(min(int(out[given + 1]), CAPS[action.dest]))
    return out


def run_script(argv: list[str]) -> int:
    """``python script.py args``, in this process (so the caps apply): its exit status."""
    saved = sys.argv
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scratch:
    """The scratch folder and the environment every block runs in."""

    def __init__(self, root: Path):
        from sharebert.formats.paths import data_dir

        data = data_dir().resolve()
        (root / "shared").symlink_to(data.parent, target_is_directory=True)
        self.cwd = root / "work"
        self.cwd.mkdir()
        for name in LINKED:
            (self.cwd / name).symlink_to(REPO / name, target_is_directory=True)
        bindir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "SHAREBERT_DATA": str(data),
            "SHAREBERT_CACHE": str(root / "cache"),  # the blocks' own, seeded before the first compress
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }
        self.seeded = False

    def run_block(self, block: Block, say) -> None:
        if block.language == "python":
            self._in_process(lambda: exec(compile(block.code, block.id, "exec"), {"__name__": "__main__"}))
            return
        server, port = None, None
        try:
            for line in commands(block.code):
                needs = NEEDS.search(line)
                if needs:
                    say(f"{block.id}: skipped `{line[: needs.start()].strip()[:80]}`: {needs.group(1)}")
                    continue
                assignment = ASSIGNMENT.match(line.strip())
                if assignment:  # kept, as a shell keeps it, for the block's later lines (bash and in-process)
                    name = assignment.group(1)
                    done = subprocess.run(
                        ["bash", "-e", "-o", "pipefail", "-c", f'{line}\nprintf %s "${name}"'],
                        cwd=self.cwd,
                        env=self.env,
                        capture_output=True,
                        text=True,
                        timeout=600,
                    )
                    assert done.returncode == 0, f"{block.id}: `{line}` exited {done.returncode}: {done.stderr[-500:]}"
                    self.env[name] = done.stdout
                    continue
                argv = [
                    VARIABLE.sub(lambda m: self.env.get(m.group(1) or m.group(2), m.group(0)), w) for w in words(line)
                ]
                if "..." in argv:
                    say(f"{block.id}: skipped `{line[:80]}`: an outline (holds ...)")
                    continue
                program = next((w for w in argv if "=" not in w), argv[0])  # after VAR=value prefixes
                if shutil.which(program, path=self.env["PATH"]) is None and "/" not in program:
                    say(f"{block.id}: skipped `{line[:80]}`: {program} is not installed in this environment")
                    continue
                if port is not None:
                    line = line.replace(f"localhost:{port[0]}", f"localhost:{port[1]}")
                if argv[:2] == ["sharebert", "serve"]:
                    port = (argv[argv.index("--port") + 1] if "--port" in argv else "8000", str(free_port()))
                    served = [a if a != port[0] else port[1] for a in argv[1:]] + (
                        [] if "--port" in argv else ["--port", port[1]]
                    )
                    server = self._serve(served, port[1], block)
                elif argv[0] == "sharebert" and not SHELL_OPERATORS & set(argv):
                    from sharebert_runtime.main import main

                    rc = self._in_process(lambda argv=argv: main(argv[1:]))
                    assert rc == 0, f"{block.id}: `{line}` exited {rc}"
                elif (
                    argv[0] in ("python", "python3")
                    and argv[1:2]
                    and argv[1].endswith(".py")
                    and not SHELL_OPERATORS & set(argv)
                ):
                    rc = self._in_process(lambda argv=argv: run_script(argv[1:]))
                    assert rc == 0, f"{block.id}: `{line}` exited {rc}"
                elif (capped := capped_command_line(argv)) is not None:  # another process: its options capped
                    assert not SHELL_OPERATORS & set(argv), f"{block.id}: `{line[:80]}`: uncapped in a pipeline"
                    done = subprocess.run(["env", *capped], cwd=self.cwd, env=self.env, timeout=600)
                    assert done.returncode == 0, f"{block.id}: `{shlex.join(capped)}` exited {done.returncode}"
                else:
                    done = subprocess.run(
                        ["bash", "-e", "-o", "pipefail", "-c", line], cwd=self.cwd, env=self.env, timeout=600
                    )
                    assert done.returncode == 0, f"{block.id}: `{line}` exited {done.returncode}"
        finally:
            if server is not None:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=30)

    def _in_process(self, call):
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        try:
            return call()
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)

    def _serve(self, argv, port, block):
        # started as the console script starts it (sharebert_runtime.main:main): serve imports no torch
        server = subprocess.Popen([sys.executable, "-m", "sharebert_runtime", *argv], cwd=self.cwd, env=self.env)
        deadline = time.monotonic() + 300  # a hang guard: starting takes long on a loaded machine
        while True:
            assert server.poll() is None, f"{block.id}: `sharebert {' '.join(argv)}` exited {server.returncode}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return server
            except OSError:
                assert time.monotonic() < deadline, f"{block.id}: the server did not answer /health in 300 s"
                time.sleep(0.5)


BLOCKS = blocks()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    capping = Capping()
    with pytest.MonkeyPatch.context() as monkeypatch:
        capping.install(monkeypatch)
        capping.active = True
        try:
            yield Scratch(tmp_path_factory.mktemp("docs"))
        finally:
            capping.active = False


def test_docs_have_runnable_blocks():
    assert any(b.doc == "README.md" and b.skip is None for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_written(block, scratch, capsys, request):
    def say(message):
        with capsys.disabled():
            print(f"\n[docs-check] {message}", flush=True)

    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    if "sharebert compress" in block.code and not scratch.seeded:
        # the cache of a user's first compress of all-MiniLM-L6-v2, which the tests make once (conftest): the
        # teacher's export ladder is not run again here; nothing else changes for the command
        request.getfixturevalue("seed_minilm_cache")(scratch.env["SHAREBERT_CACHE"])
        scratch.seeded = True
    started = time.monotonic()
    scratch.run_block(block, say)
    if time.monotonic() - started > 60:
        say(f"{block.id}: {time.monotonic() - started:.0f} s")


def test_the_caps_apply_to_options_fields_and_named_limits_only_while_active():
    from sharebert.training.arguments import PretrainArgs

    def run(args=None, eval_limit=None, lr=None, **fields):
        return args, eval_limit, lr, fields

    capping = Capping()
    capped = capping.wrap(run, {"args": "sharebert.training.arguments:PretrainArgs", "eval_limit": "max_eval_samples"})
    given = PretrainArgs(max_steps=2000, batch_size=32, lr=5e-4)
    assert capped(given, 100, lr=1, check_limit=100) == (given, 100, 1, {"check_limit": 100})
    capping.active = True
    args, eval_limit, lr, fields = capped(given, 100, lr=1, check_limit=100, threads=4)
    assert (args.max_steps, args.batch_size, args.max_eval_sequences, args.lr) == (
        CAPS["max_steps"],
        CAPS["batch_size"],
        CAPS["max_eval_sequences"],
        5e-4,
    )
    assert (eval_limit, lr, fields) == (CAPS["max_eval_samples"], 1, {"check_limit": CAPS["check_limit"], "threads": 4})
    assert capped()[0] == capped_options(PretrainArgs()) and capped()[0].max_steps == CAPS["max_steps"]
    assert capped(given, eval_limit=1)[1] == 1  # below the cap: kept


def test_every_budgeted_function_takes_the_parameters_it_is_capped_by():
    for target, parameters in BUDGETED.items():
        assert set(parameters) <= set(inspect.signature(_resolve(target)).parameters), target
        for cap in parameters.values():
            assert cap in CAPS or dataclasses.is_dataclass(_resolve(cap)), (target, cap)


def test_installed_caps_reach_every_holder_of_a_budgeted_function(monkeypatch):
    import types

    from sharebert.training.distill import distill_glue

    holder = types.ModuleType("sharebert.holder")  # a module that took the function with `from ... import`
    holder.distill_glue = distill_glue
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    Capping().install(monkeypatch)
    for target in BUDGETED:
        assert hasattr(_resolve(target), "__wrapped__"), target
    assert holder.distill_glue.__wrapped__ is distill_glue


def test_a_command_line_run_in_another_process_gets_its_budget_options_capped():
    line = words(
        "torchrun --standalone --nproc_per_node=2 -m sharebert pretrain --preset sharebert-tiny "
        "--out runs/ddp --max-steps 20 --batch-size 4"
    )
    capped = capped_command_line(line)
    assert capped[: capped.index("--max-steps")] == line[: line.index("--max-steps")]
    assert capped[capped.index("--max-steps") + 1] == str(CAPS["max_steps"])
    assert capped[capped.index("--batch-size") + 1] == "4"  # below the cap: kept
    assert capped[capped.index("--eval-samples") + 1] == str(CAPS["max_eval_sequences"])  # appended
    glue = capped_command_line(words("sharebert evaluate glue --model m --task sst2 --depths 1 2"))
    assert glue[glue.index("--max-eval-samples") + 1] == str(CAPS["max_eval_samples"])  # evaluate glue's own options
    assert glue[glue.index("--latency-samples") + 1] == str(CAPS["latency_samples"])
    assert capped_command_line(words("sharebert predict artifacts/tiny 'a [MASK]'")) is None
