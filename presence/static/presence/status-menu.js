/* The status menu ({% presence_status_menu %}, presence/status_menu.html).
 *
 * With presence.js on the page it saves through window.presence.setStatus (over the WebSocket,
 * else POST to the status endpoint) and shows the server's message when it refuses; without it
 * the form posts to the settings page, which saves and comes back to the page.
 *
 * The server decides when the text and emoji clear: each option of the menu says it, as seconds
 * from the save (data-presence-expires-in) or as a time (data-presence-expires-at: "at
 * midnight", the time as set). A time is counted from the server's clock when it rendered the
 * menu (data-presence-now) with this page's elapsed time, so a browser clock that is off changes
 * nothing. The activity the menu does not edit is kept (data-presence-activity), as the settings
 * page keeps it. No inline script or style: it runs under a strict Content Security Policy. */
(() => {
  "use strict";

  const KEEP = "keep";
  // The page's clock when this script ran: the elapsed time since the server rendered the menu.
  const started = Date.now();

  // Milliseconds on the server's clock, now.
  const serverNow = (form) => Date.parse(form.dataset.presenceNow) + (Date.now() - started);

  // expires_in for the chosen option: seconds, null (never), or NaN (a time that has passed).
  function expiresIn(form, option) {
    if (!option) return null;
    if (option.dataset.presenceExpiresIn) return Number(option.dataset.presenceExpiresIn);
    if (!option.dataset.presenceExpiresAt) return null;
    const left = Math.round((Date.parse(option.dataset.presenceExpiresAt) - serverNow(form)) / 1000);
    return left >= 1 ? left : NaN;
  }

  function when(at) {
    const options = { dateStyle: "medium", timeStyle: "short" };
    try {
      return new Intl.DateTimeFormat(document.documentElement.lang || undefined, options).format(at);
    } catch (e) {
      return new Intl.DateTimeFormat(undefined, options).format(at);
    }
  }

  // After a save: the time it set is the menu's "as set" choice, chosen, as the server offers it
  // on the next page (saving again, e.g. to change only the mode, keeps it).
  function keepChoice(form, select, seconds) {
    let keep = select.querySelector(`option[value="${KEEP}"]`);
    if (seconds === null) {
      if (keep) keep.remove();
      select.value = "never";
      return;
    }
    const at = new Date(serverNow(form) + seconds * 1000);
    if (!keep) {
      keep = document.createElement("option");
      keep.value = KEEP;
      select.insertBefore(keep, select.firstChild);
    }
    keep.dataset.presenceExpiresAt = at.toISOString();
    keep.textContent = form.dataset.presenceKeepLabel.replace("%(when)s", when(at));
    select.value = KEEP;
  }

  function modeOf(presence) {
    if (presence.invisible) return "invisible";
    if (presence.status === "dnd") return "dnd";
    return presence.status === "offline" ? null : "auto";
  }

  function setUp(menu) {
    if (menu.dataset.presenceStatusMenuReady) return; // the script loaded twice
    menu.dataset.presenceStatusMenuReady = "true";
    const form = menu.querySelector("form");
    const summary = menu.querySelector("[data-presence-status-summary]");
    const error = menu.querySelector("[data-presence-status-error]");
    const button = form.querySelector("[type=submit]");
    const select = form.elements.expires;

    const showSummary = (presence) => {
      const custom = [presence.emoji, presence.text].filter(Boolean).join(" ");
      summary.textContent = custom || summary.dataset.presenceStatusEmpty;
    };
    const showError = (message) => {
      error.textContent = message;
      error.hidden = false;
    };
    const close = () => {
      menu.open = false;
      summary.focus();
    };

    form.addEventListener("submit", async (event) => {
      const presence = window.presence;
      if (!presence || !presence.setStatus) return; // a plain POST, then
      event.preventDefault();
      const data = new FormData(form);
      const text = String(data.get("text") || "").trim();
      const emoji = String(data.get("emoji") || "").trim();
      const activity = form.dataset.presenceActivity || "";
      // Nothing to clear: no clearing time (as the server stores none to show).
      const custom = Boolean(text || emoji || activity);
      const seconds = custom ? expiresIn(form, select.selectedOptions[0]) : null;
      error.hidden = true;
      if (Number.isNaN(seconds)) {
        showError(form.dataset.presenceExpired);
        return;
      }
      button.disabled = true;
      menu.setAttribute("aria-busy", "true");
      try {
        const own = await presence.setStatus({
          status: data.get("status"),
          text: text || null,
          emoji: emoji || null,
          activity: activity || null,
          expires_in: seconds,
        });
        showSummary(own);
        keepChoice(form, select, seconds);
        close();
      } catch (e) {
        showError(e.message);
      } finally {
        button.disabled = false;
        menu.removeAttribute("aria-busy");
      }
    });

    menu.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && menu.open) close();
    });

    // Every status change of this page (this menu's, or other code's through presence.js).
    document.addEventListener("presence:status", ({ detail }) => {
      const own = detail && detail.presence;
      if (!own) return;
      showSummary(own);
      form.dataset.presenceActivity = own.activity || "";
      if (menu.open) return; // not under the user's hands
      const mode = modeOf(own);
      const radio = mode && form.querySelector(`input[name="status"][value="${mode}"]`);
      if (radio) radio.checked = true;
      form.elements.text.value = own.text || "";
      form.elements.emoji.value = own.emoji || "";
    });
  }

  document.querySelectorAll("[data-presence-status-menu]").forEach(setUp);
})();
