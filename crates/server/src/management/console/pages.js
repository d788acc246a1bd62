// The Lepus web console, second script (loaded after app.js, whose helpers it uses): the queue
// page's consumers table and chart, and the detail pages of an exchange (bindings, add and remove a
// binding, publish), a connection and a channel, with the links that lead to them from the lists.
'use strict';

// ---------------------------------------------------------------- links

/** The URL of an exchange's page; the default exchange ("") is "amq.default", as in the API. */
function exchangeHref(vhost, name) {
  return `#/exchanges/${enc(vhost)}/${enc(name || 'amq.default')}`;
}

function exchangeLink(vhost, name) {
  return h('a', {href: exchangeHref(vhost, name)}, name || '(AMQP default)');
}

function connectionLink(name) {
  return name ? h('a', {href: `#/connections/${enc(name)}`}, name) : '–';
}

function channelLink(name) {
  return name ? h('a', {href: `#/channels/${enc(name)}`}, name) : '–';
}

function queueLink(vhost, name) {
  return h('a', {href: `#/queues/${enc(vhost)}/${enc(name)}`}, name);
}

/** The TLS cell of a connection: "TLSv1.3" (its protocol) or "no". */
function connectionTls(connection) {
  if (!connection.ssl) return 'no';
  return h('span', {class: 'badge ok', title: connection.ssl_cipher || ''}, connection.ssl_protocol || 'TLS');
}

const yesNo = (value) => (value ? 'yes' : 'no');

/** A definition list row pair: [dt, dd data-fact=id]. */
function fact(term, value, id) {
  return [h('dt', {}, term), h('dd', {'data-fact': id}, value === undefined || value === null ? '–' : value)];
}

/** Shows "NAME does not exist (any more)" in `target` for a 404; rethrows anything else. */
function notFound(error, target, what) {
  if (error.status !== 404) throw error;
  target.replaceChildren(h('p', {class: 'error', 'data-not-found': ''}, `${what} does not exist (any more).`));
}

// ---------------------------------------------------------------- queue page: consumers and chart

/** The consumers of a queue, from `consumer_details` of GET /api/queues/VHOST/NAME. */
function queueConsumersTable() {
  return dataTable('consumers', [
    {id: 'tag', title: 'Consumer tag', cell: (c) => c.consumer_tag},
    {id: 'channel', title: 'Channel', cell: (c) => channelLink((c.channel_details || {}).name)},
    {id: 'ack', title: 'Ack required', cell: (c) => (c.ack_required ? 'manual ack' : 'auto ack (no ack)')},
    {id: 'prefetch', title: 'Prefetch', num: true, cell: (c) => fmtNumber(c.prefetch_count)},
    {id: 'exclusive', title: 'Exclusive', cell: (c) => yesNo(c.exclusive)},
    {id: 'arguments', title: 'Arguments', cell: (c) => JSON.stringify(c.arguments || {})},
  ], 'No consumers.');
}

/**
 * The queue page's charts: ready/unacked and publish/deliver rates, from the samples the broker
 * keeps of the queue (the page asks for them with CHART_RANGE), so they are full at page load.
 */
function queueCharts() {
  const queued = chart('Queued messages', [
    {label: 'Ready', key: 'ready', color: COLORS.ready},
    {label: 'Unacked', key: 'unacked', color: COLORS.unacked}], '');
  const rates = chart('Message rates', [
    {label: 'Publish', key: 'publish', color: COLORS.publish},
    {label: 'Deliver / get', key: 'deliver', color: COLORS.deliver}], '/s');
  return {
    element: h('div', {class: 'charts', id: 'queue-charts'}, queued.element, rates.element),
    update(queue) {
      const points = messageChartPoints(queue, queue.message_stats || {});
      queued.update(points.queued);
      rates.update(points.rates);
    },
  };
}

// ---------------------------------------------------------------- exchange page

function exchangeView(vhost, name) {
  const apiName = name === '' ? 'amq.default' : name;
  const path = `/exchanges/${enc(vhost)}/${enc(apiName)}`;
  const facts = h('dl', {class: 'facts'});
  const bindings = dataTable('exchange-bindings', [
    {id: 'destination', title: 'To', cell: (b) => (b.destination_type === 'queue' ? queueLink(b.vhost, b.destination)
      : exchangeLink(b.vhost, b.destination))},
    {id: 'destination_type', title: 'Type', cell: (b) => b.destination_type},
    {id: 'routing_key', title: 'Routing key', cell: (b) => b.routing_key},
    {id: 'arguments', title: 'Arguments', cell: (b) => JSON.stringify(b.arguments || {})},
    {id: 'actions', title: '', cell: (b) => rowActions(rowButton('Unbind', 'danger',
      {'data-unbind': `${b.destination} ${b.routing_key}`}, () => removeBinding(b)))},
  ], 'No bindings from this exchange.');
  const element = h('div', {},
    h('p', {class: 'crumbs'}, h('a', {href: '#/exchanges'}, 'Exchanges'), ' in vhost ', h('code', {}, vhost)),
    h('h1', {}, 'Exchange ', h('span', {class: 'name', id: 'exchange-name'}, apiName === 'amq.default' ? '(AMQP default)' : name)),
    h('div', {class: 'columns'}, section('Details', facts),
      section('Bindings', bindings.element, h('h3', {}, 'Add a binding from this exchange'), bindingForm(vhost, apiName))),
    section('Publish a message', exchangePublishForm(path)));
  return {
    element,
    async refresh() {
      let exchange;
      try {
        exchange = await api('GET', path);
      } catch (error) {
        notFound(error, facts, `Exchange ${name}`);
        return;
      }
      facts.replaceChildren(
        ...fact('Vhost', exchange.vhost, 'vhost'),
        ...fact('Type', exchange.type, 'type'),
        ...fact('Durable', yesNo(exchange.durable), 'durable'),
        ...fact('Auto-delete', yesNo(exchange.auto_delete), 'auto_delete'),
        ...fact('Internal', yesNo(exchange.internal), 'internal'),
        ...fact('Arguments', JSON.stringify(exchange.arguments || {}), 'arguments'),
        ...fact('Policy', exchange.policy || 'none', 'policy'),
        ...fact('Messages in', fmtCountAndRate((exchange.message_stats || {}).publish_in, (exchange.message_stats || {}).publish_in_details), 'publish_in'),
        ...fact('Messages out', fmtCountAndRate((exchange.message_stats || {}).publish_out, (exchange.message_stats || {}).publish_out_details), 'publish_out'));
      const list = await api('GET', path + '/bindings/source');
      bindings.update(list, (b) => `${b.destination_type} ${b.destination} ${b.properties_key}`);
    },
  };
}

function bindingForm(vhost, exchange) {
  const what = (f) => `Binding queue ${f.queue.value.trim()} to exchange ${exchange}`;
  return h('form', {id: 'binding-form', class: 'stacked', onsubmit: (event) => submitForm(event, what, (form) => addBinding(form, vhost, exchange))},
    h('label', {}, 'Destination queue ', h('input', {name: 'queue', required: true, autocomplete: 'off', placeholder: 'orders'})),
    h('label', {}, 'Routing key ', h('input', {name: 'routing_key', autocomplete: 'off'})),
    h('label', {}, 'Arguments (JSON) ', h('input', {name: 'arguments', autocomplete: 'off', placeholder: '{"x-match": "all"}'})),
    formError(),
    h('div', {}, h('button', {type: 'submit'}, 'Bind')));
}

async function addBinding(form, vhost, exchange) {
  const queue = form.queue.value.trim();
  const body = {routing_key: form.routing_key.value, arguments: parseArguments(form.arguments.value)};
  await api('POST', `/bindings/${enc(vhost)}/e/${enc(exchange)}/q/${enc(queue)}`, body);
  form.queue.value = '';
  form.routing_key.value = '';
  return `Queue ${queue} bound to exchange ${exchange}.`;
}

function removeBinding(binding) {
  const kind = binding.destination_type === 'queue' ? 'q' : 'e';
  const path = `/bindings/${enc(binding.vhost)}/e/${enc(binding.source)}/${kind}/${enc(binding.destination)}/${enc(binding.properties_key)}`;
  return confirmThen(null, () => api('DELETE', path),
    `Binding to ${binding.destination} (routing key "${binding.routing_key}") removed.`, `Removing the binding to ${binding.destination}`);
}

function exchangePublishForm(path) {
  return h('form', {id: 'exchange-publish-form', class: 'stacked narrow', onsubmit: (event) => submitForm(event, () => 'Publishing', (form) => publishToExchange(form, path))},
    h('label', {}, 'Routing key ', h('input', {name: 'routing_key', autocomplete: 'off'})),
    h('label', {}, h('input', {type: 'checkbox', name: 'persistent', checked: true}), ' persistent (delivery mode 2)'),
    h('label', {}, 'Headers (JSON) ', h('input', {name: 'headers', autocomplete: 'off', placeholder: '{"x-source": "console"}'})),
    h('label', {}, 'Payload ', h('textarea', {name: 'payload', rows: 3})),
    formError(),
    h('div', {}, h('button', {type: 'submit'}, 'Publish message')));
}

async function publishToExchange(form, path) {
  const properties = {delivery_mode: form.persistent.checked ? 2 : 1};
  if (form.headers.value.trim()) properties.headers = parseArguments(form.headers.value);
  const answer = await api('POST', path + '/publish', {
    routing_key: form.routing_key.value, payload: form.payload.value, payload_encoding: 'string', properties,
  });
  // RabbitMQ answers {"routed": false} for a message no binding took; say so rather than "published".
  if (!answer.routed) throw new Error('the message was not routed to any queue (no binding matched)');
  return 'Message published and routed.';
}

// ---------------------------------------------------------------- connection page

function connectionView(name) {
  const path = `/connections/${enc(name)}`;
  const facts = h('dl', {class: 'facts'});
  const channels = dataTable('connection-channels', [
    {id: 'name', title: 'Channel', cell: (c) => channelLink(c.name)},
    {id: 'number', title: 'Number', num: true, cell: (c) => c.number},
    {id: 'prefetch', title: 'Prefetch', num: true, cell: channelPrefetch},
    {id: 'consumers', title: 'Consumers', num: true, cell: (c) => fmtNumber(c.consumer_count)},
    {id: 'unacked', title: 'Unacked', num: true, cell: (c) => fmtNumber(c.messages_unacknowledged)},
  ], 'No open channels.');
  const element = h('div', {},
    h('p', {class: 'crumbs'}, h('a', {href: '#/connections'}, 'Connections')),
    h('h1', {}, 'Connection ', h('span', {class: 'name', id: 'connection-name'}, name)),
    h('div', {class: 'columns'}, section('Details', facts), section('Channels', channels.element)),
    section('Manage', h('button', {type: 'button', id: 'close-connection', class: 'danger', onclick: () => closeConnection(name)}, 'Close connection')));
  return {
    element,
    async refresh() {
      let connection;
      try {
        connection = await api('GET', path);
      } catch (error) {
        notFound(error, facts, `Connection ${name}`);
        channels.update([], () => '');
        return;
      }
      const client = connection.client_properties || {};
      facts.replaceChildren(
        ...fact('Protocol', connection.protocol, 'protocol'),
        ...fact('TLS', connectionTls(connection), 'ssl'),
        ...fact('TLS cipher', connection.ssl ? connection.ssl_cipher : 'none', 'ssl_cipher'),
        ...fact('State', connection.state, 'state'),
        ...fact('User', connection.user, 'user'),
        ...fact('Vhost', connection.vhost, 'vhost'),
        ...fact('Client', [client.product, client.version].filter(Boolean).join(' ') || '–', 'client'),
        ...fact('Peer', `${connection.peer_host}:${connection.peer_port}`, 'peer'),
        ...fact('Authentication', connection.auth_mechanism, 'auth_mechanism'),
        ...fact('Heartbeat', connection.timeout ? `${connection.timeout}s` : 'off', 'timeout'),
        ...fact('Frame max', fmtNumber(connection.frame_max), 'frame_max'),
        ...fact('Channels', fmtNumber(connection.channels), 'channels'),
        ...fact('From client', `${fmtBytes(connection.recv_oct)} (${fmtByteRate(connection.recv_oct_details)})`, 'recv_oct'),
        ...fact('To client', `${fmtBytes(connection.send_oct)} (${fmtByteRate(connection.send_oct_details)})`, 'send_oct'),
        ...fact('Connected at', fmtTime(connection.connected_at), 'connected_at'));
      channels.update(await api('GET', path + '/channels'), (c) => c.name);
    },
  };
}

// ---------------------------------------------------------------- channel page

function channelView(name) {
  const path = `/channels/${enc(name)}`;
  const facts = h('dl', {class: 'facts'});
  const consumers = dataTable('channel-consumers', [
    {id: 'tag', title: 'Consumer tag', cell: (c) => c.consumer_tag},
    {id: 'queue', title: 'Queue', cell: (c) => queueLink((c.queue || {}).vhost, (c.queue || {}).name)},
    {id: 'ack', title: 'Ack required', cell: (c) => yesNo(c.ack_required)},
    {id: 'prefetch', title: 'Prefetch', num: true, cell: (c) => fmtNumber(c.prefetch_count)},
    {id: 'exclusive', title: 'Exclusive', cell: (c) => yesNo(c.exclusive)},
  ], 'No consumers on this channel.');
  const element = h('div', {},
    h('p', {class: 'crumbs'}, h('a', {href: '#/channels'}, 'Channels')),
    h('h1', {}, 'Channel ', h('span', {class: 'name', id: 'channel-name'}, name)),
    h('div', {class: 'columns'}, section('Details', facts), section('Consumers', consumers.element)));
  return {
    element,
    async refresh() {
      let channel;
      try {
        channel = await api('GET', path);
      } catch (error) {
        notFound(error, facts, `Channel ${name}`);
        return;
      }
      const connection = (channel.connection_details || {}).name;
      facts.replaceChildren(
        ...fact('Connection', connectionLink(connection), 'connection'),
        ...fact('Number', channel.number, 'number'),
        ...fact('User', channel.user, 'user'),
        ...fact('Vhost', channel.vhost, 'vhost'),
        ...fact('State', channel.state, 'state'),
        ...fact('Mode', channelMode(channel), 'mode'),
        ...fact('Prefetch', channelPrefetch(channel), 'prefetch'),
        ...fact('Consumers', fmtNumber(channel.consumer_count), 'consumer_count'),
        ...fact('Unacked', fmtNumber(channel.messages_unacknowledged), 'messages_unacknowledged'),
        ...fact('Unconfirmed', fmtNumber(channel.messages_unconfirmed), 'messages_unconfirmed'));
      consumers.update(channel.consumer_details || [], (c) => c.consumer_tag);
    },
  };
}
