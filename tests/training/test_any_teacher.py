"""Teachers of every encoder architecture and tokenizer kind (tests/tiny_teachers.py: tiny models built from
transformers' config classes with tokenizers trained on the shared text, nothing downloaded): read, exported and
run torch-free as PyTorch runs them, distilled into a student that speaks their tokenizer, their vocabulary cut
with exact ids."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tiny_teachers import ARCHITECTURES, build, training_text

KINDS = {"wordpiece": "bert", "bpe": "roberta", "unigram": "xlm-roberta"}  # one architecture per tokenizer kind


@pytest.fixture(scope="session")
def teachers(tmp_path_factory):
    """``{model_type: {"embedding": folder, "classifier": folder}}`` for every architecture, built once."""
    root = tmp_path_factory.mktemp("teachers")
    return {model_type: build(root, model_type) for model_type in ARCHITECTURES}


def _cos(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


SENTENCES = ["The cat sat on the mat.", "A much longer sentence about the weather in Paris, written in 1999!", "ok"]


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_architecture_is_read_as_a_teacher(teachers, model_type):
    from sharebert.training.teacher import embedding_tables, read_teacher, teacher_shape, teacher_tokenizer

    for folder in teachers[model_type].values():
        assert read_teacher(folder)["model_type"] == model_type
        assert teacher_shape(folder) == {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 2}
        assert teacher_tokenizer(folder).pad_token_id is not None
    from transformers import AutoModel

    model = AutoModel.from_pretrained(teachers[model_type]["embedding"])
    t = embedding_tables(model)
    assert t["word"].shape[0] == 1000
    pos = getattr(getattr(model, "embeddings", None), "position_embeddings", None)
    if model_type in ("roberta", "xlm-roberta", "mpnet"):  # positions counted after padding_idx
        assert torch.equal(t["position"], pos.weight[pos.padding_idx + 1 :])
    elif model_type in ("modernbert", "deberta-v2"):  # rotary / relative positions: none to copy
        assert t["position"] is None
    else:
        assert torch.equal(t["position"], pos.weight)
    assert (t["token_type"] is None) == (model_type in ("distilbert", "mpnet", "modernbert", "deberta-v2"))


@pytest.mark.parametrize("model_type, length", [("roberta", 130), ("mpnet", 130), ("bert", 128), ("modernbert", 128)])
def test_an_export_reads_no_position_past_the_learned_ones(teachers, model_type, length):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sharebert.training.teacher import usable_length

    folder = teachers[model_type]["classifier"]
    tok = AutoTokenizer.from_pretrained(folder)
    tok.model_max_length = int(1e30)  # unset, as many published tokenizers leave it
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.max_position_embeddings == (130 if model_type in ("roberta", "mpnet") else 128)
    pos = getattr(model.base_model.embeddings, "position_embeddings", None)
    offset = pos.padding_idx + 1 if model_type in ("roberta", "mpnet") else 0  # MPNet's: 1 whatever its pad id
    assert usable_length(model, tok) == length - offset  # RoBERTa's, MPNet's: 130 rows less padding_idx + 1
    tok.model_max_length = 64
    assert usable_length(model, tok) == 64


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_export_of_any_architecture_runs_torch_free_as_pytorch(teachers, model_type, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sharebert.export import export_model
    from sharebert_runtime import Runtime

    folder = teachers[model_type]["embedding"]
    export_model(folder, tmp_path / "emb", check_limit=16, runs=1, progress=False)
    assert Runtime(tmp_path / "emb").verify()["passed"]  # its own check, replayed (`sharebert verify`)
    got = np.stack(Runtime(tmp_path / "emb").embed(SENTENCES))
    assert _cos(got, SentenceTransformer(str(folder)).encode(SENTENCES)).min() > 0.999
    folder = teachers[model_type]["classifier"]
    manifest = export_model(folder, tmp_path / "clf", check_limit=16, runs=1, progress=False)
    assert manifest["labels"] == ["negative", "positive"] and Runtime(tmp_path / "clf").verify()["passed"]
    answers = Runtime(tmp_path / "clf").classify(SENTENCES, text_pair=SENTENCES[::-1])
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        want = model.eval()(**tok(SENTENCES, SENTENCES[::-1], padding=True, return_tensors="pt")).logits.softmax(-1)
    got = np.array([[a["scores"][name] for name in ("negative", "positive")] for a in answers])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cut_vocabulary_keeps_every_token_of_its_text_and_maps_ids_exactly(teachers, kind, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from sharebert.training.vocab import cut_vocabulary

    tok = AutoTokenizer.from_pretrained(teachers[KINDS[kind]]["embedding"])
    text = training_text(1600)[1000:1300]
    cut = cut_vocabulary(tok, text)
    assert cut.coverage == 1.0 and len(cut.kept) < len(tok) and cut.kept == tuple(sorted(cut.kept))
    student_id = {t: i for i, t in enumerate(cut.kept)}
    cut.tokenizer.save_pretrained(tmp_path)
    runtime, again = Tokenizer.from_file(str(tmp_path / "tokenizer.json")), AutoTokenizer.from_pretrained(tmp_path)
    for a, b in [(s, None) for s in text[:100]] + [(text[0], text[1])]:
        want = [student_id[i] for i in tok(a, b)["input_ids"]]
        assert cut.tokenizer(a, b)["input_ids"] == want
        assert again(a, b)["input_ids"] == want
        assert (runtime.encode(a) if b is None else runtime.encode(a, b)).ids == want
    assert again.pad_token_id == student_id[tok.pad_token_id] and again.model_input_names == tok.model_input_names
    small = cut_vocabulary(tok, text, 300)  # forced: the most frequent tokens, all specials, never an id out of range
    assert len(small.kept) <= 300 and small.coverage < 1.0
    assert set(tok.all_special_ids) <= set(small.kept)
    ids = small.tokenizer(training_text()[1700:1800])["input_ids"]
    assert max(max(row) for row in ids) < len(small.kept)


def test_byte_level_cut_loses_no_text(teachers):
    from transformers import AutoTokenizer

    from sharebert.training.vocab import cut_vocabulary

    tok = AutoTokenizer.from_pretrained(teachers["roberta"]["embedding"])
    cut = cut_vocabulary(tok, training_text(1200)[1000:1100], 400)
    unseen = "Zürich's naïve café: 東京 ✓"
    assert cut.tokenizer.decode(cut.tokenizer(unseen, add_special_tokens=False)["input_ids"]) == unseen


def test_compress_cuts_a_vocabulary_that_does_not_fit_and_says_how_much_it_kept(teachers):
    from sharebert.accounting.budget import student_for
    from sharebert.training.teacher import teacher_shape, teacher_tokenizer
    from sharebert.training.vocab import plan_vocabulary

    folder = teachers["xlm-roberta"]["embedding"]
    tok, said = teacher_tokenizer(folder), []
    shape = {**teacher_shape(folder), "hidden_size": 384, "num_hidden_layers": 6, "vocab_size": 250_002}
    text = lambda: training_text(1100)[1000:1100]  # noqa: E731
    limits = {"max_params": 2_000_000}
    with pytest.raises(ValueError, match="no ShareBERT student fits"):
        student_for(shape, limits)
    cut = plan_vocabulary(tok, shape, limits, student_for, text, say=said.append)
    assert cut is not None and cut.coverage == 1.0 and "of its tokens kept" in said[0]
    student_for({**shape, "vocab_size": cut.table_rows}, limits)  # fits now
    assert cut.table_rows >= len(cut.kept)  # enough rows to generate its layers from, the extra ones never looked up
    assert cut.table_rows < 250_002 / 10
    assert plan_vocabulary(tok, {**shape, "vocab_size": 5000}, limits, student_for, text) is None  # fits whole
    forced = plan_vocabulary(tok, {**shape, "vocab_size": 5000}, limits, student_for, text, size=200, say=said.append)
    assert len(forced.kept) <= 200 and forced.as_dict()["size"] == len(forced.kept)


def _student_cosine(student_dir, teacher_dir, sentences) -> float:
    from sentence_transformers import SentenceTransformer

    import sharebert.model.modeling_sharebert  # noqa: F401  (the student's Auto classes)

    s = SentenceTransformer(str(student_dir)).encode(sentences)
    return float(_cos(s, SentenceTransformer(str(teacher_dir)).encode(sentences)).mean())


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_short_distillation_of_any_teacher_improves_the_students_cosine(teachers, model_type, tmp_path):
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert.training.teacher import student_fields, teacher_tokenizer
    from sharebert.training.vocab import cut_vocabulary

    teacher = teachers[model_type]["embedding"]
    text = tmp_path / "train.txt"
    text.write_text("\n".join(training_text(1400)[1000:1400]))
    tok = teacher_tokenizer(teacher)
    shape = dict(
        hidden_size=32,
        embedding_size=16,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        **student_fields(tok),
    )
    vocab = cut_vocabulary(tok, training_text(1400)[1000:1400]) if model_type in ("roberta", "xlm-roberta") else None
    held = training_text()[1750:1814]
    scores = []
    for steps in (1, 60):
        args = EmbeddingArgs(
            max_steps=steps,
            batch_size=16,
            lr=1e-3,
            warmup_steps=0,
            weights=DistillWeights(hidden=0, attention=0, embedding=0),
        )
        m = distill_embedding(
            teacher,
            "sharebert-tiny",
            tmp_path / f"s{steps}",
            [text],
            args,
            overrides=shape,
            progress=False,
            score_sts=False,
            vocab=vocab,
        )
        assert m["init"] == "teacher"
        scores.append(_student_cosine(tmp_path / f"s{steps}", teacher, held))
    assert scores[1] > scores[0], scores
    saved = json.loads((tmp_path / "s60" / "config.json").read_text())
    assert saved["type_vocab_size"] == (2 if "token_type_ids" in tok.model_input_names else 1)
    if vocab is not None:
        assert saved["vocab_size"] == len(vocab.kept) < 1000


@pytest.mark.parametrize(
    "kind, message",
    [
        ("gpt2", "is a causal (decoder) model"),
        ("bart", "is an encoder-decoder model"),
        ("vit", "model_type 'vit' is not a text encoder"),
        ("no_tokenizer", "has no tokenizer files"),
    ],
)
def test_folders_that_are_no_encoder_teacher_get_one_line_errors(teachers, tmp_path, kind, message, capsys):
    import transformers

    from sharebert_runtime.main import main

    folder = tmp_path / kind
    if kind == "no_tokenizer":
        shutil.copytree(teachers["roberta"]["embedding"], folder)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (folder / name).unlink(missing_ok=True)
    else:
        config = {"gpt2": transformers.GPT2Config, "bart": transformers.BartConfig, "vit": transformers.ViTConfig}[kind]
        config(
            architectures=[{"gpt2": "GPT2LMHeadModel", "bart": "BartModel", "vit": "ViTModel"}[kind]]
        ).save_pretrained(folder)
    for argv in (
        ["compress", str(folder), "--out", str(tmp_path / "out")],
        ["export", "--model", str(folder), "--out", str(tmp_path / "art")],
    ):
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
        if kind != "no_tokenizer" and argv[0] == "compress":
            assert "bidirectional encoder teacher (bert, distilbert, roberta" in err
        assert not (tmp_path / "out").exists() and not (tmp_path / "art").exists()


@pytest.mark.slow
def test_the_teachers_artifact_takes_the_first_quantization_that_keeps_it(teachers, tmp_path, monkeypatch):
    from sharebert.pipelines import teacher_pass as t
    from sharebert.pipelines.run import Teacher
    from sharebert_runtime.outdir import read_json

    folder, said = Teacher.read(teachers["mpnet"]["embedding"]), []
    art, mode, refused = t.export_teacher(folder, tmp_path / "a", "feature-extraction", False, said.append)
    assert (mode, refused, said) == ("int8-dynamic", {}, [])
    monkeypatch.setattr(t, "TEACHER_COSINE", 0.99999)  # tighter than int8 compute and int8 storage keep it here
    art, mode, refused = t.export_teacher(folder, tmp_path / "b", "feature-extraction", False, said.append)
    assert mode in ("fp16", "none") and {"int8-dynamic", "int8"} <= set(refused)
    assert read_json(art / "manifest.json")["quantization"] == mode and len(said) == len(refused)
    assert t.export_teacher(folder, tmp_path / "b", "feature-extraction", False)[1] == mode  # a resumed run keeps it
    monkeypatch.setattr(t, "TEACHER_COSINE", 1.5)
    with pytest.raises(ValueError, match="no quantization keeps the teacher"):
        t.export_teacher(folder, tmp_path / "c", "feature-extraction", False, said.append)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_mlm_distillation_takes_a_masked_lm_teacher_of_any_architecture(model_type, tmp_path, capsys):
    """`distill --objective mlm` from each architecture's masked-LM head: soft targets over the teacher's own
    vocabulary, a student that keeps that tokenizer."""
    from tiny_teachers import masked_lm
    from transformers import AutoTokenizer

    from sharebert_runtime.main import main

    teacher, text, out = masked_lm(tmp_path, model_type), tmp_path / "train.txt", tmp_path / "student"
    text.write_text("\n".join(training_text(1200)[1000:1200]))
    assert (
        main(
            [
                "distill",
                "--objective",
                "mlm",
                "--teacher",
                str(teacher),
                "--student",
                "bert-h128",
                "--train",
                str(text),
                "--out",
                str(out),
                "--max-steps",
                "3",
                "--batch-size",
                "4",
                "--seq-len",
                "32",
            ]
        )
        == 0
    ), capsys.readouterr().err
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 3 and m["soft_targets"] and np.isfinite(m["train_loss"])
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(teacher).get_vocab()


@pytest.mark.parametrize("model_type", [t for t in ARCHITECTURES if t != "bert"])  # BERT: counted analytically
def test_report_counts_a_folder_of_any_architecture_as_transformers_builds_it(teachers, model_type, capsys):
    """`report --model` of another architecture: the parameters transformers' model has, by component, and the
    FLOPs of its forward; --set (a ShareBERT shape) refused in one line."""
    from transformers import AutoModelForSequenceClassification

    from sharebert_runtime.main import main

    folder = teachers[model_type]["classifier"]
    assert main(["report", "--model", str(folder), "--head", "classifier", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert r["learned_params"] == sum(p.numel() for p in model.parameters()) == sum(r["components"].values())
    assert r["bytes"]["int8"] == r["learned_params"] and r["gflops"]["inference"] > 0
    assert main(["report", "--model", str(folder), "--set", "hidden_size=64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--set shapes a ShareBERT or BERT config" in err


@pytest.fixture(scope="module")
def masked_lm_named(tmp_path_factory):
    """``{model_type: folder}``: sentence-transformers folders of MPNet and BERT whose ``config.json`` names the
    masked-LM class (as many published ones do: the class their base was pre-trained as) and that hold no head."""
    root = tmp_path_factory.mktemp("named-mlm")
    folders = {}
    for model_type, arch in (("mpnet", "MPNetForMaskedLM"), ("bert", "BertForMaskedLM")):
        folder = build(root, model_type)["embedding"]
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = [arch]
        (folder / "config.json").write_text(json.dumps(config))
        folders[model_type] = folder
    return folders


@pytest.mark.parametrize("model_type", ["mpnet", "bert"])
def test_a_sentence_transformers_folder_exports_as_a_sentence_encoder_whatever_its_architectures(
    masked_lm_named, model_type, tmp_path, capsys
):
    from sentence_transformers import SentenceTransformer

    from sharebert.export.exporter import infer_task
    from sharebert_runtime import Runtime
    from sharebert_runtime.main import main

    folder = masked_lm_named[model_type]
    config = json.loads((folder / "config.json").read_text())
    assert infer_task(config) == "fill-mask" and infer_task(config, folder) == "feature-extraction"
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "art"), "--check-limit", "8"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "art" / "manifest.json").read_text())["task"] == "feature-extraction"
    got = np.stack(Runtime(tmp_path / "art").embed(SENTENCES))
    assert _cos(got, SentenceTransformer(str(folder)).encode(SENTENCES)).min() > 0.999
    # asked for the head its architectures name, it is refused with the task that works, which then exports
    argv = ["export", "--model", str(folder), "--out", str(tmp_path / "mlm"), "--task", "fill-mask"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no trained weights" in err and "(--task feature-extraction)" in err, err
    assert not (tmp_path / "mlm").exists()


def test_a_head_named_but_never_saved_is_refused_naming_the_encoders_task(masked_lm_named, tmp_path, capsys):
    """Without modules.json the folder's architectures say fill-mask; its weights hold the encoder alone: the hint
    names --task feature-extraction, never the task that just failed."""
    from sharebert_runtime.main import main

    folder = tmp_path / "plain"
    shutil.copytree(masked_lm_named["mpnet"], folder)
    (folder / "modules.json").unlink()
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "art"), "--check-limit", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the fill-mask model needs" in err and "(--task feature-extraction)" in err, err
    assert "--task fill-mask" not in err
    argv = ["export", "--model", str(folder), "--out", str(tmp_path / "art"), "--check-limit", "8"]
    assert main([*argv, "--task", "feature-extraction"]) == 0
