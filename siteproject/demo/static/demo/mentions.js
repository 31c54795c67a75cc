/* Mention completion for the post box: type "@al" and pick a username.
 *
 * Asks the feed's JSON endpoint (data-mention-endpoint on the form) for usernames starting
 * with what follows the "@", at most once per pause in typing; arrow keys, Enter/Tab and the
 * mouse pick one; Escape closes the list. Without JavaScript the box is a plain textarea.
 */
(function () {
  "use strict";

  // An "@" starts a mention at the start of the text or after a character that cannot be part
  // of an e-mail address or a URL (the same rule as the server's, presence/feed/domain.py).
  var BEFORE_AT = /[\p{L}\p{N}_.+\-@\/=]/u;
  var NAME = /^[\p{L}\p{N}_.+\-]*$/u;

  function mentionAt(text, caret) {
    var at = text.lastIndexOf("@", caret - 1);
    if (at < 0) return null;
    var name = text.slice(at + 1, caret);
    if (!NAME.test(name)) return null;
    if (at > 0 && BEFORE_AT.test(text.charAt(at - 1))) return null;
    return { start: at, name: name };
  }

  function setUp(form) {
    var input = form.querySelector("[data-mention-input]");
    var list = form.querySelector(".mention-list");
    var endpoint = form.getAttribute("data-mention-endpoint");
    if (!input || !list || !endpoint) return;
    input.setAttribute("aria-autocomplete", "list");
    input.setAttribute("aria-controls", list.id);
    var timer = null;
    var asked = 0;
    var choices = [];
    var active = -1;
    var current = null;

    function close() {
      list.hidden = true;
      list.textContent = "";
      choices = [];
      active = -1;
      input.removeAttribute("aria-activedescendant");
      input.setAttribute("aria-expanded", "false");
    }

    function highlight(index) {
      active = index;
      Array.prototype.forEach.call(list.children, function (item, n) {
        item.setAttribute("aria-selected", n === index ? "true" : "false");
      });
      if (index >= 0) input.setAttribute("aria-activedescendant", list.children[index].id);
    }

    function pick(index) {
      if (!current || index < 0 || index >= choices.length) return;
      var text = input.value;
      var insert = "@" + choices[index] + " ";
      var caret = current.start + 1 + current.name.length;
      input.value = text.slice(0, current.start) + insert + text.slice(caret);
      var at = current.start + insert.length;
      input.setSelectionRange(at, at);
      close();
      input.focus();
    }

    function show(names) {
      list.textContent = "";
      choices = names;
      names.forEach(function (name, n) {
        var item = document.createElement("li");
        item.id = list.id + "-" + n;
        item.setAttribute("role", "option");
        item.textContent = "@" + name;
        item.addEventListener("mousedown", function (event) {
          event.preventDefault(); // keep the focus in the textarea
          pick(n);
        });
        list.appendChild(item);
      });
      list.hidden = names.length === 0;
      input.setAttribute("aria-expanded", names.length ? "true" : "false");
      highlight(names.length ? 0 : -1);
    }

    function lookUp() {
      current = mentionAt(input.value, input.selectionStart);
      if (!current || !current.name) return close();
      var ticket = ++asked;
      fetch(endpoint + "?q=" + encodeURIComponent(current.name), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      })
        .then(function (response) { return response.ok ? response.json() : { users: [] }; })
        .then(function (data) {
          if (ticket !== asked) return; // an answer to an older keystroke
          show((data.users || []).map(function (user) { return user.username; }));
        })
        .catch(close);
    }

    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(lookUp, 150);
    });
    input.addEventListener("keydown", function (event) {
      if (list.hidden) return;
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        var step = event.key === "ArrowDown" ? 1 : -1;
        highlight((active + step + choices.length) % choices.length);
      } else if (event.key === "Enter" || event.key === "Tab") {
        event.preventDefault();
        pick(active);
      } else if (event.key === "Escape") {
        close();
      }
    });
    input.addEventListener("blur", function () { setTimeout(close, 100); });
  }

  document.querySelectorAll("form[data-mention-endpoint]").forEach(setUp);
})();
