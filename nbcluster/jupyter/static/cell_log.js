// The per-cell log area of nbcluster (anywidget ESM). Task output is shown as text only
// (textContent), never as HTML: it comes from code that ran elsewhere.
const LEVELS = [
  ["all", "all levels", () => true],
  ["stdout", "stdout", l => l === "stdout"],
  ["stderr", "stderr and logging", l => l !== "stdout"],
  ["warning", "warnings and errors", l => l === "WARNING" || l === "ERROR" || l === "CRITICAL"],
  ["error", "errors", l => l === "ERROR" || l === "CRITICAL"],
];

function option(value, label) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = label;
  return o;
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
    body.textContent = shown.map(l => l[4]).join("");
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
  for (const name of ["lines", "folded", "collapsed", "sources", "total"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
