"""GLUE TSV readers: the real staged files and synthetic files for the layouts not staged."""

from collections import Counter

import pytest

from sharebert.formats.paths import data_path
from sharebert.training.glue import TASKS, get_task, read_split

GLUE = data_path("glue")


@pytest.mark.parametrize(
    "task,split,rows,label_counts",
    [
        ("cola", "train", 8551, {1: 6023, 0: 2528}),
        ("cola", "dev", 1043, None),
        ("sst2", "train", 67349, {1: 37569, 0: 29780}),
        ("sst2", "dev", 872, None),
        ("stsb", "train", 5749, None),
        ("stsb", "dev", 1500, None),
        ("qnli", "dev", 5463, {0: 2702, 1: 2761}),  # entailment = class 0
    ],
)
def test_real_files(task, split, rows, label_counts):
    t = get_task(task)
    s = read_split(t, GLUE / t.folder, split)
    assert len(s) == len(s.text_a) == rows
    assert (s.text_b is not None) == (len(t.text_columns) == 2)
    if label_counts:
        assert dict(Counter(s.labels)) == label_counts
    if t.is_regression:
        assert all(0.0 <= y <= 5.0 for y in s.labels)
    assert all(a.strip() for a in s.text_a)


def test_real_first_rows():
    cola = read_split("cola", GLUE / "CoLA", "dev")
    assert cola.text_a[0] == "The sailors rode the breeze clear of the rocks." and cola.labels[0] == 1
    sts = read_split("stsb", GLUE / "STS-B", "dev")
    assert (sts.text_a[0], sts.text_b[0], sts.labels[0]) == (
        "A man with a hard hat is dancing.",
        "A man wearing a hard hat is dancing.",
        5.0,
    )
    qnli = read_split("qnli", GLUE / "QNLI", "dev")
    assert qnli.text_a[0].startswith("What came into force") and qnli.labels[:2] == [0, 1]


def _write(path, lines, bom=False, crlf=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("\r\n" if crlf else "\n").join(lines) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def test_mrpc_with_bom_and_crlf(tmp_path):
    _write(
        tmp_path / "train.tsv",
        [
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him as the witness .",
            "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's .",
        ],
        bom=True,
        crlf=True,
    )
    s = read_split("mrpc", tmp_path, "train")
    assert s.text_a == ["Amrozi accused his brother .", "Yucaipa owned Dominick 's ."]
    assert s.text_b[1] == "Yucaipa bought Dominick 's ." and s.labels == [1, 0]


def test_qqp_rte_wnli(tmp_path):
    _write(
        tmp_path / "QQP" / "dev.tsv",
        [
            "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "1\t3\t4\tHow do I cook rice?\tHow is rice cooked?\t1",
            "2\t5\t6\tWhat is AI?\tWho is Ada?\t0",
        ],
    )
    s = read_split("qqp", tmp_path / "QQP", "dev")
    assert s.text_b == ["How is rice cooked?", "Who is Ada?"] and s.labels == [1, 0]
    _write(
        tmp_path / "RTE" / "train.tsv",
        [
            "index\tsentence1\tsentence2\tlabel",
            "0\tA dog runs.\tAn animal moves.\tentailment",
            "1\tA dog runs.\tA cat sleeps.\tnot_entailment",
        ],
    )
    assert read_split("rte", tmp_path / "RTE", "train").labels == [0, 1]
    _write(
        tmp_path / "WNLI" / "train.tsv",
        [
            "index\tsentence1\tsentence2\tlabel",
            "0\tI put the cake in the box because it was small.\tThe box was small.\t0",
            "1\tThe cup fell because it was heavy.\tThe cup was heavy.\t1",
        ],
    )
    w = read_split("wnli", tmp_path / "WNLI", "train")
    assert [TASKS["wnli"].label_names[y] for y in w.labels] == ["not_entailment", "entailment"]


def test_mnli_matched_and_mismatched(tmp_path):
    head = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
    ]
    train = head + ["label1", "gold_label"]
    dev = head + ["label1", "label2", "label3", "label4", "label5", "gold_label"]
    row = ["0", "1", "1e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", "It rains.", "It is wet."]
    _write(tmp_path / "train.tsv", ["\t".join(train), "\t".join(row + ["entailment", "entailment"])])
    for name, gold in (("dev_matched", "neutral"), ("dev_mismatched", "contradiction")):
        _write(tmp_path / f"{name}.tsv", ["\t".join(dev), "\t".join(row + ["neutral"] * 5 + [gold])])
    task = get_task("MNLI")
    assert task.dev_splits == ("dev_matched", "dev_mismatched")
    assert read_split(task, tmp_path, "train").labels == [task.label_names.index("entailment")]
    assert read_split(task, tmp_path, "dev_matched").labels == [task.label_names.index("neutral")]
    mm = read_split(task, tmp_path, "dev_mismatched")
    assert mm.text_a == ["It rains."] and mm.text_b == ["It is wet."] and mm.labels == [0]


def test_errors_name_file_line_and_layout(tmp_path):
    p = _write(tmp_path / "train.tsv", ["sentence\tlabel", "good movie\t1", "bad movie"])
    with pytest.raises(ValueError, match=r"train\.tsv, line 3: 1 fields, expected 2.*\['sentence', 'label'\]"):
        read_split("sst2", tmp_path, "train")
    _write(p, ["text\tlabel", "good movie\t1"])
    with pytest.raises(ValueError, match=r"line 1: header .* lacks \['sentence'\]"):
        read_split("sst2", tmp_path, "train")
    _write(p, ["sentence\tlabel", "good movie\tpositive"])
    with pytest.raises(ValueError, match=r"line 2: label 'positive' is not one of \['0', '1'\]"):
        read_split("sst2", tmp_path, "train")
    _write(p, ["gj04\t1\tgood sentence ."])  # CoLA needs four fields, no header
    with pytest.raises(ValueError, match=r"line 1: 3 fields, expected 4"):
        read_split("cola", tmp_path, "train")
    _write(p, ["index\tsentence1\tsentence2\tscore", "0\ta\tb\thigh"])
    with pytest.raises(ValueError, match=r"line 2: score 'high' is not a number"):
        read_split("stsb", tmp_path, "train")
    for score in ("5.5", "-0.1", "nan", "inf"):
        _write(p, ["index\tsentence1\tsentence2\tscore", f"0\ta\tb\t{score}"])
        with pytest.raises(ValueError, match=rf"line 2: score '{score}' is outside \[0, 5\]"):
            read_split("stsb", tmp_path, "train")
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_split("sst2", tmp_path, "train")
    _write(p, ["sentence\tlabel"])
    with pytest.raises(ValueError, match="no examples after the header"):
        read_split("sst2", tmp_path, "train")


def test_missing_files_and_tasks(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"did you mean --data-dir .*SST-2"):
        read_split("sst2", GLUE, "train")
    with pytest.raises(FileNotFoundError, match=r"QNLI/train\.tsv not found .*dev\.tsv"):
        read_split("qnli", GLUE / "QNLI", "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_split("rte", tmp_path / "RTE", "train")
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        get_task("squad")


def test_unlabelled_sentences_of_every_layout_come_from_the_text_fields():
    """``read_sentences`` (distillation's ``--train``) takes a .tsv's text by GLUE header names, or by CoLA's
    headerless layout: CoLA's first row is a sentence, not a header, and field 0 (its source code) is no text."""
    from sharebert.training.distill_sentences import read_sentences
    from sharebert.training.glue import text_fields

    assert text_fields(["\ufeffsentence1", "x", "sentence2"]) == ([0, 2], True)
    assert text_fields(["gj04", "1", "", "Some sentence."]) == ([3], False)
    assert text_fields(["id", "text"]) is None
    cola = read_sentences([data_path("glue", "CoLA", "train.tsv")])
    assert len(cola) == 8532 and cola[0].startswith("Our friends won't buy this analysis")
    qnli = read_sentences([data_path("glue", "QNLI", "dev.tsv")], limit=2)
    assert qnli[0].endswith("?") and not qnli[1].endswith("?")  # question, then its sentence
