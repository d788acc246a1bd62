// The Lepus web console, third script (loaded after app.js and pages.js, whose helpers it uses):
// the cluster page, #/cluster. Its data: GET /api/nodes (every member and whether it runs, as
// RabbitMQ answers it), GET /api/lepus/cluster (this node's view of the metadata group and of
// every quorum shard: leader, voters, learners, the queues on it). A node started without
// --cluster-port is not clustered, and the page says so rather than draw a cluster of one.
'use strict';

/** A node's name with a badge: "running" or "not running". */
function runningBadge(running) {
  return h('span', {class: 'badge ' + (running ? 'ok' : 'alarm'), 'data-running': String(Boolean(running))},
    running ? 'running' : 'not running');
}

/** The role of a member in the metadata group: leader, voter or learner (a joined node that
 * has not caught up yet: it votes once it has). */
function metadataRole(member, leader) {
  if (member.name === leader) return h('span', {class: 'badge ok', 'data-metadata-leader': ''}, 'metadata leader');
  return member.voter ? 'voter' : 'learner';
}

/** The names of `nodes`, each marked when it is not running (as /api/nodes says). */
function nodeList(nodes, runningByName) {
  if (!nodes || !nodes.length) return '–';
  return nodes.flatMap((name, index) => [index ? ', ' : '', runningByName.get(name) === false
    ? h('span', {class: 'node-down', title: 'not running'}, `${name} (not running)`) : name]);
}

/** The nodes table: /api/nodes for `running`, /api/lepus/cluster's members for the rest. */
function clusterNodesTable() {
  return dataTable('cluster-nodes', [
    {id: 'name', title: 'Node', cell: (n) => n.name},
    {id: 'running', title: 'State', cell: (n) => runningBadge(n.running)},
    {id: 'role', title: 'Metadata group', cell: (n) => n.role},
    {id: 'address', title: 'Cluster address', cell: (n) => n.address || '–'},
  ], 'No nodes.');
}

/** The quorum shards table: a quorum queue's members are those of the shard it is on. */
function quorumShardsTable(runningByName) {
  return dataTable('quorum-shards', [
    {id: 'shard', title: 'Shard', num: true, cell: (s) => s.shard},
    {id: 'leader', title: 'Leader', cell: (s) => s.leader || h('span', {class: 'error'}, 'no leader')},
    {id: 'voters', title: 'Voters', cell: (s) => nodeList(s.voters, runningByName())},
    {id: 'learners', title: 'Learners', cell: (s) => nodeList(s.learners, runningByName())},
    // Learners chosen as voters (grow, add_member) that have not caught up yet.
    {id: 'promotion_pending', title: 'Promotion pending', cell: (s) => nodeList(s.promotion_pending, runningByName())},
    {id: 'queues', title: 'Quorum queues', cell: (s) => ((s.queues || []).length
      ? s.queues.flatMap((q, index) => [index ? ', ' : '', queueLink(q.vhost, q.name)]) : '–')},
  ], 'No quorum shards.');
}

function clusterView() {
  const summary = h('dl', {class: 'facts', id: 'cluster-summary'});
  const metadata = h('dl', {class: 'facts', id: 'cluster-metadata'});
  const nodes = clusterNodesTable();
  let runningByName = new Map();
  const shards = quorumShardsTable(() => runningByName);
  const shardsNote = h('p', {class: 'muted small', id: 'shards-note'});
  const element = h('div', {},
    h('h1', {}, 'Cluster'),
    h('div', {class: 'columns'}, section('Cluster', summary), section('Metadata group (as this node sees it)', metadata)),
    section('Nodes', nodes.element),
    section('Quorum shards', shards.element, shardsNote));
  return {
    element,
    async refresh() {
      const [nodeList, status] = await Promise.all([api('GET', '/nodes'), api('GET', '/lepus/cluster')]);
      runningByName = new Map(nodeList.map((n) => [n.name, Boolean(n.running)]));
      if (!status.clustered) {
        showNotClustered(status, nodeList, {summary, metadata, nodes, shards, shardsNote});
        return;
      }
      const leader = (status.metadata || {}).leader;
      const members = new Map((status.members || []).map((m) => [m.name, m]));
      nodes.update(nodeList.map((n) => {
        const member = members.get(n.name) || {name: n.name};
        return {name: n.name, running: n.running, role: metadataRole(member, leader), address: member.address};
      }), (n) => n.name);
      const running = nodeList.filter((n) => n.running).length;
      summary.replaceChildren(
        ...fact('Name', status.cluster_name, 'cluster_name'),
        ...fact('Nodes running', `${running} of ${nodeList.length}`, 'running'),
        ...fact('Metadata leader', leader || h('span', {class: 'error'}, 'none: no majority'), 'metadata_leader'),
        ...fact('This node', status.node, 'node'),
        ...fact('Member', status.member ? 'yes' : 'no (not yet joined, or forgotten)', 'member'));
      showMetadata(metadata, status.metadata || {});
      shards.update(status.quorum_shards || [], (s) => String(s.shard));
      shardsNote.textContent = 'Every quorum queue lives on one shard (by a hash of its vhost and name); '
        + 'its leader, members and online members are its shard\'s. Voters elect and commit; learners '
        + 'copy the log and may be promoted (lepus ctl queues grow), each only once it has caught up.';
    },
  };
}

function showMetadata(target, view) {
  target.replaceChildren(
    ...fact('Role of this node', view.role, 'role'),
    ...fact('Leader', view.leader || '–', 'leader'),
    ...fact('Term', fmtNumber(view.term), 'term'),
    ...fact('Commit index', fmtNumber(view.commit_index), 'commit_index'),
    ...fact('Applied index', fmtNumber(view.applied_index), 'applied_index'),
    ...fact('Last index', fmtNumber(view.last_index), 'last_index'),
    ...fact('Elections', fmtNumber(view.elections), 'elections'));
}

/** A node without --cluster-port: itself, running, and no metadata group or shards to show. */
function showNotClustered(status, nodeList, {summary, metadata, nodes, shards, shardsNote}) {
  summary.replaceChildren(
    ...fact('Clustered', h('span', {'data-not-clustered': ''}, 'no: this node was started without --cluster-port'), 'clustered'),
    ...fact('This node', status.node, 'node'));
  metadata.replaceChildren(h('p', {class: 'muted'}, 'Not clustered: there is no metadata group; this node keeps its definitions itself.'));
  nodes.update(nodeList.map((n) => ({name: n.name, running: n.running, role: 'not clustered', address: null})), (n) => n.name);
  shards.update([], () => '');
  shardsNote.textContent = 'Not clustered: every quorum queue has one member, this node.';
}

/**
 * The queue page's replica facts of a quorum queue (as /api/queues answers them): its leader, its
 * members, and which of them are online. Empty for other queue types.
 */
function quorumReplicaFacts(queue) {
  if (queue.type !== 'quorum') return [];
  const online = new Set(queue.online || []);
  const members = (queue.members || []).flatMap((name, index) => [index ? ', ' : '', online.has(name) ? name
    : h('span', {class: 'node-down', 'data-offline': name}, `${name} (offline)`)]);
  return [
    ...fact('Leader', queue.leader || h('span', {class: 'error'}, 'none'), 'leader'),
    ...fact('Members', members.length ? members : '–', 'members'),
    ...fact('Online', (queue.online || []).join(', ') || h('span', {class: 'error'}, 'none'), 'online'),
    ...fact('Replicas', h('a', {href: '#/cluster'}, 'cluster page'), 'replicas'),
  ];
}

views.cluster = clusterView;
