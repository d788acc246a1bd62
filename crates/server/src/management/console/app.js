// The Lepus web console: plain JavaScript over the management API (/api), no libraries.
// Views are hash routes (#/overview, #/queues, #/queues/VHOST/NAME, ...). Each view builds its
// page once (forms keep what the user typed) and refreshes its data every REFRESH_MS.
'use strict';

// `?refresh=MS` (at least 1000) changes the refresh period, e.g. for tests.
const REFRESH_MS = Math.max(1000, Number(new URLSearchParams(location.search).get('refresh')) || 5000);
// The charts' range: the broker's samples of the last 10 minutes in steps of 5 s (what it keeps
// per queue; RabbitMQ's lengths_age/msg_rates_age parameters), drawn at page load already.
const CHART_AGE_S = 600;
const CHART_INCR_S = 5;
const CHART_RANGE = `lengths_age=${CHART_AGE_S}&lengths_incr=${CHART_INCR_S}` +
  `&msg_rates_age=${CHART_AGE_S}&msg_rates_incr=${CHART_INCR_S}&data_rates_age=${CHART_AGE_S}&data_rates_incr=${CHART_INCR_S}`;
const AUTH_KEY = 'lepus.console.auth';

// ---------------------------------------------------------------- DOM helpers

/** Creates an element: h('a', {href: '#'}, 'text', child...). Text is never parsed as HTML. */
function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
    else if (key === 'class') element.className = value;
    else if (value === true) element.setAttribute(key, '');
    else element.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const $ = (selector, root = document) => root.querySelector(selector);

function fmtNumber(value) {
  return typeof value === 'number' ? value.toLocaleString('en-US') : '–';
}

function fmtRate(details) {
  const rate = details && typeof details.rate === 'number' ? details.rate : 0;
  return rate.toLocaleString('en-US', {maximumFractionDigits: 1}) + '/s';
}

// A byte rate from RabbitMQ's `*_oct_details`.
function fmtByteRate(details) {
  const rate = details && typeof details.rate === 'number' ? details.rate : 0;
  return fmtBytes(rate) + '/s';
}

// A counted figure with its rate, as the detail pages show `message_stats`: "12 (0.4/s)".
function fmtCountAndRate(count, details) {
  return `${fmtNumber(count || 0)} (${fmtRate(details)})`;
}

function fmtBytes(bytes) {
  if (typeof bytes !== 'number') return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return value.toLocaleString('en-US', {maximumFractionDigits: unit ? 1 : 0}) + ' ' + units[unit];
}

function fmtDuration(ms) {
  let seconds = Math.floor((ms || 0) / 1000);
  const days = Math.floor(seconds / 86400); seconds -= days * 86400;
  const hours = Math.floor(seconds / 3600); seconds -= hours * 3600;
  const minutes = Math.floor(seconds / 60); seconds -= minutes * 60;
  if (days) return `${days}d ${hours}h`;
  if (hours) return `${hours}h ${minutes}m`;
  if (minutes) return `${minutes}m ${seconds}s`;
  return `${seconds}s`;
}

function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString('en-GB') : '–';
}

function flags(object) {
  const list = [];
  if (object.durable) list.push(h('abbr', {class: 'flag', title: 'durable'}, 'D'));
  if (object.auto_delete) list.push(h('abbr', {class: 'flag', title: 'auto-delete'}, 'AD'));
  if (object.exclusive) list.push(h('abbr', {class: 'flag', title: 'exclusive'}, 'Excl'));
  if (object.internal) list.push(h('abbr', {class: 'flag', title: 'internal'}, 'I'));
  const args = Object.keys(object.arguments || {});
  if (args.length) list.push(h('abbr', {class: 'flag', title: args.join(', ')}, 'Args'));
  return list;
}

/** Messages at the top of the page: notify('text') or notify('text', 'error'). */
function notify(text, kind = 'ok') {
  const flash = $('#flash');
  const item = h('div', {class: `notice ${kind}`, 'data-kind': kind, 'data-at': Date.now()}, text,
    h('button', {type: 'button', class: 'link', 'aria-label': 'dismiss', onclick: () => item.remove()}, '×'));
  flash.append(item);
  setTimeout(() => item.remove(), kind === 'error' ? 15000 : 5000);
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  /** `sessionEnded`: the credentials no longer work and the console has logged out. */
  constructor(status, reason, sessionEnded = false) { super(reason); this.status = status; this.sessionEnded = sessionEnded; }
}

// The 401 reasons that mean the credentials are refused; any other 401 refuses one operation
// (e.g. "Not administrator user") and is shown to the user, who stays logged in.
const LOGIN_REFUSALS = new Set(['Login failed', 'Not_Authorized', 'Not management user']);

function credentials() { return sessionStorage.getItem(AUTH_KEY); }

/** Calls the management API; answers the parsed JSON (null for an empty answer). */
async function api(method, path, body, extraHeaders = {}) {
  const headers = {Authorization: 'Basic ' + credentials(), ...extraHeaders};
  const init = {method, headers, cache: 'no-store', credentials: 'omit'};
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  const response = await fetch('/api' + path, init);
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = text; }
  }
  if (response.status === 401) {
    const reason = (data && data.reason) || 'Login failed';
    if (!LOGIN_REFUSALS.has(reason)) throw new ApiError(401, 'not authorised: ' + reason);
    logout('Your session is no longer valid: ' + reason);
    throw new ApiError(401, 'not authorised', true);
  }
  if (!response.ok) {
    const reason = data && data.reason ? String(data.reason).trim() : `HTTP ${response.status}`;
    throw new ApiError(response.status, reason);
  }
  return data;
}

const enc = encodeURIComponent;

// ---------------------------------------------------------------- session

function login(user, password) {
  // btoa needs Latin-1; encode UTF-8 first so any password works.
  const raw = new TextEncoder().encode(`${user}:${password}`);
  return btoa(String.fromCharCode(...raw));
}

function logout(message) {
  sessionStorage.removeItem(AUTH_KEY);
  stopView();
  $('#view').replaceChildren();
  $('#nav').hidden = true;
  $('#session').hidden = true;
  $('#login').hidden = false;
  const error = $('#login-error');
  error.hidden = !message;
  error.textContent = message || '';
}

async function onLogin(event) {
  event.preventDefault();
  const form = event.target;
  const user = form.user.value;
  sessionStorage.setItem(AUTH_KEY, login(user, form.password.value));
  try {
    const me = await api('GET', '/whoami');
    form.password.value = '';
    startSession(me.name);
  } catch (error) {
    if (error.status !== 401) logout('Cannot reach the management API: ' + error.message);
    else logout('Login failed: wrong user or password, or this user may not log in from here.');
  }
}

let sessionUser = null;

function startSession(user) {
  sessionUser = user;
  $('#login').hidden = true;
  $('#nav').hidden = false;
  $('#session').hidden = false;
  $('#user').textContent = user;
  route();
}

// ---------------------------------------------------------------- header status and history

let lastOverview = null;

/**
 * Chart points from `*_details.samples` (newest first), oldest first: {t, KEY: value} for each
 * series [{key, details, rate}]. A rate series turns its counter samples into the change per
 * second between neighbouring points; a length series shows the samples as they are.
 */
function chartPoints(series) {
  const points = new Map();
  for (const {key, details, rate} of series) {
    const samples = ((details || {}).samples || []).slice().reverse();
    samples.forEach((sample, index) => {
      if (rate && index === 0) return;
      const point = points.get(sample.timestamp) || {t: sample.timestamp};
      if (rate) {
        const before = samples[index - 1];
        const seconds = (sample.timestamp - before.timestamp) / 1000;
        point[key] = seconds > 0 ? Math.max(0, (sample.sample - before.sample) / seconds) : 0;
      } else {
        point[key] = sample.sample;
      }
      points.set(sample.timestamp, point);
    });
  }
  return [...points.values()].sort((a, b) => a.t - b.t);
}

/** The points of the queued-messages and message-rates charts of an overview or a queue. */
function messageChartPoints(lengths, stats) {
  return {
    queued: chartPoints([
      {key: 'ready', details: lengths.messages_ready_details},
      {key: 'unacked', details: lengths.messages_unacknowledged_details}]),
    rates: chartPoints([
      {key: 'publish', details: stats.publish_details, rate: true},
      {key: 'deliver', details: stats.deliver_get_details, rate: true}]),
  };
}

async function sampleOverview() {
  const overview = await api('GET', '/overview?' + CHART_RANGE);
  lastOverview = overview;
  const alarm = $('#alarm');
  alarm.className = 'badge ' + (overview.disk_free_alarm ? 'alarm' : 'ok');
  alarm.textContent = overview.disk_free_alarm ? 'DISK ALARM: publishers blocked' : 'disk ok';
  const memoryAlarm = $('#memory-alarm');
  memoryAlarm.className = 'badge ' + (overview.mem_alarm ? 'alarm' : 'ok');
  memoryAlarm.textContent = overview.mem_alarm ? 'MEMORY ALARM: publishers blocked' : 'memory ok';
  $('#node').textContent = overview.node;
  $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString('en-GB');
  return overview;
}

// ---------------------------------------------------------------- views and routing

let currentView = null;
let timer = null;

function stopView() {
  if (timer) clearInterval(timer);
  timer = null;
  currentView = null;
}

async function refresh() {
  const view = currentView;
  if (!view || !credentials()) return;
  try {
    await sampleOverview();
    if (view === currentView) await view.refresh();
    document.body.dataset.loaded = String(Date.now());
  } catch (error) {
    if (!error.sessionEnded) notify('Refresh failed: ' + error.message, 'error');
  }
}

function route() {
  if (!credentials()) { logout(); return; }
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'overview';
  let view;
  if (page === 'queues' && parts.length >= 3) view = queueView(parts[1], parts.slice(2).join('/'));
  else if (page === 'exchanges' && parts.length >= 3) view = exchangeView(parts[1], parts.slice(2).join('/'));
  else if (page === 'connections' && parts.length >= 2) view = connectionView(parts.slice(1).join('/'));
  else if (page === 'channels' && parts.length >= 2) view = channelView(parts.slice(1).join('/'));
  else view = (views[page] || views.overview)();
  stopView();
  // Notices belong to the page they were raised on; keep only one just raised (e.g. "deleted").
  for (const notice of document.querySelectorAll('#flash .notice')) {
    if (Date.now() - Number(notice.dataset.at) > 1500) notice.remove();
  }
  for (const link of document.querySelectorAll('#nav a')) {
    link.classList.toggle('active', link.dataset.nav === (views[page] ? page : 'overview'));
  }
  delete document.body.dataset.loaded;
  const container = $('#view');
  container.replaceChildren(view.element);
  currentView = view;
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

/** A table whose body is replaced on each refresh. columns: [{title, cell(row) -> node|text, num}] */
function dataTable(name, columns, empty) {
  const body = h('tbody');
  const table = h('table', {class: 'data', 'data-table': name},
    h('thead', {}, h('tr', {}, columns.map((column) => h('th', {class: column.num ? 'num' : ''}, column.title)))),
    body);
  return {
    element: h('div', {class: 'table-wrap'}, table),
    update(rows, key) {
      if (!rows.length) {
        body.replaceChildren(h('tr', {}, h('td', {colspan: columns.length, class: 'empty'}, empty)));
        return;
      }
      body.replaceChildren(...rows.map((row) => h('tr', {'data-row': key(row)},
        columns.map((column) => h('td', {class: column.num ? 'num' : '', 'data-col': column.id}, column.cell(row))))));
    },
  };
}

function section(title, ...children) {
  return h('section', {class: 'card'}, h('h2', {}, title), ...children);
}

function vhostSelect() {
  const select = h('select', {name: 'vhost'}, h('option', {value: '/'}, '/'));
  api('GET', '/vhosts').then((vhosts) => {
    select.replaceChildren(...vhosts.map((vhost) => h('option', {value: vhost.name}, vhost.name)));
  }).catch(() => {});
  return select;
}

/** Parses `text` as a JSON object; `what` names it in the error ("the definition ..."). */
function parseJsonObject(text, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(`${what} is not valid JSON (${error.message})`);
  }
  if (typeof value !== 'object' || Array.isArray(value) || value === null) {
    throw new Error(`${what} must be a JSON object: {"key": value, ...}`);
  }
  return value;
}

function parseArguments(text) {
  return text.trim() ? parseJsonObject(text, 'the arguments') : {};
}

/** Fills a select with `values`, keeping the chosen one; leaves it alone when nothing changed. */
function fillSelect(select, values) {
  const current = [...select.options].map((option) => option.value);
  if (current.length === values.length && current.every((value, index) => value === values[index])) return;
  const chosen = select.value;
  select.replaceChildren(...values.map((value) => h('option', {value}, value)));
  if (values.includes(chosen)) select.value = chosen;
}

/** The error line of a form: shows why its last submit failed. */
function formError() {
  return h('p', {class: 'error form-error', 'data-form-error': '', hidden: true});
}

/**
 * Submits a form: `action(form)` does the work and answers the notice to show. A failure shows
 * in the form's error line, next to what the user just did: "`what(form)` failed: reason".
 */
async function submitForm(event, what, action) {
  event.preventDefault();
  const form = event.target;
  const error = $('.form-error', form);
  const label = what(form);
  error.hidden = true;
  try {
    notify(await action(form));
    refresh();
  } catch (failure) {
    if (failure.sessionEnded) return;
    error.textContent = `${label} failed: ${failure.message}`;
    error.hidden = false;
  }
}

/** A row button's work: asks `question` first (when given), runs `action`, reports. */
async function confirmThen(question, action, done, what) {
  if (question && !confirm(question)) return;
  try {
    await action();
    notify(done);
    refresh();
  } catch (error) {
    if (!error.sessionEnded) notify(`${what} failed: ${error.message}`, 'error');
  }
}

function rowButton(text, kind, data, onclick) {
  return h('button', {type: 'button', class: `${kind} small`, ...data, onclick}, text);
}

function rowActions(...buttons) {
  return h('span', {class: 'row-actions'}, ...buttons);
}

const tagList = (tags) => (Array.isArray(tags) ? tags.join(', ') : tags || '');

function stat(label, value, id) {
  return h('div', {class: 'stat'}, h('div', {class: 'stat-value', 'data-stat': id}, value), h('div', {class: 'stat-label'}, label));
}

// ---------------------------------------------------------------- charts

const COLORS = {ready: '#d97706', unacked: '#2563eb', publish: '#059669', deliver: '#7c3aed'};

/** Draws series [{label, key, color}] of `samples` ({t, KEY: value}, oldest first) on a canvas. */
function drawChart(canvas, series, unit, samples) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 480;
  const height = canvas.clientHeight || 180;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const left = 56, right = 10, top = 10, bottom = 22;
  const plotW = width - left - right, plotH = height - top - bottom;
  let max = 0;
  for (const sample of samples) for (const s of series) max = Math.max(max, sample[s.key] || 0);
  const niceMax = niceCeiling(max);
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillStyle = '#6b7280';
  ctx.strokeStyle = '#e5e7eb';
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let i = 0; i <= 4; i++) {
    const y = top + plotH - (plotH * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, Math.round(y) + 0.5); ctx.lineTo(left + plotW, Math.round(y) + 0.5); ctx.stroke();
    const value = (niceMax * i) / 4;
    ctx.fillText(value.toLocaleString('en-US', {maximumFractionDigits: 2}) + unit, left - 6, y);
  }
  // x axis: the chart's range (10 minutes), the newest point at the right.
  const now = samples.length ? samples[samples.length - 1].t : Date.now();
  const span = CHART_AGE_S * 1000;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  for (let i = 0; i <= 5; i++) {
    const ago = (span * i) / 5 / 1000;
    const x = left + plotW - (plotW * i) / 5;
    const label = i === 0 ? 'now' : span >= 300000 ? `-${Math.round(ago / 60)}m` : `-${Math.round(ago)}s`;
    ctx.textAlign = i === 5 ? 'left' : i === 0 ? 'right' : 'center';
    ctx.fillText(label, x, top + plotH + 6);
  }
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    samples.forEach((sample, index) => {
      const x = left + plotW - (plotW * (now - sample.t)) / span;
      const y = top + plotH - (niceMax ? (plotH * (sample[s.key] || 0)) / niceMax : 0);
      if (index === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    if (samples.length === 1) ctx.arc(left + plotW, top + plotH - (niceMax ? (plotH * (samples[0][s.key] || 0)) / niceMax : 0), 2, 0, 7);
    ctx.stroke();
  }
}

function niceCeiling(value) {
  if (value <= 0) return 4;
  const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 4, 6, 8, 10]) if (step * magnitude >= value) return step * magnitude;
  return 10 * magnitude;
}

/** A chart of series [{label, key, color}]; `update(samples)` draws the broker's samples. */
function chart(title, series, unit) {
  const canvas = h('canvas', {class: 'chart', 'aria-label': title, role: 'img'});
  const legend = h('div', {class: 'legend'});
  return {
    element: h('div', {class: 'chart-box'}, h('h3', {}, title), canvas, legend),
    update(samples) {
      canvas.dataset.points = String(samples.length);
      drawChart(canvas, series, unit, samples);
      const last = samples[samples.length - 1] || {};
      legend.replaceChildren(...series.map((s) => h('span', {class: 'legend-item', 'data-series': s.key},
        h('i', {class: `swatch swatch-${s.key}`}), `${s.label}: `,
        h('b', {}, (last[s.key] || 0).toLocaleString('en-US', {maximumFractionDigits: 1}) + unit))));
    },
  };
}

// ---------------------------------------------------------------- overview

function overviewView() {
  const totals = h('div', {class: 'stats'});
  const queued = chart('Queued messages', [
    {label: 'Ready', key: 'ready', color: COLORS.ready},
    {label: 'Unacked', key: 'unacked', color: COLORS.unacked}], '');
  const rates = chart('Message rates', [
    {label: 'Publish', key: 'publish', color: COLORS.publish},
    {label: 'Deliver / get', key: 'deliver', color: COLORS.deliver}], '/s');
  const messages = h('div', {class: 'stats'});
  const node = h('dl', {class: 'facts'});
  const listeners = h('ul', {class: 'plain'});
  // Every member of the cluster with whether it runs (this node alone when not clustered).
  const clusterNodes = h('ul', {class: 'plain', id: 'cluster-nodes'});
  const importInput = h('input', {type: 'file', accept: 'application/json,.json', name: 'definitions'});
  const element = h('div', {},
    h('h1', {}, 'Overview'),
    section('Messages', messages, h('div', {class: 'charts'}, queued.element, rates.element)),
    section('Objects', totals),
    h('div', {class: 'columns'},
      section('Node', node, h('h3', {}, 'Listeners'), listeners, h('h3', {}, 'Cluster nodes'), clusterNodes,
        h('p', {class: 'small'}, h('a', {href: '#/cluster'}, 'Cluster page: metadata leader and quorum shards'))),
      section('Definitions',
        h('p', {class: 'muted'}, 'Exchanges, queues, bindings, users and vhosts as a RabbitMQ definitions file.'),
        h('p', {}, h('button', {type: 'button', id: 'export-definitions', onclick: exportDefinitions}, 'Download definitions')),
        h('form', {id: 'import-form', onsubmit: (event) => importDefinitions(event, importInput)},
          h('label', {}, 'Import a file ', importInput), ' ', h('button', {type: 'submit'}, 'Upload definitions')))));
  return {
    element,
    async refresh() {
      const overview = lastOverview;
      const [nodes] = await Promise.all([api('GET', '/nodes')]);
      const q = overview.queue_totals || {};
      const s = overview.message_stats || {};
      messages.replaceChildren(
        stat('Ready', fmtNumber(q.messages_ready), 'messages_ready'),
        stat('Unacked', fmtNumber(q.messages_unacknowledged), 'messages_unacknowledged'),
        stat('Total', fmtNumber(q.messages), 'messages'),
        stat('Publish', fmtRate(s.publish_details), 'publish_rate'),
        stat('Deliver / get', fmtRate(s.deliver_get_details), 'deliver_rate'),
        stat('Published since start', fmtNumber(s.publish), 'publish'));
      const o = overview.object_totals || {};
      totals.replaceChildren(
        ...['connections', 'channels', 'exchanges', 'queues', 'consumers'].map((key) =>
          stat(key[0].toUpperCase() + key.slice(1), fmtNumber(o[key]), key)));
      const points = messageChartPoints(q, s);
      queued.update(points.queued);
      rates.update(points.rates);
      const n = nodes.find((entry) => entry.name === overview.node) || nodes[0] || {};
      clusterNodes.replaceChildren(...nodes.map((entry) => h('li', {'data-cluster-node': entry.name}, `${entry.name} `,
        h('span', {class: 'badge ' + (entry.running ? 'ok' : 'alarm')}, entry.running ? 'running' : 'not running'))));
      const fact = (term, value, id) => [h('dt', {}, term), h('dd', {'data-fact': id}, value)];
      node.replaceChildren(
        ...fact('Name', n.name, 'name'),
        ...fact('Version', `${overview.product_name} ${overview.product_version} (API of RabbitMQ ${overview.management_version})`, 'version'),
        ...fact('Uptime', fmtDuration(n.uptime), 'uptime'),
        ...fact('Memory (RSS)', fmtBytes(n.mem_used), 'memory'),
        ...fact('File descriptors', `${fmtNumber(n.fd_used)} of ${fmtNumber(n.fd_total)}`, 'fds'),
        ...fact('Disk free', `${fmtBytes(n.disk_free)} (limit ${fmtBytes(n.disk_free_limit)})`, 'disk'),
        ...fact('Disk alarm', n.disk_free_alarm
          ? h('span', {class: 'badge alarm'}, 'raised: publishers are blocked')
          : h('span', {class: 'badge ok'}, 'not raised'), 'disk_alarm'),
        ...fact('Memory high watermark', fmtBytes(n.mem_limit), 'memory_limit'),
        ...fact('Memory alarm', n.mem_alarm
          ? h('span', {class: 'badge alarm'}, 'raised: publishers are blocked')
          : h('span', {class: 'badge ok'}, 'not raised'), 'memory_alarm'),
        ...fact('Processors', fmtNumber(n.processors), 'processors'));
      listeners.replaceChildren(...(overview.listeners || []).map((l) =>
        h('li', {'data-listener': l.protocol}, `${l.protocol} on ${l.ip_address}:${l.port}`)));
    },
  };
}

async function exportDefinitions() {
  try {
    const definitions = await api('GET', '/definitions');
    const blob = new Blob([JSON.stringify(definitions, null, 2) + '\n'], {type: 'application/json'});
    const url = URL.createObjectURL(blob);
    const stamp = new Date().toISOString().slice(0, 19).replace(/[T:]/g, '-');
    const link = h('a', {href: url, download: `lepus-definitions-${stamp}.json`});
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (error) {
    notify('Export failed: ' + error.message, 'error');
  }
}

async function importDefinitions(event, input) {
  event.preventDefault();
  const file = input.files && input.files[0];
  if (!file) { notify('Choose a definitions file first.', 'error'); return; }
  try {
    const text = await file.text();
    JSON.parse(text); // a clear message for a file that is not JSON at all
    await api('POST', '/definitions', text);
    notify(`Imported definitions from ${file.name}.`);
    input.value = '';
  } catch (error) {
    notify('Import failed: ' + error.message, 'error');
  }
}

// ---------------------------------------------------------------- queues

function queuesView() {
  const table = dataTable('queues', [
    {id: 'name', title: 'Name', cell: (q) => h('a', {href: `#/queues/${enc(q.vhost)}/${enc(q.name)}`}, q.name)},
    {id: 'vhost', title: 'Vhost', cell: (q) => q.vhost},
    {id: 'features', title: 'Features', cell: (q) => flags(q)},
    {id: 'state', title: 'State', cell: (q) => q.state},
    {id: 'policy', title: 'Policy', cell: (q) => q.policy || '–'},
    {id: 'ready', title: 'Ready', num: true, cell: (q) => fmtNumber(q.messages_ready)},
    {id: 'unacked', title: 'Unacked', num: true, cell: (q) => fmtNumber(q.messages_unacknowledged)},
    {id: 'total', title: 'Total', num: true, cell: (q) => fmtNumber(q.messages)},
    {id: 'consumers', title: 'Consumers', num: true, cell: (q) => fmtNumber(q.consumers)},
    {id: 'publish_rate', title: 'Publish', num: true, cell: (q) => fmtRate((q.message_stats || {}).publish_details)},
    {id: 'deliver_rate', title: 'Deliver / get', num: true, cell: (q) => fmtRate((q.message_stats || {}).deliver_get_details)},
  ], 'No queues yet.');
  const form = h('form', {id: 'declare-queue', class: 'inline-form', onsubmit: declareQueue},
    h('label', {}, 'Vhost ', vhostSelect()),
    h('label', {}, 'Name ', h('input', {name: 'name', required: true, placeholder: 'orders'})),
    h('label', {}, h('input', {type: 'checkbox', name: 'durable', checked: true}), ' durable'),
    h('label', {}, h('input', {type: 'checkbox', name: 'auto_delete'}), ' auto-delete'),
    h('label', {class: 'wide'}, 'Arguments (JSON) ', h('input', {name: 'arguments', placeholder: '{"x-message-ttl": 60000}'})),
    h('button', {type: 'submit'}, 'Add queue'));
  const count = h('span', {class: 'muted'});
  return {
    element: h('div', {}, h('h1', {}, 'Queues ', count), section('All queues', table.element), section('Add a queue', form)),
    async refresh() {
      const queues = await api('GET', '/queues');
      count.textContent = `(${queues.length})`;
      table.update(queues, (q) => q.name);
    },
  };
}

async function declareQueue(event) {
  event.preventDefault();
  const form = event.target;
  const name = form.name.value.trim();
  try {
    const body = {durable: form.durable.checked, auto_delete: form.auto_delete.checked, arguments: parseArguments(form.arguments.value)};
    await api('PUT', `/queues/${enc(form.vhost.value)}/${enc(name)}`, body);
    notify(`Queue ${name} declared.`);
    form.name.value = '';
    refresh();
  } catch (error) {
    notify(`Declaring queue ${name} failed: ${error.message}`, 'error');
  }
}

function queueView(vhost, name) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const facts = h('dl', {class: 'facts'});
  const numbers = h('div', {class: 'stats'});
  const bindings = dataTable('bindings', [
    {id: 'source', title: 'From exchange', cell: (b) => b.source || '(AMQP default)'},
    {id: 'routing_key', title: 'Routing key', cell: (b) => b.routing_key},
    {id: 'arguments', title: 'Arguments', cell: (b) => JSON.stringify(b.arguments || {})},
  ], 'No bindings.');
  const results = h('div', {id: 'get-results'});
  const publishForm = h('form', {id: 'publish-form', class: 'stacked', onsubmit: (event) => publish(event, vhost)},
    h('label', {}, 'Routing key ', h('input', {name: 'routing_key', value: name})),
    h('label', {}, h('input', {type: 'checkbox', name: 'persistent', checked: true}), ' persistent (delivery mode 2)'),
    h('label', {}, 'Content type ', h('input', {name: 'content_type', placeholder: 'text/plain'})),
    h('label', {}, 'Headers (JSON) ', h('input', {name: 'headers', placeholder: '{"x-source": "console"}'})),
    h('label', {}, 'Payload ', h('textarea', {name: 'payload', rows: 4})),
    h('div', {}, h('button', {type: 'submit'}, 'Publish message')));
  const getForm = h('form', {id: 'get-form', class: 'stacked', onsubmit: (event) => getMessages(event, path, results)},
    h('label', {}, 'Ack mode ', h('select', {name: 'ackmode'},
      h('option', {value: 'ack_requeue_true'}, 'Nack, requeue (message stays in the queue)'),
      h('option', {value: 'ack_requeue_false'}, 'Ack (message is removed)'),
      h('option', {value: 'reject_requeue_true'}, 'Reject, requeue'),
      h('option', {value: 'reject_requeue_false'}, 'Reject, no requeue'))),
    h('label', {}, 'Encoding ', h('select', {name: 'encoding'},
      h('option', {value: 'auto'}, 'Auto: text if valid UTF-8, else base64'),
      h('option', {value: 'base64'}, 'base64'))),
    h('label', {}, 'Messages ', h('input', {name: 'count', type: 'number', min: 1, max: 10000, value: 1})),
    h('div', {}, h('button', {type: 'submit'}, 'Get messages')));
  const actions = h('div', {class: 'actions'},
    h('button', {type: 'button', id: 'purge', class: 'warn', onclick: () => purge(path, name)}, 'Purge messages'),
    h('button', {type: 'button', id: 'delete-queue', class: 'danger', onclick: () => deleteQueue(path, name)}, 'Delete queue'));
  const consumers = queueConsumersTable();
  const charts = queueCharts();
  const element = h('div', {},
    h('p', {class: 'crumbs'}, h('a', {href: '#/queues'}, 'Queues'), ' in vhost ', h('code', {}, vhost)),
    h('h1', {}, 'Queue ', h('span', {class: 'name', id: 'queue-name'}, name)),
    section('Messages', numbers, charts.element),
    section('Consumers', consumers.element),
    h('div', {class: 'columns'}, section('Details', facts), section('Bindings', bindings.element)),
    h('div', {class: 'columns'}, section('Publish a message', publishForm), section('Get messages', getForm, results)),
    section('Manage', actions));
  return {
    element,
    async refresh() {
      let queue;
      try {
        queue = await api('GET', `${path}?${CHART_RANGE}`);
      } catch (error) {
        if (error.status === 404) {
          numbers.replaceChildren(h('p', {class: 'error'}, `Queue ${name} does not exist (any more).`));
          return;
        }
        throw error;
      }
      const s = queue.message_stats || {};
      charts.update(queue);
      consumers.update(queue.consumer_details || [], (c) => `${(c.channel_details || {}).name} ${c.consumer_tag}`);
      numbers.replaceChildren(
        stat('Ready', fmtNumber(queue.messages_ready), 'messages_ready'),
        stat('Unacked', fmtNumber(queue.messages_unacknowledged), 'messages_unacknowledged'),
        stat('Total', fmtNumber(queue.messages), 'messages'),
        stat('Paged out', fmtNumber(queue.messages_paged_out), 'messages_paged_out'),
        stat('Consumers', fmtNumber(queue.consumers), 'consumers'),
        stat('Publish', fmtRate(s.publish_details), 'publish_rate'),
        stat('Deliver / get', fmtRate(s.deliver_get_details), 'deliver_rate'));
      const fact = (term, value, id) => [h('dt', {}, term), h('dd', {'data-fact': id}, value)];
      facts.replaceChildren(
        ...fact('Vhost', queue.vhost),
        ...fact('Type', queue.type),
        ...fact('State', queue.state),
        ...quorumReplicaFacts(queue),
        ...fact('Durable', queue.durable ? 'yes' : 'no'),
        ...fact('Auto-delete', queue.auto_delete ? 'yes' : 'no'),
        ...fact('Exclusive', queue.exclusive ? 'yes' : 'no'),
        ...fact('Arguments', JSON.stringify(queue.arguments || {})),
        ...fact('Policy', queue.policy ? h('a', {href: '#/policies'}, queue.policy) : 'none', 'policy'),
        ...fact('Policy settings', JSON.stringify(queue.effective_policy_definition || {}), 'effective_policy'),
        ...fact('Published', fmtNumber(s.publish)),
        ...fact('Delivered / got', fmtNumber(s.deliver_get)),
        ...fact('Acked', fmtNumber(s.ack)),
        ...fact('Redelivered', fmtNumber(s.redeliver)));
      bindings.update(await api('GET', path + '/bindings'), (b) => `${b.source} ${b.routing_key}`);
    },
  };
}

async function publish(event, vhost) {
  event.preventDefault();
  const form = event.target;
  try {
    const properties = {delivery_mode: form.persistent.checked ? 2 : 1};
    if (form.content_type.value.trim()) properties.content_type = form.content_type.value.trim();
    if (form.headers.value.trim()) properties.headers = parseArguments(form.headers.value);
    const answer = await api('POST', `/exchanges/${enc(vhost)}/amq.default/publish`, {
      routing_key: form.routing_key.value, payload: form.payload.value, payload_encoding: 'string', properties,
    });
    if (answer.routed) notify('Message published.');
    else notify('Message published but not routed: no queue is named like the routing key.', 'error');
    refresh();
  } catch (error) {
    notify('Publish failed: ' + error.message, 'error');
  }
}

async function getMessages(event, path, results) {
  event.preventDefault();
  const form = event.target;
  try {
    const messages = await api('POST', path + '/get', {
      count: Number(form.count.value) || 1, ackmode: form.ackmode.value, encoding: form.encoding.value, truncate: 50000,
    });
    if (!messages.length) {
      results.replaceChildren(h('p', {class: 'muted', 'data-empty': ''}, 'The queue is empty.'));
    } else {
      results.replaceChildren(...messages.map((message, index) => h('div', {class: 'message', 'data-message': index},
        h('dl', {class: 'facts'},
          h('dt', {}, 'Message'), h('dd', {}, `${index + 1} (${fmtNumber(message.message_count)} left in the queue)`),
          h('dt', {}, 'Exchange'), h('dd', {}, message.exchange || '(AMQP default)'),
          h('dt', {}, 'Routing key'), h('dd', {}, message.routing_key),
          h('dt', {}, 'Redelivered'), h('dd', {}, message.redelivered ? 'yes' : 'no'),
          h('dt', {}, 'Properties'), h('dd', {}, h('code', {}, JSON.stringify(message.properties || {}))),
          h('dt', {}, 'Payload'), h('dd', {}, `${fmtNumber(message.payload_bytes)} bytes, ${message.payload_encoding}`)),
        h('pre', {class: 'payload'}, message.payload))));
    }
    refresh();
  } catch (error) {
    notify('Get failed: ' + error.message, 'error');
  }
}

async function purge(path, name) {
  if (!confirm(`Purge every ready message of queue ${name}?`)) return;
  try {
    await api('DELETE', path + '/contents');
    notify(`Queue ${name} purged.`);
    refresh();
  } catch (error) {
    notify('Purge failed: ' + error.message, 'error');
  }
}

async function deleteQueue(path, name) {
  if (!confirm(`Delete queue ${name} and its messages?`)) return;
  try {
    await api('DELETE', path);
    notify(`Queue ${name} deleted.`);
    location.hash = '#/queues';
  } catch (error) {
    notify('Delete failed: ' + error.message, 'error');
  }
}

// ---------------------------------------------------------------- exchanges

function exchangesView() {
  const table = dataTable('exchanges', [
    {id: 'name', title: 'Name', cell: (e) => exchangeLink(e.vhost, e.name)},
    {id: 'vhost', title: 'Vhost', cell: (e) => e.vhost},
    {id: 'type', title: 'Type', cell: (e) => e.type},
    {id: 'features', title: 'Features', cell: (e) => flags(e)},
    {id: 'rate_in', title: 'Message rate in', num: true, cell: (e) => fmtRate((e.message_stats || {}).publish_in_details)},
    {id: 'rate_out', title: 'Message rate out', num: true, cell: (e) => fmtRate((e.message_stats || {}).publish_out_details)},
  ], 'No exchanges.');
  const form = h('form', {id: 'declare-exchange', class: 'inline-form', onsubmit: declareExchange},
    h('label', {}, 'Vhost ', vhostSelect()),
    h('label', {}, 'Name ', h('input', {name: 'name', required: true, placeholder: 'events'})),
    h('label', {}, 'Type ', h('select', {name: 'type'}, ['direct', 'fanout', 'topic', 'headers'].map((type) => h('option', {value: type}, type)))),
    h('label', {}, h('input', {type: 'checkbox', name: 'durable', checked: true}), ' durable'),
    h('label', {}, h('input', {type: 'checkbox', name: 'auto_delete'}), ' auto-delete'),
    h('label', {}, h('input', {type: 'checkbox', name: 'internal'}), ' internal'),
    h('button', {type: 'submit'}, 'Add exchange'));
  return {
    element: h('div', {}, h('h1', {}, 'Exchanges'), section('All exchanges', table.element), section('Add an exchange', form)),
    async refresh() {
      table.update(await api('GET', '/exchanges'), (e) => e.name);
    },
  };
}

async function declareExchange(event) {
  event.preventDefault();
  const form = event.target;
  const name = form.name.value.trim();
  try {
    const body = {type: form.type.value, durable: form.durable.checked, auto_delete: form.auto_delete.checked, internal: form.internal.checked, arguments: {}};
    await api('PUT', `/exchanges/${enc(form.vhost.value)}/${enc(name)}`, body);
    notify(`Exchange ${name} declared.`);
    form.name.value = '';
    refresh();
  } catch (error) {
    notify(`Declaring exchange ${name} failed: ${error.message}`, 'error');
  }
}

// ---------------------------------------------------------------- connections and channels

function connectionsView() {
  const table = dataTable('connections', [
    {id: 'name', title: 'Name', cell: (c) => connectionLink(c.name)},
    {id: 'user', title: 'User', cell: (c) => c.user},
    {id: 'vhost', title: 'Vhost', cell: (c) => c.vhost},
    {id: 'protocol', title: 'Protocol', cell: (c) => c.protocol},
    {id: 'tls', title: 'TLS', cell: connectionTls},
    {id: 'client', title: 'Client', cell: (c) => [(c.client_properties || {}).product, (c.client_properties || {}).version].filter(Boolean).join(' ') || '–'},
    {id: 'state', title: 'State', cell: (c) => h('span', {class: 'badge ' + (c.state === 'running' ? 'ok' : 'alarm')}, c.state)},
    {id: 'channels', title: 'Channels', num: true, cell: (c) => fmtNumber(c.channels)},
    {id: 'from_client', title: 'From client', num: true, cell: (c) => fmtByteRate(c.recv_oct_details)},
    {id: 'to_client', title: 'To client', num: true, cell: (c) => fmtByteRate(c.send_oct_details)},
    {id: 'heartbeat', title: 'Heartbeat', num: true, cell: (c) => (c.timeout ? `${c.timeout}s` : 'off')},
    {id: 'connected_at', title: 'Connected at', cell: (c) => fmtTime(c.connected_at)},
    {id: 'close', title: '', cell: (c) => h('button', {type: 'button', class: 'danger small', 'data-close': c.name, onclick: () => closeConnection(c.name)}, 'Close')},
  ], 'No open connections.');
  return {
    element: h('div', {}, h('h1', {}, 'Connections'), section('Open connections', table.element)),
    async refresh() {
      table.update(await api('GET', '/connections'), (c) => c.name);
    },
  };
}

async function closeConnection(name) {
  if (!confirm(`Close connection ${name}? The client gets 320 CONNECTION_FORCED.`)) return;
  try {
    await api('DELETE', `/connections/${enc(name)}`, undefined, {'X-Reason': `Closed from the web console by ${sessionUser}`});
    notify(`Connection ${name} closed.`);
    refresh();
  } catch (error) {
    notify('Close failed: ' + error.message, 'error');
  }
}

function channelsView() {
  const table = dataTable('channels', [
    {id: 'name', title: 'Channel', cell: (c) => channelLink(c.name)},
    {id: 'number', title: 'Number', num: true, cell: (c) => c.number},
    {id: 'connection', title: 'Connection', cell: (c) => connectionLink((c.connection_details || {}).name)},
    {id: 'user', title: 'User', cell: (c) => c.user},
    {id: 'vhost', title: 'Vhost', cell: (c) => c.vhost},
    {id: 'mode', title: 'Mode', cell: channelMode},
    {id: 'state', title: 'State', cell: (c) => h('span', {class: 'badge ' + (c.state === 'running' ? 'ok' : 'alarm')}, c.state)},
    {id: 'prefetch', title: 'Prefetch', num: true, cell: channelPrefetch},
    {id: 'consumers', title: 'Consumers', num: true, cell: (c) => fmtNumber(c.consumer_count)},
    {id: 'unacked', title: 'Unacked', num: true, cell: (c) => fmtNumber(c.messages_unacknowledged)},
    {id: 'unconfirmed', title: 'Unconfirmed', num: true, cell: (c) => fmtNumber(c.messages_unconfirmed)},
  ], 'No open channels.');
  const count = h('span', {class: 'muted'});
  return {
    element: h('div', {}, h('h1', {}, 'Channels ', count),
      section('Open channels', table.element,
        h('p', {class: 'muted small'}, 'Mode: C = publisher confirms, T = transactional. Prefetch: per consumer, ',
          'with the channel-wide (global) limit after it when one is set; 0 is unlimited.'))),
    async refresh() {
      const channels = await api('GET', '/channels');
      count.textContent = `(${channels.length})`;
      table.update(channels, (c) => c.name);
    },
  };
}

function channelMode(channel) {
  const modes = [];
  if (channel.confirm) modes.push(h('abbr', {class: 'flag', title: 'publisher confirms'}, 'C'));
  if (channel.transactional) modes.push(h('abbr', {class: 'flag', title: 'transactional'}, 'T'));
  return modes.length ? modes : '–';
}

function channelPrefetch(channel) {
  const global = channel.global_prefetch_count;
  return fmtNumber(channel.prefetch_count) + (global ? ` (global ${fmtNumber(global)})` : '');
}

// ---------------------------------------------------------------- users and permissions

function adminView() {
  const userSelect = h('select', {name: 'user', required: true});
  const userForm = userFormElement();
  const permissionForm = permissionFormElement(userSelect);
  const users = dataTable('users', [
    {id: 'name', title: 'Name', cell: (u) => u.name},
    {id: 'tags', title: 'Tags', cell: (u) => tagList(u.tags)},
    {id: 'hashing', title: 'Password hashing', cell: (u) => u.hashing_algorithm},
    {id: 'actions', title: '', cell: (u) => rowActions(
      rowButton('Edit', 'secondary', {'data-edit-user': u.name}, () => editUser(userForm, u)),
      rowButton('Delete', 'danger', {'data-delete-user': u.name}, () => deleteUser(u.name)))},
  ], 'No users.');
  const permissions = dataTable('permissions', [
    {id: 'user', title: 'User', cell: (p) => p.user},
    {id: 'vhost', title: 'Vhost', cell: (p) => p.vhost},
    {id: 'configure', title: 'Configure', cell: (p) => h('code', {}, p.configure)},
    {id: 'write', title: 'Write', cell: (p) => h('code', {}, p.write)},
    {id: 'read', title: 'Read', cell: (p) => h('code', {}, p.read)},
    {id: 'actions', title: '', cell: (p) => rowActions(
      rowButton('Edit', 'secondary', {'data-edit-permission': `${p.user} ${p.vhost}`}, () => editPermission(permissionForm, p)),
      rowButton('Delete', 'danger', {'data-delete-permission': `${p.user} ${p.vhost}`}, () => deletePermission(p)))},
  ], 'No permissions.');
  return {
    element: h('div', {}, h('h1', {}, 'Users and permissions'),
      h('div', {class: 'columns'},
        section('Users', users.element, h('h3', {}, 'Add or update a user'), userForm),
        section('Permissions', permissions.element, h('h3', {}, 'Set a permission'), permissionForm))),
    async refresh() {
      const [userList, permissionList] = await Promise.all([api('GET', '/users'), api('GET', '/permissions')]);
      users.update(userList, (u) => u.name);
      permissions.update(permissionList, (p) => `${p.user} ${p.vhost}`);
      fillSelect(userSelect, userList.map((u) => u.name));
    },
  };
}

function userFormElement() {
  return h('form', {id: 'user-form', class: 'stacked', onsubmit: (event) => submitForm(event, (f) => `Saving user ${f.name.value.trim()}`, saveUser)},
    h('label', {}, 'Name ', h('input', {name: 'name', required: true, autocomplete: 'off', placeholder: 'orders-service'})),
    h('label', {}, 'Password ', h('input', {name: 'password', type: 'password', autocomplete: 'new-password',
      placeholder: 'empty: keep the current password'})),
    h('label', {}, 'Tags (comma-separated) ', h('input', {name: 'tags', autocomplete: 'off', placeholder: 'management'})),
    h('p', {class: 'muted small'}, 'Tags: administrator (everything), policymaker (policies), monitoring, management ',
      '(this console and the API). A user without tags can use AMQP only.'),
    formError(),
    h('div', {}, h('button', {type: 'submit'}, 'Save user')));
}

async function saveUser(form) {
  const name = form.name.value.trim();
  const password = form.password.value;
  const body = {tags: form.tags.value.split(',').map((tag) => tag.trim()).filter(Boolean).join(',')};
  if (password) {
    body.password = password;
  } else {
    // The API takes a password or its hash: an update without a new password keeps the hash.
    const existing = await api('GET', `/users/${enc(name)}`).catch((error) => {
      if (error.status === 404) throw new Error('a new user needs a password');
      throw error;
    });
    body.password_hash = existing.password_hash;
    body.hashing_algorithm = existing.hashing_algorithm;
  }
  await api('PUT', `/users/${enc(name)}`, body);
  // Changing one's own password: the console goes on with the new one.
  if (password && name === sessionUser) sessionStorage.setItem(AUTH_KEY, login(name, password));
  form.password.value = '';
  return `User ${name} saved.`;
}

function editUser(form, user) {
  form.name.value = user.name;
  form.tags.value = tagList(user.tags);
  form.password.value = '';
  form.password.focus();
}

function deleteUser(name) {
  const self = name === sessionUser ? ' You are logged in as this user: the console will log you out.' : '';
  return confirmThen(`Delete user ${name} and its permissions?${self}`,
    () => api('DELETE', `/users/${enc(name)}`), `User ${name} deleted.`, `Deleting user ${name}`);
}

function permissionFormElement(userSelect) {
  const what = (f) => `Setting the permission of ${f.user.value} in vhost ${f.vhost.value}`;
  return h('form', {id: 'permission-form', class: 'stacked', onsubmit: (event) => submitForm(event, what, savePermission)},
    h('div', {class: 'row'}, h('label', {}, 'User ', userSelect), h('label', {}, 'Vhost ', vhostSelect())),
    h('label', {}, 'Configure ', h('input', {name: 'configure', value: '.*', autocomplete: 'off'})),
    h('label', {}, 'Write ', h('input', {name: 'write', value: '.*', autocomplete: 'off'})),
    h('label', {}, 'Read ', h('input', {name: 'read', value: '.*', autocomplete: 'off'})),
    h('p', {class: 'muted small'}, 'Regular expressions over the names of queues and exchanges the user may ',
      'configure (declare, delete), write (publish, bind) and read (consume, get). Empty allows nothing.'),
    formError(),
    h('div', {}, h('button', {type: 'submit'}, 'Set permission')));
}

async function savePermission(form) {
  const [user, vhost] = [form.user.value, form.vhost.value];
  const body = {configure: form.configure.value, write: form.write.value, read: form.read.value};
  await api('PUT', `/permissions/${enc(vhost)}/${enc(user)}`, body);
  return `Permission of ${user} in vhost ${vhost} set.`;
}

function editPermission(form, permission) {
  form.user.value = permission.user;
  form.vhost.value = permission.vhost;
  for (const key of ['configure', 'write', 'read']) form[key].value = permission[key];
  form.configure.focus();
}

function deletePermission({user, vhost}) {
  return confirmThen(`Delete the permission of ${user} in vhost ${vhost}?`,
    () => api('DELETE', `/permissions/${enc(vhost)}/${enc(user)}`),
    `Permission of ${user} in vhost ${vhost} deleted.`, `Deleting the permission of ${user} in vhost ${vhost}`);
}

// ---------------------------------------------------------------- vhosts

function vhostsView() {
  const table = dataTable('vhosts', [
    {id: 'name', title: 'Name', cell: (v) => v.name},
    {id: 'description', title: 'Description', cell: (v) => v.description || ''},
    {id: 'tags', title: 'Tags', cell: (v) => tagList(v.tags)},
    {id: 'ready', title: 'Ready', num: true, cell: (v) => fmtNumber(v.messages_ready)},
    {id: 'unacked', title: 'Unacked', num: true, cell: (v) => fmtNumber(v.messages_unacknowledged)},
    {id: 'messages', title: 'Messages', num: true, cell: (v) => fmtNumber(v.messages)},
    {id: 'actions', title: '', cell: (v) => rowActions(
      rowButton('Delete', 'danger', {'data-delete-vhost': v.name}, () => deleteVhost(v.name)))},
  ], 'No vhosts.');
  const form = h('form', {id: 'vhost-form', class: 'inline-form', onsubmit: (event) => submitForm(event, (f) => `Saving vhost ${f.name.value.trim()}`, saveVhost)},
    h('label', {}, 'Name ', h('input', {name: 'name', required: true, autocomplete: 'off', placeholder: 'staging'})),
    h('label', {class: 'wide'}, 'Description ', h('input', {name: 'description', autocomplete: 'off'})),
    h('label', {}, 'Tags ', h('input', {name: 'tags', autocomplete: 'off', placeholder: 'a, b'})),
    h('button', {type: 'submit'}, 'Add vhost'),
    formError());
  return {
    element: h('div', {}, h('h1', {}, 'Virtual hosts'), section('All vhosts', table.element),
      section('Add or update a vhost', form,
        h('p', {class: 'muted small'}, 'You get full permissions in a vhost you create; give other users theirs on the Users page.'))),
    async refresh() {
      table.update(await api('GET', '/vhosts'), (v) => v.name);
    },
  };
}

async function saveVhost(form) {
  const name = form.name.value.trim();
  const body = {description: form.description.value, tags: form.tags.value.split(',').map((tag) => tag.trim()).filter(Boolean).join(',')};
  await api('PUT', `/vhosts/${enc(name)}`, body);
  form.name.value = '';
  return `Vhost ${name} saved.`;
}

function deleteVhost(name) {
  return confirmThen(`Delete vhost ${name}? This deletes every queue in it with its messages, its exchanges, `
    + 'permissions and policies, and closes its connections. It cannot be undone.',
  () => api('DELETE', `/vhosts/${enc(name)}`), `Vhost ${name} deleted.`, `Deleting vhost ${name}`);
}

// ---------------------------------------------------------------- policies

function policiesView() {
  const form = policyFormElement();
  const table = dataTable('policies', [
    {id: 'vhost', title: 'Vhost', cell: (p) => p.vhost},
    {id: 'name', title: 'Name', cell: (p) => p.name},
    {id: 'pattern', title: 'Pattern', cell: (p) => h('code', {}, p.pattern)},
    {id: 'apply_to', title: 'Apply to', cell: (p) => p['apply-to']},
    {id: 'priority', title: 'Priority', num: true, cell: (p) => p.priority},
    {id: 'definition', title: 'Definition', cell: (p) => h('code', {}, JSON.stringify(p.definition))},
    {id: 'actions', title: '', cell: (p) => rowActions(
      rowButton('Edit', 'secondary', {'data-edit-policy': `${p.vhost} ${p.name}`}, () => editPolicy(form, p)),
      rowButton('Delete', 'danger', {'data-delete-policy': `${p.vhost} ${p.name}`}, () => deletePolicy(p)))},
  ], 'No policies.');
  return {
    element: h('div', {}, h('h1', {}, 'Policies'), section('All policies', table.element),
      section('Add or update a policy', form)),
    async refresh() {
      table.update(await api('GET', '/policies'), (p) => `${p.vhost} ${p.name}`);
    },
  };
}

function policyFormElement() {
  return h('form', {id: 'policy-form', class: 'stacked narrow', onsubmit: (event) => submitForm(event, (f) => `Saving policy ${f.name.value.trim()}`, savePolicy)},
    h('div', {class: 'row'},
      h('label', {}, 'Vhost ', vhostSelect()),
      h('label', {}, 'Name ', h('input', {name: 'name', required: true, autocomplete: 'off', placeholder: 'orders-limit'}))),
    h('label', {}, 'Pattern (regular expression over names) ', h('input', {name: 'pattern', required: true, autocomplete: 'off', placeholder: '^orders'})),
    h('div', {class: 'row'},
      h('label', {}, 'Apply to ', h('select', {name: 'apply_to'},
        h('option', {value: 'queues'}, 'queues'), h('option', {value: 'exchanges'}, 'exchanges'), h('option', {value: 'all'}, 'all'))),
      h('label', {}, 'Priority ', h('input', {name: 'priority', type: 'number', step: 1, value: 0}))),
    h('label', {}, 'Definition (JSON object) ', h('textarea', {name: 'definition', rows: 4, required: true,
      placeholder: '{"max-length": 1000, "overflow": "reject-publish", "message-ttl": 60000}'})),
    h('p', {class: 'muted small'}, 'Lepus applies max-length, overflow (drop-head, reject-publish), message-ttl (ms) and ',
      'queue-mode, and refuses the settings it does not implement. Of the policies that match a queue, the one of ',
      'highest priority applies.'),
    formError(),
    h('div', {}, h('button', {type: 'submit'}, 'Save policy')));
}

async function savePolicy(form) {
  const definition = parseJsonObject(form.definition.value, 'the definition');
  const [vhost, name] = [form.vhost.value, form.name.value.trim()];
  const body = {pattern: form.pattern.value, definition, priority: Number(form.priority.value) || 0, 'apply-to': form.apply_to.value};
  await api('PUT', `/policies/${enc(vhost)}/${enc(name)}`, body);
  return `Policy ${name} saved in vhost ${vhost}.`;
}

function editPolicy(form, policy) {
  form.vhost.value = policy.vhost;
  form.name.value = policy.name;
  form.pattern.value = policy.pattern;
  form.apply_to.value = policy['apply-to'];
  form.priority.value = policy.priority;
  form.definition.value = JSON.stringify(policy.definition, null, 2);
  form.pattern.focus();
}

function deletePolicy({vhost, name}) {
  return confirmThen(`Delete policy ${name} of vhost ${vhost}? The queues it applies to lose its settings.`,
    () => api('DELETE', `/policies/${enc(vhost)}/${enc(name)}`), `Policy ${name} deleted.`, `Deleting policy ${name}`);
}

const views = {
  overview: overviewView,
  queues: queuesView,
  exchanges: exchangesView,
  connections: connectionsView,
  channels: channelsView,
  admin: adminView,
  vhosts: vhostsView,
  policies: policiesView,
};

// ---------------------------------------------------------------- start

document.addEventListener('DOMContentLoaded', () => {
  $('#login-form').addEventListener('submit', onLogin);
  $('#logout').addEventListener('click', () => logout());
  window.addEventListener('hashchange', () => { if (credentials()) route(); });
  window.addEventListener('resize', () => { if (currentView && currentView.element.isConnected) currentView.refresh().catch(() => {}); });
  if (!credentials()) { logout(); return; }
  api('GET', '/whoami').then((me) => startSession(me.name)).catch((error) => {
    if (error.status !== 401) logout('Cannot reach the management API: ' + error.message);
  });
});
