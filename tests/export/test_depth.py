"""Depth chosen at inference: PyTorch ``depth=``, the exported ``depth`` input, ``predict``/``serve --depth``."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import sharebert
from sharebert.export import depth as gating
from sharebert.export.exporter import export_model
from sharebert.formats.build import build_model
from sharebert_runtime import Runtime
from sharebert_runtime.serve import make_server

N = 3
TINY = dict(hidden_size=64, num_hidden_layers=N, intermediate_size=128, num_attention_heads=2, embedding_size=16)
QUICK = dict(check_limit=16, runs=3, progress=False)
TEXTS = ["the capital of france is [MASK].", "a [MASK] movie , and a [MASK] one .", "it 's a charming journey ."]


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """A model whose layers hold distinct biases and norms, as after training (a fresh model's are all equal,
    and the exporter then stores one tensor for all layers)."""
    root = tmp_path_factory.mktemp("depth")
    build_model("sharebert-tiny", root / "model", TINY, seed=3)
    model = sharebert.ShareBertForMaskedLM.from_pretrained(root / "model")
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(root / "model")
    export_model(root / "model", root / "artifact", task="fill-mask", **QUICK)
    return root / "model", root / "artifact"


def _feeds(runtime, texts):
    return runtime._pad([e.ids for e in runtime.tokenizer.encode_batch(texts)])


def _torch(model, ids, mask, depth):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), depth=depth).logits.numpy()


def test_depth_k_is_the_k_layer_model_with_the_same_weights(mlm):
    """Running k of N shared layers is exactly a k-layer model holding the same learned tensors."""
    model = sharebert.ShareBertForMaskedLM.from_pretrained(mlm[0]).eval()
    ids = torch.randint(1000, 2000, (2, 9))
    for k in range(1, N + 1):
        small = sharebert.ShareBertForMaskedLM(
            sharebert.ShareBertConfig(**{**model.config.to_dict(), "num_hidden_layers": k})
        ).eval()
        missing, unexpected = small.load_state_dict(model.state_dict(), strict=False)
        assert not missing and {u.split("layers.")[1].split(".")[0] for u in unexpected} == {
            str(i) for i in range(k, N)
        }
        with torch.no_grad():
            diff = (model(ids, depth=k).logits - small(ids).logits).abs().max().item()
        assert diff <= 1e-6, (k, diff)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids, depth=N).logits)
        assert not torch.allclose(model(ids, depth=1).logits, model(ids).logits)


@pytest.mark.parametrize(
    "bad", [0, N + 1, -1, 1.0, "2", True, torch.tensor(2.7), torch.tensor([2]), torch.tensor(True), np.float64(2)]
)
def test_torch_refuses_bad_depths(mlm, bad):
    model = sharebert.ShareBertForMaskedLM.from_pretrained(mlm[0]).eval()
    with pytest.raises(ValueError, match="depth must be an integer"):
        model(torch.ones(1, 4, dtype=torch.long), depth=bad)


def test_training_samples_depths_and_eval_runs_all(mlm):
    """``train_min_depth``: training forwards run depths from the range; eval forwards the full depth."""
    model = sharebert.ShareBertForMaskedLM.from_pretrained(mlm[0], train_min_depth=2)
    ran = []
    for i, layer in enumerate(model.sharebert.layers):
        layer.register_forward_hook(lambda mod, args, out, i=i: ran.append(i))
    seen = set()
    torch.manual_seed(0)
    model.train()
    for _ in range(30):
        ran.clear()
        model(torch.ones(1, 4, dtype=torch.long))
        seen.add(len(ran))
    assert seen == {2, 3}
    model.eval()
    ran.clear()
    model(torch.ones(1, 4, dtype=torch.long))
    assert len(ran) == N
    with pytest.raises(ValueError, match="train_min_depth"):
        sharebert.ShareBertConfig(**{**model.config.to_dict(), "train_min_depth": N + 1})


def test_artifact_gates_layers_and_stays_learned_size(mlm):
    manifest = json.loads((mlm[1] / "manifest.json").read_text())
    assert manifest["max_depth"] == N
    assert manifest["parity"]["depth_1"]["max_abs_diff"] <= 1e-4  # fails on NaN too
    proto = onnx.load(str(mlm[1] / "model.onnx"))
    ifs = [n for n in proto.graph.node if n.op_type == "If"]
    assert len(ifs) == N  # every layer, each If also passing on whether the next runs
    flat = onnx.load(str(mlm[1] / "model.onnx"))
    gating.inline_layers(flat)
    gated = (mlm[1] / "model.onnx").stat().st_size  # still one layer's weights, each layer's biases once:
    assert gated - flat.ByteSize() <= 0.002 * gated  # the gating adds a few nodes, no tensor
    assert not gating.is_wrapped(flat.graph) and "depth" not in {i.name for i in flat.graph.input}
    so = ort.SessionOptions()
    a = ort.InferenceSession(str(mlm[1] / "model.onnx"), so, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(flat.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runtime = Runtime(mlm[1])
    ids, mask = _feeds(runtime, TEXTS)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    assert np.array_equal(a.run(None, feeds)[0], b.run(None, feeds)[0])  # inlined = gated at full depth
    assert gating.wrap_layers(flat) == N and gating.wrap_layers(flat) == 0  # wrapping twice changes nothing


# fp32: the same products in another order, 1e-4 absolute on logits of |x| < 1. RAM int8, relative to the largest
# logit: each int8 product rounds its weights to half of max|w|/64 per channel (0.8%) and its activations to half of
# their range/255 (0.2%), ~1% of the sum it feeds; through N = 3 layers and the head that is a few percent, so 5%.
# A kernel that saturates its int16 pairs (u8 x s8 with 8-bit weights on a CPU without VNNI) is off by ~60%.
@pytest.mark.parametrize("ram, tol, relative", [("fp32", 1e-4, False), ("int8", 0.05, True)])
def test_runtime_at_each_depth_matches_pytorch(mlm, ram, tol, relative):
    model = sharebert.ShareBertForMaskedLM.from_pretrained(mlm[0]).eval()
    runtime = Runtime(mlm[1], ram=ram, threads=1)
    ids, mask = _feeds(runtime, TEXTS)
    outs = {}
    for k in range(1, N + 1):
        view = runtime.at_depth(k)
        outs[k] = view._run(ids, mask)["logits"]
        reference = _torch(model, ids, mask, k)
        diff = np.abs(outs[k] - reference).max()
        assert diff <= tol * (np.abs(reference).max() if relative else 1.0), (ram, k, diff)  # fails on NaN
        assert view.session is runtime.session  # a view: nothing loaded again
    assert np.array_equal(runtime._run(ids, mask)["logits"], outs[N])
    assert np.array_equal(Runtime(mlm[1], ram=ram, threads=1, depth=1)._run(ids, mask)["logits"], outs[1])
    assert not np.allclose(outs[1], outs[N])


def test_classifier_and_causal_lm_at_depth(tmp_path):
    """Every head: a classifier's probabilities and a causal LM's cached generation follow PyTorch's depth."""
    from transformers import AutoModelForCausalLM

    build_model("sharebert-tiny", tmp_path / "clm", TINY, seed=4, head="clm")
    export_model(tmp_path / "clm", tmp_path / "clm-art", task="causal-lm", **QUICK)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "clm").eval()
    runtime = Runtime(tmp_path / "clm-art", threads=1)
    prompt = "the film was"
    ids = torch.tensor([[runtime.cls_id] + runtime.tokenizer.encode(prompt, add_special_tokens=False).ids])
    for k in (1, N):
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=6, do_sample=False, depth=k, pad_token_id=0)[0, ids.shape[1] :]
        assert runtime.at_depth(k).generate(prompt, max_new_tokens=6)[0] == runtime.tokenizer.decode(ref.tolist())
        assert runtime.at_depth(k).generate(prompt, max_new_tokens=6, use_cache=False) == runtime.at_depth(k).generate(
            prompt, max_new_tokens=6
        )


def _without_depth(artifact, tmp_path):
    """A copy of ``artifact`` whose manifest predates depth support (no ``max_depth``)."""
    old = tmp_path / "old"
    shutil.copytree(artifact, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["max_depth"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    return old


def test_integral_depths_of_any_kind_are_accepted(mlm):
    model = sharebert.ShareBertForMaskedLM.from_pretrained(mlm[0]).eval()
    ids = torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():
        ref = model(ids, depth=2).logits
        assert all(torch.equal(model(ids, depth=d).logits, ref) for d in (np.int64(2), torch.tensor(2)))
    assert Runtime(mlm[1], depth=np.int64(2)).depth == 2
    with pytest.raises(ValueError):
        Runtime(mlm[1], depth=np.bool_(True))


def _predict(capsys, *argv):
    """``sharebert predict ARGV`` in this process (``sharebert_runtime.main.main``, as the console script calls it):
    (exit status, stdout, stderr)."""
    from sharebert_runtime.main import main

    capsys.readouterr()
    rc = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_predict_takes_options_before_its_texts(mlm, capsys):
    """`sharebert predict ART --depth 1 TEXT`, as documented: options may come before the texts."""
    rc, out, err = _predict(capsys, mlm[1], "--depth", "1", "--json", "a [MASK] day")
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["result"] == Runtime(mlm[1], depth=1).fill_mask("a [MASK] day")[0]
    rc, out, err = _predict(capsys, mlm[1], "--depth", "1", "x", "--bogus")
    assert rc == 2 and "sharebert predict: error: unrecognized arguments: --bogus" in err


BAD_CLI = [  # (arguments after the artifact, what the one-line error names)
    (["--depth", "0"], "depth must be an integer in 1..3"),
    (["--depth", "4"], "depth must be an integer in 1..3"),
    (["--depth", "two"], "invalid int value"),
]


@pytest.mark.parametrize("args, message", BAD_CLI)
def test_predict_refuses_bad_depth_in_one_line(mlm, args, message, capsys):
    rc, _, err = _predict(capsys, mlm[1], "a [MASK] day", *args)  # an exception escaping main would fail here
    assert rc == 2 and message in err and "Traceback" not in err


def test_predict_at_depth_and_refusal_without_depth_support(mlm, tmp_path, capsys):
    rc, out, err = _predict(capsys, mlm[1], "a [MASK] day", "--json", "--depth", "1")
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["result"] == Runtime(mlm[1], depth=1).fill_mask("a [MASK] day")[0]
    assert Runtime(mlm[1], depth=1).fill_mask("a [MASK] day") != Runtime(mlm[1]).fill_mask("a [MASK] day")
    old = _without_depth(mlm[1], tmp_path)
    rc, _, err = _predict(capsys, old, "a [MASK] day", "--depth", "2")
    assert rc == 2 and "has no depth input" in err and len(err.strip().splitlines()) == 1
    assert Runtime(old).fill_mask("a [MASK] day")  # without --depth it still runs


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_per_request_depth(mlm, tmp_path):
    runtime = Runtime(mlm[1], threads=1, depth=2)  # --depth 2: the default of requests without "depth"
    server = make_server(runtime, "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predict"
    try:
        for depth in (1, 3):
            status, body = _post(url, {"text": TEXTS[0], "depth": depth})
            assert status == 200 and body["results"] == Runtime(mlm[1], depth=depth).fill_mask(TEXTS[0])
        assert _post(url, {"text": TEXTS[0]})[1]["results"] == Runtime(mlm[1], depth=2).fill_mask(TEXTS[0])
        for bad in (0, 4, "2", 1.5, True, None, [1]):
            status, body = _post(url, {"text": TEXTS[0], "depth": bad})
            assert status == 400 and "depth" in body["error"], (bad, status, body)
    finally:
        server.shutdown()
        server.server_close()
    old = Runtime(_without_depth(mlm[1], tmp_path), threads=1)
    server = make_server(old, "127.0.0.1", 0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body = _post(f"http://127.0.0.1:{server.server_address[1]}/predict", {"text": "a", "depth": 1})
        assert status == 400 and "no depth input" in body["error"]
    finally:
        server.shutdown()
        server.server_close()
