// The console's detail pages (queue consumers and chart, exchange with bindings and publish,
// connection, channel) in headless Chromium against a real broker this file starts itself; what the
// pages show is compared with the management API, what they do is checked through the API and an
// AMQP client (amqplib). Run through ../run.sh (node --test runs every file of tests/).
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {
  REFRESH_MS, WAIT_MS, amqpConnect, api, apiQueue, broker, cell, open, page, pageErrors, shot, sleep, unique, useBrokerAndBrowser, waitFor,
} from './harness.mjs';

useBrokerAndBrowser();

// ------------------------------------------------------------------ tests (in order, one page)

async function loginAsGuest() {
  await page.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=${REFRESH_MS}#/overview`);
  await page.waitForSelector('#login-form', {state: 'visible'});
  await page.fill('#login-form [name=password]', 'guest');
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#nav', {state: 'visible'});
}

/** The text of a `data-fact` entry of the current page. */
async function factText(id) {
  const texts = await page.locator(`[data-fact="${id}"]`).allTextContents();
  return texts.length ? texts[0].trim() : null;
}

/** The keys (data-row) of a console table's rows, in page order. */
async function rowKeys(table) {
  return page.locator(`table[data-table="${table}"] tr[data-row]`).evaluateAll((rows) => rows.map((row) => row.dataset.row));
}

/** Painted pixels of the canvas `selector`. */
function paintedPixels(selector) {
  return page.evaluate((css) => {
    const canvas = document.querySelector(css);
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let coloured = 0;
    for (let i = 0; i < pixels.length; i += 4) if (pixels[i + 3] > 0) coloured++;
    return coloured;
  }, selector);
}

test('the queue page lists each consumer as the API does and charts ready and unacked', async () => {
  await loginAsGuest();
  const queue = unique('consumed');
  const connection = await amqpConnect();
  const publisher = await connection.createConfirmChannel();
  await publisher.assertQueue(queue, {durable: true});
  for (let i = 0; i < 9; i++) publisher.sendToQueue(queue, Buffer.from(`m${i}`), {persistent: true});
  await publisher.waitForConfirms();
  const manual = await connection.createChannel();
  await manual.prefetch(4);
  await manual.consume(queue, () => {}, {noAck: false, consumerTag: 'manual-tag'}); // holds four unacked
  const expected = await waitFor('the API to list the consumer with 4 unacked', async () => {
    const q = await apiQueue(queue);
    return q && q.messages_unacknowledged === 4 && (q.consumer_details || []).length === 1 ? q : null;
  });
  await open(`#/queues/%2F/${queue}`);
  const consumer = expected.consumer_details[0];
  const key = `${consumer.channel_details.name} ${consumer.consumer_tag}`;
  await waitFor('the consumers table to show the consumer', async () => (await cell('consumers', key, 'tag')) === 'manual-tag');
  assert.equal(await cell('consumers', key, 'channel'), consumer.channel_details.name);
  assert.equal(await cell('consumers', key, 'ack'), consumer.ack_required ? 'manual ack' : 'auto ack (no ack)');
  assert.equal(consumer.ack_required, true);
  assert.equal(await cell('consumers', key, 'prefetch'), String(consumer.prefetch_count));
  assert.equal(consumer.prefetch_count, 4);
  assert.equal(await cell('consumers', key, 'exclusive'), consumer.exclusive ? 'yes' : 'no');
  // A second consumer, auto-ack and exclusive on its own queue, shows on that queue's page only.
  const other = unique('exclusive');
  const automatic = await connection.createChannel();
  await automatic.assertQueue(other, {durable: false});
  await automatic.consume(other, () => {}, {noAck: true, exclusive: true, consumerTag: 'auto-tag'});
  await open(`#/queues/%2F/${other}`);
  const otherQueue = await waitFor('the API to list the exclusive consumer', async () => {
    const q = await apiQueue(other);
    return q && (q.consumer_details || []).length === 1 ? q : null;
  });
  const otherKey = `${otherQueue.consumer_details[0].channel_details.name} auto-tag`;
  await waitFor('the exclusive consumer row', async () => (await cell('consumers', otherKey, 'exclusive')) === 'yes');
  assert.equal(await cell('consumers', otherKey, 'ack'), 'auto ack (no ack)');
  assert.deepEqual(await rowKeys('consumers'), [otherKey]);
  // The chart of the first queue: ready and unacked as the API counts them, drawn from the
  // broker's samples; more publishes make the ready line move.
  await open(`#/queues/%2F/${queue}`);
  for (let i = 0; i < 4; i++) {
    publisher.sendToQueue(queue, Buffer.from('more'), {persistent: true});
    await sleep(REFRESH_MS);
  }
  await publisher.waitForConfirms();
  const now = await waitFor('the API to count 9 ready', async () => {
    const q = await apiQueue(queue);
    return q && q.messages_ready === 9 ? q : null;
  });
  await waitFor('the chart legend to show the API counts', async () => {
    const ready = await page.textContent('#queue-charts [data-series="ready"] b');
    const unacked = await page.textContent('#queue-charts [data-series="unacked"] b');
    return ready === String(now.messages_ready) && unacked === String(now.messages_unacknowledged);
  });
  const samples = await page.evaluate(() => document.querySelectorAll('#queue-charts canvas').length);
  assert.equal(samples, 2);
  assert.ok(await paintedPixels('#queue-charts canvas') > 500, 'the queue chart is drawn');
  await shot('queue-consumers');
  await connection.close();
});

/** Loads the console afresh at `hash` with a refresh period so long that only the first load draws. */
async function loadOnce(hash) {
  // A query of its own makes it a new document, not a hash change of the page already open.
  await page.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=600000&load=${Date.now()}${hash}`);
  await page.waitForSelector('body[data-loaded]', {timeout: WAIT_MS});
}

/** The points a chart canvas of the current page was drawn with. */
function chartPointCount(selector) {
  return page.evaluate((css) => Number(document.querySelector(css).dataset.points || 0), selector);
}

test('charts are full at page load, drawn from the samples the broker keeps', async () => {
  const queue = unique('history');
  const connection = await amqpConnect();
  const publisher = await connection.createConfirmChannel();
  await publisher.assertQueue(queue, {durable: true});
  for (let i = 0; i < 3; i++) publisher.sendToQueue(queue, Buffer.from(`m${i}`), {persistent: true});
  await publisher.waitForConfirms();
  // The broker samples every 5 s: wait until its newest sample of the queue counts the three.
  const range = 'lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5';
  const sampled = await waitFor('the broker to have sampled the queue', async () => {
    const answer = await api('GET', `/queues/%2F/${queue}?${range}`);
    const samples = answer.body.messages_ready_details.samples;
    return samples[0].sample === 3 ? answer.body : null;
  }, 3 * WAIT_MS);
  assert.equal(sampled.messages_ready_details.samples.length, 121);
  // A fresh page, loaded once: both charts already hold the broker's 10 minutes of points.
  await loadOnce(`#/queues/%2F/${queue}`);
  assert.equal(await chartPointCount('#queue-charts canvas[aria-label="Queued messages"]'), 121);
  assert.equal(await chartPointCount('#queue-charts canvas[aria-label="Message rates"]'), 120);
  assert.equal(await page.textContent('#queue-charts [data-series="ready"] b'), '3');
  assert.ok(await paintedPixels('#queue-charts canvas') > 500, 'the queue chart is drawn');
  await loadOnce('#/overview');
  assert.equal(await chartPointCount('canvas[aria-label="Queued messages"]'), 121);
  assert.equal(await chartPointCount('canvas[aria-label="Message rates"]'), 120);
  await shot('charts-at-load');
  await connection.close();
});

test('the exchange list links to an exchange page with its details from the API', async () => {
  const exchange = unique('events');
  assert.equal((await api('PUT', `/exchanges/%2F/${exchange}`, {type: 'topic', durable: true, arguments: {'alternate-exchange': 'ae'}})).status, 201);
  await open('#/exchanges');
  await waitFor('the exchange row', async () => (await cell('exchanges', exchange, 'name')) === exchange);
  await page.click(`table[data-table="exchanges"] tr[data-row="${exchange}"] td[data-col="name"] a`);
  await page.waitForSelector('[data-fact="type"]');
  assert.equal(page.url().split('#')[1], `/exchanges/%2F/${exchange}`);
  const expected = (await api('GET', `/exchanges/%2F/${exchange}`)).body;
  assert.equal((await page.textContent('#exchange-name')).trim(), exchange);
  assert.equal(await factText('type'), expected.type);
  assert.equal(await factText('durable'), expected.durable ? 'yes' : 'no');
  assert.equal(await factText('internal'), expected.internal ? 'yes' : 'no');
  assert.equal(await factText('arguments'), JSON.stringify(expected.arguments));
  // The default exchange's page is reached by its API alias.
  await open('#/exchanges');
  await page.click('table[data-table="exchanges"] tr[data-row=""] td[data-col="name"] a');
  await page.waitForSelector('[data-fact="type"]');
  assert.equal(page.url().split('#')[1], '/exchanges/%2F/amq.default');
  assert.equal(await factText('type'), 'direct');
});

test('the exchange page adds and removes a binding and publishes through it', async () => {
  const exchange = unique('routing');
  const queue = unique('bound');
  assert.equal((await api('PUT', `/exchanges/%2F/${exchange}`, {type: 'direct', durable: false})).status, 201);
  assert.equal((await api('PUT', `/queues/%2F/${queue}`, {durable: false})).status, 201);
  await open(`#/exchanges/%2F/${exchange}`);
  await page.waitForSelector('table[data-table="exchange-bindings"] td.empty');
  await page.fill('#binding-form [name=queue]', queue);
  await page.fill('#binding-form [name=routing_key]', 'orders.new');
  await page.click('#binding-form button[type=submit]');
  const binding = await waitFor('the API to list the binding', async () => {
    const list = (await api('GET', `/exchanges/%2F/${exchange}/bindings/source`)).body;
    return list.length === 1 ? list[0] : null;
  });
  assert.equal(binding.destination, queue);
  assert.equal(binding.destination_type, 'queue');
  assert.equal(binding.routing_key, 'orders.new');
  const key = `queue ${queue} ${binding.properties_key}`;
  await waitFor('the binding row', async () => (await cell('exchange-bindings', key, 'routing_key')) === 'orders.new');
  assert.equal(await cell('exchange-bindings', key, 'destination'), queue);

  // Publish through the binding: the queue gets the message, with the routing key and payload.
  await page.fill('#exchange-publish-form [name=routing_key]', 'orders.new');
  await page.fill('#exchange-publish-form [name=payload]', 'to the bound queue');
  await page.click('#exchange-publish-form button[type=submit]');
  await page.waitForSelector('.notice[data-kind="ok"]:has-text("Message published and routed.")');
  const connection = await amqpConnect();
  const channel = await connection.createChannel();
  const message = await waitFor('the message in the queue', async () => channel.get(queue, {noAck: true}));
  assert.equal(message.content.toString(), 'to the bound queue');
  assert.equal(message.fields.exchange, exchange);
  assert.equal(message.fields.routingKey, 'orders.new');
  assert.equal(message.properties.deliveryMode, 2);
  // A key no binding matches is reported as not routed, in the form.
  await page.fill('#exchange-publish-form [name=routing_key]', 'nowhere');
  await page.click('#exchange-publish-form button[type=submit]');
  await page.waitForSelector('#exchange-publish-form .form-error:not([hidden])');
  assert.match(await page.textContent('#exchange-publish-form .form-error'), /not routed/);
  // The page counts what came in (two publishes) and went out (one routed), with their rates.
  await waitFor('the messages counted in and out', async () =>
    (await factText('publish_in')).startsWith('2 (') && (await factText('publish_out')).startsWith('1 ('));
  assert.match(await factText('publish_in'), /^2 \([\d.,]+\/s\)$/);
  await open('#/exchanges');
  await waitFor('the exchange row', async () => /\/s$/.test(await cell('exchanges', exchange, 'rate_in') || ''));
  assert.match(await cell('exchanges', exchange, 'rate_out'), /^[\d.,]+\/s$/);
  await open(`#/exchanges/%2F/${exchange}`);
  await page.waitForSelector('[data-fact="publish_in"]');
  await shot('exchange-page');

  // Unbind: the API lists no binding, and a publish no longer reaches the queue.
  await page.click(`[data-unbind="${queue} orders.new"]`);
  await waitFor('the API to list no binding', async () =>
    (await api('GET', `/exchanges/%2F/${exchange}/bindings/source`)).body.length === 0);
  await page.waitForSelector('table[data-table="exchange-bindings"] td.empty');
  const answer = await api('POST', `/exchanges/%2F/${exchange}/publish`,
    {routing_key: 'orders.new', payload: 'x', payload_encoding: 'string', properties: {}});
  assert.equal(answer.body.routed, false);
  await connection.close();
});

test('connection and channel pages show what the API answers, linked from the lists', async () => {
  const connection = await amqpConnect();
  const channel = await connection.createConfirmChannel();
  const queue = unique('detail');
  await channel.assertQueue(queue, {durable: false});
  await channel.prefetch(7);
  await channel.consume(queue, () => {}, {noAck: false, consumerTag: 'detail-tag'});
  const localPort = connection.connection.stream.localPort;
  const expected = await waitFor('the API to list the connection', async () =>
    (await api('GET', '/connections')).body.find((c) => c.peer_port === localPort));
  await open('#/connections');
  await waitFor('the connection row', async () => (await cell('connections', expected.name, 'protocol')) === expected.protocol);
  assert.equal(expected.protocol, 'AMQP 0-9-1');
  assert.equal(await cell('connections', expected.name, 'tls'), 'no');
  assert.match(await cell('connections', expected.name, 'from_client'), /^[\d.,]+ (B|KiB|MiB)\/s$/);
  assert.match(await cell('connections', expected.name, 'to_client'), /^[\d.,]+ (B|KiB|MiB)\/s$/);
  assert.equal(expected.ssl, false);
  await page.click(`table[data-table="connections"] tr[data-row="${expected.name}"] td[data-col="name"] a`);
  await page.waitForSelector('[data-fact="protocol"]');
  const detail = (await api('GET', `/connections/${encodeURIComponent(expected.name)}`)).body;
  assert.equal((await page.textContent('#connection-name')).trim(), detail.name);
  assert.equal(await factText('protocol'), detail.protocol);
  assert.equal(await factText('ssl'), 'no');
  assert.equal(await factText('user'), detail.user);
  assert.equal(await factText('peer'), `${detail.peer_host}:${detail.peer_port}`);
  assert.equal(await factText('frame_max'), detail.frame_max.toLocaleString('en-US'));
  // Bytes received from the client (its handshake at least) and sent to it, with their rates.
  assert.ok(detail.recv_oct > 0 && detail.send_oct > 0, JSON.stringify(detail));
  assert.match(await factText('recv_oct'), /^[\d.,]+ (B|KiB) \([\d.,]+ (B|KiB)\/s\)$/);
  assert.match(await factText('send_oct'), /^[\d.,]+ (B|KiB) \([\d.,]+ (B|KiB)\/s\)$/);
  assert.equal(await factText('client'), [detail.client_properties.product, detail.client_properties.version].filter(Boolean).join(' ') || '–');
  const channels = (await api('GET', `/connections/${encodeURIComponent(expected.name)}/channels`)).body;
  assert.equal(channels.length, 1);
  await waitFor('the channel row', async () => (await cell('connection-channels', channels[0].name, 'prefetch')) === '7');
  await shot('connection-page');

  // The channel's page, from the connection page's link.
  await page.click(`table[data-table="connection-channels"] tr[data-row="${channels[0].name}"] td[data-col="name"] a`);
  await page.waitForSelector('[data-fact="number"]');
  const channelDetail = (await api('GET', `/channels/${encodeURIComponent(channels[0].name)}`)).body;
  assert.equal((await page.textContent('#channel-name')).trim(), channelDetail.name);
  assert.equal(await factText('connection'), expected.name);
  assert.equal(await factText('number'), String(channelDetail.number));
  assert.equal(await factText('mode'), channelDetail.confirm ? 'C' : '–');
  assert.equal(await factText('prefetch'), '7');
  assert.equal(await factText('consumer_count'), String(channelDetail.consumer_count));
  await waitFor('the consumer row', async () => (await cell('channel-consumers', 'detail-tag', 'queue')) === queue);
  assert.equal(await cell('channel-consumers', 'detail-tag', 'ack'), 'yes');
  await shot('channel-page');

  // Closed: the pages say so instead of showing stale facts.
  await connection.close();
  await page.waitForSelector('[data-not-found]');
  await open(`#/connections/${encodeURIComponent(expected.name)}`);
  await page.waitForSelector('[data-not-found]');
});

test('a node started without a cluster port says it is not clustered, and a quorum queue page shows it as the one member', async () => {
  const overview = (await api('GET', '/overview')).body;
  assert.equal((await api('GET', '/lepus/cluster')).body.clustered, false);
  await open('#/cluster');
  await page.waitForSelector('[data-not-clustered]');
  assert.deepEqual(await rowKeys('cluster-nodes'), [overview.node]);
  assert.equal(await cell('cluster-nodes', overview.node, 'running'), 'running');
  assert.equal(await cell('cluster-nodes', overview.node, 'role'), 'not clustered');
  assert.equal(await page.locator('table[data-table="quorum-shards"] tbody tr[data-row]').count(), 0);
  await shot('cluster-not-clustered');

  const queue = unique('single-qq');
  assert.equal((await api('PUT', `/queues/%2F/${queue}`, {durable: true, arguments: {'x-queue-type': 'quorum'}})).status, 201);
  await open(`#/queues/%2F/${queue}`);
  await waitFor('the quorum queue\'s replica facts', async () => (await factText('leader')) === overview.node);
  assert.equal(await factText('members'), overview.node);
  assert.equal(await factText('online'), overview.node);
  await api('DELETE', `/queues/%2F/${queue}`);
});

test('the detail pages had no script errors', async () => {
  assert.deepEqual(pageErrors, []);
});
