// Signs in through oauth2-proxy (and the mock OIDC provider behind it) in
// Debian's headless chromium, for deploy/test/signin.py.
// Usage: node signin.mjs BASE_URL
// Every request the browser makes, WebSocket handshakes included, carries
// forged identity headers (as any client can send them): the checks are that
// they never win. Prints one JSON line:
//   {"shiny_status": 200|403|..., "shiny_user": "...", "shiny_groups": "...",
//    "api": {...}|null, "api_status": N, "admin_status": N, "signed_in": bool}
import { chromium } from "../../tests/browser/node_modules/playwright-core/index.mjs";

const base = process.argv[2];
if (!base) {
  console.error("usage: node signin.mjs BASE_URL");
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
});
const result = {};
try {
  const context = await browser.newContext({
    extraHTTPHeaders: {
      "Shiny-Server-Credentials": JSON.stringify({ user: "mallory", groups: ["admin"] }),
      "X-Forwarded-User": "mallory",
      "X-Forwarded-Groups": "admin",
    },
  });
  const page = await context.newPage();
  page.on("pageerror", (e) => console.error(`[page error] ${e.message}`));

  // The Shiny app: oauth2-proxy sends the browser to the provider, which signs
  // it in at once and sends it back; then valve serves the app (or refuses it).
  const response = await page.goto(`${base}/shiny/`, { waitUntil: "load", timeout: 60000 });
  result.shiny_status = response ? response.status() : null;
  result.signed_in = (await context.cookies()).some((c) => c.name === "_oauth2_proxy");
  if (result.shiny_status === 200) {
    await page.waitForFunction(() => {
      const u = document.getElementById("user");
      return u && u.textContent.trim() !== "";
    }, null, { timeout: 60000, polling: 100 });
    result.shiny_user = await page.evaluate(() => document.getElementById("user").textContent.trim());
    result.shiny_groups = await page.evaluate(() => document.getElementById("groups").textContent.trim());
  } else {
    result.shiny_body = (await page.content()).slice(0, 300);
  }

  // The API and the app nobody here may use, with the session's cookie.
  const get = (path) => page.evaluate(async (url) => {
    const r = await fetch(url, { credentials: "include" });
    return { status: r.status, text: await r.text() };
  }, `${base}${path}`);
  const api = await get("/api/whoami");
  result.api_status = api.status;
  try { result.api = JSON.parse(api.text); } catch { result.api = null; result.api_text = api.text.slice(0, 300); }
  const admin = await get("/admin/whoami");
  result.admin_status = admin.status;
  result.admin_text = admin.text.slice(0, 300);
} catch (e) {
  result.error = String(e && e.stack || e);
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result) + "\n");
