// Drives a Shiny app over valve's HTTPS in Debian's headless chromium (the
// test's certificate is its own: errors about it are ignored).
// Usage: node https.mjs hello|survive VALVE_URL (VALVE_BROWSER_HTTP1=1: HTTP/1.1 only)
// Prints JSON lines with what it saw; exits non-zero when a check fails.
// `survive` prints {"ready":true} once connected, waits for a line on stdin
// (the test cuts the connection meanwhile), then checks the session recovered
// without a reload: the same page re-renders with its inputs kept.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const [mode, url] = process.argv.slice(2);
const check = (ok, msg) => { if (!ok) throw new Error(msg); };
// VALVE_BROWSER_HTTP1=1: a browser that speaks HTTP/1.1 only (its WebSockets are upgrades).
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic",
         ...(process.env.VALVE_BROWSER_HTTP1 ? ["--disable-http2"] : [])],
});

const plotSrc = (page) => page.getAttribute("#distPlot img", "src");
async function rerender(page, bins) {
  const old = await plotSrc(page);
  await page.evaluate((b) => Shiny.setInputValue("bins", b), bins);
  await page.waitForFunction((o) => {
    const img = document.querySelector("#distPlot img");
    return img && img.getAttribute("src") !== o;
  }, old, { timeout: 30000 });
}

try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  const resp = await page.goto(url);
  await page.waitForFunction(() => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected(), null, { timeout: 30000 });
  await page.waitForSelector("#distPlot img", { timeout: 30000 });
  await rerender(page, 7);
  const seen = await page.evaluate(() => ({
    protocol: location.protocol,
    http: performance.getEntriesByType("navigation")[0].nextHopProtocol,
    url_protocol: Shiny.shinyapp.$inputValues[".clientdata_url_protocol"],
  }));
  const headers = resp.headers();
  seen.hsts = headers["strict-transport-security"] || null;
  if (mode === "hello") {
    console.log(JSON.stringify({ rendered: true, ...seen }));
  } else if (mode === "survive") {
    console.log(JSON.stringify({ ready: true, ...seen }));
    const lines = createInterface({ input: process.stdin });
    for await (const _ of lines) break;
    // The reconnect layer brings the session back over a new connection.
    await page.waitForFunction(() => Shiny.shinyapp.isConnected(), null, { timeout: 30000 });
    await rerender(page, 11);
    const bins = await page.evaluate(() => Shiny.shinyapp.$inputValues.bins);
    check(bins === 11, `the session kept its inputs (bins ${bins})`);
    console.log(JSON.stringify({ recovered: true }));
  }
  await browser.close();
} catch (e) {
  console.error(String(e && e.stack || e));
  await browser.close();
  process.exit(1);
}
