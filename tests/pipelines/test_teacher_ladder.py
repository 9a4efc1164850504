"""The teacher's export ladder: a large teacher starts at its cheapest sure rung (weight-only int8), a small one tries
int8-dynamic first."""

from sharebert.pipelines.teacher_pass import LARGE_TEACHER, TEACHER_QUANTIZATIONS, teacher_ladder


def _folder(root, weight_bytes: int):
    root.mkdir()
    with open(root / "model.safetensors", "wb") as f:  # sparse: only its size is read
        f.truncate(weight_bytes)
    (root / "config.json").write_text("{}")
    return root


def test_a_large_teacher_skips_int8_dynamic_and_a_small_one_tries_it_first(tmp_path):
    """More than LARGE_TEACHER bytes of weights (all-MiniLM-L6-v2's 90 MB, a 109M MPNet's 438 MB): int8 first, the
    rung int8-dynamic fell to for both; at or under it, the whole ladder in order."""
    small, large = _folder(tmp_path / "small", LARGE_TEACHER), _folder(tmp_path / "large", LARGE_TEACHER + 1)
    assert teacher_ladder(small) == TEACHER_QUANTIZATIONS == ("int8-dynamic", "int8", "fp16", "none")
    assert teacher_ladder(large) == ("int8", "fp16", "none")


def test_a_large_teachers_rung_measures_its_parity_on_fewer_sentences(tmp_path, monkeypatch):
    """A teacher over LARGE_TEACHER, whose ladder starts at weight-only int8 (far above the bar on every teacher
    measured), has each rung's parity measured on LARGE_TEACHER_CHECK sentences; a small one on TEACHER_CHECK."""
    import sharebert.export as export
    from sharebert.pipelines.teacher_pass import LARGE_TEACHER_CHECK, TEACHER_CHECK, export_rung

    asked = []
    monkeypatch.setattr(export, "export_model", lambda folder, out, **k: asked.append((folder.name, k["check_limit"])))
    for name, size in (("small", LARGE_TEACHER), ("large", LARGE_TEACHER + 1)):
        export_rung(_folder(tmp_path / name, size), tmp_path / "out", "feature-extraction", "int8")
    assert asked == [("small", TEACHER_CHECK), ("large", LARGE_TEACHER_CHECK)] and LARGE_TEACHER_CHECK < TEACHER_CHECK
