/* django-live-presence client: keeps presence dots and last-seen texts fresh.
 *
 * Loaded by {% presence_script %} as
 *   <script src=".../presence/presence.js" data-presence-endpoint="/presence/api/presence" defer>
 * It watches every [data-presence-user="PK"] element (also ones added later), polls
 * GET endpoint?users=1,2,3 every 15 s and when the tab becomes visible again, and updates
 *   - the dot's class presence-dot--STATUS, its title and aria-label,
 *   - the text of [data-presence-last-seen="PK"]: "online", a relative time, or empty.
 * API: window.presence.refresh() -> Promise of {id: presence};
 *      window.presence.on("update", ({presences}) => ...) -> function that unsubscribes.
 * Every update is also a "presence:update" CustomEvent on document, detail {presences}.
 * Optional: data-presence-labels='{"online": "Online", ..., "onlineText": "online"}' on the
 * script tag; otherwise the words are taken from the server-rendered (localized) page.
 * Plain ES2017, no build step. A WebSocket client replaces the polling in a later release.
 */
(() => {
  "use strict";

  const script = document.currentScript;
  const endpoint = script && script.dataset.presenceEndpoint;
  if (!endpoint || (window.presence && window.presence.refresh)) return;

  const POLL_MS = 15000;
  const MAX_DELAY_MS = 5 * 60 * 1000;
  const MAX_IDS = 500; // the endpoint's limit per request
  const STATUSES = ["online", "idle", "dnd", "offline"];
  const USER = "data-presence-user";
  const LAST_SEEN = "data-presence-last-seen";
  const WATCHED = `[${USER}], [${LAST_SEEN}]`;

  const labels = {
    online: "Online",
    idle: "Idle",
    dnd: "Do not disturb",
    offline: "Offline",
    onlineText: "online",
  };
  const latest = new Map(); // user id -> last presence received
  const pending = new Set(); // ids of elements added since, not fetched yet
  let delay = POLL_MS;
  let timer = null;
  let pendingTimer = null;

  const statusOf = (el) => STATUSES.find((s) => el.classList.contains(`presence-dot--${s}`));

  function readLabels() {
    try {
      Object.assign(labels, JSON.parse(script.dataset.presenceLabels || "{}"));
      return Boolean(script.dataset.presenceLabels);
    } catch (e) {
      return false;
    }
  }

  // The server renders dots and texts in the page's language: reuse its words, so updates
  // stay localized without a second translation catalog.
  function learnLabels() {
    document.querySelectorAll(`.presence-dot[${USER}]`).forEach((dot) => {
      const status = statusOf(dot);
      const title = dot.getAttribute("title");
      if (status && title) labels[status] = title;
      const text = document.querySelector(`[${LAST_SEEN}="${dot.getAttribute(USER)}"]`);
      if (status && status !== "offline" && text && text.textContent.trim()) {
        labels.onlineText = text.textContent.trim();
      }
    });
  }

  const relative = (() => {
    try {
      return new Intl.RelativeTimeFormat(document.documentElement.lang || undefined, {
        numeric: "auto",
      });
    } catch (e) {
      return new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
    }
  })();

  // Like the server's "5 minutes ago": the largest whole unit, rounded down.
  const UNITS = [
    ["year", 365 * 86400],
    ["month", 30 * 86400],
    ["week", 7 * 86400],
    ["day", 86400],
    ["hour", 3600],
    ["minute", 60],
  ];

  function lastSeenText(p) {
    if (p.status !== "offline") return labels.onlineText;
    if (!p.last_seen) return "";
    const seconds = Math.max(0, (Date.now() - Date.parse(p.last_seen)) / 1000);
    const unit = UNITS.find(([, size]) => seconds >= size);
    if (!unit) return relative.format(0, "second"); // "now"
    return relative.format(-Math.floor(seconds / unit[1]), unit[0]);
  }

  function render(id, p) {
    document.querySelectorAll(`[${USER}="${id}"]`).forEach((el) => {
      STATUSES.forEach((s) => el.classList.toggle(`presence-dot--${s}`, s === p.status));
      if (el.classList.contains("presence-dot")) {
        const label = labels[p.status] || p.status;
        el.setAttribute("title", label);
        el.setAttribute("aria-label", label);
      }
    });
    document.querySelectorAll(`[${LAST_SEEN}="${id}"]`).forEach((el) => {
      el.textContent = lastSeenText(p);
    });
  }

  function watchedIds(root = document) {
    const found = Array.from(root.querySelectorAll(WATCHED));
    if (root.matches && root.matches(WATCHED)) found.push(root);
    const ids = found.map((el) => el.getAttribute(USER) || el.getAttribute(LAST_SEEN));
    return Array.from(new Set(ids.filter((id) => /^\d+$/.test(id))));
  }

  async function fetchChunk(ids) {
    const url = `${endpoint}${endpoint.includes("?") ? "&" : "?"}users=${ids.join(",")}`;
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) throw new Error(`presence: HTTP ${response.status}`);
    return (await response.json()).presences || {};
  }

  // Fetch presence of `ids` (default: every watched user), render and announce it.
  // Resolves to {id: presence}; never rejects: errors (401 once logged out, network, 5xx)
  // only lengthen the polling delay, doubling up to MAX_DELAY_MS.
  async function load(ids = watchedIds()) {
    if (!ids.length) return {};
    const chunks = [];
    for (let i = 0; i < ids.length; i += MAX_IDS) chunks.push(ids.slice(i, i + MAX_IDS));
    let presences;
    try {
      presences = Object.assign({}, ...(await Promise.all(chunks.map(fetchChunk))));
    } catch (e) {
      delay = Math.min(delay * 2, MAX_DELAY_MS);
      return {};
    }
    delay = POLL_MS;
    Object.entries(presences).forEach(([id, p]) => {
      latest.set(id, p);
      render(id, p);
    });
    document.dispatchEvent(new CustomEvent("presence:update", { detail: { presences } }));
    return presences;
  }

  function schedule() {
    clearTimeout(timer);
    // Hidden tabs do not poll; becoming visible polls at once.
    timer = document.hidden ? null : setTimeout(poll, delay);
  }

  async function poll() {
    clearTimeout(timer);
    const presences = await load();
    schedule();
    return presences;
  }

  // Added elements show what is known at once; unknown users are fetched shortly after,
  // together, so inserting a list of 50 people costs one request.
  function onAdded(node) {
    watchedIds(node).forEach((id) => {
      if (latest.has(id)) render(id, latest.get(id));
      else pending.add(id);
    });
    if (pending.size && !pendingTimer) {
      pendingTimer = setTimeout(() => {
        const ids = Array.from(pending);
        pending.clear();
        pendingTimer = null;
        load(ids);
      }, 250);
    }
  }

  function start() {
    if (!readLabels()) learnLabels();
    new MutationObserver((mutations) => {
      mutations.forEach((m) => {
        m.addedNodes.forEach((node) => {
          if (node.nodeType === Node.ELEMENT_NODE) onAdded(node);
        });
      });
    }).observe(document.documentElement, { childList: true, subtree: true });
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) clearTimeout(timer);
      else poll();
    });
    // A page restored from the back/forward cache shows old presence.
    window.addEventListener("pageshow", (event) => {
      if (event.persisted) poll();
    });
    // The server rendered fresh presence: the first poll can wait a full interval.
    schedule();
  }

  window.presence = {
    refresh: poll,
    on(event, fn) {
      const type = event.includes(":") ? event : `presence:${event}`;
      const listener = (e) => fn(e.detail, e);
      document.addEventListener(type, listener);
      return () => document.removeEventListener(type, listener);
    },
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
