"""Stock transformers BERT folders are read as BERT (sharing='none', BERT's layout), never as a random ShareBERT."""

import json

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel, BertTokenizerFast

from sharebert import ShareBertForMaskedLM, ShareBertForSequenceClassification, ShareBertModel
from sharebert.formats.model_folder import load_config, load_model
from sharebert.formats.paths import data_path, default_vocab
from sharebert.training.finetune import FinetuneArgs, finetune
from sharebert_runtime.main import main

SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _save(model, folder):
    model.save_pretrained(folder)
    BertTokenizerFast(str(default_vocab())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_dirs(tmp_path_factory):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, **SHAPE)
    root = tmp_path_factory.mktemp("bert")
    mlm = BertForMaskedLM(config).eval()
    cls = BertForSequenceClassification(BertConfig(vocab_size=30522, num_labels=2, **SHAPE)).eval()
    return {"mlm": (_save(mlm, root / "mlm"), mlm), "cls": (_save(cls, root / "cls"), cls)}


def _ids():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 30000, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


@pytest.mark.parametrize(
    "kind, ours, output",
    [
        ("mlm", ShareBertForMaskedLM, "logits"),
        ("cls", ShareBertForSequenceClassification, "logits"),
        ("mlm", ShareBertModel, "last_hidden_state"),
    ],
)
def test_bert_folder_loads_as_the_same_function(bert_dirs, kind, ours, output):
    folder, bert = bert_dirs[kind]
    config = load_config(folder)
    assert (config.sharing, config.norm_position, config.pooler, config.embedding_size) == (
        "none",
        "post",
        "dense",
        None,
    )
    model, missing = load_model(ours, folder)
    assert missing == [] or (ours is ShareBertModel and set(missing) <= {"pooler.weight", "pooler.bias"})
    ids, mask = _ids()
    with torch.no_grad():
        ref = bert if ours is not ShareBertModel else BertModel.from_pretrained(folder).eval()
        want = getattr(ref(input_ids=ids, attention_mask=mask), output)
        got = getattr(model.eval()(input_ids=ids, attention_mask=mask), output)
    keep = mask.bool() if got.dim() == 3 else slice(None)
    diff = (got[keep] - want[keep]).abs().max().item()
    assert diff <= 1e-4, diff


def test_report_of_a_bert_folder_counts_bert(bert_dirs, capsys):
    folder, bert = bert_dirs["mlm"]
    assert main(["report", "--model", str(folder), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["sharing"] == "none" and report["config"]["hidden_size"] == 64
    assert report["learned_params"] == BertModel(bert.config).num_parameters()  # the backbone, pooler included


def test_finetune_from_a_bert_folder_starts_from_its_weights(bert_dirs, tmp_path):
    """One step at learning rate 2e-7: the fine-tuned encoder is the BERT encoder (a random one would differ by
    ~0.02)."""
    folder, bert = bert_dirs["mlm"]
    args = FinetuneArgs(max_steps=1, max_train_samples=16, max_eval_samples=16, batch_size=8, lr=2e-7, warmup_steps=0)
    finetune(folder, "sst2", tmp_path / "ft", data_path("glue", "SST-2"), args, progress=False)
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model_type"] == "bert"  # BERT in, BERT out
    tuned, _ = load_model(ShareBertForSequenceClassification, tmp_path / "ft")
    want = bert.bert.encoder.layer[1].intermediate.dense.weight
    diff = (tuned.sharebert.layer_weights[1].matrices["ffn_in"] - want).abs().max().item()
    assert diff <= 1e-6, diff


def test_pretrain_from_a_bert_folder_starts_from_its_weights(bert_dirs, tmp_path, plain_transformers):
    """Masked-LM pre-training of a stock BERT folder continues BERT (sharing='none'), not a random ShareBERT,
    and saves BERT: plain transformers (sharebert not importable) loads it as BertForMaskedLM, the same function."""
    from sharebert.training.pretrain import PretrainArgs, pretrain

    folder, bert = bert_dirs["mlm"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat . " * 400)
    args = PretrainArgs(
        max_steps=1,
        batch_size=2,
        seq_len=32,
        lr=1e-9,
        save_steps=100,
        eval_steps=100,
        valid_fraction=0.0,
        progress=False,
    )
    pretrain([corpus], tmp_path / "run", folder, args=args)
    config = load_config(tmp_path / "run")
    assert (config.sharing, config.hidden_size, config.num_hidden_layers) == ("none", 64, 2)
    trained, _ = load_model(ShareBertForMaskedLM, tmp_path / "run")
    want = bert.bert.encoder.layer[0].attention.self.query.weight
    assert (trained.sharebert.layer_weights[0].matrices["query"] - want).abs().max().item() <= 1e-6
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_type"] == "bert"
    ids, mask = _ids()
    name, logits = plain_transformers(
        tmp_path / "run", "AutoModelForMaskedLM", {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    )
    with torch.no_grad():
        ours = trained.eval()(input_ids=ids, attention_mask=mask).logits.numpy()
    assert name == "BertForMaskedLM" and abs(logits - ours).max() <= 1e-4


def test_finetune_converts_a_bert_folder_to_sharebert_when_asked(bert_dirs, tmp_path):
    folder, _ = bert_dirs["mlm"]
    args = FinetuneArgs(max_steps=1, max_train_samples=16, max_eval_samples=16, batch_size=8, convert_to_sharebert=True)
    finetune(folder, "sst2", tmp_path / "ft", data_path("glue", "SST-2"), args, progress=False)
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["model_type"] == "sharebert" and config["architectures"] == ["ShareBertForSequenceClassification"]


def test_export_of_a_bert_folder_runs_at_full_depth_and_says_why(bert_dirs, tmp_path, capsys):
    """A transformers BERT has no forward(depth=) to check a gated graph against: its artifact has no depth
    input, the manifest says why, and asking for a depth is refused in one line quoting that reason."""
    from sharebert.export.exporter import export_model
    from sharebert_runtime import Runtime

    manifest = export_model(
        bert_dirs["mlm"][0], tmp_path / "art", check_limit=8, runs=2, progress=False, shapes=("1x64",)
    )
    assert manifest["max_depth"] is None and "sharebert models" in manifest["depth_note"]
    assert Runtime(tmp_path / "art").fill_mask("a [MASK] day")
    assert main(["predict", str(tmp_path / "art"), "--depth", "1", "a [MASK] day"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no depth input" in err[0] and "sharebert models" in err[0]
