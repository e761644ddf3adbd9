// Drives valve's site dashboard and an app's page in Debian's chromium
// (headless) while a signed-in browser holds a Shiny session open.
// Usage: node observe.mjs ADMIN_URL SHINY_URL API_URL APP SHOTS_DIR
//   SHINY_URL: a Shiny app's page (opened with X-Forwarded-User: alice);
//   API_URL:   a plumber API's base URL (its /print?marker= prints a line);
//   APP:       the app whose page is opened (by its link in the site table);
//   SHOTS_DIR: where dashboard-site.png and dashboard-app.png go.
// Prints one JSON line with what it saw; exits non-zero when a check fails.
import { chromium } from "playwright-core";
import { signIn } from "./admin.mjs";

const [admin, shinyUrl, apiUrl, app, shots] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});
try {
  // A user signed in through a trusted proxy, on the Shiny app.
  const user = await browser.newContext({ extraHTTPHeaders: { "X-Forwarded-User": "alice" } });
  const shiny = await user.newPage();
  await shiny.goto(shinyUrl);
  await shiny.waitForFunction(() => window.Shiny && Shiny.shinyapp && Shiny.shinyapp.isConnected(), null, { timeout: 30000 });

  const ops = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  const page = await ops.newPage();
  await signIn(page, admin, process.env.VALVE_ADMIN_TOKEN);
  // The table follows on its own: wait until it shows the session and its user.
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("#rows tr")];
    return rows.length >= 3 && rows.some((r) => r.querySelector(".sessions")?.textContent === "1"
      && r.querySelector(".users")?.textContent.includes("alice"));
  }, null, { timeout: 20000 });
  const rows = await page.$$eval("#rows tr", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.app, {
    kind: tr.querySelector(".kind").textContent,
    path: tr.querySelector(".path").textContent,
    runs_as: tr.querySelector(".runs-as").textContent,
    workers: tr.querySelector(".workers").textContent,
    sessions: Number(tr.querySelector(".sessions").textContent),
    users: tr.querySelector(".users").textContent,
    state: tr.querySelector(".tag").textContent,
  }])));
  // A click on a column's head sorts by it; another turns the order round.
  await page.click('th[data-key="name"]');
  const last = await page.$eval("#rows tr", (tr) => tr.dataset.app);
  await page.click('th[data-key="name"]');
  // The filter narrows the table to what matches.
  await page.fill("#filter", "static");
  const filtered = await page.$$eval("#rows tr", (trs) => trs.map((tr) => tr.dataset.app));
  await page.fill("#filter", "");
  await page.waitForFunction((n) => document.querySelectorAll("#rows tr").length === n, Object.keys(rows).length);
  // The busiest first (a number column sorts from the top), as the screenshot shows it.
  await page.click('th[data-key="sessions"]');
  const busiest = await page.$eval("#rows tr", (tr) => tr.dataset.app);
  await page.screenshot({ path: `${shots}/dashboard-site.png` });

  // The app's own page, through its link: its workers, and its log live.
  await page.click(`#rows tr[data-app="${app}"] td.name a`);
  await page.waitForSelector("td.pid", { timeout: 10000 });
  await page.waitForFunction(() => document.getElementById("logstate").textContent === "following", null, { timeout: 10000 });
  const marker = `from-the-browser-${Date.now()}`;
  const printed = await fetch(`${apiUrl}/print?marker=${marker}`);
  if (printed.status !== 200) throw new Error(`the API answered ${printed.status}`);
  await page.waitForFunction((m) => document.getElementById("log").textContent.includes(`stderr-marker: ${m}`), marker, { timeout: 10000 });
  const pids = await page.$$eval("td.pid", (cells) => cells.map((c) => Number(c.textContent.trim())));
  const title = await page.textContent("#name");
  const runsAs = await page.textContent("#who");
  await page.screenshot({ path: `${shots}/dashboard-app.png` });
  console.log(JSON.stringify({ rows, last, busiest, filtered, app: title, runs_as: runsAs, pids, marker, log_seen: true }));
  // The user leaves: the session ends (valve's script says goodbye as the page closes).
  await shiny.close();
} catch (e) {
  console.error(`observe check failed: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser.close().catch(() => {});
}
