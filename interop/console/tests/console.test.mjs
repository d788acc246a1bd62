// The Lepus web console in a real headless Chromium against a real broker (no mocks): what the
// pages show is compared with what the management API answers, and what the pages do is checked
// through the API and an AMQP client (amqplib). Run through ../run.sh.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {chromium} from 'playwright-core';
import amqp from 'amqplib';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SCREENSHOTS = path.join(HERE, '..', 'screenshots');
const WAIT_MS = 15000; // every wait is bounded by this
const REFRESH_MS = 1000; // the console's refresh period in these tests (?refresh=)

let broker; // {process, amqpPort, httpPort, dataDir, log}
let context; // the browser context (fresh user-data-dir)
let page;
const cleanups = [];

// ------------------------------------------------------------------ helpers

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const {port} = server.address();
      server.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` (sync or async; truthy ends) until WAIT_MS; fails with `what` and the last value. */
async function waitFor(what, check, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last})`);
    await sleep(100);
  }
}

const AUTH = 'Basic ' + Buffer.from('guest:guest').toString('base64');

/** The management API as a test client: {status, body}. */
async function api(method, apiPath, body) {
  const response = await fetch(`http://127.0.0.1:${broker.httpPort}/api${apiPath}`, {
    method,
    headers: {Authorization: AUTH, 'Content-Type': 'application/json'},
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10000),
  });
  const text = await response.text();
  return {status: response.status, body: text ? JSON.parse(text) : null};
}

async function apiQueue(name) {
  const answer = await api('GET', `/queues/%2F/${encodeURIComponent(name)}`);
  return answer.status === 200 ? answer.body : null;
}

async function amqpConnect() {
  const connection = await amqp.connect(`amqp://guest:guest@127.0.0.1:${broker.amqpPort}/`, {timeout: 10000});
  connection.on('error', () => {}); // a forced close is expected in one test
  cleanups.push(() => connection.close().catch(() => {}));
  return connection;
}

function unique(prefix) {
  return `${prefix}-${Math.random().toString(16).slice(2, 10)}`;
}

async function shot(name) {
  // Notices from earlier steps would cover the page: the screenshot shows the page itself.
  await page.evaluate(() => document.querySelectorAll('#flash .notice').forEach((notice) => notice.remove()));
  await page.screenshot({path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true});
}

/** Opens a console route and waits for its first data refresh. */
async function open(hash) {
  await page.evaluate(() => { delete document.body.dataset.loaded; });
  await page.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=${REFRESH_MS}${hash}`);
  await page.waitForSelector('body[data-loaded]', {timeout: WAIT_MS});
}

/** The text of one cell of a console table row. */
async function cell(table, row, column) {
  const locator = page.locator(`table[data-table="${table}"] tr[data-row="${row}"] td[data-col="${column}"]`);
  // allTextContents does not wait: a row that is (or just went) missing reads as null.
  const texts = await locator.allTextContents();
  return texts.length ? texts[0].trim() : null;
}

// ------------------------------------------------------------------ broker and browser

before(async () => {
  const binary = process.env.LEPUS_BIN;
  assert.ok(binary, 'LEPUS_BIN must be set (run.sh skips without it)');
  fs.mkdirSync(SCREENSHOTS, {recursive: true});
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lepus-console-'));
  const [amqpPort, httpPort] = [await freePort(), await freePort()];
  const log = fs.openSync(path.join(dataDir, '..', `${path.basename(dataDir)}.log`), 'w');
  const child = spawn(binary, ['server', '--data-dir', path.join(dataDir, 'data'), '--amqp-port', String(amqpPort),
    '--http-port', String(httpPort), '--metrics-port', '0', '--bind', '127.0.0.1'], {stdio: ['ignore', log, log]});
  broker = {process: child, amqpPort, httpPort, dataDir};
  await waitFor('the broker to serve its HTTP API', async () => {
    if (child.exitCode !== null) throw new Error(`lepus exited with ${child.exitCode}`);
    return (await api('GET', '/overview')).status === 200;
  });

  context = await chromium.launchPersistentContext(path.join(dataDir, 'chromium-profile'), {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: {width: 1360, height: 900},
    acceptDownloads: true,
    timeout: 30000,
  });
  context.setDefaultTimeout(WAIT_MS);
  page = context.pages()[0] || await context.newPage();
  page.on('dialog', (dialog) => dialog.accept()); // the console confirms purge, delete and close
  page.on('pageerror', (error) => { console.error('page error:', error); pageErrors.push(error); });
});

const pageErrors = [];

after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  if (context) await context.close().catch(() => {});
  if (broker) {
    broker.process.kill('SIGTERM');
    await Promise.race([new Promise((resolve) => broker.process.once('exit', resolve)), sleep(10000)]);
    if (broker.process.exitCode === null) broker.process.kill('SIGKILL');
    fs.rmSync(broker.dataDir, {recursive: true, force: true});
  }
});

// ------------------------------------------------------------------ tests (in order, one page)

test('the console asks for a login and refuses a wrong password', async () => {
  await page.goto(`http://127.0.0.1:${broker.httpPort}/`);
  await page.waitForSelector('#login-form', {state: 'visible'});
  assert.equal(await page.locator('#nav').isVisible(), false);
  await page.fill('#login-form [name=user]', 'guest');
  await page.fill('#login-form [name=password]', 'wrong');
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#login-error:not([hidden])');
  assert.match(await page.textContent('#login-error'), /Login failed/);
  await shot('login');
});

test('logging in shows the overview with totals, node and disk alarm state', async () => {
  await page.fill('#login-form [name=password]', 'guest');
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#nav', {state: 'visible'});
  assert.equal((await page.textContent('#user')).trim(), 'guest');
  await page.waitForSelector('[data-fact="disk_alarm"]');
  assert.match(await page.textContent('[data-fact="disk_alarm"]'), /not raised/);
  assert.equal((await page.textContent('#alarm')).trim(), 'disk ok');
  const overview = (await api('GET', '/overview')).body;
  assert.equal((await page.textContent('[data-fact="name"]')).trim(), overview.node);
  assert.equal((await page.textContent('[data-stat="exchanges"]')).trim(), String(overview.object_totals.exchanges));
  // A reload keeps the session (sessionStorage), and asks for no password.
  await page.reload();
  await page.waitForSelector('#nav', {state: 'visible'});
  assert.equal(await page.locator('#login').isVisible(), false);
});

test('the queue list shows the numbers the API answers for a queue used over AMQP', async () => {
  const queue = unique('amqp');
  const connection = await amqpConnect();
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(queue, {durable: true});
  for (let i = 0; i < 7; i++) channel.sendToQueue(queue, Buffer.from(`message ${i}`), {persistent: true});
  await channel.waitForConfirms();
  const consumer = await connection.createChannel();
  await consumer.prefetch(2);
  await consumer.consume(queue, () => {}, {noAck: false}); // holds two unacked
  const expected = await waitFor('the API to count 5 ready and 2 unacked', async () => {
    const q = await apiQueue(queue);
    return q && q.messages_ready === 5 && q.messages_unacknowledged === 2 && q.consumers === 1 ? q : null;
  });
  await open('#/queues');
  await waitFor('the queue row to show the API numbers', async () =>
    (await cell('queues', queue, 'ready')) === String(expected.messages_ready) &&
    (await cell('queues', queue, 'unacked')) === String(expected.messages_unacknowledged) &&
    (await cell('queues', queue, 'total')) === String(expected.messages) &&
    (await cell('queues', queue, 'consumers')) === String(expected.consumers));
  assert.equal(await cell('queues', queue, 'name'), queue);
  assert.match(await cell('queues', queue, 'features'), /D/);
  // The overview totals agree as well, and the charts are drawn.
  await open('#/overview');
  const overview = (await api('GET', '/overview')).body;
  await waitFor('overview totals', async () =>
    (await page.textContent('[data-stat="messages_ready"]')).trim() === String(overview.queue_totals.messages_ready) &&
    (await page.textContent('[data-stat="messages_unacknowledged"]')).trim() === String(overview.queue_totals.messages_unacknowledged) &&
    (await page.textContent('[data-stat="queues"]')).trim() === String(overview.object_totals.queues) &&
    (await page.textContent('[data-stat="connections"]')).trim() === String(overview.object_totals.connections));
  // Let a few samples accumulate (the broker's rates need two 5 s samples) for the screenshot.
  for (let i = 0; i < 6; i++) {
    channel.sendToQueue(queue, Buffer.from('more'), {persistent: true});
    await sleep(1000);
  }
  await channel.waitForConfirms();
  await sleep(1500);
  const painted = await page.evaluate(() => {
    const canvas = document.querySelector('canvas.chart');
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let coloured = 0;
    for (let i = 0; i < pixels.length; i += 4) if (pixels[i + 3] > 0) coloured++;
    return coloured;
  });
  assert.ok(painted > 500, `the queued-messages chart has ${painted} painted pixels`);
  await shot('overview');
  await open('#/queues');
  await shot('queues');
});

test('the queue page publishes a message and gets it back', async () => {
  const queue = unique('page');
  assert.equal((await api('PUT', `/queues/%2F/${queue}`, {durable: true})).status, 201);
  await open(`#/queues/%2F/${queue}`);
  assert.equal((await page.textContent('#queue-name')).trim(), queue);
  const payload = 'hello from the console <b>not bold</b> ünïcödé';
  await page.fill('#publish-form [name=payload]', payload);
  await page.fill('#publish-form [name=headers]', '{"x-test": "yes"}');
  await page.click('#publish-form button[type=submit]');
  await page.waitForSelector('.notice[data-kind="ok"]:has-text("Message published.")');
  await waitFor('the API to count the message', async () => (await apiQueue(queue)).messages_ready === 1);
  await waitFor('the page to count the message', async () =>
    (await page.textContent('[data-stat="messages_ready"]')).trim() === '1');

  await page.selectOption('#get-form [name=ackmode]', 'ack_requeue_false');
  await page.click('#get-form button[type=submit]');
  await page.waitForSelector('#get-results .message');
  assert.equal(await page.textContent('#get-results pre.payload'), payload);
  assert.match(await page.textContent('#get-results .message'), /"x-test":"yes"/);
  assert.match(await page.textContent('#get-results .message'), /"delivery_mode":2/);
  await waitFor('the API to see the queue empty', async () => (await apiQueue(queue)).messages === 0);
  await shot('queue-page');

  await page.click('#get-form button[type=submit]');
  await page.waitForSelector('#get-results [data-empty]');
});

test('purge and delete from the queue page', async () => {
  const queue = unique('purge');
  assert.equal((await api('PUT', `/queues/%2F/${queue}`, {durable: false})).status, 201);
  for (let i = 0; i < 3; i++) {
    const answer = await api('POST', '/exchanges/%2F/amq.default/publish',
      {routing_key: queue, payload: `m${i}`, payload_encoding: 'string', properties: {}});
    assert.equal(answer.body.routed, true);
  }
  await open(`#/queues/%2F/${queue}`);
  await waitFor('the page to show 3 ready', async () =>
    (await page.textContent('[data-stat="messages_ready"]')).trim() === '3');
  await page.click('#purge');
  await waitFor('the API to see the queue purged', async () => (await apiQueue(queue)).messages === 0);
  await waitFor('the page to show 0 ready', async () =>
    (await page.textContent('[data-stat="messages_ready"]')).trim() === '0');

  await page.click('#delete-queue');
  await waitFor('the API to see the queue deleted', async () => (await apiQueue(queue)) === null);
  await page.waitForFunction(() => location.hash === '#/queues');
});

test('a queue and an exchange declared from the console exist in the API', async () => {
  const queue = unique('console-q');
  await open('#/queues');
  await page.fill('#declare-queue [name=name]', queue);
  await page.uncheck('#declare-queue [name=durable]');
  await page.fill('#declare-queue [name=arguments]', '{"x-max-length": 10}');
  await page.click('#declare-queue button[type=submit]');
  const declared = await waitFor('the API to see the queue', () => apiQueue(queue));
  assert.equal(declared.durable, false);
  assert.equal(declared.arguments['x-max-length'], 10);
  await waitFor('the list to show the queue', async () => (await cell('queues', queue, 'name')) === queue);

  const exchange = unique('console-x');
  await open('#/exchanges');
  await page.fill('#declare-exchange [name=name]', exchange);
  await page.selectOption('#declare-exchange [name=type]', 'topic');
  await page.click('#declare-exchange button[type=submit]');
  const answer = await waitFor('the API to see the exchange', async () => {
    const got = await api('GET', `/exchanges/%2F/${exchange}`);
    return got.status === 200 ? got.body : null;
  });
  assert.equal(answer.type, 'topic');
  assert.equal(answer.durable, true);
  await waitFor('the list to show the exchange', async () => (await cell('exchanges', exchange, 'type')) === 'topic');
  await shot('exchanges');
});

test('closing a connection from the console closes the client', async () => {
  const connection = await amqpConnect();
  const channel = await connection.createChannel();
  await channel.assertQueue('', {exclusive: true});
  channel.on('error', () => {});
  const closed = new Promise((resolve) => connection.once('close', resolve));
  const localPort = connection.connection.stream.localPort;
  const name = await waitFor('the API to list the connection', async () => {
    const list = (await api('GET', '/connections')).body;
    const found = list.find((c) => c.peer_port === localPort);
    return found && found.name;
  });
  await open('#/connections');
  await waitFor('the connection row', async () => (await cell('connections', name, 'user')) === 'guest');
  assert.equal(await cell('connections', name, 'channels'), '1');
  await shot('connections');
  await open('#/channels');
  await waitFor('its channel row', async () => (await cell('channels', `${name} (1)`, 'connection')) === name);
  await shot('channels');

  await open('#/connections');
  await page.click(`button[data-close="${name}"]`);
  const error = await Promise.race([closed, sleep(WAIT_MS).then(() => 'timeout')]);
  assert.notEqual(error, 'timeout', 'the client saw no close');
  assert.match(String(error && error.message), /320|CONNECTION_FORCED|web console/);
  await waitFor('the API to drop the connection', async () =>
    !(await api('GET', '/connections')).body.some((c) => c.name === name));
  await waitFor('the page to drop the row', async () => (await cell('connections', name, 'user')) === null);
});

test('definitions download and upload', async () => {
  const queue = unique('defs');
  assert.equal((await api('PUT', `/queues/%2F/${queue}`, {durable: true})).status, 201);
  await open('#/overview');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export-definitions')]);
  assert.match(download.suggestedFilename(), /^lepus-definitions-.*\.json$/);
  const file = path.join(broker.dataDir, 'exported.json');
  await download.saveAs(file);
  const exported = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.ok(exported.queues.some((q) => q.name === queue), 'the export lists the queue');
  assert.ok(Array.isArray(exported.exchanges) && Array.isArray(exported.bindings));

  const imported = unique('imported');
  const upload = path.join(broker.dataDir, 'import.json');
  fs.writeFileSync(upload, JSON.stringify({
    queues: [{name: imported, vhost: '/', durable: true, auto_delete: false, arguments: {}}],
    exchanges: [{name: `${imported}-x`, vhost: '/', type: 'fanout', durable: true, auto_delete: false, internal: false, arguments: {}}],
    bindings: [{source: `${imported}-x`, vhost: '/', destination: imported, destination_type: 'queue', routing_key: '', arguments: {}}],
  }));
  await page.setInputFiles('#import-form input[type=file]', upload);
  await page.click('#import-form button[type=submit]');
  await page.waitForSelector('.notice[data-kind="ok"]:has-text("Imported definitions")');
  assert.ok(await apiQueue(imported), 'the imported queue exists');
  const bindings = (await api('GET', `/queues/%2F/${imported}/bindings`)).body;
  assert.ok(bindings.some((b) => b.source === `${imported}-x`), 'the imported binding exists');

  // A file that is not definitions is refused with the API's reason, and nothing changes.
  fs.writeFileSync(upload, 'not json');
  await page.setInputFiles('#import-form input[type=file]', upload);
  await page.click('#import-form button[type=submit]');
  await page.waitForSelector('.notice[data-kind="error"]:has-text("Import failed")');
});

test('users and permissions are listed as the API lists them', async () => {
  await open('#/admin');
  const users = (await api('GET', '/users')).body;
  const permissions = (await api('GET', '/permissions')).body;
  for (const user of users) {
    assert.equal(await cell('users', user.name, 'name'), user.name);
    assert.equal(await cell('users', user.name, 'tags'), user.tags.join(', '));
  }
  for (const permission of permissions) {
    const row = `${permission.user} ${permission.vhost}`;
    assert.equal(await cell('permissions', row, 'configure'), permission.configure);
    assert.equal(await cell('permissions', row, 'read'), permission.read);
  }
  await shot('users');
});

test('logging out forgets the credentials; the page had no script errors', async () => {
  await page.click('#logout');
  await page.waitForSelector('#login-form', {state: 'visible'});
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.reload();
  await page.waitForSelector('#login-form', {state: 'visible'});
  assert.deepEqual(pageErrors, []);
});
