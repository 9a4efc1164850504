"""``sharebert predict``: run an exported artifact on texts, a file or stdin (torch-free).

Input lines are plain text, or JSON objects ``{"text": ..., ...}`` (other keys such as ``id`` are
copied to the output; ``"text_pair"``, a string, is the second text of a pair for text-classification). Pairs
are recognised by content and the model (:func:`shaped`), never by the file's name: for a model trained on pairs (the
manifest's ``pairs``) a plain line ``text<TAB>text_pair`` is a pair. The rule: a line is a JSON record when it parses as
a JSON object with a ``"text"`` key (whose value must then be a string); any other line, ``{`` at its start or not, is
the text itself. Lines are read and answered in chunks of :data:`CHUNK_LINES` (at least ``--batch-size``),
so memory stays bounded for any input size; the runtime orders a chunk by token length into calls of
``--batch-size`` texts and answers in input order. A line that cannot be answered (not UTF-8, a
non-string ``"text"``, a result that is not finite) is reported on stderr with its number and
skipped; the run goes on and exits with status 1 at the end when any line was skipped (0 when all
were answered). Output: JSON lines ``{"line": n, "text": ..., "result": ...}`` in input order (strict JSON, never NaN;
``line`` and ``result`` are always predict's own (:data:`OWN_FIELDS`): a record's fields of those names are not copied,
said once on stderr); to ``--output`` through :func:`~sharebert_runtime.outdir.atomic_output`
(a hidden temporary file beside it renamed at the end; any failure, a full disk or a stopping signal included, removes
it and leaves an existing file as it was; a symbolic link is written through), or stdout;
texts given as arguments print readably. A line over :data:`~sharebert_runtime.textlines.MAX_LINE_BYTES` (1 MiB) ends
the run with an error naming it (an input without newlines, such as ``/dev/zero``, is not one text per line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from . import options as opt
from .errors import first_line
from .outdir import atomic_output
from .textlines import check_text_file, numbered_lines

OWN_FIELDS = ("line", "result")  # the output record's fields that predict writes; an input record's are not copied
CHUNK_LINES = 1024  # lines handed to the runtime at once: it groups texts of similar lengths within a chunk


def add_arguments(p):
    p.add_argument("artifact", help="artifact folder written by `sharebert export`")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to answer (or use --input)")
    p.add_argument(
        "--input",
        type=opt.path,
        metavar="FILE|-",
        help='one text (or JSON object with a "text" key) per line; - is stdin',
    )
    p.add_argument("--output", type=opt.path, metavar="FILE.jsonl", help="write JSON lines here (default: stdout)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per ONNX Runtime call (default: 32)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: ORT's choice)")
    from .runtime import RAM_MODES

    p.add_argument(
        "--ram",
        choices=RAM_MODES,
        default="auto",
        help="fp32: generated weights folded to fp32 at load; int8: held as int8, dynamic-int8 MatMuls "
        "(compact artifacts; about 4x less RAM for them); auto (default): int8 for a compact artifact "
        'whose weights are stored int8, else fp32 (docs/DEVICE.md "Memory")',
    )
    p.add_argument("--top-k", type=int, default=5, help="fill-mask: candidates per [MASK] (default: 5)")
    from .pooling import POOLING_MODES

    p.add_argument(
        "--pooling",
        choices=POOLING_MODES,
        default=None,
        help="feature-extraction: pool the token states this way instead of the artifact's recipe (which "
        "the manifest records: the model's sentence-transformers pooling, else cls); the recipe's Dense "
        "layers apply only to its own pooling",
    )
    p.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="feature-extraction: L2-normalise the vectors or not (default: as the recipe says)",
    )
    p.add_argument("--max-new-tokens", type=int, default=20, help="causal-lm: tokens to generate (default: 20)")
    p.add_argument("--json", action="store_true", help="print JSON lines even for TEXT arguments")
    p.add_argument("--pin", metavar="SHA256", help="refuse the artifact unless manifest.json has this sha256")
    p.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="K",
        help="run only the first K encoder layers (1..N; default all): faster, no extra memory",
    )


def _task_kwargs(runtime, args) -> dict:
    return {
        "fill-mask": {"top_k": args.top_k},
        "feature-extraction": {"pooling": args.pooling, "normalize": args.normalize},
        "causal-lm": {"max_new_tokens": args.max_new_tokens},
    }.get(runtime.task, {})


def _jsonable(result):
    if hasattr(result, "tolist"):
        return [round(float(x), 6) for x in result.tolist()]
    return result


def parse_line(raw: bytes) -> dict:
    """One input line -> ``{"text": str, ...}``: a JSON record, or the line itself as ``{"text": line}`` (marked
    ``PLAIN``, so :func:`shaped` may read its TAB as a pair's); raises ``ValueError`` saying what is wrong."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not line.lstrip().startswith("{"):
        return {"text": line, PLAIN: True}
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return {"text": line, PLAIN: True}  # text that happens to start with "{"
    if not isinstance(record, dict) or "text" not in record:
        return {"text": line, PLAIN: True}
    for key in ("text", "text_pair"):
        if key in record and not isinstance(record[key], str):
            raise ValueError(f'"{key}" must be a string, got {type(record[key]).__name__}')
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the JSON holds a lone surrogate escape (such as \\ud800), not a character") from None
    return record


PLAIN = object()  # the key marking a record made from a plain text line (never a JSON key: not a string)


def takes_pairs(task: str, pairs: bool | None) -> bool | None:
    """Whether a model answers sentence pairs: a text-classification artifact's manifest ``pairs`` (None: the
    export could not tell); every other task takes single texts (False)."""
    return pairs if task == "text-classification" else False


def shaped(record: dict, number: int, pairs: bool | None, said: dict) -> dict:
    """``record`` as the model takes it, decided by its content and the model (``pairs``, :func:`takes_pairs`),
    never by a file name. A plain line of two TAB-separated columns is a pair (text, text_pair) for a pair model, and
    for a classifier that does not say (a warning, once); a pair model's single text, a single-text model's
    ``"text_pair"`` and a line of more than two columns for a pair model are ``ValueError`` (the line is skipped);
    a TAB in a single-text model's line is part of its text (a warning, once). ``said``: the warnings given."""
    plain = record.pop(PLAIN, False)
    columns = record["text"].split("\t") if plain else [record["text"]]
    if "text_pair" in record or (len(columns) == 2 and pairs is not False):
        if pairs is False:
            raise ValueError(
                '"text_pair": the model takes single texts, not pairs (it was not trained on pairs); '
                "give one text per line"
            )
        if "text_pair" not in record:
            record = {"text": columns[0], "text_pair": columns[1]}
            _say_once(
                said,
                "unsaid",
                number,
                "a text and its text_pair (TAB-separated): the artifact does not record "
                "whether its model was trained on pairs (export it again to record it)",
                pairs is None,
            )
        return record
    if pairs:
        got = f"{len(columns)} TAB-separated columns" if len(columns) > 2 else "one text"
        raise ValueError(
            f"the model classifies sentence pairs, and this line holds {got}: give text<TAB>text_pair, "
            'or a JSON record {"text": ..., "text_pair": ...}'
        )
    _say_once(
        said,
        "tab",
        number,
        "holds a TAB, read as part of one text: the model takes single texts, not text<TAB>text_pair pairs",
        len(columns) > 1,
    )
    return record


def _say_once(said: dict, key: str, number: int, message: str, when: bool = True) -> None:
    """A warning on stderr the first time ``key`` applies in a run (its later lines are counted in ``said``)."""
    if not when:
        return
    said[key] = said.get(key, 0) + 1
    if said[key] == 1:
        from tqdm import tqdm

        tqdm.write(f"line {number}: {message} (said once)", file=sys.stderr)


def _read(stream, name, progress, pairs: bool | None = False, said: dict | None = None):
    """Yield ``(line_number, record or error message)`` for each line of a binary stream (bounded:
    :class:`~sharebert_runtime.textlines.LineTooLong` ends the run at a line over the limit), each record
    :func:`shaped` for a model that takes ``pairs``."""
    said = {} if said is None else said
    for number, raw in numbered_lines(stream, name):
        progress.update(len(raw))
        try:
            yield number, shaped(parse_line(raw), number, pairs, said)
        except ValueError as e:
            yield number, str(e)


def _print_readable(task, text, result) -> None:
    print(text)
    if task == "fill-mask":
        for n, candidates in enumerate(result, 1):
            print(f"  [MASK] {n}: " + ", ".join(f"{c['token']} ({_score(c['score'])})" for c in candidates))
        if not result:
            print("  (no [MASK] token)")
    elif task == "feature-extraction":
        print(f"  vector of {len(result)}: [{', '.join(f'{x:.4f}' for x in result[:4])}, ...]")
    else:
        print(f"  {_dumps(result)}")


def _score(p: float) -> str:
    """A probability readable at any size: ``0.612``, ``0.0421``, ``3.2e-05`` (never a run of ``0.000``)."""
    return f"{p:.3f}" if p >= 0.1 else f"{p:.3g}" if p >= 1e-3 else f"{p:.2g}"


def _dumps(obj) -> str:
    """Strict JSON (``ValueError`` for NaN or infinity)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def _answer(runtime, args, batch, sink, counts) -> None:
    """Answer a chunk of lines (runs of single texts and of pairs apart, in order); when it fails, each half
    alone, down to the line that fails (named)."""
    start = 0
    for end in range(1, len(batch) + 1):
        if end == len(batch) or ("text_pair" in batch[end][1]) != ("text_pair" in batch[start][1]):
            _answer_run(runtime, args, batch[start:end], sink, counts)
            start = end


def _answer_run(runtime, args, batch, sink, counts) -> None:
    kwargs = _task_kwargs(runtime, args)
    if "text_pair" in batch[0][1]:
        if runtime.task != "text-classification":
            for number, _ in batch:
                _skip(
                    number,
                    f'"text_pair": task {runtime.task} takes single texts (pairs are for text-classification)',
                    counts,
                )
            return
        kwargs["text_pair"] = [r["text_pair"] for _, r in batch]
    try:
        preds = runtime.predict([r["text"] for _, r in batch], **kwargs)
        results = [(number, record, result) for (number, record), result in zip(batch, preds)]
        counts["truncated"] += preds.truncated
    except Exception as e:
        if len(batch) == 1:
            _skip(batch[0][0], f"cannot be answered ({type(e).__name__}: {first_line(e)})", counts)
            return
        half = len(batch) // 2
        _answer_run(runtime, args, batch[:half], sink, counts)
        _answer_run(runtime, args, batch[half:], sink, counts)
        return
    for number, record, result in results:
        try:
            line = _dumps(_output_record(number, record, _jsonable(result), counts))
            line.encode("utf-8")  # a lone surrogate from a JSON escape cannot be written
        except ValueError as e:
            why = "the result is not finite (NaN or infinity)" if "JSON compliant" in str(e) else str(e)
            _skip(number, f"{why}; not written", counts)
            continue
        sink.write(line + "\n")
        counts["written"] += 1


def _output_record(number: int, record: dict, result, counts) -> dict:
    """``{"line": number, **record, "result": result}`` where the line number and the result are always ours: a
    record's own :data:`OWN_FIELDS` are left out (said once per run on stderr), never written over ours."""
    own = [key for key in OWN_FIELDS if key in record]
    if own and not counts.get("own_fields_said"):
        from tqdm import tqdm

        counts["own_fields_said"] = True
        tqdm.write(
            f"line {number}: the record's own {', '.join(repr(k) for k in own)} not copied to the output: "
            f"{' and '.join(repr(k) for k in OWN_FIELDS)} are predict's (said once)",
            file=sys.stderr,
        )
    return {"line": number, **{k: v for k, v in record.items() if k not in OWN_FIELDS}, "result": result}


def _argument_lines(texts, pairs: bool | None):
    """``(number, record or error message)`` of TEXT arguments, each :func:`shaped` as an input line is."""
    said = {}
    for number, text in enumerate(texts, 1):
        try:
            yield number, shaped({"text": text, PLAIN: True}, number, pairs, said)
        except ValueError as e:
            yield number, str(e)


def _argument_pairs(texts, pairs: bool | None) -> list[tuple[str, str]] | None:
    """The TEXT arguments as ``(text, text_pair)`` when they are pairs (:func:`shaped`), None when single texts;
    ``ValueError`` naming the argument that does not fit the model, or a mix of both."""
    records = []
    for number, item in _argument_lines(texts, pairs):
        if isinstance(item, str):
            raise ValueError(f"TEXT argument {number}: {item}")
        records.append(item)
    kinds = {"text_pair" in r for r in records}
    if len(kinds) > 1:
        raise ValueError("the TEXT arguments mix pairs (text<TAB>text_pair) and single texts; give one kind")
    return [(r["text"], r["text_pair"]) for r in records] if kinds == {True} else None


def _answer_all(runtime, args, sink, counts) -> None:
    """Answer every line of the TEXT arguments or ``--input`` into ``sink``, chunk by chunk."""
    from tqdm import tqdm

    stream = None
    try:
        if args.texts:
            lines = _argument_lines(args.texts, takes_pairs(runtime.task, runtime.pairs))
            progress = tqdm(disable=True)
        else:
            stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
            size = None if args.input == "-" else os.path.getsize(args.input)
            progress = tqdm(total=size, unit="B", unit_scale=True, desc="predict", file=sys.stderr, disable=None)
            lines = _read(stream, f"--input {args.input}", progress, takes_pairs(runtime.task, runtime.pairs))
        batch, chunk = [], max(CHUNK_LINES, args.batch_size)
        for number, item in lines:
            if isinstance(item, str):
                _skip(number, item, counts)
                continue
            batch.append((number, item))
            if len(batch) == chunk:
                _answer(runtime, args, batch, sink, counts)
                batch = []
        if batch:
            _answer(runtime, args, batch, sink, counts)
        progress.close()
    finally:
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()


def _skip(number, message, counts) -> None:
    from tqdm import tqdm

    counts["skipped"] += 1
    tqdm.write(f"line {number}: {message}; skipped", file=sys.stderr)


def _check_output(output, input_file) -> None:
    """Refuse an ``--output`` that cannot be written (a folder, no writable folder) or is the input."""
    out = Path(output)
    if out.is_dir():
        raise ValueError(f"--output {output} is a folder; give a file path")
    if not out.parent.is_dir():
        what = "is a file, not a folder" if out.parent.exists() else "does not exist"
        raise ValueError(f"--output {output}: {out.parent} {what}")
    if not os.access(out.parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"--output {output} is not writable")
    if input_file and input_file != "-" and out.resolve() == Path(input_file).resolve():
        raise ValueError(f"--output {output} is the --input file; write the results elsewhere")


def _check_args(args) -> None:
    """The arguments that need no artifact: where the texts come from, the numbers, the output file."""
    if not args.texts and not args.input:
        raise ValueError("give TEXT arguments or --input FILE (- for stdin)")
    if args.texts and args.input:
        raise ValueError("give TEXT arguments or --input, not both")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    if args.input and args.input != "-":
        check_text_file(args.input, "--input")
    for number, text in enumerate(args.texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach argv as lone surrogates
            raise ValueError(f"TEXT argument {number} is not valid UTF-8") from None
    if args.top_k < 1 or args.max_new_tokens < 0:
        raise ValueError(f"--top-k must be >= 1 and --max-new-tokens >= 0, got {args.top_k} and {args.max_new_tokens}")
    if args.output:
        _check_output(args.output, args.input)


def run(args) -> int:
    from .runtime import Runtime

    _check_args(args)
    runtime = Runtime(
        args.artifact,
        threads=args.threads,
        ram=args.ram,
        batch_size=args.batch_size,
        depth=args.depth,
        manifest_sha256=args.pin,
    )
    if runtime.task != "feature-extraction" and (args.pooling is not None or args.normalize is not None):
        raise ValueError(
            f"--pooling and --normalize are for feature-extraction artifacts; {args.artifact} is {runtime.task}"
        )
    if args.texts and not (args.output or args.json):
        return _print_answers(runtime, args)
    out_path = Path(args.output) if args.output else None
    counts = {"written": 0, "skipped": 0, "truncated": 0}
    with atomic_output(out_path) if out_path else contextlib.nullcontext(sys.stdout) as sink:
        _answer_all(runtime, args, sink, counts)
        sink.flush()  # stdout too: a write error (a full disk) is this run's error, not one at exit
    print(
        f"{counts['written']} results{f' -> {out_path}' if out_path else ''}; {counts['skipped']} line(s) "
        f"skipped; {counts['truncated']} input(s) cut to {runtime.max_length} tokens",
        file=sys.stderr,
    )
    return 1 if counts["skipped"] else 0


def _print_answers(runtime, args) -> int:
    """The TEXT arguments' results, readable, on stdout."""
    kwargs = _task_kwargs(runtime, args)
    pairs = _argument_pairs(args.texts, takes_pairs(runtime.task, runtime.pairs))
    preds = runtime.predict(
        [a for a, _ in pairs] if pairs else args.texts,
        **kwargs,
        **({"text_pair": [b for _, b in pairs]} if pairs else {}),
    )
    for text, result in zip(args.texts, preds):
        _print_readable(runtime.task, text, _jsonable(result))
    if preds.truncated:
        print(f"{preds.truncated} input(s) cut to {runtime.max_length} tokens", file=sys.stderr)
    return 0
