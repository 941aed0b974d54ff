// The dashboard's self-refresh (served from /static: the CSP allows no inline script). A page whose <main> has
// data-refresh="N" re-reads its own URL (its filters and page kept) every N seconds and swaps <main> in place;
// it waits while a field of the page has focus or a form on it was edited, follows a redirect (signed out: the
// sign-in page), and stops when the new page asks for no refresh. Without JavaScript a <noscript> meta refresh
// of the same URL does the same, less smoothly.
(function () {
  "use strict";
  var main = document.querySelector("main[data-refresh]");
  if (!main || !window.fetch || !window.DOMParser) {
    return;
  }
  var every = 1000 * Math.max(1, parseFloat(main.getAttribute("data-refresh")) || 10);
  var edited = false;
  var count = 0;
  document.addEventListener("input", function (e) {
    if (main.contains(e.target)) {
      edited = true;
    }
  });
  function busy() {
    var a = document.activeElement;
    var field = a && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName) && main.contains(a);
    return edited || Boolean(field);
  }
  function later() {
    window.setTimeout(tick, every);
  }
  function swap(text) {
    var doc = new DOMParser().parseFromString(text, "text/html");
    var fresh = doc.querySelector("main");
    if (!fresh || busy()) {
      return later();
    }
    var nodes = Array.prototype.map.call(fresh.childNodes, function (n) {
      return document.importNode(n, true);
    });
    main.replaceChildren.apply(main, nodes);
    document.title = doc.title;
    count += 1;
    main.setAttribute("data-refreshed", String(count));
    var next = fresh.getAttribute("data-refresh");
    if (next) {
      every = 1000 * Math.max(1, parseFloat(next) || 10);
      later();
    } else {
      main.removeAttribute("data-refresh");
    }
  }
  function tick() {
    if (busy()) {
      return later();
    }
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" }).then(
      function (r) {
        if (r.redirected) {
          window.location.assign(r.url);
          return;
        }
        if (!r.ok) {
          return later();
        }
        return r.text().then(swap);
      },
      later
    );
  }
  later();
})();
