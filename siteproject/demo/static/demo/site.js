/* Small behaviours of the demo's pages, as a file: the site runs under a strict Content
 * Security Policy (script-src 'self' 'nonce-...'), so no inline event handlers. */
(() => {
  "use strict";
  // The language switcher submits as soon as a language is chosen.
  document.querySelectorAll("select[data-submit-on-change]").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });
})();
