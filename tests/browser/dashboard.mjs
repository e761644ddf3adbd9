// Opens valve's dashboard in Debian's chromium (headless), follows the app's
// link to its page, and checks that it lists every worker's pid and updates,
// without a reload, as requests flow.
// Usage: node dashboard.mjs VALVE_URL SCREENSHOT.png PID...
// Prints one JSON line with what it saw; exits non-zero when a check fails.
import { chromium } from "playwright-core";
import { signIn } from "./admin.mjs";

const [url, screenshot, ...pids] = process.argv.slice(2);
const fail = (msg) => { console.error(`dashboard check failed: ${msg}`); process.exitCode = 1; };

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  await signIn(page, process.env.VALVE_ADMIN || url, process.env.VALVE_ADMIN_TOKEN);
  await page.click("#rows tr td.name a", { timeout: 10000 });
  await page.waitForSelector("td.pid", { timeout: 10000 });
  const shown = await page.$$eval("td.pid", (cells) => cells.map((c) => c.textContent.trim()));
  for (const pid of pids) if (!shown.includes(pid)) fail(`worker pid ${pid} not listed (shown: ${shown})`);

  const served = async () => page.$$eval("td.requests", (cells) => cells.reduce((n, c) => n + Number(c.textContent), 0));
  const before = await served();
  // Traffic while the page stays open: the table must follow on its own.
  await Promise.all(Array.from({ length: 20 }, () => fetch(`${url}/echo?msg=dash`)));
  let after = before;
  const deadline = Date.now() + 10000;
  while (after < before + 20 && Date.now() < deadline) {
    await page.waitForTimeout(250);
    after = await served();
  }
  if (after < before + 20) fail(`request counts did not update live: ${before} -> ${after}`);
  const rps = await page.textContent("#rps");
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ shown, before, after, rps }));
} finally {
  await browser.close();
}
