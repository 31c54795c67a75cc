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
 * nothing. "At midnight" comes back each day (data-presence-expires-daily): on a page left open
 * past the midnight it was rendered with, it is the next one in the site's time zone; only a
 * time as set can have passed. The activity the menu does not edit is kept (data-presence-activity), as the settings
 * page keeps it. No inline script or style: it runs under a strict Content Security Policy.
 *
 * It keeps itself current with the user's own presence as the server tells it: the menu holds
 * an element that names the user ([data-presence-text]), so presence.js follows them, and each
 * of their presences (a change made in another tab or by other code, the custom status
 * clearing, the answer of a save) updates the button and the form: the mode, the text, the
 * emoji and, from the own presence's expires_at, the time they clear ("as set"). A save then
 * sends what the user sees, not what the page was rendered with. While the menu is open, what
 * the user changed in it is left alone. Times are written in the site's time zone
 * (data-presence-time-zone), as the server writes them. */
(() => {
  "use strict";

  const KEEP = "keep";
  // The page's clock when this script ran: the elapsed time since the server rendered the menu.
  const started = Date.now();

  // Milliseconds on the server's clock, now.
  const serverNow = (form) => Date.parse(form.dataset.presenceNow) + (Date.now() - started);

  const HOUR = 3600 * 1000;
  const DAY = 24 * HOUR;

  // The wall clock's hour and minute at `time` in `zone`; null where the browser does not
  // know the zone.
  function wallClock(time, zone) {
    try {
      const parts = new Intl.DateTimeFormat("en-US", {
        timeZone: zone,
        hourCycle: "h23",
        hour: "numeric",
        minute: "numeric",
      }).formatToParts(time);
      const part = (type) => Number(parts.find((p) => p.type === type).value);
      return { hour: part("hour"), minute: part("minute") };
    } catch (e) {
      return null; // RangeError: a time zone this browser does not know
    }
  }

  // The first time after `now` of a time that comes back each day ("at midnight"), from one
  // of its times (`at`): a day on, at 00:00 in the site's zone, which a day whose clocks
  // change (23 or 25 hours) would move by the hour. Where the clocks move at midnight itself
  // and 00:00 never shows, the first instant of the new day (the server's next_midnight):
  // `at` itself may be such a 01:00, so the wall clock aimed at is 00:00, never `at`'s.
  function nextDaily(at, now, zone) {
    let next = at;
    while (next - now < 1000) {
      next += DAY;
      const seen = wallClock(next, zone);
      if (!seen) continue; // a zone this browser does not know: 24 hours
      let off = seen.hour * HOUR + seen.minute * 60 * 1000;
      if (off > DAY / 2) off -= DAY; // 23:00: an hour early, not 23 hours late
      next -= off;
      const landed = wallClock(next, zone);
      if (landed.hour !== 0 || landed.minute !== 0) next = dayStart(next, zone);
    }
    return next;
  }

  // The first instant whose wall clock reads the new day near `near` (a time within hours of a
  // midnight that did not exist): the first reading before noon after one after noon.
  function dayStart(near, zone) {
    const morning = (time) => wallClock(time, zone).hour < 12;
    let evening = near - 6 * HOUR;
    let day = near + 6 * HOUR;
    while (day - evening > 1) {
      const middle = Math.floor((evening + day) / 2);
      if (morning(middle)) day = middle;
      else evening = middle;
    }
    return day;
  }

  // expires_in for the chosen option: seconds, null (never), or NaN (a time that has passed:
  // only a time as set; "at midnight" on a page left open past it is the next midnight).
  function expiresIn(form, option) {
    if (!option) return null;
    if (option.dataset.presenceExpiresIn) return Number(option.dataset.presenceExpiresIn);
    if (!option.dataset.presenceExpiresAt) return null;
    const now = serverNow(form);
    let at = Date.parse(option.dataset.presenceExpiresAt);
    if ("presenceExpiresDaily" in option.dataset) {
      at = nextDaily(at, now, form.dataset.presenceTimeZone);
    }
    const left = Math.round((at - now) / 1000);
    return left >= 1 ? left : NaN;
  }

  // A time as the page's language writes it, in the site's time zone (the server's label).
  function when(form, at) {
    const options = { dateStyle: "medium", timeStyle: "short" };
    const zone = form.dataset.presenceTimeZone;
    for (const [lang, more] of [
      [document.documentElement.lang || undefined, { timeZone: zone }],
      [undefined, { timeZone: zone }],
      [undefined, {}], // a zone this browser does not know: its own
    ]) {
      try {
        return new Intl.DateTimeFormat(lang, Object.assign({}, options, more)).format(at);
      } catch (e) {
        // RangeError: an unknown language tag or time zone; the next is tried
      }
    }
    return at.toISOString();
  }

  // The time the custom status clears (ISO 8601, or null: never, or none) as the menu's "as
  // set" choice, chosen, as the server offers it on the next page (saving again, e.g. to
  // change only the mode, keeps it).
  function keepChoice(form, select, clears) {
    let keep = select.querySelector(`option[value="${KEEP}"]`);
    const at = clears ? new Date(clears) : null;
    if (!at || Number.isNaN(at.getTime())) {
      if (keep) keep.remove();
      select.value = "never";
      return;
    }
    if (!keep) {
      keep = document.createElement("option");
      keep.value = KEEP;
      select.insertBefore(keep, select.firstChild);
    }
    keep.dataset.presenceExpiresAt = at.toISOString();
    keep.textContent = form.dataset.presenceKeepLabel.replace("%(when)s", when(form, at));
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

    const ownId = form.dataset.presenceSelf;
    const touched = new Set(); // the controls the user changed since the menu opened

    const showSummary = (presence) => {
      const custom = [presence.emoji, presence.text].filter(Boolean).join(" ");
      summary.textContent = custom || summary.dataset.presenceStatusEmpty;
    };
    const showError = (message) => {
      error.textContent = message;
      error.hidden = false;
    };
    const hideError = () => {
      error.hidden = true;
      error.textContent = "";
    };
    const close = () => {
      menu.open = false;
      summary.focus();
    };

    // The user's own presence, as the server told it: the button, and the form but for what
    // the user is changing in it (all of it with force: after a save).
    const show = (own, force = false) => {
      showSummary(own);
      form.dataset.presenceActivity = own.activity || "";
      const untouched = (name) => force || !menu.open || !touched.has(name);
      const mode = modeOf(own);
      const radio = mode && form.querySelector(`input[name="status"][value="${mode}"]`);
      if (radio && untouched("status")) radio.checked = true;
      if (untouched("text")) form.elements.text.value = own.text || "";
      if (untouched("emoji")) form.elements.emoji.value = own.emoji || "";
      if (untouched("expires")) keepChoice(form, select, own.expires_at || null);
      if (force) touched.clear();
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
      hideError();
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
        show(own, true);
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
    // Closed, however (Escape, the button): the next opening starts afresh, without the last
    // refusal's message; what the server says next updates the whole form.
    menu.addEventListener("toggle", () => {
      if (menu.open) return;
      hideError();
      touched.clear();
    });
    ["input", "change"].forEach((type) =>
      form.addEventListener(type, (event) => {
        if (event.target.name) touched.add(event.target.name);
      })
    );

    // Every status change of this page (this menu's, or other code's through presence.js).
    document.addEventListener("presence:status", ({ detail }) => {
      if (detail && detail.presence) show(detail.presence);
    });
    // The user's own presence pushed, polled or read (their other tabs' changes, the custom
    // status clearing), which presence.js follows for the menu's [data-presence-text].
    document.addEventListener("presence:update", ({ detail }) => {
      const own = ownId && detail && detail.presences && detail.presences[ownId];
      if (own) show(own);
    });
  }

  document.querySelectorAll("[data-presence-status-menu]").forEach(setUp);
})();
