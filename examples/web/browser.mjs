// node browser.mjs --url URL --texts TEXTS.json --out OUT.json [--query TEXT --screenshot PNG]
// Opens URL (index.html served from 127.0.0.1) in headless Chromium (puppeteer-core; $CHROMIUM or /usr/bin/chromium),
// waits for the page's model, writes the page's check() of TEXTS.json (as node.mjs does, on onnxruntime-web's WASM)
// to OUT.json; with --query, types it into the search box, saves a screenshot once the results show, then empties the
// box (the report's "search").
// Every wait has a limit: a page that never answers is an error, never a hang.
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import puppeteer from "puppeteer-core";

const USAGE = "usage: node browser.mjs --url URL --texts TEXTS.json --out OUT.json [--query TEXT --screenshot PNG]";
const KEYS = ["url", "texts", "out", "query", "screenshot"];
const WAIT_MS = Number(process.env.SHAREBERT_WEB_WAIT_MS ?? 120_000); // each wait: page load, model, check, query
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

function fail(message, code = 2) {
  process.stderr.write(`browser.mjs: error: ${message}\n`);
  process.exit(code);
}

function parse(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i]?.replace(/^--/, "");
    if (!KEYS.includes(key) || argv[i + 1] === undefined) fail(`${argv[i]}: ${USAGE}`);
    args[key] = argv[i + 1];
  }
  for (const key of ["url", "texts", "out"]) if (!args[key]) fail(`--${key} is missing; ${USAGE}`);
  if (!args.query !== !args.screenshot) fail(`--query and --screenshot go together; ${USAGE}`);
  return args;
}

function within(promise, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${WAIT_MS / 1000} s`)), WAIT_MS);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

// Types the query, saves the screenshot once the results show, then empties the box: the ranking goes, the page
// answers on. Returns the results shown for the query and how many stay for the empty box.
async function search(page, args) {
  const shown = "document.querySelectorAll('#results li').length";
  await page.type("#query", args.query);
  await page.waitForFunction("document.getElementById('stats').dataset.query !== undefined");
  await page.waitForFunction(`${shown} > 0`);
  await page.screenshot({ path: args.screenshot, type: "png" });
  const results = await page.$$eval("#results li", (items) => items.map((li) => li.textContent));
  await page.$eval("#query", (box) => {
    box.value = "";
    box.dispatchEvent(new Event("input"));
  });
  await page.waitForFunction(`document.getElementById('stats').dataset.query === "" && ${shown} === 0`);
  const error = await page.$eval("#error", (e) => e.textContent);
  return { query: args.query, results, empty_query_results: await page.evaluate(shown), error };
}

async function run(args, texts) {
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    timeout: WAIT_MS,
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(WAIT_MS);
    await page.setViewport({ width: 900, height: 620 });
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(args.url, { waitUntil: "load" });
    await page.waitForFunction("window.sharebertReady === true || window.sharebertError !== undefined");
    const error = await page.evaluate("window.sharebertError");
    if (error) throw new Error(`the page could not load its model: ${error}`);
    const report = await within(page.evaluate((t) => window.sharebertCheck(t), texts), "the page's check");
    report.runtime = `${await browser.version()}, onnxruntime-web wasm`;
    if (args.query) report.search = await search(page, args);
    writeFileSync(args.out, JSON.stringify(report));
    if (errors.length) throw new Error(`the page threw: ${errors[0]}`);
  } finally {
    await browser.close();
  }
}

async function main() {
  const args = parse(process.argv.slice(2));
  if (!existsSync(CHROMIUM)) fail(`no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
  let texts;
  try {
    texts = JSON.parse(readFileSync(args.texts, "utf8"));
  } catch (e) {
    fail(`${args.texts}: ${e.message.split("\n")[0]}`);
  }
  const watchdog = setTimeout(() => fail(`gave up after ${(4 * WAIT_MS) / 1000} s`, 1), 4 * WAIT_MS);
  await run(args, texts);
  clearTimeout(watchdog);
}

main().catch((e) => fail(String(e?.message ?? e).split("\n")[0], 1));
