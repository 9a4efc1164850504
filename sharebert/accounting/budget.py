"""Budget search: ShareBERT and dense BERT-style configurations under parameter, byte, RAM and FLOP limits.

Candidates are plain config dicts scored analytically (``accounting``); no model is built. Metrics
per candidate (backbone, ``head='none'``): learned parameters, bytes stored and RAM at load
(learned + generated weights) at the chosen dtype, and inference GFLOPs at the given sequence length.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from .counts import DTYPE_BYTES, as_shape, count_flops, count_params

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> float:
    """``"10M"`` -> 1e7, ``"20MB"`` -> 2e7, ``"1.5G"`` -> 1.5e9, ``"64MiB"`` -> 64 * 2**20."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(
            f"cannot read size {text!r}: use a number with an optional k/M/G/T suffix, e.g. 10M, 20MB, 1.5G"
        )
    number, prefix, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    power = "kmgt".index(prefix) + 1 if prefix else 0
    return number * (1024 if binary else 1000) ** power


def human(x: float) -> str:
    """``1e7`` -> ``"10M"``, ``2.5e7`` -> ``"25M"``, ``0.44`` -> ``"0.44"`` (the suffixes ``parse_size`` reads)."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


# The fields the counts depend on: candidates equal on these are one candidate.
_COUNTED_FIELDS = (
    "vocab_size",
    "word_embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "max_position_embeddings",
    "type_vocab_size",
    "sharing",
    "share_layers",
    "attention",
    "qk_share_ratio",
    "norm_position",
    "pooler",
    "mlm_head",
)


def candidate_configs(vocab_size: int = 30528) -> list[dict]:
    """ShareBERT (VEPS) grid over F, V, N, I, heads, attention, and dense BERT baselines, plus the paper's presets."""
    from ..model.shape import PRESETS

    # the presets at the teacher's vocabulary (their own is 30,528 rows): counted with the table the student gets,
    # and only those that build with it (a cut vocabulary's table may be too small a source for a preset's layers)
    out = [
        (name, c)
        for name, c in ((n, dict(p, vocab_size=vocab_size)) for n, p in PRESETS.items() if not p.get("is_decoder"))
        if _builds(c)
    ]
    common = dict(
        vocab_size=vocab_size,
        max_position_embeddings=128,
        type_vocab_size=2,
        share_layers=None,
        qk_share_ratio=0.5,
        mlm_head="tied",
        is_decoder=False,
    )
    for F, V, N, ratio, head_dim, att in itertools.product(
        (16, 32, 64, 128, 256, 384, 768),
        (256, 512, 768, 1024, 2048),
        (4, 6, 8, 12),
        (1, 2, 4),
        (64, 128),
        ("standard", "symmetric", "shared-qkv"),
    ):
        c = dict(
            common,
            embedding_size=F,
            hidden_size=V,
            num_hidden_layers=N,
            intermediate_size=ratio * V,
            num_attention_heads=V // head_dim,
            attention=att,
            sharing="veps",
            pooler="generated",
            norm_position="pre",
        )
        if F < V and as_shape(c).columns_used() <= V:
            out.append(("sharebert", c))
    for H, N, att in itertools.product(
        (128, 256, 384, 512, 768), (2, 4, 6, 12), ("standard", "symmetric", "shared-qkv")
    ):
        out.append(
            (
                "bert",
                dict(
                    common,
                    embedding_size=None,
                    hidden_size=H,
                    num_hidden_layers=N,
                    intermediate_size=4 * H,
                    num_attention_heads=max(1, H // 64),
                    attention=att,
                    sharing="none",
                    pooler="dense",
                    norm_position="post",
                ),
            )
        )
    seen, unique = set(), []
    for name, c in out:  # a grid point equal to a preset keeps the preset's name
        s = as_shape(c)
        key = tuple(getattr(s, field) for field in _COUNTED_FIELDS)
        if key not in seen:
            seen.add(key)
            unique.append((name, c))
    return unique


def _builds(config: dict) -> bool:
    """Whether a config dict is a valid shape (``ModelShape.validate``: the EPS column budget among its checks)."""
    try:
        as_shape(config).validate()
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Candidate:
    name: str  # preset name, or "sharebert" / "bert" for grid points
    config: dict
    params: int
    stored_bytes: int
    ram_bytes: int
    gflops: float

    @property
    def is_preset(self) -> bool:
        from ..model.shape import PRESETS

        return self.name in PRESETS

    def describe(self) -> str:
        s = as_shape(self.config)
        sizes = f"N={s.num_hidden_layers} I={s.intermediate_size} heads={s.num_attention_heads}"
        shape = (
            f"F={s.word_embedding_size} V={s.hidden_size} {sizes}"
            if s.sharing != "none"
            else f"H={s.hidden_size} {sizes}"
        )
        kind = "ShareBERT" if s.sharing == "veps" else ("BERT+EPS" if s.sharing == "eps" else "BERT")
        return f"{kind} {shape} {s.attention}"


def score(configs, dtype: str = "fp32", seq_len: int = 128) -> list[Candidate]:
    k = DTYPE_BYTES[dtype]
    out = []
    for name, c in configs:
        n = count_params(c)
        out.append(
            Candidate(
                name,
                c,
                n["learned_params"],
                n["learned_params"] * k,
                (n["learned_params"] + n["generated_params"]) * k,
                count_flops(c, seq_len=seq_len)["inference"] / 1e9,
            )
        )
    return out


LIMITS = {
    "max_params": ("learned parameters", "params"),
    "max_bytes": ("bytes stored", "stored_bytes"),
    "max_ram": ("RAM at load", "ram_bytes"),
    "max_gflops": ("GFLOPs per forward", "gflops"),
}


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Candidates no other candidate beats on (params, RAM at load, GFLOPs): sorted by params, largest first.

    More parameters is better (capacity), less RAM and fewer GFLOPs are better.
    """

    def key(c):
        return (-c.params, c.ram_bytes, c.gflops)

    front = []
    for c in sorted(cands, key=key):
        if not any(
            o.params >= c.params and o.ram_bytes <= c.ram_bytes and o.gflops <= c.gflops and key(o) != key(c)
            for o in front
        ):
            front.append(c)
    return front


def search_candidates(limits: dict, dtype: str = "fp32", seq_len: int = 128, models: dict | None = None) -> dict:
    """``{"front", "feasible", "total", "presets", "all", "blocking", "seq_len"}``: ``presets`` the feasible paper
    presets, ``blocking`` why nothing fits.

    ``limits`` maps ``max_params`` / ``max_bytes`` / ``max_ram`` / ``max_gflops`` to a number (or None).
    ``models``: ``{name: config dict}`` of the user's own models (``budget --model``), placed among the candidates.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    limits = {k: v for k, v in limits.items() if v is not None}
    cands = score(candidate_configs(), dtype, seq_len) + score(list((models or {}).items()), dtype, seq_len)

    def fits(c, skip=None):
        return all(getattr(c, LIMITS[k][1]) <= v for k, v in limits.items() if k != skip)

    feasible = [c for c in cands if fits(c)]
    blocking = None
    if not feasible:
        reasons = []
        for k, v in limits.items():
            label, attr = LIMITS[k]
            smallest = min(getattr(c, attr) for c in cands)
            if smallest > v:
                reasons.append(
                    f"{label} <= {human(v)} rules out every candidate on its own: the smallest needs "
                    f"{human(smallest)} ({smallest / v:.2f}x the limit)"
                )
                continue
            others = [c for c in cands if fits(c, skip=k)]
            if others:
                need = min(getattr(c, attr) for c in others)
                reasons.append(
                    f"{label} <= {human(v)}: the candidates within the other limits need at least "
                    f"{human(need)} ({need / v:.2f}x the limit)"
                )
        blocking = "no configuration fits. " + (
            "; ".join(reasons) or "no single limit rules everything out: only the limits together do; relax any of them"
        )
    return {
        "front": pareto_front(feasible),
        "feasible": len(feasible),
        "total": len(cands),
        "presets": [c for c in feasible if c.is_preset],
        "all": cands,
        "fits": [fits(c) for c in cands],
        "limits": limits,
        "dtype": dtype,
        "blocking": blocking,
        "seq_len": seq_len,
    }


def _clusters(rows: list[dict], ratio: float = 1.12) -> list[list[dict]]:
    """Reference methods grouped where their sizes are within ``ratio`` of each other (one line, one label)."""
    groups: list[list[dict]] = []
    for row in sorted(rows, key=lambda r: r["params"]):
        if groups and row["params"] <= groups[-1][0]["params"] * ratio:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def plot(result: dict, path: str) -> None:
    """Candidates by learned parameters and GFLOPs: inside the limits in colour, outside faded, the limits
    drawn, the front highlighted, paper presets starred; ShareBERT Table 1 methods as lettered lines with
    their key beside the plot (methods of about one size share a line, so no label covers another)."""
    from .picture import figure, save, wrap
    from .picture import headline as headline_at

    headline, key = _plot_title(result)
    headline = wrap(headline, 85)  # 14-pt bold: about 85 characters to the picture's edge
    extra = 0.3 * headline.count("\n")  # inches for each further line of the headline
    with figure(7.2 + extra, layout=None) as (fig, [[ax]]):
        top = 1 - (1.0 + extra) / fig.get_figheight()  # an inch above the axes: the headline and the key's two lines
        fig.subplots_adjust(left=0.075, right=0.66, top=top, bottom=0.09)  # the right third: the key and legend
        _plot_candidates(ax, result)
        _plot_limits(ax, result.get("limits", {}), DTYPE_BYTES[result.get("dtype", "fp32")])
        _plot_methods(fig, ax)
        ax.set_xlabel("learned parameters (millions, backbone)")
        ax.set_ylabel(f"GFLOPs per forward (batch 1, seq {result.get('seq_len', 128)})")
        ax.set_title(key, pad=18)
        # beside the axes: never over a point; markers larger than the grid's dots, so each colour is seen
        legend = ax.legend(loc="lower left", bbox_to_anchor=(1.01, 0.0), frameon=False, markerscale=2)
        for handle in legend.legend_handles:  # the faded dots' key stays visible
            handle.set_alpha(max(handle.get_alpha() or 1.0, 0.3))
        headline_at(fig, headline, x=0.075)  # over the axes' left edge
        save(fig, path)


def _plot_candidates(ax, result: dict) -> None:
    """The grids (inside the limits in colour, outside faded), the front, and the paper's presets as stars."""
    cands, fits = result["all"], result["fits"]
    for kind, color, name in (("veps", "tab:blue", "ShareBERT grid"), ("none", "tab:gray", "dense BERT grid")):
        for inside in (True, False):
            pts = [c for c, ok in zip(cands, fits) if ok == inside and not c.is_preset and c.config["sharing"] == kind]
            ax.scatter(
                [c.params / 1e6 for c in pts],
                [c.gflops for c in pts],
                s=7,
                color=color,
                alpha=0.45 if inside else 0.07,
                label=f"{name}, {'within' if inside else 'outside'} the limits",
            )
    front = result["front"]
    ax.scatter(
        [c.params / 1e6 for c in front],
        [c.gflops for c in front],
        s=22,
        color="tab:orange",
        zorder=3,
        label="Pareto front within the limits",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(c.params for c in cands) / 1e6 * 0.8, max(c.params for c in cands) / 1e6 * 2.2)  # room for labels
    ax.set_ylim(min(c.gflops for c in cands) * 0.7, max(c.gflops for c in cands) * 1.6)
    _plot_presets(ax, cands, fits)


def _plot_presets(ax, cands, fits) -> None:
    """ShareBERT Table 2's presets as stars (hollow: outside the limits), each labelled."""
    from .counts import published

    table2 = published()["table2"]["rows"]
    stars = [(c, ok) for c, ok in zip(cands, fits) if c.name in table2]
    for c, ok in stars:
        ax.scatter(
            c.params / 1e6,
            c.gflops,
            marker="*",
            s=130,
            zorder=4,
            color="tab:red" if ok else "white",
            edgecolors="tab:red",
        )
    _label_without_overlap(ax, [(c.name, c.params / 1e6, c.gflops) for c, _ in stars])


def _plot_limits(ax, limits: dict, dtype_bytes: int) -> None:
    """The limits as dashed lines, the outside shaded. Learned parameters are the x axis, and bytes stored are
    parameters x bytes per number: both are vertical lines."""
    for x in [limits[n] / d for n, d in (("max_params", 1), ("max_bytes", dtype_bytes)) if n in limits]:
        ax.axvline(x / 1e6, color="tab:red", ls="--", lw=1.2)
        ax.axvspan(x / 1e6, 1e4, color="tab:red", alpha=0.04)
    if "max_gflops" in limits:
        ax.axhline(limits["max_gflops"], color="tab:red", ls="--", lw=1.2)
        ax.axhspan(limits["max_gflops"], 1e6, color="tab:red", alpha=0.04)


def _plot_methods(fig, ax) -> None:
    """ShareBERT Table 1's methods as lettered green lines, their key beside the plot."""
    from .counts import published

    key = []
    for letter, group in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", _clusters(published()["compression_methods"]["rows"])):
        x = sum(r["params"] for r in group) / len(group) / 1e6
        ax.axvline(x, color="tab:green", alpha=0.35, lw=0.9)
        ax.text(
            x,
            1.01,
            letter,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            color="tab:green",
            fontweight="bold",
        )
        key.append(
            f"{letter}  " + "; ".join(f"{r['label']} {r['params'] / 1e6:.3g}M ({r['relative_perf']}%)" for r in group)
        )
    fig.text(
        0.675,
        ax.get_position().y1,  # level with the axes' top
        "ShareBERT Table 1 methods (green lines;\nrelative GLUE score vs BERT Base):\n\n"
        + "\n".join(_wrap(k, 44) for k in key),
        fontsize=9,
        va="top",
        family="monospace",
    )


def _plot_title(result: dict) -> tuple[str, str]:
    """``(headline, key)``: how many candidates fit which limits; what was counted, and what the lines and stars
    are."""
    limits = result.get("limits", {})
    shown = {"max_params": "params", "max_bytes": "bytes", "max_gflops": "GFLOPs"}
    words = [f"{LIMITS[k][0]} <= {human(v)}" for k, v in limits.items()]
    drawn = " and ".join(shown[k] for k in limits if k in shown)
    dashes = f"red dashes: the {drawn} limit{'s' if ' and ' in drawn else ''} (shaded: outside); " if drawn else ""
    return (
        f"sharebert budget: {result['feasible']:,} of {result['total']:,} candidates within "
        f"{', '.join(words) or 'no limits'} ({result.get('dtype', 'fp32')})",
        "counted from each candidate's config (GFLOPs with the weights materialised; no model run)\n"
        f"{dashes}stars: ShareBERT Table 2 presets (hollow: outside the limits)",
    )


def _label_without_overlap(ax, points: list[tuple[str, float, float]], fontsize: int = 10) -> None:
    """Annotate each ``(text, x, y)`` at the first offset around it whose box meets no earlier label's box."""
    dpi = ax.figure.dpi
    char, line = fontsize * 0.62 * dpi / 72, fontsize * 1.3 * dpi / 72  # pixels per character and per line
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 15), (5, -22), (-5, 15), (-5, -22)]
    placed = []
    for text, x, y in sorted(points, key=lambda p: (p[1], p[2])):
        px, py = ax.transData.transform((x, y))
        for dx, dy in offsets:
            left = px + dx * dpi / 72 - (len(text) * char if dx < 0 else 0)
            box = (left, py + dy * dpi / 72, left + len(text) * char, py + dy * dpi / 72 + line)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(
            text,
            (x, y),
            fontsize=fontsize,
            zorder=5,
            textcoords="offset points",
            xytext=(dx, dy),
            ha="right" if dx < 0 else "left",
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},  # read over the dots
        )


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n   ".join(textwrap.wrap(text, width))


def student_for(
    teacher: dict, limits: dict, seq_len: int = 128, num_labels: int | None = None
) -> tuple[Candidate, int]:
    """``(candidate, head parameters)``: the ShareBERT student ``sharebert compress`` trains for a teacher (its
    config fields: ``vocab_size``, ``hidden_size`` H, ``num_hidden_layers`` L) under ``limits`` (``max_params``,
    ``max_bytes`` at int8), counting the head the student keeps: the V -> H output projection of a narrower
    embedding student, or a classifier's V -> ``num_labels`` layer.

    Among VEPS candidates with standard attention, V <= H and at most L layers (no pooler: the sentence vector
    is pooled from token states): the widest word embeddings F (their table is the teacher's, reduced), then
    the fewest GFLOPs. ``ValueError`` naming the smallest need when none fits. The student has ``max_length``
    positions where the teacher dict gives it (``compress``: the teacher's maximum length, so the student reads
    what its teacher reads), else 128; they are counted.
    """
    H = int(teacher["hidden_size"])
    cands = score(_student_configs(teacher), "int8", seq_len)
    out_width = H if num_labels is None else num_labels

    def head(c) -> int:
        return 0 if num_labels is None and c.config["hidden_size"] == H else (c.config["hidden_size"] + 1) * out_width

    fits = _fitting(cands, limits, lambda c: c.params + head(c), teacher)
    best = max(fits, key=lambda c: (c.config["embedding_size"], -c.gflops, c.params))
    return best, head(best)


def _student_configs(teacher: dict) -> list[tuple[str, dict]]:
    """The VEPS candidates with standard attention, no wider than the teacher and with at most its layers (4 at
    least), at the teacher's positions with no pooler; ``ValueError`` when there are none."""
    H, L = int(teacher["hidden_size"]), int(teacher["num_hidden_layers"])
    positions = int(teacher.get("max_length") or 128)
    shaped = [
        (n, {**c, "pooler": "none", "max_position_embeddings": positions})
        for n, c in candidate_configs(int(teacher["vocab_size"]))
        if c["sharing"] == "veps"
        and c.get("attention", "standard") == "standard"
        and c["num_hidden_layers"] <= max(L, 4)
        and c["max_position_embeddings"] == 128
    ]
    if not shaped:  # a ShareBERT generates its layers' weights from its word table: a few hundred rows source none
        raise ValueError(
            f"no ShareBERT student builds on a {teacher['vocab_size']}-row word table: its layers' "
            "weights are generated from that table, and it is too small a source"
        )
    configs = [(n, c) for n, c in shaped if c["hidden_size"] <= H]
    if not configs:
        narrowest = min(c["hidden_size"] for _, c in shaped)
        raise ValueError(
            f"no ShareBERT student is as narrow as this teacher (hidden_size {H}); the narrowest "
            f"candidate has hidden_size {narrowest}"
        )
    return configs


def _fitting(cands: list, limits: dict, total, teacher: dict) -> list:
    """The candidates whose ``total`` parameters (head included) are within ``max_params`` and ``max_bytes``;
    ``ValueError`` naming the smallest one's when none is."""
    fits = [
        c
        for c in cands
        if all(total(c) <= v for k, v in limits.items() if v is not None and k in ("max_params", "max_bytes"))
    ]
    if not fits:
        smallest = min(cands, key=total)
        stated = ", ".join(f"{k.replace('_', '-')} {human(v)}" for k, v in limits.items() if v is not None)
        raise ValueError(
            f"no ShareBERT student fits under {stated}: the smallest for this teacher's vocabulary "
            f"({teacher['vocab_size']} tokens) has {human(total(smallest))} learned parameters "
            f"({human(total(smallest))}B at int8)"
        )
    return fits
