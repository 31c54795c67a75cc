/* The demo's live timelines: the first page of a timeline watches it over the presence
 * WebSocket (window.presence.watchFeed) and prepends each new activity the server sends.
 * The server decides who sees what (follows, memberships, mentions, privacy, blocks). */
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

  function start() {
    const list = document.querySelector("[data-live-feed]");
    if (!list || !window.presence || !window.presence.watchFeed) return;
    const name = list.dataset.liveFeed;
    window.presence.on("activity", ({ feeds, activity }) => {
      if (!feeds.includes(name) || document.getElementById(`activity-${activity.id}`)) return;
      list.hidden = false;
      const empty = document.querySelector("[data-testid=timeline-empty]");
      if (empty) empty.remove();
      list.prepend(item(activity));
    });
    window.presence.watchFeed(name);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
