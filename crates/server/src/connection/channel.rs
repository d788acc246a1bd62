//! One channel: assembling published content, and the exchange, queue, basic, tx and confirm
//! methods. Runs on the connection's reader task, which owns this state alone; what queues must
//! see lives in [`ChannelShared`].

use super::context::Context;
use crate::outbound::{ChannelShared, ConsumerHandle, Outbound, Unacked};
use crate::queue_runtime::{ConsumerRemoval, Enqueued, QueueRuntime};
use amqp_codec::{
    constants, encode_method_frame, BasicAck, BasicCancelOk, BasicConsumeOk, BasicGetEmpty,
    BasicNack, BasicQosOk, BasicRecoverOk, ChannelClose, ChannelCloseOk, ChannelFlowOk,
    ChannelOpenOk, ConfirmSelectOk, ContentHeader, ExchangeBindOk, ExchangeDeclareOk,
    ExchangeDeleteOk, ExchangeUnbindOk, FramePayload, LongStr, Method, QueueBindOk, QueueDeclareOk,
    QueueDeleteOk, QueuePurgeOk, QueueUnbindOk, ShortStr, TxCommitOk, TxRollbackOk, TxSelectOk,
};
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition};
use broker_core::{AmqpError, Message};
use bytes::{Bytes, BytesMut};
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use storage::syncer::SharedLog;

/// How many publishes and acks one transaction may hold before commit (a bound on memory).
pub const TRANSACTION_OPERATIONS_MAX: usize = 1_000_000;

/// What the connection does with the channel after a frame.
pub enum After {
    /// Keep it.
    KeepOpen,
    /// It is closed: forget it.
    Forget,
}

/// A publish whose content is still arriving.
struct Content {
    exchange: ShortStr,
    routing_key: ShortStr,
    mandatory: bool,
    header: Option<ContentHeader>,
    body: BytesMut,
    first_body_frame: Option<Bytes>,
    body_received: u64,
}

/// A completed publish.
struct Publish {
    mandatory: bool,
    message: Arc<Message>,
}

/// Where a publish went.
struct Routed {
    /// Logs written, to sync before confirming.
    logs: Vec<SharedLog>,
    /// Whether a queue refused the message (x-overflow reject-publish).
    rejected: bool,
}

/// Acks, nacks and rejects wait in a transaction until commit.
struct PendingSettle {
    delivery_tag: u64,
    multiple: bool,
    requeue: Option<bool>,
}

#[derive(Default)]
struct Transaction {
    publishes: Vec<Publish>,
    settles: Vec<PendingSettle>,
}

/// A channel's state on the reader task.
pub struct Channel {
    shared: Arc<ChannelShared>,
    closing: bool,
    content: Option<Content>,
    consumers: HashMap<ShortStr, (Arc<ConsumerHandle>, Arc<QueueRuntime>)>,
    consumer_prefetch: u32,
    /// In confirm mode: the sequence number of the last publish.
    confirm_sequence: Option<u64>,
    transaction: Option<Transaction>,
    last_declared_queue: Option<ShortStr>,
}

fn random_name(prefix: &str) -> ShortStr {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 22];
    rand::thread_rng().fill_bytes(&mut bytes);
    let suffix: String = bytes
        .iter()
        .map(|byte| ALPHABET[usize::from(byte % 64)] as char)
        .collect();
    ShortStr::from(format!("{prefix}{suffix}"))
}

impl Channel {
    /// channel.open: replies open-ok.
    pub fn open(id: u16, context: &Context) -> Channel {
        context.reply(
            id,
            ChannelOpenOk {
                channel_id: LongStr::default(),
            }
            .into(),
        );
        Channel {
            shared: Arc::new(ChannelShared::new(id, context.connection.clone())),
            closing: false,
            content: None,
            consumers: HashMap::new(),
            consumer_prefetch: 0,
            confirm_sequence: None,
            transaction: None,
            last_declared_queue: None,
        }
    }

    fn id(&self) -> u16 {
        self.shared.id
    }

    /// Handles one frame for this channel.
    pub fn handle(
        &mut self,
        context: &mut Context,
        payload: FramePayload,
    ) -> Result<After, AmqpError> {
        if self.closing {
            return Ok(match payload {
                FramePayload::Method(Method::ChannelCloseOk(_)) => After::Forget,
                FramePayload::Method(Method::ChannelClose(_)) => {
                    context.reply(self.id(), ChannelCloseOk {}.into());
                    After::KeepOpen
                }
                _ => After::KeepOpen,
            });
        }
        match payload {
            FramePayload::Method(method) => {
                if let Some(content) = &self.content {
                    let expected = if content.header.is_none() {
                        "content header for class 60"
                    } else {
                        "content body"
                    };
                    return Err(AmqpError::unexpected_frame(format!(
                        "expected {expected}, got non content frame instead (method {})",
                        method.name()
                    ))
                    .during(60, 40));
                }
                let (class_id, method_id) = (method.class_id(), method.method_id());
                self.handle_method(context, method).map_err(|error| {
                    if error.class_id == 0 {
                        error.during(class_id, method_id)
                    } else {
                        error
                    }
                })
            }
            FramePayload::Header(header) => {
                self.handle_header(context, header)?;
                Ok(After::KeepOpen)
            }
            FramePayload::Body(body) => {
                self.handle_body(context, body)?;
                Ok(After::KeepOpen)
            }
            FramePayload::Heartbeat => Err(AmqpError::unexpected_frame(
                "heartbeat frame on a non-zero channel",
            )),
        }
    }

    /// Sends channel.close for a soft error and releases the channel's deliveries and consumers.
    pub fn fail(&mut self, context: &mut Context, error: &AmqpError) {
        let close = ChannelClose {
            reply_code: error.code,
            reply_text: ShortStr::truncating(error.text.clone()),
            class_id: error.class_id,
            method_id: error.method_id,
        };
        context.reply(self.id(), close.into());
        self.release(context);
        self.closing = true;
    }

    /// Stops deliveries, removes consumers (auto-deleting queues) and requeues unacked messages.
    pub fn release(&mut self, context: &Context) {
        self.content = None;
        self.transaction = None;
        let unacked = {
            let mut ledger = self.shared.ledger.lock();
            ledger.open = false;
            std::mem::take(&mut ledger.unacked)
        };
        for (_, (consumer, queue)) in self.consumers.drain() {
            consumer.cancelled.store(true, Ordering::Release);
            if queue.remove_consumer(&consumer) == ConsumerRemoval::DeleteQueue {
                context.broker.remove_queue(&context.vhost, queue.name());
            }
        }
        finish_grouped(unacked.into_values(), true);
    }

    fn handle_header(&mut self, context: &Context, header: ContentHeader) -> Result<(), AmqpError> {
        let Some(content) = self.content.as_mut() else {
            return Err(AmqpError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        if content.header.is_some() {
            return Err(AmqpError::unexpected_frame(
                "expected content body, got non content body frame instead",
            )
            .during(60, 40));
        }
        if header.class_id != amqp_codec::class_id::BASIC {
            return Err(AmqpError::unexpected_frame(format!(
                "content header for class {} does not match class 60",
                header.class_id
            ))
            .during(60, 40));
        }
        if header.body_size > context.broker.config.message_bytes_max {
            return Err(AmqpError::precondition(format!(
                "message size {} is larger than configured max size {}",
                header.body_size, context.broker.config.message_bytes_max
            ))
            .during(60, 40));
        }
        let complete = header.body_size == 0;
        content.header = Some(header);
        if complete {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    fn handle_body(&mut self, context: &Context, body: Bytes) -> Result<(), AmqpError> {
        let Some(content) = self.content.as_mut() else {
            return Err(AmqpError::unexpected_frame(
                "expected method frame, got non method frame instead",
            ));
        };
        let Some(header) = &content.header else {
            return Err(AmqpError::unexpected_frame(
                "expected content header for class 60, got non content header frame instead",
            )
            .during(60, 40));
        };
        let expected = header.body_size;
        content.body_received += body.len() as u64;
        if content.body_received > expected {
            return Err(AmqpError::new(
                constants::FRAME_ERROR,
                format!(
                    "body frames carry {} bytes, more than the announced {expected}",
                    content.body_received
                ),
            ));
        }
        // A body in one frame stays the frame's own bytes; only multi-frame bodies are copied.
        if content.first_body_frame.is_none() && content.body.is_empty() {
            content.first_body_frame = Some(body);
        } else {
            if let Some(first) = content.first_body_frame.take() {
                content.body.reserve(expected as usize);
                content.body.extend_from_slice(&first);
            }
            content.body.extend_from_slice(&body);
        }
        if content.body_received == expected {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    fn finish_publish(&mut self, context: &Context) -> Result<(), AmqpError> {
        let content = self.content.take().expect("called with content present");
        let header = content.header.expect("header arrived");
        let body = match content.first_body_frame {
            Some(body) => body,
            None => content.body.freeze(),
        };
        if let Ok(properties) = header.properties() {
            if let Some(mode) = properties.delivery_mode {
                if mode != 1 && mode != 2 {
                    return Err(AmqpError::precondition(format!(
                        "invalid message: {{delivery_mode_unknown,{mode}}}"
                    ))
                    .during(60, 40));
                }
            }
            if let Some(user_id) = &properties.user_id {
                if user_id.as_bytes() != context.user.as_bytes() {
                    return Err(AmqpError::precondition(format!(
                        "user_id property set to '{}' but authenticated user was '{}'",
                        user_id, context.user
                    ))
                    .during(60, 40));
                }
            }
        }
        {
            let vhost = context.broker.vhost(&context.vhost).read();
            let exchange = vhost
                .require_exchange(&content.exchange)
                .map_err(|error| error.during(60, 40))?;
            if exchange.internal {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{}' in vhost '{}'",
                    content.exchange, context.vhost
                ))
                .during(60, 40));
            }
        }
        let message = Arc::new(Message {
            exchange: content.exchange,
            routing_key: content.routing_key,
            header,
            body,
        });
        let publish = Publish {
            mandatory: content.mandatory,
            message,
        };
        if let Some(transaction) = self.transaction.as_mut() {
            if transaction.publishes.len() + transaction.settles.len() >= TRANSACTION_OPERATIONS_MAX
            {
                return Err(AmqpError::precondition(format!(
                    "transaction holds more than {TRANSACTION_OPERATIONS_MAX} operations"
                )));
            }
            transaction.publishes.push(publish);
            return Ok(());
        }
        let Routed { logs, rejected } = self.route(context, &publish);
        match self.confirm_sequence.as_mut() {
            Some(sequence) => {
                *sequence += 1;
                let delivery_tag = *sequence;
                if rejected {
                    // A queue at its x-max-length with reject-publish refused it: nack, as RabbitMQ does.
                    send_confirm(&self.shared, delivery_tag, false);
                } else if logs.is_empty() {
                    send_confirm(&self.shared, delivery_tag, true);
                } else {
                    let shared = self.shared.clone();
                    context.broker.syncer.sync(
                        logs,
                        Some(Box::new(move |durable| {
                            send_confirm(&shared, delivery_tag, durable)
                        })),
                    );
                }
            }
            None => {
                if !logs.is_empty() {
                    context.broker.syncer.sync(logs, None);
                }
            }
        }
        Ok(())
    }

    /// Routes a publish into its queues; returns the logs written, to sync before confirming.
    fn route(&self, context: &Context, publish: &Publish) -> Routed {
        let message = &publish.message;
        let mut queues: Vec<Arc<QueueRuntime>> = Vec::new();
        {
            let vhost = context.broker.vhost(&context.vhost).read();
            let mut headers = || {
                message
                    .header
                    .properties()
                    .ok()
                    .and_then(|properties| properties.headers)
            };
            vhost.route(
                &message.exchange,
                &message.routing_key,
                &mut headers,
                &mut queues,
            );
        }
        if queues.is_empty() {
            if publish.mandatory {
                context.connection.send(Outbound::Return {
                    channel: self.id(),
                    reply_code: constants::NO_ROUTE,
                    reply_text: ShortStr::from("NO_ROUTE"),
                    message: message.clone(),
                });
            }
            return Routed {
                logs: Vec::new(),
                rejected: false,
            };
        }
        let mut logs = Vec::new();
        let mut rejected = false;
        for queue in &queues {
            match queue.publish(message.clone()) {
                Enqueued::Logged(log) => logs.push(log),
                Enqueued::InMemory => {}
                Enqueued::Rejected => rejected = true,
            }
        }
        Routed { logs, rejected }
    }

    fn handle_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::BasicPublish(publish) => {
                if publish.immediate {
                    return Err(AmqpError::not_implemented("immediate=true"));
                }
                self.content = Some(Content {
                    exchange: publish.exchange,
                    routing_key: publish.routing_key,
                    mandatory: publish.mandatory,
                    header: None,
                    body: BytesMut::new(),
                    first_body_frame: None,
                    body_received: 0,
                });
            }
            Method::BasicAck(ack) => self.settle(context, ack.delivery_tag, ack.multiple, None)?,
            Method::BasicNack(nack) => self.settle(
                context,
                nack.delivery_tag,
                nack.multiple,
                Some(nack.requeue),
            )?,
            Method::BasicReject(reject) => {
                self.settle(context, reject.delivery_tag, false, Some(reject.requeue))?
            }
            Method::ChannelClose(_) => {
                self.release(context);
                context.reply(id, ChannelCloseOk {}.into());
                return Ok(After::Forget);
            }
            Method::ChannelCloseOk(_) => return Ok(After::Forget),
            Method::ChannelOpen(_) => {
                return Err(AmqpError::channel_error("second 'channel.open' seen"))
            }
            Method::ChannelFlow(flow) => {
                if !flow.active {
                    // RabbitMQ 3.x refuses client-side flow control the same way.
                    return Err(AmqpError::not_implemented("active=false"));
                }
                self.shared.flow_active.store(true, Ordering::Release);
                context.reply(id, ChannelFlowOk { active: true }.into());
            }
            Method::ChannelFlowOk(_) => {}
            Method::AccessRequest(_) => {
                context.reply(id, amqp_codec::AccessRequestOk { ticket: 1 }.into())
            }
            Method::ExchangeDeclare(declare) => {
                let declaration = ExchangeDeclaration {
                    name: declare.exchange,
                    kind: declare.exchange_type,
                    passive: declare.passive,
                    durable: declare.durable,
                    auto_delete: declare.auto_delete,
                    internal: declare.internal,
                    arguments: declare.arguments,
                };
                context
                    .broker
                    .declare_exchange(&context.vhost, &declaration)?;
                if !declare.nowait {
                    context.reply(id, ExchangeDeclareOk {}.into());
                }
            }
            Method::ExchangeDelete(delete) => {
                context.broker.delete_exchange(
                    &context.vhost,
                    &delete.exchange,
                    delete.if_unused,
                )?;
                if !delete.nowait {
                    context.reply(id, ExchangeDeleteOk {}.into());
                }
            }
            Method::ExchangeBind(bind) => {
                let binding = Binding {
                    destination: Destination::Exchange(bind.destination),
                    routing_key: bind.routing_key,
                    arguments: bind.arguments,
                };
                context.broker.bind(&context.vhost, &bind.source, binding)?;
                if !bind.nowait {
                    context.reply(id, ExchangeBindOk {}.into());
                }
            }
            Method::ExchangeUnbind(unbind) => {
                let binding = Binding {
                    destination: Destination::Exchange(unbind.destination),
                    routing_key: unbind.routing_key,
                    arguments: unbind.arguments,
                };
                context
                    .broker
                    .unbind(&context.vhost, &unbind.source, &binding)?;
                if !unbind.nowait {
                    context.reply(id, ExchangeUnbindOk {}.into());
                }
            }
            Method::QueueDeclare(declare) => {
                let server_named = declare.queue.is_empty() && !declare.passive;
                let name = if server_named {
                    random_name("amq.gen-")
                } else {
                    declare.queue.clone()
                };
                let name = if declare.passive && name.is_empty() {
                    self.queue_name(&name)?
                } else {
                    name
                };
                let exclusive_owner = declare.exclusive.then_some(context.connection.id);
                let definition = QueueDefinition {
                    name,
                    durable: declare.durable,
                    exclusive_owner,
                    auto_delete: declare.auto_delete,
                    arguments: declare.arguments,
                };
                let (name, message_count, consumer_count) = context.broker.declare_queue(
                    &context.vhost,
                    definition,
                    declare.passive,
                    server_named,
                    context.connection.id,
                )?;
                if declare.exclusive
                    && !declare.passive
                    && !context.exclusive_queues.contains(&name)
                {
                    context.exclusive_queues.push(name.clone());
                }
                self.last_declared_queue = Some(name.clone());
                if !declare.nowait {
                    context.reply(
                        id,
                        QueueDeclareOk {
                            queue: name,
                            message_count,
                            consumer_count,
                        }
                        .into(),
                    );
                }
            }
            Method::QueueBind(bind) => {
                let queue = self.queue_name(&bind.queue)?;
                self.require_queue(context, &queue)?;
                let binding = Binding {
                    destination: Destination::Queue(queue),
                    routing_key: bind.routing_key,
                    arguments: bind.arguments,
                };
                context
                    .broker
                    .bind(&context.vhost, &bind.exchange, binding)?;
                if !bind.nowait {
                    context.reply(id, QueueBindOk {}.into());
                }
            }
            Method::QueueUnbind(unbind) => {
                let queue = self.queue_name(&unbind.queue)?;
                self.require_queue(context, &queue)?;
                let binding = Binding {
                    destination: Destination::Queue(queue),
                    routing_key: unbind.routing_key,
                    arguments: unbind.arguments,
                };
                context
                    .broker
                    .unbind(&context.vhost, &unbind.exchange, &binding)?;
                context.reply(id, QueueUnbindOk {}.into());
            }
            Method::QueuePurge(purge) => {
                let name = self.queue_name(&purge.queue)?;
                let queue = self.require_queue(context, &name)?;
                let message_count = queue.purge();
                if !purge.nowait {
                    context.reply(id, QueuePurgeOk { message_count }.into());
                }
            }
            Method::QueueDelete(delete) => {
                let name = self.queue_name(&delete.queue)?;
                let exists = context
                    .broker
                    .vhost(&context.vhost)
                    .read()
                    .queue(&name)
                    .is_some();
                let message_count = if exists {
                    let queue = self.require_queue(context, &name)?;
                    let (ready, consumers) = queue.counts();
                    if delete.if_unused && consumers > 0 {
                        return Err(AmqpError::precondition(format!(
                            "queue '{name}' in vhost '{}' in use",
                            context.vhost
                        )));
                    }
                    if delete.if_empty && ready > 0 {
                        return Err(AmqpError::precondition(format!(
                            "queue '{name}' in vhost '{}' not empty",
                            context.vhost
                        )));
                    }
                    context
                        .exclusive_queues
                        .retain(|exclusive| exclusive != &name);
                    context.broker.remove_queue(&context.vhost, &name)
                } else {
                    0
                };
                if !delete.nowait {
                    context.reply(id, QueueDeleteOk { message_count }.into());
                }
            }
            Method::BasicQos(qos) => {
                if qos.prefetch_size != 0 {
                    return Err(AmqpError::not_implemented(format!(
                        "prefetch_size!=0 ({})",
                        qos.prefetch_size
                    )));
                }
                if qos.global {
                    self.shared
                        .prefetch_global
                        .store(u32::from(qos.prefetch_count), Ordering::Release);
                } else {
                    self.consumer_prefetch = u32::from(qos.prefetch_count);
                }
                context.reply(id, BasicQosOk {}.into());
                self.dispatch_consumed_queues();
            }
            Method::BasicConsume(consume) => self.consume(context, consume)?,
            Method::BasicCancel(cancel) => {
                if let Some((consumer, queue)) = self.consumers.remove(&cancel.consumer_tag) {
                    consumer.cancelled.store(true, Ordering::Release);
                    if queue.remove_consumer(&consumer) == ConsumerRemoval::DeleteQueue {
                        context.broker.remove_queue(&context.vhost, queue.name());
                    }
                }
                if !cancel.nowait {
                    context.reply(
                        id,
                        BasicCancelOk {
                            consumer_tag: cancel.consumer_tag,
                        }
                        .into(),
                    );
                }
            }
            Method::BasicGet(get) => {
                let name = self.queue_name(&get.queue)?;
                let queue = self.require_queue(context, &name)?;
                match queue.get(&self.shared, get.no_ack) {
                    Some(get_ok) => context.connection.send(get_ok),
                    None => context.reply(
                        id,
                        BasicGetEmpty {
                            cluster_id: ShortStr::from(""),
                        }
                        .into(),
                    ),
                }
            }
            Method::BasicRecover(recover) => {
                self.recover(recover.requeue)?;
                context.reply(id, BasicRecoverOk {}.into());
            }
            Method::BasicRecoverAsync(recover) => self.recover(recover.requeue)?,
            Method::TxSelect(_) => {
                if self.confirm_sequence.is_some() {
                    return Err(AmqpError::precondition(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                self.transaction.get_or_insert_with(Transaction::default);
                context.reply(id, TxSelectOk {}.into());
            }
            Method::TxCommit(_) => self.commit(context)?,
            Method::TxRollback(_) => {
                let Some(transaction) = self.transaction.as_mut() else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                *transaction = Transaction::default();
                context.reply(id, TxRollbackOk {}.into());
            }
            Method::ConfirmSelect(select) => {
                if self.transaction.is_some() {
                    return Err(AmqpError::precondition(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                self.confirm_sequence.get_or_insert(0);
                if !select.nowait {
                    context.reply(id, ConfirmSelectOk {}.into());
                }
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "a client may not send {} on a channel",
                    other.name()
                )));
            }
        }
        Ok(After::KeepOpen)
    }

    /// An empty queue name means the last queue declared on this channel, as in RabbitMQ.
    fn queue_name(&self, name: &ShortStr) -> Result<ShortStr, AmqpError> {
        if !name.is_empty() {
            return Ok(name.clone());
        }
        self.last_declared_queue
            .clone()
            .ok_or_else(|| AmqpError::new(constants::NOT_FOUND, "no previously declared queue"))
    }

    fn require_queue(
        &self,
        context: &Context,
        name: &ShortStr,
    ) -> Result<Arc<QueueRuntime>, AmqpError> {
        let vhost = context.broker.vhost(&context.vhost).read();
        Ok(vhost
            .require_queue(name, context.connection.id)?
            .handle
            .clone())
    }

    fn consume(
        &mut self,
        context: &Context,
        consume: amqp_codec::BasicConsume,
    ) -> Result<(), AmqpError> {
        let name = self.queue_name(&consume.queue)?;
        let queue = self.require_queue(context, &name)?;
        let tag = if consume.consumer_tag.is_empty() {
            random_name("amq.ctag-")
        } else {
            consume.consumer_tag.clone()
        };
        if self.consumers.contains_key(&tag) {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let priority = match consume.arguments.get("x-priority") {
            None => 0,
            Some(value) => value.as_i64().ok_or_else(|| {
                AmqpError::precondition("invalid arg 'x-priority': expected an integer")
            })?,
        };
        let consumer = Arc::new(ConsumerHandle {
            tag: tag.clone(),
            channel: self.shared.clone(),
            no_ack: consume.no_ack,
            prefetch: self.consumer_prefetch,
            unacked: Default::default(),
            priority,
            cancelled: Default::default(),
        });
        let id = self.id();
        let reply = (!consume.nowait).then(|| {
            let mut frames = BytesMut::new();
            encode_method_frame(
                &mut frames,
                id,
                &BasicConsumeOk {
                    consumer_tag: tag.clone(),
                }
                .into(),
            );
            frames.freeze()
        });
        let connection = context.connection.clone();
        queue.add_consumer(consumer.clone(), consume.exclusive, move || {
            if let Some(frames) = reply {
                connection.send(Outbound::Frames(frames));
            }
        })?;
        self.consumers.insert(tag, (consumer, queue));
        Ok(())
    }

    /// Takes deliveries off the ledger: one tag, every tag up to it (`multiple`), or all (tag 0
    /// with `multiple`). An unknown tag is a 406, as in RabbitMQ.
    fn take_deliveries(
        &self,
        delivery_tag: u64,
        multiple: bool,
    ) -> Result<Vec<Unacked>, AmqpError> {
        let mut ledger = self.shared.ledger.lock();
        let taken: Vec<Unacked> = if multiple {
            let keep = if delivery_tag == 0 {
                std::collections::BTreeMap::new()
            } else {
                ledger.unacked.split_off(&(delivery_tag + 1))
            };
            std::mem::replace(&mut ledger.unacked, keep)
                .into_values()
                .collect()
        } else {
            ledger.unacked.remove(&delivery_tag).into_iter().collect()
        };
        if taken.is_empty() && !(multiple && delivery_tag == 0) {
            return Err(AmqpError::precondition(format!(
                "unknown delivery tag {delivery_tag}"
            )));
        }
        Ok(taken)
    }

    /// basic.ack (`requeue` None), basic.nack and basic.reject.
    fn settle(
        &mut self,
        _context: &Context,
        delivery_tag: u64,
        multiple: bool,
        requeue: Option<bool>,
    ) -> Result<(), AmqpError> {
        if let Some(transaction) = self.transaction.as_mut() {
            let known = delivery_tag == 0 && multiple
                || self
                    .shared
                    .ledger
                    .lock()
                    .unacked
                    .contains_key(&delivery_tag);
            if !known {
                return Err(AmqpError::precondition(format!(
                    "unknown delivery tag {delivery_tag}"
                )));
            }
            transaction.settles.push(PendingSettle {
                delivery_tag,
                multiple,
                requeue,
            });
            return Ok(());
        }
        let taken = self.take_deliveries(delivery_tag, multiple)?;
        finish_grouped(taken.into_iter(), requeue.unwrap_or(false));
        if self.shared.prefetch_global.load(Ordering::Acquire) != 0 {
            self.dispatch_consumed_queues();
        }
        Ok(())
    }

    fn recover(&mut self, requeue: bool) -> Result<(), AmqpError> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        let taken = std::mem::take(&mut self.shared.ledger.lock().unacked);
        finish_grouped(taken.into_values(), true);
        Ok(())
    }

    fn commit(&mut self, context: &Context) -> Result<(), AmqpError> {
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(AmqpError::precondition("channel is not transactional"));
        };
        let Transaction { publishes, settles } = std::mem::take(transaction);
        let mut logs: Vec<SharedLog> = Vec::new();
        for publish in &publishes {
            for log in self.route(context, publish).logs {
                if !logs.iter().any(|known| Arc::ptr_eq(known, &log)) {
                    logs.push(log);
                }
            }
        }
        for settle in settles {
            // A tag settled twice in one transaction is already gone; RabbitMQ ignores it too.
            if let Ok(taken) = self.take_deliveries(settle.delivery_tag, settle.multiple) {
                finish_grouped(taken.into_iter(), settle.requeue.unwrap_or(false));
            }
        }
        self.dispatch_consumed_queues();
        let id = self.id();
        if logs.is_empty() {
            context.reply(id, TxCommitOk {}.into());
        } else {
            // commit-ok promises the transaction's persistent messages are on disk.
            let connection = context.connection.clone();
            context.broker.syncer.sync(
                logs,
                Some(Box::new(move |_durable| {
                    let mut frames = BytesMut::new();
                    encode_method_frame(&mut frames, id, &TxCommitOk {}.into());
                    connection.send(Outbound::Frames(frames.freeze()));
                })),
            );
        }
        Ok(())
    }

    fn dispatch_consumed_queues(&self) {
        let mut seen: Vec<*const QueueRuntime> = Vec::new();
        for (_, queue) in self.consumers.values() {
            if !seen.contains(&Arc::as_ptr(queue)) {
                seen.push(Arc::as_ptr(queue));
                queue.dispatch();
            }
        }
    }
}

/// Settles (or requeues) deliveries, grouped per queue so each queue is locked once.
fn finish_grouped(deliveries: impl Iterator<Item = Unacked>, requeue: bool) {
    let mut groups: Vec<(Arc<QueueRuntime>, Vec<u64>)> = Vec::new();
    for delivery in deliveries {
        if let Some(consumer) = &delivery.consumer {
            consumer.release_delivery();
        }
        match groups
            .iter_mut()
            .find(|(queue, _)| Arc::ptr_eq(queue, &delivery.queue))
        {
            Some((_, positions)) => positions.push(delivery.position),
            None => groups.push((delivery.queue, vec![delivery.position])),
        }
    }
    for (queue, positions) in groups {
        queue.finish_deliveries(&positions, requeue);
    }
}

/// Sends basic.ack (or basic.nack when the message could not be made durable) to a publisher.
fn send_confirm(channel: &ChannelShared, delivery_tag: u64, durable: bool) {
    let method: Method = if durable {
        BasicAck {
            delivery_tag,
            multiple: false,
        }
        .into()
    } else {
        BasicNack {
            delivery_tag,
            multiple: false,
            requeue: false,
        }
        .into()
    };
    let mut frames = BytesMut::with_capacity(32);
    encode_method_frame(&mut frames, channel.id, &method);
    channel.connection.send(Outbound::Frames(frames.freeze()));
}
