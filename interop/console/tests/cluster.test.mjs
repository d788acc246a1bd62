// The console's cluster page (#/cluster) and a quorum queue's replica facts against a real
// cluster: three `lepus server` processes on loopback (ports 26800-26899, or INTEROP_PORTS), the
// page opened on the first. What the page shows is compared with the management API of that node;
// then the third node is killed (SIGKILL) and the page must show it not running and the queue's
// member offline.
// Run through ../run.sh (node --test runs every file of tests/).
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {
  REFRESH_MS, api, broker, cell, clusterNodes, killNode, open, page, pageErrors, shot, unique, useClusterAndBrowser, waitFor,
} from './harness.mjs';

useClusterAndBrowser(3);

// A killed node's links close at once (the kernel resets them), but its peers may retry a while
// before they call it not running; elections among the two left take a few seconds more.
const NODE_DOWN_MS = 30000;

const queue = unique('cluster-qq');

async function loginAsGuest() {
  await page.goto(`http://127.0.0.1:${broker.httpPort}/?refresh=${REFRESH_MS}#/cluster`);
  await page.waitForSelector('#login-form', {state: 'visible'});
  await page.fill('#login-form [name=password]', 'guest');
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#nav', {state: 'visible'});
}

async function factText(id) {
  const texts = await page.locator(`[data-fact="${id}"]`).allTextContents();
  return texts.length ? texts[0].trim() : null;
}

/** The rows' keys (data-row) of a console table, in page order. */
async function rowKeys(table) {
  return page.locator(`table[data-table="${table}"] tbody tr[data-row]`).evaluateAll((rows) => rows.map((row) => row.dataset.row));
}

/** The shard of `queue` as the API of the page's node says: {shard, leader, voters, learners, queues}. */
async function apiShardOfQueue() {
  const status = (await api('GET', '/lepus/cluster')).body;
  return status.quorum_shards.find((shard) => shard.queues.some((q) => q.vhost === '/' && q.name === queue));
}

test('the cluster page shows every node running, the metadata leader and the quorum shards', async () => {
  const declared = await api('PUT', `/queues/%2F/${queue}`, {durable: true, arguments: {'x-queue-type': 'quorum'}});
  assert.equal(declared.status, 201, JSON.stringify(declared.body));
  await loginAsGuest();
  await open('#/cluster');
  const names = clusterNodes.map((node) => node.name);
  await waitFor('the three nodes in the nodes table', async () => JSON.stringify((await rowKeys('cluster-nodes')).sort()) === JSON.stringify(names));
  for (const name of names) assert.equal(await cell('cluster-nodes', name, 'running'), 'running', name);
  assert.equal(await factText('running'), '3 of 3');

  // One row says "metadata leader", and it is the leader the API names (read again on each try:
  // the page and the API must agree on one refresh).
  await waitFor('the metadata leader of the API marked in the nodes table', async () => {
    const leader = (await api('GET', '/lepus/cluster')).body.metadata.leader;
    const marked = await page.locator('table[data-table="cluster-nodes"] tr:has([data-metadata-leader])').evaluateAll(
      (rows) => rows.map((row) => row.dataset.row));
    return marked.length === 1 && marked[0] === leader && (await factText('metadata_leader')) === leader;
  });

  // Every shard of the API has its row; the queue's shard lists it, with its leader and voters.
  const shards = (await api('GET', '/lepus/cluster')).body.quorum_shards;
  assert.ok(shards.length > 0, 'a cluster runs quorum shards');
  await waitFor('a row per quorum shard', async () => (await rowKeys('quorum-shards')).length === shards.length);
  await waitFor('the queue on its shard\'s row with the shard\'s leader and three voters', async () => {
    const shard = await apiShardOfQueue();
    if (!shard || !shard.leader) return false;
    const row = String(shard.shard);
    const queues = await cell('quorum-shards', row, 'queues');
    const voters = await cell('quorum-shards', row, 'voters');
    return queues.split(', ').includes(queue) && (await cell('quorum-shards', row, 'leader')) === shard.leader
      && names.every((name) => voters.includes(name)) && !voters.includes('not running');
  });
  await page.click(`table[data-table="quorum-shards"] a[href="#/queues/%2F/${queue}"]`);
  await page.waitForSelector('#queue-name');

  // The queue page: its leader, members and online members, as /api/queues answers them.
  await waitFor('the queue page\'s leader, members and online facts', async () => {
    const answer = (await api('GET', `/queues/%2F/${queue}`)).body;
    return answer.leader && (await factText('leader')) === answer.leader
      && (await factText('members')) === answer.members.join(', ')
      && (await factText('online')) === answer.online.join(', ') && answer.online.length === 3;
  });
  await shot('cluster-queue-three-online');
  await open('#/cluster');
  await shot('cluster-three-running');
  assert.deepEqual(pageErrors, []);
});

test('a killed node shows as not running on the cluster page and offline on the queue page', async () => {
  const victim = clusterNodes[2];
  await killNode(victim);
  await open('#/cluster');
  await waitFor(`${victim.name} shown not running`, async () => (await cell('cluster-nodes', victim.name, 'running')) === 'not running',
    NODE_DOWN_MS);
  for (const node of clusterNodes.slice(0, 2)) assert.equal(await cell('cluster-nodes', node.name, 'running'), 'running', node.name);
  assert.equal(await factText('running'), '2 of 3');
  // The API agrees: the page did not make it up.
  const nodes = (await api('GET', '/nodes')).body;
  assert.equal(nodes.find((n) => n.name === victim.name).running, false);

  // Its shard marks the dead voter, and a leader among the two left is shown once elected.
  await waitFor('the queue\'s shard with a running leader and the killed voter marked', async () => {
    const shard = await apiShardOfQueue();
    if (!shard || !shard.leader || shard.leader === victim.name) return false;
    const row = String(shard.shard);
    return (await cell('quorum-shards', row, 'leader')) === shard.leader
      && (await cell('quorum-shards', row, 'voters')).includes(`${victim.name} (not running)`);
  }, NODE_DOWN_MS);
  await shot('cluster-one-node-killed');

  await open(`#/queues/%2F/${queue}`);
  await waitFor('the killed node offline on the queue page', async () => {
    const online = await factText('online');
    return online !== null && !online.includes(victim.name) && (await factText('members')).includes(`${victim.name} (offline)`);
  }, NODE_DOWN_MS);
  await shot('cluster-queue-one-offline');
  assert.deepEqual(pageErrors, []);
});
