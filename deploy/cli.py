"""``sharebert predict``: run an exported artifact on texts, a file or stdin (torch-free).

Input lines are plain text, or JSON objects ``{"text": ..., ...}`` (other keys such as ``id`` are
copied to the output; ``"text_pair"``, a string, is the second text of a pair for text-classification). An
``--input`` file named ``*.tsv`` holds pairs: two tab-separated columns per line, text and text_pair. The rule: a line is a JSON record when it parses as a JSON object with a
``"text"`` key (whose value must then be a string); any other line, ``{`` at its start or not, is the
text itself. Lines are read and answered in chunks of :data:`CHUNK_LINES` (at least ``--batch-size``),
so memory stays bounded for any input size; the runtime orders a chunk by token length into calls of
``--batch-size`` texts and answers in input order. A line that cannot be answered (not UTF-8, a
non-string ``"text"``, a result that is not finite) is reported on stderr with its number and
skipped; the run goes on and exits with status 1 at the end when any line was skipped (0 when all
were answered). Output: JSON lines ``{"line": n, "text": ..., "result": ...}`` in input order (strict
JSON, never NaN; ``line`` and ``result`` are always predict's own (:data:`OWN_FIELDS`): a record's fields of
those names are not copied, said once on stderr); to ``--output``, written to a hidden temporary file beside it
and renamed at the end (any failure, a full disk included, removes it and leaves an existing file as it was),
or stdout;
texts given as arguments print readably. A line over :data:`~sharebert.textlines.MAX_LINE_BYTES` (1 MiB) ends
the run with an error naming it (an input without newlines, such as ``/dev/zero``, is not one text per line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .. import options as opt
from ..errors import first_line
from ..textlines import check_text_file, numbered_lines

OWN_FIELDS = ("line", "result")  # the output record's fields that predict writes; an input record's are not copied
CHUNK_LINES = 1024  # lines handed to the runtime at once: it groups texts of similar lengths within a chunk
HELP = "answer the task of an exported artifact (fill-mask, classify, embed, generate) without torch"


def add_arguments(p):
    p.add_argument("artifact", help="artifact folder written by `sharebert export`")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to answer (or use --input)")
    p.add_argument("--input", type=opt.path, metavar="FILE|-", help="one text (or JSON object with a \"text\" key) per line; - is stdin")
    p.add_argument("--output", type=opt.path, metavar="FILE.jsonl", help="write JSON lines here (default: stdout)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per ONNX Runtime call (default: 32)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: ORT's choice)")
    p.add_argument("--ram", choices=("fp32", "int8"), default="fp32",
                   help="fp32: generated weights folded to fp32 at load; int8: held as int8, dynamic-int8 MatMuls "
                        "(compact artifacts; about 4x less RAM for them)")
    p.add_argument("--top-k", type=int, default=5, help="fill-mask: candidates per [MASK] (default: 5)")
    from .pooling import POOLERS

    p.add_argument("--pooling", choices=tuple(POOLERS), default=None,
                   help="feature-extraction: pool the token states this way instead of the artifact's recipe (which "
                        "the manifest records: the model's sentence-transformers pooling, else cls); the recipe's Dense "
                        "layers apply only to its own pooling")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="feature-extraction: L2-normalise the vectors or not (default: as the recipe says)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="causal-lm: tokens to generate (default: 20)")
    p.add_argument("--json", action="store_true", help="print JSON lines even for TEXT arguments")
    p.add_argument("--pin", metavar="SHA256", help="refuse the artifact unless manifest.json has this sha256")
    p.add_argument("--depth", type=int, default=None, metavar="K",
                   help="run only the first K encoder layers (1..N; default all): faster, no extra memory")


def _task_kwargs(runtime, args) -> dict:
    return {"fill-mask": {"top_k": args.top_k}, "feature-extraction": {"pooling": args.pooling, "normalize": args.normalize},
            "causal-lm": {"max_new_tokens": args.max_new_tokens}}.get(runtime.task, {})


def _jsonable(result):
    if hasattr(result, "tolist"):
        return [round(float(x), 6) for x in result.tolist()]
    return result


def parse_line(raw: bytes, pairs: bool = False) -> dict:
    """One input line -> ``{"text": str, ...}`` (``pairs``: a TSV line, ``{"text", "text_pair"}``); raises
    ``ValueError`` saying what is wrong."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if pairs:
        columns = line.split("\t")
        if len(columns) != 2:
            raise ValueError(f"a .tsv input line needs two tab-separated columns (text, text_pair), got {len(columns)}")
        return {"text": columns[0], "text_pair": columns[1]}
    if not line.lstrip().startswith("{"):
        return {"text": line}
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return {"text": line}  # text that happens to start with "{"
    if not isinstance(record, dict) or "text" not in record:
        return {"text": line}
    for key in ("text", "text_pair"):
        if key in record and not isinstance(record[key], str):
            raise ValueError(f'"{key}" must be a string, got {type(record[key]).__name__}')
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the JSON holds a lone surrogate escape (such as \\ud800), not a character") from None
    return record


def _read(stream, name, progress, pairs: bool = False):
    """Yield ``(line_number, record or error message)`` for each line of a binary stream (bounded:
    :class:`~sharebert.textlines.LineTooLong` ends the run at a line over the limit); ``pairs``: a
    two-column TSV of text and text_pair."""
    for number, raw in numbered_lines(stream, name):
        progress.update(len(raw))
        try:
            yield number, parse_line(raw, pairs)
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
                _skip(number, f'"text_pair": task {runtime.task} takes single texts (pairs are for text-classification)',
                      counts)
            return
        kwargs["text_pair"] = [r["text_pair"] for _, r in batch]
    try:
        preds = runtime.predict([r["text"] for _, r in batch], **kwargs)
        results = [(number, record, result) for (number, record), result in zip(batch, preds)]
        counts["truncated"] += preds.truncated
    except Exception as e:
        if len(batch) == 1:
            _skip(batch[0][0], f"cannot be answered ({type(e).__name__}: {first_line(e)})",
                  counts)
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
        tqdm.write(f"line {number}: the record's own {', '.join(repr(k) for k in own)} not copied to the output: "
                   f"{' and '.join(repr(k) for k in OWN_FIELDS)} are predict's (said once)", file=sys.stderr)
    return {"line": number, **{k: v for k, v in record.items() if k not in OWN_FIELDS}, "result": result}


def _open_output(out_path: Path):
    """``(temporary path, text file)``: a new hidden file beside ``out_path`` (never a file of the user's), with
    the permissions a new file gets under the umask; renamed over ``out_path`` once every line is written."""
    fd, name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".partial", dir=out_path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    return Path(name), open(fd, "w", encoding="utf-8")


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


def run(args) -> int:
    from tqdm import tqdm

    from .runtime import Runtime

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
    runtime = Runtime(args.artifact, threads=args.threads, ram=args.ram, batch_size=args.batch_size, depth=args.depth,
                      manifest_sha256=args.pin)
    if runtime.task != "feature-extraction" and (args.pooling is not None or args.normalize is not None):
        raise ValueError(f"--pooling and --normalize are for feature-extraction artifacts; {args.artifact} is "
                         f"{runtime.task}")

    if args.texts and not (args.output or args.json):
        preds = runtime.predict(args.texts, **_task_kwargs(runtime, args))
        for text, result in zip(args.texts, preds):
            _print_readable(runtime.task, text, _jsonable(result))
        if preds.truncated:
            print(f"{preds.truncated} input(s) cut to {runtime.max_length} tokens", file=sys.stderr)
        return 0

    out_path = Path(args.output) if args.output else None
    tmp, sink = _open_output(out_path) if out_path else (None, sys.stdout)
    counts = {"written": 0, "skipped": 0, "truncated": 0}
    stream = None
    try:
        if args.texts:
            lines = ((n, {"text": t}) for n, t in enumerate(args.texts, 1))
            progress = tqdm(disable=True)
        else:
            stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
            size = None if args.input == "-" else os.path.getsize(args.input)
            progress = tqdm(total=size, unit="B", unit_scale=True, desc="predict", file=sys.stderr, disable=None)
            lines = _read(stream, f"--input {args.input}", progress,
                          pairs=args.input != "-" and args.input.lower().endswith(".tsv"))
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
        if tmp:  # the last writes, where a full disk shows up, are inside the clean-up's reach
            sink.flush()
            os.fsync(sink.fileno())
            sink.close()
            os.replace(tmp, out_path)
    except BaseException:
        if tmp:
            try:
                sink.close()  # flushing what is left may fail again (a full disk): the file is closed anyway
            except OSError:
                pass
            tmp.unlink(missing_ok=True)
        raise
    finally:
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()
    print(f"{counts['written']} results{f' -> {out_path}' if out_path else ''}; {counts['skipped']} line(s) "
          f"skipped; {counts['truncated']} input(s) cut to {runtime.max_length} tokens", file=sys.stderr)
    return 1 if counts["skipped"] else 0
