// The per-cell log area of nbcluster (anywidget ESM). Task output is shown as text only
// (textContent), never as HTML: it comes from code that ran elsewhere. Rich output a task
// asked for with display() (the "rich" trait: seq -> {data, metadata}) is rendered in its
// line's place: images and SVG as <img> data URLs, HTML sanitised (no scripts, no event
// handlers, no javascript: URLs) into a shadow root so its styles stay inside.
const LEVELS = [
  ["all", "all levels", () => true],
  ["stdout", "stdout and display", l => l === "stdout" || l === "display"],
  ["stderr", "stderr and logging", l => l !== "stdout" && l !== "display"],
  ["warning", "warnings and errors", l => l === "WARNING" || l === "ERROR" || l === "CRITICAL"],
  ["error", "errors", l => l === "ERROR" || l === "CRITICAL"],
];

function option(value, label) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = label;
  return o;
}

const BLOCKED = new Set([
  "script", "iframe", "frame", "frameset", "object", "embed", "base", "meta", "link",
  "animate", "set", "noscript", "template",
]);
const URL_ATTRS = new Set(["href", "src", "xlink:href", "action", "formaction", "srcset"]);

function joined(value) {
  return Array.isArray(value) ? value.join("") : String(value);
}

// HTML as inert nodes: parsed in a document that runs nothing, then stripped of what could.
function sanitize(html) {
  const doc = new DOMParser().parseFromString(html, "text/html");
  for (const node of Array.from(doc.querySelectorAll("*"))) {
    if (BLOCKED.has(node.localName.toLowerCase())) {
      node.remove();
      continue;
    }
    for (const attr of Array.from(node.attributes)) {
      const name = attr.name.toLowerCase();
      const value = attr.value.replace(/[\s\u0000-\u001f]/g, "").toLowerCase();
      // Only links and raster images: no script URLs, no data: documents or SVG.
      const badUrl = URL_ATTRS.has(name) && (
        value.startsWith("javascript:") || value.startsWith("vbscript:") ||
        (value.startsWith("data:") && !/^data:image\/(png|jpeg|gif|webp)[;,]/.test(value))
      );
      if (name.startsWith("on") || badUrl) node.removeAttribute(attr.name);
    }
  }
  const styles = Array.from(doc.head.querySelectorAll("style"));
  return [...styles, ...Array.from(doc.body.childNodes)].map(n => document.importNode(n, true));
}

function image(src, md) {
  const img = document.createElement("img");
  img.src = src;
  if (md && md.width) img.width = md.width;
  if (md && md.height) img.height = md.height;
  return img;
}

function renderBundle(bundle) {
  const data = bundle.data || {};
  const meta = bundle.metadata || {};
  const box = document.createElement("div");
  box.className = "nbcluster-log-rich";
  if (data["text/html"] !== undefined) {
    box.attachShadow({ mode: "open" }).append(...sanitize(joined(data["text/html"])));
  } else if (data["image/svg+xml"] !== undefined) {
    const svg = joined(data["image/svg+xml"]);
    box.append(image(`data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`, meta["image/svg+xml"]));
  } else {
    const mime = ["image/png", "image/jpeg", "image/gif"].find(m => data[m] !== undefined);
    if (mime) {
      box.append(image(`data:${mime};base64,${joined(data[mime]).replace(/\s/g, "")}`, meta[mime]));
    } else {
      const pre = document.createElement("pre");
      const text = ["text/markdown", "text/latex"].find(m => data[m] !== undefined);
      pre.textContent = text ? joined(data[text]) : JSON.stringify(data["application/json"], null, 2);
      box.append(pre);
    }
  }
  return box;
}

function render({ model, el }) {
  el.classList.add("nbcluster-log");
  const head = document.createElement("div");
  head.className = "nbcluster-log-head";
  const toggle = document.createElement("button");
  toggle.className = "nbcluster-log-toggle";
  toggle.type = "button";
  const summary = document.createElement("span");
  summary.className = "nbcluster-log-summary";
  const source = document.createElement("select");
  source.className = "nbcluster-log-source";
  source.title = "show one task or actor";
  const level = document.createElement("select");
  level.className = "nbcluster-log-level";
  level.title = "show one level";
  for (const [value, label] of LEVELS) level.appendChild(option(value, label));
  head.append(toggle, summary, source, level);
  const body = document.createElement("pre");
  body.className = "nbcluster-log-body";
  el.append(head, body);

  const rendered = new Map(); // seq -> the element of a rich output (kept across draws)
  let sourcesKey = "";
  function drawSources() {
    const sources = model.get("sources") || [];
    const key = JSON.stringify(sources);
    if (key === sourcesKey) return;
    sourcesKey = key;
    const keep = source.value;
    source.replaceChildren(option("", "all tasks and actors"));
    for (const [name, kind] of sources) source.appendChild(option(name, `${kind} ${name}`));
    source.value = sources.some(([name]) => name === keep) ? keep : "";
  }

  function draw() {
    const lines = model.get("lines") || [];
    const folded = model.get("folded") || 0;
    const collapsed = model.get("collapsed");
    // Nothing to show yet: take no room under the cell.
    el.style.display = lines.length || folded ? "" : "none";
    drawSources();
    const keepLevel = LEVELS.find(([v]) => v === level.value)[2];
    const shown = lines.filter(
      ([, name, , lvl]) => (!source.value || name === source.value) && keepLevel(lvl)
    );
    const atBottom = body.scrollTop + body.clientHeight >= body.scrollHeight - 4;
    const rich = model.get("rich") || {};
    for (const seq of Array.from(rendered.keys())) if (!(seq in rich)) rendered.delete(seq);
    const nodes = [];
    let run = "";
    for (const line of shown) {
      const bundle = line[3] === "display" ? rich[String(line[0])] : undefined;
      if (bundle === undefined) {
        run += line[4];
        continue;
      }
      if (run) nodes.push(document.createTextNode(run));
      run = "";
      const seq = String(line[0]);
      if (!rendered.has(seq)) rendered.set(seq, renderBundle(bundle));
      nodes.push(rendered.get(seq));
    }
    if (run) nodes.push(document.createTextNode(run));
    body.replaceChildren(...nodes);
    if (atBottom) body.scrollTop = body.scrollHeight;
    const total = model.get("total") || 0;
    let text = `nbcluster log: ${total} line${total === 1 ? "" : "s"}`;
    if (shown.length !== lines.length) text += `, ${shown.length} shown`;
    if (folded) text += ` · ${folded} folded`;
    summary.textContent = text;
    toggle.textContent = collapsed ? "\u25b8" : "\u25be";
    toggle.title = collapsed ? "show the log" : "hide the log";
    body.style.display = collapsed ? "none" : "";
  }

  toggle.addEventListener("click", () => {
    model.set("collapsed", !model.get("collapsed"));
    model.save_changes();
  });
  source.addEventListener("change", draw);
  level.addEventListener("change", draw);
  for (const name of ["lines", "folded", "collapsed", "sources", "total", "rich"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
