"""Sentence pairs on the device, and BERT in, BERT out: a transformers BERT fine-tuned on STS-B (a regression
head on pairs) is saved as BERT (plain transformers loads it, sharebert not importable), exported, and
answered by Runtime.classify / predict / serve with text_pair as PyTorch answers it."""

import csv
import json
import threading

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

from sharebert.formats.paths import data_path, default_vocab
from sharebert_runtime import Runtime

SHAPE = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64
)
PAIRS = 48


@pytest.fixture(scope="module")
def stsb_pairs():
    with open(data_path("glue", "STS-B", "dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:PAIRS]
    first, second = [r["sentence1"] for r in rows], [r["sentence2"] for r in rows]
    first[0] = "a very long first sentence " * 20  # past the 64 positions: cut longest first
    return first, second


@pytest.fixture(scope="module")
def stsb_model(tmp_path_factory):
    """A small transformers BERT fine-tuned 4 steps on STS-B with `finetune` (saved as BERT), and its artifact."""
    from sharebert.export.exporter import export_model
    from sharebert.training.finetune import FinetuneArgs, finetune

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("pairs")
    # initializer_range 0.2: scores that differ from pair to pair, and token types that matter, after 4 steps
    BertModel(BertConfig(vocab_size=30522, initializer_range=0.2, **SHAPE)).save_pretrained(root / "bert")
    BertTokenizerFast(str(default_vocab())).save_pretrained(root / "bert")
    args = FinetuneArgs(max_steps=4, max_train_samples=64, max_eval_samples=32, batch_size=16, lr=1e-3, warmup_steps=0)
    finetune(root / "bert", "stsb", root / "ft", data_path("glue", "STS-B"), args, progress=False)
    export_model(root / "ft", root / "art", check_limit=8, runs=1, shapes=("1x8",), progress=False)
    return root / "ft", root / "art"


def test_finetuned_bert_folder_is_bert_without_sharebert(stsb_model, plain_transformers):
    from sharebert import ShareBertForSequenceClassification
    from sharebert.formats.model_folder import load_model

    folder, _ = stsb_model
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForSequenceClassification"]
    assert len(config["id2label"]) == 1  # the regression head
    ids = torch.randint(1000, 30000, (2, 10), generator=torch.Generator().manual_seed(0))
    feeds = {"input_ids": ids.numpy(), "token_type_ids": np.array([[0] * 5 + [1] * 5] * 2)}
    name, logits = plain_transformers(folder, "AutoModelForSequenceClassification", feeds)
    ours, _ = load_model(ShareBertForSequenceClassification, folder)
    with torch.no_grad():
        want = ours.eval()(**{k: torch.tensor(v) for k, v in feeds.items()}).logits.numpy()
    assert name == "BertForSequenceClassification" and logits.shape == (2, 1)
    assert np.abs(logits - want).max() <= 1e-5


def _torch_scores(folder, first, second):
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    enc = tokenizer(first, second, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[:, 0].numpy()


def test_pair_regression_matches_pytorch(stsb_model, stsb_pairs):
    folder, artifact = stsb_model
    first, second = stsb_pairs
    runtime = Runtime(artifact, threads=1)
    assert runtime.manifest["problem_type"] == "regression"
    got = runtime.classify(first, text_pair=second)
    assert got.truncated == 1 and set(got[0]) == {"score"}
    scores = np.array([r["score"] for r in got])
    want = _torch_scores(folder, first, second)
    assert np.abs(scores - want).max() <= 1e-4 and scores.std() >= 1e-2, (np.abs(scores - want).max(), scores.std())
    single = np.array([r["score"] for r in runtime.classify([f"{a} {b}" for a, b in zip(first, second)])])
    assert np.abs(single - want).max() >= 1e-2  # the pair's second segment (token type 1) matters


def test_predict_reads_pairs_from_json_lines_and_tsv(stsb_model, stsb_pairs, tmp_path):
    from sharebert_runtime.main import main

    folder, artifact = stsb_model
    first, second = stsb_pairs[0][1:6], stsb_pairs[1][1:6]
    want = _torch_scores(folder, first, second)
    jsonl, tsv = tmp_path / "pairs.jsonl", tmp_path / "pairs.tsv"
    jsonl.write_text(
        "".join(json.dumps({"text": a, "text_pair": b, "id": i}) + "\n" for i, (a, b) in enumerate(zip(first, second)))
    )
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in zip(first, second)))
    for source in (jsonl, tsv):
        out = tmp_path / f"{source.suffix[1:]}.out.jsonl"
        assert main(["predict", str(artifact), "--input", str(source), "--output", str(out)]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["text_pair"] for r in rows] == second
        assert np.abs(np.array([r["result"]["score"] for r in rows]) - want).max() <= 1e-4


def test_serve_answers_pairs(stsb_model, stsb_pairs, http_json):
    from sharebert_runtime.serve import make_server

    folder, artifact = stsb_model
    first, second = stsb_pairs[0][1:4], stsb_pairs[1][1:4]
    server = make_server(Runtime(artifact, threads=1), "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predict"

    def post(body):
        return http_json(url, body)

    try:
        status, body = post({"texts": first, "text_pair": second})
        assert status == 200
        want = _torch_scores(folder, first, second)
        assert np.abs(np.array([r["score"] for r in body["results"]]) - want).max() <= 1e-4
        status, body = post({"text": first[0], "text_pair": second[0]})
        assert status == 200 and abs(body["results"][0]["score"] - want[0]) <= 1e-4
        for bad, says in [
            ({"texts": first, "text_pair": second[:2]}, "one per text"),
            ({"texts": first, "text_pair": "one string"}, "a list of strings with"),
            ({"text": first[0], "text_pair": 3}, "a string with"),
            ({"text": first[0], "text_pair": ["a"]}, "a string with"),
        ]:
            status, body = post(bad)
            assert status == 400 and says in body["error"], (bad, body)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda rt: rt.classify(["a", "b"], text_pair=["c"]), ValueError, "one second text per text"),
        (lambda rt: rt.classify(["a"], text_pair=[3]), TypeError, "must be strings"),
        (
            lambda rt: rt.classify(["a"], text_pair=3),
            TypeError,
            "text_pair must be a string or a list of strings, got int",
        ),
        (
            lambda rt: rt.classify(["a"], text_pair={"b": 1}),
            TypeError,
            "text_pair must be a string or a list of strings, got dict",
        ),
    ],
)
def test_bad_pairs_are_refused(stsb_model, call, error, says):
    with pytest.raises(error, match=says):
        call(Runtime(stsb_model[1], threads=1))


def test_pairs_on_a_model_with_one_token_type(tmp_path):
    """A BERT with type_vocab_size 1 exports (with token types 0 traced: an index 1 is past its table) and answers
    pairs as transformers does for such a model: [CLS] a [SEP] b [SEP], token type 0 throughout."""
    from sharebert.export.exporter import export_model

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, type_vocab_size=1, initializer_range=0.2, num_labels=2, **SHAPE)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    BertTokenizerFast(str(default_vocab())).save_pretrained(tmp_path / "bert")
    export_model(tmp_path / "bert", tmp_path / "art", check_limit=4, runs=1, shapes=("1x8",), progress=False)
    first, second = ["a man is playing a guitar .", "x"], ["a guitar is being played .", ""]
    got = np.array(
        [r["scores"]["LABEL_1"] for r in Runtime(tmp_path / "art", threads=1).classify(first, text_pair=second)]
    )
    tokenizer = BertTokenizerFast.from_pretrained(tmp_path / "bert")
    enc = tokenizer(first, second, padding=True, return_tensors="pt")
    enc["token_type_ids"].zero_()
    with torch.no_grad():
        want = (
            BertForSequenceClassification.from_pretrained(tmp_path / "bert")
            .eval()(**enc)
            .logits.softmax(-1)[:, 1]
            .numpy()
        )
    assert np.abs(got - want).max() <= 1e-5
