// The console's shell: navigation by the URL's fragment, one refresh loop for the page shown (paused while the tab
// is hidden), and a sign-in form when the SQL API asks for a password.

import { h, replace, errorBox } from "./dom.js";
import { SqlSocket, AuthError, credentials, setCredentials } from "./sql.js";
import { objectsPage } from "./pages/objects.js";
import { webhooksPage, webhookSourcePage } from "./pages/webhooks.js";
import { materializationsPage } from "./pages/materializations.js";
import { editorPage } from "./pages/editor.js";

const main = document.getElementById("main");
const reads = new SqlSocket(); // the pages' reads; the SQL editor has a session of its own
let page = null;
let timer = null;
let generation = 0;

function route() {
  const [name, argument] = location.hash.replace(/^#\/?/, "").split("/");
  const chosen = name || "objects";
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === chosen);
  page?.dispose?.();
  clearTimeout(timer);
  generation += 1;
  if (chosen === "sql") page = editorPage(main);
  else if (chosen === "webhooks" && argument) page = webhookSourcePage(main, reads, decodeURIComponent(argument));
  else if (chosen === "webhooks") page = webhooksPage(main, reads);
  else if (chosen === "materializations") page = materializationsPage(main, reads);
  else page = objectsPage(main, reads);
  if (page.refresh) loop(generation);
}

async function loop(mine) {
  if (mine !== generation) return;
  if (document.visibilityState === "visible") {
    try {
      await page.refresh();
      main.querySelector(":scope > .error.connection")?.remove();
    } catch (error) {
      if (error instanceof AuthError && ["28P01", "28000"].includes(error.code)) return signIn(error);
      if (!main.querySelector(":scope > .error.connection")) {
        main.prepend(h("p", { class: "error connection" }, `Cannot read from headrace: ${error.message}`));
      }
    }
  }
  if (mine === generation) timer = setTimeout(() => loop(mine), page.interval || 3000);
}

function signIn(error) {
  const user = h("input", { id: "signin-user", name: "user", value: credentials().user || "headrace", autocomplete: "username" });
  const password = h("input", { id: "signin-password", name: "password", type: "password", autocomplete: "current-password" });
  replace(main, h("h1", {}, "Sign in"),
    h("p", {}, "This server's authentication rules ask for a role's password (the same as psql and the SQL API)."),
    errorBox(error),
    h("form", { class: "signin", onsubmit: (event) => {
      event.preventDefault();
      setCredentials({ user: user.value, password: password.value });
      reads.close();
      showWho();
      route();
    } }, h("label", {}, "Role ", user), h("label", {}, "Password ", password), h("button", { type: "submit" }, "Sign in")));
}

function showWho() {
  replace(document.getElementById("who"), `as ${credentials().user}`);
}

reads.onclose = () => { /* reconnected by the next refresh */ };
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible" && page?.refresh) { clearTimeout(timer); loop(generation); }
});
window.addEventListener("hashchange", route);
showWho();
route();
