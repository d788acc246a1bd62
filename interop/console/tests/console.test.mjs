// The Lepus web console in a real headless Chromium against a real broker (no mocks): what the
// pages show is compared with what the management API answers, and what the pages do is checked
// through the API and an AMQP client (amqplib). Run through ../run.sh.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {
  REFRESH_MS, WAIT_MS, amqpConnect, answerDialogs, api, apiQueue, basicAuth, broker, cell, cleanups, context, dialogs, open, page, pageErrors, shot, sleep, unique, useBrokerAndBrowser, waitFor,
} from './harness.mjs';

useBrokerAndBrowser();

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

test('logging in shows the overview with totals, node, both alarms and every listener', async () => {
  await page.fill('#login-form [name=password]', 'guest');
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#nav', {state: 'visible'});
  assert.equal((await page.textContent('#user')).trim(), 'guest');
  await page.waitForSelector('[data-fact="disk_alarm"]');
  assert.match(await page.textContent('[data-fact="disk_alarm"]'), /not raised/);
  assert.equal((await page.textContent('#alarm')).trim(), 'disk ok');
  assert.equal((await page.textContent('#memory-alarm')).trim(), 'memory ok');
  await page.waitForSelector('[data-fact="memory_alarm"]');
  assert.match(await page.textContent('[data-fact="memory_alarm"]'), /not raised/);
  const overview = (await api('GET', '/overview')).body;
  // This broker serves AMQP, the HTTP API and the stream protocol, metrics off: each listed, with its port.
  assert.deepEqual(overview.listeners.map((l) => [l.protocol, l.port]),
    [['amqp', broker.amqpPort], ['http', broker.httpPort], ['stream', broker.streamPort]]);
  assert.match(await page.textContent('[data-listener="http"]'), new RegExp(`:${broker.httpPort}$`));
  assert.match(await page.textContent('[data-listener="stream"]'), new RegExp(`:${broker.streamPort}$`));
  assert.equal((await page.textContent('[data-fact="name"]')).trim(), overview.node);
  assert.equal((await page.textContent('[data-stat="exchanges"]')).trim(), String(overview.object_totals.exchanges));
  // The cluster view: every node /api/nodes lists, with whether it runs (this node alone here).
  const nodes = (await api('GET', '/nodes')).body;
  await page.waitForSelector(`[data-cluster-node="${overview.node}"]`);
  assert.equal(await page.locator('#cluster-nodes li').count(), nodes.length);
  assert.match(await page.textContent(`[data-cluster-node="${overview.node}"]`), /running/);
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

// ------------------------------------------------------------------ editing: users, vhosts, policies

/** GET through the API: the body, or null for a 404. */
async function apiGet(apiPath) {
  const answer = await api('GET', apiPath);
  if (answer.status === 404) return null;
  assert.equal(answer.status, 200, `GET ${apiPath}`);
  return answer.body;
}

/** The text of a form's error line ('' while hidden). */
async function formError(form) {
  const error = page.locator(`${form} [data-form-error]`);
  return (await error.isVisible()) ? (await error.textContent()).trim() : '';
}

test('users: add one, change its tags and password, set and delete its permission, delete it', async () => {
  const name = unique('user');
  await open('#/admin');
  await page.fill('#user-form [name=name]', name);
  await page.fill('#user-form [name=password]', 'first-pass');
  await page.fill('#user-form [name=tags]', 'management');
  await page.click('#user-form button[type=submit]');
  const created = await waitFor('the API to see the user', () => apiGet(`/users/${name}`));
  assert.deepEqual(created.tags, ['management']);
  await waitFor('the list to show the user', async () => (await cell('users', name, 'tags')) === 'management');
  assert.equal((await api('GET', '/whoami', undefined, basicAuth(name, 'first-pass'))).status, 200);

  // Edit: new tags, the password field left empty keeps the password.
  await page.click(`button[data-edit-user="${name}"]`);
  assert.equal(await page.inputValue('#user-form [name=name]'), name);
  assert.equal(await page.inputValue('#user-form [name=tags]'), 'management');
  await page.fill('#user-form [name=tags]', 'management, policymaker');
  await page.click('#user-form button[type=submit]');
  await waitFor('the API to see the new tags', async () =>
    (await apiGet(`/users/${name}`)).tags.join(',') === 'management,policymaker');
  assert.equal((await api('GET', '/whoami', undefined, basicAuth(name, 'first-pass'))).status, 200, 'the password is kept');
  await waitFor('the list to show the new tags', async () => (await cell('users', name, 'tags')) === 'management, policymaker');

  // A permission in /, set from the form, shown in the table.
  await page.selectOption('#permission-form [name=user]', name);
  await page.selectOption('#permission-form [name=vhost]', '/');
  await page.fill('#permission-form [name=configure]', '^cfg-');
  await page.fill('#permission-form [name=write]', '.*');
  await page.fill('#permission-form [name=read]', '^read-');
  await page.click('#permission-form button[type=submit]');
  const permission = await waitFor('the API to see the permission', () => apiGet(`/permissions/%2F/${name}`));
  assert.deepEqual([permission.configure, permission.write, permission.read], ['^cfg-', '.*', '^read-']);
  assert.ok((await apiGet('/permissions')).some((p) => p.user === name && p.vhost === '/'));
  await waitFor('the permissions table to show it', async () => (await cell('permissions', `${name} /`, 'read')) === '^read-');
  await shot('users');

  // A new password replaces the old one.
  await page.click(`button[data-edit-user="${name}"]`);
  await page.fill('#user-form [name=password]', 'second-pass');
  await page.click('#user-form button[type=submit]');
  await waitFor('the new password to work', async () =>
    (await api('GET', '/whoami', undefined, basicAuth(name, 'second-pass'))).status === 200);
  assert.equal((await api('GET', '/whoami', undefined, basicAuth(name, 'first-pass'))).status, 401);

  await page.click(`button[data-delete-permission="${name} /"]`);
  await waitFor('the API to drop the permission', async () => (await apiGet(`/permissions/%2F/${name}`)) === null);
  assert.match(dialogs.at(-1), new RegExp(`permission of ${name} in vhost /`));

  // Deleting asks first: answering no keeps the user.
  answerDialogs(false);
  await page.click(`button[data-delete-user="${name}"]`);
  await sleep(500);
  answerDialogs(true);
  assert.match(dialogs.at(-1), new RegExp(`Delete user ${name}`));
  assert.ok(await apiGet(`/users/${name}`), 'a dismissed confirm keeps the user');
  await page.click(`button[data-delete-user="${name}"]`);
  await waitFor('the API to drop the user', async () => (await apiGet(`/users/${name}`)) === null);
  await waitFor('the list to drop the user', async () => (await cell('users', name, 'name')) === null);
});

test('a user without the administrator tag sees why a change is refused and stays logged in', async () => {
  const name = unique('manager');
  assert.equal((await api('PUT', `/users/${name}`, {password: 'pw', tags: 'management'})).status, 201);
  cleanups.push(() => api('DELETE', `/users/${name}`));
  const other = await context.newPage(); // a new tab: its own session storage, its own login
  try {
    await other.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=${REFRESH_MS}#/vhosts`);
    await other.fill('#login-form [name=user]', name);
    await other.fill('#login-form [name=password]', 'pw');
    await other.click('#login-form button[type=submit]');
    await other.waitForSelector('#vhost-form');
    const vhost = unique('refused');
    await other.fill('#vhost-form [name=name]', vhost);
    await other.click('#vhost-form button[type=submit]');
    await other.waitForSelector('#vhost-form [data-form-error]:not([hidden])');
    assert.match(await other.textContent('#vhost-form [data-form-error]'), /Not administrator user/);
    assert.equal(await other.locator('#nav').isVisible(), true, 'still logged in');
    assert.equal(await apiGet(`/vhosts/${vhost}`), null);
  } finally {
    await other.close();
  }
});

test('vhosts: create one, see its messages, delete it with its queues', async () => {
  const vhost = unique('vhost');
  await open('#/vhosts');
  await page.fill('#vhost-form [name=name]', vhost);
  await page.fill('#vhost-form [name=description]', 'made by the console test');
  await page.fill('#vhost-form [name=tags]', 'test, console');
  await page.click('#vhost-form button[type=submit]');
  const created = await waitFor('the API to see the vhost', () => apiGet(`/vhosts/${vhost}`));
  assert.equal(created.description, 'made by the console test');
  assert.deepEqual(created.tags, ['test', 'console']);
  // The permission is granted after the vhost is created, before the PUT answers (as RabbitMQ's
  // handler does it): the API can show the vhost a moment before it.
  assert.ok(await waitFor('the permission', () => apiGet(`/permissions/${vhost}/guest`)), 'the creating administrator gets a permission');
  await waitFor('the list to show the vhost', async () =>
    (await cell('vhosts', vhost, 'description')) === 'made by the console test');

  // A queue with two messages in it, counted on the page.
  const queue = unique('in-vhost');
  assert.equal((await api('PUT', `/queues/${vhost}/${queue}`, {durable: true})).status, 201);
  for (let i = 0; i < 2; i++) {
    const answer = await api('POST', `/exchanges/${vhost}/amq.default/publish`,
      {routing_key: queue, payload: `m${i}`, payload_encoding: 'string', properties: {}});
    assert.equal(answer.body.routed, true);
  }
  await waitFor('the list to count its messages', async () => (await cell('vhosts', vhost, 'messages')) === '2');
  await shot('vhosts');

  await page.click(`button[data-delete-vhost="${vhost}"]`);
  await waitFor('the API to drop the vhost', async () => (await apiGet(`/vhosts/${vhost}`)) === null);
  assert.match(dialogs.at(-1), new RegExp(`Delete vhost ${vhost}\\? This deletes every queue in it`));
  assert.equal(await apiGet(`/queues/${vhost}/${queue}`), null, 'its queue is gone');
  await waitFor('the list to drop the vhost', async () => (await cell('vhosts', vhost, 'name')) === null);
});

test('policies: add one, see it on the matching queue, edit it, refuse bad definitions, delete it', async () => {
  const prefix = unique('orders');
  const queue = `${prefix}.eu`;
  const other = unique('other');
  for (const name of [queue, other]) assert.equal((await api('PUT', `/queues/%2F/${name}`, {durable: true})).status, 201);
  const policy = unique('limit');
  await open('#/policies');
  await page.selectOption('#policy-form [name=vhost]', '/');
  await page.fill('#policy-form [name=name]', policy);
  await page.fill('#policy-form [name=pattern]', `^${prefix}`);
  await page.selectOption('#policy-form [name=apply_to]', 'queues');
  await page.fill('#policy-form [name=priority]', '3');
  await page.fill('#policy-form [name=definition]', '{"max-length": 100, "overflow": "reject-publish", "message-ttl": 60000}');
  await page.click('#policy-form button[type=submit]');
  const saved = await waitFor('the API to see the policy', () => apiGet(`/policies/%2F/${policy}`));
  assert.equal(saved.pattern, `^${prefix}`);
  assert.equal(saved['apply-to'], 'queues');
  assert.equal(saved.priority, 3);
  assert.deepEqual(saved.definition, {'max-length': 100, overflow: 'reject-publish', 'message-ttl': 60000});
  const row = `/ ${policy}`;
  await waitFor('the list to show the policy', async () => (await cell('policies', row, 'pattern')) === `^${prefix}`);
  assert.equal(await cell('policies', row, 'apply_to'), 'queues');
  assert.equal(await cell('policies', row, 'priority'), '3');
  assert.deepEqual(JSON.parse(await cell('policies', row, 'definition')), saved.definition);

  // The matching queue has it (API, queue list, queue page); the other queue does not.
  await waitFor('the API to apply the policy', async () => (await apiQueue(queue)).policy === policy);
  assert.equal((await apiQueue(other)).policy, null);
  await open('#/queues');
  await waitFor('the queue list to show the policy', async () => (await cell('queues', queue, 'policy')) === policy);
  assert.equal(await cell('queues', other, 'policy'), '–');
  await open(`#/queues/%2F/${queue}`);
  await waitFor('the queue page to show the policy', async () =>
    (await page.textContent('[data-fact="policy"]')).trim() === policy);
  assert.deepEqual(JSON.parse(await page.textContent('[data-fact="effective_policy"]')), saved.definition);
  await shot('queue-policy');

  // Definitions that are not JSON objects are refused before anything is sent.
  await open('#/policies');
  const puts = [];
  const onRequest = (request) => { if (request.method() === 'PUT') puts.push(request.url()); };
  page.on('request', onRequest);
  await page.fill('#policy-form [name=name]', `${policy}-bad`);
  await page.fill('#policy-form [name=pattern]', '^nothing');
  for (const [text, reason] of [['{"max-length": ', /not valid JSON/], ['[1, 2]', /must be a JSON object/], ['"x"', /must be a JSON object/]]) {
    await page.fill('#policy-form [name=definition]', text);
    await page.click('#policy-form button[type=submit]');
    await waitFor(`the form to refuse ${text}`, async () => reason.test(await formError('#policy-form')));
  }
  page.off('request', onRequest);
  assert.deepEqual(puts, [], 'nothing was sent');

  // A setting Lepus does not implement: the API's 400 reason is on the page.
  await page.fill('#policy-form [name=definition]', '{"ha-mode": "all"}');
  await page.click('#policy-form button[type=submit]');
  await waitFor('the form to show the API reason', async () =>
    /ha-mode.*not implemented by Lepus/.test(await formError('#policy-form')));
  assert.equal(await apiGet(`/policies/%2F/${policy}-bad`), null);
  await shot('policies-refused');

  // Edit fills the form from the row; a new priority and definition are saved.
  // The list re-renders its rows on every refresh: a click that lands while the row is replaced
  // is lost (CI saw the form still holding the refused name), so click until the form is filled.
  await waitFor('Edit to fill the form from the row', async () => {
    await page.click(`button[data-edit-policy="/ ${policy}"]`);
    return (await page.inputValue('#policy-form [name=name]')) === policy;
  });
  assert.equal(await page.inputValue('#policy-form [name=name]'), policy);
  assert.deepEqual(JSON.parse(await page.inputValue('#policy-form [name=definition]')), saved.definition);
  await page.fill('#policy-form [name=priority]', '7');
  await page.fill('#policy-form [name=definition]', '{"max-length": 5}');
  await page.click('#policy-form button[type=submit]');
  await waitFor('the API to see the edit', async () => {
    const edited = await apiGet(`/policies/%2F/${policy}`);
    return edited.priority === 7 && edited.definition['max-length'] === 5 && !('overflow' in edited.definition);
  });
  assert.equal(await formError('#policy-form'), '', 'a successful save clears the error line');
  await waitFor('the list to show the edit', async () => (await cell('policies', row, 'priority')) === '7');
  await waitFor('the queue to carry the new settings', async () =>
    JSON.stringify((await apiQueue(queue)).effective_policy_definition) === '{"max-length":5}');
  await shot('policies');

  await page.click(`button[data-delete-policy="/ ${policy}"]`);
  await waitFor('the API to drop the policy', async () => (await apiGet(`/policies/%2F/${policy}`)) === null);
  assert.match(dialogs.at(-1), new RegExp(`Delete policy ${policy}`));
  await waitFor('the queue to lose the policy', async () => (await apiQueue(queue)).policy === null);
  await waitFor('the list to drop the policy', async () => (await cell('policies', row, 'name')) === null);
});

test('the channels page lists each channel of a real AMQP client with its own numbers', async () => {
  const connection = await amqpConnect();
  const publisher = await connection.createConfirmChannel();
  const consumer = await connection.createChannel();
  const queue = unique('channels');
  await publisher.assertQueue(queue, {durable: false});
  for (let i = 0; i < 5; i++) publisher.sendToQueue(queue, Buffer.from(`m${i}`));
  await publisher.waitForConfirms();
  await consumer.prefetch(3);
  await consumer.consume(queue, () => {}, {noAck: false}); // holds three unacked
  const localPort = connection.connection.stream.localPort;
  const channels = await waitFor('the API to list both channels with 3 unacked', async () => {
    const list = (await api('GET', '/channels')).body.filter((c) => c.connection_details.peer_port === localPort);
    return list.length === 2 && list.some((c) => c.messages_unacknowledged === 3) ? list : null;
  });
  await open('#/channels');
  for (const channel of channels) {
    await waitFor(`the row of channel ${channel.number}`, async () =>
      (await cell('channels', channel.name, 'unacked')) === String(channel.messages_unacknowledged));
    assert.equal(await cell('channels', channel.name, 'number'), String(channel.number));
    assert.equal(await cell('channels', channel.name, 'connection'), channel.connection_details.name);
    assert.equal(await cell('channels', channel.name, 'user'), 'guest');
    assert.equal(await cell('channels', channel.name, 'vhost'), '/');
    assert.equal(await cell('channels', channel.name, 'consumers'), String(channel.consumer_count));
    assert.equal(await cell('channels', channel.name, 'prefetch'), String(channel.prefetch_count));
    assert.equal(await cell('channels', channel.name, 'mode'), channel.confirm ? 'C' : '–');
  }
  const byNumber = Object.fromEntries(channels.map((c) => [c.number, c]));
  assert.equal(byNumber[publisher.ch].confirm, true);
  assert.equal(byNumber[consumer.ch].prefetch_count, 3);
  assert.equal(byNumber[consumer.ch].consumer_count, 1);
  await shot('channels');
  await connection.close();
});

test('logging out forgets the credentials; the page had no script errors', async () => {
  await page.click('#logout');
  await page.waitForSelector('#login-form', {state: 'visible'});
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.reload();
  await page.waitForSelector('#login-form', {state: 'visible'});
  assert.deepEqual(pageErrors, []);
});
