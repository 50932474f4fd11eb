// gpuhost panel, Ask page: posts the question to /ask/stream and renders the
// agent's timeline from the server-sent events as they arrive (fetch and a
// stream reader: an EventSource cannot POST). Without this script the form
// posts to /ask and the page comes back with the whole timeline. Every
// string from the daemon goes in as textContent, never as markup.
(() => {
  'use strict';

  const $ = (sel, root = document) => root.querySelector(sel);
  const csrf = ($('meta[name="csrf-token"]') || {}).content || '';

  // The same words as stopWords and askRows in ask.go.
  const stopWords = {
    answer: 'answered',
    max_steps: 'step cap reached',
    token_budget: 'token budget used up',
    deadline: 'deadline passed',
    empty_reply: 'the model returned neither text nor a tool call',
    error: 'the model endpoint failed',
    canceled: 'canceled',
    invalid_question: 'invalid question',
    busy: 'busy',
  };

  // The same as formatDuration in views.go.
  const fmtDur = (ms) => {
    if (!(ms > 0) || !isFinite(ms)) return '';
    if (ms < 1) return '<1 ms';
    if (ms < 1000) return Math.round(ms) + ' ms';
    if (ms < 120000) return (ms / 1000).toFixed(1) + ' s';
    return (ms / 60000).toFixed(1) + ' min';
  };

  const str = (v) => (v === undefined || v === null ? '' : String(v));
  const int = (v) => (typeof v === 'number' && isFinite(v) ? Math.trunc(v) : 0);
  // A kind becomes part of a class name: letters and underscores only.
  const safeKind = (k) => str(k).replace(/[^a-z_]/gi, '') || 'unknown';

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = str(text);
    return e;
  }

  // Timeline folds events into rows exactly as askRows does on the server.
  class Timeline {
    constructor(ol) {
      this.ol = ol;
      this.reset();
    }

    reset() {
      this.ol.replaceChildren();
      this.failedSteps = new Set();
      this.badged = new Set();
      this.calls = 0;
      this.failures = 0;
      this.steps = 0;
      this.stop = null;
    }

    add(e) {
      const kind = safeKind(e.kind);
      const step = int(e.step);
      const li = el('li', 'ev ev-' + kind);
      li.dataset.kind = kind;
      li.dataset.step = String(step);
      let recovery = false, badge = false;
      if (step > 1 && this.failedSteps.has(step - 1) && kind !== 'stop') {
        recovery = true;
        if (!this.badged.has(step)) {
          badge = true;
          this.badged.add(step);
        }
      }
      if (step > this.steps) this.steps = step;
      let label = kind, tool = '', detail = '', code = false, latency = '', failed = false, text = '';
      switch (kind) {
        case 'start': {
          const tools = Array.isArray(e.tools) ? e.tools.map(str) : [];
          label = 'question';
          text = str(e.text);
          detail = tools.length + ' tools offered';
          li.title = tools.join(', ');
          break;
        }
        case 'model':
          label = 'model request';
          detail = int(e.prompt_tokens) + ' + ' + int(e.completion_tokens) + ' tokens';
          if (e.model) detail += ' · ' + str(e.model);
          latency = fmtDur(e.latency_ms);
          break;
        case 'tool_call':
          label = 'tool call';
          tool = str(e.tool);
          detail = str(e.arguments);
          code = true;
          this.calls++;
          break;
        case 'tool_result':
          label = 'tool result';
          tool = str(e.tool);
          detail = str(e.result);
          latency = fmtDur(e.latency_ms);
          if (e.is_error === true) {
            failed = true;
            this.failedSteps.add(step);
            this.failures++;
          }
          break;
        case 'answer':
          label = 'answer';
          text = str(e.text);
          break;
        case 'stop': {
          const reason = str(e.reason);
          label = 'stopped';
          detail = Object.prototype.hasOwnProperty.call(stopWords, reason) ? stopWords[reason] : reason;
          if (e.text) detail = reason === 'answer' ? str(e.text) : detail + ': ' + str(e.text);
          li.classList.add('stop-' + safeKind(reason));
          this.stop = reason;
          break;
        }
        default:
          detail = str(e.text);
      }
      if (failed) li.classList.add('failed');
      if (recovery) li.classList.add('recovery');
      li.append(el('span', 'ev-step', step ? 'step ' + step : ''), ' ', el('span', 'ev-label', label));
      if (failed) li.append(' ', el('span', 'badge sev-fail ev-failed', 'failed'));
      if (badge) li.append(' ', el('span', 'badge sev-warn ev-recovery', 'recovery'));
      if (tool) li.append(' ', el('code', 'ev-tool', tool));
      if (latency) li.append(' ', el('span', 'ev-latency', latency));
      if (detail) li.append(' ', el('span', code ? 'ev-detail ev-args' : 'ev-detail', detail));
      if (text) li.append(el('p', 'ev-text', text));
      this.ol.append(li);
      li.scrollIntoView({ block: 'nearest' });
    }

    summary(ms) {
      const parts = [];
      parts.push(this.stop ? (stopWords[this.stop] || this.stop) : 'no stop event');
      parts.push('in ' + (fmtDur(ms) || '<1 ms'));
      parts.push(this.steps + (this.steps === 1 ? ' step' : ' steps'));
      let calls = this.calls + (this.calls === 1 ? ' tool call' : ' tool calls');
      if (this.failures) calls += ', ' + this.failures + ' failed';
      parts.push(calls);
      return parts.join(' · ');
    }
  }

  // parseBlock reads one SSE event block; null for comments and junk.
  function parseBlock(block) {
    let kind = '', data = [], any = false;
    for (const line of block.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? '' : line.slice(i + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') kind = value;
      if (field === 'data') { data.push(value); any = true; }
    }
    if (!any) return null;
    let e;
    try { e = JSON.parse(data.join('\n')); } catch (_) { return null; }
    if (!e || typeof e !== 'object') return null;
    if (!e.kind) e.kind = kind;
    return e;
  }

  // readStream calls onEvent per event; true when it saw the stop event.
  async function readStream(res, onEvent) {
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const e = parseBlock(buf.slice(0, i));
        buf = buf.slice(i + 2);
        if (!e) continue;
        onEvent(e);
        if (e.kind === 'stop') {
          reader.cancel().catch(() => {});
          return true;
        }
      }
    }
  }

  function init() {
    const form = $('#ask-form');
    const ol = $('#timeline');
    if (!form || !ol) return;
    const box = $('#question');
    const submit = $('#ask-submit');
    const cancel = $('#ask-cancel');
    const status = $('#ask-status');
    const notice = $('#ask-notice');
    const tl = new Timeline(ol);
    let ctrl = null;

    const showNotice = (msg) => {
      notice.textContent = msg;
      notice.hidden = false;
    };
    const busy = (on) => {
      submit.disabled = on;
      box.readOnly = on;
      cancel.hidden = !on;
      ol.dataset.state = on ? 'running' : 'done';
    };

    cancel.addEventListener('click', () => { if (ctrl) ctrl.abort(); });
    box.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) form.requestSubmit();
    });
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const q = box.value;
      notice.hidden = true;
      if (!q.trim()) {
        showNotice('Type a question first.');
        return;
      }
      tl.reset();
      busy(true);
      status.textContent = 'asking…';
      ctrl = new AbortController();
      const t0 = performance.now();
      let res;
      try {
        res = await fetch('/ask/stream', {
          method: 'POST',
          body: JSON.stringify({ question: q }),
          headers: {
            'Content-Type': 'application/json',
            'Accept': 'text/event-stream, application/json',
            'X-CSRF-Token': csrf,
          },
          credentials: 'same-origin',
          signal: ctrl.signal,
        });
      } catch (err) {
        busy(false);
        status.textContent = '';
        showNotice(ctrl.signal.aborted ? 'Stopped before the daemon answered.' : 'The request failed: ' + err);
        return;
      }
      if (!res.ok) {
        let msg = 'HTTP ' + res.status;
        try {
          const d = await res.json();
          msg = str(d.detail || d.error || msg);
        } catch (_) { /* not JSON: keep the status */ }
        busy(false);
        status.textContent = '';
        showNotice(msg);
        return;
      }
      let sawStop = false;
      try {
        sawStop = await readStream(res, (e) => {
          tl.add(e);
          status.textContent = 'step ' + tl.steps + ' · ' + fmtDur(performance.now() - t0);
        });
      } catch (err) {
        if (!ctrl.signal.aborted) showNotice('The answer stream broke: ' + err);
      }
      busy(false);
      if (sawStop) {
        status.textContent = tl.summary(performance.now() - t0);
      } else if (ctrl.signal.aborted) {
        status.textContent = 'stopped in the browser; the daemon ends the loop';
      } else {
        status.textContent = '';
        showNotice('The answer stream ended before the agent stopped (the daemon may have restarted).');
      }
      ctrl = null;
    });
    // Tells tests (and curious operators) that the page is live.
    ol.dataset.js = 'ready';
  }

  document.addEventListener('DOMContentLoaded', init);
})();
