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
