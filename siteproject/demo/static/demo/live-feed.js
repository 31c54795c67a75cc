/* The demo's live timelines: the first page of a timeline watches it over the presence
 * WebSocket (window.presence.watchFeed) from the newest activity it was rendered with, and
 * puts each new activity the server sends in its place (newest first), once: those posted
 * while the socket was down come after a reconnect. When more were missed than the server
 * sends, a link offers to load the page again. The server decides who sees what (follows,
 * memberships, mentions, privacy, blocks). */
(() => {
  "use strict";

  function item(activity) {
    const li = document.createElement("li");
    li.className = "activity activity--live";
    li.id = `activity-${activity.id}`;
    li.dataset.activity = String(activity.id);
    const body = document.createElement("div");
    body.className = "activity__body";
    const head = document.createElement("div");
    head.className = "activity__head";
    const name = document.createElement("a");
    name.className = "person__name";
    name.href = `/u/${encodeURIComponent(activity.author.username)}/activity/`;
    name.textContent = activity.author.username;
    const time = document.createElement("time");
    time.className = "activity__time";
    time.dateTime = activity.created_at;
    time.textContent = document.documentElement.lang === "en" ? "just now" : "";
    head.append(name, " ", time);
    const text = document.createElement("p");
    text.className = "activity__text";
    text.innerHTML = activity.html; // escaped by the server, mentions linked
    body.append(head, text);
    li.append(body);
    return li;
  }

  // Before the first item older than it: a missed activity can come after a newer live one.
  function insert(list, li, id) {
    const older = [...list.children].find((other) => Number(other.dataset.activity) < id);
    list.insertBefore(li, older || null);
  }

  function offerReload(list) {
    if (document.querySelector("[data-testid=timeline-reload]")) return;
    const link = document.createElement("a");
    link.className = "btn";
    link.href = window.location.pathname;
    link.dataset.testid = "timeline-reload";
    link.textContent = list.dataset.reloadLabel || "New activities: show them"; // the page's language
    list.before(link);
  }

  function start() {
    const list = document.querySelector("[data-live-feed]");
    if (!list || !window.presence || !window.presence.watchFeed) return;
    const name = list.dataset.liveFeed;
    window.presence.on("activity", ({ feeds, activity }) => {
      if (!feeds.includes(name) || document.getElementById(`activity-${activity.id}`)) return;
      list.hidden = false;
      const empty = document.querySelector("[data-testid=timeline-empty]");
      if (empty) empty.remove();
      insert(list, item(activity), activity.id);
    });
    window.presence.on("feed_reload", ({ feed }) => feed === name && offerReload(list));
    // The newest activity rendered (0: none): what is posted after it and before the watch is
    // answered is sent too.
    const newest = list.querySelector("[data-activity]");
    window.presence.watchFeed(name, { after: newest ? Number(newest.dataset.activity) : 0 });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
