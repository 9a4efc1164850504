// A `sharebert export --format web` folder in JavaScript (Node or a browser page), through transformers.js.
// The caller passes the transformers.js module (Node: "@huggingface/transformers"; a page: its dist/transformers.js),
// with env.localModelPath set to the folder holding the model folders. Embeddings come from the graph's
// `sentence_embedding` output (the recipe's pooling, Dense layers and normalisation, as sharebert_runtime gives them);
// a classifier's labels from its logits, as pipeline("text-classification") gives them.

const SENTENCE_EMBEDDING = "sentence_embedding";

function checkTexts(texts, what) {
  if (!Array.isArray(texts)) throw new TypeError(`${what}: expected an array of strings, got ${typeof texts}`);
  texts.forEach((t, i) => {
    if (typeof t !== "string") throw new TypeError(`${what}: text ${i} is a ${typeof t}, not a string`);
  });
}

function rows(tensor) {
  const [n, d] = tensor.dims;
  const data = Array.from(tensor.data, Number);
  return Array.from({ length: n }, (_, i) => data.slice(i * d, (i + 1) * d));
}

export class ShareBert {
  /** Load the model folder `name` (under env.localModelPath); `device`: transformers.js' (default: its own). */
  static async load(tf, name, { device } = {}) {
    if (typeof name !== "string" || !name) throw new TypeError("load: the model folder's name must be a string");
    const start = performance.now();
    const config = await tf.AutoConfig.from_pretrained(name);
    const about = config.sharebert;
    if (!about) throw new Error(`${name}/config.json has no "sharebert" entry: not a sharebert --format web folder`);
    const Model = about.task === "text-classification" ? tf.AutoModelForSequenceClassification : tf.AutoModel;
    const options = device ? { config, device } : { config };
    const graph = Model.from_pretrained(name, options).catch((e) => {
      // ONNX Runtime's own words (a damaged or cut-short file: "protobuf parsing failed"), with the folder's name
      throw new Error(`${name}: its graph could not be loaded (a damaged or partial copy? export it again): ${e?.message ?? e}`);
    });
    const [tokenizer, model] = await Promise.all([tf.AutoTokenizer.from_pretrained(name), graph]);
    return new ShareBert(tf, name, config, about, tokenizer, model, performance.now() - start);
  }

  constructor(tf, name, config, about, tokenizer, model, loadMs) {
    Object.assign(this, { tf, name, config, about, tokenizer, model, loadMs });
  }

  /** Token ids of each text as the model sees them (special tokens added, cut to the maximum length). */
  tokenize(texts) {
    checkTexts(texts, "tokenize");
    return texts.map((t) => Array.from(this._encode(t).input_ids.data, Number));
  }

  // The runtime's encoding: the recipe's lower-casing, then a text longer than max_length keeps its first tokens and
  // its final [SEP] (transformers.js' own truncation cuts the [SEP] off), token types 0.
  _encode(text) {
    const input = this.about.embedding?.do_lower_case ? text.toLowerCase() : text;
    let ids = Array.from(this.tokenizer(input, { truncation: false }).input_ids.data);
    const max = this.about.max_length;
    if (ids.length > max) ids = [...ids.slice(0, max - 1), ids[ids.length - 1]];
    const shape = [1, ids.length];
    const tensor = (values) => new this.tf.Tensor("int64", BigInt64Array.from(values), shape);
    return {
      input_ids: tensor(ids),
      attention_mask: tensor(ids.map(() => 1n)),
      token_type_ids: tensor(ids.map(() => 0n)),
    };
  }

  /** One sentence embedding (an array of numbers) per text, each text run alone (no padding). */
  async embed(texts) {
    checkTexts(texts, "embed");
    if (this.about.task !== "feature-extraction") throw new Error(`embed: ${this.name} is a ${this.about.task} model`);
    const out = [];
    for (const text of texts) {
      const outputs = await this.model(this._encode(text));
      const vector = outputs[this.about.embedding?.output ?? SENTENCE_EMBEDDING];
      if (!vector) throw new Error(`embed: ${this.name}'s graph has no ${SENTENCE_EMBEDDING} output`);
      out.push(rows(vector)[0]);
    }
    return out;
  }

  /** The label of each text (the largest logit's, by config.json's id2label). */
  async classify(texts) {
    checkTexts(texts, "classify");
    if (this.about.task !== "text-classification") throw new Error(`classify: ${this.name} is a ${this.about.task} model`);
    const labels = [];
    for (const text of texts) {
      const [logits] = rows((await this.model(this._encode(text))).logits);
      labels.push(this.config.id2label[logits.indexOf(Math.max(...logits))]);
    }
    return labels;
  }
}

/** What the tests and benchmarks compare: per text its ids; embeddings or labels of `sentences`, and the time
 * each sentence took (ms) after the first, which is "time to first answer" from the start of the load; then, untimed,
 * the embeddings or labels of `hostile` (the empty string, 10,000 characters, control characters, ...). */
export async function check(tf, name, sentences, hostile, options = {}) {
  checkTexts(sentences, "sentences");
  checkTexts(hostile, "hostile");
  const started = performance.now();
  const model = await ShareBert.load(tf, name, options);
  const answer = model.about.task === "text-classification" ? (t) => model.classify(t) : (t) => model.embed(t);
  const results = [];
  const perSentenceMs = [];
  let firstAnswerMs = null;
  for (const sentence of sentences) {
    const t0 = performance.now();
    results.push((await answer([sentence]))[0]);
    perSentenceMs.push(performance.now() - t0);
    firstAnswerMs ??= performance.now() - started;
  }
  const report = {
    model: name,
    task: model.about.task,
    load_ms: model.loadMs,
    first_answer_ms: firstAnswerMs,
    per_sentence_ms: perSentenceMs,
    token_ids: model.tokenize(sentences),
    hostile_token_ids: model.tokenize(hostile),
  };
  const key = model.about.task === "text-classification" ? "labels" : "embeddings";
  report[key] = results;
  report[`hostile_${key}`] = await answer(hostile);
  if (model.about.task === "text-classification") {
    const classifier = await tf.pipeline("text-classification", name, options);
    report.pipeline_labels = [];
    for (const s of sentences) report.pipeline_labels.push((await classifier(s))[0].label);
  } else if (!model.about.embedding?.dense?.length && ["mean", "cls"].includes(model.about.embedding?.pooling)) {
    const extractor = await tf.pipeline("feature-extraction", name, options);
    const { pooling, normalize } = model.about.embedding;
    report.pipeline_embeddings = rows(await extractor(sentences, { pooling, normalize }));
  }
  return report;
}
