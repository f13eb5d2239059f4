"use strict";
// The fleet page: everything comes from the JSON blob in #fleet-data; nothing is fetched.
// Three levels, one select: all sections (the terminal matrix's columns), a section (its kinds,
// or its checks when it has one kind), a kind (its checks).
(function () {
  const data = JSON.parse(document.getElementById("fleet-data").textContent);
  const S = data.strings, OUT = data.outcomes, KINDS = data.kinds, CHECKS = data.checks;
  const SECTIONS = data.sections, KIND_SECTION = data.kindSection;
  const STRIDE = 7; // check, outcome, observed, expected, message, evidence, top cause
  const PAGE = 100;
  const GOOD = new Set(["passed", "fixed", "skipped"]);
  const str = (i) => (i < 0 ? null : S[i]);
  const esc = (t) => String(t).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const state = { view: "", outcome: "", target: "", page: 0, driftAll: false };

  const kindsOfSection = SECTIONS.map(() => []);
  for (const k of data.kindOrder) kindsOfSection[KIND_SECTION[k]].push(k);
  // A kind's label inside its section: pcie.max_read_request -> max_read_request.
  const kindLabel = (k) => {
    const name = KINDS[k], prefix = SECTIONS[KIND_SECTION[k]] + ".";
    return name.startsWith(prefix) ? name.slice(prefix.length) : name;
  };

  // Per target: the offsets of its results of each section and of each kind.
  const targets = data.targets.map(([name, reason, facts, results], index) => {
    const bySection = new Map(), byKind = new Map();
    for (let r = 0; r < results.length; r += STRIDE) {
      const kind = CHECKS[results[r]][2], section = KIND_SECTION[kind];
      if (!bySection.has(section)) bySection.set(section, []);
      bySection.get(section).push(r);
      if (!byKind.has(kind)) byKind.set(kind, []);
      byKind.get(kind).push(r);
    }
    return { index, name, reason: str(reason), facts: str(facts), results, bySection, byKind };
  });
  const checksOfKind = new Map();
  for (const t of targets) {
    for (let r = 0; r < t.results.length; r += STRIDE) {
      const c = t.results[r], kind = CHECKS[c][2];
      if (!checksOfKind.has(kind)) checksOfKind.set(kind, new Set());
      checksOfKind.get(kind).add(c);
    }
  }

  // The view: "" all sections, "sN" section N, "kN" kind N. A section of one kind is that kind.
  function parseView(view) {
    if (view === "") return { level: "all" };
    const n = Number(view.slice(1));
    if (view[0] === "k") return { level: "kind", kind: n };
    const kinds = kindsOfSection[n];
    return kinds.length === 1 ? { level: "kind", kind: kinds[0], section: n } : { level: "section", section: n };
  }
  function inView(kind) {
    const v = parseView(state.view);
    if (v.level === "all") return true;
    if (v.level === "kind") return kind === v.kind;
    return KIND_SECTION[kind] === v.section;
  }

  function outcomeOf(t, r) { return OUT[t.results[r + 1]]; }
  function worst(t, rows) {
    let best = OUT.length;
    for (const r of rows) best = Math.min(best, t.results[r + 1]);
    return OUT[best] || "passed";
  }
  function has(t, outcome) {
    for (let r = 0; r < t.results.length; r += STRIDE) {
      if (outcomeOf(t, r) === outcome && inView(CHECKS[t.results[r]][2])) return true;
    }
    return false;
  }

  function visibleTargets() {
    const needle = state.target.toLowerCase();
    return targets.filter((t) => {
      if (needle && !t.name.toLowerCase().includes(needle)) return false;
      if (state.outcome === "no result") return t.reason !== null;
      if (state.outcome) return t.reason === null && has(t, state.outcome);
      return true;
    });
  }

  // A column: what it groups (a section, a kind or one check), its heading, and where a click
  // on the heading leads.
  function columns() {
    const v = parseView(state.view);
    if (v.level === "all") {
      return SECTIONS.map((name, s) => ({ section: s, label: name, title: name, drill: `s${s}` }));
    }
    if (v.level === "section") {
      return kindsOfSection[v.section].map((k) => ({ kind: k, label: kindLabel(k), title: KINDS[k],
        drill: `k${k}`, vertical: true }));
    }
    return [...(checksOfKind.get(v.kind) || [])].map((c) => ({ check: c, label: S[CHECKS[c][3]],
      title: S[CHECKS[c][1]], vertical: true }));
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

  function rowsOf(t, col) {
    if (col.section !== undefined) return t.bySection.get(col.section) || [];
    if (col.kind !== undefined) return t.byKind.get(col.kind) || [];
    return (t.byKind.get(CHECKS[col.check][2]) || []).filter((r) => t.results[r] === col.check);
  }

  // What is wrong in a group of checks, for its tooltip: "pcie.aspm 8 failed; ...".
  function problems(t, rows) {
    const counts = new Map();
    for (const r of rows) {
      const o = outcomeOf(t, r);
      if (GOOD.has(o)) continue;
      const key = `${KINDS[CHECKS[t.results[r]][2]]} ${o}`;
      counts.set(key, (counts.get(key) || 0) + 1);
    }
    return [...counts].map(([key, n]) => `${n} ${key}`).join("; ");
  }

  function cellOf(t, col) {
    const rows = rowsOf(t, col);
    if (!rows.length) return '<td class="cell empty">-</td>';
    const where = col.section !== undefined ? `data-s="${col.section}"` :
      col.kind !== undefined ? `data-k="${col.kind}"` : `data-c="${col.check}"`;
    if (col.check !== undefined) {
      const r = rows[0], o = outcomeOf(t, r), observed = str(t.results[r + 2]);
      const cause = str(t.results[r + 6]);
      const dim = state.outcome && o !== state.outcome;
      const text = observed === null ? "&mdash;" : esc(observed.length > 12 ? observed.slice(0, 11) + "…" : observed);
      return `<td class="cell o-${o}${dim ? " dim" : ""}" data-t="${t.index}" ${where}` +
        ` data-outcome="${o}" title="${esc(col.title)}: ${esc(o)}` +
        `${cause === null ? "" : esc("; top cause: " + cause)}">${text}</td>`;
    }
    const w = worst(t, rows);
    const bad = rows.filter((r) => !GOOD.has(outcomeOf(t, r))).length;
    const dim = state.outcome && !rows.some((r) => outcomeOf(t, r) === state.outcome);
    const text = bad ? `${bad}/${rows.length}` : String(rows.length);
    const title = (bad ? `${col.title}: ${bad} of ${rows.length} not good: ${problems(t, rows)}` :
      `${col.title}: ${rows.length} good`) + topCause(t, rows);
    return `<td class="cell o-${w}${dim ? " dim" : ""}" data-t="${t.index}" ${where}` +
      ` data-outcome="${w}" title="${esc(title)}">${text}</td>`;
  }

  function drawMatrix() {
    const shown = visibleTargets(), cols = columns();
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = shown.slice(state.page * PAGE, state.page * PAGE + PAGE);
    const parts = ['<thead><tr><th class="name">target</th>'];
    for (const col of cols) {
      const cls = [col.vertical ? "v" : "", col.drill ? "drill" : ""].filter(Boolean).join(" ");
      parts.push(`<th class="${cls}" title="${esc(col.title)}"` +
        (col.drill ? ` data-drill="${col.drill}"` : "") + `><span>${esc(col.label)}</span></th>`);
    }
    parts.push("</tr></thead><tbody>");
    for (const t of slice) {
      if (t.reason !== null) {
        parts.push(`<tr class="target noresult" data-target="${esc(t.name)}"><td class="name">${esc(t.name)}</td>` +
          `<td class="reason" colspan="${Math.max(1, cols.length)}">no result: ${esc(t.reason)}</td></tr>`);
        continue;
      }
      parts.push(`<tr class="target" data-target="${esc(t.name)}"><td class="name" title="${esc(t.facts)}">${esc(t.name)}</td>`);
      for (const col of cols) parts.push(cellOf(t, col));
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
    const col = cell.dataset.s !== undefined ? { section: Number(cell.dataset.s), title: SECTIONS[Number(cell.dataset.s)] } :
      cell.dataset.k !== undefined ? { kind: Number(cell.dataset.k), title: KINDS[Number(cell.dataset.k)] } :
        { check: Number(cell.dataset.c), title: S[CHECKS[Number(cell.dataset.c)][1]] };
    // the worst first, then in the spec's order
    const rows = [...rowsOf(t, col)].sort((a, b) => t.results[a + 1] - t.results[b + 1] || a - b);
    document.getElementById("detail-body").innerHTML = `<h3>${esc(t.name)}: ${esc(col.title)}</h3>` +
      `<p class="facts">${esc(t.facts || "")}</p>` + rows.map((r) => recordHtml(t, r)).join("");
    document.getElementById("detail").hidden = false;
    document.querySelectorAll("td.chosen").forEach((td) => td.classList.remove("chosen"));
    cell.classList.add("chosen");
  }

  function closeDetail() {
    document.getElementById("detail").hidden = true;
    document.querySelectorAll("td.chosen").forEach((td) => td.classList.remove("chosen"));
  }

  function drawDrift() {
    const rows = data.drift.filter(([c]) => inView(CHECKS[c][2]));
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
    document.getElementById("drift").hidden = !rows.length;
    document.getElementById("drift-summary").textContent = rows.length
      ? `${rows.length} check(s) whose observed value differs between targets: the majority's value first, the other targets flagged.`
      : "Every check holds one value on every target.";
    document.getElementById("drift-more").hidden = rows.length <= limit;
  }

  function draw() { drawMatrix(); drawDrift(); }

  function setView(view) {
    state.view = view;
    state.page = 0;
    document.getElementById("f-section").value = view;
    closeDetail();
    draw();
  }

  function setup() {
    const select = document.getElementById("f-section");
    SECTIONS.forEach((name, s) => {
      const kinds = kindsOfSection[s];
      if (kinds.length === 1) {
        select.add(new Option(name, `s${s}`));
        return;
      }
      const group = document.createElement("optgroup");
      group.label = name;
      group.appendChild(new Option(`${name}: its ${kinds.length} kinds`, `s${s}`));
      for (const k of kinds) group.appendChild(new Option(KINDS[k], `k${k}`));
      select.appendChild(group);
    });
    const outcomeSelect = document.getElementById("f-outcome");
    for (const o of OUT) outcomeSelect.add(new Option(o, o));
    outcomeSelect.add(new Option("no result", "no result"));
    select.addEventListener("change", () => setView(select.value));
    outcomeSelect.addEventListener("change", () => { state.outcome = outcomeSelect.value; state.page = 0; drawMatrix(); });
    const input = document.getElementById("f-target");
    input.addEventListener("input", () => { state.target = input.value; state.page = 0; drawMatrix(); });
    document.getElementById("prev").addEventListener("click", () => { state.page -= 1; drawMatrix(); });
    document.getElementById("next").addEventListener("click", () => { state.page += 1; drawMatrix(); });
    document.getElementById("drift-more").addEventListener("click", () => { state.driftAll = true; drawDrift(); });
    document.getElementById("detail-close").addEventListener("click", closeDetail);
    document.getElementById("matrix").addEventListener("click", (event) => {
      const heading = event.target.closest("th[data-drill]");
      if (heading) { setView(heading.dataset.drill); return; }
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
