// gpuhost panel: progressive enhancement only. Every page works without
// this script; with it, the Switch button shows live progress from the
// daemon's event stream (/api/events), the dashboard follows changes,
// the logs page tails the backend's journal, the Bench page follows a
// run until its result is in the table, the Activity page shows requests
// as they finish, and the header pill and dashboard gauges stay current.
(() => {
  'use strict';

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  const csrf = ($('meta[name="csrf-token"]') || {}).content || '';

  // The same words as stepLabels in views.go.
  const labels = {
    drain: ['draining requests in flight', 'requests drained'],
    stop: ['stopping', 'stopped'],
    vram_release: ['waiting for VRAM release', 'VRAM released'],
    configure: ['configuring', 'configured'],
    start: ['starting', 'started'],
    ready: ['waiting until ready', 'ready'],
    load_model: ['loading model', 'model loaded'],
    verify: ['verifying', 'verified'],
  };

  const fmtDur = (ms) => {
    if (!(ms > 0)) return '';
    if (ms < 1) return '<1 ms';
    if (ms < 1000) return Math.round(ms) + ' ms';
    if (ms < 120000) return (ms / 1000).toFixed(1) + ' s';
    return (ms / 60000).toFixed(1) + ' min';
  };
  const gib = (mib) => (mib / 1024).toFixed(1);
  const num = (v) => (typeof v === 'number' && isFinite(v) && v >= 0 ? v : null);

  function stepLabel(step, status, detail, beforeMiB) {
    let base = step, prefix = '';
    if (step.startsWith('rollback.')) { base = step.slice(9); prefix = 'rollback: '; }
    const words = labels[base] || [base, base + ' done'];
    if (status === 'started') return prefix + words[0];
    if (status === 'failed') return prefix + words[0] + ' failed';
    let label = words[1];
    const d = detail || {};
    const used = num(d.used_mib);
    if (base === 'vram_release' && used !== null) {
      label = beforeMiB >= 0 ? `VRAM released ${gib(beforeMiB)} → ${gib(used)} GiB` : `VRAM released → ${gib(used)} GiB`;
    } else if (base === 'drain' && num(d.drained) !== null && num(d.cut) !== null) {
      label = `requests drained: ${d.drained} finished, ${d.cut} cut`;
    } else if (base === 'verify' && used !== null && num(d.total_mib) !== null) {
      label = `verified · ${gib(used)}/${gib(d.total_mib)} GiB used`;
    }
    return prefix + label;
  }

  function showNotice(message, extra) {
    const n = $('#notice');
    if (!n) return;
    n.replaceChildren();
    n.className = 'notice notice-error';
    const p = document.createElement('p');
    p.textContent = message;
    n.append(p);
    if (extra) n.append(extra);
    n.hidden = false;
  }

  function setBusy(busy) {
    $$('form.switch-form button').forEach((b) => { b.disabled = busy; });
  }

  // pollLive asks /live once now (set by initLive): after a switch on a
  // box of several lanes the pill names every lane, which only the server
  // knows.
  let pollLive = null;

  const gpuList = (key) => (key || '0').split(',');

  // markActive marks profile active after its switch. On a box of one
  // lane it is the only active profile. On a box of several lanes (GPU
  // sets serving at once) the switch stopped only the profiles of the
  // lanes sharing a GPU with its own: the others keep their mark.
  function markActive(profile) {
    const rows = $$('tr[data-profile]');
    const row = rows.find((tr) => tr.dataset.profile === profile);
    const table = $('table.profiles');
    const lanes = !!(table && table.dataset.lanes === 'true');
    const mine = gpuList(row && row.dataset.laneGpus);
    rows.forEach((tr) => {
      const shares = !lanes || gpuList(tr.dataset.laneGpus).some((g) => mine.includes(g));
      if (tr === row) tr.classList.add('active');
      else if (shares) tr.classList.remove('active');
    });
    const pill = $('#phase');
    if (lanes) {
      if (pollLive) pollLive();
    } else if (pill) {
      const backend = row ? row.dataset.backend || '' : '';
      pill.textContent = backend ? `${profile} · ${backend}` : profile;
      pill.className = 'pill phase-active';
    }
  }

  function stepItem(box, step) {
    let li = $$('li[data-step]', box).find((el) => el.dataset.step === step);
    if (!li) {
      li = document.createElement('li');
      li.dataset.step = step;
      const label = document.createElement('span');
      label.className = 'label';
      const dur = document.createElement('span');
      dur.className = 'dur';
      li.append(label, ' ', dur);
      $('.steps', box).append(li);
    }
    return li;
  }

  function apply(box, e, beforeMiB) {
    if (e.kind === 'step') {
      const li = stepItem(box, e.step);
      const status = e.status === 'started' ? 'running' : e.status === 'failed' ? 'failed' : 'done';
      li.className = 'step step-' + status;
      li.title = e.message || '';
      $('.label', li).textContent = stepLabel(e.step, e.status, e.detail, beforeMiB);
      $('.dur', li).textContent = fmtDur(e.duration_ms);
      if (e.status === 'failed' && e.journal && e.journal.length) {
        const det = document.createElement('details');
        const sum = document.createElement('summary');
        sum.textContent = 'Journal of the failed unit';
        const pre = document.createElement('pre');
        pre.textContent = e.journal.join('\n');
        det.append(sum, pre);
        box.append(det);
      }
    } else if (e.kind === 'switch') {
      if (e.status === 'info') {
        const li = document.createElement('li');
        li.className = 'step step-info';
        li.dataset.step = 'info';
        const label = document.createElement('span');
        label.className = 'label';
        label.textContent = e.message || '';
        li.append(label);
        $('.steps', box).append(li);
      } else if (e.status === 'done') {
        const d = fmtDur(e.duration_ms);
        $('.result', box).textContent = `${e.profile} is active` + (d ? ` (total ${d})` : '');
        box.classList.add('outcome-done');
      } else if (e.status === 'failed') {
        $('.result', box).textContent = e.message || 'switch failed';
        box.classList.add('outcome-failed');
      }
    }
  }

  // follow streams one switch's events into the progress box until it ends.
  function follow(box, id, since, beforeMiB) {
    box.dataset.running = 'true';
    setBusy(true);
    const es = new EventSource('/api/events?since=' + encodeURIComponent(since));
    let finished = false;
    const onEvent = (ev) => {
      let e;
      try { e = JSON.parse(ev.data); } catch (_) { return; }
      if (!e || e.switch_id !== id) return;
      if (box.dataset.switchId !== id) {
        // The box follows another switch now (one started after this
        // one, possibly on another lane): this stream is done with it.
        es.close();
        return;
      }
      box.dataset.since = String(e.seq);
      apply(box, e, beforeMiB);
      if (e.kind === 'switch' && (e.status === 'done' || e.status === 'failed')) {
        finished = true;
        es.close();
        box.dataset.running = 'false';
        setBusy(false);
        if (e.status === 'done') {
          markActive(e.profile);
        } else {
          // A failed switch may have rolled back: show the true state.
          setTimeout(() => { location.assign('/profiles?switch=' + encodeURIComponent(id)); }, 2500);
        }
      }
    };
    es.addEventListener('step', onEvent);
    es.addEventListener('switch', onEvent);
    es.onerror = () => {
      // EventSource reconnects by itself (with Last-Event-ID); when it
      // gives up, the server-rendered page carries on without it.
      if (!finished && es.readyState === EventSource.CLOSED) {
        location.assign('/profiles?switch=' + encodeURIComponent(id));
      }
    };
  }

  function startBox(profile, id, since, beforeMiB) {
    const box = $('#progress');
    $('.target', box).textContent = profile;
    $('.steps', box).replaceChildren();
    $('.result', box).textContent = '';
    $$('details', box).forEach((d) => d.remove());
    box.classList.remove('outcome-done', 'outcome-failed', 'outcome-unknown', 'outcome-');
    box.dataset.switchId = id;
    box.dataset.beforeMib = String(beforeMiB);
    box.hidden = false;
    return box;
  }

  // postForm sends a panel form as the script does (JSON answer, CSRF
  // header) and returns the response with its decoded body.
  async function postForm(form) {
    const res = await fetch(form.action, {
      method: 'POST',
      body: new URLSearchParams(new FormData(form)),
      headers: { 'Accept': 'application/json', 'X-CSRF-Token': csrf },
      credentials: 'same-origin',
    });
    return { res, data: await res.json() };
  }

  async function onSwitch(ev) {
    ev.preventDefault();
    const form = ev.currentTarget;
    const n = $('#notice');
    if (n) n.hidden = true;
    setBusy(true);
    let res, data;
    try {
      ({ res, data } = await postForm(form));
    } catch (err) {
      setBusy(false);
      showNotice('The switch request failed: ' + err);
      return;
    }
    if (res.status !== 202) {
      setBusy(false);
      let extra = null;
      const force = data.extra && data.extra.force_profile;
      if (force) {
        extra = document.createElement('div');
        const ul = document.createElement('ul');
        (data.extra.checks || []).forEach((c) => {
          const li = document.createElement('li');
          li.textContent = c;
          ul.append(li);
        });
        const btn = document.createElement('button');
        btn.className = 'danger';
        btn.type = 'button';
        btn.textContent = `Switch to ${force} anyway`;
        btn.addEventListener('click', () => {
          const f = $$('form.switch-form').find((x) => x.elements.profile && x.elements.profile.value === force);
          if (!f) return;
          let inp = f.elements.force;
          if (!inp) {
            inp = document.createElement('input');
            inp.type = 'hidden';
            inp.name = 'force';
            f.append(inp);
          }
          inp.value = '1';
          f.requestSubmit();
        });
        extra.append(ul, btn);
      }
      showNotice(data.detail || data.error || ('HTTP ' + res.status), extra);
      return;
    }
    history.replaceState(null, '', data.location);
    const box = startBox(data.profile, data.switch_id, data.since, data.before_mib);
    follow(box, data.switch_id, data.since, data.before_mib);
  }

  function initProfiles() {
    $$('form.switch-form').forEach((f) => f.addEventListener('submit', onSwitch));
    const box = $('#progress');
    if (box && box.dataset.running === 'true') {
      follow(box, box.dataset.switchId, box.dataset.since, Number(box.dataset.beforeMib));
    }
  }

  // The dashboard reloads itself when the backend state changes.
  function initDashboard() {
    const es = new EventSource('/api/events');
    let timer = null;
    const soon = () => {
      if (timer) return;
      timer = setTimeout(() => { es.close(); location.reload(); }, 400);
    };
    es.addEventListener('state', soon);
    es.addEventListener('switch', soon);
  }

  // The logs page polls /logs/tail every 2 s and appends the new lines
  // (as text: journal lines are outside input), keeping the view at the
  // bottom when it was there.
  function initLogs() {
    const pre = $('#tail');
    if (!pre || pre.dataset.off === 'true') return;
    const status = $('#tail-status');
    const unit = pre.dataset.unit || '';
    let busy = false;
    const poll = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const q = new URLSearchParams({ unit, after: pre.dataset.cursor || '' });
        const res = await fetch('/logs/tail?' + q, { headers: { 'Accept': 'application/json' }, credentials: 'same-origin' });
        const data = await res.json();
        if (!res.ok) throw new Error(data.detail || data.error || ('HTTP ' + res.status));
        if (data.error) throw new Error(data.error);
        const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        const text = data.lines.map((l) => l + '\n').join('');
        if (data.reset) pre.textContent = text;
        else if (text) pre.append(text);
        pre.dataset.cursor = data.cursor || '';
        if (atEnd) pre.scrollTop = pre.scrollHeight;
        if (status) status.textContent = 'live · updated ' + new Date().toLocaleTimeString();
      } catch (err) {
        if (status) status.textContent = 'live tail paused: ' + err.message;
      } finally {
        busy = false;
      }
    };
    pre.scrollTop = pre.scrollHeight;
    setInterval(poll, 2000);
  }

  // The Bench page follows a run's "bench <id>: …" progress lines (Kind
  // "bench" on /api/events, written by bench.Service) and, when the run
  // has finished, swaps in the results table from a fresh GET /bench.
  async function refreshBenchResults() {
    const res = await fetch('/bench', { headers: { 'Accept': 'text/html' }, credentials: 'same-origin' });
    if (!res.ok) throw new Error('HTTP ' + res.status);
    const doc = new DOMParser().parseFromString(await res.text(), 'text/html');
    const fresh = doc.getElementById('bench-results');
    const cur = $('#bench-results');
    if (!fresh || !cur) throw new Error('no results in the answer');
    const img = $('img.chart', fresh);
    if (img) img.src = '/api/bench/chart.svg?t=' + Date.now(); // a new figure, not the cached one
    cur.replaceWith(document.adoptNode(fresh));
  }

  // benchStream is the Bench page's one reader of /api/events: the run it
  // follows and the results stored by others come from the same stream (a
  // second EventSource held a second of the browser's few connections per
  // host). It keeps the last bench events, so a run whose first lines came
  // before its POST answered still shows them.
  function benchStream(since) {
    const handlers = new Set();
    const recent = [];
    const es = new EventSource('/api/events?since=' + encodeURIComponent(since || '0'));
    es.addEventListener('bench', (ev) => {
      let e;
      try { e = JSON.parse(ev.data); } catch (_) { return; }
      if (!e || typeof e.message !== 'string') return;
      recent.push(e);
      if (recent.length > 200) recent.shift();
      [...handlers].forEach((h) => h(e));
    });
    return {
      es,
      on(h, after) {
        handlers.add(h);
        const from = Number(after || 0);
        recent.filter((e) => Number(e.seq) > from).forEach((e) => h(e));
      },
      off(h) { handlers.delete(h); },
    };
  }

  function followBench(stream, box, id, since) {
    box.dataset.running = 'true';
    setBenchBusy(true);
    const prefix = 'bench ' + id + ': ';
    const lines = $('.bench-lines', box);
    const onEvent = async (e) => {
      if (!e.message.startsWith(prefix)) return;
      box.dataset.since = String(e.seq);
      const text = e.message.slice(prefix.length);
      const li = document.createElement('li');
      li.textContent = text;
      lines.append(li);
      li.scrollIntoView({ block: 'nearest' });
      if (!text.startsWith('finished, ')) return;
      stream.off(onEvent);
      box.dataset.running = 'false';
      $('.bench-state', box).textContent = 'Finished';
      setBenchBusy(false);
      try {
        await refreshBenchResults();
        box.dataset.refreshed = 'true';
      } catch (err) {
        showNotice('The run finished, but the results did not load (' + err.message + '); reload the page.');
      }
    };
    stream.on(onEvent, since);
  }

  function setBenchBusy(busy) {
    $$('form.bench-form button').forEach((b) => { b.disabled = busy; });
  }

  async function onBenchRun(ev, stream) {
    ev.preventDefault();
    const form = ev.currentTarget;
    const n = $('#notice');
    if (n) n.hidden = true;
    setBenchBusy(true);
    let res, data;
    try {
      ({ res, data } = await postForm(form));
    } catch (err) {
      setBenchBusy(false);
      showNotice('The bench request failed: ' + err);
      return;
    }
    if (res.status !== 202) {
      setBenchBusy(false);
      showNotice(data.detail || data.error || ('HTTP ' + res.status));
      return;
    }
    const box = $('#bench-live');
    $('.bench-state', box).textContent = 'Running';
    $('.bench-id', box).textContent = data.id;
    $('.bench-profile', box).textContent = data.profile;
    $('.bench-lines', box).replaceChildren();
    box.dataset.runId = data.id;
    box.dataset.refreshed = 'false';
    box.hidden = false;
    followBench(stream, box, data.id, data.since);
  }

  // watchStoredRuns refreshes the results table when a run that this page
  // did not start is stored: a `gpuhost bench run` uploaded to the daemon
  // ("bench <id>: uploaded, …") or a run started elsewhere that finished.
  // A run this page follows refreshes the table itself.
  function watchStoredRuns(stream, box) {
    const stored = /^bench (\S+): (uploaded, |finished, )/;
    let pending = null;
    stream.on((e) => {
      const m = stored.exec(e.message);
      if (!m || (box && box.dataset.runId === m[1])) return;
      clearTimeout(pending);
      pending = setTimeout(async () => {
        try {
          await refreshBenchResults();
          document.body.dataset.benchStored = m[1];
        } catch (err) {
          showNotice('A new result was stored, but the table did not load (' + err.message + '); reload the page.');
        }
      }, 250); // several results stored at once refresh the table once
    });
  }

  function initBench() {
    const box = $('#bench-live');
    const forms = $$('form.bench-form');
    if (!box && forms.length === 0 && !$('#bench-results')) return;
    const stream = benchStream(box && box.dataset.since);
    // EventSource reconnects by itself (with Last-Event-ID); when it has
    // given up in the middle of a run, the page reloads to show the state.
    stream.es.onerror = () => {
      if (stream.es.readyState === EventSource.CLOSED && box && box.dataset.running === 'true') location.assign('/bench');
    };
    forms.forEach((f) => f.addEventListener('submit', (ev) => onBenchRun(ev, stream)));
    if (box && box.dataset.running === 'true' && box.dataset.runId) {
      followBench(stream, box, box.dataset.runId, box.dataset.since);
    }
    if ($('#bench-results')) watchStoredRuns(stream, box);
  }

  // Every page's header pill, and the dashboard's gauges, follow GET /live
  // every 2 s (the values come formatted; the script sets text only).
  function initLive() {
    const pill = $('#phase');
    if (!pill) return;
    const several = $$('[data-gpu]').length > 1;
    let busy = false;
    const poll = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const res = await fetch(several ? '/live?gpus=1' : '/live', { headers: { 'Accept': 'application/json' }, credentials: 'same-origin' });
        if (!res.ok) return;
        const data = await res.json();
        pill.textContent = data.pill;
        pill.title = data.title || data.phase;
        pill.className = 'pill phase-' + (data.pill_class || data.phase);
        // GPU 0's lane (the only one on a one-GPU box) follows the
        // gauges, every other lane its own entry of data.gpus.
        const laneOf = (el) => {
          const lane = el.closest('[data-gpu]');
          const i = lane ? lane.dataset.gpu : '0';
          if (i === '0') return { gauges: data.gauges || {}, mem_pct: data.mem_pct };
          return (data.gpus || {})[i] || { gauges: {} };
        };
        $$('[data-live]').forEach((el) => {
          const g = laneOf(el).gauges;
          if (typeof g[el.dataset.live] === 'string') el.textContent = g[el.dataset.live];
        });
        $$('[data-live-bar]').forEach((el) => {
          const l = laneOf(el);
          if (l.gauges[el.dataset.liveBar] !== undefined) el.setAttribute('width', String(l.mem_pct));
        });
        document.documentElement.dataset.live = String(Number(document.documentElement.dataset.live || 0) + 1);
      } catch (_) {
        // The daemon is restarting or the session ended: the next poll retries.
      } finally {
        busy = false;
      }
    };
    pollLive = poll;
    setInterval(poll, 2000);
  }

  // The Activity page: new requests arrive on /activity/events (filtered
  // by the server as the page is), newest on top, at most data-limit rows;
  // the charts are fetched again every 4 s.
  const requestCells = ['time', 'client', 'model', 'api', 'status', 'prompt', 'completion', 'ttfb', 'tok_s', 'held'];

  function requestRow(r, gpuColumn) {
    const tr = document.createElement('tr');
    tr.dataset.seq = String(r.seq);
    const cells = gpuColumn ? requestCells.flatMap((k) => (k === 'model' ? [k, 'gpus'] : [k])) : requestCells;
    cells.forEach((k) => {
      const td = document.createElement('td');
      if (k === 'client') {
        const code = document.createElement('code');
        code.textContent = r.client;
        td.append(code);
      } else if (k === 'status') {
        const b = document.createElement('span');
        b.className = 'badge ' + r.status_class;
        b.textContent = String(r.status);
        td.append(b);
      } else if (k === 'model') {
        td.className = 'model';
        td.textContent = r.model || '–';
      } else if (k === 'gpus') {
        td.className = 'gpus';
        td.textContent = r.gpus || '–';
      } else if (k === 'api') {
        td.textContent = r.api;
      } else {
        td.textContent = r[k] || '';
        if (k !== 'time') td.className = 'num';
      }
      tr.append(td);
    });
    return tr;
  }

  async function refreshCharts(status) {
    const cur = $('#charts');
    if (!cur || document.hidden) return;
    try {
      const res = await fetch('/activity/charts?window=' + encodeURIComponent(cur.dataset.window), { headers: { 'Accept': 'text/html' }, credentials: 'same-origin' });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      const doc = new DOMParser().parseFromString(await res.text(), 'text/html');
      const fresh = doc.getElementById('charts');
      if (!fresh) throw new Error('no charts in the answer');
      cur.replaceWith(document.adoptNode(fresh));
      if (status) status.textContent = 'live · updated ' + new Date().toLocaleTimeString();
    } catch (err) {
      if (status) status.textContent = 'charts paused: ' + err.message;
    }
  }

  function initActivity() {
    const body = $('#requests');
    if (!body) return;
    const status = $('#live-status');
    const limit = Number(body.dataset.limit) || 200;
    const gpuColumn = body.dataset.gpuColumn === 'true';
    const q = new URLSearchParams({ after: body.dataset.after || '0', model: body.dataset.model || '', status: body.dataset.status || '', gpus: body.dataset.gpus || '' });
    const es = new EventSource('/activity/events?' + q);
    es.addEventListener('request', (ev) => {
      let r;
      try { r = JSON.parse(ev.data); } catch (_) { return; }
      if ($$('tr', body).some((tr) => tr.dataset.seq === String(r.seq))) return;
      body.prepend(requestRow(r, gpuColumn));
      $$('tr', body).slice(limit).forEach((tr) => tr.remove());
      const empty = $('#requests-empty');
      if (empty) empty.hidden = true;
      if (status) status.textContent = 'live · last request ' + r.time;
    });
    es.addEventListener('missed', (ev) => {
      if (status) status.textContent = 'live · ' + ev.data + ' requests went by too fast to show';
    });
    es.onerror = () => {
      if (status && es.readyState !== EventSource.OPEN) status.textContent = 'live updates reconnecting…';
    };
    const chartStatus = $('#charts-status');
    setInterval(() => refreshCharts(chartStatus), 4000);
  }

  document.addEventListener('DOMContentLoaded', () => {
    const page = document.body.dataset.page;
    if (page === 'profiles') initProfiles();
    if (page === 'dashboard') initDashboard();
    if (page === 'logs') initLogs();
    if (page === 'bench') initBench();
    if (page === 'activity') initActivity();
    initLive();
    // Tells tests (and curious operators) that the enhancements are live.
    document.documentElement.dataset.js = 'ready';
  });
})();
