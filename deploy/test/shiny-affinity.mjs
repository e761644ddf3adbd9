// Browsers on a Shiny app served by two valves behind HAProxy with cookie
// affinity (driven by shiny_affinity.py). Debian's headless chromium through
// playwright-core from tests/browser (npm ci there).
//
//   node shiny-affinity.mjs BALANCER_URL BROWSERS COOKIE
//
// Speaks JSON lines: prints {"placed": [...]} once every browser has the app
// running and has reloaded it RELOADS times (each browser's balancer cookie must
// not change). Then waits for {"cut": true} (HAProxy cut every connection):
// every browser must come back to the same session on the same instance by
// itself (valve's reconnect, through the balancer's cookie); prints
// {"resumed": [...]}. Then waits for {"stopped": NAME}: the browsers that were
// on NAME must get a new session on the other instance by themselves, with
// their inputs and without a page reload, while the others keep their live
// session untouched; prints {"moved": [...]} and keeps every browser open
// until stdin closes.
import { chromium } from "../../tests/browser/node_modules/playwright-core/index.mjs";
import { createInterface } from "node:readline";

const [url, countArg, cookieName] = process.argv.slice(2);
const count = Number(countArg || 4);
const RELOADS = 2;
const check = (ok, msg) => { if (!ok) throw new Error(msg); };
const out = (obj) => console.log(JSON.stringify(obj));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});

// Waits for Shiny to connect and the histogram to render, then moves the slider
// (through Shiny's input API) and waits for the new plot: the session works.
// `bins` must differ from the slider's value (01_hello starts at 30).
async function works(page, bins, what) {
  const step = async (name, f) => {
    try { return await f(); } catch (e) { throw new Error(`${what}: ${name}: ${e.message.split("\n")[0]}`); }
  };
  await step("Shiny connects", () => page.waitForFunction(
    () => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected(), null, { timeout: 30000 }));
  await step("the plot renders", () => page.waitForSelector("#distPlot img", { timeout: 30000 }));
  const before = await page.getAttribute("#distPlot img", "src");
  await page.evaluate((b) => Shiny.setInputValue("bins", b), bins);
  await step(`the plot follows bins = ${bins}`, () => page.waitForFunction((old) => {
    const img = document.querySelector("#distPlot img");
    return img && img.getAttribute("src") !== old;
  }, before, { timeout: 30000 }));
}

async function cookies(context) {
  const all = await context.cookies();
  const get = (name) => (all.find((c) => c.name === name) || {}).value || null;
  return { lb: get(cookieName), worker: get("valve_worker") };
}

// The id Shiny gave this page's session: a new one after a reload or a move.
const sessionId = (page) => page.evaluate(() => Shiny.shinyapp.config.sessionId);

try {
  const browsers = [];
  for (let i = 0; i < count; i++) {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(url);
    await works(page, 10 + i, `browser ${i} first load`);
    const c = await cookies(context);
    check(c.lb, `browser ${i} got the balancer's ${cookieName} cookie`);
    browsers.push({ i, context, page, lb: c.lb, worker: c.worker });
  }
  for (const b of browsers) {
    for (let r = 0; r < RELOADS; r++) {
      await b.page.reload();
      await works(b.page, 20 + r, `browser ${b.i} reload ${r + 1}`);
      const c = await cookies(b.context);
      check(c.lb === b.lb, `browser ${b.i} stays on ${b.lb} after reload ${r + 1} (now ${c.lb})`);
    }
    b.session = await sessionId(b.page);
  }
  out({ placed: browsers.map((b) => ({ browser: b.i, instance: b.lb, worker: b.worker })) });

  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const cut = await lines.next();
  check(!cut.done && JSON.parse(cut.value).cut, "told the connections were cut");
  const resumed = [];
  for (const b of browsers) {
    const t = Date.now();
    await b.page.waitForFunction(() => window.__valve && window.__valve.resumes >= 1
      && window.__valve.state === "attached", null, { timeout: 60000 });
    check(await sessionId(b.page) === b.session, `browser ${b.i} came back to its session`);
    await works(b.page, 30 + b.i, `browser ${b.i} after the cut`);
    const c = await cookies(b.context);
    check(c.lb === b.lb, `browser ${b.i} still on ${b.lb} after the cut`);
    resumed.push({ browser: b.i, instance: b.lb, ms: Date.now() - t });
  }
  out({ resumed });
  for (const b of browsers) {
    await b.page.evaluate(() => { window.__marker = "no reload"; });
    b.bins = await b.page.evaluate(() => Shiny.shinyapp.$inputValues.bins);
  }

  const told = await lines.next();
  const stopped = told.done ? null : JSON.parse(told.value).stopped;
  check(stopped, "told which instance stopped");

  const moved = [];
  for (const b of browsers) {
    if (b.lb === stopped) {
      // No reload: once the stopped valve ends its sessions, the page starts a
      // new one on the other instance with the inputs it had.
      await b.page.waitForFunction((old) => window.Shiny && Shiny.shinyapp.isConnected()
        && Shiny.shinyapp.config && Shiny.shinyapp.config.sessionId !== old, b.session, { timeout: 90000 });
      check(await b.page.evaluate(() => window.__marker) === "no reload", `browser ${b.i} was not reloaded`);
      const bins = await b.page.evaluate(() => Shiny.shinyapp.$inputValues.bins);
      check(bins === b.bins, `browser ${b.i} kept its input bins = ${b.bins} (now ${bins})`);
      await works(b.page, 33, `browser ${b.i} moved after ${stopped} stopped`);
      const c = await cookies(b.context);
      check(c.lb && c.lb !== stopped, `browser ${b.i} moved off ${stopped} (cookie now ${c.lb})`);
      moved.push({ browser: b.i, from: stopped, to: c.lb });
    } else {
      // Not reloaded: the same live session still answers.
      await works(b.page, 44, `browser ${b.i} on ${b.lb}, not reloaded`);
      check(await sessionId(b.page) === b.session, `browser ${b.i} on ${b.lb} kept its session`);
      const c = await cookies(b.context);
      check(c.lb === b.lb, `browser ${b.i} still on ${b.lb}`);
    }
  }
  out({ moved, kept: browsers.filter((b) => b.lb !== stopped).map((b) => b.i) });
  // Browsers stay open (the caller counts sessions) until stdin closes.
  while (!(await lines.next()).done) { /* nothing more to do */ }
} catch (e) {
  console.error(`shiny affinity check failed: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
