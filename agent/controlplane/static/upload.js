// The package upload form with progress (served from /static: the CSP allows no inline script). The form posts
// multipart/form-data to /models/upload with or without this file; with it, the post goes through
// XMLHttpRequest so that its upload progress events show how much was sent, a file over the service's limit
// (data-max-bytes, max_body_bytes) is refused before a byte is sent, and a refusal shows the service's answer.
(function () {
  "use strict";
  if (!window.XMLHttpRequest || !window.FormData || !window.DOMParser) {
    return;
  }
  function mib(n) {
    return (n / 1048576).toFixed(2) + " MiB";
  }
  function say(text, cls) {
    var status = document.getElementById("upload-status");
    if (status) {
      status.textContent = text;
      status.className = cls || "";
    }
  }
  function answer(xhr) {
    var type = xhr.getResponseHeader("content-type") || "";
    if (type.indexOf("text/html") === 0) {
      var fresh = new DOMParser().parseFromString(xhr.responseText, "text/html").querySelector("main");
      var main = document.querySelector("main");
      if (fresh && main) {
        var nodes = Array.prototype.map.call(fresh.childNodes, function (n) {
          return document.importNode(n, true);
        });
        main.replaceChildren.apply(main, nodes);
        return;
      }
    }
    var why = xhr.responseText;
    try {
      why = JSON.parse(xhr.responseText).error || why;
    } catch (e) {
      // not JSON: shown as text
    }
    say("refused (HTTP " + xhr.status + "): " + why, "error");
  }
  function send(form, file) {
    var bar = document.getElementById("upload-progress");
    var button = form.querySelector("button[type=submit]");
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.upload.addEventListener("progress", function (e) {
      if (!e.lengthComputable) {
        return;
      }
      bar.max = e.total;
      bar.value = e.loaded;
      say("sent " + mib(e.loaded) + " of " + mib(e.total) + " (" + Math.floor((100 * e.loaded) / e.total) + "%)");
    });
    xhr.upload.addEventListener("load", function () {
      say("sent " + mib(file.size) + " (100%); the service checks the package with the rules of package --check");
    });
    xhr.addEventListener("load", function () {
      var done = xhr.status >= 200 && xhr.status < 300 && xhr.responseURL;
      if (done && xhr.responseURL.split("?")[0] !== form.action.split("?")[0]) {
        window.location.assign(xhr.responseURL);
        return;
      }
      button.disabled = false;
      answer(xhr);
    });
    xhr.addEventListener("error", function () {
      button.disabled = false;
      say("the upload failed: the connection closed (over the service's limit, or the service stopped)", "error");
    });
    bar.hidden = false;
    bar.value = 0;
    button.disabled = true;
    xhr.send(new FormData(form));
  }
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form || form.id !== "upload") {
      return;
    }
    var input = form.elements.namedItem("package");
    var file = input && input.files && input.files[0];
    if (!file) {
      return;
    }
    ev.preventDefault();
    var max = parseInt(form.getAttribute("data-max-bytes"), 10);
    if (max && file.size > max) {
      say(
        "refused before sending: " + file.name + " is " + file.size + " bytes, more than the " + max +
          " bytes this service takes (max_body_bytes)",
        "error"
      );
      return;
    }
    send(form, file);
  });
})();
