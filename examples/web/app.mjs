// The page: loads a `sharebert export --format web` folder from ./models/NAME/ (?model=NAME, default "student")
// with transformers.js on onnxruntime-web's WASM backend, embeds sentences.json, and ranks those sentences by
// cosine to what the user types. Every file comes from this page's own origin: nothing from a CDN or a hub.
import * as tf from "./node_modules/@huggingface/transformers/dist/transformers.js";
import { ShareBert, check } from "./sharebert.mjs";

const ORT_DIST = new URL("./node_modules/onnxruntime-web/dist/", import.meta.url).href;
const params = new URLSearchParams(location.search);
const name = params.get("model") ?? "student";
const $ = (id) => document.getElementById(id);

tf.env.allowRemoteModels = false;
tf.env.allowLocalModels = true;
tf.env.localModelPath = new URL("./models/", import.meta.url).pathname; // a path: transformers.js joins it as one
tf.env.useBrowserCache = false;
tf.env.backends.onnx.wasm.wasmPaths = {
  mjs: ORT_DIST + "ort-wasm-simd-threaded.asyncify.mjs",
  wasm: ORT_DIST + "ort-wasm-simd-threaded.asyncify.wasm",
};

// The test's entry (tests/deploy/test_web.py through browser.mjs): the same check() as node.mjs, on WASM.
window.sharebertCheck = (texts) => check(tf, name, texts.sentences, texts.hostile, { device: "wasm" });

async function modelBytes() {
  const config = await (await fetch(`./models/${name}/config.json`)).json();
  const dtype = config["transformers.js_config"]?.dtype ?? "fp32";
  const file = dtype === "q8" ? "model_quantized.onnx" : "model.onnx";
  const head = await fetch(`./models/${name}/onnx/${file}`, { method: "HEAD" });
  return Number(head.headers.get("content-length"));
}

function cosine(a, b) {
  let dot = 0, aa = 0, bb = 0;
  for (let k = 0; k < a.length; k++) [dot, aa, bb] = [dot + a[k] * b[k], aa + a[k] * a[k], bb + b[k] * b[k]];
  return dot / Math.sqrt(Math.max(aa * bb, 1e-24));
}

// The first results of `ranked` and the query's time (`ms`; null for an empty box: no results, no time).
function show(ranked, ms) {
  $("results").replaceChildren(
    ...ranked.slice(0, 8).map(({ text, score }) => {
      const li = document.createElement("li");
      const s = document.createElement("span");
      s.className = "score";
      s.textContent = score.toFixed(3);
      li.append(s, text);
      return li;
    }),
  );
  $("stats").dataset.query = ms === null ? "" : `${ms.toFixed(1)} ms`;
  $("stats").textContent = $("stats").dataset.base + (ms === null ? "" : ` · this query ${ms.toFixed(1)} ms`);
}

async function main() {
  const sentences = await (await fetch("./sentences.json")).json();
  const [model, bytes] = await Promise.all([ShareBert.load(tf, name, { device: "wasm" }), modelBytes()]);
  if (model.about.task !== "feature-extraction") throw new Error(`${name} is a ${model.about.task} model, not a sentence encoder`);
  const corpus = await model.embed(sentences);
  $("stats").dataset.base =
    `model ${name}: ${(bytes / 1e6).toFixed(2)} MB, loaded in ${model.loadMs.toFixed(0)} ms · ${sentences.length} sentences`;
  $("stats").textContent = $("stats").dataset.base;
  let pending = Promise.resolve();
  $("query").addEventListener("input", () => {
    const text = $("query").value;
    pending = pending
      .then(async () => {
        if (text !== $("query").value) return; // a newer keystroke: answer that one
        $("error").textContent = "";
        if (!text.trim()) return show([], null); // nothing typed: no ranking (the runtime would embed it as [CLS] [SEP])
        const t0 = performance.now();
        const [q] = await model.embed([text]);
        const ranked = corpus
          .map((v, i) => ({ text: sentences[i], score: cosine(v, q) }))
          .sort((a, b) => b.score - a.score);
        show(ranked, performance.now() - t0);
      })
      .catch((e) => {
        // said on the page; the chain goes on, so the next keystroke is answered (a rejected chain would hang it)
        $("error").textContent = `could not answer: ${e?.message ?? e}`;
        $("stats").dataset.query = "error";
      });
  });
  $("query").disabled = false;
  $("query").focus();
  window.sharebertReady = true;
}

// ?check: the test's page, which runs sharebertCheck only (any task; no search box)
if (params.has("check")) window.sharebertReady = true;
else main().catch((e) => {
  $("error").textContent = `could not load ${name}: ${e?.message ?? e}`;
  window.sharebertError = String(e?.message ?? e);
});
