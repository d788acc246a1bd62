// The console suites' shared harness: one Lepus broker (LEPUS_BIN, free ports, its own data
// directory) and one headless Chromium page per test file, with the helpers both files use. Each
// test file calls useBrokerAndBrowser() once; node --test runs every file in its own process.
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

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const SCREENSHOTS = path.join(HERE, '..', 'screenshots');
export const WAIT_MS = 15000; // every wait is bounded by this
export const REFRESH_MS = 1000; // the console's refresh period in these tests (?refresh=)

export let broker; // {process, amqpPort, httpPort, dataDir, log}
export let context; // the browser context (fresh user-data-dir)
export let page;
export const cleanups = [];

// ------------------------------------------------------------------ helpers

// Ports come from 10000-29999, below the kernel's ephemeral range (32768 and up): a port the
// kernel handed out for a moment could be taken by another test's outgoing connection before the
// broker binds it (CI runs the RabbitMQ reference suites beside this one: seen as "cannot listen
// on 127.0.0.1:44129 for the RabbitMQ Stream protocol").
// INTEROP_PORTS=FIRST-LAST takes every port from that range instead (a machine shared with other
// runs), the cluster file's too.
const CONFIGURED_PORTS = (process.env.INTEROP_PORTS || '').match(/^(\d+)-(\d+)$/);
const PORT_FIRST = CONFIGURED_PORTS ? Number(CONFIGURED_PORTS[1]) : 10000;
const PORT_COUNT = CONFIGURED_PORTS ? Number(CONFIGURED_PORTS[2]) - PORT_FIRST + 1 : 20000;
const PORT_ATTEMPTS_MAX = 200;
const handedOut = new Set();

function bindable(port) {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.on('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

export async function freePort() {
  for (let attempt = 0; attempt < PORT_ATTEMPTS_MAX; attempt++) {
    const port = PORT_FIRST + Math.floor(Math.random() * PORT_COUNT);
    if (!handedOut.has(port) && await bindable(port)) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error(`no free port in ${PORT_FIRST}-${PORT_FIRST + PORT_COUNT - 1} after ${PORT_ATTEMPTS_MAX} tries`);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` (sync or async; truthy ends) until WAIT_MS; fails with `what` and the last value. */
export async function waitFor(what, check, timeoutMs = WAIT_MS) {
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

export const basicAuth = (user, password) => 'Basic ' + Buffer.from(`${user}:${password}`).toString('base64');
export const AUTH = basicAuth('guest', 'guest');

/** The management API as a test client: {status, body}; as guest unless `auth` says otherwise. */
export async function api(method, apiPath, body, auth = AUTH) {
  const response = await fetch(`http://127.0.0.1:${broker.httpPort}/api${apiPath}`, {
    method,
    headers: {Authorization: auth, 'Content-Type': 'application/json'},
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10000),
  });
  const text = await response.text();
  return {status: response.status, body: text ? JSON.parse(text) : null};
}

export async function apiQueue(name) {
  const answer = await api('GET', `/queues/%2F/${encodeURIComponent(name)}`);
  return answer.status === 200 ? answer.body : null;
}

export async function amqpConnect() {
  const connection = await amqp.connect(`amqp://guest:guest@127.0.0.1:${broker.amqpPort}/`, {timeout: 10000});
  connection.on('error', () => {}); // a forced close is expected in one test
  cleanups.push(() => connection.close().catch(() => {}));
  return connection;
}

export function unique(prefix) {
  return `${prefix}-${Math.random().toString(16).slice(2, 10)}`;
}

export async function shot(name) {
  // Notices from earlier steps would cover the page: the screenshot shows the page itself.
  await page.evaluate(() => document.querySelectorAll('#flash .notice').forEach((notice) => notice.remove()));
  await page.screenshot({path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true});
}

/** Opens a console route and waits for its first data refresh. */
export async function open(hash) {
  await page.evaluate(() => { delete document.body.dataset.loaded; });
  await page.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=${REFRESH_MS}${hash}`);
  await page.waitForSelector('body[data-loaded]', {timeout: WAIT_MS});
}

/** The text of one cell of a console table row. */
export async function cell(table, row, column) {
  const locator = page.locator(`table[data-table="${table}"] tr[data-row="${row}"] td[data-col="${column}"]`);
  // allTextContents does not wait: a row that is (or just went) missing reads as null.
  const texts = await locator.allTextContents();
  return texts.length ? texts[0].trim() : null;
}

// ------------------------------------------------------------------ broker and browser

export const pageErrors = [];
export const dialogs = []; // the messages of the console's confirm() dialogs, oldest first
let dialogAnswer = true; // what the next confirm() answers

/** Starts the broker and the browser before this file's tests and stops them after. */
export function useBrokerAndBrowser() {
  before(async () => {
    const binary = process.env.LEPUS_BIN;
    assert.ok(binary, 'LEPUS_BIN must be set (run.sh skips without it)');
    fs.mkdirSync(SCREENSHOTS, {recursive: true});
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lepus-console-'));
    const [amqpPort, httpPort, streamPort] = [await freePort(), await freePort(), await freePort()];
    const log = fs.openSync(path.join(dataDir, '..', `${path.basename(dataDir)}.log`), 'w');
    const child = spawn(binary, ['server', '--data-dir', path.join(dataDir, 'data'), '--amqp-port', String(amqpPort),
      '--http-port', String(httpPort), '--metrics-port', '0', '--stream-port', String(streamPort), '--bind', '127.0.0.1'],
    {stdio: ['ignore', log, log]});
    broker = {process: child, amqpPort, httpPort, streamPort, dataDir};
    await waitFor('the broker to serve its HTTP API', async () => {
      if (child.exitCode !== null) throw new Error(`lepus exited with ${child.exitCode}`);
      return (await api('GET', '/overview')).status === 200;
    });
    await launchBrowser(dataDir);
  });

  after(async () => {
    await closeBrowser();
    if (broker) {
      await stopProcess(broker.process);
      fs.rmSync(broker.dataDir, {recursive: true, force: true});
    }
  });
}

// ------------------------------------------------------------------ a cluster of real nodes

// The cluster file's ports: its own range, apart from the random ports of the single-broker files.
const CLUSTER_PORT_FIRST = CONFIGURED_PORTS ? PORT_FIRST : 26800;
const CLUSTER_PORT_LAST = CONFIGURED_PORTS ? PORT_FIRST + PORT_COUNT - 1 : 26899;
const CLUSTER_FORM_MS = 60000;

export let clusterNodes = []; // [{name, process, amqpPort, httpPort, clusterPort, log}]

async function freePortInClusterRange() {
  for (let port = CLUSTER_PORT_FIRST; port <= CLUSTER_PORT_LAST; port++) {
    if (!handedOut.has(port) && await bindable(port)) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error(`no free port in ${CLUSTER_PORT_FIRST}-${CLUSTER_PORT_LAST}`);
}

/** The management API of one cluster node (as `api`, which talks to `broker`, the first node). */
export async function nodeApi(node, method, apiPath) {
  const response = await fetch(`http://127.0.0.1:${node.httpPort}/api${apiPath}`, {
    method, headers: {Authorization: AUTH}, signal: AbortSignal.timeout(10000),
  });
  const text = await response.text();
  return {status: response.status, body: text ? JSON.parse(text) : null};
}

/** Whether every node still running sees a metadata leader and `expected` members running. */
async function clusterFormed(expected) {
  for (const node of clusterNodes.filter((n) => n.process.exitCode === null)) {
    const status = (await nodeApi(node, 'GET', '/lepus/cluster')).body;
    if (!status.member || !status.metadata.leader) return false;
    if (status.members.filter((m) => m.running).length !== expected) return false;
  }
  return true;
}

/**
 * Starts `size` `lepus server` processes on loopback that form one cluster (each with every
 * cluster port as a seed, as interop/cluster's harness does) and the browser, before this file's
 * tests; `broker` is the first node, whose console the page opens. Stops them all after.
 */
export function useClusterAndBrowser(size = 3) {
  let dataDir;
  before(async () => {
    const binary = process.env.LEPUS_BIN;
    assert.ok(binary, 'LEPUS_BIN must be set (run.sh skips without it)');
    fs.mkdirSync(SCREENSHOTS, {recursive: true});
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lepus-console-cluster-'));
    const clusterPorts = [];
    for (let index = 0; index < size; index++) clusterPorts.push(await freePortInClusterRange());
    const seeds = clusterPorts.map((port) => `127.0.0.1:${port}`).join(',');
    for (let index = 0; index < size; index++) {
      const name = `n${index + 1}@localhost`;
      const [amqpPort, httpPort] = [await freePortInClusterRange(), await freePortInClusterRange()];
      const logPath = path.join(dataDir, `n${index + 1}.log`);
      const log = fs.openSync(logPath, 'w');
      const child = spawn(process.env.LEPUS_BIN, ['server', '--node-name', name, '--data-dir', path.join(dataDir, `n${index + 1}`),
        '--bind', '127.0.0.1', '--amqp-port', String(amqpPort), '--http-port', String(httpPort), '--metrics-port', '0',
        '--stream-port', '0', '--cluster-port', String(clusterPorts[index]), '--cluster-seeds', seeds],
      {stdio: ['ignore', log, log]});
      clusterNodes.push({name, process: child, amqpPort, httpPort, clusterPort: clusterPorts[index], log: logPath});
    }
    broker = {...clusterNodes[0], dataDir};
    await waitFor(`the ${size} nodes to form a cluster (logs in ${dataDir})`, async () => {
      const exited = clusterNodes.find((n) => n.process.exitCode !== null);
      if (exited) throw new Error(`${exited.name} exited with ${exited.process.exitCode}; log ${exited.log}`);
      return clusterFormed(size);
    }, CLUSTER_FORM_MS);
    await launchBrowser(dataDir);
  });

  after(async () => {
    await closeBrowser();
    for (const node of clusterNodes) await stopProcess(node.process);
    if (dataDir) fs.rmSync(dataDir, {recursive: true, force: true});
  });
}

/** Kills a cluster node at once (SIGKILL), as a crash would. */
export async function killNode(node) {
  node.process.kill('SIGKILL');
  await new Promise((resolve) => (node.process.exitCode !== null || node.process.signalCode ? resolve() : node.process.once('exit', resolve)));
}

// ------------------------------------------------------------------ processes and the browser

async function stopProcess(child) {
  if (child.exitCode !== null || child.signalCode) return;
  child.kill('SIGTERM');
  await Promise.race([new Promise((resolve) => child.once('exit', resolve)), sleep(10000)]);
  if (child.exitCode === null && !child.signalCode) child.kill('SIGKILL');
}

/** Headless Chromium with a fresh profile under `dataDir`; `page` is its one page. */
async function launchBrowser(dataDir) {
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
  // CONSOLE_DIR (the console's source folder) serves its files from there instead of from the
  // binary, so a change to the console, or a deliberate breakage, is tried without a rebuild.
  if (process.env.CONSOLE_DIR) {
    await context.route(/\/console\/[a-z]+\.(js|css)$/, (route) =>
      route.fulfill({path: path.join(process.env.CONSOLE_DIR, path.basename(new URL(route.request().url()).pathname))}));
  }
  page = context.pages()[0] || await context.newPage();
  // The console confirms purge, delete and close: the tests answer as `dialogAnswer` says.
  page.on('dialog', (dialog) => {
    dialogs.push(dialog.message());
    (dialogAnswer ? dialog.accept() : dialog.dismiss()).catch(() => {});
  });
  page.on('pageerror', (error) => { console.error('page error:', error); pageErrors.push(error); });
}

async function closeBrowser() {
  for (const cleanup of cleanups.reverse()) await cleanup();
  if (context) await context.close().catch(() => {});
}

/** What the console's confirm() dialogs answer from now on. */
export function answerDialogs(accept) {
  dialogAnswer = accept;
}
