// node node.mjs --models DIR --model NAME --texts TEXTS.json --out OUT.json
// Loads DIR/NAME (a `sharebert export --format web` folder) from disk with transformers.js (onnxruntime-node; no hub)
// and writes sharebert.mjs's check() of TEXTS.json ({"sentences": [...], "hostile": [...]}) to OUT.json.
import { readFileSync, writeFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { check } from "./sharebert.mjs";

const USAGE = "usage: node node.mjs --models DIR --model NAME --texts TEXTS.json --out OUT.json";

function fail(message, code = 2) {
  process.stderr.write(`node.mjs: error: ${message}\n`);
  process.exit(code);
}

function parse(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i]?.replace(/^--/, "");
    if (!["models", "model", "texts", "out"].includes(key) || argv[i + 1] === undefined) fail(`${argv[i]}: ${USAGE}`);
    args[key] = argv[i + 1];
  }
  for (const key of ["models", "model", "texts", "out"]) if (!args[key]) fail(`--${key} is missing; ${USAGE}`);
  return args;
}

async function main() {
  const args = parse(process.argv.slice(2));
  const folder = resolve(args.models, args.model);
  if (!statSync(folder, { throwIfNoEntry: false })?.isDirectory()) fail(`${folder} is not a folder`);
  let texts;
  try {
    texts = JSON.parse(readFileSync(args.texts, "utf8"));
  } catch (e) {
    fail(`${args.texts}: ${e.message.split("\n")[0]}`);
  }
  const tf = await import("@huggingface/transformers");
  tf.env.allowRemoteModels = false;
  tf.env.allowLocalModels = true;
  tf.env.localModelPath = resolve(args.models) + "/";
  const report = await check(tf, args.model, texts.sentences ?? [], texts.hostile ?? []);
  report.runtime = `node ${process.version}, transformers.js ${tf.env.version}, onnxruntime-node`;
  writeFileSync(args.out, JSON.stringify(report));
}

main().catch((e) => fail(String(e?.message ?? e).split("\n")[0], 1));
