"""A careless or hostile user at the workstation commands: one line naming the problem, exit 2, nothing lost.

Each row: the command (with placeholders for the fixture's paths), what the one-line message must say,
and which of the user's paths must be byte-identical afterwards. Export, predict, serve and pretrain
have their own tables beside their tests.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from sharebert.formats.build import build_model
from sharebert_runtime.main import main

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, embedding_size=16)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A model folder, damaged copies of it, a user's file and a user's unrelated folder."""
    root = tmp_path_factory.mktemp("world")
    model = root / "model"
    build_model("sharebert-tiny", model, TINY, seed=0)
    damaged = {
        "bad_config": ("config.json", b'{"model_type": "sharebert", "hidden_size": 6'),
        "alien_config": ("config.json", json.dumps({"model_type": "gpt2"}).encode()),
        "bad_weights": ("model.safetensors", None),  # truncated below
        "bad_tokenizer": ("tokenizer.json", b"\x00\x01 not a tokenizer"),
        "bad_tokenizer_config": ("tokenizer_config.json", b'{"mask_token": "[MA'),
    }
    for name, (file, data) in damaged.items():
        shutil.copytree(model, root / name)
        path = root / name / file
        path.write_bytes(data if data is not None else path.read_bytes()[: path.stat().st_size // 2])
    shutil.copytree(model, root / "wrong_shape")  # weights of another shape than config.json says (embeddings 16 -> 24)
    config = json.loads((model / "config.json").read_text())
    (root / "wrong_shape" / "config.json").write_text(json.dumps({**config, "embedding_size": 24}))
    artifact = root / "artifact"
    artifact.mkdir()
    (artifact / "manifest.json").write_text('{"format": "sharebert-onnx"}')
    (artifact / "model.onnx").write_bytes(b"onnx")
    (root / "notes.txt").write_text("my notes\n")
    (root / "vocab.bin").write_bytes(bytes(range(255, -1, -1)) * 8)
    (root / "vocab-one-line.txt").write_bytes(b"[PAD] [UNK] " * (1 << 17))  # 1.5 MiB without a newline
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("\\documentclass{article}\n")
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    (root / "corpus").mkdir()  # a corpus folder holding a text and a symbolic link loop
    (root / "corpus" / "a.txt").write_text("some text\n")
    (root / "corpus" / "b.txt").symlink_to(root / "loop1")
    stsb = root / "stsb"
    stsb.mkdir()
    (stsb / "train.tsv").write_text("index\tsentence1\tsentence2\tscore\n0\ta cat\ta dog\t7.5\n")
    (stsb / "dev.tsv").write_text("index\tsentence1\tsentence2\tscore\n0\ta cat\ta dog\t2.5\n")
    return root


def _snapshot(path):
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


FT = ["--max-steps", "1", "--max-train-samples", "8", "--max-eval-samples", "8"]
CASES = [
    # (id, argv, message, paths that must be unchanged, path that must not be created)
    (  # an abbreviation is not the flag it starts (argparse would take --max-step as --max-steps)
        "flag-abbreviated",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/new0", "--overwr"],
        "unrecognized arguments: --overwr",
        [],
        "new0",
    ),
    (
        "flag-abbreviated-subcommand",
        ["evaluate", "wordsim", "--mod", "{root}/model"],
        "--mod",
        [],
        None,
    ),
    (
        "set-typo",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/new1", "--set", "num_hiden_layers=3"],
        "did you mean num_hidden_layers",
        [],
        "new1",
    ),
    (
        "out-is-file",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/notes.txt"],
        "is a file, not a folder",
        ["notes.txt"],
        None,
    ),
    (
        "out-under-file",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/notes.txt/sub"],
        "notes.txt is a file, not a folder",
        ["notes.txt"],
        None,
    ),
    (
        "out-foreign",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/mine"],
        "not a model folder",
        ["mine"],
        None,
    ),
    (
        "demo-into-a-user-folder",
        ["demo", "--out", "{root}/mine"],
        "is a non-empty folder that is not a sharebert demo folder",
        ["mine"],
        None,
    ),
    ("demo-into-a-file", ["demo", "--out", "{root}/notes.txt"], "is a file, not a folder", ["notes.txt"], None),
    (
        "out-foreign-overwrite",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/mine", "--overwrite"],
        "not a model folder",
        ["mine"],
        None,
    ),
    (
        "vocab-binary",
        ["build", "--preset", "sharebert-tiny", "--vocab", "{root}/vocab.bin", "--out", "{root}/new2"],
        "vocab.bin is not a UTF-8 text file",
        ["vocab.bin"],
        "new2",
    ),
    (
        "vocab-dev-zero",
        ["build", "--preset", "sharebert-tiny", "--vocab", "/dev/zero", "--out", "{root}/new2"],
        "vocabulary file /dev/zero: a character device, not a regular file",
        [],
        "new2",
    ),
    (
        "vocab-line-over-1MiB",
        [
            "pretrain",
            "--preset",
            "sharebert-tiny",
            "--vocab",
            "{root}/vocab-one-line.txt",
            "--train",
            "{root}/notes.txt",
            "--out",
            "{root}/new2",
        ],
        "vocab-one-line.txt line 1: longer than 1048576",
        ["vocab-one-line.txt"],
        "new2",
    ),
    (
        "out-existing-model",
        ["build", "--preset", "sharebert-tiny", "--out", "{root}/model"],
        "holds a model folder without the sharebert_run.json",
        ["model"],
        None,
    ),  # not `build`'s: never replaced
    (
        "out-unwritable",
        ["build", "--preset", "sharebert-tiny", "--out", "/proc/sharebert-test"],
        "cannot write",
        [],
        None,
    ),
    (
        "report-bad-config",
        ["report", "--model", "{root}/bad_config"],
        "config.json is not valid JSON",
        ["bad_config"],
        None,
    ),
    (
        "report-alien-config",
        ["report", "--model", "{root}/alien_config"],
        "model_type 'gpt2' is not a text encoder",
        ["alien_config"],
        None,
    ),
    ("report-artifact", ["report", "--model", "{root}/artifact"], "is an exported ONNX artifact", ["artifact"], None),
    (
        "report-model-is-a-file",
        ["report", "--model", "{root}/notes.txt"],
        "notes.txt is a file, not a model folder",
        ["notes.txt"],
        None,
    ),
    (
        "evaluate-bad-config",
        ["evaluate", "glue", "--model", "{root}/bad_config", "--task", "sst2"],
        "config.json is not valid JSON",
        ["bad_config"],
        None,
    ),
    (
        "finetune-bad-weights",
        ["finetune", "--model", "{root}/bad_weights", "--task", "sst2", "--out", "{root}/ft1", *FT],
        "model.safetensors cannot be loaded",
        ["bad_weights"],
        "ft1",
    ),
    (
        "finetune-weights-do-not-fit-config",
        ["finetune", "--model", "{root}/wrong_shape", "--task", "sst2", "--out", "{root}/ft6", *FT],
        "model.safetensors does not fit",
        ["wrong_shape"],
        "ft6",
    ),
    (
        "finetune-bad-tokenizer",
        ["finetune", "--model", "{root}/bad_tokenizer", "--task", "sst2", "--out", "{root}/ft2", *FT],
        "tokenizer.json cannot be read",
        ["bad_tokenizer"],
        "ft2",
    ),
    (
        "finetune-bad-tokenizer-config",
        ["finetune", "--model", "{root}/bad_tokenizer_config", "--task", "sst2", "--out", "{root}/ft7", *FT],
        "tokenizer_config.json is not valid JSON",
        ["bad_tokenizer_config"],
        "ft7",
    ),
    (
        "finetune-into-model",
        ["finetune", "--model", "{root}/model", "--task", "sst2", "--out", "{root}/model", *FT],
        "is, or holds, the input",
        ["model"],
        None,
    ),
    (
        "finetune-into-parent",
        ["finetune", "--model", "{root}/model", "--task", "sst2", "--out", "{root}", "--overwrite", *FT],
        "is, or holds, the input",
        ["model", "mine", "notes.txt"],
        None,
    ),
    (
        "finetune-artifact",
        ["finetune", "--model", "{root}/artifact", "--task", "sst2", "--out", "{root}/ft3", *FT],
        "is an exported ONNX artifact",
        ["artifact"],
        "ft3",
    ),
    # evaluate's output files are checked before any evaluation (the model is never loaded for these)
    (
        "plot-is-a-folder",
        ["evaluate", "glue", "--model", "{root}/model", "--task", "sst2", "--depths", "1", "--plot", "{root}/mine"],
        "is a folder",
        ["mine"],
        None,
    ),
    (
        "plot-under-a-file",
        [
            "evaluate",
            "glue",
            "--model",
            "{root}/model",
            "--task",
            "sst2",
            "--depths",
            "1",
            "--plot",
            "{root}/notes.txt/p.png",
        ],
        "notes.txt is a file, not a folder",
        ["notes.txt"],
        None,
    ),
    (
        "plot-format",
        ["evaluate", "glue", "--model", "{root}/model", "--task", "sst2", "--depths", "1", "--plot", "{root}/p.txt"],
        "must end in .png",
        [],
        "p.txt",
    ),
    (
        "json-under-a-file",
        [
            "evaluate",
            "glue",
            "--model",
            "{root}/model",
            "--task",
            "sst2",
            "--depths",
            "1",
            "--plot",
            "{root}/p1.png",
            "--json",
            "{root}/notes.txt/r.json",
        ],
        "notes.txt is a file",
        ["notes.txt"],
        "p1.png",
    ),
    (
        "plot-and-json-same",
        [
            "evaluate",
            "glue",
            "--model",
            "{root}/model",
            "--task",
            "sst2",
            "--depths",
            "1",
            "--plot",
            "{root}/same.png",
            "--json",
            "{root}/same.png",
        ],
        "name the same file",
        [],
        "same.png",
    ),
    # the demo replaces only its own folder, never another --out with everything in it
    (
        "demo-into-user-folder",
        ["demo", "--out", "{root}/mine"],
        "is a non-empty folder that is not a sharebert demo folder",
        ["mine"],
        None,
    ),
    (
        "demo-into-parent-of-user-work",
        ["demo", "--out", "{root}"],
        "not a sharebert demo folder",
        ["mine", "notes.txt", "model"],
        None,
    ),
    ("demo-into-file", ["demo", "--out", "{root}/notes.txt"], "is a file, not a folder", ["notes.txt"], None),
    # numeric options: refused by name before any work (sharebert/options.py types)
    (
        "pretrain-seq-len-0",
        ["pretrain", "--model", "{root}/model", "--train", "{root}/notes.txt", "--out", "{root}/pt1", "--seq-len", "0"],
        "argument --seq-len: must be an integer >= 3, got 0",
        ["model"],
        "pt1",
    ),
    (
        "pretrain-grad-norm-negative",
        [
            "pretrain",
            "--model",
            "{root}/model",
            "--train",
            "{root}/notes.txt",
            "--out",
            "{root}/pt1",
            "--max-grad-norm",
            "-1",
        ],
        "argument --max-grad-norm: must be a number >= 0",
        [],
        "pt1",
    ),
    (
        "pretrain-weight-decay-nan",
        [
            "pretrain",
            "--model",
            "{root}/model",
            "--train",
            "{root}/notes.txt",
            "--out",
            "{root}/pt1",
            "--weight-decay",
            "nan",
        ],
        "argument --weight-decay: must be a finite number",
        [],
        "pt1",
    ),
    (
        "pretrain-warmup-ratio-2",
        [
            "pretrain",
            "--model",
            "{root}/model",
            "--train",
            "{root}/notes.txt",
            "--out",
            "{root}/pt1",
            "--warmup-ratio",
            "2",
        ],
        "argument --warmup-ratio: must be a number in [0, 1)",
        [],
        "pt1",
    ),
    (
        "finetune-seq-len-1",
        ["finetune", "--model", "{root}/model", "--task", "sst2", "--out", "{root}/ft5", *FT, "--seq-len", "1"],
        "argument --seq-len: must be an integer >= 3, got 1",
        [],
        "ft5",
    ),
    (
        "finetune-lr-inf",
        ["finetune", "--model", "{root}/model", "--task", "sst2", "--out", "{root}/ft5", *FT, "--lr", "inf"],
        "argument --lr: must be a finite number",
        [],
        "ft5",
    ),
    (
        "export-threads-0",
        ["export", "--model", "{root}/model", "--out", "{root}/ex1", "--threads", "0"],
        "argument --threads: must be an integer >= 1, got 0",
        [],
        "ex1",
    ),
    ("budget-max-params-0", ["budget", "--max-params", "0"], "--max-params must be positive, got 0", [], None),
    (
        "budget-max-gflops-nan",
        ["budget", "--max-params", "10M", "--max-gflops", "nan"],
        "argument --max-gflops: must be a finite number",
        [],
        None,
    ),
    ("budget-plot-folder", ["budget", "--max-params", "10M", "--plot", "{root}/mine"], "--plot", ["mine"], "mine.png"),
    (
        "demo-steps-0",
        ["demo", "--out", "{root}/d1", "--steps", "0"],
        "argument --steps: must be an integer >= 1",
        [],
        "d1",
    ),
    (
        "stsb-out-of-scale",
        [
            "finetune",
            "--model",
            "{root}/model",
            "--task",
            "stsb",
            "--data-dir",
            "{root}/stsb",
            "--out",
            "{root}/ft4",
            *FT,
        ],
        "score '7.5' is outside [0, 5]",
        ["stsb", "model"],
        "ft4",
    ),
    # a typo lists every preset, ShareBERT's and BERT's; a --data-dir that is a file says so before the model loads
    (
        "preset-typo-lists-all",
        ["build", "--preset", "sharebert-tny", "--out", "{root}/new2"],
        "(did you mean sharebert-tiny?); known presets: sharebert-small",
        [],
        "new2",
    ),
    (
        "preset-typo-lists-bert",
        ["build", "--preset", "sharebert-tny", "--out", "{root}/new3"],
        ", bert-base, ",
        [],
        "new3",
    ),
    (
        "data-dir-is-a-file",
        [
            "finetune",
            "--model",
            "{root}/bad_weights",
            "--task",
            "sst2",
            "--data-dir",
            "{root}/notes.txt",
            "--out",
            "{root}/ft5",
            *FT,
        ],
        "notes.txt is a file; give the task's folder",
        ["notes.txt"],
        "ft5",
    ),
]

# A symbolic link loop given as any file or folder option (or through one, or inside a corpus folder): named as a
# loop (ELOOP; `os.path.exists` calls it missing), never "not found" or an internal error
# (sharebert_runtime.options.path).
L = "{root}/loop1"
LOOP_CASES = [
    ("build-vocab", ["build", "--preset", "sharebert-tiny", "--vocab", L, "--out", "{root}/n"]),
    ("build-out", ["build", "--preset", "sharebert-tiny", "--out", L]),
    ("build-out-through-the-loop", ["build", "--preset", "sharebert-tiny", "--out", L + "/new"]),
    ("report-model", ["report", "--model", L]),
    ("budget-model", ["budget", "--max-params", "10M", "--model", L]),
    ("budget-plot", ["budget", "--max-params", "10M", "--plot", L]),
    ("prepare-train", ["prepare", "--train", L, "--out", "{root}/n"]),
    ("prepare-train-folder-entry", ["prepare", "--train", "{root}/corpus", "--out", "{root}/n"]),
    ("prepare-valid", ["prepare", "--train", "{root}/notes.txt", "--valid", L, "--out", "{root}/n"]),
    ("prepare-tokenizer", ["prepare", "--train", "{root}/notes.txt", "--tokenizer", L, "--out", "{root}/n"]),
    ("prepare-out", ["prepare", "--train", "{root}/notes.txt", "--out", L]),
    ("pretrain-model", ["pretrain", "--model", L, "--train", "{root}/notes.txt", "--out", "{root}/n"]),
    (
        "pretrain-vocab",
        ["pretrain", "--preset", "sharebert-tiny", "--vocab", L, "--train", "{root}/notes.txt", "--out", "{root}/n"],
    ),
    ("pretrain-train", ["pretrain", "--model", "{root}/model", "--train", L, "--out", "{root}/n"]),
    (
        "pretrain-valid",
        ["pretrain", "--model", "{root}/model", "--train", "{root}/notes.txt", "--valid", L, "--out", "{root}/n"],
    ),
    ("pretrain-data", ["pretrain", "--model", "{root}/model", "--data", L, "--out", "{root}/n"]),
    ("pretrain-out", ["pretrain", "--model", "{root}/model", "--train", "{root}/notes.txt", "--out", L]),
    ("finetune-model", ["finetune", "--model", L, "--task", "sst2", "--out", "{root}/n"]),
    (
        "finetune-data-dir",
        ["finetune", "--model", "{root}/model", "--task", "sst2", "--data-dir", L, "--out", "{root}/n"],
    ),
    ("finetune-out", ["finetune", "--model", "{root}/model", "--task", "sst2", "--out", L]),
    (
        "distill-teacher",
        ["distill", "--teacher", L, "--student", "sharebert-tiny", "--task", "sst2", "--out", "{root}/n"],
    ),
    (
        "distill-student",
        ["distill", "--teacher", "{root}/model", "--student", L, "--task", "sst2", "--out", "{root}/n"],
    ),
    (
        "distill-train",
        [
            "distill",
            "--teacher",
            "{root}/model",
            "--student",
            "sharebert-tiny",
            "--objective",
            "mlm",
            "--train",
            L,
            "--out",
            "{root}/n",
        ],
    ),
    (
        "distill-data",
        [
            "distill",
            "--teacher",
            "{root}/model",
            "--student",
            "sharebert-tiny",
            "--objective",
            "mlm",
            "--data",
            L,
            "--out",
            "{root}/n",
        ],
    ),
    (
        "distill-data-dir",
        [
            "distill",
            "--teacher",
            "{root}/model",
            "--student",
            "sharebert-tiny",
            "--task",
            "sst2",
            "--data-dir",
            L,
            "--out",
            "{root}/n",
        ],
    ),
    (
        "distill-cache-teacher",
        [
            "distill",
            "--teacher",
            "{root}/model",
            "--student",
            "sharebert-tiny",
            "--task",
            "sst2",
            "--cache-teacher",
            L,
            "--out",
            "{root}/n",
        ],
    ),
    (
        "distill-out",
        ["distill", "--teacher", "{root}/model", "--student", "sharebert-tiny", "--task", "sst2", "--out", L],
    ),
    ("compress-teacher", ["compress", L, "--out", "{root}/n"]),
    ("compress-train", ["compress", "{root}/model", "--train", L, "--out", "{root}/n"]),
    ("compress-out", ["compress", "{root}/model", "--out", L]),
    ("evaluate-model", ["evaluate", "glue", "--model", L, "--task", "sst2"]),
    ("evaluate-data-dir", ["evaluate", "glue", "--model", "{root}/model", "--task", "sst2", "--data-dir", L]),
    ("evaluate-json", ["evaluate", "glue", "--model", "{root}/model", "--task", "sst2", "--json", L]),
    ("evaluate-plot", ["evaluate", "glue", "--model", "{root}/model", "--task", "sst2", "--depths", "1", "--plot", L]),
    ("evaluate-analogy-file", ["evaluate", "analogy", "--model", "{root}/model", "--file", L]),
    ("export-model", ["export", "--model", L, "--out", "{root}/n"]),
    ("export-out", ["export", "--model", "{root}/model", "--out", L]),
    (
        "export-calibration",
        ["export", "--model", "{root}/model", "--out", "{root}/n", "--quantize", "int8-static", "--calibration", L],
    ),
    ("export-check-file", ["export", "--model", "{root}/model", "--out", "{root}/n", "--check-file", L]),
    ("plot-run", ["plot", L]),
    ("plot-out", ["plot", "{root}/model", "--out", L]),
    ("predict-artifact", ["predict", L, "x"]),
    ("predict-input", ["predict", "{root}/artifact", "--input", L]),
    ("predict-output", ["predict", "{root}/artifact", "--input", "{root}/notes.txt", "--output", L]),
    ("serve-artifact", ["serve", L, "--port", "0"]),
    ("demo-out", ["demo", "--out", L]),
]
CASES += [
    (f"symlink-loop-{name}", argv, "cannot be opened: it is a symbolic link loop", [], "n") for name, argv in LOOP_CASES
]


@pytest.mark.parametrize("argv, message, intact, absent", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_lost(world, capsys, argv, message, intact, absent):
    argv = [a.format(root=world) for a in argv]
    before = {p: _snapshot(world / p) for p in intact}
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
    assert {p: _snapshot(world / p) for p in intact} == before
    if absent:
        assert not (world / absent).exists()


def test_build_overwrite_replaces_the_folder_whole(world):
    """--overwrite of a model folder leaves none of the old model's files (a sentence-transformers recipe, portable
    code) behind, and a build that fails leaves the old folder as it was."""
    folder = world / "replaced"
    shutil.copytree(world / "model", folder)
    from sharebert_runtime.outdir import mark_out

    mark_out(folder, "build")  # a folder `sharebert build` wrote (its marker): --overwrite replaces only those
    (folder / "modules.json").write_text("[]")
    (folder / "1_Pooling").mkdir()
    (folder / "modeling_sharebert.py").write_text("# an old copy\n")
    assert (
        main(["build", "--preset", "sharebert-tiny", "--out", str(folder), "--overwrite", "--set", "hidden_size=7"])
        == 2
    )
    kept = _snapshot(folder)
    assert "modules.json" in kept and not (world / ".replaced.partial").exists()
    assert main(["build", "--preset", "sharebert-tiny", "--out", str(folder), "--overwrite"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*(p.name for p in (world / "model").iterdir()), "sharebert_run.json"]
    )
    assert not (world / ".replaced.partial").exists()


def test_build_overwrite_refuses_while_the_folder_holds_a_file_it_did_not_build(world, capsys):
    """A finished build's marker lists what it wrote (outdir.seal_out): --overwrite, which replaces the folder whole,
    refuses in one line naming a file added since, and leaves everything as it was; a marker edited by hand (a listed
    file changed) makes the folder no build's."""
    folder = world / "sealed"
    assert main(["build", "--preset", "sharebert-tiny", "--out", str(folder)]) == 0
    (folder / "my_notes.txt").write_text("mine\n")
    before = _snapshot(folder)
    capsys.readouterr()
    assert main(["build", "--preset", "sharebert-tiny", "--out", str(folder), "--overwrite"]) == 2
    assert "files the earlier build did not write (my_notes.txt)" in capsys.readouterr().err
    assert _snapshot(folder) == before
    (folder / "my_notes.txt").unlink()
    (folder / "config.json").write_text("{}\n")  # the user's own config now: not the file the build wrote
    assert main(["build", "--preset", "sharebert-tiny", "--out", str(folder), "--overwrite"]) == 2
    assert "is a non-empty folder that is not a model folder" in capsys.readouterr().err
    assert (folder / "config.json").read_text() == "{}\n"


def test_device_install_names_the_extra_to_install(world):
    """Without torch (a `pip install sharebert` device install), a workstation command says what to install."""
    code = (
        "import sys; sys.modules.update(torch=None, transformers=None); from sharebert_runtime.main import main; "
        f"sys.exit(main(['build', '--preset', 'sharebert-tiny', '--out', {str(world / 'dev')!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'sharebert[full]'" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (world / "dev").exists()
