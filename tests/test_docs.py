"""The docs run as written: every ```bash and ```python block of README.md and docs/*.md, in reading order
(``DOC_ORDER``, then any other page alphabetically), in one scratch folder, with the training and evaluation
budgets capped by ``SHAREBERT_DOCS_CHECK=1`` (``sharebert/docs_check.py``: a few steps and samples each).
A command that exits non-zero fails its block's test; later blocks read what earlier ones wrote.

Markers for what cannot run here (the reason is printed):
- ``<!-- docs-check: skip REASON -->`` on the line before a block: the whole block is skipped;
- a command whose trailing comment starts with ``needs`` (``torchrun ... # needs 8 GPUs``, ``# needs your
  corpus``): that command is skipped;
- a command holding a ``...`` placeholder is an outline, skipped; so is a program this environment lacks
  (``torchrun``, ``optimum-cli`` outside a ``make install``), said so. Blocks without a language are output.

How it runs, in as few processes as possible: ``sharebert`` commands in this process (``sharebert.cli.main``,
so torch loads once), other commands in ``bash -e -o pipefail``, Python blocks with ``exec``. ``sharebert
serve`` starts in the background (on a free port that replaces the block's port in its ``curl`` lines) and
stops at the end of its block. The scratch folder ``work/`` sits beside a link ``shared`` to the data's
parent folder, so ``../shared/data`` resolves as it does beside a checkout; ``examples/`` and ``benchmarks/``
are linked in. ``make docs-check`` runs only this file (``-rs`` lists the skipped blocks).
"""
from __future__ import annotations

import os
import re
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
DOC_ORDER = ["README.md", "docs/TRAINING.md", "docs/FINETUNING.md", "docs/DISTILLATION.md", "docs/EXPORT.md",
             "docs/DEVICE.md", "docs/ACCOUNTING.md", "docs/RESULTS.md"]
RUN_LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKIP_BLOCK = re.compile(r"<!--\s*docs-check:\s*skip\b\s*(.*?)\s*-->")
NEEDS = re.compile(r"\s#\s*(needs\b.*)$")
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=\S")  # `M=$(python -c ...)`: a shell variable for the lines after
VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "$("}
LINKED = ("examples", "benchmarks")


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
            before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
            marker = SKIP_BLOCK.search(before)
            out.append(Block(doc, text.count("\n", 0, m.start()) + 1, language, m.group(2),
                             (marker.group(1) or "marked skip") if marker else None))
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scratch:
    """The scratch folder and the environment every block runs in."""

    def __init__(self, root: Path):
        from sharebert.paths import data_dir

        data = data_dir().resolve()
        (root / "shared").symlink_to(data.parent, target_is_directory=True)
        self.cwd = root / "work"
        self.cwd.mkdir()
        for name in LINKED:
            (self.cwd / name).symlink_to(REPO / name, target_is_directory=True)
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "SHAREBERT_DOCS_CHECK": "1", "SHAREBERT_DATA": str(data), "OMP_NUM_THREADS": "1",
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}

    def run_block(self, block: Block, say) -> None:
        if block.language == "python":
            self._in_process(lambda: exec(compile(block.code, block.id, "exec"), {"__name__": "__main__"}))
            return
        server, port = None, None
        try:
            for line in commands(block.code):
                needs = NEEDS.search(line)
                if needs:
                    say(f"{block.id}: skipped `{line[:needs.start()].strip()[:80]}`: {needs.group(1)}")
                    continue
                assignment = ASSIGNMENT.match(line.strip())
                if assignment:  # kept, as a shell keeps it, for the block's later lines (bash and in-process)
                    name = assignment.group(1)
                    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", f'{line}\nprintf %s "${name}"'],
                                          cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=600)
                    assert done.returncode == 0, f"{block.id}: `{line}` exited {done.returncode}: {done.stderr[-500:]}"
                    self.env[name] = done.stdout
                    continue
                argv = [VARIABLE.sub(lambda m: self.env.get(m.group(1) or m.group(2), m.group(0)), w) for w in words(line)]
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
                    served = [a if a != port[0] else port[1] for a in argv[1:]] + ([] if "--port" in argv else ["--port", port[1]])
                    server = self._serve(served, port[1], block)
                elif argv[0] == "sharebert" and not SHELL_OPERATORS & set(argv):
                    from sharebert.cli import main

                    rc = self._in_process(lambda: main(argv[1:]))
                    assert rc == 0, f"{block.id}: `{line}` exited {rc}"
                else:
                    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", line], cwd=self.cwd, env=self.env,
                                          timeout=600)
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
        server = subprocess.Popen([sys.executable, "-m", "sharebert", *argv], cwd=self.cwd, env=self.env)
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"{block.id}: `sharebert {' '.join(argv)}` exited {server.returncode}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return server
            except OSError:
                assert time.monotonic() < deadline, f"{block.id}: the server did not answer /health in 120 s"
                time.sleep(0.5)


BLOCKS = blocks()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return Scratch(tmp_path_factory.mktemp("docs"))


def test_docs_have_runnable_blocks():
    assert any(b.doc == "README.md" and b.skip is None for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_written(block, scratch, capsys):
    def say(message):
        with capsys.disabled():
            print(f"\n[docs-check] {message}", flush=True)

    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    started = time.monotonic()
    scratch.run_block(block, say)
    if time.monotonic() - started > 60:
        say(f"{block.id}: {time.monotonic() - started:.0f} s")


def test_docs_check_caps_budgets_only_when_set(monkeypatch):
    from sharebert.docs_check import CAPS, cap, cap_value
    from sharebert.training.options import FinetuneArgs, PretrainArgs

    monkeypatch.delenv("SHAREBERT_DOCS_CHECK", raising=False)
    assert cap(PretrainArgs()) == PretrainArgs() and cap_value("max_eval_samples", None) is None
    monkeypatch.setenv("SHAREBERT_DOCS_CHECK", "1")
    a = cap(PretrainArgs(max_steps=2000, batch_size=32, lr=5e-4))
    assert (a.max_steps, a.batch_size, a.max_eval_sequences, a.lr) == (CAPS["max_steps"], CAPS["batch_size"],
                                                                       CAPS["max_eval_sequences"], 5e-4)
    f = cap(FinetuneArgs(max_steps=1, max_train_samples=None))
    assert (f.max_steps, f.max_train_samples, f.max_eval_samples) == (1, CAPS["max_train_samples"], CAPS["max_eval_samples"])
    monkeypatch.setenv("SHAREBERT_DOCS_CHECK", "0")
    assert cap(PretrainArgs()) == PretrainArgs()
