"""Embedding distillation and `sharebert compress` on the real all-MiniLM-L6-v2.

One short `compress` run (tiny budgets) is shared: it improves STS-B Spearman over its start, its student is a
standard sentence-transformers folder, and its artifact alone gives the student's embeddings (projection
included). The teacher-started student is closer to the teacher than a random one; the loss is 0 for
identical vectors; bad inputs get one-line errors.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from open_count import count_opens

from sharebert.training.distill_embedding import HEAD_FIT
from sharebert.training.distill_embedding_model import (
    EmbeddingProjections,
    embedding_loss,
    fit_head,
    load_encoder,
    recipe_head,
)
from sharebert.training.distill_embedding_setup import build_student
from sharebert.training.distill_sentences import default_corpus, read_sentences
from sharebert.training.sentence_vectors import encode
from sharebert_runtime.main import main

SENTENCES = [
    "A man is playing a guitar.",
    "A woman is slicing an onion in the kitchen.",
    "The stock market fell sharply on Monday after the announcement.",
    "Two dogs run across a snowy field.",
    "Children are playing football in the park.",
    "The president spoke about the economy.",
    "A cat is sleeping on the warm windowsill.",
    "Heavy rain flooded the streets of the city.",
]


UNBOUNDED = "86400"  # a --max-time no test run reaches: its --max-steps decide
SAMPLES = "200"  # the shared run's --max-train-samples (each with a string of words: the teacher's pass over 400)


TINY_RUN = dict(overrides={"embedding_size": 32}, progress=False, eval_limit=8)  # a small student, 8 pairs scored


def _tiny_args(**fields):
    """``EmbeddingArgs`` of the short runs below: batches of 4 from 16 sentences, the sentence loss alone."""
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs

    weights = DistillWeights(hidden=0, attention=0, embedding=0)
    return EmbeddingArgs(batch_size=4, lr=1e-3, warmup_steps=0, max_train_samples=16, weights=weights, **fields)


STS_PAIRS = 200  # the STS-B dev pairs of the shared run's data folder (the real file's first 200 of 1,500)


@pytest.fixture(scope="session")
def sts_subset(tmp_path_factory) -> Path:
    """A data folder that is the real one (each file a link to it: the training text, SST-2 dev for export's parity)
    but for STS-B dev, cut to its first :data:`STS_PAIRS` pairs. The shared run's STS-B row then passes 400
    sentences through teacher and student, not 3,000 (~34 s of its ~70 s of CPU); the row is measured by the same
    code over every pair of the file it finds, which test_distill_embedding_cli_scores_max_eval_samples_pairs
    checks is all 1,500 of the real one."""
    from sharebert.formats.paths import data_dir

    real, root = data_dir(), tmp_path_factory.mktemp("data")
    for entry in real.iterdir():
        if entry.name != "glue":
            (root / entry.name).symlink_to(entry)
    for task in (real / "glue").iterdir():
        (root / "glue" / task.name).mkdir(parents=True)
        for file in task.iterdir():
            if (task.name, file.name) != ("STS-B", "dev.tsv"):
                (root / "glue" / task.name / file.name).symlink_to(file)
    lines = (real / "glue" / "STS-B" / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "glue" / "STS-B" / "dev.tsv").write_text("".join(lines[: 1 + STS_PAIRS]), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def compressed(minilm_dir, seed_minilm_cache, sts_subset, tmp_path_factory):
    """A short `sharebert compress` of the real MiniLM: 40 steps on 200 sentences, a checkpoint every 1.2 s of
    training, its work folder kept (--keep-work). --max-steps decides, never the clock: --max-time (600 s by
    default) bounds the whole command, and on a loaded machine its plan left the 40 steps 1. Its cache is a user's
    after a first compress of this teacher (conftest's minilm_user_run), its data folder :func:`sts_subset`; what
    it printed is in ``said.txt`` beside it."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("compress") / "run"
    seed_minilm_cache(out.parent / "cache")
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(said):  # its own cache, beside it
        env.setenv("SHAREBERT_CACHE", str(out.parent / "cache"))
        env.setenv("SHAREBERT_DATA", str(sts_subset))
        opens = count_opens(env, minilm_dir / "config.json")  # the whole run's, kept beside it
        rc = main(
            [
                "compress",
                str(minilm_dir),
                "--out",
                str(out),
                "--max-steps",
                "40",
                "--max-train-samples",
                SAMPLES,
                "--batch-size",
                "16",
                "--lr",
                "1e-3",
                "--max-params",
                "2.5M",
                "--save-minutes",
                "0.02",
                "--keep-work",
                "--max-time",
                UNBOUNDED,
            ]
        )
    (out.parent / "said.txt").write_text(said.getvalue())
    (out.parent / "config_opens.json").write_text(json.dumps(opens))
    assert rc == 0, said.getvalue()[-2000:]
    return out


def _cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(-1)


def test_teacher_start_is_closer_to_the_teacher_than_a_random_start(minilm_dir):
    from transformers import AutoTokenizer

    from sharebert.training.student_init import init_from_teacher

    teacher, tok = load_encoder(minilm_dir), AutoTokenizer.from_pretrained(minilm_dir)
    fit, held = read_sentences(default_corpus(), 400), SENTENCES
    t_fit, t_held = encode(teacher, tok, fit, "mean"), encode(teacher, tok, held, "mean")
    shape = {"embedding_size": 64, "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 256}
    closeness = {}
    for init in ("teacher", "random"):
        torch.manual_seed(0)
        student = build_student("sharebert-tiny", shape, teacher.config.vocab_size).eval()
        head = EmbeddingProjections(256, 384, 384).head
        if init == "teacher":
            init_from_teacher(student, teacher, head)
        fit_head(head, encode(student, tok, fit, "mean"), t_fit)  # the same head fit for both starts
        closeness[init] = float(_cos(encode(student, tok, held, "mean", head), t_held).mean())
    assert np.isfinite(list(closeness.values())).all()
    assert closeness["teacher"] >= closeness["random"] + 0.05, closeness


def test_embedding_loss_is_zero_for_identical_vectors_and_positive_otherwise(minilm_dir):
    from transformers import AutoTokenizer

    teacher, tok = load_encoder(minilm_dir), AutoTokenizer.from_pretrained(minilm_dir)
    t = torch.from_numpy(encode(teacher, tok, SENTENCES, "mean"))
    s = torch.from_numpy(encode(teacher, tok, SENTENCES, "mean"))  # the teacher as its own student
    for kind in ("mse", "cosine"):
        assert float(embedding_loss(s, t, kind)) <= 1e-6
        assert float(embedding_loss(s.roll(1, 0), t, kind)) >= 1e-3  # other sentences' vectors: a real loss
    assert float(embedding_loss(3 * s, t, "cosine")) <= 1e-6  # cosine ignores the scale, mse does not
    assert float(embedding_loss(3 * s, t, "mse")) >= 1e-3


def test_fit_head_recovers_a_linear_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(HEAD_FIT // 8, 16))
    w, b = rng.normal(size=(16, 24)), rng.normal(size=24)
    head = torch.nn.Linear(16, 24)
    fit_head(head, x, x @ w + b, ridge=0.0)
    assert np.abs(head.weight.detach().numpy().T - w).max() <= 1e-4
    assert np.abs(head.bias.detach().numpy() - b).max() <= 1e-4


def test_a_preset_student_trains_without_dropout_unless_set():
    from sharebert.training.distill_embedding_setup import build_student

    plain = build_student("sharebert-tiny", {"embedding_size": 16}, 30522).config
    assert (plain.hidden_dropout_prob, plain.attention_probs_dropout_prob, plain.vocab_size) == (0.0, 0.0, 30522)
    assert build_student("sharebert-tiny", {"hidden_dropout_prob": 0.1}, 30522).config.hidden_dropout_prob == 0.1


def test_short_compress_reports_its_agreement_with_the_teacher(compressed):
    r = json.loads((compressed / "report.json").read_text())
    s, t = r["student"], r["teacher"]
    assert [q["key"] for q in r["quality"]] == ["agreement_cosine", "agreement_top1", "search_top1", "sts_spearman"]
    assert "(35 queries over 105 sentences)" in r["quality"][2]["label"] and 0.0 <= s["search_top1"] <= 1.0
    assert f"all {STS_PAIRS} pairs" in r["quality"][-1]["label"]  # every pair of its data folder's STS-B dev
    assert np.isfinite([s["sts_spearman"], t["sts_spearman"], s["agreement_cosine"], s["agreement_top1"]]).all()
    # A student that learned from its teacher: one step leaves the mean cosine near 0.10, the fixture's 40 steps
    # give 0.27 (deterministic here); 0.2 tells the two apart without asking 40 steps for more.
    assert 0.2 < s["agreement_cosine"] < 1.0 and t["agreement_top1"] == 1.0
    assert set(r["calibration"]) == {"related", "unrelated"}
    # the student reads what its teacher reads (sentence_bert_config.json: 256), and every file of it says so
    assert t["name"] == "all-MiniLM-L6-v2" and s["portable"] and s["max_seq_length"] == t["max_seq_length"] == 256
    student = compressed / "student"
    assert json.loads((student / "config.json").read_text())["max_position_embeddings"] == 256
    assert json.loads((student / "tokenizer_config.json").read_text())["model_max_length"] == 256
    assert json.loads((student / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    assert "reads at most 256 tokens (its config, tokenizer and recipe say so), as its teacher does." in r["summary"]
    assert not {"checkpoints", "metrics.json", "sharebert_run.json"} & {
        p.name for p in (compressed / "student").iterdir()
    }
    assert s["learned_params"] <= 2.5e6 and t["learned_params"] == 22_713_216
    assert s["file_bytes"] < t["artifact_bytes"] / 4
    assert (compressed / "report.md").is_file() and (compressed / "report.png").stat().st_size > 1000
    # the verdict, first in report.md: 40 steps are far from usable (search agreement 0.9), all 200 sentences taken
    v = r["verdict"]
    assert v["usable_for_search"] is (s["search_top1"] >= 0.9) and v["search_top1"] == s["search_top1"]
    assert (v["steps"], v["planned_steps"], v["sentences"], v["available_sentences"]) == (40, 40, 200, 200)
    assert v["seconds_per_step"] == pytest.approx(r["training"]["train_seconds"] / 40) and not v["untrained"]
    md = (compressed / "report.md").read_text().splitlines()
    assert md[2] == v["lines"][0] and md[2].startswith("Verdict: ") and "of 35 search queries" in md[2]
    assert md[4] == v["lines"][1] and "It trained 40 of the 40 planned steps of 16 sentences" in md[4]
    # 40 steps of 16 over the 200 sentences and their 200 strings of words
    assert "on 200 of the 200 sentences of its training text (100%): 1.6 passes over them and their" in md[4]
    if not v["usable_for_search"]:  # 40 steps x 16 of the 2,200 x 32 a useful student needed: the budget for 4,400
        assert f"Suggested budget: --max-time {v['suggested_max_time']}: 4,400 steps of 16" in md[6]


def test_a_compress_leaves_the_teachers_artifact_and_quality_vectors_in_the_cache(
    compressed, minilm_dir, sts_subset, monkeypatch
):
    """What the next compress of this teacher skips: its export ladder and its side of every quality row. The
    fixture's run started from a first run's cache (conftest's minilm_user_run, whose test checks what that run
    left): it took the teacher's artifact from there, without a ladder, and added its STS-B vectors."""
    from sharebert.pipelines.quality import cached_quality_sentences, quality_sentences
    from sharebert.pipelines.run import Teacher
    from sharebert.pipelines.teacher_pass import teacher_cache

    monkeypatch.setenv("SHAREBERT_CACHE", str(compressed.parent / "cache"))
    monkeypatch.setenv("SHAREBERT_DATA", str(sts_subset))
    teacher = Teacher.read(minilm_dir)
    # the 600 held-out sentences, the 35 queries and 105 search sentences, and STS-B's two sides
    assert cached_quality_sentences(teacher) == quality_sentences() == 740 + 2 * STS_PAIRS
    assert (teacher_cache(teacher, "feature-extraction") / "artifact" / "manifest.json").is_file()
    said = (compressed.parent / "said.txt").read_text()
    assert "the teacher's int8 artifact from the cache" in said and "does not keep it" not in said


def test_the_run_reads_its_teachers_config_json_once(compressed):
    """The whole run (its artifact from the cache, the distillation, the student's export, the measures, the report)
    opens the teacher's config.json twice: read once (``run.Teacher``: its checks, transformers config, tokenizer and
    recipe, passed to the distillation) and hashed once for the fingerprint (the caches' keys, --resume's check)."""
    assert json.loads((compressed.parent / "config_opens.json").read_text()) == ["os.open", "open"]


def test_the_demos_search_answers_with_both_artifacts_and_counts_agreement(compressed, capsys):
    """`sharebert demo`'s step 3 on a compress result: answers shown for both artifacts, then the share that agree,
    the report's search row (the same queries, the student's int8 artifact; the teacher's int8 artifact here)."""
    from sharebert.commands.demo import SHOWN, search
    from sharebert.formats.paths import packaged_search

    share = search(compressed)
    out = capsys.readouterr().out
    corpus, queries, _ = packaged_search()
    assert out.count("query: ") == SHOWN and out.count("  student (") == out.count("  teacher (") == SHOWN
    assert f"for {round(share * len(queries))} of {len(queries)} queries" in out and 0.0 <= share <= 1.0
    report = json.loads((compressed / "report.json").read_text())
    assert abs(share - report["student"]["search_top1"]) <= 3 / len(queries)  # the teacher's int8 moves a few


def test_compress_keeps_checkpoints_by_time(compressed):
    """--save-minutes: checkpoints mid-run (its steps save every 200, past the run's 40), the two newest kept, each
    complete, so a compress killed at any time can --resume."""
    from sharebert.training.callbacks import checkpoints

    found = checkpoints(compressed / "work" / "student" / "checkpoints")
    assert 1 <= len(found) <= 2 and all(ok for _, _, ok in found), found
    assert 0 < found[0][0] < 40


def test_resume_with_a_larger_budget_trains_on_and_exports_the_new_student(
    compressed, minilm_dir, sts_subset, tmp_path, monkeypatch
):
    """--resume of a finished compress with more steps: the student trains on from its last checkpoint and the
    artifact (and so the report) is made again from the new student, not kept from the run it continues."""
    import shutil

    from transformers import AutoTokenizer

    from sharebert.formats.recipe import read_recipe
    from sharebert_runtime import Runtime

    monkeypatch.setenv("SHAREBERT_CACHE", str(compressed.parent / "cache"))  # the resumed run's, as on a user's machine
    monkeypatch.setenv("SHAREBERT_DATA", str(sts_subset))  # and its data (its training text too)
    out = tmp_path / "run"
    shutil.copytree(compressed, out)
    exported = (out / "artifact" / "manifest.json").stat().st_mtime_ns
    assert (
        main(
            [
                "compress",
                str(minilm_dir),
                "--out",
                str(out),
                "--max-steps",
                "48",
                "--max-train-samples",
                SAMPLES,
                "--batch-size",
                "16",
                "--lr",
                "1e-3",
                "--max-params",
                "2.5M",
                "--resume",
                "--max-time",
                UNBOUNDED,
            ]
        )
        == 0
    )
    r = json.loads((out / "report.json").read_text())
    assert r["training"]["steps"] == 48
    assert not (out / "work").exists()  # a finished run without --keep-work removes it
    student, manifest = out / "student", out / "artifact" / "manifest.json"
    assert manifest.stat().st_mtime_ns > max(exported, (student / "model.safetensors").stat().st_mtime_ns)
    recipe = read_recipe(student)
    ours = encode(
        load_encoder(student),
        AutoTokenizer.from_pretrained(student),
        SENTENCES,
        "mean",
        recipe_head(student, recipe),
        normalize=True,
    )
    assert _cos(np.stack(Runtime(out / "artifact").embed(SENTENCES)), ours).min() >= 0.98


def test_a_stopped_run_run_again_is_told_to_resume(compressed, minilm_dir, tmp_path, capsys):
    """The same command again after Ctrl-C or a kill (a checkpoint, no report yet) names --resume first, with the
    checkpoint it would continue; a finished run's folder names --overwrite alone. Nothing changes either way."""
    import shutil

    from sharebert.training.callbacks import latest_checkpoint

    out = tmp_path / "run"
    shutil.copytree(compressed, out)
    (out / "report.json").unlink()  # what a stop leaves: the run's marker and checkpoints, no report
    step = int(latest_checkpoint(out / "work" / "student" / "checkpoints").name.removeprefix("checkpoint-"))
    capsys.readouterr()
    argv = ["compress", str(minilm_dir), "--out", str(out), "--max-steps", "40", "--max-params", "2.5M"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"stopped before its end (a checkpoint at step {step}, work/student/checkpoints/checkpoint-{step})" in err
    assert "pass --resume to continue it, or --overwrite to start again" in err
    assert main(["compress", str(minilm_dir), "--out", str(compressed), "--max-params", "2.5M"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already holds a compress result; pass --overwrite to replace it" in err and "--resume" not in err
    shutil.rmtree(out / "work")  # stopped before its first checkpoint: nothing to resume, so --overwrite alone
    assert main(argv) == 2 and "--resume" not in capsys.readouterr().err


def test_resume_with_limits_that_pick_another_student_is_refused_before_any_work(
    compressed, minilm_dir, tmp_path, capsys
):
    """The limits of a resumed run pick another shape than the student in --out: one line naming what differs,
    before anything loads or is written (not a late load_state_dict error)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(compressed, out)

    def files():  # the run lock (.lock) aside: every run takes it
        return {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file() and f.name != ".lock"}

    before = files()
    capsys.readouterr()
    assert (
        main(["compress", str(minilm_dir), "--out", str(out), "--max-steps", "48", "--max-params", "5M", "--resume"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds a student of another shape than these options pick" in err, err
    assert "embedding_size 64 -> 128" in err and "--overwrite" in err
    assert files() == before


def test_resume_with_another_teacher_is_refused_naming_it(compressed, minilm_dir, tmp_path, capsys):
    """`compress OTHER --out R --resume` is refused (resuming would export the other teacher beside the first one's
    scores): one line naming the teacher's file that differs, nothing changed."""
    import shutil

    out, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(compressed, out)
    shutil.copytree(minilm_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "note": "another teacher"}))
    before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file() and f.name != ".lock"}
    capsys.readouterr()
    assert (
        main(
            [
                "compress",
                str(other),
                "--out",
                str(out),
                "--max-steps",
                "48",
                "--max-train-samples",
                SAMPLES,
                "--batch-size",
                "16",
                "--max-params",
                "2.5M",
                "--resume",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "teacher (its weights, config or tokenizer files): config.json" in err, err
    assert {f: f.read_bytes() for f in out.rglob("*") if f.is_file() and f.name != ".lock"} == before


def test_student_is_a_sentence_transformers_folder_and_its_artifact_gives_its_embeddings(compressed):
    from sentence_transformers import SentenceTransformer

    from sharebert.formats.recipe import read_recipe
    from sharebert_runtime import Runtime

    student = compressed / "student"
    recipe = read_recipe(student)
    assert recipe.pooling == "mean" and recipe.normalize and len(recipe.dense) == 1  # narrower: its projection kept
    assert recipe.dense[0].out_features == 384
    model, head = load_encoder(student), recipe_head(student, recipe)
    from transformers import AutoTokenizer

    ours = encode(model, AutoTokenizer.from_pretrained(student), SENTENCES, "mean", head, normalize=True)
    st = SentenceTransformer(str(student), device="cpu").encode(SENTENCES)
    assert np.abs(st - ours).max() <= 1e-5
    art = np.stack(Runtime(compressed / "artifact").embed(SENTENCES))  # int8: the projection is in the graph
    assert art.shape == (len(SENTENCES), 384)
    assert _cos(art, ours).min() >= 0.98


def test_a_student_folder_distilled_further_keeps_its_own_head(compressed, minilm_dir, tmp_path):
    """A student folder given as `--student` starts with the output projection it was trained with, not a head
    fitted afresh by ridge regression, so its step-0 score is its own."""
    from transformers import AutoTokenizer

    from sharebert.formats.recipe import read_dense_weights, read_recipe
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert.training.distill_sentences import sts_spearman

    student = compressed / "student"
    recipe = read_recipe(student)
    own = sts_spearman(
        load_encoder(student), AutoTokenizer.from_pretrained(student), "mean", recipe_head(student, recipe), limit=40
    )
    args = EmbeddingArgs(
        max_steps=1,
        batch_size=4,
        lr=1e-9,
        warmup_steps=0,
        max_train_samples=16,
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    m = distill_embedding(minilm_dir, str(student), tmp_path / "on", args=args, progress=False, eval_limit=40)
    assert m["head"] == "the student's own"
    assert abs(m["start_sts_spearman"] - own) <= 1e-6, (m["start_sts_spearman"], own)  # NaN fails
    w0, _ = read_dense_weights(student, recipe.dense[0])
    w1, _ = read_dense_weights(tmp_path / "on", read_recipe(tmp_path / "on").dense[0])
    assert np.abs(w1 - w0).max() <= 1e-6


def test_fp32_artifact_equals_the_pytorch_student(compressed, tmp_path):
    from transformers import AutoTokenizer

    from sharebert.export import export_model
    from sharebert.formats.recipe import read_recipe
    from sharebert_runtime import Runtime

    student = compressed / "student"
    export_model(student, tmp_path / "fp32", task="feature-extraction", check_limit=16, runs=2, progress=False)
    recipe = read_recipe(student)
    ours = encode(
        load_encoder(student),
        AutoTokenizer.from_pretrained(student),
        SENTENCES,
        "mean",
        recipe_head(student, recipe),
        normalize=True,
    )
    art = np.stack(Runtime(tmp_path / "fp32").embed(SENTENCES))
    assert np.abs(art - ours).max() <= 1e-4


@pytest.fixture(scope="session")
def prepared(minilm_dir, tmp_path_factory):
    """A slice of WikiText-2 (valid, first 120 lines) prepared twice: ``minilm`` with the teacher's tokenizer,
    ``chars`` with a character-level tokenizer of the same text (another vocabulary)."""
    from sharebert.formats.paths import data_path
    from sharebert.training.corpus import char_tokenizer
    from sharebert.training.shards import prepare

    root = tmp_path_factory.mktemp("prepared")
    text = root / "wiki.txt"
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8") as f:
        text.write_text("".join(line for _, line in zip(range(120), f)), encoding="utf-8")
    char_tokenizer(text.read_text(encoding="utf-8")).save_pretrained(root / "char_tok")
    for name, tok in (("minilm", str(minilm_dir)), ("chars", str(root / "char_tok"))):
        prepare([text], root / name, tok, progress=False)
    return root


def test_embedding_distillation_on_prepared_data(minilm_dir, prepared, tmp_path):
    """``--data``: each packed block of the teacher's tokens is one training sentence, the teacher runs per batch
    (no teacher_targets file), the student is saved as a sentence-transformers folder."""
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    args = EmbeddingArgs(
        max_steps=3,
        batch_size=4,
        seq_len=32,
        lr=1e-3,
        warmup_steps=0,
        max_train_samples=24,
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    out = tmp_path / "student"
    m = distill_embedding(
        minilm_dir,
        "sharebert-tiny",
        out,
        args=args,
        overrides={"embedding_size": 32},
        progress=False,
        data=prepared / "minilm",
        eval_limit=16,
    )
    assert m["steps"] == 3 and m["train_sentences"] == 24 and m["seq_len"] == 32
    assert np.isfinite([m["train_loss"], m["last_terms"]["sentence"], m["student_sts_spearman"]]).all()
    assert 0 < m["last_terms"]["sentence"] <= 2  # cosine loss of unit-free vectors lies in [0, 2]
    assert not list(out.glob("teacher_targets*"))  # nothing precomputed for the corpus
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(out), device="cpu")
    v = st.encode(SENTENCES[:2])
    assert v.shape == (2, 384) and np.isfinite(v).all()


def test_embedding_distillation_samples_depth_with_token_level_terms(minilm_dir, tmp_path, monkeypatch):
    """`--depth-sampling` reaches the embedding student: the saved config samples
    depths 2..4 in training, and the hidden-state term pairs only the iterations that ran at each step.
    The teacher runs on each batch for that term, so its vectors are computed only for the sentences the
    output projection is fitted on (a pass over every training sentence would go unused)."""
    import sharebert.training.distill_embedding as de
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    monkeypatch.setattr(de, "HEAD_FIT", 4)

    args = EmbeddingArgs(
        max_steps=4,
        batch_size=4,
        lr=1e-3,
        warmup_steps=0,
        max_train_samples=16,
        depth_sampling=2,
        weights=DistillWeights(hidden=1.0, attention=0, embedding=0),
    )
    out = tmp_path / "student"
    m = distill_embedding(
        minilm_dir, "sharebert-tiny", out, args=args, overrides={"embedding_size": 32}, progress=False, eval_limit=16
    )
    assert m["steps"] == 4 and np.isfinite([m["last_terms"]["hidden"], m["last_terms"]["sentence"]]).all()
    assert json.loads((out / "config.json").read_text())["train_min_depth"] == 2
    (targets,) = out.glob("teacher_targets*.npy")
    assert m["train_sentences"] == 16 and np.load(targets).shape[0] == 4


@pytest.fixture(scope="module")
def bad_inputs(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    raw = json.loads((minilm_dir / "config.json").read_text())
    decoder = root / "decoder"
    decoder.mkdir()
    (decoder / "config.json").write_text(json.dumps({**raw, "is_decoder": True, "architectures": ["BertLMHeadModel"]}))
    classifier = root / "classifier"
    classifier.mkdir()
    (classifier / "config.json").write_text(json.dumps({**raw, "architectures": ["BertForSequenceClassification"]}))
    finetuned = root / "finetuned_sst2"  # a classifier whose metrics.json (as `finetune` writes it) records its task
    finetuned.mkdir()
    (finetuned / "config.json").write_text((classifier / "config.json").read_text())
    (finetuned / "metrics.json").write_text(json.dumps({"task": "sst2", "accuracy": 0.9}))
    (root / "headless.tsv").write_text("id\ttext\n1\tsome words here\n")  # no GLUE layout
    unreadable = root / "metrics_corrupt"  # a metrics.json that is not JSON: said so, not missing
    unreadable.mkdir()
    (unreadable / "config.json").write_text((classifier / "config.json").read_text())
    (unreadable / "metrics.json").write_text('{"task": "sst2", "acc')
    listed = root / "labels_as_list"  # id2label a JSON list, not a mapping: one line, no internal error
    listed.mkdir()
    (listed / "config.json").write_text(
        json.dumps({**raw, "architectures": ["BertForSequenceClassification"], "id2label": ["negative", "positive"]})
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (listed / name).write_bytes((minilm_dir / name).read_bytes())
    (root / "o22" / "general").mkdir(parents=True)  # a user's folder with a subfolder named like a compress phase
    (root / "o22" / "general" / "mywork.txt").write_text("precious")
    (root / "o23").mkdir()  # a compress result whose student folder was deleted: its report alone
    (root / "o23" / "report.json").write_text("{}")
    (root / "o20").mkdir()  # a user's folder holding a --train file
    (root / "o20" / "corpus.txt").write_text("A man is playing a guitar.\n")
    from sharebert.formats.build import build_model

    build_model(
        "sharebert-tiny",
        root / "other_tok",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "embedding_size": 16,
            "intermediate_size": 128,
            "num_attention_heads": 2,
        },
    )
    return root


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compress", "{root}/decoder", "--out", "{root}/o1"], "causal (decoder) model"),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{root}/decoder",
                "--student",
                "sharebert-tiny",
                "--out",
                "{root}/o2",
            ],
            "needs a bidirectional encoder teacher",
        ),
        (
            ["compress", "{root}/classifier", "--out", "{root}/o3"],
            "is a classifier whose GLUE task is unknown (no "
            "metrics.json from `sharebert finetune`; its labels [] name no task); name it with --task, "
            "e.g. --task sst2",
        ),
        (
            ["compress", "{root}/metrics_corrupt", "--out", "{root}/o18"],
            "GLUE task is unknown (its metrics.json cannot be read: ",
        ),
        (
            ["compress", "{root}/finetuned_sst2", "--task", "cola", "--out", "{root}/o11"],
            "--task cola, but {root}/finetuned_sst2 was fine-tuned on sst2 (its metrics.json)",
        ),
        (["compress", "{root}/classifier", "--task", "stsb", "--out", "{root}/o12"], "has 2 labels, task stsb has 1"),
        (["compress", "{root}/classifier", "--task", "mnli", "--out", "{root}/o13"], "has 2 labels, task mnli has 3"),
        (["compress", "{minilm}", "--task", "sst2", "--out", "{root}/o14"], "--task is for a classifier teacher"),
        (["compress", "{minilm}", "--task-lr", "0.1", "--out", "{root}/o16"], "--task-lr is for a classifier teacher"),
        (["compress", "{minilm}", "--augment", "2", "--out", "{root}/o16b"], "--augment is for a classifier teacher"),
        (
            ["compress", "{root}/labels_as_list", "--out", "{root}/o17"],
            "id2label must map label ids to names, got list",
        ),
        (
            [
                "compress",
                "{root}/finetuned_sst2",
                "--out",
                "{root}/o15",
                "--max-params",
                "10k",
            ],  # 100k: a vocabulary cut fits
            "no ShareBERT student fits under max-params 10k",
        ),
        (
            ["compress", "{minilm}", "--out", "{root}/o4", "--max-params", "100k"],
            "no ShareBERT student fits under max-params 100k",
        ),
        # 300kB now fits: a student with the teacher's vocabulary cut to the text's tokens (training/vocab.py)
        (["compress", "{minilm}", "--out", "{root}/o5", "--max-bytes", "50kB"], "no ShareBERT student fits"),
        (
            ["compress", "{minilm}", "--out", "{root}/o6", "--max-time", "-5"],
            "argument --max-time: must be a number > 0, got -5",
        ),
        (["compress", "{minilm}", "--out", "{root}/o7", "--max-params", "lots"], "cannot read size 'lots'"),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "{root}/other_tok",
                "--out",
                "{root}/o8",
            ],
            "do not share a tokenizer",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "{root}/other_tok",
                "--out",
                "{root}/other_tok",
                "--overwrite",
            ],
            "is, or holds, the input {root}/other_tok",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "{root}/other_tok",
                "--out",
                "{root}/other_tok/inner",
            ],
            "lies inside the input {root}/other_tok",
        ),
        (
            [
                "distill",
                "--objective",
                "mlm",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--hidden-weight",
                "1",
                "--train",
                "{root}/o20/corpus.txt",
                "--out",
                "{root}/o20",
                "--overwrite",
            ],
            "is, or holds, the input {root}/o20/corpus.txt",
        ),
        (
            [
                "distill",
                "--objective",
                "mlm",
                "--teacher",
                "{minilm}",
                "--student",
                "{root}/other_tok",
                "--hidden-weight",
                "1",
                "--train",
                "{root}/o20/corpus.txt",
                "--out",
                "{root}/other_tok/x",
            ],
            "lies inside the input {root}/other_tok",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--max-eval-samples",
                "1",
                "--out",
                "{root}/o21",
            ],
            "needs at least 2 STS-B dev pairs",
        ),
        (
            ["compress", "{root}/finetuned_sst2", "--out", "{root}/o22", "--resume"],
            "o22 is a non-empty folder that is not a compress result",
        ),  # its subfolder's name makes it no result of ours
        (
            ["compress", "{minilm}", "--out", "{root}/o23", "--resume"],
            "o23 is a non-empty folder that is not a compress result",
        ),  # no marker: not ours to resume
        (
            ["compress", "{minilm}", "--out", "{root}/o24", "--resume"],
            "--resume: {root}/o24 holds no complete checkpoint to continue from; run without --resume to start",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--set",
                "vocab_size=100",
                "--out",
                "{root}/o9",
            ],
            "takes the teacher's vocabulary",
        ),
        (
            [
                "distill",
                "--objective",
                "glue",
                "--task",
                "sst2",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--set",
                "hidden_size=64",
                "--out",
                "{root}/o10",
            ],
            "are for --objective embedding",
        ),
        (
            [
                "distill",
                "--objective",
                "mlm",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--max-time",
                "60",
                "--out",
                "{root}/o10b",
            ],
            "--max-time is for --objective embedding and glue",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--data",
                "{prepared}/chars",
                "--out",
                "{root}/o11",
            ],
            "was prepared with another tokenizer than the teacher's",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--data",
                "{prepared}/minilm",
                "--train",
                "{prepared}/wiki.txt",
                "--out",
                "{root}/o12",
            ],
            "are alternatives",
        ),
        (
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                "{minilm}",
                "--student",
                "sharebert-tiny",
                "--data",
                "{prepared}",
                "--out",
                "{root}/o13",
            ],
            "is not a prepared data folder",
        ),
        (
            ["compress", "{minilm}", "--data", "{prepared}/chars", "--out", "{root}/o14"],
            "another tokenizer than the teacher's",
        ),
        (["compress", "{minilm}", "--data", "{root}/missing", "--out", "{root}/o15"], "not found"),
        (
            ["compress", "{minilm}", "--data", "{prepared}/wiki.txt", "--out", "{root}/o16"],
            "is a file, not a prepared data folder",
        ),
        (
            [
                "compress",
                "{minilm}",
                "--train",
                "{root}/headless.tsv",
                "--out",
                "{root}/o17",
            ],  # not column 0 read silently
            "headless.tsv: a .tsv needs a GLUE header naming its text column",
        ),
    ],
)
def test_bad_inputs_get_one_line_errors(bad_inputs, minilm_dir, prepared, argv, message, capsys):
    argv = [a.format(root=bad_inputs, minilm=minilm_dir, prepared=prepared) for a in argv]
    message = message.format(root=bad_inputs)
    out = Path(argv[argv.index("--out") + 1])
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) if out.exists() else None
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err
    after = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) if out.exists() else None
    assert after == before  # nothing half-written, nothing of an existing folder (an input as --out) touched


def test_train_text_over_the_in_memory_limit_is_refused_before_the_teacher_runs(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """--train sentences are held in memory with the teacher's vectors (~2 GB a million): more than IN_MEMORY
    without --max-train-samples is refused in one line naming both ways out (unbounded, a 1 GB text would be
    read whole, then the teacher's pass and its vectors would outgrow the machine); nothing is written.
    --max-train-samples above the limit is the user's call and trains."""
    import sharebert.training.distill_embedding as de

    monkeypatch.setattr(de, "IN_MEMORY", 6)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(SENTENCES) + "\n")  # 8 sentences
    argv = [
        "distill",
        "--objective",
        "embedding",
        "--teacher",
        str(minilm_dir),
        "--student",
        "sharebert-tiny",
        "--set",
        "embedding_size=32",
        "--train",
        str(text),
        "--max-steps",
        "1",
        "--batch-size",
        "4",
        "--max-eval-samples",
        "8",
    ]
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "--train holds over 6 sentences" in err and "--max-train-samples" in err and "--data" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()
    assert main([*argv, "--out", str(tmp_path / "ok"), "--max-train-samples", "8"]) == 0
    assert json.loads((tmp_path / "ok" / "metrics.json").read_text())["train_sentences"] == 8


def test_mlm_distillation_accepts_a_teacher_without_an_mlm_head(minilm_dir, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(SENTENCES * 8) + "\n")
    rc = main(
        [
            "distill",
            "--objective",
            "mlm",
            "--teacher",
            str(minilm_dir),
            "--student",
            "sharebert-tiny",
            "--train",
            str(text),
            "--out",
            str(tmp_path / "out"),
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--seq-len",
            "32",
        ]
    )
    assert rc == 0
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["steps"] == 2 and m["soft_targets"] is False
    assert "kl" not in m["last_terms"] and np.isfinite([m["last_terms"][k] for k in ("hidden", "attention")]).all()


@pytest.mark.parametrize(
    "command",
    [
        ["distill", "--objective", "embedding", "--student", "sharebert-tiny", "--max-steps", "1"],
        ["distill", "--objective", "glue", "--task", "sst2", "--student", "sharebert-tiny", "--max-steps", "1"],
        ["compress", "--max-steps", "1"],
    ],
)
def test_one_run_at_a_time_per_out_and_a_refused_run_leaves_nothing(command, minilm_dir, tmp_path, capsys):
    """distill and compress hold the --out lock (outdir.run_lock) as prepare, pretrain and
    finetune do: a second run into a folder being written is refused in one line naming the first; a run refused
    before writing anything leaves no lock file in a user's folder and no --out it created."""
    from sharebert_runtime.outdir import OutLock

    name = command[0]
    teacher = ["--teacher", str(minilm_dir)] if name == "distill" else [str(minilm_dir)]
    argv = lambda out, t=teacher: [name, *t, "--out", str(out), *command[1:]]  # noqa: E731
    busy = tmp_path / "busy"
    busy.mkdir()
    with OutLock(busy, name):
        assert main(argv(busy)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"another `sharebert {name}` (pid " in err, err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    assert main(argv(mine)) == 2
    assert "non-empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.txt"]
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "a.txt").write_text("x")
    bad = ["--teacher", str(not_a_model)] if name == "distill" else [str(not_a_model)]
    fresh = tmp_path / "new" / "out"
    assert main(argv(fresh, bad)) == 2
    capsys.readouterr()
    assert not (tmp_path / "new").exists()
    inside = minilm_dir / "sharebert-out"  # inside the teacher: refused, and nothing left there
    assert main(argv(inside)) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert not inside.exists()


def test_teacher_vectors_cache_follows_the_teacher_and_survives_damage(minilm_dir, tmp_path):
    """The cached sentence vectors are keyed by the teacher's files, not its path: a teacher changed in place
    gets new vectors, never the old teacher's. A damaged cache file (truncated, not an array, another width) is
    recomputed and replaced, with no numpy message or internal error."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from sharebert.training.distill_embedding import _teacher_targets
    from sharebert.training.fingerprint import teacher_fingerprint
    from sharebert.training.teacher_vectors import TeacherPass

    teacher_dir = tmp_path / "teacher"
    shutil.copytree(minilm_dir, teacher_dir)
    tok, out = AutoTokenizer.from_pretrained(teacher_dir), tmp_path / "out"

    def vectors():
        teacher = TeacherPass(load_encoder(teacher_dir), None, tok, "mean", 32)
        return _teacher_targets(teacher, teacher_fingerprint(teacher_dir), SENTENCES[:4], 384, out, progress=False)

    first = vectors()
    (cached,) = out.glob("teacher_targets-*.npy")
    for damage in (cached.read_bytes()[:200], b"not an array", (4, 10), np.int64, "U1"):
        if not isinstance(damage, bytes):  # another width; integers or strings of the right shape
            np.save(
                cached, np.ones(damage, dtype=np.float32) if isinstance(damage, tuple) else np.ones((4, 384), damage)
            )
        else:
            cached.write_bytes(damage)
        again = vectors()
        assert again.shape == (4, 384) and np.allclose(again, first, atol=1e-5)
        assert np.load(cached).shape == (4, 384)  # replaced
    weights = load_file(str(teacher_dir / "model.safetensors"))
    weights = {k: (v * 1.5 if k.endswith("word_embeddings.weight") else v) for k, v in weights.items()}
    save_file(weights, str(teacher_dir / "model.safetensors"), metadata={"format": "pt"})
    changed = vectors()
    assert len(list(out.glob("teacher_targets-*.npy"))) == 2
    assert not np.allclose(changed, first, atol=1e-3)


def test_a_student_as_wide_as_its_teacher_keeps_its_own_head(minilm_dir, tmp_path):
    """A student folder whose width equals the teacher's output width, with its own Dense projection (a student of
    another teacher), keeps that projection, though no head is made where the widths match."""
    from dataclasses import replace

    from sharebert.formats.recipe import DenseLayer, read_dense_weights, read_recipe, write_recipe
    from sharebert.training.arguments import DistillWeights, EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    args = EmbeddingArgs(
        max_steps=1,
        batch_size=4,
        lr=1e-9,
        warmup_steps=0,
        max_train_samples=8,
        weights=DistillWeights(hidden=0, attention=0, embedding=0),
    )
    wide = tmp_path / "wide"
    kw = dict(progress=False, eval_limit=8)
    distill_embedding(
        minilm_dir,
        "sharebert-tiny",
        wide,
        args=args,
        **kw,
        overrides={"embedding_size": 32, "hidden_size": 384, "num_attention_heads": 6},
    )
    assert read_recipe(wide).dense == ()  # as wide as MiniLM's 384: no projection of its own yet
    rng = np.random.default_rng(0)
    w0, b0 = (rng.normal(size=(384, 384)) * 0.05).astype(np.float32), rng.normal(size=384).astype(np.float32)
    dense = DenseLayer("", 384, 384, True, "torch.nn.modules.linear.Identity")
    write_recipe(wide, replace(read_recipe(wide), dense=(dense,)), [(w0, b0)])
    m = distill_embedding(minilm_dir, str(wide), tmp_path / "on", args=args, **kw)
    assert m["head"] == "the student's own"
    w1, b1 = read_dense_weights(tmp_path / "on", read_recipe(tmp_path / "on").dense[0])
    assert np.abs(w1 - w0).max() <= 1e-6 and np.abs(b1 - b0).max() <= 1e-6


def test_overwrite_then_resume_continues_the_new_run(minilm_dir, tmp_path):
    """`--overwrite` starts without the replaced run's checkpoints, so a later `--resume` continues the new run
    (never the replaced run's newest checkpoint); a `--resume` on other sentences is refused. A folder killed after
    the teacher's pass and before its first checkpoint is recognised as a distillation's (so --overwrite and
    --resume take it)."""
    from sharebert.training.arguments import EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    out = tmp_path / "run"
    args = _tiny_args(max_steps=4)
    distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, **TINY_RUN)
    assert (out / "checkpoints" / "checkpoint-4").is_dir()
    short = EmbeddingArgs(**{**args.__dict__, "max_steps": 2})
    distill_embedding(minilm_dir, "sharebert-tiny", out, args=short, overwrite=True, **TINY_RUN)
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2"
    ]
    m = distill_embedding(
        minilm_dir,
        "sharebert-tiny",
        out,
        args=EmbeddingArgs(**{**args.__dict__, "max_steps": 3}),
        resume=True,
        **TINY_RUN,
    )
    assert m["steps"] == 3
    before = {f: (out / f).read_bytes() for f in ("metrics.json", "checkpoints/checkpoint-3/sharebert_complete.json")}
    m = distill_embedding(
        minilm_dir,
        "sharebert-tiny",
        out,
        args=EmbeddingArgs(**{**args.__dict__, "max_steps": 3}),
        resume=True,
        **TINY_RUN,
    )  # a finished run resumed mid-epoch takes no step
    assert m["steps"] == 3 and not (out / "checkpoints" / "checkpoint-4").exists()
    assert m["last_terms"]  # kept, not rewritten as {}; its checkpoint not saved again
    assert {f: (out / f).read_bytes() for f in before} == before
    other = EmbeddingArgs(**{**args.__dict__, "max_steps": 5, "max_train_samples": 12})  # refused, not trained on
    with pytest.raises(ValueError, match="trained on 16 other sentences; resume on the same"):
        distill_embedding(minilm_dir, "sharebert-tiny", out, args=other, resume=True, **TINY_RUN)
    with pytest.raises(
        ValueError,
        match="distilled the student sharebert-tiny --set embedding_size=32; resume with "
        "the same --student and --set \\(now sharebert-tiny --set embedding_size=48\\)",
    ):  # not loaded,
        distill_embedding(
            minilm_dir,
            "sharebert-tiny",
            out,
            args=args,
            resume=True,  # nor failed on shapes
            **{**TINY_RUN, "overrides": {"embedding_size": 48}},
        )

    from sharebert_runtime.outdir import mark_out, read_mark

    killed = tmp_path / "killed"
    mark = read_mark(out)
    mark_out(killed, mark["command"], mark["fingerprint"])  # the marker a run writes in its folder before the pass
    for f in out.glob("teacher_targets-*.npy"):
        (killed / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="no complete checkpoint to continue from; start it again with --overwrite"):
        distill_embedding(minilm_dir, "sharebert-tiny", killed, args=short, resume=True, **TINY_RUN)
    m = distill_embedding(minilm_dir, "sharebert-tiny", killed, args=short, overwrite=True, **TINY_RUN)
    assert m["steps"] == 2


def test_a_checkpoint_whose_projections_do_not_fit_is_one_line(minilm_dir, tmp_path):
    """A checkpoint whose projections file lacks this run's keys (a layout without the
    student's own Dense head) is refused in one line naming the file."""
    from safetensors.torch import load_file, save_file

    from sharebert.training.arguments import EmbeddingArgs
    from sharebert.training.callbacks import mark_complete
    from sharebert.training.distill_embedding import distill_embedding
    from sharebert.training.distill_run import PROJECTIONS_FILE

    out = tmp_path / "run"
    args = _tiny_args(max_steps=2)
    distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, **TINY_RUN)
    ckpt = out / "checkpoints" / "checkpoint-2"
    saved = load_file(str(ckpt / PROJECTIONS_FILE))
    save_file({k: v for k, v in saved.items() if not k.startswith("head.")}, str(ckpt / PROJECTIONS_FILE))
    mark_complete(ckpt, 2)
    with pytest.raises(ValueError, match=f"{PROJECTIONS_FILE} does not fit this run's projections .*Missing key"):
        distill_embedding(
            minilm_dir,
            "sharebert-tiny",
            out,
            args=EmbeddingArgs(**{**args.__dict__, "max_steps": 3}),
            resume=True,
            **TINY_RUN,
        )


def test_a_finished_run_whose_results_were_lost_writes_its_figures_again(minilm_dir, tmp_path):
    """A run stopped while writing its results (here: metrics.json gone) and resumed takes no step and writes its
    figures from the run's logged losses (transformers divides a resumed call's losses, none, by the
    run's steps: its own train_loss would read 0.0)."""
    from sharebert.training.distill_embedding import distill_embedding

    out = tmp_path / "run"
    args = _tiny_args(max_steps=3, eval_steps=1)
    first = distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, **TINY_RUN)
    (out / "metrics.json").unlink()
    again = distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, resume=True, **TINY_RUN)
    assert again["steps"] == 3 and not (out / "checkpoints" / "checkpoint-4").exists()
    assert abs(again["train_loss"] - first["train_loss"]) <= 1e-3, (again["train_loss"], first["train_loss"])
    assert again["last_terms"].keys() == first["last_terms"].keys() == {"sentence"}
    assert abs(again["last_terms"]["sentence"] - first["last_terms"]["sentence"]) <= 1e-5


def test_finished_max_time_run_resumed_is_kept(minilm_dir, tmp_path, capsys, stepped_clock):
    """A run its --max-time stopped, resumed with the same limit, takes no step and keeps its results (metrics
    untouched); a larger --max-time trains on from where it stopped."""
    from sharebert.training.arguments import EmbeddingArgs
    from sharebert.training.distill_embedding import distill_embedding

    out = tmp_path / "run"
    args = _tiny_args(max_time=4, epochs=1000)
    first = distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, **TINY_RUN)
    assert first["stopped_by_time"] and first["steps"] > 0
    saved = (out / "metrics.json").read_bytes()
    again = distill_embedding(minilm_dir, "sharebert-tiny", out, args=args, resume=True, **TINY_RUN)
    assert again["steps"] == first["steps"] and (out / "metrics.json").read_bytes() == saved
    assert "had finished (at step" in capsys.readouterr().out
    longer = distill_embedding(
        minilm_dir,
        "sharebert-tiny",
        out,
        args=EmbeddingArgs(**{**args.__dict__, "max_time": 8}),
        resume=True,
        **TINY_RUN,
    )
    assert longer["steps"] > first["steps"] and longer["train_seconds"] > first["train_seconds"]


def test_distill_embedding_cli_scores_max_eval_samples_pairs(minilm_dir, tmp_path):
    """`distill --objective embedding --max-eval-samples N` scores the first N STS-B dev pairs."""
    out = tmp_path / "s"
    assert (
        main(
            [
                "distill",
                "--objective",
                "embedding",
                "--teacher",
                str(minilm_dir),
                "--student",
                "sharebert-tiny",
                "--set",
                "embedding_size=32",
                "--out",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--max-train-samples",
                "8",
                "--max-eval-samples",
                "20",
            ]
        )
        == 0
    )
    assert json.loads((out / "metrics.json").read_text())["sts_dev_pairs"] == 20
    from sharebert.training.distill_sentences import sts_dev

    assert len(sts_dev(10**6).labels) == len(sts_dev().labels) == 1500  # the count scored, not the limit asked


def test_start_checkpoints_removes_only_its_own_folders(tmp_path):
    """A run that does not resume clears the checkpoints a replaced run left, and nothing else: a user's files,
    folders and links there stay, a link's target is never entered, a linked checkpoints folder is left alone."""
    from sharebert.training.callbacks import start_checkpoints

    ckpts, elsewhere = tmp_path / "out" / "checkpoints", tmp_path / "elsewhere"
    for name in (
        "checkpoint-3",
        "incomplete-checkpoint-4",
        "corrupt-checkpoint-5",
        "corrupt-checkpoint-5.2",
        "notes",
        "checkpoint-x",
    ):
        (ckpts / name).mkdir(parents=True)
    (ckpts / "mywork.txt").write_text("precious")
    (elsewhere / "checkpoint-9").mkdir(parents=True)
    (ckpts / "checkpoint-8").symlink_to(elsewhere / "checkpoint-9")
    start_checkpoints(ckpts, start_from=str(ckpts / "checkpoint-3"))  # a resume keeps them all
    assert len(list(ckpts.iterdir())) == 8
    start_checkpoints(ckpts, start_from=None)
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-8", "checkpoint-x", "mywork.txt", "notes"]
    assert (elsewhere / "checkpoint-9").is_dir()
    linked = tmp_path / "linked" / "checkpoints"
    linked.parent.mkdir()
    linked.symlink_to(elsewhere)
    start_checkpoints(linked, start_from=None)
    assert (elsewhere / "checkpoint-9").is_dir()


def test_teacher_fingerprint_covers_shards_and_named_modules(tmp_path):
    """Sharded weights (and their index) and a Dense module that modules.json names at any depth are part of the
    caches' key (were not: a changed sharded or nested-module teacher reused stale vectors); an unrelated deep
    file is not read. An embedding checkpoint is not resumed as a task distillation's."""
    from sharebert.training.distill_run import check_same_data
    from sharebert.training.fingerprint import teacher_fingerprint

    t = tmp_path / "t"
    (t / "modules" / "2_Dense").mkdir(parents=True)
    (t / "data" / "big").mkdir(parents=True)
    files = {
        "config.json": "{}",
        "model-00001-of-00002.safetensors": "a",
        "model-00002-of-00002.safetensors": "b",
        "model.safetensors.index.json": "{}",
        "modules/2_Dense/model.safetensors": "d",
        "modules.json": json.dumps([{"path": ""}, {"path": "modules/2_Dense"}]),
        "data/big/train.bin": "x",
    }
    for name, text in files.items():
        (t / name).write_text(text)
    first = teacher_fingerprint(t)
    assert not any(p.startswith("data/") for p in first)
    for name in (
        "model-00002-of-00002.safetensors",
        "modules/2_Dense/model.safetensors",
        "model.safetensors.index.json",
    ):
        (t / name).write_text("changed")
        assert teacher_fingerprint(t) != first, name
        (t / name).write_text(files[name])
    assert teacher_fingerprint(t) == first
    (t / "data" / "big" / "train.bin").write_text("other")
    assert teacher_fingerprint(t) == first

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "distill_data.json").write_text(json.dumps({"sentences": 16, "sentences_sha256": "ab"}))
    with pytest.raises(ValueError, match="is an embedding distillation's checkpoint"):
        check_same_data(ckpt, {"augment": 0, "seed": 0})
