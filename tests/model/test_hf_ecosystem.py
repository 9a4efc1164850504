"""The Hugging Face stack on ShareBERT as on BERT, each from a fresh process where it matters: ``import sharebert``
as the one import (Auto classes, pipelines, optimum's export where the ``optimum`` extra is installed), the BERT
tokenizer class, multiple choice, and ``build`` of a causal preset. Real transformers, optimum (where installed) and
ONNX Runtime; no hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sharebert.formats.build import build_model
from sharebert_runtime.main import main

TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=2,
    embedding_size=16,
    max_position_embeddings=64,
)
TEXTS = ["the capital of france is [MASK].", "a [MASK] movie, and a good one."]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("eco") / "mlm"
    build_model("sharebert-tiny", out, TINY, seed=0)
    return out


QUICK_EXPORT = dict(check_limit=8, runs=1, shapes=("1x16",), progress=False)
ARTIFACT_KINDS = {  # what `sharebert export` writes, by kind: (export options, layers)
    "fp32 fill-mask": (dict(task="fill-mask"), 2),  # depth-gated; its ram_int8/ graphs are the RAM-int8 kind
    "int8 fill-mask": (dict(task="fill-mask", quantize="int8"), 2),
    "int8-dynamic fill-mask": (dict(task="fill-mask", quantize="int8-dynamic"), 2),
    "feature-extraction": (dict(task="feature-extraction"), 2),  # last_hidden_state and sentence_embedding
    "classification, one layer": (dict(task="text-classification"), 1),  # no depth input
}


@pytest.fixture(scope="module")
def artifact_of(mlm_dir, tmp_path_factory):
    """``artifact_of(kind)``: the artifact folder of ``ARTIFACT_KINDS[kind]`` (exported on first use) of the
    module's tiny model (a one-layer classifier built beside it for the one-layer kind)."""
    root, made = tmp_path_factory.mktemp("artifacts"), {}

    def make(kind):
        if kind not in made:
            options, layers = ARTIFACT_KINDS[kind]
            source = mlm_dir
            if layers != TINY["num_hidden_layers"] or options["task"] == "text-classification":
                from sharebert.model.modeling_sharebert import ShareBertForSequenceClassification

                source = root / f"model-{layers}"
                build_model("sharebert-tiny", source, {**TINY, "num_hidden_layers": layers}, seed=0)
                ShareBertForSequenceClassification.from_pretrained(source, num_labels=2).save_pretrained(source)
            from sharebert.export.exporter import export_model

            export_model(source, root / kind.replace(" ", "-"), allow_low_parity=True, **options, **QUICK_EXPORT)
            made[kind] = root / kind.replace(" ", "-")
        return made[kind]

    return make


@pytest.mark.parametrize(
    "with_optimum", [False, pytest.param(True, marks=pytest.mark.optimum)], ids=["transformers", "optimum"]
)
def test_import_sharebert_is_the_one_import(mlm_dir, tmp_path, with_optimum):
    """A user's script, written the obvious way: ``import sharebert``, then transformers' own entry points on a
    sharebert folder (AutoConfig, AutoTokenizer, AutoModel*, pipeline) and, with the ``optimum`` extra, optimum's
    ``main_export``."""
    optimum = (
        f"""
from optimum.exporters.onnx import main_export
main_export(folder, {str(tmp_path / "onnx")!r}, task="fill-mask")
session = ort.InferenceSession({str(tmp_path / "onnx" / "model.onnx")!r}, providers=["CPUExecutionProvider"])
onnx = session.run(["logits"], {{i.name: enc[i.name].numpy() for i in session.get_inputs()}})[0]
got["onnx_diff"] = float(np.abs(onnx - logits.numpy()).max())
"""
        if with_optimum
        else ""
    )
    script = f"""
import json, sharebert
import numpy as np, onnxruntime as ort, torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer, pipeline
folder = {str(mlm_dir)!r}
config = AutoConfig.from_pretrained(folder)
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForMaskedLM.from_pretrained(folder).eval()
enc = tokenizer({TEXTS!r}, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(**enc).logits
    hidden = AutoModel.from_pretrained(folder).eval()(**enc).last_hidden_state
fill = pipeline("fill-mask", model=folder, top_k=1)({TEXTS[0]!r})
top = int(logits[0, enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)].argmax())
from transformers import BertTokenizerFast  # transformers 5: the one BERT tokenizer class, BertTokenizer
got = {{"config": type(config).__name__,
       "tokenizer": "BertTokenizerFast" if isinstance(tokenizer, BertTokenizerFast) else type(tokenizer).__name__,
       "model": type(model).__name__, "hidden": list(hidden.shape), "fill": fill[0]["token"], "top": top}}
{optimum}
print(json.dumps(got))
"""
    done = _python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert (got["config"], got["tokenizer"], got["model"]) == (
        "ShareBertConfig",
        "BertTokenizerFast",
        "ShareBertForMaskedLM",
    )
    assert got["hidden"][-1] == TINY["hidden_size"] and got["fill"] == got["top"]
    assert got.get("onnx_diff", 0.0) <= 1e-4, got["onnx_diff"]


def test_without_registration_transformers_does_not_know_sharebert(mlm_dir):
    """The check above is not vacuous: without ``import sharebert`` the same first lines fail."""
    done = _python(f"from transformers import AutoConfig; AutoConfig.from_pretrained({str(mlm_dir)!r})")
    assert done.returncode != 0 and "sharebert" in done.stderr


def test_build_of_a_causal_preset_writes_a_causal_lm(tmp_path, capsys):
    out = tmp_path / "charlm"
    assert main(["build", "--preset", "charlm-tiny", "--set", "num_hidden_layers=1", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert config["architectures"] == ["ShareBertForCausalLM"] and config["is_decoder"] is True
    assert generation["eos_token_id"] == vocab["[SEP]"] and generation["pad_token_id"] == vocab["[PAD]"]
    assert (
        main(
            [
                "build",
                "--preset",
                "charlm-tiny",
                "--set",
                "num_hidden_layers=1",
                "--head",
                "mlm",
                "--out",
                str(tmp_path / "mlm"),
            ]
        )
        == 0
    )  # --head still decides when given
    assert json.loads((tmp_path / "mlm" / "config.json").read_text())["architectures"] == ["ShareBertForMaskedLM"]


def _multiple_choice():
    """``(BertForMultipleChoice, ShareBertForMultipleChoice with its weights, inputs, labels)``: 2 questions,
    3 choices."""
    from transformers import AutoModelForMultipleChoice, BertConfig, BertForMultipleChoice

    from sharebert import ShareBertConfig, ShareBertForMultipleChoice
    from sharebert.formats.model_folder import bert_state_dict

    shape = dict(
        vocab_size=500,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    bert = BertForMultipleChoice(BertConfig(**shape)).eval()
    config = ShareBertConfig.from_preset("bert-base", **shape)
    ours = AutoModelForMultipleChoice.from_config(config).eval()
    assert isinstance(ours, ShareBertForMultipleChoice)
    missing, unexpected = ours.load_state_dict(bert_state_dict(bert.state_dict(), 2, "sharebert."), strict=False)
    assert not missing and not unexpected
    g = torch.Generator().manual_seed(1)
    inputs = {
        "input_ids": torch.randint(5, 500, (2, 3, 10), generator=g),
        "token_type_ids": torch.randint(0, 2, (2, 3, 10), generator=g),
        "attention_mask": torch.ones(2, 3, 10, dtype=torch.long),
    }
    inputs["attention_mask"][1, 2, 7:] = 0
    return bert, ours, inputs, torch.tensor([2, 0])


def test_multiple_choice_is_berts():
    """``ShareBertForMultipleChoice`` with BERT's weights (``sharing='none'``) gives ``BertForMultipleChoice``'s
    logits and loss; ``AutoModelForMultipleChoice`` builds it."""
    bert, ours, inputs, labels = _multiple_choice()
    with torch.no_grad():
        want, got = bert(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert got.logits.shape == (2, 3)
    assert (got.logits - want.logits).abs().max().item() <= 1e-5
    assert abs(got.loss.item() - want.loss.item()) <= 1e-5


def test_optimum_exports_multiple_choice(tmp_path, optimum_onnx):
    """optimum's ``main_export`` (the ``optimum`` extra) exports a sharebert multiple-choice folder (task
    ``multiple-choice``) whose graph gives the model's logits."""
    import onnxruntime as ort

    _, ours, inputs, _ = _multiple_choice()
    with torch.no_grad():
        got = ours(**inputs).logits
    ours.save_pretrained(tmp_path / "mc")
    optimum_onnx.main_export(str(tmp_path / "mc"), str(tmp_path / "onnx"), task="multiple-choice")
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx = session.run(["logits"], {i.name: inputs[i.name].numpy() for i in session.get_inputs()})[0]
    assert np.abs(onnx - got.numpy()).max() <= 1e-4


BLOCK_SHAREBERT = """
import sys
class _NoSharebert:  # this process stands for a machine where sharebert is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sharebert", "transformers_sharebert"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, _NoSharebert())
"""
IDS = [[101, 2023, 2003, 1037, 3231, 102, 0], [101, 7592, 2088, 999, 2204, 2154, 102]]


EMBED_TEXTS = ["a good film", "the capital of france is paris .", "short"]
REMOTE_SCRIPT = f"""
import json, sys, torch, transformers
try:
    import sharebert
    raise SystemExit("sharebert is importable")
except ImportError:
    pass
from sentence_transformers import SentenceTransformer
folders, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ids = torch.tensor({IDS!r})
out = {{}}
for name, auto in (("portable", "AutoModelForMaskedLM"), ("hub", "AutoModelForSequenceClassification"),
                   ("resaved", "AutoModelForSequenceClassification")):
    model = getattr(transformers, auto).from_pretrained(folders[name], trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=(ids > 0).long()).logits
    out[name] = {{"module": type(model).__module__, "logits": logits.tolist()}}
model = SentenceTransformer(folders["embedder"], device="cpu", trust_remote_code=True)
out["embedder"] = model.encode(texts, convert_to_numpy=True).tolist()
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "sharebert")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """The three hub-way folders of the tests below, made here: ``portable`` (``sharebert build --portable``),
    ``hub`` (``register_for_auto_class`` then ``save_pretrained``; its in-memory logits under ``hub_logits``) and
    ``embedder`` (an encoder with its recipe and portable code). All three are loaded with ``trust_remote_code=True``
    in ONE process where ``import sharebert`` fails (one interpreter start instead of three); ``outputs``: what
    it saw (``loaded``: the sharebert modules it imported, after all three loads)."""
    from sharebert import ShareBertConfig, ShareBertForSequenceClassification, ShareBertModel
    from sharebert.formats.recipe import DenseLayer, EmbeddingRecipe, write_recipe
    from sharebert.model.modeling_sharebert import AUTO_CLASSES
    from sharebert.model.portable import make_portable

    root = tmp_path_factory.mktemp("remote")
    folders = {name: root / name for name in ("portable", "hub", "embedder", "resaved")}
    assert (
        main(
            [
                "build",
                "--preset",
                "sharebert-tiny",
                *[f"--set={k}={v}" for k, v in TINY.items()],
                "--portable",
                "--out",
                str(folders["portable"]),
            ]
        )
        == 0
    )
    torch.manual_seed(0)  # the portable folder loaded by the package's class and saved again, as finetune does
    ShareBertForSequenceClassification.from_pretrained(folders["portable"]).save_pretrained(folders["resaved"])

    torch.manual_seed(0)
    model = ShareBertForSequenceClassification(
        ShareBertConfig.from_preset("sharebert-tiny", vocab_size=30528, num_labels=3, **TINY)
    )
    ShareBertForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
    try:
        model.save_pretrained(folders["hub"])
    finally:
        ShareBertForSequenceClassification._auto_class = None

    folder = folders["embedder"]
    build_model("sharebert-tiny", folder, TINY, seed=0)
    ShareBertModel.from_pretrained(folder).save_pretrained(folder)  # the encoder alone, as embedders ship
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(24, TINY["hidden_size"])).astype(np.float32) * 0.2, rng.normal(size=24).astype(np.float32)
    write_recipe(
        folder,
        EmbeddingRecipe(
            "mean", True, (DenseLayer("", TINY["hidden_size"], 24, True, "torch.nn.modules.activation.Tanh"),), 48, True
        ),
        [(w, b)],
    )
    make_portable(folder, AUTO_CLASSES)

    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_SHAREBERT)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            REMOTE_SCRIPT,
            json.dumps({k: str(v) for k, v in folders.items()}),
            json.dumps(EMBED_TEXTS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(site), "HF_MODULES_CACHE": str(root / "modules")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**folders, "hub_logits": _local_logits(model), "outputs": json.loads(done.stdout.strip().splitlines()[-1])}


def _local_logits(model) -> np.ndarray:
    ids = torch.tensor(IDS)
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=(ids > 0).long()).logits.numpy()


def test_portable_folder_loads_without_sharebert(remote):
    """``sharebert build --portable``: the folder's own code (generated from the package) gives the package's logits."""
    from transformers import AutoModelForMaskedLM

    folder = remote["portable"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_sharebert.ShareBertForMaskedLM"
    from sharebert.model.portable import FILES, portable_source

    assert all((folder / f"{name}.py").read_text() == portable_source(name) for name in FILES)
    got = remote["outputs"]["portable"]
    assert got["module"].startswith("transformers_modules.") and remote["outputs"]["loaded"] == []
    want = _local_logits(AutoModelForMaskedLM.from_pretrained(folder))  # the package's class (no remote code)
    assert np.abs(np.asarray(got["logits"]) - want).max() <= 1e-5


def test_a_portable_model_saved_again_keeps_its_code(remote):
    """A model loaded from a portable folder and saved (finetune's path) writes the code its ``auto_map`` names,
    so it loads where sharebert is not installed."""
    from sharebert import ShareBertForSequenceClassification
    from sharebert.model.portable import FILES, portable_source

    folder = remote["resaved"]
    config = json.loads((folder / "config.json").read_text())
    assert {v.split(".")[0] for v in config["auto_map"].values()} == set(FILES)
    assert all((folder / f"{name}.py").read_text() == portable_source(name) for name in FILES)
    got = remote["outputs"]["resaved"]
    assert got["module"].startswith("transformers_modules.")
    want = _local_logits(ShareBertForSequenceClassification.from_pretrained(folder))
    assert np.abs(np.asarray(got["logits"]) - want).max() <= 1e-5


def test_a_portable_model_saved_by_a_process_that_is_not_the_main_one_writes_nothing(remote, tmp_path):
    """``save_pretrained(..., is_main_process=False)`` (every rank but one under torchrun) writes no file, as
    transformers' save does (the portable code does not look for a config.json never written)."""
    from sharebert import ShareBertForSequenceClassification

    ShareBertForSequenceClassification.from_pretrained(remote["portable"]).save_pretrained(
        tmp_path / "r", is_main_process=False
    )
    assert not any((tmp_path / "r").glob("*.json")) and not any((tmp_path / "r").glob("*.py"))


def test_push_to_hub_of_a_portable_model_uploads_its_code(remote, tmp_path, monkeypatch):
    """``save_pretrained(..., push_to_hub=True)`` of a model loaded from a portable folder uploads the portable code
    its ``auto_map`` names (written before transformers uploads the folder). The Hub is out of reach
    in tests: huggingface_hub's repo creation and commit, as transformers calls them, record what they are given."""
    import transformers.utils.hub as hub

    from sharebert import ShareBertForSequenceClassification
    from sharebert.model.portable import FILES, portable_source

    uploaded = {}

    class Hub:  # huggingface_hub's HfApi as transformers calls it (``hub.hf_api()``)
        def create_repo(self, repo_id, **kw):
            return type("Url", (), {"repo_id": repo_id})()

        def create_commit(self, repo_id, operations, **kw):
            uploaded.update({op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations})

    monkeypatch.setattr(hub, "hf_api", Hub)
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **kw: type("Card", (), {"save": print})())
    model = ShareBertForSequenceClassification.from_pretrained(remote["portable"])
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="me/tiny", commit_message="up")
    assert {f"{name}.py" for name in FILES} <= set(uploaded) and "config.json" in uploaded
    assert all(uploaded[f"{name}.py"].decode() == portable_source(name) for name in FILES)
    assert (tmp_path / "local" / "modeling_sharebert.py").is_file()  # the local save is portable too


def test_export_of_a_portable_folder_leaves_its_auto_map_behind(remote, tmp_path):
    """The artifact of a portable folder carries no ``auto_map`` (it has no .py files to name) and
    runs in the device runtime."""
    from sharebert_runtime import Runtime
    from sharebert_runtime.main import main

    assert (
        main(
            [
                "export",
                "--model",
                str(remote["portable"]),
                "--out",
                str(tmp_path / "art"),
                "--shapes",
                "1x16",
                "--check-limit",
                "8",
            ]
        )
        == 0
    )  # parity still checked, on 8 sentences, not SST-2's 872
    config = json.loads((tmp_path / "art" / "config.json").read_text())
    assert "auto_map" not in config and config["model_type"] == "sharebert"
    assert not any((tmp_path / "art").glob("*.py"))
    assert Runtime(tmp_path / "art").fill_mask(["a [MASK] day"])


def test_a_plain_save_over_a_portable_folder_removes_its_code_and_nothing_else(remote, tmp_path):
    """A model without ``auto_map`` saved over a portable folder (``finetune --overwrite``) leaves no portable code
    naming classes the folder does not use; a user's file of that name stays."""
    import shutil

    from sharebert import ShareBertConfig, ShareBertForSequenceClassification

    folder = tmp_path / "f"
    shutil.copytree(remote["portable"], folder)
    raw = json.loads((folder / "config.json").read_text())
    plain = ShareBertForSequenceClassification(ShareBertConfig(**{k: v for k, v in raw.items() if k != "auto_map"}))
    plain.save_pretrained(folder)
    assert not any(folder.glob("*.py")) and "auto_map" not in json.loads((folder / "config.json").read_text())
    (folder / "modeling_sharebert.py").write_text("# the user's own\n")
    plain.save_pretrained(folder)
    assert (folder / "modeling_sharebert.py").read_text() == "# the user's own\n"


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_portable_save_over_a_users_file_of_that_name_is_refused(remote, tmp_path, kind):
    """A portable save where the user keeps a file named like a portable one (or a link there) is refused before
    anything is written: never overwritten without a word, nor written through the link into the user's file."""
    from sharebert import ShareBertForMaskedLM

    mine, folder = tmp_path / "mine.py", tmp_path / "f"
    mine.write_text("# the user's own\n")
    folder.mkdir()
    target = folder / "configuration_sharebert.py"
    target.write_text(mine.read_text()) if kind == "file" else target.symlink_to(mine)
    with pytest.raises(ValueError, match="configuration_sharebert.py is not code sharebert generated.*move it away"):
        ShareBertForMaskedLM.from_pretrained(remote["portable"]).save_pretrained(folder)
    assert mine.read_text() == target.read_text() == "# the user's own\n" and not (folder / "config.json").exists()


def test_register_for_auto_class_then_save_pretrained_shares_the_hub_way(remote):
    got = remote["outputs"]["hub"]
    assert got["module"].startswith("transformers_modules.")
    assert np.abs(np.asarray(got["logits"]) - remote["hub_logits"]).max() <= 1e-5


@pytest.mark.parametrize("sharing", ["veps", "eps"])
def test_lora_adapts_the_generated_weights_trains_only_adapters_merges_and_exports(sharing, tmp_path):
    from peft import PeftModel, get_peft_model
    from transformers import AutoTokenizer

    import sharebert
    from sharebert import ShareBertForSequenceClassification
    from sharebert.export.exporter import export_model

    shape = dict(TINY, sharing=sharing, num_labels=2)
    if sharing == "eps":
        shape.update(embedding_size=None, pooler="dense")
    base_dir = tmp_path / "base"
    build_model("sharebert-tiny", base_dir, {k: v for k, v in shape.items() if k != "num_labels"}, seed=0)
    model = ShareBertForSequenceClassification.from_pretrained(base_dir, num_labels=2)
    model.save_pretrained(base_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    enc = tokenizer(["a good film", "a dull , tedious film", "fine"], padding=True, return_tensors="pt")
    labels = torch.tensor([1, 0, 1])
    with torch.no_grad():
        base = model.eval()(**enc).logits.clone()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}

    peft_model = get_peft_model(model, sharebert.lora_config(model, r=4, task_type="SEQ_CLS"))
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable), trainable
    assert any("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    for _ in range(3):
        optimizer.zero_grad()
        peft_model(**enc, labels=labels).loss.backward()
        optimizer.step()
    peft_model.eval()
    with torch.no_grad():
        adapted = peft_model(**enc).logits.clone()
        encoder = peft_model.base_model.model.sharebert
        moved = (
            (
                encoder(**enc).last_hidden_state
                - ShareBertForSequenceClassification.from_pretrained(base_dir).eval().sharebert(**enc).last_hidden_state
            )
            .abs()
            .max()
            .item()
        )
    assert (adapted - base).abs().max().item() > 1e-3 and moved > 1e-4  # the encoder itself changed
    peft_model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(
        ShareBertForSequenceClassification.from_pretrained(base_dir), tmp_path / "adapter"
    )
    merged = peft_model.merge_and_unload()
    assert all(
        torch.equal(p, frozen[n])
        for n, p in merged.named_parameters()
        if "word_embeddings" not in n and "weight_generator" not in n and "classifier" not in n
    )
    with torch.no_grad():
        for other in (reloaded.eval()(**enc).logits, merged.eval()(**enc).logits):
            assert (other - adapted).abs().max().item() <= 1e-5
    merged.save_pretrained(tmp_path / "merged")
    tokenizer.save_pretrained(tmp_path / "merged")
    export_model(
        tmp_path / "merged",
        tmp_path / "artifact",
        task="text-classification",
        check_limit=4,
        runs=1,
        shapes=("1x16",),
        progress=False,
    )
    from sharebert_runtime import Runtime

    got = Runtime(tmp_path / "artifact").classify(["a good film", "a dull , tedious film", "fine"])
    probs = torch.softmax(adapted, -1).numpy()  # the artifact computes the adapted model (merged in its weights)
    names = [merged.config.id2label[i] for i in range(2)]
    assert np.abs(np.array([[r["scores"][n] for n in names] for r in got]) - probs).max() <= 1e-4


@pytest.mark.parametrize(
    "config, said",
    [
        (dict(sharing="none", embedding_size=None, pooler="dense"), "needs sharing 'veps' or 'eps'"),
        ("bert", "for sharebert models"),
    ],
)
def test_lora_config_refusals_name_the_problem(config, said):
    from transformers import BertConfig

    import sharebert
    from sharebert import ShareBertConfig

    cfg = BertConfig() if config == "bert" else ShareBertConfig.from_preset("sharebert-tiny", **TINY | config)
    with pytest.raises(ValueError, match=said):
        sharebert.lora_config(cfg)


def test_sentence_transformers_loads_a_sharebert_embedding_folder_as_the_artifact_embeds(remote, tmp_path):
    """A ShareBERT saved with its recipe (``sharebert.formats.recipe.write_recipe``: mean pooling, a Dense layer,
    Normalize): ``SentenceTransformer(dir)`` gives the exported artifact's embeddings, here (registration by
    ``import sharebert``) and, from the folder's portable code, in a process where sharebert is not installed
    (the ``remote`` fixture's)."""
    from sentence_transformers import SentenceTransformer

    from sharebert.export.exporter import export_model
    from sharebert_runtime import Runtime

    folder, texts = remote["embedder"], EMBED_TEXTS
    local = SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
    export_model(
        folder,
        tmp_path / "artifact",
        task="feature-extraction",
        check_limit=4,
        runs=1,
        shapes=("1x16",),
        progress=False,
    )
    artifact = np.stack(Runtime(tmp_path / "artifact").embed(texts))
    assert local.shape == (3, 24) and np.abs(np.linalg.norm(local, axis=1) - 1).max() <= 1e-5
    assert np.abs(local - artifact).max() <= 1e-4
    assert np.abs(np.asarray(remote["outputs"]["embedder"]) - artifact).max() <= 1e-4


def test_export_optimize_fuses_keeps_depth_and_equals_the_plain_artifact(mlm_dir, artifact_of, tmp_path):
    """``--optimize``: ONNX Runtime's BERT fusions on a depth-gated artifact; the session loads, the depth input
    still gates, and every depth gives the plain artifact's outputs."""
    import onnx
    import onnxruntime as ort

    from sharebert.export.exporter import export_model
    from sharebert_runtime.artifact import MODEL

    plain = json.loads((artifact_of("fp32 fill-mask") / "manifest.json").read_text())
    fused = export_model(mlm_dir, tmp_path / "fused", optimize=True, task="fill-mask", **QUICK_EXPORT)
    assert plain["optimized"] is None and fused["max_depth"] == plain["max_depth"] == TINY["num_hidden_layers"]
    assert (
        fused["optimized"].get("SkipLayerNormalization", 0) >= 1
        and fused["optimized"].get("LayerNormalization", 0) >= 1
    )
    ops = {n.op_type for n in onnx.load(str(tmp_path / "fused" / MODEL)).graph.node}
    assert "If" in ops and "SkipLayerNormalization" in ops
    assert fused["parity"]["max_abs_diff"] <= 1e-3 and fused["parity"]["depth_1"]["max_abs_diff"] <= 1e-3
    sessions = [
        ort.InferenceSession(str(folder / MODEL), providers=["CPUExecutionProvider"])
        for folder in (artifact_of("fp32 fill-mask"), tmp_path / "fused")
    ]
    ids = np.random.default_rng(0).integers(1000, 30000, (2, 12)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    outs = {}
    for depth in (1, TINY["num_hidden_layers"]):
        a, b = (s.run(["logits"], {**feeds, "depth": np.array(depth, np.int64)})[0] for s in sessions)
        assert np.abs(a - b).max() <= 1e-4
        outs[depth] = b
    assert np.abs(outs[1] - outs[TINY["num_hidden_layers"]]).max() > 1e-3  # depth still gates


def _ort_optimize(model, call: str):
    """ONNX Runtime's transformer optimizer on ``model`` (a path or ModelProto) as a user calls it: ``default``
    (``optimize_model(path, model_type="bert", ...)``: ONNX Runtime's basic graph optimizations, then the
    fusions) or ``fusions`` (``opt_level=0`` without symbolic shape inference, as ``--optimize``: the fusions
    alone, SkipLayerNormalization included)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    kwargs = {}
    if call == "fusions":
        options = FusionOptions("bert")
        options.enable_shape_inference = False
        kwargs = dict(opt_level=0, optimization_options=options)
    return optimize_model(
        model,
        model_type="bert",
        num_heads=TINY["num_attention_heads"],
        hidden_size=TINY["hidden_size"],
        use_gpu=False,
        **kwargs,
    )


def _ort_feeds(session) -> dict:
    ids = np.random.default_rng(0).integers(1000, 2000, (2, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, -3:] = 0  # a padded row
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {i.name: feeds[i.name] for i in session.get_inputs() if i.name in feeds}


@pytest.mark.parametrize("call", ["default", "fusions"])
@pytest.mark.parametrize("kind", list(ARTIFACT_KINDS))
def test_ort_transformer_optimizer_writes_a_valid_model_with_the_artifacts_outputs(artifact_of, kind, call, tmp_path):
    """ONNX Runtime's own ``optimize_model(model_type="bert")`` on a ``sharebert export`` artifact, called by hand:
    the model it writes loads, fuses something, and gives the artifact's outputs at every depth (the depth input
    still gates)."""
    import onnx
    import onnxruntime as ort

    from sharebert.export import session_options
    from sharebert_runtime.artifact import DEPTH, MODEL

    folder = artifact_of(kind)
    optimized = _ort_optimize(str(folder / MODEL), call)
    optimized.save_model_to_file(str(tmp_path / MODEL))
    fused = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    assert fused.get("SkipLayerNormalization", 0) + fused.get("BiasGelu", 0) + fused.get("Gelu", 0) >= 1, fused
    sessions = [
        ort.InferenceSession(str(f / MODEL), session_options(folder), providers=["CPUExecutionProvider"])
        for f in (folder, tmp_path)
    ]
    feeds = _ort_feeds(sessions[0])
    gated = DEPTH in {i.name for i in sessions[0].get_overridable_initializers()}  # an input with a default
    assert (
        gated == (ARTIFACT_KINDS[kind][1] > 1) == bool(json.loads((folder / "manifest.json").read_text())["max_depth"])
    )
    if gated:
        assert DEPTH in {i.name for i in sessions[1].get_overridable_initializers()}
        assert "If" in {n.op_type for n in onnx.load(str(tmp_path / MODEL)).graph.node}
    outs = {}
    for depth in (1, TINY["num_hidden_layers"]) if gated else (None,):
        run = {**feeds, DEPTH: np.array(depth, np.int64)} if gated else feeds
        want, got = (s.run(None, run) for s in sessions)
        assert len(want) == len(got) >= 1 and all(np.isfinite(g).all() for g in got)
        diff = max(float(np.abs(w - g).max()) for w, g in zip(want, got))
        assert diff <= 1e-4, (kind, call, depth, diff)
        outs[depth] = got[0]
    if gated:
        assert np.abs(outs[1] - outs[TINY["num_hidden_layers"]]).max() > 1e-3  # depth still gates


@pytest.mark.parametrize("call", ["default", "fusions"])
def test_ort_transformer_optimizer_on_the_ram_int8_compute_graph(artifact_of, call):
    """The RAM-int8 kind: ``ram_int8/compute.onnx`` (its external data read from the artifact folder) through ONNX
    Runtime's optimizer gives the device runtime's RAM-int8 outputs at every depth."""
    import onnx
    import onnxruntime as ort
    from onnx.external_data_helper import load_external_data_for_model

    from sharebert_runtime import Runtime
    from sharebert_runtime.artifact import RAM_INT8_COMPUTE, session_options

    folder = artifact_of("fp32 fill-mask")
    runtime = Runtime(folder, ram="int8", threads=1)
    ids = np.random.default_rng(0).integers(1000, 2000, (2, 9)).astype(np.int64)
    depths = (1, TINY["num_hidden_layers"])
    want = {d: runtime.at_depth(d)._run(ids, np.ones_like(ids))["logits"] for d in depths}
    graph = onnx.load(str(folder / RAM_INT8_COMPUTE), load_external_data=False)
    load_external_data_for_model(graph, str(folder))
    optimized = _ort_optimize(graph, call)
    runtime.session = ort.InferenceSession(
        optimized.model.SerializeToString(), session_options(None, 1), providers=["CPUExecutionProvider"]
    )
    for d in depths:
        got = runtime.at_depth(d)._run(ids, np.ones_like(ids))["logits"]
        assert np.isfinite(got).all() and np.abs(got - want[d]).max() <= 1e-4, d
    assert np.abs(want[1] - want[TINY["num_hidden_layers"]]).max() > 1e-3


@pytest.mark.parametrize(
    "args, said",
    [
        (["--quantize", "int8"], "--optimize applies ONNX Runtime's fp32 encoder fusions"),
        (["--format", "ort"], "needs --quantize none, --format onnx"),
    ],
)
def test_export_optimize_refusals(mlm_dir, tmp_path, capsys, args, said):
    out = tmp_path / "never"
    assert main(["export", "--model", str(mlm_dir), "--out", str(out), "--optimize", *args]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_make_portable_refuses_a_folder_that_is_not_sharebert(tmp_path):
    from transformers import BertConfig

    from sharebert.model.modeling_sharebert import AUTO_CLASSES
    from sharebert.model.portable import make_portable

    BertConfig(num_hidden_layers=1).save_pretrained(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="config.json: model_type is 'bert', not 'sharebert'"):
        make_portable(tmp_path, AUTO_CLASSES)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
