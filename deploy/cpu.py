"""The CPU a figure came from: its architecture, model and the int8-relevant instruction sets (stdlib only).

ONNX Runtime picks its int8 matrix-product kernel by instruction set, so the answers of an int8 path, its speed and
its memory are facts about a CPU as much as about an artifact. ``export`` records :func:`cpu_info` in the manifest,
``compress`` in its report, ``sharebert verify`` prints it beside the one the artifact was exported on
(docs/DEVICE.md "Checking an artifact on the device"). Features are read from ``/proc/cpuinfo`` (Linux); elsewhere
they are unknown (``None``), never guessed.
"""

from __future__ import annotations

import platform
from importlib import metadata

CPUINFO = "/proc/cpuinfo"
# The instruction sets ONNX Runtime's int8 kernels choose between, by architecture, as /proc/cpuinfo names them.
# x86: AVX2 (u8 x s8 pairs summed in a saturating int16: vpmaddubsw), AVX-512 BW (the same, wider), AVX-512 VNNI and
# AVX-VNNI (vpdpbusd: int32 sums), AMX (tile int8 products). Arm: ASIMD (NEON), the dot product (sdot/udot) and the
# int8 matrix multiply (smmla/ummla).
INT8_FEATURES = {
    "x86_64": ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"),
    "aarch64": ("asimd", "asimddp", "i8mm"),
}
INT8_FEATURES["amd64"] = INT8_FEATURES["x86_64"]
INT8_FEATURES["arm64"] = INT8_FEATURES["aarch64"]


def _cpuinfo(path: str = CPUINFO) -> tuple[str | None, set[str] | None]:
    """``(model name, flags)`` of the first processor in ``path``; ``(None, None)`` where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)  # the first processors' blocks are enough: every core has the same features
    except OSError:
        return None, None
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and model is None and value.strip():
            model = value.strip()
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
    return model, flags


def _onnxruntime_version() -> str | None:
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:  # another build (onnxruntime-gpu, a source build): said as unknown
        return None


def cpu_info(path: str = CPUINFO) -> dict:
    """``{"machine", "model", "int8_features", "int8_missing", "onnxruntime"}``: the architecture
    (``platform.machine()``), the CPU's model name, which of :data:`INT8_FEATURES` it has and lacks (both None where
    the features cannot be read), and the installed onnxruntime's version."""
    machine = platform.machine() or "unknown"
    model, flags = _cpuinfo(path)
    wanted = INT8_FEATURES.get(machine.lower(), ())
    return {
        "machine": machine,
        "model": model or platform.processor() or None,
        "int8_features": None if flags is None else [f for f in wanted if f in flags],
        "int8_missing": None if flags is None else [f for f in wanted if f not in flags],
        "onnxruntime": _onnxruntime_version(),
    }


def describe(info: dict | None) -> str:
    """One line: ``x86_64 AMD EPYC; int8: avx2 (not avx512f, avx512bw, ...); onnxruntime 1.32.0``."""
    if not isinstance(info, dict):
        return "not recorded"
    features = info.get("int8_features")
    if features is None:
        int8 = "int8 features unknown"
    elif not features and not info.get("int8_missing"):
        int8 = "no int8 features known for this architecture"
    else:
        missing = info.get("int8_missing") or []
        int8 = f"int8: {', '.join(features) or 'none of ' + ', '.join(missing)}"
        if features and missing:
            int8 += f" (not {', '.join(missing)})"
    head = " ".join(str(x) for x in (info.get("machine"), info.get("model")) if x)
    return f"{head}; {int8}; onnxruntime {info.get('onnxruntime') or 'unknown'}"
