// Signs a page in to valve's dashboard, as a person would: the admin
// address asks to sign in, the operator token (or a key) is typed once, and
// the session cookie does the rest.
export async function signIn(page, admin, token) {
  await page.goto(`${admin}/__valve__/`);
  if ((await page.title()) !== "Sign in to valve") throw new Error(`no sign-in page at ${admin}/__valve__/: ${await page.title()}`);
  await page.fill("#key", token);
  await Promise.all([page.waitForURL(`${admin}/__valve__/`), page.click("button[type=submit]")]);
  if ((await page.title()) === "Sign in to valve") throw new Error("the sign-in was refused");
}

// valve's admin pages as a program asks them: with the operator token.
export function adminFetch(url, init = {}) {
  const headers = { ...(init.headers || {}), Authorization: `Bearer ${process.env.VALVE_ADMIN_TOKEN}` };
  return fetch(url, { ...init, headers });
}
