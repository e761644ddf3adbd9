// Drives tests/fixtures/shiny_reconnect in Debian's headless chromium for
// Shiny sessions that survive dropped connections (docs/design/shiny-reconnect.md).
// Usage: node reconnect.mjs URL
// Prints {"ready":true, ...state} once the app is connected, then answers
// each JSON command line on stdin with exactly one JSON line (errors as
// {"error": "..."}). Ops: state, type, slider, click, burst, wait, waitCount,
// flood, reload, eval (see answer() below); `wait` takes
// min_resumes. Stdin EOF closes the page (the
// script sends `b`: the session ends) and the browser.
// VALVE_INJECT_CLIENT=/path/to/client.js runs valve's client script in the
// page before Shiny connects (for trying the script against plain Shiny).
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";

const url = process.argv[2];
if (!url) {
  console.error("usage: node reconnect.mjs URL");
  process.exit(2);
}
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});
// Over HTTPS the test's certificate is its own.
const context = await browser.newContext({ ignoreHTTPSErrors: url.startsWith("https:") });
const page = await context.newPage();
page.on("pageerror", (e) => console.error(`[page error] ${e.message}`));
page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") console.error(`[console ${m.type()}] ${m.text()}`); });

if (process.env.VALVE_INJECT_CLIENT) {
  // Run it on DOMContentLoaded ahead of jQuery's ready handlers (this listener
  // is added first): shiny.js has loaded, Shiny has not connected yet. (A
  // rewritten document would lose its address and its loopback WebSocket.)
  // As valve serves it: framing.js (beside client.js) and client.js in one function.
  const framing = readFileSync(new URL("framing.js", "file://" + process.env.VALVE_INJECT_CLIENT), "utf8");
  const client = "(function () {\n" + framing + readFileSync(process.env.VALVE_INJECT_CLIENT, "utf8") + "})();";
  await page.addInitScript({
    content: `document.addEventListener("DOMContentLoaded", function () {\n${client}\n}, { once: true });`,
  });
}

// Watch, from the first moment of every document, for Shiny's grey overlay
// (present and visible) and for valve's notice.
await page.addInitScript(() => {
  window.__seen = { overlay: false, notice: false };
  const look = () => {
    const o = document.getElementById("shiny-disconnected-overlay");
    if (o && o.getClientRects().length > 0 && getComputedStyle(o).display !== "none"
        && getComputedStyle(o).visibility !== "hidden") window.__seen.overlay = true;
    if (document.getElementById("valve-reconnecting")) window.__seen.notice = true;
  };
  new MutationObserver(look).observe(document, { childList: true, subtree: true, attributes: true,
    attributeFilter: ["class", "style"] });
});

// The secret valve gave this page's latest session (its `s` message), for
// tests that try to borrow it; the page keeps it private.
let secret = null;
page.on("websocket", (ws) => ws.on("framereceived", (f) => {
  if (typeof f.payload === "string" && f.payload.startsWith("s ")) secret = f.payload.split(" ")[2];
}));

const text = (id) => page.evaluate((id) => (document.getElementById(id)?.textContent ?? "").trim(), id);

async function state() {
  return page.evaluate(() => {
    const t = (id) => (document.getElementById(id)?.textContent ?? "").trim();
    const ticks = window.__ticks || [];
    let ok = true;
    for (let i = 0; i < ticks.length; i++) if (ticks[i] !== i + 1) { ok = false; break; }
    const v = window.__valve || {};
    const iv = {};
    const all = (window.Shiny && Shiny.shinyapp && Shiny.shinyapp.$inputValues) || {};
    for (const [k, val] of Object.entries(all)) {
      const short = k.split(":")[0];
      if (short === "name" || short === "n") iv[short] = val;
    }
    const seen = t("seen");
    return {
      token: t("token") || (window.Shiny && Shiny.shinyapp && Shiny.shinyapp.config && Shiny.shinyapp.config.sessionId) || "",
      sid: v.sid ?? null, name: t("name_seen"), n: t("n_seen"), go: t("go_seen"),
      seen: seen === "" ? [] : seen.split(","), count: Number(t("count") || 0),
      ticks: { n: ticks.length, ok, last: ticks.length ? ticks[ticks.length - 1] : null },
      marker: window.__marker ?? null,
      overlay_seen: !!(window.__seen && window.__seen.overlay),
      notice_seen: !!(window.__seen && window.__seen.notice),
      connected: !!(window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected()),
      resumes: v.resumes ?? null, restarts: v.restarts ?? null, state: v.state ?? null,
      input_values: iv,
    };
  });
}

const connected = () => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected()
  && ((document.getElementById("token")?.textContent ?? "").trim() !== ""
      || (!document.getElementById("token") && !!(Shiny.shinyapp.config && Shiny.shinyapp.config.sessionId)));

// Wait for a connected app and a token that is (`same`) or is not (`fresh`)
// `first`, after at least `minResumes` resumes (so a wait that follows a cut
// does not end before the page has even seen the cut).
async function waitToken(mode, first, timeoutS, minResumes = 0) {
  await page.waitForFunction(([mode, first, minResumes]) => {
    if (!(window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected())) return false;
    if (minResumes > 0 && !((window.__valve && window.__valve.resumes) >= minResumes)) return false;
    // Back: the script's socket is attached again (or plain, without valve's protocol).
    if (window.__valve && !["attached", "plain"].includes(window.__valve.state)) return false;
    const t = (document.getElementById("token")?.textContent ?? "").trim()
      || (document.getElementById("token") ? "" : (Shiny.shinyapp.config && Shiny.shinyapp.config.sessionId) || "");
    return t !== "" && (mode === "same" ? t === first : t !== first);
  }, [mode, first, minResumes], { timeout: timeoutS * 1000, polling: 50 });
}

// The baseline: the session's first token, and a marker in the page that
// only a page reload loses.
let firstToken = null;
let marker = null;
async function baseline() {
  marker = Math.random().toString(36).slice(2);
  await page.evaluate((m) => { window.__marker = m; }, marker);
  firstToken = (await state()).token;
}

async function stateWithMarker() {
  const { marker: m, ...s } = await state();
  return { ...s, marker_ok: m === marker, secret };
}

await page.goto(url);
await page.waitForFunction(connected, null, { timeout: 30000, polling: 50 });
await baseline();
out({ ready: true, ...(await stateWithMarker()) });

async function answer(cmd) {
  const timeout = (cmd.timeout ?? 30) * 1000;
  switch (cmd.op) {
    case "state":
      return stateWithMarker();
    case "type": {
      await page.fill("#name", String(cmd.text));
      await page.waitForFunction((v) => (document.getElementById("name_seen")?.textContent ?? "").trim() === v,
        String(cmd.text), { timeout, polling: 50 });
      return stateWithMarker();
    }
    case "slider": {
      const v = Number(cmd.value);
      await page.evaluate((v) => $("#n").data("ionRangeSlider").update({ from: v }), v);
      await page.waitForFunction((v) => (document.getElementById("n_seen")?.textContent ?? "").trim() === String(v),
        v, { timeout, polling: 50 });
      return stateWithMarker();
    }
    case "click": {
      await page.click("#go");
      // The button's own count after the click; R echoes it.
      const want = await page.evaluate(() => String($("#go").data("val") || 0));
      await page.waitForFunction((v) => (document.getElementById("go_seen")?.textContent ?? "").trim() === v,
        want, { timeout, polling: 50 });
      return stateWithMarker();
    }
    case "burst": {
      await page.evaluate(([n, tag]) => {
        let i = 0;
        const next = () => {
          i += 1;
          Shiny.setInputValue("msg", tag + i, { priority: "event" });
          if (i < n) setTimeout(next, 40);
        };
        if (n > 0) next();
      }, [Number(cmd.n ?? 50), String(cmd.tag ?? "a")]);
      return { started: true };
    }
    case "wait": {
      const t0 = Date.now();
      await waitToken(cmd.for === "fresh" ? "fresh" : "same", firstToken, cmd.timeout ?? 30, Number(cmd.min_resumes ?? 0));
      return { ...(await stateWithMarker()), ms: Date.now() - t0 };
    }
    case "waitCount": {
      await page.waitForFunction((n) => Number((document.getElementById("count")?.textContent ?? "").trim() || 0) >= n,
        Number(cmd.n), { timeout, polling: 50 });
      return stateWithMarker();
    }
    case "flood":
      await page.evaluate((k) => Shiny.setInputValue("flood", k, { priority: "event" }), Number(cmd.kib));
      return { sent: true };
    case "reload": {
      const old = await text("token");
      await page.reload();
      await page.waitForFunction(connected, null, { timeout, polling: 50 });
      await waitToken("fresh", old, cmd.timeout ?? 30);
      await baseline(); // later `wait same`/marker_ok refer to the reloaded page
      return stateWithMarker();
    }
    case "eval":
      return { value: await page.evaluate(cmd.js) };
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  try {
    out(await answer(JSON.parse(line)));
  } catch (e) {
    out({ error: String(e && e.message ? e.message.split("\n")[0] : e) });
  }
}
// Closing the page first lets the script say `b` (pagehide), ending the session.
await page.close().catch(() => {});
await browser.close().catch(() => {});
process.exit(0);
