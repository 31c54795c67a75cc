/* django-live-presence client: keeps presence dots and last-seen texts live.
 *
 * Loaded by {% presence_script %}, which passes its configuration as data attributes:
 *   data-presence-socket           WebSocket path (ws/presence/); absent: poll over HTTP only
 *   data-presence-endpoint         GET ?users=1,2,3 (polling while there is no socket)
 *   data-presence-status-endpoint  POST (setStatus while there is no socket)
 *   data-presence-heartbeat        HEARTBEAT_INTERVAL, seconds
 *   data-presence-idle-after       IDLE_AFTER, seconds
 *   data-presence-labels           {"online": "Online", ..., "onlineText", "justNow"} (localized)
 *   data-presence-self             the logged-in user's id (presence.self)
 *
 * It watches every [data-presence-user="PK"], [data-presence-last-seen="PK"] and
 * [data-presence-text="PK"] element (also ones added later; users whose elements all left the
 * page are unsubscribed), subscribes to exactly those users, and renders what the server pushes:
 *   - the dot's class presence-dot--STATUS, its title and aria-label,
 *   - the text of [data-presence-last-seen="PK"]: "online", a relative time (refreshed every
 *     30 s; counted and worded as {% last_seen %} renders it), or empty,
 *   - the text of [data-presence-text="PK"] ({% presence_text %}): the custom status, its emoji
 *     and its text with a space between, or empty (none, hidden from the viewer, expired).
 * It sends a heartbeat every HEARTBEAT_INTERVAL ("active", or "idle" after IDLE_AFTER without
 * input or while the tab is hidden; at once when that changes), reconnects with exponential
 * backoff and jitter, and resubscribes. While the socket is down (or where WebSocket is missing)
 * it polls the JSON endpoint every 15 s instead.
 * Stamps: a user whose every element carries the same data-presence-since (the dots of
 * {% presence_dot %}, the texts of {% presence_text %}) is subscribed with that stamp, and the
 * server sends only what changed since the page was rendered; each snapshot's stamp is kept, and
 * a reconnect resubscribes with it, so it is sent only what changed while it was away (or
 * everything, when away too long); a page open longer gets fresh stamps ("stamp" frames) that it
 * keeps the same way. The page's
 * users (those sharing a stamp, up to 2,000 characters of ids) are subscribed in the socket's
 * opening request (?users=...&since=...), answered at connect; the others by subscribe frames.
 *
 * API (window.presence):
 *   on(event, fn) -> function that removes the listener; fn(detail). Events:
 *     "update"     {presences: {id: PRESENCE}}   new presence rendered (snapshot, diff or poll)
 *     "status"     {presence}                     the user's own presence after a status change
 *     "error"      {code, message}                an error frame, or a failed status change
 *     "connection" {state, code}                  "connecting" | "open" | "closed" (retrying,
 *                                                 polling meanwhile) | "polling" (no socket) |
 *                                                 "unauthorized" (4401: stopped) |
 *                                                 "forbidden" (4403, a foreign origin: stopped)
 *     Each is also a CustomEvent "presence:EVENT" on document.
 *   refresh() -> Promise of {id: presence}: fetches over HTTP, or, while the socket is open
 *     (presence is pushed then), resolves to what the page shows (users it shows as rendered,
 *     unchanged since the page's stamp, are read over HTTP once).
 *     "activity"   {feeds, activity}              a new activity on watched timelines (or
 *                                                 one missed while the socket was down)
 *     "feed_reload" {feed}                         more were missed than the server sends:
 *                                                 load the timeline again
 *   watchFeed(name, {after}) / unwatchFeed(name): live timelines ("following", "mentions",
 *     "user:<id>", "group:<slug>"), watched again after every reconnect with the newest
 *     activity id shown on each (after: the page's newest as rendered, 0 for none), so that
 *     what was posted meanwhile comes as "activity" events.
 *   Online count: every [data-presence-online-count] ({% online_count %}) shows the number of
 *     users online, grouped as the server groups it (data-presence-labels; else
 *     Intl.NumberFormat of the document's lang): the
 *     socket is asked for it ("watch_count": only on pages that show it) and pushes its changes
 *     (at most one "online_count" frame per 5 s); polling reads the attribute's endpoint.
 *     Event "online_count" {count}.
 *   Rooms' counts: every [data-presence-room-count-of="kind:id"] ({% room_count %}) shows the
 *     room's count as the viewer may see it, kept live without joining the room: the socket
 *     is asked for it ("watch_room_count", again after every reconnect; "unwatch_room_count"
 *     once its last element left the page) and pushes "room_count" frames; polling reads every
 *     such room's count in one request (data-presence-room-counts-endpoint).
 *     Event "room_count" {room, count}.
 *   Rooms: every [data-presence-room="kind:id"] ({% room_presence %}) is joined and kept
 *     live (members, others, count); event "room" {room, members, others, count}.
 *     joinRoom(name, meta) joins (again: replaces meta), leaveRoom(name), room(name) -> view;
 *     view.more() -> Promise of the room's next members ({id: member}, none at the end),
 *     merged into the room's list: the socket's room_more frame, else the room's endpoint
 *     with ?after= (docs/rooms.md, "Paging").
 *     othersWith(members, key) -> ids of the members but the viewer whose meta has key set
 *     (a room's members always list the viewer: "someone is typing" is about the others).
 *   self: the viewer's own id as the server keys it (a string), null where the page does not
 *     say (a script tag of the site's own without data-presence-self).
 *   setStatus({status, text, emoji, activity, expires_in}) -> Promise of the own presence;
 *     over the socket, else POSTed to the status endpoint. Rejects with an Error with .code.
 *   state: the connection state above.
 * Plain ES2017, no build step.
 */
(() => {
  "use strict";

  const script = document.currentScript;
  if (!script || (window.presence && window.presence.refresh)) return;
  const config = script.dataset;
  const ms = (seconds, fallback) => (Number(seconds) > 0 ? Number(seconds) : fallback) * 1000;

  // The viewer's own id, as the server keys members and presences: a room lists the viewer too.
  const selfId = config.presenceSelf || null;
  const endpoint = config.presenceEndpoint || "";
  const statusEndpoint = config.presenceStatusEndpoint || "";
  const HEARTBEAT_MS = ms(config.presenceHeartbeat, 30);
  const IDLE_MS = ms(config.presenceIdleAfter, 300);
  const POLL_MS = 15000;
  const MAX_POLL_DELAY_MS = 5 * 60 * 1000;
  const RETRY_MS = 1000; // first reconnection delay; doubles up to RETRY_MAX_MS
  const RETRY_MAX_MS = 30000;
  const RATE_LIMITED_MS = 10000; // at least this long after a 4429 or 4408 close
  const STABLE_MS = 10000; // a connection open this long resets the backoff
  const STATUS_TIMEOUT_MS = 10000;
  const CLOCK_MS = 30000; // relative times are rewritten this often
  const MAX_IDS = 500; // per HTTP request and per subscribe frame
  const URL_IDS_LENGTH = 2000; // characters of ids in the socket's opening request, at most
  const CLOSE_UNAUTHORIZED = 4401;
  const CLOSE_FORBIDDEN = 4403;
  const CLOSE_RATE_LIMITED = 4429;
  const CLOSE_TOO_SLOW = 4408; // the client did not read what it was sent fast enough
  const STATUSES = ["online", "idle", "dnd", "offline"];
  const USER = "data-presence-user";
  const LAST_SEEN = "data-presence-last-seen";
  const STATUS_TEXT = "data-presence-text";
  const SINCE = "data-presence-since";
  const NAMING = [USER, LAST_SEEN, STATUS_TEXT]; // the attributes that name a user shown
  const WATCHED = NAMING.map((attribute) => `[${attribute}]`).join(", ");
  // User ids are opaque strings (integers, UUIDs, any string pk): quoted in selectors, encoded
  // in URLs, sent as strings (the server echoes each id back as it was sent). Inside a quoted
  // selector string, a quote and a backslash are escaped, and every control character as a
  // CSS hex escape ("\d "): CSS reads \r and \f as line breaks, which end the string.
  const byId = (attribute, id) => {
    const quoted = id
      .replace(/["\\]/g, "\\$&")
      .replace(/[\u0000-\u001f\u007f]/g, (c) => `\\${c.charCodeAt(0).toString(16)} `);
    return `[${attribute}="${quoted}"]`;
  };

  const socketUrl = (() => {
    if (!config.presenceSocket || typeof WebSocket === "undefined") return null;
    const url = new URL(config.presenceSocket, location.href);
    if (url.protocol === "http:") url.protocol = "ws:";
    if (url.protocol === "https:") url.protocol = "wss:";
    return url.href;
  })();

  const labels = {
    online: "Online",
    idle: "Idle",
    dnd: "Do not disturb",
    offline: "Offline",
    onlineText: "online",
    justNow: "",
  };
  const latest = new Map(); // user id -> presence last rendered
  // Sequence numbers: each HTTP read takes one when it starts, each socket push (or "unchanged"
  // confirmation) one when it is rendered. A user's renderedAt is the number of what last
  // rendered them (an HTTP answer: its start's): an answer is applied only to users whose last
  // render is older than its start (a read that started earlier may answer later).
  let sequence = 0;
  const nextSequence = () => ++sequence;
  const renderedAt = new Map();
  let state = socketUrl ? "connecting" : "polling";
  let everOpened = false; // whether the socket ever opened on this page
  let toldWhyPolling = false; // the console hears once why the page polls

  // --- events -----------------------------------------------------------------------------

  function emit(name, detail) {
    document.dispatchEvent(new CustomEvent(`presence:${name}`, { detail }));
  }

  function setState(next, code) {
    state = next;
    emit("connection", { state: next, code: code === undefined ? null : code });
  }

  const failure = (code, message) => Object.assign(new Error(message || code), { code });

  // --- rendering ----------------------------------------------------------------------------

  const statusOf = (el) => STATUSES.find((s) => el.classList.contains(`presence-dot--${s}`));

  function readLabels() {
    try {
      Object.assign(labels, JSON.parse(config.presenceLabels || "{}"));
      return Boolean(config.presenceLabels);
    } catch (e) {
      return false;
    }
  }

  // Without data-presence-labels (a hand-written script tag), reuse the words of the
  // server-rendered (localized) page.
  function learnLabels() {
    document.querySelectorAll(`.presence-dot[${USER}]`).forEach((dot) => {
      const status = statusOf(dot);
      const title = dot.getAttribute("title");
      if (status && title) labels[status] = title;
      const text = document.querySelector(byId(LAST_SEEN, dot.getAttribute(USER)));
      if (status && status !== "offline" && text && text.textContent.trim()) {
        labels.onlineText = text.textContent.trim();
      }
    });
  }

  // Without the server's words (a hand-written script tag): the browser's, in <html lang>.
  const relativeFormat = (numeric) => {
    try {
      return new Intl.RelativeTimeFormat(document.documentElement.lang || undefined, { numeric });
    } catch (e) {
      return new Intl.RelativeTimeFormat(undefined, { numeric });
    }
  };
  const relative = relativeFormat("always"); // "1 day ago", as the server says, not "yesterday"
  const relativeNow = relativeFormat("auto"); // "now"

  // The units counted in whole seconds, below the calendar's months and years.
  const UNITS = [
    ["week", 7 * 86400],
    ["day", 86400],
    ["hour", 3600],
    ["minute", 60],
  ];
  const DAY_MS = 86400000;

  // The server's rule (presence.domain.display.elapsed), so that the text written here is the
  // one the page was rendered with: the largest whole unit, rounded down, or null under a
  // minute. Years and months on the calendar, in UTC: from 31 January, 28 February is not a
  // month yet, 1 March is (the day of the month and the time of day must be reached again).
  // `since` counts in whole seconds, as the server's JSON gives it.
  function elapsed(sinceMs, nowMs) {
    const since = new Date(Math.floor(sinceMs / 1000) * 1000);
    const now = new Date(nowMs);
    const seconds = Math.floor((now - since) / 1000);
    if (!(seconds >= 60)) return null;
    const timeOfDay = (d) => ((d.getTime() % DAY_MS) + DAY_MS) % DAY_MS;
    let months =
      (now.getUTCFullYear() - since.getUTCFullYear()) * 12 + now.getUTCMonth() - since.getUTCMonth();
    const dayDiff = now.getUTCDate() - since.getUTCDate();
    if (dayDiff < 0 || (dayDiff === 0 && timeOfDay(now) < timeOfDay(since))) months -= 1;
    if (months >= 12) return ["year", Math.floor(months / 12)];
    if (months >= 1) return ["month", months];
    const unit = UNITS.find(([, size]) => seconds >= size);
    return [unit[0], Math.floor(seconds / unit[1])];
  }

  // Python's "%(name)s" / "%(name)d" formatting, as the server fills the same words in.
  const pyFormat = (template, values) =>
    template.replace(/%(?:\((\w+)\)[sd]|%)/g, (all, name) => (name ? String(values[name]) : "%"));

  // "5 minutes ago" in the server's words (data-presence-labels: presence.domain.display.
  // script_words): a unit's words for most numbers, and those of the numbers whose plural form
  // differs; years past 199 take the words of 100 + their last two digits, as the server says.
  function agoText(unit, num) {
    const words = labels.units && labels.units[unit];
    if (!words || typeof labels.ago !== "string") return relative.format(-num, unit);
    const listed = unit === "year" && num >= 200 ? 100 + (num % 100) : num;
    const template = (words[1] || {})[String(listed)] || words[0];
    // As the server's avoid_wrapping: "5 minutes" stays on one line.
    const delta = pyFormat(template, { num }).replace(/ /g, "\u00a0");
    return pyFormat(labels.ago, { delta });
  }

  // Where only the approximate last seen shows: "last seen recently"... (no number, no time).
  const APPROX = ["recently", "within_week", "within_month", "long_ago"];

  function lastSeenText(p) {
    if (p.status !== "offline") return labels.onlineText;
    if (!p.last_seen) return APPROX.includes(p.last_seen_approx) ? labels[p.last_seen_approx] || "" : "";
    const found = elapsed(Date.parse(p.last_seen), Date.now());
    if (!found) return labels.justNow || relativeNow.format(0, "second");
    return agoText(found[0], found[1]);
  }

  function renderText(id, p) {
    document.querySelectorAll(byId(LAST_SEEN, id)).forEach((el) => {
      const text = lastSeenText(p);
      if (el.textContent !== text) el.textContent = text;
    });
    if (p.last_seen_approx && p.last_seen_approx !== "long_ago") refreshApproxAfterMidnight();
  }

  // The approximate last seen moves at UTC midnight, and the server sends nothing then (a diff
  // to every open view at once would be a thundering herd): each page re-reads the users it
  // shows approximately, once, at a random moment of the new UTC day's first 15 minutes.
  let approxTimer = null;
  function refreshApproxAfterMidnight() {
    if (approxTimer) return;
    const now = Date.now();
    const midnight = (Math.floor(now / 86400000) + 1) * 86400000;
    approxTimer = setTimeout(() => {
      approxTimer = null;
      const ids = Array.from(latest)
        .filter(([, p]) => p.last_seen_approx && p.last_seen_approx !== "long_ago")
        .map(([id]) => id);
      if (ids.length) load(ids);
    }, midnight - now + Math.random() * 15 * 60000);
  }

  // The custom status as {% presence_text %} writes it: the emoji, then the text.
  const customStatus = (p) =>
    [p.emoji, p.text].filter((part) => typeof part === "string" && part).join(" ");

  function renderStatusText(id, p) {
    const text = customStatus(p);
    document.querySelectorAll(byId(STATUS_TEXT, id)).forEach((el) => {
      if (el.textContent !== text) el.textContent = text; // text, never markup
    });
  }

  function render(id, p) {
    renderStatusText(id, p);
    document.querySelectorAll(byId(USER, id)).forEach((el) => {
      STATUSES.forEach((s) => el.classList.toggle(`presence-dot--${s}`, s === p.status));
      if (el.classList.contains("presence-dot")) {
        const label = labels[p.status] || p.status;
        el.setAttribute("title", label);
        el.setAttribute("aria-label", label);
      }
    });
    renderText(id, p);
  }

  // Render and announce {id: presence}, read at `at` (an HTTP answer: its start's number).
  function apply(presences, at = nextSequence()) {
    const ids = Object.keys(presences);
    if (!ids.length) return;
    ids.forEach((id) => {
      latest.set(id, presences[id]);
      renderedAt.set(id, at);
      leftOut.delete(id);
      render(id, presences[id]);
      memberPresence(id, presences[id]);
    });
    arrangeFriends();
    emit("update", { presences });
  }

  // Live online-friends lists ({% online_friends_list %}): each [data-presence-friend] item is
  // shown while its friend is online (online, idle or dnd), the most recently active first, at
  // most data-presence-friends-limit of them; the others stay in the list, hidden and watched.
  function arrangeFriends() {
    document.querySelectorAll("[data-presence-friends]").forEach((box) => {
      const limit = Number(box.dataset.presenceFriendsLimit) || Infinity;
      const items = Array.from(box.querySelectorAll("[data-presence-friend]"));
      items.forEach((item) => {
        const p = latest.get(item.dataset.presenceFriend);
        if (!p) return; // not known yet: as the server rendered it
        item.dataset.presenceLastSeenAt = p.last_seen || "";
        item.dataset.presenceOnline = p.status !== "offline" ? "1" : "";
      });
      const online = (item) =>
        item.dataset.presenceOnline !== undefined
          ? item.dataset.presenceOnline === "1"
          : !item.hidden;
      const when = (item) => Date.parse(item.dataset.presenceLastSeenAt || "") || 0;
      const shown = items.filter(online).sort((a, b) => when(b) - when(a)).slice(0, limit);
      const list = items.length ? items[0].parentNode : null;
      shown.forEach((item, index) => {
        if (list && list.children[index] !== item) list.insertBefore(item, list.children[index]);
      });
      items.forEach((item) => {
        item.hidden = !shown.includes(item);
      });
      box.querySelectorAll("[data-presence-friends-empty]").forEach((el) => {
        el.hidden = shown.length > 0;
      });
      document.querySelectorAll("[data-presence-friends-count]").forEach((el) => {
        el.textContent = String(shown.length);
      });
    });
  }

  function watchedIds(root = document) {
    const found = Array.from(root.querySelectorAll(WATCHED));
    if (root.matches && root.matches(WATCHED)) found.push(root);
    const ids = [];
    found.forEach((el) => NAMING.forEach((attribute) => ids.push(el.getAttribute(attribute))));
    return Array.from(new Set(ids.filter((id) => id)));
  }

  // --- polling (no socket, or while it is down) --------------------------------------------

  let pollDelay = POLL_MS;
  let pollTimer = null;

  async function fetchChunk(ids) {
    const url = `${endpoint}${endpoint.includes("?") ? "&" : "?"}users=${ids.map(encodeURIComponent).join(",")}`;
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) throw new Error(`presence: HTTP ${response.status}`);
    return (await response.json()).presences || {};
  }

  // Ids a successful read left out (no such user): refresh() while the socket is open does not
  // ask for them again.
  const leftOut = new Set();

  // Fetch presence of `ids` (default: every watched user), render and announce it.
  // Resolves to {id: presence}; never rejects: errors (401 once logged out, network, 5xx)
  // only lengthen the polling delay, doubling up to MAX_POLL_DELAY_MS (a read made while the
  // socket is open leaves it: polling starts 15 s after a later close).
  // A user rendered by what started after this request (a socket push, a later request that
  // answered first) keeps what is shown: the answer was read before it.
  async function load(ids = watchedIds()) {
    if (!ids.length || !endpoint) return {};
    const chunks = [];
    for (let i = 0; i < ids.length; i += MAX_IDS) chunks.push(ids.slice(i, i + MAX_IDS));
    const started = nextSequence();
    const socketDown = !isOpen();
    let presences;
    try {
      presences = Object.assign({}, ...(await Promise.all(chunks.map(fetchChunk))));
    } catch (e) {
      if (socketDown) pollDelay = Math.min(pollDelay * 2, MAX_POLL_DELAY_MS);
      return {};
    }
    if (socketDown) pollDelay = POLL_MS;
    ids.forEach((id) => presences[id] === undefined && leftOut.add(id));
    const fresh = {};
    const answer = {}; // what is shown now
    Object.keys(presences).forEach((id) => {
      if ((renderedAt.get(id) || 0) < started) fresh[id] = answer[id] = presences[id];
      else if (latest.has(id)) answer[id] = latest.get(id);
    });
    apply(fresh, started);
    return answer;
  }

  const polling = () => state === "polling" || state === "closed";

  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
  }

  function schedulePoll() {
    clearTimeout(pollTimer);
    // Hidden tabs do not poll; becoming visible polls at once.
    pollTimer = polling() && !document.hidden ? setTimeout(poll, pollDelay) : null;
  }

  async function poll() {
    stopPolling();
    pollRooms();
    pollCount();
    pollRoomCounts();
    const presences = await load();
    schedulePoll();
    return presences;
  }

  // --- the socket ---------------------------------------------------------------------------

  let socket = null;
  let attempts = 0; // connections in a row that failed or did not last
  let retryTimer = null;
  let retryNotBefore = 0; // Date.now() before which no connection is tried (4429, 4408)
  let stableTimer = null;
  let beatTimer = null;
  const subscribed = new Set(); // ids subscribed on this connection
  const snapshotted = new Set(); // ... whose presence_state has arrived
  const early = new Map(); // id -> a diff that arrived before its snapshot
  // id -> the stamp of what is shown (the snapshot's, kept across reconnects: resuming)
  const stamps = new Map();
  const waiting = []; // set_status frames sent, waiting for their "status" reply, in order
  const feeds = new Set(); // live timelines watched (sent again on every new connection)
  // activity id -> the timelines it was shown for, the latest SEEN_ACTIVITIES: an activity can
  // come twice (an announcement sent again after a channel-layer failure that had landed)
  const seenActivities = new Map();
  const SEEN_ACTIVITIES = 1000;
  // timeline -> the newest activity id shown on it: sent as watch_feed's "after", so the
  // server sends what was posted while the socket was down (or before the watch was answered)
  const feedAfter = new Map();
  // timeline -> the newest live activity id shown while its watch with "after" waits for its
  // missed_activities (null: none yet). Its "after" moves past them only with that answer: a
  // socket that drops before it must ask again from the "after" sent, or what the answer held
  // (older than the live ones) is skipped for good.
  const feedAwaiting = new Map();

  const isOpen = () => socket !== null && socket.readyState === WebSocket.OPEN;

  function send(message) {
    if (isOpen()) socket.send(JSON.stringify(message));
  }

  function connect() {
    clearTimeout(retryTimer);
    if (!socketUrl || socket || state === "unauthorized" || state === "forbidden") return;
    setState("connecting");
    const ws = new WebSocket(openingUrl());
    socket = ws;
    ws.onopen = () => {
      everOpened = true;
      // Subscribed by the opening request: its answer is on its way (sync sends the rest).
      openingIds.forEach((id) => subscribed.add(id));
      // Not at once: a server that accepts and drops every connection must not be hammered.
      stableTimer = setTimeout(() => {
        attempts = 0;
      }, STABLE_MS);
      setState("open");
      stopPolling();
      heartbeat();
      beatTimer = setInterval(heartbeat, HEARTBEAT_MS);
      feeds.forEach((feed) => send(watchFrame(feed)));
      countWatched = false;
      watchCount();
      countedRooms.clear();
      refusedCounts.clear();
      watchRoomCounts();
      joinRooms();
      sync();
    };
    ws.onmessage = (event) => receive(event.data);
    // An error is always followed by a close.
    ws.onclose = (event) => {
      if (socket !== ws) return;
      socket = null;
      clearInterval(beatTimer);
      clearTimeout(stableTimer);
      subscribed.clear();
      snapshotted.clear();
      early.clear();
      joinedRooms.clear(); // joined again on the next connection
      enteredRooms.clear();
      refusedRooms.clear();
      clearRetries(roomRetries);
      // Counts waiting for their retry are watched at once on the next connection.
      clearRetries(countRetries);
      roomAsks.clear(); // never answered now
      // Pages asked over this socket are never answered: resolved unmerged, as a page of a
      // replaced list is (the fresh room_state's "next" pages from its own list).
      roomPages.forEach((pending, room) => {
        if (pending.socket === ws) settlePage(room, (p) => p.resolve({}));
      });
      // Unanswered status changes are sent again over HTTP (setting a status is idempotent).
      waiting.splice(0).forEach((entry) => {
        clearTimeout(entry.timer);
        if (!entry.timedOut) postStatus(entry.change).then(entry.resolve, entry.reject);
      });
      if (event.code === CLOSE_UNAUTHORIZED) {
        // Not logged in (any more): the HTTP endpoint would answer 401 too. Stop.
        setState("unauthorized", event.code);
        return;
      }
      if (event.code === CLOSE_FORBIDDEN) {
        // A page of an origin the site does not allow: every retry would be refused. Stop.
        setState("forbidden", event.code);
        return;
      }
      setState("closed", event.code);
      if (!everOpened && !toldWhyPolling) {
        // Never opened: usually no ASGI server or no WebSocket route (a 404 on the handshake).
        toldWhyPolling = true;
        console.warn(
          `presence: the WebSocket ${socketUrl} could not be opened (code ${event.code}); ` +
            `polling ${endpoint} instead, and retrying. Is the site served by an ASGI server ` +
            "(daphne, uvicorn; runserver with \"daphne\" in INSTALLED_APPS) with " +
            "presence.routing.websocket_urlpatterns in asgi.py? See the docs, Deployment.",
        );
      }
      // A poll already due keeps its time: a server refusing every handshake at once must not
      // put off polling for as long as the retries come faster than POLL_MS.
      if (!pollTimer) schedulePoll();
      const delay = retryDelay(event.code);
      retryNotBefore = slowDown(event.code) ? Date.now() + delay : 0;
      retryTimer = setTimeout(connect, delay);
    };
  }

  // Exponential backoff with "equal jitter": half the delay fixed, half random, so that the
  // pages of a restarted server do not all come back in the same instant.
  const backoff = (tries) => {
    const delay = Math.min(RETRY_MAX_MS, RETRY_MS * 2 ** (tries - 1));
    return delay / 2 + (Math.random() * delay) / 2;
  };

  // A room's join or count answered "unavailable": asked again after the backoff of its tries
  // (retries: room -> {tries, timer}); a later answer for it deletes its entry.
  function retryLater(retries, room, again) {
    const retry = retries.get(room) || { tries: 0, timer: null };
    retry.tries += 1;
    clearTimeout(retry.timer);
    retry.timer = setTimeout(() => {
      retry.timer = null;
      again();
    }, backoff(retry.tries));
    retries.set(room, retry);
  }

  function clearRetries(retries) {
    retries.forEach((retry) => clearTimeout(retry.timer));
    retries.clear();
  }
  const slowDown = (code) => code === CLOSE_RATE_LIMITED || code === CLOSE_TOO_SLOW;

  function retryDelay(code) {
    attempts += 1;
    const jittered = backoff(attempts);
    return slowDown(code) ? Math.max(RATE_LIMITED_MS, jittered) : jittered;
  }

  // Reconnect now (the tab came back, the network is back) rather than at the end of the
  // backoff, unless the server asked for the wait (4429, 4408): its retry stays as timed.
  function reconnectSoon() {
    if (state === "closed" && Date.now() >= retryNotBefore) connect();
  }

  function receive(raw) {
    let message;
    try {
      message = JSON.parse(raw);
    } catch (e) {
      return;
    }
    const presences = message.presences || {};
    if (message.type === "presence_state") {
      // Only users still subscribed: the answer of a subscribe whose users left the page
      // meanwhile (unsubscribed) is no snapshot of their next subscription.
      const now = {};
      Object.keys(presences).forEach((id) => {
        if (!subscribed.has(id)) return;
        snapshotted.add(id);
        // A diff cannot be older than the snapshot it overtook: it describes a change made
        // after this subscription began. Keep it.
        now[id] = early.has(id) ? early.get(id) : presences[id];
        early.delete(id);
        if (message.stamp) stamps.set(id, message.stamp);
      });
      // Unchanged since the stamp the subscribe sent: the page shows them right already.
      (message.unchanged || []).map(String).forEach((id) => {
        if (!subscribed.has(id)) return;
        snapshotted.add(id);
        if (early.has(id)) now[id] = early.get(id);
        else renderedAt.set(id, nextSequence()); // confirmed: an HTTP read before is older
        early.delete(id);
        if (message.stamp) stamps.set(id, message.stamp);
      });
      apply(now);
    } else if (message.type === "stamp") {
      // A fresh stamp of all this connection was answered for (sent once the server proved
      // every change before it reached this page): a reconnect after RESUME_WINDOW resumes.
      snapshotted.forEach((id) => stamps.set(id, message.stamp));
    } else if (message.type === "presence_diff") {
      const now = {};
      Object.keys(presences).forEach((id) => {
        if (subscribed.has(id) && !snapshotted.has(id)) early.set(id, presences[id]);
        else if (subscribed.has(id)) now[id] = presences[id];
      });
      apply(now);
    } else if (message.type === "room_state" || message.type === "room_diff") {
      // A room_state answers the room's oldest join (or comes unprompted: after an outage).
      const join = message.type === "room_state" && answeredAsk(message.room, "join");
      applyRoom(message, Boolean(join));
    } else if (message.type === "room_page") {
      const ask = answeredAsk(message.room, "more");
      // Unless it is the late answer of a page that timed out (a page of a list replaced
      // since resolves unmerged: mergePage).
      if (ask && roomPages.get(message.room) === ask.page) {
        settlePage(message.room, (pending) =>
          pending.resolve(mergePage(message.room, message, pending.view, pending.after))
        );
      }
    } else if (message.type === "online_count") {
      showCount(message.count);
    } else if (message.type === "room_count") {
      // Counted again: a later outage starts its backoff afresh (unless a retry is pending).
      const retry = countRetries.get(message.room);
      if (retry && !retry.timer) countRetries.delete(message.room);
      showRoomCount(message.room, message.count);
    } else if (message.type === "activity") {
      showActivity(message.feeds, message.activity);
      if (Array.isArray(message.feeds) && message.activity) {
        message.feeds.forEach((feed) => noteLive(feed, message.activity.id));
      }
    } else if (message.type === "missed_activities") {
      // The answer of a watch_feed with "after": oldest first.
      const feed = message.feed;
      if (!feeds.has(feed)) return;
      (message.activities || []).forEach((activity) => {
        showActivity([feed], activity);
        noteNewest(feed, activity.id);
      });
      // The live activities shown while it was read are newer than all it holds.
      if (feedAwaiting.has(feed)) noteNewest(feed, feedAwaiting.get(feed));
      feedAwaiting.delete(feed);
      if (message.reload) emit("feed_reload", { feed });
    } else if (message.type === "status") {
      // The answer of the oldest set_status (one that timed out takes its own late answer).
      const entry = waiting.shift();
      if (entry) {
        clearTimeout(entry.timer);
        entry.resolve(message.presence);
      }
      emit("status", { presence: message.presence });
    } else if (message.type === "error" && typeof message.room === "string") {
      // An error naming a room answers the room's oldest join or room_more (never a
      // set_status: those name no room), or, unprompted, "forbidden" says the room's rule
      // took the connection out of the room. Anything else is the late answer of a page that
      // was given up on: ignored.
      const room = message.room;
      if (refusedCount(room, message.code, message.answers)) {
        emit("error", { code: message.code, message: message.message });
        return;
      }
      const ask = answeredAsk(room);
      if (ask && ask.kind === "more") {
        if (roomPages.get(room) === ask.page) {
          const refused = failure(message.code, message.message);
          settlePage(room, (pending) => pending.reject(refused));
        }
      } else if (ask || message.code === "forbidden") {
        refusedJoin(room, message.code);
      }
      emit("error", { code: message.code, message: message.message });
    } else if (message.type === "error") {
      // Errors carry no request id: those answering a room's frame name the room (above), and
      // those answering a watch_feed or unwatch_feed name the feed. Every error answering a
      // frame of a type the server accepts names that type ("answers"): only one answering a
      // set_status settles it. A server that does not send "answers" is read as before: this
      // client's subscribe and heartbeat frames are well-formed, so an error other than these
      // answers the oldest pending set_status; never an unknown_type, whichever frame it
      // answers (a site without the activity feed answers watch_feed so): set_status is
      // always known.
      const notStatusError = [
        "unknown_users",
        "too_many_subscriptions",
        "unknown_feed",
        "too_many_feeds",
        "unknown_type",
      ];
      const answersFeed = typeof message.feed === "string";
      const answersStatus =
        typeof message.answers === "string"
          ? message.answers === "set_status"
          : !answersFeed && !notStatusError.includes(message.code);
      if (answersStatus && waiting.length) {
        const entry = waiting.shift();
        clearTimeout(entry.timer);
        entry.reject(failure(message.code, message.message));
      }
      const detail = { code: message.code, message: message.message };
      if (answersFeed) detail.feed = message.feed;
      emit("error", detail);
    }
  }

  // An "activity" event for the timelines this activity has not been shown for (a repeat of
  // one shown already is dropped).
  function showActivity(names, activity) {
    if (!Array.isArray(names) || !activity) return;
    const shown = seenActivities.get(activity.id) || new Set();
    const fresh = names.filter((name) => !shown.has(name));
    if (!fresh.length) return;
    fresh.forEach((name) => shown.add(name));
    seenActivities.delete(activity.id); // (re-inserted: the latest are kept)
    seenActivities.set(activity.id, shown);
    if (seenActivities.size > SEEN_ACTIVITIES) {
      seenActivities.delete(seenActivities.keys().next().value);
    }
    emit("activity", { feeds: fresh, activity });
  }

  function noteNewest(feed, id) {
    if (Number.isInteger(id) && id >= 0 && !(feedAfter.get(feed) >= id)) feedAfter.set(feed, id);
  }

  // A live activity's id: the timeline's "after" at once, unless a watch with "after" waits for
  // its answer (kept until it comes: feedAwaiting).
  function noteLive(feed, id) {
    if (!feedAwaiting.has(feed)) noteNewest(feed, id);
    else if (Number.isInteger(id) && !(feedAwaiting.get(feed) >= id)) feedAwaiting.set(feed, id);
  }

  // The watch_feed frame to send for a timeline; one with "after" waits for its answer.
  function watchFrame(feed) {
    const frame = { type: "watch_feed", feed };
    if (feedAfter.has(feed)) {
      frame.after = feedAfter.get(feed);
      feedAwaiting.set(feed, null);
    }
    return frame;
  }

  // Subscribe to the users on the page that are not subscribed yet, unsubscribe from those
  // gone; with no socket, fetch the added users whose presence is unknown.
  const added = new Set(); // ids of elements added since the last sync
  function sync() {
    syncTimer = null;
    const ids = watchedIds();
    const present = new Set(ids);
    const unknown = Array.from(added).filter((id) => present.has(id) && !latest.has(id));
    added.clear();
    if (isOpen()) {
      const fresh = ids.filter((id) => !subscribed.has(id));
      const gone = Array.from(subscribed).filter((id) => !present.has(id));
      // One subscribe per stamp (null: none, the full snapshot); each answer brings a stamp.
      bySince(fresh).forEach((group, since) => {
        for (let i = 0; i < group.length; i += MAX_IDS) {
          const chunk = group.slice(i, i + MAX_IDS);
          chunk.forEach((id) => subscribed.add(id));
          send({ type: "subscribe", users: chunk, since });
        }
      });
      if (gone.length) {
        gone.forEach((id) => {
          subscribed.delete(id);
          snapshotted.delete(id);
          early.delete(id);
          latest.delete(id); // no longer kept fresh
          leftOut.delete(id);
          stamps.delete(id);
        });
        send({ type: "unsubscribe", users: gone });
      }
    } else if (polling() && unknown.length) {
      load(unknown);
    }
  }

  // The ids grouped by the stamp each is shown with: its last snapshot's, or its page's.
  function bySince(ids) {
    const groups = new Map();
    ids.forEach((id) => {
      const since = stamps.get(id) || pageStamp(id);
      if (!groups.has(since)) groups.set(since, []);
      groups.get(since).push(id);
    });
    return groups;
  }

  // The socket's URL with the subscription of its opening request (?users=...&since=...) and
  // the client's idle state (&state=idle): the server answers it at connect, one frame and one
  // round trip before a subscribe would be. The largest group of the page's users sharing a
  // stamp, as many as fit in URL_IDS_LENGTH characters (proxies and servers limit a request's
  // length); sync subscribes the rest.
  let openingIds = [];
  function openingUrl() {
    openingIds = [];
    let since = null;
    let best = [];
    bySince(watchedIds()).forEach((group, stamp) => {
      if (group.length > best.length) [since, best] = [stamp, group];
    });
    const parts = [];
    let length = 0;
    for (const id of best.slice(0, MAX_IDS)) {
      const part = encodeURIComponent(id); // a comma inside an id is %2C
      if (length + part.length + 1 > URL_IDS_LENGTH) break;
      parts.push(part);
      openingIds.push(id);
      length += part.length + 1;
    }
    // An idle client (a hidden tab reconnecting) opens idle: its user is not shown online to
    // every watcher, and idle again at its first heartbeat.
    const fields = [];
    if (parts.length) fields.push(`users=${parts.join(",")}`, `since=${encodeURIComponent(since || "")}`);
    if (activity === "idle") fields.push("state=idle");
    const query = fields.join("&");
    if (!query) return socketUrl;
    return socketUrl + (socketUrl.includes("?") ? "&" : "?") + query;
  }

  // The stamp every element of this user carries (the server rendered them all at once), or
  // null: an element of the site's own markup shows nothing the server resolved.
  function pageStamp(id) {
    const found = Array.from(
      document.querySelectorAll(NAMING.map((attribute) => byId(attribute, id)).join(", "))
    );
    const since = found.length ? found[0].getAttribute(SINCE) : null;
    return since && found.every((el) => el.getAttribute(SINCE) === since) ? since : null;
  }

  let syncTimer = null;
  function scheduleSync() {
    // Together, so that inserting a list of 50 people costs one frame or one request.
    if (!syncTimer) syncTimer = setTimeout(sync, isOpen() ? 50 : 250);
  }

  // --- activity: heartbeats and idle detection ----------------------------------------------

  let activity = "active";
  let lastInput = Date.now();
  let idleTimer = null;

  function heartbeat() {
    send({ type: "heartbeat", state: activity });
  }

  // Idle after IDLE_AFTER without input, or while the tab is hidden; a change is reported
  // at once. The timer is armed only while active, for the moment idleness would begin.
  function checkActivity() {
    clearTimeout(idleTimer);
    const quiet = Date.now() - lastInput;
    const next = document.hidden || quiet >= IDLE_MS ? "idle" : "active";
    if (next !== activity) {
      activity = next;
      heartbeat();
    }
    if (activity === "active") idleTimer = setTimeout(checkActivity, IDLE_MS - quiet + 50);
  }

  function onInput() {
    lastInput = Date.now();
    if (activity === "idle" && !document.hidden) checkActivity();
  }

  // --- status -------------------------------------------------------------------------------

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    if (input) return input.value;
    const cookie = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
    return cookie ? decodeURIComponent(cookie.slice("csrftoken=".length)) : "";
  }

  async function postStatus(change) {
    if (!statusEndpoint) throw failure("unavailable", "No status endpoint.");
    const response = await fetch(statusEndpoint, {
      method: "POST",
      credentials: "same-origin",
      headers: {
        Accept: "application/json",
        "Content-Type": "application/json",
        "X-CSRFToken": csrfToken(),
      },
      body: JSON.stringify(change),
    });
    let body = {};
    try {
      body = await response.json();
    } catch (e) {
      // not JSON: described by the status code below
    }
    if (!response.ok) {
      const error = body.error || { code: `http_${response.status}`, message: response.statusText };
      emit("error", error);
      throw failure(error.code, error.message);
    }
    emit("status", { presence: body.presence });
    if (!isOpen()) load(); // nothing pushes the change to this page's dots
    return body.presence;
  }

  // Answers come in the order of the changes. One that timed out stays in `waiting` (settled:
  // its resolve and reject do nothing more), so that its late answer is taken by it and not by
  // the next change; a close drops it rather than posting it again.
  function setStatus(change = {}) {
    if (!isOpen()) return postStatus(change);
    return new Promise((resolve, reject) => {
      const entry = { change, resolve, reject };
      entry.timer = setTimeout(() => {
        entry.timedOut = true;
        reject(failure("timeout", "The server did not answer."));
      }, STATUS_TIMEOUT_MS);
      waiting.push(entry);
      send(Object.assign({}, change, { type: "set_status" }));
    });
  }

  // --- the online count ({% online_count %}) ---------------------------------------------

  const COUNT = "data-presence-online-count";
  const countElements = () => document.querySelectorAll(`[${COUNT}]`);
  const numbers = (() => {
    try {
      return new Intl.NumberFormat(document.documentElement.lang || undefined);
    } catch (e) {
      return new Intl.NumberFormat();
    }
  })();

  // The count as the server writes it ({% online_count %}: Django's number_format, from
  // data-presence-labels' numberGrouping and thousandSeparator): a group size, or the sizes
  // from the right as Python's locale gives them ([3, 2, 0]: 0 repeats the last one); 0 groups
  // nothing. Intl.NumberFormat where the page did not say.
  const reversed = (text) => Array.from(text).reverse().join("");
  function formatCount(count) {
    const grouping = labels.numberGrouping;
    const separator = labels.thousandSeparator;
    const sizes = Array.isArray(grouping) ? grouping.slice() : [grouping, 0];
    const known = sizes.length && sizes.every(Number.isInteger) && typeof separator === "string";
    if (!known || !Number.isSafeInteger(count) || count < 0) return numbers.format(count);
    if (!grouping) return String(count);
    let size = sizes.shift();
    let grouped = "";
    let inGroup = 0;
    for (const digit of reversed(String(count))) {
      if (inGroup && inGroup === size) {
        if (sizes.length) size = sizes.shift() || size;
        grouped += reversed(separator);
        inGroup = 0;
      }
      grouped += digit;
      inGroup += 1;
    }
    return reversed(grouped);
  }

  let countWatched = false; // watch_count sent on this connection

  // Ask the socket for the count once the page shows one (also an element added later).
  function watchCount() {
    if (countWatched || !isOpen() || !countElements().length) return;
    countWatched = true;
    send({ type: "watch_count" });
  }

  // The sequence number of the count shown (see renderedAt): an HTTP count is shown only if
  // its read started after what showed the count shown.
  let countShownAt = 0;

  function showCount(count, at = nextSequence()) {
    if (typeof count !== "number" || !Number.isFinite(count)) return;
    countShownAt = at;
    const text = formatCount(count);
    countElements().forEach((el) => {
      if (el.textContent !== text) el.textContent = text;
    });
    emit("online_count", { count });
  }

  // Without a socket the count is read over HTTP with each poll (no login needed).
  function pollCount() {
    const el = countElements()[0];
    const url = el && el.getAttribute(COUNT);
    if (!url) return;
    const started = nextSequence();
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : null))
      .then((body) => body && countShownAt < started && showCount(body.count, started))
      .catch(() => {}); // the next poll tries again
  }

  // --- rooms' counts ({% room_count %}) -----------------------------------------------------
  // Each [data-presence-room-count-of="kind:id"] shows the room's count as the viewer may see
  // it. The socket watches the room's count (watch_room_count: the room is not joined, so the
  // viewer is neither listed nor counted there, and no MAX_ROOMS place is taken) and pushes a
  // room_count frame when it changes; without a socket each poll reads every such room's count
  // in one request (the elements' data-presence-room-counts-endpoint).
  const COUNT_OF = "data-presence-room-count-of";
  const COUNTS_ENDPOINT = "data-presence-room-counts-endpoint";
  // The rooms one request may name: the endpoint's ROOM_LIST_LIMIT, as the elements were
  // rendered with it (its default where an element does not say).
  const COUNTS_LIMIT = "data-presence-room-counts-limit";
  const ROOM_COUNTS_PER_READ = 100;
  let roomCountsPerRead = 0; // 0: not read from the elements yet
  const countedRooms = new Set(); // rooms whose count is watched on this connection
  // Rooms whose watch was refused on this connection: room -> code (not asked again on it;
  // too_many_watched_rooms until the page drops a watched room)
  const refusedCounts = new Map();
  const countRetries = new Map(); // room -> {tries, timer}: "unavailable", watched again later
  const roomCountShownAt = new Map(); // room -> sequence of the count shown (see renderedAt)
  let roomCountsTimer = null;

  const countRoomElements = () => document.querySelectorAll(`[${COUNT_OF}]`);
  function pageCountRooms() {
    const rooms = new Set();
    countRoomElements().forEach((el) => rooms.add(el.getAttribute(COUNT_OF)));
    rooms.delete("");
    return rooms;
  }

  // Watch the counts of the rooms on the page not watched on this connection; unwatch those
  // no longer there.
  function watchRoomCounts() {
    roomCountsTimer = null;
    if (!isOpen()) return;
    const wanted = pageCountRooms();
    refusedCounts.forEach((code, room) => wanted.has(room) || refusedCounts.delete(room));
    let freed = false;
    countedRooms.forEach((room) => {
      if (wanted.has(room)) return;
      countedRooms.delete(room);
      send({ type: "unwatch_room_count", room });
      freed = true;
    });
    if (freed) {
      refusedCounts.forEach((code, room) => {
        if (code === "too_many_watched_rooms") refusedCounts.delete(room);
      });
    }
    wanted.forEach((room) => {
      if (countedRooms.has(room) || refusedCounts.has(room)) return;
      const retry = countRetries.get(room);
      if (retry && retry.timer) return; // watched again when its backoff ends
      countedRooms.add(room);
      send({ type: "watch_room_count", room });
    });
  }

  function scheduleRoomCounts() {
    if (!roomCountsTimer) roomCountsTimer = setTimeout(watchRoomCounts, 50);
  }

  // A null count (a poll's answer) is a room the viewer may no longer see (its rule refuses
  // them now, or its kind is no longer declared): shown as nothing, as the tag renders it.
  function showRoomCount(room, count, at = nextSequence()) {
    if (typeof room !== "string") return;
    if (count !== null && (typeof count !== "number" || !Number.isFinite(count))) return;
    roomCountShownAt.set(room, at);
    const text = count === null ? "" : formatCount(count);
    countRoomElements().forEach((el) => {
      if (el.getAttribute(COUNT_OF) === room && el.textContent !== text) el.textContent = text;
    });
    if (count !== null) emit("room_count", { room, count });
  }

  // An error naming a room answers a watch_room_count (or, unprompted "forbidden", says the
  // room's rule no longer lets the viewer see a count it watches and does not join): whether
  // it was one. "unavailable" and "internal_error" are watched again with backoff; the others
  // refuse the room's count on this connection. A room the viewer may no longer see
  // (forbidden, unknown_room) shows nothing, as a poll's null count does; too_many_watched_rooms
  // keeps its number (still right, only no longer live).
  function refusedCount(room, code, answers) {
    const mine =
      answers === "watch_room_count" ||
      answers === "unwatch_room_count" ||
      (answers === undefined &&
        code === "forbidden" &&
        countedRooms.has(room) &&
        !joinedRooms.has(room));
    if (!mine) return false;
    if (answers === "unwatch_room_count" || !countedRooms.has(room)) return true;
    countedRooms.delete(room);
    if (code === "unavailable" || code === "internal_error") {
      retryLater(countRetries, room, watchRoomCounts);
    } else {
      refusedCounts.set(room, code);
      if (code === "forbidden" || code === "unknown_room") showRoomCount(room, null);
    }
    return true;
  }

  // Without a socket the counts are read over HTTP with each poll: one request for every
  // room on the page (at most the endpoint's limit each), one id per room of HTTP_READ_LIMIT.
  function pollRoomCounts() {
    const first = countRoomElements()[0];
    const url = first && first.getAttribute(COUNTS_ENDPOINT);
    const rooms = Array.from(pageCountRooms());
    if (!url || !rooms.length) return;
    if (!roomCountsPerRead) {
      const limit = parseInt(first.getAttribute(COUNTS_LIMIT), 10);
      roomCountsPerRead = limit > 0 ? limit : ROOM_COUNTS_PER_READ;
    }
    for (let i = 0; i < rooms.length; i += roomCountsPerRead) {
      readRoomCounts(url, rooms.slice(i, i + roomCountsPerRead));
    }
  }

  function readRoomCounts(url, rooms) {
    const query = rooms.map((room) => `room=${encodeURIComponent(room)}`).join("&");
    const started = nextSequence();
    fetch(`${url}${url.includes("?") ? "&" : "?"}${query}`, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then((response) => {
        if (response.ok) return response.json();
        if (response.status !== 400 || rooms.length < 2) return null;
        return response.json().then((body) => {
          if (body && body.error && body.error.code === "too_many_rooms") {
            // The site's limit is below the one the page was rendered with (lowered since):
            // half as many rooms a request from now on, these read again at once.
            const half = Math.ceil(rooms.length / 2);
            roomCountsPerRead = Math.min(roomCountsPerRead, half);
            readRoomCounts(url, rooms.slice(0, half));
            readRoomCounts(url, rooms.slice(half));
          }
          return null;
        });
      })
      .then((body) => {
        const counts = (body && body.counts) || {};
        Object.keys(counts).forEach((room) => {
          if ((roomCountShownAt.get(room) || 0) < started) {
            showRoomCount(room, counts[room], started);
          }
        });
      })
      .catch(() => {}); // the next poll tries again
  }

  // --- rooms ({% room_presence %}) ---------------------------------------------------------
  // Every [data-presence-room="kind:id"] element on the page is joined once the socket opens
  // (with the JSON object of its data-presence-room-meta, or null), joined again after every
  // reconnect, and left on pagehide or when its last element leaves the page. room_state and
  // room_diff keep its members (avatar, dot, name), its "others" and its count live. Each
  // listed member comes with its card ({name, avatar}, PRESENCE["MEMBER_CARD"]): the avatar
  // image, else the name's initials. A member without a card (a server that could not read
  // it) is named from the server-rendered members or the room's JSON endpoint
  // (data-presence-room-endpoint).
  const ROOM = "data-presence-room";
  const ROOM_MEMBER = "data-presence-room-member";
  const NAME_RETRY_MS = 5000; // a room's endpoint is asked for names at most this often
  const joinedRooms = new Set(); // rooms joined on this connection
  const enteredRooms = new Set(); // ... whose room_state came (in the room: a join again keeps it)
  // Rooms whose join was refused on this connection, not joined again on it: room -> code.
  // unknown_room, forbidden, invalid_value stay refused until the next connection (or a
  // joinRoom call); too_many_rooms until the page leaves a room.
  const refusedRooms = new Map();
  // Joins refused "unavailable" (Redis is down), joined again with backoff: room -> {tries, timer}
  const roomRetries = new Map();
  // room -> {members: Map(id -> {meta, presence}), others, count, next, paged, pagedIds: the
  // members listed by more() only, after the first page}
  const roomViews = new Map();
  const roomMeta = new Map(); // room -> meta given to presence.joinRoom (wins over the attribute)
  const scriptRooms = new Set(); // rooms joined by presence.joinRoom, with or without an element
  const names = new Map(); // user id -> display name
  const avatars = new Map(); // user id -> avatar URL (absent: initials)
  const nameFetches = new Map(); // room -> time of its last fetch of names
  const roomPages = new Map(); // room -> its more() waiting: {promise, resolve, reject, timer, view}
  // Requests of each room sent on this connection and not answered yet, in the order sent (the
  // server answers a connection's frames in order): {kind: "join"} (answered by a room_state
  // or an error naming the room) and {kind: "more", page} (a room_page or such an error; one
  // that timed out stays, so that its late answer is not taken for a join's).
  const roomAsks = new Map();
  let roomsTimer = null;

  function askRoom(room, ask) {
    if (!roomAsks.has(room)) roomAsks.set(room, []);
    roomAsks.get(room).push(ask);
  }

  // The oldest unanswered request of the room (of that kind, if given), taken; or null.
  function answeredAsk(room, kind = null) {
    const asks = roomAsks.get(room) || [];
    const index = kind ? asks.findIndex((ask) => ask.kind === kind) : 0;
    if (index < 0 || index >= asks.length) return null;
    const [ask] = asks.splice(index, 1);
    if (!asks.length) roomAsks.delete(room);
    return ask;
  }

  function sendJoin(room) {
    if (!isOpen()) return;
    askRoom(room, { kind: "join" });
    send({ type: "join", room, meta: metaOf(room) });
  }

  const roomBoxes = (room) => document.querySelectorAll(byId(ROOM, room));

  function pageRooms() {
    const found = new Set(scriptRooms);
    document.querySelectorAll(`[${ROOM}]`).forEach((el) => {
      if (el.getAttribute(ROOM)) found.add(el.getAttribute(ROOM));
    });
    return found;
  }

  function metaOf(room) {
    if (roomMeta.has(room)) return roomMeta.get(room);
    const box = roomBoxes(room)[0];
    const raw = box && box.getAttribute("data-presence-room-meta");
    if (!raw) return null;
    try {
      const meta = JSON.parse(raw);
      return meta && typeof meta === "object" && !Array.isArray(meta) ? meta : null;
    } catch (e) {
      return null;
    }
  }

  // Join the rooms on the page not joined on this connection; leave those no longer there.
  function joinRooms() {
    roomsTimer = null;
    if (!isOpen()) return;
    const wanted = pageRooms();
    refusedRooms.forEach((code, room) => wanted.has(room) || refusedRooms.delete(room));
    wanted.forEach((room) => {
      if (joinedRooms.has(room) || refusedRooms.has(room)) return;
      const retry = roomRetries.get(room);
      if (retry && retry.timer) return; // joined again when its backoff ends
      joinedRooms.add(room);
      sendJoin(room);
    });
    let left = false;
    joinedRooms.forEach((room) => {
      if (wanted.has(room)) return;
      joinedRooms.delete(room);
      enteredRooms.delete(room);
      roomViews.delete(room);
      send({ type: "leave", room });
      left = true;
    });
    if (left) roomLeft();
  }

  function leaveRooms() {
    joinedRooms.forEach((room) => send({ type: "leave", room }));
    joinedRooms.clear();
    enteredRooms.clear();
    roomLeft();
  }

  // A room left frees a place: rooms refused as too many may be joined now.
  function roomLeft() {
    let freed = false;
    refusedRooms.forEach((code, room) => {
      if (code !== "too_many_rooms") return;
      refusedRooms.delete(room);
      freed = true;
    });
    if (freed) scheduleRooms();
  }

  // An error naming a room answers its join (or says the connection is out of the room).
  // "unavailable" (Redis is down; nothing of the join stays) and "internal_error" (the server
  // failed; try again later): joined again with backoff; a room the page was in keeps being
  // shown (a join again, with new meta, only was refused). The others refuse the room on this
  // connection (no retry loop).
  function refusedJoin(room, code) {
    if (!joinedRooms.has(room)) return; // left since
    if (code === "unavailable" || code === "internal_error") {
      if (!enteredRooms.has(room)) joinedRooms.delete(room);
      retryLater(roomRetries, room, () => {
        if (!isOpen() || !pageRooms().has(room)) return;
        if (joinedRooms.has(room)) sendJoin(room);
        else joinRooms();
      });
      return;
    }
    joinedRooms.delete(room);
    enteredRooms.delete(room);
    refusedRooms.set(room, code);
  }

  // A member's live presence (its dot's presence_state, diff or poll) is what the room shows
  // from then on: paged members get no room_diff, and the next showRoom repaints every member.
  function memberPresence(id, presence) {
    roomViews.forEach((view) => {
      const member = view.members.get(id);
      if (member) view.members.set(id, Object.assign({}, member, { presence }));
    });
  }

  function scheduleRooms() {
    if (!roomsTimer) roomsTimer = setTimeout(joinRooms, 50);
  }

  // A member's card ({name, avatar}) as the server sent it, where it did.
  function learnCard(id, member) {
    const card = member && member.card;
    if (!card || typeof card.name !== "string") return;
    names.set(id, card.name);
    if (typeof card.avatar === "string" && card.avatar) avatars.set(id, card.avatar);
    else avatars.delete(id);
  }

  // The room's first page read again (the answer of a join again, a poll), in the view the
  // page shows: it lists the first page as read. Read with "next": null, it lists the whole
  // room the viewer may see, so the paged members it does not list left, and so did a
  // first-page member it does not list; otherwise the paged members it does not list stay
  // after it (nothing says they left: their leaving is never sent). The cursor stays where
  // the pages reached, but for the read's own when the pages had reached the end (newcomers
  // since are on pages after the read's) or a first-page member it does not list was dropped
  // (left, or pushed to a later page by one listed before it, a new contact): paging again
  // then adds only the members missing (mergePage skips those listed). The view stays the
  // same object, so a page read meanwhile merges.
  function freshFirstPage(view, members, next) {
    const listed = new Map(Object.entries(members || {}));
    const pagedIds = new Set();
    let dropped = false;
    view.members.forEach((member, id) => {
      if (listed.has(id)) return;
      if (!view.pagedIds.has(id)) dropped = true;
      else if (next) {
        listed.set(id, member);
        pagedIds.add(id);
      }
    });
    view.members = listed;
    view.pagedIds = pagedIds;
    if (!view.paged || !view.next || !next || dropped) view.next = next || null;
  }

  function newView(members, next) {
    return {
      members: new Map(Object.entries(members || {})),
      next: next || null,
      paged: false,
      pagedIds: new Set(),
    };
  }

  // A room_state replaces what the page shows of the room (but for the pages read, when it
  // answers a join again: joinedAgain); a room_diff changes it.
  function applyRoom(message, joinedAgain = false) {
    const room = message.room;
    if (!joinedRooms.has(room)) return; // left since
    let view = roomViews.get(room);
    Object.entries(message.members || message.joins || {}).forEach(([id, m]) => learnCard(id, m));
    if (message.type === "room_state") {
      const wasIn = enteredRooms.has(room);
      enteredRooms.add(room);
      // In: a later outage starts its backoff afresh (unless a join again waits for its retry).
      if (roomRetries.has(room) && !roomRetries.get(room).timer) roomRetries.delete(room);
      if (joinedAgain && wasIn && view) {
        // A join again (a new meta) on this connection: the same list, its first page anew.
        freshFirstPage(view, message.members, message.next);
      } else {
        // A first join, or a fresh state (after an outage): it replaces the pages read so far
        // too; its "next" pages from its list.
        view = newView(message.members, message.next);
        roomViews.set(room, view);
      }
    } else if (!view) {
      return; // its room_state follows
    } else {
      (message.leaves || []).forEach((id) => view.members.delete(String(id)));
      Object.entries(message.joins || {}).forEach(([id, member]) => {
        view.members.set(id, member);
        view.pagedIds.delete(id); // listed live from now on
      });
    }
    view.count = Number(message.count) || 0;
    // The server's "others" leaves out its own list; members of later pages are listed here.
    view.others = view.paged
      ? Math.max(0, view.count - view.members.size)
      : Number(message.others) || 0;
    showRoom(room);
  }

  // A page of the room (room_page, or the endpoint's answer ?after=): its members join the
  // list after those shown (the state's order); what it lists is what more() resolves to.
  // asked: the view whose cursor it was read from; a fresh room_state replaced it meanwhile
  // (a reconnect, an outage): the page follows the old list, so it is dropped (more() resolves
  // to {}) and the fresh state's "next" pages from its own list. A join again or a poll keeps
  // the view (freshFirstPage): the page merges. after: the cursor it was read from; one taken
  // afresh meanwhile (freshFirstPage) stays the view's, the page's "next" following the old.
  function mergePage(room, body, asked, after) {
    const page = {};
    const view = roomViews.get(room);
    if (view !== asked) return page;
    Object.entries(body.members || {}).forEach(([id, member]) => {
      if (member && typeof member.name === "string") names.set(id, member.name);
      learnCard(id, member);
      page[id] = member;
      if (view && !view.members.has(id)) {
        view.members.set(id, member);
        view.pagedIds.add(id);
      }
    });
    if (view) {
      if (view.next === after) view.next = body.next || null;
      view.paged = true;
      // Any count the server gave: 0 too (everyone left meanwhile).
      const count = typeof body.count === "number" ? body.count : NaN;
      if (Number.isFinite(count)) view.count = count;
      view.others = Math.max(0, view.count - view.members.size);
      showRoom(room);
    }
    return page;
  }

  function settlePage(room, settle) {
    const pending = roomPages.get(room);
    if (!pending) return;
    roomPages.delete(room);
    clearTimeout(pending.timer);
    settle(pending);
  }

  // The room's next members: one page at a time (a call while one is read gets the same
  // promise); none once the room's "next" is null.
  function moreOf(room) {
    const view = roomViews.get(room);
    if (!view) return Promise.reject(failure("not_joined", `presence: ${room} is not shown.`));
    const asked = roomPages.get(room);
    if (asked && asked.view === view) return asked.promise;
    // A page asked for from a list a fresh room_state replaced: its answer comes first (frames
    // keep their order) and is dropped; this page is asked for after it, from the fresh list.
    if (asked) return asked.promise.catch(() => ({})).then(() => moreOf(room));
    if (!view.next) return Promise.resolve({});
    const pending = {};
    pending.promise = new Promise((resolve, reject) => {
      pending.resolve = resolve;
      pending.reject = reject;
    });
    pending.view = view;
    pending.after = view.next;
    roomPages.set(room, pending);
    if (isOpen()) {
      pending.socket = socket; // its close settles the page
      pending.timer = setTimeout(
        () => settlePage(room, (p) => p.reject(failure("timeout", "The server did not answer."))),
        STATUS_TIMEOUT_MS
      );
      askRoom(room, { kind: "more", page: pending });
      send({ type: "room_more", room, after: view.next });
    } else {
      fetchRoom(room, view.next)
        .then((body) => {
          if (!body) throw failure("unavailable", `presence: no endpoint for ${room}.`);
          settlePage(room, (p) => p.resolve(mergePage(room, body, p.view, p.after)));
        })
        .catch((error) => settlePage(room, (p) => p.reject(error)));
    }
    return pending.promise;
  }

  // The server's rule (rendering.initials): the first letters of the first two words, or the
  // first two letters of a one-word name.
  function initials(name) {
    const words = name.trim().split(/\s+/).filter((word) => word);
    if (words.length === 1) return Array.from(words[0]).slice(0, 2).join("").toUpperCase();
    return words
      .slice(0, 2)
      .map((word) => Array.from(word)[0])
      .join("")
      .toUpperCase();
  }

  function fillName(item, id) {
    const name = names.get(id);
    if (name === undefined) return;
    const label = item.querySelector(".presence-room__name");
    if (label && label.textContent !== name) label.textContent = name;
    const avatar = item.querySelector(".presence-room__avatar");
    if (!avatar) return;
    // The card's image with the name as its text alternative, else the initials (as the
    // server renders them: presence/room_presence.html).
    const url = avatars.get(id);
    const wanted = url ? "IMG" : "SPAN";
    let shown = avatar;
    if (avatar.tagName !== wanted) {
      shown = document.createElement(wanted.toLowerCase());
      shown.className = "presence-room__avatar";
      avatar.replaceWith(shown);
    }
    if (url) {
      if (shown.getAttribute("src") !== url) shown.setAttribute("src", url);
      shown.setAttribute("alt", name);
    } else {
      shown.setAttribute("aria-hidden", "true");
      shown.textContent = initials(name);
    }
  }

  // The same markup as the server's (presence/rendering.py, room_member).
  function memberItem(id) {
    const item = document.createElement("li");
    item.className = "presence-room__member";
    item.setAttribute(ROOM_MEMBER, id);
    const avatar = document.createElement("span");
    avatar.className = "presence-room__avatar";
    avatar.setAttribute("aria-hidden", "true");
    const dot = document.createElement("span");
    dot.className = "presence-dot";
    dot.setAttribute(USER, id);
    dot.setAttribute("role", "img");
    const name = document.createElement("span");
    name.className = "presence-room__name";
    item.append(avatar, dot, " ", name);
    fillName(item, id);
    return item;
  }

  function showDot(item, presence) {
    const status = presence && STATUSES.includes(presence.status) ? presence.status : "offline";
    item.querySelectorAll(`.presence-dot[${USER}]`).forEach((dot) => {
      STATUSES.forEach((s) => dot.classList.toggle(`presence-dot--${s}`, s === status));
      dot.setAttribute("title", labels[status] || status);
      dot.setAttribute("aria-label", labels[status] || status);
    });
  }

  // Render the room's view in each of its elements: members in the server's order (the
  // viewer's contacts first, then by join time; later arrivals last), the count and "others".
  function showRoom(room) {
    const view = roomViews.get(room);
    if (!view) return;
    let unnamed = false;
    roomBoxes(room).forEach((box) => {
      const list = box.querySelector("[data-presence-room-members]");
      if (list) {
        const items = new Map();
        list.querySelectorAll(`[${ROOM_MEMBER}]`).forEach((item) => {
          const id = item.getAttribute(ROOM_MEMBER);
          if (view.members.has(id)) items.set(id, item);
          else item.remove();
        });
        let index = 0;
        view.members.forEach((member, id) => {
          const item = items.get(id) || memberItem(id);
          if (!names.has(id)) unnamed = true;
          if (member && member.card) fillName(item, id);
          showDot(item, member && member.presence);
          if (list.children[index] !== item) list.insertBefore(item, list.children[index] || null);
          index += 1;
        });
      }
      box.querySelectorAll("[data-presence-room-count]").forEach((el) => {
        el.textContent = String(view.count);
      });
      box.querySelectorAll("[data-presence-room-others]").forEach((el) => {
        el.textContent = `+${view.others}`;
        el.hidden = !view.others;
      });
      box.toggleAttribute("data-presence-room-empty", view.count === 0);
    });
    if (unnamed) fetchNames(room);
    const members = {};
    view.members.forEach((member, id) => {
      members[id] = member;
    });
    emit("room", { room, members, others: view.others, count: view.count });
  }

  async function fetchRoom(room, after = null) {
    const box = roomBoxes(room)[0];
    let url = box && box.getAttribute("data-presence-room-endpoint");
    if (!url) return null;
    if (after) url += `${url.includes("?") ? "&" : "?"}after=${encodeURIComponent(after)}`;
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      const error = body && body.error;
      if (error) throw failure(error.code, error.message);
      throw new Error(`presence: HTTP ${response.status}`);
    }
    const body = await response.json();
    Object.entries(body.members || {}).forEach(([id, member]) => {
      if (member && typeof member.name === "string") names.set(id, member.name);
      learnCard(id, member);
    });
    return body;
  }

  // Names of members who arrived after the page was rendered, from the room's endpoint: at
  // once, or at the end of the room's NAME_RETRY_MS since its last fetch (one timer per room).
  const nameTimers = new Map();
  const nameTries = new Map(); // room -> fetches in a row that left a member unnamed
  const NAME_TRIES = 3;
  function fetchNames(room) {
    if (nameTimers.has(room)) return;
    const wait = (nameFetches.get(room) || 0) + NAME_RETRY_MS - Date.now();
    if (wait > 0) {
      nameTimers.set(
        room,
        setTimeout(() => {
          nameTimers.delete(room);
          fetchNames(room);
        }, wait)
      );
      return;
    }
    nameFetches.set(room, Date.now());
    fetchRoom(room)
      .then(() => {
        const view = roomViews.get(room);
        const unnamed = view ? Array.from(view.members.keys()).filter((id) => !names.has(id)) : [];
        // Members who arrived meanwhile are asked for again after NAME_RETRY_MS; ids the
        // endpoint does not name (a user deleted since) at most NAME_TRIES times in a row.
        const tries = unnamed.length ? (nameTries.get(room) || 0) + 1 : 0;
        nameTries.set(room, tries);
        if (unnamed.length && tries < NAME_TRIES) fetchNames(room);
        roomBoxes(room).forEach((box) =>
          box.querySelectorAll(`[${ROOM_MEMBER}]`).forEach((item) => {
            fillName(item, item.getAttribute(ROOM_MEMBER));
          })
        );
      })
      .catch(() => {}); // a name shows on a later try; the dot and the count are live anyway
  }

  // Without a socket, rooms are read over HTTP with each poll (nobody is joined, though): the
  // first page, which keeps the pages more() read since (freshFirstPage).
  function pollRooms() {
    pageRooms().forEach((room) => {
      fetchRoom(room)
        .then((body) => {
          if (!body || isOpen()) return;
          let view = roomViews.get(room);
          if (view) freshFirstPage(view, body.members, body.next);
          else roomViews.set(room, (view = newView(body.members, body.next)));
          view.count = Number(body.count) || 0;
          // The endpoint's "others" leaves out its first page; members of later pages are
          // listed here.
          view.others = view.paged
            ? Math.max(0, view.count - view.members.size)
            : Number(body.others) || 0;
          showRoom(room);
        })
        .catch(() => {});
    });
  }

  function startRooms() {
    // The viewer's own name (their join lists them), then the members the server rendered.
    document.querySelectorAll("[data-presence-room-viewer]").forEach((box) => {
      const name = box.getAttribute("data-presence-room-viewer-name");
      if (name) names.set(box.getAttribute("data-presence-room-viewer"), name);
    });
    document.querySelectorAll(`[${ROOM_MEMBER}]`).forEach((item) => {
      const id = item.getAttribute(ROOM_MEMBER);
      const label = item.querySelector(".presence-room__name");
      if (label) names.set(id, label.textContent);
      const image = item.querySelector("img.presence-room__avatar");
      if (image && image.getAttribute("src")) avatars.set(id, image.getAttribute("src"));
    });
    new MutationObserver((mutations) => {
      const touched = (node) =>
        node.nodeType === Node.ELEMENT_NODE &&
        (node.hasAttribute(ROOM) || node.querySelector(`[${ROOM}]`));
      const changed = mutations.some(
        (m) => Array.from(m.addedNodes).some(touched) || Array.from(m.removedNodes).some(touched)
      );
      watchCount();
      const countsTouched = (node) =>
        node.nodeType === Node.ELEMENT_NODE &&
        (node.hasAttribute(COUNT_OF) || node.querySelector(`[${COUNT_OF}]`));
      if (
        mutations.some(
          (m) =>
            Array.from(m.addedNodes).some(countsTouched) ||
            Array.from(m.removedNodes).some(countsTouched)
        )
      ) {
        scheduleRoomCounts();
      }
      if (!changed) return;
      roomViews.forEach((view, room) => showRoom(room)); // a copy added later shows the room
      scheduleRooms();
    }).observe(document.documentElement, { childList: true, subtree: true });
    // Leaving now rather than OFFLINE_GRACE after the socket closes: the others see it at once.
    window.addEventListener("pagehide", leaveRooms);
    window.addEventListener("pageshow", (event) => event.persisted && scheduleRooms());
  }

  function joinRoom(room, meta = null) {
    const name = String(room);
    scriptRooms.add(name);
    roomMeta.set(name, meta);
    refusedRooms.delete(name); // asked for again: tried again
    if (joinedRooms.has(name)) sendJoin(name);
    else scheduleRooms();
  }

  function leaveRoom(room) {
    const name = String(room);
    scriptRooms.delete(name);
    roomMeta.delete(name);
    scheduleRooms();
  }

  // --- start --------------------------------------------------------------------------------

  const isWatched = (node) =>
    node.nodeType === Node.ELEMENT_NODE && (node.matches(WATCHED) || node.querySelector(WATCHED));

  function start() {
    if (!readLabels()) learnLabels();
    new MutationObserver((mutations) => {
      let changed = false;
      mutations.forEach((m) => {
        m.addedNodes.forEach((node) => {
          if (!isWatched(node)) return;
          changed = true;
          watchedIds(node).forEach((id) => {
            added.add(id);
            if (latest.has(id)) render(id, latest.get(id)); // known users are shown at once
            // Left out of its snapshot as unchanged (the page shows it), this user's new
            // element of other markup is read once over HTTP.
            else if (snapshotted.has(id) && pageStamp(id) === null) load([id]);
          });
        });
        m.removedNodes.forEach((node) => {
          if (isWatched(node)) changed = true;
        });
      });
      if (changed) scheduleSync();
    }).observe(document.documentElement, { childList: true, subtree: true });

    ["pointerdown", "pointermove", "keydown", "wheel", "touchstart", "scroll"].forEach((type) =>
      window.addEventListener(type, onInput, { passive: true, capture: true })
    );
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) lastInput = Date.now(); // coming back counts as input
      checkActivity();
      if (document.hidden) stopPolling();
      else if (state === "closed") {
        if (!pollTimer) schedulePoll(); // hidden, it stopped polling
        reconnectSoon();
      } else if (state === "polling") poll();
    });
    window.addEventListener("online", reconnectSoon);
    // A page restored from the back/forward cache shows old presence.
    window.addEventListener("pageshow", (event) => {
      if (!event.persisted) return;
      if (!socketUrl) poll();
      else if (state === "closed") reconnectSoon();
      else connect();
    });
    setInterval(() => latest.forEach((p, id) => renderText(id, p)), CLOCK_MS);
    checkActivity();
    startRooms();

    // The server rendered fresh presence: polling can wait a full interval.
    if (socketUrl) connect();
    else schedulePoll();
  }

  window.presence = {
    refresh() {
      if (!isOpen()) return poll();
      // What is shown: the presence last rendered. Users the page shows as it was rendered
      // (left out of their snapshot as unchanged, or not answered yet) are read once over HTTP;
      // ids the endpoint left out (no such user) are not asked for again.
      const ids = watchedIds();
      const unread = ids.filter((id) => !latest.has(id) && !leftOut.has(id));
      return (unread.length ? load(unread) : Promise.resolve({})).then(() => {
        const shown = {};
        ids.forEach((id) => latest.has(id) && (shown[id] = latest.get(id)));
        return shown;
      });
    },
    setStatus,
    // As a string (as joinRoom sends its room): the server names the feed in its errors only
    // when the frame's feed was one, and an error naming none is taken for a setStatus answer.
    watchFeed(name, options) {
      const feed = String(name);
      feeds.add(feed);
      if (options && options.after !== undefined) noteNewest(feed, Number(options.after));
      send(watchFrame(feed));
    },
    unwatchFeed(name) {
      const feed = String(name);
      feeds.delete(feed);
      feedAfter.delete(feed);
      feedAwaiting.delete(feed);
      send({ type: "unwatch_feed", feed });
    },
    joinRoom,
    leaveRoom,
    self: selfId,
    othersWith(members, key) {
      // The viewer is always among a room's members (their own join), and their own meta is
      // no news to them: a typist must not see their own "someone is typing".
      return Object.keys(members || {}).filter((id) => {
        const meta = members[id] && members[id].meta;
        return id !== selfId && Boolean(meta && meta[key]);
      });
    },
    room(name) {
      const room = String(name);
      const view = roomViews.get(room);
      if (!view) return null;
      const members = {};
      view.members.forEach((member, id) => {
        members[id] = member;
      });
      return {
        room,
        members,
        others: view.others,
        count: view.count,
        next: view.next || null,
        more: () => moreOf(room),
      };
    },
    on(event, fn) {
      const type = event.includes(":") ? event : `presence:${event}`;
      const listener = (e) => fn(e.detail, e);
      document.addEventListener(type, listener);
      return () => document.removeEventListener(type, listener);
    },
    get state() {
      return state;
    },
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
