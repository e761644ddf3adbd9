// Drives Shiny's own example apps through valve in Debian's headless chromium.
// Usage: node shiny.mjs hello|upload|download|survive|keep|whoami VALVE_URL [SESSIONS | whoami's HEADERS as JSON]
// Prints JSON lines with what it saw; exits non-zero when a check fails.
// `survive` prints {"ready":true}, waits for a line on stdin (the test kills
// the session's worker meanwhile), then reloads and checks the app works.
import { chromium } from "playwright-core";
import { adminFetch } from "./admin.mjs";
import { createInterface } from "node:readline";

const [mode, url, count] = process.argv.slice(2);
const check = (ok, msg) => { if (!ok) throw new Error(msg); };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});

// A fresh browser (own cookies) with the app loaded and connected.
async function session(extraHTTPHeaders = {}) {
  const context = await browser.newContext({ extraHTTPHeaders });
  const page = await context.newPage();
  await page.goto(url);
  await page.waitForFunction(() => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected(), null, { timeout: 30000 });
  return page;
}

const plotSrc = (page) => page.getAttribute("#distPlot img", "src");

try {
  if (mode === "hello") {
    const page = await session();
    await page.waitForSelector("#distPlot img", { timeout: 30000 });
    const first = await plotSrc(page);
    await page.evaluate(() => Shiny.setInputValue("bins", 7));
    await page.waitForFunction((old) => {
      const img = document.querySelector("#distPlot img");
      return img && img.getAttribute("src") !== old;
    }, first, { timeout: 30000 });
    check((await plotSrc(page)).startsWith("data:image/png"), "the plot is a PNG");
    console.log(JSON.stringify({ rendered: true, rerendered: true }));
  } else if (mode === "upload") {
    const n = Number(count || 6);
    const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
      const page = await session();
      const marker = `session${i}_${Math.random().toString(36).slice(2, 8)}`;
      const csv = `name,value\n${marker},${i}\n`;
      await page.setInputFiles("#file1", { name: `${marker}.csv`, mimeType: "text/csv", buffer: Buffer.from(csv) });
      await page.waitForSelector("#contents table", { timeout: 30000 });
      const text = await page.textContent("#contents");
      check(text.includes(marker), `session ${i} sees its own table (got ${text})`);
      for (let j = 0; j < n; j++) if (j !== i) check(!text.includes(`session${j}_`), `session ${i} sees only its own data`);
      return { session: i, marker };
    }));
    const status = await (await adminFetch(`${process.env.VALVE_ADMIN || url}/__valve__/status`)).json();
    console.log(JSON.stringify({ uploads: results.length, sessions: status.workers.map((w) => w.sessions) }));
    await browser.close();
  } else if (mode === "download") {
    const page = await session();
    await page.waitForSelector("#table table", { timeout: 30000 });
    const [download] = await Promise.all([page.waitForEvent("download"), page.click("#downloadData")]);
    const stream = await download.createReadStream();
    let body = "";
    for await (const chunk of stream) body += chunk;
    check(body.split("\n")[0].includes("area"), `the download is the rock data set (got ${body.slice(0, 80)})`);
    console.log(JSON.stringify({ filename: download.suggestedFilename(), lines: body.trim().split("\n").length }));
  } else if (mode === "survive") {
    const page = await session();
    await page.waitForSelector("#distPlot img", { timeout: 30000 });
    console.log(JSON.stringify({ ready: true }));
    const lines = createInterface({ input: process.stdin });
    for await (const _ of lines) break;
    await page.reload();
    await page.waitForFunction(() => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected(), null, { timeout: 30000 });
    await page.waitForSelector("#distPlot img", { timeout: 30000 });
    console.log(JSON.stringify({ survived: true }));
  } else if (mode === "keep") {
    // One session held open across reloads of valve's config: on each stdin
    // line `step`, change the input and wait for the plot of this same
    // session (no page reload); on `end`, check a fresh browser too.
    const page = await session();
    await page.waitForSelector("#distPlot img", { timeout: 30000 });
    const token = await page.evaluate(() => Shiny.shinyapp.config.sessionId);
    console.log(JSON.stringify({ ready: true }));
    let step = 0;
    const lines = createInterface({ input: process.stdin });
    for await (const line of lines) {
      if (line.trim() === "end") break;
      step += 1;
      const before = await plotSrc(page);
      await page.evaluate((n) => Shiny.setInputValue("bins", 5 + (n % 40)), step);
      await page.waitForFunction((old) => {
        const img = document.querySelector("#distPlot img");
        return img && img.getAttribute("src") !== old;
      }, before, { timeout: 30000 });
      const same = await page.evaluate(() => Shiny.shinyapp.isConnected() && Shiny.shinyapp.config.sessionId);
      check(same === token, `the same session answers (was ${token}, now ${same})`);
      console.log(JSON.stringify({ step, kept: true }));
    }
    lines.close();
    const fresh = await session();
    await fresh.waitForSelector("#distPlot img", { timeout: 30000 });
    console.log(JSON.stringify({ fresh: true }));
  } else if (mode === "whoami") {
    // A browser that names itself a user on every request, the WebSocket's
    // handshake included, in both spellings R reads as one header; or, given
    // a JSON object of headers, a browser behind a sign-in proxy that adds them.
    const page = await session(count ? JSON.parse(count) : {
      "Shiny-Server-Credentials": JSON.stringify({ user: "mallory", groups: ["admin"] }),
      "X-Forwarded-User": "mallory",
      "X-Forwarded-Groups": "admin",
    });
    await page.waitForFunction(() => (document.querySelector("#who")?.textContent || "").startsWith("user="),
      null, { timeout: 30000 });
    // The users valve lists for the workers' open sessions, this one's included.
    const admin = process.env.VALVE_ADMIN;
    const users = admin ? (await (await adminFetch(`${admin}/__valve__/status`)).json()).workers.flatMap((w) => w.users) : null;
    console.log(JSON.stringify({ who: await page.textContent("#who"), users }));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
} catch (e) {
  console.error(`shiny check failed: ${e.message}`);
  process.exitCode = 1;
} finally {
  // Pages close as a user closes tabs (so valve's script says goodbye and the
  // sessions end now), then the browser.
  for (const context of browser.contexts()) {
    for (const page of context.pages()) await page.close().catch(() => {});
  }
  await browser.close().catch(() => {});
}
