"""The papers' evaluations: GLUE dev metrics, word similarity and analogy, noise robustness, cross-domain.

- ``evaluate_glue(model_dir, task)``: dev metrics of a fine-tuned classifier (MNLI: matched and mismatched).
- ``word_similarity(model, tokenizer)``: Spearman between embedding cosines and human scores.
- ``word_analogy(model, tokenizer)``: 3CosAdd accuracy on the Google analogy set.
  Both use single-token words only and count the pairs/questions skipped as out-of-vocabulary
  (the tokenizer gives [UNK]) or multi-token (WordPiece splits the word); VEPS models are scored on
  their virtual embeddings ``A @ P + p`` (width V), other models on their word embeddings.
- ``noise_robustness(model_dir, task)``: Kowsher Table 5. Gaussian noise ``N(0, s^2 I)`` is added to
  every input embedding with ``s = level * mean_norm / sqrt(d)``, so the noise norm is about
  ``level`` times the mean L2 norm of the eval set's input embeddings (d = embedding width).
- ``cross_domain({task: model_dir})``: Kowsher Table 6, accuracy of each model on each other task
  whose labels it can name (same label space; MNLI's contradiction/neutral count as not_entailment).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ..formats.bars import bar
from ..formats.model_folder import load_config, load_model, load_tokenizer
from ..formats.paths import data_path
from .arguments import MULTI_TOKEN, NOISE_LEVELS, WORDSIM_SETS
from .encoded import encode, evaluate_split, label_map, mean_embedding_norm
from .glue import TASKS, GlueTask, get_task, read_split

# ---------------------------------------------------------------- classification


def load_finetuned(model_dir: str | Path):
    """A fine-tuned ``ShareBertForSequenceClassification`` (eval mode, on GPU when present) and its tokenizer."""
    from ..model.modeling_sharebert import ShareBertForSequenceClassification

    config = load_config(model_dir)
    if "ShareBertForSequenceClassification" not in (config.architectures or []):
        raise ValueError(
            f"{model_dir} holds a {', '.join(config.architectures or ['bare'])} model, not a fine-tuned "
            f"classifier; run `sharebert finetune` first"
        )
    tokenizer = load_tokenizer(model_dir, config.vocab_size, needs=("pad",))
    model = load_model(ShareBertForSequenceClassification, model_dir, config)[0]
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval(), tokenizer


def _dev_sets(task: GlueTask, data_dir, tokenizer, config, max_eval_samples, progress):
    data_dir = Path(data_dir) if data_dir is not None else data_path("glue", task.folder)
    seq_len = min(128, config.max_position_embeddings)
    return {
        s: encode(read_split(task, data_dir, s).head(max_eval_samples), tokenizer, seq_len, progress=progress)
        for s in task.dev_splits
    }


def evaluate_glue(
    model_dir: str | Path,
    task: str,
    data_dir: str | Path | None = None,
    max_eval_samples: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> dict[str, float]:
    """Dev metrics of a fine-tuned model; MNLI's mismatched set adds ``<metric>_mismatched`` keys."""
    task_ = get_task(task)
    model, tokenizer = load_finetuned(model_dir)
    label_map(model.config, task_)  # fail before reading data when the model was trained for another space
    out = {}
    for i, ds in enumerate(_dev_sets(task_, data_dir, tokenizer, model.config, max_eval_samples, progress).values()):
        scores = evaluate_split(model, ds, task_, batch_size, progress=progress)
        out.update({k + ("" if i == 0 else "_mismatched"): v for k, v in scores.items()})
        out.setdefault("eval_samples", len(ds))
    return out


def noise_robustness(  # 8: the public call: `sharebert evaluate noise`'s options as keywords, batch size, progress
    model_dir: str | Path,
    task: str,
    data_dir: str | Path | None = None,
    levels=NOISE_LEVELS,
    max_eval_samples: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Kowsher Table 5: ``{"task", "mean_norm", "rows": [{"level", <metrics>}...]}`` on the (first) dev set."""
    task_ = get_task(task)
    model, tokenizer = load_finetuned(model_dir)
    ds = next(iter(_dev_sets(task_, data_dir, tokenizer, model.config, max_eval_samples, progress).values()))
    norm = mean_embedding_norm(model, ds)
    rows = []
    for level in bar(levels, desc="noise levels", progress=progress):
        if not 0 <= level <= 1:
            raise ValueError(f"noise level {level} is outside 0..1 (a fraction of the mean embedding norm)")
        rows.append(
            {"level": float(level), **evaluate_split(model, ds, task_, batch_size, level, norm, seed, progress=False)}
        )
    return {"task": task_.name, "mean_norm": norm, "eval_samples": len(ds), "rows": rows}


def cross_domain(
    models: dict[str, str | Path],
    data_dirs: dict[str, str | Path] | None = None,
    max_eval_samples: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> dict:
    """Kowsher Table 6: ``{"tasks", "matrix": {trained_on: {evaluated_on: accuracy or None}}}``.

    A cell is None when the model's labels do not fit the evaluated task's label space.
    """
    models = {get_task(t).name: d for t, d in models.items()}
    data_dirs = {get_task(t).name: d for t, d in (data_dirs or {}).items()}
    tasks = list(models)
    loaded = {t: load_finetuned(d) for t, d in models.items()}
    for t, (model, _) in loaded.items():
        try:
            label_map(model.config, TASKS[t])
        except ValueError as e:
            raise ValueError(f"the model given for {t} ({models[t]}) was not trained on {t}'s labels: {e}") from None
    matrix = {}
    for train_task, (model, tokenizer) in loaded.items():
        row = {}
        for eval_task in tasks:
            task = TASKS[eval_task]
            try:
                label_map(model.config, task)
            except ValueError:
                row[eval_task] = None
                continue
            ds = next(
                iter(
                    _dev_sets(
                        task, data_dirs.get(eval_task), tokenizer, model.config, max_eval_samples, progress
                    ).values()
                )
            )
            metric = task.main_metric if task.is_regression else "accuracy"
            row[eval_task] = evaluate_split(model, ds, replace(task, metrics=(metric,)), batch_size, progress=progress)[
                metric
            ]
        matrix[train_task] = row
    return {"tasks": tasks, "matrix": matrix}


# ---------------------------------------------------------------- embeddings


def embedding_matrix(model) -> torch.Tensor:
    """``(E, d)`` embeddings the papers evaluate: virtual ``A @ P + p`` for VEPS, else the word embeddings."""
    base = getattr(model, "sharebert", model)
    with torch.no_grad():
        return base.virtual_embeddings().detach().float().cpu()


def word_ids(tokenizer, word: str) -> tuple[list[int], str]:
    """The word's token ids and ``"ok"`` (one token), ``"multi"`` (several) or ``"oov"`` (``[UNK]``, no ids)."""
    pieces = tokenizer.tokenize(word)
    if not pieces or tokenizer.unk_token in pieces:
        return [], "oov"
    return tokenizer.convert_tokens_to_ids(pieces), "ok" if len(pieces) == 1 else "multi"


def word_vector(emb: torch.Tensor, ids: list[int], status: str, multi_token: str) -> torch.Tensor | None:
    """Unit vector of a word in the embedding space of single tokens: its row, or for a split word the mean
    (``mean``) or first (``first``) of its pieces' rows; None when it is skipped (``oov``, or ``skip``)."""
    if status == "oov" or (status == "multi" and multi_token == "skip"):
        return None
    v = emb[ids].mean(0) if multi_token == "mean" else emb[ids[0]]
    return torch.nn.functional.normalize(v, dim=-1)


def _skip_reason(status: list[str], multi_token: str) -> str:
    return "oov" if "oov" in status else "multi" if "multi" in status and multi_token == "skip" else "ok"


def read_wordsim(path: str | Path, columns: tuple[int, int, int] = (0, 1, 2)) -> list[tuple[str, str, float]]:
    """``(word1, word2, score)`` rows of a tab/space-separated file; ``#`` lines are comments."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"word-similarity file not found: {path}")
    a, b, s = columns
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()
            try:
                rows.append((fields[a], fields[b], float(fields[s])))
            except (IndexError, ValueError):
                raise ValueError(
                    f"{path}, line {lineno}: expected word1, word2 and a numeric score in fields {a}, {b}, {s}"
                ) from None
    if not rows:
        raise ValueError(f"{path}: no word pairs")
    return rows


def word_similarity(model, tokenizer, sets: list[str] | None = None, multi_token: str = "mean") -> dict[str, dict]:
    """Spearman per set: ``{name: {"spearman", "pairs", "used", "used_multitoken", "skipped_oov",
    "skipped_multitoken"}}``.

    ``sets`` are names in :data:`WORDSIM_SETS` present under ``data/wordsim`` (default: all present) or
    paths to ``word1 word2 score`` files. ``multi_token``: how words WordPiece splits are scored
    (:data:`MULTI_TOKEN`; ``used_multitoken`` counts the pairs with such a word that were used).
    """
    if multi_token not in MULTI_TOKEN:
        raise ValueError(f"multi_token must be one of {', '.join(MULTI_TOKEN)}, got {multi_token!r}")
    if sets is None:
        sets = [n for n, spec in WORDSIM_SETS.items() if data_path("wordsim", spec[0]).is_file()]
    emb = embedding_matrix(model)
    results = {}
    for name in sets:
        if name in WORDSIM_SETS:
            rel, *cols = WORDSIM_SETS[name]
            rows = read_wordsim(data_path("wordsim", rel), tuple(cols))
        else:
            rows, name = read_wordsim(name), Path(name).stem
        counts = {"ok": 0, "oov": 0, "multi": 0, "used_multi": 0}
        sims, gold = [], []
        for w1, w2, score in rows:
            (i, s1), (j, s2) = word_ids(tokenizer, w1), word_ids(tokenizer, w2)
            reason = _skip_reason([s1, s2], multi_token)
            counts[reason] += 1
            if reason == "ok":
                sims.append(float(word_vector(emb, i, s1, multi_token) @ word_vector(emb, j, s2, multi_token)))
                gold.append(score)
                counts["used_multi"] += "multi" in (s1, s2)
        rho = float(stats.spearmanr(sims, gold)[0]) if len(sims) > 1 else float("nan")
        results[name] = {
            "spearman": rho,
            "pairs": len(rows),
            "used": counts["ok"],
            "used_multitoken": counts["used_multi"],
            "skipped_oov": counts["oov"],
            "skipped_multitoken": counts["multi"],
        }
    return results


def read_analogy(path: str | Path) -> list[tuple[str, tuple[str, str, str, str]]]:
    """``(section, (a, b, c, d))`` for each question ``a b c d`` (a:b = c:d) under ``: section`` lines."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"analogy file not found: {path}")
    section, out = "", []
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith(":"):
                section = line[1:].strip()
            elif line.strip():
                words = line.split()
                if len(words) != 4:
                    raise ValueError(f"{path}, line {lineno}: expected four words 'a b c d', got {len(words)}")
                out.append((section, tuple(words)))
    if not out:
        raise ValueError(f"{path}: no analogy questions")
    return out


def _candidate_ids(tokenizer, rows: int) -> torch.Tensor:
    """Whole-word vocabulary entries (no specials, [unusedN] or ## pieces) that have an embedding row."""
    special = set(tokenizer.all_special_tokens)
    ids = [
        i
        for t, i in tokenizer.get_vocab().items()
        if i < rows and t not in special and not t.startswith("##") and not (t.startswith("[") and t.endswith("]"))
    ]
    return torch.tensor(sorted(ids))


@torch.no_grad()
def word_analogy(  # 7: the public call: `sharebert evaluate analogy`'s options as keywords, batch size, progress
    model,
    tokenizer,
    path: str | Path | None = None,
    batch_size: int = 512,
    progress: bool = True,
    multi_token: str = "mean",
    max_questions: int | None = None,
) -> dict:
    """3CosAdd accuracy: ``d* = argmax_w cos(w, b - a + c)`` over whole-word tokens except a, b, c.

    ``a``, ``b``, ``c`` that WordPiece splits get vectors by ``multi_token`` (:data:`MULTI_TOKEN`); the
    answer ``d`` must be one token (the candidates are whole-word tokens), else the question is skipped.
    ``max_questions``: the first N questions of the file only (all by default).
    Returns ``{"accuracy", "questions", "used", "used_multitoken", "skipped_oov", "skipped_multitoken",
    "sections": {name: acc}}``.
    """
    if multi_token not in MULTI_TOKEN:
        raise ValueError(f"multi_token must be one of {', '.join(MULTI_TOKEN)}, got {multi_token!r}")
    questions = read_analogy(path or data_path("analogy", "questions-words.txt"))[:max_questions]
    emb = embedding_matrix(model)
    cand = _candidate_ids(tokenizer, emb.shape[0])
    cand_emb = torch.nn.functional.normalize(emb[cand], dim=-1)
    vectors, answers, excluded, used_sections, cache = [], [], [], [], {}
    counts = {"ok": 0, "oov": 0, "multi": 0, "used_multi": 0}
    for section, words in questions:
        looked = [cache.setdefault(w, word_ids(tokenizer, w)) for w in words]
        status = [st for _, st in looked]
        reason = _skip_reason(status, "skip" if status[3] == "multi" else multi_token)  # d must be one token
        counts[reason] += 1
        if reason == "ok":
            a, b, c = (word_vector(emb, ids, st, multi_token) for ids, st in looked[:3])
            vectors.append(b - a + c)
            answers.append(looked[3][0][0])
            excluded.append([ids[0] if st == "ok" else -1 for ids, st in looked[:3]])
            used_sections.append(section)
            counts["used_multi"] += "multi" in status
    correct = np.zeros(len(answers), dtype=bool)
    for s in bar(
        range(0, len(answers), batch_size), desc="analogy", progress=progress and len(answers) > batch_size, leave=False
    ):
        scores = torch.stack(vectors[s : s + batch_size]) @ cand_emb.T  # (B, |cand|)
        skip = torch.tensor(excluded[s : s + batch_size])
        for col in skip.unbind(-1):  # exclude the question words (those that are one token)
            scores[(cand[None, :] == col[:, None])] = -math.inf
        correct[s : s + len(skip)] = (cand[scores.argmax(-1)] == torch.tensor(answers[s : s + batch_size])).numpy()
    sections = {}
    for name in dict.fromkeys(used_sections):
        mask = np.array([u == name for u in used_sections])
        sections[name] = float(correct[mask].mean())
    return {
        "accuracy": float(correct.mean()) if len(answers) else float("nan"),
        "questions": len(questions),
        "used": counts["ok"],
        "used_multitoken": counts["used_multi"],
        "skipped_oov": counts["oov"],
        "skipped_multitoken": counts["multi"],
        "sections": sections,
    }


def load_any(model_dir: str | Path):
    """The backbone (``ShareBertModel``) of any ShareBERT model folder, for embedding evaluations, and its tokenizer."""
    from ..model.modeling_sharebert import ShareBertModel

    config = load_config(model_dir)
    tokenizer = load_tokenizer(model_dir, config.vocab_size, needs=("pad",))
    return load_model(ShareBertModel, model_dir, config, add_pooling_layer=False)[0].eval(), tokenizer
