"""``--overwrite`` never destroys before it validates and takes only its own folders (the marker ``outdir.MARK``, never
subfolder names); a ``--resume`` checks it resumes the same run (teacher, student shape, data, objective); ``compress``
refuses bad inputs before torch is imported.

One table per root cause. A refusal that must come before torch is imported runs in a subprocess with torch and
transformers blocked (``_sharebert(device=True)``, as on a device install, where ``import sharebert`` registers
nothing), so a refusal that needs torch fails to come; the workstation commands run in this process
(``_sharebert_here``), through the console script's ``main``.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sharebert_runtime.outdir import MARK, check_same_run, mark_out, read_mark

DRIVER = (
    "import sys, json\n"
    "if sys.argv.pop(1) == 'device':\n"
    "    sys.modules.update(torch=None, transformers=None)\n"
    "from sharebert_runtime.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(json.dumps({'rc': rc, 'torch': sys.modules.get('torch') is not None}))\n"
)


def _sharebert(*argv, cwd, env=None, device=False):
    """``(exit status, torch imported, stderr)`` of ``sharebert argv`` in a fresh process (``device``: torch
    blocked)."""
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, "device" if device else "workstation", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=600,
    )
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    return last["rc"], last["torch"], proc.stderr


def _sharebert_here(*argv, cwd, capfd, monkeypatch):
    """``(exit status, stderr)`` of ``sharebert argv`` run in this process from ``cwd``
    (``sharebert_runtime.main.main``, as the console script calls it). For workstation commands, whose refusals come
    from the same code in a fresh process (torch is imported there too): a new process would add ~6 s of imports
    and nothing a test checks."""
    from sharebert_runtime.main import main

    capfd.readouterr()
    with monkeypatch.context() as m:
        m.chdir(cwd)
        rc = main([str(a) for a in argv])
    return rc, capfd.readouterr().err


def _snapshot(folder: Path) -> dict:
    """Every path and file content under ``folder`` (a run's lock file aside: ``outdir.OutLock``)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
        if p.name != ".lock"
    }


# what each --overwrite-taking command writes (a finished result, made by hand with the command's marker), and an
# invalid limit it finds only after it has checked --out
FINISHED = {
    "compress": (
        "student/config.json",
        "student/model.safetensors",
        "artifact/manifest.json",
        "teacher_artifact/x.onnx",
        "report.json",
        "report.md",
        "report.png",
    ),
    "distill": ("config.json", "model.safetensors", "metrics.json", "checkpoints/checkpoint-2/trainer_state.json"),
    "finetune": ("config.json", "model.safetensors", "metrics.json"),
    "build": ("config.json", "model.safetensors", "vocab.txt"),
}


def _argv(command, teacher, out, invalid: bool):
    bad = (
        {
            "compress": ["--max-params", "1k"],
            "distill": ["--set", "hidden_size=7"],
            "finetune": ["--depth-sampling", "99"],
            "build": ["--set", "hidden_size=7"],
        }[command]
        if invalid
        else []
    )
    return {
        "compress": ["compress", teacher, "--out", out, "--overwrite", "--max-steps", "1", *bad],
        "distill": [
            "distill",
            "--objective",
            "embedding",
            "--teacher",
            teacher,
            "--student",
            "sharebert-tiny",
            "--out",
            out,
            "--overwrite",
            "--max-steps",
            "1",
            *bad,
        ],
        "finetune": [
            "finetune",
            "--model",
            teacher,
            "--task",
            "sst2",
            "--out",
            out,
            "--overwrite",
            "--max-steps",
            "1",
            *bad,
        ],
        "build": ["build", "--preset", "sharebert-tiny", "--out", out, "--overwrite", *bad],
    }[command]


def _finished(folder: Path, command: str) -> Path:
    for name in FINISHED[command]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"{command} {name}\n")
    if command == "compress":
        (folder / "report.json").write_text(json.dumps({"teacher": {}, "student": {}}))
    mark_out(folder, command)
    return folder


def _users(folder: Path) -> Path:
    """A user's project folder holding what a command's own folder holds, by name (never a sharebert result)."""
    for name in (
        "student/essay.txt",
        "general/notes.txt",
        "checkpoints/draft.txt",
        "report.md",
        "metrics.json",
        "config.json",
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("the user's own\n")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "bert",
                "vocab_size": 10,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
                "intermediate_size": 8,
            }
        )
    )
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(FINISHED))
def test_overwrite_with_an_invalid_limit_keeps_a_finished_result_whole(
    command, minilm_dir, tmp_path, capfd, monkeypatch
):
    out = _finished(tmp_path / "result", command)
    before = _snapshot(out)
    rc, err = _sharebert_here(
        *_argv(command, minilm_dir, out, invalid=True), cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch
    )
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert _snapshot(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(FINISHED))
def test_overwrite_never_takes_a_users_folder(command, minilm_dir, tmp_path, capfd, monkeypatch):
    out = _users(tmp_path / "mine")
    before = _snapshot(out)
    for invalid in (True, False):
        rc, err = _sharebert_here(
            *_argv(command, minilm_dir, out, invalid), cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch
        )
        assert rc == 2, err
        assert _snapshot(out) == before
    assert "not a" in err or "without the sharebert_run.json" in err, err


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--train", "empty.txt"], "--train empty.txt is empty"),
        (["--train", "fifo"], "FIFO"),
        (["--train", "/dev/zero"], "a character device"),
        (["--train", "nohdr.tsv"], "a .tsv needs a GLUE header"),
        (["--train", "missing.txt"], "missing.txt"),
        (["--max-params", "1k"], "no ShareBERT student fits under max-params 1k"),
        (["--out", "afile"], "is a file"),
        (["--out", "mine"], "is a non-empty folder that is not a compress result"),
        (["--teacher-missing"], "model folder not found"),
    ],
)
def test_compress_refuses_bad_inputs_before_torch_is_imported(bad, message, minilm_dir, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "nohdr.tsv").write_text("a\tb\n1\t2\n")
    (tmp_path / "afile").write_text("x\n")
    _users(tmp_path / "mine")
    teacher = tmp_path / "no-such-teacher" if bad == ["--teacher-missing"] else minilm_dir
    bad = [] if bad == ["--teacher-missing"] else bad
    out = [] if "--out" in bad else ["--out", "R"]
    rc, torch_imported, err = _sharebert("compress", teacher, *out, *bad, cwd=tmp_path, device=True)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not torch_imported
    assert not (tmp_path / "R").exists()


def test_a_resume_of_another_run_is_refused_naming_what_differs(tmp_path):
    fp = {
        "teacher": ["config.json:aa", "model.safetensors:bb"],
        "student": '{"hidden_size": 64}',
        "data": ["train.txt:cc"],
        "objective": "embedding (cosine loss)",
    }
    mark_out(tmp_path, "compress", fp)
    check_same_run(tmp_path, fp)  # the same run resumes
    cases = {
        "teacher": (
            ["config.json:aa", "model.safetensors:XX"],
            "teacher (its weights, config or tokenizer files): model.safetensors",
        ),
        "student": ('{"hidden_size": 128}', "student shape"),
        "data": (["other.txt:dd"], "training data"),
        "objective": ("embedding (mse loss)", "objective: embedding (cosine loss) -> embedding (mse loss)"),
    }
    for key, (value, said) in cases.items():
        with pytest.raises(ValueError, match="--resume") as e:
            check_same_run(tmp_path, {**fp, key: value})
        assert said in str(e.value) and "\n" not in str(e.value)
    assert read_mark(tmp_path)["command"] == "compress"
    assert (tmp_path / MARK).is_file()


@pytest.mark.parametrize("saved", [[1, 2], [["train.txt", "cc"]], [{"train.txt": "cc"}], [None]])
def test_a_hand_edited_fingerprint_of_other_types_is_refused_naming_what_differs(tmp_path, saved):
    """A marker edited by hand, valid JSON of other types where the run wrote "name:digest" strings: --resume was an
    internal error (numbers have no split, lists and objects no hash); now the one-line refusal naming the data."""
    mark_out(tmp_path, "compress", {"data": saved})
    with pytest.raises(ValueError, match="--resume") as e:
        check_same_run(tmp_path, {"data": ["train.txt:cc"]})
    assert "training data" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_distill_resume_with_another_teacher_data_or_objective_is_refused(minilm_dir, tmp_path, capfd, monkeypatch):
    """A real short embedding distillation, then --resume with another teacher (a copy whose config differs), other
    --train text, another loss: each refused in one line naming it, the run's folder unchanged."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(minilm_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "note": "another teacher"}))
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    text = tmp_path / "train.txt"
    text.write_text("".join(f"The {a} met the {b} near {i} old trees.\n" for i, a in enumerate(words) for b in words))
    other_text = tmp_path / "other.txt"
    other_text.write_text(text.read_text().replace("trees", "rivers"))
    out = tmp_path / "run"
    base = [
        "distill",
        "--objective",
        "embedding",
        "--student",
        "sharebert-tiny",
        "--set",
        "hidden_size=64",
        "--set",
        "embedding_size=32",
        "--set",
        "intermediate_size=64",
        "--set",
        "num_hidden_layers=1",
        "--out",
        out,
        "--max-train-samples",
        "64",
        "--batch-size",
        "16",
        "--eval-steps",
        "1",
        "--max-eval-samples",
        "8",
    ]
    here = {"cwd": tmp_path, "capfd": capfd, "monkeypatch": monkeypatch}
    rc, err = _sharebert_here(*base, "--teacher", minilm_dir, "--train", text, "--max-steps", "1", **here)
    assert rc == 0, err
    before = _snapshot(out)
    for change, said in (
        (["--teacher", other, "--train", text], "teacher (its weights, config or tokenizer files): config.json"),
        (["--teacher", minilm_dir, "--train", other_text], "other sentences"),
        (["--teacher", minilm_dir, "--train", text, "--loss", "mse"], "objective"),
    ):
        rc, err = _sharebert_here(*base, *change, "--max-steps", "2", "--resume", **here)
        assert rc == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert _snapshot(out) == before
    # stopped after its checkpoint (its marker as a stop leaves it: written in its folder, no files listed), then
    # copied with cp -r: the copy resumes there, the run's teacher and data checked as in the folder it copies
    mark_out(out, "distill", read_mark(out)["fingerprint"])
    (out / "metrics.json").unlink()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    copied = [a if a != out else copy for a in base]
    rc, err = _sharebert_here(*copied, "--teacher", minilm_dir, "--train", text, "--max-steps", "2", "--resume", **here)
    assert rc == 0, err
    assert json.loads((copy / "metrics.json").read_text())["steps"] == 2 and "files" in read_mark(copy)


def test_compress_overwrite_keeps_the_earlier_result_aside_until_the_new_one_is_written(tmp_path):
    """`start_out` moves the earlier result's parts aside (a user's own file in the folder stays put); a failed run
    puts them back exactly (`restore_out`), a finished one removes them (`finish_out`)."""
    from sharebert.pipelines.out_folder import ASIDE, finish_out, restore_out, start_out

    out = _finished(tmp_path / "result", "compress")
    (out / "notes.txt").write_text("the user's own\n")
    before = _snapshot(out)
    aside = start_out(out, {"objective": "new"}, overwrite=True, resume=False)
    assert aside == out / ASIDE and not (out / "report.json").exists() and (out / "notes.txt").is_file()
    assert read_mark(out)["fingerprint"] == {"objective": "new"}
    (out / "student").mkdir()
    (out / "student" / "half.safetensors").write_text("partial")
    restore_out(out, aside)
    assert _snapshot(out) == before
    aside = start_out(out, {"objective": "new"}, overwrite=True, resume=False)
    (out / "report.json").write_text("{}")
    finish_out(out)
    assert not (out / ASIDE).exists() and (out / "notes.txt").is_file()


def test_publish_over_restores_on_failure_keeps_a_stopped_run_and_clears_aside_when_done(tmp_path):
    """The one wrapper both compress paths run in: a failing run leaves the earlier result exactly as it was, a
    stopped one keeps its new parts (to --resume) and the earlier result aside, a finished one drops the aside."""
    from sharebert.pipelines.out_folder import ASIDE, publish_over
    from sharebert.training.callbacks import StopRequested

    out = _finished(tmp_path / "result", "compress")
    before = _snapshot(out)

    def fails():
        (out / "student").mkdir()
        raise ValueError("the new run failed")

    with pytest.raises(ValueError, match="the new run failed"):
        publish_over(out, {"objective": "new"}, True, False, fails)
    assert _snapshot(out) == before

    def stopped():
        (out / "student").mkdir()
        raise StopRequested(signal.SIGTERM)

    with pytest.raises(StopRequested):
        publish_over(out, {"objective": "new"}, True, False, stopped)
    assert (out / "student").is_dir() and (out / ASIDE).is_dir()
    report = publish_over(out, {"objective": "new"}, False, True, lambda: {"stopped": False})
    assert report == {"stopped": False} and not (out / ASIDE).exists()


def test_a_marker_that_is_no_file_of_ours_owns_nothing(tmp_path):
    from sharebert_runtime.outdir import made_by

    os.mkfifo(tmp_path / MARK)  # never opened: a FIFO would block
    assert read_mark(tmp_path) is None
    (tmp_path / MARK).unlink()
    (tmp_path / MARK).write_text(json.dumps({"command": "compress", "pad": "x" * (2 << 20)}))
    assert not made_by("compress")(tmp_path)
    (tmp_path / MARK).write_text("{not json")
    assert read_mark(tmp_path) is None
    mark_out(tmp_path, "distill")
    assert made_by("distill")(tmp_path) and not made_by("compress")(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev-zero"])
def test_a_teacher_file_that_is_not_a_regular_file_is_refused_by_the_fingerprint(tmp_path, kind):
    """The resume fingerprint reads every weights/config/tokenizer file of a teacher: one of them that is a FIFO,
    a folder or a device is an error naming it, never left out of the fingerprint (nor read forever)."""
    from sharebert.training.fingerprint import teacher_fingerprint

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text('{"model_type": "bert"}')
    odd = teacher / "tokenizer.json"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "folder":
        odd.mkdir()
    else:
        odd.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="tokenizer.json"):
        teacher_fingerprint(teacher)
    odd.unlink() if kind != "folder" else odd.rmdir()
    odd.write_text("{}")
    assert [p.split(":")[0] for p in teacher_fingerprint(teacher)] == ["config.json", "tokenizer.json"]


def _sealed(folder: Path) -> Path:
    """A finished compress result as a run leaves it: its files, then the marker listing them (``seal_out``)."""
    from sharebert_runtime.outdir import seal_out

    _finished(folder, "compress")
    seal_out(folder)
    return folder


def _precheck_out(out: Path, minilm_dir, overwrite=True, resume=False):
    from sharebert.pipelines.out_folder import check_out

    return check_out(out, minilm_dir, None, overwrite, resume)


def test_a_hand_written_marker_makes_no_folder_a_compress_result(minilm_dir, tmp_path):
    """The issue's case: a one-key marker beside the user's notes and a model file; and a real marker copied from
    another result, or one whose listed report changed: neither taken by --overwrite, refused before any work."""
    import shutil

    mine = tmp_path / "P"
    (mine / "student").mkdir(parents=True)
    (mine / "report.md").write_text("notes\n")
    (mine / "student" / "model.safetensors").write_text("w\n")
    (mine / MARK).write_text(json.dumps({"command": "compress"}))
    copied = tmp_path / "copied"
    shutil.copytree(_finished(tmp_path / "unfinished", "compress"), copied)  # its marker names another folder
    edited = _sealed(tmp_path / "edited")
    (edited / "report.md").write_text("the user's own report\n")
    for out in (mine, copied, edited):
        before = _snapshot(out)
        with pytest.raises(ValueError, match="not a compress result|whose sharebert_run.json does not match"):
            _precheck_out(out, minilm_dir)
        assert _snapshot(out) == before
    _precheck_out(_sealed(tmp_path / "sealed"), minilm_dir)  # a run's own, as it left it: taken
    _precheck_out(_finished(tmp_path / "stopped", "compress"), minilm_dir)  # a stopped run's, in its own folder


def test_overwrite_refuses_while_a_result_holds_files_its_run_did_not_write(minilm_dir, tmp_path):
    out = _sealed(tmp_path / "result")
    (out / "student" / "my_extra.bin").write_bytes(b"mine")
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"the earlier compress run did not write \(student/my_extra.bin\)"):
        _precheck_out(out, minilm_dir)
    assert _snapshot(out) == before
    _precheck_out(out, minilm_dir, overwrite=False, resume=True)  # a resume replaces nothing: no refusal
    (out / "student" / "my_extra.bin").unlink()
    _precheck_out(out, minilm_dir)


def test_seal_lists_what_the_run_wrote_and_a_listed_file_outside_is_not_vouched(tmp_path):
    from sharebert_runtime.outdir import file_fingerprint, made_by, seal_out, unlisted, vouched

    out = _sealed(tmp_path / "r")
    mark = read_mark(out)
    assert set(mark["files"]) == set(FINISHED["compress"]) and vouched(out, mark) is None
    assert mark["files"]["report.md"] == file_fingerprint(out / "report.md") and unlisted(out) == []
    (out / "report.md").unlink()  # a listed file gone: no one's loss, still the run's folder
    assert made_by("compress")(out) and not made_by("distill")(out)
    (out / MARK).write_text(json.dumps({**mark, "files": {"../outside": "0" * 16}}))
    assert "outside" in vouched(out, read_mark(out)) and not made_by("compress")(out)
    seal_out(tmp_path / "no-marker-here")  # nothing to seal: nothing written
    assert not (tmp_path / "no-marker-here").exists()


def test_overwrite_refuses_a_users_folder_named_like_the_aside_of_a_finished_result(minilm_dir, tmp_path):
    """A finished result has no ``.replaced`` (its run removed it before sealing): one there is the user's. It was
    left out of what the marker's files are compared with, so --overwrite took it for an earlier --overwrite's
    aside: the finished result's parts were deleted (not kept aside) and the user's files in it went with the
    aside at the run's end. Now refused before any work, naming them, nothing changed."""
    out = _sealed(tmp_path / "result")
    (out / ".replaced").mkdir()
    (out / ".replaced" / "notes.txt").write_text("the user's own\n")
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"did not write \(\.replaced/notes\.txt\)"):
        _precheck_out(out, minilm_dir)
    assert _snapshot(out) == before


def test_an_overwrite_killed_while_setting_the_result_aside_says_so_and_how_to_put_it_back(minilm_dir, tmp_path):
    """kill -9 while --overwrite moved the earlier result's parts into .replaced (before its own marker): the next
    --overwrite named those parts as files the earlier run did not write. Now it says what happened and how to put
    them back, nothing changed; put back as it says, the folder is the finished result again."""
    import subprocess

    out = _sealed(tmp_path / "result")
    (out / ".replaced").mkdir()
    for part in ("report.json", "student"):
        os.replace(out / part, out / ".replaced" / part)
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"an --overwrite stopped while it set the earlier result aside") as refused:
        _precheck_out(out, minilm_dir)
    assert "\n" not in str(refused.value) and "report.json, student in" in str(refused.value)
    assert _snapshot(out) == before
    fix = str(refused.value).split("put them back (")[1].split(") and run again")[0]
    subprocess.run(fix, shell=True, check=True)
    assert _precheck_out(out, minilm_dir) == out
    (out / ".replaced").mkdir()  # a copy of a part beside the part itself is the user's: named as such
    (out / ".replaced" / "report.json").write_text((out / "report.json").read_text())
    with pytest.raises(ValueError, match=r"did not write \(\.replaced/report\.json\)"):
        _precheck_out(out, minilm_dir)


def _checkpointed(folder: Path, command: str) -> Path:
    """A run stopped after its first checkpoint, as it leaves its folder: the marker written there (``mark_out``),
    a complete ``checkpoint-2`` (files and the completion marker the Trainer's callbacks write), no result."""
    from sharebert.training.callbacks import mark_complete

    mark_out(folder, command, {"objective": "mlm"})
    ckpt = folder / "checkpoints" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights" * 100)
    (ckpt / "trainer_state.json").write_text('{"global_step": 2}')
    mark_complete(ckpt, 2)
    return folder


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "outside-name"])
def test_a_checkpoint_marker_that_is_no_file_of_ours_completes_nothing(tmp_path, kind):
    """A checkpoint's completion marker made a FIFO (reading it waited forever for a writer), a link to /dev/zero
    (read whole: without end), or listing a file outside the checkpoint (taken as one of its files, hashed where it
    lies): the checkpoint is not complete, so --resume sets it aside and takes the one before it."""
    from sharebert.training.callbacks import MARKER, checkpoints, resume_checkpoint

    out = _checkpointed(tmp_path / "run", "distill") / "checkpoints"
    bad = out / "checkpoint-4"
    shutil.copytree(out / "checkpoint-2", bad)
    if kind == "outside-name":
        (tmp_path / "outside.bin").write_bytes(b"weights" * 100)
        record = json.loads((bad / MARKER).read_text())
        record["files"]["../../../outside.bin"] = record["files"].pop("model.safetensors")
        (bad / MARKER).write_text(json.dumps(record))
    else:
        (bad / MARKER).unlink()
        os.mkfifo(bad / MARKER) if kind == "fifo" else (bad / MARKER).symlink_to("/dev/zero")
    assert [(step, ok) for step, _, ok in checkpoints(out)] == [(2, True), (4, False)]
    assert resume_checkpoint(out, say=lambda line: None) == out / "checkpoint-2"


def test_a_copy_of_a_stopped_run_is_vouched_for_by_its_intact_checkpoint(tmp_path):
    """`cp -r` of a stopped run (its marker written in the folder it copies, so its folder identity differs) is the
    run's folder where a complete checkpoint's hashes hold: it resumes. A marker copied alone beside the user's
    files, or beside a checkpoint changed since it completed, vouches for nothing, and says why."""
    import shutil

    from sharebert_runtime.outdir import made_by, vouched

    run = _checkpointed(tmp_path / "run", "distill")
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert made_by("distill")(run) and made_by("distill")(copy) and not made_by("compress")(copy)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(run / MARK, alone / MARK)
    (alone / "metrics.json").write_text("the user's own\n")
    assert "no complete checkpoint here vouches for it" in vouched(alone, read_mark(alone))
    weights = copy / "checkpoints" / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes().replace(b"weights", b"WEIGHTS", 1))  # same size, other bytes
    assert not made_by("distill")(copy) and made_by("distill")(run)


def test_a_copy_made_of_links_is_no_run_of_its_own(tmp_path):
    """`cp -rs` of a stopped run (real folders, every file a link to the run's): its checkpoint's hashes held through
    the links, so the copy was vouched for and a --resume there wrote its model through them, over the original
    run's files. A marker that is a link is no marker: the copy is refused as any folder without one is."""
    from sharebert_runtime.outdir import made_by

    run = _checkpointed(tmp_path / "run", "distill")
    (run / "model.safetensors").write_bytes(b"the run's own")
    copy = tmp_path / "copy"
    for path in sorted(run.rglob("*")):
        if path.is_dir():
            (copy / path.relative_to(run)).mkdir(parents=True)
        else:
            (copy / path.relative_to(run)).symlink_to(path)
    assert made_by("distill")(run) and not made_by("distill")(copy) and read_mark(copy) is None


@pytest.mark.parametrize("marker", [None, {"command": "pretrain"}])
def test_pretrain_takes_no_folder_on_the_word_of_its_names(marker, tmp_path, capsys):
    """The issue's case for pretrain: a user's folder holding a metrics.json and a log.jsonl (and a hand-written
    marker) was taken for a run by those names, and `--resume` replaced the metrics and appended to the log; now it
    is refused in one line naming the marker, before any work, nothing changed."""
    from sharebert_runtime.main import main

    mine = tmp_path / "P"
    mine.mkdir()
    (mine / "metrics.json").write_text("my notes\n")
    (mine / "log.jsonl").write_text("mine\n")
    if marker is not None:
        (mine / MARK).write_text(json.dumps(marker))
    (tmp_path / "c.txt").write_text("a few words of text to train on.\n" * 20)
    before = _snapshot(mine)
    argv = ["pretrain", "--preset", "sharebert-tiny", "--train", tmp_path / "c.txt", "--out", mine, "--max-steps", "1"]
    for resume in ([], ["--resume"]):
        capsys.readouterr()
        assert main([*map(str, argv), *resume]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds a pretrain run" in err and MARK in err, err
        assert _snapshot(mine) == before


@pytest.mark.slow
def test_pretrain_marks_its_run_seals_it_and_a_copy_of_a_stopped_one_resumes(tmp_path):
    """A real tiny pretrain stopped by SIGTERM after step 1: its folder is the run's by its marker; a `cp -r` copy
    resumes to the end (the copy's marker then names the copy and lists its files); a resume with another objective
    is refused naming it; the finished run's metrics.json edited by hand makes the folder no longer the run's."""
    import shutil

    from transformers import TrainerCallback

    from sharebert.formats.paths import data_path
    from sharebert.training.pretrain import PretrainArgs, pretrain
    from sharebert_runtime.outdir import file_fingerprint, made_by

    class StopAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    corpus = tmp_path / "c.txt"
    with open(data_path("wikitext-2-raw", "wiki.valid.raw"), encoding="utf-8") as f:
        corpus.write_text("".join(next(f) for _ in range(100)))
    tiny = dict(hidden_size=64, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2, embedding_size=16)
    args = dict(max_steps=2, batch_size=2, seq_len=32, save_steps=1, eval_steps=100, logging_steps=1, progress=False)
    args = PretrainArgs(**args, max_eval_sequences=4, overrides=tiny)
    run = tmp_path / "run"
    stopped = pretrain([corpus], run, preset="sharebert-tiny", args=args, callbacks=[StopAfterFirstStep()])
    assert stopped["status"] == "interrupted" and made_by("pretrain")(run) and "files" not in read_mark(run)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with pytest.raises(ValueError, match="another objective: mlm -> clm; resume with that run's options, or choose"):
        pretrain(
            [corpus],
            copy,
            preset="sharebert-tiny",
            args=PretrainArgs(**{**vars(args), "objective": "clm", "resume": True}),
        )
    resumed = pretrain([corpus], copy, preset="sharebert-tiny", args=PretrainArgs(**{**vars(args), "resume": True}))
    assert resumed["status"] == "completed" and resumed["global_step"] == 2
    mark = read_mark(copy)
    assert mark["files"]["metrics.json"] == file_fingerprint(copy / "metrics.json")
    assert not any(name.startswith("checkpoint-") for name in mark["files"])  # vouched for by their own markers
    (copy / "metrics.json").write_text("edited\n")
    assert not made_by("pretrain")(copy)


def test_a_resumed_copy_takes_its_own_checkpoint_as_the_best(tmp_path):
    """The Trainer's state names the best checkpoint by the folder it was saved in (the original's, in a copy; the
    Trainer drops it where that is gone): fine-tuning and distillation (MarkCheckpoints) take the run's own
    checkpoint of that step, so the copy's rotation keeps it and the end loads it."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from sharebert.training.callbacks import MarkCheckpoints

    (tmp_path / "copy" / "checkpoint-4").mkdir(parents=True)
    args = SimpleNamespace(output_dir=str(tmp_path / "copy"))
    for recorded in (str(tmp_path / "run" / "checkpoint-4"), None):
        state = TrainerState(best_global_step=4, best_model_checkpoint=recorded)
        MarkCheckpoints().on_train_begin(args, state, TrainerControl())
        assert state.best_model_checkpoint == str(tmp_path / "copy" / "checkpoint-4")
    state = TrainerState(best_global_step=6, best_model_checkpoint=None)  # none of that step here: nothing to take
    MarkCheckpoints().on_train_begin(args, state, TrainerControl())
    assert state.best_model_checkpoint is None
