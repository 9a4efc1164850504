"""Light imports: shapes, validation and reports without torch; Auto registration however it is imported."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharebert.accounting.counts import count_flops, count_params
from sharebert.model.configuration_sharebert import ShareBertConfig
from sharebert.model.shape import DEFAULTS, PRESETS, ModelShape


def _run(code: str, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_config_signature_defaults_are_the_shape_defaults():
    params = inspect.signature(ShareBertConfig.__init__).parameters
    assert {k: params[k].default for k in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_shape_matches_config(name):
    shape, config = ModelShape.from_preset(name), ShareBertConfig.from_preset(name)
    assert shape.layer_matrices() == config.layer_matrices()
    assert shape.generated_targets() == config.generated_targets()
    assert (shape.column_plan() is None) == (config.column_plan() is None)
    for head in ("none", "mlm", "classifier"):
        assert count_params(shape, head) == count_params(config, head)
    assert count_flops(shape, "mlm", 64, 2) == count_flops(config, "mlm", 64, 2)


@pytest.mark.parametrize(
    "bad",
    [
        dict(hidden_size=250),
        dict(qk_share_ratio=1.5),
        dict(attention="fancy"),
        dict(sharing="eps", embedding_size=None, hidden_size=2048, vocab_size=1000),
    ],
)
def test_model_shape_refuses_what_the_config_refuses(bad):
    with pytest.raises(ValueError) as from_config:
        ShareBertConfig.from_preset("sharebert-tiny", **bad)
    with pytest.raises(ValueError) as from_shape:
        ModelShape.from_preset("sharebert-tiny", **bad)
    assert str(from_shape.value) == str(from_config.value)


def test_report_and_budget_run_without_torch():
    """The analytic commands need no torch: they run where torch and transformers cannot be imported (as on a
    device install; on a workstation ``import sharebert`` registers with transformers, which loads torch)."""
    code = """
import io, sys, contextlib
sys.modules.update(torch=None, transformers=None)
from sharebert_runtime.main import main
from sharebert.model.shape import PRESETS
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    for name in PRESETS:
        assert main(["report", "--preset", name, "--head", "mlm", "--format", "json"]) == 0
    assert main(["budget", "--max-params", "10M", "--top", "3"]) == 0
heavy = sorted(m for m in ("torch", "transformers", "onnx", "optimum") if sys.modules.get(m) is not None)
print(heavy)
"""
    assert _run(code).strip() == "[]"


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "sharebert_runtime", "--help"],
        ["-m", "sharebert_runtime", "--version"],
        ["CONSOLE", "predict", "--help"],
        ["CONSOLE", "serve", "--help"],
    ],
)
def test_the_sharebert_command_imports_no_torch_for_device_commands(command):
    """The ``sharebert`` command (``sharebert_runtime.main``, its console script as the shell runs it) answers its
    overview and the device commands without importing torch, transformers or the library package."""
    if command[0] == "CONSOLE":  # the script pip wrote, run as the shell would
        command = [str(Path(sys.executable).parent / "sharebert"), *command[1:]]
    command = [sys.executable, "-X", "importtime", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "sharebert_runtime" in imported and not imported & {"sharebert", "torch", "transformers", "optimum", "onnx"}


def test_a_broken_transformers_install_leaves_the_runtime_importable(tmp_path):
    """A workstation whose transformers fails to import: the torch-free runtime imports, and ``import sharebert``
    warns in one line that it did not register."""
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text('raise ImportError("libbroken.so: cannot open")')
    out = subprocess.run(
        [sys.executable, "-c", "from sharebert_runtime import Runtime; import sharebert; print('imported')"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0 and out.stdout == "imported\n", out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "not registered with transformers: libbroken.so" in out.stderr


REGISTER = "import sharebert"  # the documented import


@pytest.mark.parametrize(
    "order",
    [
        "sharebert first",
        "transformers first",
        "model class first",
        pytest.param("optimum exporter", marks=pytest.mark.optimum),
        "pipeline",
        pytest.param("optimum ORTModel first", marks=pytest.mark.optimum),
    ],
)
def test_auto_classes_know_sharebert_after_import(order):
    first = {
        "sharebert first": REGISTER,
        "transformers first": "from transformers import AutoModel; " + REGISTER,
        "model class first": "from sharebert import ShareBertModel",
        "optimum exporter": REGISTER + "; from optimum.exporters.onnx import main_export",
        "pipeline": REGISTER + "; from transformers import pipeline",
        "optimum ORTModel first": "from optimum.onnxruntime import ORTModelForMaskedLM; " + REGISTER,
    }[order]
    code = (
        first
        + """
import json, sys
from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification
config = AutoConfig.for_model("sharebert", hidden_size=32, embedding_size=8, num_hidden_layers=1,
                              intermediate_size=64, num_attention_heads=2, vocab_size=512)
print(json.dumps([type(AutoModelForMaskedLM.from_config(config)).__name__,
                  type(AutoModelForSequenceClassification.from_config(config)).__name__]))
"""
    )
    assert json.loads(_run(code)) == ["ShareBertForMaskedLM", "ShareBertForSequenceClassification"]


def test_import_sharebert_registers_models_and_optimum_configs(optimum_onnx):
    code = (
        "import sharebert, sys; from transformers import AutoConfig; from optimum.exporters.tasks import TasksManager; "
        "print(type(AutoConfig.for_model('sharebert')).__name__, 'sharebert.model.modeling_sharebert' in sys.modules, "
        "'fill-mask' in TasksManager.get_supported_tasks_for_model_type('sharebert', 'onnx', "
        "library_name='transformers'))"
    )
    assert _run(code).split() == ["ShareBertConfig", "True", "True"]
