"""Depth at inference, training and evaluation side: --depth-sampling in finetune / pretrain / distill (real
Trainer, few steps), DDP with layers skipped (under torchrun: test_pretrain.py's two-node test), `evaluate glue
--depths` (PyTorch and artifact), bad input."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from sharebert.formats.build import build_model
from sharebert.formats.model_folder import load_tokenizer
from sharebert.formats.paths import data_path, default_vocab
from sharebert.model.modeling_sharebert import ShareBertModel
from sharebert.training.arguments import DistillArgs
from sharebert.training.distill import distill_glue
from sharebert.training.distill_losses import layer_map, pairs_that_ran
from sharebert.training.evaluate import evaluate_glue
from sharebert.training.finetune import load_classifier
from sharebert.training.glue import get_task
from sharebert_runtime.main import main

TINY4 = dict(
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=2,
    embedding_size=16,
    max_position_embeddings=64,
)
SET = [x for k, v in TINY4.items() for x in ("--set", f"{k}={v}")]
REPO = Path(__file__).resolve().parents[2]
SST2 = str(data_path("glue", "SST-2"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("base4")
    build_model("sharebert-tiny", out, TINY4, seed=0)
    return out


@pytest.fixture(scope="module")
def classifier(base, tmp_path_factory):
    """An SST-2 classifier with an untrained but decisive head (no training needed to score depths)."""
    out = tmp_path_factory.mktemp("clf")
    torch.manual_seed(0)
    model = load_classifier(base, get_task("sst2"))
    with torch.no_grad():
        model.classifier.weight.normal_(0, 3.0)
    model.save_pretrained(out)
    load_tokenizer(base, model.config.vocab_size).save_pretrained(out)
    return out


@pytest.fixture
def depths_seen(monkeypatch):
    """``(training, depth)`` of every backbone forward while the test runs."""
    seen, depth = [], ShareBertModel._depth

    def spy(self, d):
        k = depth(self, d)
        seen.append((self.training, k))
        return k

    monkeypatch.setattr(ShareBertModel, "_depth", spy)
    return seen


def _config(folder) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def test_finetune_samples_depths_in_training_and_scores_at_full_depth(base, tmp_path, depths_seen):
    out = tmp_path / "ft"
    assert (
        main(
            [
                "finetune",
                "--model",
                str(base),
                "--task",
                "sst2",
                "--data-dir",
                SST2,
                "--out",
                str(out),
                "--max-steps",
                "12",
                "--max-train-samples",
                "96",
                "--max-eval-samples",
                "32",
                "--batch-size",
                "8",
                "--eval-steps",
                "6",
                "--depth-sampling",
                "1",
            ]
        )
        == 0
    )
    assert _config(out)["train_min_depth"] == 1
    train = [k for training, k in depths_seen if training]
    assert len(train) == 12 and len(set(train)) > 1 and set(train) <= {1, 2, 3, 4}
    assert {k for training, k in depths_seen if not training} == {4}  # dev scoring at the full depth
    assert 0 <= json.loads((out / "metrics.json").read_text())["accuracy"] <= 1


def test_pretrain_bare_depth_sampling_means_min_1(tmp_path, depths_seen):
    corpus = tmp_path / "c.txt"
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8") as f:
        corpus.write_text("".join(next(f) for _ in range(120)), encoding="utf-8")
    out = tmp_path / "pt"
    assert (
        main(
            [
                "pretrain",
                "--preset",
                "sharebert-tiny",
                *SET,
                "--train",
                str(corpus),
                "--out",
                str(out),
                "--max-steps",
                "10",
                "--batch-size",
                "4",
                "--seq-len",
                "32",
                "--eval-steps",
                "10",
                "--eval-samples",
                "8",
                "--no-progress",
                "--depth-sampling",
            ]
        )
        == 0
    )
    assert _config(out)["train_min_depth"] == 1
    train = [k for training, k in depths_seen if training]
    assert len(train) == 10 and len(set(train)) > 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["args"]["depth_sampling"] == 1 and 0 < metrics["train_loss"] <= 20


# torchrun with --depth-sampling (DDP with layers skipped needs find_unused_parameters): the two-node test of
# tests/training/test_pretrain.py trains with it, one torchrun run for both.


def _ddp_worker(rank, port, out):
    """Rank r runs depth r + 1 of a 2-layer model under DDP (gloo); writes its averaged gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sharebert.model.configuration_sharebert import ShareBertConfig
    from sharebert.model.modeling_sharebert import ShareBertForMaskedLM

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = ShareBertForMaskedLM(
        ShareBertConfig.from_preset("sharebert-tiny", **{**TINY4, "num_hidden_layers": 2, "vocab_size": 1024})
    )
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(rank))
    ddp(input_ids=ids, labels=ids, depth=rank + 1).loss.backward()
    torch.save({n: p.grad for n, p in model.named_parameters()}, out / f"grads{rank}.pt")
    dist.barrier()
    os._exit(0)  # gloo's teardown at interpreter exit can hang a rank once its peer is gone


def test_ddp_ranks_at_different_depths_average_the_same_gradients(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = mp.spawn(_ddp_worker, args=(port, tmp_path), nprocs=2, join=False)
    deadline = time.monotonic() + 300  # a hang guard: two ranks load torch at once
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            pytest.fail("the two DDP ranks did not finish within 300 s")
    g0, g1 = (torch.load(tmp_path / f"grads{r}.pt") for r in (0, 1))
    assert g0.keys() == g1.keys()
    for name in g0:  # rank 0 skipped layer 2; DDP still averaged (its share 0) and both ranks agree
        assert g0[name] is not None and torch.equal(g0[name], g1[name]), name
    assert g0["sharebert.layers.1.ffn_norm.weight"].abs().sum() > 0


def test_layer_map_at_a_sampled_depth():
    full = layer_map(4, 12)
    assert pairs_that_ran(full, 4, 4, 12) == full == ((1, 3), (2, 6), (3, 9), (4, 12))
    assert pairs_that_ran(full, 2, 4, 12) == ((1, 3), (2, 12))
    assert pairs_that_ran(full, 1, 4, 12) == ((1, 12),)
    assert pairs_that_ran(((1, 2), (4, 12)), 3, 4, 12) == ((1, 2), (3, 12))


def test_distill_with_depth_sampling_has_finite_losses(base, tmp_path, depths_seen):
    teacher = tmp_path / "teacher"
    torch.manual_seed(0)
    BertForSequenceClassification(
        BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(teacher)
    BertTokenizerFast(str(default_vocab())).save_pretrained(teacher)
    out = tmp_path / "student"
    args = DistillArgs(
        max_steps=8,
        max_train_samples=64,
        max_eval_samples=32,
        batch_size=8,
        warmup_steps=1,
        eval_steps=4,
        seq_len=32,
        depth_sampling=1,
    )
    metrics = distill_glue(teacher, str(base), "sst2", out, args=args, progress=False)
    assert _config(out)["train_min_depth"] == 1
    student = [k for training, k in depths_seen if training]  # the teacher is a BERT: not counted here
    assert len(student) == 8 and len(set(student)) > 1
    terms = [e for e in json.loads((out / "log_history.json").read_text()) if "loss_hidden" in e]
    assert terms and all(
        abs(e[k]) <= 1e6
        for e in terms
        for k in ("loss", "loss_kl", "loss_hard", "loss_hidden", "loss_attention", "loss_embedding")
    )
    assert 0 <= metrics["accuracy"] <= 1


def test_evaluate_depths_table_full_row_equals_plain_evaluate(classifier, tmp_path, capsys):
    plot = tmp_path / "depths.png"
    assert (
        main(
            [
                "evaluate",
                "glue",
                "--model",
                str(classifier),
                "--task",
                "sst2",
                "--max-eval-samples",
                "120",
                "--depths",
                "1",
                "2",
                "--latency-samples",
                "5",
                "--plot",
                str(plot),
                "--json",
                str(tmp_path / "d.json"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "d.json").read_text())
    rows = {r["depth"]: r for r in result["rows"]}
    assert sorted(rows) == [1, 2, 4] and result["layers"] == 4  # the full depth is always a row
    assert sum(line.split()[0] in {"1", "2", "4"} for line in printed.splitlines() if line.split()) == 3
    plain = evaluate_glue(classifier, "sst2", max_eval_samples=120, progress=False)
    assert rows[4]["accuracy"] == plain["accuracy"] and rows[4]["metric_vs_full"] == 0
    assert all(
        r["p50_ms"] > 0 and abs(r["accuracy"] - plain["accuracy"] - r["metric_vs_full"]) <= 1e-12 for r in rows.values()
    )
    assert plot.stat().st_size > 10_000


@pytest.fixture(scope="module")
def artifact(classifier, tmp_path_factory):
    from sharebert.export.exporter import export_model

    out = tmp_path_factory.mktemp("art") / "clf"
    export_model(classifier, out, check_limit=8, runs=1, shapes=("1x32",), progress=False)
    return out


def test_artifact_depth_1_matches_pytorch_and_stays_torch_free(classifier, artifact, tmp_path):
    code = (
        "import json, sys; sys.modules.update(torch=None, transformers=None); "  # a device install: no torch
        "from sharebert.training.depth_table import depth_table; "
        f"r = depth_table({str(artifact)!r}, 'sst2', [1], max_eval_samples=120, latency_samples=3); "
        "print(json.dumps(r))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    onnx = {r["depth"]: r["accuracy"] for r in json.loads(proc.stdout.splitlines()[-1])["rows"]}
    from sharebert.training.depth_table import depth_table

    torch_rows = {
        r["depth"]: r["accuracy"]
        for r in depth_table(classifier, "sst2", [1], max_eval_samples=120, latency_samples=3)["rows"]
    }
    for k in (1, 4):  # fp32 artifact: at most one of 120 predictions may flip on a tie
        assert abs(onnx[k] - torch_rows[k]) <= 1 / 120, (k, onnx, torch_rows)


def _no_depth_artifact(artifact, tmp_path):
    import shutil

    folder = tmp_path / "old"
    shutil.copytree(artifact, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("max_depth")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


BAD = [
    (
        "depths 0",
        ["evaluate", "glue", "--model", "{clf}", "--task", "sst2", "--depths", "0"],
        "--depths must be integers in 1..4",
    ),
    ("depths 13", ["evaluate", "glue", "--model", "{clf}", "--task", "sst2", "--depths", "2", "13"], "got 13"),
    ("plot alone", ["evaluate", "glue", "--model", "{clf}", "--task", "sst2", "--plot", "x.png"], "give --depths too"),
    (
        "no depth input",
        ["evaluate", "glue", "--model", "{old}", "--task", "sst2", "--depths", "1"],
        "has no depth input",
    ),
    ("artifact pairs", ["evaluate", "glue", "--model", "{art}", "--task", "qnli", "--depths", "1"], "sentence pairs"),
    (
        "sampling 0",
        ["finetune", "--model", "{base}", "--task", "sst2", "--out", "{out}", "--depth-sampling", "0"],
        "--depth-sampling: must be an integer >= 1, got 0",
    ),
    (
        "sampling 9",
        ["finetune", "--model", "{base}", "--task", "sst2", "--out", "{out}", "--depth-sampling", "9"],
        "got 9",
    ),
    (
        "pretrain 9",
        [
            "pretrain",
            "--preset",
            "sharebert-tiny",
            *SET,
            "--train",
            "{corpus}",
            "--out",
            "{out}",
            "--depth-sampling",
            "9",
        ],
        "in 1..4",
    ),
    (
        "one layer",
        [
            "pretrain",
            "--preset",
            "sharebert-tiny",
            "--set",
            "num_hidden_layers=1",
            "--train",
            "{corpus}",
            "--out",
            "{out}",
            "--depth-sampling",
        ],
        "at least 2 layers",
    ),
    (
        "--set",
        [
            "pretrain",
            "--preset",
            "sharebert-tiny",
            "--set",
            "train_min_depth=2",
            "--train",
            "{corpus}",
            "--out",
            "{out}",
        ],
        "--depth-sampling MIN, not --set",
    ),
    (
        "distill 5",
        [
            "distill",
            "--teacher",
            "{clf}",
            "--student",
            "{base}",
            "--task",
            "sst2",
            "--out",
            "{out}",
            "--depth-sampling",
            "5",
        ],
        "in 1..4",
    ),
]


@pytest.mark.parametrize("case, argv, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2(case, argv, message, base, classifier, artifact, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text to train on.\n" * 50)
    paths = {"{clf}": classifier, "{base}": base, "{art}": artifact, "{out}": tmp_path / "out", "{corpus}": corpus}
    if "{old}" in argv:
        paths["{old}"] = _no_depth_artifact(artifact, tmp_path)
    argv = [str(paths.get(a, a)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
