// The head atlas: the overview grid, the pruning slider, the sortable head table and a head's
// card, drawn with D3 from the JSON embedded in the page (headcount.atlas writes it).
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("atlas-data").textContent);
  const TYPE_NAMES = {enc_self: "encoder self-attention", dec_self: "decoder self-attention",
                      dec_enc: "decoder-encoder attention"};
  const typeName = t => TYPE_NAMES[t] || t;
  const CELL = 30, GAP = 2;
  const heads = DATA.heads;
  const byKey = new Map(heads.map(h => [h.key, h]));
  const roleOf = new Map(DATA.roles.map(r => [r.name, r]));
  const fmt = v => (v === null || v === undefined) ? "–" : (Math.abs(v) >= 100 ? d3.format(".1f")(v)
                    : d3.format(".3~g")(v));
  const signed = v => (v === null || v === undefined) ? "–" : d3.format("+.2f")(v);
  const pct = v => (v === null || v === undefined) ? "–" : d3.format(".0%")(v);
  const state = {colour: DATA.measures.length ? DATA.measures[0].column : "role", order: "index",
                 setting: null, run: 0, selected: null, sort: {column: "key", desc: false}};

  // ---------------------------------------------------------------- controls
  const colourBy = d3.select("#colour-by");
  colourBy.selectAll("option").data(DATA.measures.map(m => m.column).concat(["role"])).join("option")
    .attr("value", d => d).text(d => d === "role" ? "role" : d + (DATA.measures.find(m => m.column === d).score
      ? "" : " (" + DATA.measures.find(m => m.column === d).measure + ")"));
  colourBy.property("value", state.colour).on("change", function () { state.colour = this.value; drawOverview(); });
  d3.select("#order-by").on("change", function () { state.order = this.value; drawOverview(); });

  const settings = Object.keys(DATA.pruning.settings);
  if (!settings.length) d3.select("#pruning-controls").style("display", "none");
  d3.select("#pruning-setting").selectAll("option").data(["none"].concat(settings)).join("option")
    .attr("value", d => d).text(d => d === "none" ? "off" : d === "enc" ? "encoder self-attention only"
      : d === "all" ? "all attention types" : d);
  const slider = d3.select("#lambda-slider");
  d3.select("#pruning-setting").on("change", function () {
    state.setting = this.value === "none" ? null : this.value;
    state.run = 0;
    const runs = state.setting ? DATA.pruning.settings[state.setting] : [];
    slider.attr("max", Math.max(0, runs.length - 1)).property("value", 0).property("disabled", !runs.length);
    updatePruning();
  });
  slider.property("disabled", true).on("input", function () { state.run = +this.value; updatePruning(); });

  function currentRun() {
    return state.setting ? DATA.pruning.settings[state.setting][state.run] : null;
  }
  function closedSet() {
    const run = currentRun();
    return new Set(run ? run.closed : []);
  }

  function updatePruning() {
    const run = currentRun(), status = d3.select("#pruning-status");
    if (!run) {
      status.attr("data-closed", 0).attr("data-lambda", null).text("no pruning shown");
    } else {
      const ci = (d, lo, hi) => d === null || d === undefined ? "" : `${signed(d)} [${signed(lo)}, ${signed(hi)}]`;
      // BLEU for a translation model, perplexity (lower is better) for a language model
      const value = run[DATA.pruning.column || "bleu"];
      const parts = [`λ = ${run.lam}${run.control ? " (control)" : ""}`,
                     `${DATA.pruning.metric} ${value === null || value === undefined ? "–" : d3.format(DATA.pruning.format || ".2f")(value)}`];
      if (run.delta_nll !== undefined && run.delta_nll !== null)
        parts.push(`NLL vs baseline ${ci(run.delta_nll, run.delta_nll_low, run.delta_nll_high)} nats/token`);
      // a sentence encoder's: its embedding distance minus the baseline's (0)
      if (run.delta_distance !== undefined && run.delta_distance !== null) {
        const small = d3.format("+.3g");  // distances of one head are 1e-4 to 1e-2: .2f would show 0
        parts.push(`distance vs baseline ${small(run.delta_distance)} [${small(run.delta_distance_low)}, ` +
                   `${small(run.delta_distance_high)}]`);
      }
      if (run.d_baseline !== undefined && run.d_baseline !== null)
        parts.push(`vs baseline ${ci(run.d_baseline, run.d_baseline_low, run.d_baseline_high)}`);
      if (run.d_control !== undefined && run.d_control !== null)
        parts.push(`vs control ${ci(run.d_control, run.d_control_low, run.d_control_high)}`);
      parts.push(`${heads.length - run.closed.length} heads open, ${run.closed.length} closed`);
      status.attr("data-closed", run.closed.length).attr("data-lambda", run.lam).text(parts.join(" · "));
    }
    drawOverview();
    drawTable();
    if (state.selected) drawCard(state.selected);
  }

  // ---------------------------------------------------------------- colours
  function colourScale(kind) {
    if (state.colour === "role") return null;
    const values = heads.filter(h => h.type === kind).map(h => h.scores[state.colour]).filter(v => v !== null);
    const extent = d3.extent(values);
    if (extent[0] === undefined) return null;
    if (extent[0] === extent[1]) extent[1] = extent[0] + 1e-9;
    return d3.scaleSequential(d3.interpolateViridis).domain(extent);
  }
  function fillOf(h, scale) {
    if (state.colour === "role") {
      if (h.type !== DATA.role_type || !h.role) return "#ffffff";
      return (roleOf.get(h.role) || roleOf.get("none")).colour;
    }
    const v = h.scores[state.colour];
    return v === null || !scale ? "#ffffff" : scale(v);
  }

  // ---------------------------------------------------------------- overview
  function drawOverview() {
    const closed = closedSet();
    const root = d3.select("#overview");
    root.selectAll("*").remove();
    for (const [kind, [nLayers, nHeads]] of Object.entries(DATA.layout)) {
      const scale = colourScale(kind);
      const div = root.append("div").attr("class", "grid").attr("data-type", kind);
      div.append("h2").text(typeName(kind));
      const margin = {left: 56, top: 18, right: 8, bottom: 8};
      const width = margin.left + nHeads * (CELL + GAP) + margin.right;
      const height = margin.top + nLayers * (CELL + GAP) + margin.bottom;
      const svg = div.append("svg").attr("width", width).attr("height", height);
      const y = d3.scaleBand().domain(d3.range(nLayers)).range([margin.top, height - margin.bottom]).padding(0.06);
      svg.append("g").attr("class", "axis").attr("transform", `translate(${margin.left - 2},0)`)
        .call(d3.axisLeft(y).tickFormat(l => `layer ${l + 1}`).tickSize(0)).select(".domain").remove();
      svg.append("text").attr("x", margin.left).attr("y", 12).attr("class", "muted").style("font-size", "11px")
        .text(state.order === "index" ? "heads 1 to " + nHeads : "heads ordered by " + state.colour);
      for (let layer = 0; layer < nLayers; layer++) {
        let row = heads.filter(h => h.type === kind && h.layer === layer);
        if (state.order === "score" && state.colour !== "role")
          row = row.slice().sort((a, b) => d3.descending(a.scores[state.colour], b.scores[state.colour]));
        else if (state.order === "score")
          row = row.slice().sort((a, b) => d3.ascending(a.role || "~", b.role || "~") || a.head - b.head);
        const x = d3.scaleBand().domain(d3.range(row.length)).range([margin.left, width - margin.right]).padding(0.06);
        const g = svg.append("g");
        g.selectAll("rect").data(row).join("rect")
          .attr("class", h => "head" + (closed.has(h.key) ? " closed" : "") + (state.selected === h.key ? " selected" : ""))
          .attr("data-key", h => h.key).attr("data-layer", h => h.layer).attr("data-head", h => h.head)
          .attr("x", (h, i) => x(i)).attr("y", y(layer)).attr("width", x.bandwidth()).attr("height", y.bandwidth())
          .attr("fill", h => fillOf(h, scale))
          .on("click", (event, h) => select(h.key))
          .append("title").text(h => `${typeName(h.type)}, layer ${h.layer + 1}, head ${h.head + 1}` +
            (state.colour === "role" ? `: ${h.role || "not analysed"}` : `: ${state.colour} ${fmt(h.scores[state.colour])}`) +
            (closed.has(h.key) ? " (gate closed)" : ""));
        g.selectAll("text").data(row).join("text")
          .attr("class", h => "cell-label" + (closed.has(h.key) ? " closed" : ""))
          .attr("x", (h, i) => x(i) + x.bandwidth() / 2).attr("y", y(layer) + y.bandwidth() / 2 + 4)
          .text(h => h.head + 1);
      }
      if (scale) {  // a colour bar with D3's axis
        const lw = Math.min(220, width - margin.left - 8), legend = div.append("svg").attr("width", width).attr("height", 40);
        const id = "grad-" + kind;
        const grad = legend.append("defs").append("linearGradient").attr("id", id);
        grad.selectAll("stop").data(d3.range(0, 1.01, 0.1)).join("stop").attr("offset", d => d)
          .attr("stop-color", d => scale(scale.domain()[0] + d * (scale.domain()[1] - scale.domain()[0])));
        legend.append("rect").attr("x", margin.left).attr("y", 4).attr("width", lw).attr("height", 10)
          .attr("fill", `url(#${id})`);
        legend.append("g").attr("class", "axis").attr("transform", `translate(0,14)`)
          .call(d3.axisBottom(d3.scaleLinear().domain(scale.domain()).range([margin.left, margin.left + lw])).ticks(4));
      }
    }
    drawLegend();
  }

  function drawLegend() {
    const legend = d3.select("#legend");
    legend.selectAll("*").remove();
    if (state.colour !== "role") return;
    const items = legend.selectAll("span").data(DATA.roles).join("span").style("margin-right", "12px");
    items.append("span").attr("class", "badge").style("background", d => d.colour).text(d => d.label);
    legend.append("span").attr("class", "muted").text(" (roles are found for " + typeName(DATA.role_type) +
      " heads; white: not analysed)");
  }

  // ---------------------------------------------------------------- planted functions
  if (DATA.planted.length) {
    const div = d3.select("#planted");
    div.append("h2").text("Planted functions (positive control)");
    div.append("ul").attr("class", "planted-list").selectAll("li").data(DATA.planted).join("li")
      .html(p => `<b>${p.function}</b> (${p.kind}): ` + (p.head ? headLabel(p.head) + (p.via ? ` via ${p.via}` : "") +
        `, rate ${fmt(p.rate)}` + (p.baseline !== null ? ` against ${fmt(p.baseline)}` : "") : "not found"))
      .on("click", (event, p) => p.head && select(p.head));
  }

  function headLabel(key) {
    const h = byKey.get(key);
    return h ? `${typeName(h.type)} layer ${h.layer + 1} head ${h.head + 1}` : key;
  }

  // ---------------------------------------------------------------- table
  const tableColumns = [{id: "key", label: "head"}, {id: "role", label: "role"}]
    .concat(DATA.measures.map(m => ({id: m.column, label: m.column})));
  function cellValue(h, c) {
    if (c === "key") return [Object.keys(DATA.layout).indexOf(h.type), h.layer, h.head];
    if (c === "role") return h.role || "";
    return h.scores[c];
  }
  function compare(a, b) {
    const c = state.sort.column, va = cellValue(a, c), vb = cellValue(b, c);
    let r;
    if (Array.isArray(va)) r = d3.ascending(va[0], vb[0]) || d3.ascending(va[1], vb[1]) || d3.ascending(va[2], vb[2]);
    else if (va === null || va === undefined) r = 1;
    else if (vb === null || vb === undefined) r = -1;
    else r = d3.ascending(va, vb);
    return state.sort.desc && va !== null && vb !== null ? -r : r;
  }
  function drawTable() {
    const closed = closedSet();
    d3.select("#head-table thead").selectAll("tr").data([0]).join("tr").selectAll("th").data(tableColumns).join("th")
      .attr("data-column", c => c.id).text(c => c.label)
      .attr("class", c => c.id === state.sort.column ? (state.sort.desc ? "sorted-desc" : "sorted-asc") : null)
      .on("click", (event, c) => {
        state.sort = {column: c.id, desc: c.id === state.sort.column ? !state.sort.desc : c.id !== "key" && c.id !== "role"};
        drawTable();
      });
    const rows = heads.slice().sort(compare);
    d3.select("#head-table tbody").selectAll("tr").data(rows, h => h.key).join("tr")
      .attr("data-key", h => h.key).attr("class", h => closed.has(h.key) ? "closed" : null)
      .on("click", (event, h) => select(h.key))
      .selectAll("td").data(h => tableColumns.map(c => ({h, c: c.id}))).join("td")
      .text(({h, c}) => c === "key" ? `${h.type} ${h.layer + 1}.${h.head + 1}` : c === "role" ? (h.role || "")
        : fmt(h.scores[c]));
  }

  // ---------------------------------------------------------------- the card
  function select(key) {
    state.selected = key;
    d3.selectAll("rect.head").classed("selected", d => d.key === key);
    drawCard(key);
  }

  function drawCard(key) {
    const h = byKey.get(key);
    const card = d3.select("#card").property("hidden", false).attr("data-key", key);
    card.selectAll("*").remove();
    const top = card.append("div").attr("class", "card-head");
    top.append("h2").text(`${typeName(h.type)}, layer ${h.layer + 1}, head ${h.head + 1}`);
    top.append("button").attr("title", "close").text("×").on("click", () => {
      state.selected = null; card.property("hidden", true); d3.selectAll("rect.head").classed("selected", false);
    });
    if (h.role) {
      const role = roleOf.get(h.role) || roleOf.get("none");
      const p = card.append("p");
      p.append("span").attr("class", "badge role").attr("data-role", h.role).style("background", role.colour).text(role.label);
      if (h.role_paper && h.role_paper !== h.role) p.append("span").text(` (the paper's rules: ${h.role_paper})`);
      if (h.text) p.append("span").attr("class", "muted").text(` · statistics on ${h.text}`);
    }
    const run = currentRun();
    if (run && run.closed.includes(key)) card.append("p").attr("class", "closed-note")
      .text(`Gate closed at λ = ${run.lam} (${state.setting}).`);

    // scores with ranks in the layer
    card.append("h3").text("Scores (rank in its layer, 1 = largest)");
    const layerSize = heads.filter(o => o.type === h.type && o.layer === h.layer).length;
    const table = card.append("table").attr("class", "scores");
    const tr = table.selectAll("tr").data(DATA.measures).join("tr");
    tr.append("th").text(m => m.column);
    tr.append("td").attr("class", "score-value").attr("data-column", m => m.column)
      .attr("data-value", m => h.scores[m.column]).text(m => fmt(h.scores[m.column]));
    tr.append("td").attr("class", "score-rank").attr("data-column", m => m.column)
      .text(m => h.ranks[m.column] === null ? "" : `${h.ranks[m.column]} of ${layerSize}`);

    const planted = DATA.planted.filter(p => p.head === key);
    if (planted.length) {
      card.append("h3").text("Planted function (positive control)");
      card.append("ul").attr("class", "planted").selectAll("li").data(planted).join("li")
        .text(p => `${p.function} (${p.kind})${p.via ? " via " + p.via : ""}: rate ${fmt(p.rate)}` +
          (p.baseline !== null ? ` against the baseline ${fmt(p.baseline)}` : "") +
          Object.entries(p.closes_at).map(([s, l]) => `; gate closes at λ ${l === null ? "never (open)" : l} (${s})`).join(""));
    }
    drawRoleEvidence(card, h);
    drawTrajectories(card, h);
    drawExamples(card, h);
  }

  function barChart(parent, rows, opts) {
    // rows: [{label, value, colour?}], opts: {width, height, max, lines: [{value, label}]}
    const width = opts.width || 560, height = opts.height || 150, m = {l: 40, r: 10, t: 10, b: opts.bottom || 30};
    const svg = parent.append("svg").attr("width", width).attr("height", height).attr("class", opts.cls || null);
    const x = d3.scaleBand().domain(rows.map(r => r.label)).range([m.l, width - m.r]).padding(0.15);
    const y = d3.scaleLinear().domain([0, opts.max || Math.max(1e-9, d3.max(rows, r => r.value) || 0)]).nice()
      .range([height - m.b, m.t]);
    svg.append("g").attr("class", "axis").attr("transform", `translate(0,${height - m.b})`).call(d3.axisBottom(x))
      .selectAll("text").attr("transform", opts.rotate ? "rotate(-35)" : null)
      .style("text-anchor", opts.rotate ? "end" : "middle");
    svg.append("g").attr("class", "axis").attr("transform", `translate(${m.l},0)`).call(d3.axisLeft(y).ticks(4, "%"));
    svg.append("g").selectAll("rect").data(rows).join("rect").attr("class", "bar")
      .attr("data-label", r => r.label).attr("data-value", r => r.value)
      .attr("x", r => x(r.label)).attr("width", x.bandwidth()).attr("y", r => y(r.value || 0))
      .attr("height", r => y(0) - y(r.value || 0)).attr("fill", r => r.colour || "#4c78a8")
      .append("title").text(r => `${r.label}: ${pct(r.value)}`);
    (opts.lines || []).forEach((line, i) => {
      svg.append("line").attr("x1", m.l).attr("x2", width - m.r).attr("y1", y(line.value)).attr("y2", y(line.value))
        .attr("stroke", line.colour || "#d62728").attr("stroke-dasharray", "4 3");
      svg.append("text").attr("x", i % 2 ? m.l + 4 : width - m.r).attr("y", y(line.value) - 3)
        .attr("text-anchor", i % 2 ? "start" : "end").style("font-size", "11px")
        .attr("fill", line.colour || "#d62728").text(line.label);
    });
    return svg;
  }

  function groupedBars(parent, rows, t) {
    // per relation and direction: the head's accuracy beside the positional baseline, and the
    // bar it must reach (baseline + margin) as a tick
    const width = 560, height = 190, m = {l: 40, r: 10, t: 10, b: 46};
    const svg = parent.append("svg").attr("width", width).attr("height", height).attr("class", "syntactic-chart");
    const x0 = d3.scaleBand().domain(rows.map(r => `${r.relation} ${r.name}`)).range([m.l, width - m.r]).padding(0.2);
    const x1 = d3.scaleBand().domain(["accuracy", "baseline_accuracy"]).range([0, x0.bandwidth()]).padding(0.05);
    const y = d3.scaleLinear().domain([0, 1]).range([height - m.b, m.t]);
    const colour = d3.scaleOrdinal().domain(x1.domain()).range([roleOf.get("syntactic")?.colour || "#2e8b57", "#c7c7c7"]);
    svg.append("g").attr("class", "axis").attr("transform", `translate(0,${height - m.b})`).call(d3.axisBottom(x0))
      .selectAll("text").call(text => text.each(function (d) {  // relation over direction
        const [relation, name] = d.split(" ");
        d3.select(this).text(null).append("tspan").attr("x", 0).attr("dy", "0.7em").text(relation);
        d3.select(this).append("tspan").attr("x", 0).attr("dy", "1.1em").text(name);
      }));
    svg.append("g").attr("class", "axis").attr("transform", `translate(${m.l},0)`).call(d3.axisLeft(y).ticks(4, "%"));
    const group = svg.append("g").selectAll("g").data(rows).join("g")
      .attr("transform", r => `translate(${x0(`${r.relation} ${r.name}`)},0)`);
    group.selectAll("rect").data(r => x1.domain().map(k => ({r, k, v: r[k]}))).join("rect").attr("class", "bar")
      .attr("data-label", d => `${d.r.relation} ${d.r.name} ${d.k === "accuracy" ? "head" : "baseline"}`)
      .attr("data-value", d => d.v).attr("x", d => x1(d.k)).attr("width", x1.bandwidth())
      .attr("y", d => y(d.v || 0)).attr("height", d => y(0) - y(d.v || 0)).attr("fill", d => colour(d.k))
      .append("title").text(d => `${d.r.relation} ${d.r.name}, ${d.k === "accuracy" ? "this head" : "positional baseline"}: ` +
        `${pct(d.v)} of ${d.r.n} instances`);
    if (t.syntactic_margin !== undefined)
      group.append("line").attr("x1", 0).attr("x2", x0.bandwidth())
        .attr("y1", r => y(Math.min(1, (r.baseline_accuracy || 0) + t.syntactic_margin)))
        .attr("y2", r => y(Math.min(1, (r.baseline_accuracy || 0) + t.syntactic_margin)))
        .attr("stroke", "#d62728").attr("stroke-width", 1.5);
  }

  function drawRoleEvidence(card, h) {
    const t = DATA.thresholds, hist = (DATA.histograms || {})[h.type];
    if (hist && hist.share[h.key]) {
      card.append("h3").text("Relative position of the most attended token");
      const rows = hist.offsets.map((o, i) => ({label: (o > 0 ? "+" : "") + o, value: hist.share[h.key][i],
        colour: h.positional && o === h.positional.offset ? roleOf.get("positional")?.colour || "#7b3fa0" : "#9ecae1"}));
      const lines = h.type === DATA.role_type && t.positional_threshold !== undefined ?
        [{value: t.positional_threshold, label: `positional threshold ${pct(t.positional_threshold)}`}] : [];
      barChart(card, rows, {max: 1, lines, cls: "positional-histogram", height: 140});
      card.append("p").attr("class", "hint").text(`Share of queries whose largest weight is at each offset, among the ${hist.rule}; EOS left out.` +
        (h.positional ? ` Its most frequent offset: ${h.positional.offset} (${pct(h.positional.fraction)}).` : ""));
    }
    const scored = (h.syntactic || []).filter(s => s.n > 0 && s.accuracy !== null);  // relations the text has
    if (scored.length) {
      card.append("h3").text("Syntactic accuracy against the positional baseline");
      groupedBars(card, scored, t);
      card.append("p").attr("class", "hint").text(`Green: how often its largest weight falls on the related word; grey: always pointing at the relation's most frequent relative position; red tick: grey + ${pct(t.syntactic_margin)}, what a syntactic head reaches (on ≥ ${t.min_instances} instances).` +
        (h.syntactic_text ? ` Text: ${h.syntactic_text}; parser: ${h.parser}.` : ""));
    }
    if (h.rare && !h.rare.n_sentences) {
      card.append("h3").text("Rare tokens");
      card.append("p").attr("class", "hint").text("No analysis sentence is eligible (none has its rarest word outside the " +
        `${t.top_k} most frequent training words).`);
    } else if (h.rare) {
      card.append("h3").text("Rare tokens");
      const r = h.rare;
      const rows = [{label: "rarest word", value: r.rate_rarest, colour: "#f28e1c"},
                    {label: "one of two rarest", value: r.rate_two_rarest, colour: "#f28e1c"},
                    {label: "uniform head: two rarest", value: r.uniform_rate_two_rarest, colour: "#c7c7c7"}];
      const lines = [{value: t.rare_threshold, label: `threshold ${pct(t.rare_threshold)}`}];
      if (t.rare_margin !== null && t.rare_margin !== undefined && r.uniform_rate_two_rarest !== null)
        lines.push({value: r.uniform_rate_two_rarest + t.rare_margin, label: `uniform + ${pct(t.rare_margin)}`});
      barChart(card, rows, {max: 1, lines, cls: "rare-chart", height: 150});
      card.append("p").attr("class", "hint").text(`How often it points to the rarest words over ${r.n_sentences} eligible sentences (their rarest word is not among the ${t.top_k} most frequent training words).`);
    }
  }

  function drawTrajectories(card, h) {
    const lines = [];
    for (const [setting, runs] of Object.entries(DATA.pruning.settings)) {
      for (const run of runs) {
        const tr = run.trajectory;
        if (tr && tr.p_closed[h.key]) lines.push({setting, lam: run.lam, steps: tr.steps, p: tr.p_closed[h.key],
                                                  closed: run.closed.includes(h.key)});
      }
    }
    if (!lines.length) return;
    card.append("h3").text("Gate trajectory in each pruning run");
    const x = d3.scaleLinear().domain([0, d3.max(lines, l => d3.max(l.steps))]).range([40, 440]);
    const line = d3.line().defined(d => d[1] !== null).x(d => x(d[0]));
    for (const [setting, runs] of d3.group(lines, l => l.setting)) {
      const width = 560, m = {l: 40, r: 120, t: 8, b: 28}, height = Math.max(130, m.t + m.b + 14 * runs.length);
      const svg = card.append("svg").attr("width", width).attr("height", height).attr("class", "trajectories")
        .attr("data-setting", setting);
      const y = d3.scaleLinear().domain([0, 1]).range([height - m.b, m.t]);
      const colour = d3.scaleSequential(d3.interpolatePlasma).domain([-0.5, runs.length]);
      svg.append("g").attr("class", "axis").attr("transform", `translate(0,${height - m.b})`).call(d3.axisBottom(x).ticks(5));
      svg.append("g").attr("class", "axis").attr("transform", `translate(${m.l},0)`).call(d3.axisLeft(y).ticks(4));
      svg.append("text").attr("x", m.l).attr("y", height - 2).style("font-size", "11px")
        .text(`step · ${setting === "enc" ? "encoder self-attention only" : setting === "all" ? "all attention types" : setting}`);
      runs.forEach((l, i) => svg.append("path").attr("fill", "none").attr("stroke", colour(i)).attr("stroke-width", 1.5)
        .attr("data-run", `${setting} λ ${l.lam}`).attr("d", line.y(d => y(d[1]))(l.steps.map((s, j) => [s, l.p[j]]))));
      svg.append("g").attr("transform", `translate(${width - m.r + 8},${m.t})`).selectAll("text").data(runs).join("text")
        .attr("y", (l, i) => 11 + i * 14).style("font-size", "11px").attr("fill", (l, i) => colour(i))
        .text(l => `λ ${l.lam}${l.closed ? " (closed)" : ""}`);
    }
    card.append("p").attr("class", "hint").text("P(gate closed) of the Hard Concrete gate over the fine-tuning steps, one line per λ.");
  }

  // ---------------------------------------------------------------- attention on sentences
  function decodeMatrix(text, rows, cols) {
    const bytes = atob(text), out = [];
    for (let r = 0; r < rows; r++) {
      const row = new Array(cols);
      for (let c = 0; c < cols; c++) row[c] = bytes.charCodeAt(r * cols + c) / 255;
      out.push(row);
    }
    return out;
  }
  const axesOf = kind => (DATA.axes || {})[kind];

  function drawExamples(card, h) {
    const examples = (DATA.examples || {})[h.key] || [];
    if (!examples.length) return;
    card.append("h3").text("Attention on sentences");
    const view = card.append("p").attr("class", "hint");
    view.append("span").text("Draw as ");
    const modes = ["matrix", "lines"];
    view.selectAll("label").data(modes).join("label").html(d =>
      `<input type="radio" name="view-${h.key}" value="${d}" ${d === (state.view || "matrix") ? "checked" : ""}> ${d} `)
      .on("change", (event, d) => { state.view = d; drawCard(h.key); });
    const [rowsAxis, colsAxis] = axesOf(h.type);
    for (const ex of examples) {
      const s = DATA.sentences[ex.s];
      const qTokens = rowsAxis === "src" ? s.src : s.tgt, kTokens = colsAxis === "src" ? s.src : s.tgt;
      const div = card.append("div").attr("class", "example").attr("data-why", ex.why);
      div.append("div").html(`<b>${ex.why === "chosen" ? "Chosen sentence" : "Shows its role"}</b>: ${s.label}`);
      if (ex.why !== "chosen") div.append("div").attr("class", "note").text(ex.note);
      const matrix = decodeMatrix(ex.m, ex.rows, ex.cols);
      ((state.view || "matrix") === "matrix" ? drawMatrix : drawLines)(div, matrix, qTokens, kTokens, ex.marks || {});
    }
  }

  function markedKeys(marks, nRows) {
    const cells = new Set(), tokens = new Set();
    if (marks.offset !== undefined) for (let q = 0; q < nRows; q++) cells.add(`${q},${q + marks.offset}`);
    for (const [q, t] of marks.arcs || []) cells.add(`${q},${t}`);
    for (const p of marks.rare || []) tokens.add(p);
    return {cells, tokens};
  }

  function drawMatrix(div, matrix, qTokens, kTokens, marks) {
    const size = Math.max(9, Math.min(18, Math.floor(420 / Math.max(qTokens.length, kTokens.length))));
    const m = {l: 90, t: 80}, width = m.l + kTokens.length * size + 10, height = m.t + qTokens.length * size + 10;
    const svg = div.append("svg").attr("width", width).attr("height", height).attr("class", "matrix");
    const x = d3.scaleBand().domain(d3.range(kTokens.length)).range([m.l, m.l + kTokens.length * size]);
    const y = d3.scaleBand().domain(d3.range(qTokens.length)).range([m.t, m.t + qTokens.length * size]);
    const colour = d3.scaleSequential(d3.interpolateBlues).domain([0, 1]);
    const {cells, tokens} = markedKeys(marks, qTokens.length);
    const data = [];
    matrix.forEach((row, q) => row.forEach((p, k) => data.push({q, k, p})));
    svg.append("g").selectAll("rect").data(data).join("rect").attr("x", d => x(d.k)).attr("y", d => y(d.q))
      .attr("width", x.bandwidth()).attr("height", y.bandwidth()).attr("fill", d => colour(d.p))
      .append("title").text(d => `${qTokens[d.q]} → ${kTokens[d.k]}: ${d.p.toFixed(2)}`);
    svg.append("g").selectAll("rect").data(data.filter(d => cells.has(`${d.q},${d.k}`))).join("rect")
      .attr("class", "mark").attr("x", d => x(d.k) + 1).attr("y", d => y(d.q) + 1)
      .attr("width", x.bandwidth() - 2).attr("height", y.bandwidth() - 2);
    svg.append("g").attr("class", "axis").attr("transform", `translate(${m.l},0)`)
      .call(d3.axisLeft(y).tickFormat(i => qTokens[i]).tickSize(0)).select(".domain").remove();
    svg.append("g").attr("class", "axis").attr("transform", `translate(0,${m.t})`)
      .call(d3.axisTop(x).tickFormat(i => kTokens[i]).tickSize(0))
      .call(g => g.select(".domain").remove())
      .selectAll("text").attr("transform", "rotate(-60)").style("text-anchor", "start")
      .attr("class", i => "token" + (tokens.has(i) ? " marked" : ""));
  }

  function drawLines(div, matrix, qTokens, kTokens, marks) {
    const step = 16, width = 420, left = 150, right = width - 150;
    const height = 20 + Math.max(qTokens.length, kTokens.length) * step;
    const svg = div.append("svg").attr("width", width).attr("height", height).attr("class", "lines");
    const yq = d3.scalePoint().domain(d3.range(qTokens.length)).range([14, 14 + (qTokens.length - 1) * step]);
    const yk = d3.scalePoint().domain(d3.range(kTokens.length)).range([14, 14 + (kTokens.length - 1) * step]);
    const {cells, tokens} = markedKeys(marks, qTokens.length);
    const links = [];
    matrix.forEach((row, q) => row.forEach((p, k) => { if (p >= 0.02) links.push({q, k, p}); }));
    svg.append("g").selectAll("line").data(links).join("line")
      .attr("x1", left + 4).attr("x2", right - 4).attr("y1", d => yq(d.q) - 4).attr("y2", d => yk(d.k) - 4)
      .attr("stroke", d => cells.has(`${d.q},${d.k}`) ? "#d62728" : "#1f77b4").attr("stroke-opacity", d => d.p)
      .attr("stroke-width", d => 0.5 + 2.5 * d.p);
    svg.append("g").selectAll("text").data(qTokens).join("text").attr("x", left).attr("y", (t, i) => yq(i))
      .attr("text-anchor", "end").attr("class", "token").text(t => t);
    svg.append("g").selectAll("text").data(kTokens).join("text").attr("x", right).attr("y", (t, i) => yk(i))
      .attr("class", (t, i) => "token" + (tokens.has(i) ? " marked" : "")).text(t => t);
  }

  // ---------------------------------------------------------------- start
  d3.select("#experiment").text(DATA.experiment);
  d3.select("#description").text(DATA.description + ` · ${heads.length} heads` +
    (DATA.sentences ? ` · attention stored on ${DATA.sentences.length} sentences` : ""));
  updatePruning();
  if (new URLSearchParams(location.search).has("head")) select(new URLSearchParams(location.search).get("head"));
  document.body.dataset.ready = "1";
  window.atlasReadyAt = performance.now();
})();
