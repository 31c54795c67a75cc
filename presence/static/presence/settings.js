// The settings page's contact search, filtering the listed people as one types. Without
// JavaScript the search is a GET form (?q=) that the server answers with the matching contacts.
// Each person matches by the name shown (data-presence-person) or by what the server's search
// matches (data-presence-person-search: the username and first and last names, one per line).
(function () {
  "use strict";
  function setUp(input) {
    var list = document.getElementById(input.getAttribute("data-presence-filter"));
    if (!list) return;
    var people = list.querySelectorAll("[data-presence-person]");
    var empty = list.querySelector("[data-presence-filter-empty]");
    input.addEventListener("input", function () {
      var wanted = input.value.trim().toLowerCase();
      var shown = 0;
      people.forEach(function (person) {
        var names = [person.getAttribute("data-presence-person")].concat(
          (person.getAttribute("data-presence-person-search") || "").split("\n")
        );
        var match = names.some(function (name) {
          return name.toLowerCase().indexOf(wanted) !== -1;
        });
        person.hidden = !match;
        if (match) shown += 1;
      });
      if (empty) empty.hidden = shown > 0 || people.length === 0;
    });
  }
  function start() {
    document.querySelectorAll("input[data-presence-filter]").forEach(setUp);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
