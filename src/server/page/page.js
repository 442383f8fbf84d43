// The status page's script (served as /page.js; the page's policy allows no inline script).
// It polls /status.json, asks /top only when that would answer (open reads, or a token the
// user typed, kept in this tab's sessionStorage only), and posts the explain form to
// /explain. Every value is put in the page as text, never as HTML.
'use strict';

const POLL_MS = 5000;
const TOKEN_KEY = 'sluice.adminToken';

const $ = (id) => document.getElementById(id);

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(typeof c === 'string' || typeof c === 'number' ? String(c) : c);
  }
  return e;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function ago(ms, now) {
  if (!ms) return 'never';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.floor(s / 60) + ' min ago';
  if (s < 86400) return Math.floor(s / 3600) + ' h ago';
  return Math.floor(s / 86400) + ' d ago';
}

function when(ms, now) {
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') + ' (' + ago(ms, now) + ')';
}

function limitText(l) {
  const unit = l.unit.toLowerCase();
  const per = l.unit_multiplier > 1 ? l.unit_multiplier + ' ' + unit + 's' : unit;
  let t = l.requests_per_unit + ' / ' + per;
  if (l.algorithm === 'token_bucket') t += ' (bucket, burst ' + l.burst + ')';
  else if (l.algorithm === 'concurrency') t = l.requests_per_unit + ' in flight (lease ' + per + ')';
  else if (l.algorithm === 'fixed_window') t += ' (fixed window)';
  return t;
}

function tags(r) {
  const t = [];
  if (r.unlimited) t.push('unlimited');
  if (r.shadow_mode) t.push('shadow');
  if (r.exact) t.push('exact');
  return el('td', {}, ...t.map((x) => el('span', { class: 'tag' }, x)));
}

// === status ===

let rulesShown = '';
let lastStatus = null;

function renderHeader(s) {
  $('version').textContent = 'v' + s.version + ' (' + s.commit + ')';
  $('mode').textContent = s.mode + ' mode';
  const ready = $('ready');
  ready.textContent = s.ready ? 'ready' : 'not ready';
  ready.className = 'badge ' + (s.ready ? 'ok' : 'bad');
  $('updated').textContent = 'updated ' + new Date(s.now_unix_ms).toLocaleTimeString();
}

function renderRules(s) {
  const r = s.reload;
  const reload = $('reload');
  let outcome = el('span', { class: 'ok' }, 'Last reload applied');
  if (!r.ok) outcome = el('span', { class: 'bad' }, 'Last reload rejected; the previous rules stay in force');
  else if (r.loads === 0) outcome = el('span', { class: 'warn' }, 'No rules loaded yet (waiting for the xDS server?)');
  reload.replaceChildren(
    outcome,
    ' — rules in force since ' + when(r.applied_at_unix_ms, s.now_unix_ms) + ', ' + r.loads + ' load(s) since start, from ',
    el('span', { class: 'mono' }, r.files.join(', ') || 'no file'),
    r.files_more ? ' and ' + r.files_more + ' more' : ''
  );
  fill($('reload-errors'), r.errors.map((e) => el('li', { class: 'mono' }, e)));
  if (r.errors_more) $('reload-errors').append(el('li', {}, 'and ' + r.errors_more + ' more'));

  const rules = s.rules;
  $('rules-summary').textContent = rules.count + ' rule(s) in ' + rules.domains + ' domain(s)';
  // The table is rebuilt only when the rules changed, so a scrolled or selected row stays.
  const key = r.loads + ':' + r.applied_at_unix_ms;
  if (key !== rulesShown) {
    rulesShown = key;
    fill($('rules').tBodies[0], rules.listed.map((x) => el('tr', {},
      el('td', { class: 'mono' }, x.domain),
      el('td', {}, x.name ? el('strong', {}, x.name) : null, x.name ? el('br') : null, el('span', { class: 'mono muted' }, x.full_key)),
      el('td', {}, x.unlimited ? 'unlimited' : x.limits.map(limitText).join('; ')),
      el('td', { class: 'mono' }, x.source),
      tags(x)
    )));
  }
  $('rules-more').textContent = rules.more ? 'and ' + rules.more + ' more rule(s) not listed (GET /rlconfig has them all)' : '';
  const domain = $('explain-domain');
  if (!domain.value && rules.listed.length) domain.value = rules.listed[0].domain;
}

function renderFleet(s) {
  const section = $('fleet-section');
  section.hidden = s.mode !== 'global';
  if (section.hidden) return;
  const f = s.fleet;
  $('fleet').textContent = f ? 'Live replicas: ' + f.live + '. This replica: ' + f.replica_id + '. ' + f.join : '';
  fill($('shards').tBodies[0], s.shards.map((h) => el('tr', {},
    el('td', { class: 'mono' }, h.name),
    el('td', { class: h.ok ? 'ok' : 'bad' }, h.status),
    el('td', {}, h.last_success_unix_ms ? ago(h.last_success_unix_ms, s.now_unix_ms) : 'never')
  )));
}

function renderRlqs(s) {
  const section = $('rlqs-section');
  section.hidden = !s.rlqs;
  if (!s.rlqs) return;
  const q = s.rlqs;
  $('rlqs').textContent = q.streams + ' open stream(s) (at most ' + q.max_streams + '), ' + q.buckets +
    ' bucket(s) tracked (at most ' + q.max_buckets + '), ' + q.counters + ' counter(s) shared.';
  $('streams').hidden = q.listed.length === 0;
  fill($('streams').tBodies[0], q.listed.map((x) => el('tr', {},
    el('td', {}, '#' + x.id), el('td', { class: 'mono' }, x.domain || '(no report yet)'), el('td', {}, x.buckets))));
  $('streams-more').textContent = q.streams_more ? 'and ' + q.streams_more + ' more stream(s)' : '';
}

async function poll() {
  try {
    const resp = await fetch('/status.json', { cache: 'no-store' });
    if (!resp.ok) throw new Error('/status.json answered ' + resp.status);
    const s = await resp.json();
    lastStatus = s;
    $('problem').hidden = true;
    renderHeader(s);
    renderRules(s);
    renderFleet(s);
    renderRlqs(s);
    await renderTop(s);
  } catch (e) {
    const p = $('problem');
    p.hidden = false;
    p.textContent = 'The service does not answer: ' + e.message + '. Retrying every ' + POLL_MS / 1000 + ' s.';
  }
}

// === top keys ===

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function renderTop(s) {
  const note = $('top-note');
  const form = $('token-form');
  const forget = $('forget-token');
  const table = $('top');
  const body = table.tBodies[0];
  const t = token();
  table.hidden = true;
  form.hidden = !(s.top === 'token' && !t);
  forget.hidden = !(s.top === 'token' && t);
  if (s.top === 'off') {
    note.textContent = 'Top keys need the admin token, and none is configured (ADMIN_TOKEN_FILE).';
    fill(body, []);
    return;
  }
  if (s.top === 'token' && !t) {
    note.textContent = 'Enter the admin token to see top keys (kept in this tab only).';
    fill(body, []);
    return;
  }
  const headers = t ? { Authorization: 'Bearer ' + t } : {};
  const resp = await fetch('/top?n=20', { headers, cache: 'no-store' });
  if (resp.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    note.textContent = 'The token was refused; enter it again.';
    form.hidden = false;
    forget.hidden = true;
    fill(body, []);
    return;
  }
  if (!resp.ok) {
    note.textContent = '/top answered ' + resp.status + '.';
    fill(body, []);
    return;
  }
  const keys = (await resp.json()).keys || [];
  table.hidden = keys.length === 0;
  note.textContent = keys.length ? 'The busiest keys now, by share of their limit.' : 'No key has been counted yet.';
  fill(body, keys.map((k) => el('tr', {},
    el('td', {}, k.name ? el('strong', {}, k.name) : null, k.name ? el('br') : null, el('span', { class: 'mono muted' }, k.rule)),
    el('td', { class: 'mono' }, k.entries.map((e) => e.key + '=' + e.value).join(', ')),
    el('td', {}, el('meter', { min: '0', max: '1', low: '0.7', high: '0.9', optimum: '0', value: String(Math.min(1, k.ratio)) }),
      ' ' + Math.round(k.ratio * 100) + '%'),
    el('td', {}, k.count + ' / ' + k.limit + ' a ' + String(k.unit).toLowerCase()),
    el('td', {}, k.reset_seconds + ' s')
  )));
}

function useToken(ev) {
  ev.preventDefault();
  const v = $('token').value.trim();
  if (!v) return;
  sessionStorage.setItem(TOKEN_KEY, v);
  $('token').value = '';
  if (lastStatus) renderTop(lastStatus);
}

function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  if (lastStatus) renderTop(lastStatus);
}

// === explain ===

// "k=v, k2=v2" a line: one descriptor a line.
function descriptors(text) {
  return text.split('\n').map((line) => line.trim()).filter((line) => line).map((line) => ({
    entries: line.split(',').map((p) => p.trim()).filter((p) => p).map((p) => {
      const at = p.indexOf('=');
      return at < 0 ? { key: p, value: '' } : { key: p.slice(0, at).trim(), value: p.slice(at + 1).trim() };
    }),
  }));
}

function renderExplanation(a) {
  const out = [el('h3', { class: a.overall_code === 'OK' ? 'ok' : 'bad' }, 'Would be answered ' + a.overall_code),
    a.shadow_mode ? el('p', { class: 'muted' }, 'SHADOW_MODE is on: an OVER_LIMIT is answered OK.') : null];
  a.descriptors.forEach((d, i) => {
    const entries = d.entries.map((e) => e.key + '=' + e.value).join(', ');
    const parts = [el('div', { class: 'mono' }, '#' + (i + 1) + ' ' + entries)];
    if (d.rule) {
      const src = d.rule.source.file ? d.rule.source.file + (d.rule.source.line ? ':' + d.rule.source.line : '')
        : d.rule.source.xds ? 'xds:' + d.rule.source.xds : 'the request';
      parts.push(el('div', {}, 'Rule ', el('strong', { class: 'rule-name' }, d.rule.name || d.rule.full_key),
        ' (', el('span', { class: 'mono' }, d.rule.full_key), ') from ', el('span', { class: 'mono' }, src)));
    } else if (d.no_match) {
      parts.push(el('div', { class: 'muted' }, 'No rule: ' + d.no_match.message));
    }
    if (d.replaced_by) parts.push(el('div', { class: 'muted' }, 'Replaced by ' + d.replaced_by + ': counts nothing here.'));
    for (const l of d.limits) {
      parts.push(el('div', {}, limitText(l) + ': ' + l.count + ' counted, ' + l.remaining + ' left, resets in ' +
        l.reset_seconds + ' s → ', el('span', { class: l.decision === 'OK' ? 'ok' : 'bad' }, l.decision)));
    }
    parts.push(el('div', {}, 'Decision: ', el('span', { class: d.code === 'OK' ? 'ok' : 'bad' }, d.decision),
      d.code !== d.decision ? ' (answered ' + d.code + ': shadow mode)' : ''));
    out.push(el('div', { class: 'descriptor' }, ...parts));
  });
  return el('div', { class: 'answer', id: 'explain-result' }, ...out);
}

async function explain(ev) {
  ev.preventDefault();
  const answer = $('explain-answer');
  const body = { domain: $('explain-domain').value.trim(), descriptors: descriptors($('explain-entries').value) };
  try {
    const resp = await fetch('/explain', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    if (!resp.ok) {
      answer.replaceChildren(el('p', { class: 'bad answer', id: 'explain-result' }, (await resp.text()).trim()));
      return;
    }
    answer.replaceChildren(renderExplanation(await resp.json()));
  } catch (e) {
    answer.replaceChildren(el('p', { class: 'bad answer', id: 'explain-result' }, 'No answer: ' + e.message));
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('explain-form').addEventListener('submit', explain);
  $('token-form').addEventListener('submit', useToken);
  $('forget-token').addEventListener('click', forgetToken);
  poll();
  setInterval(poll, POLL_MS);
});
