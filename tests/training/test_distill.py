"""Knowledge distillation: exact losses (copy of the teacher -> 0, KL at T=2 by hand), gradients, a short real run,
bad input."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from sharebert.formats.build import build_model, config_for_vocab
from sharebert.formats.model_folder import load_model
from sharebert.formats.paths import data_path, default_vocab
from sharebert.model.modeling_sharebert import ShareBertForSequenceClassification
from sharebert.training.arguments import DistillArgs, DistillWeights
from sharebert.training.distill import distill_glue
from sharebert.training.distill_losses import Projections, distill_losses, head_groups, layer_map, soft_kl
from sharebert.training.distill_run import PROJECTIONS_FILE
from sharebert.training.distill_teacher import load_teacher
from sharebert.training.encoded import encode, predict_logits
from sharebert.training.glue import get_task, read_split
from sharebert_runtime.main import main

SHAPE = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64
)
STUDENT = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    embedding_size=16,
    max_position_embeddings=64,
)
ALL = DistillWeights(temperature=2.0, kl=1.0, hard=0.0, hidden=1.0, attention=1.0, embedding=1.0)


def _bert_classifier(folder, seed=0, **labels):
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(vocab_size=30522, **{"num_labels": 2, **labels}, **SHAPE)).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(300)  # confident, input-dependent predictions: soft targets far from uniform
        model.classifier.bias.copy_(torch.linspace(1.0, -1.0, model.num_labels))
    model.save_pretrained(folder)
    BertTokenizerFast(str(default_vocab())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return _bert_classifier(tmp_path_factory.mktemp("teacher"))


def _batch():
    tok = BertTokenizerFast(str(default_vocab()))
    return tok(["a fine film , warm and funny", "dull"], padding=True, return_tensors="pt")


def _outputs(model, batch, **kw):
    return model(**batch, output_hidden_states=True, output_attentions=True, **kw)


def test_student_that_copies_the_teacher_has_every_distillation_loss_zero(teacher_dir):
    teacher = load_teacher(teacher_dir)
    student = load_model(ShareBertForSequenceClassification, teacher_dir)[0].eval()  # the same function
    batch = _batch()
    assert batch["attention_mask"].min() == 0  # padding present: masked positions must not count
    pairs = layer_map(2, 2)
    parts = distill_losses(
        _outputs(student, batch),
        _outputs(teacher, batch),
        batch["attention_mask"],
        None,
        Projections(32, 32),
        ALL,
        pairs,
        head_groups(2, 2),
    )
    assert set(parts) == {"kl", "hidden", "attention", "embedding", "loss"}
    for name, value in parts.items():
        assert float(value.detach()) <= 1e-6, (name, float(value.detach()))  # fails on NaN too


def test_kl_matches_a_hand_computation_at_t2():
    s = np.array([[1.0, -0.5, 2.0], [0.3, 0.3, -1.0]])
    t = np.array([[2.0, 0.0, -1.0], [0.0, 1.5, 0.5]])
    T = 2.0

    def softmax(x):
        e = np.exp(x / T - (x / T).max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    p, q = softmax(t), softmax(s)
    want = T * T * np.mean(np.sum(p * np.log(p / q), axis=1))
    got = float(soft_kl(torch.tensor(s), torch.tensor(t), T))
    assert abs(got - want) <= 1e-6 and want > 0.1


def test_gradients_reach_a_p_and_the_projections(teacher_dir):
    teacher = load_teacher(teacher_dir)
    torch.manual_seed(0)
    student = ShareBertForSequenceClassification(config_for_vocab("sharebert-tiny", STUDENT, 30522))
    proj = Projections(64, 32)
    batch = _batch()
    parts = distill_losses(
        _outputs(student, batch),
        _outputs(teacher, batch),
        batch["attention_mask"],
        None,
        proj,
        ALL,
        layer_map(2, 2),
        head_groups(4, 2),
    )
    parts["loss"].backward()
    named = dict(student.named_parameters())
    for p in (
        named["sharebert.embeddings.word_embeddings.weight"],
        named["sharebert.weight_generator.projection"],
        proj.hidden.weight,
        proj.embedding.weight,
    ):
        norm = float(p.grad.norm())
        assert np.isfinite(norm) and norm > 0
    assert all(p.grad is None for p in teacher.parameters())


@pytest.mark.parametrize(
    "s, t, want",
    [
        (4, 12, [(1, 3), (2, 6), (3, 9), (4, 12)]),
        (2, 2, [(1, 1), (2, 2)]),
        (4, 2, [(1, 1), (2, 1), (3, 1), (4, 2)]),
    ],
)
def test_uniform_layer_map(s, t, want):
    assert [list(p) for p in layer_map(s, t)] == [list(p) for p in want]


@pytest.mark.parametrize("s, t, want", [(2, 4, [[0, 1], [2, 3]]), (4, 2, [[0], [0], [1], [1]]), (2, 2, [[0], [1]])])
def test_head_groups(s, t, want):
    assert head_groups(s, t) == want


def _kl_to_teacher(student, teacher, ds):
    s = torch.tensor(predict_logits(student, ds, progress=False))
    t = torch.tensor(predict_logits(teacher, ds, progress=False))
    return float(soft_kl(s, t, 1.0))


def test_short_distillation_moves_the_student_toward_the_teacher(teacher_dir, tmp_path):
    student_dir = tmp_path / "student"
    build_model("sharebert-tiny", student_dir, STUDENT, vocab=default_vocab(), seed=1)
    task = get_task("sst2")
    dev = read_split(task, data_path("glue", "SST-2"), "dev").head(64)
    tok = BertTokenizerFast(str(default_vocab()))
    ds = encode(dev, tok, 64, progress=False)
    teacher = load_teacher(teacher_dir)
    from sharebert.training.finetune import load_classifier

    before = _kl_to_teacher(load_classifier(student_dir, task).eval(), teacher, ds)
    out = tmp_path / "out"
    args = DistillArgs(
        max_steps=30,
        max_train_samples=256,
        max_eval_samples=64,
        batch_size=16,
        lr=2e-3,
        warmup_steps=2,
        eval_steps=15,
        seq_len=64,
        weights=DistillWeights(hard=0.0, hidden=0.0, attention=0.0, embedding=0.0),
    )
    m = distill_glue(teacher_dir, str(student_dir), "sst2", out, args=args, progress=False)
    student, missing = load_model(ShareBertForSequenceClassification, out)
    after = _kl_to_teacher(student.eval(), teacher, ds)
    assert after < 0.5 * before, (before, after)
    assert missing == [] and not (out / PROJECTIONS_FILE).exists() and not (out / "checkpoints").exists()
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["steps"] == 30 and 0 <= saved["accuracy"] <= 1 and 0 <= saved["teacher"]["accuracy"] <= 1
    assert m["teacher"] == saved["teacher"]


def test_a_clock_bounded_task_distillation_anneals_its_learning_rate(teacher_dir, tmp_path, capsys, stepped_clock):
    """`distill --objective glue --max-time` (compress's task phase), bounded by the clock and no step count:
    the learning rate warms up and falls with the clock, so the last logged rate is far below the peak (and the
    default 5 epochs, 20 steps here, do not end the run first). Each step takes 0.05 s of the test's clock: the
    6 s end the run at step 119, its rate logged at steps 50 and 100."""
    stepped_clock.step_seconds = 0.05
    build_model("sharebert-tiny", tmp_path / "s", STUDENT, seed=0)
    out = tmp_path / "out"
    assert (
        main(
            [
                "distill",
                "--objective",
                "glue",
                "--task",
                "sst2",
                "--teacher",
                str(teacher_dir),
                "--student",
                str(tmp_path / "s"),
                "--out",
                str(out),
                "--max-time",
                "6",  # no --epochs: the clock ends it
                "--max-train-samples",
                "64",
                "--max-eval-samples",
                "16",
                "--batch-size",
                "16",
                "--lr",
                "1e-3",
                "--warmup-steps",
                "1",
                "--eval-steps",
                "10000",
                "--seq-len",
                "32",
                "--save-minutes",
                "0",
                "--hard-weight",
                "0",
                "--hidden-weight",
                "0",
                "--attention-weight",
                "0",
                "--embedding-weight",
                "0",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    rates = [e["learning_rate"] for e in json.loads((out / "log_history.json").read_text()) if "learning_rate" in e]
    assert m["stopped_by_time"] and m["steps"] >= 3 and len(rates) >= 2, (m["steps"], rates)
    assert m["train_seconds"] > 0 and max(rates) <= 1e-3 and rates[-1] <= 0.5 * max(rates), (m, rates)


def test_all_terms_train_and_projections_are_dropped(teacher_dir, tmp_path):
    out = tmp_path / "out"
    args = DistillArgs(
        max_steps=4, max_train_samples=64, max_eval_samples=32, batch_size=16, warmup_steps=1, eval_steps=2, seq_len=32
    )
    build_model("sharebert-tiny", tmp_path / "s", STUDENT, seed=0)
    distill_glue(teacher_dir, str(tmp_path / "s"), "sst2", out, args=args, progress=False, keep_checkpoints=True)
    ckpt = sorted(out.glob("checkpoints/checkpoint-*"))[-1]
    assert (ckpt / PROJECTIONS_FILE).is_file()  # checkpoints carry them, for --resume
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("projections" in k or k.startswith(("hidden.", "embedding.")) for k in keys)
    log = json.loads((out / "log_history.json").read_text())
    losses = [e for e in log if "loss_attention" in e]
    assert losses and all(
        math.isfinite(e[k]) for e in losses for k in ("loss_kl", "loss_hard", "loss_hidden", "loss_embedding")
    )
    # --resume continues from the newest complete checkpoint (same steps: nothing left to do, the projections
    # load); one killed while being saved (no completion marker)
    # is skipped, as pretrain skips it
    from sharebert.training.callbacks import MARKER, is_complete

    assert is_complete(ckpt)
    half = ckpt.with_name("checkpoint-99")
    shutil.copytree(ckpt, half)
    (half / "trainer_state.json").unlink()
    (half / MARKER).unlink()
    distill_glue(teacher_dir, str(tmp_path / "s"), "sst2", out, args=args, progress=False, resume=True)
    # --resume into a folder with nothing to resume says so instead of training from scratch
    with pytest.raises(ValueError, match="holds no complete checkpoint to continue from"):
        distill_glue(teacher_dir, str(tmp_path / "s"), "sst2", tmp_path / "new", args=args, progress=False, resume=True)
    assert not (tmp_path / "new").exists()


@pytest.fixture(scope="module")
def bad_folders(tmp_path_factory, teacher_dir):
    root = tmp_path_factory.mktemp("bad")
    _bert_classifier(root / "wrong_labels", num_labels=3)
    _bert_classifier(root / "named", id2label={0: "yes", 1: "no"}, label2id={"yes": 0, "no": 1})
    _bert_classifier(root / "nomask")
    BertTokenizerFast(str(default_vocab()), mask_token=None).save_pretrained(
        root / "nomask"
    )  # no [MASK] to augment with
    from transformers import BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=30522, **SHAPE)).save_pretrained(root / "mlm")
    BertTokenizerFast(str(default_vocab())).save_pretrained(root / "mlm")
    vocab = root / "vocab.txt"
    words = default_vocab().read_text().splitlines()
    words[2000], words[2001] = words[2001], words[2000]  # same size, other ids: only the hash can tell
    vocab.write_text("\n".join(words) + "\n")
    build_model("sharebert-tiny", root / "other_tok", STUDENT, vocab=vocab, seed=0)
    return root


BAD = [
    ("temperature 0", ["--temperature", "0"], "argument --temperature: must be a number > 0, got 0"),
    ("temperature -1", ["--temperature", "-1"], "argument --temperature: must be a number > 0, got -1"),
    ("temperature nan", ["--temperature", "nan"], "argument --temperature: must be a finite number, got nan"),
    ("negative weight", ["--kl-weight", "-1"], "argument --kl-weight: must be a number >= 0, got -1"),
    ("layer map syntax", ["--layer-map", "1-2"], "expected STUDENT:TEACHER pairs"),
    ("layer map range", ["--layer-map", "1:9"], "out of range"),
    ("teacher label count", ["--teacher", "{bad}/wrong_labels"], "has 3 labels, task sst2 has 2"),
    (
        "teacher label names",
        ["--teacher", "{bad}/named"],
        "has labels ['yes', 'no'], task sst2 has ['negative', 'positive']",
    ),
    ("teacher not a classifier", ["--teacher", "{bad}/mlm"], "is not a sequence classifier"),
    ("tokenizers differ", ["--student", "{bad}/other_tok"], "differs from the student's"),
    ("unknown student", ["--student", "no-such-preset"], "neither a model folder nor a preset"),
    (
        "every loss weight 0",
        [
            "--kl-weight",
            "0",
            "--hard-weight",
            "0",
            "--hidden-weight",
            "0",
            "--attention-weight",
            "0",
            "--embedding-weight",
            "0",
        ],
        "every loss weight is 0",
    ),
    ("max steps 0", ["--max-steps", "0"], "argument --max-steps: must be an integer >= 1, got 0"),
    ("augment 0", ["--augment", "0"], "argument --augment: must be an integer >= 1, got 0"),
    ("augment without the kl term", ["--augment", "2", "--kl-weight", "0"], "needs --kl-weight above 0"),
    ("augment on mlm", ["--objective", "mlm", "--augment", "2"], "--augment is for --objective glue"),
    (
        "augment without a mask token",
        ["--augment", "2", "--teacher", "{bad}/nomask", "--student", "sharebert-tiny"],
        "the tokenizer of {bad}/nomask has none",
    ),
    (
        "augment past the row limit",
        ["--augment", "1000000"],
        "makes 16,000,016 training rows from 16 examples, more than 2,000,000",
    ),
]


@pytest.mark.parametrize("case, extra, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    case, extra, message, teacher_dir, bad_folders, tmp_path, capsys
):
    opts = {
        "--teacher": str(teacher_dir),
        "--student": "sharebert-tiny",
        "--task": "sst2",
        "--out": str(tmp_path / "out"),
        "--max-steps": "1",
        "--max-train-samples": "16",
    }
    extra = [e.replace("{bad}", str(bad_folders)) for e in extra]
    message = message.replace("{bad}", str(bad_folders))
    for k, v in zip(extra[::2], extra[1::2]):
        opts[k] = v
    argv = ["distill"] + [x for kv in opts.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_mlm_general_distillation_on_text(bad_folders, tmp_path, capsys):
    student = tmp_path / "student"
    build_model("sharebert-tiny", student, STUDENT, seed=0)
    out = tmp_path / "out"
    argv = [
        "distill",
        "--objective",
        "mlm",
        "--teacher",
        str(bad_folders / "mlm"),
        "--student",
        str(student),
        "--train",
        str(data_path("wikitext-2-raw", "wiki.valid.raw")),
        "--out",
        str(out),
        "--max-steps",
        "3",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--max-train-samples",
        "64",
        "--save-minutes",
        "0.0001",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 3 and set(m["last_terms"]) == {"kl", "hard", "hidden", "attention", "embedding"}
    assert all(np.isfinite(v) and v > 0 for v in m["last_terms"].values())
    from sharebert.model.modeling_sharebert import ShareBertForMaskedLM

    assert load_model(ShareBertForMaskedLM, out)[1] == []
    # --save-minutes: a checkpoint by time at every step (save_steps is 500), the two newest kept; --resume goes on
    from sharebert.training.callbacks import checkpoints

    assert [(step, ok) for step, _, ok in checkpoints(out / "checkpoints")] == [(2, True), (3, True)]
    assert main(argv[:-2] + ["--max-steps", "4", "--resume"]) == 0, capsys.readouterr().err
    assert f"resuming from {out / 'checkpoints' / 'checkpoint-3'}" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["steps"] == 4
    assert main(argv[:-2] + ["--task", "sst2"]) == 2  # --task belongs to task distillation


def test_mlm_general_distillation_on_prepared_data(bad_folders, tmp_path, capsys):
    """--data reads `sharebert prepare` shards made with the teacher's tokenizer; another tokenizer is refused."""
    from sharebert.training.shards import prepare

    student = tmp_path / "student"
    build_model("sharebert-tiny", student, STUDENT, seed=0)
    teacher = bad_folders / "mlm"
    corpus = data_path("wikitext-2-raw", "wiki.valid.raw")
    prepare([corpus], tmp_path / "data", tokenizer=str(teacher), progress=False)
    common = [
        "distill",
        "--objective",
        "mlm",
        "--teacher",
        str(teacher),
        "--student",
        str(student),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--max-train-samples",
        "32",
    ]
    assert main(common + ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0, (
        capsys.readouterr().err
    )
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["steps"] == 2 and m["train_sequences"] == 32 and all(np.isfinite(v) for v in m["last_terms"].values())
    from sharebert.training.corpus import char_tokenizer

    build_model(
        "charlm-tiny",
        tmp_path / "chars",
        dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128),
        head="clm",
        tokenizer=char_tokenizer(corpus.read_text()[:5000]),
    )
    prepare([corpus], tmp_path / "other", tokenizer=str(tmp_path / "chars"), progress=False)
    assert main(common + ["--data", str(tmp_path / "other"), "--out", str(tmp_path / "out2")]) == 2
    assert "prepared with another tokenizer" in capsys.readouterr().err and not (tmp_path / "out2").exists()


def test_cached_teacher_logits_train_the_same_student(teacher_dir, tmp_path):
    student = tmp_path / "s"
    build_model("sharebert-tiny", student, STUDENT, seed=0)
    args = DistillArgs(
        max_steps=4,
        max_train_samples=64,
        max_eval_samples=32,
        batch_size=16,
        warmup_steps=1,
        eval_steps=4,
        seq_len=32,
        weights=DistillWeights(hidden=0.0, attention=0.0, embedding=0.0),
    )
    cache = tmp_path / "cache"
    runs = {}
    for name, c in (("plain", None), ("first", cache), ("cached", cache), ("damaged", cache)):
        if name == "damaged":  # a corrupt cache file is recomputed and replaced
            cached = next(cache.glob("*.npy"))
            cached.write_bytes(cached.read_bytes()[:40] + b"garbage")
        distill_glue(teacher_dir, str(student), "sst2", tmp_path / name, args=args, progress=False, cache_teacher=c)
        runs[name] = load_model(ShareBertForSequenceClassification, tmp_path / name)[0].state_dict()
        if name == "first":
            assert len(list(cache.glob("*.npy"))) == 1
    assert np.load(next(cache.glob("*.npy"))).shape == (64, 2)  # rewritten whole
    for name in ("first", "cached", "damaged"):
        diff = max(float((runs[name][k] - v).abs().max()) for k, v in runs["plain"].items())
        assert diff <= 1e-5, (name, diff)
    cached = next(cache.glob("*.npy"))  # the cache is what teaches (the teacher does not run again): other
    np.save(cached, -np.load(cached))  # logits in it train another student
    distill_glue(teacher_dir, str(student), "sst2", tmp_path / "other", args=args, progress=False, cache_teacher=cache)
    other = load_model(ShareBertForSequenceClassification, tmp_path / "other")[0].state_dict()
    assert max(float((other[k] - v).abs().max()) for k, v in runs["plain"].items()) > 1e-4
