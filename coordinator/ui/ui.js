/* ptcoord web UI: the logic of the read-only pages (jobs, one job, nodes), dispatched on
   <body data-page>. Plain ES2017, no modules or build step; Chart.js 3 is the global `Chart`.
   Data from the API reaches the page only through textContent and attributes, never as HTML. */
(function () {
  'use strict';

  const POLL_MS = 2000;
  const STATES = ['queued', 'running', 'restarting', 'succeeded', 'failed', 'cancelled', 'paused'];
  const ACTIVE = new Set(['queued', 'running', 'restarting']);
  const KIND_COLORS = {
    submitted: '#6b7280', attempt: '#2563eb', restart: '#ea580c', node_lost: '#dc2626',
    shrink: '#9333ea', grow: '#16a34a', pause: '#0891b2', preempt: '#c026d3', rollback: '#a16207',
    checkpoint: '#0d9488', hang: '#be123c', cancel: '#111827', other: '#9ca3af',
  };
  const RANK_HUES = [221, 0, 152, 32, 271, 190, 330, 84];
  const RANK_POINTS_MAX = 600;  // ptcoord keeps as many per rank
  const GROUP_DASHES = [[], [6, 3], [2, 2], [8, 3, 2, 3], [1, 4]];

  // ---------------------------------------------------------------- helpers

  function $(id) { return document.getElementById(id); }

  // el('td', {class: 'num'}, 'text', childNode): strings become text nodes.
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      const v = attrs[k];
      if (v == null || v === false) continue;
      if (k === 'class') e.className = v; else e.setAttribute(k, String(v));
    }
    for (const c of kids) {
      if (c == null || c === false || c === '') continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function isNum(v) { return typeof v === 'number' && isFinite(v); }
  function pad2(n) { return String(n).padStart(2, '0'); }

  function fmtNum(v, digits) {
    if (!isNum(v)) return '—';
    if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString('en-US');
    return String(Number(v.toPrecision(digits || 4)));
  }

  // What a job still on its way to an end shows beside its state: a
  // request to cancel or pause; nothing once it has ended.
  function ending(j, cancelling, pausing) {
    if (['succeeded', 'failed', 'cancelled'].includes(j.state)) return '';
    return j.cancel_requested ? cancelling : j.pause_requested ? pausing : '';
  }

  function fmtRate(v) {
    if (!isNum(v)) return '—';
    if (v >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (v >= 1e3) return (v / 1e3).toFixed(1) + 'k';
    return String(Number(v.toPrecision(3)));
  }

  function fmtDur(s) {
    if (!isNum(s) || s < 0) return '—';
    s = Math.round(s);
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + pad2(s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + pad2(Math.floor(s / 60) % 60) + 'm';
    return Math.floor(s / 86400) + 'd ' + Math.floor(s / 3600) % 24 + 'h';
  }

  function fmtTime(ms) {
    if (!ms) return '—';
    const d = new Date(ms);
    const hms = pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ':' + pad2(d.getSeconds());
    if (new Date().toDateString() === d.toDateString()) return hms;
    return d.getFullYear() + '-' + pad2(d.getMonth() + 1) + '-' + pad2(d.getDate()) + ' ' + hms;
  }

  function fmtBytes(b) {
    if (!isNum(b) || b <= 0) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(b < 10 ? 1 : 0) : b) + ' ' + units[i];
  }

  function badge(state) { return el('span', {class: 'badge s-' + state}, state); }

  function progressBar(done, total, fill) {
    const f = total > 0 ? Math.max(0, Math.min(1, done / total)) : 0;
    const bar = fill || el('div', {class: 'fill'});
    bar.style.width = (100 * f).toFixed(1) + '%';
    return bar;
  }

  function progressCell(done, total, label) {
    return el('div', {class: 'progress'}, el('div', {class: 'bar'}, progressBar(done, total)),
              el('span', {class: 'sub'}, label || done + ' / ' + total));
  }

  // ------------------------------------------------------- API and polling

  let lastOkMs = 0;

  function setNote(text, kind) {
    const n = $('note');
    if (!n) return;
    n.textContent = text || '';
    n.className = kind ? 'note is-' + kind : 'note';
    n.hidden = !text;
  }

  // GET a JSON route. A 401 leaves for /login; a failure throws an Error with .status
  // (0 when the server could not be reached) and sets nothing on the page.
  async function api(path) {
    let r;
    try {
      r = await fetch(path, {credentials: 'same-origin', headers: {Accept: 'application/json'}});
    } catch (e) {
      const err = new Error('offline');
      err.status = 0;
      throw err;
    }
    if (r.status === 401) {
      location.href = '/login';
      const err = new Error('signed out');
      err.status = 401;
      throw err;
    }
    let body = null;
    try { body = await r.json(); } catch (e) { /* an error page that is not JSON */ }
    if (!r.ok) {
      const err = new Error((body && body.error) || 'HTTP ' + r.status);
      err.status = r.status;
      throw err;
    }
    lastOkMs = Date.now();
    return body;
  }

  // Failures keep the data already on the page and only say so in the header.
  function report(err) {
    if (err.status === 401) return;
    if (err.status === 0 || err.status === 502 || err.status === 503 || err.status === 504) {
      setNote('offline' + (lastOkMs ? ' · data from ' + fmtTime(lastOkMs) : ''), 'offline');
    } else {
      setNote(err.message, 'error');
    }
  }

  // Runs fn now and POLL_MS after each finish (never two at once); skips while the tab is hidden.
  function poll(fn) {
    const tick = async () => {
      if (!document.hidden) {
        try {
          await fn();
          setNote('');
        } catch (e) {
          report(e);
        }
      }
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  // -------------------------------------------------------------- jobs page

  function jobsPage() {
    const wanted = () => {
      const s = decodeURIComponent(location.hash.slice(1));
      return STATES.includes(s) ? s : '';
    };
    const drawFilter = () => {
      const cur = wanted();
      $('filter').replaceChildren(...[''].concat(STATES).map(s =>
        el('a', {href: '#' + s, class: s === cur ? 'on' : null, 'data-state': s}, s || 'all')));
    };
    const load = async () => {
      const s = wanted();
      const data = await api('/api/v1/jobs' + (s ? '?state=' + s : ''));
      if (s === wanted()) drawJobs(data);  // a filter change while this was in flight wins
    };
    window.addEventListener('hashchange', () => { drawFilter(); load().catch(report); });
    drawFilter();
    poll(load);
  }

  function drawJobs(data) {
    const rows = data.jobs.slice().reverse().map(j => jobRow(j, data.now_ms));
    $('jobs').tBodies[0].replaceChildren(...rows);
    $('empty').hidden = rows.length > 0;
  }

  function jobRow(j, now) {
    const flag = ending(j, 'cancelling', 'pausing');
    const job = el('td', {class: 'job'},
                   el('a', {href: '/jobs/' + encodeURIComponent(j.id)}, j.name || j.id),
                   el('div', {class: 'sub mono'}, j.id));
    if (j.error) job.append(el('div', {class: 'sub err', title: j.error}, j.error));
    return el('tr', {'data-job': j.id, 'data-state': j.state},
      el('td', null, badge(j.state), flag && el('span', {class: 'flag'}, flag),
         j.waiting && el('div', {class: 'sub waiting', title: 'place ' + j.queue_position + ' in the queue'},
                         '#' + j.queue_position + ' ' + j.waiting)),
      job,
      el('td', {class: 'owner'}, j.owner || '—'),
      el('td', null, progressCell(j.step, j.steps)),
      el('td', {class: 'num'}, fmtNum(j.loss),
         isNum(j.val_loss) && el('div', {class: 'sub'}, 'val ' + fmtNum(j.val_loss))),
      el('td', {class: 'num'}, fmtRate(j.tok_per_s)),
      el('td', {class: 'num'}, fmtDur(j.eta_s)),
      el('td', {class: 'num'}, String(j.attempts)),
      el('td', {class: 'num', title: fmtTime(j.created_ms)},
         j.created_ms ? fmtDur((now - j.created_ms) / 1000) : '—'));
  }

  // ------------------------------------------------------------- nodes page

  function nodesPage() {
    poll(async () => drawNodes(await api('/api/v1/nodes')));
  }

  function drawNodes(d) {
    const now = d.now_ms;
    const rows = d.nodes.map(n => el('tr', {'data-node': n.name, 'data-state': n.state,
                                            'data-draining': n.draining ? '1' : null},
      el('td', null, el('strong', null, n.name), el('div', {class: 'sub mono'}, n.address)),
      el('td', null, badge(n.state === 'up' && n.draining ? 'draining' : n.state)),
      el('td', null, progressCell(n.slots_used, n.slots)),
      el('td', {class: 'num'}, String(n.gpus)),
      el('td', {class: 'num'}, String(n.cores)),
      el('td', {class: 'num'}, fmtBytes(n.memory_bytes)),
      el('td', {class: 'num'}, isNum(n.load1) ? n.load1.toFixed(2) : '—'),
      el('td', {class: 'num'}, String(n.processes)),
      el('td', {class: 'num', title: fmtTime(n.last_heartbeat_ms)},
         n.last_heartbeat_ms ? fmtDur((now - n.last_heartbeat_ms) / 1000) + ' ago' : '—'),
      el('td', {class: 'sub mono'}, n.version)));
    if (!rows.length) {
      const dash = () => el('td', {class: 'num'}, '—');
      const h = d.local || {};
      rows.push(el('tr', {'data-node': 'local', 'data-state': 'up', class: 'local'},
        el('td', null, el('strong', null, 'local host'),
           el('div', {class: 'sub'}, 'no nodes registered: ptcoord launches here')),
        el('td', null, badge('up')),
        el('td', null, progressCell(d.local_slots_used || 0, d.local_slots || 0)),
        el('td', {class: 'num'}, isNum(h.gpus) && h.gpus >= 0 ? String(h.gpus) : '—'),
        el('td', {class: 'num'}, isNum(h.cores) ? String(h.cores) : '—'),
        el('td', {class: 'num'}, h.memory_bytes ? fmtBytes(h.memory_bytes) : '—'),
        el('td', {class: 'num'}, isNum(h.load1) ? h.load1.toFixed(2) : '—'),
        dash(), dash(), el('td')));
    }
    $('nodes').tBodies[0].replaceChildren(...rows);
  }

  // --------------------------------------------------------------- charts

  function rankColor(r, a) {
    const hue = RANK_HUES[r % RANK_HUES.length] + 13 * Math.floor(r / RANK_HUES.length);
    return 'hsla(' + hue + ', 70%, 45%, ' + (a == null ? 1 : a) + ')';
  }

  // Vertical lines at chart.$eventLines = [{x, color, text}]; hovering one shows its text
  // as the canvas tooltip.
  const eventLinesPlugin = {
    id: 'eventLines',
    afterDatasetsDraw(chart) {
      const area = chart.chartArea, xs = chart.scales.x, ctx = chart.ctx;
      ctx.save();
      ctx.lineWidth = 1.5;
      ctx.setLineDash([5, 3]);
      for (const l of chart.$eventLines || []) {
        const px = xs.getPixelForValue(l.x);
        if (!(px >= area.left - 1 && px <= area.right + 1)) continue;
        ctx.strokeStyle = l.color;
        ctx.beginPath();
        ctx.moveTo(px, area.top);
        ctx.lineTo(px, area.bottom);
        ctx.stroke();
      }
      ctx.restore();
    },
    afterEvent(chart, args) {
      const e = args.event;
      if (e.type !== 'mousemove' && e.type !== 'mouseout') return;
      const near = e.type === 'mousemove' ? (chart.$eventLines || []).filter(
        l => Math.abs(chart.scales.x.getPixelForValue(l.x) - e.x) <= 4) : [];
      chart.canvas.title = near.map(l => 'step ' + l.x + ': ' + l.text).join('\n');
    },
  };

  function lineChart(id, scales, datasets, plugins) {
    return new Chart($(id), {
      type: 'line',
      data: {datasets: datasets},
      plugins: plugins || [],
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        parsing: false,
        interaction: {mode: 'nearest', axis: 'x', intersect: false},
        elements: {point: {radius: 0, hitRadius: 4}, line: {borderWidth: 1.5}},
        plugins: {
          legend: {labels: {boxWidth: 14, boxHeight: 2, filter: (item, d) =>
            d.datasets[item.datasetIndex].data.length > 0}},
        },
        scales: scales,
      },
    });
  }

  function series(label, color, extra) {
    return Object.assign({label: label, data: [], borderColor: color, backgroundColor: color}, extra);
  }

  function axis(title, extra) {
    return Object.assign({type: 'linear', title: {display: true, text: title}}, extra);
  }

  function makeJobCharts() {
    const stepAxis = () => axis('step', {ticks: {precision: 0, includeBounds: false}});
    const timeAxis = () => axis('seconds since the first rank point', {ticks: {includeBounds: false}});
    return {
      loss: lineChart('chart-loss', {x: stepAxis(), y: axis('loss')}, [
        series('train', '#2563eb'),
        series('train (smoothed)', '#2563eb', {borderWidth: 2}),
        series('val', '#dc2626', {borderWidth: 2, pointRadius: 2.5}),
      ], [eventLinesPlugin]),
      speed: lineChart('chart-speed', {
        x: stepAxis(),
        y: axis('tok/s', {ticks: {callback: v => fmtRate(v)}}),
        y1: axis('MFU %', {position: 'right', grid: {drawOnChartArea: false}}),
      }, [series('tok/s', '#2563eb'), series('MFU %', '#ea580c', {yAxisID: 'y1'})]),
      lr: lineChart('chart-lr', {x: stepAxis(), y: axis('lr', {ticks: {callback: v => v.toExponential(1)}})},
                    [series('learning rate', '#059669')]),
      rankStep: lineChart('chart-rank-step', {x: timeAxis(), y: axis('step ms')}, []),
      rankComm: lineChart('chart-rank-comm', {x: timeAxis(), y: axis('comm ms')}, []),
    };
  }

  // Redraws with the x axis spanning exactly the data (Chart.js would round it up to a tick).
  function render(chart) {
    let lo = Infinity, hi = -Infinity;
    for (const d of chart.data.datasets) {
      if (!d.data.length) continue;
      lo = Math.min(lo, d.data[0].x);
      hi = Math.max(hi, d.data[d.data.length - 1].x);
    }
    const x = chart.options.scales.x;
    x.min = lo < hi ? lo : undefined;
    x.max = lo < hi ? hi : undefined;
    chart.update('none');
  }

  // Exponential moving average of the y values, started at the first one.
  function ema(points, a) {
    let s = null;
    return points.map(p => {
      s = s == null ? p.y : a * s + (1 - a) * p.y;
      return {x: p.x, y: s};
    });
  }

  // --------------------------------------------------------------- job page

  function jobPage() {
    const id = decodeURIComponent(location.pathname.split('/')[2] || '');
    const base = '/api/v1/jobs/' + encodeURIComponent(id);
    const S = {
      since: null, rankSince: null, rankAttempt: null, t0: null, world: 0, ranks: new Map(),
      train: [], val: [], valBy: new Map(), tok: [], mfu: [], lr: [], timeline: [], events: [],
      job: null, listKey: '', logKey: '',
    };
    $('job-name').textContent = id;  // until the first answer, or for good if there is none
    const charts = makeJobCharts();
    const redrawLoss = () => {
      $('smoothing-value').textContent = Number($('smoothing').value).toFixed(2);
      drawLoss(S, charts.loss);
    };
    $('smoothing').addEventListener('input', redrawLoss);
    $('log-scale').addEventListener('change', redrawLoss);
    const reloadLog = () => loadLog(S, base, true);
    $('log-attempt').addEventListener('change', reloadLog);
    $('log-stream').addEventListener('change', reloadLog);

    poll(async () => {
      let q = base + '/metrics';
      const cursors = [];
      if (S.since != null) cursors.push('since=' + S.since);
      if (S.rankSince != null) cursors.push('rank_since=' + S.rankSince);
      if (cursors.length) q += '?' + cursors.join('&');
      const [detail, metrics] = await Promise.all([api(base), api(q)]);
      appendMetrics(S, metrics);
      drawHeader(S, detail);
      drawLists(S, detail);
      drawLoss(S, charts.loss);
      drawSpeed(S, charts);
      drawRanks(S, charts);
      document.body.dataset.ranks = String(charts.rankStep.data.datasets.length);
      document.body.dataset.loaded = '1';
      loadLog(S, base, false);
    });
  }

  // Appends one metrics answer to the page's series. A step at or below the last one (a
  // rollback to a checkpoint) replaces the tail, so each line stays a function of step.
  function appendMetrics(S, m) {
    if (S.since != null && m.next_since < S.since) {  // ptcoord's history restarted: start over
      Object.assign(S, {since: null, rankSince: null, rankAttempt: null, ranks: new Map(),
                        train: [], val: [], valBy: new Map(), tok: [], mfu: [], lr: [], timeline: []});
      return;
    }
    const push = (arr, x, y) => {
      if (!isNum(y)) return;
      while (arr.length && arr[arr.length - 1].x >= x) arr.pop();
      arr.push({x: x, y: y});
    };
    for (const p of m.points || []) {
      S.timeline.push({t: p.unix_ms, step: p.step});
      push(S.train, p.step, p.loss);
      push(S.val, p.step, p.val_loss);
      for (const [name, loss] of Object.entries(p.val_loss_by_source || {})) {  // a blend's sources
        if (!S.valBy.has(name)) S.valBy.set(name, []);
        push(S.valBy.get(name), p.step, loss);
      }
      push(S.tok, p.step, p.tok_per_s);
      push(S.mfu, p.step, isNum(p.mfu) ? 100 * p.mfu : null);
      push(S.lr, p.step, p.lr);
    }
    S.since = m.next_since;
    S.rankSince = m.next_rank_since;
    appendRanks(S, m.ranks);
  }

  function appendRanks(S, R) {
    if (!R) return;
    if (R.attempt !== S.rankAttempt) {  // a new attempt's ranks start from an empty chart
      S.ranks = new Map();
      S.t0 = null;
      S.rankAttempt = R.attempt;
    }
    S.world = R.world_size;
    const pts = R.points || [];
    if (S.t0 == null && pts.length) S.t0 = pts.reduce((a, p) => Math.min(a, p.unix_ms), Infinity);
    for (const p of pts) {
      const comm = p.comm_ms || {};
      let total = 0;
      for (const g in comm) total += comm[g];
      let s = S.ranks.get(p.rank);
      if (!s) S.ranks.set(p.rank, s = []);
      s.push({x: (p.unix_ms - S.t0) / 1000, stepMs: p.step_ms, compute: p.step_ms - total,
              comm: comm, total: total});
      if (s.length > RANK_POINTS_MAX) s.shift();
    }
  }

  // The step of the first metrics point at or after t (the last step for later events).
  function stepAt(S, t) {
    const tl = S.timeline;
    if (!tl.length) return null;
    let lo = 0, hi = tl.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (tl[mid].t < t) lo = mid + 1; else hi = mid;
    }
    return tl[Math.min(lo, tl.length - 1)].step;
  }

  function drawHeader(S, d) {
    const j = d.job;
    S.job = j;
    document.title = (j.name || j.id) + ' · ptcoord';
    $('job-name').textContent = j.name || j.id;
    $('job-id').textContent = j.id;
    $('job-state').textContent = j.state;
    $('job-state').className = 'badge s-' + j.state;
    const flag = ending(j, 'cancel requested', 'pause requested');
    $('job-flags').textContent = flag;
    $('job-flags').hidden = !flag;
    progressBar(j.step, j.steps, $('job-bar'));
    $('job-step').textContent = 'step ' + j.step + ' / ' + j.steps;
    const now = d.now_ms;
    const run = j.started_ms ? ((j.finished_ms || now) - j.started_ms) / 1000 : null;
    const placement = (j.placement || []).map(p => p.node + ': ' + p.ranks + (p.ranks === 1 ? ' rank' : ' ranks') +
      (p.gpus && p.gpus.length ? ' (GPU ' + p.gpus.join(', ') + ')' : '')).join('; ');
    const stats = [
      ['attempts', String(j.attempts)], ['ETA', fmtDur(j.eta_s)], ['loss', fmtNum(j.loss)],
      ['val loss', fmtNum(j.val_loss)], ['tok/s', fmtRate(j.tok_per_s)],
      ['MFU', isNum(j.mfu) ? (100 * j.mfu).toFixed(1) + ' %' : '—'], ['lr', fmtNum(j.lr, 3)],
      ['owner', j.owner || '—'], ['world size', String(j.world_size)], ['run time', fmtDur(run)],
      ['submitted', fmtTime(j.created_ms)], ['placement', placement || '—'],
    ];
    $('job-stats').replaceChildren(...stats.map(s => el('div', null, el('dt', null, s[0]), el('dd', null, s[1]))));
    $('job-error').textContent = j.error || '';
    $('job-error').hidden = !j.error;
    syncAttempts(d.attempts || []);
  }

  // The log's attempt selector: "latest" and one option per attempt, keeping the choice.
  function syncAttempts(attempts) {
    const sel = $('log-attempt');
    const key = attempts.map(a => a.number + a.end).join(',');
    if (sel.dataset.key === key) return;
    const keep = sel.value;
    sel.replaceChildren(el('option', {value: '0'}, 'latest'),
      ...attempts.map(a => el('option', {value: String(a.number)}, a.number + ' · ' + a.end)));
    sel.value = keep;
    if (sel.selectedIndex < 0) sel.value = '0';
    sel.dataset.key = key;
  }

  function drawLists(S, d) {
    const evs = d.events || [], cps = d.checkpoints || [];
    const last = S.timeline.length ? S.timeline[S.timeline.length - 1].step : '';
    const key = [evs.length, evs.length && evs[evs.length - 1].unix_ms, cps.length, last].join('|');
    S.events = evs;
    drawSample(d.sample);
    drawExperts(d.experts);
    if (key === S.listKey) return;
    S.listKey = key;
    $('events').replaceChildren(...evs.slice().reverse().map(e => {
      const step = stepAt(S, e.unix_ms);
      const dot = el('span', {class: 'dot'});
      dot.style.background = KIND_COLORS[e.kind] || KIND_COLORS.other;
      return el('li', {'data-kind': e.kind}, dot, el('time', null, fmtTime(e.unix_ms)),
                el('span', {class: 'sub'}, step == null ? '' : 'step ' + step),
                el('span', {class: 'msg'}, e.message));
    }));
    if (!evs.length) $('events').append(el('li', {class: 'none'}, 'No events.'));
    $('checkpoints').replaceChildren(...cps.slice().reverse().map(c =>
      el('li', null, el('strong', null, 'step ' + c.step), el('span', {class: 'sub'}, 'attempt ' + c.attempt),
         el('time', null, fmtTime(c.unix_ms)), el('span', {class: 'mono path', title: c.dir}, c.dir))));
    if (!cps.length) $('checkpoints').append(el('li', {class: 'none'}, 'No checkpoints yet.'));
  }

  function drawSample(s) {
    $('sample').textContent = s ? s.text : '';
    $('sample-info').textContent = s ? 'step ' + s.step + ' · attempt ' + s.attempt : 'none yet';
  }

  // A Mixture-of-Experts job's newest expert load: one row per MoE layer, one cell per expert
  // (its share of the layer's tokens, shaded by its load over the mean), the imbalance and the
  // choices dropped.
  function drawExperts(x) {
    const panel = $('experts-panel');
    panel.hidden = !x || !x.layers || !x.layers.length;
    if (panel.hidden) return;
    const E = Math.max(...x.layers.map(l => l.tokens.length));
    $('experts-info').textContent = 'step ' + x.step + ' · attempt ' + x.attempt;
    const head = el('tr', null, el('th', null, 'layer'),
      ...Array.from({length: E}, (_, e) => el('th', null, String(e))),
      el('th', null, 'imbalance'), el('th', null, 'dropped'));
    const rows = x.layers.map(l => {
      const total = l.tokens.reduce((a, t) => a + t, 0);
      const mean = total / Math.max(1, l.tokens.length);
      const cells = l.tokens.map((t, e) => {
        const cell = el('td', {title: 'expert ' + e + ': ' + t + ' tokens'},
                        total > 0 ? (100 * t / total).toFixed(1) + '%' : '—');
        const over = mean > 0 ? Math.min(1, t / mean / 3) : 0;
        cell.style.background = 'rgba(37, 99, 235, ' + over.toFixed(3) + ')';
        if (over > 0.6) cell.style.color = '#fff';
        return cell;
      });
      return el('tr', {'data-layer': String(l.layer)}, el('th', null, String(l.layer)), ...cells,
                el('td', null, fmtNum(l.imbalance, 2)), el('td', null, String(l.dropped)));
    });
    $('experts').replaceChildren(el('thead', null, head), el('tbody', null, ...rows));
  }

  function drawLoss(S, chart) {
    const a = Number($('smoothing').value);
    const d = chart.data.datasets;
    d[0].data = S.train.slice();
    d[0].borderColor = a > 0 ? 'rgba(37, 99, 235, 0.25)' : '#2563eb';
    d[0].borderWidth = a > 0 ? 1 : 1.5;
    d[1].data = a > 0 ? ema(S.train, a) : [];
    d[2].data = S.val.slice();
    // After them, one dashed series per blend source, in name order.
    const sources = Array.from(S.valBy.keys()).sort();
    d.length = 3 + sources.length;
    sources.forEach((name, i) => {
      if (!d[3 + i] || d[3 + i].label !== 'val ' + name) {
        d[3 + i] = series('val ' + name, rankColor(i), {borderWidth: 1.5, borderDash: [5, 3], pointRadius: 2});
      }
      d[3 + i].data = S.valBy.get(name).slice();
    });
    document.body.dataset.valSources = sources.join(',');
    chart.options.scales.y.type = $('log-scale').checked ? 'logarithmic' : 'linear';
    chart.$eventLines = S.timeline.length ? S.events.map(e => ({
      x: stepAt(S, e.unix_ms), color: KIND_COLORS[e.kind] || KIND_COLORS.other, text: e.message,
    })) : [];
    render(chart);
  }

  function drawSpeed(S, charts) {
    charts.speed.data.datasets[0].data = S.tok.slice();
    charts.speed.data.datasets[1].data = S.mfu.slice();
    render(charts.speed);
    charts.lr.data.datasets[0].data = S.lr.slice();
    render(charts.lr);
  }

  // The rank with the highest recent compute time (step_ms less its communication): the one
  // the others wait for in a synchronous job.
  function slowestRank(S) {
    let best = null, worst = -Infinity;
    for (const [r, pts] of S.ranks) {
      const tail = pts.slice(-10);
      const mean = tail.reduce((a, p) => a + p.compute, 0) / tail.length;
      if (mean > worst) { worst = mean; best = r; }
    }
    return {rank: best, ms: worst};
  }

  function drawRanks(S, charts) {
    const ranks = Array.from(S.ranks.keys()).sort((a, b) => a - b);
    const slow = ranks.length > 1 ? slowestRank(S) : {rank: null};
    const many = ranks.length > 8;
    // A series of a few points shows them (one point draws no line).
    const dots = r => (S.ranks.get(r).length < 20 ? 2.5 : 0);
    charts.rankStep.data.datasets = ranks.map(r => {
      const hot = r === slow.rank;
      return series('rank ' + r + (hot ? ' (slowest)' : ''), rankColor(r, many && !hot ? 0.45 : 1), {
        data: S.ranks.get(r).map(p => ({x: p.x, y: p.stepMs})),
        borderWidth: hot ? 3 : 1.25, order: hot ? 0 : 1, pointRadius: dots(r),
      });
    });
    charts.rankStep.options.plugins.legend.display = !many;
    render(charts.rankStep);

    const groups = new Set();
    for (const pts of S.ranks.values()) for (const p of pts) for (const g in p.comm) groups.add(g);
    const gs = Array.from(groups).sort();
    const byGroup = gs.length > 1 && ranks.length * gs.length <= 12;
    charts.rankComm.data.datasets = byGroup
      ? [].concat(...ranks.map(r => gs.map((g, i) => series('rank ' + r + ' ' + g, rankColor(r), {
          data: S.ranks.get(r).map(p => ({x: p.x, y: p.comm[g] || 0})), borderDash: GROUP_DASHES[i % 5],
          pointRadius: dots(r),
        }))))
      : ranks.map(r => series('rank ' + r + (gs.length === 1 ? ' ' + gs[0] : ''), rankColor(r, many ? 0.6 : 1), {
          data: S.ranks.get(r).map(p => ({x: p.x, y: p.total})), pointRadius: dots(r),
        }));
    charts.rankComm.options.plugins.legend.display = charts.rankComm.data.datasets.length <= 12;
    render(charts.rankComm);

    $('rank-info').textContent = !ranks.length ? 'no rank reports yet'
      : 'attempt ' + S.rankAttempt + ' · ' + ranks.length + ' of ' + S.world + ' ranks' +
        (slow.rank != null ? ' · slowest: rank ' + slow.rank + ' (' + slow.ms.toFixed(1) + ' ms compute)' : '');
  }

  // Fetches the log tail when the choice changed (force) or while the job may still write.
  async function loadLog(S, base, force) {
    const attempt = $('log-attempt').value, stream = $('log-stream').value;
    const key = [attempt, stream, S.job ? S.job.state : '', S.job ? S.job.attempts : ''].join('|');
    if (!force && key === S.logKey && S.job && !ACTIVE.has(S.job.state)) return;
    S.logKey = key;
    const pre = $('log');
    try {
      const r = await api(base + '/log?attempt=' + attempt + '&stream=' + stream);
      if ($('log-attempt').value !== attempt || $('log-stream').value !== stream) return;
      const atEnd = force || pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
      if (pre.textContent !== r.text) pre.textContent = r.text;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
      const shown = new TextEncoder().encode(r.text).length;
      $('log-info').textContent = 'attempt ' + r.attempt + ' · ' + r.stream + ' · ' + (r.omitted ? r.omitted
        : !r.size ? 'empty' : (r.size > shown ? 'last ' + fmtBytes(shown) + ' of ' : '') + fmtBytes(r.size));
    } catch (e) {
      S.logKey = '';
      if (e.status !== 401) $('log-info').textContent = 'log: ' + e.message;
    }
  }

  // ---------------------------------------------------------------- dispatch

  const pages = {jobs: jobsPage, job: jobPage, nodes: nodesPage};
  window.ptrainUi = {jobsPage: jobsPage, jobPage: jobPage, nodesPage: nodesPage};
  const start = () => {
    const page = pages[document.body.dataset.page];
    if (page) page();
  };
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
