// valve's dashboard asks a browser to sign in, signs it in with the
// operator token, and refuses what another site's page makes that browser
// post to it. Usage: node signin.mjs ADMIN_URL EVIL_PAGE_URL
// (VALVE_ADMIN_TOKEN: the operator token). Prints one JSON line.
import { chromium } from "playwright-core";

const [admin, evil] = process.argv.slice(2);
const fail = (msg) => { console.error(`sign-in check failed: ${msg}`); process.exitCode = 1; };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});
const seen = {};
try {
  const context = await browser.newContext();
  const page = await context.newPage();
  const first = await page.goto(`${admin}/__valve__/`);
  seen.asked = await page.title();
  seen.first = first.status();
  // A wrong key: the page says so and signs nobody in.
  await page.fill("#key", "not-a-key-valve-knows");
  const [wrong] = await Promise.all([page.waitForNavigation(), page.click("button[type=submit]")]);
  seen.wrong = wrong.status();
  // The token: the dashboard.
  await page.fill("#key", process.env.VALVE_ADMIN_TOKEN);
  await Promise.all([page.waitForURL(`${admin}/__valve__/`), page.click("button[type=submit]")]);
  await page.waitForSelector("#rows tr", { timeout: 15000 });
  seen.apps = (await page.$$("#rows tr")).length;
  seen.cookie = (await context.cookies()).find((c) => c.name === "valve_admin");
  // valve's own page may change things: it sends the session's token.
  seen.own = await page.evaluate(async () => {
    const s = await (await fetch("session")).json();
    const r = await fetch("reload", { method: "POST", headers: { "X-Valve-CSRF": s.csrf } });
    return r.status;
  });
  // Another site's page (an app on the main port) posts to valve's reload in the same browser.
  const other = await context.newPage();
  await other.goto(evil);
  await other.waitForLoadState("load");
  await other.waitForFunction(() => !document.getElementById("f"), null, { timeout: 15000 }).catch(() => {});
  seen.evil = await other.evaluate(() => document.body.innerText);
  if (seen.asked !== "Sign in to valve") fail(`no sign-in page: ${seen.asked}`);
  console.log(JSON.stringify(seen));
} catch (e) {
  fail(`${e.stack || e}`);
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
