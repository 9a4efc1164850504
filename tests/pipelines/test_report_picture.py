"""compress's report.png (pipelines/picture.plot_report) from a report dict: a PNG that reads at 1,200 pixels wide
for an embedding report (cost, quality, calibration, verdict, CPU), a classifier report (one quality row) and a
report of the first layout (quality one dict, no CPU); without matplotlib, no picture and no failure."""

import sys

import pytest
from pictures import assert_readable_png

from sharebert.pipelines.picture import plot_report
from sharebert_runtime.cpu import cpu_info

COST = dict(peak_rss_bytes=232_665_088, added_rss_bytes=99_598_336, p50_ms_16=10.86, p50_ms_128=45.5)


def _embedding() -> dict:
    """The shape of a compress run's report.json (all-MiniLM-L6-v2, 40 steps), its figures rounded."""
    return {
        "teacher": dict(
            folder="/x/model",
            name="all-MiniLM-L6-v2",
            learned_params=22_713_216,
            file_bytes=90_868_376,
            artifact_bytes=23_070_318,
            first_answer_ms=757.7,
            agreement_cosine=1.0,
            search_top1=1.0,
            sts_spearman=0.867,
            **COST,
        ),
        "student": dict(
            folder="/x/out/student",
            shape="ShareBERT F=64 V=256 N=4 I=256 heads=4 standard",
            learned_params=2_162_816,
            file_bytes=2_709_996,
            peak_rss_bytes=66_490_368,
            added_rss_bytes=11_075_584,
            p50_ms_16=1.94,
            p50_ms_128=10.12,
            first_answer_ms=400.9,
            agreement_cosine=0.269,
            search_top1=0.514,
            sts_spearman=0.660,
        ),
        "quality": [
            {
                "label": "mean cosine to the teacher's vector (600 held-out WikiText-2 sentences)",
                "key": "agreement_cosine",
            },
            {
                "label": "top-1 search answer agreement with the teacher (35 queries over 105 sentences)",
                "key": "search_top1",
            },
            {"label": "STS-B dev Spearman (all 1500 pairs)", "key": "sts_spearman"},
        ],
        "calibration": {
            "unrelated": {
                "teacher": 0.055,
                "student": 0.513,
                "measured_on": "600 pairs of unrelated held-out sentences",
            },
            "related": {"teacher": 0.839, "student": 0.907, "measured_on": "the 388 pairs of the gold's top quarter"},
        },
        "verdict": {
            "lines": [
                "Verdict: NOT usable for search: the student gives the teacher's top-1 answer on 18 of 35 "
                "search queries (usable from 0.90); mean cosine to the teacher's vectors 0.269."
            ]
        },
        "cpu": cpu_info(),
        "summary": "...",
    }


def _classifier() -> dict:
    """A CoLA classifier's report: Matthews correlation, which an untrained student can take below 0."""
    student = {k: v / 4 for k, v in COST.items()}
    return {
        "teacher": dict(
            folder="/x/bert-cola", learned_params=4_400_000, artifact_bytes=4_500_000, **COST, glue_dev=0.31
        ),
        "student": dict(
            folder="/x/out/student",
            shape="F=32 V=128 N=2",
            learned_params=900_000,
            file_bytes=1_100_000,
            **student,
            glue_dev=-0.05,
        ),
        "quality": [{"label": "CoLA dev matthews_correlation (1043 examples)", "key": "glue_dev"}],
        "summary": "...",
    }


def _first_layout() -> dict:
    r = _classifier()
    return {**r, "quality": r["quality"][0]}


@pytest.mark.parametrize("report", [_embedding, _classifier, _first_layout], ids=lambda f: f.__name__.strip("_"))
def test_report_picture_reads_at_full_width(tmp_path, report):
    path = plot_report(report(), tmp_path / "report.png")
    assert path == tmp_path / "report.png"
    assert_readable_png(path)


def test_without_matplotlib_the_run_keeps_going_without_a_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert plot_report(_embedding(), tmp_path / "report.png") is None
    assert list(tmp_path.iterdir()) == []
