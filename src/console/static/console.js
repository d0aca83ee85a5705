// The console's only script: the live tail. An element with data-tail="<URL of an SSE
// stream>" receives each line as a table row, newest on top; EventSource resumes with
// Last-Event-ID by itself after a dropped connection.
"use strict";
document.querySelectorAll("[data-tail]").forEach((table) => {
  const body = table.querySelector("tbody");
  const status = document.querySelector(table.dataset.status || "#tail-status");
  const source = new EventSource(table.dataset.tail);
  source.addEventListener("open", () => { if (status) status.textContent = "live"; });
  source.addEventListener("error", () => { if (status) status.textContent = "reconnecting…"; });
  source.addEventListener("log", (event) => {
    const line = JSON.parse(event.data);
    const row = document.createElement("tr");
    row.className = "tailed";
    for (const text of [line.timestamp, line.level, line.endpoint || "", String(line.status), line.duration_ms == null ? "" : String(line.duration_ms), line.message]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.appendChild(cell);
    }
    row.children[1].className = line.level;
    body.insertBefore(row, body.firstChild);
    while (body.children.length > 200) body.removeChild(body.lastChild);
  });
});
