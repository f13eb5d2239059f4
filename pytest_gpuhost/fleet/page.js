"use strict";
// The fleet page: everything comes from the JSON blob in #fleet-data; nothing is fetched.
(function () {
  const data = JSON.parse(document.getElementById("fleet-data").textContent);
  const S = data.strings, OUT = data.outcomes, KINDS = data.kinds, CHECKS = data.checks;
  const STRIDE = 7; // check, outcome, observed, expected, message, evidence, top cause
  const PAGE = 100;
  const GOOD = new Set(["passed", "fixed", "skipped"]);
  const rank = (o) => OUT.indexOf(o); // worst first
  const str = (i) => (i < 0 ? null : S[i]);
  const esc = (t) => String(t).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const state = { kind: "", outcome: "", target: "", page: 0, driftAll: false, chosen: null };

  // Per target: the indices of its results of each kind, and the outcomes of each kind.
  const targets = data.targets.map(([name, reason, facts, results], index) => {
    const byKind = new Map();
    for (let r = 0; r < results.length; r += STRIDE) {
      const kind = CHECKS[results[r]][2];
      if (!byKind.has(kind)) byKind.set(kind, []);
      byKind.get(kind).push(r);
    }
    return { index, name, reason: str(reason), facts: str(facts), results, byKind };
  });
  const checksOfKind = new Map();
  for (const t of targets) {
    for (let r = 0; r < t.results.length; r += STRIDE) {
      const c = t.results[r], kind = CHECKS[c][2];
      if (!checksOfKind.has(kind)) checksOfKind.set(kind, new Set());
      checksOfKind.get(kind).add(c);
    }
  }

  function outcomeOf(t, r) { return OUT[t.results[r + 1]]; }
  function worst(t, rows) {
    let best = OUT.length;
    for (const r of rows) best = Math.min(best, t.results[r + 1]);
    return OUT[best] || "passed";
  }
  function has(t, outcome, kind) {
    const rows = kind === "" ? null : t.byKind.get(Number(kind)) || [];
    if (rows === null) {
      for (let r = 0; r < t.results.length; r += STRIDE) if (outcomeOf(t, r) === outcome) return true;
      return false;
    }
    return rows.some((r) => outcomeOf(t, r) === outcome);
  }

  function visibleTargets() {
    const needle = state.target.toLowerCase();
    return targets.filter((t) => {
      if (needle && !t.name.toLowerCase().includes(needle)) return false;
      if (state.outcome === "no result") return t.reason !== null;
      if (state.outcome) return t.reason === null && has(t, state.outcome, state.kind);
      return true;
    });
  }

  function columns() {
    if (state.kind === "") return data.kindOrder.map((k) => ({ kind: k, label: KINDS[k] }));
    const kind = Number(state.kind);
    return [...(checksOfKind.get(kind) || [])].map((c) => ({ check: c, label: S[CHECKS[c][3]] }));
  }

  // The cause most of these rows name first (the failing ones, else all): "acs_redirect (56 of 56)".
  function topCause(t, rows) {
    const failing = rows.filter((r) => !GOOD.has(outcomeOf(t, r)));
    const counts = new Map();
    for (const r of failing.length ? failing : rows) {
      const cause = str(t.results[r + 6]);
      if (cause === null) continue;
      const name = cause.split(" ", 1)[0];
      counts.set(name, (counts.get(name) || 0) + 1);
    }
    let best = null;
    for (const [name, n] of counts) if (best === null || n > best[1]) best = [name, n];
    return best === null ? "" : `; top cause: ${best[0]} (${best[1]} of ${rows.length})`;
  }

  function kindCell(t, col) {
    const rows = t.byKind.get(col.kind);
    if (!rows) return '<td class="cell empty">-</td>';
    const w = worst(t, rows);
    const bad = rows.filter((r) => !GOOD.has(outcomeOf(t, r))).length;
    const dim = state.outcome && !rows.some((r) => outcomeOf(t, r) === state.outcome);
    const text = bad ? `${bad}/${rows.length}` : String(rows.length);
    return `<td class="cell o-${w}${dim ? " dim" : ""}" data-t="${t.index}" data-k="${col.kind}"` +
      ` data-outcome="${w}" title="${esc(KINDS[col.kind])}: ${esc(w)}${esc(topCause(t, rows))}">${text}</td>`;
  }

  function checkCell(t, col) {
    const rows = t.byKind.get(Number(state.kind)) || [];
    const r = rows.find((x) => t.results[x] === col.check);
    if (r === undefined) return '<td class="cell empty">-</td>';
    const o = outcomeOf(t, r), observed = str(t.results[r + 2]), cause = str(t.results[r + 6]);
    const dim = state.outcome && o !== state.outcome;
    const text = observed === null ? "&mdash;" : esc(observed.length > 12 ? observed.slice(0, 11) + "…" : observed);
    return `<td class="cell o-${o}${dim ? " dim" : ""}" data-t="${t.index}" data-c="${col.check}"` +
      ` data-outcome="${o}" title="${esc(S[CHECKS[col.check][1]])}: ${esc(o)}` +
      `${cause === null ? "" : esc("; top cause: " + cause)}">${text}</td>`;
  }

  function drawMatrix() {
    const shown = visibleTargets(), cols = columns();
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = shown.slice(state.page * PAGE, state.page * PAGE + PAGE);
    const parts = ['<thead><tr><th class="name">target</th>'];
    for (const col of cols) parts.push(`<th title="${esc(col.label)}">${esc(col.label)}</th>`);
    parts.push("</tr></thead><tbody>");
    for (const t of slice) {
      if (t.reason !== null) {
        parts.push(`<tr class="target noresult" data-target="${esc(t.name)}"><td class="name">${esc(t.name)}</td>` +
          `<td class="reason" colspan="${Math.max(1, cols.length)}">no result: ${esc(t.reason)}</td></tr>`);
        continue;
      }
      parts.push(`<tr class="target" data-target="${esc(t.name)}"><td class="name" title="${esc(t.facts)}">${esc(t.name)}</td>`);
      for (const col of cols) parts.push(col.check === undefined ? kindCell(t, col) : checkCell(t, col));
      parts.push("</tr>");
    }
    parts.push("</tbody>");
    document.getElementById("matrix").innerHTML = parts.join("");
    const first = shown.length ? state.page * PAGE + 1 : 0;
    document.getElementById("rows").textContent =
      `targets ${first}-${state.page * PAGE + slice.length} of ${shown.length}`;
    document.getElementById("prev").disabled = state.page === 0;
    document.getElementById("next").disabled = state.page >= pages - 1;
  }

  function recordHtml(t, r) {
    const c = CHECKS[t.results[r]], o = outcomeOf(t, r);
    const field = (name, i) => {
      const v = str(t.results[r + i]);
      return v === null || v === "" ? "" : `<dt>${name}</dt><dd class="${name}">${esc(v)}</dd>`;
    };
    return `<div class="record" style="border-color: var(--${o})"><span class="rid">${esc(S[c[1]])}</span>` +
      `<span class="badge o-${o}">${o}</span><dl><dt>spec</dt><dd>${esc(S[c[0]])}</dd>` +
      field("expected", 3) + field("observed", 2) + field("message", 4) + field("cause", 6) +
      field("evidence", 5) + "</dl></div>";
  }

  function showDetail(cell) {
    const t = targets[Number(cell.dataset.t)];
    const rows = t.byKind.get(cell.dataset.k !== undefined ? Number(cell.dataset.k) : CHECKS[Number(cell.dataset.c)][2]) || [];
    const chosen = cell.dataset.c !== undefined ? rows.filter((r) => t.results[r] === Number(cell.dataset.c)) : rows;
    const title = cell.dataset.k !== undefined ? KINDS[Number(cell.dataset.k)] : S[CHECKS[Number(cell.dataset.c)][1]];
    document.getElementById("detail").innerHTML = `<h3>${esc(t.name)}: ${esc(title)}</h3>` +
      `<p class="facts">${esc(t.facts || "")}</p>` + chosen.map((r) => recordHtml(t, r)).join("");
    document.querySelectorAll("td.chosen").forEach((td) => td.classList.remove("chosen"));
    cell.classList.add("chosen");
  }

  function drawDrift() {
    const kind = state.kind === "" ? null : Number(state.kind);
    const rows = data.drift.filter(([c]) => kind === null || CHECKS[c][2] === kind);
    const limit = state.driftAll ? rows.length : 200;
    const parts = ["<thead><tr><th>check</th><th>majority</th><th>minority (flagged)</th></tr></thead><tbody>"];
    for (const [c, groups] of rows.slice(0, limit)) {
      const [value, members, passes] = groups[0];
      const minority = groups.slice(1).map(([v, ts, p]) =>
        `<div><code>${esc(S[v])}</code> <span class="${p ? "passes" : "fails"}">${p ? "passes" : "fails"}</span>: ` +
        ts.map((i) => `<span class="minority">${esc(targets[i].name)}</span>`).join("") + "</div>").join("");
      const all = groups.every((g) => g[2]);
      parts.push(`<tr class="drift" data-check="${esc(S[CHECKS[c][1]])}"><td><code>${esc(S[CHECKS[c][0]])}</code><br>` +
        `${esc(S[CHECKS[c][1]])}${all ? ' <span class="passes">(every value passes)</span>' : ""}</td>` +
        `<td><code>${esc(S[value])}</code> on ${members.length} <span class="${passes ? "passes" : "fails"}">` +
        `${passes ? "passes" : "fails"}</span></td><td>${minority}</td></tr>`);
    }
    parts.push("</tbody>");
    document.getElementById("drift").innerHTML = parts.join("");
    document.getElementById("drift-summary").textContent = rows.length
      ? `${rows.length} check(s) whose observed value differs between targets: the majority's value first, the other targets flagged.`
      : "Every check holds one value on every target.";
    document.getElementById("drift-more").hidden = rows.length <= limit;
  }

  function draw() { drawMatrix(); drawDrift(); }

  function setup() {
    const kindSelect = document.getElementById("f-kind");
    for (const k of data.kindOrder) kindSelect.add(new Option(KINDS[k], String(k)));
    const outcomeSelect = document.getElementById("f-outcome");
    for (const o of OUT) outcomeSelect.add(new Option(o, o));
    outcomeSelect.add(new Option("no result", "no result"));
    kindSelect.addEventListener("change", () => { state.kind = kindSelect.value; state.page = 0; draw(); });
    outcomeSelect.addEventListener("change", () => { state.outcome = outcomeSelect.value; state.page = 0; drawMatrix(); });
    const input = document.getElementById("f-target");
    input.addEventListener("input", () => { state.target = input.value; state.page = 0; drawMatrix(); });
    document.getElementById("prev").addEventListener("click", () => { state.page -= 1; drawMatrix(); });
    document.getElementById("next").addEventListener("click", () => { state.page += 1; drawMatrix(); });
    document.getElementById("drift-more").addEventListener("click", () => { state.driftAll = true; drawDrift(); });
    document.getElementById("matrix").addEventListener("click", (event) => {
      const cell = event.target.closest("td.cell");
      if (cell && cell.dataset.t !== undefined) showDetail(cell);
    });
    document.getElementById("legend").innerHTML = [...OUT, "no result"].map((o) =>
      `<span><i class="o-${o === "no result" ? "noresult" : o}"></i>${o}</span>`).join("");
    const bad = targets.filter((t) => t.reason === null && t.results.some((v, i) => i % STRIDE === 1 && !GOOD.has(OUT[v]))).length;
    const none = targets.filter((t) => t.reason !== null).length;
    document.getElementById("summary").textContent = `${targets.length} targets: ${targets.length - bad - none} healthy, ` +
      `${bad} with problems, ${none} no result; ${CHECKS.length} checks; ${data.tool}, ${data.generated}`;
  }

  setup();
  draw();
  document.body.dataset.renderedMs = String(Math.round(performance.now()));
})();
