/* The header's status menu: saves through window.presence.setStatus (presence.js sends it over
 * the WebSocket, or POSTs presence/api/status while there is none) and shows the server's error.
 * Without presence.js the form posts to the status page as a plain form. */
(() => {
  "use strict";

  const SECONDS = { "30m": 30 * 60, "1h": 3600, "4h": 4 * 3600 };

  // The menu's expiry choice as seconds from now; "today" ends at the browser's midnight,
  // "keep" when the custom status clears now (the form's data-keep-until).
  function expiresIn(choice, form) {
    if (choice === "never") return null;
    if (choice === "keep") {
      const left = Math.round((Date.parse(form.dataset.keepUntil || "") - Date.now()) / 1000);
      return left >= 1 ? left : null;
    }
    if (choice === "today") {
      const midnight = new Date();
      midnight.setHours(24, 0, 0, 0);
      return Math.max(1, Math.round((midnight - Date.now()) / 1000));
    }
    return SECONDS[choice] || null;
  }

  function setUp(menu) {
    const form = menu.querySelector("form");
    const error = menu.querySelector("[data-status-error]");
    const summary = menu.querySelector("[data-status-summary]");
    const button = form.querySelector("[type=submit]");

    const showSummary = (presence) => {
      const custom = [presence.emoji, presence.text].filter(Boolean).join(" ");
      summary.textContent = custom || summary.dataset.empty;
    };

    form.addEventListener("submit", async (event) => {
      if (!window.presence || !window.presence.setStatus) return; // a plain POST, then
      event.preventDefault();
      const data = new FormData(form);
      const text = String(data.get("text") || "").trim();
      const emoji = String(data.get("emoji") || "").trim();
      error.hidden = true;
      button.disabled = true;
      summary.setAttribute("aria-busy", "true");
      try {
        const presence = await window.presence.setStatus({
          status: data.get("status"),
          text: text || null,
          emoji: emoji || null,
          expires_in: text || emoji ? expiresIn(data.get("expires"), form) : null,
        });
        showSummary(presence);
        menu.open = false;
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
      } finally {
        button.disabled = false;
        summary.removeAttribute("aria-busy");
      }
    });
    // Status changes made by other code on this page (presence.js announces each).
    if (window.presence) {
      window.presence.on("status", ({ presence }) => presence && showSummary(presence));
    }
  }

  document.querySelectorAll("[data-status-menu]").forEach(setUp);
})();
